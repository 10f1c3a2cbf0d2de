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

Values the model computes never appear whole in the context. One kind of them is swapped too
when asked (`days=True`): a *phrased day*, an ISO day a call writes ("2026-03-10", alone or
opening a timestamp) that the context names as "March 10" ("Tuesday, March 10"). Its copy
moves the day to another phrased day of the mixture on the same weekday (so the weekday, and
every fact that hangs on it such as an alarm's days, stays true), in the ISO form and the
phrase alike; the month and day can then only be read from the instruction, not remembered.
The system prompt outside the remembered facts is left as it is (tool schemas and Skills
quote example values). A conversation is left out when one copied value contains another (a
search for "Yusuf" and the contact "Yusuf Patel" would be swapped apart), or when no value
of its arguments can be exchanged without colliding with text already in it.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from typing import Any

from qpa.harness.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = ["copied_values", "phrased_days", "swap_values"]

MEMORY_HEADER = "# What you remember about the user"
_CALL = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"\s*(\{.*?\})\s*" + re.escape(TOOL_CALL_CLOSE), re.S
)
_MIN_CHARS = 2  # a one-character value ("5") matches too much unrelated text to swap safely
_ISO_DAY = re.compile(r"(?<![0-9])(\d{4}-\d{2}-\d{2})(?![0-9])")
_BEFORE = r"(?<![A-Za-z0-9])"

Slot = tuple[str, str]  # (tool, argument)


def _bounded(value: str) -> re.Pattern[str]:
    return re.compile(_BEFORE + re.escape(value) + r"(?![A-Za-z0-9])")


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


def month_day(day: date) -> str:
    """How an instruction names `day`: "March 10" (after a weekday or not)."""
    return f"{day:%B} {day.day}"


def _day_pattern(text: str) -> re.Pattern[str]:
    """`text` (an ISO day or a "March 1" phrase) not inside a longer number: "March 1" does
    not match "March 10", "2026-03-10" does match "2026-03-10T09:00"."""
    return re.compile(_BEFORE + re.escape(text) + r"(?![0-9])")


def phrased_days(messages: Sequence[Mapping[str, Any]]) -> set[date]:
    """The days an assistant call in `messages` writes in ISO form (alone or opening a
    timestamp) while what was read before it names them as "March 10"."""
    found: set[date] = set()
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        context = _readable(messages[:index])
        for _tool, arguments in _calls(str(message.get("content") or "")):
            for value in arguments.values():
                for match in _ISO_DAY.finditer(value if isinstance(value, str) else ""):
                    try:
                        day = date.fromisoformat(match.group(1))
                    except ValueError:
                        continue
                    phrase = _day_pattern(month_day(day))
                    if any(phrase.search(part) for part in context):
                        found.add(day)
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
    messages: Sequence[Mapping[str, Any]],
    mapping: dict[str, str],
    day_mapping: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """`messages` with each key of `mapping` (as a whole word) and of `day_mapping` (ISO days
    and "March 10" phrases, not inside a longer number) replaced, in one pass."""
    days = day_mapping or {}
    alternatives = []
    if mapping:
        values = "|".join(re.escape(v) for v in sorted(mapping, key=len, reverse=True))
        alternatives.append(_BEFORE + "(?:" + values + r")(?![A-Za-z0-9])")
    if days:
        keys = "|".join(re.escape(v) for v in sorted(days, key=len, reverse=True))
        alternatives.append(_BEFORE + "(?:" + keys + r")(?![0-9])")
    pattern = re.compile("|".join(alternatives))
    table = {**days, **mapping}

    def swap(text: str) -> str:
        return pattern.sub(lambda m: table[m.group(0)], text)

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


def _day_options(
    days: set[date], pool: Mapping[int, list[date]], whole: str
) -> dict[date, list[date]]:
    """For each phrased day of a conversation, the mixture's phrased days on its weekday that
    the conversation does not mention (in either form)."""
    return {
        day: [
            other
            for other in pool.get(day.weekday(), [])
            if other != day
            and not _day_pattern(other.isoformat()).search(whole)
            and not _day_pattern(month_day(other)).search(whole)
        ]
        for day in sorted(days)
    }


def swap_values(
    rows: Sequence[Mapping[str, Any]], copies: int, *, seed: int = 0, days: bool = False
) -> list[dict[str, Any]]:
    """Up to `copies` value-swapped copies of each row of `rows` (rows with a `messages` list);
    each copy's `trajectory_id` ends with `~swap<n>`. The replacement values of a (tool,
    argument) are the values it copied in any row; a replacement never already appears in the
    conversation. With `days`, the row's phrased days move too, each to another phrased day of
    the mixture on the same weekday. Seeded: the same rows and seed give the same copies."""
    if copies <= 0:
        return []
    found_days = [phrased_days(row["messages"]) if days else set() for row in rows]
    found = [
        {
            text: slot
            for text, slot in copied_values(row["messages"]).items()
            # a phrased day moves with its phrase, never as a copied value on its own
            if not any(day.isoformat() in text for day in row_days)
        }
        for row, row_days in zip(rows, found_days, strict=True)
    ]
    pools: dict[Slot, list[str]] = {}
    for values in found:
        for text, slot in values.items():
            pool = pools.setdefault(slot, [])
            if text not in pool:
                pool.append(text)
    day_pool: dict[int, list[date]] = {}
    for day in sorted(set().union(*found_days)):
        day_pool.setdefault(day.weekday(), []).append(day)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for row, values, row_days in zip(rows, found, found_days, strict=True):
        if not (values or row_days) or _nested(values):
            continue
        whole = "\n".join(str(m.get("content") or "") for m in row["messages"])
        free = {
            text: [v for v in pools[slot] if v != text and not _appears(v, whole)]
            for text, slot in values.items()
        }
        free_days = _day_options(row_days, day_pool, whole)
        made: list[tuple[dict[str, str], dict[str, str]]] = []
        for n in range(copies):
            mapping: dict[str, str] = {}
            for text, candidates in free.items():
                options = [v for v in candidates if v not in mapping.values()]
                if options:
                    mapping[text] = rng.choice(options)
            day_mapping: dict[str, str] = {}
            for day, others in free_days.items():
                moved = [d for d in others if d.isoformat() not in day_mapping.values()]
                if moved:
                    other = rng.choice(moved)
                    day_mapping[day.isoformat()] = other.isoformat()
                    day_mapping[month_day(day)] = month_day(other)
            if (
                not (mapping or day_mapping)
                # a day has one or two others on its weekday: not the same copy again (a
                # repeated copy without days is kept, as mixtures made before had it)
                or (day_mapping and (mapping, day_mapping) in made)
                or _nested([*values, *mapping.values()])
            ):
                continue
            made.append((mapping, day_mapping))
            out.append(
                {
                    **row,
                    "messages": _replace(row["messages"], mapping, day_mapping),
                    "trajectory_id": f"{row['trajectory_id']}~swap{n}",
                }
            )
    return out
