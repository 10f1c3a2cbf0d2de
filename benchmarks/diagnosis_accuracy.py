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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

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

from qpa.diagnose import SIDES  # noqa: E402
from qpa.diagnose.attribution import diagnose  # noqa: E402
from qpa.envs.sandbox.suite import generate_suite  # noqa: E402


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
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    main()
