"""The episode runner: drive a planner against an environment and record a `Trajectory`.

The environment may be local or remote; the runner only speaks the contract. It enforces the
episode budgets (turns, tokens, wall time), keeps the sub-agent stack for `Delegate`, and records
actions the Harness answered itself. Nothing an episode raises propagates to the caller: the
episode ends and `trajectory.error` records the side the exception came from, as
`"<side>: <Type>: <message> (raised by <component>)"` (and `metadata["abort"]`), so diagnosis blames
the right side:

- **environment**: anything raised by the environment's `reset`, `tools`, `step` or `verify`
  (a dead environment server, a lost device, `RemoteEnv` transport errors), and an
  `EpisodeAborted` with `side="environment"` or an exception whose own `side` says so (a model
  endpoint that cannot be reached: `BackendError.side`);
- **model**: anything the planner's decision raised inside the model backend
  (`qpa.harness.backends`), a model-free planner (`qpa.harness.planners`, `qpa.harness.noisy`)
  or a planner defined outside the Harness (an RL policy, a test's planner);
- **harness**: anything the Harness's own code raised (parsing, adapter, Skills, memory, guard,
  prompt, the agent loop and sub-agent bookkeeping), including its memory write-back after the
  episode, and an `EpisodeAborted` with `side="harness"`.

Which component raised is read from the exception's traceback: the innermost frame in a qpa
module that belongs to one of the sides above (shared data types in `qpa.contract` and this
runner are skipped), so a `ValueError` from pydantic inside the parser is the Harness's and an
`IndexError` inside the local model backend is the model's.

The trajectory records what the episode offered, so it can be diagnosed, curated and rendered
without the environment: `tools` is the environment's `tools()` after reset (the planner gets
exactly these), and `skills` the planner's `skills_offered()` when it has Skills (the Harness).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Literal, TypeVar

from qpa.contract import (
    Action,
    Delegate,
    Environment,
    Feedback,
    Finish,
    Policy,
    Step,
    Task,
    ToolCall,
    Trajectory,
    Verification,
)
from qpa.harness.planners import Planner

DEFAULT_MAX_TURNS = 40

Side = Literal["model", "harness", "environment"]
_SIDES: tuple[Side, ...] = ("model", "harness", "environment")
T = TypeVar("T")

# Module prefixes -> the side their exceptions belong to; the longest matching prefix wins.
_MODULE_SIDES: tuple[tuple[str, Side], ...] = (
    ("qpa.envs", "environment"),
    ("qpa.harness.backends", "model"),
    ("qpa.harness.planners", "model"),
    ("qpa.harness.noisy", "model"),
    ("qpa.harness", "harness"),
)
# Shared by every side (data types, this runner): never where a fault is pinned.
_NEUTRAL = ("qpa.contract", "qpa.harness.runner")
_AGENT = "qpa.harness.agent"  # calls the model backend's `complete`


@dataclass(frozen=True)
class Budgets:
    """Limits on one episode; a cut episode is recorded as a Harness-side stop."""

    max_turns: int = DEFAULT_MAX_TURNS
    max_tokens: int | None = None
    max_wall_s: float | None = None


class EpisodeAborted(Exception):
    """Raised by planners when the episode cannot go on (e.g. the model endpoint is gone).

    `side` says who is to blame in diagnosis: environment (endpoint, server, device) or harness.
    """

    def __init__(self, message: str, side: str = "environment") -> None:
        super().__init__(message)
        self.side = side


class _Fault(Exception):
    """An exception of one episode component, labelled with its side (internal to the runner)."""

    def __init__(self, side: Side, component: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause} (raised by {component})")
        self.side = side
        self.component = component
        self.cause = cause


def _module_side(module: str) -> Side | None:
    best: tuple[int, Side] | None = None
    for prefix, side in _MODULE_SIDES:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > best[0]
        ):
            best = (len(prefix), side)
    return best[1] if best else None


def blame(exc: BaseException, default: Side) -> tuple[Side, str]:
    """(side, module) of where `exc` was raised, read from its traceback.

    The model backend's `complete`, as the Harness agent calls it, and everything it calls are
    the model's (a backend defined anywhere: a served model, a local checkpoint, a test's).
    Otherwise the innermost frame in a qpa module that belongs to a side decides; `default`
    (and the module of the innermost frame) when none does.
    """
    frames: list[tuple[str, str]] = []  # (module, function), outermost first
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        frames.append((str(frame.f_globals.get("__name__", "")), frame.f_code.co_name))
        tb = tb.tb_next
    for (caller, _), (module, function) in itertools.pairwise(frames):
        if caller == _AGENT and function == "complete":
            return "model", module
    for module, _ in reversed(frames):
        if module.startswith(_NEUTRAL):
            continue
        side = _module_side(module)
        if side is not None:
            return side, module
    return default, frames[-1][0] if frames else ""


def _env(component: str, call: Callable[..., T], *args: object) -> T:
    """Call the environment; whatever it raises is the environment's."""
    try:
        return call(*args)
    except EpisodeAborted:
        raise
    except Exception as exc:
        raise _Fault("environment", component, exc) from exc


def _planner(component: str, call: Callable[..., T], *args: object) -> T:
    """Call the planner; what it raises is the model's or the Harness's, by its traceback."""
    try:
        return call(*args)
    except EpisodeAborted:
        raise
    except Exception as exc:
        # an exception that names its own side (a model endpoint that cannot be reached is the
        # environment's: `BackendError.side`) keeps it; otherwise its traceback decides
        declared = getattr(exc, "side", None)
        side = declared if declared in _SIDES else blame(exc, default="model")[0]
        raise _Fault(side, component, exc) from exc


