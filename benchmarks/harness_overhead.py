"""Harness overhead per turn: everything the Harness does except the model's own time.

Runs the test split twice in one process: (a) baseline: the bare oracle planner straight
against the sandbox (no prompt, no parsing, no adapter, no memory, no guard); (b) the full
Harness (Scenario Adapter, Persistent Memory on SQLite, prompt building, parsing, provenance
guard, sub-agent contexts) driving a model backend that replays the plan (`OracleBackend`),
whose own time is measured and subtracted. Prints per-turn numbers side by side. Aim: <= 1 ms.

    .venv/bin/python benchmarks/harness_overhead.py [--limit N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from qpa.contract import ToolSpec
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.memory import MemoryStore
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode


class TimedBackend:
    """Wraps a backend and accumulates the time spent inside it (the 'model time')."""

    def __init__(self, inner: OracleBackend) -> None:
        self.inner = inner
        self.seconds = 0.0

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        t0 = time.perf_counter()
        try:
            return self.inner.complete(messages, tools)
        finally:
            self.seconds += time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=400, help="tasks from the test split")
    args = parser.parse_args()
    tasks = [t for t in generate_suite() if t.split == "test"][: args.limit]
    env = SandboxEnv()
    memory = MemoryStore(":memory:")

    t0 = time.perf_counter()
    base_turns = sum(run_episode(env, t, OraclePlanner()).totals.turns for t in tasks)
    base_s = time.perf_counter() - t0

    per_turn: list[float] = []
    turns = 0
    model_s = 0.0
    harness_s = 0.0
    successes = 0
    for task in tasks:
        backend = TimedBackend(OracleBackend(task))
        planner = HarnessPlanner(backend, memory=memory)
        t1 = time.perf_counter()
        trajectory = run_episode(env, task, planner)
        elapsed = time.perf_counter() - t1
        env_s = sum(s.duration_ms for s in trajectory.steps) / 1000.0
        overhead = elapsed - backend.seconds - env_s
        turns += trajectory.totals.turns
        model_s += backend.seconds
        harness_s += overhead
        successes += trajectory.success
        per_turn.append(overhead / max(1, trajectory.totals.turns))

    print(f"tasks: {len(tasks)} (test split), turns: {turns}, Harness successes: {successes}")
    print(f"{'':34}{'per turn':>12}")
    print(f"{'baseline: bare oracle, whole loop':34}{base_s / base_turns * 1e3:>10.3f} ms")
    print(f"{'Harness overhead (mean)':34}{harness_s / turns * 1e3:>10.3f} ms")
    print(f"{'Harness overhead (median episode)':34}{statistics.median(per_turn) * 1e3:>10.3f} ms")
    q95 = statistics.quantiles(per_turn, n=20)[-1]
    print(f"{'Harness overhead (p95 episode)':34}{q95 * 1e3:>10.3f} ms")
    print(f"{'scripted model time (excluded)':34}{model_s / turns * 1e3:>10.3f} ms")
    print("aim: Harness overhead <= 1 ms per turn")


if __name__ == "__main__":
    main()
