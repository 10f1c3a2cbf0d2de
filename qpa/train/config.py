"""Settings of a supervised run: `SFTConfig`, `DeepSpeedSettings`, `CheckpointSettings`, ...

A run is one YAML file (`qpa train sft --config sft.yaml`) or a TrainingRun work order (`qpa train
sft --spec FILE`: `SFTConfig.from_trainingrun`, the one translation of the custom resource), read
into pydantic models that reject unknown fields and name the file and field of every error. The
qpa settings map onto TRL/transformers ones in `SFTConfig.to_trl` (TRL's `SFTConfig` is a
`TrainingArguments`), and the DeepSpeed JSON is generated from `DeepSpeedSettings` by
`qpa.train.deepspeed.deepspeed_config`. Anything TRL offers that qpa does not name goes through
the `trl:` mapping unchanged (its keys are checked against `trl.SFTConfig`'s fields).

`from_order` maps the spec fields SFT and RL share (model, seed, precision, DeepSpeed, checkpoints
in the object store below `outputUri`, resume) for both stages. This module imports only
pydantic, PyYAML and `qpa.api`; torch and TRL are imported when a run starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpa.api.v1alpha1 import SFTSettings, TrainingRun, WorkOrder

Auto = Literal["auto"]


class ConfigError(ValueError):
    """A settings file that cannot be read or does not validate; the message names the field."""


M = TypeVar("M", bound=BaseModel)


def read_settings_file(
    path: str | Path, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A run's YAML settings as a dict, with `overrides` (dotted paths) applied; errors name
    the file."""
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
    return data


def validate_settings(cls: type[M], data: Mapping[str, Any], origin: str) -> M:
    """`cls` from `data`, or a `ConfigError` naming `origin` and every failing field."""
    try:
        return cls.model_validate(dict(data))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"{origin}: {problems}") from None


