"""DevicePool -> a DaemonSet of the device bridge on the device nodes, and what it needs.

On every node matching `nodeSelector` one bridge pod (`bridgeImage`, else the operator's
default bridge image) runs

    qpa device bridge --spec /etc/qpa/order/workorder.yaml

with the node's `/dev/bus/usb` mounted (hostPath). It is the only privileged pod qpa runs:
adb needs the raw USB devices. The pool itself (filters, health checks, lease duration, adb
port) reaches it as its work order (ConfigMap `<pool>-order`), read by
`BridgeSettings.from_devicepool`; the pod template carries the work order's hash, so a spec
change rolls the bridges. A headless
Service `<pool>-bridge` lists the bridges for device-backed RolloutPools, and a ServiceAccount
with a Role on `coordination.k8s.io` Leases (and on its own DevicePool's status) lets the
bridge publish phones.

**Phone Leases** are the contract between the bridge and the operator: one Lease per phone,
labelled `qpa.ai/devicepool=<pool>`, owned by the DevicePool, carrying the phone in
annotations (`qpa.ai/serial`, `qpa.ai/node`, `qpa.ai/model`, `qpa.ai/android-version`,
`qpa.ai/state`, `qpa.ai/reason`, `qpa.ai/last-seen`) and its holder in
`spec.holderIdentity` while a rollout leases it. `devicepool_status` turns them into
`status.phones`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from qpa_operator.builders.common import (
    Defaults,
    JsonDict,
    child_name,
    field_env,
    labels,
    lease_rbac,
    metadata,
    owner_namespace,
    selector_labels,
    setting,
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

POOL_LABEL: Final = "qpa.ai/devicepool"
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


def daemonset_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge")


def service_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge")


def account_name(pool: DevicePool) -> str:
    return child_name(pool, "bridge")


def config_map(pool: DevicePool, defaults: Defaults) -> JsonDict:
    """The bridge's work order: the DevicePool itself and its namespace."""
    return work_order_config_map(
        pool, Resolved(namespace=owner_namespace(pool)), COMPONENT, defaults
    )


#: The bridge reads its pool from the work order; `$(POD_IP)` (for the Leases) and the node
#: come from the pod's own environment.
BRIDGE_ARGS: Final = ("qpa", "device", "bridge", "--spec", WORK_ORDER_PATH)


def bridge_image(pool: DevicePool, defaults: Defaults) -> str:
    """The pool's `bridgeImage`, else the operator's (the chart's `images.deviceBridge`)."""
    image: str = setting(
        pool,
        "spec.bridgeImage",
        pool.spec.bridge_image,
        defaults.bridge_image,
        "QPA_OPERATOR_BRIDGE_IMAGE, the chart's images.deviceBridge",
    )
    return image


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
        ],
        "volumeMounts": [
            {"name": "usb", "mountPath": USB_PATH},
            *work_order_parts(pool).mounts,
        ],
        # The one privileged container of qpa: adb opens the node's raw USB devices.
        "securityContext": {
            "privileged": True,
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": True,
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
                    "nodeSelector": dict(sorted(spec.node_selector.items())),
                    "containers": [container],
                    "volumes": [
                        {"name": "usb", "hostPath": {"path": USB_PATH, "type": "Directory"}},
                        *work_order_parts(pool).volumes,
                    ],
                },
            },
        },
    }
    return with_spec_hash(manifest)


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


def bridge_rbac(pool: DevicePool, defaults: Defaults) -> list[JsonDict]:
    """Lease RBAC, plus reading its own DevicePool and patching its status (the phone list)."""
    account, role, binding = lease_rbac(pool, account_name(pool), COMPONENT, defaults)
    own = [pool.metadata.name or ""]
    role["rules"] += [
        {"apiGroups": [GROUP], "resources": ["devicepools"], "resourceNames": own,
         "verbs": ["get"]},
        {"apiGroups": [GROUP], "resources": ["devicepools/status"], "resourceNames": own,
         "verbs": ["get", "patch"]},
    ]  # fmt: skip
    return [with_spec_hash(o) for o in (account, role, binding)]


def children(pool: DevicePool, defaults: Defaults) -> list[JsonDict]:
    rbac = bridge_rbac(pool, defaults)
    return [*rbac, config_map(pool, defaults), daemonset(pool, defaults), service(pool, defaults)]


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
