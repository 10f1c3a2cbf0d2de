"""`NoisyPlanner`: the oracle with injected, labelled faults, to test diagnosis and curation.

Per episode, with probability `fault_rate`, one fault kind is drawn deterministically from
`(seed, task.id)` and injected at one step of the task's reference plan:

- `wrong_tool`: calls a plausible other tool (same app first) instead of the planned one;
- `wrong_argument`: changes one argument to a plausible wrong value (a sibling in the world);
- `skipped_step`: leaves one planned call out;
- `ignores_memory`: uses another value where the plan uses a remembered one (the superseded or
  conflicting memory value, or a sibling from the world);
- `gives_up_early`: finishes before the work is done.

Faults target state-changing steps when the plan has any (and, for `wrong_argument`, an
argument the verifier looks at), so a faulted episode almost always fails verification. In a
read-only plan a fault at a read step also spoils the final answer (the planner never learnt
it); that step is annotated `fault_consequence`. A kind that does not apply falls back
(`ignores_memory` without remembered values in the plan, or `wrong_tool` without another tool ->
`wrong_argument` -> `gives_up_early`; `skipped_step` -> `gives_up_early`); the label names the
fault actually injected and the one `requested`. It sits on the decision where the fault
happens: `Decision.annotations["injected_fault"] = {"kind", "step", "detail", "tool",
"requested"}`, with `step` the index in the reference plan; diagnosis is scored against it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Literal, get_args

from qpa.contract import Action, Feedback, Finish, MemoryItem, Step, Task, ToolCall, ToolSpec
from qpa.harness.planners import Decision, OraclePlanner, resolve_refs

FaultKind = Literal[
    "wrong_tool", "wrong_argument", "skipped_step", "ignores_memory", "gives_up_early"
]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
GIVE_UP_ANSWER = "Sorry, I could not complete this task."

_FALLBACK: dict[FaultKind, FaultKind | None] = {
    "ignores_memory": "wrong_argument",
    "wrong_tool": "wrong_argument",
    "skipped_step": "gives_up_early",
    "wrong_argument": "gives_up_early",
    "gives_up_early": None,
}


@dataclass
class PlannedFault:
    """A fault chosen at `start`: what, where, and the choices made for it."""

    kind: FaultKind
    step: int
    requested: FaultKind
    key: str | None = None  # the argument to change, when fixed at planning ("answer", memory)
    replacement_tool: str | None = None
    memory: MemoryItem | None = None
    memory_alternatives: list[Any] = field(default_factory=list)
    salt: int = 0


def _rng_for(seed: int, task_id: str) -> random.Random:
    digest = hashlib.sha256(f"noisy|{seed}|{task_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class NoisyPlanner(OraclePlanner):
    """The oracle planner, wrong on purpose in one labelled way in a share of the episodes."""

    name = "noisy"

    def __init__(
        self,
        fault_rate: float = 0.5,
        faults: Sequence[str] | str = FAULT_KINDS,
        seed: int = 0,
    ) -> None:
        super().__init__()
        fault_rate = float(fault_rate)
        if isinstance(faults, str):  # "wrong_tool,skipped_step" from a command line
            faults = [f.strip() for f in faults.split(",") if f.strip()]
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        unknown = [f for f in faults if f not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; choose from {', '.join(FAULT_KINDS)}")
        self.fault_rate = fault_rate
        self.faults: tuple[FaultKind, ...] = tuple(f for f in FAULT_KINDS if f in set(faults))
        self.seed = int(seed)
        self.planned: PlannedFault | None = None
        self.injected: dict[str, Any] | None = None
        self._task: Task | None = None
        self._tools: list[ToolSpec] = []
        self._answer_step: int | None = None
        self._ungrounded = False

    # ------------------------------------------------------------------ planning
    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        super().start(task, tools, first)
        self._task = task
        self._tools = list(tools)
        self.planned = None
        self.injected = None
        self._ungrounded = False
        writes = self._writes()
        has_writes = any(self._call(i).tool in writes for i in self._tool_steps())
        answers = [
            i for i, a in enumerate(self._plan) if isinstance(a, Finish) and a.answer is not None
        ]
        # in a read-only plan the final answer is what the reads found out
        self._answer_step = answers[-1] if answers and not has_writes else None
        rng = _rng_for(self.seed, task.id)
        if self.faults and rng.random() < self.fault_rate:
            requested = self.faults[rng.randrange(len(self.faults))]
            kind: FaultKind | None = requested
            while kind is not None and self.planned is None:
                self.planned = self._choose(kind, requested, rng)
                kind = _FALLBACK[kind]

    def _writes(self) -> set[str]:
        return {t.name for t in self._tools if t.side_effect != "read"}

    def _tool_steps(self) -> list[int]:
        return [i for i, a in enumerate(self._plan) if isinstance(a, ToolCall)]

    def _targets(self) -> list[int]:
        steps = self._tool_steps()
        writes = self._writes()
        return [i for i in steps if self._call(i).tool in writes] or steps

    def _call(self, index: int) -> ToolCall:
        action = self._plan[index]
        assert isinstance(action, ToolCall)
        return action

    def _choose(
        self, kind: FaultKind, requested: FaultKind, rng: random.Random
    ) -> PlannedFault | None:
        salt = rng.randrange(1 << 30)
        if kind == "wrong_tool":
            targets = self._targets()
            if not targets:
                return None
            step = targets[rng.randrange(len(targets))]
            tool = self._other_tool(self._call(step).tool, rng)
            if tool is None:
                return None
            return PlannedFault(kind, step, requested, replacement_tool=tool, salt=salt)
        if kind == "wrong_argument":
            steps = [i for i in self._targets() if self._call(i).arguments]
            if steps:
                # the argument is chosen when acting, once `${i}` references are resolved
                return PlannedFault(kind, steps[rng.randrange(len(steps))], requested, salt=salt)
            answered = [
                i
                for i, a in enumerate(self._plan)
                if isinstance(a, Finish) and a.answer is not None
            ]
            if answered:
                return PlannedFault(kind, answered[-1], requested, key="answer", salt=salt)
            return None
        if kind == "skipped_step":
            targets = self._targets()
            if not targets:
                return None
            return PlannedFault(kind, targets[rng.randrange(len(targets))], requested, salt=salt)
        if kind == "ignores_memory":
            return self._plan_memory(requested, rng, salt)
        # gives_up_early: stop at (or before) a state-changing step, else at any call
        targets = self._targets()
        if targets:
            steps = [i for i in self._tool_steps() if i <= max(targets)]
            return PlannedFault(kind, steps[rng.randrange(len(steps))], requested, salt=salt)
        finishes = [i for i, a in enumerate(self._plan) if isinstance(a, Finish)]
        step = finishes[-1] if finishes else len(self._plan)
        return PlannedFault(kind, step, requested, salt=salt)

    def _plan_memory(
        self, requested: FaultKind, rng: random.Random, salt: int
    ) -> PlannedFault | None:
        task = self._task
        if task is None or not task.memory:
            return None
        uses: list[tuple[int, str, MemoryItem]] = []
        for i, action in enumerate(self._plan):
            fields: dict[str, Any] = {}
            if isinstance(action, ToolCall):
                fields = action.arguments
            elif isinstance(action, Finish) and action.answer is not None:
                fields = {"answer": action.answer}
            for key in sorted(fields):
                item = _memory_used(fields[key], task.memory)
                if item is not None:
                    uses.append((i, key, item))
        if not uses:
            return None
        # prefer a use whose value the verifier looks at, or one that changes state
        checked, writes = self._checked(), self._writes()

        def matters(use: tuple[int, str, MemoryItem]) -> bool:
            action = self._plan[use[0]]
            if isinstance(action, ToolCall):
                value = action.arguments[use[1]]
                return action.tool in writes or any(_same(value, op, c) for op, c in checked)
            expected = task.verifier.answer
            given = action.answer if isinstance(action, Finish) else None
            return expected is not None and _same(given, "contains", expected)

        pool = [u for u in uses if matters(u)] or uses
        step, key, item = pool[rng.randrange(len(pool))]
        conflicting = [m.value for m in task.memory if m.key == item.key and m.value != item.value]
        return PlannedFault(
            "ignores_memory",
            step,
            requested,
            key=key,
            memory=item,
            memory_alternatives=conflicting,
            salt=salt,
        )

    def _other_tool(self, name: str, rng: random.Random) -> str | None:
        own = next((t for t in self._tools if t.name == name), None)
        others = [t for t in self._tools if t.name != name]
        if not others:
            return None
        app = own.app if own is not None else ""
        side = own.side_effect if own is not None else "read"

        def kinship(tool: ToolSpec) -> tuple[int, int]:
            return (int(tool.app == app), int(tool.side_effect == side))

        closest = max(kinship(t) for t in others)
        group = [t for t in others if kinship(t) == closest]  # same app and side effect first
        group.sort(key=lambda t: (-SequenceMatcher(None, t.name, name).ratio(), t.name))
        best = group[:3]
        return best[rng.randrange(len(best))].name

    # ------------------------------------------------------------------ acting
    def decide(self, last: Step | None) -> Decision:
        if last is not None:
            self._results.append(last.feedback.observation)
        fault = self.planned if self.injected is None else None
        label: dict[str, Any] | None = None
        if fault is not None and fault.kind == "skipped_step" and self._cursor == fault.step:
            skipped = self._call(fault.step)
            self._results.append(None)  # keeps `${i}` references of later steps aligned
            self._cursor += 1
            label = self._label(
                fault, skipped.tool, f"skipped {skipped.tool} (plan step {fault.step})"
            )
        if self._cursor >= len(self._plan):
            index: int | None = None
            action: Action = Finish()
        else:
            index = self._cursor
            action = self._plan[index]
            self._cursor += 1
            if isinstance(action, ToolCall) and "${" in str(action.arguments):
                action = action.model_copy(
                    update={"arguments": resolve_refs(action.arguments, self._results)}
                )
        if fault is not None and label is None and fault.kind != "skipped_step":
            at = len(self._plan) if index is None else index
            if at == fault.step:
                action, label = self._inject(fault, action)
        annotations: dict[str, Any] = {} if index is None else {"plan_step": index}
        if label is not None:
            self.injected = label
            annotations["injected_fault"] = label
            self._ground(label)
        if (
            self._ungrounded
            and index is not None
            and index == self._answer_step
            and (label is None or label["step"] != index)
        ):
            action, consequence = self._unground(action)
            annotations["fault_consequence"] = consequence
        return Decision(action, annotations=annotations)

    def _ground(self, label: dict[str, Any]) -> None:
        """A fault at a read step of a read-only plan also spoils the final answer."""
        if (
            self._answer_step is not None
            and label["kind"] != "gives_up_early"
            and label["step"] < self._answer_step
            and label["tool"] is not None
        ):
            self._ungrounded = True
            label["detail"] += "; the final answer is no longer grounded"

    def _unground(self, action: Action) -> tuple[Action, dict[str, Any]]:
        assert self.injected is not None
        current = _field(action, "answer")
        rng = random.Random(self.planned.salt if self.planned else 0)
        replacement = _pick(current, self._alternatives(current), rng)
        consequence = {
            "kind": "ungrounded_answer",
            "caused_by_step": self.injected["step"],
            "detail": f"answer {current!r} -> {replacement!r}",
        }
        return _with_field(action, "answer", replacement), consequence

    def _label(self, fault: PlannedFault, tool: str | None, detail: str) -> dict[str, Any]:
        return {
            "kind": fault.kind,
            "step": fault.step,
            "detail": detail,
            "tool": tool,
            "requested": fault.requested,
        }

    def _inject(self, fault: PlannedFault, action: Action) -> tuple[Action, dict[str, Any]]:
        rng = random.Random(fault.salt)
        tool = action.tool if isinstance(action, ToolCall) else None
        if fault.kind == "gives_up_early":
            self._cursor = len(self._plan)
            where = f"{tool} (plan step {fault.step})" if tool else f"plan step {fault.step}"
            detail = f"gave up before {where} of {len(self._plan)} steps"
            return Finish(answer=GIVE_UP_ANSWER), self._label(fault, tool, detail)
        if fault.kind == "wrong_tool" and isinstance(action, ToolCall):
            new = fault.replacement_tool or action.tool
            spec = next((t for t in self._tools if t.name == new), None)
            accepted = set((spec.parameters.get("properties") or {}) if spec else ())
            arguments = {k: v for k, v in action.arguments.items() if k in accepted}
            detail = f"called {new} instead of {action.tool}"
            wrong = action.model_copy(update={"tool": new, "arguments": arguments})
            return wrong, self._label(fault, action.tool, detail)
        key = fault.key or "answer"
        if fault.kind == "wrong_argument" and isinstance(action, ToolCall) and action.arguments:
            key = self._key_that_matters(action.arguments, rng)
        current = _field(action, key)
        if fault.kind == "ignores_memory" and fault.memory is not None:
            memory = fault.memory
            whole = current == memory.value
            candidates = list(fault.memory_alternatives) or self._alternatives(
                memory.value, key if whole else None
            )
            replacement = _swap(current, memory.value, candidates, rng)
            detail = (
                f"{tool or 'finish'}.{key}: used {replacement!r} instead of the remembered "
                f"{memory.key} = {memory.value!r}"
            )
        else:
            replacement = _pick(current, self._alternatives(current, key), rng)
            detail = f"{tool or 'finish'}.{key}: {current!r} -> {replacement!r}"
        return _with_field(action, key, replacement), self._label(fault, tool, detail)

    def _checked(self) -> list[tuple[str, Any]]:
        """What the verifier compares: (how, value) pairs from its checks and its answer."""
        task = self._task
        checked: list[tuple[str, Any]] = []
        if task is not None:
            for check in task.verifier.checks:
                for field_, value in check.where.items():
                    suffix = field_.rsplit("__", 1)[1] if "__" in field_ else "exact"
                    values = value if isinstance(value, list) else [value]
                    if suffix in ("exact", "in", "contains", "icontains"):
                        checked.extend(("exact" if suffix == "in" else suffix, v) for v in values)
                if check.expect is not None:
                    checked.append(("exact", check.expect))
            if task.verifier.answer is not None:
                checked.append(("contains", task.verifier.answer))
        return checked

    def _key_that_matters(self, arguments: dict[str, Any], rng: random.Random) -> str:
        """An argument whose value the verifier looks at (else any): a consequential mistake."""
        checked = self._checked()
        keys = sorted(arguments)
        matters = [k for k in keys if any(_same(arguments[k], op, c) for op, c in checked)]
        pool = matters or keys
        return pool[rng.randrange(len(pool))]

    def _alternatives(self, value: Any, key: str | None = None) -> list[Any]:
        """Plausible mistakes for `value`: the same field of sibling records in the world.

        Fields holding `value` are looked up first; failing that, the field named `key`.
        """
        task = self._task
        if task is None or value is None or isinstance(value, dict | list):
            return []
        lists = _record_lists(task.world)
        holding = [
            (records, sorted({k for r in records for k, v in r.items() if v == value}))
            for records in lists
        ]
        found = _siblings(holding, value)
        if not found and key is not None:
            found = _siblings([(records, [key]) for records in lists], value)
        return found


# --------------------------------------------------------------------------- helpers


def _same(value: Any, op: str, checked: Any) -> bool:
    """Whether a verifier check compares `value` (as `op` does) with `checked`."""
    if value is None or checked is None or isinstance(value, bool) != isinstance(checked, bool):
        return False
    if op in ("contains", "icontains") and isinstance(value, str) and isinstance(checked, str):
        return checked.lower() in value.lower()
    return bool(value == checked)


def _memory_used(value: Any, memory: list[MemoryItem]) -> MemoryItem | None:
    if not isinstance(value, str):
        return None
    for item in memory:
        if value == item.value or (len(item.value) >= 3 and item.value in value):
            return item
    return None


def _siblings(fields: list[tuple[list[dict[str, Any]], list[str]]], value: Any) -> list[Any]:
    """Values of the named fields of the records, of `value`'s type, other than `value`."""
    found: list[Any] = []
    for records, names in fields:
        for name in names:
            for record in records:
                other = record.get(name)
                if other != value and type(other) is type(value) and other not in found:
                    found.append(other)
    return found


