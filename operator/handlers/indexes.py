"""kopf indexes of what the operator owns and reads, fed by its watches (no polling).

- one index per child kind (`qpa_jobs`, `qpa_deployments`, ...), keyed `(namespace, name)`,
  over objects labelled `app.kubernetes.io/managed-by=qpa-operator` (selected by the server);
- one index per custom resource kind (`qpa_taskbatches`, ...), keyed `(namespace, name)`;
- `qpa_taskbatch_shards`: (shard, summary) of finished collector pods, keyed by TaskBatch;
- `qpa_trainingrun_summaries`: (attempt, summary) of rank-0 trainer pods, keyed by run;
- `qpa_trainingrun_refusals`: (component, attempt, why) of trainer or data pods that refused
  their input (`error: ...` in the termination message), keyed by run;
- `qpa_phone_leases` / `qpa_pool_leases`: phone Leases by DevicePool and by RolloutPool.

The parent event handler here also keeps `qpa_operator_objects{kind,phase}` current.
"""

from __future__ import annotations

from typing import Any

import kopf
from qpa_operator import metrics
from qpa_operator.builders import devicepool as dp
from qpa_operator.builders import taskbatch as tb
from qpa_operator.builders import trainingrun as tr
from qpa_operator.builders.common import kind_label
from qpa_operator.handlers.status import forget
from qpa_operator.handlers.views import CHILD_INDEXES, PARENT_INDEXES, snapshot
from qpa_operator.kube import plural_of

from qpa.api import GROUP, RESOURCES, VERSION


def _register_child_index(index_id: str, api_version: str, kind: str) -> None:
    group, _, version = api_version.rpartition("/")
    plural = plural_of(api_version, kind)

    @kopf.index(group, version, plural, id=index_id)
    def index_child(body: Any, namespace: str | None, name: str, **_: Any) -> Any:
        return {(namespace, name): snapshot(body, keep=("spec", "status"))}


def _register_parent_index(index_id: str, kind: str) -> None:
    plural = plural_of(f"{GROUP}/{VERSION}", kind)

    @kopf.index(GROUP, VERSION, plural, id=index_id)
    def index_parent(body: Any, namespace: str | None, name: str, **_: Any) -> Any:
        return {(namespace, name): snapshot(body, keep=("spec", "status"))}


for _index_id, (_api_version, _kind) in CHILD_INDEXES.items():
    _register_child_index(_index_id, _api_version, _kind)
for _index_id, _kind in PARENT_INDEXES.items():
    _register_parent_index(_index_id, _kind)


@kopf.index("", "v1", "pods", labels={kind_label("TaskBatch"): kopf.PRESENT})
def qpa_taskbatch_shards(body: Any, namespace: str | None, labels: Any, **_: Any) -> Any:
    found = tb.shard_summary(body)
    if found is None:
        return None
    return {(namespace, labels[kind_label("TaskBatch")]): found}


@kopf.index("", "v1", "pods", labels={kind_label("TrainingRun"): kopf.PRESENT})
def qpa_trainingrun_summaries(body: Any, namespace: str | None, labels: Any, **_: Any) -> Any:
    found = tr.rank0_summary(body)
    if found is None:
        return None
    return {(namespace, labels[kind_label("TrainingRun")]): found}


@kopf.index("", "v1", "pods", labels={kind_label("TrainingRun"): kopf.PRESENT})
def qpa_trainingrun_refusals(body: Any, namespace: str | None, labels: Any, **_: Any) -> Any:
    found = tr.pod_refusal(body)
    if found is None:
        return None
    return {(namespace, labels[kind_label("TrainingRun")]): found}


@kopf.index("coordination.k8s.io", "v1", "leases", labels={dp.POOL_LABEL: kopf.PRESENT})
def qpa_phone_leases(body: Any, namespace: str | None, labels: Any, **_: Any) -> Any:
    return {(namespace, labels[dp.POOL_LABEL]): snapshot(body, keep=("spec",))}


@kopf.index("coordination.k8s.io", "v1", "leases", labels={dp.ROLLOUT_POOL_LABEL: kopf.PRESENT})
def qpa_pool_leases(body: Any, namespace: str | None, labels: Any, **_: Any) -> Any:
    return {(namespace, labels[dp.ROLLOUT_POOL_LABEL]): snapshot(body, keep=("spec",))}


def _track(kind: str) -> None:
    plural = plural_of(f"{GROUP}/{VERSION}", kind)

    @kopf.on.event(GROUP, VERSION, plural, id=f"qpa_track_{plural}")
    def track_phase(type: str, body: Any, namespace: str | None, name: str, **_: Any) -> None:
        where = namespace or ""
        if type == "DELETED":
            metrics.OBJECTS.forget(kind, where, name)
            forget(kind, where, name)
        else:
            metrics.OBJECTS.set(kind, where, name, (body.get("status") or {}).get("phase"))


for _cls in RESOURCES:
    _track(_cls.info.kind)
