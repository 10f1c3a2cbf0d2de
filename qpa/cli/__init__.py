"""The `qpa` command line: every stage of the loop is a subcommand (Typer + Rich)."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="qpa",
    help="qpa: the closed AI-for-AI loop for mobile planner agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

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
    "loop",
    "release",
    "device",
    "doctor",
]
for _name in _COMMAND_MODULES:
    importlib.import_module(f"qpa.cli.{_name}")


def main() -> None:
    app()
