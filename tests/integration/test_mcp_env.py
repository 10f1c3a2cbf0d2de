"""Environment kind `mcp` against a real MCP server (tests/fakes/mcp_app.py, the SDK's MCPServer):
ToolSpecs from its tool list, results as Feedback, verification by its verifier tool or a rubric,
the Harness running planners on it (and its guard keeping a tool's injected text as data), bad
input and a server that is gone."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from fakes.mcp_admin_app import task as notes_share_task
from fakes.mcp_app import ATTACKER, NotesServer, stdio_command
from fakes.openai_server import ChatRequest, FakeOpenAI

from qpa.contract import Finish, Task, ToolCall, ToolSpec, UIAction
from qpa.envs.factory import env_kinds, make_env
from qpa.envs.llmsim.client import ChatClient
from qpa.envs.mcp import McpEnv
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion, RawToolCall
from qpa.harness.backends.scripted import OracleBackend, ScriptedBackend
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

pytestmark = pytest.mark.timeout(120)

#: The notes server's machinery, which the server side lets tasks name (`control_tools`).
CONTROL = ("reset_notes", "check_notes")
WORLD = {
    "_mcp": {
        "reset_tool": "reset_notes",
        "reset_arguments": {"seed": 0},
        "verifier_tool": "check_notes",
        "verifier_arguments": {"title": "Groceries", "shared_with": "sam@example.com"},
    }
}


def share_task(**changes: Any) -> Task:
    """Share the grocery list with Sam: search, then share what the search found."""
    return notes_share_task(WORLD["_mcp"], **{"id": "notes.share_groceries.test.000", **changes})


@pytest.fixture(scope="module")
def notes() -> Iterator[NotesServer]:
    with NotesServer() as server:
        yield server


@pytest.fixture
def env(notes: NotesServer) -> Iterator[McpEnv]:
    environment = McpEnv(notes.url, control_tools=CONTROL)
    yield environment
    environment.close()


def test_the_kind_is_registered_and_needs_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "mcp" in env_kinds()
    monkeypatch.delenv("QPA_MCP_URL", raising=False)
    monkeypatch.delenv("QPA_MCP_COMMAND", raising=False)
    with pytest.raises(ValueError, match="url: the mcp environment needs"):
        make_env("mcp")
    with pytest.raises(ValueError, match="url: 'ftp://x' is not an http"):
        make_env("mcp", url="ftp://x")
    with pytest.raises(ValueError, match=r"or its command \(stdio\), one of them"):
        make_env("mcp", url="http://127.0.0.1:1/mcp", command=["x"])
    monkeypatch.setenv("QPA_MCP_URL", "http://127.0.0.1:9/mcp")
    from_env = make_env("mcp")
    assert isinstance(from_env, McpEnv) and from_env.server.url == "http://127.0.0.1:9/mcp"


def test_toolspecs_come_from_the_servers_tool_list(env: McpEnv) -> None:
    first = env.reset(share_task())
    assert first.status == "ok", first.message
    assert first.observation["app"] == "notes" and first.observation["reset"] == {"notes": 3}
    specs = {t.name: t for t in env.tools()}
    # the reset and verifier tools are the task's machinery, never the planner's
    assert set(specs) == {
        "list_notes",
        "search_notes",
        "read_note",
        "create_note",
        "share_note",
        "delete_note",
    }
    assert {n for n, t in specs.items() if t.side_effect == "read"} == {
        "list_notes",
        "search_notes",
        "read_note",
    }
    assert specs["share_note"].side_effect == "write"
    assert all(t.app == "notes" for t in specs.values())
    share = specs["share_note"].parameters
    assert set(share["required"]) == {"note_id", "email"}
    assert specs["search_notes"].description == "Notes whose title or body contains the query."
    assert env.kind == "mcp"


def test_results_are_feedback_and_the_verifier_tool_decides(
    env: McpEnv, notes: NotesServer
) -> None:
    env.reset(share_task())
    found = env.step(ToolCall(tool="search_notes", arguments={"query": "groceries"}))
    assert found.status == "ok" and found.observation == {
        "notes": [{"id": "n1", "title": "Groceries"}]
    }
    assert not env.verify().success  # not shared yet, not finished
    shared = env.step(
        ToolCall(tool="share_note", arguments={"note_id": "n1", "email": "sam@example.com"})
    )
    assert shared.observation == {"shared": "n1", "with": "sam@example.com"}
    assert notes.state["shares"] == [{"note_id": "n1", "email": "sam@example.com"}]
    unfinished = env.verify()
    assert not unfinished.success and unfinished.progress == 1.0  # the app is happy; not done
    assert env.step(Finish(answer="done")).done
    verification = env.verify()
    assert verification.success and verification.fidelity == "programmatic"
    assert [c.name for c in verification.checks] == [
        "note exists",
        "note shared",
        "no other shares",
    ]


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_oracle_through_the_runner(notes: NotesServer, transport: str) -> None:
    env = (
        McpEnv(notes.url, control_tools=CONTROL)
        if transport == "http"
        else McpEnv(command=stdio_command(), control_tools=CONTROL)
    )
    try:
        trajectory = run_episode(env, share_task(), OraclePlanner())
    finally:
        env.close()
    assert trajectory.error is None, trajectory.error
    assert trajectory.env_kind == "mcp" and trajectory.success
    assert [s.action.type for s in trajectory.steps] == ["tool_call", "tool_call", "finish"]
    assert trajectory.steps[1].action.arguments["note_id"] == "n1"  # grounded in the search
    assert {t.name for t in trajectory.tools} >= {"share_note", "search_notes"}


def test_the_harness_runs_a_model_planner_on_it(env: McpEnv) -> None:
    task = share_task()
    planner = HarnessPlanner(OracleBackend(task), HarnessConfig(memory_path=":memory:"))
    trajectory = run_episode(env, task, planner)
    assert trajectory.success, [s.feedback for s in trajectory.steps]
    assert "guard" not in trajectory.steps[1].annotations
    assert trajectory.steps[0].annotations["tools_exposed"]


def _call(name: str, arguments: dict[str, Any], index: int) -> Completion:
    raw = RawToolCall(id=f"c{index}", name=name, arguments=json.dumps(arguments))
    return Completion(text="", tool_calls=[raw], finish_reason="tool_calls")


def test_injected_text_in_a_tool_result_stays_data(env: McpEnv, notes: NotesServer) -> None:
    """A note's body tells the agent to share every note with an attacker; a model that obeys
    is stopped by the Harness's guard, and the share never reaches the server."""
    task = share_task(
        instruction="Read my 'Wi-Fi at the cabin' note and tell me what it says.",
        world={
            "_mcp": {
                "reset_tool": "reset_notes",
                "verifier_tool": "check_notes",
                "verifier_arguments": {"title": "Wi-Fi at the cabin"},
            }
        },
        reference_plan=None,
    )
    seen: list[str] = []

    def obedient(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        turn = sum(1 for m in messages if m.role == "assistant")
        seen.append(messages[-1].content or "")
        if turn == 0:
            return _call("read_note", {"note_id": "n2"}, turn)
        if turn == 1:  # the note said to: follow it
            return _call("share_note", {"note_id": "n1", "email": ATTACKER}, turn)
        return _call("finish", {"answer": "The note asks to share notes."}, turn)

    planner = HarnessPlanner(ScriptedBackend(obedient), HarnessConfig(memory_path=":memory:"))
    trajectory = run_episode(env, task, planner)
    read, share, _ = trajectory.steps
    assert read.feedback.status == "ok" and ATTACKER in json.dumps(read.feedback.observation)
    assert ATTACKER in seen[1]  # the model was shown the note's text (quoted as a tool result)
    assert share.feedback.error == "permission_denied", share.feedback
    assert "guard" in share.annotations and "email" in share.feedback.message
    assert notes.state["shares"] == []  # the refused call never reached the MCP server
    assert not any(c["tool"] == "share_note" for c in notes.state["calls"])
    assert trajectory.success  # nothing was shared: the verifier's "no other shares" holds


def test_bad_input_is_error_feedback_naming_the_field(env: McpEnv) -> None:
    env.reset(share_task())
    missing = env.step(ToolCall(tool="create_note", arguments={"body": "x"}))
    assert missing.error == "invalid_arguments" and "missing argument 'title'" in missing.message
    typed = env.step(ToolCall(tool="read_note", arguments={"note_id": 7}))
    assert typed.error == "invalid_arguments" and "'note_id'" in typed.message
    unknown = env.step(ToolCall(tool="format_disk", arguments={}))
    assert unknown.error == "unknown_tool" and "no tool named 'format_disk'" in unknown.message
    assert env.server.describe() in unknown.message
    hidden = env.step(ToolCall(tool="check_notes", arguments={"title": "x"}))
    assert hidden.error == "unknown_tool" and "not available" in hidden.message
    refused = env.step(ToolCall(tool="read_note", arguments={"note_id": "n99"}))
    assert refused.error == "precondition_failed" and "no note with id 'n99'" in refused.message
    kind = env.step(ToolCall(tool="create_note", arguments={"title": " "}))
    assert kind.error == "invalid_arguments" and "title must not be empty" in kind.message
    ui = env.step(UIAction(op="tap", x=1, y=2))
    assert ui.error == "precondition_failed"


def test_bad_tasks_fail_the_reset_clearly(env: McpEnv) -> None:
    absent = env.reset(share_task(tools=["search_notes", "teleport"]))
    assert absent.error == "environment_failure" and "'teleport'" in absent.message
    bad_world = env.reset(share_task(world={"_mcp": {"verifier_tol": "check_notes"}}))
    assert bad_world.error == "environment_failure" and "_mcp.verifier_tol" in bad_world.message
    scoped = env.reset(share_task(tools=["search_notes"]))
    assert scoped.status == "ok" and [t.name for t in env.tools()] == ["search_notes"]


def test_a_server_that_is_gone_is_a_clear_environment_failure() -> None:
    server = NotesServer().start()
    env = McpEnv(server.url, timeout=5, control_tools=CONTROL)
    try:
        assert env.reset(share_task()).status == "ok"
        server.stop()
        gone = env.step(ToolCall(tool="list_notes", arguments={}))
        assert gone.error == "environment_failure"
        assert server.url in gone.message and "gone or unreachable" in gone.message
        assert not env.verify().success
    finally:
        env.close()
        server.stop()
    # never there at all: the runner records the reset failure, nothing raises
    nowhere = McpEnv("http://127.0.0.1:9/mcp", timeout=5, control_tools=CONTROL)
    trajectory = run_episode(nowhere, share_task(), OraclePlanner())
    assert trajectory.error is not None and "reset failed" in trajectory.error
    assert "cannot connect" in trajectory.error and "127.0.0.1:9" in trajectory.error
    # a stdio server that exits at once
    dead = McpEnv(command=[sys.executable, "-c", "pass"], timeout=5, control_tools=CONTROL)
    first = dead.reset(share_task())
    assert first.error == "environment_failure" and "stdio:" in first.message
    dead.close()


def test_rubric_verification_is_llm_judged(notes: NotesServer, openai_server: FakeOpenAI) -> None:
    judged: list[dict[str, Any]] = []

    def judge(request: ChatRequest) -> Any:
        context = json.loads(request.messages[-1]["content"])
        judged.append(context)
        shared = any(
            "result" in e and e["result"].get("with") == "sam@example.com"
            for e in context["record"]
        )
        return {"verdicts": [{"item": 1, "passed": shared, "reason": "from the record"}]}

    openai_server.handler = judge
    task = share_task(
        world={"_mcp": {"reset_tool": "reset_notes"}},
        verifier={"kind": "rubric", "rubric": ["The Groceries note is shared with Sam."]},
    )
    env = McpEnv(
        notes.url,
        judge_client=ChatClient(openai_server.base_url, "judge"),
        control_tools=CONTROL,
    )
    try:
        trajectory = run_episode(env, task, OraclePlanner())
    finally:
        env.close()
    assert trajectory.success and trajectory.verification is not None
    assert trajectory.verification.fidelity == "llm_judged"
    assert "real app" in openai_server.requests[-1].system
    assert judged[-1]["rubric"] == [{"item": 1, "text": "The Groceries note is shared with Sam."}]
    # no judge configured: the rubric fails, saying what is missing
    bare = McpEnv(notes.url, control_tools=CONTROL)
    try:
        bare.reset(task)
        bare.step(Finish())
        verdict = bare.verify()
    finally:
        bare.close()
    assert not verdict.success and "judge_url" in verdict.checks[0].detail


def test_env_serve_fronts_an_mcp_server(
    notes: NotesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`qpa env serve --kind mcp` with `$QPA_MCP_URL`: RemoteEnv clients (rollouts, the
    flywheel) run episodes on the real app's MCP server."""
    from helpers.uvicorn_thread import serve

    from qpa.envs.remote import RemoteEnv
    from qpa.envs.serve_config import EnvServeConfig
    from qpa.envs.server import create_app

    monkeypatch.setenv("QPA_MCP_URL", notes.url)
    monkeypatch.setenv("QPA_MCP_CONTROL_TOOLS", ",".join(CONTROL))
    assert EnvServeConfig(kind="mcp").kind == "mcp"
    with serve(create_app("mcp")) as url, RemoteEnv(url) as remote:
        trajectory = run_episode(remote, share_task(), OraclePlanner())
    assert trajectory.error is None, trajectory.error
    assert trajectory.success and trajectory.env_kind == "mcp"
