"""Online multi-turn agentic RL with CARE (`qpa train rl --config rl.yaml [--care on|off]`).

One step of the loop:

1. **Sample tasks.** `tasks_per_step` tasks from the pool (a suite split, a tasks JSONL, a
   dataset's task ids), seeded by `(seed, step)`, so a resumed run sees the same sequence.
   With several DeepSpeed ranks, each rank takes its share of the step's tasks (whole groups).
2. **Roll out.** `samples_per_task` (k) episodes per task, each `run_episode(env, task,
   HarnessPlanner(backend))` on a `SandboxEnv` or a `RemoteEnv` (`--env-url`, round-robin over
   servers). The backend is `LocalBackend` wrapped around the in-memory policy
   (`LocalBackend.from_loaded`): the Harness renders exactly the prompt a served model would
   see (Scenario Adapter, Skills, memory, text protocol, ChatML). Episodes run in threads; every
   model call of every live episode is collected and answered by **one batched `generate`** in
   the main thread (when all live episodes wait on the model), so the k x tasks episodes of a
   step need about as many `generate` calls as one episode has turns. For each assistant turn
   the prompt token ids (as tokenized for generation) and the sampled token ids are recorded.
   On a GPU, generation may go to a vLLM server instead (`generation.backend: vllm`, TRL's
   `VLLMClient`, weights pushed after every optimizer step): configuration only, never reached
   by CPU tests.
3. **Score.** Episodes are grouped by task; CARE (`qpa.train.care.care_group`) picks each
   group's tier and computes rewards and success-anchored advantages; with `--care off`, one
   fixed reward (outcome by default) and vanilla GRPO standardisation. Each trajectory's
   advantage applies to every token it generated.
4. **Update.** Turns become training sequences: a turn's prompt followed by its completion. When
   the next turn's prompt extends the previous sequence token for token (the usual ChatML case),
   the turns are packed into one sequence and what lies between two completions (the
   environment's feedback, the chat template's tokens) gets loss mask 0. Whatever the layout,
   only tokens the policy sampled carry loss: prompt, tool responses and feedback have mask 0,
   so they get no gradient. The loss is GRPO's clipped surrogate
   ``-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)`` with ``rho = exp(logp - logp_old)``,
   optionally ``+ beta * KL_k3(pi || pi_ref)`` against the frozen starting model, averaged over
   all trained tokens of the step (`token_mean`, DAPO-style) or per sequence then over
   sequences (`sequence_mean`). Old log-probabilities are the rollout policy's, recomputed
   under the training graph (with one PPO epoch the ratio is exactly 1 and the clip inactive,
   as in TRL). Micro-batches accumulate into one optimizer step; samples with zero advantage
   are skipped when `beta == 0` (they contribute exactly zero gradient) but still count in the
   normaliser. Optimizer: AdamW, or a DeepSpeed engine (ZeRO-2/3, gloo on CPU) with
   `managed_gradient_accumulation: false`, so a step may hold any number of micro-batches.
5. **Record.** Metrics (loss, reward, success rate, CARE tier mix, output tokens, tool calls,
   turns, timings) go to `qpa.train.metrics.TrainMetrics` (JSONL + Prometheus). Every
   `checkpoint.every_steps` steps `<output_dir>/checkpoint-<step>/` is written (`model/`: weights
   + tokenizer as a Hugging Face folder; optimizer or DeepSpeed state; `rl_state.json`; RNG),
   hashed and uploaded to the store (`qpa.train.checkpoint`); `--resume` continues from the
   newest complete one, local or in the store, up to the same final step count. At the end,
   `<output_dir>/final/` (and `<prefix>/final` in the store) holds the trained model.

Why a lean loop instead of TRL's `GRPOTrainer` hooks: the Harness, not the trainer, owns the
conversation. TRL's `rollout_func` must return one prompt and one completion per sample with an
`env_mask`, which forces every multi-turn episode into a single growing token sequence; the
Harness's prompts are not always prefix-extensions of each other (sub-agents get their own
conversation, text-protocol tool results are merged, generated tokens are re-tokenized in the
next prompt), so that layout would train on tokens the model never saw, or drop turns. CARE needs
whole trajectories per group (verifier progress, tokens, tool calls) and replaces the advantage
computed inside TRL's private `_generate_and_score_completions`, a method that changes between
releases. And a k x tasks group of multi-turn episodes needs dynamic batching across episodes
that TRL's rollout hook does not provide. What TRL does well is kept: its vLLM client drives GPU
generation and weight sync, and the loss is TRL's GRPO objective (the same clipped surrogate, k3
KL estimator and `dapo` token-level normalisation), so `--care off` is vanilla GRPO as TRL
computes it. The loop is one file with no hidden state machine; `benchmarks/rl_step.py` times a
step of it against plain `GRPOTrainer` on the same model and prompts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpa.contract import Environment, Policy, Split, Task, ToolSpec, Trajectory, read_tasks
from qpa.envs.factory import make_env
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import BackendUnavailable, ChatMessage, Completion
from qpa.harness.backends.local import LocalBackend
from qpa.harness.parsing import STOP_STRINGS
from qpa.harness.runner import EpisodeAborted, run_episode
from qpa.harness.skills import SkillLibrary
from qpa.train.care import CARE_TIERS, CareConfig, CareTier, GroupResult, care_group, vanilla_group
from qpa.train.config import (
    CheckpointSettings,
    ConfigError,
    DeepSpeedSettings,
    MetricsSettings,
    set_dotted,
)

Auto = Literal["auto"]
STATE_FILE = "rl_state.json"


# =========================================================================== settings


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


# =========================================================================== tasks


def load_tasks(source: TaskSource) -> list[Task]:
    """The task pool of `source` (filtered, in a stable order); raises if it is empty."""
    from qpa.envs.sandbox.suite import generate_suite

    suite_tasks: list[Task] | None = None

    def suite() -> list[Task]:
        nonlocal suite_tasks
        if suite_tasks is None:
            suite_tasks = list(generate_suite(source.suite, source.suite_seed))
        return suite_tasks

    wanted: set[str] = set(source.ids)
    if source.file:
        pool = _read_task_file(source.file)
    elif source.dataset:
        pool, named = _read_dataset_tasks(source.dataset)
        if named:
            wanted = wanted & named if wanted else named
            if not pool:
                pool = suite()
    else:
        pool = suite()
    tasks = [
        t
        for t in pool
        if (source.split is None or t.split == source.split)
        and (not wanted or t.id in wanted)
        and (not source.domains or t.domain in source.domains)
    ]
    if source.limit is not None:
        tasks = tasks[: source.limit]
    if not tasks:
        raise ConfigError("tasks: no task matches (check split, ids, domains, file, dataset)")
    return tasks


def _read_task_file(location: str) -> list[Task]:
    if "://" not in location:
        return list(read_tasks(location))
    import tempfile

    from qpa.store import open_object

    store, key = open_object(location)
    with tempfile.TemporaryDirectory() as tmp:
        local = store.get_file(key, Path(tmp) / "tasks.jsonl")
        return list(read_tasks(local))


def _read_dataset_tasks(location: str) -> tuple[list[Task], set[str]]:
    """(tasks held by the dataset, task ids its lineage names) of a dataset with a manifest."""
    import tempfile

    from qpa.store import open_store
    from qpa.store.manifest import read_manifest

    store = open_store(location if "://" in location else Path(location))
    manifest = read_manifest(store)
    tasks: list[Task] = []
    if manifest.kind == "tasks":
        with tempfile.TemporaryDirectory() as tmp:
            for index, item in enumerate(manifest.files):
                local = store.get_file(item.key, Path(tmp) / f"part-{index}.jsonl")
                tasks += list(read_tasks(local))
    return tasks, set(manifest.lineage.tasks)


def sample_tasks(pool: Sequence[Task], count: int, seed: int, step: int) -> list[Task]:
    """`count` tasks for `step`: a seeded shuffle of the pool per epoch, consumed in order.

    Step s takes positions [s*count, (s+1)*count) of the concatenated per-epoch shuffles, so
    every task is seen once per epoch and the sequence depends only on (pool, seed, step).
    """
    chosen: list[Task] = []
    n = len(pool)
    start = step * count
    for position in range(start, start + count):
        epoch, offset = divmod(position, n)
        order = list(range(n))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        chosen.append(pool[order[offset]])
    return chosen


# =========================================================================== rollouts


@dataclass
class Turn:
    """One model call: the prompt as tokenized for generation and the sampled tokens."""

    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass
class Episode:
    """One rollout: which task (index in the step's batch), which sample, what happened."""

    group: int
    sample: int
    trajectory: Trajectory
    turns: list[Turn] = field(default_factory=list)


class GenerationFailed(RuntimeError):
    """The policy could not generate (the batch failed); ends the episodes that asked."""


@dataclass
class _Request:
    prompt_ids: list[int]
    order: tuple[int, int]
    result: list[int] | None = None
    error: BaseException | None = None


class TokenBatcher:
    """Collects the model calls of concurrent episodes; the main thread answers them in batches.

    Worker threads call `submit(prompt_ids)` and block. `serve()` runs in the thread that owns
    the model: it waits until every live worker is blocked on the model (or `max_batch` requests
    are pending), runs `generate` on all of them at once (ordered by episode, so a batch's
    content does not depend on thread timing), hands the results back, and returns when every
    worker has left.
    """

    def __init__(
        self, generate: Callable[[list[list[int]]], list[list[int]]], max_batch: int
    ) -> None:
        self._generate = generate
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._live = 0
        self.calls = 0
        self.sequences = 0
        self.failure: BaseException | None = None

    def enter(self, count: int = 1) -> None:
        with self._cond:
            self._live += count

    def leave(self) -> None:
        with self._cond:
            self._live -= 1
            self._cond.notify_all()

    def submit(self, prompt_ids: list[int], order: tuple[int, int] = (0, 0)) -> list[int]:
        request = _Request(list(prompt_ids), order)
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
            while request.result is None and request.error is None:
                self._cond.wait()
        if request.error is not None:
            raise GenerationFailed(str(request.error)) from request.error
        assert request.result is not None
        return request.result

    def serve(self) -> None:
        while True:
            with self._cond:
                while not (
                    self._live == 0
                    or (self._pending and len(self._pending) >= min(self._live, self.max_batch))
                ):
                    self._cond.wait()
                if self._live == 0 and not self._pending:
                    return
                self._pending.sort(key=lambda r: r.order)
                batch, self._pending = (
                    self._pending[: self.max_batch],
                    self._pending[self.max_batch :],
                )
            try:
                results = self._generate([r.prompt_ids for r in batch])
                if len(results) != len(batch):
                    raise GenerationFailed(f"{len(results)} completions for {len(batch)} prompts")
            except Exception as exc:
                with self._cond:
                    self.failure = self.failure or exc
                    for request in batch:
                        request.error = exc
                    self._cond.notify_all()
                continue
            with self._cond:
                self.calls += 1
                self.sequences += len(batch)
                for request, ids in zip(batch, results, strict=True):
                    request.result = list(ids)
                self._cond.notify_all()


class PromptTooLong(ValueError):
    """The next prompt exceeds `generation.max_prompt_tokens`."""


class PolicyBackend(LocalBackend):
    """`LocalBackend` over the policy being trained: generation goes through a `TokenBatcher`,
    and every call's prompt and sampled token ids are recorded in `turns`.

    Build it with `PolicyBackend.from_loaded(model, tokenizer, ...)` and then `bind(...)`.
    """

    turns: list[Turn]
    _batcher: TokenBatcher
    _order: tuple[int, int]
    _max_prompt: int | None
    _token_lock: threading.Lock

    def bind(
        self,
        batcher: TokenBatcher,
        *,
        order: tuple[int, int],
        max_prompt_tokens: int | None,
        token_lock: threading.Lock,
    ) -> PolicyBackend:
        self.turns = []
        self._batcher = batcher
        self._order = order
        self._max_prompt = max_prompt_tokens
        self._token_lock = token_lock
        return self

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        try:
            return super().complete(messages, tools)
        except BackendUnavailable as exc:
            if isinstance(exc.cause, PromptTooLong):  # the policy's own verbosity: a budget stop
                raise EpisodeAborted(str(exc.cause), side="harness") from exc
            raise

    def _generate(self, prompt: str) -> tuple[str, int, int, bool]:
        tokenizer = self._tokenizer
        with self._token_lock:  # fast tokenizers are not safe to share across threads
            prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if self._max_prompt is not None and len(prompt_ids) > self._max_prompt:
            raise PromptTooLong(
                f"prompt of {len(prompt_ids)} tokens exceeds max_prompt_tokens={self._max_prompt}"
            )
        completion = self._batcher.submit(prompt_ids, self._order)
        self.turns.append(Turn(prompt_ids, completion))
        eos = tokenizer.eos_token_id
        hit_eos = bool(completion) and eos is not None and completion[-1] == eos
        with self._token_lock:
            text = tokenizer.decode(
                completion[:-1] if hit_eos else completion, skip_special_tokens=True
            )
        return str(text), len(prompt_ids), len(completion), hit_eos


def trim_completion(
    ids: Sequence[int], stop: int | Sequence[int] | None, pad: int | None
) -> list[int]:
    """The sampled tokens of one generated row: up to and including the first stop token (eos,
    or a stop string that is one token), without the padding `generate` appends once a row has
    stopped."""
    out = list(ids)
    stops = {stop} if isinstance(stop, int) else set(stop or ())
    for index, token in enumerate(out):
        if token in stops:
            return out[: index + 1]
    if pad is not None:
        while out and out[-1] == pad:
            out.pop()
    return out


def stop_token_ids(tokenizer: Any) -> list[int] | None:
    """The ids of the protocol's stop strings when each is a single token (as in the tiny and
    Qwen tokenizers): generation then stops on them like on eos, with no string matching."""
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in STOP_STRINGS]
    return [i[0] for i in ids] if all(len(i) == 1 for i in ids) else None


