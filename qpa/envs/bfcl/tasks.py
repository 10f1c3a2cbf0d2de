"""BFCL's multi-turn entries as qpa `Task`s: suites `bfcl/<category>`, one task per entry.

- Id `bfcl.<category>.<entry_id>` (`entry_id` is BFCL's own, e.g. `multi_turn_base_0`), suite
  `bfcl/<category>`, domain the module of the involved backend class most of the ground truth's
  calls go to (ties, and entries without calls: the first in BFCL's `involved_classes`), e.g.
  `gorilla_file_system`, `posting_api`, `trading_bot`; apps the involved classes; tools the
  functions offered at the start (miss_func's withheld ones left out); instruction the first
  user turn. Difficulty is the number of user turns less one, clamped to 1..5.
- The world carries ids only (`world["_bfcl"] = {"category", "entry_id"}`): the environment loads
  the initial state, the turns, the withheld functions and the ground truth from the installed
  package by id, so whoever resets an episode (a client of an environment server) can bring
  neither a world nor a judge of their own.
- Splits are fixed per scenario, not per entry: BFCL's four categories are variants of the same
  200 scenarios (entry `multi_turn_<category>_<n>` is scenario `n` in every category), so all
  four variants of a scenario share a split and no test scenario is trained on in another
  category's guise. The rule: the first 8 hex digits of sha256(`bfcl/multi_turn/<n>`) as a
  number, modulo 10: 0-5 train, 6-7 validation, 8-9 test.
- The reference plan is BFCL's ground truth (`possible_answer/`): each call string parsed into
  a `ToolCall` (positional arguments named by the backend method's signature), and each user turn
  closed by a `Finish()`. A turn whose ground truth is empty is one where no call can do what the
  user asks; BFCL's data README says what it expects there, and the plan closes such a turn with
  a `MessageUser` instead: in miss_param, asking the user for the missing detail ("we expect the
  LLM to ask for a follow-up to clarify"); in miss_func, the turn before the withheld functions
  come back, saying no available function can do it ("we expect the model to recognize that no
  action should be taken given the lack of functions provided"); elsewhere (e.g. an invoice for a
  cancelled booking) saying it cannot be done. BFCL's checker does not check such a turn by
  itself: it runs whatever was called there, and the state that leaves is judged at the next
  turn (BFCL's `multi_turn_irrelevance_checker`, which would fail any call there, is not used
  by its own runner in this version).
- Payment functions the ground truth calls are the task's `confirmations`: BFCL has no
  confirmation turn, so the request in the user's turn is the consent.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from typing import Any

from qpa.contract import Action, Finish, MessageUser, Split, Task, ToolCall
from qpa.envs.bfcl import benchmark
from qpa.envs.bfcl.calls import parse_call
from qpa.envs.bfcl.schema import class_tools

WORLD_KEY = "_bfcl"
SUITE_PREFIX = "bfcl/"
ASK_FOR_MISSING = (
    "Some information this request needs is missing and I cannot look it up. "
    "Could you tell me the missing detail?"
)
NO_FUNCTION = "None of the functions available to me can do this. Could you give me one that can?"
CANNOT = "I cannot do this with the functions and information available."


def scenario_of(entry_id: str) -> str:
    """The scenario number an entry id ends with (`multi_turn_miss_func_12` -> `12`)."""
    return entry_id.rsplit("_", 1)[-1]


def split_of(entry_id: str) -> Split:
    """The split of an entry (see the module docstring for the rule)."""
    digest = hashlib.sha256(f"bfcl/multi_turn/{scenario_of(entry_id)}".encode()).hexdigest()
    bucket = int(digest[:8], 16) % 10
    return "train" if bucket < 6 else "validation" if bucket < 8 else "test"


def offered_at_start(found: benchmark.Entry) -> list[str]:
    """The function names an episode of `found` offers at its first turn, in BFCL's order."""
    withheld = found.withheld
    return [
        spec.name
        for class_name in found.involved_classes
        for spec in class_tools(class_name)
        if spec.name not in withheld
    ]


def owner(found: benchmark.Entry, function: str) -> str:
    """The involved class that has `function` (the last one, as BFCL maps method names)."""
    owners = [c for c in found.involved_classes if any(s.name == function for s in class_tools(c))]
    if not owners:
        raise KeyError(f"{found.id}: no involved class has a function {function!r}")
    return owners[-1]


def ground_truth_call(found: benchmark.Entry, text: str) -> ToolCall:
    """One of BFCL's ground-truth call strings as a `ToolCall`."""

    def names(function: str) -> tuple[str, ...]:
        return benchmark.parameters(owner(found, function), function)

    tool, arguments = parse_call(text, names)
    owner(found, tool)
    return ToolCall(tool=tool, arguments=arguments)


def _closing_message(found: benchmark.Entry, turn: int) -> str:
    if found.category == "multi_turn_miss_param":
        return ASK_FOR_MISSING
    if found.category == "multi_turn_miss_func" and turn + 1 in found.missed:
        return NO_FUNCTION
    return CANNOT


def reference_plan(found: benchmark.Entry) -> list[Action]:
    """BFCL's ground truth as actions: each turn's calls, then the turn's closing action."""
    plan: list[Action] = []
    for turn, calls in enumerate(found.ground_truth):
        plan.extend(ground_truth_call(found, text) for text in calls)
        plan.append(Finish() if calls else MessageUser(text=_closing_message(found, turn)))
    return plan


def domain_of(found: benchmark.Entry, plan: list[Action]) -> str:
    """The task's domain (see the module docstring)."""
    counts = Counter(owner(found, a.tool) for a in plan if isinstance(a, ToolCall))
    main = max(found.involved_classes, key=lambda c: counts.get(c, 0))  # first of the ties
    return benchmark.module_name(main)


def _task(found: benchmark.Entry) -> Task:
    plan = reference_plan(found)
    table = benchmark.effects()
    payments = sorted(
        {
            a.tool
            for a in plan
            if isinstance(a, ToolCall) and table[owner(found, a.tool)][a.tool] == "payment"
        }
    )
    world: dict[str, dict[str, Any]] = {
        WORLD_KEY: {"category": found.category, "entry_id": found.id}
    }
    return Task(
        id=f"bfcl.{found.category}.{found.id}",
        suite=f"{SUITE_PREFIX}{found.category}",
        split=split_of(found.id),
        domain=domain_of(found, plan),
        capabilities=["tool_use"],
        difficulty=min(5, max(1, len(found.turns) - 1)),
        instruction=found.turns[0],
        apps=list(found.involved_classes),
        tools=offered_at_start(found),
        world=world,
        reference_plan=plan,
        confirmations=payments,
        source="bfcl",
        lineage={
            "benchmark": "bfcl-eval",
            "version": benchmark.VERSION,
            "category": found.category,
            "entry_id": found.id,
        },
    )


@functools.cache
def bfcl_tasks(category: str) -> tuple[Task, ...]:
    """Every entry of BFCL category `category` as a `Task`, in BFCL's order; `KeyError` naming
    the category and the choices when it is not one of `BFCL_CATEGORIES`."""
    return tuple(_task(found) for found in benchmark.entries(category).values())
