"""`BfclEnv`: BFCL v4 multi-turn behind the `Environment` protocol (environment kind `bfcl`).

- reset: the task's `world["_bfcl"]` names a category and an entry (ids only; anything else is
  refused, naming the field); the entry's backends are built from BFCL's own classes and initial
  config, privately for this environment; the observation is the first user turn
  (`{"user", "turn": 0, "turns"}`).
- tools: the involved classes' functions as `ToolSpec`s (BFCL's func docs as JSON Schema, the
  class as `app`, the side effect from the reviewed `effects.yaml`); in miss_func, the withheld
  functions join only at the turn BFCL brings them back.
- step: a `ToolCall` is checked against its schema (`unknown_tool`, `invalid_arguments` naming
  the argument), run on this episode's backend and recorded in BFCL's call-string form for the
  judge; its result is the observation (JSON data), and a backend's `{"error": ...}` answer is a
  `precondition_failed` error (it still ran, and is recorded, as BFCL would run it). `Finish` or
  `MessageUser` ends the user's turn (in BFCL a turn ends when the model stops calling): the next
  turn's text comes back with `done=False` (and, in miss_func, the functions it brings back as
  `tools_added`), or, after the last turn, `done=True`. What the planner says is not judged
  (BFCL's checker judges the backends' state and the calls' results only). The environment
  refuses nothing BFCL would run (no confirmation rule of its own: payments' consent is the
  task's `confirmations`, for the Harness's guard). UI gestures and delegation are
  `precondition_failed`; past `max_steps` the episode ends with an error.
- verify: BFCL's own `multi_turn_checker` on the recorded turns against the ground truth
  (`qpa.envs.bfcl.judge`), one check `multi_turn_checker` whose detail is the checker's error
  type and message; success needs every turn finished and the checker's pass; progress is the
  share of turns the checker accepts among those finished.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, ValidationError

from qpa.contract import (
    Action,
    CheckResult,
    EnvKind,
    Feedback,
    Task,
    ToolSpec,
    Verification,
)
from qpa.envs.bfcl import benchmark
from qpa.envs.bfcl.calls import format_call, non_finite
from qpa.envs.bfcl.judge import Judgement, judge
from qpa.envs.bfcl.schema import class_tools
from qpa.envs.bfcl.tasks import WORLD_KEY
from qpa.envs.schema_errors import describe_schema_errors

MAX_STEPS = 200
CHECK_NAME = "multi_turn_checker"


class BfclWorld(BaseModel):
    """What a task may say of its BFCL episode: the category and the entry's id, nothing else."""

    model_config = ConfigDict(extra="forbid")

    category: Literal[
        "multi_turn_base",
        "multi_turn_long_context",
        "multi_turn_miss_func",
        "multi_turn_miss_param",
    ]
    entry_id: str


def jsonable(value: Any) -> Any:
    """A backend's result as JSON data (a detached copy): dicts, lists, strings, numbers, None;
    anything JSON cannot hold becomes its `str`."""
    if value is None or isinstance(value, str | bool | int):
        return value
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=_fallback))
    except (TypeError, ValueError):
        return str(value)


