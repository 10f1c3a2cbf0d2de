"""Shared pieces of every child manifest: names, labels, owner references, security, secrets.

Everything here is a pure function of its arguments (a parsed custom resource from `qpa.api`,
plain values, or `Defaults`): no API calls, no clock, no environment. The kind modules
(`taskbatch`, `rolloutpool`, ...) compose these into whole manifests, and handlers send what
they return.

Conventions every child follows:

- **names**: `<owner>-<suffix>` (`nightly-collect`, `sandbox-env`): deterministic, so running
  a handler twice can never create a second copy; owners' names are at most 52 characters
  (`qpa.api.MAX_NAME_LENGTH`), which keeps children DNS labels;
- **labels**: the recommended `app.kubernetes.io/*` set plus `qpa.ai/<kind>: <owner>`; the
  operator's watches select `app.kubernetes.io/managed-by=qpa-operator` on the server side;
- **owner references** to the custom resource (controller, blockOwnerDeletion), so deleting
  the resource garbage-collects its children;
- **`qpa.ai/spec-hash`**: a hash of the manifest as built; a child whose annotation differs
  from a fresh build has drifted from its owner's spec and is patched;
- **restricted pod security** for every pod but the device bridge: non-root, read-only root
  filesystem, no privilege escalation, all capabilities dropped, seccomp RuntimeDefault, no
  service-account token unless the pod talks to the API (Leases);
- **secrets by reference**: S3 credentials as a Secret volume (`QPA_S3_*_FILE`), API keys as
  `secretKeyRef` environment variables; no secret value ever appears in a manifest.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError
from qpa_operator.builders.netsettings import NetworkSettings
from qpa_operator.builders.resolver import dns_addresses, no_addresses

from qpa.api.v1alpha1 import (
    ConfigMapKeySelector,
    CustomResource,
    ObjectStore,
    ResourceRequirements,
    SecretKeySelector,
)
from qpa.api.v1alpha1.base import parse_quantity
from qpa.api.v1alpha1.workorder import (
    HARNESS_CONFIG_DIR,
    WORK_ORDER_DIR,
    WORK_ORDER_KEY,
    Resolved,
    dump_work_order,
    harness_config_path,
)

JsonDict = dict[str, Any]

MANAGED_BY: Final = "qpa-operator"
PART_OF: Final = "qpa"
APP_NAME: Final = "qpa"

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_VERSION: Final = "app.kubernetes.io/version"

HASH_ANNOTATION: Final = "qpa.ai/spec-hash"
CONFIG_HASH_ANNOTATION: Final = "qpa.ai/config-hash"
#: The server-side selector of every watch the operator opens on child kinds.
MANAGED_SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

#: Where a container writes its JSON summary for the operator (kubelet's default path).
TERMINATION_LOG: Final = "/dev/termination-log"
STORE_SECRET_MOUNT: Final = "/var/run/secrets/qpa/store"
HARNESS_CONFIG_MOUNT: Final = HARNESS_CONFIG_DIR


def kind_label(kind: str) -> str:
    """`qpa.ai/taskbatch` for TaskBatch: the label naming a child's owner."""
    return f"qpa.ai/{kind.lower()}"


