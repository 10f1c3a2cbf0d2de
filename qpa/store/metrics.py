"""Prometheus metrics of the artifact store and the upload spool.

Collectors are registered once in the default registry (importing this module twice, or under
another name, reuses the registered ones) and nothing is served on import: a process exposes
them with `prometheus_client.start_http_server` (or a `/metrics` route) where it wants to.

- `qpa_store_operations_total{backend, op, outcome}`: calls by outcome (ok, not_found,
  unavailable, denied, integrity, error).
- `qpa_store_operation_seconds{backend, op}`: latency histogram of the calls.
- `qpa_store_bytes_total{backend, direction}`: bytes written (`out`) and read (`in`).
- `qpa_spool_parts{state}`: parts waiting in the local spool (`pending`).
- `qpa_spool_uploads_total{outcome}`: part uploads (uploaded, already_present, failed, conflict).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _registered(kind: Any, name: str, doc: str, labels: list[str], **extra: Any) -> Any:
    """The collector called `name`, created and registered on first use only."""
    existing = REGISTRY._names_to_collectors.get(name)  # prometheus_client has no public lookup
    if existing is None and kind is Counter:
        existing = REGISTRY._names_to_collectors.get(name + "_total")
    if existing is not None:
        return existing
    return kind(name, doc, labels, **extra)


STORE_OPS: Counter = _registered(
    Counter,
    "qpa_store_operations",
    "Artifact store operations by backend, operation and outcome.",
    ["backend", "op", "outcome"],
)
STORE_LATENCY: Histogram = _registered(
    Histogram,
    "qpa_store_operation_seconds",
    "Latency of artifact store operations.",
    ["backend", "op"],
    buckets=_LATENCY_BUCKETS,
)
STORE_BYTES: Counter = _registered(
    Counter,
    "qpa_store_bytes",
    "Bytes moved by the artifact store (out = written, in = read).",
    ["backend", "direction"],
)
SPOOL_PARTS: Gauge = _registered(
    Gauge, "qpa_spool_parts", "Parts held in local upload spools.", ["state"]
)
SPOOL_UPLOADS: Counter = _registered(
    Counter, "qpa_spool_uploads", "Spooled part uploads by outcome.", ["outcome"]
)


def outcome_of(exc: BaseException | None) -> str:
    """The `outcome` label of an exception raised by a store call (None: ok)."""
    if exc is None:
        return "ok"
    from qpa.store.base import (
        ArtifactNotFound,
        IntegrityError,
        StoreAccessDenied,
        StoreUnavailable,
    )

    for kind, label in (
        (ArtifactNotFound, "not_found"),
        (StoreUnavailable, "unavailable"),
        (StoreAccessDenied, "denied"),
        (IntegrityError, "integrity"),
    ):
        if isinstance(exc, kind):
            return label
    return "error"


@contextmanager
def observed(backend: str, op: str) -> Iterator[None]:
    """Count and time one store call; the exception (if any) decides the outcome label."""
    started = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        STORE_OPS.labels(backend, op, outcome_of(exc)).inc()
        raise
    else:
        STORE_OPS.labels(backend, op, "ok").inc()
    finally:
        STORE_LATENCY.labels(backend, op).observe(time.perf_counter() - started)


def moved(backend: str, direction: str, size: int) -> None:
    STORE_BYTES.labels(backend, direction).inc(size)
