"""`qpa tasks list|show|stats|generate`: browse and regenerate task suites."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from qpa.cli import app
from qpa.cli.common import console, die, print_json
from qpa.contract import WORLD_PROFILES, Task, WorldProfile, write_tasks
from qpa.envs.sandbox.registry import all_tools
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.envs.suites import load_suite

tasks_app = typer.Typer(help="Browse, count and generate tasks.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

SuiteOpt = Annotated[str, typer.Option("--suite", "-s", help="Task suite name.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Suite seed (0 = the canonical suite).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
WorldOpt = Annotated[
    str,
    typer.Option(
        "--world",
        help="World profile: 'default' (the task's own world) or 'phone' (every app filled to "
        "a real phone's sizes from the task's seed).",
    ),
]


def load(suite: str, seed: int = CANONICAL_SEED, world: str = "default") -> tuple[Task, ...]:
    if world not in WORLD_PROFILES:
        die(f"--world: unknown world profile {world!r} (one of: {', '.join(WORLD_PROFILES)})")
    profile: WorldProfile = world
    try:
        return load_suite(suite, seed, profile)
    except KeyError as exc:
        die(str(exc.args[0]))


def world_sizes(tasks: tuple[Task, ...] | list[Task]) -> dict[str, Any]:
    """World sizes at the tasks' profile, over one task per template (the first of each): the
    median and largest world in records and JSON bytes, the largest size of each collection."""
    import statistics

    import orjson

    from qpa.envs.sandbox.env import base_for
    from qpa.envs.sandbox.profiles import world_stats
    from qpa.envs.sandbox.registry import all_apps

    apps = all_apps()
    sample = list({t.template: t for t in reversed(tasks)}.values())
    records, sizes = [], []
    largest: dict[str, int] = {}
    for task in sample:
        names = [a for a in task.apps if a in apps]
        state = base_for(task, names, apps).state
        counts = world_stats(state)
        records.append(sum(counts.values()))
        sizes.append(len(orjson.dumps(state)))
        for key, n in counts.items():
            largest[key] = max(largest.get(key, 0), n)
    if not sample:
        return {}
    return {
        "sampled_tasks": len(sample),
        "records_median": int(statistics.median(records)),
        "records_max": max(records),
        "bytes_median": int(statistics.median(sizes)),
        "bytes_max": max(sizes),
        "largest_collections": dict(sorted(largest.items())),
    }


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
    world: WorldOpt = "default",
    split: Annotated[str | None, typer.Option(help="train, validation or test.")] = None,
    domain: Annotated[str | None, typer.Option(help="Only this domain.")] = None,
    capability: Annotated[str | None, typer.Option(help="Only this capability.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List tasks, filtered by split, domain or capability."""
    tasks = [
        t
        for t in load(suite, world=world)
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
    task_id: str,
    suite: SuiteOpt = DEFAULT_SUITE,
    seed: SeedOpt = CANONICAL_SEED,
    world: WorldOpt = "default",
) -> None:
    """Print one task as JSON (instruction, world, tools, verifier, reference plan)."""
    for task in load(suite, seed, world):
        if task.id == task_id:
            print_json(task.model_dump(mode="json"))
            return
    die(f"no task {task_id!r} in suite {suite!r}")


@tasks_app.command("stats")
def stats(
    suite: SuiteOpt = DEFAULT_SUITE,
    world: WorldOpt = "default",
    as_json: JsonOpt = False,
    sizes: Annotated[
        bool, typer.Option("--sizes", help="Also measure world sizes (one task per template).")
    ] = False,
) -> None:
    """Counts per domain, capability, split, difficulty and tool (and world sizes)."""
    tasks = load(suite, world=world)
    data = suite_stats(tasks)
    data["world_profile"] = world
    if sizes or world != "default":
        data["world"] = world_sizes(tasks)
    if as_json:
        print_json(data)
        return
    console.print(
        f"[bold]{suite}[/] ({world} worlds): {data['tasks']} tasks, {data['domains']} domains, "
        f"{data['tools']} tools"
    )
    if "world" in data:
        w = data["world"]
        console.print(
            f"worlds ({w['sampled_tasks']} sampled): median {w['records_median']} records / "
            f"{w['bytes_median']:,} bytes, largest {w['records_max']} / {w['bytes_max']:,}"
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
    world: WorldOpt = "default",
) -> None:
    """Regenerate a suite from its templates; the same seed always gives the same tasks."""
    tasks = [t for t in load(suite, seed, world) if split is None or t.split == split]
    if out is None:
        print_json({"suite": suite, "seed": seed, "world": world, "tasks": len(tasks)})
        return
    count = write_tasks(out, tasks)
    console.print(f"wrote {count} tasks to {out}")
