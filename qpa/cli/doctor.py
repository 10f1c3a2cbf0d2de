"""`qpa doctor`: what is missing for the local loop, a kind cluster or a GPU cluster."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from qpa.cli import app
from qpa.cli.common import console, print_json
from qpa.doctor import PATHS, Context, PathName, run_checks

MARKS = {"ok": "[green]ok[/]", "missing": "[red]missing[/]", "warning": "[yellow]warning[/]",
         "skipped": "[dim]skipped[/]"}  # fmt: skip


@app.command("doctor")
def doctor(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help=f"Which paths to check: {', '.join(PATHS)} (default: all)."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            envvar="QPA_STORE_URI",
            help="Object store folder to check: s3://bucket/prefix/ (keys from QPA_S3_*).",
        ),
    ] = None,
    kubeconfig: Annotated[str | None, typer.Option(envvar="KUBECONFIG")] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check what each way of running qpa needs, and print the fix for what is missing.

    Exit status 1 when a check of the chosen paths finds something missing.
    """
    chosen: list[PathName] = []
    for name in paths or list(PATHS):
        if name not in PATHS:
            raise typer.BadParameter(f"unknown path {name!r}; choose from {', '.join(PATHS)}")
        chosen.append(name)
    ctx = Context(root=Path.cwd(), kubeconfig=kubeconfig, context=context, store_uri=store)
    results = run_checks(chosen, ctx)
    if json_:
        print_json([asdict(check) for check in results])
    else:
        table = Table("path", "check", "status", "detail", "fix")
        for check in results:
            table.add_row(check.path, check.name, MARKS[check.status], check.detail, check.fix)
        console.print(table)
    if any(check.failed for check in results):
        raise typer.Exit(1)
