"""THE training format: a trajectory rendered as the chat a text-protocol model sees at inference.

SFT and RL both train on what this module produces, so a model learns on exactly the
conversation the Harness will show it when it serves behind the `local` backend (or any
OpenAI-compatible endpoint without native function calling):

- the system prompt of `qpa.harness.prompt` with the Scenario Adapter's tool and Skill text and
  the remembered facts, followed by the text-protocol tool schema (`to_text_protocol`);
- the instruction with the reset observation as the first user turn;
- each assistant turn as the model writes it in the text protocol: `<tool_call>{...}</tool_call>`
  (`format_tool_call`) or `<finish>answer</finish>`;
- each tool result as the user turn the Harness answers with (quoted data with error hints), a
  sub-agent's result as a `<tool_response>` block.

It is not re-implemented here: the trajectory's actions are **replayed through `HarnessPlanner`**
with a replay backend that answers each request with the recorded action (as text) and keeps
the messages the Harness sends, and the recorded feedback is fed back step by step. Whatever the
Harness does at inference (adapter selection, memory, hints, sub-agent prompts) is therefore
what the training data shows. What the episode remembered (`memory_retrieved`, recorded on the
first step by the Harness) is replayed as recorded; trajectories of model-free planners (oracle,
noisy) get what a fresh Harness would retrieve for the task.

Each message is `{"role": "system"|"user"|"assistant", "content": str, "train": bool}`;
`train` is False for every non-assistant turn and for erroneous assistant turns (`mask_reason`:
an error the agent caused, a parse failure, a guard refusal, or a step flagged by curation with
`annotations["train"] = False`). A sub-agent's turns form their own conversation (its system
prompt, its goal, its calls), returned by `render_conversations` after the main one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, cast, get_args

from qpa.contract import (
    Action,
    Delegate,
    Evidence,
    Feedback,
    Finish,
    MemoryItem,
    MessageUser,
    Step,
    ToolCall,
    ToolSpec,
    Trajectory,
    UIAction,
)
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion, to_text_protocol
from qpa.harness.memory import MemoryStore, RetrievedMemory
from qpa.harness.parsing import FINISH_CLOSE, FINISH_OPEN, TOOL_CALL_OPEN, format_tool_call
from qpa.harness.skills import SkillLibrary

Role = Literal["system", "user", "assistant"]
RenderedMessage = dict[str, Any]
"""`{"role": "system"|"user"|"assistant", "content": str, "train": bool}`."""

AGENT_ERROR_KINDS: frozenset[str] = frozenset(
    {
        "invalid_arguments",
        "unknown_tool",
        "malformed_action",
        "precondition_failed",
        "permission_denied",
    }
)
"""Error feedback the agent caused (wrong tool, wrong arguments, acting before a precondition
holds, paying without confirmation). `transient` and `environment_failure` are the world's."""


#: Kinds whose reset is a pure function of the task (no server, phone or model is reached).
_REPLAYABLE_RESETS = ("sandbox", "agentdojo", "bfcl")


class RenderError(ValueError):
    """A trajectory that cannot be replayed through the Harness (names trajectory and step)."""


@dataclass
class Conversation:
    """One agent's conversation: the main agent's, or one sub-agent's."""

    agent: str
    messages: list[RenderedMessage]
    steps: list[int] = field(default_factory=list)
    """Trajectory step index of each assistant turn, in order."""

    @property
    def trainable(self) -> int:
        """How many assistant turns are trained on."""
        return sum(1 for m in self.messages if m["train"])


# --------------------------------------------------------------------------- masking


def mask_reason(step: Step) -> str | None:
    """Why this step's assistant turn must not be trained on; None when it should be.

    An explicit `annotations["train"]` (set by curation) wins; otherwise an error the agent
    caused, a parse failure or a guard refusal masks the turn.
    """
    flag = step.annotations.get("train")
    if flag is False:
        return str(step.annotations.get("mask_reason") or "flagged")
    if flag is True:
        return None
    if step.feedback.status == "error" and step.feedback.error in AGENT_ERROR_KINDS:
        return str(step.feedback.error)
    if "parse_failure" in step.annotations:
        return "parse_failure"
    if "guard" in step.annotations:
        return "guard_refused"
    return None


# --------------------------------------------------------------------------- assistant text


