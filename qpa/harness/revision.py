"""Harness revision: Harness-side failures (task, cause) -> the next Harness version.

`revise_harness` turns the diagnosis of a validation run into a new `HarnessConfig` (a wider tool
cap, a larger adapter budget, more memory, more turns), each change with the cause and the number
of failures behind it; `Revision` holds the result. The adapter is simulated on each failed
task's sandbox scenario, so a fix closes every gap of those tasks. Which Skills a task needs is
the diagnosis's rule, passed in as `skills_needed`: the Harness imports no diagnosis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qpa.contract import Task, ToolCall, ToolSpec
from qpa.envs.sandbox import SandboxEnv
from qpa.harness.adapter import ScenarioAdapter
from qpa.harness.agent import HarnessConfig
from qpa.harness.skills import bump_version


@dataclass
class Revision:
    """A Harness revision: the new config and why each setting changed."""

    config: HarnessConfig
    changes: list[dict[str, Any]] = field(default_factory=list)
    unaddressed: dict[str, int] = field(default_factory=dict)


def _scenario_tools(task: Task) -> list[ToolSpec]:
    """The tools the sandbox offers in the task's scenario."""
    env = SandboxEnv()
    try:
        env.reset(task)
        return list(env.tools())
    finally:
        env.close()


def _exposure(harness: HarnessConfig, task: Task, library: Any) -> Any:
    tools = _scenario_tools(task)
    adapter = ScenarioAdapter(
        library,
        token_budget=harness.token_budget,
        max_tools=harness.max_tools,
        drop_skills=set(harness.drop_skills),
    )
    return adapter.select(task.instruction, tools)


def _smallest(values: Iterable[int], ok: Callable[[int], bool], default: int) -> int:
    for value in values:
        if ok(value):
            return value
    return default


def revise_harness(
    current: HarnessConfig,
    failures: Sequence[tuple[Task, str]],
    settings: Any,
    *,
    skills_needed: Callable[
        [Task, Mapping[str, Mapping[str, str]], Sequence[ToolSpec]], Sequence[str]
    ],
) -> Revision:
    """Turn Harness-side failures (task, cause) into the next Harness version.

    The diagnosis reports the first Harness gap of a failure (a missing tool hides a missing
    Skill behind it), so every gap of the failed tasks is closed, the adapter simulated on each
    task's scenario:

    - tools: `max_tools` becomes the smallest value exposing every reference-plan tool;
    - Skills: `token_budget` becomes the smallest budget (steps of 50) at which the adapter
      injects every Skill the task needs (`skills_needed(task, skills, tools)` with the
      Harness's Skills and the scenario's tools: the diagnosis's rule, the loop passes
      `qpa.diagnose.skills_needed`);
    - `memory_retrieval_miss`: `memory_k` grows by 2; `budget_cut`: `max_turns` covers the
      longest reference plan plus 2 recovery turns.

    Other Harness-side causes (a parser or guard rejection) have no setting to turn: they are
    counted in `unaddressed` for a person to look at. Limits come from `RevisionSettings`.
    """

    library = current.skill_library()
    causes = Counter(cause for _, cause in failures)
    update: dict[str, Any] = {}
    changes: list[dict[str, Any]] = []
    max_tools = current.max_tools
    # The diagnosis names the first Harness gap it finds (tools before Skills); a fix must close
    # every gap of those tasks, or the next diagnosis only finds the one behind it.
    tasks = list({t.id: t for t, _ in failures}.values())

    def missing_tools(config: HarnessConfig, task: Task) -> list[str]:
        names = set(_exposure(config, task, library).tool_names)
        return [
            a.tool
            for a in task.reference_plan or []
            if isinstance(a, ToolCall) and a.tool not in names
        ]

    def missing_skills(config: HarnessConfig, task: Task) -> list[str]:
        needed = skills_needed(task, library.skills, _scenario_tools(task))
        if not needed:
            return []
        exposed = set(_exposure(config, task, library).skill_ids)
        return [s for s in needed if s not in exposed]

    tool_tasks = [t for t in tasks if missing_tools(current, t)]
    if tool_tasks and max_tools is not None:
        start = max_tools

        def tools_ok(n: int) -> bool:
            trial = current.model_copy(update={"max_tools": n})
            return not any(missing_tools(trial, t) for t in tool_tasks)

        max_tools = _smallest(
            range(start + 1, settings.max_tools_cap + 1), tools_ok, settings.max_tools_cap
        )
        update["max_tools"] = max_tools
        changes.append(
            {
                "setting": "max_tools",
                "from": start,
                "to": max_tools,
                "cause": "tool_not_exposed",
                "failures": causes["tool_not_exposed"],
                "tasks": len(tool_tasks),
                "tools": sorted({n for t in tool_tasks for n in missing_tools(current, t)}),
                "why": "the reference plan's tools were cut by the adapter's tool cap",
            }
        )
    widened = current.model_copy(update={"max_tools": max_tools})
    skill_tasks = [t for t in tasks if missing_skills(widened, t)]
    if skill_tasks:
        start = current.token_budget

        def skills_ok(budget: int) -> bool:
            trial = widened.model_copy(update={"token_budget": budget})
            return not any(missing_skills(trial, t) for t in skill_tasks)

        budgets = range(start + 50, settings.token_budget_cap + 1, 50)
        budget = _smallest(budgets, skills_ok, settings.token_budget_cap)
        update["token_budget"] = budget
        needed = sorted({s for t in skill_tasks for s in missing_skills(widened, t)})
        changes.append(
            {
                "setting": "token_budget",
                "from": start,
                "to": budget,
                "cause": "skill_not_injected",
                "failures": causes["skill_not_injected"],
                "tasks": len(skill_tasks),
                "skills": needed,
                "why": "Skills the tasks need did not fit the adapter's budget",
            }
        )
    if causes["memory_retrieval_miss"]:
        k = min(settings.memory_k_cap, current.memory_k + 2)
        update["memory_k"] = k
        changes.append(
            {
                "setting": "memory_k",
                "from": current.memory_k,
                "to": k,
                "cause": "memory_retrieval_miss",
                "failures": causes["memory_retrieval_miss"],
                "why": "a remembered value the step needed was not retrieved",
            }
        )
    if causes["budget_cut"]:
        longest = max(len(t.reference_plan or []) for t, c in failures if c == "budget_cut")
        turns = min(settings.max_turns_cap, max(current.max_turns, longest + 2))
        if turns != current.max_turns:
            update["max_turns"] = turns
            changes.append(
                {
                    "setting": "max_turns",
                    "from": current.max_turns,
                    "to": turns,
                    "cause": "budget_cut",
                    "failures": causes["budget_cut"],
                    "why": "the turn budget cut episodes that were on track",
                }
            )
    handled = {"tool_not_exposed", "skill_not_injected", "memory_retrieval_miss", "budget_cut"}
    unaddressed = {c: n for c, n in sorted(causes.items()) if c not in handled}
    version = bump_version(current.version) if changes else current.version
    config = current.model_copy(update={**update, "version": version})
    return Revision(config=config, changes=changes, unaddressed=unaddressed)


__all__ = ["Revision", "revise_harness"]
