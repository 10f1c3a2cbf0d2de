"""Supervised fine-tuning with turn-level error masking: `train_sft(config)`.

The data are conversations in the Harness's text protocol (`messages`: `role`, `content`,
`train`). Loss is taken only on assistant turns, and not on those flagged `"train": false` (the
erroneous turns of a trajectory that recovered): the model learns decomposition, tool calls and
recovery, never the mistakes. Masked turns stay in the input, as the context later turns see.

How the labels are built (`encode_conversation`): the conversation is rendered with the
tokenizer's own chat template (any template that writes a message's content verbatim: ChatML,
Qwen's, the tiny checkpoints'), the character span of every trained assistant turn is located
(its content plus the end-of-turn token that follows, so the model learns to stop), and the text
is tokenized once with offsets; a token is trained when it starts inside a trained span, and
every other label is -100. TRL's `SFTTrainer` gets this pre-tokenized `input_ids`/`labels`
dataset and uses the labels as they are (TRL 1.16: "a dataset that already provides a labels
column is left as is"); its loss sums the log-probabilities of labelled positions only, so a
masked token contributes exactly zero gradient (tests prove it on the trainer's own loss).

Before any compute (`plan_sft`) the inputs are checked and clear errors raised: a missing base
checkpoint, tokenizer or resume checkpoint (named), a tokenizer whose ids do not fit the model's
embedding, a dataset without a `messages` column or without a single trainable token (named),
and a dataset whose human review is pending or unpublished (`qpa.data.review.require_published`:
refused, naming it and its state, unless its manifest records `gate: automatic`).

Checkpoints are written every `checkpoint.every_steps` steps, then hashed and uploaded to the
store in a background thread while training goes on (`qpa.train.checkpoint`); `resume:
latest|auto` (or `--resume`) continues from the newest complete one with optimizer, scheduler,
RNG states and step restored (a killed run resumed this way ends with bit-identical weights).
The `weight` column is honoured by seeded repetition (`SFTConfig.weighting`), except for
mixtures from `qpa data mix`, which already hold each item as many times as its weight asks.
Metrics go to a JSONL log and Prometheus (`qpa.train.metrics`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from qpa import progress
from qpa.store import ResolveError, resolve_local
from qpa.train.checkpoint import (
    CheckpointError,
    CheckpointRef,
    CheckpointStore,
    CheckpointUploader,
    download_checkpoint,
    latest_local,
    sweep_snapshots,
    verify_local,
)
from qpa.train.config import SFTConfig
from qpa.train.deepspeed import deepspeed_config, ensure_single_process_env, skip_cpu_shm_op
from qpa.train.metrics import TrainMetrics
from qpa.train.placement import choose_dtype, is_hub_id, resolve_model_source

IGNORE_INDEX = -100
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "<end_of_turn>")
"""End-of-turn markers trained with the assistant turn they close (plus the tokenizer's eos)."""
MODEL_FILES = ("config.json",)


class SFTInputError(ValueError):
    """Bad input found before any compute; the message names the input."""


# --------------------------------------------------------------------------- labels


@dataclass
class Encoded:
    """One tokenized conversation with its labels (-100 where no loss is taken)."""

    input_ids: list[int]
    labels: list[int]
    trained_turns: int = 0
    masked_turns: int = 0
    truncated: bool = False

    @property
    def trainable_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def _trained(message: Mapping[str, Any], turn_masking: bool = True) -> bool:
    flag = message.get("train")
    masked = turn_masking and flag is not None and not bool(flag)
    return message.get("role") == "assistant" and not masked


def chat_template_of(tokenizer: Any) -> str:
    """The tokenizer's chat template, or ChatML (`LocalBackend`'s fallback) when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        return template
    from qpa.harness.backends.local import CHATML_TEMPLATE

    return CHATML_TEMPLATE


def end_tokens_of(tokenizer: Any) -> tuple[str, ...]:
    eos = getattr(tokenizer, "eos_token", None)
    return tuple(dict.fromkeys([*([eos] if isinstance(eos, str) and eos else []), *END_OF_TURN]))


def render_with_spans(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_template: str | None = None,
    turn_masking: bool = True,
) -> tuple[str, list[tuple[int, int]], int, int]:
    """(text, trained character spans, trained turns, masked assistant turns); without
    `turn_masking` every assistant turn is trained, flagged or not."""
    conversation = [
        {"role": str(m.get("role", "")), "content": str(m.get("content") or "")} for m in messages
    ]
    text = str(
        tokenizer.apply_chat_template(
            conversation, tokenize=False, chat_template=chat_template or chat_template_of(tokenizer)
        )
    )
    ends = end_tokens_of(tokenizer)
    spans: list[tuple[int, int]] = []
    trained = masked = 0
    cursor = 0
    for index, (message, plain) in enumerate(zip(messages, conversation, strict=True)):
        content = plain["content"]
        if content:
            at = text.find(content, cursor)
            if at < 0:
                raise SFTInputError(
                    f"message {index} ({plain['role']}) does not appear verbatim in the text the "
                    "chat template renders; use a template that writes message content as is"
                )
            end = at + len(content)
        else:
            at = end = cursor
        if plain["role"] == "assistant":
            if _trained(message, turn_masking):
                stop = next((e for e in ends if text.startswith(e, end)), "")
                if content or stop:
                    spans.append((at, end + len(stop)))
                    trained += 1
            else:
                masked += 1
        cursor = end
    return text, spans, trained, masked


def encode_conversation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    max_length: int | None = None,
    chat_template: str | None = None,
    turn_masking: bool = True,
) -> Encoded:
    """Tokenize a conversation; labels are the ids of trained assistant turns, else -100."""
    text, spans, trained, masked = render_with_spans(
        tokenizer, messages, chat_template=chat_template, turn_masking=turn_masking
    )
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(encoding["input_ids"])
    labels = _labels(ids, encoding["offset_mapping"], spans)
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        ids, labels = ids[:max_length], labels[:max_length]
    return Encoded(ids, labels, trained, masked, truncated)


def _labels(
    ids: Sequence[int], offsets: Sequence[Sequence[int]], spans: Sequence[tuple[int, int]]
) -> list[int]:
    labels = [IGNORE_INDEX] * len(ids)
    if not spans:
        return labels
    span = 0
    for i, (start, stop) in enumerate(offsets):
        if stop <= start:
            continue
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        if span == len(spans):
            break
        if spans[span][0] <= start < spans[span][1]:
            labels[i] = ids[i]
    return labels


# --------------------------------------------------------------------------- data


class DataStats(BaseModel):
    """What the training data hold, after tokenization, truncation and weighting."""

    dataset: str
    rows: int = 0
    rows_dropped: int = Field(default=0, description="rows left without trainable tokens")
    rows_truncated: int = 0
    examples: int = Field(default=0, description="training examples after weighting")
    weighting: str = Field(default="none", description="how the weight column was applied")
    tokens: int = 0
    trainable_tokens: int = 0
    trained_turns: int = 0
    masked_turns: int = Field(default=0, description="assistant turns flagged erroneous")
    success_rate: float | None = None
    sources: dict[str, int] = Field(default_factory=dict)
    capabilities: dict[str, int] = Field(default_factory=dict)


@dataclass
class LoadedRows:
    """A dataset as read, with the store manifest that came with it (if any)."""

    rows: Any
    manifest: dict[str, Any] | None = None


_SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")


def _is_saved_dataset(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _SAVED)


def _verify_manifest(root: Path, manifest: dict[str, Any], source: str) -> None:
    """Check the files a store manifest lists against their recorded SHA-256."""
    from qpa.store import sha256_file

    for entry in manifest.get("files") or []:
        path = root.joinpath(*str(entry.get("key", "")).split("/"))
        if not path.is_file():
            raise SFTInputError(f"dataset {source}: {entry.get('key')} listed but missing")
        sha, _ = sha256_file(path)
        if sha != entry.get("sha256"):
            raise SFTInputError(f"dataset {source}: {entry.get('key')} does not match its SHA-256")


def _require_reviewed(source: str) -> None:
    """The review gate (`qpa.data.review.require_published`), before anything is downloaded."""
    from qpa.data.review import GateClosed, require_published

    try:
        require_published(source)
    except GateClosed as exc:
        raise SFTInputError(str(exc)) from None


def load_rows(source: str, *, split: str = "train", cache_dir: Path) -> LoadedRows:
    """The dataset at `source`: a `save_to_disk` folder (a `DatasetDict`: its `split`), a store
    prefix holding one (as `qpa data mix` writes: `manifest.json` + `dataset/`, verified against
    the manifest), a folder of `.jsonl`/`.parquet` files, or one such file (local or URI)."""
    import json

    import datasets

    _require_reviewed(source)
    try:
        path = resolve_local(source, field="dataset", cache_dir=cache_dir)
    except ResolveError as exc:
        raise SFTInputError(str(exc)) from None
    manifest: dict[str, Any] | None = None
    try:
        if path.is_file():
            kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
            if kind is None:
                raise SFTInputError(f"dataset {source}: unsupported file type {path.suffix!r}")
            loaded = datasets.load_dataset(kind, data_files=str(path), split="train")
            return LoadedRows(loaded)
        for root in (path, path.parent):
            if (root / "manifest.json").is_file() and (root == path or path.name == "dataset"):
                manifest = json.loads((root / "manifest.json").read_text())
                _verify_manifest(root, manifest, source)
                break
        if _is_saved_dataset(path):
            loaded = datasets.load_from_disk(str(path))
        elif _is_saved_dataset(path / "dataset"):
            loaded = datasets.load_from_disk(str(path / "dataset"))
        else:
            files = sorted(str(f) for f in path.rglob("*.jsonl")) or sorted(
                str(f) for f in path.rglob("*.parquet")
            )
            if not files:
                raise SFTInputError(
                    f"dataset {source}: no saved dataset, .jsonl or .parquet files in it"
                )
            kind = "json" if files[0].endswith(".jsonl") else "parquet"
            loaded = datasets.load_dataset(kind, data_files=files, split="train")
    except SFTInputError:
        raise
    except Exception as exc:
        raise SFTInputError(
            f"dataset {source}: cannot load it: {type(exc).__name__}: {exc}"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise SFTInputError(
                f"dataset {source}: no split {split!r} (splits: {', '.join(loaded)})"
            )
        loaded = loaded[split]
    return LoadedRows(loaded, manifest)


def weights_realized(loaded: LoadedRows) -> bool:
    """Whether the rows already carry their sampling weights as copies (`qpa data mix` draws
    each item `copies` times and keeps `weight` as a record): then weights are not applied again."""
    lineage = (loaded.manifest or {}).get("lineage") or {}
    if lineage.get("generator") == "qpa.data.mix":
        return True
    return "trajectory_id" in (loaded.rows.column_names or [])


def repeat_indices(weights: Sequence[float], seed: int) -> list[int]:
    """Row indices with each row repeated in proportion to its weight (mean weight → 1).

    Row i appears `floor(w_i)` times plus once more with probability `w_i - floor(w_i)`,
    drawn from a generator seeded with `seed` (the same data every time).
    """
    if any(w < 0 or not math.isfinite(w) for w in weights):
        raise SFTInputError("weights must be finite and non-negative")
    total = sum(weights)
    if total <= 0:
        return []
    scale = len(weights) / total
    rng = random.Random(seed)
    out: list[int] = []
    for index, weight in enumerate(weights):
        scaled = weight * scale
        count = int(scaled) + (1 if rng.random() < scaled - int(scaled) else 0)
        out.extend([index] * count)
    return out


def prepare_dataset(
    rows: Any,
    tokenizer: Any,
    *,
    name: str,
    max_length: int,
    weighting: str = "repeat",
    seed: int = 0,
    turn_masking: bool = True,
) -> tuple[Any, DataStats]:
    """Tokenize with turn-level labels, drop rows without trainable tokens, apply weights
    (`weighting`: `repeat` or `none`).

    Returns a `datasets.Dataset` with `input_ids` and `labels` only, and its `DataStats`;
    raises `SFTInputError` naming the dataset when nothing is left to train on.
    """
    import datasets

    columns = list(rows.column_names)
    if "messages" not in columns:
        raise SFTInputError(
            f"dataset {name} has no 'messages' column (columns: {', '.join(columns) or 'none'})"
        )
    stats = DataStats(dataset=name, rows=len(rows), weighting=weighting)
    if len(rows) == 0:
        raise SFTInputError(f"dataset {name} is empty: no trainable tokens")
    template = chat_template_of(tokenizer)
    input_ids: list[list[int]] = []
    labels: list[list[int]] = []
    kept_rows: list[int] = []
    for index, row in enumerate(rows):
        messages = row["messages"]
        if not isinstance(messages, list):
            raise SFTInputError(f"dataset {name}, row {index}: 'messages' is not a list")
        try:
            encoded = encode_conversation(
                tokenizer,
                messages,
                max_length=max_length,
                chat_template=template,
                turn_masking=turn_masking,
            )
        except SFTInputError as exc:
            raise SFTInputError(f"dataset {name}, row {index}: {exc}") from None
        stats.trained_turns += encoded.trained_turns
        stats.masked_turns += encoded.masked_turns
        stats.rows_truncated += int(encoded.truncated)
        if encoded.trainable_tokens == 0:
            stats.rows_dropped += 1
            continue
        input_ids.append(encoded.input_ids)
        labels.append(encoded.labels)
        kept_rows.append(index)
    if not kept_rows:
        raise SFTInputError(
            f"dataset {name} has no trainable tokens: none of its {stats.rows} rows has an "
            "assistant turn flagged for training (within max_length "
            f"{max_length} tokens)"
        )
    weights = [1.0] * len(kept_rows)
    if weighting == "repeat" and "weight" in columns:
        raw = rows["weight"]
        weights = [float(raw[i]) if raw[i] is not None else 1.0 for i in kept_rows]
    order = repeat_indices(weights, seed) if weighting == "repeat" else list(range(len(kept_rows)))
    if not order:
        raise SFTInputError(f"dataset {name}: every row has weight 0: no trainable tokens")
    stats.examples = len(order)
    stats.tokens = sum(len(input_ids[i]) for i in order)
    stats.trainable_tokens = sum(
        sum(1 for label in labels[i] if label != IGNORE_INDEX) for i in order
    )
    source_rows = [kept_rows[i] for i in order]
    if "success" in columns:
        success = rows["success"]
        flags = [bool(success[i]) for i in source_rows if success[i] is not None]
        stats.success_rate = sum(flags) / len(flags) if flags else None
    if "source" in columns:
        sources = rows["source"]
        stats.sources = dict(Counter(str(sources[i]) for i in source_rows))
    if "capabilities" in columns:
        caps = rows["capabilities"]
        stats.capabilities = dict(Counter(c for i in source_rows for c in (caps[i] or [])))
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [input_ids[i] for i in order], "labels": [labels[i] for i in order]}
    )
    return dataset, stats


# --------------------------------------------------------------------------- model checks


def _has_weights(folder: Path) -> bool:
    names = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
    return any((folder / n).is_file() for n in names) or any(folder.glob("*.safetensors"))


def check_tokenizer_fits(tokenizer: Any, model_config: Any, *, tokenizer_source: str) -> None:
    """Raise `SFTInputError` when token ids the tokenizer can produce fall outside the model's
    embedding (a tokenizer of another model), naming both sizes."""
    text_config = (
        model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    )
    rows = getattr(text_config, "vocab_size", None)
    if not isinstance(rows, int):
        return
    size = len(tokenizer)
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens}
    added = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}
    outside = sorted(
        {t: i for t, i in {**special, **added}.items() if isinstance(i, int) and i >= rows}.items(),
        key=lambda kv: kv[1],
    )
    if size > rows or outside:
        detail = (
            f"; special tokens outside it: {', '.join(f'{t}={i}' for t, i in outside[:8])}"
            if outside
            else ""
        )
        raise SFTInputError(
            f"tokenizer {tokenizer_source} does not match the model: it has {size} tokens but "
            f"the model's embedding has {rows} rows{detail}"
        )
    if (
        getattr(tokenizer, "pad_token", None) is None
        and getattr(tokenizer, "eos_token", None) is None
    ):
        raise SFTInputError(f"tokenizer {tokenizer_source} has neither a pad nor an eos token")


# --------------------------------------------------------------------------- the plan


@dataclass
class SFTPlan:
    """Everything checked and prepared before compute starts."""

    config: SFTConfig
    output_dir: Path
    model_dir: Path
    tokenizer: Any
    model_config: Any
    dataset: Any
    stats: DataStats
    args: Any
    checkpoints: CheckpointStore | None = None
    resume: CheckpointRef | None = None
    deepspeed: dict[str, Any] | None = None


def _topology() -> tuple[int, int, int, int]:
    """(world rank, world size, node rank, nodes) from the launcher's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("NPROC_PER_NODE", world)))
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    nodes = max(1, world // max(1, local_world))
    return rank, world, node, nodes


def _cuda() -> tuple[bool, bool]:
    import torch

    cuda = torch.cuda.is_available()
    return cuda, bool(cuda and torch.cuda.is_bf16_supported())


def _cpu_deepspeed_state(config: SFTConfig) -> SFTConfig:
    """DeepSpeed on CPU: the distributed state made here, before the trainer's, and kept.

    Accelerate names no process-group backend for DeepSpeed, and without CUDA no backend means
    "not distributed" to it: it counts one process whatever the world size, so the `auto` train
    batch size disagrees with DeepSpeed's world size and every rank fails. A `PartialState` for
    DeepSpeed over gloo counts them all; `use_configured_state` makes the trainer keep it.
    """
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier run's, as the trainer
    before = os.environ.get("ACCELERATE_USE_DEEPSPEED")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # as TrainingArguments sets it, for a moment
    try:
        PartialState(backend="gloo")
    finally:
        if before is None:
            del os.environ["ACCELERATE_USE_DEEPSPEED"]
        else:
            os.environ["ACCELERATE_USE_DEEPSPEED"] = before
    accelerator = {"use_configured_state": True, **config.trl.get("accelerator_config", {})}
    return config.model_copy(update={"trl": {**config.trl, "accelerator_config": accelerator}})


T = TypeVar("T")


def _local_main_first(fn: Callable[[], T]) -> T:
    """Run `fn` on each node's main process first (downloads), then on the other ranks.

    An error is raised only after the barrier, so the other ranks are never left waiting.
    """
    from accelerate import PartialState

    error: Exception | None = None
    result: T | None = None
    with PartialState().local_main_process_first():
        try:
            result = fn()
        except Exception as exc:
            error = exc
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


def _fetch_inputs(config: SFTConfig, cache: Path) -> tuple[Path, Path, LoadedRows]:
    """The base checkpoint, tokenizer and dataset as local paths (downloaded when URIs)."""
    try:
        model_dir = resolve_model_source(config.model, field="base checkpoint", cache_dir=cache)
    except ResolveError as exc:
        raise SFTInputError(str(exc)) from None
    if not (model_dir / "config.json").is_file():
        raise SFTInputError(f"base checkpoint {config.model} has no config.json")
    if not _has_weights(model_dir):
        raise SFTInputError(f"base checkpoint {config.model} holds no weights")
    tokenizer_dir = model_dir
    if config.tokenizer:
        try:
            tokenizer_dir = resolve_model_source(
                config.tokenizer, field="tokenizer", cache_dir=cache
            )
        except ResolveError as exc:
            raise SFTInputError(str(exc)) from None
    loaded = load_rows(config.dataset, split=config.dataset_split, cache_dir=cache)
    return model_dir, tokenizer_dir, loaded


def plan_sft(config: SFTConfig) -> SFTPlan:
    """Check every input and prepare the data; loads no weights and trains nothing."""
    output_dir = config.run_dir.resolve()
    cache = output_dir / ".inputs"
    # 1. what must exist locally, before anything else
    for what, location in (("base checkpoint", config.model), ("tokenizer", config.tokenizer)):
        if (
            location
            and "://" not in location
            and not Path(location).exists()
            and not is_hub_id(location)  # resolved below (qpa.train.placement)
        ):
            raise SFTInputError(f"{what} {location} does not exist")
    _require_reviewed(config.dataset)  # refuse unreviewed flywheel data before any side effect
    resume_from = config.checkpoint.resume_from
    if resume_from and "://" not in resume_from and not Path(resume_from).is_dir():
        raise SFTInputError(f"resume checkpoint {resume_from} does not exist")
    if (
        config.checkpoint.store is None
        and config.checkpoint.resume == "latest"
        and not (latest_local(output_dir))
    ):
        raise SFTInputError(
            f"resume: no complete checkpoint in {output_dir} (and no checkpoint store configured)"
        )

    # 2. the training arguments (creating them sets up the distributed state)
    import transformers

    cuda, cuda_bf16 = _cuda()
    ds_config = None
    if config.deepspeed.enabled:
        ensure_single_process_env()
        ds_config = deepspeed_config(config.deepspeed, cuda=cuda)
        if not cuda:
            skip_cpu_shm_op()
            config = _cpu_deepspeed_state(config)
    args = config.to_trl(bf16=config.resolve_bf16(cuda_bf16=cuda_bf16), deepspeed=ds_config)

    # 3. inputs that may live in a store: one download per node
    model_dir, tokenizer_dir, loaded = _local_main_first(lambda: _fetch_inputs(config, cache))

    tokenizer_source = config.tokenizer or config.model
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except Exception as exc:
        raise SFTInputError(
            f"tokenizer {tokenizer_source}: cannot load it: {type(exc).__name__}: {exc}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise SFTInputError(f"tokenizer {tokenizer_source} is not a fast tokenizer (no offsets)")
    try:
        model_config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:
        raise SFTInputError(
            f"base checkpoint {config.model}: unreadable config: {type(exc).__name__}: {exc}"
        ) from None
    check_tokenizer_fits(tokenizer, model_config, tokenizer_source=tokenizer_source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    # 4. the data: labels with turn-level masking; nothing trainable is an error
    weighting = config.weighting
    if weighting == "auto":
        weighting = "none" if weights_realized(loaded) else "repeat"
    dataset, stats = prepare_dataset(
        loaded.rows,
        tokenizer,
        name=config.dataset,
        max_length=config.max_length,
        weighting=weighting,
        seed=config.seed,
        turn_masking=config.sft.turn_masking,
    )
    stats.weighting = weighting

    # 5. where to resume from
    checkpoints = (
        CheckpointStore.open(config.checkpoint.store, config.store_prefix)
        if config.checkpoint.store
        else None
    )
    hidden = getattr(model_config.get_text_config(), "hidden_size", None)
    checkpointing = config.resolve_gradient_checkpointing(hidden)
    args.activation_checkpointing = args.gradient_checkpointing = checkpointing
    resume = _local_main_first(lambda: find_resume(config, output_dir, checkpoints))
    return SFTPlan(
        config=config,
        output_dir=output_dir,
        model_dir=model_dir,
        tokenizer=tokenizer,
        model_config=model_config,
        dataset=dataset,
        stats=stats,
        args=args,
        checkpoints=checkpoints,
        resume=resume,
        deepspeed=ds_config,
    )


def find_resume(
    config: SFTConfig, output_dir: Path, checkpoints: CheckpointStore | None
) -> CheckpointRef | None:
    """The checkpoint to continue from (downloaded into `output_dir` when it is in the store)."""
    explicit = config.checkpoint.resume_from
    if explicit:
        if "://" not in explicit:
            folder = Path(explicit)
            if not (folder / "trainer_state.json").is_file():
                raise SFTInputError(f"resume checkpoint {explicit} has no trainer_state.json")
            problems = verify_local(folder) if (folder / "qpa_checkpoint.json").exists() else []
            if problems:
                raise SFTInputError(f"resume checkpoint {explicit} is corrupt: {problems[0]}")
            return CheckpointRef(_state_step(folder), str(folder), folder)
        from qpa.store import open_store

        try:
            store = open_store(explicit)
            dest = output_dir / f"resume-{hashlib.sha256(explicit.encode()).hexdigest()[:12]}"
            folder = download_checkpoint(store, "", dest)
        except (CheckpointError, ValueError) as exc:
            raise SFTInputError(f"resume checkpoint {explicit}: {exc}") from None
        return CheckpointRef(_state_step(folder), explicit, folder)
    if config.checkpoint.resume == "never":
        return None
    sweep_snapshots(output_dir)  # what a process killed mid-upload or mid-download left
    local = latest_local(output_dir)
    if checkpoints is not None:  # the newest complete one in the store that verifies, if newer
        remote = checkpoints.download_latest(
            lambda step: output_dir / f"checkpoint-{step}",
            newer_than=local.step if local is not None else None,
        )
        if remote is not None:
            return remote
    if local is not None:
        return local
    if config.checkpoint.resume == "latest":
        where = [str(output_dir)] + ([checkpoints.uri()] if checkpoints is not None else [])
        raise SFTInputError(f"resume: no complete checkpoint in {' or '.join(where)}")
    return None


def _state_step(folder: Path) -> int:
    import json

    try:
        return int(json.loads((folder / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError) as exc:
        raise SFTInputError(f"checkpoint {folder}: unreadable trainer_state.json ({exc})") from None


# --------------------------------------------------------------------------- training


class SFTResult(BaseModel):
    """What a finished run reports."""

    run: str
    global_step: int
    train_loss: float | None = None
    train_runtime_s: float = 0.0
    tokens: int = 0
    output_tokens: int = 0
    tokens_per_second: float = 0.0
    final_dir: str | None = None
    final_uri: str | None = None
    checkpoint_uris: list[str] = Field(default_factory=list)
    resumed_from: str | None = None
    resumed_step: int | None = None
    metrics_path: str | None = None
    stats: DataStats


class _CountingCollator:
    """TRL's language-modeling collator, counting tokens and trained tokens it hands out."""

    def __init__(self, inner: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.inner = inner
        self.tokens = 0
        self.output_tokens = 0

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        for example in examples:
            self.tokens += len(example["input_ids"])
            self.output_tokens += sum(1 for label in example["labels"] if label != IGNORE_INDEX)
        return self.inner(examples)


def _callback_class() -> type:
    from transformers import TrainerCallback

    class QpaCallback(TrainerCallback):
        """Metrics on every log; every save handed to the checkpoint uploader (background);
        the steps as `qpa.progress` (world rank 0 only)."""

        def __init__(
            self,
            plan: SFTPlan,
            metrics: TrainMetrics,
            collator: _CountingCollator,
            uploader: CheckpointUploader,
        ) -> None:
            self.plan = plan
            self.metrics = metrics
            self.collator = collator
            self.uploader = uploader
            self._seen = (0, 0)
            self._clock = time.perf_counter()
            self.totals = [0, 0]
            self._steps: contextlib.ExitStack | None = None
            self._bar: progress.Tracker | None = None

        def _deltas(self) -> tuple[int, int]:
            tokens, output = self.collator.tokens, self.collator.output_tokens
            delta = (tokens - self._seen[0], output - self._seen[1])
            self._seen = (tokens, output)
            return _all_reduce(delta)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._clock = time.perf_counter()
            if state.is_world_process_zero and self._steps is None:
                self._steps = contextlib.ExitStack()
                self._bar = self._steps.enter_context(
                    progress.track("sft", total=int(state.max_steps or 0) or None, unit="steps")
                )
                self._bar.update(int(state.global_step))
            stats = self.plan.stats
            self.metrics.log(
                state.global_step,
                success_rate=stats.success_rate,
                data_examples=stats.examples,
                data_trainable_tokens=stats.trainable_tokens,
                data_masked_turns=stats.masked_turns,
            )

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
        ) -> None:
            tokens, output = self._deltas()
            now = time.perf_counter()
            elapsed, self._clock = now - self._clock, now
            self.totals[0] += tokens
            self.totals[1] += output
            values = dict(logs or {})
            values.pop("num_tokens", None)
            if tokens and elapsed > 0:
                values["tokens_per_second"] = tokens / elapsed
            self.metrics.log(
                state.global_step,
                tokens=tokens,
                output_tokens=output,
                epoch=state.epoch,
                **{k: v for k, v in values.items() if k != "epoch"},
            )

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.update(int(state.global_step))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.stop_progress()

        def stop_progress(self) -> None:
            if self._steps is not None:
                self._steps.close()
                self._steps, self._bar = None, None

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_local_process_zero and folder.is_dir():
                self.uploader.submit(folder, state.global_step)

    return QpaCallback


def _all_reduce(values: tuple[int, int]) -> tuple[int, int]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return values
    tensor = torch.tensor(values, dtype=torch.long)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return int(tensor[0]), int(tensor[1])


def load_model(plan: SFTPlan) -> Any:
    """The base model's weights (after the training arguments exist, so ZeRO-3 can shard)."""
    import torch
    from transformers import AutoModelForCausalLM

    # `auto`: bf16 on CUDA only where DeepSpeed bf16 keeps fp32 masters (qpa.train.placement)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    masters = plan.deepspeed is not None and bool(getattr(plan.args, "bf16", False))
    dtype = choose_dtype(plan.config.model_dtype, device, fp32_master=masters)
    return AutoModelForCausalLM.from_pretrained(plan.model_dir, local_files_only=True, dtype=dtype)


def build_trainer(plan: SFTPlan, *, callbacks: Sequence[Any] = ()) -> tuple[Any, Any, Any]:
    """(trainer, qpa callback, metrics) for a plan."""
    from trl import SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    config = plan.config
    rank, _, _, _ = _topology()
    metrics = TrainMetrics(
        config.name,
        "sft",
        jsonl=config.metrics_path,
        textfile=config.metrics.textfile,
        enabled=rank == 0,
    )
    collator = _CountingCollator(
        DataCollatorForLanguageModeling(pad_token_id=plan.tokenizer.pad_token_id)
    )
    _, _, node, nodes = _topology()
    uploader = CheckpointUploader(
        plan.checkpoints, node_rank=node, nodes=nodes, world_zero=rank == 0
    )
    qpa_callback = _callback_class()(plan, metrics, collator, uploader)
    trainer = SFTTrainer(
        model=load_model(plan),
        args=plan.args,
        train_dataset=plan.dataset,
        processing_class=plan.tokenizer,
        data_collator=collator,
        callbacks=[qpa_callback, *callbacks],
    )
    return trainer, qpa_callback, metrics


def train_sft(config: SFTConfig, *, callbacks: Sequence[Any] = ()) -> SFTResult:
    """Run SFT: check inputs (`plan_sft`), train with TRL, checkpoint, save the final model."""
    plan = plan_sft(config)
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    rank, _, _, _ = _topology()
    if rank == 0 and config.metrics.prometheus_port:
        TrainMetrics.serve(config.metrics.prometheus_port)
    trainer, qpa_callback, metrics = build_trainer(plan, callbacks=callbacks)
    resume = str(plan.resume.local) if plan.resume and plan.resume.local else None
    uploader: CheckpointUploader = qpa_callback.uploader
    _, _, _, nodes = _topology()
    if (  # resumed from a local checkpoint a kill kept out of the store: upload it too
        rank == 0
        and nodes == 1
        and plan.resume is not None
        and plan.resume.local is not None
        and plan.resume.location == str(plan.resume.local)
        and config.checkpoint.resume_from is None
        and plan.checkpoints is not None
        and plan.resume.step not in plan.checkpoints.steps()
    ):
        uploader.submit(plan.resume.local, plan.resume.step)
    try:
        output = trainer.train(resume_from_checkpoint=resume)
    except BaseException:
        qpa_callback.stop_progress()  # on_train_end never comes after a crash
        with contextlib.suppress(CheckpointError):  # the training error is the one to report
            uploader.wait()  # a crashed run still lands the checkpoints it saved
        uploader.close()
        raise
    checkpoint_uris = uploader.wait()
    uploader.close()
    final_dir: Path | None = None
    final_uri: str | None = None
    if config.checkpoint.save_final:
        final_dir = plan.output_dir / "final"
        trainer.save_model(str(final_dir))
        if trainer.is_world_process_zero():
            plan.tokenizer.save_pretrained(final_dir)
            if plan.checkpoints is not None:
                final_uri = plan.checkpoints.upload_final(final_dir)
    runtime = float(output.metrics.get("train_runtime", 0.0))
    tokens, output_tokens = qpa_callback.totals
    return SFTResult(
        run=config.name,
        global_step=int(trainer.state.global_step),
        train_loss=output.training_loss,
        train_runtime_s=runtime,
        tokens=tokens,
        output_tokens=output_tokens,
        tokens_per_second=tokens / runtime if runtime > 0 else 0.0,
        final_dir=str(final_dir) if final_dir else None,
        final_uri=final_uri,
        checkpoint_uris=checkpoint_uris,
        resumed_from=plan.resume.location if plan.resume else None,
        resumed_step=plan.resume.step if plan.resume else None,
        metrics_path=str(metrics.jsonl) if metrics.jsonl else None,
        stats=plan.stats,
    )
