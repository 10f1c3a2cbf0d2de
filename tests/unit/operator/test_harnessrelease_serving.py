"""HarnessRelease on KServe as it is run: the model's vLLM flags and resources, the storage
initializer's credentials, the stable model endpoint, the deployment mode, and the canary
analysis (`qpa_operator.analysis` and the state machine's use of it).

Every manifest is validated as the API server validates it: built-in kinds against the
official Kubernetes schemas (strict), InferenceServices against KServe's own CRD (vendored).
"""

from __future__ import annotations

import base64
import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fakes import kube_builtin
from fakes.kube_schema import CustomResourceSchema
from qpa_operator import analysis, release
from qpa_operator.builders import Defaults
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders.common import spec_hash_of

from qpa.api import HarnessRelease, parse_resource
from qpa.api.v1alpha1 import CanaryAnalysis, MetricsSample, ObjectStore

ROOT = Path(__file__).resolve().parents[3]
D = Defaults()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
KSERVE = CustomResourceSchema(
    yaml.safe_load(
        (ROOT / "tests/fakes/vendor/kserve/serving.kserve.io_inferenceservices.yaml").read_text()
    )["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
)


def valid(obj: dict[str, Any]) -> None:
    if obj["kind"] == "InferenceService":
        body = copy.deepcopy(obj)
        assert not KSERVE.prune(body)
        assert not KSERVE.validate(body), KSERVE.validate(body)
        return
    checked = kube_builtin.check(obj)
    assert not checked.errors and not checked.unknown, (checked.errors, checked.unknown)


def body(**model: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "harnessrelease.yaml").read_text())
    doc["metadata"].update(namespace="team-a", uid="uid-planner", generation=1)
    doc["spec"]["model"].update(model)
    doc["spec"]["canary"] = {"steps": [10, 100], "stepSeconds": 60}
    return doc


def release_of(doc: dict[str, Any]) -> HarnessRelease:
    hr = parse_resource(doc)
    assert isinstance(hr, HarnessRelease)
    return hr


def cpu_memory_gpu(resources: dict[str, Any]) -> dict[str, Any]:
    """Requests and limits of CPU, memory and GPUs (what this module decides)."""
    keep = ("cpu", "memory", "nvidia.com/gpu")
    return {
        part: {k: v for k, v in values.items() if k in keep} for part, values in resources.items()
    }


def predictor(hr: HarnessRelease) -> dict[str, Any]:
    isvc = builder.model_service(hr, D)
    valid(isvc)
    return dict(isvc["spec"]["predictor"])


# --------------------------------------------------------------------------- the model


def test_vllm_gets_tensor_parallel_dtype_context_and_resources() -> None:
    hr = release_of(body())  # the example: 2 GPUs, 32768 tokens, 8 CPUs and 64Gi requested
    p = predictor(hr)
    model = p["model"]
    assert model["args"] == [
        "--model_name=planner", "--backend=vllm", "--dtype=bfloat16",
        "--tensor-parallel-size=2", "--max-model-len=32768",
    ]  # fmt: skip
    assert cpu_memory_gpu(model["resources"]) == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
    }
    # Two GPUs talk over NCCL: a memory-backed /dev/shm.
    assert p["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    assert model["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert "ports" not in model  # the runtime's own (8080): Knative takes exactly one


def test_unset_cpu_and_memory_get_defaults_per_gpu() -> None:
    doc = body(gpus=4, dtype="float16")
    del doc["spec"]["model"]["resources"]
    p = predictor(release_of(doc))
    assert "--dtype=float16" in p["model"]["args"]
    assert "--tensor-parallel-size=4" in p["model"]["args"]
    assert cpu_memory_gpu(p["model"]["resources"]) == {
        "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "128Gi", "nvidia.com/gpu": "4"},
    }
    # A memory limit alone: the request follows it (as Kubernetes would), nothing is invented.
    doc = body(gpus=1, resources={"limits": {"memory": "40Gi"}})
    p = predictor(release_of(doc))
    assert p["model"]["resources"]["requests"]["memory"] == "40Gi"
    assert p["model"]["resources"]["requests"]["cpu"] == "4"
    assert "volumes" not in p  # one GPU: no shared-memory volume


def test_a_cpu_model_has_no_tensor_parallel_flag_and_no_gpu() -> None:
    doc = body(runtime="huggingface", gpus=0)
    del doc["spec"]["model"]["resources"]
    p = predictor(release_of(doc))
    args = p["model"]["args"]
    assert "--backend=huggingface" in args and "--dtype=bfloat16" in args
    assert not any(a.startswith("--tensor-parallel-size") for a in args)
    assert cpu_memory_gpu(p["model"]["resources"]) == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }
    assert "tolerations" not in p


