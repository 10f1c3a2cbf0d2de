"""RL seconds per step (rollout + update): qpa's online loop vs plain TRL `GRPOTrainer`.

Both run in one process, one after the other, on the same tiny Qwen3 checkpoint, the same
prompts, the same group size and sampling settings, and the same loss:

- **Prompts.** For each task, the exact first-turn prompt the Harness renders (system prompt with
  Scenario Adapter text, tool protocol, instruction and reset observation, ChatML). TRL gets it
  as a plain-text prompt; qpa renders it itself inside each episode.
- **Work per step.** `tasks x k` sampled completions of `max_new_tokens` (temperature 1, top-k 0,
  top-p 1; qpa's protocol stop tokens off so both stop only at eos), one batched `generate` for
  all of them, then one forward/backward over all sequences (one micro-batch) and one AdamW
  step. Loss: token-level clipped surrogate (TRL's default `dapo` = qpa's `token_mean`), no KL,
  one iteration per batch (ratio 1), rewards with the same non-zero spread (a fixed pattern per
  completion index, since a random tiny model never solves a task), and qpa does not skip
  zero-advantage samples here.
- **What only qpa does** (the overhead measured): a real episode per sample: sandbox reset and
  verify, Harness start (Scenario Adapter, Skills, memory), rendering, parsing the output into an
  action, the Harness's feedback, the thread pool and batcher, CARE scoring, sample building.
  TRL computes rewards from completion text alone and runs its own bookkeeping (metrics,
  gathering, logging), which is part of its time.

The first step of each side is warm-up and is excluded; the median of the rest is reported.
Usage: `python benchmarks/rl_step.py [--steps 4] [--tasks 4] [--k 4] [--max-new-tokens 32]
[--json out.json]`. Bounded: each side stops early past its share of `--budget-s` (default 150).

`--ranks 1,2` measures qpa alone with each world size in turn instead: the ranks are processes
started as torchrun starts them (`qpa.train.deepspeed.local_rank_env`, gloo, one intra-op
thread each), the trainer under DeepSpeed ZeRO-`--zero` (0: plain PyTorch, gradients averaged
by all-reduce). `--tasks` is per rank (as `tasks_per_step` is), so 2 ranks do twice the
episodes of 1 in a step; the table gives seconds per step, its rollout and update parts, and
episodes per second over all ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PATTERN = (1.0, 0.0, 1.0, 1 / 3, 1.0, 0.0, 2 / 3, 1.0)


def choose_tasks(tasks: int) -> list[Any]:
    """`tasks` short sandbox tasks (the same ones every time)."""
    from qpa.envs.sandbox.suite import generate_suite

    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    return sorted(pool, key=lambda t: len(t.instruction))[:tasks]


def pattern_env(index: int) -> Any:
    """The sandbox with a stand-in verifier: episode `index`'s outcome is PATTERN's."""
    from qpa.contract import Verification
    from qpa.envs.sandbox import SandboxEnv

    class PatternSandbox(SandboxEnv):
        def verify(self) -> Verification:
            progress = PATTERN[index % len(PATTERN)]
            return Verification(done=True, success=progress == 1.0, progress=progress)

    return PatternSandbox()


def build_inputs(workdir: Path, tasks: int, hidden: int) -> tuple[Path, list[Any], list[str]]:
    """A tiny checkpoint, `tasks` short sandbox tasks, and their first-turn Harness prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qpa.envs.sandbox import SandboxEnv
    from qpa.harness.agent import HarnessPlanner
    from qpa.harness.backends.local import LocalBackend
    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, suite_corpus

    config = TinyConfig(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=8192,
    )
    checkpoint = make_tiny_checkpoint(
        workdir / "tiny", config, corpus=suite_corpus(conversations=6)
    )
    chosen = choose_tasks(tasks)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    backend = LocalBackend.from_loaded(model, tokenizer)
    prompts = []
    for task in chosen:
        env = SandboxEnv()
        planner = HarnessPlanner(backend, harness_config())
        planner.start(task, env.tools(), env.reset(task))
        context = planner._contexts[-1]
        prompts.append(backend.render_prompt(context.messages, context.tools))
    return checkpoint, chosen, prompts


def prompt_length(checkpoint: Path, prompts: list[str]) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    return sum(lengths) / len(lengths)


def harness_config() -> Any:
    from qpa.harness.agent import HarnessConfig

    return HarnessConfig(token_budget=100, max_tools=1, max_turns=1)


