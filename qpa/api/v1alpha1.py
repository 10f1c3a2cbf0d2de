"""qpa.ai/v1alpha1: TaskBatch, RolloutPool, DevicePool, TrainingRun and HarnessRelease.

These pydantic models are the single source of the custom resources: `qpa crds generate` turns
them into `crds/*.yaml` (see `qpa.api.crdgen`), the operator parses what the API server stores
with them, and tests build custom resources from them. Field names are snake_case in Python and
camelCase on the wire (`samples_per_task` <-> `samplesPerTask`); both spellings are accepted when
parsing, and `to_k8s()` writes the wire form.

Rules that span fields are written once, as `CrossFieldRule`s: each carries the CEL expression the
API server enforces (`x-kubernetes-validations` in the CRD) and the same rule as a Python
predicate that pydantic enforces, so a custom resource is rejected alike by `kubectl apply` and by
`TrainingRun.model_validate`. Rules that compare with the stored object (immutable fields) exist
only in CEL (`oldSelf`), since only the server knows the old object.

Secrets are never inlined: credentials are referenced by `secretRef` / `apiKeySecretRef`.

This module imports only pydantic and the standard library (an import-linter contract keeps it
so), so the operator can use it without importing the rest of qpa.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP: Final = "qpa.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "qpa.ai/v1alpha1"  # GROUP/VERSION, spelled out for the Literal below
CATEGORY = "qpa"

# Longest metadata.name of every kind: children are named `<name>-<suffix>` (Jobs, Services,
# Leases) and a Service name is a DNS label of at most 63 characters.
MAX_NAME_LENGTH = 52

EnvironmentKind = Literal["sandbox", "llm_sim", "device"]
Capability = Literal["tool_use", "memory", "skills", "subagent"]
Split = Literal["train", "validation", "test"]
Stage = Literal["sft", "rl"]
Planner = Literal["openai", "local", "oracle", "noisy", "noop", "greedy_wrong"]
ConditionStatus = Literal["True", "False", "Unknown"]
Offload = Literal["none", "cpu", "nvme"]

# Patterns shared by several fields (Go RE2 and Python re agree on all of them).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ARTIFACT_URI = r"^(s3|file)://\S+$"
MODEL_URI = r"^(s3|gs|pvc|hf|file)://\S+$"
HTTP_URL = r"^https?://\S+$"
IMAGE = r"^\S+$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class CrossFieldRule:
    """A validation rule spanning several fields of one object: CEL for the server, Python here.

    `cel` is evaluated with `self` bound to the object the rule is attached to; `check` gets the
    parsed model and returns True when the object is valid. `cel=None` marks a rule the server
    enforces otherwise (a list-type) or cannot express (CEL has no index loops): Python only.
    """

    cel: str | None
    message: str
    check: Callable[[Any], bool]

    def to_k8s(self) -> dict[str, str]:
        if self.cel is None:
            raise ValueError(f"rule {self.message!r} has no CEL form")
        return {"rule": self.cel, "message": self.message}


def _immutable(message: str) -> dict[str, Any]:
    """`json_schema_extra` of a field the server must keep as created (a CEL transition rule)."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


def _add_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[CrossFieldRule, ...] = getattr(cls, "RULES", ())
    cel_rules = [rule.to_k8s() for rule in rules if rule.cel is not None]
    if cel_rules:
        schema["x-kubernetes-validations"] = cel_rules


def _s3_needs_store(field: str = "outputUri") -> CrossFieldRule:
    return CrossFieldRule(
        cel=f"!self.{field}.startsWith('s3://') || has(self.store)",
        message=f"an s3:// {field} needs store (endpoint and secretRef)",
        check=lambda m: not getattr(m, _snake(field)).startswith("s3://") or m.store is not None,
    )


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


class _Model(BaseModel):
    """Base of every spec and status model: camelCase on the wire, unknown fields are errors."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=_add_rules,
    )

    RULES: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        for rule in type(self).RULES:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase keys, JSON types, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _defaulted(model: type[_Model], description: str) -> Any:
    """A sub-object whose fields all have defaults: the server fills it in (`default: {}`)."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def _list_set(description: str, **kwargs: Any) -> Any:
    """A list of unique strings (`x-kubernetes-list-type: set`, which the server enforces)."""
    return Field(
        default_factory=list,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        **kwargs,
    )


def _check_unique(*fields: str) -> Callable[[Any], bool]:
    def check(model: Any) -> bool:
        return all(len(set(getattr(model, name))) == len(getattr(model, name)) for name in fields)

    return check


Name = Annotated[
    str,
    Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN),
]
# A Kubernetes quantity (`500m`, `1Gi`, `2`): an int-or-string on the wire.
Quantity = int | Annotated[str, Field(pattern=QUANTITY)]


# --------------------------------------------------------------------------- references


class LocalObjectReference(_Model):
    """A reference to another object in the same namespace, by name."""

    name: Name = Field(description="Name of the referenced object (same namespace).")


class SecretKeySelector(_Model):
    """One key of a Secret in the same namespace."""

    name: Name = Field(description="Name of the Secret.")
    key: str = Field(
        min_length=1, max_length=253, pattern=CONFIG_KEY, description="Key within the Secret."
    )


class ConfigMapKeySelector(_Model):
    """One key of a ConfigMap in the same namespace."""

    name: Name = Field(description="Name of the ConfigMap.")
    key: str = Field(
        default="harness.yaml",
        min_length=1,
        max_length=253,
        pattern=CONFIG_KEY,
        description="Key within the ConfigMap.",
    )