def test_a_bad_dtype_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"model\.dtype"):
        release_of(body(dtype="int4"))


# --------------------------------------------------------------------------- storage


def test_an_s3_model_is_downloaded_with_the_stores_keys_in_kserve_format() -> None:
    hr = release_of(body())  # s3:// model, store http://minio.qpa-system.svc:9000, qpa-minio
    p = predictor(hr)
    assert p["serviceAccountName"] == "planner-model-storage"
    store = builder.model_store(hr, D)
    source = builder.storage_source(store, "41")
    assert source != builder.storage_source(store, "42")  # a changed Secret: a new source
    secret = builder.storage_secret(hr, D, store, source, "AKIA-test", "s3cr3t/+=")
    account = builder.storage_account(hr, D, store, source)
    valid(secret)
    valid(account)
    assert secret["metadata"]["name"] == f"planner-model-storage-{source[:8]}"
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "AWS_ACCESS_KEY_ID": "AKIA-test",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t/+=",
    }
    kserve = {
        "serving.kserve.io/s3-endpoint": "minio.qpa-system.svc:9000",
        "serving.kserve.io/s3-usehttps": "0",
        "serving.kserve.io/s3-region": "us-east-1",
        "serving.kserve.io/s3-useanoncredential": "false",
    }
    for obj in (secret, account):
        assert kserve.items() <= obj["metadata"]["annotations"].items()
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-planner"
    # No digest of the keys anywhere: the Secret carries no spec hash.
    assert "qpa.ai/spec-hash" not in secret["metadata"]["annotations"]
    assert account["secrets"] == [{"name": secret["metadata"]["name"]}]
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["annotations"][builder.STORAGE_SOURCE_ANNOTATION] == source
    https = ObjectStore.model_validate(
        {"endpoint": "https://s3.eu-west-1.amazonaws.com", "region": "eu-west-1",
         "secretRef": {"name": "aws"}}
    )  # fmt: skip
    assert builder.s3_annotations(https)["serving.kserve.io/s3-usehttps"] == "1"
    assert builder.s3_annotations(https)["serving.kserve.io/s3-endpoint"] == (
        "s3.eu-west-1.amazonaws.com"
    )


def test_a_model_from_elsewhere_needs_no_storage_account() -> None:
    hr = release_of(body(uri="hf://org/model@main"))
    assert "serviceAccountName" not in predictor(hr)
    assert not release.needs_storage(hr)
    assert release.needs_storage(release_of(body()))


def test_an_s3_model_without_any_store_names_the_missing_setting() -> None:
    doc = body()
    del doc["spec"]["store"]
    doc["spec"]["reportUri"] = "s3://qpa/default/releases/planner/"
    with pytest.raises(ValueError, match=r"spec\.store .*s3:// spec\.(model\.uri|reportUri)"):
        builder.model_service(release_of(doc), D)


# --------------------------------------------------------------------------- endpoints, mode


