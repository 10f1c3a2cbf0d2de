"""Diagnosis accuracy: does `qpa diagnose` blame the side that actually failed?

Run: `.venv/bin/python benchmarks/diagnosis_accuracy.py [--stride N] [--detours K] [--json F]`
(about a minute on 2 cores at the default stride; prints tables, asserts nothing).

Sources, each over the canonical mobilepa test split (every `--stride`-th task), all through the
real agent loop on the sandbox (`tests/helpers/faults.py`):

- model side: the `noisy` planner (one injected, labelled fault per episode: wrong tool, wrong
  argument, skipped step, ignored memory, gave up early), run directly and through the Harness
  (`noisy_harness`: the Harness's annotations present, as in production);
- Harness side: a needed Skill withheld (`drop_skill`), a needed tool hidden (`hide_tool`,
  `cap_tools`), memory retrieval broken (`no_memory`, `memory_k1`), a turn budget one short of
  the plan (`turn_budget`), valid calls in formats the parser rejects (`parser_function_tag`,
  `parser_double_encoded`);
- environment side: `environment_failure` / `transient` answers, a dead env server, a time-out,
  a refused reset, the model endpoint going down.

Every source runs twice: plain, and with the model adding harmless detours every `--detours`
turns (re-checks and misspelt tool names: noise a diagnosis must see through). A Harness or
environment fault (and `noisy_harness`) is measured only on tasks the clean Harness solves (the
control), and only episodes that failed count (a fault that changed nothing has nothing to
attribute). Printed: per source (runs, failed, side and cause accuracy), the confusion matrix
expected side x predicted side, accuracy per expected cause, overall accuracy, the control's
failures (real Harness gaps the default configuration has) and the misattributions.

**Replay labels** (`--replay RUN_DIR`): the failures of a trained model in a finished `qpa loop`
run (the eval stages' `trajectories.jsonl`, `--stages`, default `eval_sft,eval_harness`), each
labelled by counterfactual replay (`qpa.train.replay`: the oracle's step substituted at the
diverging turn, the same model under the run's revised Harness and a Harness with every tool and
Skill in reach, a retry in a fresh environment), labels the rules did not help make. Printed:
the count per label, the confusion matrix replay label x `qpa diagnose` side, side accuracy on
the decided labels and cause accuracy where the label names one (Wilson 95% intervals,
`qpa.bench.stats`), how many failures both a substituted step and a revised Harness fix, and
disagreements. `--labels F` writes every label (JSON Lines), `--json F` the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fault injection lives with the test helpers

from helpers.faults import (  # noqa: E402
    FAULTS,
    SOURCES,
    Outcome,
    SkillSensitiveBackend,
    measure,
    run_harness,
)

from qpa.bench.stats import wilson_interval  # noqa: E402
from qpa.contract import Trajectory  # noqa: E402
from qpa.diagnose import SIDES  # noqa: E402
from qpa.diagnose.attribution import diagnose  # noqa: E402
from qpa.envs.sandbox.suite import generate_suite  # noqa: E402
from qpa.train.replay import LABELS, ReplayLabel  # noqa: E402


def _pct(num: int, den: int) -> str:
    return f"{100.0 * num / den:6.1f}%" if den else "     -"


def _expected_side(source: str) -> str:
    return FAULTS[source].side if source in FAULTS else "model"


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=3, help="every N-th test task (default 3)")
    parser.add_argument("--detours", type=int, default=3, help="detour every K turns (0: off)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noisy planner")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument(
        "--replay", type=Path, default=None, metavar="RUN_DIR", help="score on replay labels"
    )
    parser.add_argument("--stages", default="eval_sft,eval_harness", help="with --replay")
    parser.add_argument("--splits", default="validation,test", help="with --replay")
    parser.add_argument(
        "--substitutions", type=int, default=1, help="oracle steps substituted at most"
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="at most N failures per stage and split, evenly spaced",
    )
    parser.add_argument("--labels", type=Path, default=None, help="write the labels (JSONL)")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return replay_main(args)

    started = time.perf_counter()
    tasks = [t for t in generate_suite() if t.split == "test"][:: max(1, args.stride)]
    controls: dict[str, bool] = {}
    variants: list[int | None] = [None] + ([args.detours] if args.detours > 0 else [])
    outcomes: list[Outcome] = []
    for detours in variants:
        sources = SOURCES if detours is None else tuple(s for s in SOURCES if s != "noisy")
        outcomes += measure(
            tasks, sources=sources, detour_every=detours, seed=args.seed, controls=controls
        )
    elapsed = time.perf_counter() - started

    print(
        f"Diagnosis accuracy on the mobilepa test split: {len(tasks)} tasks (stride "
        f"{args.stride}), noisy seed {args.seed}, detour variants {variants}, {elapsed:.1f} s"
    )
    failed = [o for o in outcomes if o.failed]

    # ------------------------------------------------------------------ per source
    print(
        f"\n{'source':<24}{'variant':<10}{'expected':<13}{'runs':>6}{'failed':>8}"
        f"{'side acc':>10}{'cause acc':>11}"
    )
    per_source: dict[str, dict[str, object]] = {}
    for source in SOURCES:
        for detours in variants:
            rows = [o for o in outcomes if o.source == source and o.detour_every == detours]
            if not rows:
                continue
            bad = [o for o in rows if o.failed]
            n_side = sum(o.side_correct for o in bad)
            n_cause = sum(o.cause_correct for o in bad)
            variant = "plain" if detours is None else f"detour{detours}"
            print(
                f"{source:<24}{variant:<10}{_expected_side(source):<13}{len(rows):>6}"
                f"{len(bad):>8}{_pct(n_side, len(bad)):>10}{_pct(n_cause, len(bad)):>11}"
            )
            per_source[f"{source}/{variant}"] = {
                "runs": len(rows),
                "failed": len(bad),
                "side_accuracy": n_side / len(bad) if bad else None,
                "cause_accuracy": n_cause / len(bad) if bad else None,
            }

    # ------------------------------------------------------------------ confusion matrix
    matrix: Counter[tuple[str, str]] = Counter(
        (o.expected_side, o.diagnosis.side) for o in failed if o.diagnosis is not None
    )
    print("\nConfusion matrix (rows: expected side, columns: predicted side)")
    print(f"{'':<14}" + "".join(f"{s:>13}" for s in SIDES) + f"{'total':>9}{'recall':>9}")
    for expected in SIDES:
        row = [matrix[(expected, p)] for p in SIDES]
        total = sum(row)
        print(
            f"{expected:<14}"
            + "".join(f"{n:>13}" for n in row)
            + f"{total:>9}{_pct(matrix[(expected, expected)], total):>9}"
        )

    # ------------------------------------------------------------------ per cause
    by_cause: dict[str, list[Outcome]] = defaultdict(list)
    for o in failed:
        by_cause[o.expected_cause].append(o)
    print(f"\n{'expected cause':<28}{'side':<13}{'n':>6}{'side acc':>10}{'cause acc':>11}  got")
    per_cause: dict[str, dict[str, object]] = {}
    for cause, rows in sorted(by_cause.items(), key=lambda kv: (kv[1][0].expected_side, kv[0])):
        side = sum(o.side_correct for o in rows)
        right = sum(o.cause_correct for o in rows)
        got = Counter(o.diagnosis.cause for o in rows if o.diagnosis and not o.cause_correct)
        others = ", ".join(f"{c} {n}" for c, n in got.most_common(3))
        print(
            f"{cause:<28}{rows[0].expected_side:<13}{len(rows):>6}{_pct(side, len(rows)):>10}"
            f"{_pct(right, len(rows)):>11}  {others}"
        )
        per_cause[cause] = {
            "n": len(rows),
            "side_accuracy": side / len(rows),
            "cause_accuracy": right / len(rows),
        }

    side_ok = sum(o.side_correct for o in failed)
    cause_ok = sum(o.cause_correct for o in failed)
    no_effect = len(outcomes) - len(failed)
    print(
        f"\nOverall: side accuracy {_pct(side_ok, len(failed)).strip()} "
        f"({side_ok}/{len(failed)}), cause accuracy {_pct(cause_ok, len(failed)).strip()} "
        f"({cause_ok}/{len(failed)}); {no_effect} faulted episode(s) still succeeded (not scored)"
    )

    # ------------------------------------------------------------------ control failures
    gaps = [task for task in tasks if task.reference_plan and not controls.get(task.id, True)]
    print(f"\nControl: the clean default Harness fails {len(gaps)} of {len(controls)} tasks")
    for task in gaps[:10]:
        found = diagnose(run_harness(task, SkillSensitiveBackend(task)))
        if found is not None:
            print(f"  {task.id}: {found.side}/{found.cause}: {found.reason}")

    wrong = [o for o in failed if not o.side_correct]
    if wrong:
        print(f"\nMisattributed sides ({len(wrong)}), first 10:")
        for o in wrong[:10]:
            assert o.diagnosis is not None
            print(
                f"  {o.source} {o.task_id}: expected {o.expected_side}/{o.expected_cause}, "
                f"got {o.diagnosis.side}/{o.diagnosis.cause}: {o.diagnosis.reason}"
            )

    summary: dict[str, object] = {
        "tasks": len(tasks),
        "stride": args.stride,
        "detours": args.detours,
        "seconds": round(elapsed, 1),
        "episodes": len(outcomes),
        "failed": len(failed),
        "side_accuracy": side_ok / len(failed) if failed else None,
        "cause_accuracy": cause_ok / len(failed) if failed else None,
        "confusion": {e: {p: matrix[(e, p)] for p in SIDES} for e in SIDES},
        "per_source": per_source,
        "per_cause": per_cause,
        "control_failures": [t.id for t in gaps],
    }
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


# =========================================================================== replay labels


def _ci(hits: int, n: int) -> list[float] | None:
    return [round(x, 4) for x in wilson_interval(hits, n)] if n else None


def score_replay(rows: list[tuple[str, Trajectory, ReplayLabel]]) -> dict[str, Any]:
    """`qpa diagnose` against replay labels: rows are (source, failed trajectory, its label).

    Side accuracy counts the decided labels (not `unknown`); cause accuracy the labels that name
    a cause. Returns the counts, the confusion matrix (label x diagnosed side), accuracies with
    Wilson intervals and the disagreements."""
    labels: Counter[str] = Counter(label.label for _, _, label in rows)
    confusion: Counter[tuple[str, str]] = Counter()
    side_hits = decided = cause_hits = caused = both = 0
    disagreements: list[dict[str, Any]] = []
    per_source: dict[str, Counter[str]] = defaultdict(Counter)
    for source, trajectory, label in rows:
        found = diagnose(trajectory)
        if found is None:
            raise ValueError(f"{trajectory.id}: diagnose sees a success in a failed trajectory")
        confusion[(label.label, found.side)] += 1
        per_source[source][label.label] += 1
        both += label.fixed_by_both
        if label.label == "unknown":
            continue
        decided += 1
        side_ok = found.side == label.label
        side_hits += side_ok
        per_source[source]["side_correct"] += side_ok
        if label.cause is not None:
            caused += 1
            cause_hits += found.cause == label.cause
        if not side_ok or (label.cause is not None and found.cause != label.cause):
            disagreements.append(
                {
                    "source": source,
                    "trajectory": trajectory.id,
                    "label": f"{label.label}/{label.cause}",
                    "diagnosed": f"{found.side}/{found.cause}",
                    "replay": label.reason,
                    "diagnosis": found.reason,
                }
            )
    return {
        "failures": len(rows),
        "labels": {name: labels[name] for name in LABELS},
        "decided": decided,
        "confusion": {lab: {side: confusion[(lab, side)] for side in SIDES} for lab in LABELS},
        "side_accuracy": side_hits / decided if decided else None,
        "side_accuracy_ci": _ci(side_hits, decided),
        "with_cause": caused,
        "cause_accuracy": cause_hits / caused if caused else None,
        "cause_accuracy_ci": _ci(cause_hits, caused),
        "fixed_by_both": both,
        "per_source": {k: dict(v) for k, v in sorted(per_source.items())},
        "disagreements": disagreements,
    }


def _run_preset(run: Path) -> Any:
    """The run's preset, as far as replay reads it (the first Harness, the revision's caps, the
    evaluation's settings) on top of the named preset's defaults: a run written by another
    version of qpa, whose other sections no longer validate, still replays."""
    from qpa.harness.agent import HarnessConfig
    from qpa.loop.presets import EvalSettings, RevisionSettings, get_preset

    path = run / "preset.json"
    if not path.exists():
        raise SystemExit(f"--replay {run}: no preset.json (not a `qpa loop` run folder)")
    raw = json.loads(path.read_text())
    return get_preset(raw.get("name", "local")).model_copy(
        update={
            "harness": HarnessConfig.model_validate(raw["harness"]),
            "revision": RevisionSettings.model_validate(raw["revision"]),
            "eval": EvalSettings.model_validate(raw["eval"]),
        }
    )


def _replay_variants(run: Path, preset: Any) -> list[Any]:
    """The Harness variants a failure is replayed under: the run's revised Harness and the
    widest Harness its model was trained for (the last rung of the loop's Harness ladder: the
    revision's caps on tools, adapter budget and memory; the revision's turn cap)."""
    from qpa.harness.agent import HarnessConfig
    from qpa.loop.stages import harness_ladder

    widest = harness_ladder(preset)[-1]
    wide = widest.model_copy(
        update={
            "version": "harness-wide",
            "max_turns": max(widest.max_turns, preset.revision.max_turns_cap),
        }
    )
    variants = []
    revision = run / "stages" / "harness_revision" / "done.json"
    if revision.exists():
        data = json.loads(revision.read_text())["outputs"]["harness"]
        variants.append(HarnessConfig.model_validate(data))
    return [*variants, wide]


def replay_main(args: argparse.Namespace) -> dict[str, Any]:
    """Label the failures of a loop run by replay and score `qpa diagnose` against them."""
    from qpa.contract import read_trajectories
    from qpa.harness.agent import HarnessConfig
    from qpa.train.greedy import load_model
    from qpa.train.replay import ModelRunner, label_failures

    run: Path = args.replay
    preset = _run_preset(run)
    variants = _replay_variants(run, preset)
    started = time.perf_counter()
    rows: list[tuple[str, Trajectory, ReplayLabel]] = []
    stages = [s for s in args.stages.split(",") if s]
    splits = [s for s in args.splits.split(",") if s]
    for stage in stages:
        done = run / "stages" / stage / "done.json"
        if not done.exists():
            raise SystemExit(f"--replay {run}: stage {stage} has not finished ({done} missing)")
        outputs = json.loads(done.read_text())["outputs"]
        harness = HarnessConfig.model_validate(outputs["harness"])
        model, tokenizer = load_model(run / outputs["model"])
        runner = ModelRunner(
            model,
            tokenizer,
            label=stage,
            max_new_tokens=preset.eval.max_new_tokens,
            workers=preset.eval.workers,
        )
        for split in splits:
            if split not in outputs:
                continue
            episodes = list(read_trajectories(run / outputs[split]["trajectories"]))
            failures = [t for t in episodes if not t.success]
            failed = len(failures)
            if args.limit is not None and len(failures) > args.limit:
                # evenly spaced over the split (tasks are in template order): every template
                failures = failures[:: -(-len(failures) // args.limit)][: args.limit]
            t0 = time.perf_counter()
            labels = label_failures(
                failures,
                runner,
                harness=harness,
                variants=variants,
                max_substitutions=args.substitutions,
            )
            print(
                f"{stage}/{split}: {failed} of {len(episodes)} episodes failed, "
                f"{len(failures)} labelled in {time.perf_counter() - t0:.1f} s",
                flush=True,
            )
            rows += [(f"{stage}/{split}", t, lab) for t, lab in zip(failures, labels, strict=True)]
    elapsed = time.perf_counter() - started
    scored = score_replay(rows)
    _print_replay(scored, run, variants, args.substitutions, elapsed)
    summary: dict[str, Any] = {
        "run": str(run),
        "stages": stages,
        "splits": splits,
        "substitutions": args.substitutions,
        "variants": [v.version for v in variants],
        "seconds": round(elapsed, 1),
        **scored,
    }
    if args.labels is not None:
        with open(args.labels, "w", encoding="utf-8") as stream:
            for source, _, label in rows:
                stream.write(json.dumps({"source": source, **label.model_dump()}) + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _print_replay(
    scored: dict[str, Any], run: Path, variants: list[Any], substitutions: int, elapsed: float
) -> None:
    print(
        f"\nDiagnosis accuracy on replay labels: {run}, {scored['failures']} failures, "
        f"Harness variants {[v.version for v in variants]}, up to {substitutions} oracle "
        f"step(s) substituted, {elapsed:.1f} s"
    )
    print("labels: " + ", ".join(f"{k} {n}" for k, n in scored["labels"].items()))
    print("\nConfusion matrix (rows: replay label, columns: `qpa diagnose` side)")
    print(f"{'':<14}" + "".join(f"{s:>13}" for s in SIDES) + f"{'total':>9}")
    for label, row in scored["confusion"].items():
        counts = [row[s] for s in SIDES]
        print(f"{label:<14}" + "".join(f"{n:>13}" for n in counts) + f"{sum(counts):>9}")

    def fmt(key: str, n: int) -> str:
        value, ci = scored[key], scored[f"{key}_ci"]
        if value is None:
            return "-"
        return f"{100 * value:.1f}% [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}] of {n}"

    print(f"\nside accuracy (decided labels): {fmt('side_accuracy', scored['decided'])}")
    print(f"cause accuracy (labels with a cause): {fmt('cause_accuracy', scored['with_cause'])}")
    print(f"fixed both by the oracle's step and by a Harness variant: {scored['fixed_by_both']}")
    for source, counts in scored["per_source"].items():
        print(f"  {source}: {dict(counts)}")
    if scored["disagreements"]:
        print(f"\nDisagreements ({len(scored['disagreements'])}), first 10:")
        for row in scored["disagreements"][:10]:
            print(
                f"  {row['source']} {row['trajectory']}: replay {row['label']} "
                f"({row['replay']}); diagnose {row['diagnosed']}: {row['diagnosis']}"
            )


if __name__ == "__main__":
    main()
