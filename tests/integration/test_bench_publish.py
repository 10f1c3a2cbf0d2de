"""`qpa bench run` publishes its report where the HarnessRelease benchmark Job says.

The operator's builder makes the Job (`qpa bench run --spec <work order>`, the work order a
ConfigMap with the release and the candidate's endpoint and report folder); these tests run that
very command through the real `qpa` console script on the work order the builder wrote, with
only the candidate's endpoint pointed at a local OpenAI-compatible server (a model that answers
at once) and a tiny task limit, and then read the report back the way the operator does, with
`qpa.release.verdict`, on a real S3 server (SeaweedFS: a HarnessRelease takes s3:// reports only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.openai_server import FakeOpenAI
from fakes.seaweed import SeaweedS3
from qpa_operator.builders import Defaults
from qpa_operator.builders import harnessrelease as builder

from qpa.api import HarnessRelease, parse_resource
from qpa.api.v1alpha1 import WORK_ORDER_KEY, WORK_ORDER_PATH, BenchSummary
from qpa.release.verdict import judge, read_report
from qpa.store import open_store

ROOT = Path(__file__).resolve().parents[2]
QPA = Path(sys.executable).with_name("qpa")
LIMIT = 3


def release(report_uri: str, store: dict[str, Any] | None = None) -> HarnessRelease:
    """The example release, benchmarking in-process sandboxes on a few tasks."""
    doc = yaml.safe_load((ROOT / "examples" / "harnessrelease.yaml").read_text())
    spec = doc["spec"]
    spec["harness"].pop("configMapRef")
    spec["benchmark"].pop("rolloutPoolRef")
    spec["benchmark"].update(limit=LIMIT, samples=1, concurrency=2)
    spec["gate"].update(minSamples=1, minTasks=1, minOverall=0)
    spec["reportUri"] = report_uri
    spec.pop("store", None)
    if store is not None:
        spec["store"] = store
    doc["metadata"].update(namespace="qpa", uid="4a7f6a34-5c2e-4a8e-9d1e-0c1f2d3e4f50")
    resource = parse_resource(doc)
    assert isinstance(resource, HarnessRelease)
    return resource


def job_command(
    hr: HarnessRelease, out: Path, model_url: str, **resolved: str
) -> tuple[list[str], dict[str, str]]:
    """The benchmark Job's command on its work order (endpoint and `resolved` overrides
    applied, --out local) and its env."""
    job = builder.bench_job(hr, Defaults())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["qpa", "bench", "run", "--spec", WORK_ORDER_PATH]
    order = yaml.safe_load(builder.bench_work_order(hr, Defaults())["data"][WORK_ORDER_KEY])
    assert order["resolved"]["modelUrl"] == builder.model_url(hr, Defaults())
    order["resolved"] |= {"modelUrl": model_url, **resolved}
    path = out.parent / "workorder.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(order))
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return [str(QPA), "bench", "run", "--spec", str(path), "--out", str(out)], env


@pytest.fixture
def endpoint() -> Any:
    """The candidate model: answers every turn at once, without tool calls."""
    with FakeOpenAI(lambda request: "Done.") as server:
        yield server.base_url


def run_job(
    command: list[str], env: dict[str, str], **extra: str
) -> subprocess.CompletedProcess[str]:
    job_env = {k: v for k, v in env.items() if k not in ("HOME", "QPA_STATUS_FILE")}
    return subprocess.run(
        command,
        env={**os.environ, **job_env, **extra, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_benchmark_job_publishes_its_report_and_run_files(
    tmp_path: Path, endpoint: str, seaweed: SeaweedS3
) -> None:
    store = {"endpoint": seaweed.endpoint, "secretRef": {"name": "qpa-store"}}
    hr = release(seaweed.root("bench-files") + "/releases/", store=store)
    command, env = job_command(hr, tmp_path / "work", endpoint)
    status_file = tmp_path / "termination-log"
    # the pod reads its keys from the mounted Secret's files; here they are local files
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "access").write_text(seaweed.access_key)
    (keys / "secret").write_text(seaweed.secret_key)
    result = run_job(
        command,
        env,
        QPA_STATUS_FILE=str(status_file),
        QPA_S3_ACCESS_KEY_FILE=str(keys / "access"),
        QPA_S3_SECRET_KEY_FILE=str(keys / "secret"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # the operator's reader finds it at the candidate's report URI
    candidate = builder.candidate(hr, Defaults())
    prefix = builder.report_prefix(hr, Defaults())
    assert candidate.report_uri == prefix + "report.json"
    config = seaweed.store_config()
    report = read_report(candidate.report_uri, config)
    assert report.tasks == LIMIT and report.complete and report.samples == 1
    assert report.policy.planner == "openai" and report.policy.model == "planner"
    verdict = judge(candidate.report_uri, None, hr.spec.gate, config)
    assert verdict.kind == "passed" and verdict.scores is not None
    assert verdict.scores.overall == pytest.approx(report.overall, abs=1e-6)
    # every trajectory records the release's Harness version
    store = open_store(prefix, config)
    lines = store.get_bytes("trajectories.jsonl").decode().splitlines()
    harness_versions = {json.loads(line)["policy"]["harness_version"] for line in lines}
    assert harness_versions == {hr.spec.harness.version}
    # the run's other files went along, byte for byte
    assert set(store.list()) >= {"report.json", "report.md", "trajectories.jsonl", "run.json"}
    local = tmp_path / "work"
    for name in ("report.json", "trajectories.jsonl"):
        assert store.get_bytes(name) == (local / name).read_bytes()
    assert f"published: {candidate.report_uri}" in result.stdout
    # the pod's termination message is the typed summary, saying where the report went
    summary = BenchSummary.from_message(status_file.read_text())
    assert summary is not None and summary.report_uri == candidate.report_uri
    assert (summary.tasks, summary.complete) == (LIMIT, True)


def test_a_bad_report_uri_fails_before_any_episode(tmp_path: Path, endpoint: str) -> None:
    store = {"endpoint": "http://127.0.0.1:9", "secretRef": {"name": "qpa-store"}}
    hr = release("s3://qpa/releases/", store=store)
    command, env = job_command(hr, tmp_path / "work", endpoint, reportUri="ftp://host/reports/")
    result = run_job(command, env)
    assert result.returncode != 0
    assert "ftp://host/reports/" in result.stderr + result.stdout
    assert "unsupported store scheme 'ftp'" in result.stderr + result.stdout
    assert not (tmp_path / "work" / "trajectories.jsonl").exists()
    # an s3:// folder without credentials is refused up front too
    command, env = job_command(hr, tmp_path / "work", endpoint, reportUri="s3://qpa/releases/")
    env = {k: v for k, v in env.items() if not k.endswith("_FILE")}  # no Secret mounted
    result = run_job(
        command,
        env,
        QPA_S3_ENDPOINT="http://127.0.0.1:9",
        AWS_ACCESS_KEY_ID="",
        AWS_SECRET_ACCESS_KEY="",
    )
    assert result.returncode != 0 and "no S3 credentials" in result.stderr + result.stdout
    assert not (tmp_path / "work" / "trajectories.jsonl").exists()


def test_the_benchmark_job_publishes_to_s3(
    tmp_path: Path, seaweed: SeaweedS3, endpoint: str
) -> None:
    root = seaweed.root("bench-publish")
    hr = release(
        f"{root}/releases/",
        store={"endpoint": seaweed.endpoint, "secretRef": {"name": "qpa-store"}},
    )
    command, env = job_command(hr, tmp_path / "work", endpoint)
    assert builder.report_prefix(hr, Defaults()).startswith(f"{root}/releases/")
    # the pod reads its keys from the mounted Secret's files; here they are local files
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "access").write_text(seaweed.access_key)
    (keys / "secret").write_text(seaweed.secret_key)
    result = run_job(
        command,
        env,
        QPA_S3_ACCESS_KEY_FILE=str(keys / "access"),
        QPA_S3_SECRET_KEY_FILE=str(keys / "secret"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    candidate = builder.candidate(hr, Defaults())
    assert candidate.report_uri is not None
    config = seaweed.store_config()
    report = read_report(candidate.report_uri, config)
    assert report.tasks == LIMIT and report.complete
    assert judge(candidate.report_uri, None, hr.spec.gate, config).passed
