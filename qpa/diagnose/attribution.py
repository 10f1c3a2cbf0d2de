"""Failure attribution: which side a failed trajectory's failure belongs to, and why.

`diagnose(trajectory)` returns `None` for a success and otherwise one `Diagnosis`: the side
(`environment`, `harness` or `model`), a short cause code, the trajectory step that shows it, the
reference-plan step it concerns and a one-line reason. It reads only the trajectory: the task (with
its reference plan, memory and verifier), the steps with their feedback and the Harness's step
annotations (`tools_exposed`, `skills_exposed`, `memory_retrieved`, `parse_failure`, `guard`), and
the tools and Skills the episode offered (`Trajectory.tools`, `Trajectory.skills`: side effects,
apps, argument schemas, Skill texts; `qpa.diagnose.tools`). It never reads an environment's
registry, nor labels a fault injector left behind (`injected_fault`, `plan_step`, metadata).

**Unknown effects.** A called tool the trajectory does not describe (a trajectory written before
tools were recorded) is neither a read nor a write: it is never a harmless re-check or detour, and
never an `extra_action`; every diagnosis lists such tools in `unknown_effects`.

**Alignment with the reference plan.** Plan steps are matched, in order, to the trajectory's steps
(greedy, looking ahead, so detours such as extra reads or recovered errors are allowed): a plan
tool call matches a call of the same tool whose arguments agree on every argument the plan sets
(strings compared case- and whitespace-insensitively; `${i.path}` references resolved from the
observation of the step matched to plan step i, unresolved ones match anything) and that the
Harness or the environment did not block (parser rejection, guard refusal, environment error). A
`Delegate` or a sub-agent's `Finish` is structure, not work: it is never required. The main
agent's final `Finish` matches any main `Finish`. The first plan step with no match is the
**divergence**; the first unmatched, non-structural trajectory step at or after the last match is
where it shows.

**Rules, in order; the first that fires decides.**

Environment side (the episode could not be judged or the world broke):

1. `trajectory.error` starts with `environment:` (dead server, lost device, model endpoint
   down, reset refused): `timeout` when the message speaks of a time-out, else
   `environment_error`.
2. No verification was recorded: `verification_missing`.
3. An `environment_failure` or `transient` error that was never recovered (the same action never
   succeeded later) happened at or before the step where the divergence shows, or hit the
   divergent plan step's own call: `environment_error` (or `timeout`). The failure cascade
   started in the environment, not in a model mistake.

Harness side (the model was not given what the task needed):

4. `trajectory.error` starts with `harness:` and is not a budget cut: `harness_error`. (The
   episode runner labels what an episode raised by where it came from: `harness:` for the
   Harness's own code, `model:` for the planner and its model backend; see rule 4m.)
5. The divergent plan step calls a tool the Harness did not expose (absent from the main
   agent's `tools_exposed`; or, in a sub-agent whose delegation asked for it, from the
   sub-agent's): `tool_not_exposed`.
6. A step carries `parse_failure` although its raw output holds a valid call (read leniently:
   native JSON, `<tool_call>`, `<function=name>`, `name({...})`, `<invoke>` XML, double-encoded
   arguments) of an exposed tool whose arguments satisfy the tool's schema, at or before the
   divergence, and that call never went through later: `parser_rejected_valid_call`.
7. The provenance guard refused the divergent plan step's own call (the reference solution):
   `guard_rejected_valid_call`.
8. A Skill the task needs (`skills_needed`, rule below) is missing from `skills_exposed`, and the
   divergent plan step's tool belongs to that Skill's app or is named by it:
   `skill_not_injected`.
9. The divergent plan step needs a remembered value (a task memory item's value in its
   arguments or answer, not stated in the instruction) and `memory_retrieved` was recorded without
   it: `memory_retrieval_miss`.
10. A budget cut the episode (`harness: ... budget ...`) while the model was on track (every step
    so far matched the plan or was a harmless detour: a successful read or a call of a tool that
    does not exist, not repeated), or the turn budget was smaller than the reference plan (the
    known solution does not fit): `budget_cut`.

Model side (everything it needed was there; it acted wrongly):

4m. `trajectory.error` starts with `model:` (the planner or its model backend raised):
    `model_error`. Checked right after rule 4, before any rule that reads the steps.
11. The same failing call (an error the model can act on: not `transient`/`environment_failure`)
    repeated by the same agent, first made at or before the divergence: `ignored_feedback`.
12. The divergence, by what the trajectory did instead (re-checks, which repeat an earlier
    successful read, and calls of tools that do not exist are noise, considered last): a main
    `Finish` (with give-up wording
    or with several plan calls left: `gave_up`, else `skipped_step`); a call of the plan step's
    tool with other arguments (`ignored_memory` when a differing argument is a remembered value,
    else `wrong_arguments`); a call of a later plan step right away (`skipped_step`); another
    tool in the plan step's place (`wrong_tool`); unparsable output (`malformed_output`);
    nothing or a message to the user (`gave_up`).
13. The plan was followed to the end: the verifier's `answer` check failed (`wrong_answer`, or
    `ignored_memory` when the expected answer is a remembered value); the verification lists
    collateral writes (`Verification.collateral`: state changes the task's verifier does not
    expect, such as an event deleted or a message sent that nobody asked for):
    `collateral_write`, at the last successful call of the tool that made the first one; a
    state-changing call outside the plan succeeded (`extra_action`); a budget cut a wandering
    model (`looping`); otherwise `failed_checks`, naming the failed checks. (A wrong write at the
    divergence is also collateral in the environment's terms, but rule 12 names it more
    precisely: `wrong_arguments`, `wrong_tool`.)

**Which Skills a task needs** (`skills_needed`): only tasks with the `skills` capability need
Skills. Among the Skills of the task's apps, each is scored by the plan's state-changing tools
it names, then all plan tools it names, then the share of the tools it names that the plan uses;
the needed Skills are those with the best score, provided they name at least one plan tool. So
`schedule_text` needs `messaging.scheduled_send` (it names `messaging_schedule`), not
`contacts.resolve_person` (which names only a read).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from qpa.contract import (
    Action,
    Capability,
    Delegate,
    Finish,
    MemoryItem,
    MessageUser,
    SkillSpec,
    Step,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
)
from qpa.diagnose.tools import EpisodeTools
from qpa.harness.parsing import PSEUDO_TOOLS
from qpa.harness.planners import resolve_refs

__all__ = [
    "CAUSES",
    "SIDES",
    "Diagnosis",
    "Side",
    "diagnose",
    "extract_calls",
    "skills_needed",
]

Side = Literal["model", "harness", "environment"]
SIDES: tuple[Side, ...] = get_args(Side)

CAUSES: dict[str, Side] = {
    # environment
    "environment_error": "environment",
    "timeout": "environment",
    "verification_missing": "environment",
    # harness
    "harness_error": "harness",
    "tool_not_exposed": "harness",
    "parser_rejected_valid_call": "harness",
    "guard_rejected_valid_call": "harness",
    "skill_not_injected": "harness",
    "memory_retrieval_miss": "harness",
    "budget_cut": "harness",
    # model
    "model_error": "model",
    "collateral_write": "model",
    "ignored_feedback": "model",
    "gave_up": "model",
    "skipped_step": "model",
    "wrong_arguments": "model",
    "ignored_memory": "model",
    "wrong_tool": "model",
    "malformed_output": "model",
    "wrong_answer": "model",
    "extra_action": "model",
    "looping": "model",
    "failed_checks": "model",
}
"""Every cause code `diagnose` emits, with the side it belongs to."""

ENV_ERRORS = frozenset({"environment_failure", "transient"})
_TIMEOUT = re.compile(r"time[- ]?out|timed out|deadline exceeded", re.IGNORECASE)
_BUDGET = re.compile(r"^harness:\s*(?:(turn)|token|wall-time)\s+budget(?: of (\d+))?")
_GIVE_UP = re.compile(
    r"\b(sorry|could ?n[o']t|cannot|can't|unable|not able|giving up|no tool)\b", re.IGNORECASE
)
_REASON_CHARS = 240


class Diagnosis(BaseModel):
    """Who is to blame for one failed trajectory, where it shows, and why (one line)."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str
    task_id: str
    side: Side
    cause: str
    step: int | None = None
    plan_step: int | None = None
    reason: str
    capabilities: list[Capability] = Field(default_factory=list)
    unknown_effects: list[str] = Field(default_factory=list)
    """Tools the trajectory called (and the environment did not reject as unknown) whose side
    effect it does not record (a trajectory written before tools were): the verdict could not
    tell whether they changed anything."""