def action_text(action: Action) -> str:
    """An action written the way a text-protocol model writes it."""
    if isinstance(action, ToolCall):
        return format_tool_call(action.tool, action.arguments)
    if isinstance(action, Finish):
        return f"{FINISH_OPEN}{action.answer or ''}{FINISH_CLOSE}"
    if isinstance(action, MessageUser):
        return format_tool_call("message_user", {"text": action.text})
    if isinstance(action, Delegate):
        return format_tool_call(
            "delegate", {"goal": action.goal, "tools": action.tools, "agent": action.agent}
        )
    if isinstance(action, UIAction):
        body = json.dumps(action.model_dump(exclude_none=True), ensure_ascii=False)
        return f"{TOOL_CALL_OPEN}\n{body}\n</tool_call>"
    raise RenderError(f"cannot write a {type(action).__name__} action as text")


def assistant_text(step: Step) -> str:
    """What the model said at this step, in the text protocol.

    A text-protocol model's own output (`annotations["model_output"]` holding a `<tool_call>` or
    `<finish>`) is kept verbatim: it is what the model saw in its context afterwards. A parse
    failure keeps the raw output the Harness rejected. Anything else (native tool calls,
    model-free planners) is written canonically with `action_text`.
    """
    raw = step.annotations.get("model_output")
    failure = step.annotations.get("parse_failure")
    if isinstance(raw, str) and raw.strip() and (TOOL_CALL_OPEN in raw or FINISH_OPEN in raw):
        return raw
    if isinstance(failure, dict):
        text = failure.get("raw") or raw
        if isinstance(text, str):
            return text
    return action_text(step.action)


# --------------------------------------------------------------------------- the replay


class _ReplayBackend:
    """Answers the Harness's n-th request with the n-th recorded step, and keeps the requests."""

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory
        self.calls: list[tuple[list[ChatMessage], list[ToolSpec]]] = []

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        index = len(self.calls)
        steps = self.trajectory.steps
        if index >= len(steps):  # pragma: no cover - the replay loop asks once per step
            raise RenderError(f"trajectory {self.trajectory.id}: more requests than steps")
        self.calls.append((cast(list[ChatMessage], messages), list(tools)))
        return Completion(text=assistant_text(steps[index]), protocol="text")


class _RecordedMemory(MemoryStore):
    """An in-memory store that retrieves what the episode recorded (else what a fresh one would)."""

    def __init__(self, recorded: list[str] | None) -> None:
        super().__init__(":memory:")
        self.recorded = None if recorded is None else [_parse_memory(line) for line in recorded]

    def retrieve(self, user_id: str, query: str, k: int = 5) -> list[RetrievedMemory]:
        if self.recorded is None or any(item is None for item in self.recorded):
            return super().retrieve(user_id, query, k)
        return [RetrievedMemory(item=item) for item in self.recorded if item is not None]


def _parse_memory(line: Any) -> MemoryItem | None:
    """`key=value (evidence)` (as `RetrievedMemory.describe` writes it) back into an item."""
    if not isinstance(line, str) or "=" not in line or not line.endswith(")"):
        return None
    key, _, rest = line.partition("=")
    value, sep, evidence = rest[:-1].rpartition(" (")
    if not sep or evidence not in get_args(Evidence):
        return None
    return MemoryItem(key=key, value=value, evidence=cast(Evidence, evidence))


@cache
def _library(skills_path: str | None) -> SkillLibrary:
    if skills_path:
        return SkillLibrary.load(skills_path)
    return SkillLibrary.from_registry()


def episode_opening(trajectory: Trajectory) -> tuple[list[ToolSpec], Feedback]:
    """The tools on offer and the reset feedback the episode started with.

    The tools are the trajectory's own (`Trajectory.tools`: what the environment offered). The
    reset feedback is not recorded, but environments are deterministic at reset: the sandbox,
    AgentDojo and BFCL (their state loaded from the installed benchmark) and the LLM-simulated
    apps (whose reset asks no model) are reset on the task again, which also
    gives the tools of a trajectory written before tools were recorded. For other kinds the reset
    observation is rebuilt from the task; such a trajectory without recorded tools cannot show
    the planner what it was offered, and is refused (ValueError naming the field).
    """
    task = trajectory.task
    recorded = list(trajectory.tools)
    env: Any = None
    try:
        if trajectory.env_kind in _REPLAYABLE_RESETS:
            from qpa.envs.factory import make_env

            env = make_env(trajectory.env_kind)
        elif trajectory.env_kind == "llm_sim":
            from qpa.envs.llmsim import LLMSimEnv

            env = LLMSimEnv("http://127.0.0.1:9/v1", "unused")  # reset never calls the model
        if env is not None:
            first = env.reset(task)
            if first.status == "ok":
                return recorded or list(env.tools()), first
    finally:
        if env is not None:
            env.close()
    if not recorded:
        raise ValueError(
            f"trajectory {trajectory.id!r} ({trajectory.env_kind}): field 'tools' is empty (it "
            "was written before trajectories recorded their tools), so the tools its planner "
            "was offered are unknown and the episode cannot be rendered"
        )
    first = Feedback.ok(
        {"user": task.user.name, "apps": task.apps, "tools": [t.name for t in recorded]}
    )
    return recorded, first


