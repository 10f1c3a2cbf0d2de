"""The store credentials of a resource's own namespace, for the operator's reads (reports).

The operator holds no store keys of its own. To read a HarnessRelease's benchmark report it
reads the Secret that the release's store names (`spec.store.secretRef`, else the chart's
`objectStore.secretName`) **in the release's namespace**, the same Secret the release's pods
mount, and reads with those keys only: what a namespace's user makes the operator read is
what that namespace's own credentials can read (no confused deputy). The chart grants `get` on
these Secret names only (`resourceNames`), and the operator refuses any other name before
asking (`Defaults.readable_secrets`).

The same keys, and only they, become the Secret of a HarnessRelease's model storage initializer
(`namespace_store_keys`, in KServe's format: `builders.harnessrelease.storage_secret`), in the
same namespace.

The keys go to files in a private temporary folder (mode 0600), which `qpa.store` reads
(`StoreConfig.access_key_file`/`secret_key_file`); nothing falls back to the operator's
environment.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from qpa_operator.builders.common import Defaults
from qpa_operator.kube import ApiError

from qpa.api.v1alpha1 import ObjectStore
from qpa.store.config import StoreConfig

#: Credential file names of the folder this module writes.
ACCESS_FILE: Final = "access-key-id"
SECRET_FILE: Final = "secret-access-key"


class StoreCredentialsError(Exception):
    """The namespace's store credentials cannot be used (the message names the field)."""


_FOLDER: tempfile.TemporaryDirectory[str] | None = None


def _folder() -> Path:
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = tempfile.TemporaryDirectory(prefix="qpa-store-keys-")
    return Path(_FOLDER.name)


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value)


def _key(secret: dict[str, Any], key: str, where: str) -> str:
    raw = (secret.get("data") or {}).get(key)
    if raw is None:
        raise StoreCredentialsError(f"{where} has no key {key!r}")
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        raise StoreCredentialsError(f"{where}: key {key!r} is not base64 UTF-8 text") from None


@dataclass(frozen=True)
class StoreKeys:
    """The keys of a store Secret of a namespace, and the Secret's resourceVersion."""

    access_key: str
    secret_key: str
    resource_version: str


async def namespace_store_keys(
    client: Any, namespace: str, store: ObjectStore, field: str, defaults: Defaults
) -> StoreKeys:
    """The keys of `store`'s Secret in `namespace`, under the same restrictions as every read
    here (only the Secret names the chart allows, only in the resource's own namespace).

    `field` names where the store came from (`spec.store`, or the chart's default), for errors.
    """
    name = store.secret_ref.name
    where = f"Secret {namespace}/{name} ({field}.secretRef)"
    if defaults.readable_secrets and name not in defaults.readable_secrets:
        allowed = ", ".join(defaults.readable_secrets)
        raise StoreCredentialsError(
            f"{field}.secretRef.name {name!r}: the operator reads only the store Secrets "
            f"{allowed} (chart values objectStore.secretName/readableSecrets)"
        )
    try:
        secret = await client.get("v1", "secrets", namespace, name)
    except ApiError as exc:
        raise StoreCredentialsError(f"{where}: cannot be read ({exc})") from exc
    if secret is None:
        raise StoreCredentialsError(f"{where} does not exist")
    access = _key(secret, store.secret_ref.access_key_id_key, where)
    secret_key = _key(secret, store.secret_ref.secret_access_key_key, where)
    if not access or not secret_key:
        raise StoreCredentialsError(f"{where}: an empty key")
    version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
    return StoreKeys(access, secret_key, version)


async def namespace_store_config(
    client: Any, namespace: str, store: ObjectStore, field: str, defaults: Defaults
) -> StoreConfig:
    """The S3 settings to read `store` with: its endpoint, the keys of its Secret in `namespace`.

    `field` names where the store came from (`spec.store`, or the chart's default), for errors.
    """
    keys = await namespace_store_keys(client, namespace, store, field, defaults)
    access, secret_key, name = keys.access_key, keys.secret_key, store.secret_ref.name
    folder = _folder() / f"{namespace}.{name}"
    folder.mkdir(mode=0o700, exist_ok=True)
    _write(folder / ACCESS_FILE, access)
    _write(folder / SECRET_FILE, secret_key)
    base = StoreConfig.from_env({k: v for k, v in os.environ.items() if _settings_only(k)})
    return base.model_copy(
        update={
            "endpoint": store.endpoint,
            "region": store.region,
            "access_key_file": folder / ACCESS_FILE,
            "secret_key_file": folder / SECRET_FILE,
            # never the operator's own environment, whatever it holds
            "access_key_env": "QPA_NAMESPACE_STORE_ACCESS_KEY_UNSET",
            "secret_key_env": "QPA_NAMESPACE_STORE_SECRET_KEY_UNSET",
            "session_token_env": "QPA_NAMESPACE_STORE_SESSION_TOKEN_UNSET",
        }
    )


def _settings_only(name: str) -> bool:
    """Transport settings of `QPA_S3_*` (CA file, timeouts), never endpoints or credentials."""
    return name in {"QPA_S3_CA_FILE", "QPA_S3_SECURE", "QPA_S3_PART_SIZE_MB", "QPA_S3_TIMEOUT_S"}
