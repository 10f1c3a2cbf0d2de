"""Status: write a resource's status from the freshest view, announce phase changes as Events.

`write_status` computes the status from the freshest view, writes only what changed
(`merge_diff`) to the `status` subresource with `metadata.resourceVersion` as a precondition,
and on 409 reads the object again and recomputes: two writers (the resource's handler and a
child's event) never overwrite each other with stale data. The newest version this operator
wrote is remembered (`STATE.written`, cleared by `forget`), since an index can lag behind it. A
phase change posts a Kubernetes Event (`announce`; Warning for `WARNING_PHASES`). Every
write carries `Ready` and kstatus' `Reconciling`/`Stalled`, derived from the phase
(`with_kstatus`, `builders.readiness`).
`child_event` is how a child's watch event reaches its owner: a deleted child is re-created by
the owner's reconcile, any other change refreshes the owner's status.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, get_args

import kopf
from pydantic import BaseModel
from qpa_operator import metrics
from qpa_operator.builders.common import JsonDict, kind_label
from qpa_operator.builders.readiness import kstatus_conditions
from qpa_operator.handlers.runtime import STATE, measured, now, retry_delay, runtime
from qpa_operator.handlers.views import R, Views, controller_uid, parse, resource_version
from qpa_operator.kube import ApiError, plural_of

from qpa.api import GROUP, VERSION, CustomResource
from qpa.api.v1alpha1.base import set_condition

logger = logging.getLogger("qpa_operator")

#: Status phases announced with a Warning Event rather than a Normal one.
WARNING_PHASES: Final = frozenset({"Failed", "Degraded", "RolledBack"})


def merge_diff(old: Any, new: Any) -> Any:
    """A JSON merge patch turning `old` into `new` (None deletes a key; lists replace)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return copy.deepcopy(new)
    patch: JsonDict = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif old[key] != value:
            patch[key] = merge_diff(old[key], value)
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def _wire(status: BaseModel | None) -> JsonDict:
    if status is None:
        return {}
    dumped: JsonDict = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


@dataclass(frozen=True)
class StatusChange:
    written: bool
    old_phase: str | None
    new_phase: str | None
    obj: JsonDict | None


async def write_status(
    cls: type[R],
    obj: Mapping[str, Any],
    compute: Callable[[R], BaseModel | None],
    *,
    reread: Callable[[], Mapping[str, Any] | None] | None = None,
    attempts: int = 8,
    announce_phases: bool = True,
) -> StatusChange:
    """Write `compute(resource)` as the status, guarded by the resourceVersion it saw.

    `obj` may be stale (from an index): a 409 makes this re-read the object and compute again,
    from `reread()` (the index, once the watch has caught up) or else from the API.
    `compute` returning None means "nothing to write". `announce_phases=False`: the caller
    posts its own Events (HarnessRelease, whose steps are finer than its phases).
    """
    rt = await runtime()
    info = cls.info
    api_version = f"{GROUP}/{VERSION}"
    current: Mapping[str, Any] | None = _latest(info.kind, obj)
    for _ in range(attempts):
        if current is None:
            return StatusChange(False, None, None, None)
        meta = current.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return StatusChange(False, None, None, dict(current))
        resource = parse(current, cls)
        if resource is None:
            return StatusChange(False, None, None, dict(current))
        desired = compute(resource)
        old_wire = _wire(getattr(resource, "status", None))
        old_phase = old_wire.get("phase")
        if desired is None:
            return StatusChange(False, old_phase, old_phase, dict(current))
        new_wire = _wire(with_kstatus(info.kind, desired, resource))
        if new_wire == old_wire:
            return StatusChange(False, old_phase, old_phase, dict(current))
        raw_old = current.get("status") or {}
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": merge_diff(raw_old, new_wire),
        }
        try:
            written = await rt.client.patch(
                api_version,
                info.plural,
                meta.get("namespace"),
                str(meta.get("name")),
                patch,
                subresource="status",
                retry_conflicts=False,
            )
        except ApiError as exc:
            if exc.not_found:
                return StatusChange(False, old_phase, None, None)
            if not exc.conflict:
                raise
            metrics.STATUS_CONFLICTS.labels(kind=info.kind).inc()
            seen = resource_version(current)
            fresher = None
            if reread is not None:
                await asyncio.sleep(0.05)  # the watch event of the newer version is on its way
                fresher = reread()
            if fresher is not None and resource_version(fresher) > seen:
                current = fresher
            else:
                current = await rt.client.get(
                    api_version, info.plural, meta.get("namespace"), str(meta.get("name"))
                )
            continue
        metrics.STATUS_WRITES.labels(kind=info.kind).inc()
        _remember(info.kind, written)
        new_phase = new_wire.get("phase")
        metrics.OBJECTS.set(info.kind, str(meta.get("namespace")), str(meta.get("name")), new_phase)
        if new_phase != old_phase and announce_phases:
            announce(written, old_phase, new_phase, new_wire)
        return StatusChange(True, old_phase, new_phase, written)
    raise kopf.TemporaryError(f"status of {info.kind} kept conflicting", delay=retry_delay(2))


