"""Shared pieces of the qpa.ai/v1alpha1 models: the base model, cross-field rules, patterns,
references, object store, resources and conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP: Final = "qpa.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "qpa.ai/v1alpha1"  # GROUP/VERSION, spelled out for the Literal below
CATEGORY = "qpa"

# Longest metadata.name of every kind: children are named `<name>-<suffix>` (Jobs, Services,
# Leases) and a Service name is a DNS label of at most 63 characters.
MAX_NAME_LENGTH = 52

EnvironmentKind = Literal["sandbox", "llm_sim", "device"]
Capability = Literal["tool_use", "memory", "skills", "subagent"]
Split = Literal["train", "validation", "test"]
Stage = Literal["sft", "rl"]
Planner = Literal["openai", "local", "oracle", "noisy", "noop", "greedy_wrong"]
ConditionStatus = Literal["True", "False", "Unknown"]
Offload = Literal["none", "cpu", "nvme"]

# Patterns shared by several fields (Go RE2 and Python re agree on all of them).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ARTIFACT_URI = r"^(s3|file)://\S+$"
MODEL_URI = r"^(s3|gs|pvc|hf|file)://\S+$"
HTTP_URL = r"^https?://\S+$"
# An S3 API endpoint: scheme and host name or IPv4 [:port] only (no credentials, path, query,
# IPv6 literal), which the pods' StoreConfig accepts.
S3_ENDPOINT = r"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$"
IMAGE = r"^\S+$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class CrossFieldRule:
    """A validation rule spanning several fields of one object: CEL for the server, Python here.

    `cel` is evaluated with `self` bound to the object the rule is attached to; `check` gets the
    parsed model and returns True when the object is valid. `cel=None` marks a rule the server
    enforces otherwise (a list-type) or cannot express (CEL has no index loops): Python only.
    """

    cel: str | None
    message: str
    check: Callable[[Any], bool]

    def to_k8s(self) -> dict[str, str]:
        if self.cel is None:
            raise ValueError(f"rule {self.message!r} has no CEL form")
        return {"rule": self.cel, "message": self.message}


def _immutable(message: str) -> dict[str, Any]:
    """`json_schema_extra` of a field the server must keep as created (a CEL transition rule)."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


def _add_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[CrossFieldRule, ...] = getattr(cls, "RULES", ())
    cel_rules = [rule.to_k8s() for rule in rules if rule.cel is not None]
    if cel_rules:
        schema["x-kubernetes-validations"] = cel_rules


def _s3_needs_store(field: str = "outputUri") -> CrossFieldRule:
    return CrossFieldRule(
        cel=f"!self.{field}.startsWith('s3://') || has(self.store)",
        message=f"an s3:// {field} needs store (endpoint and secretRef)",
        check=lambda m: not getattr(m, _snake(field)).startswith("s3://") or m.store is not None,
    )


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


class _Model(BaseModel):
    """Base of every spec and status model: camelCase on the wire, unknown fields are errors."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=_add_rules,
    )

    RULES: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        for rule in type(self).RULES:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase keys, JSON types, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _defaulted(model: type[_Model], description: str) -> Any:
    """A sub-object whose fields all have defaults: the server fills it in (`default: {}`)."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def _list_set(description: str, **kwargs: Any) -> Any:
    """A list of unique strings (`x-kubernetes-list-type: set`, which the server enforces)."""
    return Field(
        default_factory=list,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        **kwargs,
    )


def _check_unique(*fields: str) -> Callable[[Any], bool]:
    def check(model: Any) -> bool:
        return all(len(set(getattr(model, name))) == len(getattr(model, name)) for name in fields)

    return check


Name = Annotated[
    str,
    Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN),
]
# A Kubernetes quantity (`500m`, `1Gi`, `2`): an int-or-string on the wire.
Quantity = int | Annotated[str, Field(pattern=QUANTITY)]


# --------------------------------------------------------------------------- references


class LocalObjectReference(_Model):
    """A reference to another object in the same namespace, by name."""

    name: Name = Field(description="Name of the referenced object (same namespace).")


class SecretKeySelector(_Model):
    """One key of a Secret in the same namespace."""

    name: Name = Field(description="Name of the Secret.")
    key: str = Field(
        min_length=1, max_length=253, pattern=CONFIG_KEY, description="Key within the Secret."
    )


class ConfigMapKeySelector(_Model):
    """One key of a ConfigMap in the same namespace."""

    name: Name = Field(description="Name of the ConfigMap.")
    key: str = Field(
        default="harness.yaml",
        min_length=1,
        max_length=253,
        pattern=CONFIG_KEY,
        description="Key within the ConfigMap.",
    )


class StoreSecretRef(_Model):
    """A Secret holding S3 credentials under two keys."""

    name: Name = Field(description="Name of the Secret with the S3 credentials.")
    access_key_id_key: str = Field(
        default="accessKeyId",
        pattern=CONFIG_KEY,
        description="Key of the access key id within the Secret.",
    )
    secret_access_key_key: str = Field(
        default="secretAccessKey",
        pattern=CONFIG_KEY,
        description="Key of the secret access key within the Secret.",
    )


class ObjectStore(_Model):
    """S3-compatible object storage (MinIO, S3, SeaweedFS) that a resource reads or writes."""

    endpoint: str = Field(
        pattern=S3_ENDPOINT,
        max_length=2048,
        description="S3 API endpoint (scheme and host:port), e.g. http://minio.qpa-system:9000.",
    )
    region: str = Field(default="us-east-1", min_length=1, description="S3 region.")
    secret_ref: StoreSecretRef = Field(
        description="Secret with the credentials (never inlined in the resource)."
    )


class ResourceRequirements(_Model):
    """CPU, memory and accelerator requests and limits of each pod (Kubernetes quantities)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. {nvidia.com/gpu: 1}."
    )


# --------------------------------------------------------------------------- common status


class Condition(_Model):
    """One aspect of the resource's state, in the shape of Kubernetes `metav1.Condition`."""

    type: str = Field(
        max_length=316, pattern=CONDITION_TYPE, description="Condition type, e.g. Ready."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON,
        description="Machine-readable CamelCase reason of the last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable details of the transition."
    )
    last_transition_time: datetime = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was set for."
    )


def set_condition(
    conditions: Iterable[Condition],
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return `conditions` with `type` set; lastTransitionTime moves only when status changes."""
    moment = (now or datetime.now(UTC)).replace(microsecond=0)
    result: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.type != type:
            result.append(condition)
            continue
        found = True
        changed = condition.status != status
        result.append(
            Condition(
                type=type,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=moment if changed else condition.last_transition_time,
                observed_generation=observed_generation,
            )
        )
    if not found:
        result.append(
            Condition(
                type=type,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=moment,
                observed_generation=observed_generation,
            )
        )
    return result


def _conditions() -> Any:
    return Field(
        default_factory=list,
        description="Kubernetes-style conditions (Ready, Progressing, Failed, ...), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def _observed_generation() -> Any:
    return Field(
        default=None, ge=0, description="The .metadata.generation this status was computed for."
    )


def _timestamp(description: str) -> Any:
    return Field(default=None, description=description)