class StoreSecretRef(_Model):
    """A Secret holding S3 credentials under two keys."""

    name: Name = Field(description="Name of the Secret with the S3 credentials.")
    access_key_id_key: str = Field(
        default="accessKeyId",
        pattern=CONFIG_KEY,
        description="Key of the access key id within the Secret.",
    )
    secret_access_key_key: str = Field(
        default="secretAccessKey",
        pattern=CONFIG_KEY,
        description="Key of the secret access key within the Secret.",
    )


class ObjectStore(_Model):
    """S3-compatible object storage (MinIO, S3, SeaweedFS) that a resource reads or writes."""

    endpoint: str = Field(
        pattern=HTTP_URL,
        max_length=2048,
        description="S3 API endpoint, e.g. http://minio.qpa-system:9000.",
    )
    region: str = Field(default="us-east-1", min_length=1, description="S3 region.")
    secret_ref: StoreSecretRef = Field(
        description="Secret with the credentials (never inlined in the resource)."
    )


class ResourceRequirements(_Model):
    """CPU, memory and accelerator requests and limits of each pod (Kubernetes quantities)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. {nvidia.com/gpu: 1}."
    )


# --------------------------------------------------------------------------- common status


class Condition(_Model):
    """One aspect of the resource's state, in the shape of Kubernetes `metav1.Condition`."""

    type: str = Field(
        max_length=316, pattern=CONDITION_TYPE, description="Condition type, e.g. Ready."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON,
        description="Machine-readable CamelCase reason of the last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable details of the transition."
    )
    last_transition_time: datetime = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was set for."
    )


def set_condition(
    conditions: Iterable[Condition],
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return `conditions` with `type` set; lastTransitionTime moves only when status changes."""
    moment = (now or datetime.now(UTC)).replace(microsecond=0)
    result: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.type != type:
            result.append(condition)
            continue
        found = True
        changed = condition.status != status
        result.append(
            Condition(
                type=type,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=moment if changed else condition.last_transition_time,
                observed_generation=observed_generation,
            )
        )
    if not found:
        result.append(
            Condition(
                type=type,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=moment,
                observed_generation=observed_generation,
            )
        )
    return result


def _conditions() -> Any:
    return Field(
        default_factory=list,
        description="Kubernetes-style conditions (Ready, Progressing, Failed, ...), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def _observed_generation() -> Any:
    return Field(
        default=None, ge=0, description="The .metadata.generation this status was computed for."
    )


def _timestamp(description: str) -> Any:
    return Field(default=None, description=description)


# --------------------------------------------------------------------------- TaskBatch


class TaskGenerator(_Model):
    """Generate tasks from a suite (what `qpa tasks generate` does)."""

    suite: str = Field(
        default="mobilepa", min_length=1, max_length=63, description="Task suite to draw from."
    )
    seed: int = Field(default=0, ge=0, description="Suite seed; 0 is the canonical suite.")
    split: Split | None = Field(default=None, description="Only tasks of this split.")
    domains: list[str] = _list_set("Only these domains (all when empty).")
    capabilities: list[Capability] = Field(
        default_factory=list,
        description="Only tasks exercising these capabilities (all when empty).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    limit: int | None = Field(
        default=None, ge=1, le=1_000_000, description="At most this many tasks."
    )

    RULES = (
        CrossFieldRule(
            cel=None,  # the server enforces it through x-kubernetes-list-type: set
            message="domains and capabilities must be unique",
            check=_check_unique("domains", "capabilities"),
        ),
    )


class TaskSource(_Model):
    """Where a batch's tasks come from: a generator or an existing dataset, exactly one."""

    generator: TaskGenerator | None = Field(
        default=None, description="Generate tasks from a suite."
    )
    dataset_uri: str | None = Field(
        default=None,
        pattern=ARTIFACT_URI,
        max_length=2048,
        description="Tasks as JSON Lines at an s3:// or file:// URI.",
    )

    RULES = (
        CrossFieldRule(
            cel="has(self.generator) != has(self.datasetUri)",
            message="set exactly one of generator or datasetUri",
            check=lambda m: (m.generator is None) != (m.dataset_uri is None),
        ),
    )


class HarnessVersion(_Model):
    """The Harness version acting around the model: its name and its config."""

    version: str = Field(
        default="harness-v1",
        min_length=1,
        max_length=63,
        description="Harness version label recorded in every trajectory.",
    )
    config_map_ref: ConfigMapKeySelector | None = Field(
        default=None,
        description="ConfigMap key holding the Harness YAML (Skills, memory, budgets); "
        "passed as --harness-config.",
    )


class PolicyEndpoint(_Model):
    """The policy that acts: a planner (model endpoint or checkpoint) plus a Harness version."""

    planner: Planner = Field(default="openai", description="Planner backend (qpa --planner).")
    model_url: str | None = Field(
        default=None,
        pattern=HTTP_URL,
        max_length=2048,
        description="OpenAI-compatible endpoint of the model (planner openai), e.g. "
        "http://planner-predictor.qpa.svc/v1.",
    )
    model: str = Field(
        default="planner", min_length=1, max_length=253, description="Model name at the endpoint."
    )
    model_uri: str | None = Field(
        default=None,
        pattern=MODEL_URI,
        max_length=2048,
        description="Checkpoint to load in-process (planner local).",
    )
    api_key_secret_ref: SecretKeySelector | None = Field(
        default=None, description="Secret key holding the endpoint's API key."
    )
    harness: HarnessVersion = _defaulted(HarnessVersion, "Harness version around the model.")

    RULES = (
        CrossFieldRule(
            cel="self.planner != 'openai' || has(self.modelUrl)",
            message="planner openai needs modelUrl",
            check=lambda m: m.planner != "openai" or m.model_url is not None,
        ),
        CrossFieldRule(
            cel="self.planner != 'local' || has(self.modelUri)",
            message="planner local needs modelUri",
            check=lambda m: m.planner != "local" or m.model_uri is not None,
        ),
    )


class TaskBatchSpec(_Model):
    """A batch of tasks rolled out by an indexed Job of `qpa collect` workers."""

    source: TaskSource = Field(
        description="Where the tasks come from.",
        json_schema_extra=_immutable("source is immutable; create a new TaskBatch"),
    )
    policy: PolicyEndpoint = Field(description="The model and Harness version that act.")
    rollout_pool_ref: LocalObjectReference | None = Field(
        default=None,
        description="RolloutPool whose environment servers run the episodes "
        "(in-process sandbox when unset).",
    )
    samples_per_task: int = Field(
        default=1, ge=1, le=64, description="Episodes per task (the group size for CARE)."
    )
    parallelism: int = Field(default=4, ge=1, le=1024, description="Workers running at once.")
    shards: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Job completions, one shard of the tasks each (defaults to parallelism).",
    )
    max_turns: int = Field(default=40, ge=1, le=1000, description="Turn budget per episode.")
    output_uri: str = Field(
        pattern=ARTIFACT_URI,
        max_length=2048,
        description="Where trajectories land, e.g. s3://qpa/taskbatches/nightly/.",
    )
    store: ObjectStore | None = Field(
        default=None, description="Object storage settings for s3:// URIs."
    )
    image: str | None = Field(
        default=None, pattern=IMAGE, description="Worker image (the operator's default if unset)."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of each worker pod."
    )
    backoff_limit: int = Field(
        default=3, ge=0, le=100, description="Retries per shard before the batch fails."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the batch after this many seconds."
    )

    RULES = (
        CrossFieldRule(
            cel="!has(self.shards) || self.shards >= self.parallelism",
            message="shards must be at least parallelism (extra workers would have no shard)",
            check=lambda m: m.shards is None or m.shards >= m.parallelism,
        ),
        _s3_needs_store(),
    )


TaskBatchPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


class TaskBatchStatus(_Model):
    """Progress of a TaskBatch, copied from its workers' reports."""

    phase: TaskBatchPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    tasks: int = Field(default=0, ge=0, description="Tasks in the batch.")
    trajectories: int = Field(default=0, ge=0, description="Trajectories written so far.")
    successes: int = Field(default=0, ge=0, description="Trajectories whose task succeeded.")
    failures: int = Field(default=0, ge=0, description="Trajectories whose task failed (kept).")
    completed_shards: int = Field(default=0, ge=0, description="Shards finished.")
    failed_shards: int = Field(default=0, ge=0, description="Shards that failed for good.")
    job_name: str | None = Field(default=None, description="The indexed Job running the batch.")
    output_uri: str | None = Field(default=None, description="Where the trajectories are.")
    start_time: datetime | None = _timestamp("When the Job started.")
    completion_time: datetime | None = _timestamp("When the batch finished.")


# --------------------------------------------------------------------------- RolloutPool


class ReplicaRange(_Model):
    """How many environment-server pods to keep: at least `min`, at most `max`."""

    min: int = Field(default=1, ge=0, le=1000, description="Pods kept warm.")
    max: int = Field(default=4, ge=1, le=1000, description="Pods at most under load.")

    RULES = (
        CrossFieldRule(
            cel="self.min <= self.max",
            message="replicas.min must not exceed replicas.max",
            check=lambda m: m.min <= m.max,
        ),
    )


class LLMSimSettings(_Model):
    """The model endpoint that plays the apps of an llm_sim environment."""

    model_url: str = Field(
        pattern=HTTP_URL, max_length=2048, description="OpenAI-compatible endpoint (--model-url)."
    )
    model: str = Field(
        default="", max_length=253, description="Model name at the endpoint (--model)."
    )
    api_key_secret_ref: SecretKeySelector | None = Field(
        default=None, description="Secret key holding the endpoint's API key."
    )


