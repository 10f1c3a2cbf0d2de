"""Evaluate a local checkpoint: greedy episodes through the Harness, scored and diagnosed.

`evaluate` runs one greedy episode per task with the model answering through the Harness, the
model calls of all live episodes batched into one `generate` (`qpa.train.rl.TokenBatcher`), then
hands the trajectories to the benchmark (`qpa.bench.evaluate`: `trajectories.jsonl`, the report)
and the diagnosis (`qpa.diagnose`). `evaluate_sampled` runs k sampled episodes per task instead
(`temperature`, the full softmax) and scores them with k samples per task: its `overall` is
pass@1 estimated from k samples. The loop's eval stages and `benchmarks/care_ablation.py`
evaluate the checkpoints they train with it. Importing it never imports torch or transformers.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from qpa import progress
from qpa.bench.evaluate import score_episodes, summarize
from qpa.bench.report import write_report
from qpa.bench.scoring import score
from qpa.contract import Policy, Task, Trajectory, write_trajectories
from qpa.diagnose import diagnose_dir
from qpa.envs.factory import make_env
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.runner import run_episode
from qpa.train.rl import (
    GenerationSettings,
    PolicyBackend,
    TokenBatcher,
    hf_generate,
    stop_token_ids,
    trim_completion,
)


class EvaluationError(RuntimeError):
    """Generation failed during an evaluation (the message names the model's label)."""


def greedy_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy completions of a left-padded batch, cut at eos or a protocol stop token."""
    import torch
    from transformers import GenerationConfig

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


def run_batched(
    model: Any,
    tokenizer: Any,
    count: int,
    episode: Callable[[int, Any], Trajectory],
    *,
    label: str,
    max_new_tokens: int,
    workers: int,
    temperature: float | None = None,
    title: str = "eval",
) -> list[Trajectory]:
    """`count` episodes on `workers` threads whose model calls one batched `generate` answers
    (`qpa.train.rl.TokenBatcher`): greedy (`temperature` None) or sampled. `episode(i,
    backend)` runs episode i with a `PolicyBackend` bound to the batch (in order i, so a batch
    is the same whatever thread asks first); trajectories come back in index order."""
    if count == 0:
        return []
    was_training = bool(getattr(model, "training", False))
    model.eval()
    if temperature is None:
        batcher = TokenBatcher(
            lambda prompts: greedy_generate(model, tokenizer, prompts, max_new_tokens), workers
        )
    else:
        sampling = GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature)
        batcher = TokenBatcher(
            lambda prompts: hf_generate(model, tokenizer, prompts, sampling), workers
        )
    results: list[Trajectory | None] = [None] * count
    queue = deque(range(count))
    queue_lock, token_lock = threading.Lock(), threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while True:
                with queue_lock:
                    if not queue:
                        return
                    index = queue.popleft()
                backend = PolicyBackend.from_loaded(
                    model, tokenizer, name=label, max_new_tokens=max_new_tokens
                ).bind(batcher, order=(index, 0), max_prompt_tokens=None, token_lock=token_lock)
                results[index] = episode(index, backend)
                bar.advance()
        except BaseException as exc:  # a worker bug must not hang the batcher
            errors.append(exc)
        finally:
            batcher.leave()

    threads_count = min(workers, count)
    batcher.enter(threads_count)
    threads = [threading.Thread(target=work, daemon=True) for _ in range(threads_count)]
    with progress.track(f"{title} {label}", total=count, unit="episodes") as bar:
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
        raise EvaluationError(f"{title} of {label}: generation failed: {batcher.failure}")
    return [t for t in results if t is not None]


def run_episodes(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    harness: HarnessConfig,
    *,
    label: str,
    max_new_tokens: int = 96,
    workers: int = 64,
    samples: int = 1,
    temperature: float | None = None,
    wrap_env: Callable[[Any], Any] | None = None,
    on_trajectory: Callable[[Trajectory], object] | None = None,
    title: str = "eval",
) -> list[Trajectory]:
    """`samples` episodes per task through the Harness, greedy (`temperature` None) or sampled
    at `temperature`, batched (`run_batched`); trajectories in (task, sample) order.
    `wrap_env` wraps each episode's sandbox (fault injection), `on_trajectory` sees each
    trajectory as it ends."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    skills = harness.skill_library()
    policy = Policy(planner="local", model=label, harness_version=harness.version)
    jobs = [(task, sample) for task in tasks for sample in range(samples)]

    def episode(index: int, backend: Any) -> Trajectory:
        task, sample = jobs[index]
        planner = HarnessPlanner(backend, harness, skills=skills)
        env = make_env("sandbox")
        if wrap_env is not None:
            env = wrap_env(env)
        try:
            trajectory = run_episode(
                env, task, planner, policy=policy, sample=sample, budgets=harness.budgets()
            )
        finally:
            with contextlib.suppress(Exception):
                env.close()
            with contextlib.suppress(Exception):
                planner.memory.close()
        if on_trajectory is not None:
            on_trajectory(trajectory)
        return trajectory

    return run_batched(
        model,
        tokenizer,
        len(jobs),
        episode,
        label=label,
        max_new_tokens=max_new_tokens,
        workers=workers,
        temperature=temperature,
        title=title,
    )


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
    (`report.json`, `report.md`: `qpa.bench.evaluate.score_episodes`) and the diagnosis
    (`diagnosis.json`, `diagnosis.md`: `qpa.diagnose`); returns `summarize(...)`."""
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
    report = score_episodes(trajectories, tasks, out)
    diagnosis = diagnose_dir(out)
    return summarize(report, diagnosis)


def evaluate_sampled(
    model_dir: Path,
    tasks: Sequence[Task],
    harness: HarnessConfig,
    out: Path,
    *,
    label: str,
    samples: int,
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    workers: int = 64,
    loaded: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """`samples` sampled episodes per task: `out/trajectories.jsonl` and the bench report of
    `samples` samples per task (`report.json`, `report.md`; its `overall` is pass@1 estimated
    from them, its `pass_at_k` up to k). Returns the numbers the loop reports."""
    model, tokenizer = loaded if loaded is not None else load_model(model_dir)
    trajectories = run_episodes(
        model,
        tokenizer,
        tasks,
        harness,
        label=label,
        max_new_tokens=max_new_tokens,
        workers=workers,
        samples=samples,
        temperature=temperature,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_trajectories(out / "trajectories.jsonl", trajectories)
    report = score(trajectories, samples=samples, expected_tasks=[t.id for t in tasks])
    write_report(report, out, plots=False)
    return {
        "tasks": report.tasks,
        "samples": samples,
        "temperature": temperature,
        "episodes": len(trajectories),
        "pass_at_1": round(report.overall, 6),
        "complete": report.complete,
    }


__all__ = [
    "EvaluationError",
    "evaluate",
    "evaluate_sampled",
    "greedy_generate",
    "load_model",
    "run_episodes",
]
