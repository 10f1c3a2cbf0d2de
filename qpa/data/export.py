"""Curated trajectories and mixtures as Hugging Face `datasets` (Parquet + dataset card), and back.

`export_dataset(source, out)` reads one flywheel batch and writes it in the layout the Hugging Face
Hub and `datasets.load_dataset(out)` read:

```
out/
  README.md                               the dataset card: YAML header + description
  data/<split>-00000-of-00001.parquet     one Parquet file per split
```

- **Sources.** A mixture (`qpa data mix --out`: its `dataset/`, checked against its manifest's
  hashes first) becomes the split `train`, rows as the mixture drew them (copies included). A
  curated batch (`qpa data curate --out`) becomes the splits `successes` and `failures`: each
  trajectory not rejected by a reviewer is rendered for a Harness version (`qpa.data.render`,
  the same rendering the mixture uses: the prompt the planner is served with), one row per
  conversation (the main agent's, then each sub-agent's). Both pass the review gate first
  (`require_published`: a pending or unpublished batch is refused by name).
- **Columns.** `messages`: the conversation as `[{role, content}]`, ready for
  `tokenizer.apply_chat_template(row["messages"])` and TRL's conversational format;
  `train_mask`: one bool per message, true for the assistant turns that are trained on (false
  for system, user and tool turns and for erroneous assistant turns: a wrong call, a parse
  failure, a guard refusal, the diagnosed mistake of a failure); then `task_id`,
  `trajectory_id`, `agent`, `capabilities`, `domain`, `difficulty`, `source`, `weight`,
  `success` (as the mixture writes them).
- **The card.** `README.md`'s YAML header holds `configs` (split -> Parquet file, which
  `datasets.load_dataset` follows), `dataset_info` (features and split sizes, written by
  `datasets` itself), and `qpa`: the lineage (`ExportCard`): the source URI, its manifest's
  SHA-256, kind, name and generator, parent datasets, task count and `tasks_sha256`, the policy,
  every source file's key and hash, the Harness version the rows were rendered for, and the
  SHA-256 and row count of every Parquet file written.

`read_export(folder)` reads an export back (the card parsed and validated, every Parquet file
checked against the hash the card records, columns and masks checked) into rows of qpa's own
SFT format (`messages` with a `train` flag per message, as `qpa.data.mix` and `qpa train sft`
use them). `check_export` compares them with the source's rows: same rows, same masks.
Bad input raises `DataError` naming the file (and the row or field).
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.contract import Trajectory
from qpa.data.curate import CURATED_KIND, FAILURES_KEY, SUCCESSES_KEY
from qpa.data.mix import COLUMNS, DATASET_DIR, load_dataset_from_store
from qpa.data.render import Renderer, RenderError
from qpa.data.review import (
    DataError,
    as_uri,
    describe_validation_error,
    open_batch,
    read_jsonl,
    rejected_refs,
    require_published,
)
from qpa.harness.agent import HarnessConfig
from qpa.store import ArtifactNotFound, sha256_file
from qpa.store.manifest import MANIFEST_NAME, ManifestError, read_manifest, verify_manifest

CARD_NAME = "README.md"
DATA_DIR = "data"
MASK_COLUMN = "train_mask"
EXPORT_COLUMNS: tuple[str, ...] = ("messages", MASK_COLUMN, *COLUMNS[1:])
"""The exported columns: chat-ready `messages`, the per-message `train_mask`, the rest as mixed."""
CURATED_SPLITS = {"successes": SUCCESSES_KEY, "failures": FAILURES_KEY}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExportedFile(_Model):
    """One Parquet file of an export: its split, path (relative to the export), hash, rows."""

    split: str = Field(pattern=r"^[A-Za-z0-9_]+$")
    path: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rows: int = Field(ge=0)


class SourceFile(_Model):
    """One file of the source batch, as its manifest lists it."""

    key: str
    sha256: str


class ExportCard(_Model):
    """The `qpa` section of an export's dataset card: lineage and the files written."""

    schema_version: int = 1
    exported_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    source: str = Field(min_length=1, description="URI of the exported batch")
    source_kind: str = Field(description="the batch's manifest kind (sft, curated)")
    source_name: str = ""
    source_manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    generator: str = ""
    parents: list[str] = Field(default_factory=list)
    task_count: int = Field(default=0, ge=0)
    tasks_sha256: str = ""
    policy: dict[str, Any] = Field(default_factory=dict)
    source_files: list[SourceFile] = Field(default_factory=list)
    harness: dict[str, Any] | None = Field(
        default=None, description="the Harness version curated trajectories were rendered for"
    )
    columns: list[str] = Field(default_factory=lambda: list(EXPORT_COLUMNS))
    files: list[ExportedFile] = Field(default_factory=list)

    @property
    def splits(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            out[f.split] = out.get(f.split, 0) + f.rows
        return out


@dataclass
class ExportResult:
    """What `export_dataset` wrote: the folder, its card and the rows per split (qpa format)."""

    out: Path
    card: ExportCard
    rows: dict[str, list[dict[str, Any]]]


# --------------------------------------------------------------------------- the source


def _rows_of_trajectory(trajectory: Trajectory, renderer: Renderer) -> list[dict[str, Any]]:
    try:
        conversations = renderer.conversations(trajectory)
    except (RenderError, ValueError, KeyError) as exc:
        raise DataError(f"trajectory {trajectory.id}: cannot be rendered: {exc}") from exc
    return [
        {
            "messages": conversation.messages,
            "task_id": trajectory.task.id,
            "trajectory_id": trajectory.id,
            "agent": conversation.agent,
            "capabilities": list(trajectory.task.capabilities),
            "domain": trajectory.task.domain,
            "difficulty": trajectory.task.difficulty,
            "source": trajectory.task.source,
            "weight": 1.0,
            "success": trajectory.success,
        }
        for conversation in conversations
    ]


def source_rows(
    source: str | Path, harness: HarnessConfig | None = None
) -> tuple[dict[str, list[dict[str, Any]]], Any, bytes]:
    """The rows of a mixture or curated batch per split (qpa format), its manifest and the
    manifest's bytes. `DataError` names a missing, unreviewed, corrupt or unknown batch."""
    text = str(source)
    if "://" not in text and not Path(text).is_dir():
        raise DataError(f"{source}: missing (no such folder)")
    require_published(text)
    batch = open_batch(text)
    try:
        manifest = read_manifest(batch)
        raw = batch.get_bytes(MANIFEST_NAME)
    except ArtifactNotFound:
        raise DataError(
            f"{batch.uri(MANIFEST_NAME)}: missing: is {source} a mixture or curated batch?"
        ) from None
    except ManifestError as exc:
        raise DataError(str(exc)) from None
    if manifest.kind == CURATED_KIND:
        renderer = Renderer(harness)
        rejected = rejected_refs(batch)
        rows: dict[str, list[dict[str, Any]]] = {}
        for split, key in CURATED_SPLITS.items():
            if not batch.exists(key):
                raise DataError(f"{batch.uri(key)}: missing (listed curated set)")
            rows[split] = [
                row
                for t in read_jsonl(batch.uri(key), Trajectory)
                if t.id not in rejected
                for row in _rows_of_trajectory(t, renderer)
            ]
        return rows, manifest, raw
    if manifest.kind == "sft" and any(f.key.startswith(f"{DATASET_DIR}/") for f in manifest.files):
        problems = verify_manifest(batch)
        if problems:
            raise DataError(f"{source}: the mixture does not match its manifest: {problems[0]}")
        try:
            dataset = load_dataset_from_store(batch)
        except (OSError, ValueError) as exc:
            raise DataError(f"{batch.uri(DATASET_DIR)}: cannot be loaded: {exc}") from None
        return {"train": [dict(row) for row in dataset]}, manifest, raw
    raise DataError(
        f"{batch.uri(MANIFEST_NAME)}: kind {manifest.kind!r}: only mixtures (qpa data mix) and "
        "curated batches (qpa data curate) can be exported"
    )


# --------------------------------------------------------------------------- rows <-> columns


def to_export_row(row: dict[str, Any]) -> dict[str, Any]:
    """A qpa row (messages with `train`) as an exported one (`messages` + `train_mask`)."""
    messages = row["messages"]
    out = {
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        MASK_COLUMN: [bool(m.get("train", False)) for m in messages],
    }
    out.update({name: row[name] for name in COLUMNS[1:]})
    return out


def from_export_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    """An exported row back in qpa's format; `DataError` (naming `where`) for a bad one."""
    missing = [name for name in EXPORT_COLUMNS if name not in row]
    if missing:
        raise DataError(f"{where}: column {missing[0]!r} missing")
    messages, mask = row["messages"], row[MASK_COLUMN]
    if not isinstance(messages, list) or not isinstance(mask, list) or len(messages) != len(mask):
        raise DataError(
            f"{where}: {MASK_COLUMN} has {len(mask) if isinstance(mask, list) else '?'} values "
            f"for {len(messages) if isinstance(messages, list) else '?'} messages"
        )
    for m, train in zip(messages, mask, strict=True):
        if train and m.get("role") != "assistant":
            raise DataError(f"{where}: {MASK_COLUMN} trains a {m.get('role')!r} message")
    out = {
        "messages": [
            {"role": m["role"], "content": m["content"], "train": bool(train)}
            for m, train in zip(messages, mask, strict=True)
        ]
    }
    out.update({name: row[name] for name in COLUMNS[1:]})
    return out


def _features() -> Any:
    from datasets import Features, Sequence, Value

    return Features(
        {
            "messages": [{"role": Value("string"), "content": Value("string")}],
            MASK_COLUMN: Sequence(Value("bool")),
            "task_id": Value("string"),
            "trajectory_id": Value("string"),
            "agent": Value("string"),
            "capabilities": Sequence(Value("string")),
            "domain": Value("string"),
            "difficulty": Value("int32"),
            "source": Value("string"),
            "weight": Value("float64"),
            "success": Value("bool"),
        }
    )


# --------------------------------------------------------------------------- writing


def _card_text(card: ExportCard, features: Any) -> str:
    header = {
        "pretty_name": card.source_name or "qpa dataset",
        "tags": ["qpa", "agents", "tool-use", "trajectories", "conversational"],
        "task_categories": ["text-generation"],
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": f.split, "path": f.path} for f in card.files],
            }
        ],
        "dataset_info": {
            "features": features._to_yaml_list(),
            "splits": [{"name": s, "num_examples": n} for s, n in card.splits.items()],
        },
        "qpa": json.loads(card.model_dump_json()),
    }
    front = yaml.safe_dump(header, sort_keys=False, allow_unicode=True)
    splits = ", ".join(f"`{s}` ({n} rows)" for s, n in card.splits.items())
    parents = "\n".join(f"- {p}" for p in card.parents) or "- (none)"
    sources = "\n".join(f"| `{f.key}` | `{f.sha256[:16]}` |" for f in card.source_files)
    return (
        f"---\n{front}---\n\n# {card.source_name or 'qpa dataset'}\n\n"
        f"Exported by `qpa data export` from `{card.source}` (a `{card.source_kind}` batch, "
        f"generator `{card.generator or '-'}`). Splits: {splits}.\n\n"
        "## Columns\n\n"
        "- `messages`: the conversation the planner sees, `[{role, content}]`, in the Harness's "
        "text protocol; ready for `tokenizer.apply_chat_template(row['messages'])` and TRL's "
        "conversational format.\n"
        f"- `{MASK_COLUMN}`: one bool per message: true for the assistant turns that train. "
        "Erroneous turns (a wrong call, a parse failure, a guard refusal, a failure's diagnosed "
        "mistake) are false, like every system and user turn.\n"
        "- `task_id`, `trajectory_id`, `agent` (`main` or a sub-agent), `capabilities`, "
        "`domain`, `difficulty`, `source`, `weight`, `success`.\n\n"
        "```python\nfrom datasets import load_dataset\n"
        "ds = load_dataset('path/to/this/folder')\n```\n\n"
        "## Lineage\n\n"
        f"- source manifest SHA-256: `{card.source_manifest_sha256}`\n"
        f"- tasks: {card.task_count} (SHA-256 of the ids `{card.tasks_sha256 or '-'}`)\n"
        f"- policy: `{json.dumps(card.policy) if card.policy else '-'}`\n"
        f"- parents:\n{parents}\n\n"
        "| source file | SHA-256 |\n|---|---|\n"
        f"{sources}\n"
    )