def hf_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], settings: GenerationSettings
) -> list[list[int]]:
    """Sample one completion per prompt with `model.generate` (left-padded batch)."""
    import torch
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    stops = [eos] if eos is not None else []
    stop_strings = None
    if settings.stop_at_action:
        single = stop_token_ids(tokenizer)
        if single is None:
            stop_strings = list(STOP_STRINGS)
        else:
            stops += single
    device = next(iter(model.parameters())).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids) :] = 1
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=True,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        repetition_penalty=1.0,
        use_cache=True,
        pad_token_id=pad,
        eos_token_id=stops or None,
        stop_strings=stop_strings,
    )
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            tokenizer=tokenizer if stop_strings else None,
        )
    new = output[:, width:].tolist()
    return [trim_completion(row, stops, pad) for row in new]


# =========================================================================== training data


@dataclass
class Sample:
    """One training sequence: `input_ids[:prompt_len]` is context; from `prompt_len` on,
    `mask[j]` says whether token `prompt_len + j` was sampled by the policy (1) or is
    environment feedback / template text between two packed turns (0)."""

    input_ids: list[int]
    prompt_len: int
    mask: list[int]
    advantage: float
    episode: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def build_samples(
    turns: Sequence[Turn], advantage: float, *, pack: bool = True, episode: int = 0
) -> list[Sample]:
    """An episode's turns as training sequences (packed where prefixes line up; see module doc)."""
    samples: list[Sample] = []
    current: Sample | None = None
    for turn in turns:
        if not turn.completion_ids:
            continue
        if (
            pack
            and current is not None
            and len(turn.prompt_ids) >= len(current.input_ids)
            and turn.prompt_ids[: len(current.input_ids)] == current.input_ids
        ):
            between = turn.prompt_ids[len(current.input_ids) :]
            current.input_ids += between + turn.completion_ids
            current.mask += [0] * len(between) + [1] * len(turn.completion_ids)
            continue
        current = Sample(
            input_ids=[*turn.prompt_ids, *turn.completion_ids],
            prompt_len=len(turn.prompt_ids),
            mask=[1] * len(turn.completion_ids),
            advantage=advantage,
            episode=episode,
        )
        samples.append(current)
    return samples


