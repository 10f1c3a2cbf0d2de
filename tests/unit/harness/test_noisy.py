"""The noisy planner over the sandbox suite: faults are injected, labelled, and make tasks fail."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from qpa.contract import Feedback, MemoryItem, Task, ToolCall, Trajectory
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.noisy import FAULT_KINDS, GIVE_UP_ANSWER, NoisyPlanner, perturb
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

_REF = re.compile(r"\$\{(\d+)")


@pytest.fixture(scope="module")
def suite() -> tuple[Task, ...]:
    return generate_suite()


@pytest.fixture(scope="module")
def env() -> SandboxEnv:
    return SandboxEnv()


def labels(trajectory: Trajectory) -> list[dict[str, Any]]:
    return [
        s.annotations["injected_fault"]
        for s in trajectory.steps
        if "injected_fault" in s.annotations
    ]


def uses_memory(task: Task) -> bool:
    values = [m.value for m in task.memory]
    for action in task.reference_plan or []:
        fields = list(action.arguments.values()) if isinstance(action, ToolCall) else []
        if action.type == "finish" and action.answer:
            fields.append(action.answer)
        for value in fields:
            if isinstance(value, str) and any(
                v == value or (len(v) >= 3 and v in value) for v in values
            ):
                return True
    return False


def test_fault_rate_zero_is_the_oracle(suite: tuple[Task, ...], env: SandboxEnv) -> None:
    noisy, oracle = NoisyPlanner(fault_rate=0.0), OraclePlanner()
    successes = 0
    for task in suite:
        quiet = run_episode(env, task, noisy)
        reference = run_episode(env, task, oracle)
        assert not labels(quiet)
        assert noisy.planned is None and noisy.injected is None
        assert [s.action for s in quiet.steps] == [s.action for s in reference.steps], task.id
        assert quiet.success == reference.success, task.id
        successes += quiet.success
    # the oracle solves the suite (its own tests hold every task to it)
    assert successes >= 0.99 * len(suite)


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind_is_injected_once_and_labelled(
    kind: str, suite: tuple[Task, ...], env: SandboxEnv
) -> None:
    planner = NoisyPlanner(fault_rate=1.0, faults=(kind,), seed=3)
    injected: Counter[str] = Counter()
    failed = 0
    for task in suite:
        trajectory = run_episode(env, task, planner)
        found = labels(trajectory)
        assert len(found) == 1, (task.id, found)
        label = found[0]
        assert set(label) >= {"kind", "step", "detail"}
        assert label["requested"] == kind
        assert isinstance(label["detail"], str) and label["detail"]
        assert 0 <= label["step"] <= len(task.reference_plan or [])
        assert planner.injected == label
        expected = kind if kind != "ignores_memory" or uses_memory(task) else "wrong_argument"
        assert label["kind"] == expected, (task.id, label)
        injected[label["kind"]] += 1
        failed += not trajectory.success
    assert injected[kind] > 0
    assert failed >= 0.8 * len(suite), f"{kind}: only {failed}/{len(suite)} episodes failed"


def test_most_faulted_episodes_fail(suite: tuple[Task, ...], env: SandboxEnv) -> None:
    planner = NoisyPlanner(fault_rate=1.0, seed=11)
    kinds: Counter[str] = Counter()
    failed = 0
    for task in suite:
        trajectory = run_episode(env, task, planner)
        (label,) = labels(trajectory)
        kinds[label["requested"]] += 1
        failed += not trajectory.success
    assert failed >= 0.9 * len(suite)
    assert set(kinds) == set(FAULT_KINDS)  # every kind is drawn somewhere in the suite


def test_fault_choice_is_deterministic_per_seed_and_task(
    suite: tuple[Task, ...], env: SandboxEnv
) -> None:
    def run(seed: int) -> list[Any]:
        planner = NoisyPlanner(fault_rate=0.5, seed=seed)
        return [labels(run_episode(env, task, planner)) for task in suite]

    first, again, other = run(0), run(0), run(1)
    assert first == again
    assert first != other
    faulted = sum(1 for found in first if found)
    assert 0.3 * len(suite) <= faulted <= 0.7 * len(suite)


def test_skipped_step_keeps_later_references_aligned(
    suite: tuple[Task, ...], env: SandboxEnv
) -> None:
    planner = NoisyPlanner(fault_rate=1.0, faults=("skipped_step",))
    for task in suite:
        trajectory = run_episode(env, task, planner)
        (label,) = labels(trajectory)
        skipped = label["step"]
        executed = [s.annotations.get("plan_step") for s in trajectory.steps]
        assert skipped not in executed
        # steps that had no result: the skipped one, and those the skip made fail
        missing = {skipped} | {
            s.annotations["plan_step"]
            for s in trajectory.steps
            if s.feedback.status == "error" and "plan_step" in s.annotations
        }
        for step in trajectory.steps:
            if isinstance(step.action, ToolCall) and "${" in str(step.action.arguments):
                # only references to steps without a result may stay unresolved
                assert {int(i) for i in _REF.findall(str(step.action.arguments))} <= missing


def test_gives_up_early_finishes_before_the_work(suite: tuple[Task, ...], env: SandboxEnv) -> None:
    planner = NoisyPlanner(fault_rate=1.0, faults=("gives_up_early",))
    for task in suite[:40]:
        trajectory = run_episode(env, task, planner)
        assert len(labels(trajectory)) == 1
        step = next(s for s in trajectory.steps if "injected_fault" in s.annotations)
        assert step.action.type == "finish" and step.action.answer == GIVE_UP_ANSWER
        assert not trajectory.success


def test_wrong_tool_calls_another_offered_tool(suite: tuple[Task, ...], env: SandboxEnv) -> None:
    planner = NoisyPlanner(fault_rate=1.0, faults=("wrong_tool",))
    for task in suite[:40]:
        trajectory = run_episode(env, task, planner)
        step = next(s for s in trajectory.steps if "injected_fault" in s.annotations)
        planned = (task.reference_plan or [])[step.annotations["injected_fault"]["step"]]
        assert isinstance(step.action, ToolCall) and isinstance(planned, ToolCall)
        assert step.action.tool != planned.tool
        assert step.action.tool in task.tools


# --------------------------------------------------------------------------- memory


def memory_task(suite: tuple[Task, ...], memory: list[MemoryItem]) -> Task:
    base = next(t for t in suite if t.template == "add_new_contact")
    return base.model_copy(update={"memory": memory, "id": base.id + ".memory"})


def name_in_plan(task: Task) -> str:
    call = (task.reference_plan or [])[0]
    assert isinstance(call, ToolCall)
    return str(call.arguments["name"])


def test_ignores_memory_uses_the_superseded_value(suite: tuple[Task, ...], env: SandboxEnv) -> None:
    probe = memory_task(suite, [])
    name = name_in_plan(probe)
    task = memory_task(
        suite,
        [
            MemoryItem(key="new colleague", value="Old Name", evidence="inferred"),
            MemoryItem(key="new colleague", value=name, evidence="stated"),
        ],
    )
    planner = NoisyPlanner(fault_rate=1.0, faults=("ignores_memory",))
    trajectory = run_episode(env, task, planner)
    (label,) = labels(trajectory)
    assert label["kind"] == "ignores_memory"
    assert "new colleague" in label["detail"]
    call = trajectory.steps[label["step"]].action
    assert isinstance(call, ToolCall) and call.arguments["name"] == "Old Name"
    assert not trajectory.success


def test_ignores_memory_without_a_conflict_picks_a_plausible_other_value(
    suite: tuple[Task, ...], env: SandboxEnv
) -> None:
    name = name_in_plan(memory_task(suite, []))
    task = memory_task(suite, [MemoryItem(key="new colleague", value=name)])
    planner = NoisyPlanner(fault_rate=1.0, faults=("ignores_memory",))
    trajectory = run_episode(env, task, planner)
    (label,) = labels(trajectory)
    assert label["kind"] == "ignores_memory"
    call = trajectory.steps[label["step"]].action
    assert isinstance(call, ToolCall) and call.arguments["name"] != name
    existing = {c["name"] for c in task.world["contacts"]["contacts"]}
    assert call.arguments["name"] in existing  # a sibling value from the world
    assert not trajectory.success


def test_ignores_memory_falls_back_to_wrong_argument(
    suite: tuple[Task, ...], env: SandboxEnv
) -> None:
    task = memory_task(suite, [])
    planner = NoisyPlanner(fault_rate=1.0, faults=("ignores_memory",))
    trajectory = run_episode(env, task, planner)
    (label,) = labels(trajectory)
    assert (label["kind"], label["requested"]) == ("wrong_argument", "ignores_memory")
    assert not trajectory.success


# --------------------------------------------------------------------------- odds and ends


def test_planner_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        NoisyPlanner(faults=("typo",))
    with pytest.raises(ValueError, match="fault_rate"):
        NoisyPlanner(fault_rate=1.5)
    assert NoisyPlanner().name == "noisy"
    chosen = NoisyPlanner(fault_rate="0.25", faults="skipped_step, wrong_tool")  # type: ignore[arg-type]
    assert chosen.faults == ("wrong_tool", "skipped_step") and chosen.fault_rate == 0.25


def test_a_plan_without_tool_calls_still_gets_a_fault(suite: tuple[Task, ...]) -> None:
    from qpa.contract import Finish

    task = suite[0].model_copy(
        update={"reference_plan": [Finish(answer="42")], "id": "answer-only"}
    )
    planner = NoisyPlanner(fault_rate=1.0, faults=("skipped_step",))
    planner.start(task, [], Feedback.ok())
    decision = planner.decide(None)
    label = decision.annotations["injected_fault"]
    assert label["kind"] == "gives_up_early" and label["requested"] == "skipped_step"
    assert decision.action.type == "finish" and decision.action.answer != "42"


@pytest.mark.parametrize(
    "value",
    [True, 3, 2.5, "+1-555-0100", "Ana Lima", "x", "", ["a", "b"], ["a"], [], {"k": 1}, None],
)
def test_perturb_changes_the_value(value: Any) -> None:
    assert perturb(value) != value


def test_a_fault_at_a_read_step_spoils_the_answer_of_a_read_only_plan(
    suite: tuple[Task, ...], env: SandboxEnv
) -> None:
    from qpa.contract import Finish, VerifierSpec

    base = next(t for t in suite if t.template == "add_new_contact")
    person = base.world["contacts"]["contacts"][2]
    task = base.model_copy(
        update={
            "id": base.id + ".lookup",
            "instruction": f"What is {person['name']}'s number?",
            "reference_plan": [
                ToolCall(tool="contacts_search", arguments={"query": person["name"]}),
                Finish(answer=person["phone"]),
            ],
            "verifier": VerifierSpec(answer=person["phone"]),
        }
    )
    assert run_episode(env, task, OraclePlanner()).success
    for kind in ("skipped_step", "wrong_tool", "wrong_argument"):
        trajectory = run_episode(env, task, NoisyPlanner(fault_rate=1.0, faults=(kind,)))
        (label,) = labels(trajectory)
        assert label["kind"] == kind and label["step"] == 0
        assert "no longer grounded" in label["detail"]
        final = trajectory.steps[-1]
        assert final.annotations["fault_consequence"]["kind"] == "ungrounded_answer"
        assert isinstance(final.action, Finish) and final.action.answer != person["phone"]
        assert not trajectory.success