# --------------------------------------------------------------------------- tools and skills


def _plan_tools(plan: Sequence[Action]) -> list[str]:
    return [a.tool for a in plan if isinstance(a, ToolCall)]


def skills_needed(
    task: Task,
    skills: Mapping[str, Mapping[str, str]] | Iterable[SkillSpec],
    tools: Iterable[ToolSpec],
) -> list[str]:
    """The Skills (`app.name`) the task needs, by the rule in the module docstring.

    `skills` are the Skills on offer (`SkillSpec`s, or app -> skill name -> text: a Harness's
    library) and `tools` the episode's tools, whose side effects rank the Skills. For a recorded
    episode: `skills_needed(t.task, t.skills, t.tools)`.
    """
    return _skills_needed(task, EpisodeTools.build(tools, skills))


def _skills_needed(task: Task, book: EpisodeTools) -> list[str]:
    if "skills" not in task.capabilities or not task.reference_plan:
        return []
    plan = _plan_tools(task.reference_plan)
    used = set(plan)
    writes = {t for t in used if book.is_write(t)}
    scored: list[tuple[tuple[int, int, float], str]] = []
    for app in task.apps:
        for name, text in sorted((book.skills.get(app) or {}).items()):
            named = book.named_tools(text, used)
            overlap = named & used
            if not overlap:
                continue
            key = (len(overlap & writes), len(overlap), len(overlap) / len(named))
            scored.append((key, f"{app}.{name}"))
    if not scored:
        return []
    best = max(key for key, _ in scored)
    return [skill for key, skill in scored if key == best]


# --------------------------------------------------------------------------- values


def _norm(value: str) -> str:
    return " ".join(value.split()).casefold()


def _same(expected: Any, got: Any, strict: bool = False) -> bool:
    """Whether `got` agrees with the plan's `expected`; an unresolved reference matches anything
    unless `strict`."""
    if isinstance(expected, str) and "${" in expected:
        return not strict
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(
            _same(v, got.get(k), strict) for k, v in expected.items()
        )
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return False
        if all(_same(e, g, strict) for e, g in zip(expected, got, strict=True)):
            return True
        return all(any(_same(e, g, strict) for g in got) for e in expected)
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got or (expected is None and got is None)
    if isinstance(expected, int | float) and isinstance(got, int | float):
        return abs(float(expected) - float(got)) < 1e-9
    if isinstance(expected, str) and isinstance(got, str):
        return _norm(expected) == _norm(got)
    return bool(expected == got)


def _args_agree(expected: Mapping[str, Any], got: Mapping[str, Any], strict: bool = False) -> bool:
    return all(_same(v, got.get(k), strict) for k, v in expected.items())