@dataclass
class Batch:
    """Samples collated for one forward pass: prompts left-padded to `P`, completion regions
    right-padded to `C`, so every row's completion region is columns `P..P+C-1`."""

    input_ids: Any
    attention_mask: Any
    position_ids: Any
    loss_mask: Any
    advantages: Any
    prompt_width: int
    completion_width: int


def collate(samples: Sequence[Sample], pad_id: int, device: Any = None) -> Batch:
    import torch

    width_p = max(s.prompt_len for s in samples)
    width_c = max(len(s.input_ids) - s.prompt_len for s in samples)
    rows = len(samples)
    input_ids = torch.full((rows, width_p + width_c), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width_p + width_c), dtype=torch.long)
    mask = torch.zeros((rows, width_c), dtype=torch.float32)
    for row, sample in enumerate(samples):
        p, c = sample.prompt_len, len(sample.input_ids) - sample.prompt_len
        input_ids[row, width_p - p : width_p + c] = torch.tensor(sample.input_ids)
        attention[row, width_p - p : width_p + c] = 1
        mask[row, :c] = torch.tensor(sample.mask, dtype=torch.float32)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return Batch(
        input_ids.to(device),
        attention.to(device),
        positions.to(device),
        mask.to(device),
        advantages.to(device),
        width_p,
        width_c,
    )


