"""`EnvServeConfig`: everything `qpa env serve` needs, from CLI flags or a RolloutPool.

One config object for both ways in: a person's flags (`qpa env serve --kind sandbox ...`) and a
RolloutPool's work order (`qpa env serve --spec FILE`, what the pool's pods run), turned into it by
`EnvServeConfig.from_rolloutpool`. Each spec field of the pool either lands here or shapes the
Deployment (image, replicas, resources); none is dropped. The server's protections (sessions per
client, idle eviction, the read timeout; see `qpa.envs.server`) have safe defaults that a pool's
pods run with; a tokens file is a flag for servers run by hand.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qpa.api.v1alpha1 import RolloutPool
from qpa.api.v1alpha1.workorder import API_KEY_ENV, WorkOrder
from qpa.envs.factory import env_kinds
from qpa.envs.server import (
    DEFAULT_EVICT_IDLE_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_SESSION_TTL_S,
)

#: Where a pod binds: every interface of the pod's own network namespace.
POD_HOST = "0.0.0.0"

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


class EnvServeConfig(BaseModel):
    """One environment server: the kind it serves, where, how many sessions, and the kind's
    own settings (the LLM playing the apps for `llm_sim`, the phones for `device`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(default="sandbox", description="Environment kind.")
    host: str = Field(default="127.0.0.1", min_length=1, description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port.")
    sessions_per_pod: int = Field(
        default=DEFAULT_MAX_SESSIONS, ge=1, description="Live sessions at most (one server)."
    )
    session_ttl_seconds: float = Field(
        default=DEFAULT_SESSION_TTL_S, gt=0, description="Seconds an idle session lives."
    )
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1, description="Body limit.")
    sessions_per_client: int | None = Field(
        default=None, ge=1, description="Sessions one client holds at most (default: all)."
    )
    evict_idle_seconds: float = Field(
        default=DEFAULT_EVICT_IDLE_S,
        gt=0,
        description="Idle seconds after which a session may give its slot to a new one.",
    )
    read_timeout_seconds: float = Field(
        default=DEFAULT_READ_TIMEOUT_S,
        gt=0,
        le=3600,
        description="Seconds a request (line, headers, body) may take to arrive.",
    )
    tokens_file: str | None = Field(
        default=None, min_length=1, description="Bearer tokens: sha256 of a token -> client."
    )
    log_level: LogLevel = "warning"
    model_url: str | None = Field(default=None, description="llm_sim: endpoint playing apps.")
    model: str = Field(default="", description="llm_sim: model name at the endpoint.")
    api_key_env: str | None = Field(default=None, description="llm_sim: API key variable.")
    device_pool: str | None = Field(default=None, description="device: DevicePool to lease.")
    namespace: str | None = Field(default=None, description="device: the pool's namespace.")
    serial: str | None = Field(default=None, description="device: serve this one phone.")
    adb: str | None = Field(default=None, description="device: adb server HOST:PORT.")
    acquire_timeout_s: float = Field(default=30.0, ge=0, description="device: lease wait.")

    @model_validator(mode="after")
    def _kind_settings(self) -> Self:
        if self.kind not in env_kinds():
            raise ValueError(
                f"kind: unknown environment kind {self.kind!r}; "
                f"choose from: {', '.join(env_kinds())}"
            )
        if self.kind == "llm_sim" and not self.model_url:
            raise ValueError("model_url: llm_sim needs the endpoint that plays the apps")
        if self.kind == "device" and not (self.serial or self.device_pool):
            raise ValueError("device_pool: a device server needs a DevicePool or one serial")
        per_client = self.sessions_per_client
        if per_client is not None and per_client > self.sessions_per_pod:
            raise ValueError(
                f"sessions_per_client: {per_client} is more than the server's "
                f"{self.sessions_per_pod} sessions"
            )
        return self

    @classmethod
    def from_rolloutpool(cls, order: WorkOrder[RolloutPool]) -> EnvServeConfig:
        """The server a pod of the pool runs (the spec plus what the operator resolved)."""
        spec = order.resource.spec
        llm = spec.llm_sim
        return cls(
            kind=spec.environment,
            host=POD_HOST,
            port=spec.port,
            sessions_per_pod=spec.sessions_per_pod,
            session_ttl_seconds=spec.session_ttl_seconds,
            model_url=llm.model_url if llm else None,
            model=llm.model if llm else "",
            api_key_env=API_KEY_ENV if llm and llm.api_key_secret_ref else None,
            device_pool=spec.device_pool_ref.name if spec.device_pool_ref else None,
            namespace=order.resolved.namespace if spec.device_pool_ref else None,
            adb=order.resolved.device_bridge if spec.device_pool_ref else None,
        )
