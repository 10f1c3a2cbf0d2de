"""Environment-injected transient errors: a seeded wrapper around any `Environment`.

`TransientFaults(env, rate=r, seed=s)` answers, in a share `r` of the episodes (drawn
deterministically from `(seed, task.id)`), the episode's **first state-changing call** (a tool
the episode's `tools()` mark `write` or `payment`) with the transient-error feedback an
environment server gives when it is busy (`Feedback.fail("transient", ...)`, the shape
`qpa.envs.remote.RemoteEnv` returns) instead of passing it on: the wrapped environment never
sees that call, so its state, step count and clock stay as they were. A retry of the same call
goes through. `rate=1.0` gives every episode with a state-changing call one injected error
(what the recovery evaluation uses).

What a planner sees is exactly a real transient error (the message carries no tell). Which
steps were injected is recorded out of band: the wrapper keeps the injected `Feedback` objects
(the runner stores the very object in its `Step`), and `mark_injected(trajectory)` annotates
those steps with `annotations["injected_error"] = {"kind": "transient", "tool": ...}` and the
trajectory with `metadata["injected_errors"]` (the step indexes), so diagnosis, curation and
the recovery evaluation can tell an injected error from one the world produced.
"""

from __future__ import annotations

import hashlib
import random
import threading
from typing import Any

from qpa.contract import (
    Action,
    Environment,
    EnvKind,
    Feedback,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
    Verification,
)

TRANSIENT_MESSAGE = "server busy (transient): the service is temporarily unavailable"
INJECTED = "injected_error"


def injected_episode(seed: int, task_id: str, rate: float) -> bool:
    """Whether the episode of `task_id` gets an injected error (deterministic in the seed)."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(f"transient|{seed}|{task_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big")).random() < rate


class TransientFaults:
    """`env` with one injected transient error at the first state-changing call of a share
    `rate` of the episodes; see the module doc."""

    def __init__(self, env: Environment, *, rate: float = 1.0, seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"transient_error_rate must be within [0, 1], not {rate}")
        self.env = env
        self.rate = float(rate)
        self.seed = int(seed)
        self._writes: set[str] = set()
        self._armed = False
        self._lock = threading.Lock()
        # id(feedback) -> (feedback, label); the feedback is kept so its id is never reused
        self._injected: dict[int, tuple[Feedback, dict[str, Any]]] = {}

    @property
    def kind(self) -> EnvKind:  # a RemoteEnv asks its server, so only when asked
        return self.env.kind

    @kind.setter
    def kind(self, value: EnvKind) -> None:
        self.env.kind = value

    def reset(self, task: Task) -> Feedback:
        first = self.env.reset(task)
        self._writes = set()
        self._armed = first.status == "ok" and injected_episode(self.seed, task.id, self.rate)
        return first

    def tools(self) -> list[ToolSpec]:
        offered = self.env.tools()
        self._writes = {t.name for t in offered if t.changes_state}
        return offered

    def step(self, action: Action) -> Feedback:
        if self._armed and isinstance(action, ToolCall) and action.tool in self._writes:
            self._armed = False
            feedback = Feedback.fail("transient", TRANSIENT_MESSAGE)
            label = {"kind": "transient", "tool": action.tool}
            with self._lock:
                self._injected[id(feedback)] = (feedback, label)
            return feedback
        return self.env.step(action)

    def verify(self) -> Verification:
        return self.env.verify()

    def close(self) -> None:
        self.env.close()

    def mark(self, trajectory: Trajectory) -> list[int]:
        """Annotate the steps of `trajectory` this wrapper injected (and forget them); their
        indexes, also in `trajectory.metadata["injected_errors"]`."""
        marked: list[int] = []
        with self._lock:
            for step in trajectory.steps:
                entry = self._injected.get(id(step.feedback))
                if entry is not None and entry[0] is step.feedback:
                    del self._injected[id(step.feedback)]
                    step.annotations = {**step.annotations, INJECTED: dict(entry[1])}
                    marked.append(step.index)
        if marked:
            trajectory.metadata["injected_errors"] = marked
        return marked


class InjectionLog:
    """The wrappers of a pool of workers, so the thread that records a trajectory can mark it
    whichever worker ran it."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rate = rate
        self.seed = seed
        self._wrappers: list[TransientFaults] = []
        self._lock = threading.Lock()

    def wrap(self, env: Environment) -> Environment:
        wrapper = TransientFaults(env, rate=self.rate, seed=self.seed)
        with self._lock:
            self._wrappers.append(wrapper)
        wrapped: Environment = wrapper
        return wrapped

    def mark(self, trajectory: Trajectory) -> list[int]:
        with self._lock:
            wrappers = list(self._wrappers)
        marked: list[int] = []
        for wrapper in wrappers:
            marked.extend(wrapper.mark(trajectory))
        if marked:
            trajectory.metadata["injected_errors"] = sorted(marked)
        return sorted(marked)


def met_injected_error(trajectory: Trajectory) -> bool:
    """Whether an injected error answered one of the trajectory's calls."""
    return any(INJECTED in s.annotations for s in trajectory.steps)


__all__ = [
    "INJECTED",
    "TRANSIENT_MESSAGE",
    "InjectionLog",
    "TransientFaults",
    "injected_episode",
    "met_injected_error",
]
