"""`StoreConfig`: where an S3 endpoint is and where its credentials come from.

Credentials never travel in a URI: `s3://bucket/prefix` names *what*, this config names *how to
reach it*. Secrets are read, in this order, from mounted secret files (`access_key_file`,
`secret_key_file`, e.g. a Kubernetes Secret volume) or from the environment variables named by
`access_key_env`/`secret_key_env` (default `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`). The
config itself only holds names and paths, so printing or logging it leaks nothing.

`StoreConfig.from_env()` reads:

| variable | field |
|---|---|
| `QPA_S3_ENDPOINT` (else `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`) | endpoint (host:port, URL) |
| `QPA_S3_REGION` (else `AWS_REGION`, `AWS_DEFAULT_REGION`) | region |
| `QPA_S3_SECURE` (`true`/`false`) | secure (default: the endpoint's scheme, else true) |
| `QPA_S3_ACCESS_KEY_FILE`, `QPA_S3_SECRET_KEY_FILE` | secret files |
| `QPA_S3_ACCESS_KEY_ENV`, `QPA_S3_SECRET_KEY_ENV` | names of the variables holding the keys |
| `QPA_S3_CA_FILE` | CA bundle for TLS endpoints |
| `QPA_S3_PART_SIZE_MB`, `QPA_S3_TIMEOUT_S` | multipart part size, per-request timeout |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from qpa.store.base import StoreAccessDenied

MIB = 1024 * 1024
MIN_PART_SIZE = 5 * MIB  # the S3 minimum for all but the last part
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class StoreConfig(BaseModel):
    """How to reach an S3-compatible endpoint (MinIO, SeaweedFS, AWS) and authenticate."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str | None = Field(
        default=None, description="host:port or http(s)://host:port of the S3 API"
    )
    region: str | None = None
    secure: bool | None = Field(
        default=None, description="TLS; None: from the endpoint's scheme, else true"
    )
    access_key_env: str = "AWS_ACCESS_KEY_ID"
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    session_token_env: str = "AWS_SESSION_TOKEN"
    access_key_file: Path | None = None
    secret_key_file: Path | None = None
    ca_file: Path | None = None
    part_size: int = Field(default=16 * MIB, ge=MIN_PART_SIZE)
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    retries: int = Field(default=2, ge=0, description="transport retries per request")
    max_connections: int = Field(default=32, ge=1)
    create_bucket: bool = Field(default=True, description="create a missing bucket on write")

    @field_validator("endpoint")
    @classmethod
    def _no_credentials_in_endpoint(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        parts = urlsplit(value if "://" in value else f"//{value}")
        if "@" in (parts.netloc or ""):
            raise ValueError("the endpoint must not carry credentials (user:pass@)")
        if parts.scheme not in ("", "http", "https"):
            raise ValueError(f"endpoint scheme must be http or https, not {parts.scheme!r}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("the endpoint is host:port (with an optional http(s):// scheme)")
        if not parts.hostname:
            raise ValueError(f"endpoint {value!r} names no host")
        return value

    # ------------------------------------------------------------------ derived
    @property
    def host(self) -> str:
        """`host:port` as the MinIO SDK wants it."""
        if self.endpoint is None:
            raise ValueError("no S3 endpoint configured (set QPA_S3_ENDPOINT or endpoint)")
        value = self.endpoint
        return urlsplit(value if "://" in value else f"//{value}").netloc

    @property
    def use_tls(self) -> bool:
        if self.secure is not None:
            return self.secure
        if self.endpoint and "://" in self.endpoint:
            return self.endpoint.lower().startswith("https://")
        return True

    def credentials(self, environ: Mapping[str, str] | None = None) -> tuple[str, str, str | None]:
        """(access key, secret key, session token) from secret files, else the environment.

        Raises `StoreAccessDenied` saying where it looked when none are found.
        """
        env = os.environ if environ is None else environ
        access = _read_secret(self.access_key_file) or env.get(self.access_key_env, "").strip()
        secret = _read_secret(self.secret_key_file) or env.get(self.secret_key_env, "").strip()
        if not access or not secret:
            where = []
            if self.access_key_file or self.secret_key_file:
                where.append(f"files {self.access_key_file} / {self.secret_key_file}")
            where.append(f"environment {self.access_key_env} / {self.secret_key_env}")
            raise StoreAccessDenied(
                "no S3 credentials: looked in "
                + " and ".join(where)
                + " (set QPA_S3_ACCESS_KEY_FILE/QPA_S3_SECRET_KEY_FILE or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY)"
            )
        token = env.get(self.session_token_env, "").strip() or None
        return access, secret, token

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StoreConfig:
        """A config from `QPA_S3_*` (and the standard `AWS_*`) environment variables."""
        env = os.environ if environ is None else environ

        def first(*names: str) -> str | None:
            for name in names:
                value = env.get(name, "").strip()
                if value:
                    return value
            return None

        data: dict[str, object] = {}
        endpoint = first("QPA_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint:
            data["endpoint"] = endpoint
        region = first("QPA_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")
        if region:
            data["region"] = region
        secure = first("QPA_S3_SECURE")
        if secure is not None:
            if secure.lower() not in _TRUE | _FALSE:
                raise ValueError(f"QPA_S3_SECURE must be true or false, not {secure!r}")
            data["secure"] = secure.lower() in _TRUE
        for name, key in (
            ("QPA_S3_ACCESS_KEY_FILE", "access_key_file"),
            ("QPA_S3_SECRET_KEY_FILE", "secret_key_file"),
            ("QPA_S3_CA_FILE", "ca_file"),
            ("QPA_S3_ACCESS_KEY_ENV", "access_key_env"),
            ("QPA_S3_SECRET_KEY_ENV", "secret_key_env"),
        ):
            value = first(name)
            if value:
                data[key] = value
        part = first("QPA_S3_PART_SIZE_MB")
        if part:
            data["part_size"] = int(float(part) * MIB)
        timeout = first("QPA_S3_TIMEOUT_S")
        if timeout:
            data["timeout_s"] = float(timeout)
        return cls.model_validate(data)


def _read_secret(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise StoreAccessDenied(f"cannot read secret file {path}: {exc.strerror}") from None
