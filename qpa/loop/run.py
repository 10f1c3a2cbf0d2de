"""The loop's orchestrator: run every stage in order, skip what is done, write the report.

`run_loop(preset, out)` runs `qpa.loop.stages.STAGES` one after another in this process, with
`qpa.progress` showing which stage runs and how far it is (on a terminal a live display: the
loop's bar, `stage i/N: name`, with the running stage's own bar of episodes or steps below it;
elsewhere a periodic plain line; nothing with `--quiet`), then writes
`DIR/report.json` and `DIR/report.md`. Resuming is implicit: a stage whose done-marker holds
the same hash of settings and inputs is skipped, so rerunning after a crash (or with a changed
setting) only recomputes what is missing or stale. `DIR/preset.json` records the settings of the
last run; `DIR/loop.log` what the stages said.

Seeds: the preset's seed is the only source of randomness; each stage derives its own from it
(`stage_seed`) and seeds `random`, NumPy and torch before it starts.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qpa import progress
from qpa.loop.presets import LoopPreset
from qpa.loop.report import write_loop_report
from qpa.loop.stages import STAGES, Stage, StageResult, quiet_libraries, run_stage


@dataclass
class LoopRun:
    """What `run_loop` did: each stage's result, the report, the wall time."""

    out: Path
    preset: LoopPreset
    results: dict[str, StageResult] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0

    @property
    def ran(self) -> list[str]:
        return [n for n, r in self.results.items() if r.status == "ran"]

    @property
    def skipped(self) -> list[str]:
        return [n for n, r in self.results.items() if r.status == "skipped"]


def plan(preset: LoopPreset, out: Path) -> list[tuple[Stage, str]]:
    """Which stages a run would skip or run now (`--dry-run` of the local presets)."""
    from qpa.loop.stages import read_marker, stage_key

    keys: dict[str, str] = {}
    rows: list[tuple[Stage, str]] = []
    stale = False
    for stage in STAGES:
        key = stage_key(stage, preset, {d: keys[d] for d in stage.deps})
        keys[stage.name] = key
        marker = read_marker(out, stage.name)
        fresh = marker is not None and marker.get("key") == key
        rows.append((stage, "skip (done)" if fresh else ("rerun (stale)" if marker else "run")))
        stale = stale or not fresh
    return rows


def _logger(console: Console, path: Path) -> Callable[[str], None]:
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        with open(path, "a", encoding="utf-8") as stream:
            stream.write(f"{stamp} {Text.from_markup(message).plain}\n")
        console.print(f"[dim]{stamp}[/] {message}", highlight=False)

    return log


def run_loop(
    preset: LoopPreset,
    out: str | Path,
    *,
    console: Console | None = None,
    stages: Sequence[str] | None = None,
    report: bool = True,
    capture: bool = True,
) -> LoopRun:
    """Run (or resume) the loop of `preset` into `out`; see the module docstring.

    `stages` limits the run to these stages and their inputs (the report needs all of them).
    `capture` sends library output of each stage to `DIR/stages/<name>/stage.log`.
    """
    root = Path(out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    # Bound to the real stdout now: stages redirect sys.stdout into their log files.
    console = console or Console(file=sys.stdout, soft_wrap=True)
    quiet_libraries()
    (root / "preset.json").write_text(preset.model_dump_json(indent=2) + "\n")
    log = _logger(console, root / "loop.log")
    wanted = _with_inputs(stages) if stages else [s.name for s in STAGES]
    run = LoopRun(root, preset)
    started = time.perf_counter()
    log(f"qpa loop: preset {preset.name}, seed {preset.seed}, into {root}")
    with (
        progress.session(console),
        progress.track("loop", total=len(wanted), unit="stages") as overall,
    ):
        for number, stage in enumerate(s for s in STAGES if s.name in wanted):
            overall.describe(f"stage {number + 1}/{len(wanted)} {stage.name}: {stage.title}")
            result = run_stage(stage, root, preset, run.results, log=log, capture=capture)
            run.results[stage.name] = result
            if result.status == "skipped":
                log(f"[cyan]{stage.name}[/]: done earlier, skipped")
            else:
                log(f"[green]{stage.name}[/]: {result.elapsed_s:.1f} s")
            overall.advance()
    run.wall_time_s = time.perf_counter() - started
    if report and all(s.name in run.results for s in STAGES):
        run.report = write_loop_report(root, preset, run.results, wall_time_s=run.wall_time_s)
        console.print(summary_table(run))
        log(f"report: {root / 'report.md'} ({run.wall_time_s:.0f} s)")
    return run


def _with_inputs(names: Sequence[str]) -> list[str]:
    by_name = {s.name: s for s in STAGES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown stages {', '.join(unknown)}; stages: {', '.join(by_name)}")
    wanted: set[str] = set()
    frontier = list(names)
    while frontier:
        name = frontier.pop()
        if name not in wanted:
            wanted.add(name)
            frontier += list(by_name[name].deps)
    return [s.name for s in STAGES if s.name in wanted]


def summary_table(run: LoopRun) -> Table:
    """The stages' numbers on the held-out test split, one row per evaluated model."""
    report = run.report
    caps = report["curriculum"]["capabilities"]
    table = Table(
        title=f"qpa loop ({run.preset.name}, seed {run.preset.seed}): held-out test split, "
        f"{run.wall_time_s:.0f} s"
    )
    for column in ("stage", "Harness", "success", *caps, "tokens/solved", "fail m/h/e"):
        table.add_column(column, justify="left" if column in ("stage", "Harness") else "right")
    for name, entry in report["stages"].items():
        diag = entry["diagnosis"]
        tokens = entry["output_tokens_per_solved_task"]
        table.add_row(
            name,
            entry["harness_version"],
            f"{entry['test_success']:.0%}",
            *(f"{entry['by_capability'].get(c, 0.0):.0%}" for c in caps),
            "n/a" if tokens is None else f"{tokens:.0f}",
            f"{diag.get('model', 0)}/{diag.get('harness', 0)}/{diag.get('environment', 0)}",
        )
    return table


def load_report(out: str | Path) -> dict[str, Any]:
    """`DIR/report.json` of a finished run."""
    data = json.loads((Path(out) / "report.json").read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{out}/report.json is not a JSON object")
    return data


__all__ = ["LoopRun", "load_report", "plan", "run_loop", "summary_table"]
