"""The training format is what the Harness sends a text-protocol model at inference, exactly."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from qpa.contract import Task, TokenUsage, ToolSpec, Trajectory
from qpa.data.render import (
    action_text,
    mask_reason,
    render_conversations,
    render_trajectory,
)
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion, to_text_protocol
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.parsing import format_tool_call
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

SUITE = generate_suite()
TEMPLATES = [
    "add_new_contact",  # tool_use
    "schedule_text",  # skills
    "text_partner_from_memory",  # memory
    "triage_three_mailboxes",  # sub-agents
    "food_usual_dish_cheapest",  # sub-agents + memory
]


def task_of(template: str) -> Task:
    return next(t for t in SUITE if t.template == template and t.split == "train")


class TextModel:
    """A text-protocol model (like `LocalBackend`): it receives `to_text_protocol(messages)`,
    which is recorded, and answers in plain text with `<tool_call>` / `<finish>` blocks."""

    def __init__(self, task: Task, prefix: Sequence[str] = ()) -> None:
        self.oracle = OracleBackend(task)
        self.prefix = list(prefix)
        self.seen: list[list[tuple[str, str]]] = []

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        self.seen.append([(m.role, m.content or "") for m in to_text_protocol(messages, tools)])
        if self.prefix:
            return Completion(text=self.prefix.pop(0), protocol="text")
        call = self.oracle.complete(messages, tools).tool_calls[0]
        if call.name == "finish":
            answer = json.loads(call.arguments).get("answer")
            text = f"<finish>{answer or ''}</finish>"
        else:
            text = format_tool_call(call.name, call.arguments)
        return Completion(text=text, usage=TokenUsage(completion_tokens=9), protocol="text")


def harness_run(task: Task, model: TextModel) -> Trajectory:
    config = HarnessConfig()
    planner = HarnessPlanner(model, config)
    return run_episode(SandboxEnv(), task, planner, budgets=config.budgets())


def plain(messages: list[dict[str, object]]) -> list[tuple[str, str]]:
    return [(str(m["role"]), str(m["content"])) for m in messages]


@pytest.mark.parametrize("template", TEMPLATES)
def test_rendered_conversation_is_what_the_harness_sends_a_text_model(template: str) -> None:
    task = task_of(template)
    model = TextModel(task)
    trajectory = harness_run(task, model)
    assert trajectory.success, trajectory.error
    conversations = render_conversations(trajectory)
    rendered = [plain(c.messages) for c in conversations]
    # every request the model got is, exactly, the start of one rendered conversation
    for request in model.seen:
        assert any(conv[: len(request)] == request for conv in rendered), request[-1]
    # and each conversation is its last request plus the model's final answer
    for conv in rendered:
        last = max((r for r in model.seen if conv[: len(r)] == r), key=len)
        assert conv[: len(last)] == last and len(conv) == len(last) + 1
        assert conv[-1][0] == "assistant"
    # only (correct) assistant turns are trained on
    for c in conversations:
        assert all(m["train"] == (m["role"] == "assistant") for m in c.messages)
    assert render_trajectory(trajectory) == conversations[0].messages


@pytest.mark.parametrize("template", TEMPLATES)
def test_model_free_trajectories_render_like_the_harness_would_show_them(template: str) -> None:
    task = task_of(template)
    from_harness = render_conversations(harness_run(task, TextModel(task)))
    from_oracle = render_conversations(run_episode(SandboxEnv(), task, OraclePlanner()))
    assert [plain(c.messages) for c in from_oracle] == [plain(c.messages) for c in from_harness]


def test_the_text_protocol_is_in_the_system_prompt_and_calls_are_tool_call_blocks() -> None:
    task = task_of("add_new_contact")
    messages = render_trajectory(run_episode(SandboxEnv(), task, OraclePlanner()))
    assert [m["role"] for m in messages][:2] == ["system", "user"]
    system = str(messages[0]["content"])
    assert "<tools>" in system and "<tool_call>" in system and "# Tools and Skills" in system
    assert str(messages[1]["content"]).startswith(task.instruction)
    calls = [str(m["content"]) for m in messages if m["role"] == "assistant"]
    assert calls[0].startswith("<tool_call>\n") and calls[0].endswith("\n</tool_call>")
    assert calls[-1].startswith("<finish>")
    assert all("[tool output: quoted data" in str(m["content"]) for m in messages[3::2])


def test_subagents_get_their_own_conversations() -> None:
    task = task_of("triage_three_mailboxes")
    trajectory = run_episode(SandboxEnv(), task, OraclePlanner())
    conversations = render_conversations(trajectory)
    delegations = sum(1 for s in trajectory.steps if s.action.type == "delegate")
    assert len(conversations) == 1 + delegations
    main, *subs = conversations
    assert main.agent == "main" and all(c.agent != "main" for c in subs)
    for sub in subs:
        assert "You are a sub-agent" in str(sub.messages[0]["content"])
        assert {trajectory.steps[i].agent for i in sub.steps} == {sub.agent}
    assert any("<tool_response>" in str(m["content"]) for m in main.messages if m["role"] == "user")
    assert sorted(i for c in conversations for i in c.steps) == list(range(len(trajectory.steps)))


def test_erroneous_assistant_turns_are_not_trained_on() -> None:
    task = task_of("add_new_contact")
    mistakes = ["I will do it {not json", format_tool_call("contacts_teleport", {"name": "x"})]
    model = TextModel(task, mistakes)
    trajectory = harness_run(task, model)
    assert trajectory.success
    assert [mask_reason(s) for s in trajectory.steps[:2]] == ["malformed_action", "unknown_tool"]
    messages = render_trajectory(trajectory)
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert [m["train"] for m in assistant] == [False, False] + [True] * (len(assistant) - 2)
    assert assistant[0]["content"] == mistakes[0]  # the model's own words, as it saw them
    for request in model.seen:
        assert plain(messages)[: len(request)] == request


def test_flags_set_by_curation_win() -> None:
    task = task_of("add_new_contact")
    trajectory = run_episode(SandboxEnv(), task, OraclePlanner())
    trajectory.steps[0].annotations.update({"train": False, "mask_reason": "reviewer"})
    assistant = [m for m in render_trajectory(trajectory) if m["role"] == "assistant"]
    assert assistant[0]["train"] is False and all(m["train"] for m in assistant[1:])


def test_recorded_memory_is_replayed_as_the_model_saw_it() -> None:
    task = task_of("text_partner_from_memory")
    trajectory = harness_run(task, TextModel(task))
    recorded = trajectory.steps[0].annotations["memory_retrieved"]
    assert recorded and all(
        line in render_trajectory(trajectory)[0]["content"] for line in recorded
    )
    trajectory.steps[0].annotations["memory_retrieved"] = ["partner_name=Robin Example (stated)"]
    system = str(render_trajectory(trajectory)[0]["content"])
    assert "partner_name=Robin Example (stated)" in system
    assert not any(line in system for line in recorded if "partner" in line)


def test_action_text_round_trips_through_the_harness_parser() -> None:
    from qpa.contract import Delegate, Finish, MessageUser, ToolCall
    from qpa.harness.parsing import parse_completion

    tools = [ToolSpec(name="contacts_search", description="find", parameters={"type": "object"})]
    for action in (
        ToolCall(tool="contacts_search", arguments={"query": "Ana"}),
        Finish(answer="42"),
        Finish(),
        MessageUser(text="Which one?"),
        Delegate(goal="check mail", tools=["contacts_search"], agent="sub"),
    ):
        parsed = parse_completion(action_text(action), tools)
        assert parsed == action, (action, parsed)


def test_a_rendering_with_another_harness_version_follows_that_version() -> None:
    task = task_of("schedule_text")
    trajectory = run_episode(SandboxEnv(), task, OraclePlanner())
    default = render_trajectory(trajectory)
    small = render_trajectory(trajectory, HarnessConfig(drop_skills=["messaging.scheduled_send"]))
    assert plain(default)[1:] == plain(small)[1:]
    assert default[0]["content"] != small[0]["content"]


def test_the_tools_rendered_are_the_ones_the_trajectory_recorded() -> None:
    from qpa.data.render import episode_opening

    task = task_of("add_new_contact")
    trajectory = run_episode(SandboxEnv(), task, OraclePlanner())
    tools, first = episode_opening(trajectory)
    assert tools == trajectory.tools and first.status == "ok"
    fewer = trajectory.model_copy(update={"tools": trajectory.tools[:1]})
    assert episode_opening(fewer)[0] == trajectory.tools[:1]
    # an old sandbox trajectory: the sandbox, reset again, says what it offered
    assert episode_opening(trajectory.model_copy(update={"tools": []}))[0] == trajectory.tools
    # a device episode cannot be reset offline: its recorded tools, or a clear refusal
    device = trajectory.model_copy(update={"env_kind": "device"})
    tools, first = episode_opening(device)
    assert tools == trajectory.tools
    assert first.observation["tools"] == [t.name for t in trajectory.tools]
    with pytest.raises(ValueError, match="field 'tools' is empty"):
        episode_opening(device.model_copy(update={"tools": []}))
