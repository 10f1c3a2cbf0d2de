"""DevicePool: its spec, status and custom resource model."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from qpa.api.v1alpha1.base import (
    ADB_SERIAL,
    Condition,
    CrossFieldRule,
    _check_unique,
    _conditions,
    _defaulted,
    _list_set,
    _Model,
    _observed_generation,
    _timestamp,
)
from qpa.api.v1alpha1.resource import (
    AGE_COLUMN,
    PHASE_COLUMN,
    CustomResource,
    KindInfo,
    PrinterColumn,
)


class DeviceFilter(_Model):
    """Which attached phones join the pool (all filters must match; empty lists match all)."""

    serials: list[Annotated[str, Field(min_length=1, max_length=255, pattern=ADB_SERIAL)]] = (
        _list_set("Only phones with these adb serials.", max_length=1024)
    )
    models: list[Annotated[str, Field(min_length=1, max_length=255)]] = _list_set(
        "Only these models (ro.product.model).", max_length=256
    )
    min_android_version: int | None = Field(
        default=None, ge=5, le=99, description="Lowest Android major version."
    )
    max_android_version: int | None = Field(
        default=None, ge=5, le=99, description="Highest Android major version."
    )

    RULES = (
        CrossFieldRule(
            cel="!has(self.minAndroidVersion) || !has(self.maxAndroidVersion) || "
            "self.minAndroidVersion <= self.maxAndroidVersion",
            message="minAndroidVersion must not exceed maxAndroidVersion",
            check=lambda m: (
                m.min_android_version is None
                or m.max_android_version is None
                or m.min_android_version <= m.max_android_version
            ),
        ),
        CrossFieldRule(
            cel=None,  # the server enforces it through x-kubernetes-list-type: set
            message="serials and models must be unique",
            check=_check_unique("serials", "models"),
        ),
    )


class DeviceHealthCheck(_Model):
    """How the bridge probes phones, and when it quarantines one."""

    interval_seconds: int = Field(default=30, ge=1, le=3600, description="Seconds between probes.")
    timeout_seconds: int = Field(default=10, ge=1, le=600, description="Seconds a probe may take.")
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="Failed probes in a row before quarantine."
    )
    quarantine_seconds: int = Field(
        default=600,
        ge=0,
        le=604800,
        description="How long a quarantined phone stays out of the pool.",
    )

    RULES = (
        CrossFieldRule(
            cel="self.timeoutSeconds < self.intervalSeconds",
            message="timeoutSeconds must be below intervalSeconds",
            check=lambda m: m.timeout_seconds < m.interval_seconds,
        ),
    )


#: The node label of device nodes: the chart's default `devices.nodeSelector`, and what every
#: DevicePool's `nodeSelector` must name (a CEL rule: the CRD can know only this default; the
#: operator adds the label the cluster admin configured to every bridge DaemonSet).
DEVICE_NODE_LABEL: Final = "qpa.ai/device-node"
#: Kubernetes label keys (`[prefix/]name`) and values, as the API server checks them.
LABEL_KEY: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_NODE_LABELS: Final = 16
#: The adb proxy listens on an unprivileged port (well-known ports stay the node's services').
MIN_ADB_PORT: Final = 1024
#: Fields earlier v1alpha1 DevicePools had and that are refused now, with why.
REMOVED_FIELDS: Final = {
    "bridgeImage": "the device-bridge image is the cluster admin's setting (the chart's "
    "images.deviceBridge, the operator's QPA_OPERATOR_BRIDGE_IMAGE), never a DevicePool's",
}

LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]


def _valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return len(prefix) <= 253 and 0 < len(name) <= 63 and re.fullmatch(LABEL_KEY, key) is not None


class DevicePoolSpec(_Model):
    """USB-attached phones on labelled nodes, bridged by a DaemonSet and leased one at a time."""

    # Nothing here reaches the bridge's privileges: its image, security context and volumes are
    # the operator's settings, and `nodeSelector` only narrows the admin's device nodes (see
    # `qpa_operator.builders.devicepool`).

    node_selector: dict[str, LabelValue] = Field(
        default_factory=lambda: {DEVICE_NODE_LABEL: "true"},
        max_length=MAX_NODE_LABELS,
        description="Labels of the nodes phones are attached to; must name "
        f"{DEVICE_NODE_LABEL}. The operator adds the cluster admin's device-node labels (the "
        "chart's devices.nodeSelector), so this can only narrow the device nodes.",
        json_schema_extra={
            "default": {DEVICE_NODE_LABEL: "true"},
            "x-kubernetes-validations": [
                {
                    "rule": f"'{DEVICE_NODE_LABEL}' in self",
                    "message": f"nodeSelector must contain {DEVICE_NODE_LABEL} (the device-node "
                    "label): a bridge runs only on nodes the cluster admin labelled",
                },
                {
                    # label keys: `[prefix/]name` (the prefix a DNS subdomain); the full syntax
                    # is checked by qpa.api and by the API server on the DaemonSet (a regex
                    # over map keys would exceed the CRD's CEL cost budget)
                    "rule": "self.all(k, size(k) <= 317)",
                    "message": "nodeSelector keys must be Kubernetes label keys",
                },
            ],
        },
    )
    selector: DeviceFilter = _defaulted(DeviceFilter, "Which phones join the pool.")
    adb_port: int = Field(
        default=5037,
        ge=MIN_ADB_PORT,
        le=65535,
        description="Port of the bridge pod's adb proxy (the Service's port stays 5037).",
    )
    lease_duration_seconds: int = Field(
        default=300, ge=10, le=86400, description="A lease not renewed for this long expires."
    )
    health_check: DeviceHealthCheck = _defaulted(DeviceHealthCheck, "Phone health probes.")

    @model_validator(mode="before")
    @classmethod
    def _refuse_removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in REMOVED_FIELDS.items():
                if name in data or _snake_name(name) in data:
                    raise ValueError(f"spec.{name} is no longer accepted: {why}")
        return data

    @field_validator("node_selector")
    @classmethod
    def _check_node_selector(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(key for key in value if not _valid_label_key(key))
        if bad:
            raise ValueError(f"nodeSelector keys must be Kubernetes label keys, not {bad}")
        if DEVICE_NODE_LABEL not in value:
            raise ValueError(
                f"nodeSelector must contain {DEVICE_NODE_LABEL} (the device-node label): a "
                "bridge runs only on nodes the cluster admin labelled"
            )
        return value


def _snake_name(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


PhoneState = Literal["available", "leased", "quarantined", "offline"]
DevicePoolPhase = Literal["Pending", "Ready", "Degraded", "Failed"]


class Phone(_Model):
    """One phone of the pool as the bridge last saw it."""

    serial: str = Field(min_length=1, max_length=253, description="adb serial.")
    node: str = Field(min_length=1, max_length=253, description="Node the phone is attached to.")
    model: str | None = Field(default=None, max_length=253, description="ro.product.model.")
    android_version: str | None = Field(
        default=None, max_length=63, description="ro.build.version.release."
    )
    state: PhoneState = Field(description="available, leased, quarantined or offline.")
    leased_by: str | None = Field(
        default=None, max_length=253, description="Holder of the phone's Lease."
    )
    reason: str | None = Field(
        default=None, max_length=1024, description="Why it is quarantined or offline."
    )
    last_seen: datetime | None = _timestamp("Last successful probe.")


class DevicePoolStatus(_Model):
    """The phones of a DevicePool."""

    phase: DevicePoolPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    phones: list[Phone] = Field(
        default_factory=list,
        max_length=1024,
        description="Every phone seen, by serial.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["serial"],
        },
    )
    total: int = Field(default=0, ge=0, le=1_000_000, description="Phones in the pool.")
    available: int = Field(default=0, ge=0, le=1_000_000, description="Phones free to lease.")
    leased: int = Field(default=0, ge=0, le=1_000_000, description="Phones leased.")
    quarantined: int = Field(
        default=0, ge=0, le=1_000_000, description="Phones out for bad health."
    )


class DevicePool(CustomResource):
    """USB-attached phones bridged from device nodes and leased one at a time."""

    info = KindInfo(
        kind="DevicePool",
        plural="devicepools",
        singular="devicepool",
        short_names=("qdp",),
        description="DevicePool bridges USB-attached phones on labelled nodes (a DaemonSet of "
        "adb servers) and leases each phone to one rollout at a time.",
        printer_columns=(
            PHASE_COLUMN,
            PrinterColumn(name="Phones", type="integer", json_path=".status.total"),
            PrinterColumn(name="Available", type="integer", json_path=".status.available"),
            PrinterColumn(name="Leased", type="integer", json_path=".status.leased"),
            PrinterColumn(name="Quarantined", type="integer", json_path=".status.quarantined"),
            AGE_COLUMN,
        ),
    )

    kind: Literal["DevicePool"] = "DevicePool"
    spec: DevicePoolSpec
    status: DevicePoolStatus | None = None