def _record_lists(value: Any) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    if isinstance(value, dict):
        for key in sorted(value):
            if not str(key).startswith("_"):
                out.extend(_record_lists(value[key]))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out.append(value)
        for record in value:
            out.extend(_record_lists(record))
    return out


def _field(action: Action, key: str) -> Any:
    if isinstance(action, ToolCall):
        return action.arguments.get(key)
    if isinstance(action, Finish):
        return action.answer
    return None


def _with_field(action: Action, key: str, value: Any) -> Action:
    if isinstance(action, ToolCall):
        return action.model_copy(update={"arguments": {**action.arguments, key: value}})
    if isinstance(action, Finish):
        return Finish(answer=None if value is None else str(value))
    return action


def _pick(current: Any, candidates: list[Any], rng: random.Random) -> Any:
    options = [c for c in candidates if c != current]
    if options:
        return options[rng.randrange(len(options))]
    return perturb(current)


def _swap(current: Any, remembered: str, candidates: list[Any], rng: random.Random) -> Any:
    """Replace the remembered value inside `current` by another plausible value."""
    options = [c for c in candidates if c != remembered and isinstance(c, str)]
    other = options[rng.randrange(len(options))] if options else str(perturb(remembered))
    if current == remembered or not isinstance(current, str):
        return other
    return current.replace(remembered, other)


def perturb(value: Any) -> Any:
    """A different value of the same type (when nothing more plausible is at hand)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        digits = [i for i, ch in enumerate(value) if ch.isdigit()]
        if digits:
            i = digits[-1]
            return value[:i] + str((int(value[i]) + 1) % 10) + value[i + 1 :]
        words = value.split()
        if len(words) > 1:
            return " ".join(words[:-1])
        return f"{value}-2" if value else "x"
    if isinstance(value, list):
        return value[:-1] if len(value) > 1 else [perturb(value[0]) if value else "x"]
    if isinstance(value, dict) and value:
        key = sorted(value)[0]
        return {**value, key: perturb(value[key])}
    return "x"
