"""The Harness's memos per tool object and per trusted text answer as a fresh computation.

The adapter keys a tool once per `ToolSpec` object (`adapter._TOOL_KEYS`), the parser looks a
tool's validators up once per object (`parsing._BY_OBJECT`), and the provenance ledger reads a
trusted text's parts once per string (`provenance._cached_text_parts`). The guard is given the
instruction's own tool relevance as its choice scores when the instruction's quoted text holds
no term. These tests check each against computing afresh, and that a tool whose fields were
assigned anew is not served its earlier key or validator.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from qpa.contract import MemoryItem, Task, ToolCall, ToolSpec, UserProfile
from qpa.envs.sandbox.registry import all_tools
from qpa.harness import adapter as adapter_module
from qpa.harness import parsing, provenance
from qpa.harness.adapter import ScenarioAdapter
from qpa.harness.backends.base import ChatMessage, Completion
from qpa.harness.parsing import ParseFailure, parse_completion
from qpa.harness.provenance import Origin, ProvenanceLedger, text_parts
from qpa.harness.skills import SkillLibrary

LIBRARY = SkillLibrary.from_registry()
TOOLS = [
    bound.spec
    for name, bound in sorted(all_tools().items())
    if name.startswith(("messaging_", "contacts_", "notes_"))
]


def _tool(required: list[str]) -> ToolSpec:
    return ToolSpec(
        name="notes_tag",
        description="Tag a note.",
        app="notes",
        parameters={
            "type": "object",
            "properties": {"note_id": {"type": "string"}, "tag": {"type": "string"}},
            "required": required,
            "additionalProperties": False,
        },
        side_effect="write",
    )


@pytest.fixture(autouse=True)
def _empty_memos() -> None:
    adapter_module._TOOL_KEYS.clear()
    parsing._BY_OBJECT.clear()
    provenance._cached_text_parts.cache_clear()


def test_a_tool_key_is_the_content_key_and_read_once_per_object() -> None:
    spec = _tool(["note_id"])
    first = adapter_module._tool_key(spec)
    assert first == adapter_module._content_key(spec)
    assert adapter_module._TOOL_KEYS[id(spec)][0] is spec  # the object is held: no id reuse
    assert adapter_module._tool_key(spec) is first  # served from the memo
    twin = _tool(["note_id"])  # another object, the same content: the same key
    assert adapter_module._tool_key(twin) == first and len(adapter_module._TOOL_KEYS) == 2


def test_a_tool_whose_fields_are_assigned_anew_is_keyed_afresh() -> None:
    spec = _tool(["note_id"])
    before = adapter_module._tool_key(spec)
    spec.description = "Tag a note with a colour."
    after = adapter_module._tool_key(spec)
    assert after != before and after == adapter_module._content_key(spec)
    spec.parameters = _tool(["note_id", "tag"]).parameters
    assert adapter_module._tool_key(spec) == adapter_module._content_key(spec) != after


def test_the_adapter_with_the_tool_memo_selects_as_with_content_keys() -> None:
    instruction = "Text Maya the gate code from my 'Gate' note"
    remembered = ScenarioAdapter(LIBRARY).select(instruction, TOOLS).model_dump()
    relevance = ScenarioAdapter(LIBRARY).relevance(instruction, TOOLS)
    memo = adapter_module._tool_key
    adapter_module._tool_key = adapter_module._content_key
    try:
        adapter_module._SELECTIONS.clear()
        adapter_module._RELEVANCE.clear()
        assert ScenarioAdapter(LIBRARY).select(instruction, TOOLS).model_dump() == remembered
        assert ScenarioAdapter(LIBRARY).relevance(instruction, TOOLS) == relevance
    finally:
        adapter_module._tool_key = memo


def test_the_validator_memo_follows_a_schema_assigned_anew() -> None:
    spec = _tool(["note_id"])
    ok = '{"name": "notes_tag", "arguments": {"note_id": "n_1"}}'
    assert parse_completion(f"<tool_call>{ok}</tool_call>", [spec]) == ToolCall(
        tool="notes_tag", arguments={"note_id": "n_1"}
    )
    assert parsing._BY_OBJECT[id(spec)][0] is spec
    assert parsing._validator(spec) is parsing._validator(spec)
    spec.parameters = _tool(["note_id", "tag"]).parameters  # now `tag` is required
    refused = parse_completion(f"<tool_call>{ok}</tool_call>", [spec])
    assert isinstance(refused, ParseFailure) and refused.kind == "invalid_arguments"
    assert "'tag' is a required property" in refused.message
    assert parsing._validator(spec) == parsing._content_validator(spec)


@pytest.mark.parametrize(
    "text",
    ["Call +1 (555) 0142 about the lease", "Iron Works gym", "", "room 12 at 400 Market Avenue"],
)
def test_text_parts_from_the_memo_are_the_fresh_ones(text: str) -> None:
    assert provenance._cached_text_parts(text) == text_parts(text)
    assert provenance._cached_text_parts(text) is provenance._cached_text_parts(text)


def test_a_ledger_with_the_text_memo_traces_as_one_without() -> None:
    task = Task(
        id="t-memo",
        domain="test",
        capabilities=["tool_use"],
        instruction="Text Maya Chen at +1 555 0142 that I'm at Iron Works gym",
        user=UserProfile(user_id="u1", name="Sam Lee", phone="+1 555 0100"),
        memory=[MemoryItem(key="gym", value="Iron Works gym", evidence="stated")],
    )
    values = ["Maya Chen", "555-0142", "iron works", "Sam Lee", "+15550100", "Omar", "gym"]
    memo = ProvenanceLedger(task)
    provenance._parts = text_parts
    try:
        fresh = ProvenanceLedger(task)
    finally:
        provenance._parts = provenance._cached_text_parts
    assert [memo.trace(v) for v in values] == [fresh.trace(v) for v in values]
    assert memo.trace("Sam Lee") == Origin("profile", "name")
    assert memo.trace("Omar") is None


def _action(name: str, app: str) -> str:
    return name.removeprefix(f"{app}_").replace("_", " ")


def _no_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
    raise AssertionError("start asks no model")
