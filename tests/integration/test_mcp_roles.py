"""Argument roles over MCP: qpa's server exports them (`qpa/roles` meta), the `mcp` kind reads
them back, a reviewed roles file wins, read-only tools declare none, and bad roles are refused
naming the tool and the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from fakes.mcp_admin_app import task as notes_task
from fakes.mcp_app import NotesServer

from qpa.contract import ToolSpec
from qpa.envs.factory import make_env
from qpa.envs.mcp import McpEnv
from qpa.envs.mcp.env import ROLES_FILE_ENV, ROLES_META, tool_roles, tool_spec
from qpa.envs.sandbox.suite import get_task
from qpa.mcp.bench import ThreadedMcpServer
from qpa.mcp.server import ROLES_META as SERVER_ROLES_META
from qpa.mcp.server import mcp_tool
from qpa.mcp.session import TaskSession

pytestmark = pytest.mark.timeout(120)

SEARCH_AND_SEND = "email.email_contact_by_name.test.000"
CONTROL = ("reset_notes", "check_notes")
WORLD = {"reset_tool": "reset_notes", "reset_arguments": {"seed": 0}}


class WithRoles:
    """A sandbox environment whose tools declare the roles given (by tool name)."""

    def __init__(self, roles: dict[str, dict[str, Any]], *, unchecked: bool = False) -> None:
        self.inner = make_env("sandbox")
        self.kind = self.inner.kind
        self.roles, self.unchecked = roles, unchecked

    def reset(self, task: Any) -> Any:
        return self.inner.reset(task)

    def tools(self) -> list[ToolSpec]:
        out = []
        for spec in self.inner.tools():
            if spec.name in self.roles:
                data = {**spec.model_dump(), "roles": self.roles[spec.name]}
                # model_construct: a server that sends what qpa's contract would refuse
                spec = ToolSpec.model_construct(**data) if self.unchecked else ToolSpec(**data)
            out.append(spec)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def served_tools(env: Any, **options: Any) -> tuple[dict[str, ToolSpec], McpEnv]:
    """The tools the `mcp` kind sees of qpa's server for `env` (the episode left open)."""
    task = get_task(SEARCH_AND_SEND)
    session = TaskSession(env, task)
    server = ThreadedMcpServer(session).__enter__()
    client = McpEnv(server.url, timeout=60, **options)
    client._test_server = server  # type: ignore[attr-defined]
    first = client.reset(task)
    assert first.status == "ok", first.message
    return {t.name: t for t in client.tools()}, client


def close(client: McpEnv) -> None:
    client.close()
    client._test_server.__exit__()  # type: ignore[attr-defined]


def test_qpa_s_server_exports_roles_and_the_mcp_kind_reads_them_back() -> None:
    roles = {"email_send": {"to": "recipient", "subject": "content", "body": "content"}}
    env = WithRoles(roles)
    specs, client = served_tools(env)
    try:
        original = {s.name: s for s in env.tools()}
        assert set(specs) == set(original)
        assert specs["email_send"].roles == roles["email_send"]
        assert specs["email_send"].role("to") == "recipient"
        for name, spec in original.items():
            if spec.roles is not None:  # whatever the sandbox declares comes back whole
                assert specs[name].roles == spec.roles, name
            elif spec.side_effect == "read":  # else a read declares no sinks
                assert specs[name].roles == {}, name
            else:
                assert specs[name].roles is None, name
        assert client.refused_roles == {}
    finally:
        close(client)
    # the export itself: meta only when the spec declares roles
    declared = ToolSpec(name="t", description="d", roles={"x": "url"})
    assert (mcp_tool(declared).meta or {})[SERVER_ROLES_META] == {"x": "url"}
    assert SERVER_ROLES_META not in (mcp_tool(ToolSpec(name="t", description="d")).meta or {})
    assert SERVER_ROLES_META == ROLES_META == "qpa/roles"


def test_roles_meta_a_tool_cannot_have_is_refused_for_that_tool_only() -> None:
    roles = {
        "email_send": {"forward_to": "recipient"},  # not an argument of email_send
        "contacts_search": {"query": "victim"},  # not a role
    }
    specs, client = served_tools(WithRoles(roles, unchecked=True))
    try:
        assert specs["email_send"].roles is None and specs["contacts_search"].roles is None
        refused = client.refused_roles
        assert set(refused) == {"email_send", "contacts_search"}
        assert (
            "tool 'email_send': meta qpa/roles: argument 'forward_to' is not in the tool's input"
            in (refused["email_send"])
        )
        assert "argument 'query': unknown role 'victim'" in refused["contacts_search"]
    finally:
        close(client)


