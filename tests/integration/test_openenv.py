"""OpenEnv's own client (`openenv-core`) drives `qpa env serve` over real WebSockets on 127.0.0.1.

The server is qpa's (`create_app` served by uvicorn with `serve`'s configuration, and once the
real `qpa env serve` CLI); the clients are OpenEnv's `EnvClient` subclass `QpaEnv` and OpenEnv's
`GenericEnvClient` (plain dictionaries, no qpa code on the client side). What is checked: the
oracle's plan run through OpenEnv gets the same feedback and verification as in-process and the
reward says whether it succeeded; state and close reach the server's own session store (one
engine: the socket's session is visible to qpa's HTTP API and freed on close or disconnect); the
published types are what `/schema` serves and what OpenEnv's runtime validator reads; every bad
message gets an OpenEnv error naming the field, and the connection keeps working.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import websockets.sync.client
from helpers.uvicorn_thread import serve
from openenv.cli._validation import validate_running_environment
from openenv.core import GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import Action as OpenEnvAction
from openenv.core.env_server.types import Observation as OpenEnvObservation
from openenv.core.env_server.types import State as OpenEnvState

from qpa.contract import Feedback, Finish, Step, Task, ToolCall
from qpa.envs.openenv_client import QpaAction, QpaEnv, QpaObservation, QpaState
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import create_app, uvicorn_config
from qpa.envs.tokens import TokenTable
from qpa.harness.planners import GreedyWrongPlanner, OraclePlanner, Planner
from qpa.harness.runner import run_episode

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app("sandbox", max_sessions=8, max_body_bytes=MAX_BODY)


@pytest.fixture(scope="module")
def url(app: Any) -> Iterator[str]:
    with serve(None, uvicorn_config(app)) as base:
        yield base


@pytest.fixture(scope="module")
def tasks() -> tuple[Task, ...]:
    return generate_suite()


@pytest.fixture(scope="module")
def grounded_task(tasks: tuple[Task, ...]) -> Task:
    """A task whose plan refers to earlier results (`${i.path}`): the oracle must read them."""
    return next(t for t in tasks if t.reference_plan and "${" in str(t.reference_plan))


@pytest.fixture
def env(url: str) -> Iterator[Any]:
    with QpaEnv(base_url=url).sync() as client:
        yield client


def feedback_of(result: StepResult[QpaObservation]) -> Feedback:
    o = result.observation
    return Feedback(
        status=o.status,
        observation=o.observation,
        error=o.error,
        message=o.message,
        done=result.done,
    )


def drive(env: Any, task: Task, planner: Planner) -> list[StepResult[QpaObservation]]:
    """A planner's episode through an OpenEnv client: reset, then steps until done."""
    first = env.reset(task=task)
    assert first.observation.tools, "the reset observation lists the episode's tools"
    planner.start(task, first.observation.tools, feedback_of(first))
    results: list[StepResult[QpaObservation]] = []
    last: Step | None = None
    for index in range(64):
        decision = planner.decide(last)
        result = env.step(QpaAction(action=decision.action))
        results.append(result)
        last = Step(index=index, action=decision.action, feedback=feedback_of(result))
        if result.done:
            return results
    raise AssertionError("the episode did not finish in 64 steps")


def sessions(url: str) -> int:
    count: int = httpx.get(f"{url}/health", timeout=5).json()["sessions"]
    return count


def wait_for_sessions(url: str, expected: int) -> None:
    """The server frees a socket's session when it sees the close (a moment after the client)."""
    deadline = time.monotonic() + 5
    while sessions(url) != expected:
        assert time.monotonic() < deadline, f"sessions stayed {sessions(url)}, not {expected}"
        time.sleep(0.02)


# --------------------------------------------------------------------------- episodes


def test_types_are_openenv_types() -> None:
    assert issubclass(QpaAction, OpenEnvAction)
    assert issubclass(QpaObservation, OpenEnvObservation)
    assert issubclass(QpaState, OpenEnvState)
    action = QpaAction(action=ToolCall(tool="contacts_search", arguments={"query": "Lena"}))
    assert action.model_dump(mode="json") == {
        "action": {
            "type": "tool_call",
            "tool": "contacts_search",
            "arguments": {"query": "Lena"},
            "call_id": None,
        },
        "metadata": {},
    }


