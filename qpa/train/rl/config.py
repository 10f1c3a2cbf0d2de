"""RL run settings: `RLConfig` and the settings classes it is made of."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpa.contract import Split
from qpa.harness.agent import HarnessConfig
from qpa.train.care import CareConfig, CareTier
from qpa.train.config import (
    CheckpointSettings,
    ConfigError,
    DeepSpeedSettings,
    MetricsSettings,
    set_dotted,
)

Auto = Literal["auto"]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskSource(_Settings):
    """Where the training tasks come from (the pool a step samples from).

    Parameters:
        suite / suite_seed: the sandbox suite to draw from (when no `file`/`dataset` is given,
            and to resolve a dataset's task ids).
        split: keep tasks of this split (`train` by default; never train on `test`).
        file: a tasks JSONL (`Task` per line): a local path or a store URI (`s3://`, `file://`).
        dataset: a dataset prefix (local folder or store URI) with `manifest.json`: a `tasks`
            dataset's rows are the tasks; any other kind names its tasks in `lineage.tasks`.
        ids: keep only these task ids.
        domains: keep only these domains.
        limit: keep at most this many tasks (first ones, after filtering).
    """

    suite: str = "mobilepa"
    suite_seed: int = 0
    split: Split | None = "train"
    file: str | None = None
    dataset: str | None = None
    ids: list[str] = Field(default_factory=list)
    domains: list[str] = Field(default_factory=list)
    limit: int | None = Field(default=None, ge=1)


class EnvSettings(_Settings):
    """Which environment rollouts act in: in-process (`kind`) or environment servers (`urls`)."""

    kind: str = "sandbox"
    urls: list[str] = Field(default_factory=list, description="`qpa env serve` base URLs")
    options: dict[str, Any] = Field(default_factory=dict, description="in-process env options")
    timeout_s: float = Field(default=30.0, gt=0)


class GenerationSettings(_Settings):
    """How the policy samples during rollouts.

    `top_k: 0` and `top_p: 1` sample from the full softmax at `temperature`, the distribution
    the loss's log-probabilities are computed from. `max_prompt_tokens` ends an episode whose
    next prompt would be longer (recorded as an aborted episode). `workers` bounds concurrent
    episodes, `max_batch` the sequences of one `generate` call.
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
    vllm_url: str | None = None
    vllm_group_port: int = 51216
    vllm_timeout_s: float = Field(default=240.0, gt=0)

    @model_validator(mode="after")
    def _vllm_needs_url(self) -> GenerationSettings:
        if self.backend == "vllm" and not self.vllm_url:
            raise ValueError("generation.backend 'vllm' needs generation.vllm_url")
        return self


class LossSettings(_Settings):
    """The policy-gradient objective (GRPO's clipped surrogate, optional KL to the start model)."""

    clip_low: float = Field(default=0.2, ge=0, lt=1, description="eps_low")
    clip_high: float = Field(default=0.2, ge=0, description="eps_high (DAPO clip-higher)")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (0: no reference model)")
    ppo_epochs: int = Field(default=1, ge=1, description="updates per batch of rollouts")
    loss_type: Literal["token_mean", "sequence_mean"] = "token_mean"
    pack_turns: bool = True
    micro_batch_size: int = Field(default=4, ge=1, description="sequences per forward pass")
    skip_zero_advantage: bool = True


class OptimSettings(_Settings):
    """AdamW (plain PyTorch or through DeepSpeed) with linear warm-up to a constant rate."""

    learning_rate: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_epsilon: float = Field(default=1e-8, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    warmup_steps: int = Field(default=0, ge=0)


class CareSettings(CareConfig):
    """CARE's configuration (`qpa.train.care.CareConfig`) plus the switch and the baseline.

    `enabled: false` (or `--care off`) trains vanilla GRPO: every group gets the fixed reward
    of `vanilla_reward`'s tier (outcome: success only) and plain group standardisation.
    """

    enabled: bool = True
    vanilla_reward: CareTier = "outcome_consolidation"

    def care_config(self) -> CareConfig:
        return CareConfig.model_validate(self.model_dump(exclude={"enabled", "vanilla_reward"}))


class RLConfig(_Settings):
    """An online RL run (`qpa train rl --config rl.yaml`); see `examples/local/rl.yaml`.

    Parameters:
        name: run name (metrics label, default store prefix `trainingruns/<name>`).
        model: starting checkpoint: a Hugging Face folder or a store URI of one.
        tokenizer: tokenizer folder (default: the model's).
        output_dir: local working folder (checkpoints, metrics). Default `runs/<name>`.
        steps: total optimizer steps (a resumed run stops at the same count).
        tasks_per_step: tasks per step; samples_per_task: k, the group size (>= 2).
        seed: seeds task sampling, generation and initialisation.
        model_dtype / bf16 / gradient_checkpointing: as for SFT (`auto`: bf16 where CUDA has
            it; checkpointing for hidden sizes >= 1024).
        tasks, env, harness, generation, loss, optim, care: see their classes.
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
    model_dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    bf16: Auto | bool = "auto"
    gradient_checkpointing: Auto | bool = "auto"
    tasks: TaskSource = Field(default_factory=TaskSource)
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
        file = Path(path)
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read {file}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: expected a mapping of settings, got {type(data).__name__}")
        for dotted, value in (overrides or {}).items():
            set_dotted(data, dotted, value)
        return cls.from_dict(data, origin=str(file)).relative_to(Path.cwd())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "<config>") -> RLConfig:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise ConfigError(f"{origin}: {problems}") from None

    def relative_to(self, base: Path) -> RLConfig:
        """Resolve the config's relative local paths against `base`."""

        def fix(value: str | None) -> str | None:
            if value is None or "://" in value or Path(value).is_absolute():
                return value
            return str((base / value).resolve())

        return self.model_copy(
            update={
                "model": fix(self.model),
                "tokenizer": fix(self.tokenizer),
                "output_dir": fix(self.output_dir),
                "tasks": self.tasks.model_copy(
                    update={"file": fix(self.tasks.file), "dataset": fix(self.tasks.dataset)}
                ),
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
