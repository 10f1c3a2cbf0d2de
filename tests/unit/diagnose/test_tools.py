"""Diagnosis reads what each tool does from the trajectory: the runner records the tools every
environment kind offered (and the Harness's Skills); a trajectory written before that has tools of
unknown effect, which diagnosis names instead of taking them for reads."""

from __future__ import annotations

from typing import Any

from helpers.faults import task_skills

from qpa.contract import (
    Action,
    CheckResult,
    Feedback,
    Finish,
    Policy,
    Step,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
    Verification,
)
from qpa.diagnose import EpisodeTools, diagnose, skills_needed
from qpa.envs.device.actions import DEVICE_TOOLS
from qpa.envs.llmsim import LLMSimEnv
from qpa.envs.llmsim.tasks import get_longtail_task
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessPlanner
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode


def call(tool: str, **arguments: Any) -> ToolCall:
    return ToolCall(tool=tool, arguments=arguments)


def episode(
    task: Task, kind: Any, tools: list[ToolSpec], actions: list[Action], error: str | None = None
) -> Trajectory:
    """A failed episode of `task` that took `actions`, every one answered ok."""
    steps = [
        Step(index=i, action=a, feedback=Feedback.ok({}, done=isinstance(a, Finish)))
        for i, a in enumerate(actions)
    ]
    return Trajectory(
        id=f"{task.id}#0",
        task=task,
        env_kind=kind,
        policy=Policy(planner="harness"),
        tools=tools,
        steps=steps,
        error=error,
        verification=Verification(
            done=True, success=False, progress=0.0, checks=[CheckResult(name="s", passed=False)]
        ),
    )


def llmsim_tools(task: Task) -> list[ToolSpec]:
    env = LLMSimEnv("http://127.0.0.1:9/v1", "unused")  # reset and tools() ask no model
    try:
        assert env.reset(task).status == "ok"
        return env.tools()
    finally:
        env.close()


# --------------------------------------------------------------------------- recording


def test_the_runner_records_the_tools_offered_and_the_harness_its_skills() -> None:
    task = next(t for t in generate_suite() if t.template == "schedule_text")
    env = SandboxEnv()
    env.reset(task)
    offered = env.tools()
    harness = run_episode(SandboxEnv(), task, HarnessPlanner(OracleBackend(task)))
    assert harness.success and harness.tools == offered
    assert {s.app for s in harness.skills} == set(task.apps)
    assert "messaging.scheduled_send" in {s.id for s in harness.skills}
    # what the planner was shown is the exposure annotation, a subset of what was offered
    exposed = harness.steps[0].annotations["tools_exposed"]
    assert set(exposed) <= {t.name for t in harness.tools}
    assert skills_needed(harness.task, harness.skills, harness.tools) == task_skills(task)
    plain = run_episode(SandboxEnv(), task, OraclePlanner())
    assert plain.tools == offered and plain.skills == []  # a planner without Skills


def test_every_environment_kind_reports_its_writes() -> None:
    renew = get_longtail_task("parking.renew_permit.train.000")
    effects = {t.name: t.side_effect for t in llmsim_tools(renew)}
    assert effects["get_permit_status"] == "read"
    assert effects["renew_permit"] == "payment" and effects["cancel_permit"] == "write"
    assert {t.side_effect for t in DEVICE_TOOLS} == {"write"}  # any gesture may change the phone


def test_episode_tools_know_only_what_was_recorded() -> None:
    book = EpisodeTools.build(DEVICE_TOOLS, {"notes": {"list": "use tap then type_text"}})
    assert book.recorded and book.is_write("tap") and not book.is_read("tap")
    assert book.side_effect("finish") == "read"  # the Harness's pseudo-tools are always known
    assert book.side_effect("tap_twice") is None
    assert not book.is_write("tap_twice") and not book.is_read("tap_twice")
    assert book.skill_text("notes.list") == "use tap then type_text"
    assert book.named_tools(book.skill_text("notes.list")) == {"type_text"}
    assert book.app_of("tap") == "device"
    validator = book.validator("tap")
    assert validator is not None and not validator.is_valid({"x": 1})
    assert book.validator("tap_twice") is None
    assert not EpisodeTools.build([], {}).recorded


# --------------------------------------------------------------------------- diagnosis


def test_a_repeated_payment_on_llm_sim_is_an_extra_action_read_from_the_trajectory() -> None:
    task = get_longtail_task("parking.renew_permit.train.000")
    plan = task.reference_plan or []
    lookup, renew = plan[0], plan[1]
    assert isinstance(renew, ToolCall) and renew.tool == "renew_permit"
    actions: list[Action] = [lookup, renew, renew.model_copy(), Finish()]
    trajectory = episode(task, "llm_sim", llmsim_tools(task), actions)
    found = diagnose(trajectory)
    assert found is not None
    assert (found.side, found.cause, found.step) == ("model", "extra_action", 2)
    assert found.unknown_effects == []
    # the same episode written before tools were recorded: the effect is unknown, not a read
    old = trajectory.model_copy(update={"tools": []})
    found = diagnose(old)
    assert found is not None and (found.side, found.cause) == ("model", "failed_checks")
    assert found.unknown_effects == ["get_permit_status", "renew_permit"]


def device_task() -> Task:
    plan: list[Action] = [
        call("launch_app", package="com.qpa.messages"),
        call("tap", x=540, y=580),
        call("type_text", text="Running 10 minutes late"),
        call("tap", x=960, y=2225),
        Finish(),
    ]
    return Task(
        id="device.text_bob",
        domain="messaging",
        capabilities=["tool_use"],
        instruction="Text Bob that I'm running 10 minutes late",
        reference_plan=plan,
    )


def test_stray_gestures_on_a_device_are_writes_not_harmless_detours() -> None:
    task = device_task()
    plan = task.reference_plan or []
    strays: list[Action] = [call("tap", x=100 + 10 * i, y=300) for i in range(4)]
    actions = [plan[0], plan[1], *strays]
    budget = f"harness: turn budget of {len(actions)} exhausted"
    trajectory = episode(task, "device", list(DEVICE_TOOLS), actions, error=budget)
    found = diagnose(trajectory)
    # the taps changed the phone: the model wandered, the budget did not cut a model on track
    assert found is not None and (found.side, found.cause, found.step) == ("model", "wrong_tool", 2)
    assert found.unknown_effects == []
    # a harmless detour is a known read: without recorded tools nothing is harmless
    old = diagnose(trajectory.model_copy(update={"tools": []}))
    assert old is not None and old.side == "model"
    assert old.unknown_effects == ["launch_app", "tap"]


def test_a_second_send_tap_on_a_device_is_an_extra_action() -> None:
    task = device_task()
    plan = task.reference_plan or []
    send = plan[3]
    actions = [*plan[:4], call("tap", x=960, y=2225), plan[4]]
    assert isinstance(send, ToolCall)
    found = diagnose(episode(task, "device", list(DEVICE_TOOLS), actions))
    assert found is not None and (found.cause, found.step) == ("extra_action", 4)