@dataclass(frozen=True)
class Defaults:
    """Operator-wide settings the builders need beyond a resource's spec.

    `from_env` reads them once at start-up (the Helm chart sets the variables); builders take
    the frozen value, so they stay pure. A resource's own setting (its `image`, `store`) always
    wins over these.
    """

    image: str = "ghcr.io/qpa-ai/qpa-sandbox:0.1.0"
    trainer_image: str = "ghcr.io/qpa-ai/qpa-trainer:0.1.0"
    harness_image: str = "ghcr.io/qpa-ai/qpa-harness:0.1.0"
    bridge_image: str = "ghcr.io/qpa-ai/qpa-device-bridge:0.1.0"
    cluster_domain: str = "cluster.local"
    run_as_user: int = 1000
    rendezvous_port: int = 29500
    version: str = "0.1.0"
    #: the object store of resources that name none (the chart's `objectStore`)
    store: ObjectStore | None = None
    #: added to the pods that request GPUs (the chart's `gpu.nodeSelector`/`gpu.tolerations`)
    gpu_node_selector: tuple[tuple[str, str], ...] = ()
    gpu_tolerations: tuple[JsonDict, ...] = ()
    #: the labels of device nodes (the chart's `devices.nodeSelector`): every bridge DaemonSet
    #: selects them, whatever its DevicePool's `nodeSelector` adds (never empty)
    device_node_selector: tuple[tuple[str, str], ...] = (("qpa.ai/device-node", "true"),)
    #: the admin's network-policy settings (the chart's `networkPolicy`; `builders.netpol`)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    #: a host's addresses at reconcile time (`builders.resolver`: DNS in the operator, none
    #: for a `Defaults()` built in code)
    resolve: Callable[[str], tuple[str, ...]] = field(
        default=no_addresses, compare=False, repr=False
    )
    #: the namespaces the operator serves (the chart's `operator.watchNamespaces`); () = all
    namespaces: tuple[str, ...] = ()
    #: the prefix each namespace's store URIs must lie under (`{namespace}` is replaced; the
    #: chart's `objectStore.namespacePrefix`), and per-namespace overrides; "" = no limit
    store_prefix: str = ""
    store_prefixes: tuple[tuple[str, str], ...] = ()
    #: Secrets the operator may read for a namespace's store keys (the chart's
    #: `objectStore.secretName` + `objectStore.readableSecrets`); () = any the RBAC allows
    readable_secrets: tuple[str, ...] = ()
    #: Secrets every pod the operator creates pulls its images with (the chart's
    #: `imagePullSecrets`), before a resource's own `podTemplate.imagePullSecrets`
    image_pull_secrets: tuple[str, ...] = ()
    #: ServiceAccounts a `podTemplate.serviceAccountName` may name (the chart's
    #: `podOverrides.serviceAccounts`); () = none (`builders.podtemplate`)
    pod_service_accounts: tuple[str, ...] = ()
    #: whether a `podTemplate` toleration may omit its key, tolerating every taint (the chart's
    #: `podOverrides.wildcardTolerations`; `builders.podtemplate`)
    pod_wildcard_tolerations: bool = False
    #: the ephemeral-storage request of every main container that names none (the chart's
    #: `podOverrides.ephemeralStorageRequest`)
    ephemeral_storage_request: str = "1Gi"
    #: the sizeLimit of every disk emptyDir (/work, /tmp, spool) that sets none, unless the
    #: resource's `podTemplate.scratchSizeLimit` says otherwise (`podOverrides.scratchSizeLimit`)
    scratch_size_limit: str = "20Gi"
    #: the Kueue LocalQueue of TrainingRuns that name none (the chart's
    #: `trainingRuns.queueName`); None: the operator's own all-or-nothing admission
    training_queue: str | None = None
    #: what a RolloutPool's autoscaler scales on when its spec says nothing (the chart's
    #: `rolloutPools.autoscaleMetric`): sessions in use (needs a metrics adapter) or cpu
    rollout_pool_metric: str = "sessions"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Defaults:
        """Settings from `QPA_OPERATOR_*` variables; a malformed one raises ValueError naming it."""
        env = os.environ if environ is None else environ
        base = cls()
        return cls(
            image=env.get("QPA_OPERATOR_IMAGE") or base.image,
            trainer_image=env.get("QPA_OPERATOR_TRAINER_IMAGE") or base.trainer_image,
            harness_image=env.get("QPA_OPERATOR_HARNESS_IMAGE") or base.harness_image,
            bridge_image=env.get("QPA_OPERATOR_BRIDGE_IMAGE") or base.bridge_image,
            cluster_domain=env.get("QPA_CLUSTER_DOMAIN") or base.cluster_domain,
            run_as_user=int(env.get("QPA_OPERATOR_RUN_AS_USER") or base.run_as_user),
            store=_store_from_env(env),
            gpu_node_selector=tuple(
                sorted(_json_env(env, "QPA_OPERATOR_GPU_NODE_SELECTOR", dict).items())
            ),
            gpu_tolerations=tuple(_json_env(env, "QPA_OPERATOR_GPU_TOLERATIONS", list)),
            device_node_selector=_device_node_selector(env) or base.device_node_selector,
            network=NetworkSettings.from_env(env),
            resolve=dns_addresses,
            namespaces=_names_env(env, "QPA_OPERATOR_NAMESPACES"),
            store_prefix=(env.get("QPA_OPERATOR_STORE_PREFIX") or "").strip(),
            store_prefixes=tuple(
                sorted(
                    (str(k), str(v))
                    for k, v in _json_env(env, "QPA_OPERATOR_STORE_PREFIXES", dict).items()
                )
            ),
            readable_secrets=_names_env(env, "QPA_OPERATOR_READABLE_SECRETS"),
            image_pull_secrets=_names_env(env, "QPA_OPERATOR_IMAGE_PULL_SECRETS"),
            pod_service_accounts=_names_env(env, "QPA_OPERATOR_POD_SERVICE_ACCOUNTS"),
            pod_wildcard_tolerations=_flag_env(env, "QPA_OPERATOR_POD_WILDCARD_TOLERATIONS"),
            ephemeral_storage_request=_quantity_env(
                env, "QPA_OPERATOR_EPHEMERAL_STORAGE_REQUEST", base.ephemeral_storage_request
            ),
            scratch_size_limit=_quantity_env(
                env, "QPA_OPERATOR_SCRATCH_SIZE_LIMIT", base.scratch_size_limit
            ),
            training_queue=(env.get("QPA_OPERATOR_TRAINING_QUEUE") or "").strip() or None,
            rollout_pool_metric=_choice_env(
                env,
                "QPA_OPERATOR_ROLLOUTPOOL_METRIC",
                ("sessions", "cpu"),
                base.rollout_pool_metric,
            ),
        )

    def prefix_for(self, namespace: str) -> str | None:
        """The prefix `namespace`'s store URIs must start with, or None when unlimited."""
        prefix = dict(self.store_prefixes).get(namespace) or self.store_prefix
        if not prefix:
            return None
        prefix = prefix.replace("{namespace}", namespace)
        return prefix if prefix.endswith("/") else prefix + "/"


