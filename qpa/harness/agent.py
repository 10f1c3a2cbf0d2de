"""The Harness agent: a planner model joined to the environment through the Harness.

Each turn: prompt -> model -> parsed action -> safety checks -> environment -> feedback, quoted
as data with a recovery hint, back to the model. At the start of an episode the Scenario Adapter
picks the Skills and tool documentation for the tools available now and Persistent Memory
retrieves what is known about the user; both are recorded in the first step's annotations, and
memory used by a call is recorded on that call. Sub-agents get their own conversation with a
scoped tool set and report back to the parent. After the episode, memory is written back from
the evidence the trajectory holds.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from qpa.contract import (
    Delegate,
    Feedback,
    Finish,
    MessageUser,
    SkillSpec,
    Step,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
)
from qpa.harness.adapter import Exposure, ScenarioAdapter, terms
from qpa.harness.backends.base import BackendError, ChatMessage, ModelBackend
from qpa.harness.guard import ProvenanceGuard
from qpa.harness.memory import MemoryStore, RetrievedMemory
from qpa.harness.parsing import ParseFailure, parse_completion, with_pseudo_tools
from qpa.harness.planners import Decision
from qpa.harness.prompt import subagent_prompt, system_prompt, tool_result
from qpa.harness.runner import Budgets, EpisodeAborted
from qpa.harness.scope import unquoted
from qpa.harness.skills import SkillLibrary


class HarnessConfig(BaseModel):
    """One Harness version: adapter, Skills, memory and budget settings."""

    model_config = ConfigDict(extra="forbid")

    version: str = "harness-v1"
    token_budget: int = Field(default=1500, ge=100)
    max_tools: int | None = Field(default=None, ge=1)
    drop_skills: list[str] = Field(default_factory=list)
    skills_path: str | None = None
    memory_path: str = ":memory:"
    memory_k: int = Field(default=5, ge=1)
    guard: bool = True
    # the guard refuses state changes of tools whose environment declares no argument roles
    guard_strict: bool = False
    # values in the prose of a record the user named ("do what the email says"): `ask` (they
    # vouch for nothing) or `allow` (they count as the record's own fields)
    data_instructions: Literal["ask", "allow"] = "ask"
    max_turns: int = Field(default=40, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_wall_s: float | None = Field(default=None, gt=0)

    def budgets(self) -> Budgets:
        return Budgets(self.max_turns, self.max_tokens, self.max_wall_s)

    def skill_library(self) -> SkillLibrary:
        if self.skills_path:
            return SkillLibrary.load(self.skills_path)
        return _registry_skills()


@functools.lru_cache(maxsize=1)
def _registry_skills() -> SkillLibrary:
    """The registry's Skill library, built once per process (it is immutable, and a Harness
    builds a planner per episode)."""
    return SkillLibrary.from_registry()


@dataclass
class _Context:
    """One agent's conversation: the main agent's or a sub-agent's."""

    agent: str
    messages: list[ChatMessage]
    tools: list[ToolSpec]
    pending_call: str | None = None  # id of the model's call awaiting a result
    protocol: str = "native"  # how the model spoke last: native tool calls or the text protocol
    parent_call: str | None = None  # for sub-agents: the parent's delegate call id
    ids: itertools.count[int] = field(default_factory=itertools.count)
    # the tools plus the pseudo-tools, as the model is offered them (fixed per conversation)
    offered: list[ToolSpec] = field(init=False)

    def __post_init__(self) -> None:
        self.offered = with_pseudo_tools(self.tools)

    def call_id(self) -> str:
        return f"{self.agent}-{next(self.ids)}"


