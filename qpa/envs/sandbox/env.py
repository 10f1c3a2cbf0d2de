"""`SandboxEnv`: the programmatic sandbox behind the `Environment` protocol.

State is rebuilt on every reset from the task's `world` (a JSON document), so an episode is a
pure function of (task, seed, actions): replaying a trajectory's actions on a fresh environment
gives the same feedback byte for byte. Tool results are detached copies of state (JSON
round-trip), so nothing outside can mutate the phone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from pydantic import ValidationError

from qpa.contract import (
    Action,
    Delegate,
    EnvKind,
    Feedback,
    Finish,
    MessageUser,
    Task,
    ToolCall,
    ToolSpec,
    Verification,
)
from qpa.envs.sandbox.collateral import WriteLog, find_collateral, snapshot
from qpa.envs.sandbox.engine import DEFAULT_START, App, BoundTool, ToolError, World
from qpa.envs.sandbox.engine import describe_validation_error as _describe
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.verify import verify_state

MAX_STEPS = 200


class SandboxEnv:
    """One simulated phone; one episode at a time (servers hold one per session)."""

    kind: EnvKind = "sandbox"

    def __init__(self, *, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps
        self._tools = all_tools()
        self._apps = all_apps()
        self._task: Task | None = None
        self._world: World | None = None
        self._instances: dict[str, App] = {}
        self._allowed: dict[str, BoundTool] = {}
        self._finished = False
        self._answer: str | None = None
        self._steps = 0
        self._initial: dict[str, Any] = {}
        self._writes = WriteLog()
        self._replays: list[_Replayable] = []

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Task) -> Feedback:
        self._task = task
        self._finished = False
        self._answer = None
        self._steps = 0
        # A JSON round trip gives a fresh, detached copy of the world (faster than deepcopy).
        state = orjson.loads(
            orjson.dumps({k: v for k, v in task.world.items() if not k.startswith("_")})
        )
        start = datetime.fromisoformat(
            task.world.get("_clock", {}).get("start", DEFAULT_START.isoformat())
        )
        self._world = World(state, task.user, start)
        app_names = list(
            dict.fromkeys(
                [*task.apps, *(self._tools[t].app.name for t in task.tools if t in self._tools)]
            )
        )
        unknown = [a for a in app_names if a not in self._apps]
        if unknown:
            return Feedback.fail(
                "environment_failure", f"task uses unknown apps: {', '.join(unknown)}"
            )
        self._instances = {name: self._apps[name](self._world) for name in app_names}
        names = task.tools or [t for a in app_names for t in self._apps[a].bound_tools]
        self._allowed = {n: self._tools[n] for n in names if n in self._tools}
        # The state every change is measured from (after the apps installed their defaults).
        self._initial = orjson.loads(snapshot(self._world.state))
        self._writes = WriteLog()
        self._replays = []
        return Feedback.ok(
            {
                "time": self._world.iso_now(),
                "user": task.user.name,
                "apps": app_names,
                "tools": list(self._allowed),
            }
        )

    def step(self, action: Action) -> Feedback:
        if self._world is None or self._task is None:
            return Feedback.fail("precondition_failed", "no episode: call reset(task) first")
        if self._finished:
            return Feedback.fail(
                "precondition_failed", "the episode has finished; no more actions", done=True
            )
        self._steps += 1
        if self._steps > self.max_steps:
            self._finished = True
            return Feedback.fail(
                "precondition_failed", f"step budget of {self.max_steps} exhausted", done=True
            )
        self._world.tick()
        if isinstance(action, ToolCall):
            return self._call(action.tool, action.arguments)
        if isinstance(action, Finish):
            self._finished = True
            self._answer = action.answer
            return Feedback.ok({"finished": True}, done=True)
        if isinstance(action, MessageUser):
            log = self._world.state.setdefault("_user", {}).setdefault("messages", [])
            log.append({"time": self._world.iso_now(), "text": action.text})
            return Feedback.ok({"delivered": True})
        if isinstance(action, Delegate):
            return Feedback.fail(
                "precondition_failed", "delegation is handled by the Harness, not the environment"
            )
        return Feedback.fail(
            "precondition_failed",
            "the sandbox has no screen: UI gestures are not available, use tools",
        )

    def verify(self) -> Verification:
        if self._world is None or self._task is None:
            return Verification(done=False, success=False, progress=0.0)
        # Both sides as JSON, as the per-call diffs see them (a tuple an app keeps is a list).
        final = orjson.loads(snapshot(self._world.state)) if self._writes.calls else {}
        collateral = find_collateral(
            self._task.verifier.checks, self._initial, final, self._writes, replay=self._replay
        )
        return verify_state(
            self._task.verifier,
            self._world.state,
            self._answer,
            finished=self._finished,
            collateral=collateral,
        )

    def tools(self) -> list[ToolSpec]:
        return [bound.spec for bound in self._allowed.values()]

    def close(self) -> None:
        self._world = None
        self._instances = {}

    # ------------------------------------------------------------------ extras
    def state(self) -> dict[str, Any]:
        """A detached snapshot of the phone's state (for servers, debugging and tests)."""
        if self._world is None:
            return {}
        snapshot: dict[str, Any] = orjson.loads(orjson.dumps(self._world.state))
        return snapshot

    @property
    def finished(self) -> bool:
        return self._finished

    def _call(self, name: str, arguments: dict[str, Any]) -> Feedback:
        bound = self._allowed.get(name)
        if bound is None:
            if name in self._tools:
                return Feedback.fail(
                    "unknown_tool", f"tool '{name}' is not available in this scenario"
                )
            return Feedback.fail("unknown_tool", f"no tool named '{name}'")
        task = self._task
        assert task is not None
        if bound.spec.side_effect == "payment" and name not in task.confirmations:
            return Feedback.fail(
                "permission_denied", f"'{name}' moves money and the user has not confirmed it"
            )
        try:
            parsed = bound.args_model.model_validate(arguments)
        except ValidationError as exc:
            return Feedback.fail("invalid_arguments", _describe(name, exc))
        app = self._instances[bound.app.name]
        # A state-changing call is diffed around, so every change it makes (even one a failing
        # call left behind) is attributed to it; what read tools change is never collateral.
        world = self._world
        assert world is not None
        before = snapshot(world.state) if bound.spec.changes_state else None
        replayable = _Replayable(bound, orjson.dumps(arguments), world.now, dict(world._counters))
        try:
            result = bound.method(app, **parsed.__dict__)
            return Feedback.ok(orjson.loads(orjson.dumps(result)))
        except ToolError as exc:
            return Feedback.fail(exc.kind, exc.message)
        except Exception as exc:  # a bug in an app must not kill the episode
            return Feedback.fail(
                "environment_failure", f"{name} crashed: {type(exc).__name__}: {exc}"
            )
        finally:
            if before is not None and self._writes.record(name, before, snapshot(world.state)):
                self._replays.append(replayable)

    def _replay(self, index: int, state: dict[str, Any]) -> dict[str, Any] | None:
        """Run logged state-changing call `index` again on `state`, at the moment and with the
        id counters it first ran with: the state afterwards, or None if the call fails."""
        call = self._replays[index]
        assert self._task is not None
        world = World(state, self._task.user, call.now)
        world._counters.update(call.counters)
        parsed = call.bound.args_model.model_validate(orjson.loads(call.arguments))
        try:
            call.bound.method(call.bound.app(world), **parsed.__dict__)
        except Exception:  # any failure means the call needs what was undone
            return None
        replayed: dict[str, Any] = orjson.loads(snapshot(world.state))
        return replayed


@dataclass(frozen=True)
class _Replayable:
    """What it takes to run a state-changing call again (for the precondition test)."""

    bound: BoundTool
    arguments: bytes
    now: datetime
    counters: dict[str, int]