def test_the_stable_model_endpoint_follows_the_stable_version() -> None:
    hr = release_of(body())
    service = builder.stable_endpoint(hr, D, hr.spec.model)
    valid(service)
    assert service["metadata"]["name"] == "planner-model"
    assert service["spec"]["selector"] == {
        "serving.kserve.io/inferenceservice": builder.model_name(hr)
    }
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}
    ]
    assert builder.stable_model_url(hr, D) == (
        "http://planner-model.team-a.svc.cluster.local:8080/openai/v1"
    )
    # The example TaskBatch points at it (in its namespace, default).
    tb = yaml.safe_load((ROOT / "examples" / "taskbatch.yaml").read_text())
    assert tb["spec"]["policy"]["modelUrl"] == (
        "http://planner-model.default.svc.cluster.local:8080/openai/v1"
    )
    # The namespace's TaskBatch pods may reach the stable model's pods (and only that model).
    children = [builder.model_service(hr, D), service, builder.harness_service(hr, D)]
    policies = {p["metadata"]["name"]: p for p in builder.network_policies(hr, D, children)}
    ingress = policies[f"{builder.model_name(hr)}-ingress"]["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchExpressions": [
        {"key": "qpa.ai/taskbatch", "operator": "Exists"}]}} in ingress  # fmt: skip
    for policy in policies.values():
        valid(policy)


def test_every_inferenceservice_is_pinned_to_serverless_and_rawdeployment_is_refused() -> None:
    hr = release_of(body())
    for isvc in (builder.model_service(hr, D), builder.harness_service(hr, D)):
        assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    raw = body()
    raw["spec"]["rollout"]["deploymentMode"] = "RawDeployment"
    decision = release.next_step(release_of(raw), release.Observed(now=T0), D)
    status = decision.status
    assert status.phase == "RolledBack" and status.decision == "rollback"
    rejected = next(c for c in status.conditions if c.type == "Rejected")
    assert rejected.reason == "UnsupportedDeploymentMode"
    assert "spec.rollout.deploymentMode RawDeployment" in rejected.message
    assert release.children(release_of(raw), status, D).apply == ()  # nothing deployed
    # KServe running the Harness in another mode than asked: refused as well.
    reported = {"status": {"deploymentMode": "RawDeployment"}}
    decision = release.next_step(hr, release.Observed(now=T0, harness=reported), D)
    assert decision.status.phase == "RolledBack"
    assert "in RawDeployment mode" in decision.status.reasons[0]


# --------------------------------------------------------------------------- measurements

SETTINGS = CanaryAnalysis(min_requests=10, max_error_rate=0.1, max_p95_latency_seconds=2.0)


def sample(requests: float, errors: float, buckets: dict[str, float]) -> MetricsSample:
    return MetricsSample(requests=requests, errors=errors, buckets=buckets, at=T0)


def test_quantiles_interpolate_as_prometheus_does() -> None:
    buckets = {"0.5": 50.0, "1": 90.0, "2.5": 100.0, "+Inf": 100.0}
    assert analysis.quantile(0.5, buckets) == pytest.approx(0.5)
    assert analysis.quantile(0.95, buckets) == pytest.approx(1.0 + 1.5 * 5 / 10)
    assert analysis.quantile(0.95, {"1": 10.0, "+Inf": 20.0}) == 1.0  # in +Inf: the last bound
    assert analysis.quantile(0.95, {"1": 0.0, "+Inf": 0.0}) is None
    assert analysis.quantile(0.95, {"1": 3.0}) is None  # no +Inf bucket: not a histogram


