"""Dataset manifests: what a dataset holds (files with hashes) and where it came from (lineage).

Every dataset under a store prefix has `<prefix>/manifest.json`: a `DatasetManifest` naming the
dataset's files (keys relative to the prefix, SHA-256, size, rows), its lineage (which tasks,
which policy, which generator, parent dataset URIs, parameters), mixture weights, the reasons
for curation decisions and the human review state. `verify_manifest` downloads every file again
and recomputes its hash, size and row count; for a collection (kind "trajectories" written by
`qpa.data.collect`) it also reads every record's identity (task id, sample, attempt) and
`audit_trajectories` names identities found more than once, identities the lineage expects
that no part holds, and parts in the store that the manifest does not list.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.store.base import (
    HASH_CHUNK,
    ArtifactNotFound,
    ArtifactStore,
    ObjectInfo,
    StoreError,
    join_key,
)

MANIFEST_NAME = "manifest.json"
KNOWN_KINDS = ("trajectories", "tasks", "sft", "rl", "mixture", "checkpoint", "report")
COLLECTOR = "qpa.data.collect"
LISTED_TASKS_MAX = 10_000  # beyond this, lineage keeps only the count and hash of the task ids
_IN_MEMORY_MAX = 16 * 1024 * 1024


class ManifestError(StoreError, ValueError):
    """A manifest that cannot be read or does not describe its dataset; names the URI."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManifestFile(_Model):
    """One file of a dataset: key relative to the manifest's prefix, hash, size, rows (JSONL)."""

    key: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    rows: int | None = Field(default=None, ge=0)

    @classmethod
    def of(
        cls, info: ObjectInfo, rows: int | None = None, *, key: str | None = None
    ) -> ManifestFile:
        return cls(key=key or info.key, sha256=info.sha256, size=info.size, rows=rows)


def tasks_digest(task_ids: Iterable[str]) -> str:
    """SHA-256 of the sorted, newline-joined task ids: the same set always hashes the same."""
    digest = hashlib.sha256()
    for task_id in sorted(set(task_ids)):
        digest.update(task_id.encode() + b"\n")
    return digest.hexdigest()


class Lineage(_Model):
    """Where a dataset came from."""

    tasks: list[str] = Field(default_factory=list, description="task ids (when not too many)")
    task_count: int = Field(default=0, ge=0)
    tasks_sha256: str = Field(default="", description="tasks_digest(ids) of all task ids")
    policy: dict[str, Any] = Field(default_factory=dict)
    generator: str = ""
    parents: list[str] = Field(default_factory=list, description="URIs of parent datasets")
    params: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def for_tasks(
        cls, task_ids: Iterable[str], *, max_listed: int = LISTED_TASKS_MAX, **fields: Any
    ) -> Lineage:
        """Lineage naming these tasks: all ids when at most `max_listed`, always count + hash."""
        ids = sorted(set(task_ids))
        return cls(
            tasks=ids if len(ids) <= max_listed else [],
            task_count=len(ids),
            tasks_sha256=tasks_digest(ids),
            **fields,
        )


class DatasetManifest(_Model):
    """`<prefix>/manifest.json` of a dataset."""

    schema_version: int = 1
    name: str = Field(min_length=1)
    kind: str = Field(pattern=r"^[a-z][a-z0-9_\-]*$", description=f"e.g. {', '.join(KNOWN_KINDS)}")
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    files: list[ManifestFile] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    lineage: Lineage = Field(default_factory=Lineage)
    weights: dict[str, float] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)
    review: dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(f.rows or 0 for f in self.files)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def manifest_key(prefix: str = "") -> str:
    return join_key(prefix, MANIFEST_NAME)


def write_manifest(store: ArtifactStore, prefix: str, manifest: DatasetManifest) -> ObjectInfo:
    """Write `<prefix>/manifest.json` atomically (`prefix` '' = the store root)."""
    keys = [f.key for f in manifest.files]
    if len(set(keys)) != len(keys):
        raise ManifestError(f"{store.uri(manifest_key(prefix))}: the same file is listed twice")
    data = manifest.model_dump_json(indent=2).encode() + b"\n"
    return store.put_bytes(manifest_key(prefix), data)