async def refuse(
    cls: type[R],
    obj: Mapping[str, Any],
    error: Exception,
    reason: str,
    *,
    reread: Callable[[], Mapping[str, Any] | None] | None = None,
) -> None:
    """A spec the operator will not act on (a store URI outside the namespace's prefix): phase
    Failed, `reason` and the error's message (it names the field) on `Progressing=False` and
    `Failed=True`, a Warning Event; nothing is built, and the next spec change reconciles anew."""
    status_cls = next(
        arg
        for arg in get_args(cls.model_fields["status"].annotation)
        if isinstance(arg, type) and issubclass(arg, BaseModel)
    )
    message = str(error)

    def compute(resource: R) -> BaseModel:
        current: Any = getattr(resource, "status", None) or status_cls()
        generation = resource.metadata.generation
        conditions = set_condition(
            current.conditions, "Progressing", "False", reason, message,
            observed_generation=generation, now=now(),
        )  # fmt: skip
        conditions = set_condition(
            conditions, "Failed", "True", reason, message,
            observed_generation=generation, now=now(),
        )  # fmt: skip
        update = {"phase": "Failed", "observed_generation": generation, "conditions": conditions}
        updated: BaseModel = current.model_copy(update=update)
        return updated

    await write_status(cls, obj, compute, reread=reread)


def with_kstatus(kind: str, status: BaseModel, resource: CustomResource) -> BaseModel:
    """`status` with Ready (and Reconciling/Stalled) derived from its phase: every write
    carries them, whichever handler computed the status (`builders.readiness`)."""
    conditions = getattr(status, "conditions", None)
    if conditions is None:
        return status
    generation = getattr(status, "observed_generation", None) or resource.metadata.generation
    updated = kstatus_conditions(
        kind, getattr(status, "phase", None), list(conditions), generation=generation, now=now()
    )
    return status.model_copy(update={"conditions": updated})


def _key(kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return kind, str(meta.get("namespace")), str(meta.get("name"))


def _latest(kind: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    mine = STATE.written.get(_key(kind, obj))
    same_object = mine is not None and (mine.get("metadata") or {}).get("uid") == (
        obj.get("metadata") or {}
    ).get("uid")
    if mine is not None and same_object and resource_version(mine) > resource_version(obj):
        return mine
    return obj


def _remember(kind: str, obj: Mapping[str, Any]) -> None:
    STATE.written[_key(kind, obj)] = dict(obj)


def forget(kind: str, namespace: str, name: str) -> None:
    STATE.written.pop((kind, namespace, name), None)


def announce(
    obj: Mapping[str, Any], old: str | None, new: str | None, status: Mapping[str, Any]
) -> None:
    """A Kubernetes Event for a phase transition, with the reason of its main condition."""
    conditions = status.get("conditions") or []
    latest: Mapping[str, Any] = max(
        conditions, key=lambda c: str(c.get("lastTransitionTime")), default={}
    )
    message = f"{old or 'New'} -> {new}" + (
        f": {latest.get('message')}" if latest.get("message") else ""
    )
    reason = new or "Unknown"
    meta = obj.get("metadata") or {}
    raw: Any = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {key: meta.get(key) for key in ("name", "namespace", "uid")},
    }
    body = kopf.Body(raw)
    try:
        if new in WARNING_PHASES:
            kopf.warn(body, reason=reason, message=message[:1000])
        else:
            kopf.info(body, reason=reason, message=message[:1000])
    except LookupError:  # outside a kopf context (unit tests): no event queue
        logger.info("%s %s: %s", obj.get("kind"), meta.get("name"), message)


def observed(resource: CustomResource) -> int | None:
    """The generation the stored status was computed for (event-driven writes keep it)."""
    status = getattr(resource, "status", None)
    return getattr(status, "observed_generation", None)


async def child_event(
    kind: str,
    body: Mapping[str, Any],
    event_type: str | None,
    views: Views,
    reconcile: Callable[[Mapping[str, Any], Views, str], Awaitable[None]],
    refresh_status: Callable[[Mapping[str, Any], Views], Awaitable[None]],
) -> None:
    """React to an event of a child: re-create it if deleted, else refresh the owner's status.

    Errors are logged, not raised: kopf does not retry event handlers, and the next event of
    the child, or the owner's own handler, brings the status up to date anyway.
    """
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(kind_label(kind))
    namespace = meta.get("namespace")
    if not owner or not namespace:
        return
    if event_type == "ADDED" and not body.get("status"):
        return  # just created by the owner's handler, which writes the status itself
    try:
        async with measured(kind, "child"):
            if event_type == "DELETED":
                rt = await runtime()
                plural = plural_of(f"{GROUP}/{VERSION}", kind)
                parent = await rt.client.get(f"{GROUP}/{VERSION}", plural, namespace, owner)
                alive = parent is not None and not parent["metadata"].get("deletionTimestamp")
                owned = controller_uid(body) in (
                    None,
                    (parent or {}).get("metadata", {}).get("uid"),
                )
                if alive and owned and parent is not None:
                    await reconcile(parent, views, "recreate")
                return
            parent = views.parent(kind, namespace, owner)
            if parent is not None:
                await refresh_status(parent, views)
    except kopf.TemporaryError as exc:
        logger.warning("%s %s/%s: %s (the next event retries)", kind, namespace, owner, exc)
    except ApiError as exc:
        logger.warning("%s %s/%s: %s (the next event retries)", kind, namespace, owner, exc)


__all__ = [
    "WARNING_PHASES",
    "StatusChange",
    "announce",
    "child_event",
    "forget",
    "merge_diff",
    "observed",
    "refuse",
    "with_kstatus",
    "write_status",
]
