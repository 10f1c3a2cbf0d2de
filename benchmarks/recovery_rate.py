"""Recovery rate of checkpoints on test tasks with one injected transient error per episode.

    .venv/bin/python benchmarks/recovery_rate.py \
        untrained=runs/base/stages/tiny/checkpoint sft=runs/base/stages/sft/run/final
    .venv/bin/python benchmarks/recovery_rate.py sft=DIR --tasks heldout_test.jsonl --json out.json

Each `label=checkpoint` is evaluated greedily through the Harness (`--harness` YAML, default the
preset's first Harness) on the test tasks (`--tasks` JSONL, default the canonical test split of
the preset's curriculum templates) with `qpa.train.recovery_eval.evaluate_recovery`: the first
state-changing call of every episode is answered with a transient error that leaves the world
untouched, so an episode succeeds only if the model calls again. Printed per checkpoint:
episodes that met the error, recovered (succeeded), the recovery rate with its 95% Wilson
interval, and how many retried the same call at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="label=checkpoint folder")
    parser.add_argument("--preset", default="local")
    parser.add_argument(
        "--tasks",
        type=Path,
        default=None,
        help="test tasks (JSONL), e.g. a loop run's stages/heldout/test.jsonl (default: the "
        "canonical test split of the preset's templates)",
    )
    parser.add_argument("--harness", type=Path, default=None, help="Harness YAML")
    parser.add_argument("--out", type=Path, default=Path("runs/recovery_rate"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args(argv)

    from qpa.harness.factory import load_harness_config
    from qpa.loop.presets import get_preset
    from qpa.loop.stages import curriculum, quiet_libraries, read_task_file
    from qpa.train.greedy import load_model
    from qpa.train.recovery_eval import evaluate_recovery

    quiet_libraries()
    preset = get_preset(args.preset)
    tasks = read_task_file(args.tasks) if args.tasks else curriculum(preset, "test")
    harness = load_harness_config(args.harness) if args.harness else preset.harness
    results: dict[str, Any] = {}
    for item in args.models:
        label, _, folder = item.partition("=")
        if not folder:
            parser.error(f"{item!r}: write label=checkpoint")
        started = time.perf_counter()
        model_dir = Path(folder)
        summary = evaluate_recovery(
            model_dir,
            tasks,
            harness,
            args.out / label,
            label=label,
            max_new_tokens=preset.eval.max_new_tokens,
            workers=preset.eval.workers,
            seed=args.seed,
            loaded=load_model(model_dir),
        )
        summary["checkpoint"] = str(model_dir)
        summary["elapsed_s"] = round(time.perf_counter() - started, 1)
        results[label] = summary
        low, high = summary["ci"]
        rate = summary["rate"]
        print(
            f"{label}: {summary['recovered']}/{summary['episodes_with_error']} recovered "
            f"(rate {'n/a' if rate is None else f'{rate:.1%}'}, 95% CI [{low:.1%}, {high:.1%}]); "
            f"{summary['retried']} retried the same call; {summary['episodes']} episodes on "
            f"{len(tasks)} tasks, {summary['elapsed_s']}s",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