def token_logprobs(model: Any, batch: Batch, temperature: float = 1.0) -> Any:
    """Log-probabilities of the completion-region tokens under `model`, shape [rows, C]."""
    import torch

    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.completion_width + 1,
        use_cache=False,
    )
    logits = output.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, batch.prompt_width :]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def policy_loss(
    logps: Any,
    old_logps: Any,
    batch: Batch,
    settings: LossSettings,
    *,
    normalizer: float,
    ref_logps: Any = None,
) -> tuple[Any, dict[str, float]]:
    """GRPO's clipped surrogate (+ beta * k3 KL) summed over trained tokens / `normalizer`.

    `normalizer` is the step's trained-token count (`token_mean`) or sample count
    (`sequence_mean`), so micro-batch losses add up to the step's loss.
    """
    import torch

    mask = batch.loss_mask
    advantages = batch.advantages.unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    kl = None
    if ref_logps is not None and settings.beta > 0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + settings.beta * kl
    if settings.loss_type == "token_mean":
        loss = (per_token * mask).sum() / normalizer
    else:
        lengths = mask.sum(1).clamp(min=1.0)
        loss = ((per_token * mask).sum(1) / lengths).sum() / normalizer
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1.0)
        is_clipped = ((ratio < 1.0 - settings.clip_low) & (advantages < 0)) | (
            (ratio > 1.0 + settings.clip_high) & (advantages > 0)
        )
        stats = {
            "clip_fraction": float((is_clipped.float() * mask).sum() / tokens),
            "kl": float((kl * mask).sum() / tokens) if kl is not None else 0.0,
            "tokens": float(mask.sum()),
        }
    return loss, stats


# =========================================================================== the trainer


@dataclass
class StepResult:
    """What one RL step did (also the metrics it logged)."""

    step: int
    metrics: dict[str, float]
    tiers: dict[str, int]
    episodes: list[Episode]
    groups: list[GroupResult]


@dataclass
class RunResult:
    """What `run_rl` did: the last step, where it resumed from, the last checkpoint, the final
    model (folder and store URI), and each step's metrics."""

    final_step: int
    resumed_from: int
    checkpoint: Path | None
    final_dir: Path | None
    final_uri: str | None
    history: list[dict[str, float]]


def _fill_auto(config: Any, values: Mapping[str, Any]) -> Any:
    """Replace the `"auto"` values of a DeepSpeed config (the HF integration's job) by key."""
    if isinstance(config, dict):
        out = {}
        for key, value in config.items():
            if value == "auto" and key in values:
                out[key] = values[key]
            else:
                out[key] = _fill_auto(value, values)
        return out
    return config


