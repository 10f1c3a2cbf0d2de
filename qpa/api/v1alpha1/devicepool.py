"""DevicePool: its spec, status and custom resource model."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from qpa.api.v1alpha1.base import (
    IMAGE,
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

    serials: list[str] = _list_set("Only phones with these adb serials.")
    models: list[str] = _list_set("Only these models (ro.product.model).")
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
        default=600, ge=0, description="How long a quarantined phone stays out of the pool."
    )

    RULES = (
        CrossFieldRule(
            cel="self.timeoutSeconds < self.intervalSeconds",
            message="timeoutSeconds must be below intervalSeconds",
            check=lambda m: m.timeout_seconds < m.interval_seconds,
        ),
    )


class DevicePoolSpec(_Model):
    """USB-attached phones on labelled nodes, bridged by a DaemonSet and leased one at a time."""

    node_selector: dict[str, str] = Field(
        default_factory=lambda: {"qpa.ai/device-node": "true"},
        description="Labels of the nodes phones are attached to.",
        json_schema_extra={"default": {"qpa.ai/device-node": "true"}},
    )
    selector: DeviceFilter = _defaulted(DeviceFilter, "Which phones join the pool.")
    bridge_image: str | None = Field(
        default=None,
        pattern=IMAGE,
        description="Device-bridge image (adb server); default: the operator's "
        "(the chart's images.deviceBridge).",
    )
    adb_port: int = Field(default=5037, ge=1, le=65535, description="adb server port per node.")
    lease_duration_seconds: int = Field(
        default=300, ge=10, le=86400, description="A lease not renewed for this long expires."
    )
    health_check: DeviceHealthCheck = _defaulted(DeviceHealthCheck, "Phone health probes.")


PhoneState = Literal["available", "leased", "quarantined", "offline"]
DevicePoolPhase = Literal["Pending", "Ready", "Degraded", "Failed"]


class Phone(_Model):
    """One phone of the pool as the bridge last saw it."""

    serial: str = Field(min_length=1, description="adb serial.")
    node: str = Field(min_length=1, description="Node the phone is attached to.")
    model: str | None = Field(default=None, description="ro.product.model.")
    android_version: str | None = Field(default=None, description="ro.build.version.release.")
    state: PhoneState = Field(description="available, leased, quarantined or offline.")
    leased_by: str | None = Field(default=None, description="Holder of the phone's Lease.")
    reason: str | None = Field(default=None, description="Why it is quarantined or offline.")
    last_seen: datetime | None = _timestamp("Last successful probe.")


class DevicePoolStatus(_Model):
    """The phones of a DevicePool."""

    phase: DevicePoolPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    phones: list[Phone] = Field(
        default_factory=list,
        description="Every phone seen, by serial.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["serial"],
        },
    )
    total: int = Field(default=0, ge=0, description="Phones in the pool.")
    available: int = Field(default=0, ge=0, description="Phones free to lease.")
    leased: int = Field(default=0, ge=0, description="Phones leased.")
    quarantined: int = Field(default=0, ge=0, description="Phones out for bad health.")


class DevicePool(CustomResource):
    """USB-attached phones bridged from device nodes and leased one at a time."""

    info = KindInfo(
        kind="DevicePool",
        plural="devicepools",
        singular="devicepool",
        short_names=("dp",),
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
