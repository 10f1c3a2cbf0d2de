"""Dataset manifests: what a dataset holds (files with hashes) and where it came from (lineage).

Every dataset under a store prefix has `<prefix>/manifest.json`: a `DatasetManifest` naming the
dataset's files (keys relative to the prefix, SHA-256, size, rows), its lineage (which tasks,
which policy, which generator, parent dataset URIs, parameters), mixture weights, the reasons
for curation decisions and the human review state. `verify_manifest` downloads every file again
and recomputes its hash, size and row count.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    or one whose stored hash metadata disagrees with its bytes, is a problem too.
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
    return problems
