"""Diagnosis of a directory of trajectories: counts per side x capability, causes, the evidence.

`diagnose_dir(DIR)` streams `DIR/trajectories.jsonl` (what `qpa bench run` and collection jobs
write; DIR may also be the `.jsonl` file itself), attributes every failed trajectory
(`qpa.diagnose.attribution.diagnose`) and writes `DIR/diagnosis.json` (the `DiagnosisReport`)
and a short `DIR/diagnosis.md`. Memory stays constant in the number of trajectories: only the
diagnoses are kept. A corrupt line (not JSON, or not a `Trajectory`) is reported with its line
number and skipped; only a file whose every line is corrupt is an error.

A failure counts once in each capability its task has (`counts[side][capability]`), so a row's
cells may add up to more than its total (`by_side`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.contract import CAPABILITIES, Trajectory
from qpa.diagnose.attribution import CAUSES, SIDES, Diagnosis, diagnose

__all__ = [
    "JSON_NAME",
    "MARKDOWN_NAME",
    "TRAJECTORIES_NAME",
    "CorruptLine",
    "DiagnoseError",
    "DiagnosisReport",
    "build_report",
    "diagnose_dir",
]

TRAJECTORIES_NAME = "trajectories.jsonl"
JSON_NAME = "diagnosis.json"
MARKDOWN_NAME = "diagnosis.md"
EXAMPLES_PER_CELL = 5


class DiagnoseError(Exception):
    """The input cannot be diagnosed (missing, unreadable, or every line corrupt)."""


class CorruptLine(BaseModel):
    """A line of the trajectories file that could not be read as a `Trajectory`."""

    model_config = ConfigDict(extra="forbid")

    line: int
    error: str


def _empty_cells() -> dict[str, dict[str, list[str]]]:
    return {str(s): {str(c): [] for c in CAPABILITIES} for s in SIDES}


class DiagnosisReport(BaseModel):
    """Failures by side x capability and by cause, with the trajectories behind each cell."""

    model_config = ConfigDict(extra="forbid")

    source: str = ""
    trajectories: int = 0
    successes: int = 0
    failures: int = 0
    by_side: dict[str, int] = Field(default_factory=lambda: {str(s): 0 for s in SIDES})
    counts: dict[str, dict[str, int]] = Field(
        default_factory=lambda: {str(s): {str(c): 0 for c in CAPABILITIES} for s in SIDES}
    )
    by_cause: dict[str, int] = Field(default_factory=dict)
    cells: dict[str, dict[str, list[str]]] = Field(default_factory=_empty_cells)
    diagnoses: list[Diagnosis] = Field(default_factory=list)
    corrupt_lines: list[CorruptLine] = Field(default_factory=list)

    def add(self, trajectory: Trajectory) -> Diagnosis | None:
        """Count one trajectory; diagnose it if it failed."""
        self.trajectories += 1
        found = diagnose(trajectory)
        if found is None:
            self.successes += 1
            return None
        self.failures += 1
        self.by_side[found.side] = self.by_side.get(found.side, 0) + 1
        self.by_cause[found.cause] = self.by_cause.get(found.cause, 0) + 1
        for capability in found.capabilities:
            row = self.counts.setdefault(found.side, {})
            row[capability] = row.get(capability, 0) + 1
            self.cells.setdefault(found.side, {}).setdefault(capability, []).append(
                found.trajectory_id
            )
        self.diagnoses.append(found)
        return found

    def top_causes(self, n: int = 10) -> list[tuple[str, str, int]]:
        """The most frequent causes as (side, cause, count), most frequent first."""
        ranked = sorted(self.by_cause.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(CAUSES.get(cause, "model"), cause, count) for cause, count in ranked[:n]]

    def examples(self, cause: str, n: int = 1) -> list[Diagnosis]:
        return [d for d in self.diagnoses if d.cause == cause][:n]

    def to_markdown(self) -> str:
        """A short human summary: the side x capability table, top causes, examples."""
        capabilities = list(CAPABILITIES)
        lines = [
            "# Failure diagnosis",
            "",
            *([f"Source: `{self.source}`", ""] if self.source else []),
            f"{self.trajectories} trajectories: {self.successes} succeeded, "
            f"{self.failures} failed"
            + (f"; {len(self.corrupt_lines)} corrupt line(s) skipped" if self.corrupt_lines else "")
            + ".",
            "",
            "## Failures by side and capability",
            "",
            "| side | " + " | ".join(capabilities) + " | total |",
            "|---" * (len(capabilities) + 2) + "|",
        ]
        for side in SIDES:
            row = self.counts.get(side, {})
            cells = " | ".join(str(row.get(c, 0)) for c in capabilities)
            lines.append(f"| {side} | {cells} | {self.by_side.get(side, 0)} |")
        lines += [
            "",
            "## Top causes",
            "",
            "| side | cause | count | example |",
            "|---|---|---|---|",
        ]
        for side_name, cause, count in self.top_causes():
            example = self.examples(cause)
            shown = f"`{example[0].trajectory_id}`: {example[0].reason}" if example else ""
            lines.append(f"| {side_name} | {cause} | {count} | {shown.replace('|', '/')} |")
        lines += ["", "## Trajectories behind each cell", ""]
        for side in SIDES:
            for capability in capabilities:
                ids = self.cells.get(side, {}).get(capability, [])
                if ids:
                    extra = len(ids) - EXAMPLES_PER_CELL
                    more = f" (+{extra} more)" if extra > 0 else ""
                    listed = ", ".join(f"`{i}`" for i in ids[:EXAMPLES_PER_CELL])
                    lines.append(f"- {side} x {capability}: {listed}{more}")
        if self.corrupt_lines:
            lines += ["", "## Corrupt lines", ""]
            lines += [f"- line {c.line}: {c.error}" for c in self.corrupt_lines[:20]]
        return "\n".join(lines) + "\n"


def build_report(trajectories: Iterable[Trajectory], *, source: str = "") -> DiagnosisReport:
    """Diagnose trajectories already in memory (tests, the benchmark, library callers)."""
    report = DiagnosisReport(source=source)
    for trajectory in trajectories:
        report.add(trajectory)
    return report


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
        return f"{where}: {first.get('msg')}"
    return f"{type(exc).__name__}: {exc}"


def _paths(path: str | Path) -> tuple[Path, Path]:
    """(the trajectories file, the directory the outputs go to)."""
    given = Path(path)
    if given.is_dir():
        return given / TRAJECTORIES_NAME, given
    if given.suffix == ".jsonl" or given.is_file():
        return given, given.parent
    return given / TRAJECTORIES_NAME, given


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def diagnose_dir(path: str | Path, *, write: bool = True) -> DiagnosisReport:
    """Diagnose `path/trajectories.jsonl` (or the `.jsonl` file `path`) and write the reports.

    Raises `DiagnoseError` when the file is missing or unreadable, or when it has lines and
    every one of them is corrupt.
    """
    source, out_dir = _paths(path)
    report = DiagnosisReport(source=str(source))
    lines = 0
    try:
        with open(source, encoding="utf-8", errors="replace") as stream:
            for line_no, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                lines += 1
                try:
                    trajectory = Trajectory.model_validate_json(line)
                except (ValidationError, ValueError) as exc:
                    report.corrupt_lines.append(CorruptLine(line=line_no, error=_describe(exc)))
                    continue
                report.add(trajectory)
    except FileNotFoundError:
        raise DiagnoseError(f"no trajectories at {source}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnoseError(f"cannot read {source}: {exc}") from None
    if lines and len(report.corrupt_lines) == lines:
        first = report.corrupt_lines[0]
        raise DiagnoseError(
            f"{source}: all {lines} line(s) are corrupt (line {first.line}: {first.error})"
        )
    if write:
        _write_atomic(out_dir / JSON_NAME, report.model_dump_json(indent=2) + "\n")
        _write_atomic(out_dir / MARKDOWN_NAME, report.to_markdown())
    return report
