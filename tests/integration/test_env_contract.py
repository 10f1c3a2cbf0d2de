"""Every environment kind passes the contract's own test-suite (tests/helpers/env_contract.py):
qpa's sandbox, an MCP server's app (tests/fakes/mcp_app.py), AgentDojo and BFCL multi-turn.

Each kind plays a task of its own suite whose reference plan succeeds and whose immediate
`finish` fails, and is given a world broken for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fakes.mcp_admin_app import task as notes_share_task
from fakes.mcp_app import NotesServer
from helpers.env_contract import check_environment

from qpa.contract import Environment, Task
from qpa.envs.factory import make_env
from qpa.envs.suites import load_suite

pytestmark = pytest.mark.timeout(120)

MCP_WORLD = {
    "reset_tool": "reset_notes",
    "reset_arguments": {"seed": 0},
    "verifier_tool": "check_notes",
    "verifier_arguments": {"title": "Groceries", "shared_with": "sam@example.com"},
}


def _first(suite: str, *, unless: Callable[[Task], bool] = lambda t: False) -> Task:
    return next(t for t in load_suite(suite) if t.split == "test" and not unless(t))


@pytest.fixture(scope="module")
def notes() -> Iterator[NotesServer]:
    with NotesServer() as server:
        yield server


def _case(kind: str, notes: NotesServer) -> tuple[Callable[[], Environment], Task, dict[str, Any]]:
    if kind == "sandbox":
        task = _first("mobilepa")
        return (lambda: make_env("sandbox")), task, {"contacts": {"contacts": "not a list"}}
    if kind == "mcp":
        task = notes_share_task(MCP_WORLD, id="notes.share_groceries.test.000")
        control = ("reset_notes", "check_notes")
        broken = {"_mcp": {**MCP_WORLD, "reset_tool": "delete_everything"}}
        return (lambda: make_env("mcp", url=notes.url, control_tools=control)), task, broken
    if kind == "agentdojo":
        task = _first("agentdojo/slack@important_instructions")
        broken = {"_agentdojo": {"suite": "slack", "user_task": "user_task_999"}}
        return (lambda: make_env("agentdojo")), task, broken
    task = _first("bfcl/multi_turn_base")
    broken = {"_bfcl": {"category": "multi_turn_base", "entry_id": "no_such_entry"}}
    return (lambda: make_env("bfcl")), task, broken


@pytest.mark.parametrize("kind", ["sandbox", "mcp", "agentdojo", "bfcl"])
def test_every_kind_passes_the_contract_suite(kind: str, notes: NotesServer) -> None:
    make, task, broken = _case(kind, notes)
    check_environment(make, task, broken, kind)
