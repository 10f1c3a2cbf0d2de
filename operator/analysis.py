"""Canary analysis: the candidate's live request metrics judged against `spec.rollout.analysis`.

As Argo Rollouts' analysis does, a canary step is judged by measurements, not by readiness
alone. A measurement compares the candidate's counters now with those of the step's baseline
(taken when the step's revision was Ready):

- requests: the increase of `requestsMetric` (a counter with a `code` label, summed over the
  candidate's pods); errors: the part of it whose `code` is 5xx;
- p95 latency: the 95th percentile of the increase of `latencyMetric`'s buckets, interpolated
  within a bucket as Prometheus' `histogram_quantile` does;
- fewer than `minRequests` new requests: inconclusive (no verdict yet); an error rate above
  `maxErrorRate`, or a p95 above `maxP95LatencySeconds` (or no latency histogram while that
  threshold is set): failed; otherwise passed. A counter that went down (a pod restarted)
  starts a new baseline.

The counters come from the candidate's own Prometheus text endpoint (`metricsUrl`, by default
KServe's tag route of the latest revision) or, with `prometheusUrl`, from instant queries
`sum by (code) (<requestsMetric>{namespace=..., pod=~"<revision>-.*"})` and
`sum by (le) (<latencyMetric>_bucket{...})` for the candidate revision KServe reports
(`status.components.predictor.latestCreatedRevision`). `measure` is pure; `read_sample` does the
one HTTP read and never puts a response body into a message (only what it parsed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from qpa.api.v1alpha1 import CanaryAnalysis, MetricsSample

#: The quantile the latency threshold applies to.
QUANTILE: Final = 0.95
#: Most bytes read from a metrics endpoint or a Prometheus answer.
MAX_BODY: Final = 4 * 1024 * 1024
#: Most histogram buckets kept (the status field's bound).
MAX_BUCKETS: Final = 64
TIMEOUT_SECONDS: Final = 5.0

Outcome = Literal["passed", "failed", "inconclusive", "reset"]


class MetricsUnavailable(Exception):
    """The candidate's metrics could not be read or parsed (the message says where and why)."""


@dataclass(frozen=True)
class Measurement:
    """One measurement of a step: its outcome and what it found."""

    outcome: Outcome
    requests: float = 0.0
    errors: float = 0.0
    error_rate: float | None = None
    p95_seconds: float | None = None
    message: str = ""


# --------------------------------------------------------------------------- pure


def _bound(le: str) -> float:
    return math.inf if le.strip() in ("+Inf", "Inf", "inf") else float(le)


def bucket_key(le: str) -> str:
    """The one spelling of a bucket bound (`+Inf`, `0.5`, `10`), whatever the source wrote."""
    bound = _bound(le)
    return "+Inf" if math.isinf(bound) else repr(bound).removesuffix(".0")


def quantile(q: float, buckets: Mapping[str, float]) -> float | None:
    """The `q` quantile of a cumulative histogram (le -> count), as `histogram_quantile`."""
    ordered = sorted((_bound(le), count) for le, count in buckets.items())
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    total = ordered[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if count >= rank:
            if math.isinf(upper):
                return lower  # the largest finite bound: nothing finer is known
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return None


def _fmt_seconds(value: float) -> str:
    return f"{value:.3f} s"


def measure(
    baseline: MetricsSample, current: MetricsSample, analysis: CanaryAnalysis
) -> Measurement:
    """The candidate's requests since `baseline`, judged against `analysis`' thresholds."""
    requests = current.requests - baseline.requests
    errors = current.errors - baseline.errors
    buckets = {le: count - baseline.buckets.get(le, 0.0) for le, count in current.buckets.items()}
    if requests < 0 or errors < 0 or any(v < 0 for v in buckets.values()):
        return Measurement(
            "reset", message="the candidate's counters went down (a pod restarted): new baseline"
        )
    if requests < analysis.min_requests:
        return Measurement(
            "inconclusive",
            requests=requests,
            errors=errors,
            message=f"{requests:g} requests since the step began, fewer than minRequests "
            f"{analysis.min_requests}: no verdict yet",
        )
    rate = errors / requests
    p95 = quantile(QUANTILE, buckets)
    found = [f"{requests:g} requests", f"error rate {100 * rate:.2f}%"]
    if p95 is not None:
        found.append(f"p95 latency {_fmt_seconds(p95)}")
    failures = []
    if rate > analysis.max_error_rate:
        failures.append(
            f"error rate {100 * rate:.2f}% above maxErrorRate {100 * analysis.max_error_rate:.2f}%"
        )
    limit = analysis.max_p95_latency_seconds
    if limit is not None:
        if p95 is None:
            failures.append(
                f"no latency histogram {analysis.latency_metric} with a +Inf bucket: the p95 "
                "threshold cannot be checked"
            )
        elif p95 > limit:
            failures.append(
                f"p95 latency {_fmt_seconds(p95)} above maxP95LatencySeconds {limit:g} s"
            )
    if failures:
        return Measurement(
            "failed", requests, errors, rate, p95, "; ".join(failures) + f" ({', '.join(found)})"
        )
    return Measurement("passed", requests, errors, rate, p95, ", ".join(found))


def _add(buckets: dict[str, float], le: str, value: float) -> None:
    key = bucket_key(le)
    buckets[key] = buckets.get(key, 0.0) + value
    if len(buckets) > MAX_BUCKETS:
        raise MetricsUnavailable(f"the latency histogram has more than {MAX_BUCKETS} buckets")


def _is_error(code: str | None) -> bool:
    return bool(code) and str(code).strip().startswith("5")


def parse_text(text: str, analysis: CanaryAnalysis, at: datetime) -> MetricsSample:
    """A sample from Prometheus text: the request counter by code, the latency buckets."""
    names = {analysis.requests_metric, analysis.requests_metric.removesuffix("_total") + "_total"}
    bucket_name = analysis.latency_metric + "_bucket"
    requests = errors = 0.0
    buckets: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    requests += sample.value
                    if _is_error(sample.labels.get("code")):
                        errors += sample.value
                elif sample.name == bucket_name and "le" in sample.labels:
                    _add(buckets, sample.labels["le"], sample.value)
    except (ValueError, TypeError, KeyError) as exc:
        raise MetricsUnavailable(f"not Prometheus text ({type(exc).__name__})") from None
    return MetricsSample(requests=requests, errors=errors, buckets=buckets, at=at)


def _vector(answer: Any, label: str) -> Iterable[tuple[str | None, float]]:
    if not isinstance(answer, Mapping) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, Mapping) else None
        raise MetricsUnavailable(f"Prometheus answered no success ({str(error)[:200]})")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise MetricsUnavailable("Prometheus answered no instant vector")
    for item in data.get("result") or []:
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise MetricsUnavailable("Prometheus answered a malformed sample") from None
        if math.isnan(value):
            continue
        yield (item.get("metric") or {}).get(label), value


