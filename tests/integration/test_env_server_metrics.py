"""`qpa env serve`'s Prometheus metrics, scraped from `/metrics` and read with
prometheus_client's own text parser, after traffic over HTTP and over the session channel.

What is checked: steps and resets are counted once each (a retried step answered from the
record is not), requests by operation, channel and status, refusals by the error contract's
kind, error feedback by its error kind, a latency histogram per operation, and the session
gauges (sessions in use, open channels).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from helpers.uvicorn_thread import serve
from prometheus_client.parser import text_string_to_metric_families

from qpa.contract import MessageUser, Task, ToolCall
from qpa.envs.remote import RemoteEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import create_app, uvicorn_config

GHOST = "ghost-session-0000000000000000000000000000"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `/metrics`: (name, sorted labels) -> value."""
    response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted({"kind": "sandbox", **labels}.items()))), 0.0)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = create_app("sandbox", max_sessions=16)
    with serve(app, uvicorn_config(app, port=0)) as base:
        yield base


@pytest.fixture(scope="module")
def task() -> Task:
    return generate_suite()[0]


def test_traffic_is_counted_by_operation_channel_status_and_error(url: str, task: Task) -> None:
    before = scrape(url)
    assert value(before, "qpa_env_sessions_capacity") == 16
    with RemoteEnv(url, channel="websocket") as ws, RemoteEnv(url, channel="http") as http:
        for env in (ws, http):
            env.reset(task)
            env.step(MessageUser(text="one"))
            env.step(MessageUser(text="two"))
            env.step(ToolCall(tool="no_such_tool", arguments={}))  # error feedback, 200
        during = scrape(url)
        assert value(during, "qpa_env_channels_open") == 1
        assert value(during, "qpa_env_sessions_in_use") == 2
        # a retried step (same seq) is answered from the record: not a new step
        body = (
            b'{"session_id":"' + http.session_id.encode() + b'","seq":2,"action":'
            b'{"type":"message_user","text":"again"}}'
        )
        assert httpx.post(f"{url}/step", content=body).status_code == 200
    assert httpx.post(f"{url}/step", content=b"{nope").status_code == 400
    ghost = {"session_id": GHOST, "action": {"type": "finish"}}
    assert httpx.post(f"{url}/step", json=ghost).status_code == 404
    assert httpx.get(f"{url}/state", params={"session_id": "short"}).status_code == 422
    after = scrape(url)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("qpa_env_steps_total") == 6
    assert grew("qpa_env_resets_total") == 2
    assert grew("qpa_env_requests_total", op="step", channel="websocket", code="200") == 3
    assert grew("qpa_env_requests_total", op="step", channel="http", code="200") == 4
    assert grew("qpa_env_requests_total", op="reset", channel="websocket", code="200") == 1
    assert grew("qpa_env_requests_total", op="step", channel="http", code="400") == 1
    assert grew("qpa_env_requests_total", op="step", channel="http", code="404") == 1
    assert grew("qpa_env_requests_total", op="state", channel="http", code="422") == 1
    assert grew("qpa_env_errors_total", op="step", error="malformed_json") == 1
    assert grew("qpa_env_errors_total", op="step", error="unknown_session") == 1
    assert grew("qpa_env_errors_total", op="state", error="invalid_request") == 1
    assert grew("qpa_env_episode_errors_total", error="unknown_tool") == 2
    steps = grew("qpa_env_request_seconds_count", op="step", channel="websocket")
    assert steps == 3
    assert grew("qpa_env_request_seconds_bucket", op="step", channel="websocket", le="+Inf") == 3
    assert grew("qpa_env_request_seconds_sum", op="step", channel="websocket") > 0
    assert value(after, "qpa_env_channels_open") == 0  # closed with its client
    assert value(after, "qpa_env_sessions_in_use") == 0  # closed sessions free their slots


def test_metrics_need_no_token_and_each_server_counts_its_own(task: Task) -> None:
    app = create_app("sandbox")
    with serve(app, uvicorn_config(app, port=0)) as other:
        assert value(scrape(other), "qpa_env_steps_total") == 0
