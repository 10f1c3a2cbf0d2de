"""The envelope every kind shares: metadata, printer columns, names (`KindInfo`), CustomResource."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from qpa.api.v1alpha1.base import (
    API_VERSION,
    DNS_SUBDOMAIN,
    GROUP,
    MAX_NAME_LENGTH,
    _Model,
)


class OwnerReference(_Model):
    """Points a child object at its owner (garbage collection, `controller` marks the owner)."""

    model_config = ConfigDict(extra="allow")

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


#: A real API server refuses more than 256 KiB of annotations (keys and values together).
MAX_ANNOTATIONS_BYTES: Final = 256 * 1024
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _key_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (`[prefix/]name`) as label and annotation keys are."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not re.match(DNS_SUBDOMAIN, prefix)):
        return f"{key!r}: prefix part must be a lowercase RFC 1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            f"{key!r}: name part must be at most 63 alphanumeric characters, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return None


class ObjectMeta(_Model):
    """Kubernetes object metadata (the fields qpa reads; others are kept as they are).

    Labels and annotations are checked as the API server checks them (qualified-name keys,
    label values of at most 63 characters, at most 256 KiB of annotations), so a resource the
    server refuses is refused here too.
    """

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(default=None, max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN)
    generate_name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            problem = _key_problem(key)
            if problem:
                raise ValueError(problem)
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise ValueError(
                    f"{key}: {value[:80]!r}: a label value must be at most 63 characters, "
                    "alphanumeric, '-', '_' or '.', starting and ending with an alphanumeric one"
                )
        return labels

    @field_validator("annotations")
    @classmethod
    def _check_annotations(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            problem = _key_problem(key.lower())  # as the server: any case is fine
            if problem:
                raise ValueError(problem)
        size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
        if size > MAX_ANNOTATIONS_BYTES:
            raise ValueError(
                f"annotations are {size} bytes; at most {MAX_ANNOTATIONS_BYTES} are allowed"
            )
        return annotations


class PrinterColumn(BaseModel):
    """A column of `kubectl get` (CRD additionalPrinterColumns)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0


AGE_COLUMN = PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp")


PHASE_COLUMN = PrinterColumn(
    name="Phase", type="string", json_path=".status.phase", description="Lifecycle phase."
)


class ScaleSubresource(BaseModel):
    """The CRD's `scale` subresource: where `kubectl scale` and an HPA read and write the size.

    Paths are JSON paths of the custom resource (`.spec.replicas.min`); the API server maps an
    `autoscaling/v1` Scale onto them.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None


class KindInfo(BaseModel):
    """How a kind is named and shown: the CRD's names, scope, printer columns, subresources."""

    model_config = ConfigDict(frozen=True)

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    description: str
    scale: ScaleSubresource | None = None

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


class CustomResource(BaseModel):
    """Envelope shared by the five kinds: apiVersion, kind, metadata, spec, status."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    info: ClassVar[KindInfo]

    api_version: Literal["qpa.ai/v1alpha1"] = API_VERSION
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server takes it (camelCase, unset fields left out)."""
        body = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        meta = body.get("metadata", {})
        for key in ("labels", "annotations", "finalizers", "ownerReferences"):
            if not meta.get(key):
                meta.pop(key, None)
        return body

    def owner_reference(self, *, controller: bool = True) -> OwnerReference:
        """An ownerReference to this object, for its children (needs metadata.uid)."""
        if not self.metadata.name or not self.metadata.uid:
            raise ValueError("an owner needs metadata.name and metadata.uid")
        return OwnerReference(
            api_version=API_VERSION,
            kind=self.info.kind,
            name=self.metadata.name,
            uid=self.metadata.uid,
            controller=controller,
            block_owner_deletion=True,
        )
