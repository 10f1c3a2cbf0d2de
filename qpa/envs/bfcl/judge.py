"""BFCL's own judge on an episode: `multi_turn_checker` over the calls made, turn by turn.

The checker (`bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker.multi_turn_checker`)
re-executes the model's call strings and the ground truth's on fresh backends, and after every
turn whose ground truth is not empty compares the backends' public state and checks that the
ground truth's results are among the model's. qpa hands it each call as one step of its turn
(`[[call], [call], ...]`), as BFCL's harness records a model that makes one call per step.

How the checker keeps its backends, in bfcl-eval 2026.3.23 (`multi_turn_utils.
execute_multi_turn_func_call`): as globals of the `multi_turn_utils` module named
`<model_name>[_ground_truth]_eval_<entry id>_<class>_instance`, reused by every later call with
the same name. A run here gets a model name of its own (`qpa_bfcl_<uuid hex>`), so runs never see
each other's backends; its globals are deleted after it (`_forget`, which relies on that naming:
a test holds it to the pinned version), and it runs `benchmark.isolated` (one at a time, pristine
defaults and long-context data), so runs in threads cannot disturb each other.

Progress: the checker stops at the first turn that fails and names no turn in every message, so
the turns it accepts are measured with the checker itself, on growing prefixes of the episode.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qpa.envs.bfcl import benchmark

_DETAIL_LIMIT = 600


@dataclass(frozen=True)
class Judgement:
    """The checker's verdict: `valid`, its `error_type` and `message` (empty when valid), a
    readable `detail`, and how many leading turns it accepts (`turns_passed`)."""

    valid: bool
    error_type: str
    message: str
    detail: str
    turns_passed: int


def _utils() -> Any:
    return importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")


def _forget(model_name: str) -> None:
    """Delete the backends a checker run left in `multi_turn_utils`' globals."""
    namespace = vars(_utils())
    for key in [k for k in namespace if k.startswith(f"{model_name}_")]:
        del namespace[key]


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 3] + "..."


def describe(result: dict[str, Any]) -> str:
    """The checker's result as one line: its error type and message, and what differed."""
    if result.get("valid"):
        return "valid: BFCL's multi_turn_checker accepts every turn"
    line = f"{result.get('error_type', 'multi_turn:unknown')}: {result.get('error_message', '')}"
    details = result.get("details")
    if isinstance(details, dict):
        if "differences" in details and isinstance(details["differences"], dict):
            line += f" (differences: {_short(details['differences'])})"
        elif "missing_items" in details:
            line += f" (missing: {_short(details['missing_items'])})"
    return line


def _run(
    found: benchmark.Entry, model: list[list[list[str]]], truth: list[list[str]]
) -> dict[str, Any]:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model_name = f"qpa_bfcl_{uuid.uuid4().hex}"
    with benchmark.isolated(extensions=True):
        try:
            result: dict[str, Any] = multi_turn_checker(
                model, truth, found.test_entry(), found.category, model_name
            )
        except Exception as exc:  # the checker asserts; a crash is a failed judgement
            result = {
                "valid": False,
                "error_type": "qpa:checker_crashed",
                "error_message": f"{type(exc).__name__}: {exc}",
            }
        finally:
            _forget(model_name)
    return result


def judge(found: benchmark.Entry, turns: Sequence[Sequence[str]]) -> Judgement:
    """BFCL's verdict on `turns` (the call strings made in each user turn; turns never reached
    are empty)."""
    n = len(found.ground_truth)
    model = [[[call] for call in turns[i]] if i < len(turns) else [] for i in range(n)]
    truth = [list(t) for t in found.ground_truth]
    result = _run(found, model, truth)
    valid = bool(result.get("valid"))
    passed = n
    if not valid:
        passed = 0
        for k in range(1, n):
            if not _run(found, model[:k], truth[:k]).get("valid"):
                break
            passed = k
    return Judgement(
        valid=valid,
        error_type="" if valid else str(result.get("error_type", "")),
        message="" if valid else str(result.get("error_message", "")),
        detail=describe(result),
        turns_passed=passed,
    )
