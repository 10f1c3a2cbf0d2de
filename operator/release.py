"""The HarnessRelease state machine, as pure functions of what the operator observes.

    next_step(hr, observed, defaults) -> Decision     # the new status, Events, when to look again
    children(hr, status, defaults, bench) -> Desired  # the objects that status calls for

A release moves through phases, all visible in `status.phase` (and `kubectl get qhr`):

    Deploying -> Benchmarking -> [AwaitingPromotion] -> Canary -> Promoted
         \\              \\                  \\             \\
          `--------------`------------------`-------------`--> RolledBack

- **Deploying**: the candidate's model InferenceService and the Harness InferenceService
  (the candidate's revision at 0% of the traffic when a stable version serves, else 100%)
  until both are Ready for the candidate's settings; past `timeouts.deploySeconds`, or on a
  failed revision, it is rolled back.
- **Benchmarking**: the benchmark Job; once it completes, its `report.json` is read from the
  store (by the handler, as part of observing) and the release gate of `qpa.bench.gate`
  judges it against the stable version's report. A failed Job, a missing or corrupt report,
  a stable report that cannot be read, a store unreachable for `timeouts.reportSeconds`, or
  no verdict within `timeouts.benchmarkSeconds + reportSeconds` rolls it back: missing results
  never promote.
- **AwaitingPromotion** (`promotion: manual` only): the gate passed; the annotation
  `qpa.ai/override=promote` starts the canary.
- **Canary**: the Harness's `canaryTrafficPercent` walks `canary.steps`, each held for
  `canary.stepSeconds` once the Harness is Ready; a failed revision, or a step not Ready
  within `timeouts.deploySeconds`, rolls back. With `rollout.analysis`, every step (the last
  one too) is also judged by the candidate's live metrics (`qpa_operator.analysis`): a baseline
  when the step is Ready, a measurement every `intervalSeconds`; more failed measurements than
  `failureLimit` roll back (`AnalysisFailed`), and a step advances only when a measurement taken
  after its hold passed; one with too few requests by `timeouts.deploySeconds` rolls back
  (`AnalysisInconclusive`). Condition `AnalysisPassed` and `status.analysis` say where it
  stands. A first release (no stable version) has nothing to shift traffic from and is
  promoted at once.
- **Promoted**: the candidate is `stable` (100%); the former stable version becomes
  `previous` and its model stays deployed for a rollback. The `<release>-model` Service (the
  stable model endpoint, `status.modelEndpoint`) follows the stable version's model.
- **RolledBack**: the candidate's model is removed and the Harness InferenceService gets the
  stable version's spec back at 100% (no candidate left in it at 0%); with no stable
  version, both InferenceServices go. Condition `Rejected` carries every reason.

`rollout.deploymentMode: RawDeployment` (no `canaryTrafficPercent` there), or a Harness
InferenceService that KServe reports in another mode than Serverless, is RolledBack with reason
`UnsupportedDeploymentMode` naming the mode. A store Secret that cannot give the storage
initializer its keys (`Observed.storage_problem`) rolls back with `StorageCredentials`.

A release naming a store URI outside its namespace's prefix (`spec.reportUri`,
`spec.model.uri`, a stable or previous version's URIs) is RolledBack at once with reason
`OutsideStorePrefix` (the message names the field): nothing is deployed, benchmarked or read,
and no override lifts it.

A spec naming another model or Harness is a new candidate and starts over (an unfinished one
is superseded); the spec naming the stable version is simply Promoted. The annotation
`qpa.ai/override` (`promote`: skip the benchmark or overrule the gate, also after a rollback;
`abort`: roll back now) is recorded in `status.override` and condition `Overridden`, and the
handler removes it. Every transition yields an Event.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from qpa_operator import analysis as canary_analysis
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders import storeaccess
from qpa_operator.builders.common import Defaults, JsonDict, job_state, spec_hash_of

from qpa.api import HarnessRelease
from qpa.api.v1alpha1 import (
    OVERRIDE_ANNOTATION,
    AnalysisStatus,
    CanaryAnalysis,
    ConditionStatus,
    HarnessReleaseStatus,
    MetricsSample,
    OverrideAction,
    ReleaseOverride,
    ReleaseVersion,
    Scores,
    set_condition,
)
from qpa.release.verdict import Verdict

ACTIVE: Final = frozenset({"Deploying", "Benchmarking", "AwaitingPromotion", "Canary"})
#: Seconds between attempts to read a report while the store is unreachable.
REPORT_RETRY_SECONDS: Final = 10.0
#: Transitions one call may chain (a step that completes at once leads to the next).
MAX_CHAIN: Final = 8


@dataclass(frozen=True)
class Observed:
    """What the handler saw: the candidate's children, the verdict on its report, the time."""

    now: datetime
    model: Mapping[str, Any] | None = None
    harness: Mapping[str, Any] | None = None
    bench: Mapping[str, Any] | None = None
    verdict: Verdict | None = None
    report_problem: str | None = None
    #: why the release may not use a store URI it names (outside its namespace's prefix)
    refused: str | None = None
    #: the candidate's request counters now (canary analysis), or why they cannot be read
    metrics: MetricsSample | None = None
    metrics_problem: str | None = None
    #: why the storage initializer's Secret cannot be derived from the namespace's store keys
    storage_problem: str | None = None


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Decision:
    status: HarnessReleaseStatus
    events: tuple[Event, ...] = ()
    #: When a deadline or the end of a canary step asks for another look (None: no timer).
    wake_at: datetime | None = None
    #: The override annotation was acted on (or was invalid): the handler removes it.
    consume_override: bool = False
    #: The annotation's value this decision saw: only that value is removed, so a person's
    #: newer override written meanwhile is not swallowed by a late reconcile of the old one.
    override_seen: str | None = None


