"""`qpa data export` and `qpa data import`: flywheel batches as Hugging Face `datasets`, and back.

`export SOURCE --out DIR` writes a mixture (`qpa data mix`) or a curated batch (`qpa data
curate`) as Parquet with a dataset card (`qpa.data.export`); `--check` reads it back and
compares rows and masks. `import DIR` reads an export (card, hashes, columns, masks checked),
prints its splits and lineage, and with `--out FILE.jsonl` writes one split in qpa's SFT row
format (what `qpa train sft` reads).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from qpa.cli.common import console, die, print_json
from qpa.cli.data import data_app

HarnessOpt = Annotated[
    str | None,
    typer.Option(
        "--harness",
        help="Harness YAML (HarnessConfig) curated trajectories are rendered for (default: v1).",
    ),
]


def _guard(fn: Any) -> Any:
    from qpa.contract import CorruptLineError
    from qpa.data.review import DataError
    from qpa.store import StoreError

    try:
        return fn()
    except (DataError, CorruptLineError, StoreError) as exc:
        die(str(exc))
    except FileNotFoundError as exc:
        die(f"{exc.filename}: missing (no such file)")


def _splits_table(title: str, info: dict[str, Any]) -> None:
    table = Table(title=title)
    for column in ("split", "rows", "messages", "trained turns", "masked assistant turns"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, counts in info["splits"].items():
        table.add_row(
            split,
            str(counts["rows"]),
            str(counts["messages"]),
            str(counts["trained_turns"]),
            str(counts["masked_assistant_turns"]),
        )
    console.print(table)


@data_app.command("export")
def export_command(
    source: Annotated[str, typer.Argument(help="A mixture or curated batch (folder or URI).")],
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder (Parquet + README.md).")],
    harness: HarnessOpt = None,
    check: Annotated[
        bool, typer.Option("--check", help="Read the export back and compare rows and masks.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Write a batch as a Hugging Face dataset: Parquet, `messages` + `train_mask`, a card."""
    from qpa.data import export as ex
    from qpa.data.review import load_yaml_config
    from qpa.harness.agent import HarnessConfig

    def run() -> Any:
        config = load_yaml_config(harness, HarnessConfig, section="harness") if harness else None
        result = ex.export_dataset(source, out, harness=config, check=check)
        info = ex.summary(result.card, result.rows)
        info["out"] = str(result.out)
        info["checked"] = check
        return info

    info = _guard(run)
    if as_json:
        print_json(info)
        return
    _splits_table(f"exported {info['source']} -> {info['out']}", info)
    if check:
        console.print("[green]round trip ok[/]: same rows, same masks")


@data_app.command("import")
def import_command(
    folder: Annotated[str, typer.Argument(help="An export folder (qpa data export --out).")],
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="Write one split as qpa SFT rows (JSONL).")
    ] = None,
    split: Annotated[str, typer.Option(help="The split --out writes.")] = "train",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Read an export back (card, hashes, masks checked); optionally write a split as JSONL."""
    from qpa.data import export as ex
    from qpa.data.review import DataError

    def run() -> Any:
        card, rows = ex.read_export(folder)
        info = ex.summary(card, rows)
        if out is not None:
            if split not in rows:
                raise DataError(f"{folder}: no split {split!r} (splits: {', '.join(rows)})")
            info["written"] = {"path": out, "rows": ex.write_rows_jsonl(rows[split], out)}
        return info

    info = _guard(run)
    if as_json:
        print_json(info)
        return
    _splits_table(f"{folder} (from {info['source']})", info)
    lineage = info["lineage"]
    console.print(
        f"lineage: {lineage['task_count']} tasks (sha256 {lineage['tasks_sha256'][:12] or '-'}), "
        f"generator {lineage['generator'] or '-'}, source manifest "
        f"{lineage['source_manifest_sha256'][:12]}"
    )
    if "written" in info:
        console.print(f"wrote {info['written']['rows']} rows -> {info['written']['path']}")