def read_manifest(store: ArtifactStore, prefix: str = "") -> DatasetManifest:
    """Read `<prefix>/manifest.json`; `ArtifactNotFound` / `ManifestError` name the URI."""
    key = manifest_key(prefix)
    try:
        data = store.get_bytes(key)
    except ArtifactNotFound as exc:
        raise ArtifactNotFound(store.uri(key), "no dataset manifest") from exc
    try:
        return DatasetManifest.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "<document>"
        raise ManifestError(
            f"{store.uri(key)}: corrupt manifest: {where}: {first.get('msg')}"
        ) from None


def _hash_object(store: ArtifactStore, key: str, size_hint: int) -> tuple[str, int, int]:
    """(sha256, size, newline-terminated rows) of an object, streamed when large."""
    if size_hint <= _IN_MEMORY_MAX:
        data = store.get_bytes(key)
        rows = sum(1 for line in data.splitlines() if line.strip())
        return hashlib.sha256(data).hexdigest(), len(data), rows
    with tempfile.TemporaryDirectory(prefix="qpa-verify-") as scratch:
        path = store.get_file(key, Path(scratch) / "object")
        digest, size, rows = hashlib.sha256(), 0, 0
        with open(path, "rb") as stream:
            for line in iter(lambda: stream.readline(HASH_CHUNK), b""):
                digest.update(line)
                size += len(line)
                rows += bool(line.strip())
        return digest.hexdigest(), size, rows


def verify_manifest(store: ArtifactStore, prefix: str = "") -> list[str]:
    """Re-read every file the manifest lists and recompute it; the problems found, or [].

    Checks SHA-256, size and (where recorded) the number of non-blank lines. A missing file,
    or one whose stored hash metadata disagrees with its bytes, is a problem too. For a
    collection, `audit_trajectories` adds each duplicated identity (with its parts and lines),
    each missing one and each part the manifest does not list.
    """
    manifest = read_manifest(store, prefix)
    problems: list[str] = []
    for entry in manifest.files:
        key = join_key(prefix, entry.key)
        uri = store.uri(key)
        try:
            sha, size, rows = _hash_object(store, key, entry.size)
        except ArtifactNotFound:
            problems.append(f"{uri}: missing")
            continue
        except StoreError as exc:
            problems.append(f"{uri}: {exc}")
            continue
        if sha != entry.sha256:
            problems.append(f"{uri}: sha256 {sha} != manifest {entry.sha256}")
        if size != entry.size:
            problems.append(f"{uri}: size {size} != manifest {entry.size}")
        if entry.rows is not None and rows != entry.rows:
            problems.append(f"{uri}: {rows} rows != manifest {entry.rows}")
    if manifest.kind == "trajectories" and manifest.extra.get("collector") == COLLECTOR:
        audit = audit_trajectories(store, prefix, manifest)
        problems += audit.problems(store.uri(manifest_key(prefix)))
    return problems


Identity = tuple[str, int, int]  # (task id, sample index, attempt of the batch)