class RolloutPoolSpec(_Model):
    """A warm pool of environment servers (`qpa env serve`) behind one Service."""

    environment: EnvironmentKind = Field(
        description="Environment kind served (qpa env serve --kind).",
        json_schema_extra=_immutable("environment is immutable"),
    )
    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        description="Image with qpa installed (the operator's sandbox image if unset).",
    )
    replicas: ReplicaRange = _defaulted(ReplicaRange, "Pod count range.")
    sessions_per_pod: int = Field(
        default=16, ge=1, le=1024, description="Concurrent episodes per pod (--max-sessions)."
    )
    session_ttl_seconds: float = Field(
        default=600.0, gt=0, le=86400, description="Idle session lifetime (--session-ttl)."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Container and Service port.")
    llm_sim: LLMSimSettings | None = Field(
        default=None, description="Endpoint settings, for environment llm_sim only."
    )
    device_pool_ref: LocalObjectReference | None = Field(
        default=None, description="DevicePool whose phones back the sessions (device only)."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of each pod."
    )

    RULES = (
        CrossFieldRule(
            cel="self.environment == 'device' ? has(self.devicePoolRef) : !has(self.devicePoolRef)",
            message="devicePoolRef is required for environment device and allowed only there",
            check=lambda m: (m.environment == "device") == (m.device_pool_ref is not None),
        ),
        CrossFieldRule(
            cel="self.environment == 'llm_sim' ? has(self.llmSim) : !has(self.llmSim)",
            message="llmSim is required for environment llm_sim and allowed only there",
            check=lambda m: (m.environment == "llm_sim") == (m.llm_sim is not None),
        ),
    )


RolloutPoolPhase = Literal["Pending", "Ready", "Degraded", "Failed"]


class RolloutPoolStatus(_Model):
    """Capacity of a RolloutPool."""

    phase: RolloutPoolPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    replicas: int = Field(default=0, ge=0, description="Pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Pods that are ready.")
    capacity: int = Field(default=0, ge=0, description="Sessions the ready pods can hold.")
    leased: int = Field(default=0, ge=0, description="Sessions in use.")
    service_url: str | None = Field(default=None, description="URL of the pool's Service.")


# --------------------------------------------------------------------------- DevicePool


class DeviceFilter(_Model):
    """Which attached phones join the pool (all filters must match; empty lists match all)."""

    serials: list[str] = _list_set("Only phones with these adb serials.")
    models: list[str] = _list_set("Only these models (ro.product.model).")
    min_android_version: int | None = Field(
        default=None, ge=5, le=99, description="Lowest Android major version."
    )
    max_android_version: int | None = Field(
        default=None, ge=5, le=99, description="Highest Android major version."
    )

    RULES = (
        CrossFieldRule(
            cel="!has(self.minAndroidVersion) || !has(self.maxAndroidVersion) || "
            "self.minAndroidVersion <= self.maxAndroidVersion",
            message="minAndroidVersion must not exceed maxAndroidVersion",
            check=lambda m: (
                m.min_android_version is None
                or m.max_android_version is None
                or m.min_android_version <= m.max_android_version
            ),
        ),
        CrossFieldRule(
            cel=None,  # the server enforces it through x-kubernetes-list-type: set
            message="serials and models must be unique",
            check=_check_unique("serials", "models"),
        ),
    )


class DeviceHealthCheck(_Model):
    """How the bridge probes phones, and when it quarantines one."""

    interval_seconds: int = Field(default=30, ge=1, le=3600, description="Seconds between probes.")
    timeout_seconds: int = Field(default=10, ge=1, le=600, description="Seconds a probe may take.")
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="Failed probes in a row before quarantine."
    )
    quarantine_seconds: int = Field(
        default=600, ge=0, description="How long a quarantined phone stays out of the pool."
    )

    RULES = (
        CrossFieldRule(
            cel="self.timeoutSeconds < self.intervalSeconds",
            message="timeoutSeconds must be below intervalSeconds",
            check=lambda m: m.timeout_seconds < m.interval_seconds,
        ),
    )


class DevicePoolSpec(_Model):
    """USB-attached phones on labelled nodes, bridged by a DaemonSet and leased one at a time."""

    node_selector: dict[str, str] = Field(
        default_factory=lambda: {"qpa.ai/device-node": "true"},
        description="Labels of the nodes phones are attached to.",
        json_schema_extra={"default": {"qpa.ai/device-node": "true"}},
    )
    selector: DeviceFilter = _defaulted(DeviceFilter, "Which phones join the pool.")
    bridge_image: str | None = Field(
        default=None,
        pattern=IMAGE,
        description="Device-bridge image (adb server); default: the operator's "
        "(the chart's images.deviceBridge).",
    )
    adb_port: int = Field(default=5037, ge=1, le=65535, description="adb server port per node.")
    lease_duration_seconds: int = Field(
        default=300, ge=10, le=86400, description="A lease not renewed for this long expires."
    )
    health_check: DeviceHealthCheck = _defaulted(DeviceHealthCheck, "Phone health probes.")


PhoneState = Literal["available", "leased", "quarantined", "offline"]
DevicePoolPhase = Literal["Pending", "Ready", "Degraded", "Failed"]


class Phone(_Model):
    """One phone of the pool as the bridge last saw it."""

    serial: str = Field(min_length=1, description="adb serial.")
    node: str = Field(min_length=1, description="Node the phone is attached to.")
    model: str | None = Field(default=None, description="ro.product.model.")
    android_version: str | None = Field(default=None, description="ro.build.version.release.")
    state: PhoneState = Field(description="available, leased, quarantined or offline.")
    leased_by: str | None = Field(default=None, description="Holder of the phone's Lease.")
    reason: str | None = Field(default=None, description="Why it is quarantined or offline.")
    last_seen: datetime | None = _timestamp("Last successful probe.")


class DevicePoolStatus(_Model):
    """The phones of a DevicePool."""

    phase: DevicePoolPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    phones: list[Phone] = Field(
        default_factory=list,
        description="Every phone seen, by serial.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["serial"],
        },
    )
    total: int = Field(default=0, ge=0, description="Phones in the pool.")
    available: int = Field(default=0, ge=0, description="Phones free to lease.")
    leased: int = Field(default=0, ge=0, description="Phones leased.")
    quarantined: int = Field(default=0, ge=0, description="Phones out for bad health.")


# --------------------------------------------------------------------------- TrainingRun


