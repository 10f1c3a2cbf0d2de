"""The release verdict: reports read through qpa.store, gated, failing closed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers.release_reports import report_bytes

from qpa.api.v1alpha1 import GateSettings, ObjectStore, StoreSecretRef
from qpa.release.verdict import (
    ReportUnavailable,
    deltas,
    judge,
    read_report,
    report_uri,
    store_config,
)
from qpa.store import StoreConfig

GATE = GateSettings(min_overall=0.5, max_capability_regression=0.05, max_cost_increase=None)


def put(root: Path, name: str, data: bytes) -> str:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_bytes(data)
    return f"file://{folder}/"


def test_a_better_candidate_passes_with_scores_and_deltas(tmp_path: Path) -> None:
    stable = put(tmp_path, "stable", report_bytes({"tool_use": 7, "memory": 8}))
    candidate = put(tmp_path, "candidate", report_bytes({"tool_use": 9, "memory": 8}))
    verdict = judge(candidate, report_uri(stable), GATE)
    assert verdict.passed and verdict.kind == "passed" and verdict.reasons == []
    assert verdict.report_uri == f"{candidate}report.json"
    assert verdict.scores is not None and verdict.stable_scores is not None
    assert verdict.scores.by_capability["tool_use"] == 0.9
    assert verdict.deltas["tool_use"] == pytest.approx(0.2)
    assert verdict.deltas["memory"] == 0.0
    assert verdict.deltas["overall"] == pytest.approx(0.05)


def test_a_regression_beyond_the_margin_fails_with_every_reason(tmp_path: Path) -> None:
    stable = put(tmp_path, "stable", report_bytes({}))
    candidate = put(tmp_path, "candidate", report_bytes({"tool_use": 8, "skills": 9}))
    verdict = judge(candidate, stable, GATE)
    assert not verdict.passed and verdict.kind == "gate_failed"
    assert len(verdict.reasons) == 2
    assert verdict.reasons[0].startswith("tool_use: 80.00% vs baseline 100.00%")
    assert "beyond the allowed -5.0" in verdict.reasons[0]
    assert verdict.reasons[1].startswith("skills: ")
    assert verdict.deltas["tool_use"] == pytest.approx(-0.2)


def test_a_first_release_is_judged_on_the_absolute_thresholds(tmp_path: Path) -> None:
    candidate = put(tmp_path, "candidate", report_bytes({c: 2 for c in ("tool_use", "memory")}))
    verdict = judge(candidate, None, GATE.model_copy(update={"min_overall": 0.7}))
    assert not verdict.passed and verdict.deltas == {} and verdict.stable_scores is None
    assert verdict.reasons == ["overall success 60.00% < minimum 70.00%"]


@pytest.mark.parametrize(
    ("content", "kind", "words"),
    [
        (None, "report_missing", "missing"),
        (b'{"schema_version": 1, "suite": "mob', "report_corrupt", "corrupt JSON at line 1"),
        (b"[1, 2]", "report_corrupt", "expected a JSON object, got list"),
        (b'{"schema_version": 7}', "report_corrupt", "field 'schema_version'"),
        (b'{"schema_version": 1, "suite": "x"}', "report_corrupt", "split"),
        (b"\xff\xfe", "report_corrupt", "corrupt JSON"),
    ],
)
def test_missing_or_broken_candidate_reports_fail_closed(
    tmp_path: Path, content: bytes | None, kind: str, words: str
) -> None:
    folder = tmp_path / "candidate"
    folder.mkdir()
    if content is not None:
        (folder / "report.json").write_bytes(content)
    stable = put(tmp_path, "stable", report_bytes({}))
    verdict = judge(f"file://{folder}", stable, GATE)
    assert not verdict.passed and verdict.kind == kind
    (reason,) = verdict.reasons
    assert f"file://{folder}/report.json" in reason and words in reason


def test_an_unreadable_stable_report_fails_and_still_lists_the_candidates_problems(
    tmp_path: Path,
) -> None:
    candidate = put(tmp_path, "candidate", report_bytes({"tool_use": 1, "memory": 1}))
    stable = put(tmp_path, "stable", b"not json")
    verdict = judge(candidate, stable, GATE.model_copy(update={"min_overall": 0.9}))
    assert not verdict.passed and verdict.kind == "stable_report_unreadable"
    assert verdict.reasons[0].startswith("stable release: report ")
    assert any("overall success" in r for r in verdict.reasons[1:])
    assert verdict.scores is not None  # the candidate's numbers are still shown


def test_an_unreachable_store_is_not_a_verdict() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = StoreConfig(
        endpoint=f"http://127.0.0.1:{port}", retries=0, connect_timeout_s=0.5, timeout_s=1.0
    )
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        with pytest.raises(ReportUnavailable, match="store unavailable"):
            read_report("s3://qpa/releases/planner/abc/", config)
        with pytest.raises(ReportUnavailable):
            judge("s3://qpa/releases/planner/abc/", None, GATE, config)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("AWS_ACCESS_KEY_ID", raising=False)
        mp.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
        with pytest.raises(ReportUnavailable, match="no S3 credentials"):
            read_report("s3://qpa/releases/planner/abc/", config)


def test_the_resource_names_the_endpoint_and_the_reader_keeps_its_credentials() -> None:
    base = StoreConfig(endpoint="http://minio:9000", access_key_file=Path("/keys/a"))
    store = ObjectStore(
        endpoint="http://seaweed:8333", region="eu-1", secret_ref=StoreSecretRef(name="s")
    )
    config = store_config(store, base)
    assert (config.endpoint, config.region) == ("http://seaweed:8333", "eu-1")
    assert config.access_key_file == Path("/keys/a")
    assert store_config(None, base) == base


def test_reports_on_s3_are_read_through_the_store(seaweed: object, tmp_path: Path) -> None:
    from fakes.seaweed import SeaweedS3

    assert isinstance(seaweed, SeaweedS3)
    root = seaweed.root("verdict")
    config = seaweed.store_config()
    from qpa.store import open_store

    store = open_store(root, config)
    store.put_bytes("stable/report.json", report_bytes({"memory": 9}))
    store.put_bytes("candidate/report.json", report_bytes({}))
    verdict = judge(f"{root}/candidate/", f"{root}/stable/report.json", GATE, config)
    assert verdict.passed and verdict.deltas["memory"] == pytest.approx(0.1)
    assert verdict.report_uri == f"{root}/candidate/report.json"
    missing = judge(f"{root}/nothing/", None, GATE, config)
    assert missing.kind == "report_missing"


def test_deltas_cover_what_both_scored() -> None:
    from qpa.api.v1alpha1 import Scores

    a = Scores(overall=0.8, by_capability={"memory": 0.5, "skills": 0.9})
    b = Scores(overall=0.7, by_capability={"memory": 0.6})
    assert deltas(a, b) == {"overall": pytest.approx(0.1), "memory": pytest.approx(-0.1)}
    assert deltas(a, None) == {}
    assert json.loads(json.dumps(deltas(a, b)))