def test_a_measurement_judges_only_the_requests_since_the_baseline() -> None:
    base = sample(1000, 500, {"1": 900.0, "+Inf": 1000.0})  # a bad past does not count
    good = analysis.measure(base, sample(1100, 505, {"1": 999.0, "+Inf": 1100.0}), SETTINGS)
    assert good.outcome == "passed" and good.requests == 100 and good.error_rate == 0.05
    assert good.p95_seconds is not None and good.p95_seconds <= 1.0
    bad = analysis.measure(base, sample(1100, 520, {"1": 999.0, "+Inf": 1100.0}), SETTINGS)
    assert bad.outcome == "failed" and "error rate 20.00% above maxErrorRate 10.00%" in bad.message
    base = sample(1000, 500, {"1": 900.0, "5": 950.0, "+Inf": 1000.0})
    current = sample(1100, 500, {"1": 910.0, "5": 1050.0, "+Inf": 1100.0})
    slow = analysis.measure(base, current, SETTINGS)  # p95 = 1 + 4 * 85 / 90 s
    assert slow.outcome == "failed" and "above maxP95LatencySeconds 2 s" in slow.message
    assert slow.p95_seconds == pytest.approx(1 + 4 * 85 / 90)
    few = analysis.measure(base, sample(1005, 505, {"+Inf": 1005.0}), SETTINGS)
    assert few.outcome == "inconclusive" and "fewer than minRequests 10" in few.message
    reset = analysis.measure(base, sample(3, 0, {"+Inf": 3.0}), SETTINGS)
    assert reset.outcome == "reset"
    blind = analysis.measure(base, sample(1100, 500, {}), SETTINGS)
    assert blind.outcome == "failed" and "no latency histogram" in blind.message


TEXT = """\
# HELP qpa_harness_requests_total Requests.
# TYPE qpa_harness_requests_total counter
qpa_harness_requests_total{code="200",model="harness"} 90
qpa_harness_requests_total{code="400",model="harness"} 5
qpa_harness_requests_total{code="503",model="harness"} 5
# TYPE qpa_harness_request_seconds histogram
qpa_harness_request_seconds_bucket{le="0.5"} 60
qpa_harness_request_seconds_bucket{le="1.0"} 95
qpa_harness_request_seconds_bucket{le="+Inf"} 100
qpa_harness_request_seconds_sum 40
qpa_harness_request_seconds_count 100
"""


def test_prometheus_text_gives_requests_5xx_errors_and_buckets() -> None:
    parsed = analysis.parse_text(TEXT, CanaryAnalysis(), T0)
    assert (parsed.requests, parsed.errors) == (100, 5)  # a 400 is the caller's, not an error
    assert parsed.buckets == {"0.5": 60.0, "1": 95.0, "+Inf": 100.0}
    with pytest.raises(analysis.MetricsUnavailable, match="not Prometheus text"):
        analysis.parse_text('qpa_harness_requests_total{code="200" 1\n', CanaryAnalysis(), T0)


@pytest.mark.asyncio
async def test_samples_come_from_the_metrics_endpoint_or_a_prometheus_query() -> None:
    seen: list[httpx.URL] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=TEXT)
        query = request.url.params["query"]
        if query.startswith("sum by (code)"):
            vector = [{"metric": {"code": "200"}, "value": [0, "40"]},
                      {"metric": {"code": "500"}, "value": [0, "2"]}]  # fmt: skip
        else:
            vector = [{"metric": {"le": "1"}, "value": [0, "30"]},
                      {"metric": {"le": "+Inf"}, "value": [0, "42"]}]  # fmt: skip
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": vector}}
        )

    transport = httpx.MockTransport(answer)
    direct = await analysis.read_sample(
        CanaryAnalysis(), metrics_url="http://cand/metrics", namespace="team-a", revision=None,
        at=T0, transport=transport,
    )  # fmt: skip
    assert (direct.requests, direct.errors) == (100, 5)
    prom = CanaryAnalysis(prometheus_url="http://prometheus:9090")
    queried = await analysis.read_sample(
        prom, metrics_url="unused", namespace="team-a",
        revision="planner-harness-predictor-00002", at=T0, transport=transport,
    )  # fmt: skip
    assert (queried.requests, queried.errors) == (42, 2)
    assert queried.buckets == {"1": 30.0, "+Inf": 42.0}
    assert seen[1].params["query"] == (
        'sum by (code) (qpa_harness_requests_total{namespace="team-a",'
        'pod=~"planner-harness-predictor-00002-.*"})'
    )
    with pytest.raises(analysis.MetricsUnavailable, match="latestCreatedRevision"):
        await analysis.read_sample(
            prom, metrics_url="x", namespace="team-a", revision=None, at=T0, transport=transport
        )
    refused = httpx.MockTransport(lambda r: httpx.Response(503, text="secret body"))
    with pytest.raises(analysis.MetricsUnavailable) as info:
        await analysis.read_sample(
            CanaryAnalysis(), metrics_url="http://cand/metrics", namespace="n", revision=None,
            at=T0, transport=refused,
        )  # fmt: skip
    assert "answered 503" in str(info.value) and "secret body" not in str(info.value)


