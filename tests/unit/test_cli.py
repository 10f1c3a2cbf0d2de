"""The CLI as a user runs it: `qpa tasks ...`, `qpa run ...`, `qpa demo`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from qpa.cli import app
from qpa.contract import read_trajectories
from qpa.envs.sandbox.suite import generate_suite

runner = CliRunner()
TASK = next(t for t in generate_suite() if t.split == "test")


def test_tasks_stats_json_counts_everything() -> None:
    result = runner.invoke(app, ["tasks", "stats", "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    suite = generate_suite()
    assert stats["tasks"] == len(suite)
    assert stats["domains"] == len({t.domain for t in suite})
    assert sum(stats["by_split"].values()) == len(suite)
    assert sum(stats["by_domain"].values()) == len(suite)
    assert set(stats["test_by_capability"]) <= {"tool_use", "memory", "skills", "subagent"}
    assert stats["tools"] >= 1 and stats["by_tool"]
    assert sum(stats["by_difficulty"].values()) == len(suite)


def test_tasks_list_filters_and_show_prints_the_task() -> None:
    result = runner.invoke(app, ["tasks", "list", "--split", "test", "--json", "--limit", "5"])
    rows = json.loads(result.output)
    assert len(rows) == 5 and all(r["split"] == "test" for r in rows)
    shown = runner.invoke(app, ["tasks", "show", TASK.id])
    assert shown.exit_code == 0
    assert json.loads(shown.output)["id"] == TASK.id


def test_run_oracle_writes_a_trajectory(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = runner.invoke(
        app, ["run", "--task", TASK.id, "--planner", "oracle", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "SUCCESS" in result.output
    (trajectory,) = list(read_trajectories(out))
    assert trajectory.success and trajectory.task.id == TASK.id


def test_run_noop_fails_with_exit_1() -> None:
    result = runner.invoke(app, ["run", "--task", TASK.id, "--planner", "noop"])
    assert result.exit_code == 1
    assert "FAILURE" in result.output


def test_bad_input_gets_a_clear_error() -> None:
    unknown_task = runner.invoke(app, ["run", "--task", "nope.task"])
    assert unknown_task.exit_code == 2 and "nope.task" in unknown_task.output
    unknown_planner = runner.invoke(app, ["run", "--task", TASK.id, "--planner", "psychic"])
    assert unknown_planner.exit_code == 2 and "psychic" in unknown_planner.output
    unknown_suite = runner.invoke(app, ["tasks", "stats", "--suite", "nosuch"])
    assert unknown_suite.exit_code == 2 and "nosuch" in unknown_suite.output


def test_tasks_generate_is_reproducible(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    runner.invoke(app, ["tasks", "generate", "--seed", "3", "--out", str(a)])
    runner.invoke(app, ["tasks", "generate", "--seed", "3", "--out", str(b)])
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 0


def test_errors_never_wrap_on_a_narrow_non_terminal(tmp_path: Path) -> None:
    """A person greps errors and CI logs are not terminals: one line, the path unbroken."""
    import os
    import subprocess
    import sys

    deep = tmp_path.joinpath(*(["a-rather-long-folder-name"] * 6))
    deep.mkdir(parents=True)
    corrupt = deep / "tasks.jsonl"
    corrupt.write_text('{"id": "half\n')
    env = {**os.environ, "COLUMNS": "40", "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, "-c", "from qpa.cli import main; main()", "collect",
         "--tasks", str(corrupt), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and f"{corrupt}:1" in lines[0], result.stderr
