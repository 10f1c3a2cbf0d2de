"""Rollouts: turns, episodes and batched generation by the policy in training."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from qpa.contract import ToolSpec, Trajectory
from qpa.harness.backends.base import BackendUnavailable, ChatMessage, Completion
from qpa.harness.backends.local import LocalBackend
from qpa.harness.parsing import STOP_STRINGS
from qpa.harness.runner import EpisodeAborted
from qpa.train.rl.config import GenerationSettings


@dataclass
class Turn:
    """One model call: the prompt as tokenized for generation, the sampled tokens and, when the
    sampler reported them (a rollout server), its log-probability of each sampled token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float] | None = None


@dataclass(frozen=True)
class Sampled:
    """One completion from a sampler: token ids and (when known) each one's log-probability."""

    ids: list[int]
    logprobs: list[float] | None = None


@dataclass
class Episode:
    """One rollout: which task (index in the step's batch), which sample, what happened."""

    group: int
    sample: int
    trajectory: Trajectory
    turns: list[Turn] = field(default_factory=list)


class GenerationFailed(RuntimeError):
    """The policy could not generate (the batch failed); ends the episodes that asked."""


@dataclass
class _Request:
    prompt_ids: list[int]
    order: tuple[int, int]
    result: Sampled | None = None
    error: BaseException | None = None


class TokenBatcher:
    """Collects the model calls of concurrent episodes; the main thread answers them in batches.

    Worker threads call `submit(prompt_ids)` (or `submit_sampled`, which keeps the sampler's
    log-probs) and block. `serve()` runs in the thread that owns the model: it waits until every
    live worker is blocked on the model (or `max_batch` requests are pending), runs `generate` on
    all of them at once (ordered by episode, so a batch's content does not depend on thread
    timing), hands the results back, and returns when every worker has left. `generate` returns
    one token-id list or one `Sampled` per prompt.
    """

    def __init__(
        self,
        generate: Callable[[list[list[int]]], Sequence[list[int] | Sampled]],
        max_batch: int,
    ) -> None:
        self._generate = generate
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._live = 0
        self.calls = 0
        self.sequences = 0
        self.failure: BaseException | None = None

    def enter(self, count: int = 1) -> None:
        with self._cond:
            self._live += count

    def leave(self) -> None:
        with self._cond:
            self._live -= 1
            self._cond.notify_all()

    def submit(self, prompt_ids: list[int], order: tuple[int, int] = (0, 0)) -> list[int]:
        return self.submit_sampled(prompt_ids, order).ids

    def submit_sampled(self, prompt_ids: list[int], order: tuple[int, int] = (0, 0)) -> Sampled:
        request = _Request(list(prompt_ids), order)
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
            while request.result is None and request.error is None:
                self._cond.wait()
        if request.error is not None:
            raise GenerationFailed(str(request.error)) from request.error
        assert request.result is not None
        return request.result

    def serve(self) -> None:
        while True:
            with self._cond:
                while not (
                    self._live == 0
                    or (self._pending and len(self._pending) >= min(self._live, self.max_batch))
                ):
                    self._cond.wait()
                if self._live == 0 and not self._pending:
                    return
                self._pending.sort(key=lambda r: r.order)
                batch, self._pending = (
                    self._pending[: self.max_batch],
                    self._pending[self.max_batch :],
                )
            try:
                results = self._generate([r.prompt_ids for r in batch])
                if len(results) != len(batch):
                    raise GenerationFailed(f"{len(results)} completions for {len(batch)} prompts")
            except Exception as exc:
                with self._cond:
                    self.failure = self.failure or exc
                    for request in batch:
                        request.error = exc
                    self._cond.notify_all()
                continue
            with self._cond:
                self.calls += 1
                self.sequences += len(batch)
                for request, out in zip(batch, results, strict=True):
                    request.result = (
                        Sampled(list(out.ids), out.logprobs)
                        if isinstance(out, Sampled)
                        else Sampled(list(out))
                    )
                self._cond.notify_all()


