"""TrainingRun: its spec, status and custom resource model."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from qpa.api.v1alpha1.base import (
    IMAGE,
    MAX_IMAGE_LENGTH,
    MAX_MAP_ENTRIES,
    MAX_SEED,
    CheckpointUri,
    Condition,
    Count,
    CrossFieldRule,
    DataUri,
    LocalObjectReference,
    ObjectStore,
    Offload,
    OutputUri,
    Quantity,
    ResourceRequirements,
    ServiceObjectReference,
    Stage,
    Text,
    UriText,
    _conditions,
    _defaulted,
    _immutable,
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


class DatasetRef(_Model):
    """Training data: a TaskBatch's output or a URI, exactly one, with a mixture weight."""

    task_batch_ref: LocalObjectReference | None = Field(
        default=None, description="Use the trajectories of this TaskBatch."
    )
    uri: DataUri | None = Field(default=None, description="Dataset URI (s3:// only).")
    weight: float = Field(default=1.0, gt=0, le=1000, description="Relative mixture weight.")

    RULES = (
        CrossFieldRule(
            cel="has(self.taskBatchRef) != has(self.uri)",
            message="set exactly one of taskBatchRef or uri",
            check=lambda m: (m.task_batch_ref is None) != (m.uri is None),
        ),
    )


CareTier = Literal["progress_shaping", "outcome_consolidation", "efficiency_refinement"]
CARE_TIERS: tuple[CareTier, ...] = (
    "progress_shaping",
    "outcome_consolidation",
    "efficiency_refinement",
)
VANILLA_EPS = 1e-4
"""GRPO's epsilon in ``std + eps`` (TRL's default)."""


class CareSettings(_Model):
    """CARE: Competence-Aware Reward-and-Advantage Engineering (see `qpa.train.care`).

    One model for the CRD (`spec.rl.care`), the trainer (`qpa.train.care`'s functions), the RL
    config (`RLConfig.care`) and the loop preset. A group's success rate picks its reward tier:
    below `lowSuccessThreshold` progress shaping, above `highSuccessThreshold` efficiency
    refinement, in between outcome only. `formatWeight` gives a failure credit for the share
    of its turns that parsed, so a group of failures still tells a tool call from a malformed
    output. `lowSuccessThreshold: 0` switches progress shaping off,
    `highSuccessThreshold: 1` efficiency refinement. `enabled: false` trains vanilla GRPO
    instead: every group gets `vanillaReward`'s tier and plain group standardisation
    (`scaleRewards: group`) or Dr.GRPO's centring (`none`, with `spec.rl.lossType: dr_grpo`).
    """

    enabled: bool = Field(
        default=True,
        description="CARE rewards and advantages; false: vanilla GRPO (the baseline).",
    )
    vanilla_reward: CareTier = Field(
        default="outcome_consolidation",
        description="The one reward tier of every group when enabled is false.",
    )
    low_success_threshold: float = Field(
        default=0.2, ge=0, le=1, description="Below this group success rate: progress shaping."
    )
    high_success_threshold: float = Field(
        default=0.8, ge=0, le=1, description="Above this group success rate: efficiency."
    )
    progress_weight: float = Field(
        default=0.8,
        ge=0,
        lt=1,
        description="A failure's reward per unit of verifier progress (progress shaping).",
    )
    format_weight: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="A failure's reward per unit share of its turns that parsed as a tool call "
        "(progress shaping and outcome consolidation; 0: off).",
    )
    token_weight: float = Field(
        default=0.1, ge=0, le=1, description="Weight of a success's output tokens (efficiency)."
    )
    call_weight: float = Field(
        default=0.05, ge=0, le=1, description="Weight of a success's tool calls (efficiency)."
    )
    normalization: Literal["group", "budget"] = Field(
        default="group",
        description="Cost normalisers: the group's successes (group) or tokenNorm/callNorm.",
    )
    token_norm: float = Field(
        default=1024.0, gt=0, le=1e9, description="Output tokens of unit cost (budget)."
    )
    call_norm: float = Field(default=16.0, gt=0, le=1e9, description="Tool calls of unit cost.")
    cost_cap: float = Field(
        default=2.0, gt=0, le=1000, description="Cap on each normalised efficiency cost term."
    )
    success_anchor: bool = Field(
        default=True,
        description="Scale all-success and all-failure groups' advantages by what one success "
        "is worth (false: plain group standardisation for every group).",
    )
    success_value: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="What one success is worth: the success anchor's unit.",
    )
    epsilon: float = Field(default=VANILLA_EPS, ge=0, le=1, description="eps in std + eps.")
    scale_rewards: Literal["group", "none"] = Field(
        default="group",
        description="Advantages when enabled is false: group: (r - mean) / (std + eps), GRPO; "
        "none: r - mean, Dr.GRPO (CARE scales by its success anchor).",
    )

    RULES = (
        CrossFieldRule(
            cel="self.lowSuccessThreshold <= self.highSuccessThreshold",
            message="lowSuccessThreshold must not exceed highSuccessThreshold",
            check=lambda m: m.low_success_threshold <= m.high_success_threshold,
        ),
        CrossFieldRule(
            cel="self.progressWeight + self.formatWeight < 1.0",
            message="progressWeight + formatWeight must be below 1 so that every success "
            "outranks every failure",
            check=lambda m: m.progress_weight + m.format_weight < 1.0,
        ),
        CrossFieldRule(
            cel="(self.tokenWeight + self.callWeight) * self.costCap < 1.0",
            message="(tokenWeight + callWeight) * costCap must be below 1 so that every success "
            "outranks every failure",
            check=lambda m: (m.token_weight + m.call_weight) * m.cost_cap < 1.0,
        ),
    )

    @property
    def max_cost(self) -> float:
        """The largest efficiency cost a success can pay."""
        return (self.token_weight + self.call_weight) * self.cost_cap


