"""`RecoveringPlanner`: the oracle that makes a mistake the environment rejects, then recovers.

It follows the task's reference plan like `OraclePlanner`, with two departures that put
error-then-recovery turns into collected data:

- **A wrong call, corrected.** In a share `mistake_rate` of the episodes (drawn from
  `(seed, task.id)`), at one state-changing step of the plan whose tool has a required argument,
  it first sends the call with that argument left out. The environment answers
  `invalid_arguments` (the sandbox validates arguments before any state is touched); the next
  turn sends the planned call. The wrong call's step is annotated
  `recovery = {"role": "mistake", ...}` with `train = False` and `mask_reason =
  "recovered_mistake"` (SFT never learns the mistake, whatever the feedback was); the corrected
  call is annotated `recovery = {"role": "correction", "of_step": i}` and trained.
- **Transient errors retried.** A call answered `transient` (a busy server, or one injected by
  `qpa.envs.faults.TransientFaults`) is sent again, up to `max_retries` times, as the Harness's
  hint for that error says; the retry is annotated `recovery = {"role": "retry", "of_step": i}`.

Results of rejected attempts never enter the plan's `${i}` references: the plan's step `i` is
grounded in the observation of the attempt that went through.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from qpa.contract import Feedback, Finish, Step, Task, ToolCall, ToolSpec
from qpa.harness.planners import Decision, OraclePlanner, ground

RETRYABLE = frozenset({"transient"})
MISTAKE_MASK = "recovered_mistake"


def _rng(seed: int, task_id: str) -> random.Random:
    digest = hashlib.sha256(f"recovering|{seed}|{task_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


class RecoveringPlanner(OraclePlanner):
    """The oracle with a corrected mistake and transient-error retries; see the module doc."""

    name = "oracle"

    def __init__(self, mistake_rate: float = 1.0, seed: int = 0, max_retries: int = 2) -> None:
        super().__init__()
        if not 0.0 <= mistake_rate <= 1.0:
            raise ValueError(f"mistake_rate must be within [0, 1], not {mistake_rate}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, not {max_retries}")
        self.mistake_rate = float(mistake_rate)
        self.seed = int(seed)
        self.max_retries = int(max_retries)
        self._mistake: tuple[int, str] | None = None  # (plan step, argument left out)
        self._pending: tuple[ToolCall, int] | None = None  # the call to send after a mistake
        self._sent: tuple[ToolCall, int] | None = None  # the last plan call sent, its plan step
        self._retries = 0

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        super().start(task, tools, first)
        self._mistake = None
        self._pending = None
        self._sent = None
        self._retries = 0
        rng = _rng(self.seed, task.id)
        if rng.random() >= self.mistake_rate:
            return
        specs = {t.name: t for t in tools}
        candidates: list[tuple[int, str]] = []
        for index, action in enumerate(self._plan):
            spec = specs.get(action.tool) if isinstance(action, ToolCall) else None
            if spec is None or not spec.changes_state or not isinstance(action, ToolCall):
                continue
            required = [
                str(name)
                for name in spec.parameters.get("required") or []
                if name in action.arguments
            ]
            candidates.extend((index, name) for name in sorted(required))
        if candidates:
            self._mistake = candidates[rng.randrange(len(candidates))]

    def decide(self, last: Step | None) -> Decision:
        if last is not None:
            error = last.feedback.error if last.feedback.status == "error" else None
            if self._pending is not None:
                planned, plan_step = self._pending
                self._pending = None
                if error is not None:  # rejected, as meant: send the planned call
                    self._sent = (planned, plan_step)
                    self._retries = 0
                    return Decision(
                        planned,
                        annotations={
                            "plan_step": plan_step,
                            "recovery": {"role": "correction", "of_step": last.index},
                        },
                    )
                # the wrong call went through after all: its result stands for the plan step's
            elif error in RETRYABLE and self._sent is not None and self._retries < self.max_retries:
                self._retries += 1
                again, plan_step = self._sent
                return Decision(
                    again,
                    annotations={
                        "plan_step": plan_step,
                        "recovery": {"role": "retry", "of_step": last.index},
                    },
                )
            self._results.append(last.feedback.observation)
        self._retries = 0
        self._sent = None
        if self._cursor >= len(self._plan):
            return Decision(Finish())
        index = self._cursor
        self._cursor += 1
        action = ground(self._plan[index], self._results)
        annotations: dict[str, Any] = {"plan_step": index}
        if isinstance(action, ToolCall):
            if self._mistake is not None and self._mistake[0] == index:
                left_out = self._mistake[1]
                self._mistake = None
                if left_out in action.arguments:
                    self._pending = (action, index)
                    wrong = action.model_copy(
                        update={
                            "arguments": {
                                k: v for k, v in action.arguments.items() if k != left_out
                            }
                        }
                    )
                    annotations.update(
                        recovery={
                            "role": "mistake",
                            "detail": f"{action.tool} without its required argument {left_out!r}",
                        },
                        train=False,
                        mask_reason=MISTAKE_MASK,
                    )
                    return Decision(wrong, annotations=annotations)
            self._sent = (action, index)
        return Decision(action, annotations=annotations)


def recovery_roles(steps: list[Step]) -> dict[int, str]:
    """Step index -> its recovery role (`mistake`, `correction`, `retry`), for the steps that
    have one."""
    return {
        s.index: str(s.annotations["recovery"]["role"])
        for s in steps
        if isinstance(s.annotations.get("recovery"), dict)
    }


__all__ = ["MISTAKE_MASK", "RETRYABLE", "RecoveringPlanner", "recovery_roles"]
