"""Fault injection to MEASURE diagnosis: known Harness, environment and model faults, labelled.

Test and benchmark code, not part of the library: `qpa.diagnose` never uses it. The tests
(`helpers.faults`, `tests` is on pytest's path) and the benchmark
(`benchmarks/diagnosis_accuracy.py`, which puts `tests` on `sys.path`) run tasks under each fault
and score the attribution against the fault's known side and cause. Every fault goes through the
real agent loop (`HarnessPlanner` + `run_episode` on the sandbox), so the trajectories look
exactly like production ones. The faults are built from the sandbox registry (which Skills a task
needs, which plan step writes); the diagnosis reads the same facts from the trajectory.

Models (scripted, no weights):

- `SkillSensitiveBackend(task)`: a model that knows the reference plan but acts only on what its
  context shows, with the characteristic mistake when something is missing: a plan tool that is
  not offered -> it gives up; a needed Skill (`skills_needed`) absent from its system prompt ->
  at that Skill's procedure step (the first state-changing plan step the Skill names) it calls
  the obvious-but-wrong tool the Skill warns about (another tool of the app the Skill names,
  e.g. `messaging_send` instead of `messaging_schedule`), or skips the step if there is none; a
  remembered value absent from the prompt's memory -> it uses a stale value the user once had
  (a conflicting memory item), or gives up when there is none. With everything present it is
  the oracle.
- `FormatMismatchBackend(task, style)`: the oracle emitting valid calls in a format the
  Harness's parser rejects (`function_tag`: `<function=name>{...}</function>`;
  `double_encoded`: native calls whose arguments are JSON-encoded twice).
- `EndpointDownBackend(inner, at_turn)`: the model endpoint dies at a turn.
- `PlannerBackend(planner, task)`: any model-free planner (the `noisy` one) speaking as a model
  through the Harness, so model faults can be measured with the Harness's annotations present.

Harness faults go through `HarnessConfig` (`drop_skills`, `max_tools`, `memory_k`, `max_turns`),
`HidingHarnessPlanner` (a filtered tool list) or `EmptyMemoryStore` (retrieval returns nothing).
Environment faults wrap the sandbox in `FaultyEnv` (an `environment_failure` or `transient`
answer at a step, a dead server or a time-out raised at a step, a refused reset).

`FAULTS` names every fault with its expected side and cause; `run_noisy` runs the `noisy`
planner (directly, or through the Harness) and returns its label; `measure` runs sources over
tasks (only where the clean Harness solves the task: the control) and diagnoses each episode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from qpa.contract import (
    Action,
    Delegate,
    EnvKind,
    Feedback,
    Finish,
    MemoryItem,
    MessageUser,
    Policy,
    Step,
    Task,
    TokenUsage,
    ToolCall,
    ToolSpec,
    Trajectory,
    Verification,
)
from qpa.diagnose import named_tools
from qpa.diagnose import skills_needed as needed_skills
from qpa.diagnose.attribution import Diagnosis, Side, diagnose
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.registry import all_tools, skills_for, tool_specs
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import (
    BackendUnavailable,
    ChatMessage,
    Completion,
    ModelBackend,
    RawToolCall,
)
from qpa.harness.memory import MemoryStore, RetrievedMemory
from qpa.harness.noisy import NoisyPlanner
from qpa.harness.planners import Planner, resolve_refs
from qpa.harness.runner import run_episode

__all__ = [
    "ENVIRONMENT_FAULTS",
    "FAULTS",
    "HARNESS_FAULTS",
    "NOISY_CAUSES",
    "EmptyMemoryStore",
    "EndpointDownBackend",
    "Fault",
    "FaultyEnv",
    "FormatMismatchBackend",
    "HidingHarnessPlanner",
    "Outcome",
    "PlannerBackend",
    "SkillSensitiveBackend",
    "clean_run_succeeds",
    "expected_noisy_cause",
    "measure",
    "memory_needed",
    "run_harness",
    "run_noisy",
]

GIVE_UP_TOOL = "I can't do this: the tool it needs is not available to me."
_PREFACE_END = "]\n"


# --------------------------------------------------------------------------- the sandbox's facts


def is_write(tool: str) -> bool:
    """Whether a sandbox tool changes state (tools the sandbox does not have: False)."""
    bound = all_tools().get(tool)
    return bound is not None and bound.spec.side_effect != "read"


def task_skills(task: Task) -> list[str]:
    """The Skills a sandbox task needs: the diagnosis's rule over the registry's Skills of the
    task's apps and the tools its sandbox episode offers (what a Harness run records)."""
    return needed_skills(task, skills_for(list(task.apps)), _offered(task))


