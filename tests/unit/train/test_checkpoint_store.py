"""Checkpoint completion, verification, fallback and retries (`qpa.train.checkpoint`), on the
file store with a wrapper that injects faults (no torch, milliseconds).

The same code runs against SeaweedFS with the trainer SIGKILLed mid-upload in
tests/integration/test_checkpoint_s3.py; here each failure mode is pinned down on its own:
an interrupted upload never counts, an interrupted overwrite of a complete checkpoint revokes
it first, a tampered manifest or object is skipped in favour of the previous checkpoint, an
outage is ridden out (or reported, naming the object, once the retry budget is spent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qpa.store import FileStore, ObjectInfo, StoreUnavailable
from qpa.train.checkpoint import (
    COMPLETE,
    META_DIR,
    UPLOAD_DELAY_ENV,
    CheckpointError,
    CheckpointStore,
    latest_local,
    record_local,
    sweep_snapshots,
    upload_delay_s,
)


class Interrupted(Exception):
    """Stands for the process dying between two objects of an upload."""


class FaultyStore(FileStore):
    """A file store whose writes can die after `writes_left` objects, and whose calls can
    answer `StoreUnavailable` for the next `outage` calls."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes_left: int | None = None
        self.outage = 0
        self.unavailable = 0

    def _call(self) -> None:
        if self.outage > 0:
            self.outage -= 1
            self.unavailable += 1
            raise StoreUnavailable(f"{self.root_uri}: connection refused")

    def _write(self) -> None:
        self._call()
        if self.writes_left is not None:
            if self.writes_left == 0:
                raise Interrupted
            self.writes_left -= 1

    def put_file(self, key: str, path: str | Path) -> ObjectInfo:
        self._write()
        return super().put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        self._write()
        return super().put_bytes(key, data)

    def list(self, prefix: str = "") -> list[str]:
        self._call()
        return super().list(prefix)

    def get_bytes(self, key: str) -> bytes:
        self._call()
        return super().get_bytes(key)

    def delete(self, key: str) -> None:
        self._call()
        super().delete(key)


def checkpoint_folder(root: Path, step: int, payload: bytes | None = None) -> Path:
    folder = root / f"checkpoint-{step}"
    (folder / "global_step").mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "model.safetensors").write_bytes(payload or f"weights {step}".encode() * 50)
    (folder / "global_step" / "shard.pt").write_bytes(b"s" * step)
    record_local(folder, step)
    return folder


@pytest.fixture
def store(tmp_path: Path) -> FaultyStore:
    return FaultyStore(tmp_path / "store")


@pytest.fixture
def checkpoints(store: FaultyStore) -> CheckpointStore:
    return CheckpointStore(store, "trainingruns/t", retry_s=5.0)