def qpa_config(
    checkpoint: Path, args: argparse.Namespace, out: Path, zero: int | None = None
) -> dict[str, Any]:
    """The RL run both modes measure (`zero`: a DeepSpeed ZeRO stage; None or 0: plain)."""
    batch = args.tasks * args.k
    return {
        "name": "bench-qpa",
        "model": str(checkpoint),
        "output_dir": str(out),
        "steps": args.steps,
        "tasks_per_step": args.tasks,
        "samples_per_task": args.k,
        "seed": 0,
        "harness": harness_config().model_dump(),
        "generation": {"max_new_tokens": args.max_new_tokens, "stop_at_action": False},
        "loss": {"micro_batch_size": batch, "skip_zero_advantage": False},
        "optim": {"learning_rate": 1e-5},
        "care": {"enabled": True},
        "checkpoint": {"every_steps": 10_000, "save_final": False},
        "metrics": {"logging_steps": 1},
        "deepspeed": {"enabled": bool(zero), "zero_stage": zero or 2},
    }


def run_qpa(
    checkpoint: Path, tasks: list[Any], args: argparse.Namespace, out: Path, budget_s: float
) -> dict[str, Any]:
    from qpa.train.rl import RLConfig, RLTrainer

    config = RLConfig.model_validate(qpa_config(checkpoint, args, out))
    trainer = RLTrainer(config, tasks=tasks, environment=pattern_env)
    started = time.perf_counter()
    steps: list[dict[str, float]] = []
    while trainer.step < args.steps:
        result = trainer.train_step()
        steps.append(result.metrics)
        if time.perf_counter() - started > budget_s and len(steps) >= 2:
            break
    return summarize(
        [s["step_s"] for s in steps],
        rollout=[s["rollout_s"] for s in steps],
        update=[s["update_s"] for s in steps],
        tokens=[s["output_tokens_mean"] for s in steps],
    )


