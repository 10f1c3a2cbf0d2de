"""The environment server (`qpa env serve`) and `RemoteEnv`, over real HTTP on 127.0.0.1.

Servers run in background threads (uvicorn on a socket bound to a free loopback port) so each
test can choose limits (session TTL, capacity, body size); one test starts the real CLI as a
subprocess. What is checked: a remote rollout is indistinguishable from a local one, sessions
never mix, every bad input gets a structured error naming the problem, and the server survives.
"""

from __future__ import annotations

import contextlib
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
from helpers.uvicorn_thread import serve

from qpa.contract import Check, Finish, MessageUser, Task, ToolCall, VerifierSpec
from qpa.envs.factory import env_kinds, make_env
from qpa.envs.remote import KeepAliveTransport, RemoteEnv, RemoteEnvError
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import create_app
from qpa.harness.planners import NoopPlanner, OraclePlanner
from qpa.harness.runner import run_episode

MAX_BODY = 256 * 1024
GHOST = "ghost-session-0000000000000000000000000000"  # well-formed, never created


@contextlib.contextmanager
def serving(**options: Any) -> Iterator[str]:
    """An environment server in a background thread; yields its base URL."""
    app = create_app("sandbox", **options)
    with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving(max_sessions=64, max_body_bytes=MAX_BODY) as base:
        yield base