@dataclass(frozen=True)
class Desired:
    """Children to create or update, and the (kind, name) of every owned child to keep."""

    apply: tuple[JsonDict, ...]
    keep: frozenset[tuple[str, str]]


def override_of(hr: HarnessRelease) -> tuple[OverrideAction | None, str | None]:
    """(action, None), (None, why the value is invalid), or (None, None) without annotation."""
    raw = hr.metadata.annotations.get(OVERRIDE_ANNOTATION)
    if raw is None:
        return None, None
    value = raw.strip().lower()
    if value == "promote":
        return "promote", None
    if value == "abort":
        return "abort", None
    return None, f"{OVERRIDE_ANNOTATION}={raw!r} is neither promote nor abort; ignored"


def wants_report(hr: HarnessRelease, bench: Mapping[str, Any] | None, defaults: Defaults) -> bool:
    """True when the candidate's benchmark completed and the gate is still to decide."""
    status = hr.status
    if status is None or status.phase != "Benchmarking" or status.candidate is None:
        return False
    if status.candidate.id != builder.candidate(hr, defaults).id:
        return False
    return job_state(bench).complete


def wants_metrics(hr: HarnessRelease, defaults: Defaults) -> bool:
    """True when the candidate is in its canary with an analysis: its counters are read."""
    status = hr.status
    if status is None or status.phase != "Canary" or status.candidate is None:
        return False
    if hr.spec.rollout.analysis is None:
        return False
    return status.candidate.id == builder.candidate(hr, defaults).id


def needs_storage(hr: HarnessRelease) -> bool:
    """The spec's, the stable or the previous model is downloaded from the object store."""
    status = hr.status or HarnessReleaseStatus()
    versions = [v.model for v in (status.stable, status.previous) if v is not None]
    return any(builder.uses_store(m) for m in [hr.spec.model, *versions])


def deployed_models(hr: HarnessRelease, status: HarnessReleaseStatus) -> list[Any]:
    """The models `status` keeps deployed: the spec's while active, stable's, previous'."""
    models = [hr.spec.model] if status.phase in ACTIVE else []
    models += [v.model for v in (status.stable, status.previous) if v is not None]
    return models


def reported_mode(isvc: Mapping[str, Any] | None) -> str | None:
    """The deployment mode KServe reports for an InferenceService (`status.deploymentMode`)."""
    mode = ((isvc or {}).get("status") or {}).get("deploymentMode")
    return str(mode) if mode else None


def stable_report(hr: HarnessRelease) -> str | None:
    stable = hr.status.stable if hr.status else None
    return stable.report_uri if stable is not None else None


# --------------------------------------------------------------------------- children