def _choice_env(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    """One of `choices` (unset or blank: `default`); anything else raises ValueError naming it."""
    value = (env.get(name) or "").strip() or default
    if value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return value


def _quantity_env(env: Mapping[str, str], name: str, default: str) -> str:
    """A positive Kubernetes quantity (unset or blank: `default`); else ValueError naming it."""
    value = (env.get(name) or "").strip() or default
    try:
        positive = parse_quantity(value) > 0
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not positive:
        raise ValueError(f"{name}: {value!r} must be a positive quantity (e.g. 1Gi)")
    return value


def _flag_env(env: Mapping[str, str], name: str) -> bool:
    value = (env.get(name) or "false").strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    return value == "true"


def _names_env(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of names (blanks dropped, order kept, duplicates removed)."""
    names = [part.strip() for part in (env.get(name) or "").split(",")]
    return tuple(dict.fromkeys(n for n in names if n))


def _device_node_selector(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """`QPA_OPERATOR_DEVICE_NODE_SELECTOR` (a JSON object of label values); `{}` is refused:
    it would let bridges run on every node."""
    name = "QPA_OPERATOR_DEVICE_NODE_SELECTOR"
    if name not in env:
        return ()
    value = _json_env(env, name, dict)
    if not value:
        raise ValueError(f"{name}: at least one device-node label is needed ({{}} = every node)")
    if not all(isinstance(k, str) and isinstance(v, str) and k for k, v in value.items()):
        raise ValueError(f"{name}: label keys and values must be strings")
    return tuple(sorted(value.items()))


def _json_env(env: Mapping[str, str], name: str, kind: type) -> Any:
    raw = env.get(name)
    if not raw:
        return kind()
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from exc
    if not isinstance(value, kind):
        raise ValueError(f"{name}: expected a JSON {'object' if kind is dict else 'array'}")
    return value


def _store_from_env(env: Mapping[str, str]) -> ObjectStore | None:
    """`QPA_OPERATOR_STORE_ENDPOINT` + `_SECRET` (+ `_REGION`) as an `ObjectStore`, or None."""
    endpoint, secret = env.get("QPA_OPERATOR_STORE_ENDPOINT"), env.get("QPA_OPERATOR_STORE_SECRET")
    if not endpoint and not secret:
        return None
    if not endpoint or not secret:
        raise ValueError("QPA_OPERATOR_STORE_ENDPOINT and QPA_OPERATOR_STORE_SECRET go together")
    try:
        return ObjectStore.model_validate(
            {
                "endpoint": endpoint,
                "region": env.get("QPA_OPERATOR_STORE_REGION") or "us-east-1",
                "secretRef": {"name": secret},
            }
        )
    except ValidationError as exc:
        raise ValueError(f"QPA_OPERATOR_STORE_*: {exc}") from exc


class MissingSetting(ValueError):
    """A value neither the resource nor the operator's defaults give (names the field)."""


def setting(owner: CustomResource, field: str, value: Any, default: Any, source: str) -> Any:
    """`value` (the resource's `field`), else the operator's `default` (set by `source`).

    Raises `MissingSetting` naming the resource, the field and the operator setting when
    neither gives one (an empty string counts as none).
    """
    if value not in (None, ""):
        return value
    if default not in (None, ""):
        return default
    where = f"{owner_namespace(owner)}/{owner.metadata.name}"
    raise MissingSetting(
        f"{owner.kind} {where}: {field} is not set and the operator has no default ({source})"
    )


# --------------------------------------------------------------------------- identity


def owner_name(owner: CustomResource) -> str:
    if not owner.metadata.name:
        raise ValueError(f"a {owner.kind} needs metadata.name")
    return owner.metadata.name


def owner_namespace(owner: CustomResource) -> str:
    return owner.metadata.namespace or "default"


def child_name(owner: CustomResource, suffix: str) -> str:
    """`<owner>-<suffix>`: the one name a child of this role ever has."""
    return f"{owner_name(owner)}-{suffix}"


def bounded_name(owner: CustomResource, suffix: str, limit: int) -> str:
    """`<owner>-<suffix>`, or `<owner prefix>-<hash>-<suffix>` when that exceeds `limit`.

    For children whose name other controllers extend (KServe names its Services
    `<isvc>-predictor[-00001]`), so the longest owner names still give DNS labels.
    """
    name = child_name(owner, suffix)
    if len(name) <= limit:
        return name
    digest = content_hash(owner_name(owner), 6)
    keep = max(1, limit - len(suffix) - len(digest) - 2)
    return f"{owner_name(owner)[:keep].rstrip('-')}-{digest}-{suffix}"


def selector_labels(owner: CustomResource, component: str) -> dict[str, str]:
    """The immutable subset used in Deployment/DaemonSet/Service selectors."""
    return {
        LABEL_INSTANCE: owner_name(owner),
        LABEL_COMPONENT: component,
        kind_label(owner.kind): owner_name(owner),
    }


def labels(owner: CustomResource, component: str, defaults: Defaults) -> dict[str, str]:
    """Every label a child (and its pods) carries."""
    return {
        LABEL_NAME: APP_NAME,
        **selector_labels(owner, component),
        LABEL_PART_OF: PART_OF,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_VERSION: defaults.version,
    }


def owner_references(owner: CustomResource) -> list[JsonDict]:
    return [owner.owner_reference().to_k8s()]


def metadata(
    owner: CustomResource,
    name: str,
    component: str,
    defaults: Defaults,
    *,
    annotations: Mapping[str, str] | None = None,
    namespaced: bool = True,
) -> JsonDict:
    meta: JsonDict = {"name": name}
    if namespaced:
        meta["namespace"] = owner_namespace(owner)
    meta["labels"] = labels(owner, component, defaults)
    if annotations:
        meta["annotations"] = dict(annotations)
    meta["ownerReferences"] = owner_references(owner)
    return meta


# --------------------------------------------------------------------------- work orders


def work_order_name(owner: CustomResource) -> str:
    """The ConfigMap holding the work order of `owner`'s pods."""
    return child_name(owner, "order")


def work_order_config_map(
    owner: CustomResource,
    resolved: Resolved,
    component: str,
    defaults: Defaults,
    *,
    name: str | None = None,
) -> JsonDict:
    """The work order (the resource + what the operator resolved) as a ConfigMap: the one input
    of the pods, read with `qpa <stage> --spec WORK_ORDER_PATH` (see `qpa.api...workorder`).
    `name` defaults to `<owner>-order` (one work order per owner)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, name or work_order_name(owner), component, defaults),
        "data": {WORK_ORDER_KEY: dump_work_order(owner, resolved)},
    }
    return with_spec_hash(manifest)


def work_order_parts(owner: CustomResource, *, name: str | None = None) -> PodParts:
    """The volume and read-only mount of the work order at WORK_ORDER_DIR."""
    config_map = name or work_order_name(owner)
    return PodParts(
        volumes=({"name": "work-order", "configMap": {"name": config_map}},),
        mounts=({"name": "work-order", "mountPath": WORK_ORDER_DIR, "readOnly": True},),
    )


def work_order_hash(config_map: Mapping[str, Any]) -> dict[str, str]:
    """A pod-template annotation that changes with the work order, so long-running pods
    (Deployments, DaemonSets) restart when their input changes."""
    return {CONFIG_HASH_ANNOTATION: content_hash(config_map.get("data") or {})}


# --------------------------------------------------------------------------- hashing


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def content_hash(value: Any, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]


def with_spec_hash(manifest: JsonDict) -> JsonDict:
    """The manifest with `qpa.ai/spec-hash` over everything but that annotation."""
    result = copy.deepcopy(manifest)
    meta = result.setdefault("metadata", {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != HASH_ANNOTATION}
    hashed = {**result, "metadata": {**meta, "annotations": annotations}}
    meta["annotations"] = {**annotations, HASH_ANNOTATION: content_hash(hashed)}
    return result


def spec_hash_of(manifest: Mapping[str, Any]) -> str | None:
    annotations = (manifest.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(HASH_ANNOTATION)
    return value if isinstance(value, str) else None


# --------------------------------------------------------------------------- pods


def restricted_pod_security(defaults: Defaults) -> JsonDict:
    """Pod-level securityContext of the Kubernetes `restricted` Pod Security Standard."""
    return {
        "runAsNonRoot": True,
        "runAsUser": defaults.run_as_user,
        "runAsGroup": defaults.run_as_user,
        "fsGroup": defaults.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_container_security() -> JsonDict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def quantity(value: int | float | str) -> str:
    """Quantities as strings, the form the API server stores (`1`, `500m`, `1Gi`)."""
    return str(value)


def resources(
    spec: ResourceRequirements | None,
    *,
    gpus: int = 0,
    gpu_resource: str = "nvidia.com/gpu",
) -> JsonDict:
    """Requests and limits of a container; GPUs go to both (extended resources must match)."""
    requests = {k: quantity(v) for k, v in (spec.requests if spec else {}).items()}
    limits = {k: quantity(v) for k, v in (spec.limits if spec else {}).items()}
    if gpus > 0:
        requests[gpu_resource] = quantity(gpus)
        limits[gpu_resource] = quantity(gpus)
    result: JsonDict = {}
    if requests:
        result["requests"] = dict(sorted(requests.items()))
    if limits:
        result["limits"] = dict(sorted(limits.items()))
    return result


def gpu_placement(defaults: Defaults, gpu_resource: str = "nvidia.com/gpu") -> JsonDict:
    """nodeSelector and tolerations of a pod that requests GPUs.

    Always tolerates the `<gpu_resource>` taint the GPU operators put on GPU nodes; the
    operator-wide `gpu_node_selector`/`gpu_tolerations` (the chart's `gpu` values) add to that.
    """
    tolerations: list[JsonDict] = [
        {"key": gpu_resource, "operator": "Exists", "effect": "NoSchedule"}
    ]
    tolerations += [dict(t) for t in defaults.gpu_tolerations if dict(t) not in tolerations]
    placement: JsonDict = {"tolerations": tolerations}
    if defaults.gpu_node_selector:
        placement["nodeSelector"] = dict(defaults.gpu_node_selector)
    return placement


def empty_dir(name: str, *, memory: bool = False, size_limit: str | None = None) -> JsonDict:
    source: JsonDict = {}
    if memory:
        source["medium"] = "Memory"
    if size_limit:
        source["sizeLimit"] = size_limit
    return {"name": name, "emptyDir": source}


def env_var(name: str, value: str) -> JsonDict:
    return {"name": name, "value": value}


def field_env(name: str, path: str) -> JsonDict:
    """An environment variable from the downward API (`metadata.name`, `spec.nodeName`)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


@dataclass(frozen=True)
class PodParts:
    """Environment variables, volumes and mounts one concern adds to a pod."""

    env: tuple[JsonDict, ...] = ()
    volumes: tuple[JsonDict, ...] = ()
    mounts: tuple[JsonDict, ...] = ()

    def __add__(self, other: PodParts) -> PodParts:
        return PodParts(
            self.env + other.env, self.volumes + other.volumes, self.mounts + other.mounts
        )


def combine(parts: Iterable[PodParts]) -> PodParts:
    total = PodParts()
    for part in parts:
        total = total + part
    return total


def store_parts(store: ObjectStore | None) -> PodParts:
    """S3 settings as `QPA_S3_*` variables; the credentials as files of a Secret volume."""
    if store is None:
        return PodParts()
    ref = store.secret_ref
    volume = {
        "name": "store-credentials",
        "secret": {
            "secretName": ref.name,
            "items": [
                {"key": ref.access_key_id_key, "path": "access-key-id"},
                {"key": ref.secret_access_key_key, "path": "secret-access-key"},
            ],
            "defaultMode": 0o440,
        },
    }
    mount = {"name": "store-credentials", "mountPath": STORE_SECRET_MOUNT, "readOnly": True}
    env = (
        env_var("QPA_S3_ENDPOINT", store.endpoint),
        env_var("QPA_S3_REGION", store.region),
        env_var("QPA_S3_ACCESS_KEY_FILE", f"{STORE_SECRET_MOUNT}/access-key-id"),
        env_var("QPA_S3_SECRET_KEY_FILE", f"{STORE_SECRET_MOUNT}/secret-access-key"),
    )
    return PodParts(env=env, volumes=(volume,), mounts=(mount,))


API_KEY_ENV: Final = "QPA_API_KEY"


def api_key_parts(ref: SecretKeySelector | None, variable: str = API_KEY_ENV) -> PodParts:
    """The endpoint's API key as an environment variable read from a Secret key."""
    if ref is None:
        return PodParts()
    env = {
        "name": variable,
        "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
    }
    return PodParts(env=(env,))


def harness_config_parts(ref: ConfigMapKeySelector | None) -> tuple[PodParts, str | None]:
    """The Harness YAML from a ConfigMap key, mounted read-only; returns its path too."""
    if ref is None:
        return PodParts(), None
    volume = {
        "name": "harness-config",
        "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}]},
    }
    mount = {"name": "harness-config", "mountPath": HARNESS_CONFIG_MOUNT, "readOnly": True}
    return PodParts(volumes=(volume,), mounts=(mount,)), harness_config_path(ref)


def service_host(name: str, namespace: str, defaults: Defaults) -> str:
    return f"{name}.{namespace}.svc.{defaults.cluster_domain}"


def rollout_pool_service(pool: str) -> str:
    """The Service in front of a RolloutPool's environment servers."""
    return f"{pool}-env"


def rollout_pool_url(pool: str, namespace: str, defaults: Defaults) -> str:
    """Base URL of a RolloutPool's environment servers (its Service listens on port 80)."""
    return f"http://{service_host(rollout_pool_service(pool), namespace, defaults)}"


def summary_wrapper(program: str) -> list[str]:
    """`sh -c` that runs its arguments with stdout in the termination log, then echoes it.

    `qpa collect --json` prints one JSON summary on stdout (progress goes to stderr); kubelet
    hands the termination log to the operator in the pod's status, which is how shard counts
    reach the TaskBatch without the operator reading the object store.
    """
    script = f'"$@" > {TERMINATION_LOG}; rc=$?; cat {TERMINATION_LOG}; exit $rc'
    return ["sh", "-c", script, program]


def service_account(
    owner: CustomResource, name: str, component: str, defaults: Defaults
) -> JsonDict:
    """A ServiceAccount whose token pods mount only where they ask (`automount...: false`)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(owner, name, component, defaults),
        "automountServiceAccountToken": False,
    }


def role(
    owner: CustomResource, name: str, component: str, defaults: Defaults, rules: list[JsonDict]
) -> JsonDict:
    """A namespaced Role: exact verbs on named resources, no wildcards.

    Only the device bridge and device-backed environment servers talk to the API (phone
    Leases); their rules are built in `builders.devicepool`.
    """
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(owner, name, component, defaults),
        "rules": rules,
    }


def role_binding(
    owner: CustomResource,
    name: str,
    component: str,
    defaults: Defaults,
    role_name: str,
    *,
    account: str | None = None,
) -> JsonDict:
    """Binds the ServiceAccount `account` (default: `name`) of the owner's namespace to the
    Role `role_name`. A binding's roleRef cannot change: a binding to another Role needs
    another name."""
    subject = {
        "kind": "ServiceAccount",
        "name": account or name,
        "namespace": owner_namespace(owner),
    }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(owner, name, component, defaults),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [subject],
    }


def terminated_container(pod: Mapping[str, Any], container: str) -> JsonDict | None:
    """`state.terminated` of a container of a pod (None while it runs)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            terminated = (status.get("state") or {}).get("terminated")
            return dict(terminated) if isinstance(terminated, Mapping) else None
    return None


# --------------------------------------------------------------------------- Job status


def count_indexes(text: str | None) -> int:
    """How many indexes a Job's `completedIndexes`/`failedIndexes` names (`"0,2-4"` -> 4)."""
    total = 0
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            total += (int(high) - int(low) + 1) if high else 1
        except ValueError:
            continue
    return total


@dataclass(frozen=True)
class JobState:
    """What a batch/v1 Job's status says, reduced to what the reconcilers report."""

    name: str | None = None
    exists: bool = False
    started: bool = False
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    completed_indexes: int = 0
    failed_indexes: int = 0
    complete: bool = False
    failed_for_good: bool = False
    reason: str | None = None
    message: str = ""
    start_time: str | None = None
    completion_time: str | None = None

    @property
    def finished(self) -> bool:
        return self.complete or self.failed_for_good


def job_state(job: Mapping[str, Any] | None) -> JobState:
    if not job:
        return JobState()
    status = job.get("status") or {}
    conditions = {
        c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
    }
    failed = conditions.get("Failed")
    complete = conditions.get("Complete")
    active = int(status.get("active") or 0)
    ready = int(status.get("ready") or 0)
    succeeded = int(status.get("succeeded") or 0)
    reason, message = None, ""
    if failed is not None:
        reason, message = failed.get("reason") or "JobFailed", failed.get("message") or ""
    elif complete is not None:
        reason, message = complete.get("reason") or "JobComplete", complete.get("message") or ""
    return JobState(
        name=(job.get("metadata") or {}).get("name"),
        exists=True,
        started=bool(status.get("startTime")) or active > 0 or succeeded > 0,
        active=active,
        ready=ready,
        succeeded=succeeded,
        failed=int(status.get("failed") or 0),
        completed_indexes=count_indexes(status.get("completedIndexes")),
        failed_indexes=count_indexes(status.get("failedIndexes")),
        complete=complete is not None and failed is None,
        failed_for_good=failed is not None,
        reason=reason,
        message=message,
        start_time=status.get("startTime"),
        completion_time=status.get("completionTime"),
    )


def reason_word(text: str | None, fallback: str) -> str:
    """A condition reason (CamelCase, `[A-Za-z][A-Za-z0-9_,:]*`) from a free-form word."""
    if not text:
        return fallback
    cleaned = "".join(ch for ch in text if ch.isalnum() or ch in "_,:")
    while cleaned and not cleaned[0].isalpha():
        cleaned = cleaned[1:]
    cleaned = cleaned.rstrip(",:")
    return cleaned or fallback