def part_identities(data: bytes) -> list[Identity]:
    """The identity of every record of a JSONL part of trajectories, in order.

    A line that is not a JSON object with `task.id` raises ValueError naming its line number.
    """
    found: list[Identity] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            meta = record.get("metadata") or {}
            found.append(
                (
                    str(record["task"]["id"]),
                    int(record.get("sample", 0)),
                    int(meta.get("attempt", 0)),
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"line {number}: not a trajectory (no task.id)") from None
    return found


def _label(identity: Identity) -> str:
    task, sample, attempt = identity
    return f"{task} sample {sample} attempt {attempt}"


class TrajectoryAudit(_Model):
    """Every record of a collection, counted by identity (`audit_trajectories`)."""

    expected: int | None = Field(
        default=None, description="Identities the lineage names (tasks x samples), if it can."
    )
    rows: int = Field(default=0, ge=0, description="Records in the parts read.")
    distinct: int = Field(default=0, ge=0, description="Distinct identities among them.")
    duplicated: dict[str, list[str]] = Field(
        default_factory=dict, description="Identity -> every 'part:line' holding it (2 or more)."
    )
    missing: list[str] = Field(default_factory=list, description="Expected, in no part.")
    unlisted: list[str] = Field(
        default_factory=list, description="Parts in the store the manifest does not list."
    )
    unreadable: list[str] = Field(default_factory=list, description="Parts that could not be read.")

    @property
    def duplicates(self) -> int:
        """Records beyond the first of each identity."""
        return sum(len(where) - 1 for where in self.duplicated.values())

    @property
    def lost(self) -> int:
        return len(self.missing)

    def problems(self, uri: str) -> list[str]:
        """One line per finding, naming identities and parts (at most 20 of each kind)."""
        lines = [
            f"{uri}: {key} appears {len(where)} times: {', '.join(where)}"
            for key, where in list(self.duplicated.items())[:20]
        ]
        if len(self.duplicated) > 20:
            lines.append(f"{uri}: ... {len(self.duplicated) - 20} more duplicated identities")
        lines += [f"{uri}: {m} is missing" for m in self.missing[:20]]
        if len(self.missing) > 20:
            lines.append(f"{uri}: ... {len(self.missing) - 20} more missing identities")
        lines += [f"{uri}: part {k} is in the store but not in the manifest" for k in self.unlisted]
        lines += [f"{uri}: {k}" for k in self.unreadable]
        if self.expected is not None and not self.missing and self.distinct < self.expected:
            lines.append(f"{uri}: {self.distinct} identities, {self.expected} expected")
        return lines


def _expected(manifest: DatasetManifest) -> set[Identity] | None:
    """tasks x samples x the attempt, from the lineage (None when the ids are not listed)."""
    lineage = manifest.lineage
    samples = manifest.counts.get("samples")
    if samples is None or len(lineage.tasks) != lineage.task_count:
        return None
    attempt = int(lineage.params.get("attempt", 0))
    return {(task, sample, attempt) for task in lineage.tasks for sample in range(samples)}


def audit_trajectories(
    store: ArtifactStore,
    prefix: str = "",
    manifest: DatasetManifest | None = None,
    parts_prefix: str = "parts/",
) -> TrajectoryAudit:
    """Read every part the manifest lists and every `.jsonl` under `<prefix>/<parts_prefix>`,
    and count records by identity: duplicated ones (with every part and line), expected ones
    missing (when the lineage lists its tasks), parts the manifest does not list."""
    manifest = manifest if manifest is not None else read_manifest(store, prefix)
    listed = [f.key for f in manifest.files]
    in_store = [
        k[len(prefix) :].lstrip("/") if prefix else k
        for k in store.list(join_key(prefix, parts_prefix) if prefix else parts_prefix)
        if k.endswith(".jsonl")
    ]
    audit = TrajectoryAudit(unlisted=sorted(set(in_store) - set(listed)))
    where: dict[Identity, list[str]] = {}
    for key in sorted(set(listed) | set(in_store)):
        try:
            data = store.get_bytes(join_key(prefix, key))
            identities = part_identities(data)
        except ArtifactNotFound:
            continue  # verify_manifest reports a listed part that is gone
        except (StoreError, ValueError) as exc:
            audit.unreadable.append(f"{key}: {exc}")
            continue
        for number, identity in enumerate(identities, start=1):
            where.setdefault(identity, []).append(f"{key}:{number}")
        audit.rows += len(identities)
    audit.distinct = len(where)
    audit.duplicated = {_label(k): v for k, v in sorted(where.items()) if len(v) > 1}
    expected = _expected(manifest)
    if expected is not None:
        audit.expected = len(expected)
        audit.missing = [_label(k) for k in sorted(expected - set(where))]
    return audit
