"""What an API server does with a custom resource's body before storing it (test-only).

Given a CRD's `openAPIV3Schema`, `CustomResourceSchema` runs the apiextensions pipeline:

1. **prune** unknown fields (except under `x-kubernetes-preserve-unknown-fields`) and nulls of
   fields that are not `nullable`, reporting the unknown paths (for `fieldValidation`);
2. **default** missing fields top-down from `default`;
3. **validate** with `jsonschema` (Draft 4, the dialect of OpenAPI v3.0) plus what JSON Schema
   lacks: `x-kubernetes-list-type` set/map uniqueness and `x-kubernetes-validations` CEL rules
   (with `oldSelf` for transition rules on updates), evaluated by `fakes.kube_cel`.

Errors are `FieldError`s worded like the real server's, e.g.
`spec.parallelism: Invalid value: 0: spec.parallelism in body should be greater than or equal
to 1`, so a 422 names the field path exactly as `kubectl apply` would print it. CEL rules are
evaluated only when the object passes the OpenAPI checks (a real server may report both).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson

from fakes.kube_cel import CelError, evaluate, uses_old_self

__all__ = [
    "CustomResourceSchema",
    "FieldError",
    "compiled_schema",
    "field_errors",
    "format_path",
    "go_value",
]


@dataclass(frozen=True)
class FieldError:
    """One field error of a 422 Invalid answer (a `StatusCause`)."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    detail: str  # the message without the field path

    @property
    def message(self) -> str:
        return f"{self.field}: {self.detail}" if self.field else self.detail

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.detail, "field": self.field}


def format_path(parts: Iterator[Any] | list[Any] | tuple[Any, ...]) -> str:
    """`("spec", "datasets", 0, "uri")` -> `spec.datasets[0].uri` (how the server names fields)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def go_value(value: Any) -> str:
    """A value as Go's `%#v`-ish rendering in field errors: strings quoted, numbers bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    return json.dumps(_type_of(value))


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _to_jsonschema(node: Any) -> Any:
    """Translate the Kubernetes dialect (nullable, int-or-string) into plain Draft 4."""
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties",):
            out[key] = {name: _to_jsonschema(prop) for name, prop in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, Mapping):
            out[key] = _to_jsonschema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [_to_jsonschema(option) for option in value]
        elif key == "default" or key.startswith("x-kubernetes-"):
            continue  # applied by us, not by jsonschema
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        out.pop("anyOf", None)
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    out.pop("nullable", None)
    return out