def _harness(component: str, call: Callable[..., T], *args: object) -> T:
    """Call the Harness's own bookkeeping; what it raises is the Harness's."""
    try:
        return call(*args)
    except EpisodeAborted:
        raise
    except Exception as exc:
        raise _Fault("harness", component, exc) from exc


def run_episode(
    env: Environment,
    task: Task,
    planner: Planner,
    *,
    policy: Policy | None = None,
    sample: int = 0,
    max_turns: int | None = None,
    budgets: Budgets | None = None,
) -> Trajectory:
    limits = budgets or Budgets()
    if max_turns is not None:
        limits = Budgets(max_turns, limits.max_tokens, limits.max_wall_s)
    started = datetime.now(UTC)
    clock = time.perf_counter()
    unreachable: _Fault | None = None
    try:
        env_kind = env.kind  # a RemoteEnv asks its server
    except Exception as exc:
        unreachable = _Fault("environment", "env.kind", exc)
        env_kind = "sandbox"  # the field's default: the server never said
    trajectory = Trajectory(
        id=f"{task.id}#{sample}",
        task=task,
        env_kind=env_kind,
        policy=policy or Policy(planner=planner.name),
        sample=sample,
        started_at=started,
    )
    steps: list[Step] = []
    agents: list[tuple[str, set[str]]] = []  # the sub-agent stack: (name, scoped tools)
    tokens = 0
    try:
        if unreachable is not None:
            raise unreachable
        first = _env("env.reset", env.reset, task)
        if first.status == "error":
            trajectory.error = f"environment: reset failed: {first.message}"
        else:
            offered = list(_env("env.tools", env.tools))
            trajectory.tools = offered
            _planner("planner.start", planner.start, task, list(offered), first)
            skills_offered = getattr(planner, "skills_offered", None)
            if skills_offered is not None:
                trajectory.skills = list(_planner("planner.skills_offered", skills_offered))
            last: Step | None = None
            for index in range(limits.max_turns):
                decision = _planner("planner.decide", planner.decide, last)
                t0 = time.perf_counter()
                agent = agents[-1][0] if agents else "main"
                feedback = (
                    decision.feedback
                    or _harness("harness.delegation", _delegation, decision.action, agents)
                    or _env("env.step", env.step, decision.action)
                )
                last = Step.model_construct(
                    index=index,
                    agent=agent,
                    action=decision.action,
                    feedback=feedback,
                    duration_ms=(time.perf_counter() - t0) * 1000.0,
                    usage=decision.usage,
                    annotations=decision.annotations,
                )
                steps.append(last)
                if feedback.done and not agents:
                    break
                tokens += decision.usage.prompt_tokens + decision.usage.completion_tokens
                if limits.max_tokens is not None and tokens > limits.max_tokens:
                    trajectory.error = f"harness: token budget of {limits.max_tokens} exhausted"
                    break
                elapsed = time.perf_counter() - clock
                if limits.max_wall_s is not None and elapsed > limits.max_wall_s:
                    trajectory.error = (
                        f"harness: wall-time budget of {limits.max_wall_s}s exhausted"
                    )
                    break
            else:
                trajectory.error = f"harness: turn budget of {limits.max_turns} exhausted"
        trajectory.verification = _env("env.verify", env.verify)
    except EpisodeAborted as exc:
        trajectory.error = f"{exc.side}: {exc}"
        trajectory.metadata["abort"] = {"side": exc.side, "exception": "EpisodeAborted"}
        trajectory.verification = _safe_verify(env)
    except _Fault as fault:
        _record_fault(trajectory, fault)
        trajectory.verification = (
            Verification(done=False, success=False, progress=0.0)  # the world broke
            if fault.side == "environment"
            else _safe_verify(env)
        )
    trajectory.steps = steps
    trajectory.answer = next(
        (
            s.action.answer
            for s in reversed(steps)
            if isinstance(s.action, Finish) and s.agent == "main"
        ),
        None,
    )
    trajectory.recompute_totals(wall_time_s=time.perf_counter() - clock)
    end = getattr(planner, "end", None)
    if end is not None:  # e.g. the Harness writes memory back from the evidence
        try:
            end(trajectory)
        except Exception as exc:
            side, _ = blame(exc, default="harness")
            ended = _Fault(side, "planner.end", exc)
            if trajectory.error is None:
                _record_fault(trajectory, ended)
            else:
                trajectory.metadata["end_error"] = str(ended)
    return trajectory


def _record_fault(trajectory: Trajectory, fault: _Fault) -> None:
    trajectory.error = f"{fault.side}: {fault}"
    trajectory.metadata["abort"] = {
        "side": fault.side,
        "component": fault.component,
        "exception": type(fault.cause).__name__,
        "module": blame(fault.cause, default=fault.side)[1],
    }


def _safe_verify(env: Environment) -> Verification:
    try:
        return env.verify()
    except Exception:
        return Verification(done=False, success=False, progress=0.0)


def _delegation(action: Action, agents: list[tuple[str, set[str]]]) -> Feedback | None:
    """Handle sub-agent bookkeeping in the Harness; None means: send the action to the env.

    A `Delegate` opens a sub-agent with a scoped tool set; that agent's `Finish` returns its
    answer to the parent instead of ending the episode; its calls outside scope are refused.
    """
    if isinstance(action, Delegate):
        agents.append((action.agent, set(action.tools)))
        return Feedback.ok(
            {"delegated_to": action.agent, "goal": action.goal, "tools": action.tools}
        )
    if not agents:
        return None
    name, scope = agents[-1]
    if isinstance(action, Finish):
        agents.pop()
        return Feedback.ok({"subagent": name, "result": action.answer})
    if isinstance(action, ToolCall) and scope and action.tool not in scope:
        return Feedback.fail(
            "unknown_tool", f"tool '{action.tool}' is outside sub-agent '{name}' scope"
        )
    return None
