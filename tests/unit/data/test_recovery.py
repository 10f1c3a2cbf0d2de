"""Recovery in the data: injected transient errors, the recovering oracle, collection with both,
and the SFT labels of a recovered trajectory (the wrong call gets no loss, the correction does)."""

from __future__ import annotations

from typing import Any

import pytest

from qpa.contract import Task, ToolCall
from qpa.data.collect import collect, read_collected
from qpa.data.curate import curate
from qpa.data.mix import MixConfig, build_rows, plan_mixture
from qpa.data.render import Renderer, mask_reason
from qpa.envs.faults import (
    INJECTED,
    TRANSIENT_MESSAGE,
    InjectionLog,
    TransientFaults,
    injected_episode,
    met_injected_error,
)
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.factory import PlannerSpec
from qpa.harness.planners import OraclePlanner
from qpa.harness.recovery import MISTAKE_MASK, RecoveringPlanner, recovery_roles
from qpa.harness.runner import run_episode

SUITE = generate_suite()


def task_of(template: str) -> Task:
    return next(t for t in SUITE if t.template == template and t.split == "train")


def first_write(task: Task) -> int:
    env = SandboxEnv()
    env.reset(task)
    writes = {t.name for t in env.tools() if t.changes_state}
    plan = task.reference_plan or []
    return next(i for i, a in enumerate(plan) if isinstance(a, ToolCall) and a.tool in writes)


# --------------------------------------------------------------------------- the wrapper


def test_injected_error_answers_the_first_write_once_and_leaves_state_untouched() -> None:
    task = task_of("add_song_to_workout_playlist")
    inner = SandboxEnv()
    env = TransientFaults(inner, rate=1.0, seed=3)
    env.reset(task)
    writes = {t.name for t in env.tools() if t.changes_state}
    plan = [a for a in task.reference_plan or [] if isinstance(a, ToolCall)]
    read = next(a for a in plan if a.tool not in writes)
    assert env.step(read).status == "ok"  # reads pass through
    before = inner.state()
    write = ToolCall(tool=sorted(writes)[0], arguments={})
    answered = env.step(write)
    assert (answered.status, answered.error, answered.message) == (
        "error",
        "transient",
        TRANSIENT_MESSAGE,
    )
    assert inner.state() == before  # the wrapped environment never saw the call
    again = env.step(write)
    assert again.error != "transient"  # a retry reaches the sandbox (which judges it itself)


def test_the_draw_is_seeded_per_task_and_rate_bounds_hold() -> None:
    ids = [f"t{i}" for i in range(400)]
    half = [injected_episode(7, i, 0.5) for i in ids]
    assert half == [injected_episode(7, i, 0.5) for i in ids]
    assert 150 < sum(half) < 250
    assert half != [injected_episode(8, i, 0.5) for i in ids]
    assert all(injected_episode(0, i, 1.0) for i in ids)
    assert not any(injected_episode(0, i, 0.0) for i in ids)
    with pytest.raises(ValueError, match="transient_error_rate"):
        TransientFaults(SandboxEnv(), rate=1.5)


# --------------------------------------------------------------------------- the planner


def test_oracle_without_recovery_fails_an_injected_error_the_recovering_one_retries() -> None:
    task = task_of("add_new_contact")
    at = first_write(task)
    log = InjectionLog(1.0, 0)
    plain = run_episode(log.wrap(SandboxEnv()), task, OraclePlanner())
    assert log.mark(plain) == [at] and not plain.success

    log = InjectionLog(1.0, 0)
    recovered = run_episode(log.wrap(SandboxEnv()), task, RecoveringPlanner(mistake_rate=0.0))
    assert log.mark(recovered) == [at] and met_injected_error(recovered)
    assert recovered.success
    assert recovered.steps[at].annotations[INJECTED] == {
        "kind": "transient",
        "tool": recovered.steps[at].action.tool,  # type: ignore[union-attr]
    }
    assert recovery_roles(recovered.steps) == {at + 1: "retry"}
    assert recovered.steps[at + 1].action == recovered.steps[at].action
    assert recovered.metadata["injected_errors"] == [at]


def test_recovering_oracle_corrects_a_rejected_call_and_keeps_references_aligned() -> None:
    task = task_of("add_song_to_workout_playlist")  # its write uses ${i} results of reads
    trajectory = run_episode(SandboxEnv(), task, RecoveringPlanner(mistake_rate=1.0, seed=1))
    assert trajectory.success
    roles = recovery_roles(trajectory.steps)
    (mistake,) = [i for i, r in roles.items() if r == "mistake"]
    assert roles == {mistake: "mistake", mistake + 1: "correction"}
    wrong, fixed = trajectory.steps[mistake], trajectory.steps[mistake + 1]
    assert wrong.feedback.error == "invalid_arguments"  # the sandbox's own answer
    assert fixed.feedback.status == "ok"
    assert isinstance(wrong.action, ToolCall) and isinstance(fixed.action, ToolCall)
    assert wrong.action.tool == fixed.action.tool
    assert set(fixed.action.arguments) - set(wrong.action.arguments)
    assert mask_reason(wrong) == MISTAKE_MASK and mask_reason(fixed) is None
    assert fixed.annotations["recovery"]["of_step"] == mistake
    assert "${" not in str(fixed.action.arguments)  # grounded in the reads' results


def test_mistake_rate_zero_is_the_oracle() -> None:
    task = task_of("add_new_contact")
    ours = run_episode(SandboxEnv(), task, RecoveringPlanner(mistake_rate=0.0))
    oracle = run_episode(SandboxEnv(), task, OraclePlanner())
    assert [s.action for s in ours.steps] == [s.action for s in oracle.steps]
    with pytest.raises(ValueError, match="mistake_rate"):
        RecoveringPlanner(mistake_rate=-0.1)