def _offered(task: Task) -> list[ToolSpec]:
    """The tools the sandbox offers in an episode of `task` (its `tools()` after reset)."""
    env = SandboxEnv()
    try:
        env.reset(task)
        return list(env.tools())
    finally:
        env.close()


def _skill_names(text: str, known: Iterable[str] = ()) -> set[str]:
    """The sandbox tools (or `known` names) a Skill's text mentions."""
    return named_tools(text, set(all_tools()) | set(known))


# --------------------------------------------------------------------------- helpers


def _observation(message: ChatMessage) -> Any:
    """The `result` of a quoted tool result message (None for errors or other messages)."""
    content = message.content or ""
    _, _, body = content.partition(_PREFACE_END)
    try:
        data = json.loads(body or content)
    except json.JSONDecodeError:
        return None
    return data.get("result") if isinstance(data, dict) else None


def _wire(action: Action) -> tuple[str, dict[str, Any]]:
    """The action as a (tool name, arguments) call, pseudo-tools included."""
    if isinstance(action, ToolCall):
        return action.tool, dict(action.arguments)
    if isinstance(action, Finish):
        return "finish", {"answer": action.answer}
    if isinstance(action, Delegate):
        return "delegate", {"goal": action.goal, "tools": action.tools, "agent": action.agent}
    if isinstance(action, MessageUser):
        return "message_user", {"text": action.text}
    raise ValueError(f"a scripted backend cannot express a {action.type} action")


def _usage(messages: Sequence[ChatMessage], completion_tokens: int) -> TokenUsage:
    prompt = sum(len(m.content or "") for m in messages) // 4
    return TokenUsage(prompt_tokens=prompt, completion_tokens=completion_tokens)


def memory_needed(task: Task, action: Action) -> MemoryItem | None:
    """The task memory item whose value `action` uses and the instruction does not state."""
    if isinstance(action, ToolCall):
        values: list[Any] = list(action.arguments.values())
    elif isinstance(action, Finish) and action.answer:
        values = [action.answer]
    else:
        return None
    instruction = task.instruction.casefold()
    for value in values:
        if not isinstance(value, str):
            continue
        for item in task.memory:
            if item.value.casefold() in instruction:
                continue
            if value == item.value or (len(item.value) >= 3 and item.value in value):
                return item
    return None


def _procedure_steps(task: Task, needed: Iterable[str]) -> dict[int, str]:
    """Plan index -> the needed Skill whose procedure that step is (first write it names)."""
    plan = task.reference_plan or []
    calls = [(i, a.tool) for i, a in enumerate(plan) if isinstance(a, ToolCall)]
    out: dict[int, str] = {}
    for skill in needed:
        app, _, name = skill.partition(".")
        text = skills_for([app]).get(app, {}).get(name, "")
        named = _skill_names(text, [tool for _, tool in calls])
        steps = [i for i, tool in calls if tool in named]
        writes = [i for i, tool in calls if tool in named and is_write(tool)]
        if steps:
            out.setdefault((writes or steps)[0], skill)
    return out


# --------------------------------------------------------------------------- model backends


class _Detours:
    """Noise a real model adds on the way: every `every`-th turn it either re-runs its latest
    successful read (a re-check) or calls a misspelt tool name (an error it then leaves
    behind), alternating. Neither changes the outcome; diagnosis must see through both."""

    def __init__(self, every: int | None) -> None:
        self.every = every
        self.turn = 0
        self.count = 0
        self.reads: list[ToolCall] = []

    def due(self, last: Action | None, observation: Any) -> ToolCall | None:
        if isinstance(last, ToolCall) and observation is not None and not is_write(last.tool):
            self.reads.append(last)
        self.turn += 1
        if not self.every or self.turn % self.every:
            return None
        self.count += 1
        if self.count % 2 and self.reads:
            return self.reads[-1].model_copy()
        if isinstance(last, ToolCall):
            return ToolCall(tool=f"{last.tool}_v2", arguments=dict(last.arguments))
        return None