class RolloutGeneration(_Model):
    """A rollout server for the run's sampling (TRL's vLLM server mode): the operator starts it
    as its own Deployment and Service; the ranks generate through it and sync their weights to
    it every step."""

    backend: Literal["vllm", "hf"] = Field(
        default="vllm",
        description="vllm: vLLM's server (GPU); hf: a transformers model speaking the same API.",
    )
    gpus: int = Field(default=1, ge=0, le=64, description="GPUs of the rollout server's pod.")
    tensor_parallel: int = Field(
        default=1, ge=1, le=64, description="Tensor-parallel size of the vLLM server."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="Weights' dtype in the rollout server."
    )
    max_model_length: int | None = Field(
        default=None, ge=1, le=1_048_576, description="Longest prompt plus completion, in tokens."
    )
    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        max_length=MAX_IMAGE_LENGTH,
        description="Rollout server image (vllm: the operator's vLLM image; hf: the trainer's).",
    )

    RULES = (
        CrossFieldRule(
            cel="self.backend != 'vllm' || (self.gpus >= 1 && self.tensorParallel <= self.gpus)",
            message="backend vllm needs gpus >= 1 and tensorParallel <= gpus",
            check=lambda m: m.backend != "vllm" or (m.gpus >= 1 and m.tensor_parallel <= m.gpus),
        ),
        CrossFieldRule(
            cel="self.backend != 'hf' || self.tensorParallel == 1",
            message="backend hf serves on one device: tensorParallel must be 1",
            check=lambda m: m.backend != "hf" or m.tensor_parallel == 1,
        ),
    )


class TaskSampling(_Model):
    """Which pool tasks an RL step rolls out (`qpa.train.rl.tasks`).

    `uniform`: a seeded shuffle per epoch, every task once per epoch. `learnability`: each
    task's success rate p is estimated from its last `window` groups (unseen tasks count as
    p = 0.5, the most learnable), tasks are drawn without replacement with weight
    p(1-p) + `floor`, and groups whose rollouts all succeed or all fail (no success variance,
    no signal) are dropped from the update and replaced by freshly drawn tasks, up to
    `refillRounds` rounds a step.
    """

    strategy: Literal["uniform", "learnability"] = Field(
        default="uniform", description="How a step's tasks are drawn from the pool."
    )
    window: int = Field(
        default=4, ge=1, le=1024, description="Recent groups per task its success rate uses."
    )
    floor: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="Weight added to p(1-p), so no task starves (learnability).",
    )
    refill_rounds: int = Field(
        default=2,
        ge=0,
        le=16,
        description="Rounds a step may replace its zero-variance groups (learnability).",
    )


