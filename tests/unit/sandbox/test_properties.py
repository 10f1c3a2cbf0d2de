"""Property-based: random action sequences never crash the sandbox or break its invariants."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qpa.contract import Finish, MessageUser, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite

TASKS = generate_suite()[::11]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10_000) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def episodes(draw: st.DrawFn) -> tuple[int, list[Any]]:
    task_index = draw(st.integers(0, len(TASKS) - 1))
    task = TASKS[task_index]
    tool_names = [*task.tools, "no_such_tool"]
    actions: list[Any] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["call", "call", "call", "message", "finish"]))
        if kind == "call":
            name = draw(st.sampled_from(tool_names))
            args = draw(
                st.dictionaries(
                    st.sampled_from(
                        ["query", "to", "text", "contact_id", "limit", "phone", "id", "name", "x"]
                    ),
                    json_values,
                    max_size=4,
                )
            )
            actions.append(ToolCall(tool=name, arguments=args))
        elif kind == "message":
            actions.append(MessageUser(text=draw(st.text(max_size=20))))
        else:
            actions.append(Finish(answer=draw(st.none() | st.text(max_size=10))))
    return task_index, actions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_random_actions_keep_invariants(episode: tuple[int, list[Any]]) -> None:
    task_index, actions = episode
    task = TASKS[task_index]
    env = SandboxEnv()
    env.reset(task)
    finished = False
    for action in actions:
        feedback = env.step(action)  # never raises
        assert feedback.status in ("ok", "error")
        assert (feedback.error is None) == (feedback.status == "ok")
        if feedback.status == "error":
            assert feedback.message
        if finished:
            assert feedback.error == "precondition_failed"
        finished = finished or isinstance(action, Finish)
        state = env.state()
        json.dumps(state)  # state stays plain JSON
        for collection in (
            v for app in state.values() for v in app.values() if isinstance(v, list)
        ):
            ids = [r["id"] for r in collection if isinstance(r, dict) and "id" in r]
            assert len(ids) == len(set(ids)), "record ids must stay unique"
    verification = env.verify()
    assert 0.0 <= verification.progress <= 1.0
    assert verification.done == finished
    assert not verification.success or finished
    # determinism: the same actions on a fresh environment give the same state
    twin = SandboxEnv()
    twin.reset(task)
    for action in actions:
        twin.step(action)
    assert twin.state() == env.state()
