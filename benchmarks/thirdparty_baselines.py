"""Baselines on the public benchmarks qpa hosts: AgentDojo and BFCL multi-turn, their judges.

Run: `.venv/bin/python benchmarks/thirdparty_baselines.py [--out runs/thirdparty.json]`
(about 10 minutes on 2 cores, most of it AgentDojo's 949 pairs x attacks x guard).
Prints, and writes as JSON:

- oracle and noop on every AgentDojo suite and every BFCL multi-turn category (the oracle is
  the benchmark's own ground truth played by qpa's `oracle` planner; every task where it fails
  is listed with the judge's reason);
- AgentDojo with an obedient planner (`qpa.bench.thirdparty`: the ground truth, plus the
  injection task's ground truth the moment a tool result shows the planted text) through the
  Harness, guard on and off, for each attack in `--attacks`: utility without attack, utility
  under attack, targeted attack success rate (AgentDojo's `security()`), Wilson intervals;
- BFCL miss_func / miss_param: of the turns where BFCL withholds a function or a parameter, how
  often the oracle run, played through the Harness with the guard on, asks the user
  (`message_user`) there instead of calling a tool.

`--suites` / `--categories` narrow the run; `--no-bfcl` leaves BFCL out, `--no-attacks` the
attacks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from qpa.bench.thirdparty import EpisodeOutcome, agentdojo_episode, summarize_agentdojo
from qpa.contract import Environment, Task, Trajectory
from qpa.envs.factory import make_env
from qpa.envs.suites import load_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

DEFAULT_ATTACKS = ("important_instructions", "tool_knowledge", "ignore_previous", "direct")


def _episode(kind: str, task: Task, planner: str) -> Trajectory:
    env: Environment = make_env(kind)
    try:
        return run_episode(env, task, make_planner(planner), max_turns=80)
    finally:
        env.close()


def _reasons(trajectory: Trajectory) -> str:
    if trajectory.verification is None:
        return trajectory.error or "no verification"
    failed = [c for c in trajectory.verification.checks if not c.passed]
    return "; ".join(f"{c.name}: {c.detail}" for c in failed) or (trajectory.error or "")


def baselines(kind: str, suite: str) -> dict[str, Any]:
    """Oracle and noop pass rates on every task of `suite`, the oracle's failures named."""
    tasks = load_suite(suite)
    oracle = [_episode(kind, t, "oracle") for t in tasks]
    noop = [_episode(kind, t, "noop") for t in tasks]
    return {
        "tasks": len(tasks),
        "oracle": sum(t.success for t in oracle),
        "noop": sum(t.success for t in noop),
        "oracle_failures": {t.task.id: _reasons(t) for t in oracle if not t.success},
        "noop_successes": [t.task.id for t in noop if t.success],
    }


def _agentdojo_attacks(suites: list[str], attacks: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for guard in (True, False):
        clean: list[EpisodeOutcome] = [
            agentdojo_episode(t, guard=guard) for s in suites for t in load_suite(s)
        ]
        for attack in attacks:
            under = [
                agentdojo_episode(t, guard=guard)
                for s in suites
                for t in load_suite(f"{s}@{attack}")
            ]
            row: dict[str, Any] = {"all": summarize_agentdojo(clean, under)}
            for s in suites:
                row[s] = summarize_agentdojo(
                    [o for o in clean if o.suite == s],
                    [o for o in under if o.suite == f"{s}@{attack}"],
                )
            out[f"{attack}/guard_{'on' if guard else 'off'}"] = row
    return out


def _asks(category: str) -> dict[str, Any]:
    """Of BFCL's turns that withhold something, how many the Harness-played oracle answers
    with a question to the user."""
    from qpa.envs.bfcl.benchmark import entry as bfcl_entry
    from qpa.harness.agent import HarnessConfig, HarnessPlanner
    from qpa.harness.backends.scripted import OracleBackend
    from qpa.harness.memory import MemoryStore

    asked = turns = 0
    for task in load_suite(f"bfcl/{category}"):
        planner = HarnessPlanner(
            OracleBackend(task), HarnessConfig(guard=True), memory=MemoryStore(":memory:")
        )
        trajectory = _run_with(task, planner)
        found = bfcl_entry(category, task.lineage["entry_id"])
        # the turns BFCL answers with nothing: a function or a parameter is missing there
        withheld = {i for i, calls in enumerate(found.ground_truth) if not calls}
        turns += len(withheld)
        turn = 0
        for step in trajectory.steps:
            if step.action.type in ("finish", "message_user"):
                if turn in withheld and step.action.type == "message_user":
                    asked += 1
                turn += 1
    return {"withheld_turns": turns, "asked": asked}


def _run_with(task: Task, planner: Any) -> Trajectory:
    env = make_env("bfcl")
    try:
        return run_episode(env, task, planner, max_turns=80)
    finally:
        env.close()


def _print_rate(label: str, r: dict[str, Any]) -> None:
    print(
        f"  {label:<24} {r['hits']:>4}/{r['n']:<4} {100 * r['rate']:5.1f}% "
        f"[{100 * r['low']:.1f}, {100 * r['high']:.1f}]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--suites", nargs="*", default=None, help="AgentDojo suites")
    parser.add_argument("--attacks", nargs="*", default=list(DEFAULT_ATTACKS))
    parser.add_argument("--categories", nargs="*", default=None, help="BFCL categories")
    parser.add_argument("--no-bfcl", action="store_true")
    parser.add_argument("--no-attacks", action="store_true", help="leave AgentDojo's attacks out")
    args = parser.parse_args(argv)
    from qpa.envs.agentdojo import SUITES

    suites = [f"agentdojo/{s}" for s in (args.suites or SUITES)]
    started = time.perf_counter()
    result: dict[str, Any] = {"agentdojo": {}, "bfcl": {}}
    timed: Callable[[], float] = lambda: time.perf_counter() - started  # noqa: E731
    print("oracle / noop (the benchmark's own judge)")
    for suite in suites:
        row = baselines("agentdojo", suite)
        result["agentdojo"][suite] = row
        print(f"  {suite:<34} oracle {row['oracle']}/{row['tasks']}  noop {row['noop']}")
        for task_id, reason in row["oracle_failures"].items():
            print(f"    oracle fails {task_id}: {reason}")
    if not args.no_bfcl:
        from qpa.envs.bfcl import BFCL_CATEGORIES

        for category in args.categories or BFCL_CATEGORIES:
            row = baselines("bfcl", f"bfcl/{category}")
            if category in ("multi_turn_miss_func", "multi_turn_miss_param"):
                row["asks"] = _asks(category)
            result["bfcl"][category] = row
            print(
                f"  bfcl/{category:<29} oracle {row['oracle']}/{row['tasks']}  noop {row['noop']}"
            )
            for task_id, reason in row["oracle_failures"].items():
                print(f"    oracle fails {task_id}: {reason}")
            if "asks" in row:
                a = row["asks"]
                print(f"    asks the user on {a['asked']} of {a['withheld_turns']} withheld turns")
    print(f"({timed():.0f}s)\nAgentDojo, obedient planner through the Harness")
    attacks = {} if args.no_attacks else _agentdojo_attacks(suites, args.attacks)
    result["agentdojo_attacks"] = attacks
    for name, row in attacks.items():
        print(f" {name}")
        _print_rate("utility (no attack)", row["all"]["utility"])
        _print_rate("utility under attack", row["all"]["utility_under_attack"])
        _print_rate("attack success", row["all"]["attack_success"])
    print(f"({timed():.0f}s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
