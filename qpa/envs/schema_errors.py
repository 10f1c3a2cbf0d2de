"""`describe_schema_errors`: JSON-schema validation errors as short phrases naming the field.

Shared by the environments that validate model-written or agent-written JSON (tool arguments,
simulated results, judge verdicts), so every one reports a bad field the same way.
"""

from __future__ import annotations

import re

from jsonschema.exceptions import ValidationError as SchemaValidationError

__all__ = ["describe_schema_errors"]


def _path(error: SchemaValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path)


def describe_schema_errors(
    errors: list[SchemaValidationError], *, noun: str = "argument", root: str = "<arguments>"
) -> str:
    """One readable phrase per problem, naming the field: `missing argument 'plate'`."""
    problems: list[str] = []
    for err in sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        where = _path(err)
        prefix = f"{where}." if where else ""
        if err.validator == "required" and isinstance(err.instance, dict):
            missing = [k for k in err.validator_value if k not in err.instance]
            problems.extend(f"missing {noun} '{prefix}{k}'" for k in missing)
        elif err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = set(err.schema.get("properties", {}))
            patterns = list(err.schema.get("patternProperties", {}))
            extra = [
                k
                for k in err.instance
                if k not in known and not any(re.search(p, k) for p in patterns)
            ]
            problems.extend(f"unexpected {noun} '{prefix}{k}'" for k in extra)
        else:
            problems.append(f"{noun} '{where or root}': {err.message}")
    return "; ".join(dict.fromkeys(problems))
