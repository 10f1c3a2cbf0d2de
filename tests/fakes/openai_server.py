"""A deterministic OpenAI-compatible chat server for tests (FastAPI + uvicorn, 127.0.0.1 only).

Each test scripts its own backend: the server answers `POST /v1/chat/completions` by calling a
Python `handler(request) -> reply` and wraps the reply in the OpenAI response shape, with usage
counts; `GET /v1/models` lists the served model ids. It runs in a background thread on a free
port, so synchronous code under test (httpx clients, OpenAI SDKs, LLMSimEnv) talks to it over real
HTTP.

    with FakeOpenAI(lambda req: {"result": {"ok": True}}) as server:
        client = ChatClient(server.base_url, "fake-model")   # base_url ends in /v1
        ...
        assert server.requests[0].messages[-1]["role"] == "user"

What a handler may return (`Reply` gives full control):

- `str`: the assistant's content, verbatim (also invalid JSON, to test parsers);
- `dict` or `list`: JSON-encoded into the content (handy for JSON-mode backends);
- `Reply(content=..., tool_calls=[ToolCallReply("name", {...}), ...])`: native tool calls
  (`finish_reason` becomes `tool_calls`; arguments given as a dict are JSON-encoded);
- `Reply.http_error(503, retry_after=1)`: an HTTP error with an OpenAI-style error body;
- `Reply.broken_body("{not json")`: a 200 whose body is not JSON at all;
- `Reply(..., delay=2.0)`: answer late (client timeouts).

Error injection without touching the handler: `server.fail_next(2, status=429)` answers the
next two chat requests with that status before the handler sees any. Every chat request,
injected failures included, is recorded in `server.requests` (`ChatRequest.injected` tells
them apart); `server.handler_calls` counts the ones the handler answered. A handler that raises
yields HTTP 500 and the exception lands in `server.handler_errors` (assert it is empty).

Usage counts are deterministic: one token per word or punctuation mark of the message
contents (prompt) and of the reply's content and tool-call arguments (completion).
`stream=true` is answered as server-sent events (one content chunk, a final chunk, `[DONE]`,
and a usage chunk when `stream_options.include_usage` is set).

Pytest: the `openai_server` fixture yields a started server, reset before and after each test
(default handler: echo the last user message); one server serves the whole session
(`openai_server_session`). Register both with `pytest_plugins = ["fakes.openai_server"]` in
tests/conftest.py (tests/ is on sys.path there, as the rootdir conftest's folder).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

__all__ = [
    "ChatRequest",
    "FakeOpenAI",
    "Handler",
    "Reply",
    "ToolCallReply",
    "count_tokens",
    "echo_handler",
    "openai_server",
    "openai_server_session",
    "sample_instance",
    "scripted",
]

CREATED = 1_767_225_600  # fixed timestamp: responses are byte-for-byte reproducible
_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """The fake's tokenizer: words and punctuation marks."""
    return len(_TOKEN.findall(text))


@dataclass
class ChatRequest:
    """One chat request as the server received it."""

    index: int
    body: dict[str, Any]
    headers: dict[str, str]
    injected: bool = False

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages")
        return messages if isinstance(messages, list) else []

    @property
    def tools(self) -> list[dict[str, Any]]:
        tools = self.body.get("tools")
        return tools if isinstance(tools, list) else []

    @property
    def system(self) -> str:
        """The content of the first system message ('' when none)."""
        return next((_text(m) for m in self.messages if m.get("role") == "system"), "")

    @property
    def last_user(self) -> str:
        """The content of the last user message ('' when none)."""
        return next((_text(m) for m in reversed(self.messages) if m.get("role") == "user"), "")

    def last_user_json(self) -> Any:
        """The last user message parsed as JSON (raises ValueError when it is not JSON)."""
        return json.loads(self.last_user)