def test_oracle_episode_matches_in_process(env: Any, url: str, grounded_task: Task) -> None:
    local_env = SandboxEnv()
    local = run_episode(local_env, grounded_task, OraclePlanner())
    assert local.success and local.verification is not None

    results = drive(env, grounded_task, OraclePlanner())

    assert [feedback_of(r) for r in results] == [s.feedback for s in local.steps]
    assert [r.reward for r in results[:-1]] == [None] * (len(results) - 1)
    final = results[-1]
    assert final.done and final.reward == 1.0 and final.observation.reward == 1.0
    assert final.observation.verification == local.verification
    state = env.state()
    assert isinstance(state, QpaState)
    assert state.step_count == len(results)
    assert state.task_id == grounded_task.id and state.finished is True
    assert state.episode_id == state.session_id and state.session_id
    assert state.state == local_env.state()  # the phone's state after the same plan
    assert env.verify() == local.verification  # qpa's verify message, any time
    assert [t.name for t in env.tools()] == [t.name for t in local.tools]
    after = env.step(Finish())  # past the end: an episode error, no second reward
    assert after.observation.status == "error" and after.reward is None
    assert after.observation.verification is None
    assert sessions(url) == 1
    env.close()
    wait_for_sessions(url, 0)


def test_failed_plan_is_rewarded_zero(env: Any, grounded_task: Task) -> None:
    results = drive(env, grounded_task, GreedyWrongPlanner())
    final = results[-1]
    assert final.reward == 0.0
    verification = final.observation.verification
    assert verification is not None and not verification.success
    assert any(not check.passed for check in verification.checks)


def test_generic_client_needs_no_qpa_code(url: str, tasks: tuple[Task, ...]) -> None:
    """OpenEnv's GenericEnvClient with JSON-shaped dicts only: reset, step, state, close."""
    task = next(t for t in tasks if t.reference_plan and "${" not in str(t.reference_plan))
    assert task.reference_plan is not None
    plan = [orjson.loads(orjson.dumps(a.model_dump(mode="json"))) for a in task.reference_plan]
    with GenericEnvClient(base_url=url).sync() as generic:
        first = generic.reset(task=task.model_dump(mode="json"), episode_id="generic-1")
        assert first.done is False and first.reward is None
        assert {tool["name"] for tool in first.observation["tools"]} >= set(task.tools)
        for action in plan:
            result = generic.step({"action": action})
            assert result.observation["status"] == "ok", result.observation
        assert result.done and result.reward == 1.0
        assert result.observation["verification"]["success"] is True
        state = generic.state()
        assert state["episode_id"] == "generic-1" and state["step_count"] == len(plan)
        assert sessions(url) == 1
    wait_for_sessions(url, 0)


def test_reset_restarts_the_episode_in_the_same_session(env: Any, grounded_task: Task) -> None:
    drive(env, grounded_task, OraclePlanner())
    first = env.state()
    results = drive(env, grounded_task, OraclePlanner())
    assert results[-1].reward == 1.0  # the world started over: the plan succeeds again
    second = env.state()
    assert second.session_id == first.session_id and second.step_count == len(results)


def test_one_engine_with_qpa_http_api(env: Any, url: str, grounded_task: Task) -> None:
    """The socket's session is an ordinary session: qpa's HTTP routes reach it by its id."""
    env.reset(task=grounded_task)
    session_id = env.state().session_id
    with httpx.Client(base_url=url, timeout=5) as http:
        state = http.get("/state", params={"session_id": session_id})
        assert state.status_code == 200 and state.json()["task_id"] == grounded_task.id
        verify = http.post("/verify", content=orjson.dumps({"session_id": session_id}))
        assert verify.status_code == 200 and verify.json()["success"] is False
        metrics = http.get("/metrics").text
        assert 'qpa_env_sessions_in_use{kind="sandbox"} 1.0' in metrics
        deleted = http.delete(f"/sessions/{session_id}")
        assert deleted.status_code == 200
    with pytest.raises(RuntimeError, match=r"no session .*\(code: SESSION_ERROR\)"):
        env.step(Finish())


def test_disconnect_without_close_frees_the_session(url: str, grounded_task: Task) -> None:
    with websockets.sync.client.connect(url.replace("http", "ws") + "/ws") as raw:
        raw.send(orjson.dumps({"type": "reset", "data": {"task": grounded_task.model_dump()}}))
        assert orjson.loads(raw.recv())["type"] == "observation"
        assert sessions(url) == 1
    wait_for_sessions(url, 0)


