"""`qpa harness serve` under abuse: the real CLI as a subprocess on 127.0.0.1, with bearer tokens
and a trusted proxy's identity header, its environment fixed to an environment server, and a
memory store on disk the test reads.

What is checked: a request cannot choose the environment (`env_url` is refused and episodes run
in the configured server), memory writes land only in the authenticated caller's memory, an
identity header counts only on a request carrying the proxy's secret (one that bypasses the
proxy is 401 and writes no memory), a task cannot bring its own payment confirmations, and
54 malformed or abusive requests each get a 4xx JSON answer naming the field, never a 5xx, with
the server still serving a good request afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from fakes.openai_server import ChatRequest, FakeOpenAI, Reply, ToolCallReply
from helpers.harness_process import serving

from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import create_app, uvicorn_config
from qpa.envs.tokens import token_hash
from qpa.harness.memory import MemoryStore

SUITE = generate_suite()
TASK = next(t for t in SUITE if t.template == "add_new_contact" and t.split == "test")
MEMORY_TASK = next(t for t in SUITE if t.memory and t.split == "test")
CREATE_ARGS = (TASK.reference_plan or [])[0].arguments  # type: ignore[union-attr]
QPA = str(Path(sys.executable).with_name("qpa"))
PREDICT = "/v1/models/harness:predict"
ALICE = {"authorization": "Bearer alice-secret-token"}
HEADER = "x-qpa-user"
PROXY_SECRET = "proxy-secret-" + "p" * 40
PROXY = {"x-qpa-proxy-secret": PROXY_SECRET}  # what the trusted proxy adds to each request
MAX_BODY = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def env_server() -> Iterator[tuple[str, list[bytes]]]:
    """An environment server in a thread; yields its URL and the reset bodies it received."""
    app = create_app("sandbox")
    resets: list[bytes] = []
    assert app.front is not None
    routes = app.front.routes  # type: ignore[attr-defined]
    original = routes["/reset"]

    async def counting(body: bytes, client: str) -> bytes:
        resets.append(body)
        return await original(body, client)

    routes["/reset"] = counting
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", resets
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def solver(request: ChatRequest) -> Reply:
    """Creates the contact, then finishes once a tool result is in the conversation."""
    if any(m.get("role") == "tool" for m in request.body.get("messages", [])):
        return Reply.calls(ToolCallReply("finish", {"answer": "saved"}))
    return Reply.calls(ToolCallReply("contacts_create", CREATE_ARGS))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("harness")
    tokens = tmp / "tokens.yaml"
    tokens.write_text(f"{token_hash('alice-secret-token')}: alice\n")
    memory = tmp / "memory.sqlite"
    config = tmp / "harness.yaml"
    config.write_text(f"version: harness-sec\nmemory_path: {memory}\n")
    secret = tmp / "proxy-secret"
    secret.write_text(PROXY_SECRET + "\n")
    model = FakeOpenAI(solver)
    with model, env_server() as (env_url, resets):
        port = free_port()
        argv = [
            QPA,
            "harness",
            "serve",
            "--planner",
            "openai",
            "--model-url",
            model.base_url,
            "--harness-config",
            str(config),
            "--env-url",
            env_url,
            "--tokens-file",
            str(tokens),
            "--identity-header",
            HEADER,
            "--proxy-secret-file",
            str(secret),
            "--max-body-bytes",
            str(MAX_BODY),
            "--read-timeout-seconds",
            "2",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(port),
        ]
        with serving(argv, port) as url:
            yield {"url": url, "memory": memory, "resets": resets}


def predict(url: str, body: bytes | None, headers: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{url}{PREDICT}", content=body, headers=headers, timeout=60)


def refusal(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body: dict[str, Any] = response.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    return body


def test_episodes_run_in_the_configured_environment(served: dict[str, Any]) -> None:
    before = len(served["resets"])
    response = predict(served["url"], orjson.dumps({"task_id": TASK.id}), ALICE)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True and body["user_id"] == "alice"
    assert body["memory"] == "persistent" and body["harness_version"] == "harness-sec"
    assert len(served["resets"]) == before + 1  # the episode ran in the env server
    refused = predict(
        served["url"],
        orjson.dumps({"task_id": TASK.id, "env_url": "http://attacker.example/collect"}),
        ALICE,
    )
    assert refused.status_code == 400 and refusal(refused)["field"] == "env_url"
    assert len(served["resets"]) == before + 1  # nothing was sent anywhere


def test_memory_is_written_only_for_the_authenticated_caller(served: dict[str, Any]) -> None:
    url = served["url"]
    other = predict(url, orjson.dumps({"user_id": "bob", "task_id": MEMORY_TASK.id}), ALICE)
    assert other.status_code == 403 and refusal(other)["field"] == "user_id"
    own = predict(url, orjson.dumps({"user_id": "alice", "task_id": MEMORY_TASK.id}), ALICE)
    assert own.status_code == 200, own.text
    via_proxy = predict(url, orjson.dumps({"query": "hello"}), {HEADER: "carol", **PROXY})
    assert via_proxy.status_code == 200 and via_proxy.json()["user_id"] == "carol"
    memory_task = orjson.dumps({"task_id": MEMORY_TASK.id})
    for bypass in ({HEADER: "mallory"}, {HEADER: "mallory", "x-qpa-proxy-secret": "guess"}):
        around = predict(url, memory_task, bypass)  # reached the pod without the proxy
        assert around.status_code == 401, around.text
        assert refusal(around)["field"] == "x-qpa-proxy-secret"
    with MemoryStore(served["memory"]) as store:
        assert store.count("bob") == 0
        assert {m.key for m in MEMORY_TASK.memory} <= set(store.keys("alice"))
        assert "bob" not in store.users() and "mallory" not in store.users()


GOOD = {"task_id": TASK.id}


def _b(value: Any) -> bytes:
    return orjson.dumps(value)


# (name, path, body, headers, status, field)
ABUSE: list[tuple[str, str, bytes | None, dict[str, Any], int, str | None]] = [
    ("no credentials", PREDICT, _b(GOOD), {}, 401, HEADER),
    ("unknown token", PREDICT, _b(GOOD), {"authorization": "Bearer nope"}, 401, "Authorization"),
    (
        "basic auth",
        PREDICT,
        _b(GOOD),
        {"authorization": "Basic YWxpY2U6eA=="},
        401,
        "Authorization",
    ),
    ("empty bearer", PREDICT, _b(GOOD), {"authorization": "Bearer"}, 401, "Authorization"),
    (
        "huge token",
        PREDICT,
        _b(GOOD),
        {"authorization": "Bearer " + "t" * 6000},
        401,
        "Authorization",
    ),
    ("identity with spaces", PREDICT, _b(GOOD), {HEADER: "mallory admin", **PROXY}, 401, HEADER),
    (
        "identity not ascii",
        PREDICT,
        _b(GOOD),
        {HEADER: "m\xe9l".encode("latin-1"), **PROXY},
        401,
        HEADER,
    ),
    ("identity too long", PREDICT, _b(GOOD), {HEADER: "u" * 300, **PROXY}, 401, HEADER),
    ("proxy secret, no identity", PREDICT, _b(GOOD), PROXY, 401, HEADER),
    ("identity without the proxy", PREDICT, _b(GOOD), {HEADER: "alice"}, 401, "x-qpa-proxy-secret"),
    (
        "identity with a guessed proxy secret",
        PREDICT,
        _b(GOOD),
        {HEADER: "alice", "x-qpa-proxy-secret": PROXY_SECRET[:-1]},
        401,
        "x-qpa-proxy-secret",
    ),
    (
        "task brings payment confirmations",
        PREDICT,
        _b({"task": {**TASK.model_dump(mode="json"), "confirmations": ["wallet_send_money"]}}),
        ALICE,
        400,
        "task.confirmations",
    ),
    (
        "confirm not a tool name",
        PREDICT,
        _b({**GOOD, "confirm": ["a b"]}),
        ALICE,
        400,
        "confirm[0]",
    ),
    (
        "confirm a string",
        PREDICT,
        _b({**GOOD, "confirm": "wallet_send_money"}),
        ALICE,
        400,
        "confirm",
    ),
    (
        "NaN inside a task's world",
        PREDICT,
        _b({"task": {**TASK.model_dump(mode="json"), "world": {"w": {"x": 1}}}}).replace(
            b'"x":1', b'"x":NaN'
        ),
        ALICE,
        400,
        "task.world.w.x",
    ),
    (
        "Infinity turns",
        PREDICT,
        b'{"task_id": "%s", "max_turns": Infinity}' % TASK.id.encode(),
        ALICE,
        400,
        "max_turns",
    ),
    ("empty body", PREDICT, b"", ALICE, 400, "body"),
    ("truncated JSON", PREDICT, b'{"query": ', ALICE, 400, "body"),
    ("invalid UTF-8", PREDICT, b'{"query": "\xff\xfe"}', ALICE, 400, "body"),
    ("binary junk", PREDICT, b"\x00\x01\x02", ALICE, 400, "body"),
    ("lone surrogate", PREDICT, b'{"query": "\\ud800"}', ALICE, 400, "body"),
    ("deep nesting", PREDICT, b'{"task": ' + b"[" * 5000 + b"]" * 5000 + b"}", ALICE, 400, "body"),
    ("null body", PREDICT, b"null", ALICE, 400, "body"),
    ("array body", PREDICT, b"[]", ALICE, 400, "body"),
    ("string body", PREDICT, b'"predict"', ALICE, 400, "body"),
    ("empty object", PREDICT, b"{}", ALICE, 400, "query"),
    ("empty query", PREDICT, _b({"query": ""}), ALICE, 400, "query"),
    ("query a number", PREDICT, _b({"query": 5}), ALICE, 400, "query"),
    ("query a list", PREDICT, _b({"query": ["a"]}), ALICE, 400, "query"),
    ("oversized query", PREDICT, _b({"query": "q" * 9000}), ALICE, 400, "query"),
    ("env_url", PREDICT, _b({**GOOD, "env_url": "http://169.254.169.254/"}), ALICE, 400, "env_url"),
    ("env_url null", PREDICT, _b({**GOOD, "env_url": None}), ALICE, 400, "env_url"),
    ("unknown field", PREDICT, _b({**GOOD, "admin": True}), ALICE, 400, "admin"),
    ("other user's id", PREDICT, _b({**GOOD, "user_id": "bob"}), ALICE, 403, "user_id"),
    (
        "proxy user acting for another",
        PREDICT,
        _b({**GOOD, "user_id": "a"}),
        {HEADER: "b", **PROXY},
        403,
        "user_id",
    ),
    ("empty user id", PREDICT, _b({**GOOD, "user_id": ""}), ALICE, 400, "user_id"),
    ("user id with spaces", PREDICT, _b({**GOOD, "user_id": "a b"}), ALICE, 400, "user_id"),
    ("user id unicode", PREDICT, _b({**GOOD, "user_id": "ålice"}), ALICE, 400, "user_id"),
    ("user id 300 chars", PREDICT, _b({**GOOD, "user_id": "a" * 300}), ALICE, 400, "user_id"),
    ("user id a number", PREDICT, _b({**GOOD, "user_id": 42}), ALICE, 400, "user_id"),
    ("unknown task id", PREDICT, _b({"task_id": "ghost.task"}), ALICE, 400, "task_id"),
    ("path traversal task id", PREDICT, _b({"task_id": "../../etc/passwd"}), ALICE, 400, "task_id"),
    ("empty task id", PREDICT, _b({"task_id": ""}), ALICE, 400, "task_id"),
    ("task id a number", PREDICT, _b({"task_id": 7}), ALICE, 400, "task_id"),
    ("task id with NUL", PREDICT, _b({"task_id": "a\x00b"}), ALICE, 400, "task_id"),
    (
        "task and task id",
        PREDICT,
        _b({"task_id": TASK.id, "task": TASK.model_dump(mode="json")}),
        ALICE,
        400,
        "task_id",
    ),
    ("task empty", PREDICT, _b({"task": {}}), ALICE, 400, "task.id"),
    ("task a string", PREDICT, _b({"task": "do it"}), ALICE, 400, "task"),
    (
        "task unknown field",
        PREDICT,
        _b({"task": {**TASK.model_dump(mode="json"), "x": 1}}),
        ALICE,
        400,
        "task.x",
    ),
    (
        "task with unknown apps",
        PREDICT,
        _b({"task": {**TASK.model_dump(mode="json"), "apps": ["nope"]}}),
        ALICE,
        400,
        "task",
    ),
    ("suite with spaces", PREDICT, _b({**GOOD, "suite": "no such suite"}), ALICE, 400, "suite"),
    ("unknown suite", PREDICT, _b({**GOOD, "suite": "nosuchsuite"}), ALICE, 400, "suite"),
    ("zero turns", PREDICT, _b({**GOOD, "max_turns": 0}), ALICE, 400, "max_turns"),
    ("absurd turns", PREDICT, _b({**GOOD, "max_turns": 10**6}), ALICE, 400, "max_turns"),
    ("turns a string", PREDICT, _b({**GOOD, "max_turns": "many"}), ALICE, 400, "max_turns"),
    ("turns a float", PREDICT, _b({**GOOD, "max_turns": 1.5}), ALICE, 400, "max_turns"),
    ("body over the limit", PREDICT, _b({"query": "q" * MAX_BODY}), ALICE, 413, None),
    ("explain route", "/v1/models/harness:explain", _b(GOOD), ALICE, 404, None),
    ("v2 infer route", "/v2/models/harness/infer", _b(GOOD), ALICE, 404, None),
    ("another model", "/v1/models/other:predict", _b(GOOD), ALICE, 404, None),
    ("repository unload", "/v2/repository/models/harness/unload", b"", {}, 404, None),
    ("repository index", "/v2/repository/index", b"{}", {}, 404, None),
]


def test_there_are_at_least_40_abusive_cases() -> None:
    assert len(ABUSE) >= 40


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "field"),
    [case[1:] for case in ABUSE],
    ids=[case[0] for case in ABUSE],
)
def test_abusive_requests_get_4xx_naming_the_field(
    served: dict[str, Any],
    path: str,
    body: bytes | None,
    headers: dict[str, Any],
    status: int,
    field: str | None,
) -> None:
    response = httpx.post(f"{served['url']}{path}", content=body, headers=headers, timeout=30)
    assert response.status_code == status, response.text
    error = refusal(response)
    if field is not None:
        assert error["field"] == field, error


def test_a_chunked_body_over_the_limit_and_a_slow_request_are_refused(
    served: dict[str, Any],
) -> None:
    url = served["url"]
    huge = _b({"query": "q" * MAX_BODY})
    chunked = httpx.post(
        f"{url}{PREDICT}", content=iter([huge[:100], huge[100:]]), headers=ALICE, timeout=30
    )
    assert chunked.status_code == 413 and refusal(chunked)["kind"] == "body_too_large"
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nAuthorization: {ALICE['authorization']}"
        sock.sendall(head.encode() + b"\r\nContent-Length: 99\r\n\r\n{")  # 1 of 99 bytes
        t0 = time.perf_counter()
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        elapsed = time.perf_counter() - t0
    assert received.startswith(b"HTTP/1.1 408") and elapsed < 4.0, (elapsed, received[:80])


def test_the_server_still_serves_after_the_abuse(served: dict[str, Any]) -> None:
    response = predict(served["url"], _b(GOOD), ALICE)
    assert response.status_code == 200, response.text
    assert response.json()["success"] is True
    assert httpx.get(f"{served['url']}/v2/models/harness/ready").status_code == 200


def _harness_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's `/metrics`, read with prometheus_client's own text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("qpa_harness_")
    }


def test_metrics_count_episodes_steps_latency_and_errors_by_kind(served: dict[str, Any]) -> None:
    url = served["url"]
    before = _harness_samples(url)
    assert predict(url, _b(GOOD), ALICE).status_code == 200
    assert predict(url, b"{nope", ALICE).status_code == 400
    assert predict(url, _b(GOOD), {}).status_code == 401
    after = _harness_samples(url)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"model": "harness", **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("qpa_harness_requests_total", code="200") == 1
    assert grew("qpa_harness_requests_total", code="400") == 1
    assert grew("qpa_harness_errors_total", kind="malformed_json") == 1
    assert grew("qpa_harness_errors_total", kind="unauthenticated") == 1
    steps = grew("qpa_harness_steps_total")
    assert steps == 2  # contacts_create, finish
    assert grew("qpa_harness_step_seconds_count") == steps
    assert grew("qpa_harness_step_seconds_bucket", le="+Inf") == steps
    assert grew("qpa_harness_request_seconds_count") == 3
    assert after[("qpa_harness_episodes_in_flight", (("model", "harness"),))] == 0


def test_in_process_predict_applies_the_same_rules(tmp_path: Path) -> None:
    import asyncio

    from qpa.harness.factory import PlannerSpec
    from qpa.harness.serve_config import HarnessServeConfig
    from qpa.harness.server import HarnessModel, kserve

    model = HarnessModel("harness", PlannerSpec("oracle"), config=HarnessServeConfig())
    model.load()
    answer = asyncio.run(model.predict({"user_id": "u-1", "task_id": TASK.id}))
    assert answer["success"] is True and answer["memory"] == "ephemeral"
    with pytest.raises(kserve.errors.InvalidInput, match="env_url"):
        asyncio.run(model.predict({"user_id": "u-1", "task_id": TASK.id, "env_url": "http://x"}))