class _PlanFollower:
    """Replays the task's reference plan as native tool calls (like `OracleBackend`), grounding
    `${i.path}` arguments in the tool results it is shown; subclasses change what it emits.
    `detour_every` adds harmless detours (`_Detours`)."""

    def __init__(
        self, task: Task, *, completion_tokens: int = 20, detour_every: int | None = None
    ) -> None:
        if not task.reference_plan:
            raise ValueError(f"task {task.id} has no reference plan")
        self.task = task
        self.plan: list[Action] = list(task.reference_plan)
        self.results: list[Any] = []
        self.cursor = 0
        self.calls = 0
        self.completion_tokens = completion_tokens
        self.detours = _Detours(detour_every)
        self._detoured = False
        self._last_action: Action | None = None
        self._last_delegate: dict[str, Any] | None = None

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        if self.calls > 0 and self._detoured:
            self._detoured = False  # the detour's result is noise, not a plan result
        elif self.calls > 0:
            opened_subagent = not any(m.role == "assistant" for m in messages)
            observation = self._last_delegate if opened_subagent else _observation(messages[-1])
            self.results.append(observation)
            detour = None if opened_subagent else self.detours.due(self._last_action, observation)
            if detour is not None:
                self._detoured = True
                self.calls += 1
                return self.emit(detour, messages)
        self.calls += 1
        action = self.next_action(messages, tools)
        self._last_action = action
        if isinstance(action, Delegate):
            self._last_delegate = {"delegated_to": action.agent, "goal": action.goal}
        return self.emit(action, messages)

    def take(self) -> tuple[int, Action] | None:
        """The next plan step (references resolved), advancing the cursor."""
        if self.cursor >= len(self.plan):
            return None
        index = self.cursor
        action = self.plan[index]
        self.cursor += 1
        if isinstance(action, ToolCall):
            action = action.model_copy(
                update={"arguments": resolve_refs(action.arguments, self.results)}
            )
        return index, action

    def next_action(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Action:
        taken = self.take()
        return Finish() if taken is None else taken[1]

    def emit(self, action: Action, messages: Sequence[ChatMessage]) -> Completion:
        name, arguments = _wire(action)
        call = RawToolCall(id=f"call_{self.calls}", name=name, arguments=json.dumps(arguments))
        return Completion(
            tool_calls=[call],
            usage=_usage(messages, self.completion_tokens),
            finish_reason="tool_calls",
        )


class SkillSensitiveBackend(_PlanFollower):
    """The reference plan, followed only as far as the context shows what each step needs.

    - `tools`: a plan tool not offered this turn -> gives up (finish with an apology);
    - `skills`: a needed Skill (`skills_needed`, or given) missing from every system prompt seen
      -> at its procedure step, calls the naive tool the Skill warns about, or skips the step;
    - `memory`: a remembered value (not in the instruction) missing from the main agent's
      memory lines -> uses a stale conflicting value of the same key, or gives up.
    """

    def __init__(
        self,
        task: Task,
        *,
        skills_needed: Iterable[str] | None = None,
        tools: bool = True,
        skills: bool = True,
        memory: bool = True,
        completion_tokens: int = 20,
        detour_every: int | None = None,
    ) -> None:
        super().__init__(task, completion_tokens=completion_tokens, detour_every=detour_every)
        self.needed = list(skills_needed) if skills_needed is not None else task_skills(task)
        self.procedure = _procedure_steps(task, self.needed)
        self.check_tools = tools
        self.check_skills = skills
        self.check_memory = memory
        self.seen = ""  # every system prompt seen so far
        self.main_prompt: str | None = None
        self.mistakes: list[str] = []

    def next_action(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Action:
        system = messages[0].content or "" if messages and messages[0].role == "system" else ""
        if system and system not in self.seen:
            self.seen += "\n" + system
        if self.main_prompt is None:
            self.main_prompt = system
        offered = {t.name for t in tools}
        while (taken := self.take()) is not None:
            index, action = taken
            if not isinstance(action, ToolCall):
                return action
            if self.check_tools and action.tool not in offered:
                self.mistakes.append(f"gave up: {action.tool} not offered (plan step {index})")
                self.cursor = len(self.plan)
                return Finish(answer=GIVE_UP_TOOL)
            skill = self.procedure.get(index)
            if self.check_skills and skill and f"### {skill}\n" not in self.seen:
                naive = self._naive(skill, action, tools)
                if naive is not None:
                    self.mistakes.append(f"{naive.tool} for {action.tool}: Skill {skill} not shown")
                    return naive
                self.mistakes.append(f"skipped plan step {index}: Skill {skill} not shown")
                self.results.append(None)  # keeps `${i}` references of later steps aligned
                continue
            item = memory_needed(self.task, action) if self.check_memory else None
            if item is not None and f"={item.value} (" not in (self.main_prompt or ""):
                stale = next(
                    (
                        m.value
                        for m in self.task.memory
                        if m.key == item.key and m.value != item.value
                    ),
                    None,
                )
                if stale is None:
                    self.mistakes.append(f"gave up: {item.key} not remembered (step {index})")
                    self.cursor = len(self.plan)
                    return Finish(answer=f"Sorry, I don't know your {item.key}.")
                self.mistakes.append(f"used stale {item.key}={stale!r} (plan step {index})")
                arguments = {
                    k: (v.replace(item.value, stale) if isinstance(v, str) else v)
                    for k, v in action.arguments.items()
                }
                return action.model_copy(update={"arguments": arguments})
            return action
        return Finish()

    def _naive(self, skill: str, action: ToolCall, tools: Sequence[ToolSpec]) -> ToolCall | None:
        """The obvious-but-wrong tool the Skill warns about: another tool of the same app that
        the Skill names and the plan never uses (e.g. `messaging_send` for a scheduled text),
        called with the arguments it accepts."""
        app, _, name = skill.partition(".")
        text = skills_for([app]).get(app, {}).get(name, "")
        used = {a.tool for a in self.plan if isinstance(a, ToolCall)}
        offered = {t.name: t for t in tools}
        prefix = action.tool.split("_", 1)[0] + "_"
        for tool in sorted(_skill_names(text) - used):
            spec = offered.get(tool)
            if spec is None or not tool.startswith(prefix):
                continue
            accepted = set((spec.parameters.get("properties") or {}).keys())
            arguments = {k: v for k, v in action.arguments.items() if k in accepted}
            return ToolCall(tool=tool, arguments=arguments)
        return None


FormatStyle = Literal["function_tag", "double_encoded"]


class FormatMismatchBackend(_PlanFollower):
    """The oracle, writing its (valid) calls in a format the Harness's parser does not accept."""

    def __init__(
        self, task: Task, style: FormatStyle = "function_tag", *, detour_every: int | None = None
    ) -> None:
        super().__init__(task, detour_every=detour_every)
        self.style = style

    def emit(self, action: Action, messages: Sequence[ChatMessage]) -> Completion:
        name, arguments = _wire(action)
        usage = _usage(messages, self.completion_tokens)
        if self.style == "function_tag":
            text = f"<function={name}>{json.dumps(arguments)}</function>"
            return Completion(text=text, usage=usage, finish_reason="stop", protocol="text")
        call = RawToolCall(
            id=f"call_{self.calls}", name=name, arguments=json.dumps(json.dumps(arguments))
        )
        return Completion(tool_calls=[call], usage=usage, finish_reason="tool_calls")


class EndpointDownBackend:
    """Answers like `inner` until turn `at_turn`, then the endpoint is unreachable."""

    def __init__(self, inner: ModelBackend, at_turn: int = 0) -> None:
        self.inner = inner
        self.at_turn = at_turn
        self.calls = 0

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        turn = self.calls
        self.calls += 1
        if turn >= self.at_turn:
            raise BackendUnavailable(
                "model endpoint unreachable after 3 attempts",
                cause=ConnectionRefusedError("connection refused"),
                attempts=3,
                endpoint="http://planner.invalid/v1",
            )
        return self.inner.complete(messages, tools)


class PlannerBackend:
    """A model-free planner (e.g. `NoisyPlanner`) behind the model-backend interface.

    The planner is started with the task's sandbox tools and fed each quoted tool result, so its
    decisions (and their labels, kept in `labels`) are the same as when it runs directly;
    `detour_every` adds harmless detours between them (`_Detours`).
    """

    def __init__(self, planner: Planner, task: Task, *, detour_every: int | None = None) -> None:
        self.planner = planner
        self.task = task
        self.labels: list[dict[str, Any]] = []
        self.detours = _Detours(detour_every)
        self._last: Action | None = None
        self._saved: Any = None
        self._detoured = False
        self._turn = 0

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        last: Step | None = None
        if self._last is None:
            self.planner.start(self.task, tool_specs(list(self.task.tools)), Feedback.ok())
        else:
            if self._detoured:
                self._detoured = False
                observation = self._saved
            else:
                observation = _observation(messages[-1])
                detour = self.detours.due(self._last, observation)
                if detour is not None:
                    self._detoured, self._saved = True, observation
                    return self._emit(detour, messages)
            last = Step.model_construct(
                index=self._turn - 1,
                agent="main",
                action=self._last,
                feedback=Feedback.ok(observation),
                annotations={},
            )
        decision = self.planner.decide(last)
        label = decision.annotations.get("injected_fault")
        if isinstance(label, dict):
            self.labels.append(label)
        self._last = decision.action
        return self._emit(decision.action, messages)

    def _emit(self, action: Action, messages: Sequence[ChatMessage]) -> Completion:
        self._turn += 1
        name, arguments = _wire(action)
        call = RawToolCall(id=f"call_{self._turn}", name=name, arguments=json.dumps(arguments))
        return Completion(tool_calls=[call], usage=_usage(messages, 20), finish_reason="tool_calls")


# --------------------------------------------------------------------------- harness faults


class HidingHarnessPlanner(HarnessPlanner):
    """A Harness whose tool list loses the named tools (an adapter bug, injected on purpose)."""

    def __init__(
        self,
        backend: ModelBackend,
        config: HarnessConfig | None = None,
        *,
        hide: Iterable[str],
        memory: MemoryStore | None = None,
    ) -> None:
        super().__init__(backend, config, memory=memory)
        self.hide = set(hide)

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        super().start(task, [t for t in tools if t.name not in self.hide], first)


class EmptyMemoryStore(MemoryStore):
    """A memory store that stores everything and retrieves nothing (a broken retriever)."""

    def retrieve(self, user_id: str, query: str, k: int = 5) -> list[RetrievedMemory]:
        return []


# --------------------------------------------------------------------------- environment faults

EnvFaultMode = Literal["feedback", "transient", "raise", "timeout", "reset"]


class FaultyEnv:
    """Wraps an environment and breaks it at one step: the `at_step`-th call (0-based, counted
    from reset), or the `occurrence`-th call of tool `at_tool`.

    `feedback`: that step answers `environment_failure` (the app crashed) instead of acting;
    `transient`: that step and every later one answer `transient` (server busy);
    `raise`: that step raises `ConnectionError` (the env server died);
    `timeout`: that step raises `TimeoutError`; `reset`: the reset itself is refused.
    """

    def __init__(
        self,
        inner: Any = None,
        *,
        mode: EnvFaultMode = "feedback",
        at_step: int = 0,
        at_tool: str | None = None,
        occurrence: int = 1,
    ) -> None:
        self.inner = inner if inner is not None else SandboxEnv()
        self.kind: EnvKind = self.inner.kind
        self.mode = mode
        self.at_step = at_step
        self.at_tool = at_tool
        self.occurrence = occurrence
        self._steps = 0
        self._seen = 0
        self._broken = False

    def reset(self, task: Task) -> Feedback:
        self._steps = self._seen = 0
        self._broken = False
        if self.mode == "reset":
            return Feedback.fail("environment_failure", "device offline: reset refused")
        feedback: Feedback = self.inner.reset(task)
        return feedback

    def _hit(self, action: Action) -> bool:
        index = self._steps
        self._steps += 1
        if self.at_tool is None:
            return index == self.at_step
        if isinstance(action, ToolCall) and action.tool == self.at_tool:
            self._seen += 1
            return self._seen == self.occurrence
        return False

    def step(self, action: Action) -> Feedback:
        hit = self._hit(action)
        if hit and self.mode == "raise":
            raise ConnectionError("environment server closed the connection")
        if hit and self.mode == "timeout":
            raise TimeoutError("environment step timed out after 30 s")
        if hit and self.mode == "feedback":
            what = action.tool if isinstance(action, ToolCall) else action.type
            return Feedback.fail("environment_failure", f"{what}: the app stopped responding")
        self._broken = self._broken or (hit and self.mode == "transient")
        if self._broken:
            return Feedback.fail("transient", "server busy, try again later")
        feedback: Feedback = self.inner.step(action)
        return feedback

    def verify(self) -> Verification:
        verification: Verification = self.inner.verify()
        return verification

    def tools(self) -> list[ToolSpec]:
        specs: list[ToolSpec] = self.inner.tools()
        return specs

    def close(self) -> None:
        self.inner.close()


# --------------------------------------------------------------------------- running


def run_harness(
    task: Task,
    backend: ModelBackend,
    config: HarnessConfig | None = None,
    *,
    env: Any = None,
    memory: MemoryStore | None = None,
    hide: Iterable[str] = (),
) -> Trajectory:
    """One episode of `task` through the Harness (sandbox by default)."""
    config = config or HarnessConfig()
    hidden = set(hide)
    planner: HarnessPlanner
    if hidden:
        planner = HidingHarnessPlanner(backend, config, hide=hidden, memory=memory)
    elif isinstance(env, FaultyEnv) and env.mode == "reset":
        planner = HarnessPlanner(backend, config, memory=memory)
    else:
        planner = HarnessPlanner(backend, config, memory=memory)
    environment = env if env is not None else SandboxEnv()
    policy = Policy(planner="harness", model=type(backend).__name__, harness_version=config.version)
    try:
        return run_episode(environment, task, planner, policy=policy, budgets=config.budgets())
    finally:
        environment.close()


NOISY_CAUSES: dict[str, str] = {
    "wrong_tool": "wrong_tool",
    "wrong_argument": "wrong_arguments",
    "skipped_step": "skipped_step",
    "ignores_memory": "ignored_memory",
    "gives_up_early": "gave_up",
}
"""The diagnosis cause expected for each `noisy` fault kind."""


def expected_noisy_cause(label: dict[str, Any]) -> str:
    """The cause a `noisy` label calls for (a wrong final answer is `wrong_answer`)."""
    kind = str(label.get("kind"))
    if kind == "wrong_argument" and str(label.get("detail", "")).startswith("finish."):
        return "wrong_answer"
    return NOISY_CAUSES.get(kind, kind)


def run_noisy(
    task: Task, *, seed: int = 0, via_harness: bool = False, detour_every: int | None = None
) -> tuple[Trajectory, dict[str, Any] | None]:
    """The `noisy` planner (one fault per episode) on `task`, and the fault's label.

    Directly, the label sits on the faulted step; through the Harness (`via_harness`), the
    planner speaks as a model backend (with detours every `detour_every` turns, if set) and the
    label is returned (and put in the trajectory's `metadata["injected_fault"]`, which diagnosis
    never reads).
    """
    planner = NoisyPlanner(fault_rate=1.0, seed=seed)
    if not via_harness:
        env = SandboxEnv()
        try:
            trajectory = run_episode(env, task, planner, policy=Policy(planner="noisy"))
        finally:
            env.close()
        label = next(
            (
                s.annotations["injected_fault"]
                for s in trajectory.steps
                if isinstance(s.annotations.get("injected_fault"), dict)
            ),
            None,
        )
        return trajectory, label
    backend = PlannerBackend(planner, task, detour_every=detour_every)
    trajectory = run_harness(task, backend)
    label = backend.labels[0] if backend.labels else None
    if label is not None:
        trajectory.metadata["injected_fault"] = label
    return trajectory, label


# --------------------------------------------------------------------------- the fault catalogue


Detours = int | None


@dataclass(frozen=True)
class Fault:
    """One injectable fault: where it is expected to be attributed, and how to run it.

    `run(task, detour_every)` runs one episode; `detour_every` makes the model add harmless
    detours (re-checks, misspelt calls) every that many turns, to test robustness.
    """

    name: str
    side: Side
    cause: str
    description: str
    applies: Callable[[Task], bool]
    run: Callable[[Task, Detours], Trajectory]

    def inject(self, task: Task, detour_every: Detours = None) -> Trajectory:
        return self.run(task, detour_every)


def _calls(task: Task) -> list[tuple[int, ToolCall]]:
    return [(i, a) for i, a in enumerate(task.reference_plan or []) if isinstance(a, ToolCall)]


def _has_calls(task: Task) -> bool:
    return bool(_calls(task))


def _target_step(task: Task) -> int:
    """The plan index of the last state-changing call (else the last call)."""
    calls = _calls(task)
    writes = [i for i, a in calls if is_write(a.tool)]
    return (writes or [i for i, _ in calls])[-1]


def _needs_memory(task: Task) -> bool:
    return any(memory_needed(task, a) is not None for a in task.reference_plan or [])


def _work_steps(task: Task, upto: int | None = None) -> int:
    """Plan steps that are work, not structure (the fewest turns a model needs), in the whole
    plan or before plan step `upto`."""
    depth, count = 0, 0
    for action in (task.reference_plan or [])[:upto]:
        if isinstance(action, Delegate):
            depth += 1
        elif isinstance(action, Finish) and depth:
            depth -= 1
        else:
            count += 1
    return count


def _oracle(task: Task, detours: Detours) -> _PlanFollower:
    """The perfect model (as `OracleBackend`), with optional detours."""
    return _PlanFollower(task, detour_every=detours)


def _sensitive(task: Task, detours: Detours) -> SkillSensitiveBackend:
    return SkillSensitiveBackend(task, detour_every=detours)


def _drop_skill(task: Task, detours: Detours) -> Trajectory:
    config = HarnessConfig(drop_skills=task_skills(task))
    return run_harness(task, _sensitive(task, detours), config)


def _hide_tool(task: Task, detours: Detours) -> Trajectory:
    plan = task.reference_plan or []
    tool = plan[_target_step(task)]
    assert isinstance(tool, ToolCall)
    return run_harness(task, _sensitive(task, detours), hide=[tool.tool])


def _cap_tools(task: Task, detours: Detours) -> Trajectory:
    return run_harness(task, _oracle(task, detours), HarnessConfig(max_tools=1))


def _no_memory(task: Task, detours: Detours) -> Trajectory:
    return run_harness(task, _sensitive(task, detours), memory=EmptyMemoryStore())


def _memory_k1(task: Task, detours: Detours) -> Trajectory:
    return run_harness(task, _sensitive(task, detours), HarnessConfig(memory_k=1))


def _turn_budget(task: Task, detours: Detours) -> Trajectory:
    turns = max(1, len(task.reference_plan or []) - 1)
    return run_harness(task, _oracle(task, detours), HarnessConfig(max_turns=turns))


def _parser(style: FormatStyle) -> Callable[[Task, Detours], Trajectory]:
    def run(task: Task, detours: Detours) -> Trajectory:
        turns = len(task.reference_plan or []) + 2
        backend = FormatMismatchBackend(task, style, detour_every=detours)
        return run_harness(task, backend, HarnessConfig(max_turns=turns))

    return run


def _env(mode: EnvFaultMode) -> Callable[[Task, Detours], Trajectory]:
    def run(task: Task, detours: Detours) -> Trajectory:
        target = _target_step(task)
        call = (task.reference_plan or [])[target]
        assert isinstance(call, ToolCall)
        occurrence = sum(1 for i, a in _calls(task) if a.tool == call.tool and i <= target)
        env = FaultyEnv(mode=mode, at_tool=call.tool, occurrence=occurrence)
        return run_harness(task, _oracle(task, detours), env=env)

    return run


def _endpoint_down(task: Task, detours: Detours) -> Trajectory:
    backend = EndpointDownBackend(_oracle(task, detours), _target_step(task))
    return run_harness(task, backend)


HARNESS_FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "drop_skill",
            "harness",
            "skill_not_injected",
            "drop_skills withholds the Skills the task needs",
            lambda t: bool(_procedure_steps(t, task_skills(t))),
            _drop_skill,
        ),
        Fault(
            "hide_tool",
            "harness",
            "tool_not_exposed",
            "the Harness's tool list loses the plan's last state-changing tool",
            _has_calls,
            _hide_tool,
        ),
        Fault(
            "cap_tools",
            "harness",
            "tool_not_exposed",
            "max_tools=1; the model calls the hidden tools anyway",
            lambda t: len({a.tool for _, a in _calls(t)}) >= 2,
            _cap_tools,
        ),
        Fault(
            "no_memory",
            "harness",
            "memory_retrieval_miss",
            "memory retrieval returns nothing",
            _needs_memory,
            _no_memory,
        ),
        Fault(
            "memory_k1",
            "harness",
            "memory_retrieval_miss",
            "memory_k=1: retrieval keeps one item",
            _needs_memory,
            _memory_k1,
        ),
        Fault(
            "turn_budget",
            "harness",
            "budget_cut",
            "max_turns one short of the plan",
            lambda t: _work_steps(t) >= 2,
            _turn_budget,
        ),
        Fault(
            "parser_function_tag",
            "harness",
            "parser_rejected_valid_call",
            "valid calls written as <function=name>{...}</function>",
            _has_calls,
            _parser("function_tag"),
        ),
        Fault(
            "parser_double_encoded",
            "harness",
            "parser_rejected_valid_call",
            "valid native calls with double-encoded arguments",
            _has_calls,
            _parser("double_encoded"),
        ),
    )
}

