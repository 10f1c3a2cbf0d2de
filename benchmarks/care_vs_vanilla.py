"""CARE vs vanilla GRPO: same starting checkpoint, same budget, several seeds, held-out test.

    .venv/bin/python benchmarks/care_vs_vanilla.py                    # preset local, seeds 0 1 2
    .venv/bin/python benchmarks/care_vs_vanilla.py --loop runs/loop-local --seeds 0 1 2 3
    .venv/bin/python benchmarks/care_vs_vanilla.py --preset small --seeds 0 1 2   # quick check

The starting point is the loop's own: the SFT checkpoint, the revised Harness (v2) and the
round-2 RL task pool of `qpa loop --preset P --out DIR` (the loop is run, or resumed, up to
those stages first). For every seed, RL runs twice from that checkpoint with the preset's RL
budget (steps x tasks per step x samples per task, the same learning rate and sampling): once
with CARE (`care.enabled: true`), once as vanilla GRPO (`--care off`: outcome reward, group
standardisation). Each final model is evaluated greedily on the held-out test split through the
same Harness. Printed side by side: test success and output tokens per solved task, mean and
standard deviation over seeds (and each seed), plus the output tokens per episode of the last
RL step's rollouts. Runs are resumable: finished ones are read back from
`DIR/benchmarks/care_vs_vanilla/<mode>-seed<k>/summary.json`.

The source work reports 32.5% fewer output tokens at equal accuracy for CARE; what a tiny model
on a few CPU minutes shows is printed as measured, with its spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    if len(values) == 1:
        return values[0], 0.0
    return statistics.fmean(values), statistics.stdev(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="local", choices=["local", "small"])
    parser.add_argument("--loop", type=Path, default=None, help="loop folder (default runs/loop-P)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--loop-seed", type=int, default=0, help="seed of the loop run")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from qpa.harness.agent import HarnessConfig
    from qpa.loop.presets import get_preset
    from qpa.loop.run import run_loop
    from qpa.loop.stages import (
        curriculum,
        quiet_libraries,
        read_marker,
        read_task_file,
        seed_everything,
        stage_seed,
        train_rl,
    )
    from qpa.train.greedy import evaluate

    console = Console()
    quiet_libraries()
    preset = get_preset(args.preset, seed=args.loop_seed)
    root = (args.loop or Path("runs") / f"loop-{preset.name}").resolve()
    console.print(f"[bold]loop[/] {root}: SFT checkpoint, Harness revision, round-2 pool")
    run_loop(preset, root, console=console, stages=["round2"], report=False)
    sft = read_marker(root, "sft")
    revision = read_marker(root, "harness_revision")
    round2 = read_marker(root, "round2")
    assert sft and revision and round2, "the loop's stages did not finish"
    checkpoint = root / sft["outputs"]["checkpoint"]
    harness = HarnessConfig.model_validate(revision["outputs"]["harness"])
    pool = read_task_file(root / round2["outputs"]["rl_pool"])
    test = curriculum(preset, "test")
    rl = preset.rl
    console.print(
        f"budget per run: {rl.steps} steps x {rl.tasks_per_step} tasks x {rl.samples_per_task} "
        f"samples, lr {rl.learning_rate:g}; from {checkpoint.relative_to(root)}, "
        f"Harness {harness.version}; test split: {len(test)} tasks"
    )

    bench = root / "benchmarks" / "care_vs_vanilla"
    rows: dict[str, list[dict[str, Any]]] = {"CARE": [], "vanilla GRPO": []}
    for seed in args.seeds:
        for label, care in (("CARE", True), ("vanilla GRPO", False)):
            folder = bench / f"{'care' if care else 'vanilla'}-seed{seed}"
            summary_path = folder / "summary.json"
            if summary_path.exists():
                rows[label].append(json.loads(summary_path.read_text()))
                continue
            started = time.perf_counter()
            run_seed = stage_seed(seed, "rl")
            seed_everything(run_seed)
            trained = train_rl(
                folder / "run", preset, checkpoint, harness, pool, seed=run_seed, care=care
            )
            result = evaluate(
                Path(trained["checkpoint"]),
                test,
                harness,
                folder / "test",
                label=f"rl-{'care' if care else 'vanilla'}-{seed}",
                max_new_tokens=preset.eval.max_new_tokens,
                workers=preset.eval.workers,
            )
            summary = {
                "seed": seed,
                "care": care,
                "test_success": result["success"],
                "output_tokens_per_solved_task": result["output_tokens_per_solved_task"],
                "output_tokens_per_task": result["output_tokens_per_task"],
                "rollout_output_tokens_last_step": trained["output_tokens_by_step"][-1],
                "rollout_success_by_step": trained["success_rate_by_step"],
                "care_tier_share": trained["care_tier_share"],
                "seconds": round(time.perf_counter() - started, 1),
            }
            folder.mkdir(parents=True, exist_ok=True)
            summary_path.write_text(json.dumps(summary, indent=2) + "\n")
            rows[label].append(summary)
            console.print(
                f"  {label:13s} seed {seed}: test {summary['test_success']:.1%}, "
                f"{summary['output_tokens_per_solved_task'] or float('nan'):.1f} tokens/solved "
                f"({summary['seconds']:.0f} s)"
            )

    table = Table(title=f"CARE vs vanilla GRPO ({preset.name}, {len(args.seeds)} seeds, test)")
    for column in (
        "method",
        "test success",
        "tokens / solved task",
        "tokens / task",
        "rollout tokens (last step)",
        "per seed (success, tokens/solved)",
    ):
        table.add_column(column, justify="left" if column == "method" else "right")
    out: dict[str, Any] = {"preset": preset.name, "loop": str(root), "seeds": args.seeds}
    for label, items in rows.items():
        success = _mean_std([r["test_success"] for r in items])
        solved = _mean_std(
            [
                r["output_tokens_per_solved_task"]
                for r in items
                if r["output_tokens_per_solved_task"] is not None
            ]
        )
        per_task = _mean_std([r["output_tokens_per_task"] for r in items])
        rollout = _mean_std([r["rollout_output_tokens_last_step"] for r in items])
        table.add_row(
            label,
            f"{100 * success[0]:.1f}% ± {100 * success[1]:.1f}",
            f"{solved[0]:.1f} ± {solved[1]:.1f}",
            f"{per_task[0]:.1f} ± {per_task[1]:.1f}",
            f"{rollout[0]:.1f} ± {rollout[1]:.1f}",
            "; ".join(
                f"{100 * r['test_success']:.0f}%, {r['output_tokens_per_solved_task'] or 0:.0f}"
                for r in items
            ),
        )
        out[label] = {
            "test_success_mean": success[0],
            "test_success_std": success[1],
            "output_tokens_per_solved_task_mean": solved[0],
            "output_tokens_per_solved_task_std": solved[1],
            "runs": items,
        }
    console.print(table)
    care_tokens = out["CARE"]["output_tokens_per_solved_task_mean"]
    vanilla_tokens = out["vanilla GRPO"]["output_tokens_per_solved_task_mean"]
    if vanilla_tokens and vanilla_tokens == vanilla_tokens and care_tokens == care_tokens:
        change = 100 * (care_tokens - vanilla_tokens) / vanilla_tokens
        out["care_token_change_percent"] = change
        console.print(
            f"CARE output tokens per solved task vs vanilla: {change:+.1f}% "
            "(the source work reports -32.5% at equal accuracy)"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
