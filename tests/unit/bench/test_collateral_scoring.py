"""Collateral writes in `qpa bench`: counted in report.json (total, episodes, per capability,
per task, by app.collection), shown in report.md and compared; old reports read back with 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpa.bench.report import compare, render_markdown
from qpa.bench.scoring import EpisodeRecord, Report, score
from qpa.contract import (
    CollateralWrite,
    Policy,
    Task,
    ToolCall,
    Trajectory,
    Verification,
    read_trajectories,
    write_trajectories,
)
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

POLICY = Policy(planner="openai", model="planner-27b", harness_version="h1")


def _write(target: str, record_id: str) -> CollateralWrite:
    app, collection = target.split(".")
    return CollateralWrite(
        app=app, collection=collection, record_id=record_id, change="deleted", tool="x_delete"
    )


def _traj(
    task_id: str,
    *,
    success: bool = False,
    collateral: tuple[CollateralWrite, ...] = (),
    capabilities: tuple[str, ...] = ("tool_use",),
) -> Trajectory:
    task = Task(
        id=task_id,
        split="test",
        domain="calendar",
        capabilities=list(capabilities),
        instruction="do it",
    )
    return Trajectory(
        id=f"{task_id}#0",
        task=task,
        policy=POLICY,
        verification=Verification(
            done=True,
            success=success,
            progress=0.5 if collateral else float(success),
            collateral=list(collateral),
        ),
    )


def _run() -> list[Trajectory]:
    return [
        _traj("t1", success=True),
        _traj(
            "t2",
            collateral=(_write("calendar.events", "e1"), _write("calendar.events", "e2")),
            capabilities=("tool_use", "memory"),
        ),
        _traj("t3", collateral=(_write("messaging.messages", "m9"),)),
        _traj("t4", success=False),
    ]


def test_report_counts_collateral_writes() -> None:
    report = score(_run())
    assert report.collateral_writes == 3
    assert report.episodes_with_collateral == 2
    assert report.collateral_by_target == {"calendar.events": 2, "messaging.messages": 1}
    assert report.overall == 0.25  # episodes with collateral are failures
    tool_use, memory = report.by_capability["tool_use"], report.by_capability["memory"]
    assert (tool_use.collateral_writes, tool_use.episodes_with_collateral) == (3, 2)
    assert (memory.collateral_writes, memory.episodes_with_collateral) == (2, 1)
    assert report.per_task["t2"].collateral_writes == 2
    assert report.per_task["t2"].episodes_with_collateral == 1
    assert report.per_task["t1"].collateral_writes == 0
    assert score([EpisodeRecord.of(t) for t in _run()]).collateral_writes == 3


def test_report_md_and_comparison_show_collateral() -> None:
    report = score(_run())
    text = render_markdown(report)
    assert "| collateral writes (records changed unasked) | 3 in 2 episodes |" in text
    assert "## Collateral writes" in text
    assert "| calendar.events | 2 |" in text
    assert "| tool_use | 3 | 2 |" in text
    clean = score([_traj(t.task.id, success=True) for t in _run()])
    assert "## Collateral writes" not in render_markdown(clean)
    assert "| collateral writes (records changed unasked) | 0 in 0 episodes |" in (
        render_markdown(clean)
    )
    rows = {r.metric: r for r in compare(report, clean).rows}
    assert rows["collateral_writes"].delta == -3.0
    assert rows["episodes_with_collateral"].delta == -2.0
    assert rows["collateral_writes"].higher_is_better is False


def test_old_reports_and_trajectories_read_back_with_no_collateral(tmp_path: Path) -> None:
    data = json.loads(score(_run()).model_dump_json())
    for key in ("collateral_writes", "episodes_with_collateral", "collateral_by_target"):
        del data[key]
    for group in [*data["by_capability"].values(), *data["per_task"].values()]:
        del group["collateral_writes"], group["episodes_with_collateral"]
    old = Report.model_validate(data)
    assert (old.collateral_writes, old.episodes_with_collateral) == (0, 0)
    path = tmp_path / "old.jsonl"
    write_trajectories(path, _run())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        del line["verification"]["collateral"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert score(read_trajectories(path)).collateral_writes == 0


def test_a_report_cannot_claim_more_episodes_with_collateral_than_writes() -> None:
    data = json.loads(score(_run()).model_dump_json())
    data["collateral_writes"] = 1
    with pytest.raises(ValueError, match="episodes_with_collateral"):
        Report.model_validate(data)


def test_sandbox_episodes_with_an_unrequested_write_are_counted() -> None:
    """End to end: a sandbox episode that deletes a contact it was not asked to is scored as a
    failure with one collateral write on contacts.contacts."""
    task = next(t for t in generate_suite() if t.template == "text_contact_by_name")
    contact = task.world["contacts"]["contacts"][-1]["id"]
    plan = list(task.reference_plan or [])
    injected = task.model_copy(
        update={
            "reference_plan": [
                *plan[:-1],
                ToolCall(tool="contacts_delete", arguments={"contact_id": contact}),
                plan[-1],
            ]
        }
    )
    clean = run_episode(SandboxEnv(), task, make_planner("oracle"))
    dirty = run_episode(SandboxEnv(), injected, make_planner("oracle"))
    dirty.sample = 1
    report = score([clean, dirty], samples=2)
    assert report.collateral_writes == 1
    assert report.collateral_by_target == {"contacts.contacts": 1}
    assert report.per_task[task.id].successes == 1
