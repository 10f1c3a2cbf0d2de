"""Collateral-write detection over the whole mobilepa suite: what the rule sees and what it costs.

Run: `.venv/bin/python benchmarks/collateral_oracle.py` (about 10 s; prints a table, asserts
nothing; the assertions live in `tests/unit/sandbox/test_collateral.py`). Measured in this run:

- the oracle over every task of every split: episodes, successes, collateral writes found;
- the changes the state-changing calls made (fields of dict records, list records), how many a
  check explains, and how many records are forgiven only as preconditions (the rest of the
  unexplained changes are bookkeeping of asked-for calls);
- the cost: wall time of the oracle episodes with detection, against the same episodes with the
  snapshots around state-changing calls and the verification's diff switched off.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import qpa.envs.sandbox.env as sandbox_env
from qpa.envs.sandbox import SandboxEnv, collateral
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode


def classify(counts: Counter[str]) -> Any:
    """A `find_collateral` that also counts how each change made by a write was classified."""
    real = collateral.find_collateral

    def find(checks: Any, initial: Any, final: Any, log: Any, replay: Any = None) -> Any:
        made = [c for c in collateral.changes(initial, final) if c.unit in log.by_unit]
        expect = collateral.Expectation(checks, initial, final)
        explained = sum(expect.explains(c) for c in made)
        without_replay = real(checks, initial, final, log, None)
        found = real(checks, initial, final, log, replay)
        counts["changes by writes"] += len(made)
        counts["explained by a check"] += explained
        counts["precondition (replayed)"] += len(without_replay) - len(found)
        counts["collateral"] += len(found)
        return found

    return find


def run(tasks: Any) -> tuple[float, int, int]:
    env = SandboxEnv()
    started = time.perf_counter()
    successes = with_collateral = 0
    for task in tasks:
        trajectory = run_episode(env, task, make_planner("oracle"))
        successes += trajectory.success
        assert trajectory.verification is not None
        with_collateral += bool(trajectory.verification.collateral)
    return time.perf_counter() - started, successes, with_collateral


def main() -> None:
    tasks = generate_suite()
    counts: Counter[str] = Counter()
    real = sandbox_env.find_collateral
    sandbox_env.find_collateral = classify(counts)
    run(tasks)
    sandbox_env.find_collateral = real
    timed, successes, with_collateral = run(tasks)

    # Without detection: no snapshots around calls (so nothing logged) and nothing to diff.
    sandbox_env.snapshot = lambda state: b"{}"  # type: ignore[assignment]
    blind, _, _ = run(tasks)
    sandbox_env.snapshot = collateral.snapshot
    splits = Counter(t.split for t in tasks)
    print(f"tasks: {len(tasks)} ({', '.join(f'{k} {v}' for k, v in sorted(splits.items()))})")
    print(f"oracle successes: {successes} / {len(tasks)}")
    print(f"episodes with collateral writes: {with_collateral}")
    print(f"  changes made by state-changing calls: {counts['changes by writes']}")
    print(f"  explained by a check: {counts['explained by a check']}")
    print(
        "  records forgiven as preconditions (replay of a later asked-for call fails): "
        f"{counts['precondition (replayed)']}"
    )
    print(f"  collateral records: {counts['collateral']}")
    print(
        f"time, oracle over the suite: {timed:.2f} s with detection, {blind:.2f} s without "
        f"({1000 * (timed - blind) / len(tasks):.2f} ms per episode)"
    )


if __name__ == "__main__":
    main()
