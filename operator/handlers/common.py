"""What every reconciler shares: the runtime, child indexes, create-or-adopt, status writes.

- **Runtime** (`runtime()`): the API client and `Defaults`, created at start-up from the
  credentials kopf logged in with; `RETRY_SCALE` shortens every backoff in tests.
- **Indexes**: kopf keeps an in-memory copy of every child (server-side selected by
  `app.kubernetes.io/managed-by=qpa-operator`) and of every custom resource, fed by the
  watches; `Views` reads them. Handlers find children there instead of asking the API, so a
  restart or a reconcile with nothing to do sends no request at all. kopf fills every index
  before it runs the first handler.
- **`ensure`**: create a child by its fixed name, or adopt the one that exists (owner
  reference and labels) and patch it when its `qpa.ai/spec-hash` differs from a fresh build;
  the pod template of a Job cannot change, so only its mutable fields are patched and a
  Warning Event says so. Running it twice creates nothing twice.
- **`write_status`**: compute the status from the freshest view, write only what changed to
  the `status` subresource with `metadata.resourceVersion` as a precondition, and on 409 read
  the object again and recompute: two writers (the resource's handler and a child's event)
  never overwrite each other with stale data. A phase change posts a Kubernetes Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import kopf
from pydantic import BaseModel, ValidationError
from qpa_operator import metrics
from qpa_operator.builders.common import (
    HASH_ANNOTATION,
    Defaults,
    JsonDict,
    kind_label,
    spec_hash_of,
)
from qpa_operator.kube import ApiError, KubeClient, plural_of

from qpa.api import GROUP, VERSION, CustomResource, parse_resource

logger = logging.getLogger("qpa_operator")

R = TypeVar("R", bound=CustomResource)

#: Status phases announced with a Warning Event rather than a Normal one.
WARNING_PHASES: Final = frozenset({"Failed", "Degraded", "RolledBack"})


# --------------------------------------------------------------------------- runtime


@dataclass
class Runtime:
    client: KubeClient
    defaults: Defaults
    retry_scale: float = 1.0


class _State:
    connection: kopf.ConnectionInfo | None = None
    relogin: Callable[[], kopf.ConnectionInfo | None] | None = None
    defaults: Defaults = Defaults()
    retry_scale: float = 1.0
    runtime: Runtime | None = None
    lock: asyncio.Lock | None = None


STATE = _State()


def configure(*, defaults: Defaults, retry_scale: float) -> None:
    """Start-up: settings for the client made on first use (after kopf's login)."""
    _WRITTEN.clear()
    STATE.defaults = defaults
    STATE.retry_scale = retry_scale
    STATE.runtime = None
    STATE.lock = None


def remember_login(
    info: kopf.ConnectionInfo | None, relogin: Callable[[], kopf.ConnectionInfo | None]
) -> None:
    STATE.connection = info
    STATE.relogin = relogin


async def runtime() -> Runtime:
    """The runtime of this operator run (the client is made once, in the operator's loop)."""
    if STATE.runtime is not None:
        return STATE.runtime
    if STATE.lock is None:
        STATE.lock = asyncio.Lock()
    async with STATE.lock:
        if STATE.runtime is None:
            info = STATE.connection
            if info is None and STATE.relogin is not None:
                info = STATE.relogin()
            if info is None:
                raise kopf.TemporaryError("no credentials from kopf's login yet", delay=1)
            client = KubeClient.from_connection(
                info,
                relogin=STATE.relogin,
                backoff=0.2 * STATE.retry_scale,
                max_backoff=max(0.5, 5.0 * STATE.retry_scale),
            )
            STATE.runtime = Runtime(client, STATE.defaults, STATE.retry_scale)
    return STATE.runtime


async def shutdown() -> None:
    if STATE.runtime is not None:
        await STATE.runtime.client.close()
    STATE.runtime = None
    STATE.lock = None


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def retry_delay(retry: int) -> float:
    """Delay before kopf runs a failed handler again (exponential, scaled, capped)."""
    return min(60.0, 0.5 * 2**retry) * STATE.retry_scale


# --------------------------------------------------------------------------- indexes


def snapshot(body: Mapping[str, Any], *, keep: Iterable[str] = ("spec", "status")) -> JsonDict:
    """A plain copy of what the reconcilers read from a watched object."""
    meta = body.get("metadata") or {}
    kept_meta = {
        key: copy.deepcopy(meta[key])
        for key in (
            "name",
            "namespace",
            "uid",
            "generation",
            "resourceVersion",
            "labels",
            "annotations",
            "ownerReferences",
            "deletionTimestamp",
            "creationTimestamp",
        )
        if key in meta
    }
    result: JsonDict = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": kept_meta,
    }
    for key in keep:
        if key in body:
            result[key] = copy.deepcopy(body[key])
    return result


