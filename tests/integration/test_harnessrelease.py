"""HarnessRelease end to end: the real operator releases, gates, canaries and rolls back.

The real operator runs in a `KopfRunner` against the test API server (tests/fakes/kube_api.py);
kubectl applies, patches, annotates and shows the releases. The tests play the cluster's
controllers and the benchmark: they mark InferenceServices Ready for their current generation
(as KServe does), mark the benchmark Job complete or failed (as the Job controller does), and
put the benchmark's `report.json` where the Job's work order says (`resolved.reportUri`, as
`qpa bench run --spec` does), on a real S3 server (SeaweedFS: a HarnessRelease takes s3://
reports only). The operator reads it through `qpa.store` and gates it with `qpa.bench.gate`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from helpers.operator_runner import (
    NS,
    container,
    events_for,
    example,
    exists,
    isvc_ready,
    job_complete,
    job_failed,
    operator,
    owned,
    phase,
    status,
)
from helpers.release_reports import report_bytes

from qpa.api.v1alpha1 import WORK_ORDER_KEY
from qpa.store import open_store

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

NAME = "planner"
HARNESS = "planner-harness"
GOOD = report_bytes({"tool_use": 8, "memory": 8, "skills": 8, "subagent": 8})
BETTER = report_bytes({"tool_use": 9, "memory": 9, "skills": 8, "subagent": 8})
REGRESSED = report_bytes({"tool_use": 6, "memory": 9, "skills": 9, "subagent": 9})


@pytest.fixture
def release_env(operator_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QPA_OPERATOR_RELEASE_TICK", "0.1")
    return operator_env


class Reports(NamedTuple):
    """Where a release's reports go: a fresh S3 prefix and the release's `spec.store`."""

    uri: str
    store: dict[str, Any]


@pytest.fixture
def reports(kube_api: KubeAPIServer, seaweed: Any, monkeypatch: pytest.MonkeyPatch) -> Reports:
    """A report prefix in SeaweedFS, the store Secret in the namespace (the operator reads with
    it), and admin keys in the environment (the tests write the reports)."""
    kube_api.create({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "qpa-reports", "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    })  # fmt: skip
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    store = {"endpoint": seaweed.endpoint, "secretRef": {"name": "qpa-reports"}}
    return Reports(seaweed.root("releases") + "/", store)


def release_body(report_uri: str, **spec: Any) -> dict[str, Any]:
    body = example("harnessrelease.yaml")
    body["metadata"] = {"name": NAME, "namespace": NS}
    s = body["spec"]
    s["model"]["uri"] = "s3://qpa/models/a/"
    s["reportUri"] = report_uri
    s.pop("store")
    s["benchmark"].pop("rolloutPoolRef")
    s["benchmark"]["samples"] = 1
    s["gate"] = {"minOverall": 0.5, "maxCapabilityRegression": 0.05, "minSamples": 1,
                 "minTasks": 10}  # fmt: skip
    s["canary"] = {"steps": [10, 50, 100], "stepSeconds": 1}
    s["rollout"].pop("analysis")  # readiness-only steps unless a test sets one
    s.update(spec)
    return body


def apply(kubectl: Kubectl, tmp_path: Path, body: dict[str, Any]) -> None:
    path = tmp_path / "hr.yaml"
    path.write_text(yaml.safe_dump(body))
    kubectl("apply", "-f", str(path))


def models(kube: KubeAPIServer) -> dict[str, str]:
    """Model InferenceService name -> its storageUri."""
    return {
        i["metadata"]["name"]: i["spec"]["predictor"]["model"]["storageUri"]
        for i in owned(kube, "inferenceservices", "HarnessRelease", NAME)
        if i["metadata"]["name"] != HARNESS
    }


def traffic(kube: KubeAPIServer) -> int:
    harness = kube.get("inferenceservices", NS, HARNESS)
    assert harness is not None
    return int(harness["spec"]["predictor"]["canaryTrafficPercent"])


def harness_version(kube: KubeAPIServer) -> str:
    """The version the Harness InferenceService's spec serves."""
    harness = kube.get("inferenceservices", NS, HARNESS)
    assert harness is not None
    return str(harness["metadata"]["labels"]["qpa.ai/version"])


