"""The `Ready` condition and kstatus' abnormal-true conditions, derived from a kind's phase.

Tools that judge whether a custom resource is done read conditions, not qpa's phases:

- kstatus (`kubectl wait`, Flux, Config Sync, kpt) checks `metadata.generation` against
  `status.observedGeneration`, then `Reconciling=True` (in progress) and `Stalled=True`
  (failed), then a `Ready` condition (True: current; False or Unknown: in progress);
- Argo CD's health checks of custom kinds (a Lua script per kind; docs/operator.md has
  qpa's) and `kubectl wait --for=condition=Ready` read `Ready` the same way.

So every status the operator writes carries `Ready` (True/False/Unknown, with reason, message
and observedGeneration), plus `Reconciling=True` while the phase is on its way and
`Stalled=True` when it ended badly; those two are removed, not set to False, otherwise (the
kstatus convention for abnormal-true conditions). A phase that is neither (RolloutPool or
DevicePool `Degraded`: running with less than asked) has only `Ready=False`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final, Literal

from qpa.api.v1alpha1 import Condition, set_condition

READY: Final = "Ready"
RECONCILING: Final = "Reconciling"
STALLED: Final = "Stalled"
KSTATUS_TYPES: Final = frozenset({READY, RECONCILING, STALLED})

Readiness = Literal["ready", "reconciling", "stalled", "degraded"]

#: What each phase of each kind means to kstatus and Argo CD (a test checks every phase is here).
PHASES: Final[Mapping[str, Mapping[str, Readiness]]] = {
    "TaskBatch": {
        "Pending": "reconciling",
        "Running": "reconciling",
        "Succeeded": "ready",
        "Failed": "stalled",
    },
    "RolloutPool": {
        "Pending": "reconciling",
        "Ready": "ready",
        "Degraded": "degraded",
        "Failed": "stalled",
    },
    "DevicePool": {
        "Pending": "reconciling",
        "Ready": "ready",
        "Degraded": "degraded",
        "Failed": "stalled",
    },
    "TrainingRun": {
        "Pending": "reconciling",
        "Running": "reconciling",
        "Resuming": "reconciling",
        "Succeeded": "ready",
        "Failed": "stalled",
    },
    "HarnessRelease": {
        "Pending": "reconciling",
        "Deploying": "reconciling",
        "Benchmarking": "reconciling",
        "AwaitingPromotion": "reconciling",
        "Canary": "reconciling",
        "Promoted": "ready",
        "RolledBack": "stalled",
    },
}

#: Kinds whose status builder sets `Ready` itself, with its own reason and message.
OWN_READY: Final = frozenset({"RolloutPool", "DevicePool"})


def readiness(kind: str, phase: str | None) -> Readiness | None:
    """What `phase` of `kind` means; None for no phase yet (or one this table lacks)."""
    if phase is None:
        return None
    return PHASES.get(kind, {}).get(phase)


#: The kind's own condition that explains each meaning best, where the kind sets one.
_EXPLAINED_BY: Final[Mapping[str, str]] = {
    "ready": "Complete",
    "stalled": "Failed",
    "reconciling": "Progressing",
}


def _cause(
    conditions: list[Condition], phase: str | None, meaning: Readiness | None
) -> tuple[str, str]:
    """Reason and message for Ready: from the kind's condition that explains `meaning`, else
    from the one that changed last, else from the phase."""
    own = [c for c in conditions if c.type not in KSTATUS_TYPES]
    best = _EXPLAINED_BY.get(meaning or "")
    for condition in own:
        if condition.type == best and condition.status == "True":
            return condition.reason, condition.message
    if not own:
        return phase or "Unknown", f"phase {phase}" if phase else "no status yet"
    latest = max(enumerate(own), key=lambda item: (item[1].last_transition_time, item[0]))[1]
    return latest.reason, latest.message


def kstatus_conditions(
    kind: str,
    phase: str | None,
    conditions: list[Condition],
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """`conditions` with Ready, Reconciling and Stalled set from `phase` (other types kept)."""
    meaning = readiness(kind, phase)
    reason, message = _cause(conditions, phase, meaning)
    mine = next((c for c in conditions if c.type == READY), None)
    ready: Literal["True", "False", "Unknown"] = (
        "True" if meaning == "ready" else "Unknown" if meaning is None else "False"
    )
    if kind in OWN_READY and mine is not None and mine.status == ready:
        reason, message = mine.reason, mine.message
    result = set_condition(
        conditions, READY, ready, reason, message, observed_generation=generation, now=now
    )
    for type_, wanted in ((RECONCILING, ("reconciling", None)), (STALLED, ("stalled",))):
        if meaning in wanted:
            result = set_condition(
                result, type_, "True", reason, message, observed_generation=generation, now=now
            )
        else:
            result = [c for c in result if c.type != type_]
    return result


__all__ = [
    "KSTATUS_TYPES",
    "OWN_READY",
    "PHASES",
    "READY",
    "RECONCILING",
    "STALLED",
    "kstatus_conditions",
    "readiness",
]
