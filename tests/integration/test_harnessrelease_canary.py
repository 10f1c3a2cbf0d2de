"""HarnessRelease canary judged by live metrics, end to end with the real operator.

The real operator runs against the test API server; the tests play KServe (InferenceServices
Ready for their generation) and the benchmark Job (a report in SeaweedFS), and the candidate's
Prometheus endpoint is a real HTTP server on 127.0.0.1 serving Prometheus text
(`spec.rollout.analysis.metricsUrl`) whose counters grow at each scrape, as traffic would. Good
metrics walk the steps 10 -> 50 -> 100 and promote; an error rate over the threshold rolls back
and the Harness InferenceService is the stable version's spec again. The storage
initializer's service account and its Secret (KServe's S3 format, the namespace's store keys)
are checked on the way.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from helpers.operator_runner import (
    NS,
    events_for,
    example,
    exists,
    isvc_ready,
    job_complete,
    operator,
    owned,
    phase,
    status,
)
from helpers.release_reports import report_bytes

from qpa.api.v1alpha1 import WORK_ORDER_KEY
from qpa.store import open_store

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

NAME = "planner"
HARNESS = "planner-harness"
GOOD = report_bytes({"tool_use": 8, "memory": 8, "skills": 8, "subagent": 8})
BETTER = report_bytes({"tool_use": 9, "memory": 9, "skills": 8, "subagent": 8})


class Traffic:
    """The candidate's counters: each scrape sees `per_scrape` more requests, `errors` of them
    answered 503, all within 0.25 s."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.per_scrape = 0
        self.error_share = 0.0
        self.scrapes = 0
        self.lock = threading.Lock()

    def text(self) -> str:
        with self.lock:
            self.scrapes += 1
            bad = int(self.per_scrape * self.error_share)
            self.requests += self.per_scrape
            self.errors += bad
            ok = self.requests - self.errors
            return (
                "# TYPE qpa_harness_requests_total counter\n"
                f'qpa_harness_requests_total{{code="200"}} {ok}\n'
                f'qpa_harness_requests_total{{code="503"}} {self.errors}\n'
                "# TYPE qpa_harness_request_seconds histogram\n"
                f'qpa_harness_request_seconds_bucket{{le="0.25"}} {self.requests}\n'
                f'qpa_harness_request_seconds_bucket{{le="+Inf"}} {self.requests}\n'
                f"qpa_harness_request_seconds_count {self.requests}\n"
                f"qpa_harness_request_seconds_sum {0.1 * self.requests}\n"
            )


@pytest.fixture
def traffic() -> Iterator[tuple[Traffic, str]]:
    state = Traffic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = state.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def release_env(operator_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QPA_OPERATOR_RELEASE_TICK", "0.1")
    return operator_env


def release_body(report_uri: str, store: dict[str, Any]) -> dict[str, Any]:
    body = example("harnessrelease.yaml")
    body["metadata"] = {"name": NAME, "namespace": NS}
    s = body["spec"]
    s["model"]["uri"] = "s3://qpa/models/a/"
    s["reportUri"] = report_uri
    s["store"] = store
    s["benchmark"].pop("rolloutPoolRef")
    s["benchmark"]["samples"] = 1
    s["gate"] = {"minOverall": 0.5, "maxCapabilityRegression": 0.05, "minSamples": 1,
                 "minTasks": 10}  # fmt: skip
    s["canary"] = {"steps": [10, 50, 100], "stepSeconds": 1}
    s["rollout"].pop("analysis")  # the first release has no canary; candidates set it
    return body


def analysis(metrics_url: str) -> dict[str, Any]:
    return {"metricsUrl": metrics_url, "intervalSeconds": 1, "minRequests": 10,
            "maxErrorRate": 0.1, "maxP95LatencySeconds": 1, "failureLimit": 0}  # fmt: skip


def serve_all(kube: KubeAPIServer, rolled_out: list[int] | None = None) -> None:
    """KServe's part: every InferenceService of the release Ready for its generation."""
    for isvc in owned(kube, "inferenceservices", "HarnessRelease", NAME):
        if (isvc.get("status") or {}).get("observedGeneration") != isvc["metadata"]["generation"]:
            isvc_ready(kube, isvc["metadata"]["name"])
            if rolled_out is not None and isvc["metadata"]["name"] == HARNESS:
                rolled_out.append(int(isvc["spec"]["predictor"]["canaryTrafficPercent"]))


async def deploy_and_benchmark(kube: KubeAPIServer, report: bytes) -> None:
    """Ready until Benchmarking, then the benchmark's report and a Complete Job."""
    await phase(kube, "qhr", NAME, "Deploying")

    def benchmarking() -> bool:
        serve_all(kube)
        return status(kube, "qhr", NAME).get("phase") == "Benchmarking"

    await kube.eventually(benchmarking, timeout=20, interval=0.1)
    job = await exists(kube, "jobs", status(kube, "qhr", NAME)["benchmarkJob"])
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "work-order"]
    order = await exists(kube, "configmaps", volume["configMap"]["name"])
    uri = yaml.safe_load(order["data"][WORK_ORDER_KEY])["resolved"]["reportUri"]
    open_store(uri).put_bytes("report.json", report)
    job_complete(kube, job["metadata"]["name"])


def patch_spec(kube: KubeAPIServer, harness: str, model: str, metrics_url: str) -> None:
    obj = kube.get("harnessreleases", NS, NAME)
    assert obj is not None
    spec = obj["spec"]
    spec["harness"]["version"] = harness
    spec["model"]["uri"] = model
    spec["rollout"]["analysis"] = analysis(metrics_url)
    kube.patch("harnessreleases", NS, NAME, {"spec": spec})


