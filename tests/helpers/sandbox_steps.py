"""Helpers the sandbox app tests share: open a phone on a task, call tools, expect refusals."""

from __future__ import annotations

from typing import Any

from qpa.contract import Feedback, Task, ToolCall
from qpa.envs.sandbox import SandboxEnv


def open_env(task: Task) -> SandboxEnv:
    """A sandbox reset on `task` (the reset must succeed)."""
    env = SandboxEnv()
    assert env.reset(task).status == "ok"
    return env


def call(env: SandboxEnv, tool: str, **arguments: Any) -> Feedback:
    return env.step(ToolCall(tool=tool, arguments=arguments))


def ok(env: SandboxEnv, tool: str, **arguments: Any) -> Any:
    """The observation of a tool call that must succeed."""
    feedback = call(env, tool, **arguments)
    assert feedback.status == "ok", f"{tool}: {feedback.error}: {feedback.message}"
    return feedback.observation


def refused(
    env: SandboxEnv, tool: str, needle: str, error: str = "precondition_failed", **arguments: Any
) -> str:
    """The message of a tool call that must fail with `error` and mention `needle` (any case)."""
    feedback = call(env, tool, **arguments)
    assert feedback.status == "error", f"{tool} unexpectedly succeeded"
    assert feedback.error == error, feedback.message
    assert needle.lower() in feedback.message.lower(), feedback.message
    return feedback.message


def fails(env: SandboxEnv, tool: str, kind: str, text: str, **arguments: Any) -> None:
    """A tool call that must fail with `kind` and a message containing `text` (exact case)."""
    feedback = call(env, tool, **arguments)
    assert feedback.status == "error", f"{tool} unexpectedly succeeded"
    assert feedback.error == kind, feedback.message
    assert text in feedback.message, feedback.message


def record(env: SandboxEnv, target: str, record_id: str) -> dict[str, Any]:
    """The record `record_id` of collection `app.collection` in the phone's current state."""
    app, collection = target.split(".")
    rows = env.state()[app][collection]
    return next(r for r in rows if r["id"] == record_id)
