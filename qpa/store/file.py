"""`FileStore`: the artifact store on a local (or mounted) directory, the default.

Writes go to a hidden temporary file next to the target, are fsynced, then `os.replace`d over
it (and the directory is fsynced), so a reader sees the old object or the whole new one, never
a torn write, even across a crash. Temporary files (`.<name>.qpa-tmp-<random>`) never show in
listings. The local filesystem keeps no metadata, so `stat` and `get_*` hash the bytes they read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from pathlib import Path

from qpa.store.base import (
    HASH_CHUNK,
    ArtifactNotFound,
    ObjectInfo,
    StoreError,
    check_key,
    check_prefix,
    sha256_file,
)
from qpa.store.metrics import moved, observed

TMP_MARKER = ".qpa-tmp-"
BACKEND = "file"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a fsynced temporary file and `os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _copy_hashing(source: Path, target: Path) -> tuple[str, int]:
    """Copy `source` to `target` atomically; returns (sha256, size) of what was copied."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
    digest = hashlib.sha256()
    size = 0
    try:
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(HASH_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(target.parent)
    return digest.hexdigest(), size


class FileStore:
    """Artifacts under a local directory, addressed as `file:///abs/dir/<key>`."""

    backend = BACKEND

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()

    def __repr__(self) -> str:
        return f"FileStore({self.root_uri!r})"

    @property
    def root_uri(self) -> str:
        return self.root.as_uri()

    def uri(self, key: str) -> str:
        return f"{self.root_uri.rstrip('/')}/{check_key(key)}"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _error(self, key: str, action: str, exc: OSError) -> StoreError:
        if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return ArtifactNotFound(self.uri(key))
        return StoreError(f"{action} {self.uri(key)}: {exc.strerror or exc}")

    # ------------------------------------------------------------------ writes
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        path = self._path(key)
        with observed(BACKEND, "put"):
            try:
                atomic_write_bytes(path, bytes(data))
            except OSError as exc:
                raise StoreError(f"cannot write {self.uri(key)}: {exc.strerror or exc}") from exc
        moved(BACKEND, "out", len(data))
        return ObjectInfo(key, len(data), hashlib.sha256(data).hexdigest())

    def put_file(self, key: str, path: str | Path) -> ObjectInfo:
        target = self._path(key)
        source = Path(path)
        with observed(BACKEND, "put"):
            if not source.is_file():
                raise StoreError(f"cannot upload {source}: not a file")
            try:
                sha, size = _copy_hashing(source, target)
            except OSError as exc:
                raise StoreError(f"cannot write {self.uri(key)}: {exc.strerror or exc}") from exc
        moved(BACKEND, "out", size)
        return ObjectInfo(key, size, sha)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with observed(BACKEND, "delete"):
            try:
                path.unlink()
            except FileNotFoundError:
                return
            except OSError as exc:
                raise self._error(key, "cannot delete", exc) from exc

    # ------------------------------------------------------------------ reads
    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        with observed(BACKEND, "get"):
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise self._error(key, "cannot read", exc) from None
        moved(BACKEND, "in", len(data))
        return data

    def get_file(self, key: str, path: str | Path) -> Path:
        source = self._path(key)
        target = Path(path)
        with observed(BACKEND, "get"):
            if not source.is_file():
                raise ArtifactNotFound(self.uri(key))
            try:
                _, size = _copy_hashing(source, target)
            except FileNotFoundError as exc:
                if not source.exists():
                    raise ArtifactNotFound(self.uri(key)) from None
                raise StoreError(f"cannot write {target}: {exc.strerror}") from exc
            except OSError as exc:
                raise StoreError(f"cannot copy {self.uri(key)} to {target}: {exc}") from exc
        moved(BACKEND, "in", size)
        return target

    def exists(self, key: str) -> bool:
        with observed(BACKEND, "exists"):
            return self._path(key).is_file()

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with observed(BACKEND, "stat"):
            try:
                if not path.is_file():
                    raise ArtifactNotFound(self.uri(key))
                sha, size = sha256_file(path)
            except OSError as exc:
                raise self._error(key, "cannot read", exc) from None
        return ObjectInfo(key, size, sha)

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        with observed(BACKEND, "list"):
            # Walk only the deepest directory the prefix fully names.
            head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
            base = self.root.joinpath(*head.split("/")) if head else self.root
            if not base.is_dir():
                return []
            keys: list[str] = []
            for directory, _, files in os.walk(base):
                rel_dir = Path(directory).relative_to(self.root).as_posix()
                for name in files:
                    if TMP_MARKER in name:
                        continue
                    key = name if rel_dir == "." else f"{rel_dir}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
            return sorted(keys)

    def rmtree(self) -> None:
        """Remove the whole store directory (tests and scratch stores)."""
        shutil.rmtree(self.root, ignore_errors=True)