class DatasetRef(_Model):
    """Training data: a TaskBatch's output or a URI, exactly one, with a mixture weight."""

    task_batch_ref: LocalObjectReference | None = Field(
        default=None, description="Use the trajectories of this TaskBatch."
    )
    uri: str | None = Field(
        default=None, pattern=ARTIFACT_URI, max_length=2048, description="Dataset URI."
    )
    weight: float = Field(default=1.0, gt=0, le=1000, description="Relative mixture weight.")

    RULES = (
        CrossFieldRule(
            cel="has(self.taskBatchRef) != has(self.uri)",
            message="set exactly one of taskBatchRef or uri",
            check=lambda m: (m.task_batch_ref is None) != (m.uri is None),
        ),
    )


class CARESettings(_Model):
    """Competence-Aware Reward-and-Advantage Engineering: tiers by group success rate."""

    low_success_threshold: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Below this group success rate rewards use progress shaping.",
    )
    high_success_threshold: float = Field(
        default=0.8,
        ge=0,
        le=1,
        description="Above this group success rate rewards refine efficiency.",
    )
    progress_weight: float = Field(
        default=0.5, ge=0, le=10, description="Weight of process reward (progress shaping)."
    )
    efficiency_weight: float = Field(
        default=0.1, ge=0, le=10, description="Weight of token/call savings (efficiency tier)."
    )
    success_anchor: bool = Field(
        default=True, description="Calibrate advantages with the success anchor."
    )

    RULES = (
        CrossFieldRule(
            cel="self.lowSuccessThreshold < self.highSuccessThreshold",
            message="lowSuccessThreshold must be below highSuccessThreshold",
            check=lambda m: m.low_success_threshold < m.high_success_threshold,
        ),
    )


class RLSettings(_Model):
    """Online agentic RL (GRPO with CARE) in a RolloutPool's environments."""

    rollout_pool_ref: LocalObjectReference = Field(
        description="RolloutPool whose environment servers run the rollouts."
    )
    group_size: int = Field(default=8, ge=2, le=256, description="Rollouts per task (group).")
    max_turns: int = Field(default=40, ge=1, le=1000, description="Turn budget per rollout.")
    care: CARESettings = _defaulted(CARESettings, "CARE reward and advantage settings.")


class SFTSettings(_Model):
    """Planning-oriented SFT cold start."""

    turn_masking: bool = Field(
        default=True, description="Mask erroneous turns (learn recovery, not the error)."
    )


class DeepSpeedSettings(_Model):
    """DeepSpeed ZeRO settings of the ranks."""

    zero_stage: Literal[0, 1, 2, 3] = Field(default=2, description="ZeRO stage.")
    offload_optimizer: Offload = Field(default="none", description="Where optimizer state lives.")
    offload_parameters: Offload = Field(default="none", description="Where parameters live.")
    bf16: bool = Field(default=True, description="Train in bfloat16 where supported.")
    gradient_clipping: float = Field(default=1.0, ge=0, description="Global norm clip.")

    RULES = (
        CrossFieldRule(
            cel="self.offloadParameters == 'none' || self.zeroStage == 3",
            message="offloadParameters needs zeroStage 3",
            check=lambda m: m.offload_parameters == "none" or m.zero_stage == 3,
        ),
        CrossFieldRule(
            cel="self.offloadOptimizer == 'none' || self.zeroStage >= 1",
            message="offloadOptimizer needs zeroStage 1, 2 or 3",
            check=lambda m: m.offload_optimizer == "none" or m.zero_stage >= 1,
        ),
    )


class Hyperparameters(_Model):
    """Optimiser settings shared by SFT and RL."""

    learning_rate: float = Field(default=1e-5, gt=0, le=1, description="Peak learning rate.")
    epochs: float = Field(default=1.0, gt=0, le=1000, description="Passes over the data.")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps."
    )
    per_device_batch_size: int = Field(default=1, ge=1, le=4096, description="Micro-batch size.")
    gradient_accumulation_steps: int = Field(default=8, ge=1, le=4096, description="Steps/update.")
    max_seq_length: int = Field(default=8192, ge=128, le=1_048_576, description="Token limit.")
    seed: int = Field(default=0, ge=0, description="Random seed.")


