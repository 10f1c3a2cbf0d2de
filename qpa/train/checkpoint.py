"""Checkpoints in the artifact store: upload with hashes, find the latest complete one, restore.

A trainer saves `checkpoint-<step>/` folders (weights, optimizer, scheduler, RNG states,
`trainer_state.json`; with DeepSpeed also `global_step<step>/` shards). After each save,
`record_local` writes `qpa_checkpoint.json` into the folder: every file with its SHA-256 and
size. That file is the folder's completion mark (a folder without it, or whose files no longer
match it, is never resumed from) and its integrity record.

In the store (`CheckpointStore`, under the run's prefix) the layout is:

    <prefix>/checkpoints/checkpoint-<step>/<files...>
    <prefix>/checkpoints/checkpoint-<step>/_qpa/node-<k>.json   what node k uploaded (hashes)
    <prefix>/checkpoints/checkpoint-<step>/_qpa/COMPLETE.json   written last, by rank 0
    <prefix>/final/<files...> and <prefix>/final/_qpa/...       the final model, same scheme

Each node uploads the files it holds (ranks write their own ZeRO shards) with its manifest; rank
0 writes `COMPLETE.json` once every node's manifest is there. Only checkpoints with
`COMPLETE.json` count, so a run killed during an upload never resumes from half a checkpoint.
`CheckpointUploader` does the hashing and uploading in a background thread (training goes on),
from a hard-linked snapshot of the folder (so local rotation cannot delete files under it).
`download` fetches the union of the node manifests and checks every file's hash. The store keeps
every checkpoint (the local folder keeps the last few).

Through kills and outages (tested against SeaweedFS with the trainer SIGKILLed mid-upload):

- An upload first deletes the checkpoint's `COMPLETE.json` (and the node's own manifest), so a
  rerun that overwrites a checkpoint an earlier attempt completed never leaves old marks over
  new, half-written objects.
- `COMPLETE.json` is written only after every object the node manifests list was checked in
  the store (size and SHA-256), and it records the SHA-256 of each node manifest; a download
  checks those, then every file.
- `download_latest` tries the complete checkpoints newest first and skips (with a warning) one
  that fails verification, so a resume takes the newest checkpoint that is really whole.
- Store calls that fail with `StoreUnavailable` are retried with backoff for `retry_s` seconds
  (default 300) before the operation fails with a `CheckpointError` naming the URI.
- `QPA_CHECKPOINT_UPLOAD_DELAY_S` (seconds, default 0) sleeps before each object of a
  checkpoint upload: a fault-injection hook for tests and soaks (it widens the window in which
  a kill lands mid-upload); it changes timing only.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from qpa.store import (
    ArtifactNotFound,
    ArtifactStore,
    IntegrityError,
    StoreUnavailable,
    join_key,
    open_store,
    sha256_bytes,
    sha256_file,
)

log = logging.getLogger(__name__)

LOCAL_MANIFEST = "qpa_checkpoint.json"
META_DIR = "_qpa"
COMPLETE = "COMPLETE.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
SNAPSHOT_PREFIX = ".upload-"
UPLOAD_DELAY_ENV = "QPA_CHECKPOINT_UPLOAD_DELAY_S"
DEFAULT_RETRY_S = 300.0
T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupt; the message names where."""


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint: its step and where it is (a local folder or a store URI)."""

    step: int
    location: str
    local: Path | None = None


# --------------------------------------------------------------------------- local folders


def _files(folder: Path) -> Iterable[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.startswith(LOCAL_MANIFEST.split(".")[0]):
            yield path


def hash_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """`{relative path: {"sha256", "size"}}` of every file under `folder` (manifests excluded)."""
    out: dict[str, dict[str, Any]] = {}
    for path in _files(folder):
        sha, size = sha256_file(path)
        out[path.relative_to(folder).as_posix()] = {"sha256": sha, "size": size}
    return out


def _manifest_name(node_rank: int) -> str:
    return LOCAL_MANIFEST if node_rank == 0 else f"qpa_checkpoint.node-{node_rank}.json"


def record_local(folder: Path, step: int, *, node_rank: int = 0) -> dict[str, Any]:
    """Hash the checkpoint folder and write its manifest (the completion mark)."""
    manifest = {
        "step": step,
        "node_rank": node_rank,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": hash_folder(folder),
    }
    target = folder / _manifest_name(node_rank)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, target)
    return manifest


def verify_local(folder: Path) -> list[str]:
    """Problems with a local checkpoint folder (empty list: complete and intact)."""
    manifest_path = folder / LOCAL_MANIFEST
    if not manifest_path.is_file():
        return [f"{folder}: no {LOCAL_MANIFEST} (an incomplete save)"]
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{manifest_path}: unreadable ({exc})"]
    problems = []
    for rel, entry in files.items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        sha, size = sha256_file(path)
        if sha != entry.get("sha256") or size != entry.get("size"):
            problems.append(f"{path}: content does not match its recorded SHA-256")
    return problems


def checkpoint_step(folder: Path) -> int | None:
    match = CHECKPOINT_DIR.match(folder.name)
    return int(match.group(1)) if match else None


def local_checkpoints(output_dir: Path) -> list[CheckpointRef]:
    """Checkpoint folders of `output_dir` that carry a manifest, oldest first (not verified)."""
    refs = []
    if output_dir.is_dir():
        for child in output_dir.iterdir():
            step = checkpoint_step(child)
            if step is not None and (child / LOCAL_MANIFEST).is_file():
                refs.append(CheckpointRef(step, str(child), child))
    return sorted(refs, key=lambda r: r.step)


def latest_local(output_dir: Path) -> CheckpointRef | None:
    """The newest local checkpoint whose files match their manifest."""
    for ref in reversed(local_checkpoints(output_dir)):
        assert ref.local is not None
        if not verify_local(ref.local):
            return ref
    return None


# --------------------------------------------------------------------------- the store


def upload_delay_s() -> float:
    """The fault-injection pause before each checkpoint object (`QPA_CHECKPOINT_UPLOAD_DELAY_S`)."""
    text = os.environ.get(UPLOAD_DELAY_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise CheckpointError(f"{UPLOAD_DELAY_ENV}={text!r}: not a number of seconds") from None
    if not 0.0 <= value <= 60.0:
        raise CheckpointError(f"{UPLOAD_DELAY_ENV}={text!r}: must be between 0 and 60 seconds")
    return value


class CheckpointStore:
    """A run's checkpoints under `prefix` of an artifact store.

    Every store call is retried on `StoreUnavailable` (backoff from 0.5 s up to 10 s) for
    `retry_s` seconds; after that the operation fails with a `CheckpointError`.
    """

    def __init__(
        self, store: ArtifactStore, prefix: str, *, retry_s: float = DEFAULT_RETRY_S
    ) -> None:
        if retry_s < 0:
            raise CheckpointError(f"retry_s must be >= 0 seconds, got {retry_s}")
        self.store = store
        self.prefix = prefix.strip("/")
        self.retry_s = retry_s

    @classmethod
    def open(
        cls, root: str | Path, prefix: str, *, retry_s: float = DEFAULT_RETRY_S
    ) -> CheckpointStore:
        return cls(open_store(root), prefix, retry_s=retry_s)

    def key(self, *parts: str) -> str:
        return join_key(self.prefix, *parts)

    def checkpoint_key(self, step: int) -> str:
        return self.key("checkpoints", f"checkpoint-{step}")

    def uri(self, step: int | None = None) -> str:
        """URI of a checkpoint (or of the run's prefix)."""
        key = self.checkpoint_key(step) if step is not None else self.prefix
        return self.store.uri(key) if key else self.store.root_uri

    def _retry(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, retried while the store is unavailable (for `retry_s` seconds)."""
        return retry_unavailable(what, call, retry_s=self.retry_s)

    # ------------------------------------------------------------------ writing
    def upload_folder(
        self, folder: Path, base_key: str, *, node_rank: int = 0, manifest: dict[str, Any]
    ) -> None:
        """Upload the files of `manifest` and then the node's manifest.

        Node 0 first removes `COMPLETE.json` and each node its own manifest: objects being
        replaced never sit under the marks of the attempt that wrote them before.
        """
        delay = upload_delay_s()
        node_key = join_key(base_key, META_DIR, f"node-{node_rank}.json")
        if node_rank == 0:
            marker = join_key(base_key, META_DIR, COMPLETE)
            self._retry(f"delete {self.store.uri(marker)}", lambda: self.store.delete(marker))
        self._retry(f"delete {self.store.uri(node_key)}", lambda: self.store.delete(node_key))
        for rel in sorted(manifest["files"]):
            if delay:
                time.sleep(delay)
            key = join_key(base_key, rel)
            source = folder / rel
            self._retry(
                f"upload {self.store.uri(key)}",
                functools.partial(self.store.put_file, key, source),
            )
        data = json.dumps(manifest, sort_keys=True).encode()
        if delay:
            time.sleep(delay)
        self._retry(
            f"upload {self.store.uri(node_key)}", lambda: self.store.put_bytes(node_key, data)
        )

    def _node_manifest(self, base_key: str, node: int) -> tuple[dict[str, Any], str]:
        """Node `node`'s manifest of the checkpoint at `base_key`, and its SHA-256."""
        key = join_key(base_key, META_DIR, f"node-{node}.json")
        where = self.store.uri(key)
        try:
            data = self._retry(f"read {where}", lambda: self.store.get_bytes(key))
        except ArtifactNotFound:
            checkpoint = self.store.uri(base_key) if base_key else self.store.root_uri
            raise CheckpointError(
                f"checkpoint {checkpoint} lacks the manifest of node {node}"
            ) from None
        except IntegrityError as exc:
            raise CheckpointError(f"{where}: {exc}") from None
        try:
            manifest = json.loads(data)
            files = manifest["files"]
            if not isinstance(files, dict):
                raise TypeError("files is not a mapping")
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{where}: unreadable node manifest ({exc})") from None
        return manifest, sha256_bytes(data)

    def check_uploaded(self, base_key: str, *, nodes: int = 1) -> dict[str, str]:
        """Check that every object the node manifests list is in the store with its recorded
        size and SHA-256; `{node: sha256 of its manifest}`. Raises `CheckpointError`."""
        digests: dict[str, str] = {}
        for node in range(nodes):
            manifest, digest = self._node_manifest(base_key, node)
            digests[str(node)] = digest
            for rel, entry in sorted(manifest["files"].items()):
                key = join_key(base_key, rel)
                try:
                    info = self._retry(
                        f"stat {self.store.uri(key)}", functools.partial(self.store.stat, key)
                    )
                except ArtifactNotFound:
                    raise CheckpointError(
                        f"{self.store.uri(key)}: missing (node {node} lists it)"
                    ) from None
                recorded = entry.get("sha256")
                if info.size != entry.get("size") or (info.sha256 and info.sha256 != recorded):
                    raise CheckpointError(
                        f"{self.store.uri(key)}: content does not match its SHA-256 in the "
                        f"manifest of node {node}"
                    )
        return digests

    def mark_complete(self, base_key: str, *, step: int, nodes: int = 1) -> str:
        """Check the uploaded objects, then write `COMPLETE.json`: the checkpoint now counts."""
        digests = self.check_uploaded(base_key, nodes=nodes)
        record = {
            "step": step,
            "nodes": nodes,
            "manifests": digests,
            "completed": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        key = join_key(base_key, META_DIR, COMPLETE)
        data = json.dumps(record).encode()
        delay = upload_delay_s()
        if delay:
            time.sleep(delay)
        self._retry(f"upload {self.store.uri(key)}", lambda: self.store.put_bytes(key, data))
        return self.store.uri(base_key)

    def upload(self, folder: Path, step: int, *, node_rank: int = 0, nodes: int = 1) -> str:
        """Upload a recorded checkpoint folder (single node: also marks it complete)."""
        manifest_path = folder / _manifest_name(node_rank)
        manifest = (
            json.loads(manifest_path.read_text())
            if manifest_path.is_file()
            else record_local(folder, step, node_rank=node_rank)
        )
        base = self.checkpoint_key(step)
        self.upload_folder(folder, base, node_rank=node_rank, manifest=manifest)
        if nodes == 1:
            return self.mark_complete(base, step=step, nodes=1)
        return self.store.uri(base)

    def upload_final(self, folder: Path) -> str:
        """Upload the final model folder to `<prefix>/final` (hashed, marked complete)."""
        manifest = {"step": None, "node_rank": 0, "files": hash_folder(folder)}
        base = self.key("final")
        self.upload_folder(folder, base, manifest=manifest)
        return self.mark_complete(base, step=-1)

    # ------------------------------------------------------------------ reading
    def steps(self) -> list[int]:
        """Steps of the complete checkpoints in the store (`COMPLETE.json`), oldest first."""
        found = set()
        prefix = self.key("checkpoints") + "/"
        keys = self._retry(
            f"list {self.store.uri(prefix.rstrip('/'))}", lambda: self.store.list(prefix)
        )
        for key in keys:
            parts = key[len(prefix) :].split("/")
            if len(parts) == 3 and parts[1:] == [META_DIR, COMPLETE]:
                step = checkpoint_step(Path(parts[0]))
                if step is not None:
                    found.add(step)
        return sorted(found)

    def latest(self) -> CheckpointRef | None:
        """The newest checkpoint marked complete (not downloaded, not verified)."""
        steps = self.steps()
        if not steps:
            return None
        return CheckpointRef(steps[-1], self.uri(steps[-1]))

    def download(self, step: int, dest: Path) -> Path:
        """Fetch checkpoint `step` into `dest` (replaced), verified against its manifests."""
        return download_checkpoint(
            self.store, self.checkpoint_key(step), dest, step=step, retry_s=self.retry_s
        )

    def download_latest(
        self, dest: Callable[[int], Path], *, newer_than: int | None = None
    ) -> CheckpointRef | None:
        """Download the newest complete checkpoint that passes verification (into `dest(step)`),
        trying older ones when one does not; only steps above `newer_than`. None: none did."""
        for step in reversed(self.steps()):
            if newer_than is not None and step <= newer_than:
                break
            try:
                folder = self.download(step, dest(step))
            except CheckpointError as exc:
                log.warning("skipping checkpoint %s: %s", self.uri(step), exc)
                continue
            return CheckpointRef(step, self.uri(step), folder)
        return None


def retry_unavailable(what: str, call: Callable[[], T], *, retry_s: float) -> T:
    """`call()`; on `StoreUnavailable` again after 0.5, 1, 2 ... 10 s until `retry_s` passed,
    then a `CheckpointError` naming `what`."""
    deadline = time.monotonic() + retry_s
    pause = 0.5
    while True:
        try:
            return call()
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckpointError(
                    f"cannot {what}: the store stayed unavailable for {retry_s:g} s ({exc})"
                ) from None
            log.warning("cannot %s (%s); retrying in %.1f s", what, exc, min(pause, left))
            time.sleep(min(pause, left))
            pause = min(pause * 2, 10.0)


def snapshot(folder: Path, target: Path) -> Path:
    """Hard-link every file of `folder` under `target` (a copy where links are impossible)."""
    shutil.rmtree(target, ignore_errors=True)
    for path in folder.rglob("*"):
        if path.is_file():
            dest = target / path.relative_to(folder)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
    return target


class CheckpointUploader:
    """Records (hashes) and uploads saved checkpoints in one background thread, in order.

    `submit(folder, step)` snapshots the folder (hard links: instant) and returns; the thread
    hashes the snapshot, writes the folder's `qpa_checkpoint.json`, uploads the files and the
    node manifest and, on world rank 0, marks the checkpoint complete once every node's
    manifest is in the store. `wait()` drains the queue and raises the first failure.
    """

    def __init__(
        self,
        store: CheckpointStore | None,
        *,
        node_rank: int = 0,
        nodes: int = 1,
        world_zero: bool = True,
        complete_timeout_s: float = 3600.0,
    ) -> None:
        self.store = store
        self.node_rank = node_rank
        self.nodes = nodes
        self.world_zero = world_zero
        self.complete_timeout_s = complete_timeout_s
        self.uris: list[str] = []
        self.errors: list[str] = []
        self._queue: queue.Queue[tuple[Path, Path, int] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, folder: Path, step: int) -> None:
        staged = snapshot(folder, folder.with_name(f"{SNAPSHOT_PREFIX}{folder.name}"))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="qpa-checkpoints", daemon=True)
            self._thread.start()
        self._queue.put((folder, staged, step))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            folder, staged, step = item
            try:
                self._process(folder, staged, step)
            except Exception as exc:  # reported by wait(); training goes on
                message = f"checkpoint {step}: {type(exc).__name__}: {exc}"
                log.error("cannot record or upload %s", message)
                self.errors.append(message)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
                self._queue.task_done()
        self._queue.task_done()

    def _process(self, folder: Path, staged: Path, step: int) -> None:
        manifest = record_local(staged, step, node_rank=self.node_rank)
        name = _manifest_name(self.node_rank)
        if folder.is_dir():  # the local completion mark (unless rotation removed it already)
            shutil.copyfile(staged / name, folder / f"{name}.tmp")
            os.replace(folder / f"{name}.tmp", folder / name)
        if self.store is None:
            return
        base = self.store.checkpoint_key(step)
        self.store.upload_folder(staged, base, node_rank=self.node_rank, manifest=manifest)
        if not self.world_zero:
            return
        deadline = time.monotonic() + self.complete_timeout_s
        for node in range(1, self.nodes):
            key = join_key(base, META_DIR, f"node-{node}.json")
            while not self.store._retry(
                f"stat {self.store.store.uri(key)}", functools.partial(self.store.store.exists, key)
            ):
                if time.monotonic() > deadline:
                    raise CheckpointError(f"node {node} never uploaded {self.store.uri(step)}")
                time.sleep(1.0)
        self.uris.append(self.store.mark_complete(base, step=step, nodes=self.nodes))

    def wait(self) -> list[str]:
        """Finish every pending upload; the URIs of the completed checkpoints."""
        if self._thread is not None:
            self._queue.join()
        if self.errors:
            raise CheckpointError("; ".join(self.errors))
        return list(self.uris)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def download_checkpoint(
    store: ArtifactStore,
    base_key: str,
    dest: Path,
    *,
    step: int | None = None,
    retry_s: float = DEFAULT_RETRY_S,
) -> Path:
    """Fetch the checkpoint at `base_key` of `store` into `dest` and verify every file.

    Only a checkpoint with `COMPLETE.json` is fetched; the node manifests must match the
    SHA-256 it records (when it records them) and every file the SHA-256 its manifest records.
    The download goes to a sibling temporary folder that replaces `dest` only when complete.
    Raises `CheckpointError` naming the object at fault.
    """
    where = store.uri(base_key) if base_key else store.root_uri
    checkpoints = CheckpointStore(store, "", retry_s=retry_s)

    def fetch_bytes(key: str) -> bytes:
        return retry_unavailable(
            f"read {store.uri(key)}", lambda: store.get_bytes(key), retry_s=retry_s
        )

    marker = join_key(base_key, META_DIR, COMPLETE)
    try:
        complete = json.loads(fetch_bytes(marker))
        nodes = int(complete.get("nodes", 1))
        recorded = complete.get("manifests") or {}
        if not isinstance(recorded, dict):
            raise TypeError("manifests is not a mapping")
    except ArtifactNotFound:
        raise CheckpointError(f"no complete checkpoint at {where}") from None
    except (IntegrityError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{store.uri(marker)}: unreadable ({exc})") from None
    files: dict[str, dict[str, Any]] = {}
    for node in range(nodes):
        manifest, digest = checkpoints._node_manifest(base_key, node)
        expected = recorded.get(str(node))
        if expected is not None and expected != digest:
            raise CheckpointError(
                f"checkpoint {where}: the manifest of node {node} changed after the checkpoint "
                "was marked complete (an interrupted overwrite)"
            )
        files.update(manifest["files"])
    staging = dest.with_name(f"{dest.name}.download-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for rel, entry in sorted(files.items()):
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            key = join_key(base_key, rel)
            try:
                retry_unavailable(
                    f"read {store.uri(key)}",
                    functools.partial(store.get_file, key, target),
                    retry_s=retry_s,
                )
            except ArtifactNotFound:
                raise CheckpointError(
                    f"{store.uri(key)}: missing from the complete checkpoint {where}"
                ) from None
            except IntegrityError:
                raise CheckpointError(
                    f"{store.uri(key)}: content does not match its SHA-256"
                ) from None
            sha, size = sha256_file(target)
            if sha != entry["sha256"] or size != entry["size"]:
                raise CheckpointError(f"{store.uri(key)}: content does not match its SHA-256")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    resolved = step if step is not None else complete.get("step")
    (staging / LOCAL_MANIFEST).write_text(
        json.dumps({"step": resolved, "node_rank": 0, "files": files}, indent=1, sort_keys=True)
    )
    if dest.exists():
        if not verify_local(dest):  # another process (a rank of another node) got there first
            shutil.rmtree(staging, ignore_errors=True)
            return dest
        shutil.rmtree(dest)
    os.replace(staging, dest)
    return dest


def sweep_snapshots(output_dir: Path) -> list[Path]:
    """Remove the upload snapshots (`.upload-checkpoint-<step>/`) and partial downloads
    (`checkpoint-<step>.download-<pid>/`) a killed process left in `output_dir`."""
    removed = []
    if output_dir.is_dir():
        for child in output_dir.iterdir():
            stale = child.name.startswith(SNAPSHOT_PREFIX + "checkpoint-") or (
                ".download-" in child.name and child.name.startswith("checkpoint-")
            )
            if stale and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed
