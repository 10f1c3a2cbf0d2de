"""`spec.podTemplate`: what a user may add to the pods the operator builds, on every kind.

One model for TaskBatch, RolloutPool, TrainingRun and HarnessRelease: placement (service
account, node selector, affinity, tolerations, priority and runtime class), image pull
secrets, extra volumes and mounts, extra environment variables and resources (extended ones
too: `rdma/hca`, `nvidia.com/gpu`), and the size of the pods' scratch emptyDirs. The
operator merges it into each pod with one pure function (`qpa_operator.builders.podtemplate`,
rules in docs/operator.md "Pod overrides").

What is not here cannot be set: no securityContext, host namespaces, privileged containers,
command, image or probes. Volumes are limited to the types the `restricted` Pod Security
Standard allows (configMap, secret, persistentVolumeClaim, emptyDir, ephemeral, csi), so a
`hostPath` (or any node-level volume) is refused by the API server and by pydantic alike.
Names and paths the operator uses in every pod (the `QPA_` variables, `HOME`, its volume
names, its mount points) are refused here already; the merge function refuses any other
collision with the pod it is merged into.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from qpa.api.v1alpha1 import podspec, rules
from qpa.api.v1alpha1.base import (
    CONFIG_KEY,
    MAX_MAP_ENTRIES,
    CrossFieldRule,
    LocalObjectReference,
    Name,
    Quantity,
    ResourceRequirements,
    SecretKeySelector,
    _Model,
    _snake,
)

# --------------------------------------------------------------------------- reserved names

#: Environment variables of the operator's pods start with this prefix (refused here).
RESERVED_ENV_PREFIX: Final = "QPA_"
#: Other variables the operator sets in its pods.
RESERVED_ENV: Final = (
    "HOME",
    "HF_HOME",
    "TRITON_CACHE_DIR",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "JOB_COMPLETION_INDEX",
)
#: Volume names the operator uses.
RESERVED_VOLUMES: Final = (
    "work",
    "tmp",
    "spool",
    "dshm",
    "work-order",
    "store-credentials",
    "harness-config",
    "harness-tokens",
)
#: Where the operator mounts its volumes: a user mount may not be one of them or above one.
RESERVED_MOUNTS: Final = (
    "/work",
    "/tmp",
    "/var/spool/qpa",
    "/dev/shm",
    "/dev/termination-log",
    "/etc/qpa",
    "/var/run/secrets/qpa",
    "/var/run/secrets/kubernetes.io",
)
#: Trees a user mount may not go into (the operator's read-only config and secrets).
PROTECTED_TREES: Final = ("/etc/qpa", "/var/run/secrets")

#: The volume types a user may add: those of the `restricted` Pod Security Standard.
VOLUME_SOURCES: Final = (
    "configMap",
    "secret",
    "persistentVolumeClaim",
    "emptyDir",
    "ephemeral",
    "csi",
)

ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
#: An absolute path of one or more segments, no empty segment, no trailing slash.
MOUNT_PATH = r"^(/[^/]+)+$"
#: A relative path (subPath, item path): no leading slash.
RELATIVE_PATH = r"^[^/]"
#: `.` and `..` segments (refused in every path: a path means what it says).
DOT_SEGMENT = r"(^|/)[.][.]?(/|$)"
LABEL_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

MAX_VOLUMES: Final = 32
MAX_ENV: Final = 64
MAX_TOLERATIONS: Final = 32
MAX_PULL_SECRETS: Final = 16
MAX_VALUE_LENGTH: Final = 32768


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + "/")


def mount_path_problem(path: str) -> str | None:
    """Why a user may not mount at `path` (None when it may): the same rule as the CEL one."""
    for reserved in RESERVED_MOUNTS:
        if _under(reserved, path):
            return f"is, or is above, {reserved}, where the operator mounts its own volumes"
    for tree in PROTECTED_TREES:
        if _under(path, tree):
            return f"is inside {tree}, the operator's read-only config and secrets"
    return None


# --------------------------------------------------------------------------- parts


class Toleration(_Model):
    """A taint the pods tolerate (Kubernetes `Toleration`)."""

    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Taint key. Unset (with operator Exists) tolerates every taint, which lets "
        "the pods onto any node, control plane and quarantined ones included: the operator "
        "refuses it unless the chart's podOverrides.wildcardTolerations allows it.",
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect (all effects when unset)."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="How long a NoExecute taint is tolerated (forever when unset).",
    )

    RULES = (
        CrossFieldRule(
            cel="has(self.key) || self.operator == 'Exists'",
            message="a toleration without a key needs operator Exists",
            check=lambda m: m.key is not None or m.operator == "Exists",
        ),
        CrossFieldRule(
            cel="self.operator != 'Exists' || !has(self.value)",
            message="a toleration with operator Exists takes no value",
            check=lambda m: m.operator != "Exists" or m.value is None,
        ),
        CrossFieldRule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds applies to effect NoExecute only",
            check=lambda m: m.toleration_seconds is None or m.effect == "NoExecute",
        ),
    )


class KeyToPath(_Model):
    """One key of a ConfigMap or Secret as a file of the volume."""

    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_KEY, description="The key.")
    path: str = Field(
        min_length=1,
        max_length=253,
        pattern=RELATIVE_PATH,
        description="Relative file path in the volume (no `..`).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"!self.matches('{DOT_SEGMENT}')", "message": "path: no . or .. segment"}
            ]
        },
    )

    @field_validator("path")
    @classmethod
    def _no_dots(cls, value: str) -> str:
        if re.search(DOT_SEGMENT, value):
            raise ValueError("path: no . or .. segment")
        return value


def _items() -> Any:
    return Field(default_factory=list, max_length=64, description="Keys to project (all if empty).")


def _mode() -> Any:
    return Field(default=None, ge=0, le=0o777, description="File mode bits (e.g. 0440 = 288).")


class ConfigMapVolume(_Model):
    """A ConfigMap of the namespace as files."""

    name: Name = Field(description="Name of the ConfigMap.")
    items: list[KeyToPath] = _items()
    default_mode: int | None = _mode()
    optional: bool = Field(default=False, description="Start the pod if it does not exist.")


class SecretVolume(_Model):
    """A Secret of the namespace as files (mounted by the kubelet; the operator never reads it)."""

    secret_name: Name = Field(description="Name of the Secret.")
    items: list[KeyToPath] = _items()
    default_mode: int | None = _mode()
    optional: bool = Field(default=False, description="Start the pod if it does not exist.")


class ClaimVolume(_Model):
    """A PersistentVolumeClaim of the namespace (datasets, model caches)."""

    claim_name: Name = Field(description="Name of the PersistentVolumeClaim.")
    read_only: bool = Field(default=False, description="Mount it read-only.")


class EmptyDirVolume(_Model):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] = Field(default="", description="'' (node disk) or Memory.")
    size_limit: Quantity | None = Field(
        default=None,
        description="Most it may hold (the pod's scratch size, podTemplate.scratchSizeLimit, "
        "when unset).",
    )


class EphemeralVolume(_Model):
    """A generic ephemeral volume: a PVC made from the template for the pod's life."""

    volume_claim_template: podspec.part_type(  # type: ignore[valid-type]
        "volumeClaimTemplate",
        "A PersistentVolumeClaim template (metadata and spec, checked against the official "
        "schema), as in a pod spec; it may not clone a claim or a snapshot.",
    ) = Field(description="A PersistentVolumeClaim template (metadata and spec).")


class CsiVolume(_Model):
    """An inline CSI volume (Secrets Store CSI driver, image volumes, ...)."""

    driver: Name = Field(description="CSI driver name.")
    read_only: bool = Field(default=False, description="Mount it read-only.")
    fs_type: str | None = Field(default=None, max_length=63, description="File system type.")
    volume_attributes: dict[str, Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Driver-specific attributes.",
    )
    node_publish_secret_ref: LocalObjectReference | None = Field(
        default=None, description="Secret passed to the driver's NodePublishVolume."
    )


_SOURCES_MESSAGE = (
    "a volume sets exactly one of " + ", ".join(VOLUME_SOURCES) + " (hostPath and other "
    "node-level volume types are not allowed)"
)


class Volume(_Model):
    """A volume added to the pods: one of the types the restricted Pod Security Standard allows."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_NAME,
        description="Volume name (a DNS label; not one of the operator's).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!(self in {_cel_list(RESERVED_VOLUMES)})",
                    "message": "is a volume name of the operator ("
                    + ", ".join(RESERVED_VOLUMES)
                    + "); choose another",
                }
            ]
        },
    )
    config_map: ConfigMapVolume | None = Field(default=None, description="A ConfigMap.")
    secret: SecretVolume | None = Field(default=None, description="A Secret.")
    persistent_volume_claim: ClaimVolume | None = Field(
        default=None, description="A PersistentVolumeClaim."
    )
    empty_dir: EmptyDirVolume | None = Field(default=None, description="An emptyDir.")
    ephemeral: EphemeralVolume | None = Field(
        default=None, description="A generic ephemeral volume."
    )
    csi: CsiVolume | None = Field(default=None, description="An inline CSI volume.")

    RULES = (
        CrossFieldRule(
            cel=" + ".join(f"(has(self.{s}) ? 1 : 0)" for s in VOLUME_SOURCES) + " == 1",
            message=_SOURCES_MESSAGE,
            check=lambda m: sum(getattr(m, _snake(s)) is not None for s in VOLUME_SOURCES) == 1,
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _known_source(cls, data: Any) -> Any:
        """A volume type outside the allowed ones is named (not a bare "extra input")."""
        if isinstance(data, dict):
            allowed = {"name", *VOLUME_SOURCES, *(_snake(s) for s in VOLUME_SOURCES)}
            for key in data:
                if key not in allowed:
                    raise ValueError(f"{key}: {key} volumes are not allowed; " + _SOURCES_MESSAGE)
        return data

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_VOLUMES:
            raise ValueError(
                "is a volume name of the operator (" + ", ".join(RESERVED_VOLUMES) + "); "
                "choose another"
            )
        return value


_MOUNT_RULES: list[Any] = [
    {"rule": f"!self.matches('{DOT_SEGMENT}')", "message": "mountPath: no . or .. segment"},
    *(
        {
            "rule": f"!('{reserved}' == self || '{reserved}'.startsWith(self + '/'))",
            "message": f"mountPath is, or is above, {reserved}, where the operator mounts its "
            "own volumes",
        }
        for reserved in RESERVED_MOUNTS
    ),
    *(
        {
            "rule": f"!(self == '{tree}' || self.startsWith('{tree}/'))",
            "message": f"mountPath is inside {tree}, the operator's read-only config and secrets",
        }
        for tree in PROTECTED_TREES
    ),
]


class VolumeMount(_Model):
    """Where the pods' main container mounts one of `podTemplate.volumes`."""

    name: str = Field(
        min_length=1, max_length=63, pattern=LABEL_NAME, description="A volume of podTemplate."
    )
    mount_path: str = Field(
        min_length=2,
        max_length=1024,
        pattern=MOUNT_PATH,
        description="Absolute path in the container (not at or above the operator's mounts, "
        "not inside /etc/qpa or /var/run/secrets).",
        json_schema_extra={"x-kubernetes-validations": _MOUNT_RULES},
    )
    sub_path: str | None = Field(
        default=None,
        max_length=1024,
        pattern=RELATIVE_PATH,
        description="A path inside the volume to mount instead of its root (no `..`).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"!self.matches('{DOT_SEGMENT}')", "message": "subPath: no . or .."}
            ]
        },
    )
    read_only: bool = Field(default=False, description="Mount it read-only.")

    @field_validator("mount_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if re.search(DOT_SEGMENT, value):
            raise ValueError("mountPath: no . or .. segment")
        problem = mount_path_problem(value)
        if problem:
            raise ValueError(f"mountPath {problem}")
        return value

    @field_validator("sub_path")
    @classmethod
    def _check_sub_path(cls, value: str | None) -> str | None:
        if value is not None and re.search(DOT_SEGMENT, value):
            raise ValueError("subPath: no . or ..")
        return value


class FieldSelector(_Model):
    """A field of the pod (downward API)."""

    field_path: Literal[
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.podIP",
    ] = Field(description="The pod field.")


class ResourceFieldSelector(_Model):
    """A resource request or limit of the container (downward API)."""

    resource: Literal[
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
    ] = Field(description="The container resource.")
    divisor: Quantity | None = Field(default=None, description="Unit of the value (default 1).")


class EnvVarSource(_Model):
    """Where a variable's value comes from: exactly one source."""

    secret_key_ref: SecretKeySelector | None = Field(
        default=None, description="A key of a Secret of the namespace."
    )
    config_map_key_ref: SecretKeySelector | None = Field(
        default=None, description="A key of a ConfigMap of the namespace."
    )
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource of the container."
    )

    RULES = (
        CrossFieldRule(
            cel="(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) + "
            "(has(self.fieldRef) ? 1 : 0) + (has(self.resourceFieldRef) ? 1 : 0) == 1",
            message="valueFrom sets exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
            "resourceFieldRef",
            check=lambda m: (
                sum(
                    x is not None
                    for x in (
                        m.secret_key_ref,
                        m.config_map_key_ref,
                        m.field_ref,
                        m.resource_field_ref,
                    )
                )
                == 1
            ),
        ),
    )


_ENV_MESSAGE = (
    f"is set by the operator ({RESERVED_ENV_PREFIX}* and " + ", ".join(RESERVED_ENV) + ")"
)


class EnvVar(_Model):
    """A variable added to the pods' main container (after the operator's own)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=ENV_NAME,
        description="Variable name: not one that changes how the pod's processes load code or "
        "where they connect, nor one the operator sets (`qpa.api.v1alpha1.rules`, any case).",
        json_schema_extra={"x-kubernetes-validations": list(rules.ENV_NAME_RULES)},
    )
    value: str | None = Field(
        default=None, max_length=MAX_VALUE_LENGTH, description="The value (`$(VAR)` expands)."
    )
    value_from: EnvVarSource | None = Field(default=None, description="Or where it comes from.")

    RULES = (
        CrossFieldRule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            check=lambda m: m.value is None or m.value_from is None,
        ),
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        problem = rules.env_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value


# --------------------------------------------------------------------------- the template


def _map_list(key: str) -> dict[str, Any]:
    """A list whose items are unique by `key` (the server merges and checks it so)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


class PodTemplate(_Model):
    """Additions to every pod the operator creates for the resource (docs/operator.md,
    "Pod overrides"): merged in, never replacing the operator's security, command, volumes or
    variables."""

    service_account_name: Name | None = Field(
        default=None,
        description="ServiceAccount of the pods: only one the operator's "
        "podOverrides.serviceAccounts allows; its API token is never mounted.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_MAP_ENTRIES,
        description="Node labels the pods need (the operator's own keys win).",
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": 63},
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(k, size(k) <= 316)",
                    "message": "nodeSelector: label keys are at most 316 characters",
                }
            ],
        },
    )
    affinity: (
        podspec.part_type(  # type: ignore[valid-type]
            "affinity",
            "Node and pod (anti-)affinity of the pods, checked against the official schema.",
        )
        | None
    ) = Field(default=None, description="Node and pod (anti-)affinity of the pods.")
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Taints the pods tolerate (added to the operator's).",
    )
    priority_class_name: Name | None = Field(default=None, description="PriorityClass of the pods.")
    runtime_class_name: Name | None = Field(
        default=None, description="RuntimeClass of the pods (e.g. nvidia, kata, gvisor)."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description="Secrets to pull images with (added to the chart's imagePullSecrets).",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="Volumes added to the pods (configMap, secret, persistentVolumeClaim, "
        "emptyDir, ephemeral, csi).",
        json_schema_extra=_map_list("name"),
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="Mounts of those volumes in the main container.",
        json_schema_extra=_map_list("mountPath"),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Variables added to the main container (NCCL_*, proxies, ...).",
        json_schema_extra=_map_list("name"),
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="Resources added to the main container (e.g. rdma/hca, "
        "ephemeral-storage); one the operator already sets is refused.",
    )
    scratch_size_limit: Quantity | None = Field(
        default=None,
        description="sizeLimit of each disk emptyDir of the pods (/work, /tmp, spool) that "
        "sets none (the operator's default when unset).",
    )

    RULES = (
        CrossFieldRule(
            cel="!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
            "self.volumes.exists(v, v.name == m.name))",
            message="every volumeMounts[].name must be one of podTemplate.volumes",
            check=lambda m: all(
                any(v.name == mount.name for v in m.volumes) for mount in m.volume_mounts
            ),
        ),
        CrossFieldRule(
            cel=None,  # the server enforces it through x-kubernetes-list-type: map
            message="volume names, env names and mount paths must be unique",
            check=lambda m: (
                len({v.name for v in m.volumes}) == len(m.volumes)
                and len({e.name for e in m.env}) == len(m.env)
                and len({x.mount_path for x in m.volume_mounts}) == len(m.volume_mounts)
            ),
        ),
    )

    @field_validator("node_selector")
    @classmethod
    def _check_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if len(key) > 316:
                raise ValueError("nodeSelector: label keys are at most 316 characters")
            if len(label) > 63:
                raise ValueError(f"nodeSelector.{key}: a label value is at most 63 characters")
        return value
