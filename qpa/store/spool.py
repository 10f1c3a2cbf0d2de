"""`SpooledUploader`: stream JSON Lines to a store through a local spool that survives outages.

    with SpooledUploader(store, "parts", "/spool/shard-3", part_size=64, shard=(3, 8)) as up:
        for trajectory in produce():
            up.append(trajectory)          # a pydantic model, a str or bytes: one JSON line
    # leaving the block flushes: every part is in the store, or an error says what is left

- **Parts.** Lines go to an open part file in `spool_dir/open/` (flushed per line, so a crash
  of the process loses nothing written). After `part_size` lines (or `part_bytes` bytes) the
  part is sealed (atomic rename into `spool_dir/ready/`; fsynced first with `durable=True`)
  and queued for upload. Part names are deterministic: `part-<i>-of-<n>-<seq>.jsonl` for
  shard i/n and a sequence number that continues after the highest one found in the store or
  the spool.
- **Uploads** run in a background thread (or inline with `background=False`) with tenacity
  retries and exponential backoff on `StoreUnavailable`. A part that still fails stays in the
  spool and is tried again later, so producing never stops during an outage; `flush()` seals
  the open part and waits until the spool is empty (or its timeout passes).
- **Idempotent.** Before uploading, the part's key is looked up: the same SHA-256 there means
  an earlier attempt (an ambiguous failure, a crash after the upload) already landed it, so it
  is not sent again; a different hash is a conflict (two writers on one shard) and is never
  overwritten. Object keys are fixed by shard and sequence, so a re-upload never duplicates.
- **Recovery.** Opening a spool that a crashed process left behind repairs its open part (a
  last line cut short is dropped; any other corrupt line is an error naming the line), seals
  it, and uploads everything pending. One process holds a spool at a time (a file lock).
- **Named parts** (`keyed=True`, what collection uses for exactly-once placement): the caller
  names the part each line goes to (`append(line, part="a00-t00003-s0001.jsonl")`: a pure
  function of the record's identity) and seals it when it holds every record it should.
  Several named parts can be open at once; a crash leaves them open, and the next process
  repairs them and keeps them open (`open_parts()`) to be completed, never seals a partial
  one. When the store already holds the key with other bytes, `same_records(existing, path)`
  decides: True (the other writer put the same records there: a retried shard, a racing
  uploader) drops the spooled copy and keeps the store's; False is a `PartConflict`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson
from pydantic import BaseModel
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
)

from qpa.contract import CorruptLineError
from qpa.store.base import (
    ArtifactNotFound,
    ArtifactStore,
    StoreError,
    StoreUnavailable,
    join_key,
    sha256_file,
)
from qpa.store.file import atomic_write_bytes
from qpa.store.manifest import ManifestFile
from qpa.store.metrics import SPOOL_PARTS, SPOOL_UPLOADS

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.jsonl")
DEFAULT_PART_SIZE = 256
DEFAULT_PART_BYTES = 64 * 1024 * 1024


class SpoolBusy(StoreError):
    """Another process holds this spool directory."""


class PartConflict(StoreError):
    """The store already holds a part of this name with other content (two writers, one shard)."""


def shard_tag(shard: tuple[int, int]) -> str:
    index, count = shard
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"invalid shard {index}/{count}: need 0 <= i < n")
    return f"{index:05d}-of-{count:05d}"


def part_name(tag: str, seq: int) -> str:
    return f"part-{tag}-{seq:06d}.jsonl"


def count_rows(path: Path) -> int:
    with open(path, "rb") as stream:
        return sum(1 for line in stream if line.strip())


def repair_part(path: Path) -> tuple[int, bool]:
    """Make a part left by a crash whole: drop a last line cut short; returns (rows, repaired).

    Any other line that is not JSON raises `CorruptLineError` naming the file and line.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" when the file ends cleanly
    kept: list[bytes] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CorruptLineError(str(path), number, f"not JSON: {exc}") from None
        kept.append(line)
    repaired = False
    if tail.strip():
        try:
            orjson.loads(tail)
        except orjson.JSONDecodeError:
            repaired = True  # a write cut short by the crash: the record was never complete
        else:
            kept.append(tail)  # complete, only its newline was lost
            repaired = True
    clean = b"".join(line + b"\n" for line in kept)
    if clean != data:
        atomic_write_bytes(path, clean)
        repaired = True
    return len(kept), repaired


