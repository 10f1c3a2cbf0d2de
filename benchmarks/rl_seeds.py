"""RL over SFT over several RL seeds: is the RL gain of a `qpa loop` run more than one seed's luck?

    .venv/bin/python benchmarks/rl_seeds.py --loop runs/loop-local --out runs/rl-seeds
    .venv/bin/python benchmarks/rl_seeds.py --loop DIR --out OUT --seeds 0 1000 2000 [--jobs 2]

`--loop` is a `qpa loop` folder whose stages up to `round2` have finished (the SFT checkpoint,
Harness v2 and its evaluation, the RL pool); it is only read. For every seed, `OUT/seed-<K>`
gets the loop's finished stages up to `round2` (hard links where the file system allows) and runs
the loop's `rl` and `eval_rl` stages with the loop's preset and `rl.seed: K`: the same SFT
checkpoint, Harness, RL pool and budget, only the RL stage's randomness (task draws, sampled
episodes) differs. Seed 0 is the loop's own RL run when the loop ran with seed 0. Finished seeds
are reused (the stages' done-markers), so a stopped run resumes.

Printed, on the held-out test split (greedy, Harness v2 in both): per seed the RL model's success
with a Wilson 95% interval and McNemar's exact test against the SFT model under the same Harness
(`eval_harness`), b = tasks only SFT solves, c = only RL; then pooled over the seeds: the mean
success, the per-task difference (RL's success averaged over seeds minus SFT's) with a paired
bootstrap 95% interval and a two-sided sign-flip permutation p-value on those per-task
differences (each task one unit, so the shared SFT result is not counted once per seed). The last
line is a JSON object with the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from qpa.bench.stats import mcnemar_exact, paired_bootstrap, wilson_interval

RL_STAGES = ("rl", "eval_rl", "eval_recovery")
"""Stages a seed's folder recomputes (and so never copies from the loop)."""


def _link_tree(source: Path, target: Path) -> None:
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link, dirs_exist_ok=True)


def prepare(loop: Path, folder: Path) -> None:
    """A seed's folder: the loop's finished stages, less the ones this benchmark reruns."""
    stages = loop / "stages"
    for stage in sorted(p for p in stages.iterdir() if p.is_dir()):
        if stage.name not in RL_STAGES and not (folder / "stages" / stage.name).exists():
            _link_tree(stage, folder / "stages" / stage.name)


def run_seed(loop: Path, out: Path, seed: int) -> Path:
    """Run `rl` and `eval_rl` with `rl.seed = seed` in `OUT/seed-<seed>`; returns the folder."""
    from qpa.loop.presets import LoopPreset
    from qpa.loop.run import run_loop

    preset = LoopPreset.model_validate_json((loop / "preset.json").read_text())
    preset = preset.model_copy(update={"rl": preset.rl.model_copy(update={"seed": seed})})
    folder = out / f"seed-{seed}"
    prepare(loop, folder)
    run_loop(preset, folder, stages=["eval_rl"], report=False, capture=True)
    return folder


def outcomes(folder: Path, stage: str) -> dict[str, bool]:
    """Task id -> greedy success on the test split of an evaluation stage."""
    from qpa.loop.stages import read_marker, read_trajectories

    marker = read_marker(folder, stage)
    if marker is None:
        raise SystemExit(f"{folder}: stage {stage} has not finished")
    test = marker["outputs"]["test"]
    return {t.task.id: t.success for t in read_trajectories(folder / test["trajectories"])}


def sign_flip_p(differences: Sequence[float], rounds: int = 20000, seed: int = 0) -> float:
    """Two-sided p of the mean paired difference, by random sign flips (Monte Carlo, +1 rule)."""
    observed = abs(sum(differences))
    nonzero = [d for d in differences if d]
    rng = random.Random(seed)
    hits = sum(
        abs(sum(d if rng.random() < 0.5 else -d for d in nonzero)) >= observed - 1e-12
        for _ in range(rounds)
    )
    return (hits + 1) / (rounds + 1)


def summarise(sft: dict[str, bool], by_seed: dict[int, dict[str, bool]]) -> dict[str, Any]:
    tasks = sorted(set(sft).intersection(*(set(o) for o in by_seed.values())))
    per_seed: list[dict[str, Any]] = []
    for seed, rl in by_seed.items():
        test = mcnemar_exact([sft[t] for t in tasks], [rl[t] for t in tasks])
        solved = sum(rl[t] for t in tasks)
        low, high = wilson_interval(solved, len(tasks))
        per_seed.append({
            "seed": seed, "solved": solved, "success": solved / len(tasks),
            "ci": [round(low, 4), round(high, 4)], "b": test.b, "c": test.c,
            "p_value": test.p_value,
        })  # fmt: skip
    mean_rl = [statistics.fmean(by_seed[s][t] for s in by_seed) for t in tasks]
    base = [float(sft[t]) for t in tasks]
    difference, low, high = paired_bootstrap(base, mean_rl)
    return {
        "tasks": len(tasks),
        "sft_solved": int(sum(base)),
        "sft_success": sum(base) / len(tasks),
        "seeds": per_seed,
        "rl_mean_success": statistics.fmean(s["success"] for s in per_seed),
        "difference": difference,
        "difference_ci": [low, high],
        "p_value": sign_flip_p([r - b for r, b in zip(mean_rl, base, strict=True)]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", type=Path, required=True, help="a `qpa loop` folder (read only)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1000, 2000])
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once")
    args = parser.parse_args(argv)
    loop, out = args.loop.resolve(), args.out.resolve()
    from qpa.loop.stages import read_marker

    missing = [s for s in ("round2", "eval_harness") if read_marker(loop, s) is None]
    if missing:
        raise SystemExit(f"{loop}: stages {', '.join(missing)} have not finished")
    out.mkdir(parents=True, exist_ok=True)
    if args.jobs > 1:  # one process per seed at a time: each trains on its own thread(s)
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            n = len(args.seeds)
            folders = list(pool.map(run_seed, [loop] * n, [out] * n, args.seeds))
    else:
        folders = [run_seed(loop, out, s) for s in args.seeds]
    sft = outcomes(loop, "eval_harness")
    result = summarise(
        sft, {s: outcomes(f, "eval_rl") for s, f in zip(args.seeds, folders, strict=True)}
    )
    n = result["tasks"]
    print(f"held-out test tasks: {n}; SFT (Harness v2): {result['sft_solved']}/{n}")
    print("| RL seed | solved | success (Wilson 95%) | b (only SFT) | c (only RL) | McNemar p |")
    print("|---|---|---|---|---|---|")
    for s in result["seeds"]:
        print(f"| {s['seed']} | {s['solved']} | {100 * s['success']:.1f}% "
              f"({100 * s['ci'][0]:.1f}-{100 * s['ci'][1]:.1f}) | {s['b']} | {s['c']} | "
              f"{s['p_value']:.3g} |")  # fmt: skip
    low, high = result["difference_ci"]
    print(f"pooled: RL mean {100 * result['rl_mean_success']:.1f}% vs SFT "
          f"{100 * result['sft_success']:.1f}%, difference {100 * result['difference']:+.1f} "
          f"points (95% {100 * low:+.1f} to {100 * high:+.1f}), sign-flip p = "
          f"{result['p_value']:.3g}")  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
