"""The loop's stages: each a function with its inputs and outputs under `DIR/stages/<name>/`.

A stage reads the settings it needs from the preset and the outputs of the stages it depends on,
writes its artifacts into its own folder and returns a small JSON summary (paths relative to
`DIR`). `run_stage` wraps it with a **done-marker**, `DIR/stages/<name>/done.json`, holding a
hash of the stage's settings, its code version and the hashes of its inputs:

- marker present with the same hash: the stage is skipped and its summary reused;
- marker with another hash (a setting or an input changed): the folder is wiped and the stage
  reruns, and so, through their input hashes, does every stage downstream;
- no marker (first run, or a crash): the stage runs; SFT, RL and collection resume from what the
  crashed attempt left in the folder (checkpoints, uploaded parts) when the hash matches.

Every stage seeds `random`, NumPy and torch from the preset's seed and its own name, so a
second run with the same seed computes the same numbers (on the same machine and thread count).

The stages, in order (`STAGES`):

| stage | what it does |
|---|---|
| `tiny` | tokenizer (BPE + macro tokens for recurring Harness prompt lines), a random Qwen3 |
| `tasks` | round 1: fresh train variants of the curriculum's templates (`qpa.data.generate`) |
| `collect` | oracle and noisy-oracle trajectories on the training tasks (`qpa.data.collect`) |
| `curate` | validity, diagnosis, turn flags, dedupe; failures kept (`qpa.data.curate`) |
| `mix` | the SFT mixture, rendered as the Harness prompts (`qpa.data.mix`), gate automatic |
| `eval_untrained` | the random model on the held-out test split |
| `sft` | SFT with turn-level masking (`qpa.train.sft`) |
| `eval_sft` | the SFT model on validation and test (Harness v1), diagnosis of both |
| `harness_revision` | Harness-side failures on validation -> Harness v2 (budgets, tools) |
| `eval_harness` | the SFT model through Harness v2: a new Harness evaluated like a new model |
| `round2` | tasks generated for the validation weaknesses, collected, curated, mixed by weakness |
| `rl` | online RL with CARE from the SFT model through Harness v2 on the round-2 pool |
| `eval_rl` | the RL model on validation and test (Harness v2), diagnosis |

`evaluate` (greedy, batched across episodes through the Harness, scored by `qpa.bench`) and
`build_tokenizer`/`make_checkpoint` are public: `benchmarks/care_vs_vanilla.py` reuses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qpa.contract import CAPABILITIES, Policy, Task, ToolCall, Trajectory
from qpa.harness.agent import HarnessConfig
from qpa.loop.presets import LoopPreset

STAGE_VERSION = 1
"""Bumped when a stage's code changes what it computes (part of every stage hash)."""
MARKER = "done.json"
STARTED = "started.json"
LOG = "stage.log"


# =========================================================================== plumbing


class StageError(RuntimeError):
    """A stage cannot run (the message names the stage and what is missing)."""


@dataclass
class StageContext:
    """What a running stage sees: the run folder, the preset, its inputs' summaries."""

    root: Path
    preset: LoopPreset
    name: str
    inputs: dict[str, dict[str, Any]]
    log: Callable[[str], None] = print

    @property
    def dir(self) -> Path:
        return self.root / "stages" / self.name

    @property
    def seed(self) -> int:
        return stage_seed(self.preset.seed, self.name)

    def path(self, relative: str) -> Path:
        """A path a summary recorded (relative to the run folder)."""
        return self.root / relative

    def rel(self, path: Path) -> str:
        return os.path.relpath(path, self.root)

    def output(self, stage: str, key: str) -> Any:
        try:
            return self.inputs[stage][key]
        except KeyError:
            raise StageError(f"stage {self.name}: input {stage}.{key} is missing") from None


@dataclass(frozen=True)
class Stage:
    """One step of the loop: name, inputs (other stages), the preset sections it reads."""

    name: str
    title: str
    deps: tuple[str, ...]
    sections: tuple[str, ...]
    run: Callable[[StageContext], dict[str, Any]]


@dataclass
class StageResult:
    """How a stage ended in this run: ran or skipped, its summary, its time."""

    name: str
    status: str  # "ran" | "skipped"
    key: str
    outputs: dict[str, Any]
    elapsed_s: float
    ran_elapsed_s: float


def stage_seed(seed: int, name: str) -> int:
    """A stage's seed: the run's seed and the stage's name, hashed (stable across runs)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seed `random`, NumPy and torch (when installed)."""
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % (2**32))
    with contextlib.suppress(ImportError):
        import torch

        torch.manual_seed(seed)


