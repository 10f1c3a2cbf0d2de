"""The Harness predictor's request metrics are what a release's canary analysis reads by default.

A predict answer passes through `qpa.harness.metrics.recorded`; the default registry's text
(what KServe's `/metrics` serves) parsed by `qpa_operator.analysis` with the CRD's default
metric names shows the requests, the 5xx among them and the latency buckets.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from qpa_operator import analysis

from qpa.api.v1alpha1 import CanaryAnalysis
from qpa.harness import metrics
from qpa.harness.server import HarnessFront


async def answer(status: int, model: str) -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    wrapped = metrics.recorded(send, model)
    await wrapped({"type": "http.response.start", "status": status, "headers": []})
    await wrapped({"type": "http.response.body", "body": b"{}", "more_body": True})
    await wrapped({"type": "http.response.body", "body": b""})
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 2


def sample() -> Any:
    text = generate_latest(REGISTRY).decode()
    return analysis.parse_text(text, CanaryAnalysis(), datetime.now(UTC))


@pytest.mark.asyncio
async def test_answers_are_counted_by_status_with_their_latency() -> None:
    before = sample()
    for status in (200, 200, 200, 400, 503):
        await answer(status, "harness-metrics-test")
    after = sample()
    assert after.requests - before.requests == 5
    assert after.errors - before.errors == 1  # the 503; a 400 is the caller's mistake
    assert after.buckets["+Inf"] - before.buckets.get("+Inf", 0) == 5
    assert after.buckets["0.1"] - before.buckets.get("0.1", 0) == 5  # answered at once


@pytest.mark.asyncio
async def test_the_front_counts_predict_requests_only() -> None:
    class Model:
        name = "harness-front-test"
        config = type("Config", (), {"max_body_bytes": 1024})()

    passed: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        passed.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    front = HarnessFront(app, Model())  # type: ignore[arg-type]

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    def count() -> float:
        value = REGISTRY.get_sample_value(
            "qpa_harness_requests_total", {"model": Model.name, "code": "405"}
        )
        return value or 0.0

    scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": []}
    await front(scope, receive, send)
    assert passed == ["/metrics"] and count() == 0  # a scrape is not a request
    scope = {"type": "http", "method": "PUT", "path": f"/v1/models/{Model.name}:predict",
             "headers": []}  # fmt: skip
    await front(scope, receive, send)
    assert count() == 1  # refused (405), counted