class TrainingRunSpec(_Model):
    """SFT or CARE RL as an indexed Job of DeepSpeed ranks with a headless Service."""

    stage: Stage = Field(
        description="sft (cold start) or rl (online CARE RL).",
        json_schema_extra=_immutable("stage is immutable"),
    )
    base_model_uri: str = Field(
        pattern=MODEL_URI, max_length=2048, description="Checkpoint to start from."
    )
    datasets: list[DatasetRef] = Field(
        default_factory=list,
        max_length=64,
        description="Training data (SFT needs at least one; RL may seed from them).",
    )
    sft: SFTSettings | None = Field(default=None, description="SFT settings (stage sft).")
    rl: RLSettings | None = Field(default=None, description="RL settings (required for rl).")
    hyperparameters: Hyperparameters = _defaulted(Hyperparameters, "Optimiser settings.")
    deepspeed: DeepSpeedSettings = _defaulted(DeepSpeedSettings, "DeepSpeed settings.")
    nodes: int = Field(default=1, ge=1, le=512, description="Nodes (Job completions).")
    gpus_per_node: int = Field(default=8, ge=0, le=16, description="GPUs per node (0: CPU).")
    output_uri: str = Field(
        pattern=ARTIFACT_URI,
        max_length=2048,
        description="Where checkpoints and the final model go, e.g. s3://qpa/trainingruns/x/.",
    )
    store: ObjectStore | None = Field(
        default=None, description="Object storage settings for s3:// URIs."
    )
    checkpoint_every: int = Field(default=500, ge=1, description="Optimizer steps per checkpoint.")
    keep_checkpoints: int = Field(default=3, ge=1, le=1000, description="Checkpoints kept.")
    resume: bool = Field(
        default=True, description="After a failure, resume from the latest checkpoint."
    )
    resume_from: str | None = Field(
        default=None,
        pattern=ARTIFACT_URI,
        max_length=2048,
        description="Start from this checkpoint instead of the latest one.",
    )
    backoff_limit: int = Field(default=3, ge=0, le=100, description="Restarts before failing.")
    image: str | None = Field(
        default=None, pattern=IMAGE, description="Trainer image (the operator's default if unset)."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of each rank's pod (GPUs come from gpusPerNode)."
    )

    RULES = (
        CrossFieldRule(
            cel="self.stage == 'rl' ? has(self.rl) : !has(self.rl)",
            message="stage rl needs rl settings, and only stage rl accepts them",
            check=lambda m: (m.stage == "rl") == (m.rl is not None),
        ),
        CrossFieldRule(
            cel="self.stage == 'sft' || !has(self.sft)",
            message="sft settings apply to stage sft only",
            check=lambda m: m.stage == "sft" or m.sft is None,
        ),
        CrossFieldRule(
            cel="self.stage != 'sft' || size(self.datasets) > 0",
            message="stage sft needs at least one dataset",
            check=lambda m: m.stage != "sft" or len(m.datasets) > 0,
        ),
        CrossFieldRule(
            cel="self.resume || !has(self.resumeFrom)",
            message="resumeFrom needs resume: true",
            check=lambda m: m.resume or m.resume_from is None,
        ),
        _s3_needs_store(),
    )


class Checkpoint(_Model):
    """A checkpoint written by the run."""

    step: int = Field(ge=0, description="Optimizer step.")
    uri: str = Field(min_length=1, description="Where it is.")
    time: datetime | None = _timestamp("When it was written.")


TrainingRunPhase = Literal["Pending", "Running", "Resuming", "Succeeded", "Failed"]


class TrainingRunStatus(_Model):
    """Progress of a TrainingRun."""

    phase: TrainingRunPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    step: int = Field(default=0, ge=0, description="Latest optimizer step reported.")
    total_steps: int | None = Field(default=None, ge=0, description="Steps planned.")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Latest metrics (loss, reward, success_rate, ...)."
    )
    checkpoints: list[Checkpoint] = Field(
        default_factory=list, description="Checkpoints kept, oldest first."
    )
    latest_checkpoint: str | None = Field(default=None, description="URI of the newest one.")
    model_uri: str | None = Field(default=None, description="The final model, once succeeded.")
    restarts: int = Field(default=0, ge=0, description="Times the run resumed after a failure.")
    job_name: str | None = Field(default=None, description="The indexed Job of the ranks.")
    start_time: datetime | None = _timestamp("When the first rank started.")
    completion_time: datetime | None = _timestamp("When the run finished.")


# --------------------------------------------------------------------------- HarnessRelease


class ModelServing(_Model):
    """The planner model served by KServe."""

    uri: str = Field(pattern=MODEL_URI, max_length=2048, description="storageUri of the model.")
    runtime: Literal["vllm", "huggingface"] = Field(
        default="vllm", description="Serving runtime (vLLM needs GPUs)."
    )
    served_model_name: str = Field(
        default="planner", min_length=1, max_length=253, description="Name clients ask for."
    )
    gpus: int = Field(default=1, ge=0, le=16, description="GPUs per replica.")
    max_model_length: int | None = Field(
        default=None, ge=128, description="Context length limit passed to the runtime."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Extra resources of each replica."
    )

    RULES = (
        CrossFieldRule(
            cel="self.runtime != 'vllm' || self.gpus >= 1",
            message="runtime vllm needs gpus >= 1",
            check=lambda m: m.runtime != "vllm" or m.gpus >= 1,
        ),
    )


class HarnessServing(_Model):
    """The Harness served as a KServe custom predictor (`qpa harness serve`)."""

    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        description="Harness image with qpa installed; default: the operator's "
        "(the chart's images.harness).",
    )
    version: str = Field(
        min_length=1, max_length=63, description="Harness version (Skills and config)."
    )
    config_map_ref: ConfigMapKeySelector | None = Field(
        default=None, description="ConfigMap key with the Harness YAML (--harness-config)."
    )


class BenchmarkSettings(_Model):
    """The benchmark run against the candidate (`qpa bench run`)."""

    suite: str = Field(default="mobilepa", min_length=1, max_length=63, description="Suite.")
    split: Split = Field(default="test", description="Split scored.")
    samples: int = Field(default=1, ge=1, le=64, description="Samples per task (--samples).")
    limit: int | None = Field(default=None, ge=1, description="At most this many tasks.")
    concurrency: int = Field(default=8, ge=1, le=1024, description="Episodes in parallel.")
    environment: EnvironmentKind = Field(
        default="sandbox", description="Environment kind the benchmark runs in."
    )
    rollout_pool_ref: LocalObjectReference | None = Field(
        default=None, description="RolloutPool serving the benchmark's environments."
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
        default=0.10, ge=0, description="Largest relative rise of cost per 1K tasks; null: off."
    )
    max_environment_error_rate: float | None = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Largest share of episodes ended by the infrastructure; null: off.",
    )
    min_samples: int = Field(default=1, ge=1, description="Fewest samples per task.")
    min_tasks: int = Field(default=1, ge=1, description="Fewest tasks scored.")
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


