"""The episode runner: drive a planner against an environment and record a `Trajectory`.

The environment may be local or remote; the runner only speaks the contract. Failures of the
environment (a dead server, a lost device) end the episode with the cause recorded as
environment-side; they never propagate as exceptions to the caller.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from qpa.contract import Environment, Policy, Step, Task, Trajectory, Verification
from qpa.harness.planners import Planner

DEFAULT_MAX_TURNS = 40


def run_episode(
    env: Environment,
    task: Task,
    planner: Planner,
    *,
    policy: Policy | None = None,
    sample: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> Trajectory:
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
    try:
        first = env.reset(task)
        if first.status == "error":
            trajectory.error = f"environment: reset failed: {first.message}"
        else:
            planner.start(task, env.tools(), first)
            last: Step | None = None
            for index in range(max_turns):
                decision = planner.decide(last)
                t0 = time.perf_counter()
                feedback = env.step(decision.action)
                last = Step.model_construct(
                    index=index,
                    agent=decision.annotations.pop("agent", "main"),
                    action=decision.action,
                    feedback=feedback,
                    duration_ms=(time.perf_counter() - t0) * 1000.0,
                    usage=decision.usage,
                    annotations=decision.annotations,
                )
                steps.append(last)
                if feedback.done:
                    break
            else:
                trajectory.error = f"harness: turn budget of {max_turns} exhausted"
        trajectory.verification = env.verify()
    except Exception as exc:  # environment or planner died: keep the evidence
        trajectory.error = trajectory.error or f"environment: {type(exc).__name__}: {exc}"
        trajectory.verification = Verification(done=False, success=False, progress=0.0)
    trajectory.steps = steps
    trajectory.answer = next(
        (s.action.answer for s in reversed(steps) if s.action.type == "finish"), None
    )
    trajectory.recompute_totals(wall_time_s=time.perf_counter() - clock)
    return trajectory
