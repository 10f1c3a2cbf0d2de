"""`HarnessServeConfig`: everything `qpa harness serve` needs besides its planner.

The environment an episode runs in comes from here, never from a request: `env_url` (an
environment server such as a RolloutPool's Service, `http://<pool>-env.<ns>.svc`) or, without
it, an in-process sandbox. Who the caller is comes from here too (see `qpa.harness.server`):

- `tokens_file`: bearer tokens, a file (a mounted Secret) mapping `sha256:<hex>` of each token to
  the user id it stands for (`qpa.envs.tokens`);
- `identity_header`: a header a trusted proxy sets after authenticating the caller (mTLS or
  OIDC at an Istio/Envoy sidecar or an oauth2-proxy), whose value is the user id; the proxy must
  overwrite any value a client sent, and the pod must be reachable only through it. That the
  header came from the proxy must be provable: the mode needs `proxy_secret_file`, a shared
  secret the proxy sends in `X-Qpa-Proxy-Secret` on every request (the server has no TLS of
  its own, so no client certificate could prove it instead). A header clients control
  (`X-Forwarded-*`, `Forwarded`, `Host`, `X-Real-IP`, ...: `qpa.api.v1alpha1.rules`) is refused;
- `insecure_single_user`: a development mode in which every caller is that one user;
- none of these: callers are anonymous, and each episode gets a fresh memory that is thrown away
  (nothing read from or written to any user's stored memory).
"""

from __future__ import annotations

import re
from typing import Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from qpa.api.v1alpha1.rules import client_controlled_header, client_controlled_message
from qpa.envs.tokens import IDENTITY_PATTERN

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class HarnessServeConfig(BaseModel):
    """How one Harness predictor serves: where, its environment, and how callers authenticate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="harness", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    host: str = Field(default="127.0.0.1", min_length=1)
    http_port: int = Field(default=8080, ge=0, le=65535)
    env_url: str | None = Field(default=None, description="Environment server for episodes.")
    tokens_file: str | None = Field(default=None, min_length=1)
    identity_header: str | None = Field(default=None)
    proxy_secret_file: str | None = Field(default=None, min_length=1)
    insecure_single_user: str | None = Field(default=None, pattern=IDENTITY_PATTERN)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024, le=64 * 1024 * 1024)
    read_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)

    @field_validator("env_url")
    @classmethod
    def _env_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("env_url: expected an http:// or https:// URL of an env server")
        if parts.username or parts.password:
            raise ValueError("env_url: credentials do not belong in a URL (use QPA_ENV_TOKEN)")
        return value.rstrip("/")

    @field_validator("identity_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _HEADER.match(value):
            raise ValueError("identity_header: expected an HTTP header name")
        if client_controlled_header(value):
            raise ValueError(
                f"identity_header: {value!r} cannot carry an identity "
                f"({client_controlled_message()})"
            )
        return value.lower()

    @model_validator(mode="after")
    def _one_mode(self) -> Self:
        if self.insecure_single_user and (self.tokens_file or self.identity_header):
            raise ValueError(
                "insecure_single_user: a development mode; it cannot be combined with "
                "tokens_file or identity_header"
            )
        if self.identity_header and not self.proxy_secret_file:
            raise ValueError(
                "proxy_secret_file: identity_header trusts a header only from the proxy; give "
                "the proxy's shared secret (--proxy-secret-file; the proxy sends it in "
                "X-Qpa-Proxy-Secret), else any client that reaches the pod is whoever it names"
            )
        if self.proxy_secret_file and not self.identity_header:
            raise ValueError("proxy_secret_file: only with identity_header")
        return self

    @property
    def authenticates(self) -> bool:
        return bool(self.tokens_file or self.identity_header)
