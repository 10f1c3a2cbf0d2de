"""The `mcp` kind's server-side tool allow-list: a task (whoever resets an episode writes it) may
name as its `_mcp.reset_tool` / `verifier_tool` / `finish_tool` only the control tools the
server's operator listed (`control_tools`, `$QPA_MCP_CONTROL_TOOLS`; none by default), and
never reaches a tool the server hides (`hidden_tools`, `$QPA_MCP_HIDDEN_TOOLS`) in any role.

Against the notes MCP server of tests/fakes/mcp_app.py with an admin tool added that records
every call it gets: the attacks (the admin tool through each control field, through the task's
`tools`, through a planner's call, through `qpa env serve`) leave that record empty, checked on
the MCP server's side."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakes.mcp_admin_app import ADMIN, CONTROL, SHARE_WORLD, AdminNotesServer, task

from qpa.contract import Finish, ToolCall
from qpa.envs.factory import make_env
from qpa.envs.mcp import McpEnv
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

pytestmark = pytest.mark.timeout(120)

FIELDS = ("reset_tool", "verifier_tool", "finish_tool")


@pytest.fixture(scope="module")
def server() -> Iterator[AdminNotesServer]:
    with AdminNotesServer() as running:
        yield running


@pytest.fixture(autouse=True)
def _no_server_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("QPA_MCP_CONTROL_TOOLS", "QPA_MCP_HIDDEN_TOOLS", "QPA_MCP_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("allowed", [None, CONTROL], ids=["default", "allow-list"])
def test_a_task_naming_the_admin_tool_as_machinery_is_refused(
    server: AdminNotesServer, field: str, allowed: tuple[str, ...] | None
) -> None:
    env = McpEnv(server.url, control_tools=allowed)
    try:
        world = {**SHARE_WORLD, field: ADMIN} if allowed else {field: ADMIN}
        refused = env.reset(task(world))
        assert refused.error == "permission_denied", refused
        assert f"'_mcp.{field}'" in refused.message and f"'{ADMIN}'" in refused.message
        assert env.tools() == []
        # nothing of the episode runs: steps are refused, the verification fails
        assert env.step(Finish(answer="x")).error == "precondition_failed"
        assert not env.verify().success
        trajectory = run_episode(env, task(world), OraclePlanner())
        assert trajectory.error is not None and f"_mcp.{field}" in trajectory.error
    finally:
        env.close()
    server.untouched()


def test_the_refusal_comes_before_any_call_reaches_the_server() -> None:
    """Against a URL nothing listens on: the answer is the refusal, not a failed connection."""
    env = McpEnv("http://127.0.0.1:9/mcp", timeout=5, control_tools=CONTROL)
    try:
        refused = env.reset(task({"verifier_tool": ADMIN}))
        assert refused.error == "permission_denied" and "cannot connect" not in refused.message
        allowed = env.reset(task({"verifier_tool": "check_notes"}))
        assert allowed.error == "environment_failure" and "cannot connect" in allowed.message
    finally:
        env.close()


def test_the_error_names_the_field_the_tool_and_what_is_allowed() -> None:
    bare = McpEnv("http://127.0.0.1:9/mcp")
    listed = McpEnv("http://127.0.0.1:9/mcp", control_tools=["reset_notes", "check_notes"])
    try:
        assert bare.reset(task({"reset_tool": ADMIN})).message == (
            "task world '_mcp.reset_tool': tool 'admin_wipe' is not one of this server's "
            "control tools (allowed: none; the server's operator lists them in "
            "$QPA_MCP_CONTROL_TOOLS or a RolloutPool's mcp.controlTools)"
        )
        assert listed.reset(task({"finish_tool": ADMIN})).message == (
            "task world '_mcp.finish_tool': tool 'admin_wipe' is not one of this server's "
            "control tools (allowed: 'check_notes', 'reset_notes'; the server's operator lists "
            "them in $QPA_MCP_CONTROL_TOOLS or a RolloutPool's mcp.controlTools)"
        )
    finally:
        bare.close()
        listed.close()


def test_listed_control_tools_run_the_episode_and_stay_hidden_from_the_planner(
    server: AdminNotesServer,
) -> None:
    env = McpEnv(server.url, control_tools=CONTROL, hidden_tools=[ADMIN])
    try:
        trajectory = run_episode(env, task(SHARE_WORLD), OraclePlanner())
        assert trajectory.error is None, trajectory.error
        assert trajectory.success and trajectory.verification is not None
        assert trajectory.verification.fidelity == "programmatic"
        # a task that names no machinery still never sees the control tools, nor the admin one
        first = env.reset(task({}))
        assert first.status == "ok", first.message
        offered = {t.name for t in env.tools()}
        assert offered == set(first.observation["tools"])
        assert offered.isdisjoint({*CONTROL, ADMIN})
        assert "share_note" in offered
        for name in (*CONTROL, ADMIN):
            called = env.step(ToolCall(tool=name, arguments={"title": "Groceries"}))
            assert called.error == "unknown_tool" and "not available" in called.message
    finally:
        env.close()
    server.untouched()


def test_the_task_cannot_offer_a_hidden_or_control_tool_to_the_planner(
    server: AdminNotesServer,
) -> None:
    env = McpEnv(server.url, control_tools=CONTROL, hidden_tools=ADMIN)
    try:
        for name, what in ((ADMIN, "hidden by"), ("reset_notes", "a control tool of")):
            refused = env.reset(task({}, tools=["search_notes", name]))
            assert refused.error == "permission_denied"
            assert (
                refused.message
                == f"task tools: '{name}' is {what} this server, never the planner's"
            )
        # hiding it from the task's side changes nothing: it is hidden already
        scoped = env.reset(task({"hidden_tools": [ADMIN], "payment_tools": ["share_note"]}))
        assert scoped.status == "ok" and ADMIN not in scoped.observation["tools"]
    finally:
        env.close()
    server.untouched()


def test_the_settings_come_from_the_environment_and_bad_ones_name_the_field(
    server: AdminNotesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPA_MCP_URL", server.url)
    monkeypatch.setenv("QPA_MCP_CONTROL_TOOLS", " reset_notes, check_notes ,")
    monkeypatch.setenv("QPA_MCP_HIDDEN_TOOLS", ADMIN)
    env = make_env("mcp")
    assert isinstance(env, McpEnv)
    try:
        assert env.control_tools == frozenset(CONTROL)
        assert env.hidden_tools == frozenset({ADMIN})
        assert env.reset(task(SHARE_WORLD)).status == "ok"
        assert ADMIN not in {t.name for t in env.tools()}
    finally:
        env.close()
    # an explicit list wins over the variable
    assert McpEnv(server.url, control_tools=[]).control_tools == frozenset()
    monkeypatch.setenv("QPA_MCP_CONTROL_TOOLS", "reset notes")
    with pytest.raises(ValueError, match=r"^\$QPA_MCP_CONTROL_TOOLS: 'reset notes' is not an MCP"):
        McpEnv(server.url)
    with pytest.raises(ValueError, match=r"^control_tools: 'a,b' is not an MCP tool name"):
        McpEnv(server.url, control_tools=["a,b"])
    with pytest.raises(ValueError, match=r"^hidden_tools: 'check_notes' also listed as control"):
        McpEnv(server.url, control_tools=CONTROL, hidden_tools=["check_notes"])
    monkeypatch.setenv("QPA_MCP_CONTROL_TOOLS", "check_notes")
    monkeypatch.setenv("QPA_MCP_HIDDEN_TOOLS", "check_notes")
    with pytest.raises(ValueError, match=r"^\$QPA_MCP_HIDDEN_TOOLS: 'check_notes' also listed"):
        McpEnv(server.url)
    monkeypatch.setenv("QPA_MCP_CONTROL_TOOLS", "")
    monkeypatch.setenv("QPA_MCP_HIDDEN_TOOLS", "x y")
    with pytest.raises(ValueError, match=r"^\$QPA_MCP_HIDDEN_TOOLS: 'x y' is not an MCP"):
        McpEnv(server.url)
    server.untouched()


def test_through_qpa_env_serve_a_client_cannot_reach_the_admin_tool(
    server: AdminNotesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threat itself: a client of `qpa env serve --kind mcp` writes the task it resets on."""
    from helpers.uvicorn_thread import serve

    from qpa.envs.remote import RemoteEnv
    from qpa.envs.server import create_app

    monkeypatch.setenv("QPA_MCP_URL", server.url)
    monkeypatch.setenv("QPA_MCP_CONTROL_TOOLS", ",".join(CONTROL))
    monkeypatch.setenv("QPA_MCP_HIDDEN_TOOLS", ADMIN)
    with serve(create_app("mcp")) as url, RemoteEnv(url) as remote:
        for field in FIELDS:
            refused = remote.reset(task({**SHARE_WORLD, field: ADMIN}))
            assert refused.error == "permission_denied" and f"_mcp.{field}" in refused.message
        listed = remote.reset(task({}, tools=[ADMIN]))
        assert listed.error == "permission_denied" and ADMIN in listed.message
        assert remote.reset(task({})).status == "ok"
        called = remote.step(ToolCall(tool=ADMIN, arguments={}))
        assert called.error == "unknown_tool"
        trajectory = run_episode(remote, task(SHARE_WORLD), OraclePlanner())
    assert trajectory.error is None and trajectory.success, trajectory.error
    assert ADMIN not in {t.name for t in trajectory.tools}
    server.untouched()