# --------------------------------------------------------------------------- the state machine


def canary_release(**settings: Any) -> dict[str, Any]:
    """A release whose candidate passed the gate and is at its first canary step."""
    doc = body()
    doc["spec"]["rollout"]["analysis"] = {
        "intervalSeconds": 10, "minRequests": 10, "maxErrorRate": 0.1,
        "maxP95LatencySeconds": 2, "failureLimit": 0, **settings,
    }  # fmt: skip
    hr = release_of(doc)
    stable = builder.candidate(release_of(body(uri="s3://qpa/default/models/old/")), D)
    status = {
        "phase": "Canary", "canaryStep": 0, "trafficPercent": 10,
        "since": T0.isoformat(), "decision": "promote",
        "candidate": builder.candidate(hr, D).to_k8s(), "stable": stable.to_k8s(),
    }  # fmt: skip
    doc["status"] = status
    return doc


class Canary:
    """The release and a Harness InferenceService KServe reports Ready for its spec."""

    def __init__(self, **settings: Any) -> None:
        self.doc = canary_release(**settings)
        self.now = T0
        self.decisions: list[release.Decision] = []

    @property
    def hr(self) -> HarnessRelease:
        return release_of(copy.deepcopy(self.doc))

    def harness(self) -> dict[str, Any]:
        status = self.hr.status
        assert status is not None
        live = release.harness_manifest(self.hr, status, D)
        assert live is not None
        live = copy.deepcopy(live)
        live["metadata"]["generation"] = 1
        live["status"] = {"observedGeneration": 1,
                          "conditions": [{"type": "Ready", "status": "True"}]}  # fmt: skip
        return live

    def step(self, at: float, metrics: MetricsSample | None = None) -> release.Decision:
        self.now = T0 + timedelta(seconds=at)
        if metrics is not None:
            metrics = metrics.model_copy(update={"at": self.now})
        observed = release.Observed(
            now=self.now, harness=self.harness(), metrics=metrics,
            metrics_problem=None if metrics is not None else "GET ... failed (ConnectError)",
        )  # fmt: skip
        decision = release.next_step(self.hr, observed, D)
        self.doc["status"] = decision.status.to_k8s()
        self.decisions.append(decision)
        return decision

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.doc["status"])


def counters(requests: float, errors: float = 0) -> MetricsSample:
    return sample(requests, errors, {"1": requests, "+Inf": requests})


def test_good_live_metrics_promote_step_by_step() -> None:
    canary = Canary()
    d = canary.step(0, counters(0))  # Ready at 10%: the baseline
    assert canary.status["analysis"]["baseline"]["requests"] == 0
    assert d.wake_at == T0 + timedelta(seconds=10)
    canary.step(10, counters(30, 1))  # passes, but the step is held 60 s
    assert canary.status["phase"] == "Canary" and canary.status["canaryStep"] == 0
    assert canary.status["analysis"]["passed"] and canary.status["analysis"]["measurements"] == 1
    canary.step(60, counters(200, 5))  # the hold is over and the measurement passes: 100%
    assert (canary.status["canaryStep"], canary.status["trafficPercent"]) == (1, 100)
    step_event = next(e for e in canary.decisions[-1].events if e.reason == "CanaryStep")
    assert "analysis: 200 requests, error rate 2.50%" in step_event.message
    canary.step(61, counters(200, 5))  # a new baseline at the last step: analysed as well
    assert canary.status["analysis"]["step"] == 1 and canary.status["phase"] == "Canary"
    canary.step(121, counters(400, 6))
    assert canary.status["phase"] == "Promoted" and canary.status["trafficPercent"] == 100
    conditions = {c["type"]: c for c in canary.status["conditions"]}
    assert conditions["AnalysisPassed"]["status"] == "True"