def harness_traffic(hr: HarnessRelease, status: HarnessReleaseStatus) -> int:
    """The candidate's share of the Harness's traffic that `status` calls for."""
    if status.phase == "Promoted":
        return 100
    if status.stable is None:
        return 100 if status.phase in ACTIVE else 0
    if status.phase == "Canary":
        steps = hr.spec.canary.steps
        return steps[min(status.canary_step or 0, len(steps) - 1)]
    return 0


def harness_manifest(
    hr: HarnessRelease, status: HarnessReleaseStatus, defaults: Defaults
) -> JsonDict | None:
    """The Harness InferenceService for `status`, or None when there should be none."""
    if status.phase in ACTIVE:
        return builder.harness_service(
            hr, defaults, builder.candidate(hr, defaults), harness_traffic(hr, status)
        )
    if status.phase == "Promoted" and status.stable is not None:
        return builder.harness_service(hr, defaults, status.stable, 100)
    if status.phase == "RolledBack" and status.stable is not None:
        # The stable spec comes back whole: no candidate is left in it, not even at 0%.
        return builder.harness_service(hr, defaults, status.stable, 100)
    return None


def children(
    hr: HarnessRelease,
    status: HarnessReleaseStatus | None,
    defaults: Defaults,
    bench: Mapping[str, Any] | None = None,
    storage: str | None = None,
) -> Desired:
    """The children `status` calls for; `storage` is the source (`builder.storage_source`) of
    the storage initializer's Secret the handler derived, which its account names."""
    status = status or HarnessReleaseStatus()
    apply: list[JsonDict] = []
    if status.phase in ACTIVE:
        storeaccess.check_harnessrelease(hr, defaults)  # no pod for a URI outside the prefix
    models = deployed_models(hr, status)
    keep_extra: set[tuple[str, str]] = set()
    if any(builder.uses_store(m) for m in models):
        name = builder.storage_name(hr)
        keep_extra.add(("ServiceAccount", name))
        if storage is not None:
            store = builder.model_store(hr, defaults)
            apply.append(builder.storage_account(hr, defaults, store, storage))
    if status.stable is not None:
        apply.append(builder.stable_endpoint(hr, defaults, status.stable.model))
    seen: set[str] = set()
    for model in models:
        name = builder.model_name(hr, model)
        if name not in seen:
            seen.add(name)
            apply.append(builder.model_service(hr, defaults, model))
    harness = harness_manifest(hr, status, defaults)
    if harness is not None:
        apply.append(harness)
    keep = {(str(c["kind"]), c["metadata"]["name"]) for c in apply} | keep_extra
    job_name = builder.bench_job_name(hr, defaults)
    if status.phase == "Benchmarking":
        apply += [builder.bench_work_order(hr, defaults), builder.bench_job(hr, defaults)]
        keep |= {("ConfigMap", job_name), ("Job", job_name)}
    elif bench is not None and job_state(bench).finished:
        keep |= {("ConfigMap", job_name), ("Job", job_name)}  # the finished run stays, for logs
    return Desired(tuple(apply), frozenset(keep))


def is_current(live: Mapping[str, Any] | None, desired: Mapping[str, Any] | None) -> bool:
    """`live` is Ready and was last written from `desired` (same spec hash)."""
    if live is None or desired is None:
        return False
    return spec_hash_of(live) == spec_hash_of(desired) and builder.isvc_ready(live)


# --------------------------------------------------------------------------- transitions


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _points(value: float) -> str:
    return f"{100 * value:+.1f} points"


def _describe(version: ReleaseVersion) -> str:
    return f"{version.id} (Harness {version.harness_version}, model {version.model_uri})"


def score_line(scores: Scores, deltas: Mapping[str, float]) -> str:
    """`overall 81.0% (+3.0 points); tool_use 80.0% (+2.0 points); ...`"""
    parts = [
        f"overall {_pct(scores.overall)}"
        + (f" ({_points(deltas['overall'])})" if "overall" in deltas else "")
    ]
    for capability, value in scores.by_capability.items():
        delta = deltas.get(capability)
        parts.append(
            f"{capability} {_pct(value)}" + (f" ({_points(delta)})" if delta is not None else "")
        )
    return "; ".join(parts)


