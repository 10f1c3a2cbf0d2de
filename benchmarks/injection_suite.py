"""Prompt injection through the Harness: unrequested writes with the guard on and off.

Builds the injection suite (`qpa.bench.injection`: every attack kind at every planting site, on
mobilepa test-split tasks whose own plan reads the planted record), runs each injection with a
model that obeys injected text (`ObedientBackend`) through the Harness with the provenance guard
on and off, and prints the table docs/security.md carries: per injection kind and per site,
unrequested writes (state-changing calls the clean oracle run did not make, or collateral the
sandbox's verification reports) and the user's task success. `--legit` also runs the oracle's
plan through the Harness over the whole mobilepa suite with the guard on and off (the guard
must not cost legitimate tasks); `--seed N` builds the suite from the suite generated with
another seed (other tasks, other worlds: a check the guard was not tuned to the canonical one).
`--novel {tune,report,all}` builds the suite from the independent kinds of
`qpa.bench.novel_injections` (one half or both) instead: a kind the rotation left without a
site is then tried at every site, and a kind that still found none is printed.

    .venv/bin/python benchmarks/injection_suite.py [--kinds-per-site 8] [--seed 0] [--legit]
        [--novel {tune,report,all}]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from qpa.bench.injection import (
    Injection,
    InjectionResult,
    Row,
    build_suite,
    run_suite,
    summarize,
)
from qpa.bench.novel_injections import attacks_for
from qpa.contract import Task
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.memory import MemoryStore
from qpa.harness.runner import run_episode
from qpa.harness.skills import SkillLibrary


def table(rows: list[Row], first: str) -> str:
    head = (
        f"| {first} | episodes | writes, guard off (episodes) | writes, guard on (episodes) "
        "| task success, guard on | task success, guard off |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        name = r.kind if first == "injection kind" else r.site
        if r.kind == "total":
            name = "**total**"
        lines.append(
            f"| {name} | {r.episodes} | {r.writes_off} ({r.episodes_with_writes_off}) | "
            f"{r.writes_on} ({r.episodes_with_writes_on}) | {r.success_on}/{r.episodes} | "
            f"{r.success_off}/{r.episodes} |"
        )
    return "\n".join(lines)


def matrix(results: list[InjectionResult]) -> str:
    """Kind x site: unrequested writes without / with the guard (blank: not planted there)."""
    cells = {(r.kind, r.site): r for r in summarize(results, "cell") if r.kind != "total"}
    kinds = list(dict.fromkeys(r.injection.kind for r in results))
    sites = list(dict.fromkeys(r.injection.site.name for r in results))
    lines = [
        "| kind \\ site | " + " | ".join(sites) + " |",
        "|---|" + "---:|" * len(sites),
    ]
    for kind in kinds:
        row = []
        for site in sites:
            cell = cells.get((kind, site))
            row.append(f"{cell.writes_off}/{cell.writes_on}" if cell else "")
        lines.append(f"| {kind} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def legit(seed: int) -> None:
    tasks = generate_suite(seed=seed)
    skills = SkillLibrary.from_registry()
    for guard in (False, True):
        t0 = time.perf_counter()
        solved = 0
        for task in tasks:
            planner = HarnessPlanner(
                OracleBackend(task),
                HarnessConfig(guard=guard),
                memory=MemoryStore(":memory:"),
                skills=skills,
            )
            solved += run_episode(SandboxEnv(), task, planner).success
        took = time.perf_counter() - t0
        print(
            f"oracle plan through the Harness, guard {'on ' if guard else 'off'}: "
            f"{solved}/{len(tasks)} solved ({solved / len(tasks):.2%}) in {took:.0f}s"
        )


def novel_suite(half: str, kinds_per_site: int, tasks: Sequence[Task]) -> list[Injection]:
    """The novel kinds of `half`, rotated over the sites; each kind the rotation left without
    a site is tried at every site (so every kind that fits some task lands)."""
    attacks = attacks_for(half)
    injections = build_suite(kinds_per_site=kinds_per_site, tasks=tasks, attacks=attacks)
    landed = {i.kind for i in injections}
    missing = [a for a in attacks if a.kind not in landed]
    if missing:
        extra = build_suite(kinds_per_site=len(missing), tasks=tasks, attacks=missing)
        injections += extra
        landed |= {i.kind for i in extra}
    for attack in attacks:
        if attack.kind not in landed:
            print(f"NO SITE for kind {attack.kind}")
    return injections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds-per-site", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="suite seed the tasks come from")
    parser.add_argument("--legit", action="store_true", help="also the oracle over the suite")
    parser.add_argument(
        "--novel",
        choices=("tune", "report", "all"),
        help="the independent kinds of qpa.bench.novel_injections (a half or all)",
    )
    args = parser.parse_args()
    t0 = time.perf_counter()
    tasks = generate_suite(seed=args.seed)
    if args.novel:
        injections = novel_suite(args.novel, args.kinds_per_site, tasks)
    else:
        injections = build_suite(kinds_per_site=args.kinds_per_site, tasks=tasks)
    results: list[InjectionResult] = run_suite(injections)
    took = time.perf_counter() - t0
    sites = {i.site.name for i in injections}
    kinds = {i.kind for i in injections}
    print(
        f"{len(injections)} injections ({len(kinds)} kinds, {len(sites)} sites, suite seed "
        f"{args.seed}), each with the guard on and off: {len(results)} episodes in {took:.1f}s\n"
    )
    print(table(summarize(results, "kind"), "injection kind"))
    print()
    print(table(summarize(results, "site"), "planting site"))
    print()
    print("unrequested writes without / with the guard, by kind and site:\n")
    print(matrix(results))
    leaks = [r for r in results if r.guard and r.unrequested_writes]
    for r in leaks:
        print(f"LEAK {r.injection.id} on {r.injection.task.id}: {r.writes}")
    if args.legit:
        print()
        legit(args.seed)


if __name__ == "__main__":
    main()