@pytest.fixture(scope="module", params=["fast_path", "fastapi_routes"])
def any_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The same server served through the ASGI fast path and through plain FastAPI routes."""
    with serving(
        max_sessions=64, max_body_bytes=MAX_BODY, fast_path=request.param == "fast_path"
    ) as base:
        yield base


@pytest.fixture(scope="module")
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def tasks() -> tuple[Task, ...]:
    return generate_suite()


@pytest.fixture(scope="module")
def sample(tasks: tuple[Task, ...]) -> list[Task]:
    """Up to 24 tasks spread over the suite (it grows while apps are added)."""
    return list(tasks[:: max(1, len(tasks) // 24)])[:24]


@pytest.fixture(scope="module")
def messaging_task(tasks: tuple[Task, ...]) -> Task:
    return next(t for t in tasks if "messaging_send" in t.tools and "contacts_search" in t.tools)


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert error["kind"] and error["message"], body
    return error


def reset(http: httpx.Client, task: Task, session_id: str | None = None) -> str:
    payload: dict[str, Any] = {"task": task.model_dump(mode="json")}
    if session_id is not None:
        payload["session_id"] = session_id
    response = http.post("/reset", content=orjson.dumps(payload))
    assert response.status_code == 200, response.text
    assert response.json()["feedback"]["status"] == "ok"
    sid: str = response.json()["session_id"]
    return sid


def step(
    http: httpx.Client, session_id: str, action: dict[str, Any], **extra: Any
) -> httpx.Response:
    return http.post(
        "/step", content=orjson.dumps({"session_id": session_id, "action": action, **extra})
    )


def send_action(to: str, text: str) -> ToolCall:
    return ToolCall(tool="messaging_send", arguments={"to": to, "text": text})


# --------------------------------------------------------------------------- parity


def test_remote_feedback_is_byte_identical_to_local(url: str, sample: list[Task]) -> None:
    local = SandboxEnv()
    with RemoteEnv(url) as remote:
        for task in sample:
            first_local, first_remote = local.reset(task), remote.reset(task)
            assert first_remote.model_dump_json() == first_local.model_dump_json()
            assert [t.model_dump_json() for t in remote.tools()] == [
                t.model_dump_json() for t in local.tools()
            ]
            mine = run_episode(local, task, OraclePlanner())
            theirs = run_episode(remote, task, OraclePlanner())
            assert mine.steps, task.id
            assert [s.action.model_dump_json() for s in theirs.steps] == [
                s.action.model_dump_json() for s in mine.steps
            ], task.id
            assert [s.feedback.model_dump_json() for s in theirs.steps] == [
                s.feedback.model_dump_json() for s in mine.steps
            ], task.id
            assert theirs.verification is not None and mine.verification is not None
            assert theirs.verification.model_dump_json() == mine.verification.model_dump_json()
            assert remote.state() == local.state()
            assert theirs.error == mine.error


def test_run_episode_through_remote_env(url: str, sample: list[Task]) -> None:
    local = SandboxEnv()  # apps still being written may fail their oracle: judge the rest
    solvable = [t for t in sample if run_episode(local, t, OraclePlanner()).success][:8]
    assert solvable
    with RemoteEnv(url) as remote:
        assert remote.kind == "sandbox"
        for task in solvable:
            trajectory = run_episode(remote, task, OraclePlanner())
            assert trajectory.success, (task.id, trajectory.error, trajectory.verification)
            assert trajectory.env_kind == "sandbox"
            assert not run_episode(remote, task, NoopPlanner()).success


def test_close_deletes_the_session(url: str, http: httpx.Client, sample: list[Task]) -> None:
    remote = RemoteEnv(url)
    remote.reset(sample[0])
    assert http.get("/state", params={"session_id": remote.session_id}).status_code == 200
    remote.close()
    gone = http.get("/state", params={"session_id": remote.session_id})
    assert gone.status_code == 404 and error_of(gone)["kind"] == "unknown_session"
    remote.close()  # idempotent


def test_remote_env_before_reset_matches_local(url: str) -> None:
    local = SandboxEnv()
    with RemoteEnv(url, kind="sandbox") as remote:
        action = ToolCall(tool="contacts_search", arguments={"query": "a"})
        assert remote.step(action).model_dump_json() == local.step(action).model_dump_json()
        assert remote.verify() == local.verify()
        assert remote.tools() == local.tools() == []


def test_openapi_documents_the_endpoints(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/reset", "/step", "/verify", "/state", "/tools", "/health"} <= set(paths)
    assert "session_id" in paths["/step"]["post"]["requestBody"]["description"]


# --------------------------------------------------------------------------- concurrency


def test_sixteen_concurrent_sessions_never_mix(url: str, messaging_task: Task) -> None:
    sessions, rounds = 16, 6
    barrier = threading.Barrier(sessions)
    sent: dict[int, list[str]] = {}
    states: dict[int, dict[str, Any]] = {}
    failures: list[str] = []

    def worker(i: int) -> None:
        try:
            with RemoteEnv(url) as env:
                env.reset(messaging_task)
                barrier.wait(10)
                texts = []
                for j in range(rounds):
                    text = f"session {i} message {j}"
                    feedback = env.step(send_action(f"+1-555-{7000 + i:04d}", text))
                    assert feedback.status == "ok", feedback
                    texts.append(text)
                    env.step(MessageUser(text=f"note {i}.{j}"))
                barrier.wait(10)  # everyone is done: nobody's later step can hide a leak
                sent[i] = texts
                states[i] = env.state()
        except Exception as exc:  # collected: assertions in threads do not fail the test
            failures.append(f"session {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    baseline = SandboxEnv()
    baseline.reset(messaging_task)
    seeded = [m for m in baseline.state()["messaging"]["messages"] if m["sender"] == "me"]
    for i in range(sessions):
        mine = [m for m in states[i]["messaging"]["messages"] if m["sender"] == "me"]
        assert [m["text"] for m in mine[len(seeded) :]] == sent[i]
        assert all(m["to"] == f"+1-555-{7000 + i:04d}" for m in mine[len(seeded) :])
        notes = [m["text"] for m in states[i]["_user"]["messages"]]
        assert notes == [f"note {i}.{j}" for j in range(rounds)]


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "threadpool"])
def test_concurrent_requests_to_one_session_serialize(messaging_task: Task, inline: bool) -> None:
    with serving(inline=inline) as base, httpx.Client(base_url=base, timeout=10) as http:
        sid = reset(http, messaging_task)
        workers, each = 8, 10
        barrier = threading.Barrier(workers)
        statuses: list[int] = []

        def hammer(i: int) -> None:
            with httpx.Client(base_url=base, timeout=10) as mine:
                barrier.wait(10)
                for j in range(each):
                    action = send_action("+1-555-0199", f"w{i}-{j}")
                    statuses.append(step(mine, sid, action.model_dump(mode="json")).status_code)

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert statuses == [200] * (workers * each)
        state = http.get("/state", params={"session_id": sid}).json()
        assert state["steps"] == workers * each
        ours = [m for m in state["state"]["messaging"]["messages"] if m["to"] == "+1-555-0199"]
        assert sorted(m["text"] for m in ours) == sorted(
            f"w{i}-{j}" for i in range(workers) for j in range(each)
        )
        assert len({m["id"] for m in ours}) == workers * each  # no lost or doubled updates


# --------------------------------------------------------------------------- bad input


def test_tool_level_errors_are_feedback(any_url: str, messaging_task: Task) -> None:
    with httpx.Client(base_url=any_url, timeout=10) as http:
        sid = reset(http, messaging_task)
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"type": "tool_call", "tool": "no_such_tool"}, "unknown_tool", "no_such_tool"),
            (
                {"type": "tool_call", "tool": "contacts_search", "arguments": {"query": 5}},
                "invalid_arguments",
                "query",
            ),
            (
                {"type": "tool_call", "tool": "contacts_search"},
                "invalid_arguments",
                "missing argument 'query'",
            ),
            (
                {
                    "type": "tool_call",
                    "tool": "contacts_search",
                    "arguments": {"query": "a", "x": 1},
                },
                "invalid_arguments",
                "unexpected argument 'x'",
            ),
        ]
        for action, kind, named in cases:
            response = step(http, sid, action)
            assert response.status_code == 200, response.text
            feedback = response.json()["feedback"]
            assert feedback["status"] == "error" and feedback["error"] == kind, feedback
            assert named in feedback["message"], feedback
        assert step(http, sid, {"type": "finish", "answer": "done"}).json()["feedback"]["done"]
        after = step(
            http, sid, {"type": "tool_call", "tool": "contacts_search", "arguments": {"query": "a"}}
        )
        feedback = after.json()["feedback"]
        assert after.status_code == 200 and feedback["error"] == "precondition_failed"
        assert feedback["done"] is True and "finished" in feedback["message"]


def test_request_errors_are_structured(any_url: str, messaging_task: Task) -> None:
    with httpx.Client(base_url=any_url, timeout=10) as http:
        sid = reset(http, messaging_task)
        search = {"type": "tool_call", "tool": "contacts_search", "arguments": {"query": "a"}}
        task_json = messaging_task.model_dump(mode="json")

        def post(path: str, body: bytes) -> httpx.Response:
            return http.post(path, content=body)

        def expect(
            response: httpx.Response, status: int, kind: str, field: str | None = None
        ) -> str:
            assert response.status_code == status, response.text
            error = error_of(response)
            assert error["kind"] == kind, error
            if field is not None:
                assert error.get("field") == field, error
                if status != 404:  # a 404 names the session id itself
                    assert field in error["message"], error
            message: str = error["message"]
            return message

        # malformed JSON: 400
        expect(post("/step", b'{"session_id": "x", '), 400, "malformed_json")
        expect(post("/step", b""), 400, "malformed_json")
        expect(post("/reset", b"{'task': 1}"), 400, "malformed_json")
        # valid JSON, wrong shape: 422 naming the field
        assert "JSON object" in expect(post("/step", b"[1, 2]"), 422, "invalid_request")
        expect(post("/step", orjson.dumps({"session_id": sid})), 422, "invalid_request", "action")
        expect(
            post("/step", orjson.dumps({"action": search})), 422, "invalid_request", "session_id"
        )
        expect(
            post("/step", orjson.dumps({"session_id": sid, "action": {"type": "tool_call"}})),
            422,
            "invalid_request",
            "action.tool",
        )
        expect(
            post(
                "/step",
                orjson.dumps({"session_id": sid, "action": {"type": "tool_call", "tool": 7}}),
            ),
            422,
            "invalid_request",
            "action.tool",
        )
        expect(
            post(
                "/step",
                orjson.dumps(
                    {
                        "session_id": sid,
                        "action": {"type": "tool_call", "tool": "x", "arguments": [1]},
                    }
                ),
            ),
            422,
            "invalid_request",
            "action.arguments",
        )
        assert "teleport" in expect(
            post("/step", orjson.dumps({"session_id": sid, "action": {"type": "teleport"}})),
            422,
            "invalid_request",
            "action",
        )
        expect(
            post("/step", orjson.dumps({"session_id": sid, "action": search, "bogus": 1})),
            422,
            "invalid_request",
            "bogus",
        )
        expect(
            post("/step", orjson.dumps({"session_id": "has spaces!", "action": search})),
            422,
            "invalid_request",
            "session_id",
        )
        expect(
            post("/step", orjson.dumps({"session_id": sid, "action": search, "seq": -1})),
            422,
            "invalid_request",
            "seq",
        )
        bad_task = {k: v for k, v in task_json.items() if k != "instruction"}
        expect(
            post("/reset", orjson.dumps({"task": bad_task})),
            422,
            "invalid_request",
            "task.instruction",
        )
        expect(
            post("/reset", orjson.dumps({"task": {**task_json, "capabilities": []}})),
            422,
            "invalid_request",
            "task.capabilities",
        )
        expect(
            post(
                "/reset",
                orjson.dumps(
                    {"task": {**task_json, "reference_plan": [{"type": "finish", "x": 1}]}}
                ),
            ),
            422,
            "invalid_request",
            "task.reference_plan[0].x",
        )
        expect(post("/verify", b"{}"), 422, "invalid_request", "session_id")
        # unknown sessions: 404
        unknown = post("/step", orjson.dumps({"session_id": GHOST, "action": search}))
        assert f"'{GHOST}'" in expect(unknown, 404, "unknown_session", "session_id")
        expect(post("/verify", orjson.dumps({"session_id": GHOST})), 404, "unknown_session")
        expect(http.get("/state", params={"session_id": GHOST}), 404, "unknown_session")
        expect(http.get("/tools", params={"session_id": GHOST}), 404, "unknown_session")
        expect(http.delete(f"/sessions/{GHOST}"), 404, "unknown_session")
        # a short (guessable) id is refused before any lookup
        expect(post("/verify", b'{"session_id": "nope"}'), 422, "invalid_request", "session_id")
        expect(http.get("/state"), 422, "invalid_request", "session_id")
        # oversized: 413, with a Content-Length and streamed (chunked) without one
        huge = b'{"session_id": "' + b"x" * (MAX_BODY + 10) + b'"}'
        expect(post("/step", huge), 413, "body_too_large")
        chunked = http.post("/reset", content=iter([huge[:1000], huge[1000:]]))
        assert "content-length" not in chunked.request.headers
        expect(chunked, 413, "body_too_large")
        # routes and methods
        expect(http.get("/nowhere"), 404, "not_found")
        expect(http.get("/step"), 405, "method_not_allowed")
        # out-of-order steps: 409; a repeated step is answered again, not applied twice
        first = step(http, sid, search, seq=0)
        again = step(http, sid, search, seq=0)
        assert first.status_code == again.status_code == 200 and first.content == again.content
        expect(step(http, sid, search, seq=5), 409, "sequence_conflict", "seq")
        assert http.get("/state", params={"session_id": sid}).json()["steps"] == 1
        # after all that: the session and the server still work
        assert step(http, sid, search, seq=1).json()["feedback"]["status"] == "ok"
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_bug_answers_500_and_the_server_survives(any_url: str, tasks: tuple[Task, ...]) -> None:
    task = next(t for t in tasks if t.world.get("contacts", {}).get("contacts"))
    broken = task.model_copy(
        update={
            "verifier": VerifierSpec(
                checks=[Check(name="bug", target="contacts.contacts", where={"name__bogus": 1})]
            )
        }
    )
    with httpx.Client(base_url=any_url, timeout=10) as http:
        sid = reset(http, broken)
        response = http.post("/verify", content=orjson.dumps({"session_id": sid}))
        assert response.status_code == 500
        error = error_of(response)
        assert error["kind"] == "internal" and "bogus" in error["message"]
        assert http.get("/health").json()["status"] == "ok"
        assert step(http, sid, {"type": "finish"}).status_code == 200
    with RemoteEnv(any_url, retries=1, backoff_s=0.01) as remote:
        remote.reset(broken)
        with pytest.raises(RemoteEnvError) as caught:
            remote.verify()
        assert caught.value.status == 500 and caught.value.kind == "internal"
        assert remote.step(Finish()).status == "ok"  # the session lives on


def test_remote_env_maps_server_errors(url: str, http: httpx.Client, messaging_task: Task) -> None:
    with RemoteEnv(url) as remote:
        remote.reset(messaging_task)
        refused = remote.step(ToolCall.model_construct(type="tool_call", tool=5, arguments={}))  # type: ignore[arg-type]
        assert refused.status == "error" and refused.error == "invalid_arguments"
        assert "action.tool" in refused.message
        too_big = remote.step(MessageUser(text="x" * (MAX_BODY + 1)))
        assert too_big.error == "invalid_arguments" and "body_too_large" in too_big.message
        assert remote.step(Finish()).status == "ok"  # the refused actions were not counted
        http.delete(f"/sessions/{remote.session_id}")
        lost = remote.step(Finish())
        assert lost.status == "error" and lost.error == "environment_failure" and lost.done
        assert "unknown_session" in lost.message
        with pytest.raises(RemoteEnvError, match="unknown_session"):
            remote.verify()  # a rollout records the loss as environment-side
    invalid = messaging_task.model_copy(update={"instruction": ""})
    with RemoteEnv(url) as remote:
        feedback = remote.reset(invalid)
        assert feedback.status == "error" and "task.instruction" in feedback.message
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with (
        RemoteEnv(dead, retries=2, backoff_s=0.01, kind="sandbox") as remote,
        pytest.raises(RemoteEnvError),
    ):
        remote.reset(messaging_task)


class LoseFirstStepAnswer(httpx.BaseTransport):
    """Delivers every request, but loses the server's answer to the first step."""

    def __init__(self) -> None:
        self.inner = KeepAliveTransport(timeout=10)
        self.steps_sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == "/step":
            self.steps_sent += 1
            if self.steps_sent == 1:
                raise httpx.ReadError("connection lost after the server answered", request=request)
        return response