def run_trl(
    checkpoint: Path, prompts: list[str], args: argparse.Namespace, out: Path, budget_s: float
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    counter = {"n": 0}

    def pattern_reward(completions: list[Any], **_: Any) -> list[float | None]:
        values: list[float | None] = []
        for _completion in completions:
            values.append(PATTERN[counter["n"] % len(PATTERN)])
            counter["n"] += 1
        return values

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.started = time.perf_counter()
            self._t = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self._t = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.times.append(time.perf_counter() - self._t)
            if time.perf_counter() - self.started > budget_s and len(self.times) >= 2:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])
    batch = args.tasks * args.k
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        num_generations=args.k,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps,
        learning_rate=1e-5,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=str(checkpoint),
        reward_funcs=[pattern_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    return summarize(timer.times)


def summarize(times: list[float], **series: list[float]) -> dict[str, Any]:
    measured = times[1:] if len(times) > 1 else times
    out: dict[str, Any] = {
        "steps": len(times),
        "warmup_s": times[0] if times else None,
        "median_step_s": statistics.median(measured) if measured else None,
        "step_s": times,
    }
    for name, values in series.items():
        rest = values[1:] if len(values) > 1 else values
        out[f"median_{name}"] = statistics.median(rest) if rest else None
    return out


def rank_worker(spec_file: Path) -> None:
    """One rank of `--ranks`: the RL steps of the run in the spec; rank 0 writes the timings."""
    import torch

    from qpa.train.rl import RLConfig, RLTrainer

    torch.set_num_threads(1)
    spec = json.loads(spec_file.read_text())
    config = RLConfig.model_validate(spec["config"])
    trainer = RLTrainer(config, tasks=choose_tasks(spec["tasks"]), environment=pattern_env)
    steps = [trainer.train_step().metrics for _ in range(config.steps)]
    if int(os.environ["RANK"]) == 0:
        episodes = [s["episodes"] for s in steps]  # the step's, over every rank
        summary = summarize(
            [s["step_s"] for s in steps],
            rollout=[s["rollout_s"] for s in steps],
            update=[s["update_s"] for s in steps],
            episodes=episodes,
        )
        summary["median_episodes_per_s"] = summary["median_episodes"] / summary["median_step_s"]
        Path(spec["out"]).write_text(json.dumps(summary))


def run_ranks(
    checkpoint: Path, args: argparse.Namespace, work: Path, world_size: int
) -> dict[str, Any]:
    """`world_size` rank processes (torchrun's variables, gloo) running the same RL steps."""
    from qpa.train.deepspeed import free_port, local_rank_env

    folder = work / f"ranks-{world_size}"
    folder.mkdir()
    spec = {
        "config": qpa_config(checkpoint, args, folder / "run", zero=args.zero),
        "tasks": args.tasks,
        "out": str(folder / "result.json"),
    }
    (folder / "spec.json").write_text(json.dumps(spec))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    processes = []
    for rank in range(world_size):
        log = (folder / f"rank{rank}.log").open("w")
        processes.append(
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--rank-worker", "spec.json"],
                cwd=folder,  # not the repository root: its operator/ shadows the stdlib module
                env={**env, **local_rank_env(rank, world_size, port)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = time.monotonic() + args.budget_s * 4
    while any(p.poll() is None for p in processes):
        if any(p.returncode not in (None, 0) for p in processes) or time.monotonic() > deadline:
            for process in processes:
                if process.poll() is None:
                    process.kill()
            break
        time.sleep(0.2)
    codes = [p.wait() for p in processes]
    if any(codes):
        tail = (folder / "rank0.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{world_size} ranks: exit codes {codes}\n{tail}")
    result: dict[str, Any] = json.loads((folder / "result.json").read_text())
    return result


def main_ranks(args: argparse.Namespace) -> None:
    sizes = [int(x) for x in args.ranks.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--ranks {args.ranks!r}: a comma-separated list of world sizes >= 1")
    overall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoint, _, prompts = build_inputs(work, args.tasks, args.hidden)
        prompt_tokens = prompt_length(checkpoint, prompts)
        results = {size: run_ranks(checkpoint, args, work, size) for size in sizes}
    zero = f"DeepSpeed ZeRO-{args.zero}" if args.zero else "plain PyTorch"
    print(
        f"qpa RL step by world size ({zero}, gloo, 1 thread per rank, {os.cpu_count()} cores): "
        f"{args.tasks} tasks x k={args.k} per rank, ~{prompt_tokens:.0f}-token prompts, "
        f"{args.max_new_tokens} new tokens, tiny Qwen3 hidden {args.hidden}; "
        f"median of {args.steps - 1} steps after one warm-up"
    )
    print(f"  {'ranks':>5} {'s/step':>8} {'rollout s':>10} {'update s':>9} {'episodes/s':>11}")
    for size, r in results.items():
        print(
            f"  {size:>5} {r['median_step_s']:>8.3f} {r['median_rollout']:>10.3f} "
            f"{r['median_update']:>9.3f} {r['median_episodes_per_s']:>11.2f}"
        )
    print(f"  total {time.perf_counter() - overall:.0f} s")
    if args.json is not None:
        report = {
            "benchmark": "rl_step_ranks",
            "zero": args.zero,
            "tasks_per_rank": args.tasks,
            "k": args.k,
            "max_new_tokens": args.max_new_tokens,
            "hidden": args.hidden,
            "prompt_tokens_mean": prompt_tokens,
            "ranks": {str(size): r for size, r in results.items()},
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-worker":
        rank_worker(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=4, help="tasks (prompts) per step")
    parser.add_argument("--k", type=int, default=4, help="samples per task")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128, help="tiny model hidden size")
    parser.add_argument("--budget-s", type=float, default=150.0, help="both sides together")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--ranks", default=None, help="world sizes to compare, e.g. 1,2 (qpa only, no TRL)"
    )
    parser.add_argument(
        "--zero", type=int, choices=(0, 2, 3), default=2, help="with --ranks: ZeRO stage, 0 off"
    )
    args = parser.parse_args()
    if args.ranks:
        if args.steps < 2:
            parser.error("--ranks needs --steps of at least 2 (the first step is warm-up)")
        main_ranks(args)
        return

    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.manual_seed(0)
    overall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoint, tasks, prompts = build_inputs(work, args.tasks, args.hidden)
        prompt_tokens = prompt_length(checkpoint, prompts)
        setup_s = time.perf_counter() - overall
        share = max(10.0, (args.budget_s - setup_s) / 2)
        qpa = run_qpa(checkpoint, tasks, args, work / "qpa", share)
        trl = run_trl(checkpoint, prompts, args, work / "trl", share)
    overhead = None
    if qpa["median_step_s"] and trl["median_step_s"]:
        overhead = qpa["median_step_s"] / trl["median_step_s"] - 1.0
    report = {
        "benchmark": "rl_step",
        "model": f"tiny qwen3 hidden {args.hidden}, 2 layers",
        "tasks_per_step": args.tasks,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "qpa": qpa,
        "trl": trl,
        "qpa_overhead": overhead,
        "setup_s": setup_s,
        "total_s": time.perf_counter() - overall,
        "prompt_tokens_mean": prompt_tokens,
    }
    print(
        f"RL step (rollout + update), {args.tasks} tasks x k={args.k}, "
        f"~{prompt_tokens:.0f}-token prompts, {args.max_new_tokens} new tokens, "
        f"tiny Qwen3 hidden {args.hidden}, {torch.get_num_threads()} threads:"
    )
    print(
        f"  qpa  (Harness + sandbox + CARE): median {qpa['median_step_s']:.3f} s/step "
        f"(rollout {qpa['median_rollout']:.3f} s, update {qpa['median_update']:.3f} s), "
        f"{qpa['steps']} steps"
    )
    print(f"  TRL  GRPOTrainer (single turn):  median {trl['median_step_s']:.3f} s/step, "
          f"{trl['steps']} steps")  # fmt: skip
    if overhead is not None:
        print(f"  qpa overhead vs TRL: {overhead * 100:+.1f}%")
    print(f"  total {report['total_s']:.0f} s (setup {setup_s:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