class HarnessReleaseSpec(_Model):
    """A model + Harness candidate: deploy, benchmark, gate, then promote or roll back."""

    model: ModelServing = Field(description="The planner model to serve.")
    harness: HarnessServing = Field(description="The Harness version to serve.")
    benchmark: BenchmarkSettings = _defaulted(BenchmarkSettings, "Benchmark of the candidate.")
    gate: GateSettings = _defaulted(GateSettings, "Thresholds the candidate must pass.")
    canary: CanarySettings = _defaulted(CanarySettings, "Canary traffic steps.")
    timeouts: ReleaseTimeouts = _defaulted(ReleaseTimeouts, "Deadlines of each stage.")
    promotion: Literal["auto", "manual"] = Field(
        default="auto",
        description="auto: start the canary when the gate passes; manual: wait for the "
        "annotation qpa.ai/override=promote.",
    )
    report_uri: str = Field(
        pattern=ARTIFACT_URI,
        max_length=2048,
        description="Where benchmark reports go, e.g. s3://qpa/releases/planner/.",
    )
    store: ObjectStore | None = Field(
        default=None,
        description="Object storage settings for an s3:// reportUri; default: the operator's "
        "(the chart's objectStore).",
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
    model_uri: str = Field(description="Model storageUri.")
    harness_image: str = Field(description="Harness image.")
    harness_version: str = Field(description="Harness version.")
    model: ModelServing = Field(description="The model as served.")
    harness: HarnessServing = Field(description="The Harness as served.")
    report_uri: str | None = Field(default=None, description="Its benchmark report.json.")
    promoted_at: datetime | None = _timestamp("When it became stable.")


class Scores(_Model):
    """Benchmark scores of one version."""

    overall: float = Field(ge=0, le=1, description="Success rate over all tasks.")
    by_capability: dict[str, float] = Field(
        default_factory=dict, description="Success rate per capability."
    )
    cost_per_1k_tasks: float | None = Field(
        default=None, ge=0, description="Output cost per 1K tasks (USD)."
    )
    tasks: int = Field(default=0, ge=0, description="Tasks scored.")
    samples: int = Field(default=0, ge=0, description="Samples per task.")


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
    version: str = Field(description="Id of the candidate it applied to.")
    at: datetime = Field(description="When the operator acted on it.")


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
    benchmark_job: str | None = Field(default=None, description="The candidate's benchmark Job.")
    scores: Scores | None = Field(default=None, description="The candidate's scores.")
    stable_scores: Scores | None = Field(default=None, description="The stable version's scores.")
    deltas: dict[str, float] = Field(
        default_factory=dict, description="Candidate minus stable, per capability and overall."
    )
    decision: Literal["promote", "rollback"] | None = Field(
        default=None, description="The gate's decision (missing results never promote)."
    )
    reasons: list[str] = Field(default_factory=list, description="Why, one line per check.")
    override: ReleaseOverride | None = Field(
        default=None, description="The manual override applied to the candidate, if any."
    )
    canary_step: int | None = Field(default=None, ge=0, description="Index of the canary step.")
    traffic_percent: int = Field(
        default=0, ge=0, le=100, description="Share of traffic on the candidate."
    )
    report_uri: str | None = Field(default=None, description="The candidate's report.json.")


# --------------------------------------------------------------------------- envelopes


class OwnerReference(_Model):
    """Points a child object at its owner (garbage collection, `controller` marks the owner)."""

    model_config = ConfigDict(extra="allow")

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(_Model):
    """Kubernetes object metadata (the fields qpa reads; others are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)


class PrinterColumn(BaseModel):
    """A column of `kubectl get` (CRD additionalPrinterColumns)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0


AGE_COLUMN = PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp")
PHASE_COLUMN = PrinterColumn(
    name="Phase", type="string", json_path=".status.phase", description="Lifecycle phase."
)


class KindInfo(BaseModel):
    """How a kind is named and shown: the CRD's names, scope and printer columns."""

    model_config = ConfigDict(frozen=True)

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    description: str

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


class CustomResource(BaseModel):
    """Envelope shared by the five kinds: apiVersion, kind, metadata, spec, status."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    info: ClassVar[KindInfo]

    api_version: Literal["qpa.ai/v1alpha1"] = API_VERSION
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server takes it (camelCase, unset fields left out)."""
        body = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        meta = body.get("metadata", {})
        for key in ("labels", "annotations", "finalizers", "ownerReferences"):
            if not meta.get(key):
                meta.pop(key, None)
        return body

    def owner_reference(self, *, controller: bool = True) -> OwnerReference:
        """An ownerReference to this object, for its children (needs metadata.uid)."""
        if not self.metadata.name or not self.metadata.uid:
            raise ValueError("an owner needs metadata.name and metadata.uid")
        return OwnerReference(
            api_version=API_VERSION,
            kind=self.info.kind,
            name=self.metadata.name,
            uid=self.metadata.uid,
            controller=controller,
            block_owner_deletion=True,
        )


class TaskBatch(CustomResource):
    """A batch of tasks rolled out into trajectories in object storage."""

    info = KindInfo(
        kind="TaskBatch",
        plural="taskbatches",
        singular="taskbatch",
        short_names=("tb",),
        description="TaskBatch generates and/or runs a batch of tasks: an indexed Job of "
        "`qpa collect` workers writes trajectories to object storage.",
        printer_columns=(
            PHASE_COLUMN,
            PrinterColumn(
                name="Pool",
                type="string",
                json_path=".spec.rolloutPoolRef.name",
                description="RolloutPool running the episodes.",
            ),
            PrinterColumn(name="Tasks", type="integer", json_path=".status.tasks"),
            PrinterColumn(name="Trajectories", type="integer", json_path=".status.trajectories"),
            PrinterColumn(name="Successes", type="integer", json_path=".status.successes"),
            PrinterColumn(name="Output", type="string", json_path=".spec.outputUri", priority=1),
            AGE_COLUMN,
        ),
    )

    kind: Literal["TaskBatch"] = "TaskBatch"
    spec: TaskBatchSpec
    status: TaskBatchStatus | None = None


class RolloutPool(CustomResource):
    """A warm pool of environment servers that rollouts lease sessions from."""

    info = KindInfo(
        kind="RolloutPool",
        plural="rolloutpools",
        singular="rolloutpool",
        short_names=("rp",),
        description="RolloutPool keeps a warm pool of environment servers (`qpa env serve`): "
        "sandbox, LLM-simulated or device-backed.",
        printer_columns=(
            PrinterColumn(name="Environment", type="string", json_path=".spec.environment"),
            PHASE_COLUMN,
            PrinterColumn(name="Ready", type="integer", json_path=".status.readyReplicas"),
            PrinterColumn(name="Capacity", type="integer", json_path=".status.capacity"),
            PrinterColumn(name="Leased", type="integer", json_path=".status.leased"),
            PrinterColumn(name="Image", type="string", json_path=".spec.image", priority=1),
            AGE_COLUMN,
        ),
    )

    kind: Literal["RolloutPool"] = "RolloutPool"
    spec: RolloutPoolSpec
    status: RolloutPoolStatus | None = None


class DevicePool(CustomResource):
    """USB-attached phones bridged from device nodes and leased one at a time."""

    info = KindInfo(
        kind="DevicePool",
        plural="devicepools",
        singular="devicepool",
        short_names=("dp",),
        description="DevicePool bridges USB-attached phones on labelled nodes (a DaemonSet of "
        "adb servers) and leases each phone to one rollout at a time.",
        printer_columns=(
            PHASE_COLUMN,
            PrinterColumn(name="Phones", type="integer", json_path=".status.total"),
            PrinterColumn(name="Available", type="integer", json_path=".status.available"),
            PrinterColumn(name="Leased", type="integer", json_path=".status.leased"),
            PrinterColumn(name="Quarantined", type="integer", json_path=".status.quarantined"),
            AGE_COLUMN,
        ),
    )

    kind: Literal["DevicePool"] = "DevicePool"
    spec: DevicePoolSpec
    status: DevicePoolStatus | None = None


class TrainingRun(CustomResource):
    """SFT or CARE RL of the planner as DeepSpeed ranks, checkpointed to object storage."""

    info = KindInfo(
        kind="TrainingRun",
        plural="trainingruns",
        singular="trainingrun",
        short_names=("tr",),
        description="TrainingRun runs SFT or CARE RL as a multi-node DeepSpeed job that "
        "checkpoints to object storage and resumes after failures.",
        printer_columns=(
            PrinterColumn(name="Stage", type="string", json_path=".spec.stage"),
            PHASE_COLUMN,
            PrinterColumn(name="Step", type="integer", json_path=".status.step"),
            PrinterColumn(name="Nodes", type="integer", json_path=".spec.nodes"),
            PrinterColumn(name="GPUs", type="integer", json_path=".spec.gpusPerNode"),
            PrinterColumn(
                name="Checkpoint",
                type="string",
                json_path=".status.latestCheckpoint",
                priority=1,
            ),
            AGE_COLUMN,
        ),
    )

    kind: Literal["TrainingRun"] = "TrainingRun"
    spec: TrainingRunSpec
    status: TrainingRunStatus | None = None


class HarnessRelease(CustomResource):
    """A gated release of a model + Harness version through a canary."""

    info = KindInfo(
        kind="HarnessRelease",
        plural="harnessreleases",
        singular="harnessrelease",
        short_names=("hr",),
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


RESOURCES: tuple[type[CustomResource], ...] = (
    TaskBatch,
    RolloutPool,
    DevicePool,
    TrainingRun,
    HarnessRelease,
)


def resource_for_kind(kind: str) -> type[CustomResource]:
    """The model class of a kind, plural or short name (`TrainingRun`, `trainingruns`, `tr`)."""
    wanted = kind.lower()
    for cls in RESOURCES:
        info = cls.info
        if wanted in (info.kind.lower(), info.plural, info.singular, *info.short_names):
            return cls
    raise KeyError(
        f"unknown qpa.ai kind {kind!r}; known: {', '.join(c.info.kind for c in RESOURCES)}"
    )


def parse_resource(obj: dict[str, Any]) -> CustomResource:
    """Parse a qpa.ai object (a dict as the API server or a YAML file has it) into its model."""
    api_version = obj.get("apiVersion")
    if api_version != API_VERSION:
        raise ValueError(f"apiVersion must be {API_VERSION}, not {api_version!r}")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise ValueError("kind is missing")
    return resource_for_kind(kind).model_validate(obj)
