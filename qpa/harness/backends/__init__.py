"""Planner model backends behind one interface: messages + tools -> text, tool calls, usage.

- `openai`: any OpenAI-compatible endpoint (vLLM, KServe), native or text-protocol tools;
- `local`: an in-process transformers causal LM from a local checkpoint (torch imported lazily).

Turning a `Completion` into an `Action` is `qpa.harness.parsing.parse_completion`'s job.
"""

from __future__ import annotations

from typing import Any

from qpa.harness.backends.base import (
    BackendError,
    BackendRejected,
    BackendUnavailable,
    ChatMessage,
    Completion,
    ModelBackend,
    RawToolCall,
    to_text_protocol,
)
from qpa.harness.backends.local import LocalBackend
from qpa.harness.backends.openai import OpenAIBackend

BACKENDS: dict[str, type[Any]] = {"openai": OpenAIBackend, "local": LocalBackend}


def make_backend(kind: str, **options: Any) -> ModelBackend:
    """A backend by kind (`openai` or `local`) with its constructor options."""
    try:
        factory = BACKENDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown backend {kind!r}; choose from {', '.join(sorted(BACKENDS))}"
        ) from None
    backend: ModelBackend = factory(**options)
    return backend


__all__ = [
    "BACKENDS",
    "BackendError",
    "BackendRejected",
    "BackendUnavailable",
    "ChatMessage",
    "Completion",
    "LocalBackend",
    "ModelBackend",
    "OpenAIBackend",
    "RawToolCall",
    "make_backend",
    "to_text_protocol",
]