@dataclass
class _Machine:
    hr: HarnessRelease
    observed: Observed
    defaults: Defaults
    status: HarnessReleaseStatus
    candidate: ReleaseVersion
    events: list[Event] = field(default_factory=list)
    wake_at: datetime | None = None
    consume: bool = False

    # ------------------------------------------------------------------ helpers

    @property
    def now(self) -> datetime:
        return self.observed.now

    @property
    def phase(self) -> str | None:
        return self.status.phase

    def update(self, **changes: Any) -> None:
        self.status = self.status.model_copy(update=changes)

    def condition(self, type: str, status: ConditionStatus, reason: str, message: str = "") -> None:
        self.update(
            conditions=set_condition(
                self.status.conditions,
                type,
                status,
                reason,
                message[:32000],
                observed_generation=self.hr.metadata.generation,
                now=self.now,
            )
        )

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(Event(reason, message[:1000], warning))

    def wake(self, at: datetime) -> None:
        if self.wake_at is None or at < self.wake_at:
            self.wake_at = at

    def elapsed(self) -> float:
        since = self.status.since or self.now
        return (self.now - since).total_seconds()

    def after(self, seconds: float) -> datetime:
        return (self.status.since or self.now) + timedelta(seconds=seconds)

    @property
    def forced(self) -> bool:
        override = self.status.override
        return (
            override is not None
            and override.action == "promote"
            and override.version == self.candidate.id
        )

    def failure(self) -> str | None:
        for live in (self.observed.model, self.observed.harness):
            problem = builder.isvc_failure(live)
            if problem is not None:
                name = (live or {}).get("metadata", {}).get("name", "InferenceService")
                return f"{name}: {problem}"
        return None

    # ------------------------------------------------------------------ starting points

    def start(self) -> None:
        """A new candidate: Deploying, or Promoted when the spec names the stable version."""
        old = self.status.candidate
        if old is not None and self.phase in ACTIVE:
            self.event(
                "Superseded",
                f"candidate {old.id} replaced by {self.candidate.id} before a decision",
                warning=True,
            )
        self.update(
            candidate=self.candidate,
            scores=None,
            deltas={},
            decision=None,
            reasons=[],
            canary_step=None,
            override=None,
            benchmark_job=None,
            report_uri=None,
            analysis=None,
            since=self.now,
        )
        stable = self.status.stable
        if stable is not None and stable.id == self.candidate.id:
            self.update(
                phase="Promoted",
                traffic_percent=100,
                scores=self.status.stable_scores,
                reasons=[f"{stable.id} is the stable version: nothing to release"],
            )
            self.condition("Promoted", "True", "IsStable", f"{_describe(stable)} serves")
            self.condition("Rejected", "False", "NotRejected")
            self.event("Stable", f"the spec names the stable version {_describe(stable)}")
            return
        self.update(phase="Deploying", traffic_percent=harness_traffic_for(stable, "Deploying"))
        self.condition("Deployed", "False", "Deploying", "creating the InferenceServices")
        self.condition("BenchmarkDone", "False", "NotStarted", "the benchmark has not run")
        self.condition("GatePassed", "Unknown", "NotEvaluated", "no report yet")
        self.condition("Promoted", "False", "Candidate", "not promoted yet")
        self.condition("Rejected", "False", "NotRejected")
        self.condition("Overridden", "False", "NoOverride")
        self.event("Deploying", f"deploying candidate {_describe(self.candidate)}")

    def apply_override(self, action: OverrideAction) -> None:
        self.consume = True
        done = self.status.override
        if done is not None and (done.action, done.version) == (action, self.candidate.id):
            return  # seen again before its removal reached us: already acted on
        record = ReleaseOverride(action=action, version=self.candidate.id, at=self.now)
        who = f"{OVERRIDE_ANNOTATION}={action}"
        if action == "abort":
            if self.phase in ACTIVE:
                self.update(override=record)
                self.condition("Overridden", "True", "Abort", f"aborted by {who}")
                self.event("Override", f"{who}: rolling back {self.candidate.id}", warning=True)
                self.rollback("Aborted", [f"aborted by {who}"])
            else:
                self.event(
                    "OverrideIgnored",
                    f"{who} ignored: {self.candidate.id} is already {self.phase}",
                    warning=True,
                )
            return
        if self.phase == "Promoted":
            self.event("OverrideIgnored", f"{who} ignored: {self.candidate.id} is stable already")
            return
        self.update(override=record)
        self.condition(
            "Overridden", "True", "ForcePromote", f"{who}: benchmark and gate are overruled"
        )
        self.event(
            "Override", f"{who}: promoting {self.candidate.id} whatever the gate says", warning=True
        )
        if self.phase == "RolledBack":
            self.update(phase="Deploying", since=self.now, decision=None)
            self.condition("Rejected", "False", "Overridden", f"overruled by {who}")
            self.event("Deploying", f"deploying {_describe(self.candidate)} again ({who})")

    # ------------------------------------------------------------------ endings

    def rollback(self, code: str, reasons: list[str]) -> None:
        stable = self.status.stable
        keeps = f"{stable.id} keeps the traffic" if stable else "no stable version serves"
        self.update(
            phase="RolledBack",
            decision="rollback",
            reasons=reasons,
            canary_step=None,
            traffic_percent=0,
            since=self.now,
        )
        message = "; ".join(reasons)
        self.condition("Rejected", "True", code, message)
        self.condition("Promoted", "False", code, "rolled back")
        self.event(
            "RolledBack", f"{self.candidate.id} rejected ({code}): {message}; {keeps}", warning=True
        )

    def promote(self) -> None:
        old = self.status.stable
        promoted = self.candidate.model_copy(
            update={"report_uri": self.status.report_uri, "promoted_at": self.now}
        )
        previous = old if old is not None and old.id != promoted.id else self.status.previous
        self.update(
            phase="Promoted",
            stable=promoted,
            previous=previous,
            stable_scores=self.status.scores,
            decision="promote",
            canary_step=None,
            traffic_percent=100,
            since=self.now,
        )
        self.condition("Promoted", "True", "Promoted", f"{_describe(promoted)} serves all traffic")
        kept = f"; {previous.id} kept for rollback" if previous is not None else ""
        self.event("Promoted", f"{_describe(promoted)} is stable (100% of traffic){kept}")

    def start_canary(self) -> None:
        if self.forced and self.status.decision is None:
            self.update(
                decision="promote",
                reasons=[
                    *self.status.reasons,
                    f"promoted by {OVERRIDE_ANNOTATION}=promote: benchmark and gate skipped",
                ],
            )
        if self.status.stable is None:
            self.update(
                reasons=[
                    *self.status.reasons,
                    "first release: no stable version to shift traffic from",
                ]
            )
            self.promote()
            return
        steps = self.hr.spec.canary.steps
        self.update(phase="Canary", canary_step=0, traffic_percent=steps[0], since=self.now)
        self.event(
            "Canary", f"{self.candidate.id}: {steps[0]}% of traffic (step 1 of {len(steps)})"
        )

    # ------------------------------------------------------------------ phases

    def advance(self) -> bool:
        """One transition, if the observations allow one; False when the phase stays."""
        before = self.phase
        step_before = self.status.canary_step
        handler = {
            "Deploying": self.deploying,
            "Benchmarking": self.benchmarking,
            "AwaitingPromotion": self.awaiting,
            "Canary": self.canary,
        }.get(self.phase or "")
        if handler is None:
            return False
        handler()
        return self.phase != before or self.status.canary_step != step_before

    def deploying(self) -> None:
        problem = self.failure()
        if problem is not None:
            self.rollback("InferenceServiceFailed", [problem])
            return
        model_ok = is_current(self.observed.model, builder.model_service(self.hr, self.defaults))
        harness_ok = is_current(
            self.observed.harness, harness_manifest(self.hr, self.status, self.defaults)
        )
        if model_ok and harness_ok:
            self.condition(
                "Deployed", "True", "InferenceServicesReady", "model and Harness are Ready"
            )
            if self.forced:
                self.start_canary()
                return
            job = builder.bench_job_name(self.hr, self.defaults)
            self.update(phase="Benchmarking", since=self.now, benchmark_job=job)
            self.condition("BenchmarkDone", "False", "BenchmarkRunning", f"Job {job} runs")
            self.event("Benchmarking", f"Job {job} benchmarks {self.candidate.id}")
            return
        waiting = [
            name
            for name, ok in (
                (builder.model_name(self.hr), model_ok),
                (builder.harness_name(self.hr), harness_ok),
            )
            if not ok
        ]
        limit = self.hr.spec.timeouts.deploy_seconds
        if self.elapsed() > limit:
            self.rollback("DeployTimeout", [f"{' and '.join(waiting)} not Ready within {limit} s"])
            return
        self.condition(
            "Deployed", "False", "WaitingForInferenceServices", f"waiting for {', '.join(waiting)}"
        )
        self.wake(self.after(limit + 1))

    def benchmarking(self) -> None:
        if self.forced:
            self.start_canary()
            return
        timeouts = self.hr.spec.timeouts
        name = self.status.benchmark_job or builder.bench_job_name(self.hr, self.defaults)
        job = job_state(self.observed.bench)
        if job.failed_for_good:
            detail = f" ({job.reason}: {job.message})" if job.message else f" ({job.reason})"
            reason = f"benchmark Job {name} failed{detail}: no report, no promotion"
            self.condition("BenchmarkDone", "False", "BenchmarkFailed", reason)
            self.rollback("BenchmarkFailed", [reason])
            return
        if job.complete:
            verdict = self.observed.verdict
            if verdict is not None:
                self.judged(verdict)
                return
            problem = self.observed.report_problem
            if problem is None:
                # Observed before this phase began (nothing read yet): look again at once.
                self.wake(self.now)
                return
            if not self.reading():
                # The first failed read starts the store's grace period (`since`).
                self.update(since=self.now)
            deadline = self.after(timeouts.report_seconds)
            if self.now > deadline:
                self.rollback("ReportUnavailable", [problem])
                return
            self.condition("BenchmarkDone", "False", "ReportUnavailable", problem)
            self.wake(min(deadline, self.now + timedelta(seconds=REPORT_RETRY_SECONDS)))
            return
        limit = timeouts.benchmark_seconds + timeouts.report_seconds
        if self.elapsed() > limit:
            self.rollback(
                "BenchmarkTimeout", [f"benchmark Job {name} gave no report within {limit} s"]
            )
            return
        self.wake(self.after(limit + 1))

    def judged(self, verdict: Verdict) -> None:
        scores = verdict.scores
        self.update(
            scores=scores,
            deltas=verdict.deltas,
            report_uri=verdict.report_uri,
            stable_scores=verdict.stable_scores or self.status.stable_scores,
        )
        self.condition("BenchmarkDone", "True", "ReportRead", f"read {verdict.report_uri}")
        summary = score_line(scores, verdict.deltas) if scores is not None else ""
        if not verdict.passed:
            code = {
                "gate_failed": "GateFailed",
                "report_missing": "ReportMissing",
                "report_corrupt": "ReportCorrupt",
                "stable_report_unreadable": "StableReportUnreadable",
            }.get(verdict.kind, "GateFailed")
            self.condition("GatePassed", "False", code, "; ".join(verdict.reasons))
            self.rollback(code, list(verdict.reasons))
            return
        reasons = [f"gate passed: {summary}"]
        stable = self.status.stable
        if stable is not None and stable.report_uri is None:
            reasons.append(
                f"stable {stable.id} has no report (promoted by override): absolute thresholds only"
            )
        self.update(decision="promote", reasons=reasons)
        self.condition("GatePassed", "True", "GatePassed", summary)
        self.event("GatePassed", f"{self.candidate.id}: {summary}")
        if self.hr.spec.promotion == "manual":
            self.update(phase="AwaitingPromotion", since=self.now)
            self.event(
                "AwaitingPromotion",
                f"{self.candidate.id} passed the gate; "
                f"annotate {OVERRIDE_ANNOTATION}=promote to start the canary",
            )
            return
        self.start_canary()

    def reading(self) -> bool:
        """An earlier attempt to read the report already failed (condition ReportUnavailable)."""
        return any(
            c.type == "BenchmarkDone" and c.reason == "ReportUnavailable"
            for c in self.status.conditions
        )

    def awaiting(self) -> None:
        problem = self.failure()
        if problem is not None:
            self.rollback("InferenceServiceFailed", [problem])
        elif self.forced:
            self.start_canary()

    def canary(self) -> None:
        problem = self.failure()
        if problem is not None:
            self.rollback("CanaryFailed", [problem])
            return
        steps = self.hr.spec.canary.steps
        index = min(self.status.canary_step or 0, len(steps) - 1)
        desired = harness_manifest(self.hr, self.status, self.defaults)
        limit = self.hr.spec.timeouts.deploy_seconds
        if not is_current(self.observed.harness, desired):
            if self.elapsed() > limit:
                self.rollback(
                    "CanaryTimeout",
                    [f"{builder.harness_name(self.hr)} not Ready at {steps[index]}% within "
                     f"{limit} s"],
                )  # fmt: skip
                return
            self.wake(self.after(limit + 1))
            return
        analysis = self.hr.spec.rollout.analysis
        hold = self.hr.spec.canary.step_seconds
        if analysis is None:
            if index == len(steps) - 1:
                self.promote()
                return
            if self.elapsed() < hold:
                self.wake(self.after(hold))
                return
        else:
            verdict = self.analyse(index, analysis)
            if verdict == "failed":
                return
            if verdict != "passed":
                if self.elapsed() > max(limit, hold):
                    last = self.status.analysis.message if self.status.analysis else ""
                    self.rollback(
                        "AnalysisInconclusive",
                        [f"canary step {index + 1} ({steps[index]}%) had no passing analysis "
                         f"within {max(limit, hold)} s: {last}"],
                    )  # fmt: skip
                return
            if index == len(steps) - 1:
                self.promote()
                return
        nxt = index + 1
        self.update(canary_step=nxt, traffic_percent=steps[nxt], since=self.now)
        found = f"; analysis: {self.status.analysis.message}" if self.status.analysis else ""
        self.event(
            "CanaryStep", f"{self.candidate.id}: {steps[nxt]}% of traffic "
            f"(step {nxt + 1} of {len(steps)}){found}",
        )  # fmt: skip

    def analyse(self, index: int, analysis: CanaryAnalysis) -> str:
        """Measure the step's analysis if one is due: "passed" (a measurement after the hold
        passed), "failed" (rolled back), or "pending" (the wake-up is set)."""
        steps = self.hr.spec.canary.steps
        hold_end = self.after(self.hr.spec.canary.step_seconds)
        interval = timedelta(seconds=analysis.interval_seconds)
        current = self.status.analysis
        sample = self.observed.metrics
        if current is not None and current.step != index:
            current = None
        if current is not None and current.baseline is not None and current.measured_at:
            if current.passed and current.measured_at >= hold_end:
                return "passed"
            due = _next_due(current.measured_at, hold_end, interval)
            if self.now < due:
                self.wake(due)
                return "pending"
        if sample is None:
            why = self.observed.metrics_problem or "no metrics read"
            state = current or AnalysisStatus(step=index)
            return self.analysis_failed(
                index, state, f"the candidate's metrics cannot be read: {why}"
            )
        if current is None or current.baseline is None:
            self.update(
                analysis=AnalysisStatus(
                    step=index,
                    baseline=sample,
                    measured_at=self.now,
                    message=f"baseline: {sample.requests:g} requests so far",
                )
            )
            self.condition(
                "AnalysisPassed", "Unknown", "Measuring",
                f"step {index + 1} ({steps[index]}%): baseline taken",
            )  # fmt: skip
            self.wake(self.now + interval)
            return "pending"
        result = canary_analysis.measure(current.baseline, sample, analysis)
        if result.outcome == "reset":
            self.update(
                analysis=current.model_copy(
                    update={"baseline": sample, "measured_at": self.now, "passed": False,
                            "message": result.message}
                )
            )  # fmt: skip
            self.wake(self.now + interval)
            return "pending"
        measured = current.model_copy(
            update={
                "measurements": current.measurements + 1,
                "requests": result.requests,
                "error_rate": result.error_rate,
                "p95_latency_seconds": result.p95_seconds,
                "passed": result.outcome == "passed",
                "measured_at": self.now,
                "message": result.message,
            }
        )
        if result.outcome == "failed":
            return self.analysis_failed(index, measured, result.message)
        self.update(analysis=measured)
        where = f"step {index + 1} ({steps[index]}%): {result.message}"
        if result.outcome == "inconclusive":
            self.condition("AnalysisPassed", "Unknown", "Inconclusive", where)
        else:
            self.condition("AnalysisPassed", "True", "Passed", where)
        if result.outcome == "passed" and self.now >= hold_end:
            return "passed"
        self.wake(_next_due(self.now, hold_end, interval))
        return "pending"

    def analysis_failed(self, index: int, state: AnalysisStatus, message: str) -> str:
        steps = self.hr.spec.canary.steps
        analysis = self.hr.spec.rollout.analysis
        allowed = analysis.failure_limit if analysis is not None else 0
        state = state.model_copy(
            update={
                "failures": state.failures + 1,
                "passed": False,
                "measured_at": self.now,
                "message": message,
            }
        )
        self.update(analysis=state)
        where = f"step {index + 1} ({steps[index]}%)"
        self.condition("AnalysisPassed", "False", "Failed", f"{where}: {message}")
        if state.failures > allowed:
            self.rollback(
                "AnalysisFailed",
                [f"canary analysis failed at {where} ({state.failures} failed measurement(s), "
                 f"failureLimit {allowed}): {message}"],
            )  # fmt: skip
            return "failed"
        self.event("AnalysisFailed", f"{self.candidate.id} {where}: {message}", warning=True)
        if analysis is not None:
            self.wake(self.now + timedelta(seconds=analysis.interval_seconds))
        return "pending"


