"""HarnessRelease: its spec, status and custom resource model."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field

from qpa.api.v1alpha1.base import (
    IMAGE,
    MAX_IMAGE_LENGTH,
    MAX_MAP_ENTRIES,
    SUITE_NAME,
    Condition,
    ConfigMapKeySelector,
    Count,
    CrossFieldRule,
    EndpointUrl,
    EnvironmentKind,
    LabelName,
    Message,
    ObjectStore,
    OutputUri,
    ResourceRequirements,
    SecretKeySelector,
    ServiceObjectReference,
    ServingUri,
    ShortText,
    Split,
    Text,
    UriText,
    Version,
    _conditions,
    _defaulted,
    _Model,
    _observed_generation,
    _timestamp,
)
from qpa.api.v1alpha1.devicepool import LABEL_VALUE
from qpa.api.v1alpha1.podtemplate import PodTemplate
from qpa.api.v1alpha1.resource import (
    AGE_COLUMN,
    PHASE_COLUMN,
    CustomResource,
    KindInfo,
    PrinterColumn,
)
from qpa.api.v1alpha1.rules import (
    client_controlled_cel,
    client_controlled_header,
    client_controlled_message,
)
from qpa.api.v1alpha1.workorder import PodSummary

#: `--dtype` values vLLM accepts that a release may ask for.
ModelDtype = Literal["bfloat16", "float16", "float32", "auto"]


class ModelServing(_Model):
    """The planner model served by KServe."""

    uri: ServingUri = Field(description="storageUri of the model: s3://, gs://, pvc:// or hf://.")
    runtime: Literal["vllm", "huggingface"] = Field(
        default="vllm", description="Serving runtime (vLLM needs GPUs)."
    )
    served_model_name: str = Field(
        default="planner", min_length=1, max_length=253, description="Name clients ask for."
    )
    gpus: int = Field(default=1, ge=0, le=16, description="GPUs per replica.")
    max_model_length: int | None = Field(
        default=None,
        ge=128,
        le=16_777_216,
        description="Context length limit passed to the runtime (vLLM --max-model-len).",
    )
    dtype: ModelDtype = Field(
        default="bfloat16",
        description="Weights and activations type (vLLM --dtype); bfloat16 unless the GPUs "
        "lack it (auto: the checkpoint's own type).",
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="CPU and memory of each replica; unset cpu/memory requests get the "
        "operator's defaults per GPU (docs/operator.md). GPUs come from gpus.",
    )

    RULES = (
        CrossFieldRule(
            cel="self.runtime != 'vllm' || self.gpus >= 1",
            message="runtime vllm needs gpus >= 1",
            check=lambda m: m.runtime != "vllm" or m.gpus >= 1,
        ),
    )


#: An HTTP header name (what `qpa harness serve --identity-header` accepts).
HEADER_NAME: Final = r"^[A-Za-z0-9-]{1,64}$"
#: A label value of the proxy's selector (never empty: an empty value selects unlabelled pods).
ProxyLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE)]


class HarnessAuth(_Model):
    """How the Harness authenticates its callers, exactly one of two modes.

    Without it callers are anonymous and every episode gets a throwaway memory. In
    identity-header mode the header is believed only from the proxy: the operator admits only
    `proxySelector`'s pods to the Harness (an ingress policy) and the proxy proves itself with
    the shared secret of `proxySecretRef` (`X-Qpa-Proxy-Secret`).
    """

    tokens_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description="Secret key with the bearer tokens: YAML mapping `sha256:<hex of a token>` "
        "to a user id; mounted read-only into the Harness (`--tokens-file`), re-read when the "
        "Secret changes.",
    )
    identity_header: str | None = Field(
        default=None,
        pattern=HEADER_NAME,
        max_length=64,
        description="Header a trusted proxy sets to the authenticated user id "
        "(`--identity-header`, e.g. x-auth-request-user); never one clients set or proxies "
        "append to (X-Forwarded-*, Forwarded, Host, X-Real-IP, ...).",
    )
    proxy_selector: dict[str, ProxyLabel] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MAP_ENTRIES,
        description="Pod labels of the trusted proxy (identity-header mode, required): the only "
        "pods the Harness admits.",
    )
    proxy_namespace: LabelName | None = Field(
        default=None, description="Namespace of the proxy's pods (default: the release's)."
    )
    proxy_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description="Secret key with the shared secret the proxy sends in X-Qpa-Proxy-Secret "
        "(identity-header mode, required; at least 32 characters).",
    )

    RULES = (
        CrossFieldRule(
            cel="has(self.tokensSecretRef) != has(self.identityHeader)",
            message="set exactly one of tokensSecretRef or identityHeader",
            check=lambda m: (m.tokens_secret_ref is None) != (m.identity_header is None),
        ),
        CrossFieldRule(
            cel="!has(self.identityHeader) || " + client_controlled_cel("self.identityHeader"),
            message="identityHeader: " + client_controlled_message(),
            check=lambda m: (
                m.identity_header is None or not client_controlled_header(m.identity_header)
            ),
        ),
        CrossFieldRule(
            cel="has(self.identityHeader) ? (has(self.proxySelector) && "
            "has(self.proxySecretRef)) : !(has(self.proxySelector) || has(self.proxySecretRef) "
            "|| has(self.proxyNamespace))",
            message="identityHeader needs proxySelector and proxySecretRef (the proxy's pods "
            "and shared secret), and they belong to identity-header mode only",
            check=lambda m: (
                m.proxy_selector is not None and m.proxy_secret_ref is not None
                if m.identity_header is not None
                else m.proxy_selector is None
                and m.proxy_secret_ref is None
                and m.proxy_namespace is None
            ),
        ),
    )


class HarnessServing(_Model):
    """The Harness served as a KServe custom predictor (`qpa harness serve`)."""

    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        max_length=MAX_IMAGE_LENGTH,
        description="Harness image with qpa installed; default: the operator's "
        "(the chart's images.harness).",
    )
    version: Version = Field(description="Harness version (Skills and config).")
    config_map_ref: ConfigMapKeySelector | None = Field(
        default=None, description="ConfigMap key with the Harness YAML (--harness-config)."
    )
    auth: HarnessAuth | None = Field(
        default=None,
        description="How the Harness authenticates callers (bearer tokens or a trusted proxy's "
        "header); unset: anonymous callers, each episode with a throwaway memory.",
    )


class BenchmarkSettings(_Model):
    """The benchmark run against the candidate (`qpa bench run`)."""

    suite: str = Field(
        default="mobilepa",
        min_length=1,
        max_length=63,
        pattern=SUITE_NAME,
        description="Suite: mobilepa, agentdojo/<suite>[@<attack>] or bfcl/<category>.",
    )
    split: Split = Field(default="test", description="Split scored.")
    samples: int = Field(default=1, ge=1, le=64, description="Samples per task (--samples).")
    limit: int | None = Field(
        default=None, ge=1, le=1_000_000, description="At most this many tasks."
    )
    concurrency: int = Field(default=8, ge=1, le=1024, description="Episodes in parallel.")
    environment: EnvironmentKind = Field(
        default="sandbox", description="Environment kind the benchmark runs in."
    )
    rollout_pool_ref: ServiceObjectReference | None = Field(
        default=None, description="RolloutPool serving the benchmark's environments."
    )

    RULES = (
        CrossFieldRule(
            cel="self.suite.startsWith('agentdojo/') == (self.environment == 'agentdojo') && "
            "self.suite.startsWith('bfcl/') == (self.environment == 'bfcl')",
            message="environment: an agentdojo/... suite runs in environment agentdojo and a "
            "bfcl/... suite in bfcl, and those environments run only their suites",
            check=lambda m: (
                m.suite.startswith("agentdojo/") == (m.environment == "agentdojo")
                and m.suite.startswith("bfcl/") == (m.environment == "bfcl")
            ),
        ),
    )


class GateSettings(_Model):
    """Release thresholds; the same fields as `qpa bench gate --spec` (snake_case there)."""

    min_overall: float = Field(default=0.5, ge=0, le=1, description="Lowest overall success.")
    max_capability_regression: float = Field(
        default=0.03,
        ge=0,
        le=1,
        description="Largest drop of any capability's success against stable (absolute).",
    )
    max_cost_increase: float | None = Field(
        default=0.10,
        ge=0,
        le=1000,
        description="Largest relative rise of cost per 1K tasks; null: off.",
    )
    max_environment_error_rate: float | None = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Largest share of episodes ended by the infrastructure; null: off.",
    )
    min_samples: int = Field(default=1, ge=1, le=64, description="Fewest samples per task.")
    min_tasks: int = Field(default=1, ge=1, le=1_000_000, description="Fewest tasks scored.")
    require_complete: bool = Field(default=True, description="Fail a partial report.")


class ReleaseTimeouts(_Model):
    """How long each stage of a release may take before it is rolled back (fail closed)."""

    deploy_seconds: int = Field(
        default=1800,
        ge=10,
        le=86400,
        description="From deploying the candidate until both InferenceServices are Ready; "
        "also the longest a canary step may wait for the Harness to be Ready.",
    )
    benchmark_seconds: int = Field(
        default=21600,
        ge=10,
        le=604800,
        description="The benchmark Job's activeDeadlineSeconds; from its start until the "
        "verdict (report read) the release waits at most this plus reportSeconds.",
    )
    report_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="How long an unreachable object store may delay reading the report, "
        "from the first failed read, before the release is rolled back.",
    )


class CanarySettings(_Model):
    """Traffic steps of the canary (percent of requests to the candidate)."""

    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [10, 50, 100],
        min_length=1,
        max_length=20,
        description="Increasing traffic percentages; the last is 100.",
        json_schema_extra={"default": [10, 50, 100], "x-kubernetes-list-type": "set"},
    )
    step_seconds: int = Field(
        default=300, ge=0, le=86400, description="Seconds at each step before the next."
    )

    RULES = (
        CrossFieldRule(
            cel="self.steps[size(self.steps) - 1] == 100",
            message="the last canary step must be 100",
            check=lambda m: bool(m.steps) and m.steps[-1] == 100,
        ),
        CrossFieldRule(
            # strictly: the list is a set (no repeats) and sorted
            cel="self.steps.isSorted()",
            message="canary steps must increase",
            check=lambda m: all(a < b for a, b in zip(m.steps, m.steps[1:], strict=False)),
        ),
    )


#: A Prometheus metric name (what the text format and PromQL accept).
METRIC_NAME: Final = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"


class CanaryAnalysis(_Model):
    """Live metrics of the candidate that each canary step must pass, as Argo Rollouts'
    analysis does: measured every `intervalSeconds` while a step is held, over the requests
    since the step began (the Harness's `qpa_harness_requests_total{code}` and
    `qpa_harness_request_seconds` unless named otherwise)."""

    interval_seconds: int = Field(
        default=30, ge=1, le=3600, description="Seconds between measurements."
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1_000_000_000,
        description="Fewest requests of the candidate a step needs before it is judged; a step "
        "that has fewer at its end waits for more (up to timeouts.deploySeconds), then rolls "
        "back (no evidence, no promotion).",
    )
    max_error_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Largest share of the candidate's requests answered 5xx.",
    )
    max_p95_latency_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Largest 95th percentile of the candidate's request latency; null: off.",
    )
    failure_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Failed measurements tolerated before the release rolls back.",
    )
    metrics_url: EndpointUrl | None = Field(
        default=None,
        description="The candidate's Prometheus text endpoint; default: KServe's tag route of "
        "the latest revision, http://latest-<release>-harness-predictor.<ns>.svc.<domain>"
        "/metrics. Ignored when prometheusUrl is set.",
    )
    prometheus_url: EndpointUrl | None = Field(
        default=None,
        description="Prometheus to query (its /api/v1/query), e.g. "
        "http://prometheus.monitoring:9090; unset: the candidate's own /metrics endpoint.",
    )
    requests_metric: str = Field(
        default="qpa_harness_requests_total",
        pattern=METRIC_NAME,
        max_length=200,
        description="Counter of the candidate's requests with a `code` label (HTTP status).",
    )
    latency_metric: str = Field(
        default="qpa_harness_request_seconds",
        pattern=METRIC_NAME,
        max_length=200,
        description="Histogram of the candidate's request latency (seconds).",
    )


class RolloutSettings(_Model):
    """How the candidate takes traffic: KServe's deployment mode and the canary's analysis."""

    deployment_mode: Literal["Serverless", "RawDeployment"] = Field(
        default="Serverless",
        description="KServe deployment mode of the InferenceServices (annotation "
        "serving.kserve.io/deploymentMode). The canary needs Serverless (Knative splits "
        "canaryTrafficPercent); RawDeployment is refused with condition Rejected, reason "
        "UnsupportedDeploymentMode, before anything is deployed.",
    )
    analysis: CanaryAnalysis | None = Field(
        default=None,
        description="Live metrics each canary step must pass besides readiness; unset: "
        "readiness only.",
    )


class HarnessReleaseSpec(_Model):
    """A model + Harness candidate: deploy, benchmark, gate, then promote or roll back."""

    model: ModelServing = Field(description="The planner model to serve.")
    harness: HarnessServing = Field(description="The Harness version to serve.")
    benchmark: BenchmarkSettings = _defaulted(BenchmarkSettings, "Benchmark of the candidate.")
    gate: GateSettings = _defaulted(GateSettings, "Thresholds the candidate must pass.")
    canary: CanarySettings = _defaulted(CanarySettings, "Canary traffic steps.")
    timeouts: ReleaseTimeouts = _defaulted(ReleaseTimeouts, "Deadlines of each stage.")
    rollout: RolloutSettings = _defaulted(RolloutSettings, "Deployment mode and canary analysis.")
    promotion: Literal["auto", "manual"] = Field(
        default="auto",
        description="auto: start the canary when the gate passes; manual: wait for the "
        "annotation qpa.ai/override=promote.",
    )
    report_uri: OutputUri = Field(
        description="Where benchmark reports go (s3:// only), e.g. s3://qpa/releases/planner/.",
    )
    store: ObjectStore | None = Field(
        default=None,
        description="Object storage settings for an s3:// reportUri; default: the operator's "
        "(the chart's objectStore).",
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Additions to the Harness predictor and the benchmark Job (placement, "
        "pull secrets, volumes, env, resources) and to the model predictor (all but "
        'resources), merged as docs/operator.md "Pod overrides" says.',
    )

    RULES = (
        CrossFieldRule(
            cel="self.benchmark.samples >= self.gate.minSamples",
            message="benchmark.samples must be at least gate.minSamples",
            check=lambda m: m.benchmark.samples >= m.gate.min_samples,
        ),
    )


#: Annotation a person sets on a HarnessRelease to force the current candidate through
#: (`promote`: skip the benchmark or overrule the gate) or to stop it (`abort`: roll back).
#: The operator records it in status (`override`, condition `Overridden`) and removes it.
OVERRIDE_ANNOTATION: Final = "qpa.ai/override"
OverrideAction = Literal["promote", "abort"]


class ReleaseVersion(_Model):
    """A model + Harness pair as deployed: enough to deploy it again or to promote it."""

    id: str = Field(
        min_length=1, max_length=63, description="Hash of model and Harness serving settings."
    )
    model_uri: UriText = Field(description="Model storageUri.")
    harness_image: str = Field(max_length=MAX_IMAGE_LENGTH, description="Harness image.")
    harness_version: ShortText = Field(description="Harness version.")
    model: ModelServing = Field(description="The model as served.")
    harness: HarnessServing = Field(description="The Harness as served.")
    report_uri: UriText | None = Field(default=None, description="Its benchmark report.json.")
    promoted_at: datetime | None = _timestamp("When it became stable.")


class Scores(_Model):
    """Benchmark scores of one version."""

    overall: float = Field(ge=0, le=1, description="Success rate over all tasks.")
    by_capability: dict[str, float] = Field(
        default_factory=dict, max_length=MAX_MAP_ENTRIES, description="Success rate per capability."
    )
    cost_per_1k_tasks: float | None = Field(
        default=None, ge=0, description="Output cost per 1K tasks (USD)."
    )
    tasks: Count = Field(default=0, description="Tasks scored.")
    samples: Count = Field(default=0, description="Samples per task.")


HarnessReleasePhase = Literal[
    "Pending",
    "Deploying",
    "Benchmarking",
    "AwaitingPromotion",
    "Canary",
    "Promoted",
    "RolledBack",
]


class ReleaseOverride(_Model):
    """A manual override the operator acted on (from the `qpa.ai/override` annotation)."""

    action: OverrideAction = Field(description="promote or abort.")
    version: ShortText = Field(description="Id of the candidate it applied to.")
    at: datetime = Field(description="When the operator acted on it.")


class MetricsSample(_Model):
    """The candidate's request counters at one moment (sums over its pods)."""

    requests: float = Field(ge=0, description="Requests so far.")
    errors: float = Field(ge=0, description="Requests answered 5xx so far.")
    buckets: dict[str, float] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Latency histogram: upper bound (le, seconds) -> requests at or below it.",
    )
    at: datetime = Field(description="When it was read.")


