"""Seconds per RL step on qpa environments: qpa's own trainer vs TRL's `GRPOTrainer` with qpa's
rollout and CARE reward (`qpa.train.trl_grpo`), side by side in one process.

Both train the same tiny Qwen3 checkpoint on the same tasks, with the same group size, the same
multi-turn Harness episodes (`--max-turns`, `--max-new-tokens` per model call, protocol stops
on) in the same sandbox with the stand-in verifier of `benchmarks/rl_step.py` (a random tiny
model never solves a task, so the outcome pattern gives groups a spread), CARE on, no KL, one
PPO iteration, token-level loss (qpa `token_mean`, TRL `dapo`), one optimizer step per step:

- **qpa**: `RLTrainer.train_step()` (rollout through the Harness, CARE scoring, packed samples,
  update), the `step_s` it records.
- **TRL**: `GRPOTrainer.train()` built by `build_grpo_trainer(reward="care",
  scale_rewards="none")`; its per-step `step_time` (generation through `QpaRollout`, TRL's
  reward and advantage bookkeeping, its loss and optimizer).

What differs by design (see docs/ecosystem.md, "TRL GRPOTrainer"): TRL trains one packed
sequence per episode and leaves out turns that do not extend it (reported as
`unpacked_turns`); qpa trains those as sequences of their own. The first step of each side is
warm-up and excluded; medians of the rest.

Usage: `python benchmarks/trl_grpo_step.py [--steps 4] [--tasks 2] [--k 2] [--max-new-tokens 8]
[--max-turns 2] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_step import build_inputs, pattern_env


def harness(max_turns: int) -> dict[str, Any]:
    return {"token_budget": 100, "max_tools": 1, "max_turns": max_turns}


def run_qpa(checkpoint: Path, tasks: list[Any], args: argparse.Namespace, out: Path) -> dict:
    from qpa.train.rl import RLConfig, RLTrainer

    config = RLConfig.model_validate(
        {
            "name": "bench-qpa",
            "model": str(checkpoint),
            "output_dir": str(out),
            "steps": args.steps,
            "tasks_per_step": args.tasks,
            "samples_per_task": args.k,
            "seed": 0,
            "device": "cpu",
            "harness": harness(args.max_turns),
            "generation": {"max_new_tokens": args.max_new_tokens},
            "loss": {"micro_batch_size": args.tasks * args.k * args.max_turns},
            "optim": {"learning_rate": 1e-5},
            "care": {"enabled": True},
            "checkpoint": {"every_steps": 10_000, "save_final": False},
            "metrics": {"logging_steps": 1},
        }
    )
    trainer = RLTrainer(config, tasks=tasks, environment=pattern_env)
    metrics = [trainer.train_step().metrics for _ in range(args.steps)]
    times = [m["step_s"] for m in metrics]
    return {
        "step_s": times,
        "median_step_s": statistics.median(times[1:]),
        "rollout_s": [m["rollout_s"] for m in metrics],
    }


def run_trl(checkpoint: Path, tasks: list[Any], args: argparse.Namespace, out: Path) -> dict:
    from trl import GRPOConfig

    from qpa.train.trl_grpo import QpaRolloutSettings, build_grpo_trainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.tasks * args.k,
        num_generations=args.k,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps,
        learning_rate=1e-5,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    settings = QpaRolloutSettings(
        harness=harness(args.max_turns), max_new_tokens=args.max_new_tokens
    )
    trainer, rollout = build_grpo_trainer(
        checkpoint, tasks, config, settings=settings, reward="care", environment=pattern_env
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    times = [float(h["step_time"]) for h in logs]
    return {
        "step_s": times,
        "median_step_s": statistics.median(times[1:]),
        "unpacked_turns": [h.get("qpa/unpacked_turns", 0.0) for h in logs],
        "rollout_s": [h.get("qpa/rollout_s", 0.0) for h in logs],
        "episodes": len(rollout.trajectories),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is warm-up)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoint, tasks, _ = build_inputs(work, args.tasks, args.hidden)
        qpa = run_qpa(checkpoint, tasks, args, work / "qpa")
        trl = run_trl(checkpoint, tasks, args, work / "trl")
    load = os.getloadavg()[0]
    print(
        f"RL step on qpa environments ({args.tasks} tasks x k={args.k}, up to {args.max_turns} "
        f"turns of {args.max_new_tokens} tokens, tiny Qwen3 hidden {args.hidden}, CPU, "
        f"{os.cpu_count()} cores, load average {load:.1f}); median of {args.steps - 1} steps "
        "after one warm-up"
    )
    print(
        f"  qpa RLTrainer:                  {qpa['median_step_s']:.3f} s/step, "
        f"rollout {statistics.median(qpa['rollout_s'][1:]):.3f} s"
    )
    print(
        f"  TRL GRPOTrainer + QpaRollout:   {trl['median_step_s']:.3f} s/step, "
        f"rollout {statistics.median(trl['rollout_s'][1:]):.3f} s "
        f"(unpacked turns per step {trl['unpacked_turns']})"
    )
    print(f"  total {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"qpa": qpa, "trl": trl, "args": vars(args)}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