def _next_due(last: datetime, hold_end: datetime, interval: timedelta) -> datetime:
    """The next measurement: an interval after the last, and at the end of the hold."""
    due = last + interval
    return min(due, hold_end) if last < hold_end else due


def harness_traffic_for(stable: ReleaseVersion | None, phase: str) -> int:
    """The candidate's share while deploying: all of it on a first release, else none."""
    return 100 if stable is None and phase in ACTIVE else 0


def unsupported_mode(hr: HarnessRelease, observed: Observed) -> str | None:
    """Why the release's deployment mode cannot carry its canary, or None."""
    wanted = hr.spec.rollout.deployment_mode
    if wanted != builder.SUPPORTED_MODE:
        return (
            f"spec.rollout.deploymentMode {wanted}: the canary needs KServe's "
            f"{builder.SUPPORTED_MODE} mode (Knative revisions split canaryTrafficPercent; "
            f"{wanted} has no traffic split); set {builder.SUPPORTED_MODE}"
        )
    reported = reported_mode(observed.harness)
    if reported is not None and reported != builder.SUPPORTED_MODE:
        return (
            f"KServe runs {builder.harness_name(hr)} in {reported} mode despite the "
            f"{builder.DEPLOYMENT_MODE} annotation {builder.SUPPORTED_MODE}: the canary needs "
            f"{builder.SUPPORTED_MODE} (is Knative Serving installed?)"
        )
    return None


