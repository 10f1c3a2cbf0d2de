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

import importlib.metadata
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
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
    pinned = {image: locked(image) for image in CHART_KEYS}
    assert "kopf" in pinned["operator"] and "kubernetes" in pinned["operator"]
    assert "kserve" in pinned["harness"]  # the KServe SDK
    assert "adbutils" in pinned["device-bridge"] and "adbutils" in pinned["sandbox"]
    assert "install -y --no-install-recommends adb" in text["device-bridge"]
    assert pinned["trainer"]["vllm"] == "0.33.0"
    for package in ("deepspeed", "torch", "trl", "transformers", "datasets"):
        assert package in pinned["trainer"], package
    assert "nvidia/cuda:" in text["trainer"]


# --------------------------------------------------------------------------- lock files


def _lock_module() -> Any:
    spec = importlib.util.spec_from_file_location("image_lock", IMAGES / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


LOCK = _lock_module()


def lock_entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, sha256 hashes) of a `--generate-hashes` lock file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split(" --hash=")
        name_version = requirement.split(";", 1)[0].strip()
        assert "==" in name_version, f"{path.name}: {line[:80]} is not pinned"
        name, version = name_version.split("==", 1)
        assert options, f"{path.name}: {name} has no hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h.strip()) for h in options), name
        key = canonicalize_name(name)
        assert key not in entries or entries[key][0] == version, f"{name}: two versions"
        entries[key] = (version, [h.strip() for h in options])
    return entries


def lock_files(image: str) -> list[Path]:
    return sorted((IMAGES / image).glob("*.lock"))


def locked(image: str) -> dict[str, str]:
    """name -> version over every lock file of the image."""
    return {
        name: version
        for path in lock_files(image)
        for name, (version, _) in lock_entries(path).items()
    }


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_image_installs_from_its_lock_with_hashes(path: Path) -> None:
    image = path.parent.name
    steps = instructions(path)
    locks = lock_files(image)
    assert IMAGES / image / "requirements.lock" in locks
    copied = [
        source
        for instruction, args in steps
        if instruction == "COPY" and not args.startswith("--from=")
        for source in shlex.split(args)[:-1]
    ]
    for lock in locks:
        assert str(lock.relative_to(ROOT)) in copied, f"{lock.name} is not copied in"
    installs = [a for i, a in steps if i == "RUN" and "pip install" in a]
    used = set()
    for run in installs:
        for command in re.split(r"&&", run):
            if "pip install" not in command:
                continue
            argv = shlex.split(command)
            if "-r" in argv:
                assert "--require-hashes" in argv and "--no-deps" in argv, command
                used.add(Path(argv[argv.index("-r") + 1]).name)
            else:  # qpa itself, from the build context: nothing fetched
                assert argv[-1] == "." and "--no-deps" in argv, command
                assert "--no-build-isolation" in argv, command
    assert used == {lock.name for lock in locks}, (used, locks)


@pytest.mark.parametrize("image", sorted(CHART_KEYS))
def test_each_lock_pins_every_requirement_of_its_image(image: str) -> None:
    """The lock is current: its requirements.in is what images/lock.py derives from
    pyproject.toml now, and a hashed pin satisfying each of those requirements is in it."""
    source = (IMAGES / image / "requirements.in").read_text().splitlines()
    assert [line for line in source if not line.startswith("#")] == LOCK.requirements(image), (
        f"images/{image}/requirements.in is stale: run python images/lock.py {image}"
    )
    pins = locked(image)
    for line in LOCK.requirements(image) + list(LOCK.IMAGES[image].separate):
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{image}: {requirement} is not in its lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{image}: {name}=={pins[name]} does not satisfy {requirement}"
        )
        for extra in requirement.extras:  # uvicorn[standard]: the extra's packages too
            assert f"{name}[{extra}]" in (IMAGES / image / "requirements.lock").read_text() or (
                extra == "standard" and "httptools" in pins
            ), f"{image}: {requirement}'s extra {extra} is not locked"


def test_deepspeed_is_built_after_its_own_requirements_are_installed() -> None:
    apart = lock_entries(IMAGES / "trainer" / "deepspeed.lock")
    assert list(apart) == ["deepspeed"]
    pins = lock_entries(IMAGES / "trainer" / "requirements.lock")
    assert "deepspeed" not in pins
    # what the DeepSpeed sdist needs when built with --no-build-isolation (its metadata here)
    needed = [
        Requirement(r)
        for r in importlib.metadata.requires("deepspeed") or []
        if "extra ==" not in r
    ]
    assert needed
    for requirement in needed:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"deepspeed needs {requirement}: not in requirements.lock"
        assert requirement.specifier.contains(pins[name][0], prereleases=True)


def test_trainer_ops_cover_sm80_to_sm100_and_rdma_is_installed() -> None:
    steps = instructions(IMAGES / "trainer" / "Dockerfile")
    build, final = stages(steps)
    (arch,) = re.findall(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', " ".join(a for _, a in build))
    archs = [a.removesuffix("+PTX") for a in arch.split(";")]
    for needed in ("8.0", "8.6", "8.9", "9.0", "10.0"):
        assert needed in archs, needed
    # the toolkit that compiles them is CUDA 13 (torch's major), from the lock's wheels
    pins = locked("trainer")
    assert pins["nvidia-cuda-nvcc"].startswith("13.") and pins["nvidia-cuda-runtime"].startswith(
        "13."
    )
    assert "CUDA_HOME=/opt/qpa/lib/python3.12/site-packages/nvidia/cu13" in " ".join(
        a for _, a in build
    )
    apt = " ".join(a for i, a in final if i == "RUN" and "apt-get install" in a)
    assert "rdma-core" in apt.split() and "ibverbs-providers" in apt.split()


def test_parser_sees_continuations_and_stages(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("# c\nFROM a:1@sha256:" + "0" * 64 + " AS b\nRUN x \\\n  && y\nFROM b\n")
    steps = instructions(dockerfile)
    assert steps[1] == ("RUN", "x  && y")
    assert [len(s) for s in stages(steps)] == [2, 1]
