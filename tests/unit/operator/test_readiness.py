"""Ready, Reconciling and Stalled on every phase of every kind, read the way kstatus reads them.

`kstatus` below is kstatus' generic rules (sigs.k8s.io/cli-utils pkg/kstatus/status: generic.go
`checkGenericProperties`/`checkGeneration`, status.go `checkReadyCondition`): an unobserved
generation is InProgress, `Reconciling=True` InProgress, `Stalled=True` Failed, then `Ready`
True is Current, False or Unknown InProgress. `argo_cd` is the health script docs/operator.md
gives Argo CD for qpa's kinds, in Python.
"""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from qpa_operator.builders.readiness import PHASES, kstatus_conditions, readiness
from qpa_operator.handlers.status import with_kstatus

from qpa.api.v1alpha1 import RESOURCES, Condition, TaskBatch, TaskBatchStatus, set_condition

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def phases_of(cls: type[Any]) -> tuple[str, ...]:
    """Every value of a kind's `status.phase` Literal."""
    status_model = typing.get_args(cls.model_fields["status"].annotation)[0]
    annotation = status_model.model_fields["phase"].annotation
    (literal,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return typing.get_args(literal)


def kstatus(obj: dict[str, Any]) -> str:
    generation = obj["metadata"].get("generation")
    observed = obj["status"].get("observedGeneration")
    if generation is not None and observed is not None and generation != observed:
        return "InProgress"
    conditions = obj["status"].get("conditions") or []
    for c in conditions:
        if c["type"] == "Reconciling" and c["status"] == "True":
            return "InProgress"
        if c["type"] == "Stalled" and c["status"] == "True":
            return "Failed"
    for c in conditions:
        if c["type"] == "Ready":
            return "Current" if c["status"] == "True" else "InProgress"
    return "Current"


def argo_cd(obj: dict[str, Any]) -> str:
    if obj["status"].get("observedGeneration") != obj["metadata"].get("generation"):
        return "Progressing"
    conditions = {c["type"]: c for c in obj["status"].get("conditions") or []}
    if conditions.get("Stalled", {}).get("status") == "True":
        return "Degraded"
    if conditions.get("Reconciling", {}).get("status") == "True":
        return "Progressing"
    ready = conditions.get("Ready", {}).get("status")
    return {"True": "Healthy", "False": "Degraded"}.get(str(ready), "Progressing")


EXPECTED = {
    "ready": ("Current", "Healthy"),
    "reconciling": ("InProgress", "Progressing"),
    "stalled": ("Failed", "Degraded"),
    "degraded": ("InProgress", "Degraded"),
}

CASES = [(cls.info.kind, phase) for cls in RESOURCES for phase in phases_of(cls)]


def test_every_phase_of_every_kind_has_a_meaning() -> None:
    assert {cls.info.kind for cls in RESOURCES} == set(PHASES)
    for cls in RESOURCES:
        assert set(phases_of(cls)) == set(PHASES[cls.info.kind]), cls.info.kind


@pytest.mark.parametrize(("kind", "phase"), CASES)
def test_kstatus_and_argo_cd_read_each_phase(kind: str, phase: str) -> None:
    own = set_condition([], "Progressing", "True", "JobRunning", "2 of 4 shards", now=T0)
    conditions = kstatus_conditions(kind, phase, own, generation=3, now=T0)
    wire = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]
    obj = {
        "metadata": {"generation": 3},
        "status": {"phase": phase, "observedGeneration": 3, "conditions": wire},
    }
    meaning = readiness(kind, phase)
    assert meaning is not None
    assert (kstatus(obj), argo_cd(obj)) == EXPECTED[meaning]
    ready = next(c for c in wire if c["type"] == "Ready")
    assert ready["status"] == ("True" if meaning == "ready" else "False")
    assert ready["observedGeneration"] == 3 and ready["reason"] and ready["lastTransitionTime"]
    types = [c["type"] for c in wire]
    assert ("Reconciling" in types) == (meaning == "reconciling")
    assert ("Stalled" in types) == (meaning == "stalled")
    assert "Progressing" in types  # the kind's own conditions are kept
    # a newer generation not yet observed is in progress whatever the conditions say
    obj["metadata"]["generation"] = 4
    assert (kstatus(obj), argo_cd(obj)) == ("InProgress", "Progressing")


