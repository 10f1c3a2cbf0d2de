"""DevicePool handlers: the bridge DaemonSet (with its ConfigMap, Service, ingress policy and
lease RBAC); DaemonSet and phone-Lease events refresh `status.phones`, and a phone Lease that
appears or goes brings the Roles' `resourceNames` (the pool's phone Leases) in step.

Deletion: the children go with their owner references; phone Leases a bridge left without an
owner reference are deleted when the pool's deletion is seen, and any such Lease of a pool
that no longer exists is deleted when the operator (re)starts and lists the Leases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from qpa_operator.builders import devicepool as builder
from qpa_operator.builders.common import kind_label
from qpa_operator.handlers.apply import ensure_all
from qpa_operator.handlers.runtime import measured, now, retry_delay, runtime, serialized
from qpa_operator.handlers.status import child_event, observed, write_status
from qpa_operator.handlers.views import Views, fresher, generation_of, parse
from qpa_operator.kube import ApiError

from qpa.api import GROUP, VERSION, DevicePool

KIND = "DevicePool"
PLURAL = DevicePool.info.plural
logger = logging.getLogger("qpa_operator.devicepool")


async def refresh_status(
    obj: Mapping[str, Any],
    views: Views,
    *,
    daemonset: Mapping[str, Any] | None = None,
    generation: int | None = None,
) -> None:
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]

    def compute(resource: DevicePool) -> Any:
        live = fresher(
            daemonset, views.child("DaemonSet", namespace, builder.daemonset_name(resource))
        )
        return builder.devicepool_status(
            resource,
            live,
            views.values("qpa_phone_leases", (namespace, name)),
            observed_generation=generation if generation is not None else observed(resource),
            now=now(),
        )

    await write_status(
        DevicePool,
        obj,
        compute,
        reread=lambda: views.parent(KIND, obj["metadata"]["namespace"], obj["metadata"]["name"]),
    )


#: How often a Lease event's reconcile is tried: kopf never retries an event handler.
LEASE_EVENT_TRIES = 5


async def reconcile(obj: Mapping[str, Any], views: Views, reason: str) -> None:
    resource = parse(obj, DevicePool)
    if resource is None:
        return
    rt = await runtime()
    namespace, name = resource.metadata.namespace or "", resource.metadata.name or ""
    async with serialized(KIND, namespace, name):
        # the Leases are read inside the lock: the last reconcile to run saw every Lease
        leases = views.values("qpa_phone_leases", (namespace, name))
        live = await ensure_all(builder.children(resource, rt.defaults, leases), views, resource)
        daemonset = live.get(("DaemonSet", builder.daemonset_name(resource)))
        await refresh_status(obj, views, daemonset=daemonset, generation=generation_of(obj))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def devicepool_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


@kopf.on.event("apps", "v1", "daemonsets", labels={kind_label(KIND): kopf.PRESENT})
async def devicepool_daemonset_event(type: str | None, body: Any, **kwargs: Any) -> None:
    await child_event(KIND, body, type, Views(kwargs), reconcile, _refresh)


@kopf.on.event("coordination.k8s.io", "v1", "leases", labels={builder.POOL_LABEL: kopf.PRESENT})
async def devicepool_lease_event(type: str | None, body: Any, **kwargs: Any) -> None:
    """A phone changed: refresh its pool; a Lease of a pool that is gone is cleaned up."""
    views = Views(kwargs)
    meta = body.get("metadata") or {}
    namespace, pool = (
        meta.get("namespace") or "",
        (meta.get("labels") or {}).get(builder.POOL_LABEL, ""),
    )
    for attempt in range(1, LEASE_EVENT_TRIES + 1):
        parent = views.parent(KIND, namespace, pool)
        try:
            async with measured(KIND, "lease"):
                if parent is not None and type in ("ADDED", "DELETED", None):
                    await reconcile(parent, views, "lease")  # the Roles name the pool's Leases
                elif parent is not None:
                    await refresh_status(parent, views)
                elif type != "DELETED" and not meta.get("ownerReferences"):
                    rt = await runtime()
                    await rt.client.delete(
                        "coordination.k8s.io/v1", "leases", namespace, str(meta.get("name"))
                    )
                    logger.info("deleted Lease %s/%s of DevicePool %s, which is gone",
                                namespace, meta.get("name"), pool)  # fmt: skip
            return
        except kopf.TemporaryError as exc:
            logger.warning("Lease %s/%s (try %d of %d): %s", namespace, meta.get("name"),
                           attempt, LEASE_EVENT_TRIES, exc)  # fmt: skip
            if attempt < LEASE_EVENT_TRIES:
                await asyncio.sleep(exc.delay if exc.delay is not None else retry_delay(attempt))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def devicepool_deleted(type: str | None, body: Any, **_: Any) -> None:
    """Explicit clean-up of what owner references do not cover: the pool's orphaned Leases."""
    if type != "DELETED":
        return
    meta = body.get("metadata") or {}
    try:
        rt = await runtime()
        await rt.client.delete_collection(
            "coordination.k8s.io/v1",
            "leases",
            str(meta.get("namespace")),
            label_selector=f"{builder.POOL_LABEL}={meta.get('name')}",
        )
    except (ApiError, kopf.TemporaryError) as exc:
        logger.warning(
            "Leases of DevicePool %s stay for the restart sweep: %s", meta.get("name"), exc
        )


async def _refresh(obj: Mapping[str, Any], views: Views) -> None:
    await refresh_status(obj, views)