def serve_all(kube: KubeAPIServer, rolled_out: list[int] | None = None) -> bool:
    """KServe's part: every InferenceService of the release Ready for its generation.

    `rolled_out` collects the Harness's traffic percent each time it is rolled out.
    """
    for isvc in owned(kube, "inferenceservices", "HarnessRelease", NAME):
        observed = (isvc.get("status") or {}).get("observedGeneration")
        if observed != isvc["metadata"].get("generation"):
            isvc_ready(kube, isvc["metadata"]["name"])
            if rolled_out is not None and isvc["metadata"]["name"] == HARNESS:
                rolled_out.append(int(isvc["spec"]["predictor"]["canaryTrafficPercent"]))
    return True


async def deployed(kube: KubeAPIServer) -> dict[str, Any]:
    """KServe's part while the candidate deploys: Ready, generation after generation."""
    await phase(kube, "qhr", NAME, "Deploying")

    def moved_on() -> bool:
        serve_all(kube)
        return status(kube, "qhr", NAME).get("phase") != "Deploying"

    await kube.eventually(moved_on, timeout=15, interval=0.1)
    return await phase(kube, "qhr", NAME, "Benchmarking")


async def benchmark(kube: KubeAPIServer, report: bytes | None, *, fails: bool = False) -> str:
    """The benchmark Job's part: write the report where it is told, then finish."""
    current = await phase(kube, "qhr", NAME, "Benchmarking")
    job = await exists(kube, "jobs", current["benchmarkJob"])
    uri = await report_folder(kube, job)
    if report is not None:
        open_store(uri).put_bytes("report.json", report)
    if fails:
        job_failed(kube, job["metadata"]["name"])
    else:
        job_complete(kube, job["metadata"]["name"])
    return str(uri)


async def report_folder(kube: KubeAPIServer, job: dict[str, Any]) -> str:
    """Where the benchmark publishes: its work order (the ConfigMap named as the Job)."""
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "work-order"]
    order_map = await exists(kube, "configmaps", volume["configMap"]["name"])
    order = yaml.safe_load(order_map["data"][WORK_ORDER_KEY])
    assert order["kind"] == "HarnessRelease" and order["metadata"]["name"] == NAME
    return str(order["resolved"]["reportUri"])


async def walk_canary(kube: KubeAPIServer) -> list[int]:
    """Ready at every canary step until Promoted; returns the traffic steps seen."""
    seen: list[int] = []

    def step() -> bool:
        if status(kube, "qhr", NAME).get("phase") == "Promoted":
            return True
        serve_all(kube, seen)
        return False

    await kube.eventually(step, timeout=20, interval=0.1)
    return seen


async def first_release(
    kube: KubeAPIServer, kubectl: Kubectl, tmp_path: Path, reports: Reports
) -> dict:
    apply(kubectl, tmp_path, release_body(reports.uri, store=reports.store))
    await deployed(kube)
    await benchmark(kube, GOOD)
    return await phase(kube, "qhr", NAME, "Promoted")


def new_candidate(kubectl: Kubectl, harness: str, model: str) -> None:
    patch = {"spec": {"harness": {"version": harness}, "model": {"uri": model}}}
    kubectl("patch", "qhr", NAME, "--type=merge", "-p", json.dumps(patch))