# --------------------------------------------------------------------------- published types


def test_schema_and_metadata_are_what_openenv_reads(url: str) -> None:
    schema = httpx.get(f"{url}/schema", timeout=5).json()
    for published, cls in (
        ("action", QpaAction),
        ("observation", QpaObservation),
        ("state", QpaState),
    ):
        assert set(schema[published]["properties"]) == set(cls.model_json_schema()["properties"])
    assert "tool_call" in orjson.dumps(schema["action"]).decode()

    report = validate_running_environment(url)
    passed = {c["id"]: c["passed"] for c in report["criteria"]}
    for criterion in (
        "openapi_version_available",
        "metadata_endpoint",
        "schema_endpoint",
        "mode_endpoint_consistency",
    ):
        assert passed[criterion], (criterion, report)
    assert report["mode"] == "simulation"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("message", "code", "field", "text"),
    [
        (
            {"type": "step", "data": {"action": {"type": "tool_call", "tool": 7}}},
            "VALIDATION_ERROR",
            "action.tool",
            "field 'action.tool'",
        ),
        (
            {"type": "step", "data": {"action": {"type": "jump"}}},
            "VALIDATION_ERROR",
            "action",
            "field 'action'",
        ),
        (
            {"type": "step", "data": {"type": "tool_call", "tool": "x"}},
            "VALIDATION_ERROR",
            "action",
            "missing field 'action'",
        ),
        ({"type": "step"}, "VALIDATION_ERROR", "data", "missing field 'data'"),
        ({"type": "reset", "data": {}}, "VALIDATION_ERROR", "task", "missing field 'task'"),
        (
            {"type": "reset", "data": {"task": {"id": "t"}}},
            "VALIDATION_ERROR",
            "task.domain",
            "missing field 'task.domain'",
        ),
        (
            {"type": "reset", "data": {"task": None, "seed": 3}},
            "VALIDATION_ERROR",
            "seed",
            "unexpected field 'seed'",
        ),
        ({"type": "jump"}, "UNKNOWN_TYPE", "type", "unknown message type 'jump'"),
        ({"type": "state", "data": {"x": 1}}, "VALIDATION_ERROR", "data", "field 'data'"),
        ({"data": {}}, "VALIDATION_ERROR", "type", "missing field 'type'"),
    ],
)
def test_bad_messages_name_the_field(
    url: str,
    grounded_task: Task,
    message: dict[str, Any],
    code: str,
    field: str,
    text: str,
) -> None:
    with websockets.sync.client.connect(url.replace("http", "ws") + "/ws") as raw:
        task = grounded_task.model_dump(mode="json")
        if message.get("type") == "step":
            raw.send(orjson.dumps({"type": "reset", "data": {"task": task}}))
            assert orjson.loads(raw.recv())["type"] == "observation"
        raw.send(orjson.dumps(message))
        error = orjson.loads(raw.recv())
        assert error["type"] == "error", error
        assert error["data"]["code"] == code, error
        assert error["data"]["field"] == field, error
        assert text in error["data"]["message"], error
        # the connection keeps serving: an episode still starts
        raw.send(orjson.dumps({"type": "reset", "data": {"task": task}}))
        assert orjson.loads(raw.recv())["type"] == "observation"


def test_openenv_clients_raise_the_named_field(url: str, env: Any, grounded_task: Task) -> None:
    """Through OpenEnv's clients an error becomes their RuntimeError, with qpa's message."""
    with pytest.raises(RuntimeError, match=r"no episode on this connection.*SESSION_ERROR"):
        env.step(Finish())
    with pytest.raises(RuntimeError, match=r"field 'task.instruction'.*VALIDATION_ERROR"):
        env.reset(task={**grounded_task.model_dump(mode="json"), "instruction": ""})
    with GenericEnvClient(base_url=url).sync() as generic:
        generic.reset(task=grounded_task.model_dump(mode="json"))
        with pytest.raises(RuntimeError, match=r"missing field 'action.tool'.*VALIDATION_ERROR"):
            generic.step({"action": {"type": "tool_call", "arguments": {}}})
        with pytest.raises(RuntimeError, match=r"field 'action.arguments'"):
            generic.step({"action": {"type": "tool_call", "tool": "x", "arguments": []}})
        assert generic.step({"action": {"type": "finish"}}).done  # still serving


