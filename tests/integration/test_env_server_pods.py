"""Sessions addressed to their pod, draining and the load metrics of `qpa env serve`.

Two servers stand for two pods of a RolloutPool (each knows its pod name and its own URL, as a
pool's pods do from the downward API) behind a per-request round-robin proxy standing for the
pool's Service. Over real HTTP on 127.0.0.1: the reset answer carries the pod and its URL,
`RemoteEnv` sends the rest of the session there (a client that ignores it loses its session on
the other pod, and is told which pod holds it), a draining pod refuses new episodes and answers
once its live ones end (or at its bound), and `/metrics` is what an autoscaler reads. The last
test drains a real `qpa env serve` with the real `qpa env drain` (what the preStop hook runs).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from helpers.uvicorn_thread import loopback_socket, serve
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from typer.testing import CliRunner

from qpa.cli import app
from qpa.contract import Finish, Task, ToolCall
from qpa.envs.remote import RemoteEnv, RemoteEnvError, drain
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import EnvServerApp, PodIdentity, create_app
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

KEY = "drain-key-for-tests"


@pytest.fixture(scope="module")
def task() -> Task:
    suite = generate_suite()
    return next(t for t in suite if "messaging_send" in t.tools and "contacts_search" in t.tools)


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def pod(name: str, **options: Any) -> Iterator[tuple[str, EnvServerApp]]:
    """A server that knows it is pod `name` at its own URL; yields (url, app)."""
    sock = loopback_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app("sandbox", identity=PodIdentity(name, url), drain_key=KEY, **options)
    with serve(app, sock=sock):
        yield url, app


class Service:
    """A load-balancing Service: each request goes to the next pod (kube-proxy per request)."""

    def __init__(self, pods: list[str]) -> None:
        self.pods = pods
        self.turn = itertools.cycle(range(len(pods)))
        self.requests: list[str] = []

    async def forward(self, request: Request) -> Response:
        target = self.pods[next(self.turn)]
        self.requests.append(f"{request.method} {request.url.path}")
        async with httpx.AsyncClient() as client:
            answer = await client.request(
                request.method,
                target + request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers={k: v for k, v in request.headers.items() if k != "host"},
            )
        return Response(answer.content, answer.status_code, headers=dict(answer.headers))

    def app(self) -> Starlette:
        methods = ["GET", "POST", "DELETE"]
        return Starlette(routes=[Route("/{path:path}", self.forward, methods=methods)])


@pytest.fixture
def pool() -> Iterator[tuple[list[str], Service, str]]:
    """Two pods behind a round-robin Service: (pod urls, the service, its url)."""
    with pod("pool-env-a") as (a, _), pod("pool-env-b") as (b, _):
        service = Service([a, b])
        with serve(service.app()) as url:
            yield [a, b], service, url


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


def reset_body(task: Task, session_id: str | None = None) -> bytes:
    payload: dict[str, Any] = {"task": task.model_dump(mode="json")}
    if session_id:
        payload["session_id"] = session_id
    return orjson.dumps(payload)


def search(query: str) -> dict[str, Any]:
    return ToolCall(tool="contacts_search", arguments={"query": query}).model_dump()


# --------------------------------------------------------------------------- addressing


def test_the_session_handle_names_its_pod_and_the_client_stays_there(
    pool: tuple[list[str], Service, str], task: Task
) -> None:
    (a, b), service, url = pool
    answer = httpx.post(f"{url}/reset", content=reset_body(task)).json()
    assert answer["pod"] == "pool-env-a" and answer["url"] == a  # the first pod, by the turn
    assert set(answer) == {"session_id", "pod", "url", "feedback"}

    with RemoteEnv(url, kind="sandbox") as env:  # the kind given: no /health through it
        service.requests.clear()
        trajectory = run_episode(env, task, OraclePlanner())
        assert trajectory.success, trajectory.error
        # only the reset went through the Service; every later call went to the pod itself
        assert service.requests == ["POST /reset"], service.requests
        assert env.pod == "pool-env-b" and env.pod_url == b
        assert metrics(b)["qpa_env_sessions_in_use"] == 1
        second = run_episode(env, task, OraclePlanner())  # a new episode: the same pod
        assert second.success and service.requests == ["POST /reset"]
    assert metrics(b)["qpa_env_sessions_in_use"] == 0  # close() deleted it on its pod


def test_a_client_that_ignores_the_handle_loses_the_episode_and_is_told_why(
    pool: tuple[list[str], Service, str], task: Task
) -> None:
    _, _, url = pool
    with RemoteEnv(url, follow_pod=False) as env:
        env.reset(task)  # lands on pod a; the step goes to pod b
        feedback = env.step(ToolCall(tool="contacts_search", arguments={"query": "a"}))
        assert (feedback.status, feedback.error, feedback.done) == (
            "error",
            "environment_failure",
            True,
        )
        assert feedback.message.startswith("unknown_session: ")
        assert "(on pod 'pool-env-b')" in feedback.message  # the pod it asked


def test_a_request_on_the_wrong_pod_names_the_pod_that_owns_the_session(
    pool: tuple[list[str], Service, str], task: Task
) -> None:
    (a, b), _, _ = pool
    session = httpx.post(f"{a}/reset", content=reset_body(task)).json()["session_id"]
    claim = {"qpa-session-pod": "pool-env-a"}
    step = orjson.dumps({"session_id": session, "action": search("x")})
    for response in (
        httpx.post(f"{b}/step", content=step, headers=claim),  # the fast path
        httpx.get(f"{b}/state", params={"session_id": session}, headers=claim),  # FastAPI
        httpx.delete(f"{b}/sessions/{session}", headers=claim),
    ):
        assert response.status_code == 404, response.text
        error = error_of(response)
        assert error["kind"] == "session_on_other_pod" and error["field"] == "session_id"
        assert "lives on pod 'pool-env-a', not on pod 'pool-env-b'" in error["message"]
    ok = httpx.post(f"{a}/step", content=step, headers=claim)
    assert ok.status_code == 200 and ok.json()["feedback"]["status"] == "ok"


def test_reset_starts_over_through_the_service_when_its_pod_drains(
    pool: tuple[list[str], Service, str], task: Task
) -> None:
    (a, b), _, url = pool
    with RemoteEnv(url) as env:
        env.reset(task)
        first = env.pod_url
        assert first in (a, b)
        other = b if first == a else a
        result = drain(first or "", KEY, 0)  # answers at once: the episode is live
        assert result["drained"] is False and result["live"] == 1
        step = env.step(ToolCall(tool="contacts_search", arguments={"query": "a"}))
        assert step.status == "ok"  # a live episode keeps running on a draining pod
        feedback = env.reset(task)  # a new episode: not on the draining pod
        assert feedback.status == "ok" and env.pod_url == other
        assert metrics(first or "")["qpa_env_sessions_in_use"] == 0  # its old slot was freed


# --------------------------------------------------------------------------- draining


def test_drain_refuses_new_episodes_and_waits_for_the_live_ones(task: Task) -> None:
    with pod("pool-env-a") as (url, _):
        http = httpx.Client(base_url=url, timeout=10)
        live = http.post("/reset", content=reset_body(task)).json()["session_id"]
        done = http.post("/reset", content=reset_body(task)).json()["session_id"]
        finish = orjson.dumps({"session_id": done, "action": Finish().model_dump()})
        assert http.post("/step", content=finish).json()["feedback"]["done"] is True
        assert metrics(url)["qpa_env_sessions_live"] == 1  # the finished one is not live

        answers: list[dict[str, Any]] = []
        started = time.monotonic()
        waiter = threading.Thread(target=lambda: answers.append(drain(url, KEY, 10)))
        waiter.start()
        deadline = time.monotonic() + 5
        while not http.get("/health").json()["draining"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)

        refused = http.post("/reset", content=reset_body(task))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "0"
        assert error_of(refused)["kind"] == "draining"
        assert "pod 'pool-env-a' is draining" in error_of(refused)["message"]
        again = http.post("/reset", content=reset_body(task, live))  # a new episode too
        assert again.status_code == 503
        assert http.get("/ready").status_code == 503  # out of the Service
        assert http.get("/health").status_code == 200  # alive (liveness must not kill it)
        assert metrics(url)["qpa_env_draining"] == 1

        step = orjson.dumps({"session_id": live, "action": search("bo")})
        assert http.post("/step", content=step).json()["feedback"]["status"] == "ok"
        time.sleep(0.3)
        assert waiter.is_alive()  # still live: the drain waits
        ending = orjson.dumps({"session_id": live, "action": Finish().model_dump()})
        assert http.post("/step", content=ending).json()["feedback"]["done"] is True
        waiter.join(5)
        waited = time.monotonic() - started
        assert not waiter.is_alive() and waited < 5
        (answer,) = answers
        assert answer["drained"] is True and answer["live"] == 0
        assert answer["pod"] == "pool-env-a" and 0.3 <= answer["waited_s"] < 5
        http.close()


def test_drain_stops_at_its_bound_and_needs_the_key(task: Task) -> None:
    with pod("pool-env-a") as (url, _):
        httpx.post(f"{url}/reset", content=reset_body(task))  # live, never finished
        with pytest.raises(RemoteEnvError) as wrong:
            drain(url, "not-the-key", 1)
        assert wrong.value.status == 403 and wrong.value.kind == "forbidden"
        assert httpx.get(f"{url}/ready").status_code == 200  # a refused drain changed nothing
        started = time.monotonic()
        answer = drain(url, KEY, 0.5)
        assert answer["drained"] is False and answer["live"] == 1
        assert 0.5 <= time.monotonic() - started < 3
        bad = httpx.post(
            f"{url}/drain", content=b'{"timeout_s": -1}', headers={"qpa-drain-key": KEY}
        )
        assert bad.status_code == 422 and error_of(bad)["field"] == "timeout_s"
    app = create_app("sandbox")  # no drain key: no drain
    with serve(app) as plain:
        refused = httpx.post(f"{plain}/drain", content=b"{}", headers={"qpa-drain-key": KEY})
        assert refused.status_code == 403 and error_of(refused)["kind"] == "drain_disabled"
        assert "pod" not in httpx.post(f"{plain}/reset", content=reset_body(task)).json()


# --------------------------------------------------------------------------- metrics


def test_metrics_export_sessions_in_use_and_capacity(task: Task) -> None:
    with pod("pool-env-a", max_sessions=6) as (url, _):
        before = metrics(url)
        assert before["qpa_env_sessions_in_use"] == 0
        assert before["qpa_env_sessions_capacity"] == 6
        assert before["qpa_env_draining"] == 0
        assert before["qpa_env_session_evictions_total"] == 0
        for _ in range(3):
            httpx.post(f"{url}/reset", content=reset_body(task))
        after = metrics(url)
        assert (after["qpa_env_sessions_in_use"], after["qpa_env_sessions_live"]) == (3, 3)
        text = httpx.get(f"{url}/metrics")
        assert text.headers["content-type"].startswith("text/plain")
        assert 'qpa_env_sessions_in_use{kind="sandbox"} 3.0' in text.text


def test_pod_identity_from_the_downward_api() -> None:
    env = {"QPA_POD_NAME": "pool-env-7f", "QPA_POD_IP": "10.1.2.3"}
    assert PodIdentity.from_env(8000, env) == PodIdentity("pool-env-7f", "http://10.1.2.3:8000")
    v6 = PodIdentity.from_env(8000, {"QPA_POD_NAME": "p", "QPA_POD_IP": "fd00::1"})
    assert v6 is not None and v6.url == "http://[fd00::1]:8000"
    given = {"QPA_POD_NAME": "p", "QPA_ENV_ADVERTISE_URL": "http://p.pods:9/"}
    assert PodIdentity.from_env(1, given) == PodIdentity("p", "http://p.pods:9")
    assert PodIdentity.from_env(8000, {"QPA_POD_IP": "10.1.2.3"}) is None  # not a pod
    with pytest.raises(ValueError, match="QPA_POD_IP"):
        PodIdentity.from_env(8000, {"QPA_POD_NAME": "p", "QPA_POD_IP": "nope"})


# --------------------------------------------------------------------------- the CLI


def test_qpa_env_drain_drains_a_real_server(task: Task, tmp_path: Path) -> None:
    """What a pool pod's preStop hook runs, against what the pod runs."""
    qpa = str(Path(sys.executable).with_name("qpa"))
    port, key_file = _port(), tmp_path / "drain.key"
    env = {
        **os.environ,
        "QPA_POD_NAME": "pool-env-x",
        "QPA_POD_IP": "127.0.0.1",
        "QPA_ENV_DRAIN_FILE": str(key_file),
    }
    log = (tmp_path / "serve.log").open("w+")
    server = subprocess.Popen(
        [qpa, "env", "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # a loaded CI machine imports slowly
        while True:
            assert server.poll() is None, Path(log.name).read_text()
            try:
                assert httpx.get(f"{base}/health", timeout=1).json()["pod"] == "pool-env-x"
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "qpa env serve did not come up"
                time.sleep(0.1)
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        with RemoteEnv(base) as remote:
            remote.reset(task)
            assert (remote.pod, remote.pod_url) == ("pool-env-x", base)
        live = httpx.post(f"{base}/reset", content=reset_body(task)).json()["session_id"]
        hook = subprocess.Popen(
            [qpa, "env", "drain", "--url", base, "--timeout-seconds", "20"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        while httpx.get(f"{base}/ready").status_code == 200:
            assert time.monotonic() < deadline and hook.poll() is None
            time.sleep(0.05)
        assert hook.poll() is None  # waiting for the live episode
        ending = orjson.dumps({"session_id": live, "action": Finish().model_dump()})
        httpx.post(f"{base}/step", content=ending)
        _, stderr = hook.communicate(timeout=20)
        assert hook.returncode == 0, stderr
        assert "0 episodes live" in stderr and "drained" in stderr
        missing = str(tmp_path / "none")
        no_key = CliRunner().invoke(app, ["env", "drain", "--url", base, "--key-file", missing])
        assert no_key.exit_code == 2 and "--key-file: cannot read" in no_key.output
    finally:
        server.terminate()
        server.wait(10)
        log.close()
