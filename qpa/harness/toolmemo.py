"""A value computed once per `ToolSpec` object, for the Harness's per-turn hot path.

An environment hands the same `ToolSpec` objects (its registry's) to every episode, and the
Harness reads each tool's cache key and argument validators many times a turn. `ToolObjectMemo`
remembers a value per tool object: an entry holds the object itself (so its id cannot be taken
by another object while the entry lives) and the field objects the value was computed from, so
a field assigned anew is read afresh. A tool's fields are not edited in place once offered (a
changed tool is a new `ToolSpec`: `model_copy`). Bounded; emptied when full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from qpa.contract import ToolSpec

__all__ = ["ToolObjectMemo"]

V = TypeVar("V")


class ToolObjectMemo(Generic[V]):
    """`compute(spec)`, remembered per tool object while `fields(spec)` are the same objects."""

    def __init__(
        self,
        compute: Callable[[ToolSpec], V],
        fields: Callable[[ToolSpec], tuple[Any, ...]],
        *,
        limit: int = 4096,
    ) -> None:
        self.compute = compute
        self.fields = fields
        self.limit = limit
        #: id(spec) -> (spec, the field objects read, the value)
        self.entries: dict[int, tuple[ToolSpec, tuple[Any, ...], V]] = {}

    def __call__(self, spec: ToolSpec) -> V:
        current = self.fields(spec)
        known = self.entries.get(id(spec))
        if known is not None and known[0] is spec:
            for was, now in zip(known[1], current, strict=True):
                if was is not now:
                    break
            else:
                return known[2]
        value = self.compute(spec)
        if len(self.entries) >= self.limit:
            self.entries.clear()
        self.entries[id(spec)] = (spec, current, value)
        return value
