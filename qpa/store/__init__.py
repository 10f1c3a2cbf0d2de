"""Artifact store: one API over `file://` (the default) and `s3://` (MinIO or any S3).

    store = open_store("s3://qpa/taskbatches/tb-1")      # endpoint + credentials from env/files
    info = store.put_bytes("parts/part-0.jsonl", data)   # atomic; ObjectInfo(key, size, sha256)
    store.get_bytes("parts/part-0.jsonl")                # verified against the recorded hash

Roots are `/abs/dir` (or a relative path, made absolute), `file:///abs/dir` or
`s3://bucket/prefix`. URIs never carry credentials: `s3://user:pass@bucket` is refused; the
endpoint and the keys come from a `StoreConfig` (environment, config, mounted secret files).
Datasets carry a manifest (`qpa.store.manifest`); `qpa.store.spool` streams JSONL parts to a
store through a local spool that survives outages. `resolve_local` (`qpa.store.resolve`) turns
a model or dataset location (path, `file://`, `s3://`, `pvc://`, `hf://`) into a local path,
through a download cache. Imports nothing of qpa but itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from qpa.store.base import (
    ArtifactNotFound,
    ArtifactStore,
    IntegrityError,
    InvalidKey,
    ListedObject,
    ObjectInfo,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    check_key,
    join_key,
    sha256_bytes,
    sha256_file,
)
from qpa.store.config import StoreConfig
from qpa.store.file import FileStore
from qpa.store.resolve import ResolveError, default_cache_dir, resolve_local

__all__ = [
    "ArtifactNotFound",
    "ArtifactStore",
    "FileStore",
    "IntegrityError",
    "InvalidKey",
    "ListedObject",
    "ObjectInfo",
    "ResolveError",
    "StoreAccessDenied",
    "StoreConfig",
    "StoreError",
    "StoreUnavailable",
    "check_key",
    "default_cache_dir",
    "is_remote",
    "join_key",
    "open_object",
    "open_store",
    "resolve_local",
    "sha256_bytes",
    "sha256_file",
    "split_uri",
]

# S3 bucket names: 3-63 of lowercase letters, digits, dots and hyphens.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def is_remote(root: str | Path) -> bool:
    """True for `s3://` roots (the ones that need an endpoint and credentials)."""
    return str(root).lower().startswith("s3://")


def _s3_parts(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise ValueError(
            "credentials are never part of a store URI (s3://user:pass@...): put them in "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or mounted files (QPA_S3_*_KEY_FILE)"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"{uri}: a store URI has no query or fragment")
    bucket = parts.netloc
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(f"{uri}: {bucket!r} is not a valid S3 bucket name")
    prefix = unquote(parts.path).strip("/")
    if prefix:
        try:
            check_key(prefix)
        except InvalidKey as exc:
            raise ValueError(f"{uri}: invalid prefix: {exc}") from None
    return bucket, prefix


def _file_path(root: str) -> Path:
    if root.lower().startswith("file:"):
        parts = urlsplit(root)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{root}: file URIs name a local path (file:///abs/dir)")
        if parts.query or parts.fragment:
            raise ValueError(f"{root}: a store URI has no query or fragment")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"{root}: file URIs need an absolute path (file:///abs/dir)")
        return Path(path)
    if "://" in root:
        scheme = root.split("://", 1)[0]
        raise ValueError(f"unsupported store scheme {scheme!r} in {root}: use file:// or s3://")
    return Path(root)


def open_store(root: str | Path, config: StoreConfig | None = None) -> ArtifactStore:
    """The store rooted at `root`: a directory path, `file:///abs/dir` or `s3://bucket/prefix`.

    `config` (S3 only) defaults to `StoreConfig.from_env()`. Raises `ValueError` for a
    malformed URI or one that carries credentials, `StoreAccessDenied` when S3 credentials are
    not configured, `StoreError` when no endpoint is.
    """
    if isinstance(root, Path):
        return FileStore(root)
    text = str(root).strip()
    if not text:
        raise ValueError("empty store root")
    if is_remote(text):
        bucket, prefix = _s3_parts(text)
        from qpa.store.s3 import S3Store  # the minio SDK is needed only for s3:// roots

        return S3Store(bucket, prefix, config)
    return FileStore(_file_path(text))


def split_uri(uri: str | Path) -> tuple[str, str]:
    """(`parent root`, `key`) of an object URI: `s3://b/p/x.jsonl` -> (`s3://b/p`, `x.jsonl`)."""
    text = str(uri).strip()
    if is_remote(text):
        bucket, prefix = _s3_parts(text)
        if not prefix:
            raise ValueError(f"{uri}: names a bucket, not an object")
        head, _, key = prefix.rpartition("/")
        return (f"s3://{bucket}/{head}" if head else f"s3://{bucket}"), key
    path = _file_path(text).expanduser().resolve()
    return str(path.parent), path.name


def open_object(uri: str | Path, config: StoreConfig | None = None) -> tuple[ArtifactStore, str]:
    """The store holding one object and the object's key in it (for `--tasks s3://b/t.jsonl`)."""
    root, key = split_uri(uri)
    return open_store(root, config), key
