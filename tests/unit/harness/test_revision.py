"""Harness revision: failures on a task's scenario widen exactly the setting that closes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from qpa.contract import Task, ToolSpec
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessConfig
from qpa.harness.revision import revise_harness
from qpa.loop.presets import RevisionSettings


def _task() -> Task:
    return next(t for t in generate_suite() if t.id == "notes.add_to_grocery_list.validation.000")


def test_a_hidden_tool_widens_the_tool_cap_and_bumps_the_version() -> None:
    task = _task()
    seen: list[tuple[str, int]] = []

    def needed(
        task: Task, skills: Mapping[str, Mapping[str, str]], tools: Sequence[ToolSpec]
    ) -> list[str]:
        seen.append((task.id, len(tools)))
        return []

    current = HarnessConfig(max_tools=1)
    revision = revise_harness(
        current, [(task, "tool_not_exposed")], RevisionSettings(), skills_needed=needed
    )
    change = revision.changes[0]
    assert change["setting"] == "max_tools" and change["from"] == 1
    widened = revision.config.max_tools
    assert widened is not None and 1 < widened == change["to"] <= RevisionSettings().max_tools_cap
    assert revision.config.version != current.version
    assert seen and all(n > 0 for _, n in seen)  # the scenario's tools reach the rule


def test_a_cause_with_no_setting_is_counted_not_changed() -> None:
    current = HarnessConfig()
    revision = revise_harness(
        current, [(_task(), "parse_error")], RevisionSettings(), skills_needed=lambda *_: []
    )
    assert revision.changes == [] and revision.unaddressed == {"parse_error": 1}
    assert revision.config == current
