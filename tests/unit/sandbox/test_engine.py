"""The sandbox engine: bad actions become structured feedback; state stays consistent."""

from __future__ import annotations

import pytest

from qpa.contract import Delegate, Finish, MessageUser, Task, ToolCall, UIAction
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.registry import all_tools
from qpa.envs.sandbox.suite import generate_suite


@pytest.fixture(scope="module")
def task() -> Task:
    return next(t for t in generate_suite() if t.template == "text_contact_by_name")


@pytest.fixture
def env(task: Task) -> SandboxEnv:
    sandbox = SandboxEnv()
    assert sandbox.reset(task).status == "ok"
    return sandbox


def test_tool_specs_carry_schemas_and_side_effects() -> None:
    tools = all_tools()
    assert len(tools) >= 30
    send = tools["messaging_send"].spec
    assert send.side_effect == "write"
    assert send.parameters["required"] == ["to", "text"]
    assert send.parameters["properties"]["text"]["maxLength"] == 1000
    assert send.result["type"] == "object" and "id" in send.result["properties"]
    assert tools["contacts_search"].spec.side_effect == "read"
    assert all(spec.spec.description for spec in tools.values())


def test_unknown_tool(env: SandboxEnv) -> None:
    feedback = env.step(ToolCall(tool="teleport", arguments={}))
    assert (feedback.status, feedback.error) == ("error", "unknown_tool")
    assert "teleport" in feedback.message


def test_tool_outside_scenario_is_unknown(env: SandboxEnv) -> None:
    outside = next(name for name in all_tools() if not name.startswith(("contacts_", "messaging_")))
    feedback = env.step(ToolCall(tool=outside, arguments={}))
    assert feedback.error == "unknown_tool" and "not available" in feedback.message


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"query": "a", "limit": "many"}, "argument 'limit'"),
        ({"limit": 3}, "missing argument 'query'"),
        ({"query": "a", "colour": "red"}, "unexpected argument 'colour'"),
        ({"query": ""}, "argument 'query'"),
        ({"query": "a", "limit": 0}, "argument 'limit'"),
    ],
)
def test_invalid_arguments_name_the_argument(
    env: SandboxEnv, arguments: dict[str, object], needle: str
) -> None:
    feedback = env.step(ToolCall(tool="contacts_search", arguments=arguments))
    assert feedback.error == "invalid_arguments"
    assert needle in feedback.message


def test_precondition_failures_are_feedback(env: SandboxEnv) -> None:
    feedback = env.step(ToolCall(tool="contacts_get", arguments={"contact_id": "c_nope"}))
    assert feedback.error == "precondition_failed" and "c_nope" in feedback.message


def test_actions_after_finish_are_refused(env: SandboxEnv) -> None:
    assert env.step(Finish(answer="done")).done
    feedback = env.step(ToolCall(tool="contacts_search", arguments={"query": "a"}))
    assert feedback.error == "precondition_failed" and "finished" in feedback.message
    assert env.verify().done


def test_step_before_reset_is_refused() -> None:
    feedback = SandboxEnv().step(Finish())
    assert feedback.error == "precondition_failed" and "reset" in feedback.message


def test_ui_and_delegate_are_not_environment_actions(env: SandboxEnv) -> None:
    assert env.step(UIAction(op="tap", x=1, y=2)).error == "precondition_failed"
    assert env.step(Delegate(goal="x")).error == "precondition_failed"
    assert env.step(MessageUser(text="hi")).status == "ok"


def test_results_are_detached_from_state(env: SandboxEnv) -> None:
    found = env.step(ToolCall(tool="contacts_search", arguments={"query": "e"})).observation
    assert found
    found[0]["name"] = "Mallory"
    again = env.step(ToolCall(tool="contacts_get", arguments={"contact_id": found[0]["id"]}))
    assert again.observation["name"] != "Mallory"


def test_reset_restores_the_initial_world(env: SandboxEnv, task: Task) -> None:
    env.step(ToolCall(tool="contacts_create", arguments={"name": "Zed", "phone": "+1-555-0000"}))
    assert any(c["name"] == "Zed" for c in env.state()["contacts"]["contacts"])
    env.reset(task)
    assert not any(c["name"] == "Zed" for c in env.state()["contacts"]["contacts"])
    assert task.world["contacts"]["contacts"] == env.state()["contacts"]["contacts"]


def test_step_budget_ends_the_episode(task: Task) -> None:
    env = SandboxEnv(max_steps=3)
    env.reset(task)
    for _ in range(3):
        assert env.step(ToolCall(tool="contacts_search", arguments={"query": "a"})).status == "ok"
    feedback = env.step(ToolCall(tool="contacts_search", arguments={"query": "a"}))
    assert feedback.done and "budget" in feedback.message


def test_payment_tools_need_confirmation(task: Task) -> None:
    payments = [b for b in all_tools().values() if b.spec.side_effect == "payment"]
    if not payments:
        pytest.skip("no payment tool registered yet")
    bound = payments[0]
    env = SandboxEnv()
    env.reset(
        task.model_copy(update={"apps": [bound.app.name], "tools": [bound.name], "world": {}})
    )
    feedback = env.step(ToolCall(tool=bound.name, arguments={}))
    assert feedback.error == "permission_denied"


def test_unknown_app_fails_reset(task: Task) -> None:
    feedback = SandboxEnv().reset(task.model_copy(update={"apps": ["ghost"], "tools": []}))
    assert feedback.error == "environment_failure" and "ghost" in feedback.message


def test_reset_uses_the_world_it_is_given_not_a_cached_one(task: Task) -> None:
    env = SandboxEnv()
    env.reset(task)
    emptied = task.model_copy(update={"world": {"contacts": {"contacts": []}}})
    env.reset(emptied)  # same id and seed, different world
    assert env.state()["contacts"]["contacts"] == []