def stage_key(stage: Stage, preset: LoopPreset, input_keys: Mapping[str, str]) -> str:
    """The hash a done-marker must hold for the stage to be skipped."""
    payload = {
        "stage": stage.name,
        "version": STAGE_VERSION,
        "seed": preset.seed,
        "suite": preset.suite,
        "settings": preset.section(*stage.sections),
        "inputs": dict(sorted(input_keys.items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_marker(root: Path, name: str) -> dict[str, Any] | None:
    path = root / "stages" / name / MARKER
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _captured(log_path: Path) -> Iterator[None]:
    """Send what libraries print (trainer logs, progress bars) to the stage's log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "a", encoding="utf-8") as stream,
        contextlib.redirect_stdout(stream),
        contextlib.redirect_stderr(stream),
    ):
        yield


def quiet_libraries() -> None:
    """Silence the chattiest library loggers (transformers, datasets) for the run."""
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        from datasets.utils.logging import disable_progress_bar, set_verbosity_error

        disable_progress_bar()
        set_verbosity_error()


def run_stage(
    stage: Stage,
    root: Path,
    preset: LoopPreset,
    done: Mapping[str, StageResult],
    *,
    log: Callable[[str], None] = print,
    capture: bool = True,
) -> StageResult:
    """Run `stage` unless its done-marker holds the same hash; see the module docstring."""
    missing = [d for d in stage.deps if d not in done]
    if missing:
        raise StageError(f"stage {stage.name}: inputs {', '.join(missing)} have not run")
    key = stage_key(stage, preset, {d: done[d].key for d in stage.deps})
    folder = root / "stages" / stage.name
    marker = read_marker(root, stage.name)
    if marker is not None and marker.get("key") == key:
        return StageResult(
            stage.name,
            "skipped",
            key,
            dict(marker.get("outputs") or {}),
            0.0,
            float(marker.get("elapsed_s") or 0.0),
        )
    started = _read_started(folder)
    if marker is not None or (started is not None and started != key):
        shutil.rmtree(folder, ignore_errors=True)  # stale: another setting or another input
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / STARTED, {"key": key, "started_at": datetime.now(UTC).isoformat()})
    context = StageContext(
        root=root,
        preset=preset,
        name=stage.name,
        inputs={d: done[d].outputs for d in stage.deps},
        log=log,
    )
    seed_everything(context.seed)
    clock = time.perf_counter()
    if capture:
        with _captured(folder / LOG):
            outputs = stage.run(context)
    else:
        outputs = stage.run(context)
    elapsed = round(time.perf_counter() - clock, 3)  # as the marker keeps it
    _write_json(
        folder / MARKER,
        {
            "stage": stage.name,
            "key": key,
            "inputs": {d: done[d].key for d in stage.deps},
            "settings": preset.section(*stage.sections),
            "outputs": outputs,
            "elapsed_s": elapsed,
            "finished_at": datetime.now(UTC).isoformat(),
        },
    )
    return StageResult(stage.name, "ran", key, outputs, elapsed, elapsed)


def _read_started(folder: Path) -> str | None:
    try:
        data = json.loads((folder / STARTED).read_text())
    except (OSError, ValueError):
        return None
    key = data.get("key") if isinstance(data, dict) else None
    return key if isinstance(key, str) else None


# =========================================================================== tasks


def curriculum(preset: LoopPreset, split: str) -> list[Task]:
    """The canonical tasks of the curriculum's templates in `split` (capped per template)."""
    from qpa.envs.sandbox.suite import generate_suite

    cap = {
        "validation": preset.tasks.validation_per_template,
        "test": preset.tasks.test_per_template,
    }.get(split)
    wanted = set(preset.tasks.templates)
    unknown = wanted - {t.template for t in generate_suite(preset.suite)}
    if unknown:
        raise StageError(f"preset {preset.name}: unknown templates {', '.join(sorted(unknown))}")
    counts: Counter[str] = Counter()
    out: list[Task] = []
    for task in generate_suite(preset.suite):
        if task.split != split or task.template not in wanted:
            continue
        if cap is not None and counts[task.template or ""] >= cap:
            continue
        counts[task.template or ""] += 1
        out.append(task)
    return out


def read_task_file(path: Path) -> list[Task]:
    from qpa.contract import read_tasks

    return list(read_tasks(path))


def write_jsonl(path: Path, items: Iterable[Any]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as stream:
        for item in items:
            stream.write(item.model_dump_json() + "\n")
            count += 1
    return count


def read_trajectories(path: Path) -> list[Trajectory]:
    from qpa.contract import read_trajectories as read

    return list(read(path))


# =========================================================================== tokenizer + model


def oracle_trajectories(tasks: Iterable[Task]) -> list[Trajectory]:
    """The oracle's (reference plan's) episode of each task, in the sandbox."""
    from qpa.envs.factory import make_env
    from qpa.harness.planners import OraclePlanner
    from qpa.harness.runner import run_episode

    env = make_env("sandbox")
    try:
        return [run_episode(env, task, OraclePlanner()) for task in tasks]
    finally:
        env.close()


def macro_lines(
    episodes: Iterable[Iterable[Sequence[Mapping[str, Any]]]],
    *,
    min_count: int = 2,
    min_chars: int = 12,
    limit: int = 6000,
) -> list[str]:
    """Lines of the Harness's fixed text that recur in at least `min_count` episodes.

    `episodes` holds, per episode, its conversations (the same episode rendered for one or
    more Harness versions); a line counts once per episode. Only the system prompt (rules, the
    tool protocol, tool and Skill lines, memory header) and the opening user turn (the quoting
    preface, the reset observation) are mined: what the model writes and the tool results it
    must read are never made opaque. The tokenizer makes each line a single token.
    """
    counts: Counter[str] = Counter()
    for conversations in episodes:
        lines: set[str] = set()
        for conversation in conversations:
            opening = True
            for message in conversation:
                role = message.get("role")
                if role == "assistant":
                    opening = False
                    continue
                if role == "user" and not opening:
                    continue
                lines.update(
                    line
                    for line in str(message.get("content") or "").split("\n")
                    if len(line) >= min_chars
                )
        counts.update(lines)
    frequent = [line for line, count in counts.most_common() if count >= min_count]
    return sorted(frequent[:limit])


def build_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int,
    macros: Sequence[str] = (),
    model_max_length: int = 4096,
) -> Any:
    """A byte-level BPE tokenizer (ChatML template of the tiny checkpoints) with macro tokens.

    Pre-tokenization splits text into words, runs of digits and runs of everything else
    (spaces, punctuation), so a word or a number is tokenized the same wherever it appears
    (copying an argument from the instruction into a call is then token for token), while the
    call syntax between arguments (`", "`, `": "`, `"}}`) can merge into a few tokens. `macros`
    are added as single,
    non-special tokens after the protocol tags (see `qpa.train.tiny`).
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    from qpa.train.tiny import (
        EOS_TOKEN,
        PAD_TOKEN,
        PROTOCOL_TOKENS,
        SPECIAL_TOKENS,
        TRAINING_CHAT_TEMPLATE,
    )

    special = [t for t in SPECIAL_TOKENS if t not in PROTOCOL_TOKENS]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[A-Za-z]+|[0-9]+|[^A-Za-z0-9]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(list(texts), trainer)
    raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in PROTOCOL_TOKENS])
    if macros:
        raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in macros])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TRAINING_CHAT_TEMPLATE
    return tokenizer


def harness_ladder(preset: LoopPreset, rungs: int = 3) -> list[HarnessConfig]:
    """The first Harness opened step by step to the revision's caps (tool cap, adapter budget,
    memory k), the last rung the widest: what a revision can become. Macro lines are mined from
    every rung, and the SFT mixture renders each trajectory for one of v1 and the rungs, so a
    revised Harness is no new prompt (a tiny model trained on two prompt sizes fails on a
    third in between). The budget grows geometrically: revisions are small steps."""
    first, caps = preset.harness, preset.revision
    tools = first.max_tools or caps.max_tools_cap
    budget = max(first.token_budget, 50)
    ladder: list[HarnessConfig] = []
    for rung in range(1, rungs + 1):
        share = rung / rungs
        rung_budget = budget * (max(caps.token_budget_cap, budget) / budget) ** share
        ladder.append(
            first.model_copy(
                update={
                    "version": f"{first.version}-rung{rung}",
                    "token_budget": max(first.token_budget, round(rung_budget / 50) * 50),
                    "max_tools": _between(tools, caps.max_tools_cap, share),
                    "memory_k": _between(first.memory_k, caps.memory_k_cap, share),
                }
            )
        )
    return ladder


def _between(start: int, cap: int, share: float) -> int:
    return max(start, round(start + (cap - start) * share))


def make_checkpoint(
    preset: LoopPreset, out: Path, *, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The tiny checkpoint of `preset`: tokenizer (corpus: the suite's train/validation text
    and Harness-rendered oracle conversations of the curriculum's train split) + random model."""
    from qpa.data.render import render_trajectory
    from qpa.train.tiny import TINY_MANIFEST, build_model, suite_corpus

    settings = preset.tokenizer
    train = curriculum(preset, "train")
    rng = random.Random(stage_seed(preset.seed, "tiny-corpus"))
    picked = rng.sample(train, min(settings.conversations, len(train)))
    trajectories = [t for t in oracle_trajectories(picked) if t.success]
    harnesses = [preset.harness, *harness_ladder(preset)]
    episodes = [[render_trajectory(t, h) for h in harnesses] for t in trajectories]
    conversations = [c for pair in episodes for c in pair]
    macros: list[str] = []
    if settings.macro_lines:
        macros = macro_lines(
            episodes,
            min_count=settings.macro_min_count,
            min_chars=settings.macro_min_chars,
            limit=settings.macro_max,
        )
    corpus = suite_corpus(conversations=20, seed=preset.seed)
    chat = build_tokenizer(["x"], vocab_size=300)  # only its chat template renders the corpus
    corpus += [
        str(
            chat.apply_chat_template(
                [{"role": m["role"], "content": m["content"]} for m in c], tokenize=False
            )
        )
        for c in conversations
    ]
    tokenizer = build_tokenizer(
        corpus,
        vocab_size=settings.vocab_size,
        macros=macros,
        model_max_length=preset.model.max_position_embeddings,
    )
    model = build_model(preset.model, tokenizer=tokenizer)
    passages = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in corpus]
    warmup = induction_warmup(
        model,
        preset.warmup,
        seed=stage_seed(preset.seed, "tiny-warmup"),
        passages=passages,
        separator=tokenizer.convert_tokens_to_ids("Ġ"),
        log=log,
    )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    lengths = [
        len(
            tokenizer(
                str(
                    tokenizer.apply_chat_template(
                        [{"role": m["role"], "content": m["content"]} for m in c], tokenize=False
                    )
                )
            )["input_ids"]
        )
        for c in conversations[::2]
    ]
    manifest = {
        "tiny_config": preset.model.model_dump(),
        "tokenizer_size": len(tokenizer),
        "bpe_vocab_size": settings.vocab_size,
        "macro_tokens": len(macros),
        "parameters": sum(p.numel() for p in model.parameters()),
        "mean_conversation_tokens": round(sum(lengths) / max(1, len(lengths)), 1),
        "warmup": warmup,
    }
    (out / TINY_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(
        f"tiny: {manifest['parameters'] / 1e6:.2f}M parameters, {len(tokenizer)} tokens "
        f"({len(macros)} macro lines), {manifest['mean_conversation_tokens']} tokens/conversation"
    )
    return manifest


def induction_warmup(
    model: Any,
    settings: Any,
    *,
    seed: int,
    passages: Sequence[Sequence[int]] = (),
    separator: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Teach a random model to copy from its context (see `WarmupSettings`): a token span,
    filler, the span again, next-token loss on the repeat, AdamW, bf16 autocast on CPU. A share
    `settings.text_share` of the rows are windows of `passages` (tokenized corpus text), the
    others random tokens of `[token_low, token_high)`."""
    if settings.steps <= 0:
        return {"steps": 0}
    import torch

    rng = random.Random(seed)
    low = settings.token_low
    high = min(settings.token_high, int(model.get_input_embeddings().num_embeddings))
    if high - low < 2:
        raise StageError(f"warm-up token range [{low}, {high}) is empty")
    device = next(iter(model.parameters())).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    model.train()
    clock = time.perf_counter()
    first = last = float("nan")
    n = settings.length
    long_enough = [list(p) for p in passages if len(p) >= n]

    def row() -> list[int]:
        draw = rng.random()
        if long_enough and draw < settings.text_share:
            passage = rng.choice(long_enough)
            start = rng.randrange(len(passage) - n + 1)
            return passage[start : start + n]
        if separator is not None and draw < settings.text_share + settings.spaced_share:
            # words of 1-3 random tokens between separators, as text is tokenized: copying
            # them needs to look past the separator (the token before it is what identifies)
            tokens: list[int] = []
            while len(tokens) < n:
                tokens += [rng.randrange(low, high) for _ in range(rng.randint(1, 3))]
                tokens.append(separator)
            return tokens[:n]
        return [rng.randrange(low, high) for _ in range(n)]

    def example() -> tuple[list[int], list[int]]:
        # span, filler, span again: spans of varied length at varied distances, so the model
        # learns to find the earlier occurrence (induction), not a fixed offset
        span = row()[: rng.randint(max(2, n // 4), n)]
        filler = [rng.randrange(low, high) for _ in range(rng.randint(0, n // 2))]
        prefix = span + filler
        return prefix + span, [-100] * len(prefix) + span

    for step in range(settings.steps):
        batch = [example() for _ in range(settings.batch_size)]
        width = max(len(tokens) for tokens, _ in batch)
        # right padding needs no attention mask: a causal model never looks ahead
        ids = torch.tensor(
            [tokens + [0] * (width - len(tokens)) for tokens, _ in batch], device=device
        )
        labels = torch.tensor(
            [target + [-100] * (width - len(target)) for _, target in batch], device=device
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cpu"):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())
        first = value if step == 0 else first
        last = value
    model.eval()
    summary = {
        "steps": settings.steps,
        "first_loss": round(first, 4),
        "final_loss": round(last, 4),
        "seconds": round(time.perf_counter() - clock, 1),
    }
    log(f"tiny: induction warm-up {settings.steps} steps, copy loss {first:.2f} -> {last:.3f}")
    return summary


# =========================================================================== evaluation


def greedy_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy completions of a left-padded batch, cut at eos or a protocol stop token."""
    import torch
    from transformers import GenerationConfig

    from qpa.train.rl import stop_token_ids, trim_completion

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = [tokenizer.eos_token_id, *(stop_token_ids(tokenizer) or [])]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids) :] = 1
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=stops,
        use_cache=True,
    )
    device = next(iter(model.parameters())).device
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
        )
    return [trim_completion(row, stops, pad) for row in output[:, width:].tolist()]


