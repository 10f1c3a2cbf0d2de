"""`qpa diagnose DIR`: attribute every failed trajectory to the model, the Harness or the
environment, and print the counts per side x capability and the top causes.

Reads `DIR/trajectories.jsonl` (DIR may also be the `.jsonl` file), writes `DIR/diagnosis.json`
and `DIR/diagnosis.md` next to it. `--json` prints the whole report as JSON instead of tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from qpa.cli import app
from qpa.cli.common import console, die, err_console, print_json
from qpa.contract import CAPABILITIES
from qpa.diagnose import SIDES, DiagnoseError, DiagnosisReport, diagnose_dir

SIDE_STYLE = {"model": "magenta", "harness": "cyan", "environment": "yellow"}


def _step(step: int | None) -> str:
    return "-" if step is None else str(step)


def print_report(report: DiagnosisReport, top: int = 10) -> None:
    """The side x capability table and the top causes, with an example reason each."""
    console.print(
        f"[bold]{report.trajectories}[/] trajectories: [green]{report.successes} succeeded[/], "
        f"[red]{report.failures} failed[/]"
    )
    table = Table(title="Failures by side x capability")
    table.add_column("side")
    for capability in CAPABILITIES:
        table.add_column(capability, justify="right")
    table.add_column("total", justify="right", style="bold")
    for side in SIDES:
        row = report.counts.get(side, {})
        style = SIDE_STYLE.get(side, "")
        table.add_row(
            f"[{style}]{side}[/]",
            *(str(row.get(c, 0)) for c in CAPABILITIES),
            str(report.by_side.get(side, 0)),
        )
    console.print(table)
    causes = Table(title="Top causes")
    causes.add_column("side")
    causes.add_column("cause")
    causes.add_column("count", justify="right")
    causes.add_column("example", overflow="fold")
    for side_name, cause, count in report.top_causes(top):
        example = report.examples(cause)
        shown = (
            f"{example[0].trajectory_id} (step {_step(example[0].step)}): {example[0].reason}"
            if example
            else ""
        )
        style = SIDE_STYLE.get(side_name, "")
        causes.add_row(f"[{style}]{side_name}[/]", cause, str(count), shown)
    if report.by_cause:
        console.print(causes)
    for corrupt in report.corrupt_lines[:10]:
        err_console.print(f"[yellow]skipped corrupt line {corrupt.line}:[/] {corrupt.error}")
    if len(report.corrupt_lines) > 10:
        err_console.print(f"[yellow]... {len(report.corrupt_lines) - 10} more corrupt lines[/]")


def diagnose_command(
    directory: Annotated[
        Path,
        typer.Argument(help="Run directory holding trajectories.jsonl (or the .jsonl file)."),
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON instead of tables.")
    ] = False,
    top: Annotated[int, typer.Option(min=1, help="How many causes to list.")] = 10,
    write: Annotated[
        bool, typer.Option(help="Write diagnosis.json and diagnosis.md next to the input.")
    ] = True,
) -> None:
    """Attribute every failed trajectory to the model, the Harness or the environment."""
    try:
        report = diagnose_dir(directory, write=write)
    except DiagnoseError as exc:
        die(str(exc))
    if json_output:
        print_json(report.model_dump(mode="json"))
        return
    print_report(report, top)
    if write:
        out = Path(report.source).parent
        console.print(f"[dim]wrote {out / 'diagnosis.json'} and {out / 'diagnosis.md'}[/]")


app.command("diagnose")(diagnose_command)

command_app = typer.Typer(
    help="Attribute failed trajectories to model, Harness or environment.",
    pretty_exceptions_show_locals=False,
)
"""The command alone (for tests and embedding); `qpa diagnose` is the same function."""
command_app.command()(diagnose_command)
