"""`qpa env serve` under abuse: abandoned sessions, idle eviction, slow clients, bearer tokens and
malformed requests, over real HTTP on 127.0.0.1 (servers in background threads, run with the
same uvicorn configuration `serve` uses).

Two clients are told apart by their peer address: the second binds its side of the connection
to 127.0.0.2 (any 127/8 address is the loopback on Linux).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from helpers.uvicorn_thread import serve

from qpa.contract import Task
from qpa.envs.remote import RemoteEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import create_app, uvicorn_config
from qpa.envs.tokens import AuthError, TokenFileError, TokenTable, token_hash
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

TASK: Task = next(
    t for t in generate_suite() if "messaging_send" in t.tools and "contacts_search" in t.tools
)
TASK_JSON = TASK.model_dump(mode="json")
GHOST = "ghost-session-0000000000000000000000000000"
MAX_BODY = 64 * 1024


@contextlib.contextmanager
def serving(read_timeout_s: float = 15.0, **options: Any) -> Iterator[str]:
    app = create_app("sandbox", **options)
    with serve(None, uvicorn_config(app, read_timeout_s=read_timeout_s)) as url:
        yield url


def client(base: str, source: str = "127.0.0.1", **headers: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=base, timeout=10, transport=transport, headers=headers)


def reset(http: httpx.Client, session_id: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"task": TASK_JSON}
    if session_id is not None:
        body["session_id"] = session_id
    return http.post("/reset", content=orjson.dumps(body))


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["kind"] and error["message"]
    return error


def finish(http: httpx.Client, sid: str) -> httpx.Response:
    return http.post(
        "/step", content=orjson.dumps({"session_id": sid, "action": {"type": "finish"}})
    )


# --------------------------------------------------------------------------- session limits


def test_a_thousand_abandoned_sessions_do_not_block_a_new_client() -> None:
    with (
        serving(max_sessions=1024) as base,
        client(base) as hog,
        client(base, "127.0.0.2") as newcomer,
    ):
        started = time.perf_counter()
        abandoned = []
        for _ in range(1024):
            response = reset(hog)
            assert response.status_code == 200, response.text
            abandoned.append(response.json()["session_id"])
        assert len(set(abandoned)) == 1024 and all(len(s) >= 43 for s in abandoned)
        assert hog.get("/health").json()["sessions"] == 1024
        more = reset(hog)  # the hog, holding every slot, gives up its own oldest idle session
        assert more.status_code == 200, more.text
        own = finish(hog, abandoned[0])
        assert own.status_code == 404 and error_of(own)["kind"] == "session_evicted"
        assert hog.get("/health").json()["sessions"] == 1024
        t0 = time.perf_counter()
        fresh = reset(newcomer)  # ... while a new client gets a slot at once
        answered = time.perf_counter() - t0
        assert fresh.status_code == 200, fresh.text
        assert answered < 1.0
        sid = fresh.json()["session_id"]
        assert finish(newcomer, sid).status_code == 200
        evicted = abandoned[1]  # the hog's least recently used session gave its slot
        gone = finish(hog, evicted)
        assert gone.status_code == 404 and error_of(gone)["kind"] == "session_evicted"
        assert finish(hog, abandoned[-1]).status_code == 200
        print(f"1024 resets in {time.perf_counter() - started:.2f}s; newcomer in {answered:.3f}s")


def test_a_client_at_its_own_limit_replaces_its_own_oldest_idle_session() -> None:
    """At its limit a client's new session takes the slot of its own least recently used one
    (idle: no request in flight), never another client's; 429 is for a client whose sessions
    are all busy (`tests/unit/envs/test_session_store.py`)."""
    with (
        serving(max_sessions=64, max_sessions_per_client=8) as base,
        client(base) as a,
        client(base, "127.0.0.2") as b,
    ):
        theirs = [reset(b).json()["session_id"] for _ in range(8)]
        sids = [reset(a).json()["session_id"] for _ in range(8)]
        assert reset(a, sids[0]).status_code == 200  # restarting one of its own takes no slot
        over = reset(a)  # sids[0] was just used: sids[1] is a's least recently used
        assert over.status_code == 200, over.text
        assert error_of(finish(a, sids[1]))["kind"] == "session_evicted"
        assert reset(a).status_code == 200
        assert error_of(finish(a, sids[2]))["kind"] == "session_evicted"
        for sid in (sids[0], *sids[3:]):
            assert finish(a, sid).status_code == 200
        for sid in theirs:  # the other client lost nothing
            assert finish(b, sid).status_code == 200
        assert a.get("/health").json()["sessions"] == 16


def metric(base: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    want = {"kind": "sandbox", **labels}
    text = httpx.get(f"{base}/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels == want
    )


def test_capacity_held_by_live_sessions_answers_503_with_retry_after_and_is_counted() -> None:
    """One session from each of many addresses fills the server: a new client is told when to
    come back (the header, and `retry_after_s` for the session channel), the refusal is
    counted, and once a session has been idle `evict_idle_s` the newcomer is served."""
    with serving(max_sessions=4, evict_idle_s=0.5) as base:
        holders = [client(base, f"127.0.0.{i}") for i in range(2, 6)]
        try:
            held = [reset(h).json()["session_id"] for h in holders]
            with client(base, "127.0.0.6") as newcomer:
                full = reset(newcomer)
                assert full.status_code == 503 and full.headers["retry-after"] == "1"
                error = error_of(full)
                assert error["kind"] == "too_many_sessions" and error["retry_after_s"] == 1
                assert metric(base, "qpa_env_sessions_refused_total", reason="full") == 1
                assert metric(base, "qpa_env_sessions_refused_total", reason="client_busy") == 0
                with RemoteEnv(base) as remote:  # reported as a transient failure
                    feedback = remote.reset(TASK)
                    assert feedback.error == "transient"
                    assert "too_many_sessions" in (feedback.message or "")
                assert metric(base, "qpa_env_sessions_refused_total", reason="full") >= 2
                time.sleep(0.6)
                assert finish(holders[1], held[1]).status_code == 200  # used again: not LRU
                assert reset(newcomer).status_code == 200  # the oldest idle one gave its slot
                assert error_of(finish(holders[0], held[0]))["kind"] == "session_evicted"
                assert finish(holders[1], held[1]).status_code == 200
        finally:
            for h in holders:
                h.close()


def test_idle_sessions_give_their_slots_least_recently_used_first() -> None:
    with serving(max_sessions=4) as base, client(base) as http:
        sids = [reset(http).json()["session_id"] for _ in range(4)]
        assert finish(http, sids[0]).status_code == 200  # sids[0] is used again: sids[1] is LRU
        assert reset(http).status_code == 200
        assert error_of(finish(http, sids[1]))["kind"] == "session_evicted"
        assert reset(http).status_code == 200  # next LRU: sids[2]
        assert error_of(finish(http, sids[2]))["kind"] == "session_evicted"
        assert finish(http, sids[0]).status_code == 200
        assert finish(http, sids[3]).status_code == 200
        assert http.get("/health").json()["sessions"] == 4


# --------------------------------------------------------------------------- slow clients


def raw(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def closed_after(sock: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closes the connection, and what it sent before."""
    t0 = time.perf_counter()
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return time.perf_counter() - t0, received


