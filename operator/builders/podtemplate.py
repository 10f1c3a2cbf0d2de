"""One pure merge of a resource's `spec.podTemplate` into a pod spec the operator built.

Every builder calls `merge` on each pod spec it renders (Job templates, the Deployment's, the
KServe predictors), with the operator-wide `Defaults`. The rules (docs/operator.md, "Pod
overrides"):

- **the operator's always win**: its securityContext (pod and container), command, args,
  image, probes, ports and `automountServiceAccountToken` are never touched (the template has
  no field for them); a field of the template that is not a pod override is refused;
- **the operator's names are refused**: a volume named like one of the pod's, a variable the
  main container already has (or any `QPA_*`), a mount at or above one of the container's
  mount points or inside `/etc/qpa` or `/var/run/secrets`, a mount of a volume that is not the
  template's own, a resource the container already requests or limits (`ephemeral-storage`
  excepted: the operator's is a default) — each with an error naming the field;
- **volumes** are only the restricted Pod Security Standard's types (configMap, secret,
  persistentVolumeClaim, emptyDir, ephemeral, csi): hostPath and other node-level volumes are
  refused in every pod, sandboxes and env servers included;
- **lists are appended** after the operator's (tolerations, image pull secrets, volumes,
  mounts, env: so `$(POD_NAME)` and the like expand in the user's values), without duplicates;
- **maps are merged, the operator's keys winning** (nodeSelector, affinity's parts);
- **a toleration of every taint** (no `key`) is refused unless the admin allows it
  (`Defaults.pod_wildcard_tolerations`, the chart's `podOverrides.wildcardTolerations`);
- **the service account** is allowed only if the admin lists it (`Defaults.pod_service_accounts`,
  the chart's `podOverrides.serviceAccounts`), never in a pod that runs as the operator's own
  account (device-backed env servers), and its API token is never mounted;
- **extended resources** (`rdma/hca`, `nvidia.com/gpu`, ...) get equal requests and limits (the
  one given is copied; two different values are refused), as Kubernetes requires;
- **always, template or not**: the chart's image pull secrets, an `ephemeral-storage` request on
  the main container (`Defaults.ephemeral_storage_request`) and a `sizeLimit` on every disk
  emptyDir that sets none (`podTemplate.scratchSizeLimit`, else `Defaults.scratch_size_limit`).

Everything is checked on the plain dict form too (`PodTemplate.to_k8s()` or a dict), so the
rules hold even for a template that did not pass through `qpa.api`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from qpa_operator.builders.common import Defaults, JsonDict

from qpa.api.v1alpha1.base import parse_quantity
from qpa.api.v1alpha1.podtemplate import (
    DOT_SEGMENT,
    RESERVED_ENV_PREFIX,
    VOLUME_SOURCES,
    PodTemplate,
    mount_path_problem,
)

FIELD: Final = "spec.podTemplate"

PLACEMENT: Final = "placement"
SERVICE_ACCOUNT: Final = "serviceAccount"
PULL_SECRETS: Final = "imagePullSecrets"
VOLUMES: Final = "volumes"
ENV: Final = "env"
RESOURCES: Final = "resources"
#: What a template may change in a pod; builders pass a subset where a part does not apply.
ALL_PARTS: Final = frozenset({PLACEMENT, SERVICE_ACCOUNT, PULL_SECRETS, VOLUMES, ENV, RESOURCES})

_PARTS_OF: Final = {
    "serviceAccountName": SERVICE_ACCOUNT,
    "nodeSelector": PLACEMENT,
    "affinity": PLACEMENT,
    "tolerations": PLACEMENT,
    "priorityClassName": PLACEMENT,
    "runtimeClassName": PLACEMENT,
    "imagePullSecrets": PULL_SECRETS,
    "volumes": VOLUMES,
    "volumeMounts": VOLUMES,
    "scratchSizeLimit": VOLUMES,
    "env": ENV,
    "resources": RESOURCES,
}
#: Pod fields a template may never set, with why (named in the refusal).
_OPERATOR_OWNED: Final = {
    "securityContext": "the operator's restricted pod security always applies",
    "hostNetwork": "pods never share the node's network",
    "hostPID": "pods never share the node's processes",
    "hostIPC": "pods never share the node's IPC",
    "privileged": "no pod but the device bridge is privileged",
    "automountServiceAccountToken": "the operator decides whether a pod gets an API token",
    "containers": "the operator builds the containers",
    "initContainers": "the operator builds the containers",
    "command": "the operator sets the command",
    "args": "the operator sets the command",
    "image": "the image is the resource's own field (spec.image) or the operator's",
}
_MOUNT_KEYS: Final = frozenset({"name", "mountPath", "subPath", "readOnly"})
_ENV_KEYS: Final = frozenset({"name", "value", "valueFrom"})
#: Resources Kubernetes lets requests and limits differ for (the rest are "extended").
_OVERCOMMITTABLE: Final = ("cpu", "memory", "ephemeral-storage")
EPHEMERAL: Final = "ephemeral-storage"


class PodTemplateRefused(ValueError):
    """A `spec.podTemplate` the operator will not merge (the message names the field)."""


def merge(
    pod: Mapping[str, Any],
    template: PodTemplate | Mapping[str, Any] | None,
    defaults: Defaults,
    *,
    container: str = "containers",
    parts: Iterable[str] = ALL_PARTS,
    field: str = FIELD,
) -> JsonDict:
    """`pod` (a pod spec, or a KServe predictor) with `template` merged in by the rules above.

    `container` is where the main container is: the first of `pod["containers"]`, or
    `pod["model"]` for a KServe model predictor (`container="model"`). `parts` limits what the
    template changes in this pod (the others are left out: the model predictor has its own
    resources and the operator's storage ServiceAccount). Raises
    `PodTemplateRefused` naming the field. Never changes its arguments.
    """
    result: JsonDict = copy.deepcopy(dict(pod))
    main = _main_container(result, container)
    raw = _as_dict(template)
    _check_keys(raw, field)
    allowed = frozenset(parts)
    raw = {key: value for key, value in raw.items() if _PARTS_OF[key] in allowed}

    _pull_secrets(result, defaults.image_pull_secrets, raw.get("imagePullSecrets") or [], field)
    if raw:
        _placement(result, raw, defaults, field)
        own_volumes = _volumes(result, raw.get("volumes") or [], field)
        _mounts(main, raw.get("volumeMounts") or [], own_volumes, field)
        _env(main, raw.get("env") or [], field)
        _resources(main, raw.get("resources") or {}, field)
    scratch = raw.get("scratchSizeLimit") or defaults.scratch_size_limit
    _scratch_limits(result, str(scratch))
    _ephemeral_request(main, defaults.ephemeral_storage_request)
    return result


def merge_into(
    manifest: Mapping[str, Any],
    template: PodTemplate | Mapping[str, Any] | None,
    defaults: Defaults,
    *,
    parts: Iterable[str] = ALL_PARTS,
    field: str = FIELD,
) -> JsonDict:
    """`manifest` with `merge` applied to its pod spec: a Job's or Deployment's
    `spec.template.spec`, an InferenceService's `spec.predictor` (its `containers`, else its
    `model`)."""
    result: JsonDict = copy.deepcopy(dict(manifest))
    spec = result.get("spec") or {}
    if "template" in spec:
        spec["template"]["spec"] = merge(
            spec["template"]["spec"], template, defaults, parts=parts, field=field
        )
    elif "predictor" in spec:
        predictor = spec["predictor"]
        where = "containers" if predictor.get("containers") else "model"
        spec["predictor"] = merge(
            predictor, template, defaults, container=where, parts=parts, field=field
        )
    else:
        raise ValueError(f"{result.get('kind')}: no pod spec to merge a pod template into")
    return result


# --------------------------------------------------------------------------- shape


def _as_dict(template: PodTemplate | Mapping[str, Any] | None) -> JsonDict:
    if template is None:
        return {}
    if isinstance(template, PodTemplate):
        return template.to_k8s()
    return copy.deepcopy(dict(template))


def _main_container(pod: JsonDict, where: str) -> JsonDict:
    if where == "model":
        model = pod.get("model")
        if not isinstance(model, dict):
            raise ValueError("a KServe model predictor needs `model`")
        return model
    containers = pod.get(where)
    if not isinstance(containers, list) or not containers:
        raise ValueError(f"a pod spec needs `{where}`")
    main: JsonDict = containers[0]
    return main


def _check_keys(raw: Mapping[str, Any], field: str) -> None:
    for key in raw:
        if key in _OPERATOR_OWNED:
            raise PodTemplateRefused(f"{field}.{key}: not allowed ({_OPERATOR_OWNED[key]})")
        part = _PARTS_OF.get(key)
        if part is None:
            known = ", ".join(sorted(_PARTS_OF))
            raise PodTemplateRefused(f"{field}.{key}: not a pod override (known: {known})")


# --------------------------------------------------------------------------- pod level


def _pull_secrets(
    pod: JsonDict, chart: Iterable[str], own: Iterable[Mapping[str, Any]], field: str
) -> None:
    names = [str(s.get("name")) for s in pod.get("imagePullSecrets") or []]
    for index, secret in enumerate(own):
        name = secret.get("name") if isinstance(secret, Mapping) else None
        if not isinstance(name, str) or not name:
            raise PodTemplateRefused(f"{field}.imagePullSecrets[{index}].name: a Secret name")
    wanted = [*names, *chart, *(str(s["name"]) for s in own)]
    unique = list(dict.fromkeys(wanted))
    if unique:
        pod["imagePullSecrets"] = [{"name": name} for name in unique]


def _placement(pod: JsonDict, raw: Mapping[str, Any], defaults: Defaults, field: str) -> None:
    account = raw.get("serviceAccountName")
    if account:
        current = pod.get("serviceAccountName")
        if current and current != account:
            raise PodTemplateRefused(
                f"{field}.serviceAccountName: these pods run as the operator's ServiceAccount "
                f"{current!r} (the rights they need); it cannot be replaced"
            )
        if account not in defaults.pod_service_accounts:
            allowed = ", ".join(defaults.pod_service_accounts) or "none"
            raise PodTemplateRefused(
                f"{field}.serviceAccountName: ServiceAccount {account!r} is not allowed by the "
                f"operator (the chart's podOverrides.serviceAccounts: {allowed})"
            )
        pod["serviceAccountName"] = account
        pod["automountServiceAccountToken"] = bool(pod.get("automountServiceAccountToken"))
    for key in ("priorityClassName", "runtimeClassName"):
        value = raw.get(key)
        if not value:
            continue
        if pod.get(key) not in (None, value):
            raise PodTemplateRefused(f"{field}.{key}: the operator sets {pod[key]!r} here")
        pod[key] = value
    selector = raw.get("nodeSelector") or {}
    if selector:
        pod["nodeSelector"] = {**selector, **(pod.get("nodeSelector") or {})}
    affinity = {k: v for k, v in (raw.get("affinity") or {}).items() if v is not None}
    if affinity:
        pod["affinity"] = {**affinity, **(pod.get("affinity") or {})}
    tolerations = list(pod.get("tolerations") or [])
    for index, toleration in enumerate(raw.get("tolerations") or []):
        if not toleration.get("key") and not defaults.pod_wildcard_tolerations:
            raise PodTemplateRefused(
                f"{field}.tolerations[{index}].key: a toleration without a key tolerates every "
                "taint (control plane and quarantined nodes included); the chart's "
                "podOverrides.wildcardTolerations allows it"
            )
        if toleration not in tolerations:
            tolerations.append(toleration)
    if tolerations:
        pod["tolerations"] = tolerations


def _volumes(pod: JsonDict, own: list[Mapping[str, Any]], field: str) -> set[str]:
    volumes = list(pod.get("volumes") or [])
    taken = {str(v.get("name")) for v in volumes}
    names: set[str] = set()
    for index, volume in enumerate(own):
        where = f"{field}.volumes[{index}]"
        sources = [key for key in volume if key != "name"]
        for key in sources:
            if key not in VOLUME_SOURCES:
                raise PodTemplateRefused(
                    f"{where}.{key}: {key} volumes are not allowed (allowed: "
                    + ", ".join(VOLUME_SOURCES)
                    + ")"
                )
        if len(sources) != 1:
            raise PodTemplateRefused(f"{where}: set exactly one of " + ", ".join(VOLUME_SOURCES))
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            raise PodTemplateRefused(f"{where}.name: a volume needs a name")
        if name in taken:
            raise PodTemplateRefused(
                f"{where}.name: {name!r} is a volume of the operator in this pod; choose another"
            )
        taken.add(name)
        names.add(name)
        volumes.append(copy.deepcopy(dict(volume)))
    if volumes:
        pod["volumes"] = volumes
    return names


def _scratch_limits(pod: JsonDict, limit: str) -> None:
    for volume in pod.get("volumes") or []:
        source = volume.get("emptyDir")
        if isinstance(source, dict) and source.get("medium") != "Memory":
            source.setdefault("sizeLimit", limit)


# --------------------------------------------------------------------------- main container


def _mounts(main: JsonDict, own: list[Mapping[str, Any]], volumes: set[str], field: str) -> None:
    mounts = list(main.get("volumeMounts") or [])
    paths = [str(m.get("mountPath")) for m in mounts]
    for index, mount in enumerate(own):
        where = f"{field}.volumeMounts[{index}]"
        extra = sorted(set(mount) - _MOUNT_KEYS)
        if extra:
            raise PodTemplateRefused(f"{where}.{extra[0]}: not allowed in a pod override")
        name, path = mount.get("name"), mount.get("mountPath")
        if name not in volumes:
            raise PodTemplateRefused(
                f"{where}.name: {name!r} is not one of {field}.volumes (only the template's "
                "own volumes can be mounted)"
            )
        if not isinstance(path, str) or not re.match(r"^(/[^/]+)+$", path):
            raise PodTemplateRefused(f"{where}.mountPath: an absolute path, e.g. /data")
        if re.search(DOT_SEGMENT, path) or re.search(DOT_SEGMENT, str(mount.get("subPath", ""))):
            raise PodTemplateRefused(f"{where}: no . or .. path segments")
        problem = mount_path_problem(path)
        if problem:
            raise PodTemplateRefused(f"{where}.mountPath: {path} {problem}")
        for taken in paths:
            if taken == path or taken.startswith(path + "/"):
                raise PodTemplateRefused(
                    f"{where}.mountPath: {path} is, or is above, {taken}, a mount of the operator "
                    "in this pod"
                )
        paths.append(path)
        mounts.append(copy.deepcopy(dict(mount)))
    if mounts:
        main["volumeMounts"] = mounts


def _env(main: JsonDict, own: list[Mapping[str, Any]], field: str) -> None:
    env = list(main.get("env") or [])
    taken = {str(e.get("name")) for e in env}
    for index, variable in enumerate(own):
        where = f"{field}.env[{index}]"
        extra = sorted(set(variable) - _ENV_KEYS)
        if extra:
            raise PodTemplateRefused(f"{where}.{extra[0]}: not allowed in a pod override")
        name = variable.get("name")
        if not isinstance(name, str) or not name:
            raise PodTemplateRefused(f"{where}.name: a variable needs a name")
        if name.startswith(RESERVED_ENV_PREFIX):
            raise PodTemplateRefused(
                f"{where}.name: {name!r}: {RESERVED_ENV_PREFIX}* variables are the operator's"
            )
        if name in taken:
            raise PodTemplateRefused(
                f"{where}.name: {name!r} is set by the operator in this pod; choose another"
            )
        taken.add(name)
        env.append(copy.deepcopy(dict(variable)))
    if env:
        main["env"] = env


def _extended(name: str) -> bool:
    return name not in _OVERCOMMITTABLE and not name.startswith("hugepages-")


def _resources(main: JsonDict, own: Mapping[str, Any], field: str) -> None:
    if not own:
        return
    current = main.get("resources") or {}
    result = {kind: dict(current.get(kind) or {}) for kind in ("requests", "limits")}
    added: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    for kind in ("requests", "limits"):
        for name, value in (own.get(kind) or {}).items():
            where = f"{field}.resources.{kind}.{name}"
            try:
                if parse_quantity(value) <= 0:
                    raise ValueError("not positive")
            except ValueError:
                raise PodTemplateRefused(f"{where}: {value!r} is not a positive quantity") from None
            if name in result[kind] and name != EPHEMERAL:
                raise PodTemplateRefused(
                    f"{where}: the operator already sets {name} here (from the resource's own "
                    "resources or GPU count); set it there"
                )
            added[kind][name] = str(value)
    for name in set(added["requests"]) | set(added["limits"]):
        if not _extended(name):
            continue
        request, limit = added["requests"].get(name), added["limits"].get(name)
        if request is not None and limit is not None:
            if parse_quantity(request) != parse_quantity(limit):
                raise PodTemplateRefused(
                    f"{field}.resources: {name} is an extended resource; its request "
                    f"({request}) and limit ({limit}) must be equal"
                )
        else:
            added["requests"][name] = added["limits"][name] = str(request or limit)
    for kind in ("requests", "limits"):
        result[kind].update(added[kind])
    for name, limit in result["limits"].items():
        request = result["requests"].get(name)
        if request is not None and parse_quantity(limit) < parse_quantity(request):
            raise PodTemplateRefused(
                f"{field}.resources: the {name} limit ({limit}) is below its request ({request})"
            )
    main["resources"] = {
        kind: dict(sorted(values.items())) for kind, values in result.items() if values
    }


def _ephemeral_request(main: JsonDict, request: str) -> None:
    resources = main.setdefault("resources", {})
    requests = resources.setdefault("requests", {})
    if EPHEMERAL not in requests:
        requests[EPHEMERAL] = request
        limit = (resources.get("limits") or {}).get(EPHEMERAL)
        if limit is not None and parse_quantity(limit) < parse_quantity(request):
            requests[EPHEMERAL] = str(limit)
    resources["requests"] = dict(sorted(requests.items()))
