"""The release gate: a pure decision from a candidate report, a baseline report and a spec.

`evaluate_gate(candidate, baseline, spec)` returns a `GateResult` listing every check and the
reason of every failure; it never raises and reads nothing. It fails closed: a missing candidate
or baseline *file*, a corrupt or partial report, a report of too few tasks or samples, all fail.
A baseline of `None` means "first release": only the absolute thresholds apply.

Checks, in order (names are stable, for status conditions and dashboards):

- `candidate_present`, `candidate_complete` (with `require_complete`), `min_samples`,
  `min_tasks`, `min_overall`, `candidate_environment_errors` (at most
  `max_environment_error_rate` of the episodes ended by a dead server, device or endpoint: such
  a run measured the infrastructure, not the policy): absolute checks of the candidate;
- with a baseline: `baseline_complete`, `baseline_environment_errors`, `same_suite` (suite and
  split match),
  `capability_regression:<capability>` for each capability the baseline scored (the candidate's
  success may drop by at most `max_capability_regression`, in absolute points; a capability
  the candidate lacks fails), and `cost_increase` (cost per 1K tasks may rise by at most
  `max_cost_increase`, relative; skipped when that is null).

`load_report` and `load_gate_spec` read files with errors that name the file and the field;
`evaluate_gate_files` turns those errors into a failed gate (the CLI and HarnessRelease use it).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.bench.scoring import SCHEMA_VERSION, Report, describe_validation_error

REPORT_JSON = "report.json"


class GateSpec(BaseModel):
    """Release thresholds (`gate.yaml`); unknown keys are errors, so typos never pass."""

    model_config = ConfigDict(extra="forbid")

    min_overall: float = Field(default=0.5, ge=0.0, le=1.0, description="absolute")
    max_capability_regression: float = Field(
        default=0.03, ge=0.0, le=1.0, description="absolute points of success rate"
    )
    max_cost_increase: float | None = Field(
        default=0.10, ge=0.0, description="relative to the baseline's cost; null: not checked"
    )
    max_environment_error_rate: float | None = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="share of episodes a dead server, device or endpoint ended; null: not checked",
    )
    min_samples: int = Field(default=1, ge=1)
    min_tasks: int = Field(default=1, ge=1)
    require_complete: bool = True


class GateCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    passed: bool
    detail: str
    value: float | None = None
    threshold: float | None = None


class GateResult(BaseModel):
    """The decision: `passed`, the reason of every failed check, and every check."""

    model_config = ConfigDict(extra="forbid")

    passed: bool
    reasons: list[str]
    checks: list[GateCheck]


class ReportError(ValueError):
    """A report file that is missing, unreadable, corrupt or partial (names file and field)."""


class GateSpecError(ValueError):
    """A gate spec file that is unreadable or invalid (names file and field)."""


# --------------------------------------------------------------------------- loading


def report_path(path: str | Path) -> Path:
    """A report file, or the `report.json` in a benchmark output folder."""
    path = Path(path)
    return path / REPORT_JSON if path.is_dir() else path


def load_report(path: str | Path) -> Report:
    """Read and validate a `report.json` (or a folder holding one).

    Raises `ReportError` naming the file and what is wrong: missing file, not JSON (e.g. cut
    short while written), not an object, another schema version, or the first invalid fields.
    """
    file = report_path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"report {file}: missing (no such file)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"report {file}: unreadable: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"report {file}: corrupt JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ReportError(f"report {file}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ReportError(
            f"report {file}: field 'schema_version': expected {SCHEMA_VERSION}, got {version!r}"
        )
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        raise ReportError(f"report {file}: {describe_validation_error(exc)}") from None


def load_gate_spec(path: str | Path | None) -> GateSpec:
    """A `GateSpec` from YAML; None or an empty file gives the defaults."""
    if path is None:
        return GateSpec()
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GateSpecError(f"gate spec {file}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise GateSpecError(f"gate spec {file}: not YAML: {exc}") from None
    if data is None:
        return GateSpec()
    if not isinstance(data, dict):
        raise GateSpecError(f"gate spec {file}: expected a mapping of thresholds")
    try:
        return GateSpec.model_validate(data)
    except ValidationError as exc:
        raise GateSpecError(f"gate spec {file}: {describe_validation_error(exc)}") from None


# --------------------------------------------------------------------------- the decision


def _result(checks: list[GateCheck]) -> GateResult:
    return GateResult(
        passed=all(c.passed for c in checks),
        reasons=[c.detail for c in checks if not c.passed],
        checks=checks,
    )


def evaluate_gate(
    candidate: Report | None, baseline: Report | None, spec: GateSpec | None = None
) -> GateResult:
    """Decide a release (pure). `baseline=None`: first release, absolute thresholds only."""
    spec = spec or GateSpec()
    checks: list[GateCheck] = []
    if candidate is None:
        checks.append(
            GateCheck(name="candidate_present", passed=False, detail="no candidate report")
        )
        return _result(checks)
    checks.append(GateCheck(name="candidate_present", passed=True, detail="candidate report read"))
    if spec.require_complete:
        checks.append(
            GateCheck(
                name="candidate_complete",
                passed=candidate.complete,
                detail="candidate report is complete"
                if candidate.complete
                else f"candidate report is partial: {candidate.missing_episodes} episodes missing",
                value=float(candidate.missing_episodes),
                threshold=0.0,
            )
        )
    checks.append(
        GateCheck(
            name="min_samples",
            passed=candidate.samples >= spec.min_samples,
            detail=f"candidate has {candidate.samples} samples per task "
            f"(minimum {spec.min_samples})",
            value=float(candidate.samples),
            threshold=float(spec.min_samples),
        )
    )
    checks.append(
        GateCheck(
            name="min_tasks",
            passed=candidate.tasks >= spec.min_tasks,
            detail=f"candidate scored {candidate.tasks} tasks (minimum {spec.min_tasks})",
            value=float(candidate.tasks),
            threshold=float(spec.min_tasks),
        )
    )
    checks.append(
        GateCheck(
            name="min_overall",
            passed=candidate.overall >= spec.min_overall,
            detail=f"overall success {candidate.overall:.2%} "
            f"{'>=' if candidate.overall >= spec.min_overall else '<'} "
            f"minimum {spec.min_overall:.2%}",
            value=candidate.overall,
            threshold=spec.min_overall,
        )
    )
    if spec.max_environment_error_rate is not None:
        checks.append(_environment_errors("candidate", candidate, spec.max_environment_error_rate))
    if baseline is None:
        return _result(checks)
    if spec.max_environment_error_rate is not None:
        checks.append(_environment_errors("baseline", baseline, spec.max_environment_error_rate))

    if spec.require_complete:
        checks.append(
            GateCheck(
                name="baseline_complete",
                passed=baseline.complete,
                detail="baseline report is complete"
                if baseline.complete
                else f"baseline report is partial: {baseline.missing_episodes} episodes "
                "missing (re-run the baseline)",
            )
        )
    same = (candidate.suite, candidate.split) == (baseline.suite, baseline.split)
    checks.append(
        GateCheck(
            name="same_suite",
            passed=same,
            detail=f"candidate and baseline both on {candidate.suite}/{candidate.split}"
            if same
            else f"candidate is on {candidate.suite}/{candidate.split} but the baseline on "
            f"{baseline.suite}/{baseline.split}",
        )
    )
    margin = spec.max_capability_regression
    for capability, base in baseline.by_capability.items():
        name = f"capability_regression:{capability}"
        group = candidate.by_capability.get(capability)
        if group is None:
            checks.append(
                GateCheck(
                    name=name,
                    passed=False,
                    detail=f"{capability}: scored in the baseline but missing from the candidate",
                )
            )
            continue
        delta = group.success - base.success
        ok = delta >= -margin - 1e-12
        checks.append(
            GateCheck(
                name=name,
                passed=ok,
                detail=f"{capability}: {group.success:.2%} vs baseline {base.success:.2%} "
                f"({100 * delta:+.1f} points; "
                f"{'within' if ok else 'beyond'} the allowed -{100 * margin:.1f})",
                value=delta,
                threshold=-margin,
            )
        )
    if spec.max_cost_increase is not None:
        checks.append(_cost_check(candidate, baseline, spec.max_cost_increase))
    return _result(checks)


def _environment_errors(role: str, report: Report, limit: float) -> GateCheck:
    count = report.errors_by_side.get("environment", 0)
    rate = count / report.episodes if report.episodes else 1.0
    ok = rate <= limit + 1e-12
    return GateCheck(
        name=f"{role}_environment_errors",
        passed=ok,
        detail=f"{role}: {count} of {report.episodes} episodes ended by an environment-side "
        f"error ({rate:.1%}; at most {limit:.1%} allowed"
        + ("" if ok else ": rerun with `qpa bench run --retry-errors`")
        + ")",
        value=rate,
        threshold=limit,
    )


def _cost_check(candidate: Report, baseline: Report, limit: float) -> GateCheck:
    new, old = candidate.cost_per_1k_tasks, baseline.cost_per_1k_tasks
    if candidate.currency != baseline.currency:
        return GateCheck(
            name="cost_increase",
            passed=False,
            detail=f"costs in different currencies ({candidate.currency} vs {baseline.currency})",
        )
    if old <= 0.0:
        ok = new <= 0.0
        return GateCheck(
            name="cost_increase",
            passed=ok,
            detail=f"cost per 1K tasks {new:.4f} vs baseline 0"
            + ("" if ok else " (any increase over a zero baseline exceeds the limit)"),
            value=0.0 if ok else None,
            threshold=limit,
        )
    increase = (new - old) / old
    ok = increase <= limit + 1e-12
    return GateCheck(
        name="cost_increase",
        passed=ok,
        detail=f"cost per 1K tasks {new:.4f} vs baseline {old:.4f} {candidate.currency} "
        f"({increase:+.1%}; {'within' if ok else 'above'} the allowed +{limit:.0%})",
        value=increase,
        threshold=limit,
    )


def evaluate_gate_files(
    candidate: str | Path | None, baseline: str | Path | None, spec: GateSpec | None = None
) -> GateResult:
    """`evaluate_gate` on report files; a file that cannot be loaded fails the gate.

    `baseline=None` is a first release; a baseline *path* that is missing or broken fails.
    """
    checks: list[GateCheck] = []
    loaded: dict[str, Report | None] = {"candidate": None, "baseline": None}
    for role, path in (("candidate", candidate), ("baseline", baseline)):
        if path is None:
            continue
        try:
            loaded[role] = load_report(path)
        except ReportError as exc:
            checks.append(GateCheck(name=f"{role}_readable", passed=False, detail=str(exc)))
    if loaded["candidate"] is None:
        if candidate is None:
            checks.insert(
                0, GateCheck(name="candidate_present", passed=False, detail="no candidate report")
            )
        return _result(checks)
    # A broken baseline fails the gate; the candidate is still judged on the absolute checks.
    decision = evaluate_gate(loaded["candidate"], loaded["baseline"], spec)
    return _result(checks + decision.checks)
