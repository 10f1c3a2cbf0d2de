"""TaskBatch: its spec, status and custom resource model, and the summary its workers report.

A worker pod runs `qpa collect --spec <work order>`; what the operator provides beside the work
order (the API key variable, the Harness config mount) is named here, once, for both sides.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Final, Literal

from pydantic import Field, model_validator

from qpa.api.v1alpha1.base import (
    IMAGE,
    MAX_IMAGE_LENGTH,
    MAX_SEED,
    SUITE_NAME,
    Capability,
    CheckpointUri,
    Condition,
    ConfigMapKeySelector,
    Count,
    CrossFieldRule,
    DataUri,
    EndpointUrl,
    LocalDataUri,
    ObjectStore,
    OutputUri,
    Planner,
    ResourceRequirements,
    SecretKeySelector,
    ServiceObjectReference,
    ShortText,
    Split,
    Text,
    UriText,
    Version,
    _check_unique,
    _conditions,
    _defaulted,
    _immutable,
    _list_set,
    _Model,
    _observed_generation,
    _s3_needs_store,
    _timestamp,
)
from qpa.api.v1alpha1.podtemplate import PodTemplate
from qpa.api.v1alpha1.resource import (
    AGE_COLUMN,
    PHASE_COLUMN,
    CustomResource,
    KindInfo,
    PrinterColumn,
)
from qpa.api.v1alpha1.workorder import PodSummary

#: The variable a worker reads the endpoint's API key from (`policy.apiKeySecretRef`).
API_KEY_ENV: Final = "QPA_API_KEY"
#: Where a worker finds `policy.harness.configMapRef`'s key, as a file named after the key.
HARNESS_CONFIG_DIR: Final = "/etc/qpa/harness"


class TaskGenerator(_Model):
    """Generate tasks from a suite (what `qpa tasks generate` does)."""

    suite: str = Field(
        default="mobilepa",
        min_length=1,
        max_length=63,
        pattern=SUITE_NAME,
        description="Task suite to draw from: mobilepa, agentdojo/<suite>[@<attack>] or "
        "bfcl/<category>.",
    )
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, description="Suite seed; 0 is the canonical suite."
    )


class TaskSource(_Model):
    """Which tasks a batch (or an RL run) uses: an origin, then one selection rule.

    The origin is a generated suite (`generator`) or a dataset (`datasetUri`: a tasks JSON Lines
    file, or a dataset prefix with a `manifest.json`; a dataset without task rows, such as an
    SFT set, contributes the canonical suite's tasks its lineage names), exactly one. The
    selection is the same for both: keep the tasks of `split`, of `domains`, exercising any of
    `capabilities` and among `taskIds` (each filter off when unset or empty), then at most
    `limit` of them, taken round-robin across domains so a small selection still covers them,
    in the origin's order.
    """

    generator: TaskGenerator | None = Field(
        default=None, description="Generate tasks from a suite."
    )
    dataset_uri: LocalDataUri | None = Field(
        default=None,
        description="Tasks as JSON Lines (or a dataset with a manifest.json) at an s3:// or "
        "file:// URI (a TaskBatch takes s3:// only).",
    )
    split: Split | None = Field(default=None, description="Only tasks of this split.")
    domains: list[ShortText] = _list_set("Only these domains (all when empty).", max_length=64)
    capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=4,
        description="Only tasks exercising any of these capabilities (all when empty).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    task_ids: list[Text] = _list_set(
        "Only these task ids (all when empty); each must be in the origin.", max_length=10_000
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="At most this many tasks, round-robin across domains.",
    )

    RULES = (
        CrossFieldRule(
            cel="has(self.generator) != has(self.datasetUri)",
            message="set exactly one of generator or datasetUri",
            check=lambda m: (m.generator is None) != (m.dataset_uri is None),
        ),
        CrossFieldRule(
            cel=None,  # the server enforces it through x-kubernetes-list-type: set
            message="domains, capabilities and taskIds must be unique",
            check=_check_unique("domains", "capabilities", "task_ids"),
        ),
    )


class TaskBatchSource(TaskSource):
    """A TaskBatch's `TaskSource`: its dataset is in the object store (its pods have no other
    files to read); local runs (`qpa collect --tasks FILE`, the RL config) use `TaskSource`."""

    dataset_uri: DataUri | None = Field(
        default=None,
        description="Tasks as JSON Lines (or a dataset with a manifest.json) at an s3:// URI.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_task_source(cls, data: Any) -> Any:
        """A `TaskSource` is taken as its fields, checked again here."""
        if isinstance(data, TaskSource) and not isinstance(data, TaskBatchSource):
            return data.model_dump(by_alias=True, exclude_unset=True)
        return data


class HarnessVersion(_Model):
    """The Harness version acting around the model: its name and its config."""

    version: Version = Field(
        default="harness-v1", description="Harness version label recorded in every trajectory."
    )
    config_map_ref: ConfigMapKeySelector | None = Field(
        default=None,
        description="ConfigMap key holding the Harness YAML (Skills, memory, budgets), "
        "mounted into each worker.",
    )


class PolicyEndpoint(_Model):
    """The policy that acts: a planner (model endpoint or checkpoint) plus a Harness version."""

    planner: Planner = Field(default="openai", description="Planner backend (qpa --planner).")
    model_url: EndpointUrl | None = Field(
        default=None,
        description="OpenAI-compatible endpoint of the model (planner openai), e.g. "
        "http://planner-predictor.qpa.svc/v1.",
    )
    model: str = Field(
        default="planner", min_length=1, max_length=253, description="Model name at the endpoint."
    )
    model_uri: CheckpointUri | None = Field(
        default=None,
        description="Checkpoint to load in-process (planner local): s3://, pvc:// or hf://.",
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

    source: TaskBatchSource = Field(
        description="Where the tasks come from.",
        json_schema_extra=_immutable("source is immutable; create a new TaskBatch"),
    )
    policy: PolicyEndpoint = Field(description="The model and Harness version that act.")
    rollout_pool_ref: ServiceObjectReference | None = Field(
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
    output_uri: OutputUri = Field(
        description="Where trajectories land (s3:// only), e.g. s3://qpa/taskbatches/nightly/.",
    )
    store: ObjectStore | None = Field(
        default=None, description="Object storage settings for s3:// URIs."
    )
    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        max_length=MAX_IMAGE_LENGTH,
        description="Worker image (the operator's default if unset).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of each worker pod."
    )
    backoff_limit: int = Field(
        default=3, ge=0, le=100, description="Retries per shard before the batch fails."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=2_592_000, description="Fail the batch after this many seconds."
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Additions to the worker pods (placement, pull secrets, volumes, env, "
        'resources), merged as docs/operator.md "Pod overrides" says.',
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
    tasks: Count = Field(default=0, description="Tasks in the batch.")
    trajectories: Count = Field(default=0, description="Trajectories written so far.")
    successes: Count = Field(default=0, description="Trajectories whose task succeeded.")
    failures: Count = Field(default=0, description="Trajectories whose task failed (kept).")
    completed_shards: Count = Field(default=0, description="Shards finished.")
    failed_shards: Count = Field(default=0, description="Shards that failed for good.")
    job_name: Text | None = Field(default=None, description="The indexed Job running the batch.")
    output_uri: UriText | None = Field(default=None, description="Where the trajectories are.")
    start_time: datetime | None = _timestamp("When the Job started.")
    completion_time: datetime | None = _timestamp("When the batch finished.")


class TaskBatch(CustomResource):
    """A batch of tasks rolled out into trajectories in object storage."""

    info = KindInfo(
        kind="TaskBatch",
        plural="taskbatches",
        singular="taskbatch",
        short_names=("qtb",),
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


class CollectSummary(PodSummary):
    """What one `qpa collect` worker (one shard) reports in its termination message."""

    STAGE: ClassVar[str] = "collect"

    out: str = Field(description="Dataset root the shard wrote to.")
    shard: str = Field(pattern=r"^[0-9]+/[0-9]+$", description="This worker's shard, i/n.")
    total: int = Field(ge=0, description="(task, sample) pairs of the shard.")
    ran: int = Field(ge=0, description="Episodes run by this attempt.")
    skipped: int = Field(ge=0, description="Pairs already collected (resumed).")
    successes: int = Field(ge=0, description="Successful episodes among those run.")
    skipped_successes: int = Field(
        default=0, ge=0, description="Successful episodes among those already collected."
    )
    env_errors: int = Field(default=0, ge=0, description="Episodes an environment error ended.")
    parts: int = Field(default=0, ge=0, description="The shard's parts in the store.")
    spooled_parts: int = Field(default=0, ge=0, description="Parts still in the local spool.")
    manifest: str | None = Field(default=None, description="manifest.json once all shards end.")
    complete: bool = Field(default=True, description="Everything uploaded, not interrupted.")
    harness_version: str | None = Field(default=None, description="Harness version recorded.")
    elapsed_s: float = Field(default=0.0, ge=0, description="Seconds the shard took.")
    trajectories_per_s: float = Field(default=0.0, ge=0, description="Episodes run per second.")
