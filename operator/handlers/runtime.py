"""The operator's runtime: the API client and settings, retry delays, the reconcile wrapper.

`runtime()` makes the API client once, in the operator's event loop, from the credentials kopf
logged in with (`remember_login`), with the `Defaults` and `RETRY_SCALE` that `configure` set at
start-up (the scale shortens every backoff in tests); `shutdown` closes it. `retry_delay` is the
backoff of a failed handler, `measured` counts and times a reconcile and turns API failures
into kopf retries. `STATE.written` holds the newest version of each resource this operator wrote
(`qpa_operator.handlers.status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import kopf
from qpa_operator import metrics
from qpa_operator.builders.common import Defaults, JsonDict
from qpa_operator.kube import ApiError, KubeClient


@dataclass
class Runtime:
    client: KubeClient
    defaults: Defaults
    retry_scale: float = 1.0


class _State:
    connection: kopf.ConnectionInfo | None = None
    relogin: Callable[[], kopf.ConnectionInfo | None] | None = None
    defaults: Defaults = Defaults()
    retry_scale: float = 1.0
    runtime: Runtime | None = None
    lock: asyncio.Lock | None = None
    #: One lock per object whose reconciles must not interleave (`serialized`), keyed
    #: (kind, ns, name).
    serial: dict[tuple[str, str, str], asyncio.Lock] = {}
    #: The newest version of each custom resource this operator wrote, keyed (kind, ns, name):
    #: an index can lag behind our own write, and computing from it would only earn a 409.
    written: dict[tuple[str, str, str], JsonDict] = {}


STATE = _State()


def configure(*, defaults: Defaults, retry_scale: float) -> None:
    """Start-up: settings for the client made on first use (after kopf's login)."""
    STATE.written.clear()
    STATE.defaults = defaults
    STATE.retry_scale = retry_scale
    STATE.runtime = None
    STATE.lock = None
    STATE.serial = {}


def remember_login(
    info: kopf.ConnectionInfo | None, relogin: Callable[[], kopf.ConnectionInfo | None]
) -> None:
    STATE.connection = info
    STATE.relogin = relogin


async def runtime() -> Runtime:
    """The runtime of this operator run (the client is made once, in the operator's loop)."""
    if STATE.runtime is not None:
        return STATE.runtime
    if STATE.lock is None:
        STATE.lock = asyncio.Lock()
    async with STATE.lock:
        if STATE.runtime is None:
            info = STATE.connection
            if info is None and STATE.relogin is not None:
                info = STATE.relogin()
            if info is None:
                raise kopf.TemporaryError("no credentials from kopf's login yet", delay=1)
            client = KubeClient.from_connection(
                info,
                relogin=STATE.relogin,
                backoff=0.2 * STATE.retry_scale,
                max_backoff=max(0.5, 5.0 * STATE.retry_scale),
            )
            STATE.runtime = Runtime(client, STATE.defaults, STATE.retry_scale)
    return STATE.runtime


async def shutdown() -> None:
    if STATE.runtime is not None:
        await STATE.runtime.client.close()
    STATE.runtime = None
    STATE.lock = None
    STATE.serial = {}


def serialized(kind: str, namespace: str, name: str) -> asyncio.Lock:
    """The lock that makes reconciles of one object run one after another.

    Two events of different children (two phone Leases) run their handlers concurrently; each
    computes the parent's children from the indexes it saw, so without the lock the write of
    the one that saw less could land last and stay.
    """
    return STATE.serial.setdefault((kind, namespace, name), asyncio.Lock())


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def retry_delay(retry: int) -> float:
    """Delay before kopf runs a failed handler again (exponential, scaled, capped)."""
    return min(60.0, 0.5 * 2**retry) * STATE.retry_scale


@contextlib.asynccontextmanager
async def measured(kind: str, reason: str) -> AsyncIterator[None]:
    """Count and time a reconcile; turn API failures into kopf retries."""
    metrics.RECONCILES.labels(kind=kind, reason=reason).inc()
    started = time.perf_counter()
    try:
        yield
    except ApiError as exc:
        metrics.RECONCILE_ERRORS.labels(kind=kind, reason=reason).inc()
        raise kopf.TemporaryError(f"API error: {exc}", delay=retry_delay(1)) from exc
    except Exception:
        metrics.RECONCILE_ERRORS.labels(kind=kind, reason=reason).inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.labels(kind=kind).observe(time.perf_counter() - started)


__all__ = [
    "STATE",
    "Runtime",
    "configure",
    "measured",
    "now",
    "remember_login",
    "retry_delay",
    "runtime",
    "serialized",
    "shutdown",
]