def export_dataset(
    source: str | Path,
    out: str | Path,
    *,
    harness: HarnessConfig | None = None,
    check: bool = False,
) -> ExportResult:
    """Write `source` (a mixture or curated batch) as Parquet + dataset card under `out`.

    With `check`, the export is read back (`read_export`) and compared with the source's rows.
    """
    from datasets import Dataset
    from datasets.utils.logging import (
        disable_progress_bar,
        enable_progress_bar,
        is_progress_bar_enabled,
    )

    rows, manifest, raw = source_rows(source, harness)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise DataError(f"--out {out}: exists and is not a folder")
    data_dir = folder / DATA_DIR
    data_dir.mkdir(parents=True, exist_ok=True)
    for stale in data_dir.glob("*.parquet"):
        stale.unlink()
    features = _features()
    files: list[ExportedFile] = []
    enabled = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        for split, split_rows in rows.items():
            exported = [to_export_row(r) for r in split_rows]
            columns = {name: [r[name] for r in exported] for name in EXPORT_COLUMNS}
            dataset = Dataset.from_dict(columns, features=features)
            relative = f"{DATA_DIR}/{split}-00000-of-00001.parquet"
            with tempfile.NamedTemporaryFile(
                dir=data_dir, suffix=".parquet.tmp", delete=False
            ) as scratch:
                temporary = Path(scratch.name)
            try:
                dataset.to_parquet(str(temporary))
                temporary.replace(folder / relative)
            finally:
                temporary.unlink(missing_ok=True)
            sha, _ = sha256_file(folder / relative)
            files.append(ExportedFile(split=split, path=relative, sha256=sha, rows=len(exported)))
    finally:
        if enabled:
            enable_progress_bar()
    lineage = manifest.lineage
    card = ExportCard(
        source=as_uri(source),
        source_kind=manifest.kind,
        source_name=manifest.name,
        source_manifest_sha256=hashlib.sha256(raw).hexdigest(),
        generator=lineage.generator,
        parents=list(lineage.parents),
        task_count=lineage.task_count,
        tasks_sha256=lineage.tasks_sha256,
        policy=dict(lineage.policy),
        source_files=[SourceFile(key=f.key, sha256=f.sha256) for f in manifest.files],
        harness=(
            json.loads((harness or HarnessConfig()).model_dump_json())
            if manifest.kind == CURATED_KIND
            else None
        ),
        files=files,
    )
    card_path = folder / CARD_NAME
    card_path.write_text(_card_text(card, features), encoding="utf-8")
    result = ExportResult(folder, card, rows)
    if check:
        check_export(result)
    return result


