"""Device verification: a task's checks answered by queries of the phone's state.

A check's `target` names a query; `#field` after it picks a value for `op: equals`:

| target | query on the phone | gives |
|---|---|---|
| `content://AUTHORITY/PATH` | `content query --uri ...` | the provider's rows |
| `foreground` | `dumpsys window` | one row: `package`, `activity` |
| `settings/NAMESPACE/KEY` | `settings get NAMESPACE KEY` | one row: `value` |
| `prop/NAME` | `getprop NAME` | one row: `value` |

`exists` / `absent` / `count` filter the rows with `where` (same suffixes as the sandbox:
`__contains`, `__icontains`, `__in`, `__ne`, `__gte`, `__lte`); `equals` compares the first
row's field (`content://...#body`, `foreground#package`, `prop/x#value`) with `expect`. Provider
values are strings, as `content query` prints them. A query the phone cannot answer fails its
check with the reason; nothing raises. `Verification.collateral` stays empty: the phone is asked
only what the checks name, so a write anywhere else cannot be seen.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Any

from qpa.contract import Check, CheckResult, Verification, VerifierSpec
from qpa.envs.device.adb import DeviceError
from qpa.envs.device.parse import parse_content_rows, parse_foreground
from qpa.envs.sandbox.verify import answer_matches, run_check

Shell = Callable[[str], str]  # runs a command that must succeed, returns stdout
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def query_command(source: str) -> str:
    """The shell line answering a check target's source; ValueError for an unknown source."""
    if source.startswith("content://"):
        return f"content query --uri {shlex.quote(source)}"
    if source == "foreground":
        return "dumpsys window"
    kind, _, rest = source.partition("/")
    if kind == "settings":
        namespace, _, key = rest.partition("/")
        if namespace in ("system", "secure", "global") and _NAME.match(key):
            return f"settings get {namespace} {key}"
    elif kind == "prop" and _NAME.match(rest):
        return f"getprop {rest}"
    raise ValueError(
        f"check target {source!r} is not a device query: use content://..., foreground, "
        "settings/NAMESPACE/KEY or prop/NAME"
    )


def rows_of(source: str, output: str) -> list[dict[str, Any]]:
    if source.startswith("content://"):
        return parse_content_rows(output)
    if source == "foreground":
        foreground = parse_foreground(output)
        return [foreground.model_dump()] if foreground else []
    value = output.strip()
    return [{"value": None if value in ("", "null") else value}]


def check_device(check: Check, shell: Shell, cache: dict[str, list[dict[str, Any]]]) -> CheckResult:
    source, _, field = check.target.partition("#")
    try:
        if source not in cache:
            cache[source] = rows_of(source, shell(query_command(source)))
    except (ValueError, DeviceError) as exc:
        return CheckResult(name=check.name, passed=False, detail=f"query failed: {exc}")
    rows = cache[source]
    if check.op == "equals":
        state = {"value": rows[0].get(field or "value") if rows else None}
        return run_check(state, check.model_copy(update={"target": "value"}))
    if check.op == "answer":
        return CheckResult(name=check.name, passed=False, detail="use the verifier's 'answer'")
    return run_check({"rows": rows}, check.model_copy(update={"target": "rows"}))


def verify_device(
    spec: VerifierSpec, shell: Shell, answer: str | None, *, finished: bool
) -> Verification:
    """Judge the phone's state (queried through `shell`) and the final answer."""
    cache: dict[str, list[dict[str, Any]]] = {}
    results = [check_device(check, shell, cache) for check in spec.checks]
    if spec.answer is not None:
        ok = answer_matches(answer, spec.answer, spec.answer_match)
        results.append(
            CheckResult(
                name="answer", passed=ok, detail=f"expected {spec.answer!r}, got {answer!r}"
            )
        )
    passed = sum(r.passed for r in results)
    progress = passed / len(results) if results else 0.0
    success = finished and bool(results) and passed == len(results)
    return Verification(
        done=finished, success=success, progress=progress, checks=results, fidelity="device"
    )


def unreachable(spec: VerifierSpec, reason: str, *, finished: bool) -> Verification:
    """Every check failed because the phone could not be asked."""
    names = [c.name for c in spec.checks] + (["answer"] if spec.answer is not None else [])
    return Verification(
        done=finished,
        success=False,
        progress=0.0,
        checks=[CheckResult(name=n, passed=False, detail=reason) for n in names or ["device"]],
        fidelity="device",
    )
