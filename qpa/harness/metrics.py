"""Prometheus metrics of the Harness predictor: what a HarnessRelease's canary analysis reads.

Registered once in the default registry, which KServe's `/metrics` route serves:

- `qpa_harness_requests_total{model, code}`: predict requests by HTTP status (refusals and
  internal errors included; a 5xx is what the analysis counts as an error);
- `qpa_harness_request_seconds{model}`: their latency, from the request's arrival until the
  last byte of the answer (the analysis takes its 95th percentile).

`recorded(send, model)` wraps an ASGI `send` so one response is counted when it completes.
"""

from __future__ import annotations

import time
from typing import Any, Final

from prometheus_client import REGISTRY, Counter, Histogram
from starlette.types import Message, Send

#: Episodes take seconds to minutes: buckets up to 10 minutes.
LATENCY_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
                          600.0)  # fmt: skip


def _collector(kind: Any, name: str, doc: str, labels: list[str], **extra: Any) -> Any:
    """The registered collector `name`, created on first use (a second import reuses it)."""
    names = getattr(REGISTRY, "_names_to_collectors", {})  # prometheus_client has no lookup
    existing = names.get(name) or names.get(name + "_total")
    return existing if existing is not None else kind(name, doc, labels, **extra)


REQUESTS: Counter = _collector(
    Counter, "qpa_harness_requests", "Harness predict requests by HTTP status.", ["model", "code"]
)
LATENCY: Histogram = _collector(
    Histogram,
    "qpa_harness_request_seconds",
    "Harness predict request latency (seconds).",
    ["model"],
    buckets=LATENCY_BUCKETS,
)


def recorded(send: Send, model: str) -> Send:
    """`send` that counts the response it carries (status at its start, latency at its end)."""
    started = time.monotonic()
    code: list[int] = []

    async def wrapper(message: Message) -> None:
        if message["type"] == "http.response.start":
            code.append(int(message["status"]))
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            REQUESTS.labels(model=model, code=str(code[0] if code else 500)).inc()
            LATENCY.labels(model=model).observe(time.monotonic() - started)

    return wrapper
