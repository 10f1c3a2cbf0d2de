"""Parts of the official PodSpec a `spec.podTemplate` carries, validated against the schema of
the Kubernetes version the chart targets (vendored by `qpa.api.podspec_vendor`).

`affinity` and an ephemeral volume's `volumeClaimTemplate` are the only structures of a pod
template not written out field by field here; their models are made from the official schema
(with bounds on every string, list and map), so pydantic refuses what the API server refuses
(the same schema embedded in the CRD), naming the path inside the part. What the schema does
not have is refused, so no structure a user invents reaches an InferenceService or a Job, and
no depth of nesting either.
An ephemeral claim may not clone another claim or a snapshot (`dataSource`, `dataSourceRef`):
a pod would read another workload's data through it.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib.resources import files
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    WithJsonSchema,
    create_model,
)

from qpa.api.v1alpha1.base import MAX_MAP_ENTRIES

CLONE_MESSAGE: Final = (
    "an ephemeral volume's claim may not be made from another claim or a snapshot "
    "(dataSource, dataSourceRef): the pod would read data that is not its own"
)
_VENDORED: Final = "podspec-v1.29.0.json"


@functools.cache
def official(part: str) -> dict[str, Any]:
    """The vendored structural schema of `part` (`affinity`, `persistentVolumeClaimSpec`)."""
    text = files("qpa.api.v1alpha1").joinpath("schemas", _VENDORED).read_text()
    schema: dict[str, Any] = json.loads(text)["schemas"][part]
    return schema


def _claim_template_schema() -> dict[str, Any]:
    spec = copy.deepcopy(official("persistentVolumeClaimSpec"))
    spec["x-kubernetes-validations"] = [
        {"rule": "!has(self.dataSource) && !has(self.dataSourceRef)", "message": CLONE_MESSAGE}
    ]
    string_map = {
        "type": "object",
        "additionalProperties": {"type": "string", "maxLength": 1024},
        "maxProperties": MAX_MAP_ENTRIES,
    }
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {"labels": string_map, "annotations": string_map},
            },
            "spec": spec,
        },
    }


class OfficialPart(BaseModel):
    """Base of the models made from the official schema: unknown keys refused."""

    model_config = ConfigDict(extra="forbid")


def _model_of(schema: dict[str, Any], name: str, drop: frozenset[str]) -> Any:
    """The pydantic type of a structural schema node: a model per object (unknown keys refused,
    so an error's location is the path inside the part), bounded lists, maps and strings."""
    if schema.get("x-kubernetes-int-or-string"):
        return (
            Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
            | Annotated[str, Field(max_length=schema.get("maxLength", 64))]
        )
    kind = schema.get("type")
    if kind == "string":
        if schema.get("enum"):
            return Literal[tuple(schema["enum"])]
        return Annotated[str, Field(max_length=schema["maxLength"])]
    if kind == "integer":
        return Annotated[StrictInt, Field(ge=schema["minimum"], le=schema["maximum"])]
    if kind == "boolean":
        return StrictBool
    if kind == "number":
        return float
    if kind == "array":
        item = _model_of(schema["items"], name + "Item", drop)
        return Annotated[list[item], Field(max_length=schema["maxItems"])]  # type: ignore[valid-type]
    if "properties" not in schema:  # a map
        value = _model_of(schema["additionalProperties"], name + "Value", drop)
        return Annotated[dict[str, value], Field(max_length=schema["maxProperties"])]  # type: ignore[valid-type]
    required = set(schema.get("required", ()))
    fields: dict[str, Any] = {}
    for key, sub in schema["properties"].items():
        if key in drop:
            continue
        annotation = _model_of(sub, name + key[:1].upper() + key[1:], drop)
        fields[key] = (annotation, ...) if key in required else (annotation | None, None)
    return create_model(name, __base__=OfficialPart, **fields)


@functools.cache
def _parts() -> dict[str, Any]:
    claim = _claim_template_schema()
    return {
        "affinity": (official("affinity"), _model_of(official("affinity"), "Affinity", _NONE)),
        "volumeClaimTemplate": (
            claim,
            _model_of(claim, "VolumeClaimTemplate", frozenset({"dataSource", "dataSourceRef"})),
        ),
    }


_NONE: Final = frozenset[str]()


def _dump(value: Any) -> Any:
    return value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value


def part_type(part: str, description: str) -> Any:
    """The type of a field that is official part `part` (`affinity`, `volumeClaimTemplate`):
    validated field by field, dumped as the plain dict a pod spec takes, described in the CRD
    by the vendored schema."""
    schema, model = _parts()[part]
    return Annotated[
        model,
        PlainSerializer(_dump, return_type=dict[str, Any]),
        WithJsonSchema({**copy.deepcopy(schema), "description": description}),
    ]
