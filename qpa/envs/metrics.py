"""Prometheus metrics of the environment server (`qpa env serve`), served on its `/metrics`.

Each server (each `create_app`) has its own `CollectorRegistry`, so several servers in one
process (tests, benchmarks) never mix their numbers. Besides the session gauges the server's
`SessionMetrics` collector reads from its store when scraped (`qpa_env_sessions_in_use`,
`_capacity`, `_live`, `qpa_env_draining`, `qpa_env_session_evictions_total`,
`qpa_env_sessions_refused_total{reason}`: new sessions refused because live sessions hold the
capacity, `client_busy` for 429 and `full` for 503), this module counts
what the server does:

- `qpa_env_requests_total{kind, op, channel, code}`: requests answered, by operation (`reset`,
  `step`, `verify`, `state`, `tools`, `delete`, `health`, `ready`, `metrics`, `drain`, `other`),
  channel (`http`, or `websocket` for the session channel) and HTTP status (the channel's
  replies carry the same status codes);
- `qpa_env_request_seconds{kind, op, channel}`: their latency inside the server, from the request
  reaching the application until its answer was handed to the transport (buckets from 50 us);
- `qpa_env_steps_total{kind}` and `qpa_env_resets_total{kind}`: actions applied (a retried step
  answered from the record is not counted twice) and episodes started; `rate()` of the first is
  the server's steps/s;
- `qpa_env_errors_total{kind, op, error}`: refused requests by the error contract's `kind`
  (`unknown_session`, `invalid_request`, `too_many_sessions`, `internal`, ...);
- `qpa_env_episode_errors_total{kind, error}`: steps answered with error feedback (200, status
  "error") by the feedback's error kind (`invalid_arguments`, `unknown_tool`, ...);
- `qpa_env_channels_open{kind}`: session channels (WebSockets) connected now.

The hot path pays a dictionary lookup and a few locked additions per request: the labelled
children are cached by their label values.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Requests take tens of microseconds (a sandbox step) to seconds (slow kinds, a drain).
LATENCY_BUCKETS: Final = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
#: The `op` label of each HTTP path (anything else is `other`: bounded cardinality).
PATH_OPS: Final = {
    "/reset": "reset",
    "/step": "step",
    "/verify": "verify",
    "/state": "state",
    "/tools": "tools",
    "/health": "health",
    "/ready": "ready",
    "/metrics": "metrics",
    "/drain": "drain",
}
CHANNELS: Final = ("http", "websocket")


def op_of(method: str, path: str) -> str:
    """The `op` label of an HTTP request (`DELETE /sessions/ID` is `delete`)."""
    op = PATH_OPS.get(path)
    if op is not None:
        return op
    if method == "DELETE" and path.startswith("/sessions/"):
        return "delete"
    return "other"


class EnvServerMetrics:
    """The counters and histograms of one environment server, in `registry`."""

    def __init__(self, registry: CollectorRegistry, kind: str) -> None:
        self.kind = kind
        self.requests = Counter(
            "qpa_env_requests",
            "Requests answered by operation, channel and HTTP status.",
            ["kind", "op", "channel", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "qpa_env_request_seconds",
            "Request latency inside the server (seconds).",
            ["kind", "op", "channel"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        steps = Counter(
            "qpa_env_steps", "Actions applied (rate() is steps/s).", ["kind"], registry=registry
        )
        resets = Counter("qpa_env_resets", "Episodes started.", ["kind"], registry=registry)
        self.errors = Counter(
            "qpa_env_errors",
            "Refused requests by the error kind of the error contract.",
            ["kind", "op", "error"],
            registry=registry,
        )
        self.episode_errors = Counter(
            "qpa_env_episode_errors",
            "Steps answered with error feedback, by the feedback's error kind.",
            ["kind", "error"],
            registry=registry,
        )
        channels = Gauge(
            "qpa_env_channels_open", "Session channels connected now.", ["kind"], registry=registry
        )
        self.steps = steps.labels(kind)
        self.resets = resets.labels(kind)
        self.channels = channels.labels(kind)
        self._answered: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._errors: dict[tuple[str, str], Counter] = {}
        self._episode_errors: dict[str, Counter] = {}

    def answered(self, op: str, channel: str, code: int, seconds: float) -> None:
        """One request answered with `code` after `seconds`."""
        key = (op, channel, code)
        children = self._answered.get(key)
        if children is None:
            children = self._answered[key] = (
                self.requests.labels(self.kind, op, channel, str(code)),
                self.latency.labels(self.kind, op, channel),
            )
        children[0].inc()
        children[1].observe(seconds)

    def refused(self, op: str, error: str) -> None:
        """One request refused with the error contract's `error` kind."""
        key = (op, error)
        child = self._errors.get(key)
        if child is None:
            child = self._errors[key] = self.errors.labels(self.kind, op, error)
        child.inc()

    def episode_error(self, error: str | None) -> None:
        """One step answered with error feedback of kind `error`."""
        label = error or "unspecified"
        child = self._episode_errors.get(label)
        if child is None:
            child = self._episode_errors[label] = self.episode_errors.labels(self.kind, label)
        child.inc()
