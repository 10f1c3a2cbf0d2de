"""Reading objects: the kopf indexes of children and custom resources, and what they hold.

kopf keeps an in-memory copy of every child (server-side selected by
`app.kubernetes.io/managed-by=qpa-operator`) and of every custom resource, fed by the watches
(`qpa_operator.handlers.indexes` registers them, storing `snapshot`s); `Views` reads them.
Handlers find children there instead of asking the API, so a restart or a reconcile with nothing
to do sends no request at all. kopf fills every index before it runs the first handler.
`parse` turns a stored object into its `qpa.api` model; `fresher`, `resource_version`,
`controller_uid` and `generation_of` read an object's metadata.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

from pydantic import ValidationError
from qpa_operator.builders.common import JsonDict, kind_label
from qpa_operator.handlers.invalid import schedule_report

from qpa.api import CustomResource, parse_resource

R = TypeVar("R", bound=CustomResource)


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


def fresher(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The newer (by resourceVersion) of two views of the same object; None if neither."""
    if a is None or b is None:
        return a if a is not None else b
    return a if resource_version(a) >= resource_version(b) else b


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner, None when it has none."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def resource_version(obj: Mapping[str, Any]) -> int:
    """The object's `metadata.resourceVersion` as a number (0 when absent or not a number)."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def generation_of(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("generation")
    return int(value) if isinstance(value, int) else None


def parse(obj: Mapping[str, Any], cls: type[R]) -> R | None:
    """The resource as its model; a stored status that no longer parses is dropped."""
    try:
        resource = parse_resource(dict(obj))
    except ValidationError:
        body = {k: v for k, v in obj.items() if k != "status"}
        try:
            resource = parse_resource(body)
        except ValidationError as exc:
            schedule_report(obj, exc)  # once per generation, on its status
            return None
    return resource if isinstance(resource, cls) else None


__all__ = [
    "CHILD_INDEXES",
    "INDEX_BY_KIND",
    "PARENT_INDEXES",
    "PARENT_INDEX_BY_KIND",
    "Views",
    "controller_uid",
    "fresher",
    "generation_of",
    "parse",
    "resource_version",
    "snapshot",
]
