"""RL run settings: `RLConfig` and the settings classes it is made of.

`RLConfig.from_trainingrun(order)` is the one translation of a TrainingRun work order (stage rl)
into these settings; `qpa train rl --config FILE` builds the same object from YAML and flags.
The CARE settings (`care`), the task source (`tasks`) and the task sampling (`sampling`) are the
`qpa.api` models themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qpa.api.v1alpha1 import (
    CareSettings,
    TaskGenerator,
    TaskSampling,
    TaskSource,
    TrainingRun,
    WorkOrder,
)
from qpa.harness.agent import HarnessConfig
from qpa.train.config import (
    CheckpointSettings,
    ConfigError,
    DeepSpeedSettings,
    MetricsSettings,
    from_order,
    read_settings_file,
    validate_settings,
)
from qpa.train.placement import DEVICE_PATTERN, is_hub_id

if TYPE_CHECKING:
    from qpa.contract import Environment

Auto = Literal["auto"]
#: The default task pool: the canonical suite's train split (never train on test).
TRAIN_SPLIT = TaskSource(generator=TaskGenerator(), split="train")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSettings(_Settings):
    """Which environment rollouts act in: in-process (`kind`) or environment servers (`urls`)."""

    kind: str = "sandbox"
    urls: list[str] = Field(default_factory=list, description="`qpa env serve` base URLs")
    options: dict[str, Any] = Field(default_factory=dict, description="in-process env options")
    timeout_s: float = Field(default=30.0, gt=0)
    ready_s: float = Field(
        default=120.0, gt=0, description="how long to wait for the servers' `/health` at start"
    )

    def wait_ready(self) -> None:
        """Wait, at most `ready_s`, until every environment server answers `/health`: a
        RolloutPool's pods may still be starting when the ranks are (no-op in-process)."""
        if not self.urls:
            return
        from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

        from qpa.envs.remote import RemoteEnv, RemoteEnvError

        for url in self.urls:
            env = RemoteEnv(url, timeout=self.timeout_s)
            try:
                for attempt in Retrying(
                    stop=stop_after_delay(self.ready_s),
                    wait=wait_exponential(multiplier=0.2, max=2.0),
                    retry=retry_if_exception_type(RemoteEnvError),
                    reraise=True,
                ):
                    with attempt:
                        env.health()
            finally:
                env.close()

    def open(self, index: int) -> Environment:
        """Episode `index`'s environment: a `RemoteEnv` on the servers taken round robin
        (`urls`), else a fresh in-process `kind` environment made with `options`."""
        if self.urls:
            from qpa.envs.remote import RemoteEnv

            return RemoteEnv(self.urls[index % len(self.urls)], timeout=self.timeout_s)
        from qpa.envs.factory import make_env

        return make_env(self.kind, **self.options)


#: How long a TrainingRun's ranks wait for their rollout server (a large model loads slowly).
ROLLOUT_SERVER_WAIT_S = 1800.0


class GenerationSettings(_Settings):
    """How the policy samples during rollouts.

    `top_k: 0` and `top_p: 1` sample from the full softmax at `temperature`, the distribution
    the loss's log-probabilities are computed from. `max_prompt_tokens` ends an episode whose
    next prompt would be longer (recorded as an aborted episode). `workers` bounds concurrent
    episodes, `max_batch` the sequences of one `generate` call.

    `backend: vllm` samples through a rollout server at `vllm_url` (`trl vllm-serve`, or
    `qpa rollout serve`; `qpa.train.rl.vllm`): its per-token log-probs reach the loss, and the
    main process pushes the weights to it after every step over the weight-sync group it hosts
    on `vllm_group_port`.
    """

    backend: Literal["local", "vllm"] = "local"
    max_new_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    stop_at_action: bool = True
    workers: int = Field(default=64, ge=1)
    max_batch: int = Field(default=64, ge=1)
    vllm_url: str | None = Field(default=None, description="rollout server base URL (vllm)")
    vllm_group_port: int = Field(
        default=51216, ge=1, le=65535, description="weight-sync rendezvous port (on the trainer)"
    )
    vllm_timeout_s: float = Field(
        default=240.0, gt=0, description="seconds to wait for the server and the weight group"
    )

    @model_validator(mode="after")
    def _vllm_needs_url(self) -> GenerationSettings:
        if self.backend == "vllm" and not self.vllm_url:
            raise ValueError("generation.backend 'vllm' needs generation.vllm_url")
        return self

    @classmethod
    def from_order(cls, order: WorkOrder[TrainingRun]) -> GenerationSettings:
        """A TrainingRun's sampling: through the rollout server the operator started for
        `spec.rl.generation` (its URL and rendezvous port resolved in the work order), else
        each rank's own model; prompts bounded by `maxSeqLength`."""
        spec = order.resource.spec
        limit = spec.hyperparameters.max_seq_length
        if spec.rl is None or spec.rl.generation is None:
            return cls(max_prompt_tokens=limit)
        resolved = order.resolved
        if not resolved.rollout_server_url or resolved.rollout_group_port is None:
            raise ConfigError(
                "resolved.rolloutServerUrl: spec.rl.generation is set but the work order "
                "names no rollout server (URL and rolloutGroupPort)"
            )
        return cls(
            backend="vllm",
            max_prompt_tokens=limit,
            vllm_url=resolved.rollout_server_url,
            vllm_group_port=resolved.rollout_group_port,
            vllm_timeout_s=ROLLOUT_SERVER_WAIT_S,
        )