# --------------------------------------------------------------------------- collection -> SFT


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    root = tmp_path_factory.mktemp("recovering")
    tasks = [t for t in SUITE if t.split == "train" and t.template == "add_new_contact"][:6]
    result = collect(
        tasks,
        PlannerSpec(name="oracle", seed=2),
        out=str(root / "out"),
        spool_dir=root / "spool",
        recovering=True,
        mistake_rate=0.5,
        transient_error_rate=0.5,
        concurrency=2,
    )
    assert result.complete and result.successes == result.ran == 6
    manifest = (root / "out" / "manifest.json").read_text()
    assert '"transient_error_rate": 0.5' in manifest and '"mistake_rate": 0.5' in manifest
    return read_collected(str(root / "out"))


def test_collection_records_injected_errors_and_recoveries(collected: list[Any]) -> None:
    injected = [t for t in collected if met_injected_error(t)]
    mistakes = [t for t in collected if "mistake" in recovery_roles(t.steps).values()]
    assert injected and mistakes
    assert len(injected) == sum(injected_episode(2, t.task.id, 0.5) for t in collected)
    for t in injected:
        (at,) = t.metadata["injected_errors"]
        assert t.steps[at].feedback.error == "transient"
        assert recovery_roles(t.steps)[at + 1] in ("retry", "correction")


def test_sft_labels_of_a_recovered_trajectory(collected: list[Any]) -> None:
    """Token level: every token of the wrong call is ignored (-100), every token of the
    correction is trained, on a real collected, curated and mixed trajectory."""
    pytest.importorskip("transformers")
    from qpa.train.sft import IGNORE_INDEX, encode_conversation, render_with_spans
    from qpa.train.tiny import build_tokenizer

    curated = curate(collected)
    recovered = next(t for t in curated.successes if "mistake" in recovery_roles(t.steps).values())
    roles = recovery_roles(recovered.steps)
    mistake = next(i for i, r in roles.items() if r == "mistake")
    assert recovered.metadata["curation"]["flagged_steps"] == [mistake]
    summary = curated.summary()
    assert summary["recovered_successes"] == sum(1 for t in collected if recovery_roles(t.steps))
    assert summary["injected_errors"] == sum(met_injected_error(t) for t in collected)
    plan = plan_mixture([recovered], MixConfig(target_size=1))
    (row,) = build_rows(plan, Renderer())
    (conversation,) = Renderer().conversations(recovered)
    messages = row["messages"]
    assert messages == conversation.messages
    turns = [m for m in messages if m["role"] == "assistant"]
    by_step = dict(zip(conversation.steps, turns, strict=True))
    wrong, fixed = by_step[mistake], by_step[mistake + 1]
    assert (wrong["train"], fixed["train"]) == (False, True)

    tokenizer = build_tokenizer([m["content"] for m in messages] * 2, vocab_size=600)
    text, _, _, _ = render_with_spans(tokenizer, messages)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    encoded = encode_conversation(tokenizer, messages)
    assert encoded.input_ids == list(encoding["input_ids"])

    def labels_within(content: str, after: int) -> tuple[list[int], list[int], int]:
        start = text.index(content, after)
        end = start + len(content)
        inside = [
            i for i, (a, b) in enumerate(encoding["offset_mapping"]) if b > a and start <= a < end
        ]
        return [encoded.labels[i] for i in inside], [encoded.input_ids[i] for i in inside], end

    wrong_labels, _, end = labels_within(wrong["content"], 0)
    fixed_labels, fixed_ids, _ = labels_within(fixed["content"], end)
    assert wrong_labels and set(wrong_labels) == {IGNORE_INDEX}
    assert fixed_labels == fixed_ids and IGNORE_INDEX not in fixed_labels


# --------------------------------------------------------------------------- recovery rate


def test_recovery_summary_counts_episodes_that_met_the_error() -> None:
    from qpa.loop.recovery import recovery_entries, recovery_markdown
    from qpa.train.recovery_eval import recovery_summary

    task = task_of("add_new_contact")
    reader = next(t for t in SUITE if t.split == "train" and first_write_or_none(t) is None)
    runs = []
    for planner, on in (
        (RecoveringPlanner(mistake_rate=0.0), task),
        (OraclePlanner(), task),
        (OraclePlanner(), reader),  # no state-changing call: never meets the error
    ):
        log = InjectionLog(1.0, 0)
        trajectory = run_episode(log.wrap(SandboxEnv()), on, planner)
        log.mark(trajectory)
        runs.append(trajectory)
    summary = recovery_summary(runs)
    assert summary == {
        "episodes": 3,
        "episodes_with_error": 2,
        "recovered": 1,
        "rate": 0.5,
        "ci": [0.094529, 0.905471],  # Wilson: 0.5 -+ 1.96 sqrt(0.3651) / 2.9208
        "retried": 1,
    }
    entries = recovery_entries({"tasks": 3, "models": {"sft": {**summary, "model": "m"}}})
    assert entries == {"sft": summary}
    table = recovery_markdown({"sft": {"recovery": summary}, "rl": {}})
    assert table[-1] == "| sft | 2/3 | 1 | 50.0% | [9.5%, 90.5%] | 1 |"
    assert recovery_markdown({"sft": {}}) == []


def first_write_or_none(task: Task) -> int | None:
    try:
        return first_write(task)
    except StopIteration:
        return None