# --------------------------------------------------------------------------- reading back


def read_card(folder: str | Path) -> ExportCard:
    """The `qpa` section of an export's `README.md`; `DataError` names the file and field."""
    path = Path(folder) / CARD_NAME
    if not Path(folder).is_dir():
        raise DataError(f"{folder}: missing (no such folder)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: missing (no dataset card)") from None
    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise DataError(f"{path}: no YAML header (--- ... ---) at the top")
    header_text = text[4 : 4 + text[4:].index("\n---\n")]
    try:
        header = yaml.safe_load(io.StringIO(header_text))
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: YAML header is not YAML: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("qpa"), dict):
        raise DataError(f"{path}: YAML header has no 'qpa' section (not a qpa export)")
    try:
        return ExportCard.model_validate(header["qpa"])
    except ValidationError as exc:
        raise DataError(f"{path}: qpa section: {describe_validation_error(exc)}") from None


def read_export(folder: str | Path) -> tuple[ExportCard, dict[str, list[dict[str, Any]]]]:
    """An export read back: its card and rows per split in qpa's format (see the module doc)."""
    import pyarrow.parquet as pq

    card = read_card(folder)
    rows: dict[str, list[dict[str, Any]]] = {}
    for entry in card.files:
        path = Path(folder) / entry.path
        if not path.is_file():
            raise DataError(f"{path}: missing (listed in {CARD_NAME})")
        sha, _ = sha256_file(path)
        if sha != entry.sha256:
            raise DataError(f"{path}: sha256 {sha} != {entry.sha256} recorded in {CARD_NAME}")
        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise DataError(f"{path}: corrupt parquet: {exc}") from None
        if table.num_rows != entry.rows:
            raise DataError(f"{path}: {table.num_rows} rows != {entry.rows} in {CARD_NAME}")
        split_rows = rows.setdefault(entry.split, [])
        for index, row in enumerate(table.to_pylist()):
            split_rows.append(from_export_row(row, f"{path}: row {index}"))
    return card, rows


