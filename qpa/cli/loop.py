"""`qpa loop`: the whole closed loop on embedded defaults (what `make demo` runs).

    qpa loop --preset local --out runs/loop          # tiny model, 2 CPU cores, about 19 minutes
    qpa loop --preset small --out /tmp/loop          # the plumbing in < 3 minutes (tests)
    qpa loop --preset local --out runs/loop          # again: every finished stage is skipped
    qpa loop --preset local --out runs/loop --dry-run   # which stages would run or be skipped
    qpa loop --preset local --out runs/loop --set rl.beta=0.05   # one setting changed: RL reruns
    qpa loop --preset cluster --dry-run              # the TaskBatch/TrainingRun/HarnessRelease YAML

torch and transformers are imported when a stage runs, not when the CLI starts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from qpa import progress
from qpa.cli import app
from qpa.cli.common import die
from qpa.loop.presets import PRESET_NAMES, get_preset


@app.command("loop")
def loop(
    preset: Annotated[
        str,
        typer.Option("--preset", "-p", help=f"Preset: {', '.join(PRESET_NAMES)}."),
    ] = "local",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Run folder (stages, report). Default: runs/loop-<preset>."
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="local/small: list which stages would run or be skipped; cluster: print the "
            "Kubernetes resources (YAML) that run the loop.",
        ),
    ] = False,
    seed: Annotated[int | None, typer.Option("--seed", help="The run's seed.")] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE: one setting of the preset (e.g. rl.beta=0.05, "
            "round2.pool=learnable); VALUE is JSON or a string; repeatable. Only the stages "
            "that read it rerun.",
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No progress display or lines (for scripts); results still print."
        ),
    ] = False,
) -> None:
    """Run the closed AI-for-AI loop: data, SFT, evaluation, diagnosis, Harness revision,
    weakness-targeted data, CARE RL, held-out evaluation, one report. Reruns resume."""
    try:
        chosen = get_preset(preset, seed=seed).with_settings(settings or [])
    except ValueError as exc:
        die(str(exc))
    if chosen.name == "cluster":
        if not dry_run:
            die(
                "the cluster preset runs on Kubernetes: print its resources with --dry-run and "
                "apply them with kubectl (or commit them to the GitOps repository)"
            )
        from qpa.loop.cluster import cluster_resources, render_yaml

        sys.stdout.write(render_yaml(cluster_resources(chosen), chosen))
        return
    folder = out or Path("runs") / f"loop-{chosen.name}"
    if quiet:
        progress.configure(quiet=True)
    console = Console(file=sys.stdout, soft_wrap=True)
    if dry_run:
        from qpa.loop.run import plan

        table = Table(title=f"qpa loop --preset {chosen.name} (seed {chosen.seed}) in {folder}")
        table.add_column("stage")
        table.add_column("what")
        table.add_column("now")
        for stage, status in plan(chosen, folder.resolve()):
            table.add_row(stage.name, stage.title, status)
        console.print(table)
        return
    from qpa.loop.run import run_loop

    run = run_loop(chosen, folder, console=console)
    if not run.report:
        die("the loop stopped before the report")