def prometheus_queries(analysis: CanaryAnalysis, namespace: str, revision: str) -> tuple[str, str]:
    """The two instant queries of the candidate revision's counters (requests, buckets)."""
    selector = f'namespace="{namespace}",pod=~"{revision}-.*"'
    return (
        f"sum by (code) ({analysis.requests_metric}{{{selector}}})",
        f"sum by (le) ({analysis.latency_metric}_bucket{{{selector}}})",
    )


def parse_prometheus(requests_answer: Any, buckets_answer: Any, at: datetime) -> MetricsSample:
    requests = errors = 0.0
    for code, value in _vector(requests_answer, "code"):
        requests += value
        if _is_error(code):
            errors += value
    buckets: dict[str, float] = {}
    for le, value in _vector(buckets_answer, "le"):
        if le is not None:
            _add(buckets, le, value)
    return MetricsSample(requests=requests, errors=errors, buckets=buckets, at=at)


# --------------------------------------------------------------------------- I/O


async def _get(http: httpx.AsyncClient, url: str, **params: str) -> bytes:
    try:
        async with http.stream("GET", url, params=params or None) as response:
            if response.status_code != 200:
                raise MetricsUnavailable(f"GET {url} answered {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY:
                    raise MetricsUnavailable(f"GET {url}: more than {MAX_BODY} bytes")
            return bytes(body)
    except httpx.HTTPError as exc:
        raise MetricsUnavailable(f"GET {url} failed ({type(exc).__name__})") from None


async def read_sample(
    analysis: CanaryAnalysis,
    *,
    metrics_url: str,
    namespace: str,
    revision: str | None,
    at: datetime,
    transport: httpx.AsyncBaseTransport | None = None,
) -> MetricsSample:
    """The candidate's counters now, from Prometheus (`prometheusUrl`) or its /metrics."""
    timeout = httpx.Timeout(TIMEOUT_SECONDS)
    async with httpx.AsyncClient(
        timeout=timeout, transport=transport, follow_redirects=False, trust_env=False
    ) as http:
        if analysis.prometheus_url is None:
            body = await _get(http, metrics_url)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise MetricsUnavailable(f"GET {metrics_url}: not UTF-8 text") from None
            return parse_text(text, analysis, at)
        if not revision:
            raise MetricsUnavailable(
                "KServe reports no latestCreatedRevision of the Harness predictor yet"
            )
        url = analysis.prometheus_url.rstrip("/") + "/api/v1/query"
        requests_query, buckets_query = prometheus_queries(analysis, namespace, revision)
        answers = []
        for query in (requests_query, buckets_query):
            body = await _get(http, url, query=query)
            try:
                answers.append(json.loads(body))
            except ValueError:
                raise MetricsUnavailable(f"GET {url}: not JSON") from None
        return parse_prometheus(answers[0], answers[1], at)