class AnalysisStatus(_Model):
    """The canary analysis of the current step: its baseline and the last measurement."""

    step: int = Field(ge=0, le=20, description="Index of the canary step measured.")
    baseline: MetricsSample | None = Field(
        default=None, description="The counters when the step began."
    )
    measurements: Count = Field(default=0, description="Measurements taken in this step.")
    failures: Count = Field(default=0, description="Measurements over a threshold (release).")
    requests: float | None = Field(
        default=None, ge=0, description="The candidate's requests since the step began."
    )
    error_rate: float | None = Field(
        default=None, ge=0, le=1, description="Their share answered 5xx."
    )
    p95_latency_seconds: float | None = Field(
        default=None, ge=0, description="Their 95th percentile latency."
    )
    passed: bool = Field(default=False, description="The last measurement passed.")
    measured_at: datetime | None = _timestamp("When the last measurement was taken.")
    message: Message = Field(default="", description="What the last measurement found.")


class HarnessReleaseStatus(_Model):
    """Where a release stands, with the scores and the decision."""

    phase: HarnessReleasePhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    candidate: ReleaseVersion | None = Field(default=None, description="Version under test.")
    stable: ReleaseVersion | None = Field(default=None, description="Version serving now.")
    previous: ReleaseVersion | None = Field(
        default=None, description="The stable version before the last promotion (kept deployed)."
    )
    since: datetime | None = _timestamp("When the current phase or canary step began.")
    benchmark_job: Text | None = Field(default=None, description="The candidate's benchmark Job.")
    scores: Scores | None = Field(default=None, description="The candidate's scores.")
    stable_scores: Scores | None = Field(default=None, description="The stable version's scores.")
    deltas: dict[str, float] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Candidate minus stable, per capability and overall.",
    )
    decision: Literal["promote", "rollback"] | None = Field(
        default=None, description="The gate's decision (missing results never promote)."
    )
    reasons: list[Message] = Field(
        default_factory=list, max_length=256, description="Why, one line per check."
    )
    override: ReleaseOverride | None = Field(
        default=None, description="The manual override applied to the candidate, if any."
    )
    canary_step: int | None = Field(
        default=None, ge=0, le=20, description="Index of the canary step."
    )
    traffic_percent: int = Field(
        default=0, ge=0, le=100, description="Share of traffic on the candidate."
    )
    report_uri: UriText | None = Field(default=None, description="The candidate's report.json.")
    analysis: AnalysisStatus | None = Field(
        default=None, description="The canary analysis of the current step (spec.rollout)."
    )
    model_endpoint: UriText | None = Field(
        default=None,
        description="The stable model's OpenAI endpoint (the `<release>-model` Service), for "
        "TaskBatches' policy.modelUrl.",
    )


