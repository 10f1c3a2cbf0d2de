"""`qpa data ...`: the AI-for-Data stages. This module owns the `data` sub-app.

Other modules add their commands to `data_app` (generate, curate, mix, review, ...); the ones
here inspect any dataset in an artifact store: `qpa data manifest URI` prints a dataset's
manifest, `qpa data verify URI` re-reads every file and checks hashes, sizes and row counts.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from qpa.cli import app
from qpa.cli.common import console, die, err_console, print_json
from qpa.store import StoreError, open_store
from qpa.store.manifest import ManifestError, read_manifest, verify_manifest

data_app = typer.Typer(
    help="AI for Data: generate tasks, curate trajectories, mix datasets, review, inspect.",
    no_args_is_help=True,
)
app.add_typer(data_app, name="data")


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


@data_app.command("manifest")
def manifest_command(
    uri: Annotated[str, typer.Argument(help="Dataset root: a folder, file:// or s3:// URI.")],
    json_: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Print a dataset's manifest: files, counts and lineage."""
    try:
        manifest = read_manifest(open_store(uri))
    except (StoreError, ValueError) as exc:
        die(str(exc))
    if json_:
        print_json(manifest.model_dump(mode="json"))
        return
    lineage = manifest.lineage
    console.print(f"[bold]{manifest.name}[/] ({manifest.kind}), created {manifest.created_at}")
    console.print(f"files: {len(manifest.files)}, {manifest.rows} rows, {_human(manifest.size)}")
    if manifest.counts:
        console.print("counts: " + ", ".join(f"{k}={v}" for k, v in manifest.counts.items()))
    console.print(
        f"lineage: {lineage.task_count} tasks (sha256 {lineage.tasks_sha256[:12]}), "
        f"generator {lineage.generator or '-'}, policy {lineage.policy or '-'}"
    )
    for parent in lineage.parents:
        console.print(f"  parent: {parent}")


@data_app.command("verify")
def verify_command(
    uri: Annotated[str, typer.Argument(help="Dataset root: a folder, file:// or s3:// URI.")],
) -> None:
    """Re-read every file of a dataset and check it against the manifest (exit 1 on problems)."""
    try:
        store = open_store(uri)
        manifest = read_manifest(store)
        problems = verify_manifest(store)
    except (StoreError, ManifestError, ValueError) as exc:
        die(str(exc))
    if problems:
        table = Table(title=f"{len(problems)} problem(s) in {store.root_uri}")
        table.add_column("problem")
        for problem in problems:
            table.add_row(problem)
        err_console.print(table)
        raise typer.Exit(1)
    console.print(
        f"[green]ok[/]: {len(manifest.files)} files, {manifest.rows} rows, "
        f"{_human(manifest.size)} match {store.uri('manifest.json')}"
    )


# `qpa data export|import` (Hugging Face datasets) register themselves on `data_app`.
from qpa.cli import data_export as _data_export  # noqa: E402, F401
