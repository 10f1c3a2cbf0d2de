"""DevicePool -> a DaemonSet of the device bridge on the device nodes, and what it needs.

On every device node one bridge pod runs

    qpa device bridge --spec /etc/qpa/order/workorder.yaml

with the node's `/dev/bus/usb` mounted (hostPath). It is the only privileged pod qpa runs:
adb needs the raw USB devices. So **nothing a DevicePool says reaches its privileges**:

- the image is the operator's setting (`Defaults.bridge_image`: the chart's
  `images.deviceBridge`), as are the security context, the volumes and the command; a
  DevicePool has no image field (`spec.bridgeImage` is an unknown field to the API server,
  an error under `kubectl apply`'s strict validation, and refused by `qpa.api`);
- the nodes: the DaemonSet's `nodeSelector` is the pool's `nodeSelector` with the cluster
  admin's device-node labels (`Defaults.device_node_selector`: the chart's
  `devices.nodeSelector`) laid over it: a pool can only narrow the device nodes, never widen
  them (a conflicting value is the admin's; `{}` still means the device nodes only);
- `adbPort` is a container port (no hostPort), bounded to 1024-65535 by the CRD; the health
  checks, filters and lease duration reach the pod only as its work order (ConfigMap
  `<pool>-order`, read by `BridgeSettings.from_devicepool`), never as pod fields; the pod
  template carries the work order's hash, so a spec change rolls the bridges.

**Who reaches adb.** The bridge's adb server listens on the pod's loopback only; `qpa device
bridge` proxies `<pod IP>:adbPort` to it and admits only peers whose address is a running pod
labelled `qpa.ai/devicepool-client=<pool>` (the env servers of RolloutPools whose
`devicePoolRef` is this pool, see `builders.rolloutpool`), which it lists through its own Role.
The NetworkPolicy `<pool>-bridge-ingress` says the same to the CNI (the adb port, from those
pods, nothing else), so the rule holds with or without a CNI that enforces policies.

**Phone Leases** are the contract between the bridge and the operator: one Lease per phone,
named `<pool>-<phone slug>` (`lease_name`), labelled `qpa.ai/devicepool=<pool>`, owned by the
DevicePool, carrying the phone in annotations (`qpa.ai/serial`, `qpa.ai/node`, `qpa.ai/model`,
`qpa.ai/android-version`, `qpa.ai/state`, `qpa.ai/reason`, `qpa.ai/last-seen`) and its holder in
`spec.holderIdentity` while a rollout leases it. `devicepool_status` turns them into
`status.phones`.

**RBAC by name.** `get`/`update` on Leases are granted on `resourceNames`: the pool's phone
Leases the operator has seen (names derived from pool and serial, so nothing else in the
namespace is ever named), kept in step as the bridge publishes phones; `list` and `create`
cannot be scoped by name in Kubernetes RBAC, so the bridge gets `list` + `create` and the env
servers `list` only (both read, neither can then write a Lease that is not a phone of the pool).
The bridge's Role `<pool>-bridge` adds reading its own DevicePool, patching its status and
listing pods (the proxy's allowlist); the Role `<pool>-phones` is what device-backed
RolloutPools bind their env servers' ServiceAccount to.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from qpa_operator.builders import podtemplate
from qpa_operator.builders.common import (
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Defaults,
    JsonDict,
    MissingSetting,
    child_name,
    empty_dir,
    env_var,
    field_env,
    labels,
    metadata,
    owner_namespace,
    role,
    role_binding,
    selector_labels,
    service_account,
    with_spec_hash,
    work_order_config_map,
    work_order_hash,
    work_order_parts,
)

from qpa.api import GROUP, DevicePool
from qpa.api.v1alpha1 import (
    WORK_ORDER_PATH,
    DevicePoolStatus,
    Phone,
    Resolved,
    set_condition,
)

COMPONENT: Final = "device-bridge"
CONTAINER: Final = "bridge"
USB_PATH: Final = "/dev/bus/usb"
SERVICE_PORT: Final = 5037
#: The component label of the pods allowed to reach a pool's adb (`builders.rolloutpool`).
CLIENT_COMPONENT: Final = "env-server"

POOL_LABEL: Final = "qpa.ai/devicepool"
#: On the pods of a pool's env servers: the one label the bridge's proxy and NetworkPolicy admit.
CLIENT_LABEL: Final = "qpa.ai/devicepool-client"
PHONE_LABEL: Final = "qpa.ai/phone"
ROLLOUT_POOL_LABEL: Final = "qpa.ai/rolloutpool"
SERIAL_ANNOTATION: Final = "qpa.ai/serial"
NODE_ANNOTATION: Final = "qpa.ai/node"
MODEL_ANNOTATION: Final = "qpa.ai/model"
ANDROID_ANNOTATION: Final = "qpa.ai/android-version"
STATE_ANNOTATION: Final = "qpa.ai/state"
REASON_ANNOTATION: Final = "qpa.ai/reason"
LAST_SEEN_ANNOTATION: Final = "qpa.ai/last-seen"
PHONE_STATES: Final = ("available", "leased", "quarantined", "offline")
LEASES: Final = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}


def daemonset_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge")


def service_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge")


def account_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge")


def ingress_policy_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge-ingress")


def phones_role_name(device_pool: str) -> str:
    """The Role env servers of device-backed RolloutPools are bound to (`<pool>-phones`)."""
    return f"{device_pool}-phones"


def client_labels(device_pool: str) -> dict[str, str]:
    """Labels of the pods allowed to reach a DevicePool's adb servers (its env servers)."""
    return {CLIENT_LABEL: device_pool, LABEL_COMPONENT: CLIENT_COMPONENT,
            LABEL_MANAGED_BY: MANAGED_BY}  # fmt: skip


