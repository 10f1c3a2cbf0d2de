"""The baselines on every task of a suite at the phone profile: oracle, no-op and greedy_wrong.

Run: `.venv/bin/python benchmarks/phone_oracle.py` (every task of mobilepa, every split; about
250 s of CPU, 10 minutes on a loaded 2-core machine). `--every N` runs every Nth task only,
`--limit N` the first N of those, `--profile default` the same check on the task's own worlds.
Prints the three rates, the wall time, and every task where the oracle fails or a baseline
succeeds (with the failed checks and collateral writes); exits 1 when there is one.
`tests/unit/sandbox/test_profiles.py` runs a sampled variant of this check in the unit suite.

Each task's phone world is built once (`base_for`, cached) and shared by the three planners'
episodes, so the cost is one world fill and three episodes a task.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from qpa.contract import Task, Trajectory, WorldProfile
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import DEFAULT_SUITE, generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

# Each planner and whether it should solve the task.
BASELINES: tuple[tuple[str, bool], ...] = (
    ("oracle", True),
    ("noop", False),
    ("greedy_wrong", False),
)


@dataclass
class Outcome:
    """What the baselines did over a set of tasks."""

    tasks: int = 0
    successes: Counter[str] = field(default_factory=Counter)
    # (planner, task id, failed checks or "solved")
    wrong: list[tuple[str, str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def rate(self, planner: str) -> float:
        return self.successes[planner] / self.tasks if self.tasks else 0.0


def sample(tasks: tuple[Task, ...], every: int, limit: int | None = None) -> list[Task]:
    """Every `every`th task (from the first), at most `limit` of them."""
    if every < 1:
        raise ValueError(f"every must be at least 1, got {every}")
    picked = list(tasks[::every])
    return picked if limit is None else picked[:limit]


def check(tasks: list[Task]) -> Outcome:
    """Run the three baselines on each task; record successes and every wrong outcome."""
    env = SandboxEnv()
    out = Outcome(tasks=len(tasks))
    started = time.perf_counter()
    for task in tasks:
        for planner, want in BASELINES:
            trajectory = run_episode(env, task, make_planner(planner))
            out.successes[planner] += trajectory.success
            if trajectory.success != want:
                out.wrong.append((planner, task.id, _why(trajectory)))
    out.seconds = time.perf_counter() - started
    return out


def _why(trajectory: Trajectory) -> str:
    """The failed checks and collateral writes of an episode ("solved" when it succeeded)."""
    if trajectory.success:
        return "solved"
    verification = trajectory.verification
    if verification is None:
        return trajectory.error or "no verification"
    failed = [f"check {c.name!r}: {c.detail}" for c in verification.checks if not c.passed]
    failed += [f"collateral {w.app}.{w.collection}: {w.detail}" for w in verification.collateral]
    return "; ".join(failed) or trajectory.error or "not done"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default=DEFAULT_SUITE)
    parser.add_argument("--profile", default="phone", choices=["phone", "default"])
    parser.add_argument("--every", type=int, default=1, help="every Nth task only")
    parser.add_argument("--offset", type=int, default=0, help="start at this task")
    parser.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    args = parser.parse_args(argv)
    profile: WorldProfile = args.profile
    suite = generate_suite(args.suite, profile=profile)
    tasks = sample(suite[args.offset :], args.every, args.limit)
    out = check(tasks)
    print(
        f"suite {args.suite} at profile {profile}: {out.tasks} of {len(suite)} tasks "
        f"(every {args.every}, from {args.offset}), {out.seconds:.0f} s"
    )
    for planner, want in BASELINES:
        print(
            f"  {planner:<13} {out.successes[planner]:>5} / {out.tasks} = "
            f"{100 * out.rate(planner):.1f}%  (want {'100' if want else '0'}%)"
        )
    for planner, task_id, why in out.wrong:
        print(f"  WRONG {planner} {task_id}: {why}")
    return 1 if out.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
