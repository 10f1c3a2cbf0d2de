"""`qpa.progress`: plain periodic lines off a terminal, Rich bars on one, nothing when quiet."""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Iterator

import pytest
from rich.console import Console
from typer.testing import CliRunner

from qpa import progress
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.factory import PlannerSpec
from qpa.harness.pool import policy_of, run_episodes

LINE = re.compile(
    r"^\[progress\] collect: (\d+)/5 episodes \((\d+)%\), [\d.e+-]+ episodes/s"
    r"(, ETA \d+s)?, \d+s elapsed$"
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("QPA_PROGRESS", raising=False)
    monkeypatch.delenv("QPA_PROGRESS_INTERVAL", raising=False)
    progress.reset()
    yield
    progress.reset()


def test_off_a_terminal_it_prints_a_line_when_due_and_one_at_the_end() -> None:
    out = io.StringIO()
    progress.configure(stream=out, interval_s=0.0)
    assert progress.mode() == "plain"  # a StringIO is no terminal
    with progress.track("collect", total=5, unit="episodes") as bar:
        for _ in range(5):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert all(LINE.match(line) for line in lines), lines
    done = [int(LINE.match(line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert done == [1, 2, 3, 4, 5, 5]  # every advance (interval 0), then the end
    assert "ETA" in lines[2] and "(60%)" in lines[2] and "ETA" not in lines[-1]


def test_lines_are_throttled_so_updates_stay_cheap() -> None:
    out = io.StringIO()
    progress.configure(stream=out, interval_s=0.2)
    started = time.perf_counter()
    with progress.track("collect", total=100_000, unit="episodes") as bar:
        for _ in range(100_000):
            bar.advance()
        time.sleep(0.25)
        bar.advance(0)
    elapsed = time.perf_counter() - started
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 2 + int(elapsed / 0.2), lines  # one per interval at most
    assert lines[-1].startswith("[progress] collect: 100000/100000 episodes (100%)")
    assert elapsed - 0.25 < 2.0, f"{elapsed - 0.25:.2f} s for 100,000 updates"


def test_a_stage_shorter_than_the_interval_prints_nothing() -> None:
    out = io.StringIO()
    progress.configure(stream=out)  # the default 10 s
    with progress.track("generate", total=50, unit="tasks") as bar:
        for _ in range(50):
            bar.advance()
    assert out.getvalue() == ""  # a script reading a short command's output sees only that


def test_the_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPA_PROGRESS_INTERVAL", "0")
    out = io.StringIO()
    progress.configure(stream=out)
    with progress.track("sft", total=3) as bar:
        bar.update(2)
    assert out.getvalue().splitlines()[0].startswith("[progress] sft: 2/3 steps (67%)")


@pytest.mark.parametrize("how", ["configure", "env"])
def test_quiet_prints_nothing(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    progress.configure(stream=out, interval_s=0.0)
    if how == "configure":
        progress.configure(quiet=True)
    else:
        monkeypatch.setenv("QPA_PROGRESS", "off")
    with progress.track("collect", total=5, unit="episodes") as bar:
        for _ in range(5):
            bar.advance()
        bar.describe("still nothing")
    assert out.getvalue() == ""


def test_on_a_terminal_it_draws_a_rich_bar_with_rate_and_eta() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    progress.configure(console=console)
    assert progress.mode() == "rich"
    with progress.track("collect", total=4, unit="episodes") as bar:
        assert bar._progress is not None  # a Rich Progress of its own
        (task,) = bar._progress.tasks
        bar.advance(2)
        bar._progress.refresh()
        assert (task.completed, task.total, task.fields["unit"]) == (2, 4, "episodes")
    drawn = out.getvalue()
    assert "collect" in drawn and "2/4" in drawn and "episodes/s" in drawn and "ETA" in drawn
    assert "[progress]" not in drawn  # no plain lines on a terminal


def test_a_session_holds_every_stage_bar_in_one_display() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    with progress.session(console) as shared:
        assert shared is not None
        with progress.track("loop", total=3, unit="stages") as loop:
            loop.describe("stage 1/3 collect: trajectories")
            with progress.track("collect", total=5, unit="episodes") as bar:
                assert bar._progress is shared and len(shared.tasks) == 2
                assert shared.tasks[0].description == "stage 1/3 collect: trajectories"
            assert len(shared.tasks) == 1  # a finished stage's bar goes away
    assert progress.mode() == "plain"  # the session's console is not kept afterwards


def test_the_loop_line_says_which_stage_runs() -> None:
    out = io.StringIO()
    progress.configure(stream=out, interval_s=3600.0)
    with progress.track("loop", total=14, unit="stages") as loop:
        loop.describe("stage 3/14 collect: trajectories from the noisy planner")
        loop.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[progress] stage 3/14 collect: trajectories from the noisy planner")
    assert lines[0].split(": ", 2)[2].startswith("0/14 stages")
    assert lines[1].split(": ", 2)[2].startswith("1/14 stages")  # the end line


def test_episodes_of_the_pool_report_progress() -> None:
    out = io.StringIO()
    progress.configure(stream=out, interval_s=0.0)
    tasks = generate_suite()[:2]
    spec = PlannerSpec(name="oracle")
    recorded: list[object] = []
    run_episodes(
        [(task, 0) for task in tasks],
        spec,
        policy_of(spec),
        recorded.append,
        concurrency=2,
        make_env=lambda worker: SandboxEnv(),
        max_turns=40,
        stop=threading.Event(),
        name="bench",
    )
    lines = out.getvalue().splitlines()
    assert len(recorded) == 2
    assert lines[0].startswith("[progress] bench: 1/2 episodes (50%)")
    assert lines[-1].startswith("[progress] bench: 2/2 episodes (100%)")


def test_qpa_quiet_switches_progress_off() -> None:
    from qpa.cli import app

    result = CliRunner().invoke(app, ["--quiet", "crds", "check", "--dir", "crds"])
    assert result.exit_code == 0, result.output
    assert progress.mode() == "off"
