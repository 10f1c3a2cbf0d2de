"""`qpa demo`: what `make demo` runs: every shipped task with the oracle, success per domain."""

from __future__ import annotations

import time
from collections import defaultdict

from rich.progress import Progress
from rich.table import Table

from qpa.cli import app
from qpa.cli.common import console
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import DEFAULT_SUITE, generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode


@app.command("demo")
def demo(suite: str = DEFAULT_SUITE) -> None:
    """Run every task of the suite with the oracle and noop planners; print success per domain."""
    tasks = generate_suite(suite)
    env = SandboxEnv()
    results: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        for planner_name in ("oracle", "noop"):
            bar = progress.add_task(planner_name, total=len(tasks))
            for task in tasks:
                trajectory = run_episode(env, task, make_planner(planner_name))
                results[task.domain][planner_name].append(trajectory.success)
                progress.advance(bar)
    table = Table(title=f"{suite}: {len(tasks)} tasks in {time.perf_counter() - started:.1f}s")
    for column in ("domain", "tasks", "oracle success", "noop success"):
        table.add_column(column, justify="right" if column != "domain" else "left")
    for domain, by_planner in sorted(results.items()):
        oracle, noop = by_planner["oracle"], by_planner["noop"]
        table.add_row(
            domain,
            str(len(oracle)),
            f"{sum(oracle) / len(oracle):.0%}",
            f"{sum(noop) / len(noop):.0%}",
        )
    console.print(table)