@dataclass
class ToolCallReply:
    """A native tool call in a reply; `arguments` may be a dict or an already encoded string."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass
class Reply:
    """Full control over one answer: content, tool calls, HTTP status, raw body, delay."""

    content: str | None = None
    tool_calls: list[ToolCallReply] | None = None
    finish_reason: str | None = None
    status: int = 200
    error: str | None = None
    raw: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] | None = None
    delay: float = 0.0

    @classmethod
    def json(cls, value: Any) -> Reply:
        return cls(content=json.dumps(value))

    @classmethod
    def calls(cls, *calls: ToolCallReply, content: str | None = None) -> Reply:
        return cls(content=content, tool_calls=list(calls))

    @classmethod
    def http_error(
        cls, status: int = 500, message: str = "injected failure", retry_after: float | None = None
    ) -> Reply:
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return cls(status=status, error=message, headers=headers)

    @classmethod
    def broken_body(cls, text: str = "{this is not json", status: int = 200) -> Reply:
        return cls(raw=text, status=status)


Handler = Callable[[ChatRequest], "Reply | str | dict[str, Any] | list[Any]"]


def echo_handler(request: ChatRequest) -> Reply:
    """The default: repeat the last user message."""
    return Reply(content=request.last_user)


def scripted(*replies: Reply | str | dict[str, Any] | list[Any]) -> Handler:
    """A handler that gives `replies` in order, then repeats the last one."""
    if not replies:
        raise ValueError("scripted() needs at least one reply")
    state = {"next": 0}
    lock = threading.Lock()

    def handler(request: ChatRequest) -> Reply | str | dict[str, Any] | list[Any]:
        with lock:
            index = min(state["next"], len(replies) - 1)
            state["next"] += 1
        return replies[index]

    return handler


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _prompt_tokens(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        total += count_tokens(_text(message))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            total += count_tokens(str(function.get("name", "")))
            total += count_tokens(str(function.get("arguments", "")))
    return total


def _error_body(status: int, message: str) -> dict[str, Any]:
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }
    return {
        "error": {"message": message, "type": kinds.get(status, "server_error"), "code": status}
    }


class FakeOpenAI:
    """The server. Use as a context manager, or `start()`/`stop()` yourself."""

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        model: str = "fake-model",
        models: list[str] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.handler: Handler = handler or echo_handler
        self.model = model
        self.models = models  # when set, requests for other models get 404 (as vLLM does)
        self.api_key = api_key  # when set, requests need `Authorization: Bearer <api_key>`
        self._defaults = (self.handler, model, models, api_key)
        self.requests: list[ChatRequest] = []
        self.handler_errors: list[BaseException] = []
        self.handler_calls = 0
        self._inject: list[Reply] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port = 0
        self.app = self._build_app()

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        """Root URL, `http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What OpenAI clients take as base URL: `http://127.0.0.1:PORT/v1`."""
        return f"{self.url}/v1"

    def fail_next(
        self, count: int, status: int = 500, *, retry_after: float | None = None, message: str = ""
    ) -> None:
        """Answer the next `count` chat requests with HTTP `status` (before the handler)."""
        with self._lock:
            self._inject.extend(
                Reply.http_error(status, message or f"injected HTTP {status}", retry_after)
                for _ in range(count)
            )

    def reset(self, handler: Handler | None = None) -> None:
        """Forget requests and pending injections; restore the constructor's settings.

        `handler`, `model`, `models` and `api_key` go back to what the server was built with
        (or `handler` to the one given here): one server can serve many tests.
        """
        with self._lock:
            self.requests.clear()
            self.handler_errors.clear()
            self.handler_calls = 0
            self._inject.clear()
            default_handler, self.model, models, self.api_key = self._defaults
            self.models = None if models is None else list(models)
            self.handler = handler or default_handler

    @property
    def chat_requests(self) -> list[ChatRequest]:
        """Requests the handler answered (injected failures left out)."""
        return [r for r in self.requests if not r.injected]

    def start(self, timeout: float = 10.0) -> FakeOpenAI:
        if self._server is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run,
            kwargs={"sockets": [sock]},
            name=f"fake-openai-{self.port}",
            daemon=True,
        )
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        self._server, self._thread = server, thread
        self._socket = sock
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()
        self._server, self._thread, self._socket = None, None, None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP
    def _build_app(self) -> FastAPI:
        app = FastAPI(title="fake-openai", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/v1/models")
        def list_models(request: Request) -> Response:
            denied = self._denied(request)
            if denied is not None:
                return denied
            ids = self.models or [self.model]
            return JSONResponse(
                {
                    "object": "list",
                    "data": [
                        {"id": i, "object": "model", "created": CREATED, "owned_by": "fake"}
                        for i in ids
                    ],
                }
            )

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            raw = await request.body()
            # The handler is synchronous and may sleep: keep it off the event loop.
            return await run_in_threadpool(self._complete, request, raw)

        return app

    def _denied(self, request: Request) -> Response | None:
        if self.api_key is None:
            return None
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse(_error_body(401, "invalid API key"), status_code=401)
        return None

    def _complete(self, request: Request, raw: bytes) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        with self._lock:
            record = ChatRequest(
                index=len(self.requests),
                body=body if isinstance(body, dict) else {},
                headers=headers,
            )
            self.requests.append(record)
            injected = self._inject.pop(0) if self._inject else None
            record.injected = injected is not None
        if injected is not None:
            return self._respond(record, injected)
        denied = self._denied(request)
        if denied is not None:
            return denied
        if not isinstance(body, dict):
            return JSONResponse(_error_body(400, "the body must be a JSON object"), status_code=400)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return JSONResponse(
                _error_body(400, "'messages' must be a non-empty list"), status_code=400
            )
        model = body.get("model") or self.model
        if self.models is not None and model not in self.models:
            message = f"The model `{model}` does not exist."
            return JSONResponse(_error_body(404, message), status_code=404)
        try:
            answer = self.handler(record)
        except Exception as exc:
            self.handler_errors.append(exc)
            message = f"handler raised {type(exc).__name__}: {exc}"
            return JSONResponse(_error_body(500, message), status_code=500)
        finally:
            with self._lock:
                self.handler_calls += 1
        return self._respond(record, _as_reply(answer))

    def _respond(self, request: ChatRequest, reply: Reply) -> Response:
        if reply.delay:
            time.sleep(reply.delay)
        if reply.raw is not None:
            return Response(
                reply.raw,
                status_code=reply.status,
                headers=reply.headers,
                media_type="application/json",
            )
        if reply.status >= 400:
            body = _error_body(reply.status, reply.error or f"HTTP {reply.status}")
            return JSONResponse(body, status_code=reply.status, headers=reply.headers)
        tool_calls: list[dict[str, Any]] = [
            {
                "id": call.id or f"call_{request.index}_{i}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments
                    if isinstance(call.arguments, str)
                    else json.dumps(call.arguments),
                },
            }
            for i, call in enumerate(reply.tool_calls or [])
        ]
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
        completion = count_tokens(reply.content or "") + sum(
            count_tokens(c["function"]["name"]) + count_tokens(c["function"]["arguments"])
            for c in tool_calls
        )
        prompt = _prompt_tokens(request.messages)
        usage = reply.usage or {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        model = request.model or self.model
        completion_id = f"chatcmpl-fake-{request.index}"
        if request.body.get("stream"):
            options = request.body.get("stream_options") or {}
            chunks = _stream_chunks(
                completion_id, model, message, finish, usage, bool(options.get("include_usage"))
            )
            return StreamingResponse(chunks, media_type="text/event-stream", headers=reply.headers)
        document = {
            "id": completion_id,
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": usage,
        }
        return JSONResponse(document, headers=reply.headers)


def _stream_chunks(
    completion_id: str,
    model: str,
    message: dict[str, Any],
    finish: str,
    usage: dict[str, int],
    include_usage: bool,
) -> Iterator[str]:
    def chunk(delta: dict[str, Any], finish_reason: str | None, **extra: Any) -> str:
        document = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            **extra,
        }
        return f"data: {json.dumps(document)}\n\n"

    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    yield chunk(delta, None)
    yield chunk({}, finish)
    if include_usage:
        document = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        yield f"data: {json.dumps(document)}\n\n"
    yield "data: [DONE]\n\n"