class DeepSpeedSettings(BaseModel):
    """DeepSpeed ZeRO settings; the JSON config is generated from them.

    Parameters:
        enabled (`bool`, defaults to `False`):
            Run the optimizer through DeepSpeed (ZeRO). Off: plain PyTorch/accelerate.
        zero_stage (`int`, defaults to `2`):
            ZeRO stage: 0 (off), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters).
        offload_optimizer (`bool`, defaults to `False`):
            Keep optimizer states (and the step) in CPU memory (ZeRO-Offload; stages 1-3).
        offload_param (`bool`, defaults to `False`):
            Keep parameters in CPU memory (ZeRO-Infinity; stage 3 only).
        bf16 (`"auto"` or `bool`, defaults to `"auto"`):
            bf16 mixed precision; `"auto"` follows the trainer's `bf16` (on where CUDA has bf16).
        torch_adam (`bool`, *optional*):
            Use `torch.optim.AdamW` instead of DeepSpeed's fused/CPU Adam ops (no op build at
            start-up). Unset: on without CUDA, off with it.
        overlap_comm (`bool`, *optional*):
            Overlap gradient reduction with the backward pass. Unset: on with CUDA.
        contiguous_gradients (`bool`, defaults to `True`):
            Copy gradients into one contiguous buffer as they are produced.
        gather_16bit_weights_on_model_save (`bool`, defaults to `True`):
            ZeRO-3: gather the full weights when the final model is saved (a loadable folder).
        extra (`dict`, defaults to `{}`):
            Merged (deeply) into the generated JSON last: any DeepSpeed key qpa does not name.
        config_file (`str`, *optional*):
            A DeepSpeed JSON file used as is instead of the generated config.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False
    offload_param: bool = False
    bf16: Auto | bool = "auto"
    torch_adam: bool | None = None
    overlap_comm: bool | None = None
    contiguous_gradients: bool = True
    gather_16bit_weights_on_model_save: bool = True
    extra: dict[str, Any] = Field(default_factory=dict)
    config_file: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DeepSpeedSettings:
        if self.offload_param and self.zero_stage != 3:
            raise ValueError("offload_param needs zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1, 2 or 3")
        return self


class CheckpointSettings(BaseModel):
    """Where checkpoints go, how often, and how a run resumes.

    Parameters:
        every_steps (`int`, defaults to `50`):
            Save a checkpoint (weights, optimizer, scheduler, RNG states, step) every N optimizer
            steps (`save_steps`), and upload it to the store.
        keep_last (`int`, *optional*, defaults to `2`):
            Local checkpoint folders kept in `output_dir` (`save_total_limit`); the store keeps
            every uploaded checkpoint. Unset: keep all.
        store (`str`, *optional*):
            Store root URI (`file:///abs/dir`, `s3://bucket/prefix`) or local folder the
            checkpoints and the final model are uploaded to. Unset: local only.
        prefix (`str`, *optional*):
            Key prefix of this run in the store. Unset: `trainingruns/<name>`.
        resume (`"never"`, `"latest"` or `"auto"`, defaults to `"never"`):
            `latest`: continue from the newest complete checkpoint (local or in the store), and
            fail if there is none; `auto`: the same, but start fresh when there is none (what a
            restarted Job wants); `never`: start fresh.
        resume_from (`str`, *optional*):
            Continue from this checkpoint (a local folder or a store URI); overrides `resume`.
        save_final (`bool`, defaults to `True`):
            Save (and upload) the final model and tokenizer to `<output_dir>/final`.
    """

    model_config = ConfigDict(extra="forbid")

    every_steps: int = Field(default=50, ge=1)
    keep_last: int | None = Field(default=2, ge=1)
    store: str | None = None
    prefix: str | None = None
    resume: Literal["never", "latest", "auto"] = "never"
    resume_from: str | None = None
    save_final: bool = True


class MetricsSettings(BaseModel):
    """Where training metrics go (see `qpa.train.metrics`).

    Parameters:
        logging_steps (`int`, defaults to `10`):
            Log (JSONL line + Prometheus update) every N optimizer steps.
        jsonl (`str`, *optional*):
            JSON Lines log of the metrics. Unset: `<output_dir>/metrics.jsonl`.
        prometheus_port (`int`, *optional*):
            Serve `/metrics` on this port (on the main process) while training.
        textfile (`str`, *optional*):
            Also write the metrics in the Prometheus text format to this file at each log
            (for node-exporter's textfile collector, or to read after the run).
    """

    model_config = ConfigDict(extra="forbid")

    logging_steps: int = Field(default=10, ge=1)
    jsonl: str | None = None
    prometheus_port: int | None = Field(default=None, ge=1, le=65535)
    textfile: str | None = None


class SFTConfig(BaseModel):
    """A supervised fine-tuning run (`qpa train sft --config sft.yaml`).

    Parameters:
        name (`str`, defaults to `"sft"`):
            Run name: metric label, default store prefix `trainingruns/<name>`.
        model (`str`):
            Base checkpoint: a Hugging Face folder or a store URI (`file://`, `s3://`) of one.
        tokenizer (`str`, *optional*):
            Tokenizer folder or URI. Unset: the one saved with the model.
        dataset (`str`):
            Training data: a `save_to_disk` folder, a store URI of one, or a `.jsonl`/`.json`/
            `.parquet` file, with a `messages` column (`role`, `content`, `train`) and
            optionally `weight`, `success`, `source`, `capabilities`, `domain`, `difficulty`.
        dataset_split (`str`, defaults to `"train"`):
            Split to read when the dataset is a `DatasetDict`.
        output_dir (`str`, *optional*):
            Local working folder (checkpoints, final model, metrics). Unset: `runs/<name>`.
        max_length (`int`, defaults to `4096`):
            Maximum tokens per example; longer ones keep their start (`truncation_mode=
            "keep_start"`), and examples left without trainable tokens are dropped.
        weighting (`"auto"`, `"repeat"` or `"none"`, defaults to `"auto"`):
            How the `weight` column is honoured. `repeat`: weights are normalised to mean 1
            and each example appears `floor(w)` times plus once more with probability
            `w - floor(w)` (seeded), before the usual shuffling: deterministic, so a resumed
            run sees the same data order. `none`: ignore weights. `auto`: `none` for a mixture
            written by `qpa data mix` (it already draws each item as many times as its weight
            asks, and keeps `weight` as a record), `repeat` otherwise.
        per_device_train_batch_size (`int`, defaults to `4`):
            Examples per device per forward pass.
        gradient_accumulation_steps (`int`, defaults to `1`):
            Forward passes per optimizer step.
        learning_rate (`float`, defaults to `1e-5`):
            Peak learning rate of AdamW.
        lr_scheduler_type (`str`, defaults to `"cosine"`):
            transformers scheduler name (`linear`, `cosine`, `constant_with_warmup`, ...).
        warmup_steps (`float`, defaults to `0.0`):
            Warm-up steps; a value below 1 is a fraction of the total steps.
        weight_decay (`float`, defaults to `0.0`):
            AdamW weight decay.
        max_grad_norm (`float`, defaults to `1.0`):
            Gradient clipping norm.
        num_train_epochs (`float`, defaults to `1.0`):
            Passes over the (weighted) dataset; ignored when `max_steps` > 0.
        max_steps (`int`, defaults to `-1`):
            Total optimizer steps (overrides `num_train_epochs` when > 0).
        seed (`int`, defaults to `42`):
            Seed of initialisation, data order and weighting.
        model_dtype (`"float32"`, `"bfloat16"` or `"auto"`, defaults to `"float32"`):
            dtype the base weights are loaded in (mixed precision keeps fp32 master weights).
        bf16 (`"auto"` or `bool`, defaults to `"auto"`):
            bf16 mixed precision; `"auto"`: on where CUDA supports bf16, off on CPU.
        gradient_checkpointing (`"auto"` or `bool`, defaults to `"auto"`):
            Recompute activations in the backward pass; `"auto"`: on for models with a hidden
            size of 1024 or more, off for tiny ones (where it only costs time).
        dataloader_num_workers (`int`, defaults to `0`):
            Data loading worker processes.
        deepspeed (`DeepSpeedSettings`):
            ZeRO stage, offload, precision of the DeepSpeed engine.
        checkpoint (`CheckpointSettings`):
            Checkpoint cadence, store and resume policy.
        metrics (`MetricsSettings`):
            Metrics log and Prometheus export.
        sft (`SFTSettings`):
            The CRD's `spec.sft` (`qpa.api.v1alpha1.SFTSettings`): `turn_masking` (default on)
            leaves the assistant turns flagged `"train": false` out of the loss; off, every
            assistant turn is trained.
        trl (`dict`, defaults to `{}`):
            Any other `trl.SFTConfig` / `TrainingArguments` field, passed through as is (and
            applied last).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="sft", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    model: str = Field(min_length=1)
    tokenizer: str | None = None
    dataset: str = Field(min_length=1)
    dataset_split: str = "train"
    output_dir: str | None = None
    max_length: int = Field(default=4096, ge=8)
    weighting: Literal["auto", "repeat", "none"] = "auto"
    per_device_train_batch_size: int = Field(default=4, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    learning_rate: float = Field(default=1e-5, gt=0)
    lr_scheduler_type: str = "cosine"
    warmup_steps: float = Field(default=0.0, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    num_train_epochs: float = Field(default=1.0, gt=0)
    max_steps: int = -1
    seed: int = 42
    model_dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    bf16: Auto | bool = "auto"
    gradient_checkpointing: Auto | bool = "auto"
    dataloader_num_workers: int = Field(default=0, ge=0)
    deepspeed: DeepSpeedSettings = Field(default_factory=DeepSpeedSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    trl: dict[str, Any] = Field(default_factory=dict)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> SFTConfig:
        """Read a YAML file; `overrides` maps dotted paths (`deepspeed.zero_stage`) to values.

        Relative local paths in the file are relative to the working directory (as for any
        command-line tool); a TrainingRun passes absolute paths or store URIs.
        """
        return cls.from_dict(read_settings_file(path, overrides), origin=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "<config>") -> SFTConfig:
        return validate_settings(cls, data, origin)

    @classmethod
    def from_trainingrun(
        cls, order: WorkOrder[TrainingRun], *, work_dir: Path | None = None
    ) -> SFTConfig:
        """The run a TrainingRun work order (stage sft) asks for: every spec field mapped here.

        The data is the dataset the operator's data plan resolved (`resolved.datasetUri`);
        `work_dir` (default: the working directory) holds the local run folder.
        """
        spec = order.resource.spec
        if spec.stage != "sft":
            raise ConfigError(f"spec.stage: {spec.stage!r} is not sft (use qpa train {spec.stage})")
        dataset = order.resolved.dataset_uri
        if not dataset:
            raise ConfigError("resolved.datasetUri: the work order names no prepared dataset")
        hp = spec.hyperparameters
        return cls(
            **from_order(order, work_dir=work_dir),
            dataset=dataset,
            max_length=hp.max_seq_length,
            per_device_train_batch_size=hp.per_device_batch_size,
            gradient_accumulation_steps=hp.gradient_accumulation_steps,
            learning_rate=hp.learning_rate,
            num_train_epochs=hp.epochs,
            max_steps=hp.max_steps if hp.max_steps is not None else -1,
            max_grad_norm=spec.deepspeed.gradient_clipping,
            sft=spec.sft or SFTSettings(),
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

    def resolve_bf16(self, *, cuda_bf16: bool) -> bool:
        return cuda_bf16 if self.bf16 == "auto" else bool(self.bf16)

    def resolve_gradient_checkpointing(self, hidden_size: int | None) -> bool:
        if self.gradient_checkpointing == "auto":
            return hidden_size is not None and hidden_size >= 1024
        return bool(self.gradient_checkpointing)

    # ------------------------------------------------------------------ TRL mapping
    def trl_kwargs(
        self,
        *,
        bf16: bool,
        gradient_checkpointing: bool,
        deepspeed: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The keyword arguments of `trl.SFTConfig` for this run (the `trl:` mapping last).

        Labels are built by qpa (turn-level masking), so TRL gets a pre-tokenized dataset:
        no packing, no `assistant_only_loss`, truncation already done (`max_length` is passed
        on and is a no-op then).
        """
        kwargs: dict[str, Any] = {
            "output_dir": str(self.run_dir),
            "run_name": self.name,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "learning_rate": self.learning_rate,
            "lr_scheduler_type": self.lr_scheduler_type,
            "warmup_steps": self.warmup_steps,
            "weight_decay": self.weight_decay,
            "max_grad_norm": self.max_grad_norm,
            "num_train_epochs": self.num_train_epochs,
            "max_steps": self.max_steps,
            "seed": self.seed,
            "data_seed": self.seed,
            "bf16": bf16,
            "fp16": False,
            "activation_checkpointing": gradient_checkpointing,
            "logging_steps": self.metrics.logging_steps,
            "logging_first_step": True,
            "save_strategy": "steps",
            "save_steps": self.checkpoint.every_steps,
            "save_total_limit": self.checkpoint.keep_last,
            "report_to": "none",
            "disable_tqdm": True,
            "max_length": self.max_length,
            "truncation_mode": "keep_start",
            "packing": False,
            "assistant_only_loss": False,
            "dataset_num_proc": None,
            "dataloader_num_workers": self.dataloader_num_workers,
            "deepspeed": deepspeed,
        }
        kwargs.update(self.trl)
        return kwargs

    def to_trl(
        self,
        *,
        bf16: bool = False,
        gradient_checkpointing: bool = False,
        deepspeed: dict[str, Any] | None = None,
    ) -> Any:
        """A `trl.SFTConfig` for this run (imports TRL); unknown `trl:` keys are an error."""
        import trl

        known = {f.name for f in dataclasses.fields(trl.SFTConfig)}
        unknown = sorted(set(self.trl) - known)
        if unknown:
            raise ConfigError(f"trl: unknown trl.SFTConfig fields: {', '.join(unknown)}")
        kwargs = self.trl_kwargs(
            bf16=bf16, gradient_checkpointing=gradient_checkpointing, deepspeed=deepspeed
        )
        return trl.SFTConfig(**kwargs)


def store_root_and_prefix(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b/` -> (`s3://bucket`, `a/b`): a checkpoint store root and run prefix."""
    parts = urlsplit(uri)
    path = parts.path.strip("/")
    if parts.scheme == "s3":
        return f"s3://{parts.netloc}", path
    head, _, tail = path.rpartition("/")
    return f"{parts.scheme}:///{head}" if head else f"{parts.scheme}:///", tail


def from_order(order: WorkOrder[TrainingRun], *, work_dir: Path | None = None) -> dict[str, Any]:
    """The settings SFT and RL share, from a TrainingRun work order: run name, base model,
    seed, precision, DeepSpeed (always on: the ranks are DeepSpeed ranks) and checkpoints in the
    object store below `outputUri` (`resume: auto` so a restarted attempt continues from the
    newest complete checkpoint; `resumeFrom` applies to the first attempt only)."""
    spec = order.resource.spec
    ds = spec.deepspeed
    folder = (work_dir or Path.cwd()).resolve()
    nvme: dict[str, Any] = {}
    for key, where in (
        ("offload_optimizer", ds.offload_optimizer),
        ("offload_param", ds.offload_parameters),
    ):
        if where == "nvme":
            nvme[key] = {"device": "nvme", "nvme_path": str(folder / "nvme")}
    root, prefix = store_root_and_prefix(spec.output_uri)
    first_attempt = order.resolved.attempt == 0
    return {
        "name": order.name[:63],
        "model": spec.base_model_uri,
        "output_dir": str(folder / "run"),
        "seed": spec.hyperparameters.seed,
        "bf16": "auto" if ds.bf16 else False,
        "deepspeed": DeepSpeedSettings(
            enabled=True,
            zero_stage=ds.zero_stage,
            offload_optimizer=ds.offload_optimizer != "none",
            offload_param=ds.offload_parameters != "none",
            bf16="auto" if ds.bf16 else False,
            extra={"zero_optimization": nvme} if nvme else {},
        ),
        "checkpoint": CheckpointSettings(
            every_steps=spec.checkpoint_every,
            keep_last=spec.keep_checkpoints,
            store=root,
            prefix=prefix or None,
            resume="auto" if spec.resume else "never",
            resume_from=spec.resume_from if first_attempt else None,
        ),
    }


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `data["a"]["b"] = value` for `dotted == "a.b"`, creating mappings on the way."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted}: {part} is not a mapping")
        node = child
    node[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["a.b=3", "c=x"]` → `{"a.b": 3, "c": "x"}` (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out