def conditions(current: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {
        c["type"]: (c["status"], c["reason"], c.get("message", "")) for c in current["conditions"]
    }


def event_reasons(kube: KubeAPIServer) -> list[str]:
    return [e["reason"] for e in events_for(kube, NAME)]


# --------------------------------------------------------------------------- promotion


async def test_a_candidate_that_beats_stable_is_promoted_through_the_canary(
    kube_api: KubeAPIServer, release_env: Path, kubectl: Kubectl, tmp_path: Path, reports: Reports
) -> None:
    with operator():
        first = await first_release(kube_api, kubectl, tmp_path, reports)
        assert first["stable"]["harnessVersion"] == "harness-v3"
        assert first["trafficPercent"] == 100 and traffic(kube_api) == 100
        assert any("first release" in r for r in first["reasons"])
        (v3_model,) = models(kube_api)

        new_candidate(kubectl, "harness-v4", "s3://qpa/models/b/")
        await phase(kube_api, "qhr", NAME, "Deploying")
        await kube_api.eventually(lambda: len(models(kube_api)) == 2)
        assert set(models(kube_api).values()) == {"s3://qpa/models/a/", "s3://qpa/models/b/"}
        await kube_api.eventually(lambda: traffic(kube_api) == 0)  # no traffic for it yet
        await deployed(kube_api)
        uri = await benchmark(kube_api, BETTER)
        assert uri.startswith(reports.uri + "planner/")
        await phase(kube_api, "qhr", NAME, "Canary")
        assert await walk_canary(kube_api) == [10, 50, 100]

        done = await phase(kube_api, "qhr", NAME, "Promoted")
        assert done["decision"] == "promote" and done["trafficPercent"] == 100
        assert done["stable"]["harnessVersion"] == "harness-v4"
        assert done["stable"]["reportUri"] == uri + "report.json"
        assert done["previous"]["harnessVersion"] == "harness-v3"
        assert done["scores"]["byCapability"]["tool_use"] == 0.9
        assert done["deltas"]["tool_use"] == pytest.approx(0.1)
        assert done["deltas"]["overall"] == pytest.approx(0.05)
        assert done["stableScores"] == done["scores"]
        assert done["reasons"][0].startswith("gate passed: overall 85.0% (+5.0 points)")
        assert conditions(done)["GatePassed"][:2] == ("True", "GatePassed")
        # The previous model stays for a rollback.
        assert v3_model in models(kube_api) and len(models(kube_api)) == 2

        rows = [line.split() for line in kubectl("get", "qhr").stdout.splitlines()]
        assert rows[0] == ["NAME", "HARNESS", "PHASE", "DECISION", "SCORE", "DELTA", "STABLE",
                           "TRAFFIC", "AGE"]  # fmt: skip
        assert rows[1][:8] == ["planner", "harness-v4", "Promoted", "promote", "0.85", "0.05",
                               "harness-v4", "100"]  # fmt: skip
        wide = [line.split() for line in kubectl("get", "qhr", "-o", "wide").stdout.splitlines()]
        assert wide[0][8:13] == ["MODEL", "TOOLUSE", "MEMORY", "SKILLS", "SUBAGENT"]
        assert wide[1][8:13] == ["s3://qpa/models/b/", "0.9", "0.9", "0.8", "0.8"]
        await kube_api.eventually(lambda: event_reasons(kube_api).count("Promoted") == 2)
        reasons = event_reasons(kube_api)
        for wanted in ("Deploying", "Benchmarking", "GatePassed", "Canary", "CanaryStep"):
            assert wanted in reasons
        assert reasons.count("CanaryStep") == 2 and reasons.count("Promoted") == 2


async def test_a_capability_regression_beyond_the_margin_is_rolled_back(
    kube_api: KubeAPIServer, release_env: Path, kubectl: Kubectl, tmp_path: Path, reports: Reports
) -> None:
    with operator():
        await first_release(kube_api, kubectl, tmp_path, reports)
        (stable_model,) = models(kube_api)
        new_candidate(kubectl, "harness-v4", "s3://qpa/models/b/")
        await deployed(kube_api)
        assert len(models(kube_api)) == 2
        await benchmark(kube_api, REGRESSED)
        rolled = await phase(kube_api, "qhr", NAME, "RolledBack")
        assert rolled["decision"] == "rollback" and rolled["trafficPercent"] == 0
        assert rolled["stable"]["harnessVersion"] == "harness-v3"
        (reason,) = rolled["reasons"]
        assert reason.startswith("tool_use: 60.00% vs baseline 80.00% (-20.0 points; beyond")
        assert conditions(rolled)["Rejected"] == ("True", "GateFailed", reason)
        assert rolled["deltas"]["tool_use"] == pytest.approx(-0.2)
        # The candidate's model goes; the Harness gets the stable spec back, whole.
        await kube_api.eventually(lambda: list(models(kube_api)) == [stable_model])
        await kube_api.eventually(lambda: harness_version(kube_api) == rolled["stable"]["id"])
        assert traffic(kube_api) == 100
        await kube_api.eventually(lambda: "RolledBack" in event_reasons(kube_api))
        warning = next(e for e in events_for(kube_api, NAME) if e["reason"] == "RolledBack")
        assert warning["type"] == "Warning" and "GateFailed" in warning["message"]


@pytest.mark.parametrize("case", ["job-failed", "report-missing", "report-corrupt"])
async def test_without_a_good_report_nothing_is_promoted(
    kube_api: KubeAPIServer, release_env: Path, reports: Reports, case: str
) -> None:
    with operator():
        kube_api.create(release_body(reports.uri, store=reports.store))
        await deployed(kube_api)
        if case == "job-failed":
            await benchmark(kube_api, None, fails=True)
        elif case == "report-missing":
            await benchmark(kube_api, None)
        else:
            await benchmark(kube_api, GOOD[: len(GOOD) // 2])  # cut short while written
        rolled = await phase(kube_api, "qhr", NAME, "RolledBack")
        code = {"job-failed": "BenchmarkFailed", "report-missing": "ReportMissing",
                "report-corrupt": "ReportCorrupt"}[case]  # fmt: skip
        assert conditions(rolled)["Rejected"][:2] == ("True", code)
        assert rolled["decision"] == "rollback" and "stable" not in rolled
        words = {"job-failed": "BackoffLimitExceeded", "report-missing": "missing",
                 "report-corrupt": "corrupt JSON"}[case]  # fmt: skip
        assert words in rolled["reasons"][0]
        # A first release rejected leaves nothing serving.
        await kube_api.eventually(
            lambda: not owned(kube_api, "inferenceservices", "HarnessRelease", NAME)
        )


# --------------------------------------------------------------------------- restarts, overrides


async def test_an_operator_restart_mid_release_resumes_where_it_was(
    kube_api: KubeAPIServer, release_env: Path, kubectl: Kubectl, tmp_path: Path, reports: Reports
) -> None:
    with operator():
        apply(kubectl, tmp_path, release_body(reports.uri, store=reports.store))
        benchmarking = await deployed(kube_api)
        job = await exists(kube_api, "jobs", benchmarking["benchmarkJob"])
    # While the operator is away the benchmark finishes and writes its report.
    await benchmark(kube_api, GOOD)
    with operator():
        await phase(kube_api, "qhr", NAME, "Promoted")
    (only,) = owned(kube_api, "jobs", "HarnessRelease", NAME)
    assert only["metadata"]["uid"] == job["metadata"]["uid"]  # resumed, not benchmarked again

    with operator():
        new_candidate(kubectl, "harness-v4", "s3://qpa/models/b/")
        await deployed(kube_api)
        await benchmark(kube_api, BETTER)
        await phase(kube_api, "qhr", NAME, "Canary")
        await kube_api.eventually(lambda: traffic(kube_api) == 10)
    # Stopped in the middle of the canary; KServe rolls the step out meanwhile.
    assert status(kube_api, "qhr", NAME)["canaryStep"] == 0
    serve_all(kube_api)
    since = kube_api.request_count()
    with operator():
        assert await walk_canary(kube_api) == [50, 100]  # 10% was rolled out meanwhile
        done = await phase(kube_api, "qhr", NAME, "Promoted")
    assert done["stable"]["harnessVersion"] == "harness-v4"
    jobs = owned(kube_api, "jobs", "HarnessRelease", NAME)
    assert len(jobs) == 1  # the finished benchmark of the current candidate, no second one
    posts = [p for m, p, _, _ in kube_api.request_log(since) if m == "POST" and "/jobs" in p]
    assert posts == []

    # A quiet restart of a settled release writes nothing at all.
    since = kube_api.request_count()
    with operator():
        await asyncio.sleep(1.5)
    writes = [r[:2] for r in kube_api.request_log(since) if r[0] in ("POST", "PATCH", "DELETE")]
    assert writes == []


async def test_overrides_abort_and_force_promote(
    kube_api: KubeAPIServer, release_env: Path, kubectl: Kubectl, tmp_path: Path, reports: Reports
) -> None:
    with operator():
        apply(kubectl, tmp_path, release_body(reports.uri, store=reports.store))
        await deployed(kube_api)
        kubectl("annotate", "qhr", NAME, "qpa.ai/override=abort")
        rolled = await phase(kube_api, "qhr", NAME, "RolledBack")
        assert rolled["override"]["action"] == "abort"
        assert conditions(rolled)["Rejected"][:2] == ("True", "Aborted")
        await kube_api.eventually(
            lambda: (
                "qpa.ai/override"
                not in (kube_api.get("qhr", NS, NAME) or {})["metadata"].get("annotations", {})
            )
        )
        await kube_api.eventually(lambda: not owned(kube_api, "jobs", "HarnessRelease", NAME))

        # A person overrules: the candidate comes back and is promoted without a benchmark.
        kubectl("annotate", "qhr", NAME, "qpa.ai/override=promote")
        await phase(kube_api, "qhr", NAME, "Deploying")

        def promoted_by_hand() -> bool:
            serve_all(kube_api)  # KServe's part: the candidate's services come back Ready
            return status(kube_api, "qhr", NAME).get("phase") == "Promoted"

        await kube_api.eventually(promoted_by_hand, timeout=15, interval=0.1)
        promoted = status(kube_api, "qhr", NAME)
        assert promoted["override"]["action"] == "promote"
        assert conditions(promoted)["Overridden"][:2] == ("True", "ForcePromote")
        assert any("override" in r for r in promoted["reasons"])
        assert not owned(kube_api, "jobs", "HarnessRelease", NAME)  # never benchmarked
        await kube_api.eventually(lambda: event_reasons(kube_api).count("Override") == 2)


async def test_reports_are_read_from_s3(
    kube_api: KubeAPIServer,
    release_env: Path,
    seaweed: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The release names the store (spec.store); the operator reads with that Secret of the
    # release's namespace, never with keys of its own (none in its environment).
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.delenv("QPA_S3_ENDPOINT", raising=False)
    root = seaweed.root("hr")
    body = release_body(f"{root}/")
    body["spec"]["store"] = {"endpoint": seaweed.endpoint, "secretRef": {"name": "qpa-s3"}}
    kube_api.create({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "qpa-s3", "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    })  # fmt: skip
    with operator():
        kube_api.create(body)
        await deployed(kube_api)
        current = await phase(kube_api, "qhr", NAME, "Benchmarking")
        job = await exists(kube_api, "jobs", current["benchmarkJob"])
        env = {e["name"]: e.get("value") for e in container(job)["env"]}
        folder = await report_folder(kube_api, job)
        assert folder.startswith(f"{root}/planner/")
        assert env["QPA_S3_ENDPOINT"] == seaweed.endpoint
        open_store(folder, seaweed.store_config()).put_bytes("report.json", GOOD)
        job_complete(kube_api, job["metadata"]["name"])
        done = await phase(kube_api, "qhr", NAME, "Promoted")
        assert done["stable"]["reportUri"] == folder + "report.json"
        assert done["scores"]["overall"] == 0.8


async def test_a_late_reconcile_of_an_old_override_leaves_a_newer_one(
    kube_api: KubeAPIServer, reports: Reports
) -> None:
    # The race CI once lost: the status write of `abort` wakes a second reconcile of the body
    # that still says abort; by the time it removes "its" annotation a person has written
    # `promote`. The removal must leave `promote` (its own event acts on it) and only remove
    # the value it acted on.
    from qpa_operator.builders.common import Defaults
    from qpa_operator.handlers.harnessrelease import remove_override
    from qpa_operator.handlers.runtime import STATE, Runtime
    from qpa_operator.kube import KubeClient

    body = release_body(reports.uri, store=reports.store)
    body["metadata"]["annotations"] = {"qpa.ai/override": "abort"}
    stale = kube_api.create(body)
    kube_api.patch("qhr", NS, NAME, {"metadata": {"annotations": {"qpa.ai/override": "promote"}}})

    def annotation() -> str | None:
        live = kube_api.get("qhr", NS, NAME) or {}
        return live["metadata"].get("annotations", {}).get("qpa.ai/override")

    client = KubeClient(kube_api.url, retries=0)
    STATE.runtime = Runtime(client, Defaults())
    try:
        await remove_override(stale, "abort")
        assert annotation() == "promote"
        # Acted on `promote` with an older version in hand: a 409, a re-read, still promote.
        older = {
            **stale,
            "metadata": {**stale["metadata"], "annotations": {"qpa.ai/override": "promote"}},
        }
        await remove_override(older, "promote")
        assert annotation() is None
    finally:
        STATE.runtime = None
        await client.close()