class HarnessRelease(CustomResource):
    """A gated release of a model + Harness version through a canary."""

    info = KindInfo(
        kind="HarnessRelease",
        plural="harnessreleases",
        singular="harnessrelease",
        short_names=("qhr",),
        description="HarnessRelease deploys a model (KServe + vLLM) and a Harness version as a "
        "canary, benchmarks it, and promotes or rolls back by the gate.",
        printer_columns=(
            PrinterColumn(
                name="Harness",
                type="string",
                json_path=".spec.harness.version",
                description="The candidate's Harness version.",
            ),
            PHASE_COLUMN,
            PrinterColumn(name="Decision", type="string", json_path=".status.decision"),
            PrinterColumn(
                name="Score",
                type="number",
                json_path=".status.scores.overall",
                description="The candidate's overall success rate.",
            ),
            PrinterColumn(
                name="Delta",
                type="number",
                json_path=".status.deltas.overall",
                description="Overall success, candidate minus stable.",
            ),
            PrinterColumn(
                name="Stable",
                type="string",
                json_path=".status.stable.harnessVersion",
                description="The Harness version serving now.",
            ),
            PrinterColumn(name="Traffic", type="integer", json_path=".status.trafficPercent"),
            PrinterColumn(name="Model", type="string", json_path=".spec.model.uri", priority=1),
            *(
                PrinterColumn(
                    name=label,
                    type="number",
                    json_path=f".status.scores.byCapability.{capability}",
                    description=f"The candidate's {capability} success rate.",
                    priority=1,
                )
                for capability, label in (
                    ("tool_use", "ToolUse"),
                    ("memory", "Memory"),
                    ("skills", "Skills"),
                    ("subagent", "Subagent"),
                )
            ),
            PrinterColumn(
                name="Reason",
                type="string",
                json_path=".status.reasons[0]",
                description="The first reason of the decision.",
                priority=1,
            ),
            AGE_COLUMN,
        ),
    )

    kind: Literal["HarnessRelease"] = "HarnessRelease"
    spec: HarnessReleaseSpec
    status: HarnessReleaseStatus | None = None


class BenchSummary(PodSummary):
    """What a benchmark pod (`qpa bench run`) reports in its termination message.

    The release gate never trusts it: the operator reads the published report itself (fail
    closed); this is for `kubectl describe` and logs.
    """

    STAGE: ClassVar[str] = "bench"

    report_uri: str | None = Field(default=None, description="The published report.json.")
    overall: float = Field(ge=0, le=1, description="Overall success rate.")
    tasks: int = Field(ge=0, description="Tasks scored.")
    samples: int = Field(ge=0, description="Samples per task.")
    episodes: int = Field(ge=0, description="Episodes scored.")
    complete: bool = Field(description="Every selected episode ran.")
