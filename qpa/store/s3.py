"""`S3Store`: the artifact store on an S3-compatible endpoint (MinIO, SeaweedFS, AWS) via `minio`.

- Every object is written with its SHA-256 as user metadata (`x-amz-meta-sha256`); reads
  verify it and raise `IntegrityError` on a mismatch (objects written by other tools, without
  the metadata, are returned unverified).
- A PUT is atomic on S3; objects larger than `part_size` go up as a multipart upload whose
  completion is the atomic step (the SDK aborts the upload when a part fails). Downloads to a
  file go through a temporary file and `os.replace`.
- Errors are mapped to the store's: a missing key or bucket -> `ArtifactNotFound`; bad or
  missing credentials -> `StoreAccessDenied`; a refused connection, a timeout or a 5xx (after
  the transport's few retries) -> `StoreUnavailable`, which callers such as the spool retry.
- The bucket is created on the first write when it is missing (`create_bucket`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError
from urllib3.exceptions import HTTPError as Urllib3Error

from qpa.store.base import (
    HASH_CHUNK,
    ArtifactNotFound,
    IntegrityError,
    ListedObject,
    ObjectInfo,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    check_key,
    check_prefix,
    join_key,
    sha256_file,
)
from qpa.store.config import StoreConfig
from qpa.store.metrics import moved, observed

BACKEND = "s3"
SHA_META = "sha256"
_NOT_FOUND = {"NoSuchKey", "NoSuchObject", "NoSuchBucket", "NoSuchVersion", "NotFound"}
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccountProblem",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
}
_UNAVAILABLE = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling"}


def _http_client(config: StoreConfig) -> urllib3.PoolManager:
    """A pool with short connect timeouts and few retries: outages surface fast, to be retried
    (with backoff) by the caller rather than hidden in a five-minute transport stall."""
    retries = urllib3.Retry(
        total=config.retries,
        connect=config.retries,
        read=0,  # a read may follow a non-idempotent request: never replay blindly here
        backoff_factor=0.2,
        status_forcelist=[502, 503, 504],
        allowed_methods=frozenset({"GET", "HEAD", "PUT", "DELETE"}),
        raise_on_status=False,
    )
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=config.connect_timeout_s, read=config.timeout_s),
        maxsize=config.max_connections,
        cert_reqs="CERT_REQUIRED",
        ca_certs=str(config.ca_file) if config.ca_file else certifi.where(),
        retries=retries,
    )


class S3Store:
    """Artifacts under `s3://bucket/prefix`, addressed by keys relative to the prefix."""

    backend = BACKEND

    def __init__(self, bucket: str, prefix: str = "", config: StoreConfig | None = None) -> None:
        self.config = config or StoreConfig.from_env()
        if self.config.endpoint is None:
            raise StoreError(
                f"s3://{bucket}: no S3 endpoint configured "
                "(set QPA_S3_ENDPOINT or StoreConfig.endpoint)"
            )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        access, secret, token = self.config.credentials()
        self.client = Minio(
            self.config.host,
            access_key=access,
            secret_key=secret,
            session_token=token,
            secure=self.config.use_tls,
            region=self.config.region,
            http_client=_http_client(self.config),
        )
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Store({self.root_uri!r}, endpoint={self.config.endpoint!r})"

    @property
    def root_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._name(key)}"

    def _name(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    # ------------------------------------------------------------------ errors
    def _raise(self, key: str | None, action: str, exc: BaseException) -> NoReturn:
        where = f"s3://{self.bucket}/{join_key(self.prefix, key)}" if key else self.root_uri
        if isinstance(exc, S3Error):
            code = exc.code or ""
            if code in _NOT_FOUND:
                detail = "no such bucket" if code == "NoSuchBucket" else ""
                raise ArtifactNotFound(where, detail) from None
            if code in _DENIED:
                raise StoreAccessDenied(
                    f"{action} {where}: access denied by {self.config.endpoint} ({code}): "
                    "check the S3 credentials"
                ) from None
            if code in _UNAVAILABLE:
                raise StoreUnavailable(f"{action} {where}: {code}: {exc.message}") from exc
            raise StoreError(f"{action} {where}: {code}: {exc.message}") from exc
        if isinstance(exc, ServerError):
            raise StoreUnavailable(
                f"{action} {where}: server error {exc.status_code} from {self.config.endpoint}"
            ) from exc
        if isinstance(exc, InvalidResponseError):
            raise StoreUnavailable(f"{action} {where}: unexpected answer: {exc}") from exc
        if isinstance(exc, (Urllib3Error, OSError)):
            raise StoreUnavailable(
                f"{action} {where}: {self.config.endpoint} unreachable: {type(exc).__name__}"
            ) from exc
        if isinstance(exc, MinioException):
            raise StoreError(f"{action} {where}: {exc}") from exc
        raise exc

    @contextlib.contextmanager
    def _mapped(self, key: str | None, action: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (MinioException, Urllib3Error, OSError) as exc:
            self._raise(key, action, exc)

    def _ensure_bucket(self) -> None:
        if self._bucket_ready or not self.config.create_bucket:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return
            with self._mapped(None, "cannot create bucket for"):
                if not self.client.bucket_exists(bucket_name=self.bucket):
                    with contextlib.suppress(S3Error):  # lost a race with another writer
                        self.client.make_bucket(bucket_name=self.bucket)
                    if not self.client.bucket_exists(bucket_name=self.bucket):
                        raise StoreError(f"cannot create bucket {self.bucket!r}")
            self._bucket_ready = True

    # ------------------------------------------------------------------ writes
    def _put(self, key: str, stream: Any, size: int, sha: str) -> ObjectInfo:
        self._ensure_bucket()
        with self._mapped(key, "cannot write"):
            self.client.put_object(
                bucket_name=self.bucket,
                object_name=self._name(key),
                data=stream,
                length=size,
                metadata={SHA_META: sha},
                part_size=self.config.part_size,
            )
        moved(BACKEND, "out", size)
        return ObjectInfo(key, size, sha)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        check_key(key)
        data = bytes(data)
        with observed(BACKEND, "put"):
            return self._put(key, io.BytesIO(data), len(data), hashlib.sha256(data).hexdigest())

    def put_file(self, key: str, path: str | Path) -> ObjectInfo:
        check_key(key)
        source = Path(path)
        with observed(BACKEND, "put"):
            if not source.is_file():
                raise StoreError(f"cannot upload {source}: not a file")
            sha, size = sha256_file(source)
            with open(source, "rb") as stream:
                return self._put(key, stream, size, sha)

    def delete(self, key: str) -> None:
        with observed(BACKEND, "delete"), self._mapped(key, "cannot delete"):
            try:
                self.client.remove_object(bucket_name=self.bucket, object_name=self._name(key))
            except S3Error as exc:
                if exc.code not in _NOT_FOUND:
                    raise

    # ------------------------------------------------------------------ reads
    @staticmethod
    def _recorded_sha(headers: Any) -> str | None:
        value = headers.get(f"x-amz-meta-{SHA_META}") if headers is not None else None
        return str(value) if value else None

    def get_bytes(self, key: str) -> bytes:
        check_key(key)
        with observed(BACKEND, "get"), self._mapped(key, "cannot read"):
            response = self.client.get_object(bucket_name=self.bucket, object_name=self._name(key))
            try:
                data = response.read()
                expected = self._recorded_sha(response.headers)
            finally:
                response.close()
                response.release_conn()
            if expected is not None and hashlib.sha256(data).hexdigest() != expected:
                raise IntegrityError(
                    f"{self.uri(key)}: content does not match its recorded sha256 {expected}"
                )
        moved(BACKEND, "in", len(data))
        return data

    def get_file(self, key: str, path: str | Path) -> Path:
        check_key(key)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.qpa-tmp-{uuid.uuid4().hex[:12]}")
        size = 0
        try:
            with observed(BACKEND, "get"), self._mapped(key, "cannot read"):
                response = self.client.get_object(
                    bucket_name=self.bucket, object_name=self._name(key)
                )
                digest = hashlib.sha256()
                try:
                    expected = self._recorded_sha(response.headers)
                    with open(tmp, "wb") as stream:
                        for chunk in response.stream(HASH_CHUNK):
                            digest.update(chunk)
                            size += len(chunk)
                            stream.write(chunk)
                        stream.flush()
                        os.fsync(stream.fileno())
                finally:
                    response.close()
                    response.release_conn()
                if expected is not None and digest.hexdigest() != expected:
                    raise IntegrityError(
                        f"{self.uri(key)}: content does not match its recorded sha256 {expected}"
                    )
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        moved(BACKEND, "in", size)
        return target

    def stat(self, key: str) -> ObjectInfo:
        check_key(key)
        with observed(BACKEND, "stat"), self._mapped(key, "cannot stat"):
            info = self.client.stat_object(bucket_name=self.bucket, object_name=self._name(key))
        sha = self._recorded_sha(info.metadata) or ""
        return ObjectInfo(key, int(info.size or 0), sha)

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ArtifactNotFound:
            return False
        return True

    def entries(self, prefix: str = "") -> list[ListedObject]:
        """Every object starting with `prefix`, with its size and ETag, sorted by key (what
        `qpa.store.resolve` compares to decide whether a cached copy is still current)."""
        check_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        with observed(BACKEND, "list"), self._mapped(prefix or None, "cannot list"):
            try:
                found = [
                    ListedObject(
                        str(o.object_name)[len(base) :],
                        int(o.size or 0),
                        str(o.etag or "").strip('"'),
                    )
                    for o in self.client.list_objects(
                        bucket_name=self.bucket, prefix=base + prefix, recursive=True
                    )
                    if not o.is_dir
                ]
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return []
                raise
        return sorted(found, key=lambda o: o.key)

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        with observed(BACKEND, "list"), self._mapped(prefix or None, "cannot list"):
            try:
                names = [
                    str(o.object_name)
                    for o in self.client.list_objects(
                        bucket_name=self.bucket, prefix=base + prefix, recursive=True
                    )
                    if not o.is_dir
                ]
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return []
                raise
        return sorted(name[len(base) :] for name in names)