@pytest.mark.parametrize(
    "partial",
    [
        b"",  # connect and say nothing
        b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Le",  # half the headers
        b'POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"task": ',  # half a body
    ],
    ids=["silent", "half-headers", "half-body"],
)
def test_a_half_sent_request_is_cut_off_within_the_timeout(partial: bytes) -> None:
    timeout = 0.5
    with serving(read_timeout_s=timeout) as base:
        with raw(base) as sock:
            sock.sendall(partial)
            elapsed, received = closed_after(sock)
        assert timeout * 0.8 <= elapsed < timeout + 1.0, elapsed
        assert received.startswith(b"HTTP/1.1 408"), received[:80]
        assert b"request_timeout" in received
        with client(base) as http:  # the server still serves
            assert reset(http).status_code == 200


def test_a_slow_but_steady_request_within_the_timeout_is_served() -> None:
    with serving(read_timeout_s=2.0) as base:
        body = orjson.dumps({"task": TASK_JSON})
        head = f"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with raw(base) as sock:
            sock.sendall(head)
            time.sleep(0.3)
            sock.sendall(body)
            reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_keep_alive_connections_get_a_fresh_deadline_per_request() -> None:
    with serving(read_timeout_s=0.5) as base, client(base) as http:
        for _ in range(3):  # one connection, requests spread over more than the timeout
            assert http.get("/health").status_code == 200
            time.sleep(0.3)


