"""The release verdict: a candidate's benchmark report read from the store, gated against stable.

`judge(candidate_uri, stable_uri, gate, config)` reads the candidate's `report.json` (and the
stable release's, when there is one) through `qpa.store` (`file://` or `s3://`), applies the
release gate of `qpa.bench.gate` with the HarnessRelease's `GateSettings`, and returns a
`Verdict`: passed or not, every reason, the scores of both, and the deltas per capability.

It fails closed. A candidate report that is missing, cut short, not JSON, of another schema or
inconsistent gives a verdict that does not pass (`kind` says which), as does a stable report that
cannot be read. Only a store that cannot be reached at all (connection refused, timeouts, no
credentials) raises `ReportUnavailable`: the caller may try again, and decides when to give up.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.api.v1alpha1 import GateSettings, ObjectStore, Scores
from qpa.bench.gate import REPORT_JSON, GateSpec, ReportError, evaluate_gate
from qpa.bench.scoring import SCHEMA_VERSION, Report, describe_validation_error
from qpa.store import (
    ArtifactNotFound,
    IntegrityError,
    StoreAccessDenied,
    StoreConfig,
    StoreError,
    StoreUnavailable,
    open_object,
)

VerdictKind = Literal[
    "passed", "gate_failed", "report_missing", "report_corrupt", "stable_report_unreadable"
]


class ReportUnavailable(RuntimeError):
    """The store holding a report could not be reached (a transient condition, or no access)."""


class Verdict(BaseModel):
    """The gate's decision on one candidate, with the numbers behind it."""

    model_config = ConfigDict(extra="forbid")

    passed: bool
    kind: VerdictKind
    reasons: list[str] = Field(description="every failed check, or why no check could run")
    report_uri: str
    stable_report_uri: str | None = None
    scores: Scores | None = None
    stable_scores: Scores | None = None
    deltas: dict[str, float] = Field(default_factory=dict)


def report_uri(prefix: str) -> str:
    """The `report.json` inside a report folder URI (`s3://b/releases/x/` -> `.../report.json`)."""
    return prefix if prefix.endswith(".json") else f"{prefix.rstrip('/')}/{REPORT_JSON}"


def store_config(store: ObjectStore | None, base: StoreConfig | None = None) -> StoreConfig:
    """The reader's S3 settings: endpoint and region of the resource, credentials of the reader.

    The resource names where its reports are (`spec.store`); the credentials are the reader's
    own (`QPA_S3_*`/`AWS_*` variables or mounted key files), never the resource's Secret.
    """
    config = base or StoreConfig.from_env()
    if store is None:
        return config
    return config.model_copy(update={"endpoint": store.endpoint, "region": store.region})


def parse_report(data: bytes, source: str) -> Report:
    """A `Report` from the bytes of a `report.json`; `ReportError` names the source and field."""
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = (
            f" at line {exc.lineno} column {exc.colno}: {exc.msg}"
            if isinstance(exc, json.JSONDecodeError)
            else f": {exc}"
        )
        raise ReportError(f"report {source}: corrupt JSON{where}") from None
    if not isinstance(value, dict):
        raise ReportError(f"report {source}: expected a JSON object, got {type(value).__name__}")
    version = value.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ReportError(
            f"report {source}: field 'schema_version': expected {SCHEMA_VERSION}, got {version!r}"
        )
    try:
        return Report.model_validate(value)
    except ValidationError as exc:
        raise ReportError(f"report {source}: {describe_validation_error(exc)}") from None


class ReportMissing(ReportError):
    """No report at the URI."""


def read_report(uri: str, config: StoreConfig | None = None) -> Report:
    """Read and validate the report at `uri` (a `report.json` or its folder).

    Raises `ReportMissing` (no such object), `ReportError` (corrupt, partial, invalid) and
    `ReportUnavailable` (the store cannot be reached).
    """
    target = report_uri(uri)
    try:
        store, key = open_object(target, config)
        data = store.get_bytes(key)
    except ArtifactNotFound:
        raise ReportMissing(f"report {target}: missing (the benchmark wrote none)") from None
    except IntegrityError as exc:
        raise ReportError(f"report {target}: corrupt: {exc}") from None
    except (StoreUnavailable, StoreAccessDenied) as exc:
        raise ReportUnavailable(f"report {target}: store unavailable: {exc}") from None
    except ValueError as exc:  # a malformed URI
        raise ReportError(f"report {target}: {exc}") from None
    except StoreError as exc:
        raise ReportUnavailable(f"report {target}: store error: {exc}") from None
    return parse_report(data, target)


def scores_of(report: Report) -> Scores:
    return Scores(
        overall=round(report.overall, 6),
        by_capability={
            str(cap): round(group.success, 6) for cap, group in sorted(report.by_capability.items())
        },
        cost_per_1k_tasks=round(report.cost_per_1k_tasks, 6),
        tasks=report.tasks,
        samples=report.samples,
    )


def deltas(candidate: Scores, stable: Scores | None) -> dict[str, float]:
    """Candidate minus stable: `overall` and every capability both scored."""
    if stable is None:
        return {}
    result = {"overall": round(candidate.overall - stable.overall, 6)}
    for capability, value in candidate.by_capability.items():
        if capability in stable.by_capability:
            result[capability] = round(value - stable.by_capability[capability], 6)
    return result


def gate_spec(settings: GateSettings) -> GateSpec:
    """The bench gate's spec from the resource's gate settings (the same fields)."""
    return GateSpec.model_validate(settings.model_dump())


def judge(
    candidate_uri: str,
    stable_uri: str | None,
    gate: GateSettings,
    config: StoreConfig | None = None,
) -> Verdict:
    """Gate the candidate's report against the stable one (`None`: a first release).

    Raises `ReportUnavailable` only when a store cannot be reached; every other problem is a
    verdict that does not pass.
    """
    target = report_uri(candidate_uri)
    stable_target = report_uri(stable_uri) if stable_uri else None
    try:
        candidate = read_report(target, config)
    except ReportMissing as exc:
        return Verdict(
            passed=False,
            kind="report_missing",
            reasons=[str(exc)],
            report_uri=target,
            stable_report_uri=stable_target,
        )
    except ReportError as exc:
        return Verdict(
            passed=False,
            kind="report_corrupt",
            reasons=[str(exc)],
            report_uri=target,
            stable_report_uri=stable_target,
        )
    scores = scores_of(candidate)
    stable: Report | None = None
    if stable_target is not None:
        try:
            stable = read_report(stable_target, config)
        except ReportError as exc:
            # The candidate is still judged on the absolute checks, so every reason is listed.
            absolute = evaluate_gate(candidate, None, gate_spec(gate))
            return Verdict(
                passed=False,
                kind="stable_report_unreadable",
                reasons=[f"stable release: {exc}", *absolute.reasons],
                report_uri=target,
                stable_report_uri=stable_target,
                scores=scores,
            )
    result = evaluate_gate(candidate, stable, gate_spec(gate))
    stable_scores = scores_of(stable) if stable is not None else None
    return Verdict(
        passed=result.passed,
        kind="passed" if result.passed else "gate_failed",
        reasons=list(result.reasons),
        report_uri=target,
        stable_report_uri=stable_target,
        scores=scores,
        stable_scores=stable_scores,
        deltas=deltas(scores, stable_scores),
    )
