"""Planners: what decides the next `Action`. `oracle` and `noop` need no model.

A planner is started once per episode with the task, the tools on offer and the reset feedback,
then asked for one `Decision` per turn given the previous step. Model-backed planners (later
issues) implement the same interface, so the agent loop never special-cases them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from qpa.contract import (
    Action,
    Delegate,
    Feedback,
    Finish,
    Step,
    Task,
    TokenUsage,
    ToolCall,
    ToolSpec,
)


@dataclass
class Decision:
    """The next action, what producing it cost, and what the Harness noted.

    `feedback` is set when the Harness itself answers the action (a malformed model output, a
    refused payment, a write blocked by the provenance guard): the action is then recorded with
    that feedback and never reaches the environment.
    """

    action: Action
    usage: TokenUsage = field(default_factory=TokenUsage)
    annotations: dict[str, Any] = field(default_factory=dict)
    feedback: Feedback | None = None


class Planner(Protocol):
    name: str

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None: ...

    def decide(self, last: Step | None) -> Decision: ...


class NoopPlanner:
    """Finishes at once: every task's verifier must fail it."""

    name = "noop"

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        return None

    def decide(self, last: Step | None) -> Decision:
        return Decision(Finish())


_REF = re.compile(r"\$\{(\d+)((?:\.[A-Za-z0-9_]+)*)\}")
_MISSING = object()


def _lookup(value: Any, path: str) -> Any:
    for part in filter(None, path.split(".")):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def resolve_refs(value: Any, results: list[Any]) -> Any:
    """Replace `${i.path}` in plan arguments with data from the observation of plan step i.

    A string that is exactly one reference takes the referenced value with its type; references
    inside longer strings are substituted as text. Unresolvable references stay as written.
    """
    if isinstance(value, dict):
        return {k: resolve_refs(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, results) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def find(match: re.Match[str]) -> Any:
        index = int(match.group(1))
        if index >= len(results):
            return _MISSING
        return _lookup(results[index], match.group(2))

    whole = _REF.fullmatch(value)
    if whole:
        found = find(whole)
        return value if found is _MISSING else found

    def substitute(match: re.Match[str]) -> str:
        found = find(match)
        return match.group(0) if found is _MISSING else str(found)

    return _REF.sub(substitute, value)


def ground(action: Action, results: list[Any]) -> Action:
    """A reference-plan action with its `${i.path}` references resolved against `results`."""
    if isinstance(action, ToolCall) and "${" in str(action.arguments):
        return action.model_copy(update={"arguments": resolve_refs(action.arguments, results)})
    if isinstance(action, Finish) and action.answer and "${" in action.answer:
        return Finish(answer=str(resolve_refs(action.answer, results)))
    if isinstance(action, Delegate) and "${" in action.goal:
        return action.model_copy(update={"goal": str(resolve_refs(action.goal, results))})
    return action


class OraclePlanner:
    """Follows the task's reference plan, grounding `${i.path}` arguments in earlier results."""

    name = "oracle"

    def __init__(self) -> None:
        self._plan: list[Action] = []
        self._results: list[Any] = []
        self._cursor = 0

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        if task.reference_plan is None:
            raise ValueError(f"task {task.id} has no reference plan for the oracle")
        self._plan = list(task.reference_plan)
        self._results = []
        self._cursor = 0

    def decide(self, last: Step | None) -> Decision:
        if last is not None:
            self._results.append(last.feedback.observation)
        if self._cursor >= len(self._plan):
            return Decision(Finish())
        action = self._plan[self._cursor]
        self._cursor += 1
        return Decision(ground(action, self._results), annotations={"plan_step": self._cursor - 1})


def _perturb(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "-x" if value else "x"
    if isinstance(value, list):
        return [*value[:-1]] if value else ["x"]
    return "x"


class GreedyWrongPlanner(OraclePlanner):
    """The oracle with exactly one wrong argument: proves verifiers are not trivially satisfied.

    It perturbs the first argument of the last state-changing tool call of the reference plan
    (or, when the plan changes nothing, the final answer). Every shipped task must fail under it.
    """

    name = "greedy_wrong"

    def __init__(self, write_tools: set[str] | None = None) -> None:
        super().__init__()
        self._write_tools = write_tools
        self._target: int | None = None

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        super().start(task, tools, first)
        writes = self._write_tools or {t.name for t in tools if t.side_effect != "read"}
        self._target = next(
            (
                i
                for i in range(len(self._plan) - 1, -1, -1)
                if isinstance(self._plan[i], ToolCall)
                and self._plan[i].tool in writes  # type: ignore[union-attr]
                and self._plan[i].arguments  # type: ignore[union-attr]
            ),
            None,
        )

    def decide(self, last: Step | None) -> Decision:
        index = self._cursor
        decision = super().decide(last)
        action = decision.action
        if self._target is not None and index == self._target and isinstance(action, ToolCall):
            key = next(iter(action.arguments))
            arguments = {**action.arguments, key: _perturb(action.arguments[key])}
            decision.action = action.model_copy(update={"arguments": arguments})
            decision.annotations["injected_fault"] = f"wrong_argument:{key}"
        elif self._target is None and isinstance(action, Finish):
            decision.action = Finish(answer="unknown")
            decision.annotations["injected_fault"] = "wrong_answer"
        return decision


PLANNERS: dict[str, type[Any]] = {
    "oracle": OraclePlanner,
    "noop": NoopPlanner,
    "greedy_wrong": GreedyWrongPlanner,
}


def make_planner(name: str, **options: Any) -> Planner:
    try:
        factory = PLANNERS[name]
    except KeyError:
        raise ValueError(
            f"unknown planner {name!r}; choose from {', '.join(sorted(PLANNERS))}"
        ) from None
    planner: Planner = factory(**options)
    return planner
