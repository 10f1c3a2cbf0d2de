"""`TaskSession`: one task's episode, driven by whoever holds it (an MCP client, through `qpa.mcp`).

A session resets its environment on the task once, then takes calls in the order they arrive
(thread-safe: the MCP server's handlers run them off the event loop) and records each as a
`Step`, so the episode ends as an ordinary `Trajectory`: the same record, verification and
scoring (`qpa.bench`) as an episode the Harness ran. The session never interprets what the
client sends beyond the contract: tool calls, `finish`, `message_user`.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

from qpa.contract import (
    Action,
    Environment,
    Feedback,
    Finish,
    MessageUser,
    Policy,
    Step,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
    Verification,
)

__all__ = ["MCP_CLIENT_PLANNER", "SessionError", "TaskSession"]

#: The planner name an MCP-driven episode is recorded under.
MCP_CLIENT_PLANNER = "mcp-client"


class SessionError(RuntimeError):
    """The session cannot start (its environment refused the task's reset)."""


class TaskSession:
    """The episode of `task` in `env`; `close()` releases the environment."""

    def __init__(
        self,
        env: Environment,
        task: Task,
        *,
        policy: Policy | None = None,
        max_turns: int = 200,
    ) -> None:
        self.env = env
        self.task = task
        self.policy = policy or Policy(planner=MCP_CLIENT_PLANNER)
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._steps: list[Step] = []
        self._started = datetime.now(UTC)
        self._clock = time.perf_counter()
        self._answer: str | None = None
        self._done = False
        self._error: str | None = None
        self.first = env.reset(task)
        if self.first.status == "error":
            raise SessionError(f"reset of task {task.id} failed: {self.first.message}")
        self._tools: list[ToolSpec] = list(env.tools())

    # ------------------------------------------------------------------ reading
    def tools(self) -> list[ToolSpec]:
        """The tools the environment offers in this episode."""
        return list(self._tools)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def steps(self) -> list[Step]:
        with self._lock:
            return list(self._steps)

    # ------------------------------------------------------------------ acting
    def call(self, tool: str, arguments: dict[str, Any]) -> Feedback:
        """Call one of the environment's tools."""
        return self.act(ToolCall(tool=tool, arguments=arguments))

    def finish(self, answer: str | None = None) -> Feedback:
        """End the episode, optionally with an answer for the user."""
        return self.act(Finish(answer=answer))

    def message_user(self, text: str) -> Feedback:
        return self.act(MessageUser(text=text))

    def act(self, action: Action) -> Feedback:
        """Apply one action and record it; after the end, every action is refused."""
        with self._lock:
            if self._done:
                return Feedback.fail(
                    "precondition_failed", "the episode has finished; no more actions", done=True
                )
            if len(self._steps) >= self.max_turns:
                self._done = True
                self._error = f"harness: turn budget of {self.max_turns} exhausted"
                return Feedback.fail(
                    "precondition_failed", f"turn budget of {self.max_turns} exhausted", done=True
                )
            started = time.perf_counter()
            feedback = self.env.step(action)
            self._steps.append(
                Step(
                    index=len(self._steps),
                    action=action,
                    feedback=feedback,
                    duration_ms=(time.perf_counter() - started) * 1000.0,
                )
            )
            if isinstance(action, Finish) and feedback.status == "ok":
                self._answer = action.answer
            if feedback.done:
                self._done = True
            return feedback

    def verify(self) -> Verification:
        """The environment's verdict on the episode so far."""
        with self._lock:
            return self.env.verify()

    def trajectory(self, *, error: str | None = None) -> Trajectory:
        """The episode as a `Trajectory`, verified now."""
        verification = self.verify()
        with self._lock:
            trajectory = Trajectory(
                id=f"{self.task.id}#0",
                task=self.task,
                env_kind=self.env.kind,
                policy=self.policy,
                tools=list(self._tools),
                steps=list(self._steps),
                verification=verification,
                answer=self._answer,
                error=error or self._error,
                started_at=self._started,
            )
        trajectory.recompute_totals(wall_time_s=time.perf_counter() - self._clock)
        return trajectory

    def close(self) -> None:
        self.env.close()