def test_an_error_rate_over_the_threshold_rolls_back_to_the_stable_spec() -> None:
    canary = Canary()
    canary.step(0, counters(0))
    d = canary.step(10, counters(50, 10))  # 20% answered 5xx
    status = d.status
    assert status.phase == "RolledBack" and status.decision == "rollback"
    assert status.reasons[0].startswith("canary analysis failed at step 1 (10%)")
    assert "error rate 20.00% above maxErrorRate 10.00%" in status.reasons[0]
    rejected = next(c for c in status.conditions if c.type == "Rejected")
    assert rejected.reason == "AnalysisFailed"
    assert any(e.reason == "RolledBack" and e.warning for e in d.events)
    # The Harness InferenceService is the stable version's again, whole, at 100%.
    harness = release.harness_manifest(canary.hr, status, D)
    assert status.stable is not None and harness is not None
    expected = builder.harness_service(canary.hr, D, status.stable, 100)
    assert harness == expected and spec_hash_of(harness) == spec_hash_of(expected)
    assert harness["metadata"]["labels"][builder.VERSION_LABEL] == status.stable.id
    models = [c for c in release.children(canary.hr, status, D).apply
              if c["metadata"]["labels"].get(builder.MODEL_LABEL)]  # fmt: skip
    assert [m["spec"]["predictor"]["model"]["storageUri"] for m in models] == [
        "s3://qpa/default/models/old/"
    ]


def test_failure_limit_unreadable_metrics_and_too_few_requests() -> None:
    canary = Canary(failureLimit=1)
    canary.step(0, counters(0))
    d = canary.step(10, None)  # unreadable: a failed measurement, one is tolerated
    assert canary.status["phase"] == "Canary" and canary.status["analysis"]["failures"] == 1
    assert any(e.reason == "AnalysisFailed" and e.warning for e in d.events)
    canary.step(20, counters(50, 10))  # the second failure is one too many
    assert canary.status["phase"] == "RolledBack"

    canary = Canary()
    canary.step(0, counters(0))
    canary.step(60, counters(3))  # the hold is over, but 3 requests prove nothing
    assert canary.status["phase"] == "Canary"
    conditions = {c["type"]: c for c in canary.status["conditions"]}
    assert conditions["AnalysisPassed"]["reason"] == "Inconclusive"
    canary.step(1801, counters(5))  # past timeouts.deploySeconds without evidence
    assert canary.status["phase"] == "RolledBack"
    rejected = {c["type"]: c for c in canary.status["conditions"]}["Rejected"]
    assert rejected["reason"] == "AnalysisInconclusive"


def test_promoted_status_names_the_stable_model_endpoint() -> None:
    doc = body()
    hr = release_of(doc)
    version = builder.candidate(hr, D)
    doc["status"] = {"phase": "Promoted", "candidate": version.to_k8s(),
                     "stable": version.to_k8s(), "trafficPercent": 100}  # fmt: skip
    status = release.next_step(release_of(doc), release.Observed(now=T0), D).status
    assert status.model_endpoint == "http://planner-model.team-a.svc.cluster.local:8080/openai/v1"


def test_the_model_server_pod_meets_the_restricted_standard() -> None:
    from helpers.podsecurity import violations

    for model in ({}, {"gpus": 2}):
        spec = predictor(release_of(body(**model)))
        container = {k: v for k, v in spec.pop("model").items() if k != "modelFormat"}
        pod = {**spec, "containers": [{"name": "kserve-container", **container}]}
        # the Pod Security Standard's restricted profile; the root filesystem stays writable
        # (beyond the standard: model servers write caches under $HOME)
        assert violations(pod) == ["kserve-container: readOnlyRootFilesystem"]
