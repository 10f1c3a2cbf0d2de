"""RolloutPool handlers: the Deployment, Services and autoscaler of `qpa env serve` (plus the
lease RBAC of device-backed pools); Deployment, autoscaler and Lease events refresh ready,
leased and free capacity (the autoscaler's reading of the pods' sessions in use: no pod is
asked), and a DevicePool's changes refresh the pools it backs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from qpa_operator.builders import devicepool as dp_builder
from qpa_operator.builders import rolloutpool as builder
from qpa_operator.builders.common import kind_label
from qpa_operator.builders.podtemplate import PodTemplateRefused
from qpa_operator.handlers.apply import delete_child, ensure_all
from qpa_operator.handlers.netpolicy import report_egress
from qpa_operator.handlers.runtime import measured, now, runtime
from qpa_operator.handlers.status import child_event, observed, refuse, write_status
from qpa_operator.handlers.views import Views, fresher, generation_of, parse

from qpa.api import GROUP, VERSION, RolloutPool
from qpa.api.v1alpha1 import DevicePoolStatus

KIND = "RolloutPool"
PLURAL = RolloutPool.info.plural


def _holders(views: Views, namespace: str, name: str) -> int:
    return sum(
        1
        for lease in views.values("qpa_pool_leases", (namespace, name))
        if (lease.get("spec") or {}).get("holderIdentity")
    )


async def refresh_status(
    obj: Mapping[str, Any],
    views: Views,
    *,
    deployment: Mapping[str, Any] | None = None,
    generation: int | None = None,
) -> None:
    rt = await runtime()
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]

    def compute(resource: RolloutPool) -> Any:
        live = fresher(
            deployment, views.child("Deployment", namespace, builder.deployment_name(resource))
        )
        phones: int | None = None
        found: bool | None = None
        ref = resource.spec.device_pool_ref
        if ref is not None:
            pool = views.parent("DevicePool", namespace, ref.name)
            found = pool is not None
            status = DevicePoolStatus.model_validate((pool or {}).get("status") or {})
            phones = status.available
        return builder.rolloutpool_status(
            resource,
            live,
            leased=_holders(views, namespace, name),
            phones_available=phones,
            device_pool_found=found,
            observed_generation=generation if generation is not None else observed(resource),
            defaults=rt.defaults,
            now=now(),
            autoscaler=views.child(
                "HorizontalPodAutoscaler", namespace, builder.deployment_name(resource)
            ),
        )

    await write_status(
        RolloutPool,
        obj,
        compute,
        reread=lambda: views.parent(KIND, obj["metadata"]["namespace"], obj["metadata"]["name"]),
    )


async def reconcile(obj: Mapping[str, Any], views: Views, reason: str) -> None:
    resource = parse(obj, RolloutPool)
    if resource is None:
        return
    rt = await runtime()
    try:
        children = builder.children(resource, rt.defaults)
    except PodTemplateRefused as exc:
        await refuse(RolloutPool, obj, exc, "PodTemplateRefused")
        return
    live = await ensure_all(
        children,
        views,
        resource,
        unmanaged={"Deployment": builder.unmanaged_fields(resource)},
    )
    if not builder.autoscaled(resource):  # replicas.max came down to min: no autoscaler
        namespace = resource.metadata.namespace or "default"
        hpa = views.child("HorizontalPodAutoscaler", namespace, builder.deployment_name(resource))
        if hpa is not None:
            await delete_child(resource, hpa)
    deployment = live.get(("Deployment", builder.deployment_name(resource)))
    await refresh_status(obj, views, deployment=deployment, generation=generation_of(obj))
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    await report_egress(RolloutPool, obj, children, reread=lambda: views.parent(KIND, *key))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def rolloutpool_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


@kopf.on.event("apps", "v1", "deployments", labels={kind_label(KIND): kopf.PRESENT})
async def rolloutpool_deployment_event(type: str | None, body: Any, **kwargs: Any) -> None:
    await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh)


@kopf.on.event(
    "autoscaling", "v2", "horizontalpodautoscalers", labels={kind_label(KIND): kopf.PRESENT}
)
async def rolloutpool_autoscaler_event(type: str | None, body: Any, **kwargs: Any) -> None:
    """The autoscaler read the pods' sessions in use (or went): refresh leased and free."""
    await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh)


@kopf.on.event("v1", "services", labels={kind_label(KIND): kopf.PRESENT})
async def rolloutpool_service_event(type: str | None, body: Any, **kwargs: Any) -> None:
    if type == "DELETED":  # re-create a deleted Service; other changes do not move the status
        await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh)


@kopf.on.event(
    "networking.k8s.io", "v1", "networkpolicies", labels={kind_label(KIND): kopf.PRESENT}
)
async def rolloutpool_netpol_event(type: str | None, body: Any, **kwargs: Any) -> None:
    if type == "DELETED":  # a deleted egress policy is re-created at once
        await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh)


@kopf.on.event(
    "coordination.k8s.io", "v1", "leases", labels={dp_builder.ROLLOUT_POOL_LABEL: kopf.PRESENT}
)
async def rolloutpool_lease_event(body: Any, **kwargs: Any) -> None:
    views = Views(kwargs)
    meta = body.get("metadata") or {}
    pool = (meta.get("labels") or {}).get(dp_builder.ROLLOUT_POOL_LABEL)
    parent = views.parent(KIND, meta.get("namespace") or "", pool or "")
    if parent is not None:
        try:
            async with measured(KIND, "lease"):
                await refresh_status(parent, views)
        except kopf.TemporaryError:
            pass  # the next event of the Lease or the pool refreshes it


@kopf.on.event(GROUP, VERSION, "devicepools")
async def rolloutpool_devicepool_event(body: Any, **kwargs: Any) -> None:
    """A DevicePool appeared, changed or went: refresh the pools it backs."""
    views = Views(kwargs)
    meta = body.get("metadata") or {}
    for pool in views.parents(KIND):
        pmeta = pool["metadata"]
        ref = ((pool.get("spec") or {}).get("devicePoolRef") or {}).get("name")
        if pmeta.get("namespace") == meta.get("namespace") and ref == meta.get("name"):
            try:
                async with measured(KIND, "devicepool"):
                    await refresh_status(pool, views)
            except kopf.TemporaryError:
                continue  # the next event of either object refreshes it


async def _refresh(obj: Mapping[str, Any], views: Views) -> None:
    await refresh_status(obj, views)
