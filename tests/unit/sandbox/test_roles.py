"""The sandbox's declared argument roles (qpa.envs.sandbox.roles) as the registry attaches them,
and the guard's policy table as docs/security.md prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpa.envs.agentdojo import benchmark as agentdojo
from qpa.envs.effects import check_role_table
from qpa.envs.sandbox.registry import all_tools
from qpa.envs.sandbox.roles import DESTROYING_TOOLS, OPTIONS, TOOL_OVERRIDES
from qpa.harness.policy import RULES


def test_every_sandbox_tool_declares_roles_naming_only_its_own_parameters() -> None:
    tools = all_tools()
    for name, bound in tools.items():
        roles = bound.spec.roles
        assert roles is not None, name
        assert set(roles) <= set(bound.spec.parameters.get("properties") or {}), name
    for table in (DESTROYING_TOOLS, OPTIONS, TOOL_OVERRIDES):
        assert set(table) <= set(tools), set(table) - set(tools)  # no stale entries


def test_sandbox_roles_spot_checks() -> None:
    spec = {n: b.spec for n, b in all_tools().items()}
    assert spec["messaging_send"].role("to") == "recipient"
    assert spec["messaging_send"].role("text") == "content"
    assert spec["notes_delete"].role("note_id") == "destroyed"
    assert spec["notes_update"].role("note_id") == "target"
    assert spec["settings_toggle"].role("setting") == "option"
    assert spec["food_cancel_order"].role("reason") == "free"  # a qualifying choice
    assert spec["settings_connect_wifi"].role("password") == "credential"
    assert spec["wallet_send_money"].role("amount") == "amount"


def test_agentdojo_declares_roles_for_every_state_changing_tool() -> None:
    roles, effects = agentdojo.roles(), agentdojo.effects()
    for suite_name, tools in effects.items():
        for tool, effect in tools.items():
            assert tool in roles[suite_name], (suite_name, tool)
            if effect == "read":  # a read declares only the arguments that choose records
                assert set(roles[suite_name][tool].values()) <= {"target", "recipient", "url"}
    assert roles["workspace"]["delete_file"] == {"file_id": "destroyed"}
    assert roles["slack"]["get_webpage"] == {"url": "url"}
    assert roles["slack"]["read_channel_messages"] == {"channel": "target"}


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"s": {"w": {"nope": "target"}}}, "unknown arguments ['nope']"),
        ({"s": {"w": {"a": "boss"}}}, "unknown roles"),
        ({"s": {}}, "without reviewed roles ['w']"),
        ({"s": {"w": {}, "ghost": {}}}, "unknown tools ['ghost']"),
        ({"t": {}}, "unknown suite names ['t']"),
    ],
)
def test_a_role_table_is_refused_naming_what_is_wrong(table: dict, expected: str) -> None:
    parameters = {"s": {"w": {"a"}, "r": {"q"}}}
    effects = {"s": {"w": "write", "r": "read"}}
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        check_role_table(table, parameters, effects, group="suite")  # type: ignore[arg-type]


def test_docs_print_the_whole_policy_table() -> None:
    text = (Path(__file__).parents[3] / "docs" / "security.md").read_text()
    for r in RULES:
        assert f"| `{r.id}` |" in text, r.id