class LossSettings(_Settings):
    """The policy-gradient objective (GRPO's clipped surrogate, optional KL to the start model)."""

    clip_low: float = Field(default=0.2, ge=0, lt=1, description="eps_low")
    clip_high: float = Field(default=0.2, ge=0, description="eps_high (DAPO clip-higher)")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (0: no reference model)")
    ppo_epochs: int = Field(default=1, ge=1, description="updates per batch of rollouts")
    loss_type: Literal["token_mean", "sequence_mean", "dr_grpo"] = Field(
        default="token_mean",
        description="the surrogate summed over trained tokens, divided by the step's trained "
        "tokens (token_mean), its sequences (sequence_mean, each first averaged over its "
        "tokens) or a constant, episodes x max_new_tokens x max_turns (dr_grpo, Dr.GRPO's "
        "length-unbiased normaliser; `qpa.train.rl.loss.loss_normalizer`)",
    )
    pack_turns: bool = True
    micro_batch_size: int = Field(default=4, ge=1, description="sequences per forward pass")
    skip_zero_advantage: bool = True
    importance_sampling: bool = Field(
        default=True,
        description="weight each token by the truncated sampler/trainer ratio where the sampler "
        "reported log-probabilities (TRL's vllm_importance_sampling_correction, token_truncate)",
    )
    importance_sampling_cap: float = Field(
        default=3.0,
        gt=0,
        description="C in min(exp(logp_trainer - logp_sampler), C) (TRL 1.16's default 3.0)",
    )
    kl_ratio_correction: bool = Field(
        default=False,
        description="multiply the KL term by the ratio (DeepSeek-V3.2's unbiased KL gradient; "
        "TRL's use_bias_correction_kl, on by default there)",
    )


