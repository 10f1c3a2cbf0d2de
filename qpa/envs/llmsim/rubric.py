"""`judge_rubric`: a chat model judges rubric items; one loop for every environment that does so.

The `llm_sim` and `mcp` environments build their own judge prompt and context, then hand the
conversation here. The judge must answer `{"verdicts": [{"item", "passed", "reason"}]}`
(`VERDICT_SCHEMA`); an unusable reply is sent back with the problem (`RETRY_JUDGE`) and asked
again, keeping the verdicts already usable. An unreachable judge, or verdicts still missing after
the last try, fail their items with the reason; nothing raises. The reply is only ever parsed as
JSON and validated: it is data, never instructions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from jsonschema import Draft202012Validator

from qpa.contract import CheckResult
from qpa.envs.llmsim.client import ChatError
from qpa.envs.schema_errors import describe_schema_errors

__all__ = ["RETRY_JUDGE", "VERDICT_SCHEMA", "UnusableVerdict", "judge_rubric", "parse_verdicts"]

RETRY_JUDGE = (
    "Your reply was invalid: {problem}. Answer again with only the JSON object "
    '{{"verdicts": [...]}}, one verdict per rubric item 1..{n}.'
)

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["verdicts"],
    "properties": {
        "verdicts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["item", "passed"],
                "properties": {
                    "item": {"type": "integer", "minimum": 1},
                    "passed": {"type": "boolean"},
                    "reason": {"type": "string"},
                },
            },
        }
    },
}
_VERDICT_VALIDATOR = Draft202012Validator(VERDICT_SCHEMA)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)


class UnusableVerdict(Exception):
    """A judge reply that cannot be used; the message goes back to the judge on retry."""


def parse_verdicts(
    text: str, count: int, partial: dict[int, tuple[bool, str]], *, max_chars: int | None = None
) -> dict[int, tuple[bool, str]]:
    """Verdicts by item number (1..`count`) added to `partial`.

    Raises `UnusableVerdict` for a reply that is too long, not a JSON object, breaks
    `VERDICT_SCHEMA` or leaves items without a verdict; usable verdicts stay in `partial`.
    """
    if max_chars is not None and len(text) > max_chars:
        raise UnusableVerdict(f"the reply is longer than {max_chars} characters")
    body = text.strip()
    fenced = _FENCE.match(body)
    try:
        value = json.loads(fenced.group(1).strip() if fenced else body)
    except ValueError as exc:
        raise UnusableVerdict(f"the reply is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UnusableVerdict(f"the reply must be a JSON object, not {type(value).__name__}")
    errors = list(_VERDICT_VALIDATOR.iter_errors(value))
    if errors:
        raise UnusableVerdict(describe_schema_errors(errors, noun="field", root="<reply>"))
    for verdict in value["verdicts"]:
        item = verdict["item"]
        if 1 <= item <= count:
            partial[item] = (verdict["passed"], str(verdict.get("reason", "")))
    missing = [i for i in range(1, count + 1) if i not in partial]
    if missing:
        raise UnusableVerdict(f"no verdict for items {', '.join(map(str, missing))}")
    return partial


def judge_rubric(
    ask: Callable[[list[dict[str, Any]]], str],
    rubric: Sequence[str],
    messages: list[dict[str, Any]],
    *,
    retries: int,
    max_chars: int | None = None,
) -> list[CheckResult]:
    """One `CheckResult` per rubric item, judged by `ask` (the judge's reply text to `messages`).

    `ask` raises `ChatError` when the judge cannot be reached; that ends the judging. Each
    unusable reply is retried up to `retries` times.
    """
    verdicts: dict[int, tuple[bool, str]] = {}
    problem = ""
    for _ in range(retries + 1):
        try:
            text = ask(messages)
        except ChatError as exc:
            problem = f"judge unreachable: {exc}"
            break
        try:
            verdicts = parse_verdicts(text, len(rubric), verdicts, max_chars=max_chars)
            problem = ""
            break
        except UnusableVerdict as exc:
            problem = str(exc)
            messages = [
                *messages,
                {"role": "assistant", "content": text[:2000]},
                {"role": "user", "content": RETRY_JUDGE.format(problem=problem, n=len(rubric))},
            ]
    results = []
    for i, text in enumerate(rubric, 1):
        if i in verdicts:
            passed, reason = verdicts[i]
            results.append(CheckResult(name=text, passed=passed, detail=reason))
        else:
            reason = problem or "the judge gave no verdict for this item"
            results.append(
                CheckResult(name=text, passed=False, detail=f"no usable verdict: {reason}")
            )
    return results
