"""`run_episode` labels what an episode raised by where it came from, and diagnosis agrees.

A planner (the model's role), a model backend behind the Harness, a Harness component (memory,
parser, guard) and the environment (step, reset, verify, a dead `RemoteEnv`) each raise in turn;
the trajectory records the side in `error` and `metadata["abort"]`, and `qpa.diagnose` reports
that side.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import pytest

from qpa.contract import Action, Feedback, Finish, Step, Task, ToolSpec, Verification
from qpa.diagnose import diagnose
from qpa.envs.remote import RemoteEnv
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.memory import MemoryStore
from qpa.harness.planners import Decision, OraclePlanner
from qpa.harness.runner import EpisodeAborted, blame, run_episode

TASK = next(t for t in generate_suite() if t.template == "add_new_contact" and t.split == "test")


class CrashingPlanner:
    """A planner (the model's stand-in) whose decision raises on the second turn."""

    name = "crashing"

    def __init__(self) -> None:
        self.inner = OraclePlanner()
        self.turns = 0

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        self.inner.start(task, tools, first)

    def decide(self, last: Step | None) -> Decision:
        self.turns += 1
        if self.turns == 2:
            raise RuntimeError("policy head produced NaN logits")
        return self.inner.decide(last)


class CrashingBackend:
    """A model backend behind the Harness that raises (not a `BackendError`)."""

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        raise IndexError("generation ran past the KV cache")


def broken_memory() -> MemoryStore:
    """The Harness's own memory store, its database gone (sqlite raises inside qpa's memory)."""
    store = MemoryStore()
    store.close()
    return store


class FailingWriteBack(MemoryStore):
    def write_back(self, user_id: str, trajectory: Any, tools: Any = None) -> Any:
        raise OSError("disk full while writing memory")


class BrokenEnv(SandboxEnv):
    """A sandbox whose `where` call raises."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def reset(self, task: Task) -> Feedback:
        if self.where == "reset":
            raise ConnectionResetError("environment pod restarted")
        return super().reset(task)

    def step(self, action: Action) -> Feedback:
        if self.where == "step":
            raise KeyError("world state lost")
        return super().step(action)

    def verify(self) -> Verification:
        if self.where == "verify":
            raise RuntimeError("verifier crashed")
        return super().verify()


def harness(backend: Any, memory: MemoryStore | None = None) -> HarnessPlanner:
    return HarnessPlanner(backend, HarnessConfig(), memory=memory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_side(trajectory: Any, side: str, component: str, cause: str) -> None:
    assert trajectory.error is not None and trajectory.error.startswith(f"{side}: "), (
        trajectory.error
    )
    assert trajectory.metadata["abort"]["side"] == side
    assert trajectory.metadata["abort"]["component"] == component
    found = diagnose(trajectory)
    assert found is not None and (found.side, found.cause) == (side, cause), found


def test_a_planner_that_raises_is_the_model_side() -> None:
    trajectory = run_episode(SandboxEnv(), TASK, CrashingPlanner())
    assert_side(trajectory, "model", "planner.decide", "model_error")
    assert "NaN logits" in (trajectory.error or "")
    assert len(trajectory.steps) == 1  # the first turn is kept as evidence
    assert trajectory.verification is not None and trajectory.verification.success is False


def test_a_model_backend_that_raises_is_the_model_side() -> None:
    trajectory = run_episode(SandboxEnv(), TASK, harness(CrashingBackend()))
    assert_side(trajectory, "model", "planner.decide", "model_error")
    assert trajectory.metadata["abort"]["exception"] == "IndexError"


def test_a_harness_component_that_raises_is_the_harness_side() -> None:
    trajectory = run_episode(SandboxEnv(), TASK, harness(OracleBackend(TASK), broken_memory()))
    assert_side(trajectory, "harness", "planner.start", "harness_error")
    assert trajectory.metadata["abort"]["module"] == "qpa.harness.memory"


def test_the_harness_parser_raising_is_the_harness_side(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_parse(*_: Any, **__: Any) -> Any:
        raise ValueError("parser state corrupted")

    broken_parse.__module__ = "qpa.harness.parsing"
    monkeypatch.setattr("qpa.harness.agent.parse_completion", broken_parse)
    trajectory = run_episode(SandboxEnv(), TASK, harness(OracleBackend(TASK)))
    # The function lives in this test file; the frame's module decides: the agent's own loop.
    assert_side(trajectory, "harness", "planner.decide", "harness_error")


def test_a_failing_memory_write_back_is_the_harness_side() -> None:
    trajectory = run_episode(SandboxEnv(), TASK, harness(OracleBackend(TASK), FailingWriteBack()))
    assert trajectory.success  # the episode itself was solved
    assert trajectory.error is not None and trajectory.error.endswith("(raised by planner.end)")
    assert "disk full" in trajectory.error and trajectory.metadata["abort"]["side"] == "harness"


@pytest.mark.parametrize(
    ("where", "component"),
    [("reset", "env.reset"), ("step", "env.step"), ("verify", "env.verify")],
)
def test_an_environment_that_raises_is_the_environment_side(where: str, component: str) -> None:
    trajectory = run_episode(BrokenEnv(where), TASK, OraclePlanner())
    assert_side(trajectory, "environment", component, "environment_error")


def test_an_unreachable_environment_server_is_the_environment_side() -> None:
    env = RemoteEnv(f"http://127.0.0.1:{free_port()}", retries=0, timeout=2)
    trajectory = run_episode(env, TASK, harness(OracleBackend(TASK)))
    assert trajectory.error is not None and trajectory.error.startswith("environment: ")
    found = diagnose(trajectory)
    assert found is not None and found.side == "environment"


def test_an_episode_aborted_keeps_its_side() -> None:
    class Aborting(CrashingPlanner):
        def decide(self, last: Step | None) -> Decision:
            raise EpisodeAborted("model endpoint failed: connection refused", side="environment")

    trajectory = run_episode(SandboxEnv(), TASK, Aborting())
    assert trajectory.error == "environment: model endpoint failed: connection refused"
    found = diagnose(trajectory)
    assert found is not None and found.side == "environment"


def test_blame_reads_the_traceback() -> None:
    def raise_in(module: str) -> BaseException:
        namespace: dict[str, Any] = {"__name__": module}
        exec("def boom():\n    raise ValueError('x')", namespace)
        try:
            namespace["boom"]()
        except ValueError as exc:
            return exc
        raise AssertionError("unreachable")

    assert blame(raise_in("qpa.harness.guard"), "model") == ("harness", "qpa.harness.guard")
    assert blame(raise_in("qpa.harness.backends.local"), "harness")[0] == "model"
    assert blame(raise_in("qpa.envs.remote"), "model")[0] == "environment"
    assert blame(raise_in("qpa.contract.models"), "model")[0] == "model"  # neutral: default
    assert blame(raise_in("torch.nn"), "harness") == ("harness", "torch.nn")
    assert Finish().type == "finish"
