"""One resolver from a model or dataset location to a local path: `resolve_local`.

Every planner, trainer and server path that takes a model or dataset location (`--model-uri`,
`model:`/`tokenizer:`/`dataset:` of a training config, `policy.modelUri` of a TaskBatch) calls
`resolve_local` once and works on the local path it returns:

| location | local path |
|---|---|
| `/abs/dir`, `rel/dir`, `~/dir`, `file:///abs/dir` | the folder (or file) itself; it must exist |
| `s3://bucket/prefix` | a copy in the cache (below), refreshed when the remote changes |
| `s3://bucket/prefix/rows.jsonl` (one object) | the cached copy of that file |
| `pvc://<claim>/<path>` | `$QPA_PVC_ROOT/<claim>/<path>` (default root `/mnt/pvc`) |
| `hf://<org>/<name>[@<revision>]` | a Hub snapshot (when `huggingface_hub` is installed) |
| `gs://...` and other schemes | refused (`ResolveError`) |

**The cache.** `s3://` locations are downloaded below `cache_dir` (default `$QPA_CACHE_DIR`,
else `~/.cache/qpa`) as `store/<hash of the URI>/<hash of the listing>/data/`, where the listing
is every key under the prefix with its size and ETag. A download goes into a hidden temporary
folder next to it, is checked (sizes, and SHA-256 where the object records one) and then renamed
into place in one step, so a folder under its listing hash is always complete; a crashed
download leaves only a temporary folder, which is never used (and is removed by the next
resolve on the same host once its process is gone). A later call lists the remote again and
reuses the copy when the listing is unchanged; a changed listing downloads a fresh copy and
drops the old one. Endpoint and credentials come from `store_config` (default
`StoreConfig.from_env()`), never from the URI.

**PVC claims.** A PersistentVolumeClaim named `<claim>` is expected mounted at
`$QPA_PVC_ROOT/<claim>` (default `/mnt/pvc/<claim>`): the operator mounts each claim a work order
names there, read-only, and `pvc://<claim>/<path>` resolves to the path below that mount.

**The Hub.** `hf://org/name@rev` goes through `huggingface_hub.snapshot_download` (imported only
then). With `HF_HUB_OFFLINE` set only a snapshot already in the Hub cache is used (the Hub's own
cache, or `<cache_dir>/hf` when a `cache_dir` is given); without one, or without network, the
error says so and suggests copying the model to `s3://` or a claim.

Every failure is a `ResolveError` (a `StoreError` and a `ValueError`) whose message names the
location and, when given, the field it came from (`--model-uri`, `model`, `dataset`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from qpa.store.base import ListedObject, StoreError, check_key
from qpa.store.config import StoreConfig

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_PVC_ROOT",
    "PVC_ROOT_ENV",
    "ResolveError",
    "default_cache_dir",
    "pvc_root",
    "resolve_local",
]

CACHE_DIR_ENV = "QPA_CACHE_DIR"
PVC_ROOT_ENV = "QPA_PVC_ROOT"
DEFAULT_PVC_ROOT = "/mnt/pvc"
RECORD = "resolved.json"
DATA = "data"
TMP_PREFIX = ".tmp-"
_TRUE = {"1", "true", "yes", "on"}
# A Kubernetes object name (DNS-1123 subdomain), as a PersistentVolumeClaim's name must be.
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A Hub repo id: `name` or `org/name` of letters, digits, '-', '_', '.'.
_HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


class ResolveError(StoreError, ValueError):
    """A model or dataset location that cannot be made a local path; the message names it
    (and the field it came from, when known) and says why."""

    def __init__(self, location: str, detail: str, field: str | None = None) -> None:
        self.location = location
        self.field = field
        self.detail = detail
        where = f"{field} {location}" if field else location
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries intact
        return (type(self), (self.location, self.detail, self.field))


def default_cache_dir() -> Path:
    """`$QPA_CACHE_DIR`, else `~/.cache/qpa`."""
    value = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "qpa"


def pvc_root() -> Path:
    """Where claims are mounted: `$QPA_PVC_ROOT`, else `/mnt/pvc`."""
    value = os.environ.get(PVC_ROOT_ENV, "").strip()
    return Path(value or DEFAULT_PVC_ROOT)


def resolve_local(
    location: str | Path,
    *,
    field: str | None = None,
    cache_dir: str | Path | None = None,
    store_config: StoreConfig | None = None,
) -> Path:
    """The local path holding what `location` names (see the module docstring for each form).

    `field` names where the location came from, for error messages. Raises `ResolveError`.
    """
    text = str(location).strip()
    if not text:
        raise ResolveError(repr(str(location)), "empty location", field=field)
    if isinstance(location, Path) or "://" not in text:
        return _existing(Path(text).expanduser(), text, field)
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        from qpa.store import _file_path

        try:
            path = _file_path(text)
        except ValueError as exc:
            raise ResolveError(text, str(exc).removeprefix(f"{text}: "), field=field) from None
        return _existing(path, text, field)
    if scheme == "pvc":
        return _resolve_pvc(text, field)
    if scheme == "s3":
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return _resolve_s3(text, field, cache, store_config)
    if scheme == "hf":
        return _resolve_hub(text, field, Path(cache_dir) / "hf" if cache_dir else None)
    if scheme == "gs":
        raise ResolveError(
            text,
            "gs:// is not supported: use the bucket's S3-compatible endpoint "
            "(s3:// with QPA_S3_ENDPOINT=https://storage.googleapis.com and HMAC keys) "
            "or copy it to s3:// or a pvc:// claim",
            field=field,
        )
    raise ResolveError(
        text,
        f"unsupported scheme {scheme!r}: use a local path, file://, s3://, pvc:// or hf://",
        field=field,
    )


# ---------------------------------------------------------------------- local and claims
def _existing(path: Path, location: str, field: str | None) -> Path:
    path = path.absolute()
    if not path.exists():
        where = "" if str(path) == location else f" ({path})"
        raise ResolveError(location, f"does not exist{where}", field=field)
    return path


def _resolve_pvc(location: str, field: str | None) -> Path:
    rest = location.split("://", 1)[1]
    claim, _, sub = rest.partition("/")
    if not claim or len(claim) > 253 or not _CLAIM.match(claim):
        raise ResolveError(
            location,
            f"{claim!r} is not a PersistentVolumeClaim name (pvc://<claim>/<path>)",
            field=field,
        )
    sub = sub.strip("/")
    if sub:
        try:
            check_key(sub)
        except StoreError as exc:
            raise ResolveError(location, f"invalid path in the claim: {exc}", field=field) from None
    mount = pvc_root() / claim
    path = mount.joinpath(*sub.split("/")) if sub else mount
    if not path.exists():
        hint = (
            f"claim {claim!r} is not mounted at {mount} (claims are mounted at "
            f"${PVC_ROOT_ENV}/<claim>, default {DEFAULT_PVC_ROOT})"
            if not mount.is_dir()
            else f"{path} does not exist in claim {claim!r}"
        )
        raise ResolveError(location, hint, field=field)
    return path


# ---------------------------------------------------------------------- s3
def _resolve_s3(location: str, field: str | None, cache: Path, config: StoreConfig | None) -> Path:
    from qpa.store import open_store, split_uri
    from qpa.store.s3 import S3Store

    try:
        store = open_store(location, config)
        assert isinstance(store, S3Store)
        listing = store.entries()
        single: str | None = None
        if not listing and store.prefix:  # the URI may name one object (s3://b/data/rows.jsonl)
            parent_uri, single = split_uri(location)
            store = open_store(parent_uri, config)
            assert isinstance(store, S3Store)
            listing = [o for o in store.entries(single) if o.key == single]
        if not listing:
            raise ResolveError(location, "nothing is stored there", field=field)
        uri = store.uri(single) if single else store.root_uri
        entry = cache / "store" / hashlib.sha256(uri.encode()).hexdigest()[:32]
        version = entry / _listing_digest(listing)
        if _complete(version, uri, listing):
            return _data_path(version, single)
        _sweep(entry)
        _download(store, listing, uri, entry, version)
    except ResolveError:
        raise
    except (StoreError, ValueError, OSError) as exc:
        raise ResolveError(location, str(exc), field=field) from None
    for old in entry.iterdir():  # an older copy of a location that has changed since
        if old != version and not old.name.startswith(TMP_PREFIX):
            shutil.rmtree(old, ignore_errors=True)
    return _data_path(version, single)


def _data_path(version: Path, single: str | None) -> Path:
    return version / DATA / single if single else version / DATA


def _listing_digest(listing: list[ListedObject]) -> str:
    text = "\n".join(f"{o.key}\t{o.size}\t{o.etag}" for o in listing)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _record(uri: str, listing: list[ListedObject]) -> dict[str, Any]:
    return {"uri": uri, "objects": [[o.key, o.size, o.etag] for o in listing]}


def _complete(version: Path, uri: str, listing: list[ListedObject]) -> bool:
    """A cached copy is used only when its record matches the listing and every file is there
    with its size (a copy someone pruned by hand is downloaded again)."""
    try:
        recorded = json.loads((version / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if recorded != _record(uri, listing):
        return False
    data = version / DATA
    for o in listing:
        path = data.joinpath(*o.key.split("/"))
        if not path.is_file() or path.stat().st_size != o.size:
            return False
    return True


def _download(
    store: Any, listing: list[ListedObject], uri: str, entry: Path, version: Path
) -> None:
    """Download every object into a temporary folder, check it, then rename it to `version`."""
    entry.mkdir(parents=True, exist_ok=True)
    tmp = entry / f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        data = tmp / DATA
        for o in listing:
            target = data.joinpath(*check_key(o.key).split("/"))
            store.get_file(o.key, target)  # verifies the recorded SHA-256, if any
            size = target.stat().st_size
            if size != o.size:
                raise StoreError(
                    f"{store.uri(o.key)} changed during the download ({size} bytes, listed "
                    f"{o.size}): try again"
                )
        (tmp / RECORD).write_text(json.dumps(_record(uri, listing), indent=1), encoding="utf-8")
        try:
            os.rename(tmp, version)
        except OSError:
            if _complete(version, uri, listing):  # another process finished first: use theirs
                return
            # a copy that lost files (pruned by hand): move it out of the way, take its place
            stale = entry / f"{TMP_PREFIX}stale-{uuid.uuid4().hex[:8]}"
            os.rename(version, stale)
            shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, version)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sweep(entry: Path) -> None:
    """Remove temporary folders that crashed downloads on this host left behind."""
    if not entry.is_dir():
        return
    host = socket.gethostname()
    for tmp in entry.glob(f"{TMP_PREFIX}*"):
        owner_host, _, rest = tmp.name[len(TMP_PREFIX) :].rpartition("-")[0].rpartition("-")
        if owner_host != host or not rest.isdigit() or _alive(int(rest)):
            continue
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------- the Hub
def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _resolve_hub(location: str, field: str | None, hf_cache: Path | None) -> Path:
    rest = location.split("://", 1)[1].strip("/")
    repo_id, _, revision = rest.partition("@")
    if not _HUB_REPO.match(repo_id) or "--" in repo_id or ".." in repo_id:
        raise ResolveError(
            location, f"{repo_id!r} is not a Hub repo id (hf://org/name[@revision])", field=field
        )
    if "@" in rest and not revision:
        raise ResolveError(location, "empty revision after '@'", field=field)
    offline = _offline()
    try:
        import huggingface_hub
    except ImportError:
        raise ResolveError(
            location,
            "hf:// needs the huggingface_hub package (pip install huggingface_hub), or copy the "
            "model to s3:// or a pvc:// claim",
            field=field,
        ) from None
    try:
        path = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision or None,
            cache_dir=hf_cache,
            local_files_only=offline,
        )
    except (OSError, ValueError) as exc:
        why = (
            "the Hub is offline (HF_HUB_OFFLINE is set) and no snapshot is in the local cache"
            if offline
            else f"cannot download from the Hub ({type(exc).__name__}: {exc})"
        )
        raise ResolveError(
            location, f"{why}; copy the model to s3:// or a pvc:// claim", field=field
        ) from None
    return Path(str(path))
