"""The Dockerfiles under images/: small, pinned, non-root, and running real commands.

No Docker daemon here, so the files are parsed (instructions joined across line
continuations) and checked for what a review would check: multi-stage builds, base images
pinned by tag and digest, a numeric non-root USER in the final stage, no pip cache, apt lists
removed; no ENTRYPOINT, because the operator sets each pod's command line (`qpa ...`) as the
container's args/command and an ENTRYPOINT would be prepended to it; the CMD is a real
command of this repository's CLI (its `--help` exits 0 with those very options), and the
image names match the chart's defaults.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from qpa.cli import app

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "images"
#: folder -> the chart's `images.<key>`
CHART_KEYS = {
    "operator": "operator",
    "sandbox": "sandbox",
    "trainer": "trainer",
    "harness": "harness",
    "device-bridge": "deviceBridge",
}
PINNED = re.compile(r"^[a-z0-9./_-]+:[A-Za-z0-9_.-]+@sha256:[a-f0-9]{64}$")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, comments dropped, continuations joined."""
    joined, current = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        joined.append(current)
        current = ""
    assert not current, f"{path}: dangling line continuation"
    result = []
    for line in joined:
        word, _, rest = line.partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def stages(steps: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for step in steps:
        if step[0] == "FROM":
            found.append([])
        assert found, "an instruction before the first FROM"
        found[-1].append(step)
    return found


DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))


def test_one_folder_per_image() -> None:
    assert {p.parent.name for p in DOCKERFILES} == set(CHART_KEYS)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_multi_stage_pinned_small_and_non_root(path: Path) -> None:
    steps = instructions(path)
    parts = stages(steps)
    assert len(parts) >= 2, "multi-stage: build in one stage, copy the result into the next"
    names = set()
    for part in parts:
        words = part[0][1].split()
        image = words[0]
        assert image in names or PINNED.match(image), f"FROM {image}: pin a tag and a digest"
        assert ":latest" not in image
        if len(words) == 3 and words[1].upper() == "AS":
            names.add(words[2])
    final = parts[-1]
    assert any(i == "COPY" and a.startswith("--from=") for i, a in final), "nothing copied"
    users = [a for i, a in final if i == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0))
    for instruction, args in steps:
        if instruction == "RUN" and "pip install" in args:
            assert "--no-cache-dir" in args, args
        if instruction == "RUN" and "apt-get install" in args:
            assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists/*" in args
        if instruction == "COPY" and not args.startswith("--from="):
            *sources, _ = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert _in_build_context(source), f"COPY {source}: excluded by .dockerignore"
        assert instruction != "ENTRYPOINT", "the operator's args would follow an ENTRYPOINT"
        assert instruction not in ("ADD",), "use COPY"


def _in_build_context(source: str) -> bool:
    allowed = [
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    return source.rstrip("/") in allowed


def cmd_of(path: Path) -> list[str]:
    (cmd,) = [a for i, a in instructions(path) if i == "CMD"]
    argv = json.loads(cmd)  # exec form only: no shell between the signal and the process
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


@pytest.mark.parametrize(
    "path", [p for p in DOCKERFILES if p.parent.name != "operator"], ids=lambda p: p.parent.name
)
def test_cmd_is_a_real_qpa_command(path: Path) -> None:
    argv = cmd_of(path)
    assert argv[0] == "qpa"
    args = argv[1:] if "--help" in argv else [*argv[1:], "--help"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"qpa {' '.join(args)}: {result.output}"
    assert "Usage:" in result.output


def test_operator_cmd_is_the_charts_kopf_command() -> None:
    argv = cmd_of(IMAGES / "operator" / "Dockerfile")
    from kopf.cli import run as kopf_run

    assert argv[:2] == ["kopf", "run"]
    params = kopf_run.make_context("run", argv[2:]).params
    assert params["modules"] == ("qpa_operator.main",) and params["peering_name"] == "qpa-operator"
    assert params["clusterwide"] is True and params["liveness_endpoint"]
    chart = (ROOT / "charts" / "qpa" / "templates" / "deployment.yaml").read_text()
    assert "- qpa_operator.main" in chart and "- --all-namespaces" in chart


def test_image_names_are_the_charts_and_the_operators_defaults() -> None:
    from qpa_operator.builders import Defaults

    values: dict[str, Any] = yaml.safe_load((ROOT / "charts" / "qpa" / "values.yaml").read_text())
    for folder, key in CHART_KEYS.items():
        assert values["images"][key]["repository"] == f"ghcr.io/qpa-ai/qpa-{folder}"
    defaults = Defaults()
    assert defaults.image.startswith("ghcr.io/qpa-ai/qpa-sandbox:")
    assert defaults.trainer_image.startswith("ghcr.io/qpa-ai/qpa-trainer:")
    assert defaults.harness_image.startswith("ghcr.io/qpa-ai/qpa-harness:")
    assert defaults.bridge_image.startswith("ghcr.io/qpa-ai/qpa-device-bridge:")


def test_each_image_installs_what_its_command_needs() -> None:
    text = {p.parent.name: p.read_text() for p in DOCKERFILES}
    assert '".[operator]"' in text["operator"]
    assert '".[serve]"' in text["harness"]  # the KServe SDK
    assert (
        '".[device]"' in text["device-bridge"]
        and "install -y --no-install-recommends adb" in (text["device-bridge"])
    )
    for package in ("vllm==", "deepspeed", "extras['train']"):
        assert package in text["trainer"], package
    assert "nvidia/cuda:" in text["trainer"]


def test_parser_sees_continuations_and_stages(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("# c\nFROM a:1@sha256:" + "0" * 64 + " AS b\nRUN x \\\n  && y\nFROM b\n")
    steps = instructions(dockerfile)
    assert steps[1] == ("RUN", "x  && y")
    assert [len(s) for s in stages(steps)] == [2, 1]
