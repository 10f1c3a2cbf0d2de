"""Value swaps: SFT rows whose copied values are exchanged for others the same argument takes.

A planner trained from scratch on a few hundred episodes (the `local` preset's tiny model)
learns the values it sees most often instead of copying them: asked to save "Yusuf Patel" it
saves the mixture's most frequent name. A *value swap* is a copy of a conversation in which
every value the assistant's calls copied (an argument string or integer that also appears,
whole, in what the model read: the user's turns, tool results, the remembered facts) is
replaced, in every message it appears in, by another value the same tool argument takes
elsewhere in the mixture. The copy reads as consistently as the original (the instruction, the
tool results and the call all name the new value), but the value can no longer be predicted
from anything except the context, so copying is the only way to learn it.

Values the model computes (a date from "Friday, March 6") never appear whole in the context
and are left as they are; so is the system prompt outside the remembered facts (tool schemas
and Skills quote example values). A conversation is left out when one copied value contains
another (a search for "Yusuf" and the contact "Yusuf Patel" would be swapped apart), or when
no value of its arguments can be exchanged without colliding with text already in it.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qpa.harness.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = ["copied_values", "swap_values"]

MEMORY_HEADER = "# What you remember about the user"
_CALL = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"\s*(\{.*?\})\s*" + re.escape(TOOL_CALL_CLOSE), re.S
)
_MIN_CHARS = 2  # a one-character value ("5") matches too much unrelated text to swap safely

Slot = tuple[str, str]  # (tool, argument)


def _bounded(value: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(value) + r"(?![A-Za-z0-9])")


def _calls(content: str) -> Iterable[tuple[str, dict[str, Any]]]:
    for match in _CALL.finditer(content):
        try:
            payload = json.loads(match.group(1))
        except ValueError:
            continue
        name, arguments = payload.get("name"), payload.get("arguments")
        if isinstance(name, str) and isinstance(arguments, dict):
            yield name, arguments


def _as_text(value: Any) -> str | None:
    """The value as it is written in the call's JSON and in plain text alike, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str) and json.dumps(value)[1:-1] == value:
        text = value.strip()
        if text != value:
            return None
    else:
        return None
    return text if len(text) >= _MIN_CHARS else None


def _memory_span(system: str) -> tuple[int, int]:
    """Where the remembered facts are in a system prompt ((0, 0) when it has none)."""
    start = system.find(MEMORY_HEADER)
    if start < 0:
        return 0, 0
    end = system.find("\n\n# ", start + len(MEMORY_HEADER))
    return start, len(system) if end < 0 else end


def _readable(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the model read as context: user and tool turns, and the remembered facts."""
    texts: list[str] = []
    for message in messages:
        content = str(message.get("content") or "")
        if message.get("role") == "system":
            start, end = _memory_span(content)
            texts.append(content[start:end])
        elif message.get("role") != "assistant":
            texts.append(content)
    return texts


def copied_values(messages: Sequence[Mapping[str, Any]]) -> dict[str, Slot]:
    """Each value an assistant call in `messages` copied from what was read before it, with
    the first (tool, argument) it was passed as."""
    found: dict[str, Slot] = {}
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        context = _readable(messages[:index])  # only what was read before this call
        for tool, arguments in _calls(str(message.get("content") or "")):
            for key, value in arguments.items():
                text = _as_text(value)
                if text is None or text in found:
                    continue
                pattern = _bounded(text)
                if any(pattern.search(part) for part in context):
                    found[text] = (tool, key)
    return found


def _appears(value: str, text: str) -> bool:
    """Whether `value` occurs whole in `text` (a substring test first: most values do not)."""
    return value in text and _bounded(value).search(text) is not None


def _nested(values: Iterable[str]) -> bool:
    ordered = sorted(values, key=len)
    return any(
        _bounded(short).search(long) for i, short in enumerate(ordered) for long in ordered[i + 1 :]
    )


def _replace(
    messages: Sequence[Mapping[str, Any]], mapping: dict[str, str]
) -> list[dict[str, Any]]:
    pattern = re.compile(
        r"(?<![A-Za-z0-9])("
        + "|".join(re.escape(v) for v in sorted(mapping, key=len, reverse=True))
        + r")(?![A-Za-z0-9])"
    )

    def swap(text: str) -> str:
        return pattern.sub(lambda m: mapping[m.group(1)], text)

    out: list[dict[str, Any]] = []
    for message in messages:
        content = str(message.get("content") or "")
        if message.get("role") == "system":
            start, end = _memory_span(content)
            content = content[:start] + swap(content[start:end]) + content[end:]
        else:
            content = swap(content)
        out.append({**message, "content": content})
    return out


def swap_values(
    rows: Sequence[Mapping[str, Any]], copies: int, *, seed: int = 0
) -> list[dict[str, Any]]:
    """Up to `copies` value-swapped copies of each row of `rows` (rows with a `messages` list);
    each copy's `trajectory_id` ends with `~swap<n>`. The replacement values of a (tool,
    argument) are the values it copied in any row; a replacement never already appears in the
    conversation. Seeded: the same rows and seed give the same copies."""
    if copies <= 0:
        return []
    found = [copied_values(row["messages"]) for row in rows]
    pools: dict[Slot, list[str]] = {}
    for values in found:
        for text, slot in values.items():
            pool = pools.setdefault(slot, [])
            if text not in pool:
                pool.append(text)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for row, values in zip(rows, found, strict=True):
        if not values or _nested(values):
            continue
        whole = "\n".join(str(m.get("content") or "") for m in row["messages"])
        free = {
            text: [v for v in pools[slot] if v != text and not _appears(v, whole)]
            for text, slot in values.items()
        }
        for n in range(copies):
            mapping: dict[str, str] = {}
            for text, candidates in free.items():
                options = [v for v in candidates if v not in mapping.values()]
                if options:
                    mapping[text] = rng.choice(options)
            if not mapping or _nested([*values, *mapping.values()]):
                continue
            out.append(
                {
                    **row,
                    "messages": _replace(row["messages"], mapping),
                    "trajectory_id": f"{row['trajectory_id']}~swap{n}",
                }
            )
    return out