class CannedAnswers(httpx.BaseTransport):
    """Answers every request with one status and error body, counting requests per path."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.calls: dict[str, int] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls[request.url.path] = self.calls.get(request.url.path, 0) + 1
        if request.url.path == "/reset":
            feedback = {
                "status": "ok",
                "observation": None,
                "error": None,
                "message": "",
                "done": False,
            }
            return httpx.Response(200, json={"session_id": "s", "feedback": feedback})
        error = {"error": {"kind": "internal", "message": "canned failure"}}
        return httpx.Response(self.status, json=error)


def test_a_step_whose_answer_was_lost_is_applied_once(url: str, messaging_task: Task) -> None:
    transport = LoseFirstStepAnswer()
    client = httpx.Client(transport=transport)
    with RemoteEnv(url, client=client, retries=2, backoff_s=0.01) as remote:
        remote.reset(messaging_task)
        before = len(remote.state()["messaging"]["messages"])
        feedback = remote.step(send_action("+1-555-0142", "only once"))
        assert feedback.status == "ok" and transport.steps_sent == 2  # sent twice ...
        messages = remote.state()["messaging"]["messages"]
        assert len(messages) == before + 1  # ... applied once
        assert remote.step(send_action("+1-555-0142", "second")).status == "ok"
        assert len(remote.state()["messaging"]["messages"]) == before + 2
    client.close()


def test_server_errors_retry_only_idempotent_calls(messaging_task: Task) -> None:
    transport = CannedAnswers(503)
    with RemoteEnv(
        "http://127.0.0.1:9",
        client=httpx.Client(transport=transport),
        retries=2,
        backoff_s=0.001,
        kind="sandbox",
    ) as remote:
        assert remote.reset(messaging_task).status == "ok"
        with pytest.raises(RemoteEnvError) as caught:
            remote.verify()
        assert caught.value.status == 503 and transport.calls["/verify"] == 3  # 1 + 2 retries
        feedback = remote.step(Finish())
        assert feedback.error == "environment_failure" and "canned failure" in feedback.message
        assert transport.calls["/step"] == 1  # a step is never repeated on a 5xx


# --------------------------------------------------------------------------- lifetime


def test_idle_sessions_expire(messaging_task: Task) -> None:
    ttl = 1.0
    with serving(session_ttl_s=ttl) as base, httpx.Client(base_url=base, timeout=10) as http:
        sid = reset(http, messaging_task)
        kept = reset(http, messaging_task)
        deadline = time.monotonic() + ttl * 1.6
        while time.monotonic() < deadline:  # touching a session keeps it alive
            assert step(http, kept, {"type": "message_user", "text": "hi"}).status_code == 200
            time.sleep(0.05)
        response = step(http, sid, {"type": "finish"})
        assert response.status_code == 404
        error = error_of(response)
        assert error["kind"] == "session_expired" and sid in error["message"]
        assert step(http, kept, {"type": "finish"}).status_code == 200
        deadline = time.monotonic() + ttl * 5  # the sweeper frees idle sessions unasked
        while http.get("/health").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http.get("/health").json()["sessions"] == 0
        with RemoteEnv(base) as remote:
            remote.reset(messaging_task)
            time.sleep(ttl * 1.3)
            feedback = remote.step(Finish())
            assert feedback.error == "environment_failure" and "session_expired" in feedback.message
            trajectory = run_episode(remote, messaging_task, OraclePlanner())
            assert trajectory.success  # a new reset recovers
            assert remote.reset(messaging_task).status == "ok"  # the same id starts afresh
            assert remote.step(Finish()).status == "ok"


def test_capacity_is_bounded(messaging_task: Task) -> None:
    def at(base: str, address: str) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=address)
        return httpx.Client(base_url=base, timeout=10, transport=transport)

    with serving(max_sessions=2) as base, at(base, "127.0.0.1") as http, at(base, "127.0.0.2") as b:
        first = reset(http, messaging_task)
        second = reset(http, messaging_task)
        reset(http, messaging_task, session_id=first)  # restarting a live session takes no slot
        third = reset(http, messaging_task)  # a full server: its own oldest session gives way
        assert http.get("/state", params={"session_id": second}).status_code == 404
        reset(b, messaging_task)  # a second client below its fair share takes the other's
        assert http.get("/state", params={"session_id": first}).status_code == 404
        assert http.get("/state", params={"session_id": third}).status_code == 200
        with at(base, "127.0.0.3") as c:  # each client holds its fair share, none is idle
            full = c.post(
                "/reset", content=orjson.dumps({"task": messaging_task.model_dump(mode="json")})
            )
        assert full.status_code == 503 and full.headers["retry-after"]
        assert error_of(full)["kind"] == "too_many_sessions"
        assert http.delete(f"/sessions/{third}").json() == {"deleted": third}
        reset(http, messaging_task)
        assert http.get("/health").json()["sessions"] == 2


def test_make_env_names_the_choices() -> None:
    assert "sandbox" in env_kinds()
    assert isinstance(make_env("sandbox"), SandboxEnv)
    with pytest.raises(ValueError, match="sandbox"):
        make_env("holodeck")
    with pytest.raises(ValueError, match="sandbox"):
        create_app("holodeck")


# --------------------------------------------------------------------------- the CLI


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_cli_serves_episodes(messaging_task: Task, tmp_path: Path) -> None:
    qpa = Path(sys.executable).with_name("qpa")
    port = _free_port()
    log = (tmp_path / "serve.log").open("w+")
    process = subprocess.Popen(
        [
            str(qpa),
            "env",
            "serve",
            "--kind",
            "sandbox",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-sessions",
            "8",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # a loaded CI machine imports slowly
        while True:
            assert process.poll() is None, Path(log.name).read_text()
            try:
                health = httpx.get(f"{base}/health", timeout=1).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "qpa env serve did not come up"
                time.sleep(0.1)
        assert health == {
            "status": "ok",
            "kind": "sandbox",
            "sessions": 0,
            "max_sessions": 8,
            "draining": False,
            "channels": ["http", "websocket"],
        }
        for channel in ("websocket", "http"):
            with RemoteEnv(base, channel=channel) as remote:
                trajectory = run_episode(remote, messaging_task, OraclePlanner())
                assert trajectory.success, trajectory.error
                assert remote.transport == channel
    finally:
        process.terminate()
        process.wait(10)
        log.close()