ENVIRONMENT_FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "env_failure",
            "environment",
            "environment_error",
            "environment_failure at the plan's last state-changing step",
            _has_calls,
            _env("feedback"),
        ),
        Fault(
            "env_transient",
            "environment",
            "environment_error",
            "transient errors from that step on",
            _has_calls,
            _env("transient"),
        ),
        Fault(
            "env_dead",
            "environment",
            "environment_error",
            "the environment server dies at that step",
            _has_calls,
            _env("raise"),
        ),
        Fault(
            "env_timeout",
            "environment",
            "timeout",
            "an environment step times out",
            _has_calls,
            _env("timeout"),
        ),
        Fault(
            "env_reset",
            "environment",
            "environment_error",
            "the reset is refused (device offline)",
            _has_calls,
            _env("reset"),
        ),
        Fault(
            "endpoint_down",
            "environment",
            "environment_error",
            "the model endpoint dies mid-episode",
            _has_calls,
            _endpoint_down,
        ),
    )
}

FAULTS: dict[str, Fault] = {**HARNESS_FAULTS, **ENVIRONMENT_FAULTS}


# --------------------------------------------------------------------------- measuring

NOISY_SOURCES = ("noisy", "noisy_harness")
SOURCES: tuple[str, ...] = (*NOISY_SOURCES, *FAULTS)