def check_export(result: ExportResult) -> None:
    """Read the export back and compare it with the rows written: same splits, rows, masks."""
    _, back = read_export(result.out)
    if sorted(back) != sorted(result.rows):
        raise DataError(
            f"{result.out}: round trip: splits {sorted(back)} != source {sorted(result.rows)}"
        )
    for split, expected in result.rows.items():
        got = back[split]
        if len(got) != len(expected):
            raise DataError(
                f"{result.out}: round trip: split {split}: {len(got)} rows != {len(expected)}"
            )
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            if a != _normalised(b):
                raise DataError(f"{result.out}: round trip: split {split}: row {index} differs")


def _normalised(row: dict[str, Any]) -> dict[str, Any]:
    """A source row as it reads back (message keys role/content/train, bools, lists)."""
    return from_export_row(to_export_row(row), "source")


def summary(card: ExportCard, rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Counts of an export: rows, conversations' messages and trained turns per split."""
    return {
        "source": card.source,
        "source_kind": card.source_kind,
        "splits": {
            split: {
                "rows": len(split_rows),
                "messages": sum(len(r["messages"]) for r in split_rows),
                "trained_turns": sum(m["train"] for r in split_rows for m in r["messages"]),
                "masked_assistant_turns": sum(
                    m["role"] == "assistant" and not m["train"]
                    for r in split_rows
                    for m in r["messages"]
                ),
            }
            for split, split_rows in rows.items()
        },
        "lineage": {
            "source_manifest_sha256": card.source_manifest_sha256,
            "generator": card.generator,
            "parents": card.parents,
            "task_count": card.task_count,
            "tasks_sha256": card.tasks_sha256,
        },
    }


def write_rows_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> int:
    """Rows in qpa's SFT format as JSON Lines (what `qpa train sft` reads); how many."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as stream:
        for row in rows:
            stream.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


__all__ = [
    "CARD_NAME",
    "CURATED_SPLITS",
    "DATA_DIR",
    "EXPORT_COLUMNS",
    "MASK_COLUMN",
    "ExportCard",
    "ExportResult",
    "ExportedFile",
    "SourceFile",
    "check_export",
    "export_dataset",
    "from_export_row",
    "read_card",
    "read_export",
    "source_rows",
    "summary",
    "to_export_row",
    "write_rows_jsonl",
]
