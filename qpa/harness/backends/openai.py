"""`OpenAIBackend`: any OpenAI-compatible chat-completions endpoint (vLLM, KServe, hosted APIs).

- httpx with a request timeout and a separate connect timeout;
- tenacity retries with exponential backoff (and jitter) on connection errors, timeouts, 408,
  429 (honouring `Retry-After`) and 5xx, and on garbled 200 answers; never on other 4xx;
- native function calling (`tools=[{"type": "function", "function": {...}}]`), or the text
  protocol of `qpa.harness.parsing` when `native_tools=False` or when the server rejects `tools`
  with a 400/422 (vLLM without `--enable-auto-tool-choice`): the backend then stays on text;
- secrets by reference only: the name of an environment variable or the path of a mounted file
  (re-read on every request, so rotated secrets are picked up); the key is never logged.

When retries are exhausted it raises `BackendUnavailable` with the last cause; a non-retryable
client error raises `BackendRejected`. Both are environment-side: nothing the model said.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from qpa.contract import TokenUsage, ToolSpec
from qpa.harness.backends.base import (
    BackendRejected,
    BackendUnavailable,
    ChatMessage,
    Completion,
    RawToolCall,
    to_text_protocol,
)
from qpa.harness.parsing import STOP_STRINGS

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 429})


class _RetryableStatus(Exception):
    """A 408/429/5xx answer: worth another try."""

    def __init__(self, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.retry_after = retry_after


class _BadResponse(Exception):
    """A 2xx answer that is not a chat completion (a proxy's error page, a truncated body)."""


_RETRYABLE = (httpx.TransportError, _RetryableStatus, _BadResponse)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def tool_schema(tool: ToolSpec) -> dict[str, Any]:
    """A `ToolSpec` as an OpenAI function tool."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


class OpenAIBackend:
    """A planner model behind an OpenAI-compatible `/chat/completions` endpoint."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        api_key_file: str | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        jitter: bool = True,
        native_tools: bool = True,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.api_key_file = api_key_file
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.jitter = jitter
        self.native_tools = native_tools
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self.fallback_reason: str | None = None
        self._headers = dict(headers or {})
        self._api_key()  # fail fast on a missing secret reference
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
            transport=transport,
        )

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ secrets
    def _api_key(self) -> str | None:
        if self.api_key_file:
            try:
                return Path(self.api_key_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"cannot read api_key_file {self.api_key_file}: {exc}") from exc
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ValueError(
                    f"environment variable {self.api_key_env} (api_key_env) is not set"
                )
            return value.strip()
        return None

    def _request_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self._headers}
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    # ------------------------------------------------------------------ the call
    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        """Ask the model for its next turn; raises `BackendUnavailable` after the retries."""
        started = time.perf_counter()
        native = self.native_tools and bool(tools)
        if native:
            try:
                data = self._post(self._body(messages, tools, native=True))
            except BackendRejected as exc:
                if exc.status not in (400, 422):
                    raise
                data = self._post(self._body(messages, tools, native=False))
                # the text protocol worked where tools were refused: stay on it
                self.native_tools = False
                self.fallback_reason = f"HTTP {exc.status}: {exc.body[:300]}"
                native = False
                log.warning(
                    "%s rejected native tools (%s); using the text protocol",
                    self.base_url,
                    self.fallback_reason,
                )
        else:
            data = self._post(self._body(messages, tools, native=False))
        completion = self._completion(data, native=native or not tools)
        completion.latency_ms = (time.perf_counter() - started) * 1000.0
        return completion

    def _body(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, native: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if native or not tools:
            body["messages"] = [m.to_openai() for m in messages]
            if tools:
                body["tools"] = [tool_schema(t) for t in tools]
        else:
            body["messages"] = [m.to_openai() for m in to_text_protocol(messages, tools)]
            body["stop"] = list(STOP_STRINGS)
        return {**body, **self.extra_body}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(_RETRYABLE),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._post_once(body)
        except _RETRYABLE as exc:
            attempts = int(retrying.statistics.get("attempt_number", self.max_retries + 1))
            raise BackendUnavailable(
                f"model endpoint {self.url} unavailable after {attempts} attempt(s): "
                f"{_describe(exc)}",
                cause=exc,
                attempts=attempts,
                endpoint=self.url,
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _post_once(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self._client.post(self.url, json=body, headers=self._request_headers())
        status = response.status_code
        if status in _RETRY_STATUS or status >= 500:
            raise _RetryableStatus(
                status, response.text, _retry_after(response.headers.get("Retry-After"))
            )
        if status >= 400:
            raise BackendRejected(
                f"model endpoint {self.url} refused the request: "
                f"HTTP {status}: {response.text[:300]}",
                status=status,
                body=response.text,
                endpoint=self.url,
            )
        try:
            data = response.json()
        except ValueError as exc:
            raise _BadResponse(
                f"HTTP {status} with a body that is not JSON: {response.text[:200]!r}"
            ) from exc
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _BadResponse(f"HTTP {status} without choices: {response.text[:200]!r}")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise _BadResponse(f"HTTP {status}: choice without a message: {response.text[:200]!r}")
        return data

    def _wait(self, state: RetryCallState) -> float:
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** (state.attempt_number - 1))
        if self.jitter:
            delay *= 0.5 + random.random() / 2
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _RetryableStatus) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, self.backoff_max_s))
        return delay

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "model endpoint %s: attempt %d failed (%s); retrying",
            self.url,
            state.attempt_number,
            _describe(exc) if exc else "?",
        )

    # ------------------------------------------------------------------ the answer
    def _completion(self, data: dict[str, Any], *, native: bool) -> Completion:
        choice = data["choices"][0]
        message: dict[str, Any] = choice["message"]
        text = _content_text(message.get("content"))
        calls: list[RawToolCall] = []
        raw_calls = message.get("tool_calls") or []
        if not raw_calls and isinstance(message.get("function_call"), dict):  # legacy shape
            raw_calls = [{"id": "", "function": message["function_call"]}]
        for index, raw in enumerate(raw_calls if isinstance(raw_calls, list) else []):
            function = raw.get("function") if isinstance(raw, dict) else None
            if not isinstance(function, dict):
                continue
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = "{}" if arguments is None else json.dumps(arguments)
            calls.append(
                RawToolCall(
                    id=str(raw.get("id") or f"call_{index}"),
                    name=str(function.get("name") or ""),
                    arguments=arguments,
                )
            )
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        return Completion(
            text=text,
            tool_calls=calls,
            usage=_usage(data.get("usage"), text, calls),
            finish_reason=choice.get("finish_reason"),
            model=str(data.get("model") or self.model),
            reasoning=reasoning if isinstance(reasoning, str) else None,
            protocol="native" if native else "text",
        )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _usage(raw: Any, text: str, calls: list[RawToolCall]) -> TokenUsage:
    """The server's token counts; a rough estimate (4 characters a token) when it sends none."""
    if isinstance(raw, dict) and isinstance(raw.get("completion_tokens"), int):
        return TokenUsage(
            prompt_tokens=int(raw.get("prompt_tokens") or 0),
            completion_tokens=int(raw["completion_tokens"]),
        )
    produced = len(text) + sum(len(c.name) + len(c.arguments) for c in calls)
    return TokenUsage(prompt_tokens=0, completion_tokens=max(1, produced // 4) if produced else 0)
