"""TrainingRun handlers: the work order, the rendezvous Service, the data Job when the
datasets need preparing, and the ranks' Job of the current attempt.

The attempt lives in `status.restarts`. When the attempt's Job fails and `resume` is on, the
reconciler first records attempt `r+1` in the status (guarded by the resourceVersion, so two
events cannot both advance it), then deletes the failed Job and creates `<run>-r<r+1>`, whose
ranks resume from the latest checkpoint (`checkpoint.resume: auto`). A run waiting for a
TaskBatch's trajectories starts when that TaskBatch succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from qpa_operator.builders import trainingrun as builder
from qpa_operator.builders.common import job_state, kind_label
from qpa_operator.builders.storeaccess import OutsideStorePrefix
from qpa_operator.handlers.apply import delete_child, ensure_all
from qpa_operator.handlers.netpolicy import report_egress
from qpa_operator.handlers.runtime import measured, now, runtime
from qpa_operator.handlers.status import child_event, observed, refuse, write_status
from qpa_operator.handlers.views import Views, fresher, generation_of, parse

from qpa.api import GROUP, VERSION, TaskBatch, TrainingRun
from qpa.api.v1alpha1 import TrainingRunStatus

KIND = "TrainingRun"
PLURAL = TrainingRun.info.plural


def _attempt(resource: TrainingRun) -> int:
    return resource.status.restarts if resource.status else 0


def _taskbatch_outputs(views: Views, namespace: str) -> dict[str, str]:
    """Output URIs of the namespace's TaskBatches that have succeeded."""
    outputs: dict[str, str] = {}
    for item in views.parents("TaskBatch"):
        meta = item["metadata"]
        if meta.get("namespace") != namespace:
            continue
        if (item.get("status") or {}).get("phase") == "Succeeded":
            outputs[meta["name"]] = (item.get("spec") or {}).get("outputUri", "")
    return outputs


def _plan(resource: TrainingRun, views: Views) -> builder.DataPlan:
    return builder.data_plan(
        resource, _taskbatch_outputs(views, resource.metadata.namespace or "default")
    )


async def refresh_status(
    obj: Mapping[str, Any],
    views: Views,
    *,
    fresh: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    generation: int | None = None,
) -> None:
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]

    def job(job_name: str) -> Mapping[str, Any] | None:
        return fresher(
            (fresh or {}).get(("Job", job_name)), views.child("Job", namespace, job_name)
        )

    def compute(resource: TrainingRun) -> TrainingRunStatus:
        attempt = _attempt(resource)
        return builder.trainingrun_status(
            resource,
            attempt=attempt,
            job=job(builder.job_name(resource, attempt)),
            data_job=job(builder.data_job_name(resource)),
            plan=_plan(resource, views),
            summaries=views.values("qpa_trainingrun_summaries", (namespace, name)),
            observed_generation=generation if generation is not None else observed(resource),
            now=now(),
        )

    await write_status(
        TrainingRun,
        obj,
        compute,
        reread=lambda: views.parent(KIND, obj["metadata"]["namespace"], obj["metadata"]["name"]),
    )


async def _advance_attempt(obj: Mapping[str, Any], resource: TrainingRun, views: Views) -> bool:
    """Record the next attempt in the status; False when another writer moved it first."""
    attempt = _attempt(resource)
    namespace = resource.metadata.namespace or "default"
    state = job_state(views.child("Job", namespace, builder.job_name(resource, attempt)))
    following = builder.next_attempt(resource, attempt, state)
    if following is None:
        return False

    def compute(current: TrainingRun) -> TrainingRunStatus | None:
        if _attempt(current) != attempt:
            return None  # already advanced
        base = current.status or TrainingRunStatus()
        return base.model_copy(update={"restarts": following, "phase": "Resuming"})

    change = await write_status(TrainingRun, obj, compute)
    return change.written


async def reconcile(obj: Mapping[str, Any], views: Views, reason: str) -> None:
    resource = parse(obj, TrainingRun)
    if resource is None:
        return
    rt = await runtime()
    namespace = resource.metadata.namespace or "default"
    if await _advance_attempt(obj, resource, views):
        fresh = await rt.client.get(
            f"{GROUP}/{VERSION}", PLURAL, namespace, resource.metadata.name or ""
        )
        if fresh is None:
            return
        obj = fresh
        resource = parse(obj, TrainingRun) or resource
    attempt = _attempt(resource)
    plan = _plan(resource, views)
    data_job = views.child("Job", namespace, builder.data_job_name(resource))
    data_ready = not plan.steps or job_state(data_job).complete
    try:
        children = builder.children(
            resource, rt.defaults, attempt=attempt, plan=plan, data_ready=data_ready
        )
    except OutsideStorePrefix as exc:
        await refuse(TrainingRun, obj, exc, "OutsideStorePrefix")
        return
    live = await ensure_all(children, views, resource)
    for old in views.children("Job", namespace, KIND, resource.metadata.name or ""):
        labels = old["metadata"].get("labels") or {}
        if builder.ATTEMPT_LABEL in labels and labels[builder.ATTEMPT_LABEL] != str(attempt):
            await delete_child(resource, old)
    await refresh_status(obj, views, fresh=live, generation=generation_of(obj))
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    await report_egress(TrainingRun, obj, children, reread=lambda: views.parent(KIND, *key))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def trainingrun_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


@kopf.on.event("batch", "v1", "jobs", labels={kind_label(KIND): kopf.PRESENT})
async def trainingrun_job_event(type: str | None, body: Any, **kwargs: Any) -> None:
    """A data Job that finished or a ranks' Job that failed moves the run on; others: status."""
    state = job_state(body)
    moves_on = state.finished and type != "DELETED"
    handler = _reconcile_from_event if moves_on else _refresh
    await child_event(KIND, body, type, Views(kwargs), reconcile, handler)


@kopf.on.event("", "v1", "pods", labels={kind_label(KIND): kopf.PRESENT})
async def trainingrun_pod_event(type: str | None, body: Any, **kwargs: Any) -> None:
    if type == "DELETED" or builder.rank0_summary(body) is None:
        return
    await child_event(KIND, body, None, Views(kwargs), reconcile, _refresh)


@kopf.on.event(GROUP, VERSION, TaskBatch.info.plural)
async def trainingrun_taskbatch_event(body: Any, **kwargs: Any) -> None:
    """A TaskBatch succeeded: start the runs that were waiting for its trajectories."""
    if (body.get("status") or {}).get("phase") != "Succeeded":
        return
    views = Views(kwargs)
    meta = body.get("metadata") or {}
    for run in views.parents(KIND):
        if run["metadata"].get("namespace") != meta.get("namespace"):
            continue
        refs = [
            (d.get("taskBatchRef") or {}).get("name")
            for d in (run.get("spec") or {}).get("datasets") or []
        ]
        waiting = (run.get("status") or {}).get("phase") in (None, "Pending")
        if meta.get("name") in refs and waiting:
            try:
                async with measured(KIND, "taskbatch"):
                    await reconcile(run, views, "taskbatch")
            except kopf.TemporaryError:
                continue  # the run's own next event or a restart picks it up


async def _refresh(obj: Mapping[str, Any], views: Views) -> None:
    await refresh_status(obj, views)


async def _reconcile_from_event(obj: Mapping[str, Any], views: Views) -> None:
    await reconcile(obj, views, "job")