def run_episodes(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    harness: HarnessConfig,
    *,
    label: str,
    max_new_tokens: int = 96,
    workers: int = 64,
) -> list[Trajectory]:
    """One greedy episode per task through the Harness; model calls of all live episodes are
    answered by one batched `generate` (`qpa.train.rl.TokenBatcher`), in task order."""
    from qpa.envs.factory import make_env
    from qpa.harness.agent import HarnessPlanner
    from qpa.harness.runner import run_episode
    from qpa.train.rl import PolicyBackend, TokenBatcher

    if not tasks:
        return []
    was_training = bool(getattr(model, "training", False))
    model.eval()
    batcher = TokenBatcher(
        lambda prompts: greedy_generate(model, tokenizer, prompts, max_new_tokens), workers
    )
    skills = harness.skill_library()
    policy = Policy(planner="local", model=label, harness_version=harness.version)
    results: list[Trajectory | None] = [None] * len(tasks)
    queue = deque(enumerate(tasks))
    queue_lock, token_lock = threading.Lock(), threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while True:
                with queue_lock:
                    if not queue:
                        return
                    index, task = queue.popleft()
                backend = PolicyBackend.from_loaded(
                    model, tokenizer, name=label, max_new_tokens=max_new_tokens
                ).bind(batcher, order=(index, 0), max_prompt_tokens=None, token_lock=token_lock)
                planner = HarnessPlanner(backend, harness, skills=skills)
                env = make_env("sandbox")
                try:
                    results[index] = run_episode(
                        env, task, planner, policy=policy, budgets=harness.budgets()
                    )
                finally:
                    with contextlib.suppress(Exception):
                        env.close()
                    with contextlib.suppress(Exception):
                        planner.memory.close()
        except BaseException as exc:  # a worker bug must not hang the batcher
            errors.append(exc)
        finally:
            batcher.leave()

    count = min(workers, len(tasks))
    batcher.enter(count)
    threads = [threading.Thread(target=work, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        batcher.serve()
    finally:
        for thread in threads:
            thread.join()
        model.train(was_training)
    if errors:
        raise errors[0]
    if batcher.failure is not None:
        raise StageError(f"evaluation of {label}: generation failed: {batcher.failure}")
    return [t for t in results if t is not None]


def load_model(model_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a checkpoint folder, fp32 on CPU (GPU when present)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True, dtype=torch.float32
    )
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    return model, tokenizer


def summarize(report: Any, diagnosis: Any) -> dict[str, Any]:
    """The numbers the loop reports for one evaluation (a bench `Report` + a diagnosis)."""
    return {
        "split": report.split,
        "tasks": report.tasks,
        "success": round(report.overall, 6),
        "by_capability": {c: round(g.success, 6) for c, g in report.by_capability.items()},
        "by_template": _by_template(report),
        "output_tokens_per_solved_task": (
            round(report.output_tokens_per_success, 3)
            if report.output_tokens_per_success is not None
            else None
        ),
        "output_tokens_per_task": round(report.output_tokens_per_task, 3),
        "tool_calls_per_task": round(report.tool_calls, 3),
        "harness_version": report.policy.harness_version,
        "diagnosis": {side: int(n) for side, n in diagnosis.by_side.items()},
        "diagnosis_by_cause": dict(sorted(diagnosis.by_cause.items())),
        "failures": diagnosis.failures,
    }


def _by_template(report: Any) -> dict[str, float]:
    rates: dict[str, list[float]] = defaultdict(list)
    for task_id, outcome in report.per_task.items():
        parts = task_id.split(".")
        rates[parts[1] if len(parts) > 1 else task_id].append(outcome.rate)
    return {k: round(sum(v) / len(v), 6) for k, v in sorted(rates.items())}


def evaluate(
    model_dir: Path,
    tasks: Sequence[Task],
    harness: HarnessConfig,
    out: Path,
    *,
    label: str,
    max_new_tokens: int = 96,
    workers: int = 64,
    loaded: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint on `tasks`: `out/trajectories.jsonl`, the bench report
    (`report.json`, `report.md`: `qpa.bench.scoring.score`) and the diagnosis
    (`diagnosis.json`, `diagnosis.md`: `qpa.diagnose`); returns `summarize(...)`."""
    from qpa.bench.report import write_report
    from qpa.bench.scoring import score
    from qpa.diagnose import diagnose_dir

    model, tokenizer = loaded if loaded is not None else load_model(model_dir)
    trajectories = run_episodes(
        model,
        tokenizer,
        tasks,
        harness,
        label=label,
        max_new_tokens=max_new_tokens,
        workers=workers,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "trajectories.jsonl", trajectories)
    report = score(trajectories, samples=1, expected_tasks=[t.id for t in tasks])
    write_report(report, out, plots=False)
    diagnosis = diagnose_dir(out)
    return summarize(report, diagnosis)


def _evaluate_splits(
    ctx: StageContext,
    model_dir: Path,
    harness: HarnessConfig,
    label: str,
    splits: Sequence[str],
) -> dict[str, Any]:
    loaded = load_model(model_dir)
    outputs: dict[str, Any] = {"model": ctx.rel(model_dir), "harness": harness.model_dump()}
    for split in splits:
        summary = evaluate(
            model_dir,
            curriculum(ctx.preset, split),
            harness,
            ctx.dir / split,
            label=label,
            max_new_tokens=ctx.preset.eval.max_new_tokens,
            workers=ctx.preset.eval.workers,
            loaded=loaded,
        )
        summary["report"] = ctx.rel(ctx.dir / split / "report.json")
        summary["trajectories"] = ctx.rel(ctx.dir / split / "trajectories.jsonl")
        outputs[split] = summary
        ctx.log(
            f"{label} on {split}: {summary['success']:.0%} success, "
            f"failures by side {summary['diagnosis']}"
        )
    return outputs


# =========================================================================== Harness revision


@dataclass
class Revision:
    """A Harness revision: the new config and why each setting changed."""

    config: HarnessConfig
    changes: list[dict[str, Any]] = field(default_factory=list)
    unaddressed: dict[str, int] = field(default_factory=dict)


def _exposure(harness: HarnessConfig, task: Task, library: Any) -> Any:
    from qpa.envs.sandbox import SandboxEnv
    from qpa.harness.adapter import ScenarioAdapter

    env = SandboxEnv()
    try:
        env.reset(task)
        tools = list(env.tools())
    finally:
        env.close()
    adapter = ScenarioAdapter(
        library,
        token_budget=harness.token_budget,
        max_tools=harness.max_tools,
        drop_skills=set(harness.drop_skills),
    )
    return adapter.select(task.instruction, tools)


def _smallest(values: Iterable[int], ok: Callable[[int], bool], default: int) -> int:
    for value in values:
        if ok(value):
            return value
    return default


def revise_harness(
    current: HarnessConfig,
    failures: Sequence[tuple[Task, str]],
    settings: Any,
) -> Revision:
    """Turn Harness-side failures (task, cause) into the next Harness version.

    The diagnosis reports the first Harness gap of a failure (a missing tool hides a missing
    Skill behind it), so every gap of the failed tasks is closed, the adapter simulated on each
    task's scenario:

    - tools: `max_tools` becomes the smallest value exposing every reference-plan tool;
    - Skills: `token_budget` becomes the smallest budget (steps of 50) at which the adapter
      injects every Skill the task needs (`qpa.diagnose.skills_needed`);
    - `memory_retrieval_miss`: `memory_k` grows by 2; `budget_cut`: `max_turns` covers the
      longest reference plan plus 2 recovery turns.

    Other Harness-side causes (a parser or guard rejection) have no setting to turn: they are
    counted in `unaddressed` for a person to look at. Limits come from `RevisionSettings`.
    """
    from qpa.diagnose import skills_needed
    from qpa.harness.skills import bump_version

    library = current.skill_library()
    causes = Counter(cause for _, cause in failures)
    update: dict[str, Any] = {}
    changes: list[dict[str, Any]] = []
    max_tools = current.max_tools
    # The diagnosis names the first Harness gap it finds (tools before Skills); a fix must close
    # every gap of those tasks, or the next diagnosis only finds the one behind it.
    tasks = list({t.id: t for t, _ in failures}.values())

    def missing_tools(config: HarnessConfig, task: Task) -> list[str]:
        names = set(_exposure(config, task, library).tool_names)
        return [
            a.tool
            for a in task.reference_plan or []
            if isinstance(a, ToolCall) and a.tool not in names
        ]

    def missing_skills(config: HarnessConfig, task: Task) -> list[str]:
        needed = skills_needed(task)
        if not needed:
            return []
        exposed = set(_exposure(config, task, library).skill_ids)
        return [s for s in needed if s not in exposed]

    tool_tasks = [t for t in tasks if missing_tools(current, t)]
    if tool_tasks and max_tools is not None:
        start = max_tools

        def tools_ok(n: int) -> bool:
            trial = current.model_copy(update={"max_tools": n})
            return not any(missing_tools(trial, t) for t in tool_tasks)

        max_tools = _smallest(
            range(start + 1, settings.max_tools_cap + 1), tools_ok, settings.max_tools_cap
        )
        update["max_tools"] = max_tools
        changes.append(
            {
                "setting": "max_tools",
                "from": start,
                "to": max_tools,
                "cause": "tool_not_exposed",
                "failures": causes["tool_not_exposed"],
                "tasks": len(tool_tasks),
                "tools": sorted({n for t in tool_tasks for n in missing_tools(current, t)}),
                "why": "the reference plan's tools were cut by the adapter's tool cap",
            }
        )
    widened = current.model_copy(update={"max_tools": max_tools})
    skill_tasks = [t for t in tasks if missing_skills(widened, t)]
    if skill_tasks:
        start = current.token_budget

        def skills_ok(budget: int) -> bool:
            trial = widened.model_copy(update={"token_budget": budget})
            return not any(missing_skills(trial, t) for t in skill_tasks)

        budgets = range(start + 50, settings.token_budget_cap + 1, 50)
        budget = _smallest(budgets, skills_ok, settings.token_budget_cap)
        update["token_budget"] = budget
        needed = sorted({s for t in skill_tasks for s in missing_skills(widened, t)})
        changes.append(
            {
                "setting": "token_budget",
                "from": start,
                "to": budget,
                "cause": "skill_not_injected",
                "failures": causes["skill_not_injected"],
                "tasks": len(skill_tasks),
                "skills": needed,
                "why": "Skills the tasks need did not fit the adapter's budget",
            }
        )
    if causes["memory_retrieval_miss"]:
        k = min(settings.memory_k_cap, current.memory_k + 2)
        update["memory_k"] = k
        changes.append(
            {
                "setting": "memory_k",
                "from": current.memory_k,
                "to": k,
                "cause": "memory_retrieval_miss",
                "failures": causes["memory_retrieval_miss"],
                "why": "a remembered value the step needed was not retrieved",
            }
        )
    if causes["budget_cut"]:
        longest = max(len(t.reference_plan or []) for t, c in failures if c == "budget_cut")
        turns = min(settings.max_turns_cap, max(current.max_turns, longest + 2))
        if turns != current.max_turns:
            update["max_turns"] = turns
            changes.append(
                {
                    "setting": "max_turns",
                    "from": current.max_turns,
                    "to": turns,
                    "cause": "budget_cut",
                    "failures": causes["budget_cut"],
                    "why": "the turn budget cut episodes that were on track",
                }
            )
    handled = {"tool_not_exposed", "skill_not_injected", "memory_retrieval_miss", "budget_cut"}
    unaddressed = {c: n for c, n in sorted(causes.items()) if c not in handled}
    version = bump_version(current.version) if changes else current.version
    config = current.model_copy(update={**update, "version": version})
    return Revision(config=config, changes=changes, unaddressed=unaddressed)


def harness_failures(trajectories_path: Path) -> list[tuple[Task, str]]:
    """(task, cause) of every Harness-side failure among the trajectories."""
    from qpa.diagnose import diagnose

    out: list[tuple[Task, str]] = []
    for trajectory in read_trajectories(trajectories_path):
        found = diagnose(trajectory)
        if found is not None and found.side == "harness":
            out.append((trajectory.task, found.cause))
    return out


# =========================================================================== data helpers


def _automatic_review() -> Any:
    from qpa.data.review import ReviewConfig

    return ReviewConfig(gate="automatic", sample_size=20)


def _generate(
    ctx: StageContext,
    out: Path,
    *,
    count: int,
    per_cell: int,
    seed: int,
    existing: Sequence[Task],
    weakness: Any = None,
    weak_threshold: float = 0.7,
    weak_boost: float = 2.0,
    parents: Sequence[str] = (),
    per_template: bool = False,
) -> tuple[list[Task], dict[str, Any]]:
    """Tasks for the curriculum's templates (`plan_generation` + `generate_tasks`), written
    with their plan and an (automatic) review queue to `out`. `per_template`: `count` is per
    template and every template gets its share (`plan_per_template`)."""
    from qpa.data.generate import (
        CoverageTarget,
        generate_tasks,
        plan_generation,
        plan_per_template,
        write_generated,
    )
    from qpa.envs.sandbox.suite import all_templates
    from qpa.store import open_store

    templates = {n: t for n, t in all_templates().items() if n in set(ctx.preset.tasks.templates)}
    target = CoverageTarget(
        suite=ctx.preset.suite,
        per_cell=per_cell,
        weak_threshold=weak_threshold,
        weak_boost=weak_boost,
        include_canonical_train=False,
    )
    if per_template:
        plan = plan_per_template(target, count=count, existing=existing, templates=templates)
    else:
        plan = plan_generation(
            target, existing=existing, weakness=weakness, count=count, templates=templates
        )
    result = generate_tasks(plan, seed=seed, existing=existing, suite=ctx.preset.suite)
    store = open_store(out)
    manifest = write_generated(
        store,
        result,
        target=target,
        parents=list(parents),
        review=_automatic_review(),
        name=out.name,
    )
    picks = Counter(p.template for p in plan.picks)
    summary = {
        "tasks": len(result.tasks),
        "dropped": len(result.dropped),
        "picks_by_template": dict(sorted(picks.items())),
        "by_capability": result.summary()["by_capability"],
        "reasons": plan.reasons,
        "manifest": ctx.rel(out / "manifest.json"),
        "tasks_file": ctx.rel(out / "tasks.jsonl"),
        "lineage_tasks_sha256": manifest.lineage.tasks_sha256,
    }
    return result.tasks, summary


def _collect(
    tasks: Sequence[Task],
    out: Path,
    planner: str,
    *,
    samples: int,
    noise: float,
    seed: int,
    concurrency: int,
    max_turns: int,
) -> dict[str, Any]:
    from qpa.data.collect import collect
    from qpa.harness.factory import PlannerSpec

    spec = PlannerSpec(name=planner, noise=noise, seed=seed)
    result = collect(
        list(tasks),
        spec,
        samples=samples,
        out=str(out),
        concurrency=concurrency,
        spool_dir=out.parent / f".spool-{out.name}",
        max_turns=max_turns,
        flush_timeout_s=60.0,
        name=out.name,
    )
    if not result.complete:
        raise StageError(f"collection into {out} did not complete")
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest.get("counts", {})
    return {
        "trajectories": int(counts.get("trajectories", result.total)),
        "successes": int(counts.get("successes", result.successes)),
    }


def _curate(inputs: Sequence[Path], out: Path) -> dict[str, Any]:
    """Curate the trajectories of `inputs` together. Episodes of different collections share
    ids (`<task>#<sample>`); a later collection's are renamed `<id>~<folder>` so curation keeps
    both instead of rejecting the second as a duplicate."""
    from qpa.data.curate import curate, load_trajectories, write_curated
    from qpa.store import open_store

    trajectories: list[Trajectory] = []
    seen: set[str] = set()
    for path in inputs:
        for trajectory in load_trajectories([str(path)]):
            if trajectory.id in seen:
                trajectory = trajectory.model_copy(update={"id": f"{trajectory.id}~{path.name}"})
            seen.add(trajectory.id)
            trajectories.append(trajectory)
    result = curate(trajectories)
    write_curated(
        open_store(out),
        result,
        inputs=[str(p) for p in inputs],
        review=_automatic_review(),
        name=out.name,
    )
    return result.summary()


def _mix(
    ctx: StageContext,
    curated: Sequence[Path],
    out: Path,
    *,
    target_size: int,
    harness: HarnessConfig,
    include_failures: bool,
    harness_variants: Sequence[HarnessConfig] = (),
    report: Any = None,
    report_ref: str | None = None,
    weak_threshold: float = 0.7,
    weak_boost: float = 2.0,
) -> Any:
    from qpa.data.mix import Adaptive, MixConfig, Weights, mix
    from qpa.data.review import publish
    from qpa.store import open_store

    settings = ctx.preset.mix
    config = MixConfig(
        target_size=target_size,
        seed=ctx.seed,
        weights=Weights(
            capability=dict(settings.capability_weights),
            difficulty=dict(settings.difficulty_weights),
            source=dict(settings.source_weights),
        ),
        adaptive=Adaptive(weak_threshold=weak_threshold, weak_boost=weak_boost),
        include_failures=include_failures,
        harness=harness,
        harness_variants=list(harness_variants),
    )
    store = open_store(out)
    result = mix(
        store,
        [str(p) for p in curated],
        config,
        report=report,
        report_ref=report_ref,
        review=_automatic_review(),
        name=out.name,
    )
    publish(store, _automatic_review())
    return result


# =========================================================================== the stages


def stage_tiny(ctx: StageContext) -> dict[str, Any]:
    out = ctx.dir / "checkpoint"
    manifest = make_checkpoint(ctx.preset, out, log=ctx.log)
    return {"checkpoint": ctx.rel(out), **manifest}


def stage_tasks(ctx: StageContext) -> dict[str, Any]:
    canonical = curriculum(ctx.preset, "train")
    settings = ctx.preset.tasks
    generated, summary = _generate(
        ctx,
        ctx.dir / "generated",
        count=settings.generated_per_template,
        per_cell=settings.per_cell,
        seed=1 + ctx.preset.seed * 1000,
        existing=canonical,
        per_template=True,
    )
    train = [*canonical, *generated]
    write_jsonl(ctx.dir / "train_tasks.jsonl", train)
    ctx.log(f"tasks: {len(canonical)} canonical + {len(generated)} generated train tasks")
    return {
        "train_tasks": ctx.rel(ctx.dir / "train_tasks.jsonl"),
        "canonical": len(canonical),
        "generated": summary,
        "count": len(train),
        "validation": len(curriculum(ctx.preset, "validation")),
        "test": len(curriculum(ctx.preset, "test")),
    }


def stage_collect(ctx: StageContext) -> dict[str, Any]:
    tasks = read_task_file(ctx.path(ctx.output("tasks", "train_tasks")))
    settings = ctx.preset.collect
    outputs: dict[str, Any] = {}
    runs = [("oracle", settings.oracle_samples), ("noisy", settings.noisy_samples)]
    for planner, samples in runs:
        if samples < 1:
            continue
        out = ctx.dir / planner
        counts = _collect(
            tasks,
            out,
            planner,
            samples=samples,
            noise=settings.noise,
            seed=ctx.seed,
            concurrency=settings.concurrency,
            max_turns=settings.max_turns,
        )
        outputs[planner] = {"uri": ctx.rel(out), **counts}
        ctx.log(f"collect {planner}: {counts['successes']}/{counts['trajectories']} succeeded")
    return outputs


def stage_curate(ctx: StageContext) -> dict[str, Any]:
    inputs = [
        ctx.path(ctx.inputs["collect"][p]["uri"])
        for p in ("oracle", "noisy")
        if p in ctx.inputs["collect"]
    ]
    summary = _curate(inputs, ctx.dir / "curated")
    ctx.log(
        f"curate: {summary['successes']} successes, {summary['failures']} failures kept "
        f"({summary['failures_by_side']})"
    )
    return {"curated": ctx.rel(ctx.dir / "curated"), **summary}


def stage_mix(ctx: StageContext) -> dict[str, Any]:
    settings = ctx.preset.mix
    out = ctx.dir / "mixture"
    result = _mix(
        ctx,
        [ctx.path(ctx.output("curate", "curated"))],
        out,
        target_size=settings.target_size,
        harness=ctx.preset.harness,
        include_failures=settings.include_failures,
        harness_variants=harness_ladder(ctx.preset) if settings.harness_variants else [],
    )
    manifest = result.manifest
    ctx.log(f"mix: {result.rows} rows from {manifest.counts.get('drawn', 0)} trajectories")
    return {
        "dataset": ctx.rel(out / "dataset"),
        "manifest": ctx.rel(out / "manifest.json"),
        "rows": result.rows,
        "weights": dict(manifest.weights),
        "counts": dict(manifest.counts),
        "harness_version": ctx.preset.harness.version,
    }


def stage_eval_untrained(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("tiny", "checkpoint"))
    return _evaluate_splits(ctx, model_dir, ctx.preset.harness, "untrained", ["test"])


def stage_sft(ctx: StageContext) -> dict[str, Any]:
    import torch

    from qpa.train.config import CheckpointSettings, MetricsSettings, SFTConfig
    from qpa.train.sft import train_sft

    settings = ctx.preset.sft
    trl: dict[str, Any] = {}
    if not torch.cuda.is_available():
        trl["use_cpu"] = True  # bf16 autocast on CPU needs it
    config = SFTConfig(
        name="loop-sft",
        model=str(ctx.path(ctx.output("tiny", "checkpoint"))),
        dataset=str(ctx.path(ctx.output("mix", "dataset"))),
        output_dir=str(ctx.dir / "run"),
        max_length=settings.max_length,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=settings.warmup,
        max_steps=settings.max_steps,
        seed=ctx.seed,
        bf16=settings.bf16,
        metrics=MetricsSettings(logging_steps=10),
        checkpoint=CheckpointSettings(
            every_steps=settings.checkpoint_every, keep_last=1, resume="auto"
        ),
        trl=trl,
    )
    result = train_sft(config)
    if result.final_dir is None:
        raise StageError("sft: no final model was saved")
    ctx.log(
        f"sft: {result.global_step} steps, loss {result.train_loss:.3f}, "
        f"{result.tokens_per_second:.0f} tokens/s"
    )
    return {
        "checkpoint": ctx.rel(Path(result.final_dir)),
        "steps": result.global_step,
        "train_loss": result.train_loss,
        "tokens": result.tokens,
        "tokens_per_second": round(result.tokens_per_second, 1),
        "resumed_from": result.resumed_from,
        "metrics": ctx.rel(Path(result.metrics_path)) if result.metrics_path else None,
        "last_loss": _last_loss(Path(result.metrics_path)) if result.metrics_path else None,
        "data": result.stats.model_dump(),
    }


def _last_loss(path: Path) -> float | None:
    last: float | None = None
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(line).get("loss")
                if isinstance(value, (int, float)):
                    last = round(float(value), 4)
    return last


def stage_eval_sft(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("sft", "checkpoint"))
    return _evaluate_splits(ctx, model_dir, ctx.preset.harness, "sft", ["validation", "test"])


def stage_harness_revision(ctx: StageContext) -> dict[str, Any]:
    current = ctx.preset.harness
    validation = ctx.inputs["eval_sft"]["validation"]
    failures = harness_failures(ctx.path(validation["trajectories"]))
    revision = revise_harness(current, failures, ctx.preset.revision)
    path = ctx.dir / f"{revision.config.version}.yaml"
    import yaml

    path.write_text(
        "# Harness revision written by `qpa loop` from the validation diagnosis\n"
        + yaml.safe_dump(revision.config.model_dump(mode="json"), sort_keys=False)
    )
    for change in revision.changes:
        ctx.log(
            f"harness: {change['setting']} {change['from']} -> {change['to']} "
            f"({change['cause']} on {change['tasks']} failed validation tasks)"
        )
    return {
        "from": current.version,
        "to": revision.config.version,
        "harness": revision.config.model_dump(mode="json"),
        "config_file": ctx.rel(path),
        "changes": revision.changes,
        "unaddressed": revision.unaddressed,
        "harness_failures": len(failures),
        "harness_failures_by_cause": dict(sorted(Counter(c for _, c in failures).items())),
    }


def revised_harness(ctx: StageContext) -> HarnessConfig:
    return HarnessConfig.model_validate(ctx.output("harness_revision", "harness"))


def stage_eval_harness(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("sft", "checkpoint"))
    harness = revised_harness(ctx)
    return _evaluate_splits(ctx, model_dir, harness, "sft", ["validation", "test"])


def stage_round2(ctx: StageContext) -> dict[str, Any]:
    from qpa.bench.gate import load_report
    from qpa.data.generate import Weakness

    settings = ctx.preset.round2
    harness = revised_harness(ctx)
    report_ref = ctx.path(ctx.inputs["eval_harness"]["validation"]["report"])
    report = load_report(report_ref)
    weakness = Weakness.from_report(report, source=str(report_ref))
    # New variants are unique against the canonical suite only, not round 1's: a template's
    # variant space can be small (a memory task's values come from the user's memory), and
    # round 1 may have used all of it. The generator never reproduces a test-split task.
    existing = curriculum(ctx.preset, "train")
    generated, summary = _generate(
        ctx,
        ctx.dir / "generated",
        count=settings.count,
        per_cell=settings.per_cell,
        seed=2 + ctx.preset.seed * 1000,
        existing=existing,
        weakness=weakness,
        weak_threshold=settings.weak_threshold,
        weak_boost=settings.weak_boost,
        parents=[str(report_ref)],
    )
    if not generated:
        raise StageError("round2: no task was generated")
    collected = _collect(
        generated,
        ctx.dir / "oracle",
        "oracle",
        samples=1,
        noise=0.0,
        seed=ctx.seed,
        concurrency=ctx.preset.collect.concurrency,
        max_turns=ctx.preset.collect.max_turns,
    )
    curated = _curate([ctx.dir / "oracle"], ctx.dir / "curated")
    result = _mix(
        ctx,
        [ctx.dir / "curated"],
        ctx.dir / "mixture",
        target_size=settings.target_size,
        harness=harness,
        include_failures=False,
        report=report,
        report_ref=str(report_ref),
        weak_threshold=settings.weak_threshold,
        weak_boost=settings.weak_boost,
    )
    pool: list[Task] = []
    for item in result.plan.drawn:
        pool += [item.trajectory.task] * item.copies
    pool.sort(key=lambda t: t.id)
    write_jsonl(ctx.dir / "rl_pool.jsonl", pool)
    weights = dict(result.manifest.weights)
    pool_caps = Counter(c for t in pool for c in t.capabilities)
    ctx.log(
        "round 2: validation "
        + ", ".join(f"{c} {s:.0%}" for c, s in weakness.capability.items())
        + " -> mixture weights "
        + ", ".join(
            f"{k.split('.', 1)[1]} x{v:g}"
            for k, v in weights.items()
            if k.startswith("capability.")
        )
    )
    return {
        "validation_report": ctx.rel(report_ref),
        "validation_by_capability": {k: round(v, 6) for k, v in weakness.capability.items()},
        "validation_by_template": {k: round(v, 6) for k, v in weakness.template.items()},
        "generated": summary,
        "collected": collected,
        "curated": {k: v for k, v in curated.items() if isinstance(v, (int, dict))},
        "mixture": ctx.rel(ctx.dir / "mixture" / "manifest.json"),
        "mixture_weights": weights,
        "mixture_reasons": list(result.manifest.reasons)[:50],
        "rl_pool": ctx.rel(ctx.dir / "rl_pool.jsonl"),
        "rl_pool_size": len(pool),
        "rl_pool_by_capability": dict(sorted(pool_caps.items())),
        "rl_pool_by_template": dict(sorted(Counter(t.template or "" for t in pool).items())),
    }


def rl_config(
    ctx_dir: Path,
    preset: LoopPreset,
    model: Path,
    harness: HarnessConfig,
    *,
    seed: int,
    care: bool = True,
    name: str = "loop-rl",
) -> Any:
    """The `RLConfig` of the loop's RL stage (also used by `benchmarks/care_vs_vanilla.py`)."""
    from qpa.train.config import CheckpointSettings, MetricsSettings
    from qpa.train.rl import (
        CareSettings,
        GenerationSettings,
        LossSettings,
        OptimSettings,
        RLConfig,
    )

    settings = preset.rl
    return RLConfig(
        name=name,
        model=str(model),
        output_dir=str(ctx_dir),
        steps=settings.steps,
        tasks_per_step=settings.tasks_per_step,
        samples_per_task=settings.samples_per_task,
        seed=seed,
        harness=harness,
        generation=GenerationSettings(
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            workers=64,
            max_batch=64,
        ),
        loss=LossSettings(
            clip_high=settings.clip_high,
            micro_batch_size=settings.micro_batch_size,
        ),
        optim=OptimSettings(
            learning_rate=settings.learning_rate, warmup_steps=settings.warmup_steps
        ),
        care=CareSettings(
            enabled=care,
            low=settings.care.low,
            high=settings.care.high,
            progress_weight=settings.care.progress_weight,
            token_weight=settings.care.token_weight,
            call_weight=settings.care.call_weight,
            anchor=settings.care.anchor,
        ),
        checkpoint=CheckpointSettings(
            every_steps=settings.checkpoint_every, keep_last=1, resume="auto"
        ),
        metrics=MetricsSettings(logging_steps=1),
    )


def train_rl(
    out: Path,
    preset: LoopPreset,
    model: Path,
    harness: HarnessConfig,
    pool: Sequence[Task],
    *,
    seed: int,
    care: bool = True,
) -> dict[str, Any]:
    """Run RL (CARE or vanilla GRPO) and summarize its history."""
    from qpa.train.rl import run_rl

    config = rl_config(out, preset, model, harness, seed=seed, care=care)
    result = run_rl(config, tasks=list(pool))
    if result.final_dir is None:
        raise StageError("rl: no final model was saved")
    by_step: dict[int, dict[str, Any]] = {}
    metrics_path = out / "metrics.jsonl"
    if metrics_path.exists():  # every step, also those of an interrupted attempt
        for line in metrics_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    by_step[record["step"]] = record
    history = [by_step[k] for k in sorted(by_step)] or [dict(h) for h in result.history]
    tiers: dict[str, float] = defaultdict(float)
    for record in history:
        for tier, share in (record.get("care_tiers") or {}).items():
            tiers[tier] += float(share)

    def series(key: str, digits: int) -> list[float]:
        return [round(float(h.get(key, 0.0)), digits) for h in history]

    return {
        "checkpoint": str(result.final_dir),
        "steps": result.final_step,
        "resumed_from": result.resumed_from,
        "care": care,
        "success_rate_by_step": series("success_rate", 4),
        "progress_by_step": series("progress", 4),
        "output_tokens_by_step": series("output_tokens_mean", 2),
        "reward_by_step": series("reward", 4),
        "advantage_abs_by_step": series("advantage_abs", 4),
        "updated_steps": sum(1 for h in history if float(h.get("micro_batches", 0.0)) > 0),
        "care_tier_share": {
            t: round(v / max(1, len(history)), 4) for t, v in sorted(tiers.items())
        },
    }


def stage_rl(ctx: StageContext) -> dict[str, Any]:
    pool = read_task_file(ctx.path(ctx.output("round2", "rl_pool")))
    summary = train_rl(
        ctx.dir / "run",
        ctx.preset,
        ctx.path(ctx.output("sft", "checkpoint")),
        revised_harness(ctx),
        pool,
        seed=ctx.seed,
        care=True,
    )
    summary["checkpoint"] = ctx.rel(Path(summary["checkpoint"]))
    rates = summary["success_rate_by_step"]
    ctx.log(
        f"rl (CARE): {summary['steps']} steps, rollout success "
        f"{rates[0] if rates else 0:.0%} -> {rates[-1] if rates else 0:.0%}, "
        f"{summary['updated_steps']} steps with a gradient, "
        f"tier shares {summary['care_tier_share']}"
    )
    return summary


def stage_eval_rl(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("rl", "checkpoint"))
    return _evaluate_splits(ctx, model_dir, revised_harness(ctx), "rl", ["validation", "test"])


STAGES: tuple[Stage, ...] = (
    Stage(
        "tiny",
        "build the tiny model",
        (),
        ("model", "tokenizer", "warmup", "tasks", "harness", "revision"),
        stage_tiny,
    ),
    Stage("tasks", "generate tasks", (), ("tasks",), stage_tasks),
    Stage("collect", "collect oracle + noisy", ("tasks",), ("collect",), stage_collect),
    Stage("curate", "curate (keep failures)", ("collect",), (), stage_curate),
    Stage("mix", "mix", ("curate",), ("mix", "harness", "revision"), stage_mix),
    Stage(
        "eval_untrained",
        "evaluate untrained (test)",
        ("tiny",),
        ("eval", "harness"),
        stage_eval_untrained,
    ),
    Stage("sft", "SFT", ("tiny", "mix"), ("sft",), stage_sft),
    Stage(
        "eval_sft", "evaluate SFT (validation, test)", ("sft",), ("eval", "harness"), stage_eval_sft
    ),
    Stage(
        "harness_revision",
        "diagnose -> Harness revision",
        ("eval_sft",),
        ("harness", "revision"),
        stage_harness_revision,
    ),
    Stage(
        "eval_harness",
        "evaluate Harness v2",
        ("sft", "harness_revision"),
        ("eval",),
        stage_eval_harness,
    ),
    Stage(
        "round2",
        "tasks for weaknesses",
        ("tasks", "eval_harness", "harness_revision"),
        ("round2", "collect", "mix"),
        stage_round2,
    ),
    Stage("rl", "RL with CARE", ("sft", "round2", "harness_revision"), ("rl",), stage_rl),
    Stage(
        "eval_rl",
        "evaluate RL (validation, test)",
        ("rl", "harness_revision"),
        ("eval",),
        stage_eval_rl,
    ),
)
"""The loop's stages in execution order (each one's inputs come before it)."""


def stage_by_name(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in STAGES)}")


def capabilities_of(preset: LoopPreset) -> list[str]:
    """The capabilities the preset's curriculum covers, in the canonical order."""
    from qpa.envs.sandbox.suite import all_templates

    templates = all_templates()
    covered = {c for name in preset.tasks.templates for c in templates[name].capabilities}
    return [c for c in CAPABILITIES if c in covered]


__all__ = [
    "MARKER",
    "STAGES",
    "Revision",
    "Stage",
    "StageContext",
    "StageError",
    "StageResult",
    "build_tokenizer",
    "capabilities_of",
    "curriculum",
    "evaluate",
    "greedy_generate",
    "harness_failures",
    "load_model",
    "macro_lines",
    "make_checkpoint",
    "read_marker",
    "revise_harness",
    "rl_config",
    "run_episodes",
    "run_stage",
    "seed_everything",
    "stage_by_name",
    "stage_key",
    "stage_seed",
    "train_rl",
]
