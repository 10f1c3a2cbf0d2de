"""The spool's keyed mode (what exactly-once collection uses), on the local file store.

What is checked: lines go to the part the caller names and only a sealed part uploads; a
crash leaves named parts open, and the next process repairs them (a torn last line dropped)
and keeps them open to be completed, never seals a partial one; `flush` uploads sealed parts
only; a key the store already holds with the same records (another writer's) is kept and
ours dropped, while other records under the key are a conflict that is never overwritten.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpa.store import FileStore
from qpa.store.manifest import part_identities
from qpa.store.spool import PartConflict, SpooledUploader


def line(task: str, sample: int, extra: str = "") -> str:
    return json.dumps({"task": {"id": task}, "sample": sample, "x": extra})


def same(existing: bytes, spooled: Path) -> bool:
    return set(part_identities(spooled.read_bytes())) <= set(part_identities(existing))


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "root")


def test_named_parts_upload_only_when_sealed(store: FileStore, tmp_path: Path) -> None:
    up = SpooledUploader(store, "parts", tmp_path / "spool", keyed=True, background=False)
    assert up.append(line("a", 0), part="p-0.jsonl") == "p-0.jsonl"
    up.append(line("b", 0), part="p-1.jsonl")
    up.append(line("c", 0), part="p-0.jsonl")
    assert [p.name for p in up.open_parts()] == ["p-0.jsonl", "p-1.jsonl"]
    up.seal("p-0.jsonl")
    assert up.flush() and store.list("parts/") == ["parts/p-0.jsonl"]  # p-1 is partial
    assert part_identities(store.get_bytes("parts/p-0.jsonl")) == [("a", 0, 0), ("c", 0, 0)]
    with pytest.raises(ValueError, match="sealed"):
        up.append(line("d", 0), part="p-0.jsonl")
    with pytest.raises(ValueError, match="part: need a file name"):
        up.append(line("d", 0), part="../escape.jsonl")
    with pytest.raises(ValueError, match="part: need a file name"):
        up.append(line("d", 0))
    up.abandon()
    assert [p.name for p in up.open_parts()] == ["p-1.jsonl"]  # left open for the next run


def test_a_crash_leaves_named_parts_open_and_repaired(store: FileStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    first = SpooledUploader(store, "parts", spool, keyed=True, background=False)
    first.append(line("a", 0), part="p-0.jsonl")
    first.append(line("b", 0), part="p-0.jsonl")
    first.abandon()  # the process dies with the part half full
    torn = spool / "open" / "p-0.jsonl"
    torn.write_bytes(torn.read_bytes() + b'{"task": {"id": "c"')
    second = SpooledUploader(store, "parts", spool, keyed=True, background=False)
    assert second.repaired and not second.pending()  # repaired, still open: not sealed
    assert [p.name for p in second.open_parts()] == ["p-0.jsonl"]
    assert [n for _, n, _ in second.iter_spooled_lines()] == [1, 2]
    second.append(line("c", 0), part="p-0.jsonl")  # completed where it stopped
    second.seal("p-0.jsonl")
    second.close()
    ids = part_identities(store.get_bytes("parts/p-0.jsonl"))
    assert ids == [("a", 0, 0), ("b", 0, 0), ("c", 0, 0)]


def test_a_key_filled_by_another_writer_is_kept(store: FileStore, tmp_path: Path) -> None:
    up = SpooledUploader(
        store, "parts", tmp_path / "spool", keyed=True, background=False, same_records=same
    )
    theirs = (line("a", 0, "theirs") + "\n" + line("b", 0, "theirs") + "\n").encode()
    store.put_bytes("parts/p-0.jsonl", theirs)  # a racing uploader with the same records
    up.append(line("b", 0, "ours"), part="p-0.jsonl")
    up.append(line("a", 0, "ours"), part="p-0.jsonl")
    up.seal("p-0.jsonl")
    (entry,) = up.flush()
    assert store.get_bytes("parts/p-0.jsonl") == theirs and up.superseded == ["parts/p-0.jsonl"]
    assert entry.rows == 2 and entry.size == len(theirs)
    # Other records under the key: a conflict, and the store's copy stays.
    store.put_bytes("parts/p-1.jsonl", (line("z", 0) + "\n").encode())
    up.append(line("y", 0), part="p-1.jsonl")
    up.seal("p-1.jsonl")
    with pytest.raises(PartConflict, match="other content"):
        up.flush()
    assert part_identities(store.get_bytes("parts/p-1.jsonl")) == [("z", 0, 0)]
    up.abandon()
    assert [p.name for p in up.pending()] == ["p-1.jsonl"]  # kept in the spool


def test_discard_drops_an_open_part(store: FileStore, tmp_path: Path) -> None:
    up = SpooledUploader(store, "parts", tmp_path / "spool", keyed=True, background=False)
    up.append(line("a", 0), part="p-0.jsonl")
    up.discard("p-0.jsonl")
    assert not up.open_parts() and not list(up.iter_spooled_lines())
    with pytest.raises(ValueError, match="keyed"):
        SpooledUploader(store, "seq", tmp_path / "other").append("{}", part="p.jsonl")
