"""The notes MCP server of `fakes.mcp_app` plus an admin tool, for the `mcp` kind's allow-list.

`AdminNotesServer` serves it over streamable HTTP in a background thread, like `NotesServer`;
its `admin_wipe` tool deletes every note and records each call in `.admin_calls`, so a test can
check on the server's side that no task ever reached it."""

from __future__ import annotations

from typing import Any

from fakes.mcp_app import NotesServer
from qpa.contract import Finish, Task, ToolCall

#: The admin tool's name.
ADMIN = "admin_wipe"
#: The notes server's own machinery: the tools a server operator lists as control tools.
CONTROL = ("reset_notes", "check_notes")


class AdminNotesServer(NotesServer):
    """The notes server plus `admin_wipe`, which deletes every note and records its call."""

    def __init__(self) -> None:
        super().__init__()
        self.admin_calls: list[dict[str, Any]] = []

        @self.app.tool(name=ADMIN, description="Admin: delete every note of every user.")
        def admin_wipe(answer: str | None = None) -> dict[str, Any]:
            self.admin_calls.append({"answer": answer})
            self.state["notes"].clear()
            return {"wiped": True, "success": True}

    def untouched(self) -> None:
        """Assert the admin tool was never called and the notebook still has its notes."""
        assert self.admin_calls == [], self.admin_calls
        assert self.state["notes"], "the notebook was wiped"


def task(mcp: dict[str, Any], **changes: Any) -> Task:
    """Share the grocery list with Sam, with `mcp` as the task's `_mcp` settings."""
    fields: dict[str, Any] = {
        "id": "notes.share_groceries.test.001",
        "suite": "notes",
        "domain": "notes",
        "capabilities": ["tool_use"],
        "instruction": "Share my Groceries note with sam@example.com.",
        "world": {"_mcp": mcp},
        "reference_plan": [
            ToolCall(tool="search_notes", arguments={"query": "Groceries"}),
            ToolCall(
                tool="share_note",
                arguments={"note_id": "${0.notes.0.id}", "email": "sam@example.com"},
            ),
            Finish(answer="Shared."),
        ],
    }
    fields.update(changes)
    return Task(**fields)


SHARE_WORLD = {
    "reset_tool": "reset_notes",
    "verifier_tool": "check_notes",
    "verifier_arguments": {"title": "Groceries", "shared_with": "sam@example.com"},
}
