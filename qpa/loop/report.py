"""The loop's report: `DIR/report.json` (every stage's numbers and the final model's lineage)
and `DIR/report.md` with plots (success per stage and capability, output tokens per solved task,
Harness-side failures before and after the revision, mixture weights against validation success).

`report.json` holds:

- `stages`: one entry per evaluated model on the held-out **test** set (the `heldout` stage):
  `untrained`, `sft` (Harness v1), `sft+<harness v2>` (the Harness revision, evaluated like a
  new model) and `rl` (CARE RL, Harness v2). Each has `test_success` (0..1, greedy),
  `test_tasks`, `test_successes`, `test_success_ci` ([low, high], Wilson 95%),
  `by_capability` and `by_capability_ci`, `by_template`, the same `validation_*` numbers
  (none for `untrained`), `pass_at_1` with `pass_at_1_ci` (percentile bootstrap over tasks)
  and `pass_at_1_samples` (k sampled episodes per test task at `pass_at_1_temperature`; null
  for a stage not sampled), `output_tokens_per_solved_task`, `diagnosis` (failures per side:
  model, harness, environment) and `diagnosis_by_cause`, the checkpoint and the Harness
  version; `untrained` and `sft` also `recovery` (`eval_recovery`, `qpa.loop.recovery`: test
  episodes with one injected transient error: `episodes_with_error`, `recovered`, `rate`, `ci`);
- `comparisons`: McNemar's exact test between consecutive stages and `sft` -> `rl`, paired on
  the same test tasks (greedy outcomes read from the eval trajectories): `from`, `to`,
  `test` (`mcnemar_exact`), `p_value`, `b` (tasks only `from` solved), `c` (only `to`), `n`,
  `difference` (`to` - `from` success) and `difference_ci` (paired bootstrap);
- `validation`: the same numbers on the validation set (what diagnosis and targeting used);
- `harness_revision`: the changed settings with their causes, and Harness-side failures before
  and after on validation and test;
- `weakness_targeting`: validation success per capability, the round-2 mixture's capability
  weights, what was generated for which template, the RL task pool's composition;
- `data`, `training`: collection, curation and mixture counts; SFT and RL summaries;
- `lineage`: the final model, its parents, the datasets (manifests) and Harness versions;
- `timing`: wall time of this run and every stage's compute time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from qpa.bench.stats import bootstrap_interval, mcnemar_exact, paired_bootstrap, wilson_interval
from qpa.loop.presets import LoopPreset
from qpa.loop.recovery import RECOVERY_STAGE, recovery_entries, recovery_markdown
from qpa.loop.stages import StageResult, capabilities_of, read_trajectories

SCHEMA_VERSION = 2
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SUCCESS_PLOT = "success_by_stage.png"
TOKENS_PLOT = "tokens_per_solved_task.png"
HARNESS_PLOT = "harness_failures.png"
WEIGHTS_PLOT = "mixture_weights.png"


def _outcomes(root: Path, summary: Mapping[str, Any]) -> dict[str, tuple[bool, list[str]]]:
    """task id -> (greedy success, capabilities), read from an evaluation's trajectories."""
    out: dict[str, tuple[bool, list[str]]] = {}
    for trajectory in read_trajectories(root / summary["trajectories"]):
        if trajectory.sample == 0:
            out[trajectory.task.id] = (trajectory.success, list(trajectory.task.capabilities))
    return out


def _interval(successes: int, n: int) -> list[float]:
    return [round(v, 6) for v in wilson_interval(successes, n)]


