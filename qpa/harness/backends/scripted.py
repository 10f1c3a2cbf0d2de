"""Model backends that need no model: replaying a reference plan, or a scripted function.

`OracleBackend` answers like a perfect model would, one native tool call per turn, following
the task's reference plan and grounding `${i.path}` arguments in the tool results it is shown.
Running the Harness on it isolates the Harness's own cost per turn (benchmarks) and exercises
the full loop (prompt, parse, guard, sub-agents, memory) in tests. `ScriptedBackend` calls a
function of the conversation, for tests that script a model's misbehaviour.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from qpa.contract import Action, Delegate, Finish, MessageUser, Task, TokenUsage, ToolCall, ToolSpec
from qpa.harness.backends.base import ChatMessage, Completion, RawToolCall
from qpa.harness.planners import ground

_PREFACE_END = "]\n"


def _observation(message: ChatMessage) -> Any:
    content = message.content or ""
    _, _, body = content.partition(_PREFACE_END)
    try:
        data = json.loads(body or content)
    except json.JSONDecodeError:
        return None
    return data.get("result") if isinstance(data, dict) else None


def _as_call(action: Action, index: int) -> RawToolCall:
    if isinstance(action, ToolCall):
        name, args = action.tool, action.arguments
    elif isinstance(action, Finish):
        name, args = "finish", {"answer": action.answer}
    elif isinstance(action, Delegate):
        name, args = "delegate", {"goal": action.goal, "tools": action.tools, "agent": action.agent}
    elif isinstance(action, MessageUser):
        name, args = "message_user", {"text": action.text}
    else:
        raise ValueError(f"the oracle backend cannot express a {action.type} action")
    return RawToolCall(id=f"call_{index}", name=name, arguments=json.dumps(args))


class OracleBackend:
    """A perfect model for one task: replays its reference plan as native tool calls."""

    def __init__(self, task: Task, *, completion_tokens: int = 20) -> None:
        if not task.reference_plan:
            raise ValueError(f"task {task.id} has no reference plan")
        self.plan = list(task.reference_plan)
        self.completion_tokens = completion_tokens
        self.results: list[Any] = []
        self.cursor = 0
        self._last_delegate: dict[str, Any] | None = None

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        if self.cursor > 0:
            last = messages[-1]
            opened_subagent = not any(m.role == "assistant" for m in messages)
            self.results.append(self._last_delegate if opened_subagent else _observation(last))
        if self.cursor >= len(self.plan):
            action: Action = Finish()
        else:
            action = self.plan[self.cursor]
        action = ground(action, self.results)
        if isinstance(action, Delegate):
            self._last_delegate = {"delegated_to": action.agent, "goal": action.goal}
        call = _as_call(action, self.cursor)
        self.cursor += 1
        prompt = sum(len(m.content or "") for m in messages) // 4
        usage = TokenUsage(prompt_tokens=prompt, completion_tokens=self.completion_tokens)
        return Completion(text="", tool_calls=[call], usage=usage, finish_reason="tool_calls")


class ScriptedBackend:
    """A model whose every answer is `respond(messages, tools)`: for tests."""

    def __init__(self, respond: Callable[[Sequence[ChatMessage], Sequence[ToolSpec]], Completion]):
        self.respond = respond
        self.calls = 0

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        self.calls += 1
        return self.respond(messages, tools)
