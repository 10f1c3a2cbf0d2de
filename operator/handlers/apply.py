"""Applying children: create-or-adopt by fixed name, drift patches by spec hash, deletion.

`ensure` creates a child by its fixed name, or adopts the one that exists (owner reference and
labels) and patches it when its `qpa.ai/spec-hash` differs from a fresh build; the pod template
of a Job cannot change, so only its mutable fields are patched and a Warning Event says so.
Running it twice creates nothing twice. A child controlled by another object is left alone
(a `ChildConflict` Warning), one of a deleted predecessor is waited for. `ensure_all` applies
a resource's children in order, `delete_child` removes one, `drift_patch` is the merge patch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import kopf
from qpa_operator import metrics
from qpa_operator.builders.common import JsonDict, spec_hash_of
from qpa_operator.handlers.runtime import retry_delay, runtime
from qpa_operator.handlers.views import Views, controller_uid
from qpa_operator.kube import ApiError, plural_of

from qpa.api import CustomResource


def _owner_refs(desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[JsonDict]:
    ours = list((desired.get("metadata") or {}).get("ownerReferences") or [])
    uids = {ref.get("uid") for ref in ours}
    kept = [
        ref
        for ref in (live.get("metadata") or {}).get("ownerReferences") or []
        if ref.get("uid") not in uids and not ref.get("controller")
    ]
    return kept + ours


def _without(body: JsonDict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    node: Any = body
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def drift_patch(
    desired: Mapping[str, Any],
    live: Mapping[str, Any],
    *,
    unmanaged: Iterable[str] = (),
    mutable_spec: Iterable[str] | None = None,
) -> JsonDict:
    """The merge patch bringing `live` to `desired` in what the operator manages.

    `mutable_spec` names the only spec fields that may change (Jobs); None means all of them.
    """
    meta = desired.get("metadata") or {}
    patch: JsonDict = {
        "metadata": {
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": _owner_refs(desired, live),
        }
    }
    for key, value in desired.items():
        if key in ("apiVersion", "kind", "metadata", "status"):
            continue
        if key == "spec" and mutable_spec is not None:
            spec = value if isinstance(value, Mapping) else {}
            patch["spec"] = {k: copy.deepcopy(spec[k]) for k in mutable_spec if k in spec}
        else:
            patch[key] = copy.deepcopy(value)
    for dotted in unmanaged:
        _without(patch, dotted)
    return patch


@dataclass(frozen=True)
class Ensured:
    obj: JsonDict
    action: str  # created | unchanged | patched | adopted | foreign


async def ensure(
    desired: JsonDict,
    live: Mapping[str, Any] | None,
    *,
    owner: CustomResource,
    unmanaged: Iterable[str] = (),
) -> Ensured:
    """Create `desired`, or bring the existing object of that name in line (idempotent)."""
    rt = await runtime()
    client = rt.client
    kind = str(desired["kind"])
    api_version = str(desired["apiVersion"])
    meta = desired["metadata"]
    plural = plural_of(api_version, kind)
    if live is None:
        try:
            created = await client.create(desired)
        except ApiError as exc:
            if not exc.already_exists:
                raise
            live = await client.get(api_version, plural, meta.get("namespace"), meta["name"])
            if live is None:
                raise kopf.TemporaryError(f"{kind} {meta['name']} vanished", delay=0.5) from exc
        else:
            metrics.CHILDREN.labels(kind=owner.kind, child=kind, action="created").inc()
            return Ensured(created, "created")
    owner_uid = owner.metadata.uid
    controller = controller_uid(live)
    if controller is not None and controller != owner_uid:
        if (live.get("metadata") or {}).get("deletionTimestamp") or _owned_by_gone(live, owner):
            raise kopf.TemporaryError(
                f"{kind} {meta['name']} of an earlier {owner.kind} is still being deleted",
                delay=retry_delay(1),
            )
        kopf.warn(
            _body(owner.to_k8s()),
            reason="ChildConflict",
            message=f"{kind} {meta['name']} exists and is controlled by another object",
        )
        return Ensured(dict(live), "foreign")
    adopted = controller is None
    if not adopted and spec_hash_of(live) == spec_hash_of(desired):
        return Ensured(dict(live), "unchanged")
    is_job = kind == "Job"
    patch = drift_patch(
        desired,
        live,
        unmanaged=unmanaged,
        mutable_spec=_JOB_MUTABLE if is_job else None,
    )
    patched = await client.patch(api_version, plural, meta.get("namespace"), meta["name"], patch)
    action = "adopted" if adopted else "patched"
    metrics.CHILDREN.labels(kind=owner.kind, child=kind, action=action).inc()
    if is_job and not adopted:
        kopf.warn(
            _body(owner.to_k8s()),
            reason="JobTemplateImmutable",
            message=f"Job {meta['name']}: parallelism and deadline follow the spec; a pod "
            "template change applies to the next Job only",
        )
    return Ensured(patched, action)


_JOB_MUTABLE: Final = ("parallelism", "activeDeadlineSeconds")


def _body(obj: Mapping[str, Any]) -> kopf.Body:
    """A kopf Body (what `kopf.info`/`kopf.warn` take) over a plain object."""
    raw: Any = dict(obj)
    return kopf.Body(raw)


def _owned_by_gone(live: Mapping[str, Any], owner: CustomResource) -> bool:
    """An owner reference to an object of our kind and name but another uid (a predecessor)."""
    for ref in (live.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == owner.kind and ref.get("name") == owner.metadata.name:
            return ref.get("uid") != owner.metadata.uid
    return False


async def ensure_all(
    children: Iterable[JsonDict],
    views: Views,
    owner: CustomResource,
    *,
    unmanaged: Mapping[str, Iterable[str]] | None = None,
) -> dict[tuple[str, str], JsonDict]:
    """`ensure` every child in order; returns the live objects by (kind, name)."""
    result: dict[tuple[str, str], JsonDict] = {}
    for child in children:
        kind, meta = str(child["kind"]), child["metadata"]
        live = views.child(kind, meta["namespace"], meta["name"])
        ensured = await ensure(child, live, owner=owner, unmanaged=(unmanaged or {}).get(kind, ()))
        result[(kind, meta["name"])] = ensured.obj
    return result


async def delete_child(owner: CustomResource, obj: Mapping[str, Any]) -> None:
    rt = await runtime()
    meta = obj.get("metadata") or {}
    api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
    deleted = await rt.client.delete(
        api_version, plural_of(api_version, kind), meta.get("namespace"), str(meta.get("name"))
    )
    if deleted:
        metrics.CHILDREN.labels(kind=owner.kind, child=kind, action="deleted").inc()


__all__ = ["Ensured", "delete_child", "drift_patch", "ensure", "ensure_all"]
