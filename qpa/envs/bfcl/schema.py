"""BFCL function docs as JSON Schema and `ToolSpec`s.

BFCL writes its parameter schemas in its own dialect: `dict` for an object, `float` for a
number, `tuple` for an array, `any` for anything, and `"default": "None"` (a string) for an
optional argument whose Python default is `None`. `json_schema` turns one into JSON Schema
(Draft 2020-12): the types renamed (`any` loses its `type`), an argument defaulting to None
accepts `null` and says `"default": null`, everything else (descriptions, `required`, `enum`,
`items`, nested `properties`) kept. A tool's top-level parameters refuse unknown arguments
(`additionalProperties: false`): BFCL's backends are Python methods that would raise on one,
and only names the schema knows ever reach the call strings the judge evaluates.

Every `ToolSpec` declares its arguments' roles (`roles`) from the reviewed `roles.yaml`; a
function it has no entry for (a read) gets `{}`: all its arguments free, declared so.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from qpa.contract import ToolSpec
from qpa.envs.bfcl import benchmark

#: BFCL's type names -> JSON Schema's (None: no type constraint).
TYPES: Mapping[str, str | None] = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "integer": "integer",
    "int": "integer",
    "string": "string",
    "str": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "null": "null",
    "any": None,
}


def json_schema(bfcl: Mapping[str, Any], *, where: str = "<parameters>") -> dict[str, Any]:
    """BFCL schema `bfcl` as JSON Schema; `ValueError` naming `where` for an unknown type."""
    out: dict[str, Any] = {}
    for key, value in bfcl.items():
        if key == "type":
            continue
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {
                name: json_schema(sub, where=f"{where}.{name}") for name, sub in value.items()
            }
        elif key == "items" and isinstance(value, Mapping):
            out[key] = json_schema(value, where=f"{where}[]")
        elif key == "additionalProperties" and isinstance(value, Mapping):
            out[key] = json_schema(value, where=f"{where}.*")
        else:
            out[key] = value
    if "type" in bfcl:
        name = bfcl["type"]
        if name not in TYPES:
            raise ValueError(f"{where}: unknown BFCL type {name!r}")
        kind = TYPES[name]
        if kind is not None:
            out["type"] = kind
    if "default" in out and (out["default"] is None or out["default"] == "None"):
        out["default"] = None
        if isinstance(out.get("type"), str) and out["type"] != "null":
            out["type"] = [out["type"], "null"]
    return out


def parameters_schema(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A function doc's parameters as a tool's JSON Schema (an object, no unknown arguments)."""
    name = str(doc.get("name", "<function>"))
    schema = json_schema(doc.get("parameters") or {"type": "dict"}, where=name)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def tool_spec(class_name: str, doc: Mapping[str, Any]) -> ToolSpec:
    """The planner's view of one BFCL function of backend class `class_name`."""
    name = str(doc["name"])
    response = doc.get("response")
    return ToolSpec(
        name=name,
        description=str(doc.get("description") or name),
        app=class_name,
        parameters=parameters_schema(doc),
        result=json_schema(response, where=f"{name}.response") if response else {},
        side_effect=benchmark.effects()[class_name][name],
        roles=dict(benchmark.roles()[class_name].get(name, {})),
    )


@functools.cache
def class_tools(class_name: str) -> tuple[ToolSpec, ...]:
    """Every function of backend class `class_name` as a `ToolSpec`, in BFCL's order (shared:
    copy before changing one)."""
    return tuple(tool_spec(class_name, doc) for doc in benchmark.func_docs(class_name))