class RLTrainer:
    """The online RL loop of one run (see the module doc). `train()` runs to `config.steps`."""

    def __init__(
        self,
        config: RLConfig,
        *,
        tasks: Sequence[Task] | None = None,
        environment: Callable[[int], Environment] | None = None,
    ) -> None:
        self.config = config
        self.run_dir = config.run_dir
        self.pool = list(tasks) if tasks is not None else load_tasks(config.tasks)
        self._environment = environment
        self.step = 0
        self.resumed_from = 0
        self.last_checkpoint: Path | None = None
        self.final_uri: str | None = None
        self.checkpoints: Any = None
        self.history: list[dict[str, float]] = []
        self._token_lock = threading.Lock()
        self._skills: SkillLibrary | None = None
        self._vllm: Any = None
        self.engine: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.ref_model: Any = None
        self._setup()

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from qpa.train.checkpoint import CheckpointStore, materialize
        from qpa.train.metrics import TrainMetrics

        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cuda = torch.cuda.is_available()
        self.bf16 = (
            bool(self.cuda and torch.cuda.is_bf16_supported()) if cfg.bf16 == "auto" else cfg.bf16
        )
        torch.manual_seed(cfg.seed)
        try:
            model_dir = materialize(cfg.model, self.run_dir / "cache" / "model")
            tokenizer_dir = (
                materialize(cfg.tokenizer, self.run_dir / "cache" / "tokenizer")
                if cfg.tokenizer
                else None
            )
        except FileNotFoundError as exc:
            raise ConfigError(f"model: {exc}") from None
        self.checkpoints = (
            CheckpointStore.open(cfg.checkpoint.store, cfg.store_prefix)
            if cfg.checkpoint.store
            else None
        )
        resume_dir = self._find_resume()
        weights_dir = (resume_dir / "model") if resume_dir is not None else model_dir
        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_dir or weights_dir, local_files_only=True
        )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "auto": "auto"}[
            cfg.model_dtype
        ]
        self.device: Any = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            if self.cuda
            else torch.device("cpu")
        )
        hidden = getattr(AutoConfig.from_pretrained(weights_dir), "hidden_size", None)
        if cfg.deepspeed.enabled:
            self.ds_config = self._deepspeed_config(hidden or 1024)
            if cfg.deepspeed.zero_stage == 3:
                # Weights are loaded straight into ZeRO-3 partitions (zero.Init), never whole
                # on every rank; the object must stay alive while models are loaded.
                from transformers.integrations import HfDeepSpeedConfig

                self._hf_deepspeed: Any = HfDeepSpeedConfig(self.ds_config)
        model: Any = AutoModelForCausalLM.from_pretrained(
            weights_dir, local_files_only=True, dtype=dtype
        )
        checkpointing = (
            (hidden is not None and hidden >= 1024)
            if cfg.gradient_checkpointing == "auto"
            else bool(cfg.gradient_checkpointing)
        )
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.config.use_cache = not checkpointing
        if cfg.loss.beta > 0:
            self.ref_model = self._reference_model(model_dir, dtype)
        if cfg.deepspeed.enabled:
            self._setup_deepspeed(model)
            # zero.Init was for loading only: later `from_pretrained` calls in this process
            # (evaluation, tests) must get whole models again.
            self._hf_deepspeed = None
        else:
            self.model = model.to(self.device)
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad],
                lr=cfg.optim.learning_rate,
                betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2),
                eps=cfg.optim.adam_epsilon,
                weight_decay=cfg.optim.weight_decay,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.metrics = TrainMetrics(
            cfg.name,
            "rl",
            jsonl=cfg.metrics_path,
            textfile=cfg.metrics.textfile,
            enabled=self.rank == 0,
        )
        if cfg.metrics.prometheus_port and self.rank == 0:
            TrainMetrics.serve(cfg.metrics.prometheus_port)
        if resume_dir is not None:
            self._load_state(resume_dir)
        if cfg.generation.backend == "vllm":
            self._setup_vllm()

    def _lr_lambda(self, step: int) -> float:
        warmup = self.config.optim.warmup_steps
        return min(1.0, (step + 1) / warmup) if warmup else 1.0

    def _deepspeed_config(self, hidden: int) -> dict[str, Any]:
        """The DeepSpeed JSON of `qpa.train.deepspeed` with its `"auto"` values filled in (the
        Hugging Face integration's job in SFT) and caller-owned gradient accumulation."""
        import deepspeed
        import torch

        from qpa.train.deepspeed import deepspeed_config, ensure_single_process_env

        cfg = self.config
        ensure_single_process_env()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        values = {
            "train_micro_batch_size_per_gpu": 1,
            "train_batch_size": world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.optim.max_grad_norm,
            "enabled": self.bf16,
            "lr": cfg.optim.learning_rate,
            "betas": [cfg.optim.adam_beta1, cfg.optim.adam_beta2],
            "eps": cfg.optim.adam_epsilon,
            "weight_decay": cfg.optim.weight_decay,
            "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
        }
        ds_config: dict[str, Any] = _fill_auto(
            deepspeed_config(cfg.deepspeed, cuda=self.cuda), values
        )
        # A step holds as many micro-batches as its rollouts need: the caller owns the boundary.
        ds_config["managed_gradient_accumulation"] = False
        ds_config["gradient_accumulation_steps"] = 1
        return ds_config

    def _setup_deepspeed(self, model: Any) -> None:
        import deepspeed
        import torch

        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=self.ds_config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, self._lr_lambda),
        )
        self.engine, self.optimizer, self.scheduler = engine, optimizer, scheduler
        self.model = engine.module
        self.device = engine.device

    def _reference_model(self, model_dir: Path, dtype: Any) -> Any:
        """The frozen starting policy for the KL term: a plain module, or under ZeRO-3 a
        DeepSpeed inference engine over the same partitioning (as TRL prepares it)."""
        from transformers import AutoModelForCausalLM

        ref: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=dtype
        )
        ref.eval().requires_grad_(False)
        if self.config.deepspeed.enabled and self.config.deepspeed.zero_stage == 3:
            import deepspeed

            config: dict[str, Any] = {
                key: self.ds_config[key]
                for key in ("train_micro_batch_size_per_gpu", "train_batch_size", "bf16", "fp16")
                if key in self.ds_config
            }
            config["zero_optimization"] = {
                k: v
                for k, v in self.ds_config["zero_optimization"].items()
                if not k.startswith("offload_optimizer")
            }
            engine, *_ = deepspeed.initialize(model=ref, config=config)
            engine.eval()
            return engine
        return ref.to(self.device)

    def _setup_vllm(self) -> None:  # pragma: no cover - needs a GPU and a vLLM server
        from trl.generation.vllm_client import VLLMClient

        settings = self.config.generation
        self._vllm = VLLMClient(
            base_url=settings.vllm_url,
            group_port=settings.vllm_group_port,
            connection_timeout=settings.vllm_timeout_s,
        )
        self._vllm.init_communicator(device=self.device)
        self._push_weights()

    # ------------------------------------------------------------------ helpers
    @property
    def zero3(self) -> bool:
        return self.engine is not None and self.config.deepspeed.zero_stage == 3

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[None]:
        """All weights materialised (ZeRO-3 partitions them); a no-op otherwise."""
        if self.zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
                yield
        else:
            yield

    def _push_weights(self) -> None:  # pragma: no cover - needs a GPU and a vLLM server
        if self._vllm is None:
            return
        with self.full_parameters():
            if self.rank == 0:
                self._vllm.update_model_params(self.model)
                self._vllm.reset_prefix_cache()

    def _skill_library(self) -> SkillLibrary:
        if self._skills is None:
            self._skills = self.config.harness.skill_library()
        return self._skills

    def _make_env(self, index: int) -> Environment:
        if self._environment is not None:
            return self._environment(index)
        env_cfg = self.config.env
        if env_cfg.urls:
            from qpa.envs.remote import RemoteEnv

            url = env_cfg.urls[index % len(env_cfg.urls)]
            return RemoteEnv(url, timeout=env_cfg.timeout_s)
        return make_env(env_cfg.kind, **env_cfg.options)

    def _generate(self, prompts: list[list[int]]) -> list[list[int]]:
        settings = self.config.generation
        if self._vllm is not None:  # pragma: no cover - needs a GPU and a vLLM server
            out = self._vllm.generate(
                prompts,
                n=1,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                max_tokens=settings.max_new_tokens,
                logprobs=None,
                generation_kwargs={
                    "stop": list(STOP_STRINGS) if settings.stop_at_action else None,
                    "include_stop_str_in_output": True,
                    "skip_special_tokens": False,
                },
            )
            return [list(ids) for ids in out["completion_ids"]]
        return hf_generate(self.model, self.tokenizer, prompts, settings)

    # ------------------------------------------------------------------ rollouts
    def rollout(self, tasks: Sequence[Task], *, step: int = 0) -> list[Episode]:
        """k episodes per task through the Harness, generation batched across episodes."""
        import torch

        cfg = self.config
        k = cfg.samples_per_task
        jobs = [(g, s) for g in range(len(tasks)) for s in range(k)]
        results: list[Episode | None] = [None] * len(jobs)
        queue = deque(enumerate(jobs))
        queue_lock = threading.Lock()
        errors: list[BaseException] = []
        batcher = TokenBatcher(self._generate, cfg.generation.max_batch)
        policy = Policy(planner="harness", model=cfg.name, harness_version=cfg.harness.version)

        def work() -> None:
            try:
                while True:
                    with queue_lock:
                        if not queue:
                            return
                        index, (group, sample) = queue.popleft()
                    results[index] = self._episode(
                        tasks[group], group, sample, index, batcher, policy
                    )
            except BaseException as exc:  # a worker bug must not hang the batcher
                errors.append(exc)
            finally:
                batcher.leave()

        workers = min(len(jobs), cfg.generation.workers)
        batcher.enter(workers)
        threads = [
            threading.Thread(target=work, name=f"rollout-{i}", daemon=True) for i in range(workers)
        ]
        torch.manual_seed(hash((cfg.seed, step, self.rank)) & 0x7FFFFFFF)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.full_parameters():
                for thread in threads:
                    thread.start()
                batcher.serve()
        finally:
            for thread in threads:
                thread.join()
            self.model.train(was_training)
        if errors:
            raise errors[0]
        if batcher.failure is not None:
            raise GenerationFailed(
                f"the policy failed to generate: {type(batcher.failure).__name__}: "
                f"{batcher.failure}"
            ) from batcher.failure
        self._batcher_stats = (batcher.calls, batcher.sequences)
        return [e for e in results if e is not None]

    def _episode(
        self,
        task: Task,
        group: int,
        sample: int,
        index: int,
        batcher: TokenBatcher,
        policy: Policy,
    ) -> Episode:
        cfg = self.config
        backend = PolicyBackend.from_loaded(
            self.model,
            self.tokenizer,
            name=cfg.name,
            max_new_tokens=cfg.generation.max_new_tokens,
            stop_at_action=cfg.generation.stop_at_action,
        ).bind(
            batcher,
            order=(group, sample),
            max_prompt_tokens=cfg.generation.max_prompt_tokens,
            token_lock=self._token_lock,
        )
        planner = HarnessPlanner(backend, cfg.harness, skills=self._skill_library())
        env = self._make_env(index)
        try:
            trajectory = run_episode(
                env, task, planner, policy=policy, sample=sample, budgets=cfg.harness.budgets()
            )
        finally:
            with contextlib.suppress(Exception):
                env.close()
            with contextlib.suppress(Exception):
                planner.memory.close()
        return Episode(group, sample, trajectory, backend.turns)

    # ------------------------------------------------------------------ scoring
    def score(self, episodes: Sequence[Episode]) -> dict[int, tuple[list[Episode], GroupResult]]:
        """CARE (or vanilla GRPO) per group of episodes of the same task.

        Episodes ended by the environment's side (a dead env server, a failed reset) are left
        out: they say nothing about the policy. Returns group index -> (members in sample
        order, result with rewards/advantages in that order).
        """
        care = self.config.care
        by_group: dict[int, list[Episode]] = {}
        for episode in episodes:
            if trainable(episode):
                by_group.setdefault(episode.group, []).append(episode)
        results: dict[int, tuple[list[Episode], GroupResult]] = {}
        for g, members in sorted(by_group.items()):
            members.sort(key=lambda e: e.sample)
            trajectories = [e.trajectory for e in members]
            if care.enabled:
                result = care_group(trajectories, care.care_config())
            else:
                result = vanilla_group(trajectories, care.care_config(), tier=care.vanilla_reward)
            results[g] = (members, result)
        return results

    # ------------------------------------------------------------------ the update
    def update(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on `samples` (micro-batched; see the module doc)."""
        import torch

        cfg = self.config
        loss_cfg = cfg.loss
        temperature = cfg.generation.temperature
        pad = self.tokenizer.pad_token_id
        total_tokens = sum(s.trained_tokens for s in samples)
        normalizer = float(
            max(1, total_tokens if loss_cfg.loss_type == "token_mean" else len(samples))
        )
        active = [
            s
            for s in samples
            if s.trained_tokens
            and not (loss_cfg.skip_zero_advantage and loss_cfg.beta == 0 and s.advantage == 0.0)
        ]
        active.sort(key=lambda s: len(s.input_ids))
        chunks = [
            active[i : i + loss_cfg.micro_batch_size]
            for i in range(0, len(active), loss_cfg.micro_batch_size)
        ]
        if not chunks and self.world_size > 1 and samples:
            # Other ranks step: take part in the collectives with a zero-advantage sample.
            chunks = [[Sample(samples[0].input_ids, samples[0].prompt_len, samples[0].mask, 0.0)]]
        batches = [collate(chunk, pad, self.device) for chunk in chunks]
        old: list[Any] = [None] * len(batches)
        ref: list[Any] = [None] * len(batches)
        if batches and (loss_cfg.ppo_epochs > 1 or loss_cfg.beta > 0):
            with torch.no_grad():
                for i, batch in enumerate(batches):
                    if loss_cfg.ppo_epochs > 1:
                        old[i] = token_logprobs(self._forward_model, batch, temperature)
                    if self.ref_model is not None:
                        ref[i] = token_logprobs(self.ref_model, batch, temperature)
        self.model.train()
        totals = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0}
        grad_norm = 0.0
        weighted = 0.0
        for _ in range(loss_cfg.ppo_epochs if batches else 0):
            for i, batch in enumerate(batches):
                with self._autocast():
                    logps = token_logprobs(self._forward_model, batch, temperature)
                old_logps = old[i] if old[i] is not None else logps.detach()
                loss, stats = policy_loss(
                    logps, old_logps, batch, loss_cfg, normalizer=normalizer, ref_logps=ref[i]
                )
                if self.engine is not None:
                    self.engine.backward(loss, scale_wrt_gas=False)
                else:
                    loss.backward()
                totals["loss"] += float(loss.detach()) / loss_cfg.ppo_epochs
                share = stats["tokens"]
                weighted += share
                totals["clip_fraction"] += stats["clip_fraction"] * share
                totals["kl"] += stats["kl"] * share
            grad_norm = self._optimizer_step()
        if weighted:
            totals["clip_fraction"] /= weighted
            totals["kl"] /= weighted
        totals["grad_norm"] = grad_norm
        totals["learning_rate"] = self._learning_rate()
        totals["train_tokens"] = float(total_tokens)
        totals["micro_batches"] = float(len(batches))
        return totals

    @property
    def _forward_model(self) -> Any:
        return self.engine if self.engine is not None else self.model

    def _autocast(self) -> Any:
        import torch

        if self.engine is None and self.cuda and self.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _optimizer_step(self) -> float:
        import torch

        if self.engine is not None:
            self.engine.step()
            norm = self.engine.get_global_grad_norm()
            return float(norm) if norm is not None else 0.0
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _learning_rate(self) -> float:
        groups = getattr(self.optimizer, "param_groups", None)
        return float(groups[0]["lr"]) if groups else self.config.optim.learning_rate

    # ------------------------------------------------------------------ one step
    def train_step(self) -> StepResult:
        """Sample tasks, roll out, score, update; logs metrics and checkpoints when due."""
        cfg = self.config
        step = self.step + 1
        started = time.perf_counter()
        local = sample_tasks(self.pool, cfg.tasks_per_step * self.world_size, cfg.seed, step - 1)
        tasks = local[self.rank :: self.world_size]
        episodes = self.rollout(tasks, step=step)
        rolled = time.perf_counter()
        scored = self.score(episodes)
        groups = [result for _, result in scored.values()]
        samples: list[Sample] = []
        for members, result in scored.values():
            for episode, value in zip(members, result.advantages, strict=True):
                samples += build_samples(
                    episode.turns,
                    value,
                    pack=cfg.loss.pack_turns,
                    episode=episodes.index(episode),
                )
        update = self.update(samples)
        if self._vllm is not None:  # pragma: no cover - needs a GPU and a vLLM server
            self._push_weights()
        finished = time.perf_counter()
        self.step = step
        metrics = self._step_metrics(episodes, groups, samples, update)
        tokens = int(
            sum(
                e.trajectory.totals.prompt_tokens + e.trajectory.totals.completion_tokens
                for e in episodes
            )
        )
        metrics.update(
            rollout_s=rolled - started,
            update_s=finished - rolled,
            step_s=finished - started,
            tokens_per_second=tokens / max(finished - started, 1e-9),
        )
        tiers: dict[str, int] = {
            tier: sum(1 for g in groups if g.tier == tier) for tier in CARE_TIERS
        }
        self.history.append(metrics)
        if step % cfg.metrics.logging_steps == 0 or step == cfg.steps:
            output = int(sum(e.trajectory.totals.completion_tokens for e in episodes))
            self.metrics.log(step, tokens=tokens, output_tokens=output, care_tiers=tiers, **metrics)
        if step % cfg.checkpoint.every_steps == 0 or step == cfg.steps:
            self.save_checkpoint()
        return StepResult(step, metrics, tiers, episodes, groups)

    def _step_metrics(
        self,
        episodes: Sequence[Episode],
        groups: Sequence[GroupResult],
        samples: Sequence[Sample],
        update: Mapping[str, float],
    ) -> dict[str, float]:
        n = max(1, len(episodes))
        rewards = [r for g in groups for r in g.rewards]
        advantages = [a for g in groups for a in g.advantages]
        mean_reward = sum(rewards) / max(1, len(rewards))
        return {
            "loss": update["loss"],
            "reward": mean_reward,
            "reward_std": math.sqrt(
                sum((r - mean_reward) ** 2 for r in rewards) / max(1, len(rewards))
            ),
            "advantage_abs": sum(abs(a) for a in advantages) / max(1, len(advantages)),
            "success_rate": sum(e.trajectory.success for e in episodes) / n,
            "progress": sum(
                e.trajectory.verification.progress if e.trajectory.verification else 0.0
                for e in episodes
            )
            / n,
            "output_tokens_mean": sum(e.trajectory.totals.completion_tokens for e in episodes) / n,
            "tool_calls_mean": sum(e.trajectory.totals.tool_calls for e in episodes) / n,
            "turns_mean": sum(e.trajectory.totals.turns for e in episodes) / n,
            "episode_errors": float(sum(1 for e in episodes if e.trajectory.error)),
            "environment_failures": float(sum(1 for e in episodes if not trainable(e))),
            "episodes": float(len(episodes)),
            "groups": float(len(groups)),
            "anchored_groups": float(sum(1 for g in groups if g.anchored)),
            "samples": float(len(samples)),
            "packed_turns": float(sum(len(e.turns) for e in episodes) - len(samples)),
            "generate_calls": float(getattr(self, "_batcher_stats", (0, 0))[0]),
            **{k: float(v) for k, v in update.items() if k != "loss"},
        }

    def train(self) -> RunResult:
        """Run steps until `config.steps` (from where a resumed run left off)."""
        while self.step < self.config.steps:
            self.train_step()
        final = self.save_final()
        return RunResult(
            self.step, self.resumed_from, self.last_checkpoint, final, self.final_uri, self.history
        )

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Save `checkpoint-<step>/` (see `qpa.train.checkpoint`): `model/` (Hugging Face
        weights + tokenizer), optimizer state (`optimizer.pt`, or DeepSpeed's `deepspeed/`),
        `rl_state.json`, RNG; hashed (`record_local`, the completion mark) and uploaded to the
        store when one is configured. Older local folders beyond `keep_last` are removed."""
        import torch

        from qpa.train.checkpoint import record_local

        folder = self.run_dir / f"checkpoint-{self.step}"
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank == 0 and folder.exists():
            shutil.rmtree(folder)
        self._barrier()
        if self.engine is not None:
            self.engine.save_checkpoint(str(folder / "deepspeed"), tag="state")
        with self.full_parameters():
            if self.rank == 0:
                self._save_model(folder / "model")
        if self.rank == 0:
            if self.engine is None:
                torch.save(
                    {
                        "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                    },
                    folder / "optimizer.pt",
                )
            state = {"step": self.step, "name": self.config.name, "care": self.config.care.enabled}
            (folder / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
            torch.save({"torch": torch.get_rng_state()}, folder / "rng.pt")
        self._barrier()
        node, nodes = _node_topology()
        if local_rank == 0:
            record_local(folder, self.step, node_rank=node)
            if self.checkpoints is not None:
                self.checkpoints.upload(folder, self.step, node_rank=node, nodes=nodes)
        if nodes > 1:
            self._barrier()
            if self.rank == 0 and self.checkpoints is not None:
                base = self.checkpoints.checkpoint_key(self.step)
                self.checkpoints.mark_complete(base, step=self.step, nodes=nodes)
        if local_rank == 0:
            self._prune()
        self.last_checkpoint = folder
        return folder

    def _save_model(self, folder: Path) -> None:
        """The policy's full weights and the tokenizer as a Hugging Face folder (rank 0)."""
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        self.model.save_pretrained(folder, state_dict=state)
        self.tokenizer.save_pretrained(folder)

    def save_final(self) -> Path | None:
        """`<output_dir>/final`: the trained model and tokenizer (uploaded to `<prefix>/final`)."""
        if not self.config.checkpoint.save_final:
            return None
        folder = self.run_dir / "final"
        with self.full_parameters():
            if self.rank == 0:
                if folder.exists():
                    shutil.rmtree(folder)
                self._save_model(folder)
                if self.checkpoints is not None:
                    self.final_uri = self.checkpoints.upload_final(folder)
        self._barrier()
        return folder

    def _barrier(self) -> None:
        import torch

        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def _prune(self) -> None:
        from qpa.train.checkpoint import local_checkpoints

        keep = self.config.checkpoint.keep_last
        if keep is None:
            return
        for ref in local_checkpoints(self.run_dir)[:-keep]:
            if ref.local is not None:
                shutil.rmtree(ref.local, ignore_errors=True)

    def _find_resume(self) -> Path | None:
        """The checkpoint folder to continue from (downloaded when it is in the store)."""
        from qpa.store import open_store
        from qpa.train.checkpoint import (
            CheckpointError,
            download_checkpoint,
            latest_local,
            verify_local,
        )

        settings = self.config.checkpoint
        explicit = settings.resume_from
        if explicit:
            if "://" not in explicit:
                folder = Path(explicit)
                if not (folder / STATE_FILE).is_file():
                    raise ConfigError(f"resume checkpoint {explicit} has no {STATE_FILE}")
                problems = verify_local(folder)
                if problems:
                    raise ConfigError(f"resume checkpoint {explicit}: {problems[0]}")
                return folder
            try:
                dest = self.run_dir / f"resume-{hashlib.sha256(explicit.encode()).hexdigest()[:8]}"
                return download_checkpoint(open_store(explicit), "", dest)
            except (CheckpointError, ValueError) as exc:
                raise ConfigError(f"resume checkpoint {explicit}: {exc}") from None
        if settings.resume == "never":
            return None
        local = latest_local(self.run_dir)
        remote = self.checkpoints.latest() if self.checkpoints is not None else None
        if remote is not None and (local is None or remote.step > local.step):
            assert self.checkpoints is not None
            return self.checkpoints.download(
                remote.step, self.run_dir / f"checkpoint-{remote.step}"
            )
        if local is not None:
            assert local.local is not None
            return local.local
        if settings.resume == "latest":
            where = [str(self.run_dir)]
            if self.checkpoints is not None:
                where.append(self.checkpoints.uri())
            raise ConfigError(f"resume: no complete checkpoint in {' or '.join(where)}")
        return None

    def _load_state(self, folder: Path) -> None:
        import torch

        state = json.loads((folder / STATE_FILE).read_text())
        self.step = self.resumed_from = int(state["step"])
        if self.engine is not None:
            self.engine.load_checkpoint(
                str(folder / "deepspeed"),
                tag="state",
                load_module_strict=True,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
        else:
            saved = torch.load(folder / "optimizer.pt", weights_only=False)
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
        rng = folder / "rng.pt"
        if rng.exists():
            torch.set_rng_state(torch.load(rng, weights_only=False)["torch"])
        self.last_checkpoint = folder

    def close(self) -> None:
        """Release the vLLM communicator (if any)."""
        if self._vllm is not None:  # pragma: no cover - needs a GPU and a vLLM server
            with contextlib.suppress(Exception):
                self._vllm.close_communicator()


def trainable(episode: Episode) -> bool:
    """False for episodes the environment's side ended (they are not the policy's doing)."""
    return not (episode.trajectory.error or "").startswith("environment:")


def _node_topology() -> tuple[int, int]:
    """(node rank, nodes) from the launcher's environment (as `qpa train launch` sets it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("NPROC_PER_NODE", world)))
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    return node, max(1, world // max(1, local_world))


def run_rl(
    config: RLConfig,
    *,
    care: bool | None = None,
    env_urls: Sequence[str] = (),
    resume: bool = False,
    tasks: Sequence[Task] | None = None,
) -> RunResult:
    """Run (or resume) an RL run to `config.steps`; CLI flags override the config."""
    updates: dict[str, Any] = {}
    if care is not None:
        updates["care"] = config.care.model_copy(update={"enabled": care})
    if env_urls:
        updates["env"] = config.env.model_copy(update={"urls": list(env_urls)})
    if resume:
        updates["checkpoint"] = config.checkpoint.model_copy(update={"resume": "latest"})
    if updates:
        config = config.model_copy(update=updates)
    trainer = RLTrainer(config, tasks=tasks)
    try:
        return trainer.train()
    finally:
        trainer.close()


__all__ = [
    "Batch",
    "CareSettings",
    "EnvSettings",
    "Episode",
    "GenerationFailed",
    "GenerationSettings",
    "LossSettings",
    "OptimSettings",
    "PolicyBackend",
    "PromptTooLong",
    "RLConfig",
    "RLTrainer",
    "RunResult",
    "Sample",
    "StepResult",
    "TaskSource",
    "TokenBatcher",
    "Turn",
    "build_samples",
    "collate",
    "hf_generate",
    "load_tasks",
    "policy_loss",
    "run_rl",
    "sample_tasks",
    "stop_token_ids",
    "token_logprobs",
    "trainable",
    "trim_completion",
]