def test_an_interrupted_upload_never_counts(
    checkpoints: CheckpointStore, store: FaultyStore, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    checkpoints.upload(checkpoint_folder(run, 2), 2)
    store.writes_left = 2  # two of checkpoint-4's four objects land, then the process dies
    with pytest.raises(Interrupted):
        checkpoints.upload(checkpoint_folder(run, 4), 4)
    landed = store.list("trainingruns/t/checkpoints/checkpoint-4/")
    assert len(landed) == 2 and not any(k.endswith(COMPLETE) for k in landed)
    assert checkpoints.steps() == [2]
    with pytest.raises(CheckpointError, match=r"no complete checkpoint at .*checkpoint-4"):
        checkpoints.download(4, tmp_path / "dl" / "checkpoint-4")
    ref = checkpoints.download_latest(lambda step: tmp_path / "fresh" / f"checkpoint-{step}")
    assert ref is not None and ref.step == 2 and ref.local is not None
    assert json.loads((ref.local / "trainer_state.json").read_text()) == {"global_step": 2}
    assert checkpoints.download_latest(lambda s: tmp_path / "x" / str(s), newer_than=2) is None
    # the rerun of the same save completes it
    store.writes_left = None
    checkpoints.upload(run / "checkpoint-4", 4)
    assert checkpoints.steps() == [2, 4]


def test_an_interrupted_overwrite_revokes_the_old_completion(
    checkpoints: CheckpointStore, store: FaultyStore, tmp_path: Path
) -> None:
    """A rerun (resume: never, or a resume from an older step) re-saves a step an earlier
    attempt completed; killed mid-upload, old and new objects are mixed: it must not count."""
    first = tmp_path / "first"
    checkpoints.upload(checkpoint_folder(first, 2), 2)
    checkpoints.upload(checkpoint_folder(first, 4), 4)
    assert checkpoints.steps() == [2, 4]
    second = tmp_path / "second"
    checkpoint_folder(second, 4, payload=b"different weights" * 40)
    store.writes_left = 1
    with pytest.raises(Interrupted):
        checkpoints.upload(second / "checkpoint-4", 4)
    assert checkpoints.steps() == [2]
    ref = checkpoints.download_latest(lambda step: tmp_path / "dl" / f"checkpoint-{step}")
    assert ref is not None and ref.step == 2


def test_tampered_manifests_and_objects_fall_back_to_the_previous_checkpoint(
    checkpoints: CheckpointStore, store: FaultyStore, tmp_path: Path, caplog: Any
) -> None:
    run = tmp_path / "run"
    for step in (2, 4, 6):
        checkpoints.upload(checkpoint_folder(run, step), step)
    complete = json.loads(store.get_bytes(f"{checkpoints.checkpoint_key(6)}/{META_DIR}/{COMPLETE}"))
    assert complete["step"] == 6 and set(complete["manifests"]) == {"0"}
    # checkpoint 6: its node manifest rewritten after completion
    node = f"{checkpoints.checkpoint_key(6)}/{META_DIR}/node-0.json"
    manifest = json.loads(store.get_bytes(node))
    manifest["files"].pop("global_step/shard.pt")
    store.put_bytes(node, json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match="manifest of node 0 changed"):
        checkpoints.download(6, tmp_path / "dl" / "checkpoint-6")
    # checkpoint 4: an object rewritten behind the store's back
    (store.root / checkpoints.checkpoint_key(4) / "model.safetensors").write_bytes(b"bad")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: content does not match"):
        checkpoints.download(4, tmp_path / "dl" / "checkpoint-4")
    assert not (tmp_path / "dl" / "checkpoint-4").exists()  # nothing half-downloaded is left
    assert not list((tmp_path / "dl").glob("*.download-*"))
    ref = checkpoints.download_latest(lambda step: tmp_path / "resume" / f"checkpoint-{step}")
    assert ref is not None and ref.step == 2
    assert "skipping checkpoint" in caplog.text and "checkpoint-6" in caplog.text


def test_completion_checks_every_listed_object(
    checkpoints: CheckpointStore, store: FaultyStore, tmp_path: Path
) -> None:
    folder = checkpoint_folder(tmp_path / "run", 3)
    base = checkpoints.checkpoint_key(3)
    manifest = json.loads((folder / "qpa_checkpoint.json").read_text())
    checkpoints.upload_folder(folder, base, manifest=manifest)
    store.delete(f"{base}/global_step/shard.pt")
    with pytest.raises(CheckpointError, match=r"shard\.pt: missing \(node 0 lists it\)"):
        checkpoints.mark_complete(base, step=3)
    store.put_bytes(f"{base}/global_step/shard.pt", b"other")
    with pytest.raises(CheckpointError, match=r"shard\.pt: content does not match"):
        checkpoints.mark_complete(base, step=3)
    assert checkpoints.steps() == []
    store.put_file(f"{base}/global_step/shard.pt", folder / "global_step" / "shard.pt")
    with pytest.raises(CheckpointError, match="lacks the manifest of node 1"):
        checkpoints.mark_complete(base, step=3, nodes=2)  # node 1 never uploaded
    assert checkpoints.steps() == []
    checkpoints.mark_complete(base, step=3)
    assert checkpoints.steps() == [3]


def test_an_outage_is_ridden_out_or_reported(
    store: FaultyStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("qpa.train.checkpoint.time.sleep", lambda s: None)
    patient = CheckpointStore(store, "trainingruns/t", retry_s=30.0)
    folder = checkpoint_folder(tmp_path / "run", 2)
    store.outage = 3
    patient.upload(folder, 2)
    assert store.unavailable == 3 and patient.steps() == [2]
    impatient = CheckpointStore(store, "trainingruns/t", retry_s=0.0)
    store.outage = 1
    with pytest.raises(CheckpointError, match=r"cannot list .*stayed unavailable"):
        impatient.steps()
    store.outage = 1
    with pytest.raises(
        CheckpointError,
        match=r"cannot delete file://.*COMPLETE\.json: the store stayed unavailable",
    ):
        impatient.upload(folder, 2)
    with pytest.raises(CheckpointError, match="retry_s"):
        CheckpointStore(store, "p", retry_s=-1)


def test_upload_delay_hook_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UPLOAD_DELAY_ENV, raising=False)
    assert upload_delay_s() == 0.0
    monkeypatch.setenv(UPLOAD_DELAY_ENV, "0.25")
    assert upload_delay_s() == 0.25
    for bad in ("soon", "-1", "600"):
        monkeypatch.setenv(UPLOAD_DELAY_ENV, bad)
        with pytest.raises(CheckpointError, match=UPLOAD_DELAY_ENV):
            upload_delay_s()


def test_local_leftovers_of_a_killed_process(tmp_path: Path) -> None:
    run = tmp_path / "run"
    good = checkpoint_folder(run, 2)
    checkpoint_folder(run, 4)
    (run / "checkpoint-4" / "model.safetensors").write_bytes(b"torn write")  # killed mid-save
    (run / "checkpoint-6").mkdir()  # killed before the manifest: no completion mark
    (run / ".upload-checkpoint-4" / "x").mkdir(parents=True)
    (run / "checkpoint-8.download-1234").mkdir()
    ref = latest_local(run)
    assert ref is not None and ref.step == 2 and ref.local == good
    removed = sorted(p.name for p in sweep_snapshots(run))
    assert removed == [".upload-checkpoint-4", "checkpoint-8.download-1234"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
