"""TaskBatch handlers: create/update/resume render the work order ConfigMap and the indexed
Job; the Job's and its pods' events refresh the status (phase, shard and trajectory counts).

Deleting a TaskBatch deletes its Job, pods and ConfigMap through their owner references.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from qpa_operator.builders import taskbatch as builder
from qpa_operator.builders.common import kind_label
from qpa_operator.builders.podtemplate import PodTemplateRefused
from qpa_operator.builders.storeaccess import OutsideStorePrefix
from qpa_operator.handlers.apply import ensure_all
from qpa_operator.handlers.netpolicy import report_egress
from qpa_operator.handlers.runtime import measured, now, runtime
from qpa_operator.handlers.status import child_event, observed, refuse, write_status
from qpa_operator.handlers.views import Views, fresher, generation_of, parse

from qpa.api import GROUP, VERSION, TaskBatch
from qpa.api.v1alpha1.taskbatch import CollectSummary

KIND = "TaskBatch"
PLURAL = TaskBatch.info.plural


def _shards(views: Views, namespace: str, name: str) -> dict[int, CollectSummary]:
    found: dict[int, CollectSummary] = {}
    for index, summary in views.values("qpa_taskbatch_shards", (namespace, name)):
        found[int(index)] = summary
    return found


async def refresh_status(
    obj: Mapping[str, Any],
    views: Views,
    *,
    job: Mapping[str, Any] | None = None,
    generation: int | None = None,
) -> None:
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]

    def compute(resource: TaskBatch) -> Any:
        live = fresher(job, views.child("Job", namespace, builder.job_name(resource)))
        return builder.taskbatch_status(
            resource,
            live,
            _shards(views, namespace, name),
            observed_generation=generation if generation is not None else observed(resource),
            now=now(),
        )

    await write_status(
        TaskBatch,
        obj,
        compute,
        reread=lambda: views.parent(KIND, obj["metadata"]["namespace"], obj["metadata"]["name"]),
    )


async def reconcile(obj: Mapping[str, Any], views: Views, reason: str) -> None:
    resource = parse(obj, TaskBatch)
    if resource is None:
        return
    rt = await runtime()
    try:
        children = builder.children(resource, rt.defaults)
    except (OutsideStorePrefix, PodTemplateRefused) as exc:
        await refuse(TaskBatch, obj, exc, type(exc).__name__,
                     reread=lambda: views.parent(KIND, *_key(obj)))  # fmt: skip
        return
    live = await ensure_all(children, views, resource)
    job = live.get(("Job", builder.job_name(resource)))
    await refresh_status(obj, views, job=job, generation=generation_of(obj))
    await report_egress(TaskBatch, obj, children, reread=lambda: views.parent(KIND, *_key(obj)))


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def taskbatch_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


@kopf.on.event("batch", "v1", "jobs", labels={kind_label(KIND): kopf.PRESENT})
async def taskbatch_job_event(type: str | None, body: Any, **kwargs: Any) -> None:
    await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh_from_event)


@kopf.on.event(
    "networking.k8s.io", "v1", "networkpolicies", labels={kind_label(KIND): kopf.PRESENT}
)
async def taskbatch_netpol_event(type: str | None, body: Any, **kwargs: Any) -> None:
    if type == "DELETED":  # a deleted egress policy is re-created at once
        await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh_from_event)


@kopf.on.event("", "v1", "pods", labels={kind_label(KIND): kopf.PRESENT})
async def taskbatch_pod_event(type: str | None, body: Any, **kwargs: Any) -> None:
    if type == "DELETED" or builder.shard_summary(body) is None:
        return  # only a shard that just finished changes the counts
    await child_event(KIND, body, None, Views(kwargs), reconcile, _refresh_from_event)


async def _refresh_from_event(obj: Mapping[str, Any], views: Views) -> None:
    await refresh_status(obj, views)
