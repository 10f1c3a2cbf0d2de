"""A small evaluator for the subset of CEL that Kubernetes validation rules use (test-only).

The test API server (tests/fakes/kube_api.py) enforces the `x-kubernetes-validations` rules of
the CRDs with it, so a custom resource that breaks a cross-field rule gets the same 422 as from a
real API server. It covers what `qpa.api` generates and a little more:

- literals: int, double, string ('..' and ".."), bool, null, lists `[..]`, maps `{k: v}`;
- `self`, `oldSelf` (transition rules), field selection `a.b`, indexing `a[0]`, `m['k']`;
- operators `! - * / % + - < <= > >= == != in && || ?:` with CEL's precedence, short-circuit
  and error absorption (`false && error` is false, `true || error` is true);
- macros `has(a.b)`, `l.all(x, p)`, `l.exists(x, p)`, `l.exists_one(x, p)`, `l.map(x, e)`,
  `l.filter(x, p)`;
- functions `size`, `int`, `double`, `string`, `startsWith`, `endsWith`, `contains`, `matches`,
  `lowerAscii`, `upperAscii`, `trim`, and the Kubernetes list library's `isSorted`, `sum`, `min`,
  `max`, `indexOf`, and the quantity library's `isQuantity`, `quantity`, `sign`, `compareTo`,
  `isGreaterThan`, `isLessThan`, `isInteger`.

Anything else is a `CelSyntaxError` (unknown syntax or function), never a silent pass: a rule
added to qpa.api that this subset cannot read makes the tests fail loudly, and then this file
grows. Semantics follow cel-go where it matters for validation: selecting an absent field is an
error ("no such key"), comparisons across types other than int/double are errors, integer
division truncates toward zero.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

__all__ = [
    "CelError",
    "CelEvalError",
    "CelSyntaxError",
    "compile_rule",
    "evaluate",
    "uses_old_self",
]


class CelError(Exception):
    """Base of CEL errors."""


class CelSyntaxError(CelError):
    """The rule is not valid CEL, or uses a part of CEL this subset does not implement."""


class CelEvalError(CelError):
    """Evaluation failed (no such key, no matching overload, index out of range...)."""


# --------------------------------------------------------------------------- lexer

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<float>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>0x[0-9a-fA-F]+|\d+)(?P<unsigned>[uU])?
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0"}
_RESERVED = {"true", "false", "null", "in"}


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, str, ident, op, end
    value: Any
    pos: int


def _lex(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise CelSyntaxError(f"unexpected character {text[pos]!r} at {pos}")
        kind = match.lastgroup
        if match.group("ws"):
            pass
        elif match.group("float"):
            tokens.append(_Tok("num", float(match.group("float")), pos))
        elif match.group("int"):
            literal = match.group("int")
            tokens.append(_Tok("num", int(literal, 16 if literal.startswith("0x") else 10), pos))
        elif match.group("string"):
            tokens.append(_Tok("str", _unquote(match.group("string")), pos))
        elif match.group("ident"):
            tokens.append(_Tok("ident", match.group("ident"), pos))
        elif kind == "op":
            tokens.append(_Tok("op", match.group("op"), pos))
        pos = match.end()
    tokens.append(_Tok("end", None, len(text)))
    return tokens


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            nxt = body[index + 1]
            if nxt not in _ESCAPES:
                raise CelSyntaxError(f"unsupported escape \\{nxt}")
            out.append(_ESCAPES[nxt])
            index += 2
        else:
            out.append(char)
            index += 1
    return "".join(out)


# --------------------------------------------------------------------------- parser

# AST nodes are tuples: (tag, ...). Tags: lit, ident, select, index, call, method, macro,
# unary, binary, and, or, cond, list, map.
Node = tuple[Any, ...]

_MACROS = {"all", "exists", "exists_one", "map", "filter"}
_BINARY_LEVELS: list[set[str]] = [
    {"==", "!=", "<", "<=", ">", ">=", "in"},
    {"+", "-"},
    {"*", "/", "%"},
]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _lex(text)
        self.index = 0

    def peek(self) -> _Tok:
        return self.tokens[self.index]

    def take(self) -> _Tok:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def accept(self, op: str) -> bool:
        token = self.peek()
        if token.kind == "op" and token.value == op:
            self.index += 1
            return True
        return False

    def expect(self, op: str) -> None:
        if not self.accept(op):
            token = self.peek()
            raise CelSyntaxError(f"expected {op!r} at {token.pos} in {self.text!r}")

    def parse(self) -> Node:
        node = self.conditional()
        if self.peek().kind != "end":
            raise CelSyntaxError(f"unexpected {self.peek().value!r} at {self.peek().pos}")
        return node

    def conditional(self) -> Node:
        node = self.logical_or()
        if self.accept("?"):
            then = self.conditional()
            self.expect(":")
            return ("cond", node, then, self.conditional())
        return node

    def logical_or(self) -> Node:
        node = self.logical_and()
        while self.accept("||"):
            node = ("or", node, self.logical_and())
        return node

    def logical_and(self) -> Node:
        node = self.binary(0)
        while self.accept("&&"):
            node = ("and", node, self.binary(0))
        return node

    def binary(self, level: int) -> Node:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while True:
            token = self.peek()
            is_op = token.kind == "op" and token.value in _BINARY_LEVELS[level]
            is_in = level == 0 and token.kind == "ident" and token.value == "in"
            if not (is_op or is_in):
                return node
            self.take()
            node = ("binary", token.value, node, self.binary(level + 1))

    def unary(self) -> Node:
        if self.accept("!"):
            return ("unary", "!", self.unary())
        if self.accept("-"):
            return ("unary", "-", self.unary())
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.accept("."):
                token = self.take()
                if token.kind != "ident":
                    raise CelSyntaxError(f"expected a field name at {token.pos}")
                if self.accept("("):
                    if token.value in _MACROS:
                        node = self.macro(token.value, node)
                    else:
                        node = ("method", token.value, node, self.arguments())
                else:
                    node = ("select", node, token.value)
            elif self.accept("["):
                key = self.conditional()
                self.expect("]")
                node = ("index", node, key)
            else:
                return node

    def macro(self, name: str, target: Node) -> Node:
        variable = self.take()
        if variable.kind != "ident" or variable.value in _RESERVED:
            raise CelSyntaxError(f"{name}() needs a variable name first")
        self.expect(",")
        body = self.conditional()
        self.expect(")")
        return ("macro", name, target, variable.value, body)

    def arguments(self) -> list[Node]:
        args: list[Node] = []
        if self.accept(")"):
            return args
        while True:
            args.append(self.conditional())
            if self.accept(")"):
                return args
            self.expect(",")

    def primary(self) -> Node:
        token = self.take()
        if token.kind in ("num", "str"):
            return ("lit", token.value)
        if token.kind == "ident":
            name = token.value
            if name == "true":
                return ("lit", True)
            if name == "false":
                return ("lit", False)
            if name == "null":
                return ("lit", None)
            if self.accept("("):
                if name == "has":
                    arg = self.conditional()
                    self.expect(")")
                    if arg[0] != "select":
                        raise CelSyntaxError("has() needs a field selection, like has(self.x)")
                    return ("has", arg[1], arg[2])
                return ("call", name, self.arguments())
            return ("ident", name)
        if token.kind == "op" and token.value == "(":
            node = self.conditional()
            self.expect(")")
            return node
        if token.kind == "op" and token.value == "[":
            items: list[Node] = []
            if not self.accept("]"):
                while True:
                    items.append(self.conditional())
                    if self.accept("]"):
                        break
                    self.expect(",")
            return ("list", items)
        if token.kind == "op" and token.value == "{":
            entries: list[tuple[Node, Node]] = []
            if not self.accept("}"):
                while True:
                    key = self.conditional()
                    self.expect(":")
                    entries.append((key, self.conditional()))
                    if self.accept("}"):
                        break
                    self.expect(",")
            return ("map", entries)
        raise CelSyntaxError(f"unexpected {token.value!r} at {token.pos} in {self.text!r}")


@lru_cache(maxsize=512)
def compile_rule(rule: str) -> Node:
    """Parse a rule (cached); raises CelSyntaxError for syntax outside the subset."""
    node = _Parser(rule).parse()
    _check_functions(node)
    return node


def uses_old_self(rule: str) -> bool:
    """True for a transition rule (it reads `oldSelf`)."""
    return _mentions(compile_rule(rule), "oldSelf")


def _mentions(node: Any, name: str) -> bool:
    if isinstance(node, tuple):
        if node[:2] == ("ident", name):
            return True
        return any(_mentions(part, name) for part in node)
    if isinstance(node, list):
        return any(_mentions(part, name) for part in node)
    return False


def _check_functions(node: Any) -> None:
    if isinstance(node, tuple) and node:
        if node[0] == "call" and node[1] not in _FUNCTIONS:
            raise CelSyntaxError(f"function {node[1]}() is not in the supported CEL subset")
        if node[0] == "method" and node[1] not in _METHODS:
            raise CelSyntaxError(f"method .{node[1]}() is not in the supported CEL subset")
        for part in node[1:]:
            _check_functions(part)
    elif isinstance(node, list):
        for part in node:
            _check_functions(part)


# --------------------------------------------------------------------------- evaluation


def evaluate(rule: str, variables: Mapping[str, Any]) -> Any:
    """Evaluate `rule` with `variables` (usually `self` and maybe `oldSelf`)."""
    return _eval(compile_rule(rule), dict(variables))


def _type_name(value: Any) -> str:
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _eval(node: Node, env: dict[str, Any]) -> Any:
    tag = node[0]
    if tag == "lit":
        return node[1]
    if tag == "ident":
        if node[1] not in env:
            raise CelEvalError(f"undeclared reference to '{node[1]}'")
        return env[node[1]]
    if tag == "select":
        target = _eval(node[1], env)
        if not isinstance(target, dict):
            raise CelEvalError(f"cannot select field '{node[2]}' from {_type_name(target)}")
        if node[2] not in target:
            raise CelEvalError(f"no such key: {node[2]}")
        return target[node[2]]
    if tag == "has":
        target = _eval(node[1], env)
        if not isinstance(target, dict):
            raise CelEvalError(f"has() on {_type_name(target)}")
        return node[2] in target
    if tag == "index":
        return _index(_eval(node[1], env), _eval(node[2], env))
    if tag == "unary":
        value = _eval(node[2], env)
        if node[1] == "!":
            if not isinstance(value, bool):
                raise CelEvalError(f"no such overload: !{_type_name(value)}")
            return not value
        if not _is_number(value):
            raise CelEvalError(f"no such overload: -{_type_name(value)}")
        return -value
    if tag in ("and", "or"):
        return _logical(tag, node[1], node[2], env)
    if tag == "cond":
        condition = _eval(node[1], env)
        if not isinstance(condition, bool):
            raise CelEvalError("a ?: condition must be a bool")
        return _eval(node[2] if condition else node[3], env)
    if tag == "binary":
        return _binary(node[1], _eval(node[2], env), _eval(node[3], env))
    if tag == "list":
        return [_eval(item, env) for item in node[1]]
    if tag == "map":
        return {_eval(key, env): _eval(value, env) for key, value in node[1]}
    if tag == "call":
        return _FUNCTIONS[node[1]](*[_eval(arg, env) for arg in node[2]])
    if tag == "method":
        target = _eval(node[2], env)
        return _METHODS[node[1]](target, *[_eval(arg, env) for arg in node[3]])
    if tag == "macro":
        return _macro(node[1], _eval(node[2], env), node[3], node[4], env)
    raise CelEvalError(f"unknown node {tag}")  # pragma: no cover


def _logical(tag: str, left_node: Node, right_node: Node, env: dict[str, Any]) -> bool:
    decisive = tag == "or"  # true decides ||, false decides &&
    error: CelEvalError | None = None
    try:
        left = _eval(left_node, env)
        if not isinstance(left, bool):
            raise CelEvalError(f"no such overload: {_type_name(left)} {tag}")
        if left is decisive:
            return decisive
    except CelEvalError as exc:
        error = exc
    right = _eval(right_node, env)
    if not isinstance(right, bool):
        raise CelEvalError(f"no such overload: {tag} {_type_name(right)}")
    if right is decisive:
        return decisive
    if error is not None:
        raise error
    return not decisive


def _index(target: Any, key: Any) -> Any:
    if isinstance(target, list):
        if not isinstance(key, int) or isinstance(key, bool):
            raise CelEvalError(f"list index must be int, not {_type_name(key)}")
        if not 0 <= key < len(target):
            raise CelEvalError(f"index out of bounds: {key}")
        return target[key]
    if isinstance(target, dict):
        if key not in target:
            raise CelEvalError(f"no such key: {key}")
        return target[key]
    raise CelEvalError(f"cannot index {_type_name(target)}")


def _equal(left: Any, right: Any) -> bool:
    if _is_number(left) and _is_number(right):
        return bool(left == right)
    if type(left) is not type(right):
        return False
    return bool(left == right)


def _binary(op: str, left: Any, right: Any) -> Any:
    if op == "==":
        return _equal(left, right)
    if op == "!=":
        return not _equal(left, right)
    if op == "in":
        if isinstance(right, list):
            return any(_equal(left, item) for item in right)
        if isinstance(right, dict):
            return left in right
        raise CelEvalError(f"no such overload: in {_type_name(right)}")
    if op in ("<", "<=", ">", ">="):
        comparable = (_is_number(left) and _is_number(right)) or (
            type(left) is type(right) and isinstance(left, str | bool)
        )
        if not comparable:
            raise CelEvalError(f"no such overload: {_type_name(left)} {op} {_type_name(right)}")
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]
    if op == "+":
        if _is_number(left) and _is_number(right):
            return left + right
        if type(left) is type(right) and isinstance(left, str | list):
            return left + right
        raise CelEvalError(f"no such overload: {_type_name(left)} + {_type_name(right)}")
    if not (_is_number(left) and _is_number(right)):
        raise CelEvalError(f"no such overload: {_type_name(left)} {op} {_type_name(right)}")
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0 and isinstance(right, int):
        raise CelEvalError("division by zero" if op == "/" else "modulus by zero")
    if isinstance(left, int) and isinstance(right, int):
        quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
        return quotient if op == "/" else left - right * quotient
    if op == "%":
        raise CelEvalError("no such overload: double % double")
    return left / right


def _macro(name: str, target: Any, variable: str, body: Node, env: dict[str, Any]) -> Any:
    if isinstance(target, dict):
        items = list(target)
    elif isinstance(target, list):
        items = target
    else:
        raise CelEvalError(f"{name}() needs a list or map, not {_type_name(target)}")

    def run(item: Any) -> Any:
        return _eval(body, {**env, variable: item})

    def predicate(item: Any) -> bool:
        value = run(item)
        if not isinstance(value, bool):
            raise CelEvalError(f"{name}() predicate must be a bool")
        return value

    if name == "all":
        return all(predicate(item) for item in items)
    if name == "exists":
        return any(predicate(item) for item in items)
    if name == "exists_one":
        return sum(1 for item in items if predicate(item)) == 1
    if name == "map":
        return [run(item) for item in items]
    return [item for item in items if predicate(item)]  # filter


def _size(value: Any) -> int:
    if isinstance(value, str | list | dict | bytes):
        return len(value)
    raise CelEvalError(f"no such overload: size({_type_name(value)})")


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise CelEvalError(f"no such overload: int({_type_name(value)})")
    try:
        return int(value)
    except ValueError as exc:
        raise CelEvalError(f"cannot convert {value!r} to int") from exc


def _to_double(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise CelEvalError(f"no such overload: double({_type_name(value)})")
    try:
        return float(value)
    except ValueError as exc:
        raise CelEvalError(f"cannot convert {value!r} to double") from exc


def _to_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise CelEvalError(f"no such overload: string({_type_name(value)})")


def _string_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def method(target: Any, *args: Any) -> Any:
        if not isinstance(target, str) or not all(isinstance(arg, str) for arg in args):
            raise CelEvalError(f"no such overload: {_type_name(target)}.{name}()")
        return fn(target, *args)

    return method


def _list_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def method(target: Any, *args: Any) -> Any:
        if not isinstance(target, list):
            raise CelEvalError(f"no such overload: {_type_name(target)}.{name}()")
        try:
            return fn(target, *args)
        except TypeError as exc:
            raise CelEvalError(f"no such overload: list.{name}(): {exc}") from exc

    return method


def _extreme(values: list[Any], pick: Callable[..., Any]) -> Any:
    if not values:
        raise CelEvalError("min/max of an empty list")
    return pick(values)


def _index_of(values: list[Any], wanted: Any) -> int:
    for index, value in enumerate(values):
        if _equal(value, wanted):
            return index
    return -1


_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(|[KMGTPE]i|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))$"
)
_QUANTITY_SCALE = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024**p) for p, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


@dataclass(frozen=True)
class Quantity:
    """A value of the Kubernetes quantity library (`quantity('500m')`), compared exactly."""

    value: Decimal


def _parse_quantity(text: Any) -> Decimal | None:
    if not isinstance(text, str):
        raise CelEvalError(f"no such overload: quantity({_type_name(text)})")
    match = _QUANTITY.match(text)
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix in _QUANTITY_SCALE:
        return Decimal(number) * _QUANTITY_SCALE[suffix]
    return Decimal(number) * Decimal(10) ** Decimal(suffix[1:])


def _quantity(text: Any) -> Quantity:
    value = _parse_quantity(text)
    if value is None:
        raise CelEvalError(f"quantities must match the regular expression: {text!r}")
    return Quantity(value)


def _quantity_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def method(target: Any, *args: Any) -> Any:
        if not isinstance(target, Quantity) or not all(isinstance(a, Quantity) for a in args):
            raise CelEvalError(f"no such overload: {_type_name(target)}.{name}()")
        return fn(target.value, *(a.value for a in args))

    return method


def _compare(left: Decimal, right: Decimal) -> int:
    return (left > right) - (left < right)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "size": _size,
    "int": _to_int,
    "double": _to_double,
    "string": _to_string,
    # the Kubernetes quantity library
    "isQuantity": lambda text: _parse_quantity(text) is not None,
    "quantity": _quantity,
}
_METHODS: dict[str, Callable[..., Any]] = {
    "size": lambda target: _size(target),
    "startsWith": _string_method("startsWith", str.startswith),
    "endsWith": _string_method("endsWith", str.endswith),
    "contains": _string_method("contains", lambda s, sub: sub in s),
    "matches": _string_method("matches", lambda s, pattern: re.search(pattern, s) is not None),
    "lowerAscii": _string_method("lowerAscii", str.lower),
    "upperAscii": _string_method("upperAscii", str.upper),
    "trim": _string_method("trim", str.strip),
    "isSorted": _list_method("isSorted", lambda v: all(a <= b for a, b in itertools.pairwise(v))),
    "sum": _list_method("sum", lambda v: sum(v)),
    "min": _list_method("min", lambda v: _extreme(v, min)),
    "max": _list_method("max", lambda v: _extreme(v, max)),
    "indexOf": _list_method("indexOf", _index_of),
    "sign": _quantity_method("sign", lambda v: _compare(v, Decimal(0))),
    "compareTo": _quantity_method("compareTo", _compare),
    "isGreaterThan": _quantity_method("isGreaterThan", lambda a, b: a > b),
    "isLessThan": _quantity_method("isLessThan", lambda a, b: a < b),
    "isInteger": _quantity_method("isInteger", lambda v: v == v.to_integral_value()),
}