# The phone-Lease names, as `qpa.device.names` writes them (a unit test keeps both in step).
_UNSAFE: Final = re.compile(r"[^a-z0-9]+")


def phone_slug(serial: str) -> str:
    lowered = serial.lower()
    slug = _UNSAFE.sub("-", lowered).strip("-") or "phone"
    if slug == lowered and len(slug) <= 63:
        return slug
    digest = hashlib.sha256(serial.encode()).hexdigest()[:8]
    return f"{slug[:54].rstrip('-')}-{digest}"


def lease_name(pool: str, serial: str) -> str:
    return f"{pool}-{phone_slug(serial)}"[:253]


def phone_lease_names(pool: DevicePool, leases: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the pool's phone Leases: those whose name is `lease_name(pool, serial)` of the
    serial they carry. A Lease merely labelled with the pool (any other name) is never granted."""
    found = set()
    for lease in leases:
        meta = lease.get("metadata") or {}
        serial = (meta.get("annotations") or {}).get(SERIAL_ANNOTATION)
        if (
            serial
            and (meta.get("labels") or {}).get(POOL_LABEL) == pool.metadata.name
            and meta.get("name") == lease_name(pool.metadata.name or "", str(serial))
        ):
            found.add(str(meta["name"]))
    return sorted(found)


def lease_rules(verbs: Iterable[str], names: Iterable[str]) -> list[JsonDict]:
    """`verbs` (list, create: never scoped by name) on Leases, and get + update on `names`.

    No names, no get/update rule: a rule with an empty `resourceNames` would mean every Lease.
    """
    rules: list[JsonDict] = [{**LEASES, "verbs": sorted(verbs)}]
    named = sorted(set(names))
    if named:
        rules.append({**LEASES, "resourceNames": named, "verbs": ["get", "update"]})
    return rules


def config_map(pool: DevicePool, defaults: Defaults) -> JsonDict:
    """The bridge's work order: the DevicePool itself and its namespace."""
    return work_order_config_map(
        pool, Resolved(namespace=owner_namespace(pool)), COMPONENT, defaults
    )


#: The bridge reads its pool from the work order; `$(POD_IP)` (the proxy's address, written into
#: the Leases) and the node come from the pod's own environment.
BRIDGE_ARGS: Final = ("qpa", "device", "bridge", "--spec", WORK_ORDER_PATH)


def bridge_image(pool: DevicePool, defaults: Defaults) -> str:
    """The operator's bridge image (the chart's `images.deviceBridge`): never the pool's."""
    if not defaults.bridge_image:
        where = f"{owner_namespace(pool)}/{pool.metadata.name}"
        raise MissingSetting(
            f"DevicePool {where}: the operator has no device-bridge image "
            "(QPA_OPERATOR_BRIDGE_IMAGE, the chart's images.deviceBridge)"
        )
    return defaults.bridge_image


def node_selector(pool: DevicePool, defaults: Defaults) -> dict[str, str]:
    """The pool's node labels with the admin's device-node labels over them (never fewer)."""
    admin = dict(defaults.device_node_selector)
    if not admin:
        raise MissingSetting(
            f"DevicePool {owner_namespace(pool)}/{pool.metadata.name}: the operator has no "
            "device-node labels (QPA_OPERATOR_DEVICE_NODE_SELECTOR, the chart's "
            "devices.nodeSelector)"
        )
    return dict(sorted({**pool.spec.node_selector, **admin}.items()))


def daemonset(pool: DevicePool, defaults: Defaults) -> JsonDict:
    spec = pool.spec
    container: JsonDict = {
        "name": CONTAINER,
        "image": bridge_image(pool, defaults),
        "args": list(BRIDGE_ARGS),
        "ports": [{"name": "adb", "containerPort": spec.adb_port, "protocol": "TCP"}],
        "env": [
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_IP", "status.podIP"),
            env_var("HOME", "/tmp"),  # adb keeps its keys under $HOME/.android
        ],
        "volumeMounts": [
            {"name": "usb", "mountPath": USB_PATH},
            {"name": "tmp", "mountPath": "/tmp"},
            *work_order_parts(pool).mounts,
        ],
        # The one privileged container of qpa: adb opens the node's raw USB devices.
        "securityContext": {
            "privileged": True,
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": True,
            "readOnlyRootFilesystem": True,
        },
    }
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(pool, daemonset_name(pool), COMPONENT, defaults),
        "spec": {
            "selector": {"matchLabels": selector_labels(pool, COMPONENT)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": labels(pool, COMPONENT, defaults),
                    "annotations": work_order_hash(config_map(pool, defaults)),
                },
                "spec": {
                    "serviceAccountName": account_name(pool),
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "hostNetwork": False,
                    "hostPID": False,
                    "hostIPC": False,
                    "nodeSelector": node_selector(pool, defaults),
                    "containers": [container],
                    "volumes": [
                        {"name": "usb", "hostPath": {"path": USB_PATH, "type": "Directory"}},
                        empty_dir("tmp", size_limit="64Mi"),
                        *work_order_parts(pool).volumes,
                    ],
                },
            },
        },
    }
    # no user template here (the bridge is the admin's): the chart's pull secrets and the
    # ephemeral-storage request, as on every pod the operator makes
    return with_spec_hash(podtemplate.merge_into(manifest, None, defaults))