#: index id -> (apiVersion, kind) of the children it holds, keyed (namespace, name).
CHILD_INDEXES: Final[dict[str, tuple[str, str]]] = {
    "qpa_configmaps": ("v1", "ConfigMap"),
    "qpa_services": ("v1", "Service"),
    "qpa_serviceaccounts": ("v1", "ServiceAccount"),
    "qpa_roles": ("rbac.authorization.k8s.io/v1", "Role"),
    "qpa_rolebindings": ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    "qpa_deployments": ("apps/v1", "Deployment"),
    "qpa_daemonsets": ("apps/v1", "DaemonSet"),
    "qpa_hpas": ("autoscaling/v2", "HorizontalPodAutoscaler"),
    "qpa_jobs": ("batch/v1", "Job"),
    "qpa_networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy"),
    "qpa_inferenceservices": ("serving.kserve.io/v1beta1", "InferenceService"),
}
#: index id -> kind of the custom resources it holds, keyed (namespace, name).
PARENT_INDEXES: Final[dict[str, str]] = {
    "qpa_taskbatches": "TaskBatch",
    "qpa_rolloutpools": "RolloutPool",
    "qpa_devicepools": "DevicePool",
    "qpa_trainingruns": "TrainingRun",
    "qpa_harnessreleases": "HarnessRelease",
}
INDEX_BY_KIND: Final = {kind: index for index, (_, kind) in CHILD_INDEXES.items()}
PARENT_INDEX_BY_KIND: Final = {kind: index for index, kind in PARENT_INDEXES.items()}


def _newest(store: Iterable[Any]) -> JsonDict | None:
    best: JsonDict | None = None
    for item in store:
        if not isinstance(item, Mapping):
            continue
        rv = int((item.get("metadata") or {}).get("resourceVersion") or 0)
        if best is None or rv > int((best.get("metadata") or {}).get("resourceVersion") or 0):
            best = dict(item)
    return best


class Views:
    """Read access to the kopf indexes a handler received in its keyword arguments."""

    def __init__(self, kwargs: Mapping[str, Any]) -> None:
        self._kwargs = kwargs

    def _index(self, name: str) -> Any:
        return self._kwargs.get(name)

    def child(self, kind: str, namespace: str, name: str) -> JsonDict | None:
        index = self._index(INDEX_BY_KIND[kind])
        if index is None or (namespace, name) not in index:
            return None
        return _newest(index[(namespace, name)])

    def children(self, kind: str, namespace: str, owner_kind: str, owner: str) -> list[JsonDict]:
        """Every indexed child of a kind labelled as belonging to `owner`."""
        index = self._index(INDEX_BY_KIND[kind])
        if index is None:
            return []
        label = kind_label(owner_kind)
        found = []
        for (ns, _), store in index.items():
            item = _newest(store) if ns == namespace else None
            if item and ((item["metadata"].get("labels") or {}).get(label) == owner):
                found.append(item)
        return found

    def parent(self, kind: str, namespace: str, name: str) -> JsonDict | None:
        index = self._index(PARENT_INDEX_BY_KIND[kind])
        if index is None or (namespace, name) not in index:
            return None
        return _newest(index[(namespace, name)])

    def parents(self, kind: str) -> list[JsonDict]:
        index = self._index(PARENT_INDEX_BY_KIND[kind])
        if index is None:
            return []
        return [item for key in index for item in [_newest(index[key])] if item is not None]

    def values(self, index_name: str, key: Any) -> list[Any]:
        index = self._index(index_name)
        if index is None or key not in index:
            return []
        return list(index[key])


