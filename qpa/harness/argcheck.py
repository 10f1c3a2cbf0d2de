"""A fast yes for tool arguments that are plainly valid against their JSON Schema.

`jsonschema` builds a validator object for every keyword and property it descends into, which
costs more than the rest of a Harness turn. Tool argument schemas are almost always flat: an
object of typed properties, some required, maybe enums, bounds and arrays of typed items.
`compile_schema` turns such a schema into a checker that answers `True` only when the
arguments are valid under Draft 2020-12 (as `jsonschema` would judge them, formats unchecked as
there); anything it is unsure of (a keyword it does not know, a failed check) answers `False`,
and the caller runs `jsonschema` for the verdict and its error messages. So the fast path can
never accept what `jsonschema` would refuse: a refusal always comes from `jsonschema`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

#: Keywords that never change a verdict (annotations; `format` is not asserted by default).
_ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "format", "$comment", "deprecated"}
)
_KNOWN = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "enum", "items", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
    "maxItems", "pattern", "anyOf",
}  # fmt: skip


def _is_type(value: Any, name: str) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    if name == "null":
        return value is None
    raise ValueError(name)


#: JSON types that are exactly one Python class test each (`boolean` is `bool`; `integer` and
#: `number` need more than `isinstance`: a bool is no number, 2.0 is an integer)
_CLASSES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
    "boolean": (bool,),
}


def _typed(kinds: tuple[str, ...]) -> Check:
    if all(k in _CLASSES for k in kinds):  # one isinstance for the lot (= `_is_type` of each)
        classes = tuple(c for k in kinds for c in _CLASSES[k])
        return lambda v: isinstance(v, classes)
    return lambda v: any(_is_type(v, k) for k in kinds)


def _all(checks: list[Check]) -> Check:
    """Every check passes (one check, or two, called directly: no generator per value)."""
    if not checks:
        return lambda _: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda v: first(v) and second(v)
    return lambda v: all(c(v) for c in checks)


def _bounded(word: str, bound: float) -> Check:
    """A numeric bound (non-numbers pass: `type` judges them)."""

    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return True
        if word == "minimum":
            return bool(v >= bound)
        if word == "maximum":
            return bool(v <= bound)
        if word == "exclusiveMinimum":
            return bool(v > bound)
        return bool(v < bound)

    return check


def _sized(word: str, size: int) -> Check:
    """A length bound of strings (ASCII only: other text goes to jsonschema) or arrays."""
    strings = word.endswith("Length")
    at_least = word.startswith("min")

    def check(v: Any) -> bool:
        if strings:
            if not isinstance(v, str):
                return True
            if not v.isascii():
                return False  # code points vs. surrogates: let jsonschema count
        elif not isinstance(v, list):
            return True
        n = len(v)
        return n >= size if at_least else n <= size

    return check


def _any(branches: list[Check]) -> Check:
    return lambda v: any(b(v) for b in branches)


def _each(item: Check) -> Check:
    return lambda v: not isinstance(v, list) or all(item(x) for x in v)


def compile_schema(schema: Any) -> Check | None:
    """A checker for `schema`, or None when it uses anything this module does not handle."""
    if schema is True:
        return lambda _: True
    if not isinstance(schema, dict) or not set(schema) <= _KNOWN:
        return None
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(
            k in ("string", "integer", "number", "boolean", "array", "object", "null")
            for k in kinds
        ):
            return None
        checks.append(_typed(tuple(kinds)))
    if "enum" in schema:
        options = schema["enum"]
        if not isinstance(options, list) or not all(
            (isinstance(o, str) and o) or type(o) is int for o in options
        ):  # equality of other JSON values (1 == 1.0 == True) is jsonschema's to judge
            return None
        texts = frozenset(o for o in options if isinstance(o, str))
        # an integer option matches an integer argument only (a float or a bool goes to
        # jsonschema, which equates 1 with 1.0 but not with True)
        numbers = frozenset(o for o in options if type(o) is int)
        checks.append(
            lambda v: (isinstance(v, str) and v in texts) or (type(v) is int and v in numbers)
        )
    for word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if word in schema:
            bound = schema[word]
            if isinstance(bound, bool) or not isinstance(bound, int | float):
                return None
            checks.append(_bounded(word, bound))
    for word in ("minLength", "maxLength", "minItems", "maxItems"):
        if word in schema:
            size = schema[word]
            if isinstance(size, bool) or not isinstance(size, int):
                return None
            checks.append(_sized(word, size))
    if "pattern" in schema:  # jsonschema's own test: re.search on strings
        if not isinstance(schema["pattern"], str):
            return None
        try:
            pattern = re.compile(schema["pattern"])
        except re.error:
            return None
        checks.append(lambda v: not isinstance(v, str) or pattern.search(v) is not None)
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            return None
        branches = [compile_schema(o) for o in options]
        if any(b is None for b in branches):
            return None
        checks.append(_any([b for b in branches if b is not None]))
    if "items" in schema:
        item = compile_schema(schema["items"])
        if item is None:
            return None
        checks.append(_each(item))
    if {"properties", "required", "additionalProperties"} & set(schema):
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, dict) or not isinstance(required, list):
            return None
        if not all(isinstance(r, str) for r in required) or not isinstance(extra, bool):
            return None
        fields: dict[str, Check] = {}
        for name, sub in properties.items():
            compiled = compile_schema(sub)
            if compiled is None:
                return None
            fields[name] = compiled
        names = tuple(required)

        def object_check(v: Any) -> bool:
            if not isinstance(v, dict):
                return True  # `type` (if any) judges non-objects
            if not all(n in v for n in names):
                return False
            for key, value in v.items():
                check = fields.get(key)
                if check is None:
                    if not extra:
                        return False
                elif not check(value):
                    return False
            return True

        checks.append(object_check)
    return _all(checks)
