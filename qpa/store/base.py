"""What every artifact store shares: the `ArtifactStore` protocol, `ObjectInfo`, errors, keys.

A store is rooted at a URI (`file:///abs/dir` or `s3://bucket/prefix`); keys are '/'-separated
paths relative to that root. A key never starts with '/', never holds an empty, '.' or '..'
segment, a backslash or a control character, so no key can escape its root on any backend.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

HASH_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    """An object as written or found: its key (relative to the store root), size and SHA-256."""

    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ListedObject:
    """An object as a listing shows it: key (relative to the store root), size and the
    backend's version tag (the S3 ETag), enough to tell whether a copy is still current."""

    key: str
    size: int
    etag: str


class StoreError(Exception):
    """Base of every error a store raises; the message names the object's URI."""


class ArtifactNotFound(KeyError, StoreError):
    """The object (or manifest, or bucket) does not exist; `uri` names what was looked for."""

    def __init__(self, uri: str, detail: str = "") -> None:
        super().__init__(uri)
        self.uri = uri
        self.detail = detail

    def __str__(self) -> str:
        return f"not found: {self.uri}" + (f" ({self.detail})" if self.detail else "")


class StoreUnavailable(StoreError):
    """The store could not be reached or answered with a server error: worth retrying later."""


class StoreAccessDenied(StoreError):
    """Credentials are missing, wrong, or do not allow the operation: retrying will not help."""


class IntegrityError(StoreError):
    """An object's content does not match the SHA-256 recorded when it was written."""


class InvalidKey(StoreError, ValueError):
    """A key that is empty, absolute, or holds '..', '.', empty segments or odd characters."""


@runtime_checkable
class ArtifactStore(Protocol):
    """One API over `file://` and `s3://`: atomic writes, content hashes, streaming copies."""

    @property
    def root_uri(self) -> str:
        """The URI the store is rooted at (no credentials, ever)."""
        ...

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        """Write `data` at `key` atomically (readers see the old object or the whole new one)."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The whole object; `ArtifactNotFound` when missing, `IntegrityError` on a bad hash."""
        ...

    def put_file(self, key: str, path: str | Path) -> ObjectInfo:
        """Upload a local file at `key` atomically (multipart on S3 for large files)."""
        ...

    def get_file(self, key: str, path: str | Path) -> Path:
        """Download `key` to `path` (atomically, verified against its recorded hash)."""
        ...

    def exists(self, key: str) -> bool: ...

    def stat(self, key: str) -> ObjectInfo:
        """Size and recorded SHA-256 of `key` (`ArtifactNotFound` when missing)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with `prefix` (a plain string prefix), sorted."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key`; removing a missing key is not an error."""
        ...

    def uri(self, key: str) -> str:
        """The full URI of `key` (e.g. `s3://bucket/prefix/key`)."""
        ...


def check_key(key: str) -> str:
    """Return `key` when it is a safe relative key, else raise `InvalidKey` saying why."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"invalid key {key!r}: keys must be non-empty strings")
    if key.startswith("/"):
        raise InvalidKey(f"invalid key {key!r}: keys are relative to the store root")
    if "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise InvalidKey(f"invalid key {key!r}: no backslashes or control characters")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(f"invalid key {key!r}: empty, '.' and '..' segments are not allowed")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: '' (everything) or a key-like string (it may end with '/')."""
    if prefix == "":
        return prefix
    check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def join_key(*parts: str) -> str:
    """Join key parts with '/', ignoring empty parts and stray slashes at the joints."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> tuple[str, int]:
    """(hex SHA-256, size) of what is left in a binary stream."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(HASH_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sha256_file(path: str | Path) -> tuple[str, int]:
    """(hex SHA-256, size) of a local file, read in 1 MiB chunks."""
    with open(path, "rb") as stream:
        return sha256_stream(stream)
