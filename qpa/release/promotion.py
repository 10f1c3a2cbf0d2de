"""What a HarnessRelease allows to promote to the next environment: a version the gate passed.

`promotable(hr)` returns a `Promotion` (the version, its scores and deltas against the stable
version it replaced, the gate's reasons) or raises `NotPromotable` naming why not:

- the operator has not reconciled the current spec yet (no status, another generation, a
  candidate that is not the spec's);
- the gate has not decided yet (Deploying, Benchmarking);
- the gate did not pass (rolled back: every reason of the `Rejected` condition);
- the version went out by `qpa.ai/override=promote` rather than by the gate.

A version is promotable from `AwaitingPromotion`, `Canary` and `Promoted` once condition
`GatePassed` is True for it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from qpa.api import HarnessRelease
from qpa.api.v1alpha1 import OVERRIDE_ANNOTATION, Condition, ReleaseVersion, Scores

PROMOTABLE_PHASES = ("AwaitingPromotion", "Canary", "Promoted")


class NotPromotable(ValueError):
    """The release's status does not show a version the gate passed."""


class Promotion(BaseModel):
    """A version that passed the gate in one environment, ready for the next."""

    model_config = ConfigDict(extra="forbid")

    release: str
    namespace: str | None
    phase: str
    version: ReleaseVersion
    scores: Scores | None
    stable_scores: Scores | None
    deltas: dict[str, float]
    reasons: list[str]


def _condition(hr: HarnessRelease, type: str) -> Condition | None:
    for condition in hr.status.conditions if hr.status else []:
        if condition.type == type:
            return condition
    return None


def promotable(hr: HarnessRelease) -> Promotion:
    name = hr.metadata.name or "(unnamed)"
    status = hr.status
    if status is None or status.phase is None:
        raise NotPromotable(f"HarnessRelease {name} has no status: the operator has not run it")
    generation = hr.metadata.generation
    if (
        generation is not None
        and status.observed_generation is not None
        and status.observed_generation != generation
    ):
        raise NotPromotable(
            f"HarnessRelease {name}: its status is for generation {status.observed_generation} "
            f"but the spec is at {generation}: wait for the operator to judge the new spec"
        )
    candidate = status.candidate
    if candidate is None:
        raise NotPromotable(f"HarnessRelease {name} has no candidate in its status")
    if (candidate.model, candidate.harness) != (hr.spec.model, hr.spec.harness):
        raise NotPromotable(
            f"HarnessRelease {name}: the status judged {candidate.id} "
            f"(Harness {candidate.harness_version}), not the spec's Harness "
            f"{hr.spec.harness.version} and model {hr.spec.model.uri}"
        )
    gate = _condition(hr, "GatePassed")
    rejected = _condition(hr, "Rejected")
    if status.phase == "RolledBack" or status.decision == "rollback":
        why = "; ".join(status.reasons) or (rejected.message if rejected else "") or "rolled back"
        code = f" ({rejected.reason})" if rejected is not None and rejected.status == "True" else ""
        raise NotPromotable(f"the gate did not pass for {candidate.id}{code}: {why}")
    if gate is None or gate.status != "True":
        override = status.override
        if override is not None and override.action == "promote":
            raise NotPromotable(
                f"{candidate.id} went out by {OVERRIDE_ANNOTATION}=promote, not by the gate "
                f"(GatePassed={gate.status if gate else 'missing'}): carry it by hand if you "
                "mean to"
            )
        state = f"GatePassed={gate.status} ({gate.reason})" if gate else "no GatePassed condition"
        raise NotPromotable(
            f"the gate has not passed {candidate.id} (phase {status.phase}, {state})"
        )
    if status.phase not in PROMOTABLE_PHASES:
        raise NotPromotable(
            f"{candidate.id} is in phase {status.phase}; promotable from "
            f"{', '.join(PROMOTABLE_PHASES)}"
        )
    return Promotion(
        release=name,
        namespace=hr.metadata.namespace,
        phase=status.phase,
        version=candidate.model_copy(
            update={"report_uri": status.report_uri or candidate.report_uri}
        ),
        scores=status.scores,
        stable_scores=status.stable_scores if status.phase != "Promoted" else None,
        deltas=dict(status.deltas),
        reasons=list(status.reasons),
    )


def score_lines(promotion: Promotion) -> list[str]:
    """`overall 85.0% (+5.0 points vs stable)`, then one line per capability."""
    scores = promotion.scores
    if scores is None:
        return ["no scores recorded"]
    deltas = promotion.deltas

    def line(label: str, value: float, key: str) -> str:
        delta = deltas.get(key)
        suffix = f" ({100 * delta:+.1f} points vs stable)" if delta is not None else ""
        return f"{label} {100 * value:.1f}%{suffix}"

    lines = [line("overall", scores.overall, "overall")]
    lines += [line(cap, value, cap) for cap, value in scores.by_capability.items()]
    if scores.tasks:
        lines.append(f"{scores.tasks} tasks x {scores.samples} samples")
    return lines
