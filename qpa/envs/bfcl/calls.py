"""BFCL's call strings (`cd(folder='document')`) to and from qpa's `ToolCall`s.

BFCL's ground truth and its judge speak Python call expressions. `parse_call` reads one with
`ast` (never `eval`): the function's name, and its arguments as JSON values, positional ones
named by the backend method's signature (`sort('final_report.pdf')` ->
`{"file_name": "final_report.pdf"}`). `format_call` writes a validated call back in BFCL's
form, every argument by keyword as a Python literal (`repr`), which is what the judge
re-executes: argument names come from the tool's schema and values are JSON data, so the
string can hold nothing but a call of that function with literal arguments.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class CallSyntaxError(ValueError):
    """A call string that is not `name(literal, ..., key=literal, ...)`."""


def _json_value(value: Any) -> Any:
    """A Python literal as JSON data (tuples and sets become lists)."""
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_value(v) for v in value]
    return value


def parse_call(text: str, parameters: Callable[[str], Sequence[str]]) -> tuple[str, dict[str, Any]]:
    """`(name, arguments)` of call string `text`; `parameters(name)` gives the function's
    parameter names in order, for positional arguments."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise CallSyntaxError(f"{text!r}: not a Python expression ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise CallSyntaxError(f"{text!r}: not a call of a named function")
    name = node.func.id
    arguments: dict[str, Any] = {}
    try:
        if node.args:
            names = parameters(name)
            if len(node.args) > len(names):
                raise CallSyntaxError(f"{text!r}: more positional arguments than {name} takes")
            for slot, arg in zip(names, node.args, strict=False):
                arguments[slot] = _json_value(ast.literal_eval(arg))
        for keyword in node.keywords:
            if keyword.arg is None:
                raise CallSyntaxError(f"{text!r}: `**` arguments are not literals")
            if keyword.arg in arguments:
                raise CallSyntaxError(f"{text!r}: argument {keyword.arg!r} given twice")
            arguments[keyword.arg] = _json_value(ast.literal_eval(keyword.value))
    except ValueError as exc:
        if isinstance(exc, CallSyntaxError):
            raise
        raise CallSyntaxError(f"{text!r}: an argument is not a literal ({exc})") from None
    return name, arguments


def non_finite(value: Any, path: str = "") -> str | None:
    """The path of a NaN or infinite number inside `value` (no Python literal writes one), or
    None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "<value>"
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = non_finite(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = non_finite(item, f"{path}[{index}]")
            if found:
                return found
    return None


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The call in BFCL's form: `name(a=1,b='x')`, keyword arguments in the given order."""
    if not name.isidentifier() or any(not str(k).isidentifier() for k in arguments):
        raise ValueError(f"{name}: function and argument names must be identifiers")
    return f"{name}({','.join(f'{key}={value!r}' for key, value in arguments.items())})"