def _rates(outcomes: Mapping[str, tuple[bool, list[str]]], prefix: str) -> dict[str, Any]:
    """`<prefix>_tasks`, `<prefix>_successes`, `<prefix>_success_ci` (Wilson 95%) and, for
    test, `by_capability_ci`."""
    successes = sum(1 for ok, _ in outcomes.values() if ok)
    numbers: dict[str, Any] = {
        f"{prefix}_tasks": len(outcomes),
        f"{prefix}_successes": successes,
        f"{prefix}_success_ci": _interval(successes, len(outcomes)),
    }
    if prefix == "test":
        per: dict[str, list[int]] = {}
        for ok, capabilities in outcomes.values():
            for capability in capabilities:
                count = per.setdefault(capability, [0, 0])
                count[0] += int(ok)
                count[1] += 1
        numbers["by_capability_ci"] = {c: _interval(k, n) for c, (k, n) in sorted(per.items())}
    return numbers


def _sampled(root: Path, evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """pass@1 from the k sampled episodes per test task, with a bootstrap interval over tasks
    (a task's k episodes are not independent, so no binomial interval over episodes)."""
    sampled = evaluation.get("test_sampled")
    if not sampled:
        return {
            "pass_at_1": None,
            "pass_at_1_ci": None,
            "pass_at_1_samples": None,
            "pass_at_1_temperature": None,
        }
    k = int(sampled["samples"])
    per_task: dict[str, list[bool]] = {}
    for trajectory in read_trajectories(root / sampled["trajectories"]):
        if trajectory.sample < k:
            per_task.setdefault(trajectory.task.id, []).append(trajectory.success)
    rates = [sum(v) / len(v) for v in per_task.values()]
    low, high = bootstrap_interval(rates) if rates else (0.0, 1.0)
    return {
        "pass_at_1": round(sum(rates) / len(rates), 6) if rates else 0.0,
        "pass_at_1_ci": [round(low, 6), round(high, 6)],
        "pass_at_1_samples": k,
        "pass_at_1_temperature": sampled["temperature"],
    }


def _comparison(
    name_from: str,
    name_to: str,
    before: Mapping[str, tuple[bool, list[str]]],
    after: Mapping[str, tuple[bool, list[str]]],
) -> dict[str, Any]:
    paired = sorted(set(before) & set(after))
    x = [before[t][0] for t in paired]
    y = [after[t][0] for t in paired]
    test = mcnemar_exact(x, y)
    if paired:
        difference, low, high = paired_bootstrap([float(v) for v in x], [float(v) for v in y])
    else:
        difference, low, high = 0.0, 0.0, 0.0
    return {
        "from": name_from,
        "to": name_to,
        "split": "test",
        "test": test.test,
        "p_value": round(test.p_value, 6),
        "b": test.b,
        "c": test.c,
        "n": test.n,
        "difference": round(difference, 6),
        "difference_ci": [round(low, 6), round(high, 6)],
    }


def _entry(summary: Mapping[str, Any], *, model: str, kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "test_success": summary["success"],
        "by_capability": dict(summary["by_capability"]),
        "by_template": dict(summary.get("by_template", {})),
        "output_tokens_per_solved_task": summary["output_tokens_per_solved_task"],
        "output_tokens_per_task": summary["output_tokens_per_task"],
        "tool_calls_per_task": summary.get("tool_calls_per_task"),
        "diagnosis": dict(summary["diagnosis"]),
        "diagnosis_by_cause": dict(summary.get("diagnosis_by_cause", {})),
        "tasks": summary["tasks"],
        "harness_version": summary["harness_version"],
        "model": model,
        "report": summary.get("report"),
    }


def _validation(summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "success": summary["success"],
        "tasks": summary["tasks"],
        "by_capability": dict(summary["by_capability"]),
        "output_tokens_per_solved_task": summary["output_tokens_per_solved_task"],
        "diagnosis": dict(summary["diagnosis"]),
        "diagnosis_by_cause": dict(summary.get("diagnosis_by_cause", {})),
        "harness_version": summary["harness_version"],
    }


def _manifest(root: Path, relative: str | None) -> dict[str, Any] | None:
    if not relative:
        return None
    path = root / relative
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    lineage = data.get("lineage") or {}
    return {
        "name": data.get("name"),
        "kind": data.get("kind"),
        "manifest": relative,
        "counts": data.get("counts", {}),
        "parents": [_relative(root, p) for p in lineage.get("parents", [])],
        "generator": lineage.get("generator"),
        "task_count": lineage.get("task_count"),
        "tasks_sha256": lineage.get("tasks_sha256"),
        "review": (data.get("review") or {}).get("mode") or (data.get("review") or {}).get("gate"),
    }


def _relative(root: Path, uri: str) -> str:
    path = uri.removeprefix("file://")
    if path.startswith("/"):
        try:
            return os.path.relpath(path, root)
        except ValueError:
            return uri
    return uri


def build_report(
    root: Path,
    preset: LoopPreset,
    results: Mapping[str, StageResult],
    *,
    wall_time_s: float,
) -> dict[str, Any]:
    """Assemble `report.json`'s content from the stages' summaries."""
    out = {name: r.outputs for name, r in results.items()}
    tiny, sft, rl = out["tiny"], out["sft"], out["rl"]
    revision = out["harness_revision"]
    v1, v2 = revision["from"], revision["to"]
    revised_key = f"sft+{v2}" if v2 != v1 else f"sft+{v1}"
    stages = {
        "untrained": _entry(out["eval_untrained"]["test"], model=tiny["checkpoint"], kind="model"),
        "sft": _entry(out["eval_sft"]["test"], model=sft["checkpoint"], kind="model"),
        revised_key: _entry(
            out["eval_harness"]["test"], model=sft["checkpoint"], kind="harness_revision"
        ),
        "rl": _entry(out["eval_rl"]["test"], model=rl["checkpoint"], kind="model"),
    }
    validation = {
        "sft": _validation(out["eval_sft"]["validation"]),
        revised_key: _validation(out["eval_harness"]["validation"]),
        "rl": _validation(out["eval_rl"]["validation"]),
    }
    evaluations = {
        "untrained": out["eval_untrained"],
        "sft": out["eval_sft"],
        revised_key: out["eval_harness"],
        "rl": out["eval_rl"],
    }
    test_outcomes = {n: _outcomes(root, e["test"]) for n, e in evaluations.items()}
    for name, evaluation in evaluations.items():
        stages[name].update(_rates(test_outcomes[name], "test"))
        if "validation" in evaluation:
            numbers = _rates(_outcomes(root, evaluation["validation"]), "validation")
            stages[name]["validation_success"] = evaluation["validation"]["success"]
            validation[name]["success_ci"] = numbers["validation_success_ci"]
        else:
            numbers = {"validation_tasks": 0, "validation_successes": 0}
            numbers["validation_success_ci"] = None
            stages[name]["validation_success"] = None
        stages[name].update(numbers)
        stages[name].update(_sampled(root, evaluation))
    for name, recovery in recovery_entries(out.get(RECOVERY_STAGE)).items():
        stages[name]["recovery"] = recovery
    pairs = [("untrained", "sft"), ("sft", revised_key), (revised_key, "rl"), ("sft", "rl")]
    comparisons = [_comparison(a, b, test_outcomes[a], test_outcomes[b]) for a, b in pairs]
    round2 = out["round2"]
    weights = round2["mixture_weights"]
    harness_revision = {
        "from": v1,
        "to": v2,
        "changes": revision["changes"],
        "unaddressed": revision["unaddressed"],
        "config_file": revision["config_file"],
        "harness": revision["harness"],
        "harness_failures_before": {
            "validation": validation["sft"]["diagnosis"].get("harness", 0),
            "test": stages["sft"]["diagnosis"].get("harness", 0),
        },
        "harness_failures_after": {
            "validation": validation[revised_key]["diagnosis"].get("harness", 0),
            "test": stages[revised_key]["diagnosis"].get("harness", 0),
        },
        "causes_before": _harness_only(validation["sft"]["diagnosis_by_cause"]),
        "causes_after": _harness_only(validation[revised_key]["diagnosis_by_cause"]),
    }
    weakness = {
        "validation_report": round2["validation_report"],
        "validation_by_capability": round2["validation_by_capability"],
        "validation_by_template": round2["validation_by_template"],
        "mixture_weights": {
            k.split(".", 1)[1]: v for k, v in weights.items() if k.startswith("capability.")
        },
        "round1_mixture_weights": {
            k.split(".", 1)[1]: v
            for k, v in out["mix"]["weights"].items()
            if k.startswith("capability.")
        },
        "generated_by_template": round2["generated"]["picks_by_template"],
        "generated_reasons": round2["generated"]["reasons"],
        "rl_pool_by_capability": round2["rl_pool_by_capability"],
        "rl_pool_by_template": round2["rl_pool_by_template"],
        "mixture_reasons": round2["mixture_reasons"][:20],
    }
    lineage = _lineage(root, out, v1, v2)
    timing = {
        "wall_time_s": round(wall_time_s, 2),
        "compute_time_s": round(sum(r.ran_elapsed_s for r in results.values()), 2),
        "stages_s": {n: round(r.ran_elapsed_s, 2) for n, r in results.items()},
        "status": {n: r.status for n, r in results.items()},
        "budget_s": preset.budget_s,
    }
    untrained = stages["untrained"]["test_success"]
    gains = {
        "sft_minus_untrained_points": round(100 * (stages["sft"]["test_success"] - untrained), 2),
        "harness_revision_points": round(
            100 * (stages[revised_key]["test_success"] - stages["sft"]["test_success"]), 2
        ),
        "rl_minus_sft_points": round(
            100 * (stages["rl"]["test_success"] - stages[revised_key]["test_success"]), 2
        ),
        "rl_minus_untrained_points": round(100 * (stages["rl"]["test_success"] - untrained), 2),
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.now(UTC).isoformat(),
        "preset": preset.name,
        "seed": preset.seed,
        "preset_fingerprint": preset.fingerprint(),
        "suite": preset.suite,
        "curriculum": {
            "templates": list(preset.tasks.templates),
            "capabilities": capabilities_of(preset),
            "train_tasks": out["tasks"]["count"],
            "validation_tasks": out["heldout"]["counts"]["validation"],
            "test_tasks": out["heldout"]["counts"]["test"],
            "heldout_manifest": out["heldout"]["manifest"],
        },
        "stages": stages,
        "comparisons": comparisons,
        "gains": gains,
        "validation": validation,
        "harness_revision": harness_revision,
        "weakness_targeting": weakness,
        "data": {
            "collect": out["collect"],
            "curate": {k: v for k, v in out["curate"].items() if k != "curated"},
            "mix": {k: v for k, v in out["mix"].items() if k in ("rows", "weights", "counts")},
            "round2": {
                "generated": round2["generated"]["tasks"],
                "collected": round2["collected"],
                "rl_pool_size": round2["rl_pool_size"],
            },
        },
        "training": {
            "tiny": {k: v for k, v in tiny.items() if k != "tiny_config"},
            "sft": {k: v for k, v in sft.items() if k != "data"},
            "rl": rl,
        },
        "lineage": lineage,
        "timing": timing,
    }


def _harness_only(causes: Mapping[str, int]) -> dict[str, int]:
    return {c: n for c, n in causes.items() if c in _HARNESS_CAUSES}


def _lineage(root: Path, out: Mapping[str, Any], v1: str, v2: str) -> dict[str, Any]:
    tiny, sft, rl = out["tiny"], out["sft"], out["rl"]
    round2 = out["round2"]
    datasets = {
        "round1_tasks": _manifest(root, out["tasks"]["generated"]["manifest"]),
        "oracle_trajectories": _manifest(root, f"{out['collect']['oracle']['uri']}/manifest.json"),
        "noisy_trajectories": (
            _manifest(root, f"{out['collect']['noisy']['uri']}/manifest.json")
            if "noisy" in out["collect"]
            else None
        ),
        "curated": _manifest(root, f"{out['curate']['curated']}/manifest.json"),
        "sft_mixture": _manifest(root, out["mix"]["manifest"]),
        "round2_tasks": _manifest(root, round2["generated"]["manifest"]),
        "round2_mixture": _manifest(root, round2["mixture"]),
    }
    revision = out["harness_revision"]
    return {
        "final_model": {
            "name": "rl",
            "checkpoint": rl["checkpoint"],
            "harness_version": v2,
            "parents": ["sft"],
        },
        "models": [
            {
                "name": "untrained",
                "checkpoint": tiny["checkpoint"],
                "parents": [],
                "made_by": "qpa.train.warmup.build_checkpoint (random Qwen3, seeded)",
                "tokenizer": {
                    "size": tiny["tokenizer_size"],
                    "macro_tokens": tiny["macro_tokens"],
                },
            },
            {
                "name": "sft",
                "checkpoint": sft["checkpoint"],
                "parents": ["untrained"],
                "datasets": ["sft_mixture"],
                "harness_version": v1,
                "steps": sft["steps"],
            },
            {
                "name": "rl",
                "checkpoint": rl["checkpoint"],
                "parents": ["sft"],
                "datasets": ["round2_mixture"],
                "harness_version": v2,
                "care": rl["care"],
                "steps": rl["steps"],
            },
        ],
        "datasets": {k: v for k, v in datasets.items() if v is not None},
        "harness_versions": [
            {"version": v1, "parent": None, "config": out["eval_sft"]["harness"]},
            {
                "version": v2,
                "parent": v1,
                "config": revision["harness"],
                "config_file": revision["config_file"],
                "changes": revision["changes"],
            },
        ],
    }


# --------------------------------------------------------------------------- plots


def _plots(report: Mapping[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = report["stages"]
    names = list(stages)
    capabilities = [*report["curriculum"]["capabilities"], "overall"]
    files: list[str] = []

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        entry = stages[name]
        values = [
            entry["test_success"] if c == "overall" else entry["by_capability"].get(c, 0.0)
            for c in capabilities
        ]
        intervals = [
            entry.get("test_success_ci")
            if c == "overall"
            else entry.get("by_capability_ci", {}).get(c)
            for c in capabilities
        ]
        # Wilson intervals are not symmetric: lower and upper error separately.
        pairs = list(zip(values, intervals, strict=True))
        errors = [
            [100 * max(0.0, v - ci[0]) if ci else 0.0 for v, ci in pairs],
            [100 * max(0.0, ci[1] - v) if ci else 0.0 for v, ci in pairs],
        ]
        positions = [x + i * width for x in range(len(capabilities))]
        ax.bar(positions, [100 * v for v in values], width, label=name, yerr=errors, capsize=2)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(capabilities))])
    ax.set_xticklabels(capabilities)
    ax.set_ylabel("held-out test success (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Success per stage and capability (greedy; bars: Wilson 95%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / SUCCESS_PLOT, dpi=110)
    plt.close(fig)
    files.append(SUCCESS_PLOT)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    values = [stages[n]["output_tokens_per_solved_task"] or 0.0 for n in names]
    ax.bar(names, values, color="tab:orange")
    for x, value in enumerate(values):
        ax.annotate(f"{value:.0f}" if value else "n/a", (x, value), ha="center", va="bottom")
    ax.set_ylabel("output tokens per solved task")
    ax.set_title("Output tokens per solved task (test)")
    fig.tight_layout()
    fig.savefig(out / TOKENS_PLOT, dpi=110)
    plt.close(fig)
    files.append(TOKENS_PLOT)

    revision = report["harness_revision"]
    causes = sorted(set(revision["causes_before"]) | set(revision["causes_after"]))
    harness_causes = [c for c in causes if c in _HARNESS_CAUSES]
    if harness_causes:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = range(len(harness_causes))
        ax.bar(
            [x - 0.2 for x in xs],
            [revision["causes_before"].get(c, 0) for c in harness_causes],
            0.4,
            label=revision["from"],
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [revision["causes_after"].get(c, 0) for c in harness_causes],
            0.4,
            label=revision["to"],
        )
        ax.set_xticks(list(xs))
        ax.set_xticklabels(harness_causes, fontsize=8)
        ax.set_ylabel("failures (validation)")
        ax.set_title("Harness-side failures before and after the revision")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / HARNESS_PLOT, dpi=110)
        plt.close(fig)
        files.append(HARNESS_PLOT)

    weakness = report["weakness_targeting"]
    caps = [c for c in report["curriculum"]["capabilities"]]
    if caps:
        fig, ax1 = plt.subplots(figsize=(6, 3.5))
        xs = range(len(caps))
        ax1.bar(
            [x - 0.2 for x in xs],
            [weakness["round1_mixture_weights"].get(c, 1.0) for c in caps],
            0.4,
            label="round 1 weight",
        )
        ax1.bar(
            [x + 0.2 for x in xs],
            [weakness["mixture_weights"].get(c, 1.0) for c in caps],
            0.4,
            label="round 2 weight",
        )
        ax1.set_ylabel("mixture weight")
        ax1.set_xticks(list(xs))
        ax1.set_xticklabels(caps)
        ax2 = ax1.twinx()
        ax2.plot(
            list(xs),
            [100 * weakness["validation_by_capability"].get(c, 0.0) for c in caps],
            "ko-",
            label="validation success (%)",
        )
        ax2.set_ylabel("validation success (%)")
        ax2.set_ylim(0, 100)
        ax1.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="upper right", fontsize=8)
        ax1.set_title("Weakness targeting: weak capabilities weigh more")
        fig.tight_layout()
        fig.savefig(out / WEIGHTS_PLOT, dpi=110)
        plt.close(fig)
        files.append(WEIGHTS_PLOT)
    return files


