"""The `qpa` command line: every stage of the loop is a subcommand (Typer + Rich)."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from qpa import progress

app = typer.Typer(
    name="qpa",
    help="qpa: the closed AI-for-AI loop for mobile planner agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="No progress bars or progress lines (for scripts); results and errors still "
            "print. QPA_PROGRESS=off does the same, QPA_PROGRESS=plain forces plain lines.",
        ),
    ] = False,
) -> None:
    """qpa: the closed AI-for-AI loop for mobile planner agents."""
    if quiet:
        progress.configure(quiet=True)


# Each module registers its commands on `app` (or adds a sub-app) when imported.
_COMMAND_MODULES = [
    "tasks",
    "run",
    "demo",
    "env",
    "harness",
    "bench",
    "data",
    "data_stages",
    "collect",
    "diagnose",
    "crds",
    "train",
    "train_rl",
    "rollout",
    "loop",
    "release",
    "device",
    "doctor",
    "mcp",
]
for _name in _COMMAND_MODULES:
    importlib.import_module(f"qpa.cli.{_name}")


def main() -> None:
    app()
