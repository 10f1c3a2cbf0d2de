"""`judge_rubric`: the one rubric-judging loop shared by the `llm_sim` and `mcp` environments."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qpa.envs.llmsim.client import ChatError
from qpa.envs.llmsim.rubric import UnusableVerdict, judge_rubric, parse_verdicts

RUBRIC = ["booked a table", "told the user the time"]


def _verdicts(*items: tuple[int, bool]) -> str:
    return json.dumps({"verdicts": [{"item": i, "passed": p, "reason": f"r{i}"} for i, p in items]})


def test_partial_verdicts_are_kept_across_a_retry() -> None:
    replies = iter([_verdicts((1, True)), "```json\n" + _verdicts((2, False)) + "\n```"])
    seen: list[list[dict[str, Any]]] = []

    def ask(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return next(replies)

    results = judge_rubric(ask, RUBRIC, [{"role": "user", "content": "judge"}], retries=1)
    assert [(r.name, r.passed, r.detail) for r in results] == [
        ("booked a table", True, "r1"),
        ("told the user the time", False, "r2"),
    ]
    assert "no verdict for items 2" in seen[1][-1]["content"]
    assert seen[1][-2] == {"role": "assistant", "content": _verdicts((1, True))}


def test_out_of_retries_fails_missing_items_with_the_problem() -> None:
    results = judge_rubric(lambda _m: "[1]", RUBRIC, [], retries=0)
    assert all(not r.passed for r in results)
    assert results[0].detail == "no usable verdict: the reply must be a JSON object, not list"


def test_unreachable_judge_stops_at_once() -> None:
    calls = 0

    def ask(_messages: list[dict[str, Any]]) -> str:
        nonlocal calls
        calls += 1
        raise ChatError("connection refused")

    results = judge_rubric(ask, RUBRIC, [], retries=3)
    assert calls == 1
    detail = "no usable verdict: judge unreachable: connection refused"
    assert {r.detail for r in results} == {detail}


def test_parse_verdicts_names_the_bad_field_and_the_length_limit() -> None:
    bad = json.dumps({"verdicts": [{"item": 1, "passed": "yes"}]})
    with pytest.raises(UnusableVerdict, match=r"field 'verdicts\.0\.passed'"):
        parse_verdicts(bad, 1, {})
    with pytest.raises(UnusableVerdict, match="longer than 10 characters"):
        parse_verdicts(_verdicts((1, True)), 1, {}, max_chars=10)
    assert parse_verdicts(_verdicts((1, True)), 1, {}) == {1: (True, "r1")}