def test_ready_takes_the_reason_of_the_condition_that_explains_it() -> None:
    own = set_condition([], "Progressing", "False", "JobComplete", "4 of 4 shards", now=T0)
    own = set_condition(own, "Complete", "True", "JobComplete", "256 trajectories", now=T0)
    done = kstatus_conditions("TaskBatch", "Succeeded", own, generation=1, now=T0)
    ready = next(c for c in done if c.type == "Ready")
    assert (ready.status, ready.reason, ready.message) == (
        "True",
        "JobComplete",
        "256 trajectories",
    )

    failed = set_condition([], "Failed", "True", "BackoffLimitExceeded", "shard 2 failed", now=T0)
    out = kstatus_conditions("TrainingRun", "Failed", failed, generation=2, now=T0)
    stalled = next(c for c in out if c.type == "Stalled")
    assert (stalled.reason, stalled.message) == ("BackoffLimitExceeded", "shard 2 failed")

    # no condition of its own yet: the phase is the reason
    (first, *rest) = kstatus_conditions("HarnessRelease", "Pending", [], generation=1, now=T0)
    assert (first.type, first.status, first.reason) == ("Ready", "False", "Pending")
    assert [c.type for c in rest] == ["Reconciling"]


def test_a_pool_keeps_its_own_ready_reason_and_the_phase_wins_when_they_disagree() -> None:
    own = set_condition([], "Ready", "True", "PodsReady", "2 of 2+ pods ready", now=T0)
    ready = kstatus_conditions("RolloutPool", "Ready", own, generation=1, now=T0)
    assert [(c.type, c.status, c.reason) for c in ready] == [("Ready", "True", "PodsReady")]
    # the DevicePool is gone: the builder says Degraded while its Ready said True
    later = T0 + timedelta(minutes=1)
    gone = set_condition(own, "DevicePoolFound", "False", "NotFound", "DevicePool x", now=later)
    out = kstatus_conditions("RolloutPool", "Degraded", gone, generation=1, now=later)
    by_type = {c.type: c for c in out}
    assert (by_type["Ready"].status, by_type["Ready"].reason) == ("False", "NotFound")
    assert by_type["Ready"].last_transition_time == later
    assert set(by_type) == {"Ready", "DevicePoolFound"}


def test_transitions_move_only_when_the_status_changes() -> None:
    first = kstatus_conditions("TaskBatch", "Pending", [], generation=1, now=T0)
    later = T0 + timedelta(minutes=5)
    running = kstatus_conditions("TaskBatch", "Running", first, generation=1, now=later)
    ready = next(c for c in running if c.type == "Ready")
    assert ready.status == "False" and ready.last_transition_time == T0
    done = kstatus_conditions("TaskBatch", "Succeeded", running, generation=1, now=later)
    assert [c.type for c in done] == ["Ready"]
    assert next(c for c in done if c.type == "Ready").last_transition_time == later


def test_no_phase_yet_is_unknown_and_reconciling() -> None:
    out = kstatus_conditions("TaskBatch", None, [], generation=1, now=T0)
    assert [(c.type, c.status) for c in out] == [("Ready", "Unknown"), ("Reconciling", "True")]


def test_every_status_write_carries_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("qpa_operator.handlers.status.now", lambda: T0)
    body = next(d for d in yaml.safe_load_all(Path("examples/taskbatch.yaml").read_text()) if d)
    body["metadata"].update(namespace="ns", generation=2)
    batch = TaskBatch.model_validate(body)
    status = TaskBatchStatus(phase="Running", observed_generation=2)
    written = with_kstatus("TaskBatch", status, batch)
    assert isinstance(written, TaskBatchStatus)
    assert [(c.type, c.status, c.observed_generation) for c in written.conditions] == [
        ("Ready", "False", 2),
        ("Reconciling", "True", 2),
    ]
    assert all(isinstance(c, Condition) for c in written.conditions)
