"""The episode runner: drive a planner against an environment and record a `Trajectory`.

The environment may be local or remote; the runner only speaks the contract. It enforces the
episode budgets (turns, tokens, wall time), keeps the sub-agent stack for `Delegate`, and records
actions the Harness answered itself. Failures of the environment or of the model endpoint (a dead
server, a lost device) end the episode with the cause recorded as environment-side; they never
propagate as exceptions to the caller.

The trajectory records what the episode offered, so it can be diagnosed, curated and rendered
without the environment: `tools` is the environment's `tools()` after reset (the planner gets
exactly these), and `skills` the planner's `skills_offered()` when it has Skills (the Harness).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

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
    trajectory = Trajectory(
        id=f"{task.id}#{sample}",
        task=task,
        env_kind=env.kind,
        policy=policy or Policy(planner=planner.name),
        sample=sample,
        started_at=started,
    )
    steps: list[Step] = []
    agents: list[tuple[str, set[str]]] = []  # the sub-agent stack: (name, scoped tools)
    tokens = 0
    try:
        first = env.reset(task)
        if first.status == "error":
            trajectory.error = f"environment: reset failed: {first.message}"
        else:
            offered = list(env.tools())
            trajectory.tools = offered
            planner.start(task, list(offered), first)
            skills_offered = getattr(planner, "skills_offered", None)
            if skills_offered is not None:
                trajectory.skills = list(skills_offered())
            last: Step | None = None
            for index in range(limits.max_turns):
                decision = planner.decide(last)
                t0 = time.perf_counter()
                agent = agents[-1][0] if agents else "main"
                feedback = (
                    decision.feedback
                    or _delegation(decision.action, agents)
                    or env.step(decision.action)
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
        trajectory.verification = env.verify()
    except EpisodeAborted as exc:
        trajectory.error = f"{exc.side}: {exc}"
        trajectory.verification = _safe_verify(env)
    except Exception as exc:  # environment died: keep the evidence
        trajectory.error = f"environment: {type(exc).__name__}: {exc}"
        trajectory.verification = Verification(done=False, success=False, progress=0.0)
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
        end(trajectory)
    return trajectory


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
