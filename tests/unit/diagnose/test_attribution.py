"""Failure attribution, rule by rule: hand-edited trajectories (a clean Harness run, then one
thing changed) and generated ones (the noisy planner, the injected Harness/environment faults)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from helpers.faults import (
    FAULTS,
    SkillSensitiveBackend,
    expected_noisy_cause,
    run_harness,
    run_noisy,
    task_skills,
)

from qpa.contract import (
    Action,
    CheckResult,
    Feedback,
    Finish,
    MessageUser,
    Step,
    Task,
    ToolCall,
    Trajectory,
    Verification,
)
from qpa.diagnose import CAUSES, SIDES, diagnose, extract_calls, skills_needed
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.backends.scripted import OracleBackend

SUITE = generate_suite()


def first(template: str, index: int = 0) -> Task:
    return [t for t in SUITE if t.template == template and t.split == "test"][index]


@cache
def clean(template: str) -> Trajectory:
    """A successful run through the default Harness (the base every hand edit starts from)."""
    task = first(template)
    trajectory = run_harness(task, SkillSensitiveBackend(task))
    assert trajectory.success, trajectory.error
    return trajectory


def step(action: Action, feedback: Feedback | None = None, **notes: Any) -> Step:
    return Step(index=0, action=action, feedback=feedback or Feedback.ok({}), annotations=notes)


def failed(
    base: Trajectory,
    steps: list[Step] | None = None,
    *,
    error: str | None = None,
    checks: list[CheckResult] | None = None,
    verification: Verification | str | None = "failed",
    answer: str | None = None,
) -> Trajectory:
    """`base` turned into a failure: new steps (first-step annotations kept), error, checks."""
    new_steps = [s.model_copy(deep=True) for s in (steps if steps is not None else base.steps)]
    if steps is not None and new_steps and base.steps:
        notes = {k: v for k, v in base.steps[0].annotations.items() if k != "model_output"}
        new_steps[0].annotations = {**notes, **new_steps[0].annotations}
    for i, s in enumerate(new_steps):
        s.index = i
    verdict = (
        Verification(
            done=True,
            success=False,
            progress=0.0,
            checks=checks or [CheckResult(name="state", passed=False)],
        )
        if verification == "failed"
        else verification
    )
    return base.model_copy(
        update={"steps": new_steps, "error": error, "verification": verdict, "answer": answer}
    )


def call(tool: str, **arguments: Any) -> ToolCall:
    return ToolCall(tool=tool, arguments=arguments)


def verdict(trajectory: Trajectory, **kwargs: Any) -> tuple[str, str]:
    found = diagnose(trajectory, **kwargs)
    assert found is not None
    assert found.reason and "\n" not in found.reason and len(found.reason) <= 240
    assert found.side == CAUSES[found.cause]
    assert found.capabilities == trajectory.task.capabilities
    return found.side, found.cause


# --------------------------------------------------------------------------- basics


def test_successes_are_not_diagnosed() -> None:
    assert diagnose(clean("text_contact_by_name")) is None


def test_every_cause_belongs_to_one_side() -> None:
    assert set(CAUSES.values()) == set(SIDES)


# --------------------------------------------------------------------------- environment


def test_environment_errors_and_time_outs_end_the_episode_on_the_environment() -> None:
    base = clean("text_contact_by_name")
    dead = failed(base, base.steps[:1], error="environment: ConnectionError: server closed")
    assert verdict(dead) == ("environment", "environment_error")
    slow = failed(base, base.steps[:1], error="environment: TimeoutError: step timed out")
    assert verdict(slow) == ("environment", "timeout")
    endpoint = failed(base, [], error="environment: model endpoint failed: connection refused")
    assert verdict(endpoint) == ("environment", "environment_error")
    unjudged = failed(base, verification=None)
    assert verdict(unjudged) == ("environment", "verification_missing")


def test_an_unrecovered_environment_failure_before_any_mistake_is_the_environment() -> None:
    base = clean("text_contact_by_name")
    search, send, finish = base.steps
    crashed = send.model_copy(
        update={"feedback": Feedback.fail("environment_failure", "messaging crashed")}
    )
    found = diagnose(failed(base, [search, crashed, finish]))
    assert found is not None and (found.side, found.cause, found.step) == (
        "environment",
        "environment_error",
        1,
    )
    # a detour (a re-check of the search) before the crashed call changes nothing
    assert verdict(failed(base, [search, search, crashed, finish]))[0] == "environment"


def test_a_recovered_environment_failure_does_not_excuse_a_model_mistake() -> None:
    base = clean("text_contact_by_name")
    search, send, finish = base.steps
    assert isinstance(send.action, ToolCall)
    crashed = send.model_copy(update={"feedback": Feedback.fail("transient", "busy")})
    wrong = step(call("messaging_send", **{**send.action.arguments, "text": "something else"}))
    assert verdict(failed(base, [search, crashed, send, wrong, finish])) == (
        "model",
        "extra_action",
    )
    # an environment failure after the model already went wrong is not the cause
    later = step(call("contacts_search", query="x"), Feedback.fail("environment_failure", "boom"))
    assert verdict(failed(base, [search, wrong, later, finish])) == ("model", "wrong_arguments")


# --------------------------------------------------------------------------- harness


def test_a_needed_tool_the_harness_did_not_expose_is_the_harness() -> None:
    base = clean("schedule_text")
    search, _, _ = base.steps
    tools = [t for t in base.task.tools if t != "messaging_schedule"]
    hidden = step(Finish(answer="I can't do this: no tool to schedule texts."))
    trajectory = failed(base, [search.model_copy(update={"annotations": {}}), hidden])
    trajectory.steps[0].annotations["tools_exposed"] = tools
    found = diagnose(trajectory)
    assert found is not None and (found.side, found.cause) == ("harness", "tool_not_exposed")
    assert found.step == 1 and found.plan_step == 1 and "messaging_schedule" in found.reason


def test_a_hidden_tool_is_not_blamed_when_the_model_failed_before_needing_it() -> None:
    base = clean("schedule_text")
    wrong_search = step(call("contacts_search", query="Somebody Else"))
    trajectory = failed(base, [wrong_search, step(Finish())])
    trajectory.steps[0].annotations["tools_exposed"] = ["contacts_search"]
    assert verdict(trajectory) == ("model", "wrong_arguments")


def test_a_valid_call_the_parser_rejected_is_the_harness_and_garbage_is_the_model() -> None:
    base = clean("add_new_contact")
    create, _ = base.steps
    assert isinstance(create.action, ToolCall)
    raw = f"<function=contacts_create>{json.dumps(create.action.arguments)}</function>"
    rejected = step(
        MessageUser(text=raw),
        Feedback.fail("malformed_action", "the output names no tool"),
        parse_failure={"kind": "malformed_output", "message": "names no tool", "raw": raw},
    )
    trajectory = failed(base, [rejected, rejected, rejected], error=None)
    assert verdict(trajectory) == ("harness", "parser_rejected_valid_call")
    # the same call made natively later went through: the rejection did not cause the failure
    later_ok = failed(base, [rejected, create, step(Finish())])
    assert diagnose(later_ok) is None or verdict(later_ok)[1] != "parser_rejected_valid_call"
    # a call with arguments that break the tool's schema was rightly rejected
    bad = '<function=contacts_create>{"name": "Bo"}</function>'
    garbage = step(
        MessageUser(text=bad),
        Feedback.fail("malformed_action", "names no tool"),
        parse_failure={"kind": "malformed_output", "message": "names no tool", "raw": bad},
    )
    assert verdict(failed(base, [garbage, step(Finish())])) == ("model", "malformed_output")
    assert verdict(failed(base, [garbage, garbage, step(Finish())])) == (
        "model",
        "ignored_feedback",
    )


def test_the_guard_refusing_the_plans_own_call_is_the_harness() -> None:
    base = clean("text_contact_by_name")
    search, send, finish = base.steps
    refused = send.model_copy(
        update={
            "feedback": Feedback.fail("permission_denied", "from a tool result"),
            "annotations": {"guard": "argument 'to' comes from a tool result"},
        }
    )
    assert verdict(failed(base, [search, refused, finish])) == (
        "harness",
        "guard_rejected_valid_call",
    )
    injected = step(
        call("messaging_send", to="+1-555-0000", text="forward everything"),
        Feedback.fail("permission_denied", "from a tool result"),
        guard="argument comes from a tool result",
    )
    assert verdict(failed(base, [search, injected, finish]))[0] == "model"


def test_a_missing_needed_skill_is_the_harness_only_where_the_failure_is_in_its_app() -> None:
    base = clean("schedule_text")
    search, schedule, finish = base.steps
    assert isinstance(schedule.action, ToolCall)
    args = schedule.action.arguments
    send_now = step(call("messaging_send", to=args["to"], text=args["text"]))
    without = [s for s in base.steps[0].annotations["skills_exposed"] if "scheduled" not in s]

    def with_skills(skills: list[str], steps: list[Step]) -> Trajectory:
        trajectory = failed(base, steps)
        trajectory.steps[0].annotations["skills_exposed"] = skills
        return trajectory

    assert verdict(with_skills(without, [search, send_now, finish])) == (
        "harness",
        "skill_not_injected",
    )
    exposed = base.steps[0].annotations["skills_exposed"]
    assert verdict(with_skills(exposed, [search, send_now, finish])) == ("model", "wrong_tool")
    # the failure is in the contacts step, before the Skill mattered
    wrong_search = step(call("contacts_search", query="Nobody"))
    assert verdict(with_skills(without, [wrong_search, finish])) == ("model", "wrong_arguments")
    # the needed Skills can be given explicitly
    assert verdict(
        with_skills(exposed, [search, send_now, finish]), skills_needed=["messaging.missing"]
    ) == ("harness", "skill_not_injected")


def test_memory_the_retriever_missed_is_the_harness_and_memory_ignored_is_the_model() -> None:
    base = clean("text_partner_from_memory")
    stale = next(m.value for m in base.task.memory if m.evidence == "inferred")
    wrong = step(call("contacts_search", query=stale))

    def retrieved(lines: list[str]) -> Trajectory:
        trajectory = failed(base, [wrong, step(Finish())])
        trajectory.steps[0].annotations["memory_retrieved"] = lines
        return trajectory

    assert verdict(retrieved([])) == ("harness", "memory_retrieval_miss")
    kept = base.steps[0].annotations["memory_retrieved"]
    assert verdict(retrieved(kept)) == ("model", "ignored_memory")
    gave_up = failed(base, [step(Finish(answer="Sorry, who is your partner?"))])
    gave_up.steps[0].annotations["memory_retrieved"] = []
    assert verdict(gave_up) == ("harness", "memory_retrieval_miss")


def test_a_budget_that_cuts_a_model_on_track_is_the_harness_a_looping_model_is_not() -> None:
    base = clean("reply_to_latest_unread")
    on_track = failed(base, base.steps[:2], error="harness: turn budget of 2 exhausted")
    found = diagnose(on_track)
    assert found is not None and (found.side, found.cause) == ("harness", "budget_cut")
    tokens = failed(base, base.steps[:2], error="harness: token budget of 900 exhausted")
    assert verdict(tokens) == ("harness", "budget_cut")
    loop = [base.steps[0]] * 6
    assert verdict(failed(base, loop, error="harness: turn budget of 6 exhausted")) == (
        "model",
        "looping",
    )
    failing = step(
        call("contacts_get", contact_id="c_x"), Feedback.fail("precondition_failed", "x")
    )
    assert verdict(
        failed(base, [base.steps[0], failing, failing], error="harness: turn budget of 3 exhausted")
    ) == ("harness", "budget_cut")  # 3 turns cannot hold a 4-step plan
    assert verdict(
        failed(base, [base.steps[0], *[failing] * 9], error="harness: turn budget of 10 exhausted")
    ) == ("model", "ignored_feedback")


def test_harness_errors_that_are_not_budgets() -> None:
    base = clean("add_new_contact")
    trajectory = failed(base, [], error="harness: skill library could not be loaded")
    assert verdict(trajectory) == ("harness", "harness_error")


# --------------------------------------------------------------------------- model


def test_divergences_from_the_reference_plan() -> None:
    base = clean("reply_to_latest_unread")
    threads, search, send, finish = base.steps
    assert isinstance(send.action, ToolCall)
    other = step(call("messaging_read_thread", phone=send.action.arguments["to"]))
    assert verdict(failed(base, [threads, search, other, finish])) == ("model", "wrong_tool")
    assert verdict(failed(base, [threads, send, finish])) == ("model", "skipped_step")
    assert verdict(failed(base, [threads, search, step(Finish(answer="Sorry, I can't."))])) == (
        "model",
        "gave_up",
    )
    answered = failed(
        base,
        checks=[CheckResult(name="answer", passed=False, detail="expected 'Zoe', got 'Bo'")],
    )
    found = diagnose(answered)
    assert found is not None and (found.cause, found.step) == ("wrong_answer", 3)
    assert verdict(failed(base, [threads, search, step(MessageUser(text="Which one?"))])) == (
        "model",
        "gave_up",
    )


def test_noise_on_the_way_is_seen_through() -> None:
    base = clean("text_contact_by_name")
    search, send, finish = base.steps
    assert isinstance(search.action, ToolCall) and isinstance(send.action, ToolCall)
    recheck = search.model_copy(deep=True)
    typo = step(
        call("contacts_searchh", **search.action.arguments),
        Feedback.fail("unknown_tool", "no tool"),
        parse_failure={"kind": "unknown_tool", "message": "unknown", "raw": ""},
    )
    wrong = step(call("messaging_send", **{**send.action.arguments, "to": "+1-555-0000"}))
    found = diagnose(failed(base, [search, recheck, typo, wrong, finish]))
    assert found is not None and (found.cause, found.step) == ("wrong_arguments", 3)
    assert verdict(failed(base, [search, recheck, typo, finish])) == ("model", "skipped_step")


def test_without_a_reference_plan_the_verifier_decides() -> None:
    base = clean("reply_to_latest_unread")
    task = base.task.model_copy(update={"reference_plan": None})
    answer = CheckResult(name="answer", passed=False, detail="expected 'Zoe'")
    trajectory = failed(base, checks=[answer]).model_copy(update={"task": task})
    assert verdict(trajectory) == ("model", "wrong_answer")
    state = failed(base).model_copy(update={"task": task})
    assert verdict(state) == ("model", "failed_checks")


# --------------------------------------------------------------------------- helpers


def test_the_skills_a_task_needs() -> None:
    assert task_skills(first("schedule_text")) == ["messaging.scheduled_send"]
    assert task_skills(first("report_spam")) == ["messaging.spam_cleanup"]
    assert task_skills(first("text_contact_by_name")) == []  # no `skills` capability
    for task in SUITE:
        if task.split == "test" and "skills" in task.capabilities and task.id.endswith("000"):
            assert task_skills(task), task.id


def test_the_skills_a_task_needs_come_from_the_trajectory() -> None:
    base = clean("schedule_text")
    assert base.skills and all(s.app in base.task.apps for s in base.skills)
    assert skills_needed(base.task, base.skills, base.tools) == ["messaging.scheduled_send"]
    # a Harness whose library lacks the Skill could not have injected it: not needed there
    others = [s for s in base.skills if s.id != "messaging.scheduled_send"]
    assert skills_needed(base.task, others, base.tools) != ["messaging.scheduled_send"]


def test_calls_are_read_from_any_common_format() -> None:
    args = {"query": "Bo", "limit": 2}
    encoded = json.dumps(args)
    raws = [
        f"<function=contacts_search>{encoded}</function>",
        f'<tool_call>{{"name": "contacts_search", "arguments": {encoded}}}</tool_call>',
        json.dumps([{"name": "contacts_search", "arguments": json.dumps(encoded)}]),
        f"contacts_search({encoded})",
        '<invoke name="contacts_search"><parameter name="query">Bo</parameter>'
        '<parameter name="limit">2</parameter></invoke>',
        f'Sure! {{"function": {{"name": "functions.contacts_search", "arguments": {encoded}}}}}',
    ]
    for raw in raws:
        assert ("contacts_search", args) in extract_calls(raw), raw
    assert extract_calls("I think I will {not json") == []


# --------------------------------------------------------------------------- generated


@pytest.mark.parametrize("via_harness", [False, True])
def test_noisy_faults_are_the_model(via_harness: bool) -> None:
    tasks = [t for t in SUITE if t.split == "test"][::37]
    kinds: set[str] = set()
    for task in tasks:
        if via_harness and not run_harness(task, OracleBackend(task)).success:
            continue  # the guard asks about the clean plan itself: no model fault to find
        trajectory, label = run_noisy(task, seed=1, via_harness=via_harness, detour_every=3)
        if label is None or trajectory.success:
            continue
        kinds.add(label["kind"])
        found = diagnose(trajectory)
        assert found is not None and found.side == "model", (task.id, label, found)
        if found.cause == expected_noisy_cause(label):
            continue
        assert found.cause in {"skipped_step", "wrong_tool", "ignored_memory", "gave_up"}
    assert len(kinds) >= 4


def test_diagnosis_never_reads_the_injected_labels() -> None:
    task = first("text_family_group")
    trajectory, label = run_noisy(task, seed=3)
    assert label is not None
    stripped = trajectory.model_copy(deep=True)
    for s in stripped.steps:
        s.annotations = {}
    assert diagnose(stripped) == diagnose(trajectory)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_injected_harness_and_environment_faults(name: str) -> None:
    fault = FAULTS[name]
    templates = ["schedule_text", "text_partner_from_memory", "invite_three_friends"]
    tasks = [first(t) for t in templates if fault.applies(first(t))]
    assert tasks, name
    for task in tasks:
        for detours in (None, 2):
            trajectory = fault.inject(task, detours)
            if trajectory.success:
                assert name == "memory_k1"  # retrieval of one item may be enough
                continue
            found = diagnose(trajectory)
            assert found is not None
            assert (found.side, found.cause) == (fault.side, fault.cause), (task.id, found)
