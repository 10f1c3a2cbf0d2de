"""What every planner model backend speaks: chat messages and tools in, one `Completion` out.

A backend turns a conversation (`ChatMessage`s, OpenAI roles) and the tools on offer
(`ToolSpec`s) into text, raw tool calls and token usage. It never interprets the output: turning
a `Completion` into an `Action` (or a `ParseFailure`) is `qpa.harness.parsing`'s job, so the same
parser serves every backend. A backend that cannot reach its model after its retries raises
`BackendUnavailable` with the cause: an environment-side failure, never the model's fault.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from qpa.contract import TokenUsage, ToolSpec
from qpa.harness.parsing import format_tool_call, format_tool_response, render_tool_protocol

Role = Literal["system", "user", "assistant", "tool"]
WireProtocol = Literal["native", "text"]


class RawToolCall(BaseModel):
    """A tool call as the model wrote it: `arguments` is the raw (unparsed) JSON string."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    name: str
    arguments: str = "{}"

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class ChatMessage(BaseModel):
    """One message of a conversation, with OpenAI chat-completions semantics."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str | None = None
    tool_calls: list[RawToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def system(cls, content: str) -> ChatMessage:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> ChatMessage:
        return cls(role="user", content=content)

    @classmethod
    def assistant(
        cls, content: str | None = None, tool_calls: Sequence[RawToolCall] = ()
    ) -> ChatMessage:
        return cls(role="assistant", content=content, tool_calls=list(tool_calls))

    @classmethod
    def tool(cls, content: Any, tool_call_id: str, name: str | None = None) -> ChatMessage:
        """A tool result; non-string content is sent as JSON."""
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        return cls(role="tool", content=text, tool_call_id=tool_call_id, name=name)

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat-completions request item."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.role == "assistant" and self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id or ""
            if out["content"] is None:
                out["content"] = ""
        if self.name is not None:
            out["name"] = self.name
        return out


class Completion(BaseModel):
    """What the model answered to one request."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    tool_calls: list[RawToolCall] = Field(default_factory=list)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    finish_reason: str | None = None
    latency_ms: float = 0.0
    model: str = ""
    reasoning: str | None = None
    protocol: WireProtocol = "native"

    def to_message(self) -> ChatMessage:
        """The completion as the assistant turn to append to the conversation."""
        return ChatMessage.assistant(self.text or None, self.tool_calls)


@runtime_checkable
class ModelBackend(Protocol):
    """A planner model behind one call: messages + tools -> text, tool calls, token usage."""

    def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> Completion: ...


class BackendError(Exception):
    """Base of backend failures (the model could not be asked; nothing the model said)."""

    side = "environment"


class BackendUnavailable(BackendError):
    """The model endpoint could not be reached (or kept failing) after every retry.

    `cause` is the last underlying error; `attempts` how many requests were made. Diagnosis
    attributes an episode ended by this to the environment side, never to the model.
    """

    def __init__(
        self,
        message: str,
        *,
        cause: BaseException | None = None,
        attempts: int = 0,
        endpoint: str = "",
    ) -> None:
        super().__init__(message)
        self.cause = cause
        self.attempts = attempts
        self.endpoint = endpoint


class BackendRejected(BackendError):
    """The endpoint answered with a non-retryable client error (4xx): a configuration problem."""

    def __init__(self, message: str, *, status: int, body: str = "", endpoint: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.endpoint = endpoint


def to_text_protocol(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> list[ChatMessage]:
    """The conversation for a model without native function calling.

    The tools and the calling convention go into the (first) system prompt; earlier assistant
    tool calls become `<tool_call>` blocks and tool results `<tool_response>` blocks in user
    turns (consecutive results share one turn). Only system/user/assistant roles remain.
    """
    protocol = render_tool_protocol(tools)
    out: list[ChatMessage] = []
    has_system = False
    for message in messages:
        if message.role == "system" and not has_system:
            has_system = True
            content = f"{message.content}\n\n{protocol}" if message.content else protocol
            out.append(ChatMessage.system(content))
        elif message.role == "assistant":
            parts = [message.content] if message.content else []
            parts += [format_tool_call(c.name, c.arguments) for c in message.tool_calls]
            out.append(ChatMessage.assistant("\n".join(parts)))
        elif message.role == "tool":
            block = format_tool_response(message.content or "")
            last = out[-1] if out else None
            if (
                last is not None
                and last.role == "user"
                and (last.content or "").endswith("</tool_response>")
            ):
                out[-1] = ChatMessage.user(f"{last.content}\n{block}")
            else:
                out.append(ChatMessage.user(block))
        else:
            out.append(ChatMessage(role=message.role, content=message.content or ""))
    if not has_system:
        out.insert(0, ChatMessage.system(protocol))
    return out