def _fallback(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def backend_error(result: Any) -> str | None:
    """The error a backend answered instead of a result, or None. BFCL's backends answer
    `{"error": ...}` (sometimes with a status beside it), and a few list-returning ones
    `[{"error": ...}]` or `["Error: ..."]`."""
    if isinstance(result, dict) and "error" in result:
        return str(result["error"])
    if isinstance(result, list) and len(result) == 1:
        item = result[0]
        if isinstance(item, dict) and set(item) == {"error"}:
            return str(item["error"])
        if isinstance(item, str) and item.startswith("Error:"):
            return item.removeprefix("Error:").strip()
    return None


class BfclEnv:
    """One BFCL multi-turn entry at a time, its backends private to this object."""

    kind: EnvKind = "bfcl"

    def __init__(self, *, max_steps: int = MAX_STEPS) -> None:
        if max_steps < 1:
            raise ValueError("max_steps: must be at least 1")
        self.max_steps = max_steps
        self._clear()

    def _clear(self) -> None:
        self._entry: benchmark.Entry | None = None
        self._backends: dict[str, Any] = {}
        self._defaults: benchmark.Defaults = {}
        self._owners: dict[str, str] = {}
        self._specs: dict[str, ToolSpec] = {}
        self._offered: list[str] = []
        self._validators: dict[str, Draft202012Validator] = {}
        self._turn = 0
        self._calls: list[list[str]] = []
        self._steps = 0
        self._finished = False
        self._stopped = False
        self._verdict: tuple[tuple[int, int, bool], Verification] | None = None

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Task) -> Feedback:
        self._clear()
        raw = task.world.get(WORLD_KEY)
        if raw is None:
            return Feedback.fail(
                "invalid_arguments",
                f"world.{WORLD_KEY}: missing (a bfcl task names its category and entry_id)",
            )
        try:
            world = BfclWorld.model_validate(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "<world>"
            return Feedback.fail("invalid_arguments", f"world.{WORLD_KEY}.{where}: {error['msg']}")
        try:
            found = benchmark.entry(world.category, world.entry_id)
        except KeyError:
            return Feedback.fail(
                "invalid_arguments",
                f"world.{WORLD_KEY}.entry_id: {world.entry_id!r} is not an entry of BFCL "
                f"category {world.category}",
            )
        except benchmark.BfclUnavailable as exc:
            return Feedback.fail("environment_failure", str(exc))
        try:
            backends = benchmark.new_backends(found)
        except Exception as exc:  # a broken install must not kill the rollout
            return Feedback.fail(
                "environment_failure", f"BFCL backends for {found.id}: {type(exc).__name__}: {exc}"
            )
        self._entry, self._backends = found, backends
        self._defaults = benchmark.fresh_defaults()
        for class_name in found.involved_classes:
            for spec in class_tools(class_name):
                # a name in two classes goes to the later one, as in BFCL's own mapping
                self._owners[spec.name] = class_name
                self._specs[spec.name] = spec
        withheld = found.withheld
        self._offered = [
            name
            for class_name in found.involved_classes
            for name in (s.name for s in class_tools(class_name))
            if name not in withheld and self._owners[name] == class_name
        ]
        self._calls = [[]]
        return Feedback.ok(self._turn_observation())

    def step(self, action: Action) -> Feedback:
        if self._entry is None:
            return Feedback.fail("precondition_failed", "no episode: call reset(task) first")
        if self._finished or self._stopped:
            return Feedback.fail(
                "precondition_failed", "the episode has finished; no more actions", done=True
            )
        self._steps += 1
        if self._steps > self.max_steps:
            self._stopped = True
            return Feedback.fail(
                "precondition_failed", f"step budget of {self.max_steps} exhausted", done=True
            )
        if action.type == "tool_call":
            return self._tool_call(action.tool, action.arguments)
        if action.type == "finish":
            return self._end_turn()
        if action.type == "message_user":
            return self._end_turn()
        if action.type == "delegate":
            return Feedback.fail(
                "precondition_failed", "delegation is handled by the Harness, not the environment"
            )
        return Feedback.fail(
            "precondition_failed", "BFCL's backends have no screen: UI gestures are not available"
        )

    def verify(self) -> Verification:
        found = self._entry
        if found is None:
            return Verification(done=False, success=False, progress=0.0)
        state = (sum(map(len, self._calls)), len(self._calls), self._finished)
        if self._verdict is not None and self._verdict[0] == state:
            return self._verdict[1].model_copy(deep=True)
        verdict: Judgement = judge(found, self._calls)
        turns = len(found.ground_truth)
        completed = len(self._calls) if self._finished else len(self._calls) - 1
        success = self._finished and verdict.valid
        progress = 1.0 if success else min(verdict.turns_passed, completed) / turns
        verification = Verification(
            done=self._finished,
            success=success,
            progress=progress,
            checks=[CheckResult(name=CHECK_NAME, passed=verdict.valid, detail=verdict.detail)],
            fidelity="programmatic",
        )
        self._verdict = (state, verification)
        return verification.model_copy(deep=True)

    def tools(self) -> list[ToolSpec]:
        return [self._specs[name].model_copy(deep=True) for name in self._offered]

    def close(self) -> None:
        self._clear()

    # ------------------------------------------------------------------ extras
    @property
    def finished(self) -> bool:
        """Whether every user turn has ended."""
        return self._finished

    @property
    def turn(self) -> int:
        """The index of the current user turn."""
        return self._turn

    def calls(self) -> list[list[str]]:
        """The call strings made so far, per user turn (what the judge re-executes), detached."""
        return [list(turn) for turn in self._calls]

    # ------------------------------------------------------------------ internals
    def _turn_observation(self) -> dict[str, Any]:
        found = self._entry
        assert found is not None
        return {"user": found.turns[self._turn], "turn": self._turn, "turns": len(found.turns)}

    def _validator(self, name: str) -> Draft202012Validator:
        validator = self._validators.get(name)
        if validator is None:
            validator = Draft202012Validator(self._specs[name].parameters)
            self._validators[name] = validator
        return validator

    def _tool_call(self, name: str, arguments: dict[str, Any]) -> Feedback:
        if name not in self._offered:
            return Feedback.fail("unknown_tool", f"no tool named '{name}' in this episode")
        errors = list(self._validator(name).iter_errors(arguments))
        if errors:
            return Feedback.fail("invalid_arguments", f"{name}: {describe_schema_errors(errors)}")
        bad = non_finite(arguments)
        if bad:
            return Feedback.fail(
                "invalid_arguments", f"{name}: argument '{bad}': must be a finite number"
            )
        call = format_call(name, arguments)
        method = getattr(self._backends[self._owners[name]], name)
        self._calls[-1].append(call)
        try:
            with benchmark.isolated(self._defaults):
                raw = method(**copy.deepcopy(arguments))
                result = jsonable(raw)
        except Exception as exc:  # BFCL records "Error during execution: ..." and goes on
            return Feedback.fail(
                "precondition_failed",
                f"{name}: error during execution: {type(exc).__name__}: {exc}",
            )
        error = backend_error(result)
        if error is not None:
            return Feedback.fail("precondition_failed", f"{name}: {error}")
        return Feedback.ok(result)

    def _end_turn(self) -> Feedback:
        found = self._entry
        assert found is not None
        if self._turn + 1 >= len(found.turns):
            self._finished = True
            return Feedback.ok(
                {"finished": True, "turn": self._turn, "turns": len(found.turns)}, done=True
            )
        self._turn += 1
        self._calls.append([])
        observation = self._turn_observation()
        added = [n for n in found.missed.get(self._turn, ()) if n not in self._offered]
        if added:
            self._offered.extend(added)
            observation["tools_added"] = added
        return Feedback.ok(observation)