def harness(kube: KubeAPIServer) -> dict[str, Any]:
    found = kube.get("inferenceservices", NS, HARNESS)
    assert found is not None
    return found


async def test_live_metrics_promote_step_by_step_and_bad_ones_restore_the_stable_spec(
    kube_api: KubeAPIServer,
    release_env: Path,
    seaweed: Any,
    traffic: tuple[Traffic, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, metrics_url = traffic
    kube_api.create({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "qpa-reports", "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    })  # fmt: skip
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    store = {"endpoint": seaweed.endpoint, "secretRef": {"name": "qpa-reports"}}
    with operator():
        kube_api.create(release_body(seaweed.root("releases") + "/", store))
        await deploy_and_benchmark(kube_api, GOOD)
        first = await phase(kube_api, "qhr", NAME, "Promoted")

        # The storage initializer downloads s3:// models with the namespace's store keys.
        account = await exists(kube_api, "serviceaccounts", "planner-model-storage")
        (secret_ref,) = account["secrets"]
        secret = await exists(kube_api, "secrets", secret_ref["name"])
        assert secret["immutable"] is True
        keys = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        assert keys == {"AWS_ACCESS_KEY_ID": seaweed.access_key,
                        "AWS_SECRET_ACCESS_KEY": seaweed.secret_key}  # fmt: skip
        endpoint = seaweed.endpoint.split("://", 1)[1]
        assert secret["metadata"]["annotations"]["serving.kserve.io/s3-endpoint"] == endpoint
        assert secret["metadata"]["annotations"]["serving.kserve.io/s3-usehttps"] == "0"
        (model,) = [i for i in owned(kube_api, "inferenceservices", "HarnessRelease", NAME)
                    if i["metadata"]["name"] != HARNESS]  # fmt: skip
        assert model["spec"]["predictor"]["serviceAccountName"] == "planner-model-storage"
        assert "--tensor-parallel-size=2" in model["spec"]["predictor"]["model"]["args"]
        # The stable model endpoint TaskBatches point at.
        service = await exists(kube_api, "services", "planner-model")
        assert service["spec"]["selector"] == {
            "serving.kserve.io/inferenceservice": model["metadata"]["name"]
        }
        assert first["modelEndpoint"] == (
            "http://planner-model.default.svc.cluster.local:8080/openai/v1"
        )

        # ---- harness-v4, healthy: 30 requests a scrape, none failing.
        state.per_scrape, state.error_share = 30, 0.0
        patch_spec(kube_api, "harness-v4", "s3://qpa/models/b/", metrics_url)
        await deploy_and_benchmark(kube_api, BETTER)
        await phase(kube_api, "qhr", NAME, "Canary")
        seen: list[int] = []

        def promoted() -> bool:
            serve_all(kube_api, seen)
            return status(kube_api, "qhr", NAME).get("phase") == "Promoted"

        await kube_api.eventually(promoted, timeout=40, interval=0.1)
        assert seen == [10, 50, 100]
        done = status(kube_api, "qhr", NAME)
        assert done["stable"]["harnessVersion"] == "harness-v4"
        assert done["analysis"]["step"] == 2 and done["analysis"]["passed"] is True
        assert done["analysis"]["errorRate"] == 0.0 and done["analysis"]["requests"] >= 10
        steps = [e["message"] for e in events_for(kube_api, NAME) if e["reason"] == "CanaryStep"]
        assert len(steps) == 2 and all("analysis:" in m and "error rate 0.00%" in m for m in steps)
        assert state.scrapes >= 6  # a baseline and a measurement at each of the three steps
        stable_id = done["stable"]["id"]
        stable_spec = harness(kube_api)["spec"]

        # ---- harness-v5, failing: a quarter of its requests answered 503.
        state.per_scrape, state.error_share = 40, 0.25
        patch_spec(kube_api, "harness-v5", "s3://qpa/models/c/", metrics_url)
        await deploy_and_benchmark(kube_api, BETTER)
        await phase(kube_api, "qhr", NAME, "Canary")

        def rolled_back() -> bool:
            serve_all(kube_api)
            return status(kube_api, "qhr", NAME).get("phase") == "RolledBack"

        await kube_api.eventually(rolled_back, timeout=30, interval=0.1)
        rolled = status(kube_api, "qhr", NAME)
        conditions = {c["type"]: c for c in rolled["conditions"]}
        assert conditions["Rejected"]["reason"] == "AnalysisFailed"
        assert "error rate 25.00% above maxErrorRate 10.00%" in conditions["Rejected"]["message"]
        assert conditions["AnalysisPassed"]["status"] == "False"
        assert rolled["stable"]["id"] == stable_id and rolled["decision"] == "rollback"

        # The stable spec is restored whole: no candidate left in it at 0%.
        await kube_api.eventually(
            lambda: harness(kube_api)["metadata"]["labels"]["qpa.ai/version"] == stable_id
        )
        assert harness(kube_api)["spec"] == stable_spec
        assert harness(kube_api)["spec"]["predictor"]["canaryTrafficPercent"] == 100
        await kube_api.eventually(
            lambda: (
                {
                    i["spec"]["predictor"]["model"]["storageUri"]
                    for i in owned(kube_api, "inferenceservices", "HarnessRelease", NAME)
                    if i["metadata"]["name"] != HARNESS
                }
                == {"s3://qpa/models/a/", "s3://qpa/models/b/"}
            )  # previous and stable; c is gone
        )
        warning = next(e for e in events_for(kube_api, NAME) if e["reason"] == "RolledBack")
        assert warning["type"] == "Warning" and "AnalysisFailed" in warning["message"]