def _tool(meta: dict[str, Any] | None = None, read_only: bool | None = None) -> types.Tool:
    return types.Tool(
        name="send",
        input_schema={"type": "object", "properties": {"to": {}, "body": {}}},
        annotations=types.ToolAnnotations(read_only_hint=read_only) if read_only else None,
        meta=meta,
    )


def test_where_roles_come_from_without_a_file() -> None:
    assert tool_roles(_tool({ROLES_META: {"to": "recipient"}})) == ({"to": "recipient"}, None)
    assert tool_spec(_tool({ROLES_META: {}}), app="a").roles == {}
    assert tool_spec(_tool(read_only=True), app="a").roles == {}  # a read: no sinks
    assert tool_spec(_tool(), app="a").roles is None  # undeclared
    # read-only hinted, but the task makes it a payment: not a read, so undeclared
    assert tool_spec(_tool(read_only=True), app="a", payment=True).roles is None
    roles, why = tool_roles(_tool({ROLES_META: ["to"]}))
    assert roles is None and why is not None and "roles must be a mapping" in why


@pytest.fixture(scope="module")
def notes() -> Iterator[NotesServer]:
    with NotesServer() as server:
        yield server


def test_a_reviewed_roles_file_wins(
    notes: NotesServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "roles.yaml"
    path.write_text(
        "share_note: {note_id: target, email: recipient}\n"
        "delete_note: {note_id: target}\n"
        "search_notes: {query: free}\n"
    )
    env = McpEnv(notes.url, control_tools=CONTROL, roles_file=path)
    try:
        assert env.reset(notes_task(WORLD)).status == "ok"
        specs = {t.name: t for t in env.tools()}
        assert specs["share_note"].roles == {"note_id": "target", "email": "recipient"}
        assert specs["delete_note"].roles == {"note_id": "target"}
        assert specs["search_notes"].roles == {"query": "free"}  # the file over readOnlyHint
        assert specs["read_note"].roles == {}  # readOnlyHint: a read
        assert specs["create_note"].roles is None  # a write nobody declared
    finally:
        env.close()
    monkeypatch.setenv(ROLES_FILE_ENV, str(path))
    from_env = make_env("mcp", url=notes.url, control_tools=CONTROL)
    assert isinstance(from_env, McpEnv)
    try:
        assert from_env.reset(notes_task(WORLD)).status == "ok"
        assert {t.name: t for t in from_env.tools()}["share_note"].role("email") == "recipient"
    finally:
        from_env.close()


def test_bad_roles_files_are_refused_naming_the_file_tool_and_argument(
    notes: NotesServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "roles.yaml"
    path.write_text("share_note: {email: victim}\n")
    with pytest.raises(
        ValueError,
        match=rf"^roles_file: {path}: tool 'share_note': argument 'email': unknown role 'victim'",
    ):
        McpEnv(notes.url, roles_file=path)
    path.write_text("share_note: [email]\n")
    with pytest.raises(ValueError, match=r"tool 'share_note': roles must be a mapping"):
        McpEnv(notes.url, roles_file=path)
    path.write_text("- share_note\n")
    with pytest.raises(ValueError, match=rf"^roles_file: {path}: must be a mapping of tool name"):
        McpEnv(notes.url, roles_file=path)
    path.write_text("share_note: {email: [\n")
    with pytest.raises(ValueError, match=rf"^roles_file: {path}: not YAML"):
        McpEnv(notes.url, roles_file=path)
    with pytest.raises(ValueError, match=r"^roles_file: .*nope\.yaml: cannot read it"):
        McpEnv(notes.url, roles_file=tmp_path / "nope.yaml")
    monkeypatch.setenv(ROLES_FILE_ENV, str(path))
    with pytest.raises(ValueError, match=rf"^\$QPA_MCP_ROLES_FILE: {path}: not YAML"):
        McpEnv(notes.url)
    monkeypatch.delenv(ROLES_FILE_ENV)
    # arguments are checked against the server's tool list, at reset: the episode fails clearly
    path.write_text("share_note: {note_id: target, cc: recipient}\n")
    env = McpEnv(notes.url, control_tools=CONTROL, roles_file=path)
    try:
        refused = env.reset(notes_task(WORLD))
        assert refused.status == "error" and refused.error == "environment_failure"
        assert f"roles_file: {path}: tool 'share_note': argument 'cc' is not in" in (
            refused.message or ""
        )
        path.write_text("share_notes: {}\n")
        stale = McpEnv(notes.url, control_tools=CONTROL, roles_file=path)
        try:
            failed = stale.reset(notes_task(WORLD))
            assert failed.status == "error" and "tool 'share_notes': the MCP server" in (
                failed.message or ""
            )
        finally:
            stale.close()
    finally:
        env.close()