class HarnessPlanner:
    """A `Planner` that asks a model backend through the Harness."""

    name = "harness"

    def __init__(
        self,
        backend: ModelBackend,
        config: HarnessConfig | None = None,
        *,
        memory: MemoryStore | None = None,
        skills: SkillLibrary | None = None,
    ) -> None:
        self.backend = backend
        self.config = config or HarnessConfig()
        self.memory = memory or MemoryStore(self.config.memory_path)
        library = skills or self.config.skill_library()
        self.adapter = ScenarioAdapter(
            library,
            token_budget=self.config.token_budget,
            max_tools=self.config.max_tools,
            drop_skills=set(self.config.drop_skills),
        )
        self._contexts: list[_Context] = []
        self._retrieved: list[RetrievedMemory] = []
        self._pending_annotations: dict[str, Any] = {}
        self._skills_offered: list[SkillSpec] = []

    # ------------------------------------------------------------------ Planner
    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        self.task = task
        self.tools = {t.name: t for t in tools}
        apps = [self.adapter.app_of(t) for t in tools]
        self._skills_offered = [
            SkillSpec(app=s.app, name=s.name, text=s.text)
            for s in self.adapter.skills.for_apps(a for a in apps if a)
        ]
        exposure = self.adapter.select(task.instruction, tools)
        user = task.user.user_id
        if task.memory:
            self.memory.seed(user, task.memory)
        self._retrieved = self.memory.retrieve(user, task.instruction, k=self.config.memory_k)
        # The guard's scope: the apps and tools the adapter finds relevant to the user's
        # instruction; its trusted memory: what the user stated or confirmed (never what a tool
        # once showed).
        app_scores, tool_scores = self.adapter.relevance(task.instruction, tools)
        # the tools' relevance without the quoted text: the same scores when the quotes hold
        # no term (relevance is a function of the query's terms)
        asked = unquoted(task.instruction)
        choice_scores = (
            dict(tool_scores)
            if terms(asked) == terms(task.instruction)
            else self.adapter.relevance(asked, tools)[1]
        )
        self.guard = ProvenanceGuard(
            task,
            tools,
            app_scores=app_scores,
            tool_scores=tool_scores,
            app_of={t.name: self.adapter.app_of(t) for t in tools},
            memory=[(r.item.key, r.item.value, r.item.evidence) for r in self._retrieved],
            choice_scores=choice_scores,
            strict=self.config.guard_strict,
            data_instructions=self.config.data_instructions,
        )
        lines = [r.describe() for r in self._retrieved]
        system = system_prompt(task, exposure.text, lines)
        opening = f"{task.instruction}\n\n{tool_result(first)}"
        self._contexts = [
            _Context(
                "main", [ChatMessage.system(system), ChatMessage.user(opening)], exposure.tools
            )
        ]
        self._pending_annotations = {
            **exposure.annotations(),
            **MemoryStore.annotations(self._retrieved),
            "harness_version": self.config.version,
        }

    def decide(self, last: Step | None) -> Decision:
        if last is not None:
            self._absorb(last)
        context = self._contexts[-1]
        try:
            completion = self.backend.complete(context.messages, list(context.offered))
        except BackendError as exc:
            cause = getattr(exc, "cause", None)
            detail = f"{exc}" + (f" (cause: {type(cause).__name__}: {cause})" if cause else "")
            raise EpisodeAborted(f"model endpoint failed: {detail}", side=exc.side) from exc
        context.messages.append(completion.to_message())
        context.protocol = completion.protocol
        annotations: dict[str, Any] = {**self._pending_annotations, "model_output": completion.text}
        self._pending_annotations = {}
        parsed = parse_completion(completion, context.tools)
        native_id = completion.tool_calls[0].id if completion.tool_calls else None
        context.pending_call = native_id or None
        if isinstance(parsed, ParseFailure):
            annotations["parse_failure"] = parsed.annotation()
            action: Any = (
                ToolCall(tool=parsed.tool, arguments={})
                if parsed.tool
                else MessageUser(text=(parsed.raw or "(empty output)")[:2000])
            )
            feedback = parsed.feedback()
            if parsed.kind == "malformed_output":
                feedback = Feedback.fail("malformed_action", parsed.message)
            return Decision(action, completion.usage, annotations, feedback=feedback)
        if isinstance(parsed, ToolCall):
            used = MemoryStore.used_by(self._retrieved, parsed) if self._retrieved else []
            if used:
                annotations["memory_used"] = used
            if self.config.guard:
                refusal = self.guard.check(parsed)
                if refusal is not None:
                    annotations["guard"] = refusal.message
                    return Decision(parsed, completion.usage, annotations, feedback=refusal)
        return Decision(parsed, completion.usage, annotations)

    def skills_offered(self) -> list[SkillSpec]:
        """The Skills of the library for the apps of the episode's tools: what the adapter could
        inject (withheld and budget-cut ones included; the exposure says which it did)."""
        return list(self._skills_offered)

    def end(self, trajectory: Trajectory) -> None:
        """After the episode: write memory back from the trajectory's evidence."""
        if trajectory.steps:  # an episode whose reset failed never started: nothing to learn
            self.memory.write_back(trajectory.task.user.user_id, trajectory)

    # ------------------------------------------------------------------ internals
    def _absorb(self, last: Step) -> None:
        """Feed the last step's outcome to the right conversation; open/close sub-agents."""
        context = self._contexts[-1]
        action, feedback = last.action, last.feedback
        if isinstance(action, ToolCall) and "guard" not in last.annotations:
            self.guard.record(action, feedback)  # the same ledger for every agent's calls
        if isinstance(action, Delegate) and feedback.status == "ok":
            call_id = self._reply(context, last, tool_result(feedback))
            scoped = [self.tools[n] for n in action.tools if n in self.tools] or list(
                self.tools.values()
            )
            exposure: Exposure = self.adapter.select(action.goal, scoped)
            messages = [
                ChatMessage.system(subagent_prompt(action.goal, self.task, exposure.text)),
                ChatMessage.user(action.goal),
            ]
            self._contexts.append(
                _Context(action.agent, messages, exposure.tools, parent_call=call_id)
            )
            self._pending_annotations = exposure.annotations()
            return
        if isinstance(action, Finish) and last.agent != "main" and len(self._contexts) > 1:
            finished = self._contexts.pop()
            parent = self._contexts[-1]
            result = Feedback.ok({"subagent": finished.agent, "result": action.answer})
            parent.messages.append(
                ChatMessage.tool(
                    tool_result(result), finished.parent_call or parent.call_id(), "delegate"
                )
            )
            return
        self._reply(context, last, tool_result(feedback))

    def _reply(self, context: _Context, last: Step, content: str) -> str:
        """Answer the model's last turn with `content`: a tool message when it made a native
        tool call (ids must match) or spoke the text protocol (rendered as <tool_response>),
        otherwise a user turn carrying the quoted result."""
        call_id = context.pending_call or context.call_id()
        context.pending_call = None
        assistant = context.messages[-1] if context.messages else None
        if assistant is not None and assistant.role == "assistant" and assistant.tool_calls:
            first = assistant.tool_calls[0]
            if not first.id:
                first.id = call_id
            context.messages.append(ChatMessage.tool(content, first.id, first.name))
            return first.id
        if context.protocol == "text":
            # the text protocol renders tool messages as <tool_response> blocks, as it promised
            name = last.action.tool if isinstance(last.action, ToolCall) else last.action.type
            context.messages.append(ChatMessage.tool(content, call_id, name))
            return call_id
        context.messages.append(ChatMessage.user(content))
        return call_id