class Renderer:
    """Renders trajectories for one Harness version (its Skill library is loaded once)."""

    def __init__(self, harness: HarnessConfig | None = None) -> None:
        self.harness = (harness or HarnessConfig()).model_copy(update={"memory_path": ":memory:"})
        self.skills = _library(self.harness.skills_path)

    def conversations(
        self,
        trajectory: Trajectory,
        *,
        tools: list[ToolSpec] | None = None,
        first: Feedback | None = None,
    ) -> list[Conversation]:
        """The main conversation first, then one per sub-agent in the order they were opened.

        `tools` and `first` override the episode's opening (see `episode_opening`).
        """
        if tools is None or first is None:
            opened_tools, opened_first = episode_opening(trajectory)
            tools = opened_tools if tools is None else tools
            first = opened_first if first is None else first
        recorded = None
        if trajectory.steps:
            retrieved = trajectory.steps[0].annotations.get("memory_retrieved")
            recorded = list(retrieved) if isinstance(retrieved, list) else None
        memory = _RecordedMemory(recorded)
        backend = _ReplayBackend(trajectory)
        planner = HarnessPlanner(backend, self.harness, memory=memory, skills=self.skills)
        try:
            planner.start(trajectory.task, tools, first)
            last: Step | None = None
            for step in trajectory.steps:
                planner.decide(last)
                last = step
            # the last step's outcome is never sent to the model: nothing to absorb
        finally:
            memory.close()
        return self._collect(trajectory, backend)

    def _collect(self, trajectory: Trajectory, backend: _ReplayBackend) -> list[Conversation]:
        order: list[int] = []
        contexts: dict[int, tuple[list[ChatMessage], list[ToolSpec], list[int]]] = {}
        for step_index, (messages, tools) in enumerate(backend.calls):
            key = id(messages)
            if key not in contexts:
                order.append(key)
                contexts[key] = (messages, tools, [])
            contexts[key][2].append(step_index)
        if not order:  # no steps: the opening only
            return []
        out: list[Conversation] = []
        for key in order:
            messages, tools, step_indexes = contexts[key]
            agents = {trajectory.steps[i].agent for i in step_indexes}
            if len(agents) != 1:
                raise RenderError(
                    f"trajectory {trajectory.id}: steps {step_indexes} of one conversation "
                    f"belong to agents {sorted(agents)}"
                )
            text = to_text_protocol(messages, tools)
            rendered: list[RenderedMessage] = []
            turns = iter(step_indexes)
            for message in text:
                train = False
                if message.role == "assistant":
                    index = next(turns, None)
                    if index is None:
                        raise RenderError(
                            f"trajectory {trajectory.id}: more assistant turns than steps"
                        )
                    train = mask_reason(trajectory.steps[index]) is None
                rendered.append(
                    {"role": message.role, "content": message.content or "", "train": train}
                )
            out.append(Conversation(agents.pop(), rendered, step_indexes))
        return out


@cache
def _renderer(harness_json: str) -> Renderer:
    return Renderer(HarnessConfig.model_validate_json(harness_json))


def renderer_for(harness: HarnessConfig | None = None) -> Renderer:
    """A (cached) renderer for a Harness version."""
    return _renderer((harness or HarnessConfig()).model_dump_json())


def render_conversations(
    trajectory: Trajectory, harness: HarnessConfig | None = None
) -> list[Conversation]:
    """Every conversation of a trajectory: the main agent's, then each sub-agent's."""
    return renderer_for(harness).conversations(trajectory)


def render_trajectory(
    trajectory: Trajectory, harness: HarnessConfig | None = None
) -> list[RenderedMessage]:
    """The main agent's conversation as training messages (`render_conversations` for all)."""
    conversations = render_conversations(trajectory, harness)
    return conversations[0].messages if conversations else []


__all__ = [
    "AGENT_ERROR_KINDS",
    "Conversation",
    "RenderError",
    "RenderedMessage",
    "Renderer",
    "action_text",
    "assistant_text",
    "episode_opening",
    "mask_reason",
    "render_conversations",
    "render_trajectory",
    "renderer_for",
]
