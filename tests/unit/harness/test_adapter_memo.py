"""The Scenario Adapter's memo of what it selected: the same answer as computing it afresh.

`select` and `relevance` remember their answer per tool set (every tool's content), query
terms and adapter settings. These tests check a remembered answer against a fresh one, that a
changed tool or setting is not served an earlier answer, that the exposure names the caller's
own tool objects, and that changing a returned exposure cannot change a later one.
"""

from __future__ import annotations

import pytest

from qpa.contract import ToolSpec
from qpa.envs.sandbox.registry import all_tools
from qpa.harness import adapter as adapter_module
from qpa.harness.adapter import ScenarioAdapter
from qpa.harness.skills import SkillLibrary

LIBRARY = SkillLibrary.from_registry()
TOOLS = [
    bound.spec
    for name, bound in sorted(all_tools().items())
    if name.startswith(("messaging_", "contacts_", "calendar_"))
]
INSTRUCTION = "Text Maya that the dentist appointment moved to 3pm"


@pytest.fixture(autouse=True)
def _empty_memos() -> None:
    adapter_module._SELECTIONS.clear()
    adapter_module._RELEVANCE.clear()


def _fresh_select(tools: list[ToolSpec], token_budget: int = 1500) -> dict[str, object]:
    adapter_module._SELECTIONS.clear()
    return ScenarioAdapter(LIBRARY, token_budget).select(INSTRUCTION, tools).model_dump()


def test_a_remembered_selection_is_the_fresh_one() -> None:
    first = ScenarioAdapter(LIBRARY, token_budget=900).select(INSTRUCTION, TOOLS)
    assert len(adapter_module._SELECTIONS) == 1
    again = ScenarioAdapter(LIBRARY, token_budget=900).select(INSTRUCTION, TOOLS)
    assert again.model_dump() == first.model_dump() == _fresh_select(TOOLS, token_budget=900)
    assert again is not first and again.tools is not first.tools


def test_a_changed_tool_or_setting_is_not_served_the_earlier_answer() -> None:
    ScenarioAdapter(LIBRARY, token_budget=900).select(INSTRUCTION, TOOLS)
    changed = [t.model_copy() for t in TOOLS]
    target = next(i for i, t in enumerate(changed) if t.name == "messaging_send")
    changed[target] = changed[target].model_copy(
        update={"description": "Beam a holographic note to a phone number."}
    )
    got = ScenarioAdapter(LIBRARY, token_budget=900).select(INSTRUCTION, changed)
    assert got.model_dump() == _fresh_select(changed, token_budget=900)
    assert "holographic" in got.text
    tighter = ScenarioAdapter(LIBRARY, token_budget=300).select(INSTRUCTION, TOOLS)
    assert tighter.model_dump() == _fresh_select(TOOLS, token_budget=300)
    assert tighter.budget == 300


def test_the_exposure_holds_the_callers_tools_and_its_own_lists() -> None:
    first = ScenarioAdapter(LIBRARY).select(INSTRUCTION, TOOLS)
    copies = [t.model_copy() for t in TOOLS]
    second = ScenarioAdapter(LIBRARY).select(INSTRUCTION, copies)
    assert [t.name for t in second.tools] == [t.name for t in first.tools]
    mine = {id(t) for t in copies}
    assert all(id(t) in mine for t in second.tools)
    first.tools.clear()
    first.schemas.append("not a tool")
    first.tool_scores.clear()
    if first.skills:
        first.skills[0].text = "changed by a caller"
    third = ScenarioAdapter(LIBRARY).select(INSTRUCTION, TOOLS)
    assert third.model_dump() == second.model_dump() == _fresh_select(TOOLS)


def test_remembered_relevance_is_the_fresh_one_and_a_copy() -> None:
    apps, tools = ScenarioAdapter(LIBRARY).relevance(INSTRUCTION, TOOLS)
    apps["messaging"] = -1.0
    tools.clear()
    again = ScenarioAdapter(LIBRARY).relevance(INSTRUCTION, TOOLS)
    adapter_module._RELEVANCE.clear()
    assert again == ScenarioAdapter(LIBRARY).relevance(INSTRUCTION, TOOLS)
    assert again[0]["messaging"] > 0 and again[1]
    other = ScenarioAdapter(LIBRARY).relevance("What is on my calendar tomorrow?", TOOLS)
    assert other != again