class OptimSettings(_Settings):
    """AdamW (plain PyTorch or through DeepSpeed) with linear warm-up to a constant rate."""

    learning_rate: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_epsilon: float = Field(default=1e-8, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    warmup_steps: int = Field(default=0, ge=0)


class RLConfig(_Settings):
    """An online RL run (`qpa train rl --config rl.yaml`); see `examples/local/rl.yaml`.

    Parameters:
        name: run name (metrics label, default store prefix `trainingruns/<name>`).
        model: starting checkpoint: a Hugging Face folder, a store URI of one, or a Hub repo
            id (`org/name[@revision]`; `qpa.train.placement.resolve_model_source`).
        tokenizer: tokenizer folder, URI or Hub id (default: the model's).
        output_dir: local working folder (checkpoints, metrics). Default `runs/<name>`.
        steps: total optimizer steps (a resumed run stops at the same count).
        tasks_per_step: tasks per step; samples_per_task: k, the group size (>= 2).
        seed: seeds task sampling, generation and initialisation.
        device: `auto` (this rank's GPU, `cuda:$LOCAL_RANK`, wherever CUDA is available; the
            CPU only where it is not), `cpu`, `cuda` or `cuda:N` (`qpa.train.placement`).
        model_dtype: weights' dtype; `auto`: bfloat16 on CUDA (float32 weights under bf16
            autocast when plain AdamW trains them, see `qpa.train.placement`), float32 on CPU.
        bf16 / gradient_checkpointing: as for SFT (`auto`: bf16 where CUDA has it;
            checkpointing for hidden sizes >= 1024).
        tasks: the task pool (`qpa.api` TaskSource, read by `qpa.data.tasks.select_tasks`);
            default: the canonical suite's train split.
        sampling: which pool tasks a step draws (`uniform` or `learnability`; the CRD's
            `spec.rl.sampling`, `qpa.api.v1alpha1.TaskSampling`, see `qpa.train.rl.tasks`).
        env, harness, generation, loss, optim, care: see their classes (`care` is the CRD's
            `spec.rl.care` model, `qpa.api.v1alpha1.CareSettings`).
        deepspeed, checkpoint, metrics: shared with SFT (`qpa.train.config`).
    """

    name: str = Field(default="rl", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    model: str = Field(min_length=1)
    tokenizer: str | None = None
    output_dir: str | None = None
    steps: int = Field(default=100, ge=1)
    tasks_per_step: int = Field(default=8, ge=1)
    samples_per_task: int = Field(default=8, ge=2)
    seed: int = 0
    device: str = Field(default="auto", pattern=DEVICE_PATTERN)
    model_dtype: Literal["float32", "bfloat16", "auto"] = "auto"
    bf16: Auto | bool = "auto"
    gradient_checkpointing: Auto | bool = "auto"
    tasks: TaskSource = Field(default_factory=lambda: TRAIN_SPLIT)
    sampling: TaskSampling = Field(default_factory=TaskSampling)
    env: EnvSettings = Field(default_factory=EnvSettings)
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(max_turns=8))
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    loss: LossSettings = Field(default_factory=LossSettings)
    optim: OptimSettings = Field(default_factory=OptimSettings)
    care: CareSettings = Field(default_factory=CareSettings)
    deepspeed: DeepSpeedSettings = Field(default_factory=DeepSpeedSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    metrics: MetricsSettings = Field(default_factory=lambda: MetricsSettings(logging_steps=1))

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> RLConfig:
        """Read a YAML file; `overrides` maps dotted paths (`care.enabled`) to values.

        Relative local paths (model, tokenizer, output_dir, tasks file/dataset, checkpoint
        store/resume_from, metrics files, harness skills) are taken relative to the working
        directory, as for `qpa train sft` and any other command.
        """
        data = read_settings_file(path, overrides)
        return cls.from_dict(data, origin=str(path)).relative_to(Path.cwd())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "<config>") -> RLConfig:
        return validate_settings(cls, data, origin)

    def relative_to(self, base: Path) -> RLConfig:
        """Resolve the config's relative local paths against `base`."""

        def fix(value: str | None) -> str | None:
            if value is None or "://" in value or Path(value).is_absolute():
                return value
            return str((base / value).resolve())

        def fix_model(value: str | None) -> str | None:
            # A Hub repo id (org/name) stays one unless a folder of that name exists here.
            if value is not None and is_hub_id(value) and not (base / value).exists():
                return value
            return fix(value)

        return self.model_copy(
            update={
                "model": fix_model(self.model),
                "tokenizer": fix_model(self.tokenizer),
                "output_dir": fix(self.output_dir),
                "harness": self.harness.model_copy(
                    update={"skills_path": fix(self.harness.skills_path)}
                ),
                "checkpoint": self.checkpoint.model_copy(
                    update={
                        "store": fix(self.checkpoint.store),
                        "resume_from": fix(self.checkpoint.resume_from),
                    }
                ),
                "metrics": self.metrics.model_copy(
                    update={
                        "jsonl": fix(self.metrics.jsonl),
                        "textfile": fix(self.metrics.textfile),
                    }
                ),
            }
        )

    @classmethod
    def from_trainingrun(
        cls, order: WorkOrder[TrainingRun], *, work_dir: Path | None = None
    ) -> RLConfig:
        """The run a TrainingRun work order (stage rl) asks for: every spec field mapped here.

        The tasks are the resolved dataset's (a TaskBatch's output) or the suite's train split;
        rollouts go to the resolved RolloutPool. `work_dir` (default: the working directory)
        holds the local run folder.
        """
        spec = order.resource.spec
        if spec.stage != "rl" or spec.rl is None:
            raise ConfigError(f"spec.stage: {spec.stage!r} is not rl (use qpa train {spec.stage})")
        url = order.resolved.rollout_pool_url
        if not url:
            raise ConfigError("resolved.rolloutPoolUrl: the work order names no RolloutPool URL")
        rl, hp = spec.rl, spec.hyperparameters
        dataset = order.resolved.dataset_uri
        common = from_order(order, work_dir=work_dir)
        return cls(
            **common,
            steps=hp.max_steps or cls.model_fields["steps"].default,
            tasks_per_step=rl.tasks_per_step,
            samples_per_task=rl.samples_per_task,
            tasks=TaskSource(dataset_uri=dataset, split="train") if dataset else TRAIN_SPLIT,
            env=EnvSettings(urls=[url]),
            harness=HarnessConfig(max_turns=rl.max_turns),
            generation=GenerationSettings.from_order(order),
            loss=LossSettings(micro_batch_size=hp.per_device_batch_size, loss_type=rl.loss_type),
            optim=OptimSettings(
                learning_rate=hp.learning_rate, max_grad_norm=spec.deepspeed.gradient_clipping
            ),
            care=rl.care,
            sampling=rl.sampling,
            metrics=MetricsSettings(logging_steps=1),
        )

    # ------------------------------------------------------------------ derived values
    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")

    @property
    def store_prefix(self) -> str:
        return (self.checkpoint.prefix or f"trainingruns/{self.name}").strip("/")

    @property
    def metrics_path(self) -> Path:
        return Path(self.metrics.jsonl) if self.metrics.jsonl else self.run_dir / "metrics.jsonl"