class CustomResourceSchema:
    """The validation pipeline of one CRD version."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = copy.deepcopy(dict(schema))
        self._validator = jsonschema.Draft4Validator(
            _to_jsonschema(self.schema), format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER
        )

    # ------------------------------------------------------------------ pruning

    def prune(self, obj: dict[str, Any]) -> list[str]:
        """Drop unknown fields and non-nullable nulls in place; returns the unknown paths."""
        unknown: list[str] = []
        self._prune(obj, self.schema, [], unknown, root=True)
        return unknown

    def _prune(
        self,
        value: Any,
        schema: Mapping[str, Any],
        path: list[Any],
        unknown: list[str],
        *,
        root: bool,
    ) -> None:
        if isinstance(value, dict):
            props = schema.get("properties")
            extra = schema.get("additionalProperties")
            preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
            for key in list(value):
                if root and key in ("apiVersion", "kind", "metadata"):
                    continue
                if props is not None and key in props:
                    sub: Mapping[str, Any] | None = props[key]
                elif isinstance(extra, Mapping):
                    sub = extra
                elif preserve or extra is True:
                    continue
                else:
                    unknown.append(format_path([*path, key]))
                    del value[key]
                    continue
                assert sub is not None
                if value[key] is None and not sub.get("nullable", False):
                    del value[key]
                    continue
                self._prune(value[key], sub, [*path, key], unknown, root=False)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            for index, item in enumerate(value):
                self._prune(item, schema["items"], [*path, index], unknown, root=False)

    # ------------------------------------------------------------------ defaulting

    def default(self, obj: dict[str, Any]) -> None:
        """Fill in `default`s in place, top-down (a default is itself defaulted further)."""
        self._default(obj, self.schema)

    def _default(self, value: Any, schema: Mapping[str, Any]) -> None:
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key) or (extra if isinstance(extra, Mapping) else None)
                if sub is not None and item is not None:
                    self._default(item, sub)
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            for item in value:
                self._default(item, schema["items"])

    # ------------------------------------------------------------------ validation

    def validate(
        self, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None
    ) -> list[FieldError]:
        """Field errors of `obj` (after pruning and defaulting); `old` enables oldSelf rules."""
        errors = [
            field_error
            for error in self._validator.iter_errors(obj)
            for field_error in self._field_error(error)
        ]
        errors += list(self._list_types(obj, self.schema, []))
        if not errors:
            errors += list(self._cel(obj, self.schema, [], old, old is not None))
        unique: dict[str, FieldError] = {}
        for error in errors:
            unique.setdefault(error.message, error)
        return sorted(unique.values(), key=lambda e: (e.field, e.detail))

    def _field_error(self, error: jsonschema.ValidationError) -> list[FieldError]:
        return field_errors(error)

    def _list_types(
        self, value: Any, schema: Mapping[str, Any], path: list[Any]
    ) -> Iterator[FieldError]:
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key) or (extra if isinstance(extra, Mapping) else None)
                if sub is not None:
                    yield from self._list_types(item, sub, [*path, key])
        elif isinstance(value, list):
            list_type = schema.get("x-kubernetes-list-type")
            seen: set[str] = set()  # identities as canonical JSON: linear in the list's size
            for index, item in enumerate(value):
                if list_type == "set":
                    identity: Any = item
                elif list_type == "map":
                    keys = schema.get("x-kubernetes-list-map-keys") or []
                    identity = {k: item.get(k) for k in keys} if isinstance(item, dict) else item
                else:
                    identity = None
                if list_type in ("set", "map"):
                    key = json.dumps(identity, sort_keys=True)
                    if key in seen:
                        shown = go_value(item) if list_type == "set" else _go_map(identity)
                        yield FieldError(
                            format_path([*path, index]),
                            "FieldValueDuplicate",
                            f"Duplicate value: {shown}",
                        )
                    seen.add(key)
                items = schema.get("items")
                if isinstance(items, Mapping):
                    yield from self._list_types(item, items, [*path, index])

    def _cel(
        self, value: Any, schema: Mapping[str, Any], path: list[Any], old: Any, has_old: bool
    ) -> Iterator[FieldError]:
        for rule in schema.get("x-kubernetes-validations") or []:
            text = rule["rule"]
            if uses_old_self(text) and not has_old:
                continue
            field = format_path([*path, *_field_path(rule.get("fieldPath", ""))])
            variables = {"self": value, "oldSelf": old} if has_old else {"self": value}
            try:
                result = evaluate(text, variables)
            except CelError as exc:
                yield FieldError(
                    field,
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(_type_of(value))}: {exc} evaluating rule: {text}",
                )
                continue
            if result is not True:
                message = rule.get("message") or f"failed rule: {text}"
                reason = rule.get("reason", "FieldValueInvalid")
                if reason == "FieldValueForbidden":
                    yield FieldError(field, reason, f"Forbidden: {message}")
                elif reason == "FieldValueRequired":
                    yield FieldError(field, reason, f"Required value: {message}")
                else:
                    shown = json.dumps(_type_of(value))
                    yield FieldError(field, reason, f"Invalid value: {shown}: {message}")
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key) or (extra if isinstance(extra, Mapping) else None)
                if sub is None or item is None:
                    continue
                child_has_old = has_old and isinstance(old, dict) and key in old
                yield from self._cel(
                    item, sub, [*path, key], old.get(key) if child_has_old else None, child_has_old
                )
        elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
            items = schema["items"]
            old_items = _correlate(schema, old if has_old else None)
            for index, item in enumerate(value):
                match = old_items.get(_map_key(schema, item)) if old_items is not None else None
                yield from self._cel(item, items, [*path, index], match, match is not None)


def compiled_schema(schema: Mapping[str, Any]) -> CustomResourceSchema:
    """The pipeline of a schema, compiled once per process (every test server installs the
    same CRDs; KServe's InferenceService schema alone takes half a second to compile)."""
    return _compiled(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


@functools.lru_cache(maxsize=64)
def _compiled(text: bytes) -> CustomResourceSchema:
    return CustomResourceSchema(orjson.loads(text))


def field_errors(error: jsonschema.ValidationError) -> list[FieldError]:
    """The `FieldError`s of one jsonschema error, worded like the API server's."""
    parts = list(error.absolute_path)
    path = format_path(parts)
    keyword = error.validator
    value = error.instance
    limit = error.validator_value
    if keyword == "required":
        missing = [name for name in limit if isinstance(value, dict) and name not in value]
        return [
            FieldError(format_path([*parts, name]), "FieldValueRequired", "Required value")
            for name in missing
        ]
    if keyword == "type":
        wanted = limit if isinstance(limit, str) else " or ".join(t for t in limit if t != "null")
        return [
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f"Invalid value: {go_value(value)}: {path} in body must be of type {wanted}: "
                f"{json.dumps(_type_of(value))}",
            )
        ]
    if keyword == "enum":
        supported = ", ".join(json.dumps(option) for option in limit if option is not None)
        return [
            FieldError(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {go_value(value)}: supported values: {supported}",
            )
        ]
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if keyword == "minimum":
        relation = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
        return [_invalid(path, value, f"should be {relation} {_num(limit)}")]
    if keyword == "maximum":
        relation = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
        return [_invalid(path, value, f"should be {relation} {_num(limit)}")]
    if keyword == "pattern":
        return [_invalid(path, value, f"should match '{limit}'")]
    if keyword == "minLength":
        return [_invalid(path, value, f"should be at least {limit} chars long")]
    if keyword == "maxLength":
        return [
            FieldError(path, "FieldValueTooLong", f"Too long: may not be more than {limit} bytes")
        ]
    if keyword == "minItems":
        return [_invalid(path, len(value), f"should have at least {limit} items")]
    if keyword == "maxItems":
        return [
            FieldError(
                path,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {limit} items",
            )
        ]
    if keyword == "maxProperties":
        return [
            FieldError(
                path,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {limit} items",
            )
        ]
    if keyword == "format":
        return [
            FieldError(
                path,
                "FieldValueInvalid",
                f"Invalid value: {go_value(value)}: {path} in body must be of type {limit}: "
                f"{go_value(value)}",
            )
        ]
    return [
        FieldError(path, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {error.message}")
    ]


def _invalid(path: str, value: Any, relation: str) -> FieldError:
    return FieldError(
        path,
        "FieldValueInvalid",
        f"Invalid value: {go_value(value)}: {path} in body {relation}",
    )


def _num(value: Any) -> str:
    return json.dumps(value)


def _go_map(key: Mapping[str, Any]) -> str:
    inner = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in key.items())
    return f"map[string]interface {{}}{{{inner}}}"


def _field_path(field_path: str) -> list[str]:
    return [part for part in field_path.split(".") if part]


def _map_key(schema: Mapping[str, Any], item: Any) -> Any:
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if isinstance(item, dict):
        return json.dumps({k: item.get(k) for k in keys}, sort_keys=True)
    return json.dumps(item, sort_keys=True)


def _correlate(schema: Mapping[str, Any], old: Any) -> dict[Any, Any] | None:
    """Old items by key, for transition rules inside list-type map/set lists (as servers do)."""
    if not isinstance(old, list) or schema.get("x-kubernetes-list-type") not in ("map", "set"):
        return None
    return {_map_key(schema, item): item for item in old}
