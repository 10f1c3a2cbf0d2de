"""Prometheus metrics of the operator (prometheus_client), served on `/metrics` when enabled.

- `qpa_operator_reconciles_total{kind,reason}`: handler runs (create, update, resume, child);
- `qpa_operator_reconcile_errors_total{kind,reason}`: runs that raised (kopf retries them);
- `qpa_operator_reconcile_duration_seconds{kind}`: wall time of a reconcile;
- `qpa_operator_children_total{kind,child,action}`: children created, patched or deleted;
- `qpa_operator_status_writes_total{kind}` and `..._status_conflicts_total{kind}`;
- `qpa_operator_api_requests_total{method,code}`: the operator's own API requests (not kopf's);
- `qpa_operator_objects{kind,phase}`: custom resources by phase, counted at scrape time.

`serve(port)` starts the HTTP endpoint (the operator's start-up does it when
`QPA_OPERATOR_METRICS_PORT` is set); `stop()` closes it at clean-up.
"""

from __future__ import annotations

import threading
from collections import Counter as _Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

RECONCILES = Counter(
    "qpa_operator_reconciles_total", "Reconciles run, by kind and cause.", ["kind", "reason"]
)
RECONCILE_ERRORS = Counter(
    "qpa_operator_reconcile_errors_total",
    "Reconciles that raised (kopf retries them), by kind and cause.",
    ["kind", "reason"],
)
RECONCILE_SECONDS = Histogram(
    "qpa_operator_reconcile_duration_seconds",
    "Wall time of one reconcile.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CHILDREN = Counter(
    "qpa_operator_children_total",
    "Child objects created, patched (drifted) or deleted.",
    ["kind", "child", "action"],
)
STATUS_WRITES = Counter("qpa_operator_status_writes_total", "Status subresource writes.", ["kind"])
STATUS_CONFLICTS = Counter(
    "qpa_operator_status_conflicts_total",
    "Status writes retried after a 409 (the object changed meanwhile).",
    ["kind"],
)
API_REQUESTS = Counter(
    "qpa_operator_api_requests_total",
    "API requests of the operator's own client, by method and response code.",
    ["method", "code"],
)


class PhaseTracker(Collector):
    """`qpa_operator_objects{kind,phase}` from the last phase seen of every object."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def set(self, kind: str, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:
            self._phases[(kind, namespace, name)] = phase or "Unknown"

    def forget(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._phases.pop((kind, namespace, name), None)

    def clear(self) -> None:
        with self._lock:
            self._phases.clear()

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(_Tally((kind, phase) for (kind, _, _), phase in self._phases.items()))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "qpa_operator_objects", "Custom resources by kind and phase.", labels=["kind", "phase"]
        )
        for (kind, phase), count in sorted(self.counts().items()):
            family.add_metric([kind, phase], count)
        yield family


OBJECTS = PhaseTracker()
REGISTRY.register(OBJECTS)

_server: Any = None


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serve `/metrics` on `address:port` (once; a second call while serving does nothing)."""
    global _server
    if _server is not None:
        return
    _server = start_http_server(port, addr=address)


def stop() -> None:
    global _server
    if _server is None:
        return
    server = _server[0] if isinstance(_server, tuple) else _server
    shutdown = getattr(server, "shutdown", None)
    if shutdown is not None:
        shutdown()
        server.server_close()
    _server = None
