"""TrainingRun handlers: the work order, the rendezvous Service, the data Job when the
datasets need preparing, and the ranks' Job of the current attempt.

The attempt lives in `status.restarts`. When the attempt's Job fails and `resume` is on, the
reconciler first records attempt `r+1` in the status (guarded by the resourceVersion, so two
events cannot both advance it), then deletes the failed Job and creates `<run>-r<r+1>`, whose
ranks resume from the latest checkpoint (`checkpoint.resume: auto`); an attempt ended by a
disruption also advances `status.disruptions`, so it does not count against `backoffLimit`.
The Jobs of the last `scheduling.keepFailedAttempts` failed attempts stay, older ones go. A run
waiting for a TaskBatch's trajectories starts when that TaskBatch succeeds.

Gang admission: each attempt's Job is created suspended. Without a Kueue queue the reconcile
checks, one run at a time (`admission_lock`), whether every rank fits on the nodes
(`builders.admission.gang_admission` over the Nodes, the Pods and the other runs' Jobs read
from the API) and un-suspends the Job if so; while it does not fit, a kopf timer looks again
every `ADMISSION_EVERY` seconds (times the retry scale) until the run is admitted or its
`admissionTimeoutSeconds` have passed. A namespace-scoped operator cannot read Nodes: it
admits at once (`Admitted=True`, `CapacityNotChecked`) and gang admission is Kueue's there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final

import kopf
from qpa_operator.builders import trainingrun as builder
from qpa_operator.builders.admission import Verdict, gang_admission
from qpa_operator.builders.common import JsonDict, job_state, kind_label
from qpa_operator.builders.podtemplate import PodTemplateRefused
from qpa_operator.builders.storeaccess import OutsideStorePrefix
from qpa_operator.handlers.apply import delete_child, ensure_all
from qpa_operator.handlers.netpolicy import report_egress
from qpa_operator.handlers.runtime import measured, now, runtime, serialized
from qpa_operator.handlers.status import child_event, observed, refuse, write_status
from qpa_operator.handlers.views import Views, fresher, generation_of, parse

from qpa.api import GROUP, VERSION, TaskBatch, TrainingRun
from qpa.api.v1alpha1 import TrainingRunStatus

KIND = "TrainingRun"
PLURAL = TrainingRun.info.plural
#: Seconds between two capacity checks of one waiting run (times the retry scale).
ADMISSION_EVERY: Final = 10.0
#: Seconds between the admission timer's looks at a waiting run (cheap: no request).
ADMISSION_TICK: Final = 1.0
_CHECKED: dict[tuple[str, str], float] = {}


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
    verdict: Verdict | None = None,
) -> None:
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    defaults = (await runtime()).defaults

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
            refusals=views.values("qpa_trainingrun_refusals", (namespace, name)),
            observed_generation=generation if generation is not None else observed(resource),
            now=now(),
            queue=builder.queue_name(resource, defaults),
            verdict=verdict,
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
    disruptions = resource.status.disruptions if resource.status else 0
    following = builder.next_attempt(resource, attempt, state, disruptions)
    if following is None:
        return False
    disrupted = builder.failure_kind(state) == "disruption"

    def compute(current: TrainingRun) -> TrainingRunStatus | None:
        if _attempt(current) != attempt:
            return None  # already advanced
        base = current.status or TrainingRunStatus()
        update: dict[str, Any] = {"restarts": following, "phase": "Resuming"}
        if disrupted:
            update["disruptions"] = base.disruptions + 1
        return base.model_copy(update=update)

    change = await write_status(TrainingRun, obj, compute)
    return change.written


def admission_lock() -> asyncio.Lock:
    """One admission decision at a time in this operator, so that the next one sees the Job
    the last one un-suspended (a lock of this operator run: `runtime.serialized`)."""
    return serialized(KIND, "", "admission")


async def _admit(
    resource: TrainingRun, job: Mapping[str, Any] | None
) -> tuple[Verdict | None, JsonDict | None]:
    """The operator's admission of the attempt's suspended Job: (verdict, the Job as
    un-suspended), or (None, None) when there is nothing for the operator to decide."""
    rt = await runtime()
    if job is None or not builder.suspended(job) or job_state(job).finished:
        return None, None
    if builder.queue_name(resource, rt.defaults) is not None:
        return None, None  # Kueue admits it
    if builder.admission_timed_out(resource, job, now()):
        return None, None
    meta = job["metadata"]
    key = (str(meta["namespace"]), str(meta["name"]))
    async with admission_lock():
        _CHECKED[key] = time.monotonic()
        if rt.client.namespaces is not None:
            verdict = Verdict(
                True,
                "CapacityNotChecked",
                "a namespace-scoped operator cannot read Nodes: admitted without a capacity "
                "check (name a Kueue queue in spec.scheduling.queueName for gang admission)",
            )
        else:
            nodes = await rt.client.list("v1", "nodes")
            pods = await rt.client.list("v1", "pods")
            jobs = await rt.client.list("batch/v1", "jobs", label_selector=kind_label(KIND))
            verdict = gang_admission(job, nodes, pods, jobs)
        if not verdict.admitted:
            return verdict, None
        patched = await rt.client.patch(
            "batch/v1",
            "jobs",
            key[0],
            key[1],
            {
                "metadata": {"annotations": {builder.ADMITTED_ANNOTATION: verdict.message}},
                "spec": {"suspend": False},
            },
        )
    return verdict, patched


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
    except (OutsideStorePrefix, PodTemplateRefused) as exc:
        await refuse(TrainingRun, obj, exc, type(exc).__name__)
        return
    live = await ensure_all(children, views, resource)
    ranks_job = builder.job_name(resource, attempt)
    verdict, admitted = await _admit(resource, live.get(("Job", ranks_job)))
    if admitted is not None:
        live[("Job", ranks_job)] = admitted
    jobs = views.children("Job", namespace, KIND, resource.metadata.name or "")
    stale = {j["metadata"]["name"] for j in builder.stale_attempts(resource, attempt, jobs)}
    for old in views.children("Job", namespace, KIND, resource.metadata.name or ""):
        if old["metadata"]["name"] in stale:
            await delete_child(resource, old)
    await refresh_status(obj, views, fresh=live, generation=generation_of(obj), verdict=verdict)
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    await report_egress(TrainingRun, obj, children, reread=lambda: views.parent(KIND, *key))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def trainingrun_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


def _awaiting_admission(status: Mapping[str, Any] | None, **_: Any) -> bool:
    """The run's Job waits for the operator's admission (not Kueue's), and not in vain yet."""
    status = status or {}
    if status.get("phase") not in ("Pending", "Resuming"):
        return False
    return any(
        c.get("type") == "Admitted"
        and c.get("status") == "False"
        and c.get("reason") != "QueuedInKueue"
        for c in status.get("conditions") or []
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=ADMISSION_TICK, when=_awaiting_admission)
async def trainingrun_admission(body: Any, **kwargs: Any) -> None:
    """Look again whether a waiting run fits now (or has waited too long)."""
    meta = body.get("metadata") or {}
    rt = await runtime()
    resource = parse(dict(body), TrainingRun)
    if resource is None:
        return
    job = (str(meta.get("namespace")), builder.job_name(resource, _attempt(resource)))
    if time.monotonic() - _CHECKED.get(job, 0.0) < ADMISSION_EVERY * rt.retry_scale:
        return
    async with measured(KIND, "admission"):
        await reconcile(dict(body), Views(kwargs), "admission")


@kopf.on.event("batch", "v1", "jobs", labels={kind_label(KIND): kopf.PRESENT})
async def trainingrun_job_event(type: str | None, body: Any, **kwargs: Any) -> None:
    """A data Job that finished or a ranks' Job that failed moves the run on; others: status."""
    state = job_state(body)
    moves_on = state.finished and type != "DELETED"
    handler = _reconcile_from_event if moves_on else _refresh
    await child_event(KIND, body, type, Views(kwargs), reconcile, handler)


@kopf.on.event("", "v1", "pods", labels={kind_label(KIND): kopf.PRESENT})
async def trainingrun_pod_event(type: str | None, body: Any, **kwargs: Any) -> None:
    if type == "DELETED" or (
        builder.rank0_summary(body) is None and builder.pod_refusal(body) is None
    ):
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