def next_step(hr: HarnessRelease, observed: Observed, defaults: Defaults) -> Decision:
    """The release's next status (and Events, and when to look again) from what was observed."""
    current = copy.deepcopy(hr.status) if hr.status is not None else HarnessReleaseStatus()
    machine = _Machine(
        hr=hr,
        observed=observed,
        defaults=defaults,
        status=current.model_copy(update={"observed_generation": hr.metadata.generation}),
        candidate=builder.candidate(hr, defaults),
    )
    action, invalid = override_of(hr)
    if invalid is not None:
        machine.consume = True
        machine.event("OverrideInvalid", invalid, warning=True)
    known = machine.status.candidate
    if known is None or known.id != machine.candidate.id or machine.phase is None:
        machine.start()
    else:
        machine.update(candidate=machine.candidate)
    if action is not None:
        machine.apply_override(action)
    if observed.refused is not None and machine.phase in ACTIVE:
        # Before any pod is scheduled or any report read: no override lifts this.
        machine.rollback("OutsideStorePrefix", [observed.refused])
    mode = unsupported_mode(hr, observed)
    if mode is not None and machine.phase in ACTIVE:
        machine.rollback("UnsupportedDeploymentMode", [mode])
    if observed.storage_problem is not None and machine.phase in ACTIVE:
        machine.rollback(
            "StorageCredentials",
            [f"the storage initializer gets no keys for {hr.spec.model.uri}: "
             f"{observed.storage_problem}"],
        )  # fmt: skip
    for _ in range(MAX_CHAIN):
        if not machine.advance():
            break
    stable = machine.status.stable
    endpoint = builder.stable_model_url(hr, defaults) if stable is not None else None
    if machine.status.model_endpoint != endpoint:
        machine.update(model_endpoint=endpoint)
    return Decision(
        status=machine.status,
        events=tuple(machine.events),
        wake_at=machine.wake_at,
        consume_override=machine.consume,
        override_seen=hr.metadata.annotations.get(OVERRIDE_ANNOTATION),
    )