class RLSettings(_Model):
    """Online agentic RL (GRPO with CARE) in a RolloutPool's environments."""

    rollout_pool_ref: ServiceObjectReference = Field(
        description="RolloutPool whose environment servers run the rollouts."
    )
    samples_per_task: int = Field(
        default=8, ge=2, le=256, description="Rollouts per task (the group size k)."
    )
    tasks_per_step: int = Field(default=8, ge=1, le=4096, description="Tasks per RL step.")
    max_turns: int = Field(default=40, ge=1, le=1000, description="Turn budget per rollout.")
    care: CareSettings = _defaulted(CareSettings, "CARE reward and advantage settings.")
    loss_type: Literal["token_mean", "sequence_mean", "dr_grpo"] = Field(
        default="token_mean",
        description="The summed surrogate over the step's trained tokens, its sequences, or "
        "a constant (dr_grpo: Dr.GRPO's, episodes x max new tokens x turns).",
    )
    sampling: TaskSampling = _defaulted(TaskSampling, "How each step draws its tasks.")
    generation: RolloutGeneration | None = Field(
        default=None,
        description="Sample through a rollout server the operator starts (unset: each rank "
        "samples with its own model).",
    )


class SFTSettings(_Model):
    """Planning-oriented SFT cold start (the CRD's `spec.sft` and `SFTConfig.sft`)."""

    turn_masking: bool = Field(
        default=True,
        description="Mask erroneous turns (learn recovery, not the error); false: train on "
        "every assistant turn.",
    )


class DeepSpeedSettings(_Model):
    """DeepSpeed ZeRO settings of the ranks."""

    zero_stage: Literal[0, 1, 2, 3] = Field(default=2, description="ZeRO stage.")
    offload_optimizer: Offload = Field(default="none", description="Where optimizer state lives.")
    offload_parameters: Offload = Field(default="none", description="Where parameters live.")
    bf16: bool = Field(default=True, description="Train in bfloat16 where supported.")
    gradient_clipping: float = Field(
        default=1.0, gt=0, le=1e6, description="Global gradient norm clip."
    )

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
        default=None, ge=1, le=100_000_000, description="Stop after this many optimizer steps."
    )
    per_device_batch_size: int = Field(default=1, ge=1, le=4096, description="Micro-batch size.")
    gradient_accumulation_steps: int = Field(default=8, ge=1, le=4096, description="Steps/update.")
    max_seq_length: int = Field(default=8192, ge=128, le=1_048_576, description="Token limit.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Random seed.")


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that hands a suspended Job to Kueue (its LocalQueue in the Job's namespace)."""
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class SchedulingSettings(_Model):
    """How the ranks' Job is admitted: whole (every rank at once) or not at all.

    The Job of each attempt is created suspended. With a Kueue queue (`queueName`, else the
    chart's `trainingRuns.queueName`) it carries `kueue.x-k8s.io/queue-name` and Kueue
    un-suspends it once its quota holds every rank; otherwise the operator un-suspends it once
    the schedulable nodes the rank pods may use have room for all of them, and fails the run
    when that has not happened within `admissionTimeoutSeconds`.
    """

    queue_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        max_length=63,
        description="Kueue LocalQueue of the ranks' Job (unset: the chart's "
        "trainingRuns.queueName; neither: the operator's own all-or-nothing admission).",
    )
    admission_timeout_seconds: int = Field(
        default=3600,
        ge=1,
        le=604_800,
        description="Seconds an attempt may wait for room for every rank (the operator's "
        "admission) before the run fails with Admitted=False.",
    )
    keep_failed_attempts: int = Field(
        default=1,
        ge=0,
        le=20,
        description="Failed attempts whose Job (and so its pods and their logs) is kept; "
        "older ones are deleted.",
    )


