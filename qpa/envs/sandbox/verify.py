"""Evaluation of a task's `VerifierSpec` against the sandbox's final state and answer.

A check's target is `app.collection` (a list of records, or a settings dict treated as one
record). `where` filters records; a key may carry a suffix: `__contains`, `__icontains`, `__in`,
`__gte`, `__lte`, `__ne`. `exists`/`absent`/`count` count matches; `equals` compares the value at
a dotted path (`app.key.sub`) with `expect`.
"""

from __future__ import annotations

import re
from typing import Any

from qpa.contract import Check, CheckResult, CollateralWrite, Verification, VerifierSpec
from qpa.envs.sandbox.cow import FrozenList

_MISSING = object()


def _field_matches(record: dict[str, Any], key: str, expected: Any) -> bool:
    field, _, op = key.partition("__")
    value = record.get(field, _MISSING)
    if value is _MISSING:
        return op == "ne"
    if op == "":
        return bool(value == expected)
    if op == "ne":
        return bool(value != expected)
    if op == "contains":
        return isinstance(value, (str, list)) and expected in value
    if op == "icontains":
        return isinstance(value, str) and str(expected).lower() in value.lower()
    if op == "in":
        return value in expected
    if op == "gte":
        return value is not None and value >= expected
    if op == "lte":
        return value is not None and value <= expected
    raise ValueError(f"unknown filter operator '__{op}' in where key {key!r}")


def _resolve(state: dict[str, Any], path: str) -> Any:
    node: Any = state
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part, _MISSING)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def matching(state: dict[str, Any], check: Check) -> list[dict[str, Any]]:
    node = _resolve(state, check.target)
    if node is _MISSING:
        return []
    rows = node if isinstance(node, list) else [node]
    where = check.where.items()
    if isinstance(node, FrozenList):  # a copy-on-write world: narrow by an equality's index
        for key, value in where:
            if "__" not in key and value is not None:
                found = node.positions(key, value)
                if found is not None:
                    rows = [node[i] for i in found]
                break
    return [
        r for r in rows if isinstance(r, dict) and all(_field_matches(r, k, v) for k, v in where)
    ]


def run_check(state: dict[str, Any], check: Check) -> CheckResult:
    if check.op == "equals":
        value = _resolve(state, check.target)
        shown = "<missing>" if value is _MISSING else repr(value)
        return CheckResult(name=check.name, passed=value == check.expect, detail=f"value {shown}")
    count = len(matching(state, check))
    if check.op == "exists":
        passed = count >= 1
    elif check.op == "absent":
        passed = count == 0
    else:  # count
        passed = count == check.expect
    return CheckResult(name=check.name, passed=passed, detail=f"{count} matching")


_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")


def answer_matches(answer: str | None, expected: str, how: str) -> bool:
    if answer is None:
        return False
    got, want = answer.strip().lower(), expected.strip().lower()
    if how == "exact":
        return got == want
    if how == "number":
        numbers = [n.replace(",", "") for n in _NUMBER.findall(got)]
        try:
            return any(abs(float(n) - float(want)) < 1e-6 for n in numbers)
        except ValueError:
            return False
    if how == "all_of":
        return all(part.strip() in got for part in want.split("|"))
    return want in got


def verify_state(
    spec: VerifierSpec,
    state: dict[str, Any],
    answer: str | None,
    *,
    finished: bool,
    collateral: list[CollateralWrite] | None = None,
) -> Verification:
    """Run the checks; `collateral` (the writes the checks do not explain) fails the task: a
    failed `no_collateral_writes` check names them, and progress is 0 (no partial credit, in
    scores or rewards, for an episode that did what nobody asked)."""
    results = [run_check(state, check) for check in spec.checks]
    if spec.answer is not None:
        ok = answer_matches(answer, spec.answer, spec.answer_match)
        results.append(
            CheckResult(
                name="answer", passed=ok, detail=f"expected {spec.answer!r}, got {answer!r}"
            )
        )
    collateral = collateral or []
    if collateral:
        results.append(
            CheckResult(name=COLLATERAL_CHECK, passed=False, detail=describe_collateral(collateral))
        )
    passed = sum(r.passed for r in results)
    progress = passed / len(results) if results and not collateral else 0.0
    success = finished and bool(results) and passed == len(results)
    return Verification(
        done=finished, success=success, progress=progress, checks=results, collateral=collateral
    )


COLLATERAL_CHECK = "no_collateral_writes"


def describe_collateral(collateral: list[CollateralWrite], limit: int = 5) -> str:
    """One line naming the unrequested writes (the first `limit`, then how many more)."""
    shown = [
        f"{c.change} {c.target}"
        + (f"[{c.record_id}]" if c.record_id is not None else "")
        + (f" by {c.tool}" if c.tool else "")
        for c in collateral[:limit]
    ]
    more = len(collateral) - limit
    return (
        f"{len(collateral)} unrequested write(s): "
        + ", ".join(shown)
        + (f", and {more} more" if more > 0 else "")
    )
