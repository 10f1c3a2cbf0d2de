"""The environment server's session channel (`WS /channel`) and `RemoteEnv` over it.

Servers run in background threads with `uvicorn_config` (the configuration `qpa env serve`
uses). What is checked: a rollout over the channel is indistinguishable from one over HTTP (the
same feedback bytes), every request error keeps the HTTP error contract (status and body), the
upgrade is authenticated, a client falls back to HTTP where no channel is offered, and a dropped
connection is reconnected without applying a step twice.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from helpers.uvicorn_thread import serve
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from qpa.contract import MessageUser, Task, ToolCall
from qpa.envs.remote import RemoteEnv, RemoteEnvError
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import CHANNEL_SUBPROTOCOL, create_app, uvicorn_config
from qpa.envs.tokens import TokenTable, token_hash
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

MAX_BODY = 64 * 1024


@contextlib.contextmanager
def serving(**options: Any) -> Iterator[str]:
    app = create_app("sandbox", **options)
    with serve(app, uvicorn_config(app, port=0)) as url:
        yield url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving(max_sessions=64, max_body_bytes=MAX_BODY) as base:
        yield base


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    suite = generate_suite()
    return list(suite[:: max(1, len(suite) // 8)])[:8]


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/channel"


def call(ws: Any, op: str, body: Any) -> tuple[int, Any]:
    """One raw request on the channel: (status, decoded body)."""
    ws.send((op + " ").encode() + (body if isinstance(body, bytes) else orjson.dumps(body)))
    reply = ws.recv()
    status, _, payload = bytes(reply).partition(b" ")
    return int(status), orjson.loads(payload)


def test_rollouts_over_the_channel_match_http(url: str, tasks: list[Task]) -> None:
    for task in tasks:
        trajectories = {}
        for channel in ("websocket", "http"):
            with RemoteEnv(url, channel=channel) as env:
                trajectories[channel] = run_episode(env, task, OraclePlanner())
                assert env.transport == channel
        ws, http = trajectories["websocket"], trajectories["http"]
        assert ws.success and http.success, (task.id, ws.error, http.error)
        assert [s.feedback for s in ws.steps] == [s.feedback for s in http.steps]
        assert ws.verification == http.verification


def test_auto_uses_the_channel_and_the_raw_frames_are_the_http_bodies(
    url: str, tasks: list[Task]
) -> None:
    task = tasks[0]
    with RemoteEnv(url) as env:
        env.reset(task)
        assert env.transport == "websocket"
        assert env.tools() and env.state()
    sid = "channel-raw-session-0000000000000000000000"
    reset_body = {"session_id": sid, "task": task.model_dump(mode="json")}
    with connect(ws_url(url), subprotocols=[CHANNEL_SUBPROTOCOL]) as ws:  # type: ignore[list-item]
        status, reply = call(ws, "reset", reset_body)
        assert status == 200 and reply["session_id"] == sid
        over_http = httpx.post(f"{url}/reset", json=reset_body).json()
        assert over_http["feedback"] == reply["feedback"]
        action = MessageUser(text="hello").model_dump(mode="json")
        status, stepped = call(ws, "step", {"session_id": sid, "seq": 0, "action": action})
        assert status == 200 and stepped["feedback"]["status"] == "ok"
        status, again = call(ws, "step", {"session_id": sid, "seq": 0, "action": action})
        assert (status, again) == (200, stepped)  # a duplicate is answered from the record
        status, health = call(ws, "health", b"{}")
        assert status == 200 and health["channels"] == ["http", "websocket"]
        status, deleted = call(ws, "delete", {"session_id": sid})
        assert (status, deleted) == (200, {"deleted": sid})


def test_request_errors_keep_the_http_contract(url: str, tasks: list[Task]) -> None:
    ghost = "ghost-session-0000000000000000000000000000"
    sid = "channel-errors-session-000000000000000000000"
    with connect(ws_url(url), subprotocols=[CHANNEL_SUBPROTOCOL]) as ws:  # type: ignore[list-item]
        status, body = call(ws, "step", b'{"session_id": ')
        assert status == 400 and body["error"]["kind"] == "malformed_json"
        status, body = call(ws, "step", {"session_id": ghost, "action": {"type": "finish"}})
        assert status == 404 and body["error"]["kind"] == "unknown_session"
        assert body["error"]["field"] == "session_id"
        call(ws, "reset", {"session_id": sid, "task": tasks[0].model_dump(mode="json")})
        bad = {"session_id": sid, "action": {"type": "tool_call", "tool": 7}}
        status, body = call(ws, "step", bad)
        assert status == 422 and body["error"]["field"] == "action.tool"
        status, body = call(ws, "step", {"session_id": sid, "seq": 5, "action": {"type": "finish"}})
        assert status == 409 and body["error"]["field"] == "seq"
        status, body = call(ws, "teleport", {})
        assert status == 400 and body["error"]["kind"] == "unknown_operation"
        assert "step" in body["error"]["message"]
        status, body = call(ws, "step", b"x" * (MAX_BODY + 1))
        assert status == 413 and body["error"]["kind"] == "body_too_large"
        status, body = call(ws, "tools", {"session": sid})
        assert status == 422 and body["error"]["field"] == "session_id"
        # episode errors stay 200 feedback, as over HTTP
        unknown = ToolCall(tool="no_such_tool", arguments={}).model_dump(mode="json")
        status, body = call(ws, "step", {"session_id": sid, "action": unknown})
        assert status == 200 and body["feedback"]["status"] == "error"
        # the channel is still serving
        status, _ = call(ws, "delete", {"session_id": sid})
        assert status == 200


def test_remote_env_maps_channel_errors_as_over_http(url: str, tasks: list[Task]) -> None:
    with RemoteEnv(url, channel="websocket") as env:
        env.reset(tasks[0])
        refused = env.step(ToolCall(tool="x" * 10, arguments={"blob": "y" * MAX_BODY}))
        assert refused.error == "invalid_arguments" and "body_too_large" in (refused.message or "")
        assert env.step(MessageUser(text="still here")).status == "ok"
        with httpx.Client(base_url=url) as http:  # the session vanishes under the client
            assert http.delete(f"/sessions/{env.session_id}").status_code == 200
        lost = env.step(MessageUser(text="anyone?"))
        assert lost.error == "environment_failure" and lost.done
        assert "unknown_session" in (lost.message or "")
        with pytest.raises(RemoteEnvError, match="unknown_session"):
            env.verify()


def test_a_dropped_connection_reconnects_and_applies_the_step_once(
    url: str, tasks: list[Task]
) -> None:
    with RemoteEnv(url, channel="websocket") as env:
        env.reset(tasks[0])
        assert env.step(MessageUser(text="one")).status == "ok"
        channel = env._ws
        assert channel is not None and channel._sock is not None
        channel._sock.shutdown(socket.SHUT_RDWR)  # the network drops the connection
        assert env.step(MessageUser(text="two")).status == "ok"
        assert env.transport == "websocket" and channel.connected  # reconnected
        state = httpx.get(f"{url}/state", params={"session_id": env.session_id}).json()
        assert state["steps"] == 2  # each step applied once
        assert env.step(MessageUser(text="three")).status == "ok"


def test_auto_falls_back_to_http_where_no_channel_is_served(tasks: list[Task]) -> None:
    with serving(channel=False) as base:
        assert httpx.get(f"{base}/health").json()["channels"] == ["http"]
        with RemoteEnv(base) as env:
            trajectory = run_episode(env, tasks[1], OraclePlanner())
            assert trajectory.success, trajectory.error
            assert env.transport == "http" and env.channel == "http"
        with RemoteEnv(base, channel="websocket") as env, pytest.raises(RemoteEnvError) as refused:
            env.reset(tasks[1])  # the channel was demanded: no silent fallback
        assert "refused the session channel" in str(refused.value)
        assert refused.value.status == 403


def test_the_upgrade_is_authenticated_and_sessions_stay_with_their_owner(
    tmp_path: Path, tasks: list[Task]
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"{token_hash('alpha-token')}: alpha\n{token_hash('beta-token')}: beta\n")
    with serving(tokens=TokenTable(path)) as base:
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url(base), subprotocols=[CHANNEL_SUBPROTOCOL])  # type: ignore[list-item]
        assert refused.value.response.status_code == 401
        assert orjson.loads(refused.value.response.body)["error"]["field"] == "Authorization"
        with RemoteEnv(base, token="alpha-token") as alpha:
            assert alpha.reset(tasks[0]).status == "ok"
            assert alpha.transport == "websocket"
            with RemoteEnv(base, token="beta-token", session_id=alpha.session_id) as beta:
                beta._active = True  # beta claims alpha's session id without resetting it
                stolen = beta.step(MessageUser(text="hi"))
                assert stolen.error == "environment_failure"
                assert "unknown_session" in (stolen.message or "")
            assert alpha.step(MessageUser(text="mine")).status == "ok"
        with RemoteEnv(base, token="wrong-token") as stranger:
            answer = stranger.reset(tasks[0])
            assert answer.status == "error" and "unauthenticated" in (answer.message or "")


def test_the_subprotocol_is_required(url: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(url))
    assert refused.value.response.status_code == 400
    error = orjson.loads(refused.value.response.body)["error"]
    assert error["kind"] == "unsupported_subprotocol"
    assert error["field"] == "Sec-WebSocket-Protocol"