_HARNESS_CAUSES = {
    "harness_error",
    "tool_not_exposed",
    "parser_rejected_valid_call",
    "guard_rejected_valid_call",
    "skill_not_injected",
    "memory_retrieval_miss",
    "budget_cut",
}


# --------------------------------------------------------------------------- markdown


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _ci(interval: Sequence[float] | None) -> str:
    return "n/a" if not interval else f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def render_markdown(report: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    stages = report["stages"]
    caps = report["curriculum"]["capabilities"]
    lines = [
        f"# qpa loop: preset `{report['preset']}`, seed {report['seed']}",
        "",
        f"Curriculum: {len(report['curriculum']['templates'])} templates "
        f"({', '.join(report['curriculum']['templates'])}); "
        f"{report['curriculum']['train_tasks']} train tasks, "
        f"{report['curriculum']['validation_tasks']} validation, "
        f"{report['curriculum']['test_tasks']} held-out test tasks.",
        "",
        "## Held-out test success per stage",
        "",
        "Greedy success on the held-out test set with its Wilson 95% interval; pass@1 from k "
        "sampled episodes per task (bootstrap 95% over tasks) where the stage was sampled.",
        "",
        "| stage | Harness | test success | 95% CI | pass@1 (k) | 95% CI | "
        + " | ".join(caps)
        + " | output tokens / solved task | failures: model / harness / environment |",
        "|---|---|---|---|---|---|" + "---|" * len(caps) + "---|---|",
    ]
    for name, entry in stages.items():
        diag = entry["diagnosis"]
        k = entry.get("pass_at_1_samples")
        sampled = f"{_pct(entry.get('pass_at_1'))} ({k})" if k else "n/a"
        lines.append(
            f"| {name} | {entry['harness_version']} | {_pct(entry['test_success'])} "
            f"({entry.get('test_successes', 'n/a')}/{entry.get('test_tasks', entry['tasks'])}) | "
            f"{_ci(entry.get('test_success_ci'))} | {sampled} | "
            f"{_ci(entry.get('pass_at_1_ci'))} | "
            + " | ".join(_pct(entry["by_capability"].get(c)) for c in caps)
            + f" | {_num(entry['output_tokens_per_solved_task'])} | "
            f"{diag.get('model', 0)} / {diag.get('harness', 0)} / {diag.get('environment', 0)} |"
        )
    gains = report["gains"]
    lines += [
        "",
        f"SFT vs untrained: {gains['sft_minus_untrained_points']:+.1f} points; Harness revision: "
        f"{gains['harness_revision_points']:+.1f}; RL vs SFT (same Harness): "
        f"{gains['rl_minus_sft_points']:+.1f}.",
        "",
        "Paired comparisons on the same test tasks (McNemar's exact test; b: tasks only the "
        "first solved, c: only the second; difference with a paired bootstrap 95% interval):",
        "",
        "| from | to | b | c | paired tasks | difference (points) | 95% CI | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['from']} | {c['to']} | {c['b']} | {c['c']} | {c['n']} | "
        f"{100 * c['difference']:+.1f} | {_ci(c['difference_ci'])} | {_p(c['p_value'])} |"
        for c in report.get("comparisons", [])
    ]
    lines.append("")
    lines += [*recovery_markdown(stages), *([""] if recovery_markdown(stages) else [])]
    lines += [f"![{p}]({p})" for p in plots if p in (SUCCESS_PLOT, TOKENS_PLOT)]
    revision = report["harness_revision"]
    lines += [
        "",
        "## Model and Harness co-evolve",
        "",
        f"Diagnosis of the SFT model's validation failures under `{revision['from']}` found "
        f"{revision['harness_failures_before']['validation']} Harness-side failures "
        f"({', '.join(f'{k}: {v}' for k, v in revision['causes_before'].items()) or 'none'}). "
        f"The revision `{revision['to']}` (`{revision['config_file']}`) changed:",
        "",
    ]
    if revision["changes"]:
        lines += [
            f"- `{c['setting']}` {c['from']} -> {c['to']}: {c['why']} (`{c['cause']}` on "
            f"{c.get('tasks', c['failures'])} failed validation tasks)"
            + (f"; Skills {', '.join(c['skills'])}" if c.get("skills") else "")
            + (f"; tools {', '.join(c['tools'])}" if c.get("tools") else "")
            for c in revision["changes"]
        ]
    else:
        lines.append("- nothing (no Harness-side failure had a setting to change)")
    if revision["unaddressed"]:
        lines.append(f"- left for a person: {revision['unaddressed']}")
    lines += [
        "",
        "| Harness-side failures | validation | test |",
        "|---|---|---|",
        f"| before (`{revision['from']}`) | {revision['harness_failures_before']['validation']} | "
        f"{revision['harness_failures_before']['test']} |",
        f"| after (`{revision['to']}`) | {revision['harness_failures_after']['validation']} | "
        f"{revision['harness_failures_after']['test']} |",
        "",
    ]
    lines += [f"![{HARNESS_PLOT}]({HARNESS_PLOT})"] if HARNESS_PLOT in plots else []
    weakness = report["weakness_targeting"]
    lines += [
        "",
        "## The next round targets the weakest capabilities",
        "",
        "| capability | validation success | round-1 weight | round-2 weight | RL pool tasks |",
        "|---|---|---|---|---|",
    ]
    for cap in caps:
        lines.append(
            f"| {cap} | {_pct(weakness['validation_by_capability'].get(cap))} | "
            f"{weakness['round1_mixture_weights'].get(cap, 1.0):g} | "
            f"{weakness['mixture_weights'].get(cap, 1.0):g} | "
            f"{weakness['rl_pool_by_capability'].get(cap, 0)} |"
        )
    lines += [
        "",
        "Generated for the weaknesses (tasks per template): "
        + ", ".join(f"{k} {v}" for k, v in weakness["generated_by_template"].items()),
        "",
    ]
    lines += [f"![{WEIGHTS_PLOT}]({WEIGHTS_PLOT})"] if WEIGHTS_PLOT in plots else []
    training = report["training"]
    rl = training["rl"]
    lines += [
        "",
        "## Training",
        "",
        f"- tiny model: {training['tiny']['parameters'] / 1e6:.2f}M parameters, tokenizer "
        f"{training['tiny']['tokenizer_size']} tokens ({training['tiny']['macro_tokens']} macro "
        f"lines), {training['tiny']['mean_conversation_tokens']} tokens per conversation",
        f"- SFT: {training['sft']['steps']} steps, mean loss {training['sft']['train_loss']:.3f} "
        f"(last logged {training['sft'].get('last_loss') or float('nan'):.3f}), "
        f"{training['sft']['tokens_per_second']:.0f} tokens/s",
        f"- RL (CARE={rl['care']}): {rl['steps']} steps ({rl['updated_steps']} with a non-zero "
        f"gradient), rollout success by step {rl['success_rate_by_step']}, verifier progress "
        f"{rl['progress_by_step']}, CARE tier shares {rl['care_tier_share']}",
        "",
        "## Lineage of the final model",
        "",
    ]
    lineage = report["lineage"]
    for model in lineage["models"]:
        lines.append(
            f"- `{model['name']}` <- {', '.join(model['parents']) or '(random init)'}: "
            f"`{model['checkpoint']}`"
            + (f", data {', '.join(model['datasets'])}" if model.get("datasets") else "")
            + (f", Harness {model['harness_version']}" if model.get("harness_version") else "")
        )
    for name, dataset in lineage["datasets"].items():
        lines.append(
            f"- dataset `{name}` ({dataset['kind']}): `{dataset['manifest']}`, "
            f"{dataset.get('task_count')} tasks, parents {dataset['parents'] or '-'}"
        )
    timing = report["timing"]
    lines += [
        "",
        "## Time",
        "",
        f"Wall time of this run: {timing['wall_time_s']:.0f} s; compute time of all stages: "
        f"{timing['compute_time_s']:.0f} s (budget {timing['budget_s']:.0f} s).",
        "",
        "| stage | status | seconds |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {timing['status'][name]} | {seconds:.1f} |"
        for name, seconds in timing["stages_s"].items()
    ]
    return "\n".join(lines) + "\n"


def write_loop_report(
    root: Path,
    preset: LoopPreset,
    results: Mapping[str, StageResult],
    *,
    wall_time_s: float,
    plots: bool = True,
) -> dict[str, Any]:
    """Write `DIR/report.json` and `DIR/report.md` (with plots); returns the report."""
    report = build_report(root, preset, results, wall_time_s=wall_time_s)
    files = _plots(report, root) if plots else []
    report["plots"] = files
    (root / REPORT_JSON).write_text(
        json.dumps(report, indent=2, sort_keys=False, default=str) + "\n"
    )
    (root / REPORT_MD).write_text(render_markdown(report, files))
    return report


def comparable(report: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of a report (what a rerun with the same seed must reproduce)."""
    return {
        "stages": report["stages"],
        "comparisons": report["comparisons"],
        "validation": report["validation"],
        "harness_revision": {
            k: v for k, v in report["harness_revision"].items() if k != "config_file"
        },
        "weakness_targeting": report["weakness_targeting"],
    }


__all__ = [
    "REPORT_JSON",
    "REPORT_MD",
    "build_report",
    "comparable",
    "render_markdown",
    "write_loop_report",
]
