"""TrainingRun: its spec, status and custom resource model."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from qpa.api.v1alpha1.base import (
    ARTIFACT_URI,
    IMAGE,
    MODEL_URI,
    Condition,
    CrossFieldRule,
    LocalObjectReference,
    ObjectStore,
    Offload,
    ResourceRequirements,
    Stage,
    _conditions,
    _defaulted,
    _immutable,
    _Model,
    _observed_generation,
    _s3_needs_store,
    _timestamp,
)
from qpa.api.v1alpha1.resource import (
    AGE_COLUMN,
    PHASE_COLUMN,
    CustomResource,
    KindInfo,
    PrinterColumn,
)


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
