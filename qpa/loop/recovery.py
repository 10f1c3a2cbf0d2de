"""The loop's recovery evaluation: the `eval_recovery` stage and its part of the report.

`eval_recovery` runs after the models it evaluates (`recovery.models` of the preset:
`untrained`, `sft`) on the held-out test tasks (the first `recovery.tasks_per_template` of each
template; all of them when unset) with one injected transient error per episode, at its first
state-changing call (`qpa.train.recovery_eval`), through the preset's first Harness (the one
SFT trained for). Recovery rate = successes among the episodes that met the error,
with a Wilson 95% interval; it lands in `report.json` as `stages.<model>.recovery`
(`{episodes_with_error, recovered, rate, ci, retried, episodes}`) and as a table in
`report.md`.

Whether the SFT data held recoveries is the `collect` section's choice
(`collect.recovering_samples`, `collect.transient_error_rate`): comparing a run with and
without them is comparing this stage's numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qpa.loop.stages import StageContext

RECOVERY_STAGE = "eval_recovery"
RECOVERY_FIELDS = ("episodes", "episodes_with_error", "recovered", "rate", "ci", "retried")


def stage_eval_recovery(ctx: StageContext) -> dict[str, Any]:
    from qpa.loop.stages import read_heldout
    from qpa.train.greedy import load_model
    from qpa.train.recovery_eval import evaluate_recovery

    settings = ctx.preset.recovery
    tasks = read_heldout(ctx, "test")
    if settings.tasks_per_template is not None:
        seen: Counter[str] = Counter()
        capped = []
        for task in tasks:
            seen[task.template or ""] += 1
            if seen[task.template or ""] <= settings.tasks_per_template:
                capped.append(task)
        tasks = capped
    checkpoints = {
        "untrained": (ctx.output("tiny", "checkpoint"), ctx.preset.harness),
        "sft": (ctx.output("sft", "checkpoint"), ctx.preset.harness),
    }
    outputs: dict[str, Any] = {"tasks": len(tasks), "models": {}}
    for name in settings.models:
        relative, harness = checkpoints[name]
        model_dir = ctx.path(relative)
        out = ctx.dir / name
        summary = evaluate_recovery(
            model_dir,
            tasks,
            harness,
            out,
            label=name,
            max_new_tokens=ctx.preset.eval.max_new_tokens,
            workers=ctx.preset.eval.workers,
            seed=ctx.seed,
            loaded=load_model(model_dir),
        )
        summary["model"] = relative
        summary["harness_version"] = harness.version
        summary["trajectories"] = ctx.rel(out / "trajectories.jsonl")
        outputs["models"][name] = summary
        rate = summary["rate"]
        ctx.log(
            f"recovery {name}: {summary['recovered']}/{summary['episodes_with_error']} "
            f"episodes that met the injected error recovered "
            f"({'n/a' if rate is None else f'{rate:.0%}'}); {summary['retried']} retried at once"
        )
    return outputs


def recovery_entries(outputs: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Report stage name -> its `recovery` entry, from `eval_recovery`'s summary (none when
    the stage did not run)."""
    if not outputs:
        return {}
    return {
        name: {key: summary.get(key) for key in RECOVERY_FIELDS}
        for name, summary in (outputs.get("models") or {}).items()
    }


def recovery_markdown(stages: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's recovery table (no lines when no stage has a `recovery` entry)."""
    rows = [(name, entry["recovery"]) for name, entry in stages.items() if entry.get("recovery")]
    if not rows:
        return []
    lines = [
        "",
        "## Recovery from an injected transient error",
        "",
        "Held-out test tasks, one transient error injected at each episode's first "
        "state-changing call (the world untouched); recovery rate = successes among the "
        "episodes that met it, Wilson 95% interval.",
        "",
        "| stage | met the error | recovered | rate | 95% CI | retried at once |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        rate = "n/a" if r.get("rate") is None else f"{100 * r['rate']:.1f}%"
        low, high = r.get("ci") or (0.0, 1.0)
        lines.append(
            f"| {name} | {r.get('episodes_with_error')}/{r.get('episodes')} | "
            f"{r.get('recovered')} | {rate} | [{100 * low:.1f}%, {100 * high:.1f}%] | "
            f"{r.get('retried')} |"
        )
    return lines


__all__ = [
    "RECOVERY_FIELDS",
    "RECOVERY_STAGE",
    "recovery_entries",
    "recovery_markdown",
    "stage_eval_recovery",
]
