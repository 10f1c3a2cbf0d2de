"""RL seconds per step with rollouts on a rollout server vs the trainer's own `generate`.

Same tiny Qwen3 checkpoint, tasks, group size and sampling settings for both sides:

- **local**: `generation.backend: local` (each rank samples with its own model);
- **server**: `generation.backend: vllm` against `qpa rollout serve --backend hf` (a separate
  process on 127.0.0.1, the CPU stand-in of TRL's vLLM server), weights pushed over the gloo
  weight-sync group after every step.

Printed per side: median seconds per step (the first step is warm-up, excluded), its rollout,
update and weight-sync parts, and the size of one weight push. On CPU the server side pays
HTTP and a second process sharing the same cores; the number that matters is
`weight_sync_s` against the step (on GPU, vLLM's sampling is the reason to pay it).

Usage: `python benchmarks/rollout_server.py [--steps 4] [--tasks 2] [--k 4]
[--max-new-tokens 16] [--hidden 64] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PATTERN = (1.0, 0.0, 1.0, 1 / 3)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scored_env(index: int) -> Any:
    """The sandbox with a stand-in verifier (a random tiny policy never solves a task)."""
    from qpa.contract import Verification
    from qpa.envs.sandbox import SandboxEnv

    class Scored(SandboxEnv):
        def verify(self) -> Verification:
            progress = PATTERN[index % len(PATTERN)]
            return Verification(done=True, success=progress == 1.0, progress=progress)

    return Scored()


def run_side(
    name: str, model: Path, work: Path, args: argparse.Namespace, url: str | None
) -> dict[str, Any]:
    from qpa.envs.sandbox.suite import generate_suite
    from qpa.train.rl import RLConfig, RLTrainer

    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    tasks = sorted(pool, key=lambda t: len(t.instruction))[: args.tasks]
    generation: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if url is not None:
        generation.update(backend="vllm", vllm_url=url, vllm_group_port=free_port())
    config = RLConfig.from_dict(
        {
            "name": f"bench-{name}",
            "model": str(model),
            "output_dir": str(work / name),
            "steps": args.steps,
            "tasks_per_step": args.tasks,
            "samples_per_task": args.k,
            "seed": 1,
            "harness": {"token_budget": 400, "max_tools": 2, "max_turns": 2},
            "generation": generation,
            "loss": {"micro_batch_size": 16},
            "checkpoint": {"every_steps": 10_000, "save_final": False},
        }
    )
    trainer = RLTrainer(config, tasks=tasks, environment=scored_env)
    try:
        history = [trainer.train_step().metrics for _ in range(args.steps)]
        params = sum(p.numel() for p in trainer.model.parameters())
    finally:
        trainer.close()
    measured = history[1:] or history

    def median(key: str) -> float:
        return statistics.median(m.get(key, 0.0) for m in measured)

    return {
        "side": name,
        "step_s": median("step_s"),
        "rollout_s": median("rollout_s"),
        "update_s": median("update_s"),
        "weight_sync_s": median("weight_sync_s"),
        "push_mb": params * 4 / 1e6 if url is not None else 0.0,
        "episodes": median("episodes"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, suite_corpus

    work = Path(tempfile.mkdtemp(prefix="qpa-rollout-bench-"))
    tiny = TinyConfig(
        vocab_size=1024,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=8192,
    )
    model = make_tiny_checkpoint(work / "model", tiny, corpus=suite_corpus(conversations=6))
    rows = [run_side("local", model, work, args, None)]
    port = free_port()
    qpa = str(Path(sys.executable).with_name("qpa"))
    server = subprocess.Popen(
        [qpa, "rollout", "serve", "--backend", "hf", "--model", str(model), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        rows.append(run_side("server", model, work, args, f"http://127.0.0.1:{port}"))
    finally:
        server.terminate()
        server.wait(timeout=30)

    header = ("side", "step_s", "rollout_s", "update_s", "weight_sync_s", "push_mb", "episodes")
    print(" | ".join(f"{h:>13}" for h in header))
    for row in rows:
        cells = [row["side"], *(f"{row[h]:.3f}" for h in header[1:])]
        print(" | ".join(f"{c:>13}" for c in cells))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