class SpooledUploader:
    """Append JSON lines; they reach `store` under `prefix/` in whole, uniquely named parts."""

    def __init__(
        self,
        store: ArtifactStore,
        prefix: str,
        spool_dir: str | Path,
        part_size: int = DEFAULT_PART_SIZE,
        *,
        shard: tuple[int, int] = (0, 1),
        part_bytes: int = DEFAULT_PART_BYTES,
        background: bool = True,
        durable: bool = False,
        attempts: int = 4,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        keyed: bool = False,
        same_records: Callable[[bytes, Path], bool] | None = None,
    ) -> None:
        if part_size < 1 or part_bytes < 1:
            raise ValueError("part_size and part_bytes must be positive")
        self.store = store
        self.prefix = prefix.strip("/")
        self.spool_dir = Path(spool_dir)
        self.part_size = part_size
        self.part_bytes = part_bytes
        self.tag = shard_tag(shard)
        self.background = background
        # fsync on seal costs ~10-30 ms a part on the writer's path; without it a crash of the
        # process still loses nothing (the lines are in the OS page cache), only a crash of
        # the machine can, and a pod's emptyDir spool does not outlive its node anyway.
        self.durable = durable
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.keyed = keyed
        self.same_records = same_records
        self.superseded: list[str] = []  # keys another writer had already filled (ours dropped)
        self.uploaded: list[ManifestFile] = []  # parts this uploader put (or found) in the store
        self.repaired: list[str] = []  # messages about parts repaired after a crash
        self.failures = 0  # upload passes that left parts in the spool
        self.last_error: StoreError | None = None
        self._open_dir = self.spool_dir / "open"
        self._ready_dir = self.spool_dir / "ready"
        self._stream: IO[bytes] | None = None
        self._open_path: Path | None = None
        self._named: dict[str, IO[bytes]] = {}  # keyed mode: open part name -> its stream
        self._sealed: set[str] = set()  # keyed mode: parts this process sealed
        self._rows = 0
        self._bytes = 0
        self._lock = threading.Lock()  # uploaded / last_error / the upload pass
        self._wake = threading.Condition()
        self._idle = threading.Condition()
        self._stopping = False
        self._stop_event = threading.Event()
        self._dirty = False
        self._fatal: StoreError | None = None
        self._thread: threading.Thread | None = None
        self._lock_file: IO[bytes] | None = None

        self._open_dir.mkdir(parents=True, exist_ok=True)
        self._ready_dir.mkdir(parents=True, exist_ok=True)
        self._acquire()
        try:
            self._recover()
            self._seq = 0 if keyed else self._next_sequence()
        except BaseException:
            self._release()
            raise
        SPOOL_PARTS.labels("pending").inc(len(self.pending()))
        if background:
            self._thread = threading.Thread(target=self._run, name=f"spool-{self.tag}", daemon=True)
            self._thread.start()
            self._kick()

    # ------------------------------------------------------------------ set-up
    def _acquire(self) -> None:
        stream = open(self.spool_dir / ".lock", "ab")  # noqa: SIM115 (held for our lifetime)
        try:
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            stream.close()
            raise SpoolBusy(f"spool {self.spool_dir} is in use by another process") from None
        self._lock_file = stream

    def _release(self) -> None:
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def _recover(self) -> None:
        """Repair parts a previous process left open (a torn last line); seal them, unless
        named (keyed mode: a partial named part stays open to be completed)."""
        for path in sorted(self._open_dir.glob("*.jsonl")):
            rows, repaired = repair_part(path)
            if repaired:
                self.repaired.append(f"{path.name}: repaired a line cut short by a crash")
            if rows == 0:
                path.unlink()
                continue
            if not self.keyed:
                os.replace(path, self._ready_dir / path.name)
        for stray in self._open_dir.iterdir():  # temp files of an interrupted repair
            if stray.is_file() and not stray.name.endswith(".jsonl"):
                stray.unlink()

    def _next_sequence(self) -> int:
        pattern = re.compile(rf"part-{re.escape(self.tag)}-(\d+)\.jsonl$")
        names = [p.name for p in self._ready_dir.glob("*.jsonl")]
        names += [k.rsplit("/", 1)[-1] for k in self._retrying(self._list_remote)]
        found = [int(m.group(1)) for n in names if (m := pattern.search(n))]
        return max(found, default=-1) + 1

    def _list_remote(self) -> list[str]:
        return self.store.list(join_key(self.prefix, f"part-{self.tag}-"))

    def _backoff(self, seconds: float) -> None:
        self._stop_event.wait(seconds)  # ends early when the uploader stops

    def _retrying(self, fn: Any) -> Any:
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts) | stop_when_event_set(self._stop_event),
            wait=wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception_type(StoreUnavailable),
            sleep=self._backoff,
            reraise=True,
        )
        return retrying(fn)

    # ------------------------------------------------------------------ writing
    def append(self, record: BaseModel | str | bytes, part: str | None = None) -> str:
        """Add one JSON line (a model is serialized); seals and queues the part when full.

        Returns the name of the part the line went into (its key is `<prefix>/<name>`). In
        keyed mode `part` names it (and the caller seals it: `seal(part)`).
        """
        if self.keyed:
            return self._append_named(self._line(record), part)
        if part is not None:
            raise ValueError("part names are for a keyed uploader (keyed=True)")
        line = self._line(record)
        if self._stream is None:
            self._open_path = self._open_dir / part_name(self.tag, self._seq)
            self._stream = open(self._open_path, "ab")  # noqa: SIM115 (closed when sealed)
        self._stream.write(line + b"\n")
        self._stream.flush()
        name = self._open_path.name if self._open_path is not None else ""
        self._rows += 1
        self._bytes += len(line) + 1
        if self._rows >= self.part_size or self._bytes >= self.part_bytes:
            self.seal()
        return name

    @staticmethod
    def _line(record: BaseModel | str | bytes) -> bytes:
        if isinstance(record, BaseModel):
            line = record.model_dump_json().encode()
        elif isinstance(record, str):
            line = record.encode()
        else:
            line = bytes(record)
        line = line.rstrip(b"\n")
        if b"\n" in line:
            raise ValueError("a record must be one line")
        return line

    def _append_named(self, line: bytes, part: str | None) -> str:
        if part is None or not _NAME.fullmatch(part):
            raise ValueError(f"part: need a file name like part-1.jsonl, not {part!r}")
        if part in self._sealed or (self._ready_dir / part).exists():
            raise ValueError(f"part {part} is sealed: it takes no more lines")
        stream = self._named.get(part)
        if stream is None:
            stream = self._named[part] = open(self._open_dir / part, "ab")  # noqa: SIM115
        stream.write(line + b"\n")
        stream.flush()
        return part

    def open_parts(self) -> list[Path]:
        """Keyed mode: the named parts not sealed yet (this process's and a crash's)."""
        return sorted(self._open_dir.glob("*.jsonl"))

    def discard(self, part: str) -> None:
        """Keyed mode: drop an open named part (the store already holds its key, complete)."""
        stream = self._named.pop(part, None)
        if stream is not None:
            stream.close()
        with contextlib.suppress(FileNotFoundError):
            (self._open_dir / part).unlink()

    def seal(self, part: str | None = None) -> Path | None:
        """Close the open part (keyed mode: the named `part`) and queue it for upload;
        returns its spool path (None: nothing was open)."""
        if self.keyed:
            return self._seal_named(part) if part is not None else None
        if self._stream is None or self._open_path is None:
            return None
        self._stream.flush()
        if self.durable:
            os.fsync(self._stream.fileno())
        self._stream.close()
        ready = self._ready_dir / self._open_path.name
        os.replace(self._open_path, ready)
        self._stream, self._open_path = None, None
        self._rows = self._bytes = 0
        self._seq += 1
        SPOOL_PARTS.labels("pending").inc()
        self._kick()
        return ready

    def _seal_named(self, part: str) -> Path | None:
        stream = self._named.pop(part, None)
        path = self._open_dir / part
        if stream is not None:
            stream.flush()
            if self.durable:
                os.fsync(stream.fileno())
            stream.close()
        if not path.exists():
            return None
        ready = self._ready_dir / part
        os.replace(path, ready)
        self._sealed.add(part)
        SPOOL_PARTS.labels("pending").inc()
        self._kick()
        return ready

    # ------------------------------------------------------------------ inspection
    def pending(self) -> list[Path]:
        """Sealed parts not yet in the store, oldest first."""
        return sorted(self._ready_dir.glob("*.jsonl"))

    def spooled_parts(self) -> list[Path]:
        """Every part in the spool: sealed ones and the open one(s)."""
        parts = self.pending()
        if self.keyed:
            return parts + self.open_parts()
        if self._open_path is not None and self._open_path.exists():
            parts.append(self._open_path)
        return parts

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No part moves from the spool to the store inside this block (an upload pass in
        progress finishes first): what the store holds and what the spool holds can be read
        as one consistent snapshot, with no part in neither."""
        with self._lock:
            yield

    def iter_spooled_lines(self) -> Iterator[tuple[Path, int, bytes]]:
        """(part, 1-based line number, line) of every record still in the spool."""
        if self._stream is not None:
            self._stream.flush()
        for stream in self._named.values():
            stream.flush()
        for path in self.spooled_parts():
            with open(path, "rb") as stream:
                for number, line in enumerate(stream, start=1):
                    if line.strip():
                        yield path, number, line.rstrip(b"\n")

    # ------------------------------------------------------------------ uploading
    def _kick(self) -> None:
        with self._wake:
            self._dirty = True
            self._wake.notify_all()

    def _upload_one(self, path: Path) -> ManifestFile:
        key = join_key(self.prefix, path.name)
        sha, size = sha256_file(path)
        rows = count_rows(path)
        try:
            present = self.store.stat(key)
        except ArtifactNotFound:
            present = None
        if present is not None and present.sha256 == sha:
            SPOOL_UPLOADS.labels("already_present").inc()
            return ManifestFile(key=key, sha256=sha, size=size, rows=rows)
        if present is not None and self.same_records is not None:
            existing = self.store.get_bytes(key)
            if self.same_records(existing, path):  # another writer put these records there
                SPOOL_UPLOADS.labels("superseded").inc()
                self.superseded.append(key)
                return ManifestFile(
                    key=key,
                    sha256=present.sha256 or hashlib.sha256(existing).hexdigest(),
                    size=len(existing),
                    rows=sum(1 for line in existing.split(b"\n") if line.strip()),
                )
        if present is not None:
            SPOOL_UPLOADS.labels("conflict").inc()
            raise PartConflict(
                f"{self.store.uri(key)} exists with other content (sha256 {present.sha256}, "
                f"spooled {sha}): is another writer using shard {self.tag}?"
            )
        info = self.store.put_file(key, path)
        if info.sha256 != sha:  # the file changed under us: never accept a torn upload
            raise StoreUnavailable(f"{path}: changed while uploading; will retry")
        SPOOL_UPLOADS.labels("uploaded").inc()
        return ManifestFile(key=key, sha256=sha, size=size, rows=rows)

    def upload_pending(self) -> int:
        """One pass over the spool: upload what can be; returns how many parts are left.

        Transient failures (`StoreUnavailable`) are retried with backoff, then left for a later
        pass; other store errors (conflict, access denied) are recorded in `last_error`.
        """
        with self._lock:
            for path in self.pending():
                try:
                    entry = self._retrying(lambda p=path: self._upload_one(p))
                except StoreError as exc:
                    self.failures += 1
                    self.last_error = exc
                    SPOOL_UPLOADS.labels("failed").inc()
                    if not isinstance(exc, StoreUnavailable):
                        self._fatal = exc
                    break  # keep order; try again on the next pass
                path.unlink()
                SPOOL_PARTS.labels("pending").dec()
                self.uploaded.append(entry)
                self.last_error = None
            left = len(self.pending())
        with self._idle:
            self._idle.notify_all()
        return left

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                self._dirty = False
            failures = self.failures
            left = self.upload_pending()
            with self._wake:
                if self._stopping:
                    return
                if self._dirty or (left and self.failures == failures):
                    continue  # new parts arrived during the pass: no sleeping on them
                # Idle: sleep until woken. Parts left after a failure: back off, then retry.
                self._wake.wait(timeout=None if left == 0 else self.max_backoff_s)

    def flush(self, timeout: float | None = None) -> list[ManifestFile]:
        """Seal the open part and wait until every part is in the store; returns all uploaded.

        Raises `StoreUnavailable` when parts are still spooled after `timeout` seconds (they
        stay in the spool for a later flush or a later process), or the error that made an
        upload impossible (e.g. `PartConflict`, `StoreAccessDenied`).
        """
        if self._stopping:
            raise StoreError(f"spool {self.spool_dir}: the uploader is closed")
        self.seal()
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._thread is None:
            while True:
                left = self.upload_pending()
                if left == 0 or self._fatal is not None:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(self.max_backoff_s)
        else:
            self._kick()
            with self._idle:
                while self.pending() and self._fatal is None:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._idle.wait(timeout=0.5 if remaining is None else min(remaining, 0.5))
        if self._fatal is not None:
            raise self._fatal
        still = self.pending()
        if still:
            raise StoreUnavailable(
                f"{len(still)} part(s) still in spool {self.spool_dir} after {timeout}s "
                f"({self.last_error}); they upload on the next flush or run"
            )
        with self._lock:
            return list(self.uploaded)

    def close(self, timeout: float | None = None) -> list[ManifestFile]:
        """Flush, stop the upload thread and release the spool (parts left stay in it)."""
        try:
            return self.flush(timeout)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop without waiting for uploads: whatever is spooled stays for the next process."""
        if self._stream is not None:
            self.seal()
        for stream in self._named.values():  # keyed: partial parts stay open in the spool
            stream.close()
        self._named.clear()
        with self._wake:
            self._stopping = True
            self._stop_event.set()
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._release()

    def __enter__(self) -> SpooledUploader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()
