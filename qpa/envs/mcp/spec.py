"""What a task says about its MCP server (`task.world["_mcp"]`) and what a verifier tool answers.

    world:
      _mcp:
        reset_tool: reset_notes          # called at reset (seeds the app's state), hidden
        reset_arguments: {seed: 7}
        verifier_tool: check_notes       # called by verify(), hidden
        verifier_arguments: {expect_title: Groceries}
        finish_tool: submit              # called with {answer} when the planner finishes, hidden
        hidden_tools: [admin_wipe]       # never offered to the planner
        payment_tools: [buy_credits]     # side effect `payment`: needs the user's confirmation
        app: notes                       # the tools' app (default: the server's name)

Everything is optional: with no verifier tool the task's rubric (`verifier.kind: rubric`) is
judged by a model instead (`fidelity: llm_judged`). The reset, verifier and finish tools must be
control tools of the server side (`McpEnv(control_tools=...)`, `$QPA_MCP_CONTROL_TOOLS`, a
RolloutPool's `mcp.controlTools`; none by default): a task cannot pick what it calls.

A verifier tool answers a `VerifierReport` as its structured content (or as JSON text): success,
optionally progress, and named checks; what it says is the verification, `fidelity:
programmatic` (the app's own code decided).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

WORLD_KEY = "_mcp"

__all__ = ["WORLD_KEY", "McpWorld", "ReportCheck", "VerifierReport"]


class McpWorld(BaseModel):
    """A task's MCP settings (`task.world["_mcp"]`)."""

    model_config = ConfigDict(extra="forbid")

    reset_tool: str | None = Field(default=None, min_length=1)
    reset_arguments: dict[str, Any] = Field(default_factory=dict)
    verifier_tool: str | None = Field(default=None, min_length=1)
    verifier_arguments: dict[str, Any] = Field(default_factory=dict)
    finish_tool: str | None = Field(default=None, min_length=1)
    hidden_tools: list[str] = Field(default_factory=list)
    payment_tools: list[str] = Field(default_factory=list)
    app: str | None = Field(default=None, min_length=1)


class ReportCheck(BaseModel):
    """One check a verifier tool ran."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    passed: bool
    detail: str = ""


class VerifierReport(BaseModel):
    """What a verifier tool answers: `success`, optional `progress` (0..1) and `checks`."""

    model_config = ConfigDict(extra="ignore")

    success: bool
    progress: float | None = Field(default=None, ge=0.0, le=1.0)
    checks: list[ReportCheck] = Field(default_factory=list)