# --------------------------------------------------------------------------- bearer tokens


def test_tokens_identify_clients_and_bind_sessions(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"{token_hash('alpha-token')}: alpha\n{token_hash('beta-token')}: beta\n")
    tokens = TokenTable(path)
    assert len(tokens) == 2
    with serving(tokens=tokens) as base:
        with client(base) as anonymous:
            assert anonymous.get("/health").status_code == 200  # probes need no token
            denied = reset(anonymous)
            assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
            assert error_of(denied)["field"] == "Authorization"
        for header in ("Bearer wrong", "Basic YWxwaGE=", "Bearer", "Bearer " + "x" * 5000):
            with client(base, authorization=header) as bad:
                response = reset(bad)
                assert response.status_code == 401, (header[:20], response.text)
                assert error_of(response)["field"] == "Authorization"
        with (
            client(base, authorization="Bearer alpha-token") as alpha,
            client(base, authorization="Bearer beta-token") as beta,
        ):
            sid = reset(alpha).json()["session_id"]
            assert finish(alpha, sid).status_code == 200
            stolen = finish(beta, sid)  # another client does not find the session at all
            assert stolen.status_code == 404 and error_of(stolen)["kind"] == "unknown_session"
            assert beta.get("/state", params={"session_id": sid}).status_code == 404
            assert beta.delete(f"/sessions/{sid}").status_code == 404
            taken = reset(beta, sid)  # another client's id: 404, as if it never existed
            assert taken.status_code == 404 and error_of(taken)["field"] == "session_id"
            never = finish(beta, GHOST)
            assert error_of(taken)["kind"] == error_of(never)["kind"] == "unknown_session"
            assert error_of(taken)["message"] == error_of(never)["message"].replace(GHOST, sid)
            assert alpha.get("/state", params={"session_id": sid}).status_code == 200
            assert alpha.delete(f"/sessions/{sid}").status_code == 200
            gone = finish(beta, sid)  # ... nor does beta learn that alpha's session is gone
            assert error_of(gone)["kind"] == "unknown_session"
            assert error_of(finish(alpha, sid))["kind"] == "unknown_session"  # deleted: unknown
        with RemoteEnv(base, token="beta-token") as remote:
            assert run_episode(remote, TASK, OraclePlanner()).success


def test_tokens_file_errors_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("plaintext-token: alice\n")
    with pytest.raises(TokenFileError, match="sha256"):
        TokenTable(path)
    path.write_text(f"{token_hash('t')}: 'has spaces'\n")
    with pytest.raises(TokenFileError, match="identity"):
        TokenTable(path)
    with pytest.raises(TokenFileError, match="cannot read"):
        TokenTable(tmp_path / "missing.yaml")
    path.write_text(f"{token_hash('t')}: alice\n")
    table = TokenTable(path)
    assert table.identity("Bearer t") == "alice"
    with pytest.raises(AuthError):
        table.identity(None)


