"""HarnessRelease handlers: the model and Harness InferenceServices, then the benchmark Job.

create/update/resume apply both InferenceServices (phase `Deploying`); when an
InferenceService event shows both Ready, the candidate's benchmark Job is created (phase
`Benchmarking`); when it completes, the condition `BenchmarkDone=True` (reason
`AwaitingGate`) hands the candidate to the release gate, which owns the phases after it
(`Canary`, `Promoted`, `RolledBack`). A failed benchmark fails the release: no report, no
promotion. Benchmark Jobs of earlier candidates are deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders.common import kind_label
from qpa_operator.handlers.common import (
    Views,
    child_event,
    delete_child,
    ensure,
    ensure_all,
    fresher,
    generation_of,
    measured,
    now,
    observed,
    parse,
    runtime,
    write_status,
)

from qpa.api import GROUP, VERSION, HarnessRelease

KIND = "HarnessRelease"
PLURAL = HarnessRelease.info.plural


async def refresh_status(
    obj: Mapping[str, Any],
    views: Views,
    *,
    fresh: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    generation: int | None = None,
) -> None:
    namespace = obj["metadata"]["namespace"]
    known = fresh or {}

    def child(kind: str, name: str) -> Mapping[str, Any] | None:
        return fresher(known.get((kind, name)), views.child(kind, namespace, name))

    def compute(resource: HarnessRelease) -> Any:
        return builder.harnessrelease_status(
            resource,
            model=child("InferenceService", builder.model_name(resource)),
            harness=child("InferenceService", builder.harness_name(resource)),
            bench=child("Job", builder.bench_job_name(resource)),
            observed_generation=generation if generation is not None else observed(resource),
            now=now(),
        )

    await write_status(
        HarnessRelease,
        obj,
        compute,
        reread=lambda: views.parent(KIND, obj["metadata"]["namespace"], obj["metadata"]["name"]),
    )


async def reconcile(obj: Mapping[str, Any], views: Views, reason: str) -> None:
    resource = parse(obj, HarnessRelease)
    if resource is None:
        return
    rt = await runtime()
    namespace = resource.metadata.namespace or "default"
    live = await ensure_all(builder.services(resource, rt.defaults), views, resource)
    model = fresher(
        live.get(("InferenceService", builder.model_name(resource))),
        views.child("InferenceService", namespace, builder.model_name(resource)),
    )
    harness = fresher(
        live.get(("InferenceService", builder.harness_name(resource))),
        views.child("InferenceService", namespace, builder.harness_name(resource)),
    )
    bench_name = builder.bench_job_name(resource)
    bench = views.child("Job", namespace, bench_name)
    gate_owned = resource.status is not None and resource.status.phase in (
        "Canary",
        "Promoted",
        "RolledBack",
    )
    if bench is not None or (
        not gate_owned and builder.isvc_ready(model) and builder.isvc_ready(harness)
    ):
        desired = builder.bench_job(resource, rt.defaults)
        live[("Job", bench_name)] = (await ensure(desired, bench, owner=resource)).obj
    for old in views.children("Job", namespace, KIND, resource.metadata.name or ""):
        if old["metadata"]["name"] != bench_name:
            await delete_child(resource, old)
    await refresh_status(obj, views, fresh=live, generation=generation_of(obj))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def harnessrelease_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


@kopf.on.event(
    "serving.kserve.io", "v1beta1", "inferenceservices", labels={kind_label(KIND): kopf.PRESENT}
)
async def harnessrelease_isvc_event(type: str | None, body: Any, **kwargs: Any) -> None:
    """An InferenceService became Ready (or not): maybe start the benchmark; refresh status."""
    await child_event(KIND, body, type, Views(kwargs), reconcile, _reconcile_from_event)


@kopf.on.event("batch", "v1", "jobs", labels={kind_label(KIND): kopf.PRESENT})
async def harnessrelease_job_event(type: str | None, body: Any, **kwargs: Any) -> None:
    await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh)


async def _refresh(obj: Mapping[str, Any], views: Views) -> None:
    await refresh_status(obj, views)


async def _reconcile_from_event(obj: Mapping[str, Any], views: Views) -> None:
    await reconcile(obj, views, "inferenceservice")