def service(pool: DevicePool, defaults: Defaults) -> JsonDict:
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(pool, service_name(pool), COMPONENT, defaults),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(pool, COMPONENT),
            "ports": [
                {"name": "adb", "port": SERVICE_PORT, "targetPort": "adb", "protocol": "TCP"}
            ],
        },
    }
    return with_spec_hash(manifest)


def ingress_policy(pool: DevicePool, defaults: Defaults) -> JsonDict:
    """The bridge pods accept the adb port from the pool's env servers, nothing else."""
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(pool, ingress_policy_name(pool), COMPONENT, defaults),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(pool, COMPONENT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": client_labels(pool.metadata.name or "")}}
                    ],
                    "ports": [{"protocol": "TCP", "port": pool.spec.adb_port}],
                }
            ],
        },
    }
    return with_spec_hash(manifest)


def bridge_rbac(
    pool: DevicePool, defaults: Defaults, leases: Iterable[Mapping[str, Any]] = ()
) -> list[JsonDict]:
    """The bridge's ServiceAccount, Role and RoleBinding: its pool's phone Leases by name (plus
    list and create), its own DevicePool and status, and listing pods (the proxy's allowlist)."""
    name = account_name(pool)
    own = [pool.metadata.name or ""]
    rules = [
        *lease_rules(["create", "list"], phone_lease_names(pool, leases)),
        {"apiGroups": [GROUP], "resources": ["devicepools"], "resourceNames": own,
         "verbs": ["get"]},
        {"apiGroups": [GROUP], "resources": ["devicepools/status"], "resourceNames": own,
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]  # fmt: skip
    objects = [
        service_account(pool, name, COMPONENT, defaults),
        role(pool, name, COMPONENT, defaults, rules),
        role_binding(pool, name, COMPONENT, defaults, name),
    ]
    return [with_spec_hash(o) for o in objects]


def phones_role(
    pool: DevicePool, defaults: Defaults, leases: Iterable[Mapping[str, Any]] = ()
) -> JsonDict:
    """What a device env server may do: list the Leases, get and update the pool's phones."""
    rules = lease_rules(["list"], phone_lease_names(pool, leases))
    return with_spec_hash(
        role(pool, phones_role_name(pool.metadata.name or ""), COMPONENT, defaults, rules)
    )


def children(
    pool: DevicePool, defaults: Defaults, leases: Iterable[Mapping[str, Any]] = ()
) -> list[JsonDict]:
    """Every child, in order; `leases` are the pool's phone Leases the operator has seen (they
    name the Roles' `resourceNames`)."""
    seen = list(leases)
    return [
        ingress_policy(pool, defaults),
        *bridge_rbac(pool, defaults, seen),
        phones_role(pool, defaults, seen),
        config_map(pool, defaults),
        daemonset(pool, defaults),
        service(pool, defaults),
    ]


def lease_selector(pool: DevicePool) -> str:
    """Label selector of the pool's phone Leases (what deletion cleans up)."""
    return f"{POOL_LABEL}={pool.metadata.name}"


def pool_namespace(pool: DevicePool) -> str:
    return owner_namespace(pool)


# --------------------------------------------------------------------------- status


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def phone_from_lease(lease: Mapping[str, Any], now: datetime) -> Phone | None:
    """The phone a bridge published as a Lease (None when the Lease names no serial/node)."""
    meta = lease.get("metadata") or {}
    notes = meta.get("annotations") or {}
    spec = lease.get("spec") or {}
    serial = notes.get(SERIAL_ANNOTATION) or (meta.get("labels") or {}).get(PHONE_LABEL)
    node = notes.get(NODE_ANNOTATION)
    if not serial or not node:
        return None
    holder = spec.get("holderIdentity") or None
    renewed = _time(spec.get("renewTime")) or _time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    expired = (
        holder is not None
        and renewed is not None
        and isinstance(duration, int)
        and renewed + timedelta(seconds=duration) < now
    )
    state = notes.get(STATE_ANNOTATION)
    if state not in PHONE_STATES:
        state = "leased" if holder and not expired else "available"
    if state == "leased" and expired:
        state = "available"
    return Phone(
        serial=str(serial),
        node=str(node),
        model=notes.get(MODEL_ANNOTATION),
        android_version=notes.get(ANDROID_ANNOTATION),
        state=state,
        leased_by=holder if state == "leased" else None,
        reason=notes.get(REASON_ANNOTATION),
        last_seen=_time(notes.get(LAST_SEEN_ANNOTATION)),
    )


def devicepool_status(
    pool: DevicePool,
    daemonset: Mapping[str, Any] | None,
    leases: Iterable[Mapping[str, Any]],
    *,
    observed_generation: int | None,
    now: datetime,
) -> DevicePoolStatus:
    current = pool.status or DevicePoolStatus()
    phones = sorted(
        (p for p in (phone_from_lease(lease, now) for lease in leases) if p is not None),
        key=lambda p: p.serial,
    )
    by_state = {state: sum(1 for p in phones if p.state == state) for state in PHONE_STATES}
    status = (daemonset or {}).get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0)
    ready = int(status.get("numberReady") or 0)
    unhealthy = by_state["quarantined"] + by_state["offline"]
    if daemonset is None:
        phase, reason, message = "Pending", "DaemonSetMissing", "the bridge DaemonSet is not there"
    elif desired == 0:
        phase, reason = "Pending", "NoDeviceNodes"
        message = "no node matches the nodeSelector yet"
    elif ready == 0:
        phase, reason, message = "Pending", "BridgesStarting", f"0 of {desired} bridges ready"
    elif ready < desired:
        phase, reason, message = "Degraded", "BridgesNotReady", f"{ready} of {desired} ready"
    elif unhealthy:
        phase, reason = "Degraded", "PhonesUnhealthy"
        message = f"{by_state['quarantined']} quarantined, {by_state['offline']} offline"
    else:
        phase, reason = "Ready", "BridgesReady"
        message = f"{ready} bridges, {len(phones)} phones"
    conditions = set_condition(
        current.conditions,
        "Ready",
        "True" if phase == "Ready" else "False",
        reason,
        message,
        observed_generation=observed_generation,
        now=now,
    )
    return DevicePoolStatus(
        phase=phase,
        observed_generation=observed_generation,
        conditions=conditions,
        phones=phones,
        total=len(phones),
        available=by_state["available"],
        leased=by_state["leased"],
        quarantined=by_state["quarantined"],
    )