class PromptTooLong(ValueError):
    """The next prompt exceeds `generation.max_prompt_tokens`."""


class PolicyBackend(LocalBackend):
    """`LocalBackend` over the policy being trained: generation goes through a `TokenBatcher`,
    and every call's prompt and sampled token ids are recorded in `turns`.

    Build it with `PolicyBackend.from_loaded(model, tokenizer, ...)` and then `bind(...)`.
    """

    turns: list[Turn]
    _batcher: TokenBatcher
    _order: tuple[int, int]
    _max_prompt: int | None
    _token_lock: threading.Lock

    def bind(
        self,
        batcher: TokenBatcher,
        *,
        order: tuple[int, int],
        max_prompt_tokens: int | None,
        token_lock: threading.Lock,
    ) -> PolicyBackend:
        self.turns = []
        self._batcher = batcher
        self._order = order
        self._max_prompt = max_prompt_tokens
        self._token_lock = token_lock
        return self

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        try:
            return super().complete(messages, tools)
        except BackendUnavailable as exc:
            if isinstance(exc.cause, PromptTooLong):  # the policy's own verbosity: a budget stop
                raise EpisodeAborted(str(exc.cause), side="harness") from exc
            raise

    def _generate(self, prompt: str) -> tuple[str, int, int, bool]:
        tokenizer = self._tokenizer
        with self._token_lock:  # fast tokenizers are not safe to share across threads
            prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if self._max_prompt is not None and len(prompt_ids) > self._max_prompt:
            raise PromptTooLong(
                f"prompt of {len(prompt_ids)} tokens exceeds max_prompt_tokens={self._max_prompt}"
            )
        sampled = self._batcher.submit_sampled(prompt_ids, self._order)
        completion = sampled.ids
        self.turns.append(Turn(prompt_ids, completion, sampled.logprobs))
        eos = tokenizer.eos_token_id
        hit_eos = bool(completion) and eos is not None and completion[-1] == eos
        with self._token_lock:
            text = tokenizer.decode(
                completion[:-1] if hit_eos else completion, skip_special_tokens=True
            )
        return str(text), len(prompt_ids), len(completion), hit_eos


def trim_completion(
    ids: Sequence[int], stop: int | Sequence[int] | None, pad: int | None
) -> list[int]:
    """The sampled tokens of one generated row: up to and including the first stop token (eos,
    or a stop string that is one token), without the padding `generate` appends once a row has
    stopped."""
    out = list(ids)
    stops = {stop} if isinstance(stop, int) else set(stop or ())
    for index, token in enumerate(out):
        if token in stops:
            return out[: index + 1]
    if pad is not None:
        while out and out[-1] == pad:
            out.pop()
    return out


def stop_token_ids(tokenizer: Any) -> list[int] | None:
    """The ids of the protocol's stop strings when each is a single token (as in the tiny and
    Qwen tokenizers): generation then stops on them like on eos, with no string matching."""
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in STOP_STRINGS]
    return [i[0] for i in ids] if all(len(i) == 1 for i in ids) else None


def hf_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], settings: GenerationSettings
) -> list[list[int]]:
    """Sample one completion per prompt with `model.generate` (left-padded batch)."""
    import torch
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    stops = [eos] if eos is not None else []
    stop_strings = None
    if settings.stop_at_action:
        single = stop_token_ids(tokenizer)
        if single is None:
            stop_strings = list(STOP_STRINGS)
        else:
            stops += single
    device = next(iter(model.parameters())).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids) :] = 1
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=True,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        repetition_penalty=1.0,
        use_cache=True,
        pad_token_id=pad,
        eos_token_id=stops or None,
        stop_strings=stop_strings,
    )
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            tokenizer=tokenizer if stop_strings else None,
        )
    new = output[:, width:].tolist()
    return [trim_completion(row, stops, pad) for row in new]
