"""`qpa release ...`: carry a HarnessRelease that passed its gate to the next environment."""

from __future__ import annotations

import typer

from qpa.cli import app

release_app = typer.Typer(
    help="Releases of model + Harness versions: GitOps promotion between environments.",
    no_args_is_help=True,
)
app.add_typer(release_app, name="release")
