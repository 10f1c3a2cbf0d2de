"""The `Environment` protocol every environment kind implements (sandbox, llm_sim, device, remote).

A rollout holds an `Environment` and never asks which kind it is: the same four calls drive a
programmatic sandbox in-process, an environment server over HTTP, an LLM-simulated app or a phone.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from qpa.contract.models import Action, EnvKind, Feedback, Task, ToolSpec, Verification


@runtime_checkable
class Environment(Protocol):
    """reset(task) -> Feedback, step(action) -> Feedback, verify() -> Verification, tools()."""

    kind: EnvKind

    def reset(self, task: Task) -> Feedback:
        """Start an episode of `task` from its deterministic initial state."""
        ...

    def step(self, action: Action) -> Feedback:
        """Apply one action; bad actions come back as error feedback, never as exceptions."""
        ...

    def verify(self) -> Verification:
        """Judge the current state against the task's verifier."""
        ...

    def tools(self) -> list[ToolSpec]:
        """The tools available in the current episode."""
        ...

    def close(self) -> None:
        """Release whatever the environment holds (sessions, connections, devices)."""
        ...
