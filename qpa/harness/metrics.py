"""Prometheus metrics of the Harness predictor: what a HarnessRelease's canary analysis reads.

Registered once in the default registry, which KServe's `/metrics` route serves:

- `qpa_harness_requests_total{model, code}`: predict requests by HTTP status (refusals and
  internal errors included; a 5xx is what the analysis counts as an error);
- `qpa_harness_request_seconds{model}`: their latency, from the request's arrival until the
  last byte of the answer (the analysis takes its 95th percentile);
- `qpa_harness_episodes_in_flight{model}`: episodes (sessions) running now;
- `qpa_harness_steps_total{model}`: actions the Harness took in those episodes (`rate()` is
  steps/s), and `qpa_harness_step_seconds{model}`: each action's time in the environment;
- `qpa_harness_errors_total{model, kind}`: errors by kind: a refused request by its refusal
  kind (`invalid_input`, `unauthenticated`, `forbidden`, `body_too_large`, ...), `internal` for
  a bug, and `episode_<side>` for an episode that ended in an error, by the side the runner
  blames (`episode_environment`, `episode_model`, `episode_harness`: budgets are the Harness's).

`recorded(send, model)` wraps an ASGI `send` so one response is counted when it completes;
`episode_recorded(model, trajectory)` counts one finished episode's steps and error.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from starlette.types import Message, Send

from qpa.contract import Trajectory

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


IN_FLIGHT: Gauge = _collector(
    Gauge, "qpa_harness_episodes_in_flight", "Harness episodes running now.", ["model"]
)
STEPS: Counter = _collector(
    Counter, "qpa_harness_steps", "Actions taken by the Harness (rate() is steps/s).", ["model"]
)
#: An action's time in the environment: sub-millisecond (sandbox) to seconds (devices).
STEP_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                       0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # fmt: skip
STEP_LATENCY: Histogram = _collector(
    Histogram,
    "qpa_harness_step_seconds",
    "Time of one Harness action in the environment (seconds).",
    ["model"],
    buckets=STEP_BUCKETS,
)
ERRORS: Counter = _collector(
    Counter,
    "qpa_harness_errors",
    "Harness errors by kind (refusals, internal errors, episodes ending in an error).",
    ["model", "kind"],
)
_COMPONENT = re.compile(r"[a-z][a-z_]{0,31}")


def error_recorded(model: str, kind: str) -> None:
    """Count one error of `kind` (a refusal kind, `internal`, `episode_<component>`)."""
    ERRORS.labels(model=model, kind=kind).inc()


def episode_recorded(model: str, trajectory: Trajectory) -> None:
    """Count a finished episode: its steps, their environment time, and its error if any."""
    steps = trajectory.steps
    if steps:
        STEPS.labels(model=model).inc(len(steps))
        latency = STEP_LATENCY.labels(model=model)
        for step in steps:
            latency.observe(step.duration_ms / 1000.0)
    if trajectory.error:
        error_recorded(model, f"episode_{episode_component(trajectory)}")


def episode_component(trajectory: Trajectory) -> str:
    """The side an episode's error is blamed on (`environment`, `model`, `harness`: the
    runner's `"<side>: ..."`), else `other`; a bounded label."""
    abort = trajectory.metadata.get("abort")
    side = str(abort.get("side", "")) if isinstance(abort, dict) else ""
    if not side:
        side = (trajectory.error or "").split(":", 1)[0].strip().lower()
    return side if _COMPONENT.fullmatch(side) else "other"


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
