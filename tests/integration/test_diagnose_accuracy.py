"""Diagnosis end to end: accuracy against injected faults on a sample of the test split, and
`qpa diagnose DIR` on a directory of trajectories (tables, JSON, corrupt lines, errors)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from helpers.faults import FAULTS, SOURCES, Outcome, measure, run_harness, run_noisy
from typer.testing import CliRunner

from qpa.cli.diagnose import command_app
from qpa.contract import Trajectory, write_trajectories
from qpa.diagnose import DiagnosisReport, diagnose_dir
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.backends.scripted import OracleBackend

TEST_SPLIT = [t for t in generate_suite() if t.split == "test"]
runner = CliRunner()


@pytest.fixture(scope="module")
def outcomes() -> list[Outcome]:
    sample = TEST_SPLIT[::23]  # 54 tasks, every template family represented
    memory = [t for t in TEST_SPLIT[5::40] if t.memory]  # enough for the memory faults
    controls: dict[str, bool] = {}
    plain = measure([*sample, *memory], controls=controls)
    noisy = measure(sample, sources=["noisy_harness"], detour_every=3, controls=controls)
    return plain + noisy


def test_attribution_is_at_least_90_percent_right_for_every_source(
    outcomes: list[Outcome],
) -> None:
    by_source: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.failed:
            by_source[outcome.source].append(outcome)
    assert set(by_source) == set(SOURCES)
    for source, rows in by_source.items():
        side = sum(o.side_correct for o in rows) / len(rows)
        assert side >= 0.9, (source, side, [o.diagnosis for o in rows if not o.side_correct][:3])
    everything = [o for rows in by_source.values() for o in rows]
    assert sum(o.cause_correct for o in everything) / len(everything) >= 0.9


def _mixed_run(tmp_path: Path) -> tuple[Path, list[Trajectory]]:
    task = next(t for t in TEST_SPLIT if t.template == "schedule_text")
    memory_task = next(t for t in TEST_SPLIT if t.template == "text_partner_from_memory")
    trajectories = [
        run_harness(task, OracleBackend(task)),  # success
        FAULTS["drop_skill"].inject(task),
        FAULTS["no_memory"].inject(memory_task),
        FAULTS["env_dead"].inject(task),
        FAULTS["turn_budget"].inject(task),
        run_noisy(task, seed=2)[0],
    ]
    run = tmp_path / "run"
    run.mkdir()
    path = run / "trajectories.jsonl"
    write_trajectories(path, trajectories)
    with open(path, "a", encoding="utf-8") as stream:
        stream.write("\n{not json\n")
        stream.write('{"id": "half a trajectory"}\n')
    return run, trajectories


def test_qpa_diagnose_on_a_directory(tmp_path: Path) -> None:
    run, trajectories = _mixed_run(tmp_path)
    result = runner.invoke(command_app, [str(run)])
    assert result.exit_code == 0, result.output
    assert "Failures by side x capability" in result.output
    assert "skill_not_injected" in result.output and "environment" in result.output
    assert "line 8" in result.output and "line 9" in result.output  # corrupt, not fatal

    report = DiagnosisReport.model_validate_json((run / "diagnosis.json").read_text())
    assert (report.trajectories, report.successes, report.failures) == (6, 1, 5)
    assert [c.line for c in report.corrupt_lines] == [8, 9]
    assert report.by_side == {"model": 1, "harness": 3, "environment": 1}
    assert report.by_cause["memory_retrieval_miss"] == 1
    assert report.counts["harness"]["skills"] == 2  # drop_skill + turn_budget on a skills task
    assert report.counts["harness"]["memory"] == 1
    assert trajectories[1].id in report.cells["harness"]["skills"]
    assert sum(report.by_side.values()) == report.failures
    markdown = (run / "diagnosis.md").read_text()
    assert "| harness |" in markdown and "Top causes" in markdown

    as_json = runner.invoke(command_app, [str(run / "trajectories.jsonl"), "--json"])
    assert as_json.exit_code == 0, as_json.output
    payload = json.loads(as_json.output[as_json.output.index("{") :])
    assert payload["failures"] == 5 and len(payload["diagnoses"]) == 5


def test_qpa_diagnose_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    missing = runner.invoke(command_app, [str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no trajectories" in missing.output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "trajectories.jsonl").write_text("nope\n{}\n", encoding="utf-8")
    result = runner.invoke(command_app, [str(broken)])
    assert result.exit_code == 2 and "all 2 line(s) are corrupt" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "trajectories.jsonl").write_text("", encoding="utf-8")
    assert diagnose_dir(empty).trajectories == 0
