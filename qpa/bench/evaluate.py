"""Score and summarize an evaluation: a model's episodes on a task list -> report + summary.

`score_episodes` writes the episodes (`trajectories.jsonl`) and the benchmark report
(`report.json`, `report.md`; one sample per task, every task of the list expected) into a
folder; `summarize` reduces a `Report` and its diagnosis to the numbers the loop reports
(success by capability and template, tokens, tool calls, failures by side and cause). Who
produced the episodes (a trained checkpoint, `qpa.train.greedy`) is not the benchmark's business.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qpa.bench.report import write_report
from qpa.bench.scoring import Report, score
from qpa.contract import Task, Trajectory, write_trajectories


def score_episodes(trajectories: Sequence[Trajectory], tasks: Sequence[Task], out: Path) -> Report:
    """`out/trajectories.jsonl` and the bench report (`out/report.json`, `out/report.md`, no
    plots) of one episode per task; the report is complete when every task has one."""
    out.mkdir(parents=True, exist_ok=True)
    write_trajectories(out / "trajectories.jsonl", trajectories)
    report = score(trajectories, samples=1, expected_tasks=[t.id for t in tasks])
    write_report(report, out, plots=False)
    return report


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


__all__ = ["score_episodes", "summarize"]