def _differing(expected: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    return [k for k, v in expected.items() if not _same(v, got.get(k))]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _strings(inner)


def _memories_in(value: Any, memory: Sequence[MemoryItem]) -> list[MemoryItem]:
    """The memory items whose values `value` uses (equal, or contained when 3+ characters)."""
    found: list[MemoryItem] = []
    for text in _strings(value):
        for item in memory:
            if item not in found and (
                _norm(text) == _norm(item.value)
                or (len(item.value) >= 3 and _norm(item.value) in _norm(text))
            ):
                found.append(item)
    return found


def _memory_in(value: Any, memory: Sequence[MemoryItem]) -> MemoryItem | None:
    """The first memory item whose value `value` uses."""
    found = _memories_in(value, memory)
    return found[0] if found else None


def _clip(text: Any, limit: int = 60) -> str:
    shown = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    shown = " ".join(shown.split())
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


# --------------------------------------------------------------------------- lenient call reading

_FUNCTION_TAG = re.compile(r"<function\s*=\s*([A-Za-z][\w.]*)\s*>(.*?)(?:</function>|$)", re.S)
_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_INVOKE = re.compile(r"<invoke\s+name\s*=\s*\"([^\"]+)\"\s*>(.*?)</invoke>", re.S)
_PARAMETER = re.compile(r"<parameter\s+name\s*=\s*\"([^\"]+)\"\s*>(.*?)</parameter>", re.S)
_CALL_SYNTAX = re.compile(r"\b([a-z][a-z0-9_]*)\s*\(\s*(\{.*?\})\s*\)", re.S)
_NAME_KEYS = ("name", "tool", "tool_name", "function", "action")
_ARG_KEYS = ("arguments", "args", "parameters", "input", "params")


def _decode(value: Any) -> Any:
    """JSON text decoded (repeatedly: double-encoded arguments happen), else the value."""
    for _ in range(3):
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return value
    return value


def _json_values(text: str) -> Iterator[Any]:
    """Every top-level JSON object or array embedded in `text`."""
    decoder = json.JSONDecoder()
    index = 0
    while index < len(text):
        start = min(
            (i for i in (text.find("{", index), text.find("[", index)) if i >= 0), default=-1
        )
        if start < 0:
            return
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        yield value
        index = end


def _calls_in(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, list):
        for item in value:
            yield from _calls_in(item)
        return
    if not isinstance(value, dict):
        return
    inner = value.get("function")
    if isinstance(inner, dict):
        yield from _calls_in(inner)
        return
    name = next((value[k] for k in _NAME_KEYS if isinstance(value.get(k), str)), None)
    if name is None:
        return
    args: Any = next((value[k] for k in _ARG_KEYS if k in value), {})
    yield name, args


def extract_calls(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls written in any common format in a model's raw output, read leniently.

    Formats: JSON objects or lists with a name and arguments (also double-encoded), the
    `<tool_call>` text protocol, `<function=name>{...}</function>`, `name({...})` and
    `<invoke name="..."><parameter name="...">...</parameter></invoke>`. Arguments that do not
    decode to a JSON object are dropped.
    """
    found: list[tuple[str, Any]] = []
    for match in _FUNCTION_TAG.finditer(raw):
        found.append((match.group(1), match.group(2)))
    for match in _INVOKE.finditer(raw):
        params = {k: _decode(v) for k, v in _PARAMETER.findall(match.group(2))}
        found.append((match.group(1), params))
    for match in _TOOL_CALL_TAG.finditer(raw):
        for value in _json_values(match.group(1)):
            found.extend(_calls_in(value))
    for value in _json_values(raw):
        found.extend(_calls_in(value))
    for match in _CALL_SYNTAX.finditer(raw):
        found.append((match.group(1), match.group(2)))
    calls: list[tuple[str, dict[str, Any]]] = []
    for name, args in found:
        name = name.strip().removeprefix("functions.")
        decoded = _decode(args)
        if isinstance(decoded, dict) and (name, decoded) not in calls:
            calls.append((name, decoded))
    return calls


def _valid_call(
    book: EpisodeTools, tool: str, arguments: dict[str, Any], *, schema_rejected: bool
) -> bool:
    """Whether the arguments satisfy the tool's schema. Without a known schema, trust the
    Harness's parser: its own schema rejection (`schema_rejected`) stands."""
    validator = book.validator(tool)
    if validator is None:
        return not schema_rejected
    return not any(True for _ in validator.iter_errors(arguments))


# --------------------------------------------------------------------------- the plan and steps


@dataclass(frozen=True)
class _PlanStep:
    index: int
    action: Action
    agent: str
    structural: bool  # a Delegate, or a sub-agent's Finish
    main_finish: bool


def _plan_steps(plan: Sequence[Action]) -> list[_PlanStep]:
    out: list[_PlanStep] = []
    stack: list[str] = []
    for index, action in enumerate(plan):
        agent = stack[-1] if stack else "main"
        if isinstance(action, Delegate):
            out.append(_PlanStep(index, action, agent, True, False))
            stack.append(action.agent)
        elif isinstance(action, Finish) and stack:
            out.append(_PlanStep(index, action, stack.pop(), True, False))
        else:
            out.append(_PlanStep(index, action, agent, False, isinstance(action, Finish)))
    return out


def _structural(step: Step) -> bool:
    return isinstance(step.action, Delegate) or (
        isinstance(step.action, Finish) and step.agent != "main"
    )


def _blocked(step: Step) -> bool:
    """The Harness or the environment stopped this action (it did not take effect)."""
    notes = step.annotations
    return step.feedback.error in ENV_ERRORS or "parse_failure" in notes or "guard" in notes


def _tool(step: Step) -> str | None:
    return step.action.tool if isinstance(step.action, ToolCall) else None


def _failed(step: Step) -> bool:
    return step.feedback.status == "error"


def _same_action(a: Step, b: Step) -> bool:
    if a.agent != b.agent or a.action.type != b.action.type:
        return False
    if isinstance(a.action, ToolCall) and isinstance(b.action, ToolCall):
        return a.action.tool == b.action.tool and a.action.arguments == b.action.arguments
    return a.action.model_dump(exclude={"call_id"}) == b.action.model_dump(exclude={"call_id"})


def _noise(steps: Sequence[Step], index: int, book: EpisodeTools) -> bool:
    """A step that changes nothing and explains nothing on its own: a re-check (a successful
    call of a known read repeating an earlier successful call) or a call of a tool that does not
    exist here. A call of unknown effect is never noise."""
    step = steps[index]
    if not isinstance(step.action, ToolCall):
        return False
    if step.feedback.error == "unknown_tool":
        return True
    return (
        not _failed(step)
        and book.is_read(step.action.tool)
        and any(_same_action(step, s) and not _failed(s) for s in steps[:index])
    )


def _recovered(steps: Sequence[Step], index: int) -> bool:
    """Whether the action of step `index` succeeded later (a retry that worked)."""
    return any(
        _same_action(steps[index], later) and not _failed(later) for later in steps[index + 1 :]
    )


def _resolve(action: Action, results: list[Any]) -> Action:
    if isinstance(action, ToolCall) and "${" in json.dumps(action.arguments, default=str):
        return action.model_copy(update={"arguments": resolve_refs(action.arguments, results)})
    return action


def _matches(step: Step, expected: Action, plan_step: _PlanStep, strict: bool = False) -> bool:
    action = step.action
    if isinstance(expected, ToolCall):
        return (
            isinstance(action, ToolCall)
            and action.tool == expected.tool
            and _args_agree(expected.arguments, action.arguments, strict)
            and not _blocked(step)
        )
    if plan_step.main_finish:
        return isinstance(action, Finish) and step.agent == "main"
    if isinstance(expected, MessageUser):
        return isinstance(action, MessageUser) and "parse_failure" not in step.annotations
    return False


@dataclass
class _Context:
    """A trajectory aligned with its task's reference plan."""

    trajectory: Trajectory
    plan: list[_PlanStep]
    steps: list[Step]
    matched: dict[int, int] = field(default_factory=dict)  # plan index -> step index
    results: list[Any] = field(default_factory=list)
    divergence: int | None = None  # plan index of the first plan step not done
    expected: Action | None = None  # that plan step, references resolved
    cursor: int = 0  # step index after the last matched step
    shown: int | None = None  # first unmatched non-structural step at/after the cursor
    skills_needed: list[str] = field(default_factory=list)
    book: EpisodeTools = field(default_factory=lambda: EpisodeTools.build((), {}))

    @property
    def task_apps(self) -> list[str]:
        return list(self.trajectory.task.apps)

    def before_divergence(self, index: int) -> bool:
        """Whether trajectory step `index` comes at or before where the divergence shows."""
        return self.divergence is None or self.shown is None or index <= self.shown

    def where(self) -> int | None:
        """The step that shows the divergence: the first unmatched step, else the last one."""
        if self.shown is not None:
            return self.shown
        return len(self.steps) - 1 if self.steps else None

    def notes(self, key: str, agent: str = "main") -> Any:
        """The first recorded annotation `key` of `agent` (exposure notes sit on its first step)."""
        for step in self.steps:
            if step.agent == agent and key in step.annotations:
                return step.annotations[key]
        return None

    def opened_by(self, agent: str) -> Delegate | None:
        for step in self.steps:
            if isinstance(step.action, Delegate) and step.action.agent == agent:
                return step.action
        return None

    def agent_at(self, index: int | None) -> str:
        if index is None or index >= len(self.steps):
            return "main"
        return self.steps[index].agent

    def remaining_calls(self) -> int:
        if self.divergence is None:
            return 0
        return sum(
            1
            for p in self.plan[self.divergence :]
            if not p.structural and isinstance(p.action, ToolCall)
        )


def _align(trajectory: Trajectory) -> _Context:
    plan = _plan_steps(trajectory.task.reference_plan or [])
    ctx = _Context(
        trajectory,
        plan,
        list(trajectory.steps),
        results=[None] * len(plan),
        book=EpisodeTools.of(trajectory),
    )
    for plan_step in plan:
        if plan_step.structural:
            continue
        expected = _resolve(plan_step.action, ctx.results)
        found = next(
            (
                j
                for j in range(ctx.cursor, len(ctx.steps))
                if _matches(ctx.steps[j], expected, plan_step)
            ),
            None,
        )
        if found is None:
            ctx.divergence = plan_step.index
            ctx.expected = expected
            break
        ctx.matched[plan_step.index] = found
        ctx.results[plan_step.index] = ctx.steps[found].feedback.observation
        ctx.cursor = found + 1
    candidates = [j for j in range(ctx.cursor, len(ctx.steps)) if not _structural(ctx.steps[j])]
    ctx.shown = next(
        (j for j in candidates if not _noise(ctx.steps, j, ctx.book)),
        candidates[0] if candidates else None,
    )
    return ctx


# --------------------------------------------------------------------------- diagnosis


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 1] + "…"


def _verdict(
    ctx: _Context, cause: str, reason: str, step: int | None, plan_step: int | None = None
) -> Diagnosis:
    trajectory = ctx.trajectory
    return Diagnosis(
        trajectory_id=trajectory.id,
        task_id=trajectory.task.id,
        side=CAUSES[cause],
        cause=cause,
        step=step,
        plan_step=plan_step,
        reason=_one_line(reason),
        capabilities=list(trajectory.task.capabilities),
        unknown_effects=_unknown_effects(ctx),
    )


def _unknown_effects(ctx: _Context) -> list[str]:
    """The called tools whose side effect the trajectory does not record, in call order."""
    found: list[str] = []
    for step in ctx.steps:
        tool = _tool(step)
        if (
            tool is not None
            and tool not in found
            and step.feedback.error != "unknown_tool"
            and "parse_failure" not in step.annotations
            and ctx.book.side_effect(tool) is None
        ):
            found.append(tool)
    return found


def _describe_plan_step(ctx: _Context) -> str:
    expected = ctx.expected
    p = ctx.divergence
    if isinstance(expected, ToolCall):
        return f"plan step {p} ({expected.tool})"
    return f"plan step {p} ({expected.type if expected is not None else 'end'})"


# environment ----------------------------------------------------------------------------------


def _rule_environment_error(ctx: _Context) -> Diagnosis | None:
    error = ctx.trajectory.error or ""
    if not error.startswith("environment:"):
        return None
    cause = "timeout" if _TIMEOUT.search(error) else "environment_error"
    step = len(ctx.steps) - 1 if ctx.steps else None
    return _verdict(ctx, cause, f"the episode ended on {error}", step)


def _rule_verification_missing(ctx: _Context) -> Diagnosis | None:
    if ctx.trajectory.verification is not None:
        return None
    return _verdict(ctx, "verification_missing", "no verification was recorded", ctx.where())


def _unrecovered_errors(ctx: _Context) -> list[int]:
    return [i for i, s in enumerate(ctx.steps) if _failed(s) and not _recovered(ctx.steps, i)]


def _rule_environment_feedback(ctx: _Context) -> Diagnosis | None:
    unrecovered = _unrecovered_errors(ctx)
    first_env = next((i for i in unrecovered if ctx.steps[i].feedback.error in ENV_ERRORS), None)
    if first_env is None:
        return None
    if not (ctx.before_divergence(first_env) or _is_expected_call(ctx, ctx.steps[first_env])):
        return None
    feedback = ctx.steps[first_env].feedback
    cause = "timeout" if _TIMEOUT.search(feedback.message) else "environment_error"
    count = sum(1 for i in unrecovered if ctx.steps[i].feedback.error in ENV_ERRORS)
    return _verdict(
        ctx,
        cause,
        f"step {first_env} got {feedback.error} ({_clip(feedback.message)}) and never "
        f"recovered; {count} unrecovered environment error(s)",
        first_env,
        ctx.divergence,
    )


# harness --------------------------------------------------------------------------------------


def _is_expected_call(ctx: _Context, step: Step) -> bool:
    """Whether `step` is the divergent plan step's own call (tool and arguments)."""
    expected = ctx.expected
    return (
        isinstance(expected, ToolCall)
        and isinstance(step.action, ToolCall)
        and step.action.tool == expected.tool
        and _args_agree(expected.arguments, step.action.arguments)
    )


def _rule_model_error(ctx: _Context) -> Diagnosis | None:
    error = ctx.trajectory.error or ""
    if not error.startswith("model:"):
        return None
    return _verdict(ctx, "model_error", f"the planner's model raised: {error}", ctx.where())


def _rule_collateral_write(ctx: _Context) -> Diagnosis | None:
    verification = ctx.trajectory.verification
    if verification is None or not verification.collateral:
        return None
    first = verification.collateral[0]
    step = next(
        (
            i
            for i in range(len(ctx.steps) - 1, -1, -1)
            if _tool(ctx.steps[i]) == first.tool and not _failed(ctx.steps[i])
        ),
        None,
    )
    record = f"[{first.record_id}]" if first.record_id is not None else ""
    more = len(verification.collateral) - 1
    return _verdict(
        ctx,
        "collateral_write",
        f"unrequested write: {first.change} {first.target}{record}"
        + (f" by {first.tool}" if first.tool else "")
        + (f" ({_clip(first.detail)})" if first.detail else "")
        + (f", and {more} more" if more > 0 else ""),
        step,
    )


def _rule_harness_error(ctx: _Context) -> Diagnosis | None:
    error = ctx.trajectory.error or ""
    if not error.startswith("harness:") or _BUDGET.match(error):
        return None
    return _verdict(ctx, "harness_error", f"the Harness stopped the episode: {error}", ctx.where())


def _rule_tool_not_exposed(ctx: _Context) -> Diagnosis | None:
    expected = ctx.expected
    main = ctx.notes("tools_exposed")
    if not isinstance(expected, ToolCall) or not isinstance(main, list):
        return None
    tool = expected.tool
    where = ctx.where()
    if tool not in main:
        dropped = ctx.notes("tools_dropped") or []
        how = " (dropped by the adapter's tool cap)" if tool in dropped else ""
        return _verdict(
            ctx,
            "tool_not_exposed",
            f"plan step {ctx.divergence} needs {tool}, which the Harness did not expose{how}; "
            f"it showed {len(main)} tool(s)",
            where,
            ctx.divergence,
        )
    agent = ctx.agent_at(where)
    if agent != "main":
        exposed = ctx.notes("tools_exposed", agent)
        opened = ctx.opened_by(agent)
        asked = opened is None or not opened.tools or tool in opened.tools
        if isinstance(exposed, list) and tool not in exposed and asked:
            return _verdict(
                ctx,
                "tool_not_exposed",
                f"plan step {ctx.divergence} needs {tool}; sub-agent {agent} was given it but "
                "the Harness did not expose it",
                where,
                ctx.divergence,
            )
    return None


def _available(ctx: _Context, step: Step) -> set[str]:
    """The tools the model could call at `step` (pseudo-tools included)."""
    exposed = ctx.notes("tools_exposed", step.agent)
    if not isinstance(exposed, list):
        exposed = ctx.notes("tools_exposed")
    names = set(exposed) if isinstance(exposed, list) else set(ctx.trajectory.task.tools)
    return names | {p.name for p in PSEUDO_TOOLS}


def _went_through(ctx: _Context, after: int, tool: str, arguments: dict[str, Any]) -> bool:
    return any(
        isinstance(s.action, ToolCall)
        and s.action.tool == tool
        and _args_agree(arguments, s.action.arguments)
        and not _blocked(s)
        for s in ctx.steps[after + 1 :]
    )


def _rule_parser_rejected(ctx: _Context) -> Diagnosis | None:
    for index, step in enumerate(ctx.steps):
        failure = step.annotations.get("parse_failure")
        if not isinstance(failure, dict) or not ctx.before_divergence(index):
            continue
        raw = failure.get("raw") or (
            step.action.text if isinstance(step.action, MessageUser) else ""
        )
        if not isinstance(raw, str) or not raw:
            continue
        schema_rejected = failure.get("kind") == "invalid_arguments"
        available = _available(ctx, step)
        for tool, arguments in extract_calls(raw):
            if tool not in available:
                continue
            scoped = arguments.get("tools") if tool == "delegate" else None
            hidden = [
                t
                for t in (scoped if isinstance(scoped, list) else [])
                if t not in available and t in ctx.trajectory.task.tools
            ]
            if hidden:
                return _verdict(
                    ctx,
                    "tool_not_exposed",
                    f"step {index}: the delegation needs {', '.join(map(str, hidden[:3]))}, "
                    "which the Harness did not expose",
                    index,
                    ctx.divergence,
                )
            if not _valid_call(ctx.book, tool, arguments, schema_rejected=schema_rejected):
                continue
            if _went_through(ctx, index, tool, arguments):
                continue
            kind = failure.get("kind", "parse failure")
            return _verdict(
                ctx,
                "parser_rejected_valid_call",
                f"step {index}: the parser rejected ({kind}) a valid call "
                f"{tool}({_clip(arguments)}) and it never went through",
                index,
                ctx.divergence,
            )
    return None


def _rule_guard(ctx: _Context) -> Diagnosis | None:
    expected = ctx.expected
    if not isinstance(expected, ToolCall):
        return None
    for index in range(ctx.cursor, len(ctx.steps)):
        step = ctx.steps[index]
        action = step.action
        if (
            "guard" in step.annotations
            and isinstance(action, ToolCall)
            and action.tool == expected.tool
            and _args_agree(expected.arguments, action.arguments)
        ):
            return _verdict(
                ctx,
                "guard_rejected_valid_call",
                f"step {index}: the guard refused the plan's own call {expected.tool} "
                f"({_clip(step.annotations['guard'])})",
                index,
                ctx.divergence,
            )
    return None


def _rule_skill_not_injected(ctx: _Context) -> Diagnosis | None:
    expected = ctx.expected
    exposed = ctx.notes("skills_exposed")
    if not isinstance(expected, ToolCall) or not isinstance(exposed, list):
        return None
    where = ctx.where()
    seen = set(exposed)
    agent = ctx.agent_at(where)
    if agent != "main":
        seen |= set(ctx.notes("skills_exposed", agent) or [])
    app = ctx.book.app_of(expected.tool, ctx.task_apps)
    for skill in ctx.skills_needed:
        if skill in seen:
            continue
        skill_app = skill.partition(".")[0]
        named = ctx.book.named_tools(ctx.book.skill_text(skill), [expected.tool])
        if skill_app == app or expected.tool in named:
            withheld = ctx.notes("skills_withheld") or []
            truncated = ctx.notes("skills_truncated") or []
            how = (
                " (withheld)"
                if skill in withheld
                else " (cut for the token budget)"
                if skill in truncated
                else ""
            )
            return _verdict(
                ctx,
                "skill_not_injected",
                f"{_describe_plan_step(ctx)} needs Skill {skill}, which the Harness did not "
                f"inject{how}",
                where,
                ctx.divergence,
            )
    return None


def _retrieved_values(lines: Iterable[Any]) -> list[str]:
    values: list[str] = []
    for line in lines:
        if isinstance(line, str) and "=" in line:
            value = line.split("=", 1)[1]
            values.append(re.sub(r"\s*\((stated|confirmed|observed|inferred)\)\s*$", "", value))
    return values


def _needed_memories(ctx: _Context, action: Action | None) -> list[MemoryItem]:
    """The remembered values `action` uses that the instruction does not state."""
    task = ctx.trajectory.task
    if action is None or not task.memory:
        return []
    if isinstance(action, ToolCall):
        fields: Any = action.arguments
    elif isinstance(action, Finish):
        fields = action.answer
    else:
        return []
    instruction = _norm(task.instruction)
    return _memories_in(fields, [m for m in task.memory if _norm(m.value) not in instruction])


def _needed_memory(ctx: _Context, action: Action | None) -> MemoryItem | None:
    found = _needed_memories(ctx, action)
    return found[0] if found else None


def _rule_memory_miss(ctx: _Context) -> Diagnosis | None:
    retrieved = ctx.notes("memory_retrieved")
    expected = ctx.expected
    if not isinstance(retrieved, list) or expected is None:
        return None
    shown = ctx.steps[ctx.shown] if ctx.shown is not None else None
    if (
        isinstance(expected, ToolCall)
        and shown is not None
        and isinstance(shown.action, ToolCall)
        and shown.action.tool == expected.tool
    ):  # the right call with wrong arguments: only the memory those arguments needed counts
        keys = _differing(expected.arguments, shown.action.arguments)
        expected = expected.model_copy(
            update={"arguments": {k: expected.arguments[k] for k in keys}}
        )
    values = {_norm(v) for v in _retrieved_values(retrieved)}
    missing = [m for m in _needed_memories(ctx, expected) if _norm(m.value) not in values]
    if not missing:
        return None
    item = missing[0]
    return _verdict(
        ctx,
        "memory_retrieval_miss",
        f"{_describe_plan_step(ctx)} needs the remembered {item.key} = {item.value!r}; memory "
        f"held it but retrieval returned {len(retrieved)} item(s) without it",
        ctx.where(),
        ctx.divergence,
    )


def _harmless(step: Step, book: EpisodeTools) -> bool:
    action = step.action
    if isinstance(action, ToolCall):
        if step.feedback.error == "unknown_tool":
            return True  # rejected before it could do anything
        return not _failed(step) and book.is_read(action.tool)  # unknown effect: not harmless
    if isinstance(action, MessageUser):
        return "parse_failure" not in step.annotations
    return _structural(step)


def _on_track(ctx: _Context) -> bool:
    """Every step either matched the plan or was a harmless detour, and nothing repeated."""
    matched = set(ctx.matched.values())
    others = [i for i in range(len(ctx.steps)) if i not in matched]
    if not all(_harmless(ctx.steps[i], ctx.book) for i in others):
        return False
    return not any(
        _same_action(ctx.steps[i], ctx.steps[j])
        for n, i in enumerate(others)
        for j in others[n + 1 :]
        if not _structural(ctx.steps[i])
    )


def _rule_budget_cut(ctx: _Context) -> Diagnosis | None:
    error = ctx.trajectory.error or ""
    match = _BUDGET.match(error)
    if match is None:
        return None
    minimum = len(ctx.plan)
    turns = int(match.group(2)) if match.group(1) and match.group(2) else None
    too_small = turns is not None and turns < minimum
    if not (too_small or (ctx.divergence is not None and _on_track(ctx))):
        return None
    why = (
        f"the plan needs {minimum} turns"
        if too_small
        else f"the model was on track ({len(ctx.matched)} plan step(s) done)"
    )
    return _verdict(
        ctx,
        "budget_cut",
        f"{error}; {why}",
        len(ctx.steps) - 1 if ctx.steps else None,
        ctx.divergence,
    )


# model ----------------------------------------------------------------------------------------


def _rule_ignored_feedback(ctx: _Context) -> Diagnosis | None:
    steps = ctx.steps
    for i, first in enumerate(steps):
        if not _failed(first) or first.feedback.error in ENV_ERRORS:
            continue
        if not ctx.before_divergence(i):
            return None
        for j in range(i + 1, len(steps)):
            repeat = steps[j]
            if _failed(repeat) and _same_action(first, repeat):
                return _verdict(
                    ctx,
                    "ignored_feedback",
                    f"step {j} repeats the call of step {i} that failed with "
                    f"{first.feedback.error} ({_clip(first.feedback.message)})",
                    j,
                    ctx.divergence,
                )
    return None


def _matches_later(ctx: _Context, index: int) -> int | None:
    """The later plan step (after the divergence) that trajectory step `index` performs.

    Strictly: a reference to an undone step matches nothing. A plan step performed again later
    does not count (the first time was a wrong version of the divergent step)."""
    assert ctx.divergence is not None
    step = ctx.steps[index]
    for plan_step in ctx.plan[ctx.divergence + 1 :]:
        if plan_step.structural or plan_step.main_finish:
            continue
        expected = _resolve(plan_step.action, ctx.results)
        if _matches(step, expected, plan_step, strict=True):
            again = any(
                _matches(later, expected, plan_step, strict=True)
                for later in ctx.steps[index + 1 :]
            )
            return None if again else plan_step.index
    return None


def _next_plan_step(ctx: _Context) -> tuple[int, Action] | None:
    """The first non-structural plan step after the divergence (references resolved, loosely:
    a reference to the undone divergent step matches anything)."""
    assert ctx.divergence is not None
    for plan_step in ctx.plan[ctx.divergence + 1 :]:
        if not plan_step.structural and not plan_step.main_finish:
            return plan_step.index, _resolve(plan_step.action, ctx.results)
    return None


def _gave_up(ctx: _Context, index: int) -> Diagnosis:
    action = ctx.steps[index].action
    answer = action.answer if isinstance(action, Finish) else None
    remaining = ctx.remaining_calls()
    giving_up = bool(answer and _GIVE_UP.search(answer)) or remaining >= 2
    if giving_up or not isinstance(ctx.expected, ToolCall):
        return _verdict(
            ctx,
            "gave_up",
            f"step {index} finished with {remaining} plan call(s) left, before "
            f"{_describe_plan_step(ctx)}" + (f": {_clip(answer)}" if answer else ""),
            index,
            ctx.divergence,
        )
    return _verdict(
        ctx,
        "skipped_step",
        f"step {index} finished without {_describe_plan_step(ctx)}",
        index,
        ctx.divergence,
    )


def _wrong_arguments(ctx: _Context, index: int) -> Diagnosis:
    expected = ctx.expected
    action = ctx.steps[index].action
    assert isinstance(expected, ToolCall) and isinstance(action, ToolCall)
    keys = _differing(expected.arguments, action.arguments)
    memory = _needed_memory(
        ctx, expected.model_copy(update={"arguments": {k: expected.arguments[k] for k in keys}})
    )
    shown = ", ".join(
        f"{k}={_clip(action.arguments.get(k), 40)} (plan: {_clip(expected.arguments[k], 40)})"
        for k in keys[:2]
    )
    if memory is not None:
        return _verdict(
            ctx,
            "ignored_memory",
            f"step {index} called {action.tool} without the remembered {memory.key} = "
            f"{memory.value!r} it had: {shown}",
            index,
            ctx.divergence,
        )
    if not keys and _failed(ctx.steps[index]):
        shown = f"it failed with {ctx.steps[index].feedback.error}"
    return _verdict(
        ctx,
        "wrong_arguments",
        f"step {index} called {action.tool} with wrong arguments: {shown or 'see the plan'}",
        index,
        ctx.divergence,
    )


def _rule_divergence(ctx: _Context) -> Diagnosis | None:
    if ctx.divergence is None:
        return None
    expected = ctx.expected
    window: list[int] = []
    boundary: int | None = None
    for index in range(ctx.cursor, len(ctx.steps)):
        step = ctx.steps[index]
        if _structural(step):
            continue
        if isinstance(step.action, Finish):  # the main agent's Finish: the episode ends here
            if not any(
                (
                    isinstance(ctx.steps[i].action, ToolCall)
                    or "parse_failure" in ctx.steps[i].annotations
                )
                and not _noise(ctx.steps, i, ctx.book)
                for i in window
            ):
                return _gave_up(ctx, index)
            break
        if _matches_later(ctx, index) is not None:
            boundary = index
            break
        window.append(index)
    noise = [i for i in window if _noise(ctx.steps, i, ctx.book)]
    real = [i for i in window if i not in noise]
    same = [i for i in real if _same_tool(ctx, i)]
    if same:
        return _wrong_arguments(ctx, same[0])
    calls = [i for i in real if isinstance(ctx.steps[i].action, ToolCall)]
    if not calls and boundary is None:
        if noise and _BUDGET.match(ctx.trajectory.error or ""):
            return _verdict(
                ctx,
                "looping",
                f"{ctx.trajectory.error}: {len(noise)} repeated or impossible call(s) while "
                f"{_describe_plan_step(ctx)} was never done",
                noise[0],
                ctx.divergence,
            )
        calls = noise
    if isinstance(expected, ToolCall) and calls:
        kind = ctx.book.side_effect(expected.tool)
        alike = [
            i
            for i in calls
            if ctx.book.side_effect(_tool(ctx.steps[i]) or "") == kind
            or ctx.book.is_write(_tool(ctx.steps[i]) or "")
        ]
        if alike or boundary is None:
            index = (alike or calls)[0]
            tool = _tool(ctx.steps[index])
            ahead = _next_plan_step(ctx)
            if ahead is not None and _matches(ctx.steps[index], ahead[1], ctx.plan[ahead[0]]):
                return _verdict(
                    ctx,
                    "skipped_step",
                    f"step {index} did plan step {ahead[0]} ({tool}) without "
                    f"{_describe_plan_step(ctx)}",
                    index,
                    ctx.divergence,
                )
            return _verdict(
                ctx,
                "wrong_tool",
                f"step {index} called {tool} where {_describe_plan_step(ctx)} was due",
                index,
                ctx.divergence,
            )
    if boundary is not None:
        later = _matches_later(ctx, boundary)
        return _verdict(
            ctx,
            "skipped_step",
            f"step {boundary} did plan step {later} without {_describe_plan_step(ctx)}",
            boundary,
            ctx.divergence,
        )
    malformed = [i for i in window if "parse_failure" in ctx.steps[i].annotations]
    if malformed:
        index = malformed[0]
        failure = ctx.steps[index].annotations["parse_failure"]
        message = failure.get("message", "") if isinstance(failure, dict) else ""
        return _verdict(
            ctx,
            "malformed_output",
            f"step {index}: the model's output was not a valid call ({_clip(message)})",
            index,
            ctx.divergence,
        )
    if _BUDGET.match(ctx.trajectory.error or ""):
        return _verdict(
            ctx,
            "looping",
            f"{ctx.trajectory.error} while {_describe_plan_step(ctx)} was never done",
            len(ctx.steps) - 1 if ctx.steps else None,
            ctx.divergence,
        )
    last = window[0] if window else (len(ctx.steps) - 1 if ctx.steps else None)
    what = "messaged the user" if window else "stopped"
    return _verdict(
        ctx,
        "gave_up",
        f"the model {what} instead of {_describe_plan_step(ctx)}",
        last,
        ctx.divergence,
    )


def _same_tool(ctx: _Context, index: int) -> bool:
    action = ctx.steps[index].action
    expected = ctx.expected
    return (
        isinstance(expected, ToolCall)
        and isinstance(action, ToolCall)
        and action.tool == expected.tool
    )


def _rule_outcome(ctx: _Context) -> Diagnosis:
    trajectory = ctx.trajectory
    verification = trajectory.verification
    failed = [c for c in (verification.checks if verification else []) if not c.passed]
    finish = next(
        (
            i
            for i in range(len(ctx.steps) - 1, -1, -1)
            if isinstance(ctx.steps[i].action, Finish) and ctx.steps[i].agent == "main"
        ),
        None,
    )
    answer_check = next((c for c in failed if c.name == "answer"), None)
    if answer_check is not None:
        plan_finish = next((p for p in ctx.plan if p.main_finish), None)
        expected = trajectory.task.verifier.answer
        memory = _needed_memory(ctx, Finish(answer=expected)) if expected else None
        if memory is not None:
            return _verdict(
                ctx,
                "ignored_memory",
                f"the answer {trajectory.answer!r} is not the remembered {memory.key} = "
                f"{memory.value!r}",
                finish,
                plan_finish.index if plan_finish else None,
            )
        return _verdict(
            ctx,
            "wrong_answer",
            f"wrong answer: {_clip(answer_check.detail, 120)}",
            finish,
            plan_finish.index if plan_finish else None,
        )
    collateral = _rule_collateral_write(ctx)
    if collateral is not None:
        return collateral
    matched = set(ctx.matched.values())
    extra = next(
        (
            i
            for i, s in enumerate(ctx.steps)
            if ctx.plan
            and i not in matched
            and isinstance(s.action, ToolCall)
            and ctx.book.is_write(s.action.tool)  # a call of unknown effect is not claimed
            and not _failed(s)
        ),
        None,
    )
    if extra is not None:
        tool = _tool(ctx.steps[extra])
        return _verdict(
            ctx, "extra_action", f"step {extra} made a state change outside the plan: {tool}", extra
        )
    if _BUDGET.match(trajectory.error or ""):
        return _verdict(
            ctx,
            "looping",
            f"{trajectory.error} without finishing the task",
            len(ctx.steps) - 1 if ctx.steps else None,
        )
    names = ", ".join(c.name for c in failed[:3]) or "none recorded"
    return _verdict(ctx, "failed_checks", f"verification failed: {names}", finish)


_RULES = (
    _rule_environment_error,
    _rule_verification_missing,
    _rule_environment_feedback,
    _rule_harness_error,
    _rule_model_error,
    _rule_tool_not_exposed,
    _rule_parser_rejected,
    _rule_guard,
    _rule_skill_not_injected,
    _rule_memory_miss,
    _rule_budget_cut,
    _rule_ignored_feedback,
    _rule_divergence,
)


def diagnose(
    trajectory: Trajectory, *, skills_needed: Iterable[str] | None = None
) -> Diagnosis | None:
    """Attribute a failed trajectory to one side (rules in the module docstring); None on success.

    `skills_needed` overrides which Skills (`app.name`) the task needs; by default they are
    derived from the task (see `skills_needed`).
    """
    if trajectory.success:
        return None
    ctx = _align(trajectory)
    ctx.skills_needed = (
        list(skills_needed) if skills_needed is not None else _needed_for(trajectory)
    )
    for rule in _RULES:
        verdict = rule(ctx)
        if verdict is not None:
            return verdict
    return _rule_outcome(ctx)


def _needed_for(trajectory: Trajectory) -> list[str]:
    return _skills_needed(trajectory.task, EpisodeTools.of(trajectory))