# --------------------------------------------------------------------------- children


def fresher(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The newer (by resourceVersion) of two views of the same object; None if neither."""
    if a is None or b is None:
        return a if a is not None else b
    return a if _version(a) >= _version(b) else b


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


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
    controller = _controller_uid(live)
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


# --------------------------------------------------------------------------- status


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


def parse(obj: Mapping[str, Any], cls: type[R]) -> R | None:
    """The resource as its model; a stored status that no longer parses is dropped."""
    try:
        resource = parse_resource(dict(obj))
    except ValidationError:
        body = {k: v for k, v in obj.items() if k != "status"}
        try:
            resource = parse_resource(body)
        except ValidationError as exc:
            logger.error("cannot parse %s: %s", (obj.get("metadata") or {}).get("name"), exc)
            return None
    return resource if isinstance(resource, cls) else None


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
        new_wire = _wire(desired)
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
            seen = _version(current)
            fresher = None
            if reread is not None:
                await asyncio.sleep(0.05)  # the watch event of the newer version is on its way
                fresher = reread()
            if fresher is not None and _version(fresher) > seen:
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


#: The newest version of each custom resource this operator wrote, keyed (kind, ns, name):
#: an index can lag behind our own write, and computing from it would only earn a 409.
_WRITTEN: dict[tuple[str, str, str], JsonDict] = {}


def _key(kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return kind, str(meta.get("namespace")), str(meta.get("name"))


def _version(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _latest(kind: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    mine = _WRITTEN.get(_key(kind, obj))
    same_object = mine is not None and (mine.get("metadata") or {}).get("uid") == (
        obj.get("metadata") or {}
    ).get("uid")
    if mine is not None and same_object and _version(mine) > _version(obj):
        return mine
    return obj


def _remember(kind: str, obj: Mapping[str, Any]) -> None:
    _WRITTEN[_key(kind, obj)] = dict(obj)


def forget(kind: str, namespace: str, name: str) -> None:
    _WRITTEN.pop((kind, namespace, name), None)


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


# --------------------------------------------------------------------------- handler wrapper


@contextlib.asynccontextmanager
async def measured(kind: str, reason: str) -> AsyncIterator[None]:
    """Count and time a reconcile; turn API failures into kopf retries."""
    metrics.RECONCILES.labels(kind=kind, reason=reason).inc()
    started = time.perf_counter()
    try:
        yield
    except ApiError as exc:
        metrics.RECONCILE_ERRORS.labels(kind=kind, reason=reason).inc()
        raise kopf.TemporaryError(f"API error: {exc}", delay=retry_delay(1)) from exc
    except Exception:
        metrics.RECONCILE_ERRORS.labels(kind=kind, reason=reason).inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.labels(kind=kind).observe(time.perf_counter() - started)


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
                owned = _controller_uid(body) in (
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


def generation_of(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("generation")
    return int(value) if isinstance(value, int) else None


def observed(resource: CustomResource) -> int | None:
    """The generation the stored status was computed for (event-driven writes keep it)."""
    status = getattr(resource, "status", None)
    return getattr(status, "observed_generation", None)


__all__ = [
    "HASH_ANNOTATION",
    "STATE",
    "Ensured",
    "Runtime",
    "StatusChange",
    "Views",
    "child_event",
    "configure",
    "delete_child",
    "drift_patch",
    "ensure",
    "ensure_all",
    "forget",
    "fresher",
    "generation_of",
    "measured",
    "merge_diff",
    "now",
    "observed",
    "parse",
    "remember_login",
    "retry_delay",
    "runtime",
    "shutdown",
    "snapshot",
    "write_status",
]
