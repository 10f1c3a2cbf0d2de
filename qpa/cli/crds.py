"""`qpa crds generate|check`: the CustomResourceDefinitions, generated from qpa.api."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qpa.api.crdgen import CRDGenError, check_crds, write_crds
from qpa.cli import app
from qpa.cli.common import console, die, err_console

crds_app = typer.Typer(
    help="CustomResourceDefinitions of the qpa.ai kinds, generated from qpa.api.",
    no_args_is_help=True,
)
app.add_typer(crds_app, name="crds")

DirOpt = Annotated[Path, typer.Option("--out", "-o", help="Folder of the CRD YAML files.")]


@crds_app.command("generate")
def generate(out: DirOpt = Path("crds")) -> None:
    """Write one CRD per kind (`qpa.ai_<plural>.yaml`) into the folder."""
    try:
        paths = write_crds(out)
    except CRDGenError as exc:
        die(str(exc))
    for path in paths:
        console.print(f"wrote {path}", highlight=False)


@crds_app.command("check")
def check(
    crd_dir: Annotated[
        Path, typer.Option("--dir", "-d", help="Folder of the CRD YAML files.")
    ] = Path("crds"),
) -> None:
    """Exit 1 when the folder differs from what `qpa crds generate` would write."""
    try:
        problems = check_crds(crd_dir)
    except CRDGenError as exc:
        die(str(exc))
    if problems:
        for problem in problems:
            err_console.print(f"[red]drift:[/] {problem}", highlight=False, soft_wrap=True)
        err_console.print("run `qpa crds generate` and commit the result", highlight=False)
        raise typer.Exit(1)
    console.print(f"{crd_dir}: up to date", highlight=False)
