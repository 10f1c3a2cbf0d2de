"""Manifest verification of a collection: duplicated and missing identities, named.

What is checked: a clean collection verifies with no problem; a record copied into a second
part is reported with its identity and both `part:line` places (also when the copy sits in a
part the manifest does not list, which is reported too); an expected (task, sample, attempt)
that no part holds is named as missing; records of another attempt are other identities; a
line that is not a trajectory is reported as unreadable; datasets not written by collection
are not audited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpa.store import FileStore
from qpa.store.manifest import (
    COLLECTOR,
    DatasetManifest,
    Lineage,
    ManifestFile,
    audit_trajectories,
    part_identities,
    verify_manifest,
    write_manifest,
)


def record(task: str, sample: int, attempt: int | None = None) -> bytes:
    meta = {} if attempt is None else {"attempt": attempt}
    return json.dumps({"task": {"id": task}, "sample": sample, "metadata": meta}).encode()


def put_part(store: FileStore, key: str, records: list[bytes]) -> ManifestFile:
    info = store.put_bytes(key, b"".join(r + b"\n" for r in records))
    return ManifestFile.of(info, rows=len(records))


def collection(store: FileStore, files: list[ManifestFile], *, attempt: int = 0) -> None:
    write_manifest(
        store,
        "",
        DatasetManifest(
            name="c",
            kind="trajectories",
            files=files,
            counts={"samples": 2},
            lineage=Lineage.for_tasks(["a", "b"], params={"attempt": attempt}),
            extra={"collector": COLLECTOR},
        ),
    )


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "root")


def test_a_clean_collection_verifies(store: FileStore) -> None:
    files = [
        put_part(store, "parts/p0.jsonl", [record("a", 0), record("b", 0)]),
        put_part(store, "parts/p1.jsonl", [record("a", 1), record("b", 1, attempt=0)]),
    ]
    collection(store, files)
    assert verify_manifest(store) == []
    audit = audit_trajectories(store)
    assert (audit.expected, audit.rows, audit.distinct, audit.duplicates, audit.lost) == (
        4, 4, 4, 0, 0,
    )  # fmt: skip


def test_duplicates_and_missing_are_named(store: FileStore) -> None:
    files = [
        put_part(store, "parts/p0.jsonl", [record("a", 0), record("b", 0)]),
        put_part(store, "parts/p1.jsonl", [record("a", 1), record("a", 0)]),
    ]
    collection(store, files)
    put_part(store, "parts/stray.jsonl", [record("b", 0)])  # landed after the manifest
    audit = audit_trajectories(store)
    assert audit.duplicated == {
        "a sample 0 attempt 0": ["parts/p0.jsonl:1", "parts/p1.jsonl:2"],
        "b sample 0 attempt 0": ["parts/p0.jsonl:2", "parts/stray.jsonl:1"],
    }
    assert audit.duplicates == 2 and audit.missing == ["b sample 1 attempt 0"]
    assert audit.unlisted == ["parts/stray.jsonl"] and audit.rows == 5
    problems = verify_manifest(store)
    assert any("a sample 0 attempt 0 appears 2 times" in p for p in problems)
    assert any("b sample 1 attempt 0 is missing" in p for p in problems)
    assert any("stray.jsonl is in the store but not in the manifest" in p for p in problems)


def test_another_attempt_is_another_identity(store: FileStore) -> None:
    files = [
        put_part(store, "parts/p0.jsonl", [record("a", 0, 1), record("b", 0, 1)]),
        put_part(store, "parts/p1.jsonl", [record("a", 1, 1), record("b", 1, 1)]),
        put_part(store, "parts/old.jsonl", [record("a", 0, 0)]),
    ]
    collection(store, files, attempt=1)
    audit = audit_trajectories(store)
    assert audit.duplicates == 0 and audit.missing == [] and audit.distinct == 5


def test_unreadable_lines_and_other_datasets(store: FileStore) -> None:
    files = [put_part(store, "parts/p0.jsonl", [record("a", 0), b'{"no": "task"}'])]
    collection(store, files)
    assert any("p0.jsonl: line 2: not a trajectory" in p for p in verify_manifest(store))
    with pytest.raises(ValueError, match="line 1"):
        part_identities(b"not json\n")
    other = FileStore(store.root / "sft")
    info = other.put_bytes("data.jsonl", record("a", 0) + b"\n" + record("a", 0) + b"\n")
    write_manifest(
        other, "", DatasetManifest(name="s", kind="sft", files=[ManifestFile.of(info, 2)])
    )
    assert verify_manifest(other) == []  # only collections are audited by identity
