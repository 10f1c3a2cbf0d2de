"""The contract: models validate strictly, JSON Lines stream and name corrupt lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from qpa.contract import (
    ACTION_ADAPTER,
    CorruptLineError,
    Feedback,
    Finish,
    Policy,
    SkillSpec,
    Step,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
    read_trajectories,
    write_trajectories,
)


def make_task(**overrides: object) -> Task:
    fields: dict[str, object] = {
        "id": "t1",
        "domain": "messaging",
        "capabilities": ["tool_use"],
        "instruction": "do it",
    }
    fields.update(overrides)
    return Task.model_validate(fields)


def make_trajectory(i: int) -> Trajectory:
    step = Step(
        index=0, action=ToolCall(tool="x", arguments={"a": i}), feedback=Feedback.ok({"n": i})
    )
    return Trajectory(
        id=f"tr{i}", task=make_task(id=f"t{i}"), policy=Policy(planner="oracle"), steps=[step]
    )


def test_action_union_dispatches_on_type() -> None:
    action = ACTION_ADAPTER.validate_python(
        {"type": "tool_call", "tool": "a", "arguments": {"x": 1}}
    )
    assert isinstance(action, ToolCall) and action.arguments == {"x": 1}
    assert isinstance(ACTION_ADAPTER.validate_json('{"type": "finish", "answer": "42"}'), Finish)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"type": "teleport"}, "teleport"),
        ({"type": "tool_call"}, "tool"),
        ({"type": "ui", "op": "fly"}, "op"),
        ({"type": "tool_call", "tool": "a", "bogus": 1}, "bogus"),
    ],
)
def test_malformed_actions_name_the_problem(payload: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ACTION_ADAPTER.validate_python(payload)
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"capabilities": []}, "capabilities"),
        ({"capabilities": ["telepathy"]}, "capabilities"),
        ({"capabilities": ["memory", "memory"]}, "capabilities"),
        ({"difficulty": 9}, "difficulty"),
        ({"split": "holdout"}, "split"),
        ({"instruction": ""}, "instruction"),
        ({"surprise": True}, "surprise"),
    ],
)
def test_malformed_tasks_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        make_task(**overrides)
    assert field in str(info.value)


def test_jsonl_roundtrip_streams(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert write_trajectories(path, (make_trajectory(i) for i in range(50))) == 50
    loaded = list(read_trajectories(path))
    assert [t.id for t in loaded] == [f"tr{i}" for i in range(50)]
    assert loaded[7].steps[0].feedback.observation == {"n": 7}
    assert loaded[3] == make_trajectory(3)


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [("{not json", "json"), ('{"id": "x"}', "task"), ("[1, 2]", "input")],
)
def test_corrupt_line_is_named(tmp_path: Path, bad_line: str, reason: str) -> None:
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [make_trajectory(0), make_trajectory(1)])
    with open(path, "a", encoding="utf-8") as f:
        f.write(bad_line + "\n")
    write_trajectories(path, [make_trajectory(2)], append=True)
    reader = read_trajectories(path)
    assert next(reader).id == "tr0"
    assert next(reader).id == "tr1"
    with pytest.raises(CorruptLineError) as info:
        next(reader)
    assert info.value.line_no == 3
    assert f"{path}:3" in str(info.value)
    assert reason in str(info.value).lower()


def test_totals_are_derived_from_steps() -> None:
    trajectory = make_trajectory(1)
    trajectory.steps.append(
        Step(index=1, action=Finish(), feedback=Feedback.fail("transient", "x"))
    )
    totals = trajectory.recompute_totals(wall_time_s=1.5)
    assert (totals.turns, totals.tool_calls, totals.errors, totals.wall_time_s) == (2, 1, 1, 1.5)


def offered_trajectory() -> Trajectory:
    trajectory = make_trajectory(4)
    trajectory.tools = [
        ToolSpec(name="parking_find", description="find", app="parking"),
        ToolSpec(name="parking_renew", description="renew", app="parking", side_effect="payment"),
        ToolSpec(name="parking_cancel", description="cancel", app="parking", side_effect="write"),
    ]
    trajectory.skills = [SkillSpec(app="parking", name="renew", text="parking_find first")]
    return trajectory


def test_trajectories_carry_the_tools_and_skills_they_offered(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [offered_trajectory()])
    (loaded,) = read_trajectories(path)
    assert loaded == offered_trajectory()
    assert [(t.name, t.side_effect) for t in loaded.tools] == [
        ("parking_find", "read"),
        ("parking_renew", "payment"),
        ("parking_cancel", "write"),
    ]
    assert [s.id for s in loaded.skills] == ["parking.renew"]
    renew, cancel = loaded.tool("parking_renew"), loaded.tool("parking_cancel")
    assert renew is not None and renew.changes_state and renew.needs_confirmation
    assert cancel is not None and cancel.changes_state and not cancel.needs_confirmation
    find = loaded.tool("parking_find")
    assert find is not None and not find.changes_state
    assert loaded.tool("x") is None


def test_a_trajectory_written_before_tools_were_recorded_reads_with_none() -> None:
    old = make_trajectory(5).model_dump(mode="json")
    del old["tools"], old["skills"]
    loaded = Trajectory.model_validate_json(json.dumps(old))
    assert loaded.tools == [] and loaded.skills == [] and loaded.tool("x") is None


def test_recorded_tools_are_validated_naming_the_field() -> None:
    data = offered_trajectory().model_dump(mode="json")
    data["tools"][1]["side_effect"] = "delete"
    with pytest.raises(ValidationError) as info:
        Trajectory.model_validate(data)
    assert "tools.1.side_effect" in str(info.value)
    data = offered_trajectory().model_dump(mode="json")
    data["skills"][0]["app"] = ""
    with pytest.raises(ValidationError) as info:
        Trajectory.model_validate(data)
    assert "skills.0.app" in str(info.value)
