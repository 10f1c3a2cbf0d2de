"""What evaluating on the held-out sets costs: one eval stage's work, timed, on a loop's SFT model.

    .venv/bin/python benchmarks/heldout_eval_time.py --loop runs/loop-local --samples 4
    .venv/bin/python benchmarks/heldout_eval_time.py --loop DIR --samples 2 4 --json t.json

Reads the SFT checkpoint (or `--model`, e.g. an intermediate `checkpoint-N` of a running SFT)
and the round-1 training tasks of `qpa loop --preset P --out DIR` (read only: it writes under
`--out`, default a temporary folder), builds the preset's held-out
sets exactly as the `heldout` stage does (`qpa.loop.stages.make_heldout`), then times, through
Harness v1 like `eval_sft`: greedy episodes on validation and test (the greedy part of an eval
stage) and, for each k of `--samples`, k sampled episodes per test task at temperature 1 (the
`eval.samples` part). Printed: seconds, episodes and episodes per second of each, and the
greedy success and pass@1 it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="local", choices=["local", "small"])
    parser.add_argument("--loop", type=Path, required=True, help="loop folder (tasks done)")
    parser.add_argument("--model", type=Path, default=None, help="default: the loop's SFT model")
    parser.add_argument("--samples", type=int, nargs="*", default=[4], help="k values to time")
    parser.add_argument("--out", type=Path, default=None, help="where episodes go (default tmp)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON")
    args = parser.parse_args(argv)

    from qpa.loop.presets import get_preset
    from qpa.loop.stages import make_heldout, quiet_libraries, read_marker, read_task_file
    from qpa.train.greedy import evaluate, evaluate_sampled, load_model

    quiet_libraries()
    preset = get_preset(args.preset)
    sft = read_marker(args.loop, "sft")
    tasks = read_marker(args.loop, "tasks")
    if tasks is None:
        print(f"{args.loop}: the tasks stage has not finished", file=sys.stderr)
        return 2
    if args.model is not None:
        model_dir = args.model
    elif sft is not None:
        model_dir = args.loop / sft["outputs"]["checkpoint"]
    else:
        print(f"{args.loop}: the sft stage has not finished (pass --model)", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="heldout-eval-"))
    clock = time.perf_counter()
    sets, _ = make_heldout(preset, read_task_file(args.loop / tasks["outputs"]["train_tasks"]))
    rows: list[dict[str, Any]] = [
        {
            "what": "make_heldout",
            "seconds": round(time.perf_counter() - clock, 1),
            "episodes": sum(len(v) for v in sets.values()),
        }
    ]
    loaded = load_model(model_dir)
    settings = preset.eval
    greedy_total = 0.0
    for split, split_tasks in sets.items():
        clock = time.perf_counter()
        summary = evaluate(
            model_dir,
            split_tasks,
            preset.harness,
            out / split,
            label="sft",
            max_new_tokens=settings.max_new_tokens,
            workers=settings.workers,
            loaded=loaded,
        )
        seconds = time.perf_counter() - clock
        greedy_total += seconds
        rows.append(
            {
                "what": f"greedy {split}",
                "seconds": round(seconds, 1),
                "episodes": len(split_tasks),
                "success": summary["success"],
            }
        )
    rows.append({"what": "greedy validation + test", "seconds": round(greedy_total, 1)})
    for k in args.samples:
        clock = time.perf_counter()
        sampled = evaluate_sampled(
            model_dir,
            sets["test"],
            preset.harness,
            out / f"test_sampled_k{k}",
            label="sft",
            samples=k,
            temperature=settings.sample_temperature,
            max_new_tokens=settings.max_new_tokens,
            workers=settings.workers,
            loaded=loaded,
        )
        rows.append(
            {
                "what": f"sampled test, k={k}",
                "seconds": round(time.perf_counter() - clock, 1),
                "episodes": sampled["episodes"],
                "pass_at_1": sampled["pass_at_1"],
            }
        )
    for row in rows:
        rate = (
            f", {row['episodes'] / row['seconds']:.1f} episodes/s"
            if row.get("episodes") and row["seconds"]
            else ""
        )
        extra = "".join(f", {key} {row[key]:.1%}" for key in ("success", "pass_at_1") if key in row)
        print(
            f"{row['what']}: {row['seconds']:.1f} s"
            + (f", {row['episodes']} episodes" if "episodes" in row else "")
            + rate
            + extra
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
