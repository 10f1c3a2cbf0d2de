"""`qpa tasks list|show|stats|generate`: browse and regenerate task suites."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from qpa.cli import app
from qpa.cli.common import console, die, print_json
from qpa.contract import Task, write_tasks
from qpa.envs.sandbox.registry import all_tools
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE, generate_suite

tasks_app = typer.Typer(help="Browse, count and generate tasks.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

SuiteOpt = Annotated[str, typer.Option("--suite", "-s", help="Task suite name.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Suite seed (0 = the canonical suite).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def load(suite: str, seed: int = CANONICAL_SEED) -> tuple[Task, ...]:
    try:
        return generate_suite(suite, seed)
    except KeyError as exc:
        die(str(exc.args[0]))


def suite_stats(tasks: tuple[Task, ...] | list[Task]) -> dict[str, Any]:
    """Counts per domain, capability, split, difficulty and tool (the `stats` payload)."""
    tools_used = Counter(t for task in tasks for t in task.tools)
    test = [t for t in tasks if t.split == "test"]
    return {
        "suite": tasks[0].suite if tasks else "",
        "tasks": len(tasks),
        "domains": len({t.domain for t in tasks}),
        "tools": len({t for task in tasks for t in task.tools}),
        "tools_registered": len(all_tools()),
        "by_split": dict(sorted(Counter(t.split for t in tasks).items())),
        "by_domain": dict(sorted(Counter(t.domain for t in tasks).items())),
        "by_capability": dict(sorted(Counter(c for t in tasks for c in t.capabilities).items())),
        "by_difficulty": {
            str(k): v for k, v in sorted(Counter(t.difficulty for t in tasks).items())
        },
        "test_by_capability": dict(
            sorted(Counter(c for t in test for c in t.capabilities).items())
        ),
        "by_tool": dict(sorted(tools_used.items())),
    }


@tasks_app.command("list")
def list_tasks(
    suite: SuiteOpt = DEFAULT_SUITE,
    split: Annotated[str | None, typer.Option(help="train, validation or test.")] = None,
    domain: Annotated[str | None, typer.Option(help="Only this domain.")] = None,
    capability: Annotated[str | None, typer.Option(help="Only this capability.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List tasks, filtered by split, domain or capability."""
    tasks = [
        t
        for t in load(suite)
        if (split is None or t.split == split)
        and (domain is None or t.domain == domain)
        and (capability is None or capability in t.capabilities)
    ]
    if as_json:
        print_json(
            [
                {
                    "id": t.id,
                    "split": t.split,
                    "domain": t.domain,
                    "capabilities": t.capabilities,
                    "difficulty": t.difficulty,
                    "instruction": t.instruction,
                }
                for t in tasks[:limit]
            ]
        )
        return
    table = Table(
        title=f"{suite}: {len(tasks)} tasks" + (f" (first {limit})" if len(tasks) > limit else "")
    )
    for column in ("id", "split", "capabilities", "diff", "instruction"):
        table.add_column(column, overflow="fold")
    for t in tasks[:limit]:
        table.add_row(t.id, t.split, ",".join(t.capabilities), str(t.difficulty), t.instruction)
    console.print(table)


@tasks_app.command("show")
def show_task(
    task_id: str, suite: SuiteOpt = DEFAULT_SUITE, seed: SeedOpt = CANONICAL_SEED
) -> None:
    """Print one task as JSON (instruction, world, tools, verifier, reference plan)."""
    for task in load(suite, seed):
        if task.id == task_id:
            print_json(task.model_dump(mode="json"))
            return
    die(f"no task {task_id!r} in suite {suite!r}")


@tasks_app.command("stats")
def stats(suite: SuiteOpt = DEFAULT_SUITE, as_json: JsonOpt = False) -> None:
    """Counts per domain, capability, split, difficulty and tool."""
    data = suite_stats(load(suite))
    if as_json:
        print_json(data)
        return
    console.print(
        f"[bold]{suite}[/]: {data['tasks']} tasks, {data['domains']} domains, {data['tools']} tools"
    )
    for key in ("by_split", "by_domain", "by_capability", "test_by_capability", "by_difficulty"):
        table = Table(title=key)
        table.add_column("name")
        table.add_column("tasks", justify="right")
        for name, count in data[key].items():
            table.add_row(name, str(count))
        console.print(table)


@tasks_app.command("generate")
def generate(
    suite: SuiteOpt = DEFAULT_SUITE,
    seed: SeedOpt = CANONICAL_SEED,
    out: Annotated[Path | None, typer.Option(help="Write tasks as JSON Lines here.")] = None,
    split: Annotated[str | None, typer.Option(help="Only this split.")] = None,
) -> None:
    """Regenerate a suite from its templates; the same seed always gives the same tasks."""
    tasks = [t for t in load(suite, seed) if split is None or t.split == split]
    if out is None:
        print_json({"suite": suite, "seed": seed, "tasks": len(tasks)})
        return
    count = write_tasks(out, tasks)
    console.print(f"wrote {count} tasks to {out}")