# --------------------------------------------------------------------------- malformed requests

VALID_STEP = {"session_id": GHOST, "action": {"type": "finish"}}


def _with(**changes: Any) -> bytes:
    return orjson.dumps({**VALID_STEP, **changes})


def _task(**changes: Any) -> bytes:
    return orjson.dumps({"task": {**TASK_JSON, **changes}})


# (name, method, path, body, status, field)
MALFORMED: list[tuple[str, str, str, bytes | None, int, str | None]] = [
    ("empty body", "POST", "/reset", b"", 400, None),
    ("truncated JSON", "POST", "/reset", b'{"task": {', 400, None),
    ("not JSON", "POST", "/step", b"hello", 400, None),
    ("invalid UTF-8", "POST", "/step", b'{"session_id": "\xff\xfe"}', 400, None),
    ("NaN literal", "POST", "/step", b'{"session_id": NaN}', 422, "session_id"),
    ("binary junk", "POST", "/verify", b"\x00\x01\x02\x03", 400, None),
    ("lone surrogate", "POST", "/verify", b'{"session_id": "\\ud800"}', 400, None),
    ("null body", "POST", "/reset", b"null", 422, None),
    ("array body", "POST", "/reset", b"[]", 422, None),
    ("string body", "POST", "/step", b'"step"', 422, None),
    ("number body", "POST", "/verify", b"42", 422, None),
    ("no task", "POST", "/reset", b"{}", 422, "task"),
    ("task is a number", "POST", "/reset", b'{"task": 5}', 422, "task"),
    ("task is empty", "POST", "/reset", b'{"task": {}}', 422, "task.id"),
    ("task id wrong type", "POST", "/reset", _task(id=["x"]), 422, "task.id"),
    ("task apps wrong type", "POST", "/reset", _task(apps="contacts"), 422, "task.apps"),
    ("task unknown field", "POST", "/reset", _task(backdoor=True), 422, "task.backdoor"),
    (
        "reset names an env_url",
        "POST",
        "/reset",
        orjson.dumps({"task": TASK_JSON, "env_url": "http://evil.example"}),
        422,
        "env_url",
    ),
    (
        "short session id",
        "POST",
        "/reset",
        orjson.dumps({"task": TASK_JSON, "session_id": "s1"}),
        422,
        "session_id",
    ),
    (
        "unicode session id",
        "POST",
        "/reset",
        orjson.dumps({"task": TASK_JSON, "session_id": "é" * 40}),
        422,
        "session_id",
    ),
    (
        "session id of 200 chars",
        "POST",
        "/reset",
        orjson.dumps({"task": TASK_JSON, "session_id": "a" * 200}),
        422,
        "session_id",
    ),
    ("session id is a number", "POST", "/step", _with(session_id=12345), 422, "session_id"),
    ("session id is null", "POST", "/verify", b'{"session_id": null}', 422, "session_id"),
    ("session id with slash", "POST", "/verify", _with(session_id="../" * 12), 422, "session_id"),
    ("no session id", "POST", "/step", b'{"action": {"type": "finish"}}', 422, "session_id"),
    ("no action", "POST", "/step", orjson.dumps({"session_id": GHOST}), 422, "action"),
    ("unknown action type", "POST", "/step", _with(action={"type": "teleport"}), 422, "action"),
    ("action is a string", "POST", "/step", _with(action="finish"), 422, "action"),
    (
        "tool call arguments a string",
        "POST",
        "/step",
        _with(action={"type": "tool_call", "tool": "contacts_search", "arguments": "q"}),
        422,
        "action.arguments",
    ),
    (
        "tool call without a tool",
        "POST",
        "/step",
        _with(action={"type": "tool_call", "arguments": {}}),
        422,
        "action.tool",
    ),
    ("negative seq", "POST", "/step", _with(seq=-1), 422, "seq"),
    ("seq a string", "POST", "/step", _with(seq="first"), 422, "seq"),
    ("seq a float", "POST", "/step", _with(seq=1.5), 422, "seq"),
    (
        "seq huge",
        "POST",
        "/step",
        b'{"session_id": "%s", "action": {"type": "finish"}, "seq": 1e400}' % GHOST.encode(),
        422,
        "seq",
    ),
    ("step extra field", "POST", "/step", _with(admin=True), 422, "admin"),
    (
        "NaN inside a world",
        "POST",
        "/reset",
        _task(world={"wallet": {"balance": 5}}).replace(b'"balance":5', b'"balance":NaN'),
        422,
        "task.world.wallet.balance",
    ),
    (
        "Infinity in a world's list",
        "POST",
        "/reset",
        _task(world={"notes": {"items": [1, 2]}}).replace(b"[1,2]", b"[1,Infinity]"),
        422,
        "task.world.notes.items[1]",
    ),
    (
        "-Infinity in tool arguments",
        "POST",
        "/step",
        _with(
            action={"type": "tool_call", "tool": "wallet_send_money", "arguments": {"a": 1}}
        ).replace(b'"a":1', b'"a":-Infinity'),
        422,
        "action.arguments.a",
    ),
    (
        "1e400 in tool arguments",
        "POST",
        "/step",
        _with(
            action={"type": "tool_call", "tool": "wallet_send_money", "arguments": {"a": 1}}
        ).replace(b'"a":1', b'"a":1e400'),
        422,
        "action.arguments.a",
    ),
    ("unknown session step", "POST", "/step", _with(), 404, "session_id"),
    (
        "unknown session verify",
        "POST",
        "/verify",
        orjson.dumps({"session_id": GHOST}),
        404,
        "session_id",
    ),
    ("state without id", "GET", "/state", None, 422, "session_id"),
    ("state short id", "GET", "/state?session_id=abc", None, 422, "session_id"),
    ("state NUL id", "GET", "/state?session_id=%00" + "a" * 40, None, 422, "session_id"),
    ("tools unknown id", "GET", f"/tools?session_id={GHOST}", None, 404, "session_id"),
    ("delete short id", "DELETE", "/sessions/short", None, 422, "session_id"),
    ("delete unknown id", "DELETE", f"/sessions/{GHOST}", None, 404, "session_id"),
    ("unknown route", "GET", "/admin", None, 404, None),
    ("wrong method", "PUT", "/reset", b"{}", 405, None),
    ("get on step", "GET", "/step", None, 405, None),
    ("body over the limit", "POST", "/reset", b'{"task": "' + b"x" * MAX_BODY + b'"}', 413, None),
    ("deep nesting", "POST", "/reset", b'{"task": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None),
]


@pytest.fixture(scope="module")
def abused() -> Iterator[str]:
    with serving(max_sessions=16, max_body_bytes=MAX_BODY) as base:
        yield base


def test_there_are_at_least_40_malformed_cases() -> None:
    assert len(MALFORMED) >= 40


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_requests_get_4xx_naming_the_field(
    abused: str, method: str, path: str, body: bytes | None, status: int, field: str | None
) -> None:
    with client(abused) as http:
        response = http.request(method, path, content=body)
        assert response.status_code == status, response.text
        error = error_of(response)
        if field is not None:
            assert error.get("field") == field, error
        served = reset(http)  # and the server still serves
        assert served.status_code == 200, served.text
        assert http.delete(f"/sessions/{served.json()['session_id']}").status_code == 200


def test_a_chunked_body_over_the_limit_is_refused(abused: str) -> None:
    with client(abused) as http:
        huge = b'{"task": "' + b"x" * MAX_BODY + b'"}'
        response = http.post("/reset", content=iter([huge[:100], huge[100:]]))
        assert "content-length" not in response.request.headers
        assert response.status_code == 413 and error_of(response)["kind"] == "body_too_large"
