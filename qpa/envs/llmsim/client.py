"""A minimal client of OpenAI-compatible chat endpoints (vLLM, KServe, any), on httpx.

Secrets are referenced, never inlined: the API key comes from an environment variable *name*
or a file *path* (a mounted Kubernetes Secret), read once when the client is built and never
shown in `repr`. Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential
backoff and jitter (tenacity), honouring a `Retry-After` header up to the backoff cap; other
HTTP errors and unusable response bodies raise `ChatError` at once.

`chat(messages)` returns `(text, usage)`; `create(body)` returns the raw response document, for
callers that need more (native `tool_calls`, several choices).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Literal, NamedTuple

import httpx
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)

from qpa.contract import TokenUsage

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
ResponseFormat = Literal["json", "text"] | dict[str, Any] | None


class ChatError(Exception):
    """The endpoint gave no usable answer (after retries where retrying made sense)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class ChatReply(NamedTuple):
    """The assistant's text and the tokens the call cost (unpacks as `text, usage`)."""

    text: str
    usage: TokenUsage


def resolve_api_key(env: str | None = None, file: str | Path | None = None) -> str | None:
    """Read the API key referenced by an environment variable name or a file path (or none)."""
    if env and file:
        raise ValueError("give the API key as an environment variable name or a file, not both")
    if env:
        value = os.environ.get(env)
        if not value:
            raise ValueError(f"environment variable {env!r} (API key) is not set")
        return value.strip()
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read API key file {str(file)!r}: {exc.strerror}") from exc
        if not value:
            raise ValueError(f"API key file {str(file)!r} is empty")
        return value
    return None


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ChatError) and exc.retryable


class _Wait:
    """Exponential backoff with jitter; a server's `Retry-After` (seconds) wins, up to the cap."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum

    def __call__(self, state: RetryCallState) -> float:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        after = getattr(exc, "retry_after", None)
        if isinstance(after, float):
            return min(after, self.maximum)
        backoff = self.initial * 2 ** (state.attempt_number - 1) + random.uniform(0, self.initial)
        return min(backoff, self.maximum)


class _RetryableStatus(ChatError):
    def __init__(self, message: str, status: int, retry_after: float | None) -> None:
        super().__init__(message, status=status, retryable=True)
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


class ChatClient:
    """Chat completions against one model of one OpenAI-compatible endpoint.

    `base_url` includes the API version path, as OpenAI clients expect:
    `http://vllm:8000/v1`, `http://model.ns.svc/openai/v1` (KServe).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        api_key_file: str | Path | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_attempts: int = 4,
        backoff_initial: float = 0.5,
        backoff_max: float = 8.0,
        headers: dict[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_attempts = max_attempts
        self._wait = _Wait(backoff_initial, backoff_max)
        key = resolve_api_key(api_key_env, api_key_file)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if key:
            all_headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=all_headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            transport=transport,
        )

    def __repr__(self) -> str:  # never shows the key
        return f"ChatClient(base_url={self.base_url!r}, model={self.model!r})"

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ calls
    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        temperature: float = 0.0,
        response_format: ResponseFormat = "json",
        max_tokens: int | None = None,
        seed: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> ChatReply:
        """One completion; `response_format="json"` asks for a JSON object (`json_object` mode)."""
        body: dict[str, Any] = {"messages": messages, "temperature": temperature}
        if response_format == "json":
            body["response_format"] = {"type": "json_object"}
        elif isinstance(response_format, dict):
            body["response_format"] = response_format
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if seed is not None:
            body["seed"] = seed
        body.update(extra or {})
        document = self.create(body)
        return ChatReply(message_text(document), usage_of(document))

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /chat/completions with retries; the response document (`model` defaults in)."""
        payload = {"model": self.model, **body}
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.max_attempts),
                wait=self._wait,
                retry=retry_if_exception(_retryable),
                reraise=False,
            ):
                with attempt:
                    return self._post("/chat/completions", payload)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            status = getattr(last, "status", None)
            raise ChatError(
                f"no answer after {self.max_attempts} attempts: {_describe(last)}", status=status
            ) from last
        raise AssertionError("unreachable")  # pragma: no cover

    def models(self) -> list[str]:
        """Model ids the endpoint serves (GET /models): a cheap readiness probe (no retries)."""
        try:
            response = self._http.get("/models")
        except httpx.HTTPError as exc:
            raise ChatError(f"GET /models failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ChatError(
                f"GET /models: HTTP {response.status_code}", status=response.status_code
            )
        try:
            return [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ChatError(f"GET /models: unexpected body: {_excerpt(response.text)}") from exc

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(path, json=payload)
        except httpx.TransportError as exc:  # connect/read errors, timeouts: worth another try
            raise ChatError(f"{type(exc).__name__}: {exc}", retryable=True) from exc
        except httpx.HTTPError as exc:
            raise ChatError(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if status in RETRY_STATUSES:
            raise _RetryableStatus(
                f"HTTP {status}: {_excerpt(response.text)}", status, _retry_after(response)
            )
        if status >= 400:
            raise ChatError(f"HTTP {status}: {_excerpt(response.text)}", status=status)
        try:
            document = response.json()
        except ValueError as exc:
            raise ChatError(
                f"response is not JSON: {_excerpt(response.text)}", status=status
            ) from exc
        if not isinstance(document, dict) or not isinstance(document.get("choices"), list):
            raise ChatError(f"response has no choices: {_excerpt(response.text)}", status=status)
        if not document["choices"]:
            raise ChatError("response has an empty choices list", status=status)
        return document


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    return str(exc) or type(exc).__name__


def message_text(document: dict[str, Any]) -> str:
    """The first choice's message content ('' when it holds only tool calls)."""
    try:
        content = document["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ChatError("response choice has no message") from exc
    if content is None:
        return ""
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def usage_of(document: dict[str, Any]) -> TokenUsage:
    """The response's token counts (zeros when the server reports none)."""
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return TokenUsage()

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and value >= 0 else 0

    return TokenUsage(
        prompt_tokens=count("prompt_tokens"), completion_tokens=count("completion_tokens")
    )