class TrainingRunSpec(_Model):
    """SFT or CARE RL as an indexed Job of DeepSpeed ranks with a headless Service."""

    stage: Stage = Field(
        description="sft (cold start) or rl (online CARE RL).",
        json_schema_extra=_immutable("stage is immutable"),
    )
    base_model_uri: CheckpointUri = Field(
        description="Checkpoint to start from: s3://, pvc:// or hf://."
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
    nodes: int = Field(
        default=1,
        ge=1,
        le=512,
        description="Nodes (Job completions); immutable (the ranks' world size).",
        json_schema_extra=_immutable(
            "nodes is immutable: the ranks' world size is fixed for the run (create a new "
            "TrainingRun with resumeFrom to continue at another size)"
        ),
    )
    gpus_per_node: int = Field(
        default=8,
        ge=0,
        le=16,
        description="GPUs per node (0: CPU); immutable (the ranks' world size).",
        json_schema_extra=_immutable(
            "gpusPerNode is immutable: the ranks' world size is fixed for the run (create a "
            "new TrainingRun with resumeFrom to continue at another size)"
        ),
    )
    output_uri: OutputUri = Field(
        description="Where checkpoints and the final model go (s3:// only), e.g. "
        "s3://qpa/trainingruns/x/.",
    )
    store: ObjectStore | None = Field(
        default=None, description="Object storage settings for s3:// URIs."
    )
    checkpoint_every: int = Field(
        default=500, ge=1, le=100_000_000, description="Optimizer steps per checkpoint."
    )
    keep_checkpoints: int = Field(default=3, ge=1, le=1000, description="Checkpoints kept.")
    resume: bool = Field(
        default=True, description="After a failure, resume from the latest checkpoint."
    )
    resume_from: DataUri | None = Field(
        default=None,
        description="Start from this checkpoint (s3://) instead of the latest one.",
    )
    backoff_limit: int = Field(default=3, ge=0, le=100, description="Restarts before failing.")
    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        max_length=MAX_IMAGE_LENGTH,
        description="Trainer image (the operator's default if unset).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of each rank's pod (GPUs come from gpusPerNode)."
    )
    work_size: Quantity = Field(
        default="50Gi",
        description="Size limit of each rank's /work emptyDir, and its ephemeral-storage "
        "request unless resources.requests names one.",
    )
    scheduling: SchedulingSettings = _defaulted(
        SchedulingSettings, "Gang admission of the ranks: Kueue queue, timeout, kept attempts."
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Additions to the rank and data pods (placement, pull secrets, volumes, env, "
        'resources), merged as docs/operator.md "Pod overrides" says.',
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

    step: Count = Field(description="Optimizer step.")
    uri: UriText = Field(min_length=1, description="Where it is.")
    time: datetime | None = _timestamp("When it was written.")


class TrainSummary(PodSummary):
    """What rank 0 of `qpa train sft|rl` reports in its termination message (one spelling per
    field); the operator folds it into `TrainingRunStatus`."""

    STAGE: ClassVar[str] = "train"

    run: str = Field(min_length=1, description="Run name.")
    stage: Stage = Field(description="sft or rl.")
    step: int = Field(ge=0, description="Last optimizer step.")
    total_steps: int | None = Field(default=None, ge=0, description="Steps planned.")
    checkpoints: list[Checkpoint] = Field(
        default_factory=list, description="Checkpoints in the store, oldest first."
    )
    model_uri: str | None = Field(default=None, description="The final model in the store.")
    loss: float | None = Field(default=None, description="Training loss (SFT: the run's mean).")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Latest metrics (reward, success_rate, ...)."
    )
    resumed_from: str | None = Field(
        default=None, description="The checkpoint this attempt resumed from."
    )
    resumed_step: int | None = Field(default=None, ge=0, description="Its step.")


TrainingRunPhase = Literal["Pending", "Running", "Resuming", "Succeeded", "Failed"]


class TrainingRunStatus(_Model):
    """Progress of a TrainingRun."""

    phase: TrainingRunPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    step: Count = Field(default=0, description="Latest optimizer step reported.")
    total_steps: Count | None = Field(default=None, description="Steps planned.")
    metrics: dict[str, float] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Latest metrics (loss, reward, success_rate, ...).",
    )
    checkpoints: list[Checkpoint] = Field(
        default_factory=list, max_length=1000, description="Checkpoints kept, oldest first."
    )
    latest_checkpoint: UriText | None = Field(default=None, description="URI of the newest one.")
    model_uri: UriText | None = Field(default=None, description="The final model, once succeeded.")
    restarts: Count = Field(default=0, description="Times the run resumed after a failure.")
    disruptions: Count = Field(
        default=0,
        description="Attempts ended by a disruption (preemption, eviction, drain): restarted "
        "without counting against backoffLimit.",
    )
    job_name: Text | None = Field(default=None, description="The indexed Job of the ranks.")
    start_time: datetime | None = _timestamp("When the first rank started.")
    completion_time: datetime | None = _timestamp("When the run finished.")


class TrainingRun(CustomResource):
    """SFT or CARE RL of the planner as DeepSpeed ranks, checkpointed to object storage."""

    info = KindInfo(
        kind="TrainingRun",
        plural="trainingruns",
        singular="trainingrun",
        short_names=("qtr",),
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
