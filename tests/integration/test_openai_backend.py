"""`OpenAIBackend` over real HTTP against the fake OpenAI-compatible server on 127.0.0.1.

Covers native function calling, the text-protocol fallback (asked for, and automatic when the
server refuses `tools`), retries on 5xx/429/garbled answers, no retries on other 4xx, an
endpoint that is down or too slow (`BackendUnavailable` with the cause), secrets by reference,
and malformed model output ending as a `ParseFailure` rather than a crash.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from qpa.contract import Feedback, Finish, Step, Task, TokenUsage, ToolCall, ToolSpec
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.backends import (
    BackendRejected,
    BackendUnavailable,
    ChatMessage,
    OpenAIBackend,
    RawToolCall,
    make_backend,
)
from qpa.harness.parsing import ParseFailure, parse_completion
from qpa.harness.planners import Decision
from qpa.harness.runner import run_episode

try:
    from tests.fakes.openai_server import (
        ChatRequest,
        FakeOpenAI,
        Reply,
        ToolCallReply,
        count_tokens,
        scripted,
    )
except ModuleNotFoundError:  # the repository root is not importable: tests/ is on sys.path
    from fakes.openai_server import (  # type: ignore[no-redef]
        ChatRequest,
        FakeOpenAI,
        Reply,
        ToolCallReply,
        count_tokens,
        scripted,
    )

TOOLS = [
    ToolSpec(
        name="contacts_search",
        description="Find contacts by name.",
        app="contacts",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="messaging_send",
        description="Send a text message.",
        app="messaging",
        side_effect="write",
        parameters={
            "type": "object",
            "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
            "required": ["to", "text"],
            "additionalProperties": False,
        },
    ),
]
MESSAGES = [ChatMessage.system("You are a phone agent."), ChatMessage.user("Text Ana: hi")]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(model="qwen-planner") as fake:
        yield fake


def backend_for(server: FakeOpenAI, **options: Any) -> OpenAIBackend:
    settings: dict[str, Any] = {
        "max_retries": 3,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
        "jitter": False,
        "timeout_s": 5.0,
        **options,
    }
    return OpenAIBackend(server.base_url, "qwen-planner", **settings)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --------------------------------------------------------------------------- native tools


def test_native_tool_call_round_trip(server: FakeOpenAI) -> None:
    server.handler = lambda request: Reply.calls(
        ToolCallReply("contacts_search", {"query": "Ana"}, id="call_a")
    )
    with backend_for(server) as backend:
        completion = backend.complete(MESSAGES, TOOLS)
    assert completion.protocol == "native"
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls == [
        RawToolCall(id="call_a", name="contacts_search", arguments='{"query": "Ana"}')
    ]
    assert completion.usage == TokenUsage(
        prompt_tokens=count_tokens("You are a phone agent.") + count_tokens("Text Ana: hi"),
        completion_tokens=count_tokens("contacts_search") + count_tokens('{"query": "Ana"}'),
    )
    assert completion.latency_ms > 0
    assert completion.model == "qwen-planner"
    action = parse_completion(completion, TOOLS)
    assert action == ToolCall(tool="contacts_search", arguments={"query": "Ana"}, call_id="call_a")

    (request,) = server.requests
    assert request.model == "qwen-planner"
    assert request.body["temperature"] == 0.0 and request.body["max_tokens"] > 0
    assert request.tools[0] == {
        "type": "function",
        "function": {
            "name": "contacts_search",
            "description": "Find contacts by name.",
            "parameters": TOOLS[0].parameters,
        },
    }
    assert [m["role"] for m in request.messages] == ["system", "user"]


def test_native_history_carries_tool_calls_and_results(server: FakeOpenAI) -> None:
    server.handler = lambda request: Reply(content="<finish>sent</finish>")
    history = [
        *MESSAGES,
        ChatMessage.assistant(
            None, [RawToolCall(id="c1", name="contacts_search", arguments='{"query": "Ana"}')]
        ),
        ChatMessage.tool([{"name": "Ana", "phone": "+1-555-0101"}], tool_call_id="c1"),
    ]
    with backend_for(server, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) as b:
        completion = b.complete(history, TOOLS)
    assert parse_completion(completion, TOOLS) == Finish(answer="sent")
    (request,) = server.requests
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "tool"]
    assert request.messages[2]["tool_calls"][0]["function"]["name"] == "contacts_search"
    assert request.messages[3]["tool_call_id"] == "c1"
    assert "+1-555-0101" in request.messages[3]["content"]
    assert request.body["chat_template_kwargs"] == {"enable_thinking": False}


# --------------------------------------------------------------------------- text protocol


def test_text_protocol_when_asked(server: FakeOpenAI) -> None:
    server.handler = lambda request: (
        '<tool_call>\n{"name": "messaging_send", "arguments": {"to": "+1", "text": "hi"}}\n'
    )
    history = [
        *MESSAGES,
        ChatMessage.assistant(
            None, [RawToolCall(id="c1", name="contacts_search", arguments='{"query": "Ana"}')]
        ),
        ChatMessage.tool('[{"phone": "+1"}]', tool_call_id="c1"),
    ]
    with backend_for(server, native_tools=False) as backend:
        completion = backend.complete(history, TOOLS)
    assert completion.protocol == "text" and not completion.tool_calls
    assert parse_completion(completion, TOOLS) == ToolCall(
        tool="messaging_send", arguments={"to": "+1", "text": "hi"}
    )
    (request,) = server.requests
    assert "tools" not in request.body
    assert request.body["stop"] == ["</tool_call>", "</finish>"]
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.system.startswith("You are a phone agent.")
    assert '"name": "messaging_send"' in request.system and "<tool_call>" in request.system
    assert "<tool_call>" in request.messages[2]["content"]
    assert "<tool_response>" in request.last_user


def test_falls_back_to_text_when_the_server_refuses_tools(server: FakeOpenAI) -> None:
    def handler(request: ChatRequest) -> Reply:
        if request.tools:  # as vLLM answers without --enable-auto-tool-choice
            return Reply.http_error(
                400, '"auto" tool choice requires --enable-auto-tool-choice to be set'
            )
        return Reply(content="<finish>Ana is +1</finish>")

    server.handler = handler
    with backend_for(server) as backend:
        first = backend.complete(MESSAGES, TOOLS)
        assert first.protocol == "text"
        assert parse_completion(first, TOOLS) == Finish(answer="Ana is +1")
        assert backend.native_tools is False
        assert backend.fallback_reason is not None and "400" in backend.fallback_reason
        second = backend.complete(MESSAGES, TOOLS)
    assert second.protocol == "text"
    assert [bool(r.tools) for r in server.requests] == [True, False, False]


def test_without_tools_no_tools_are_sent(server: FakeOpenAI) -> None:
    server.handler = lambda request: "plain answer"
    with backend_for(server) as backend:
        completion = backend.complete(MESSAGES, [])
    assert completion.text == "plain answer"
    assert "tools" not in server.requests[0].body


# --------------------------------------------------------------------------- retries


def test_server_errors_then_success(server: FakeOpenAI) -> None:
    server.handler = lambda request: Reply.calls(ToolCallReply("contacts_search", {"query": "A"}))
    server.fail_next(2, status=500)
    server.fail_next(1, status=429, retry_after=0.01)
    with backend_for(server) as backend:
        completion = backend.complete(MESSAGES, TOOLS)
    assert completion.tool_calls[0].name == "contacts_search"
    assert [r.injected for r in server.requests] == [True, True, True, False]


def test_garbled_answer_is_retried(server: FakeOpenAI) -> None:
    server.handler = scripted(
        Reply.broken_body("<html>bad gateway</html>"), Reply(content="<finish>ok</finish>")
    )
    with backend_for(server) as backend:
        completion = backend.complete(MESSAGES, TOOLS)
    assert completion.text == "<finish>ok</finish>"
    assert len(server.requests) == 2


def test_server_errors_exhaust_the_retries(server: FakeOpenAI) -> None:
    server.fail_next(10, status=503)
    with backend_for(server, max_retries=2) as backend, pytest.raises(BackendUnavailable) as info:
        backend.complete(MESSAGES, TOOLS)
    error = info.value
    assert error.attempts == 3 and len(server.requests) == 3
    assert "503" in str(error) and "503" in str(error.cause)
    assert error.endpoint == f"{server.base_url}/chat/completions"
    assert error.side == "environment"


def test_client_errors_are_not_retried(server: FakeOpenAI) -> None:
    server.handler = lambda request: Reply.http_error(404, "The model `x` does not exist.")
    with backend_for(server) as backend, pytest.raises(BackendRejected) as info:
        backend.complete(MESSAGES, [])
    assert info.value.status == 404 and "does not exist" in info.value.body
    assert len(server.requests) == 1


def test_endpoint_down_fails_after_retries_with_the_cause() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = OpenAIBackend(url, "m", max_retries=2, backoff_s=0.01, jitter=False)
    started = time.perf_counter()
    with pytest.raises(BackendUnavailable) as info:
        backend.complete(MESSAGES, TOOLS)
    assert time.perf_counter() - started < 5
    assert info.value.attempts == 3
    assert isinstance(info.value.cause, httpx.ConnectError)
    assert "ConnectError" in str(info.value) and url in str(info.value)


def test_slow_endpoint_times_out(server: FakeOpenAI) -> None:
    server.handler = lambda request: Reply(content="too late", delay=1.0)
    with backend_for(server, timeout_s=0.2, max_retries=1) as backend:
        started = time.perf_counter()
        with pytest.raises(BackendUnavailable) as info:
            backend.complete(MESSAGES, TOOLS)
    assert time.perf_counter() - started < 2.0
    assert isinstance(info.value.cause, httpx.TimeoutException)
    assert info.value.attempts == 2


# --------------------------------------------------------------------------- secrets


def test_api_key_by_environment_variable(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.api_key = "s3cret"
    server.handler = lambda request: "<finish/>"
    monkeypatch.setenv("QPA_TEST_MODEL_KEY", "s3cret")
    with backend_for(server, api_key_env="QPA_TEST_MODEL_KEY") as backend:
        backend.complete(MESSAGES, TOOLS)
        assert "s3cret" not in repr(backend)
    assert server.requests[0].headers["authorization"] == "Bearer s3cret"
    monkeypatch.setenv("QPA_TEST_MODEL_KEY", "wrong")
    with (
        backend_for(server, api_key_env="QPA_TEST_MODEL_KEY") as backend,
        pytest.raises(BackendRejected) as info,
    ):
        backend.complete(MESSAGES, TOOLS)
    assert info.value.status == 401
    monkeypatch.delenv("QPA_TEST_MODEL_KEY")
    with pytest.raises(ValueError, match="QPA_TEST_MODEL_KEY"):
        backend_for(server, api_key_env="QPA_TEST_MODEL_KEY")


def test_api_key_by_mounted_file(server: FakeOpenAI, tmp_path: Path) -> None:
    server.api_key = "from-file"
    server.handler = lambda request: "<finish/>"
    key = tmp_path / "api-key"
    key.write_text("from-file\n")
    with backend_for(server, api_key_file=str(key)) as backend:
        backend.complete(MESSAGES, TOOLS)
        key.write_text("rotated\n")  # re-read on every request
        with pytest.raises(BackendRejected):
            backend.complete(MESSAGES, TOOLS)
    assert server.requests[0].headers["authorization"] == "Bearer from-file"
    assert server.requests[1].headers["authorization"] == "Bearer rotated"


# --------------------------------------------------------------------------- malformed output


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (Reply(content="I would text Ana now."), "malformed_output"),
        (
            Reply(content='<tool_call>{"name": "contacts_search", "arguments": {query}}'),
            "malformed_output",
        ),
        (Reply.calls(ToolCallReply("contacts_search", "{not json")), "malformed_output"),
        (Reply.calls(ToolCallReply("contacts_search", "[1, 2]")), "malformed_output"),
        (Reply.calls(ToolCallReply("sms_send", {"to": "+1"})), "unknown_tool"),
        (
            Reply.calls(ToolCallReply("messaging_send", {"to": "+1", "body": "x"})),
            "invalid_arguments",
        ),
    ],
)
def test_malformed_output_is_a_parse_failure(server: FakeOpenAI, reply: Reply, kind: str) -> None:
    server.handler = lambda request: reply
    with backend_for(server) as backend:
        completion = backend.complete(MESSAGES, TOOLS)
    result = parse_completion(completion, TOOLS)
    assert isinstance(result, ParseFailure) and result.kind == kind
    assert result.feedback().status == "error"


# --------------------------------------------------------------------------- in an episode


class _ModelPlanner:
    """A minimal model-backed planner: enough to run an episode over the backend."""

    name = "test-model"

    def __init__(self, backend: OpenAIBackend) -> None:
        self.backend = backend
        self.messages: list[ChatMessage] = []
        self.tools: list[ToolSpec] = []

    def start(self, task: Task, tools: list[ToolSpec], first: Feedback) -> None:
        self.tools = tools
        self.messages = [
            ChatMessage.system("You operate a phone."),
            ChatMessage.user(task.instruction),
        ]

    def decide(self, last: Step | None) -> Decision:
        completion = self.backend.complete(self.messages, self.tools)
        action = parse_completion(completion, self.tools)
        if isinstance(action, ParseFailure):
            return Decision(Finish(), usage=completion.usage, feedback=action.feedback())
        return Decision(action, usage=completion.usage)


def test_unreachable_endpoint_fails_the_episode_environment_side() -> None:
    task = generate_suite()[0]
    backend = OpenAIBackend(
        f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=1, backoff_s=0.01, jitter=False
    )
    trajectory = run_episode(SandboxEnv(), task, _ModelPlanner(backend))
    assert not trajectory.success
    assert trajectory.error is not None and trajectory.error.startswith("environment")
    assert "BackendUnavailable" in trajectory.error or "unavailable" in trajectory.error
    assert "ConnectError" in trajectory.error


def test_make_backend_builds_openai(server: FakeOpenAI) -> None:
    backend = make_backend("openai", base_url=server.base_url, model="qwen-planner")
    assert isinstance(backend, OpenAIBackend)
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("nope")
