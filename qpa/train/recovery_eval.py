"""Recovery rate of a local checkpoint: greedy episodes with one injected transient error each.

`evaluate_recovery(model_dir, tasks, harness, out, label=...)` runs one greedy episode per task
through the Harness (the model calls of all live episodes batched, as `qpa.train.greedy` does)
in a sandbox wrapped by `qpa.envs.faults.TransientFaults(rate=1.0)`: the episode's first
state-changing call is answered with a transient error and leaves the world untouched, so the
task succeeds only if the model calls again. It writes `out/trajectories.jsonl` (injected steps
annotated `injected_error`) and `out/recovery.json`, and returns the summary:

- `episodes`: episodes run; `episodes_with_error`: those that met the injected error (an
  episode that never made a state-changing call never meets it);
- `recovered`: successes among those, `rate` = recovered / episodes_with_error with its 95%
  Wilson interval `ci` (`qpa.bench.stats.wilson_interval`);
- `retried`: episodes whose next call after the error was the same call again (the behaviour
  the Harness's hint for a transient error asks for), successful or not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qpa.bench.stats import wilson_interval
from qpa.contract import Task, ToolCall, Trajectory, write_trajectories
from qpa.envs.faults import INJECTED, InjectionLog
from qpa.harness.agent import HarnessConfig
from qpa.train.greedy import load_model, run_episodes

RECOVERY_FILE = "recovery.json"


def recovery_summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """The recovery numbers of episodes run with injected errors (see the module doc)."""
    met = [t for t in trajectories if any(INJECTED in s.annotations for s in t.steps)]
    recovered = sum(1 for t in met if t.success)
    retried = 0
    for t in met:
        at = next(s.index for s in t.steps if INJECTED in s.annotations)
        failed = t.steps[at].action
        later = [s.action for s in t.steps[at + 1 :] if s.agent == t.steps[at].agent]
        if later and isinstance(failed, ToolCall) and later[0] == failed:
            retried += 1
    low, high = wilson_interval(recovered, len(met))
    return {
        "episodes": len(trajectories),
        "episodes_with_error": len(met),
        "recovered": recovered,
        "rate": round(recovered / len(met), 6) if met else None,
        "ci": [round(low, 6), round(high, 6)],
        "retried": retried,
    }


def run_with_errors(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    harness: HarnessConfig,
    *,
    label: str,
    max_new_tokens: int = 96,
    workers: int = 64,
    seed: int = 0,
) -> list[Trajectory]:
    """One greedy episode per task, each environment injecting one transient error at the
    first state-changing call; trajectories in task order, injected steps annotated."""
    faults = InjectionLog(1.0, seed)
    return run_episodes(
        model,
        tokenizer,
        tasks,
        harness,
        label=label,
        max_new_tokens=max_new_tokens,
        workers=workers,
        wrap_env=faults.wrap,
        on_trajectory=faults.mark,
        title="recovery",
    )


def evaluate_recovery(
    model_dir: Path,
    tasks: Sequence[Task],
    harness: HarnessConfig,
    out: Path,
    *,
    label: str,
    max_new_tokens: int = 96,
    workers: int = 64,
    seed: int = 0,
    loaded: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Greedy episodes of the checkpoint with one injected transient error each; writes
    `out/trajectories.jsonl` and `out/recovery.json`, returns the summary (module doc)."""
    model, tokenizer = loaded if loaded is not None else load_model(model_dir)
    trajectories = run_with_errors(
        model,
        tokenizer,
        tasks,
        harness,
        label=label,
        max_new_tokens=max_new_tokens,
        workers=workers,
        seed=seed,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_trajectories(out / "trajectories.jsonl", trajectories)
    summary = {
        "label": label,
        "tasks": len(tasks),
        "success": round(sum(t.success for t in trajectories) / len(trajectories), 6)
        if trajectories
        else None,
        **recovery_summary(trajectories),
    }
    (out / RECOVERY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


__all__ = ["RECOVERY_FILE", "evaluate_recovery", "recovery_summary", "run_with_errors"]