@dataclass(frozen=True)
class Outcome:
    """One faulted episode: what was injected, and what diagnosis said (None: it succeeded)."""

    source: str
    task_id: str
    expected_side: Side
    expected_cause: str
    diagnosis: Diagnosis | None
    detour_every: int | None = None

    @property
    def failed(self) -> bool:
        return self.diagnosis is not None

    @property
    def side_correct(self) -> bool:
        return self.diagnosis is not None and self.diagnosis.side == self.expected_side

    @property
    def cause_correct(self) -> bool:
        return self.diagnosis is not None and self.diagnosis.cause == self.expected_cause


def clean_run_succeeds(task: Task) -> bool:
    """The control: the default Harness with a context-sensitive model solves the task. A fault
    is only measured where this holds, so its effect is the fault's alone."""
    return run_harness(task, SkillSensitiveBackend(task)).success


def measure(
    tasks: Iterable[Task],
    *,
    sources: Iterable[str] = SOURCES,
    detour_every: int | None = None,
    seed: int = 0,
    controls: dict[str, bool] | None = None,
) -> list[Outcome]:
    """Run every applicable source on every task and diagnose the result.

    `controls` caches `clean_run_succeeds` per task id (filled in as it goes).
    """
    wanted = list(sources)
    unknown = [s for s in wanted if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown sources {unknown}; choose from {', '.join(SOURCES)}")
    cache = controls if controls is not None else {}
    out: list[Outcome] = []
    for task in tasks:
        if not task.reference_plan:
            continue
        if task.id not in cache:
            cache[task.id] = clean_run_succeeds(task)
        for source in wanted:
            if source in NOISY_SOURCES:
                via = source == "noisy_harness"
                if via and not cache[task.id]:
                    continue
                trajectory, label = run_noisy(
                    task, seed=seed, via_harness=via, detour_every=detour_every if via else None
                )
                if label is None:
                    continue
                out.append(
                    Outcome(
                        source,
                        task.id,
                        "model",
                        expected_noisy_cause(label),
                        diagnose(trajectory),
                        detour_every if via else None,
                    )
                )
                continue
            fault = FAULTS[source]
            if not cache[task.id] or not fault.applies(task):
                continue
            trajectory = fault.inject(task, detour_every)
            out.append(
                Outcome(
                    source,
                    task.id,
                    fault.side,
                    fault.cause,
                    diagnose(trajectory),
                    detour_every,
                )
            )
    return out