def _as_reply(answer: Any) -> Reply:
    if isinstance(answer, Reply):
        return answer
    if isinstance(answer, str):
        return Reply(content=answer)
    if isinstance(answer, dict | list):
        return Reply(content=json.dumps(answer))
    raise TypeError(f"a handler must return Reply, str, dict or list, not {type(answer).__name__}")


# --------------------------------------------------------------------------- schema samples


def sample_instance(schema: dict[str, Any]) -> Any:
    """A small deterministic value valid for a JSON schema (the subset tool schemas use).

    Objects get every declared property, arrays one item, strings honour `enum`/`const`,
    `format: date` and a few patterns; numbers sit inside their bounds (1 when allowed).
    """
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        return {k: sample_instance(v) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [sample_instance(schema.get("items", {})) for _ in range(count)]
    if kind in ("integer", "number"):
        step = 1 if kind == "integer" else 0.5
        value: float = 1
        if "minimum" in schema or "exclusiveMinimum" in schema:
            value = max(value, schema.get("minimum", schema.get("exclusiveMinimum", 0) + step))
        if "maximum" in schema or "exclusiveMaximum" in schema:
            value = min(value, schema.get("maximum", schema.get("exclusiveMaximum", 0) - step))
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _sample_string(schema)


def _sample_string(schema: dict[str, Any]) -> str:
    if schema.get("format") == "date":
        return "2026-03-06"
    if schema.get("format") == "date-time":
        return "2026-03-06T09:30:00Z"
    pattern = schema.get("pattern", "")
    samples = {
        "^Z[1-9]$": "Z7",
        "^PP-[0-9]{6}$": "PP-900001",
        "^[0-2][0-9]:[0-5][0-9]$": "09:30",
    }
    if pattern in samples:
        return samples[pattern]
    if pattern:
        raise ValueError(f"sample_instance: no sample for pattern {pattern!r}; add one")
    return "sample".ljust(int(schema.get("minLength", 0)), "x")


# --------------------------------------------------------------------------- pytest


@pytest.fixture(scope="session")
def openai_server_session() -> Iterator[FakeOpenAI]:
    """One fake server for the whole session (starting and stopping costs ~0.2 s each)."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def openai_server(openai_server_session: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """The session's fake server, reset for this test (echo handler, nothing recorded).

    Set `.handler` (or `.api_key`, `.models`, `fail_next(...)`) to script the backend; the
    next test starts from the defaults again.
    """
    openai_server_session.reset()
    yield openai_server_session
    openai_server_session.reset()
