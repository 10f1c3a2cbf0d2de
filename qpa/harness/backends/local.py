"""`LocalBackend`: an in-process transformers causal LM loaded from a local checkpoint folder.

Used by local runs, tests and training-time evaluation: the same checkpoint a `TrainingRun`
writes, read with `local_files_only=True` (never the hub), on CPU or GPU. Decoding is greedy and
stops after the first complete `<tool_call>` or `<finish>` block; the model speaks the text
protocol of `qpa.harness.parsing` (tools described in the system prompt), so its output is
parsed exactly like a non-native OpenAI endpoint's. Token usage comes from the tokenizer.

torch and transformers are imported lazily, inside the class: importing `qpa.harness` never
requires them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from qpa.contract import TokenUsage, ToolSpec
from qpa.harness.backends.base import (
    BackendUnavailable,
    ChatMessage,
    Completion,
    to_text_protocol,
)
from qpa.harness.parsing import STOP_STRINGS

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The chat template used when a checkpoint's tokenizer has none (ChatML, as Qwen uses)."""


class LocalBackend:
    """A causal LM from a local folder (`save_pretrained` layout), greedy, text protocol."""

    name = "local"

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        max_new_tokens: int = 512,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        stop_at_action: bool = True,
    ) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_dir():
            raise FileNotFoundError(f"no model checkpoint folder at {self.model_path}")
        self.model = str(self.model_path)
        self.device_name = device
        self.dtype_name = dtype
        self.max_new_tokens = max_new_tokens
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.stop_at_action = stop_at_action
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: Any = None

    @classmethod
    def from_loaded(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "in-memory",
        max_new_tokens: int = 512,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        stop_at_action: bool = True,
    ) -> Self:
        """Wrap a model and tokenizer that are already loaded (e.g. the policy being trained).

        Nothing is read from disk: the backend renders prompts and decodes exactly as one loaded
        from a folder, on the device the model's weights are on, and never moves or copies
        them. The caller keeps ownership (`close()` only drops the references). `name` is what
        completions report as their model.
        """
        backend = cls.__new__(cls)
        backend.model_path = Path(name)
        backend.model = name
        parameter = next(iter(model.parameters()), None)
        device = parameter.device if parameter is not None else "cpu"
        backend.device_name = str(device)
        backend.dtype_name = (
            str(parameter.dtype).removeprefix("torch.") if parameter is not None else "auto"
        )
        backend.max_new_tokens = max_new_tokens
        backend.chat_template = chat_template
        backend.template_kwargs = dict(template_kwargs or {})
        backend.stop_at_action = stop_at_action
        backend._lock = threading.Lock()
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        backend._model, backend._tokenizer = model, tokenizer
        import torch

        backend._device = torch.device(device)
        return backend

    def __repr__(self) -> str:
        return f"LocalBackend(model_path={self.model!r}, device={self.device_name!r})"

    # ------------------------------------------------------------------ loading
    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        """Load tokenizer and weights (done on first use; call early to pay the cost up front)."""
        with self._lock:
            if self._model is None:
                self._load()

    def _load(self) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise BackendUnavailable(
                "LocalBackend needs torch and transformers (pip install 'qpa[train]')",
                cause=exc,
                attempts=1,
                endpoint=self.model,
            ) from exc
        device = self.device_name
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype: Any = torch.float32
        if self.dtype_name == "auto":
            if device.startswith("cuda") and torch.cuda.is_bf16_supported():
                dtype = torch.bfloat16
        else:
            dtype = getattr(torch, self.dtype_name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            model: Any = AutoModelForCausalLM.from_pretrained(
                self.model_path, local_files_only=True, dtype=dtype
            )
            model = model.to(device)
            model.eval()
        except Exception as exc:
            raise BackendUnavailable(
                f"cannot load the model at {self.model_path}: {type(exc).__name__}: {exc}",
                cause=exc,
                attempts=1,
                endpoint=self.model,
            ) from exc
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        self._tokenizer, self._model, self._device = tokenizer, model, torch.device(device)

    # ------------------------------------------------------------------ the call
    def render_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        """The exact prompt text the model sees (text protocol, chat template applied)."""
        self.load()
        conversation = [
            {"role": m.role, "content": m.content or ""} for m in to_text_protocol(messages, tools)
        ]
        template = None
        if not getattr(self._tokenizer, "chat_template", None):
            template = self.chat_template or CHATML_TEMPLATE
        prompt = self._tokenizer.apply_chat_template(
            conversation,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
            **self.template_kwargs,
        )
        return str(prompt)

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        """Greedy-decode the model's next turn; raises `BackendUnavailable` if it cannot run."""
        started = time.perf_counter()
        prompt = self.render_prompt(messages, tools)
        with self._lock:
            try:
                text, prompt_tokens, new_tokens, hit_eos = self._generate(prompt)
            except Exception as exc:  # out of memory, a broken checkpoint: not the model's words
                raise BackendUnavailable(
                    f"local model {self.model} failed to generate: {type(exc).__name__}: {exc}",
                    cause=exc,
                    attempts=1,
                    endpoint=self.model,
                ) from exc
        if hit_eos or any(stop in text for stop in STOP_STRINGS):
            finish_reason = "stop"
        elif new_tokens >= self.max_new_tokens:
            finish_reason = "length"
        else:
            finish_reason = "stop"
        return Completion(
            text=text,
            usage=TokenUsage(prompt_tokens=prompt_tokens, completion_tokens=new_tokens),
            finish_reason=finish_reason,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            model=self.model,
            protocol="text",
        )

    def _generate(self, prompt: str) -> tuple[str, int, int, bool]:
        import torch

        tokenizer, model = self._tokenizer, self._model
        encoded = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        input_ids = encoded["input_ids"].to(self._device)
        attention_mask = encoded["attention_mask"].to(self._device)
        options: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": False,
            "pad_token_id": tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else (tokenizer.eos_token_id or 0),
        }
        if tokenizer.eos_token_id is not None:
            options["eos_token_id"] = tokenizer.eos_token_id
        if self.stop_at_action:
            options["stop_strings"] = list(STOP_STRINGS)
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=_greedy_config(model, options),
                tokenizer=tokenizer if self.stop_at_action else None,
            )
        new = output[0, input_ids.shape[1] :]
        eos = tokenizer.eos_token_id
        hit_eos = eos is not None and len(new) > 0 and int(new[-1]) == eos
        if hit_eos:
            new = new[:-1]
        text = tokenizer.decode(new, skip_special_tokens=True)
        return text, int(input_ids.shape[1]), len(new) + int(hit_eos), hit_eos

    def close(self) -> None:
        """Drop the weights (and the GPU memory they hold)."""
        with self._lock:
            self._model = None
            self._tokenizer = None


def _greedy_config(model: Any, options: dict[str, Any]) -> Any:
    """The checkpoint's generation config made greedy (its sampling settings removed)."""
    import copy

    from transformers import GenerationConfig

    base = getattr(model, "generation_config", None)
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
    config.temperature = None
    config.top_p = None
    config.top_k = None
    for key, value in options.items():
        setattr(config, key, value)
    return config