def test_malformed_json_and_oversized_messages(url: str, grounded_task: Task) -> None:
    with websockets.sync.client.connect(url.replace("http", "ws") + "/ws") as raw:
        raw.send("{not json")
        error = orjson.loads(raw.recv())
        assert error["type"] == "error" and error["data"]["code"] == "INVALID_JSON", error
        raw.send(orjson.dumps({"type": "reset", "data": {"task": "x" * (MAX_BODY + 1)}}))
        error = orjson.loads(raw.recv())
        assert error["data"]["kind"] == "body_too_large", error
        assert str(MAX_BODY) in error["data"]["message"]
        raw.send(orjson.dumps({"type": "reset", "data": {"task": grounded_task.model_dump()}}))
        assert orjson.loads(raw.recv())["type"] == "observation"


def test_full_and_draining_servers_answer_capacity_errors(grounded_task: Task) -> None:
    """The store's limits hold for OpenEnv sessions: a full server first evicts the caller's
    own idle session (both clients here are one address), and a draining one refuses a new
    episode with OpenEnv's CAPACITY_REACHED while a live episode keeps stepping."""
    app = create_app("sandbox", max_sessions=1)
    with (
        serve(None, uvicorn_config(app)) as base,
        QpaEnv(base_url=base).sync() as first,
        QpaEnv(base_url=base).sync() as second,
    ):
        empty = first.state()  # before any reset: an empty state, no session taken
        assert empty.step_count == 0 and empty.session_id is None and sessions(base) == 0
        first.reset(task=grounded_task)
        second.reset(task=grounded_task)  # the same client's idle session makes room
        assert sessions(base) == 1
        app.state.service.draining = True
        with pytest.raises(RuntimeError, match=r"draining.*CAPACITY_REACHED"):
            second.reset(task=grounded_task)  # no new episode, not even a restart
        assert second.step(Finish()).done  # the live episode finishes
        app.state.service.draining = False


def test_client_refuses_what_is_not_an_action() -> None:
    with pytest.raises(TypeError, match="QpaAction or a qpa Action, not dict"):
        QpaEnv(base_url="http://127.0.0.1:9")._step_payload({"type": "finish"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- tokens, CLI


def test_bearer_tokens_on_the_handshake(grounded_task: Task) -> None:
    app = create_app("sandbox", tokens=TokenTable.of({"alpha-token": "alpha"}))
    with serve(None, uvicorn_config(app)) as base:
        with QpaEnv(base_url=base, token="alpha-token").sync() as alpha:
            assert drive(alpha, grounded_task, OraclePlanner())[-1].reward == 1.0
        for token, why in ((None, "missing 'Authorization"), ("wrong-token", "unknown bearer")):
            refused = QpaEnv(base_url=base, token=token)
            with pytest.raises(ConnectionError, match=rf"HTTP 401 .*{why}"):
                refused.sync().connect()
        with pytest.raises(websockets.exceptions.InvalidStatus) as denied:
            websockets.sync.client.connect(base.replace("http", "ws") + "/ws")
        assert denied.value.response.status_code == 401
        assert denied.value.response.headers["www-authenticate"] == "Bearer"
        error = orjson.loads(denied.value.response.body)["error"]
        assert error["kind"] == "unauthenticated" and error["field"] == "Authorization"


def test_cli_serves_openenv_clients(grounded_task: Task, tmp_path: Path) -> None:
    """The real `qpa env serve` process, driven by OpenEnv's client end to end."""
    qpa = Path(sys.executable).with_name("qpa")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "serve.log").open("w+")
    process = subprocess.Popen(
        [str(qpa), "env", "serve", "--kind", "sandbox", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # the CLI's imports take seconds on a loaded machine
        while True:
            assert process.poll() is None, Path(log.name).read_text()
            try:
                httpx.get(f"{base}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "qpa env serve did not come up"
                time.sleep(0.1)
        with QpaEnv(base_url=base).sync() as env:
            results = drive(env, grounded_task, OraclePlanner())
            assert results[-1].reward == 1.0
            assert env.state().step_count == len(results)
    finally:
        process.terminate()
        process.wait(10)
        log.close()
