"""Training data from episodes (packed samples, collation), per-token log-probabilities and
the GRPO loss.

- `build_samples` / `collate`: an episode's turns as training rows (see `Sample`, `Batch`).
- `token_logprobs`: the completion tokens' log-probabilities under the model. Above a budget of
  `rows x C x vocab` logits (`LOGITS_BUDGET`) it never materialises the logits: the model runs
  with `logits_to_keep=1`, its final hidden states are taken from the backbone, and the LM head
  is applied in tiles of at most 4096 tokens x `vocab_chunk` vocabulary entries with an online
  logsumexp (`trl.kernels.ChunkedLogProbFunction`, the kernel TRL's own fused LM head uses; its
  backward recomputes each tile). So a Qwen-sized vocabulary (~151k) on a long packed episode
  costs a tile, not a `[rows, seq, vocab]` fp32 tensor.
- `policy_loss`: GRPO's clipped surrogate, as TRL's `GRPOTrainer._compute_loss` computes it
  (`token_mean` is TRL's `dapo`/`bnpo` normalisation over the step's tokens, `sequence_mean`
  its `grpo` one; tests/unit/train/test_policy_loss_vs_trl.py calls TRL's code on the same
  batch), optionally with TRL's truncated importance sampling for the sampler/trainer mismatch
  (`truncated_importance_weights`).
- `loss_normalizer`: what the step's summed loss is divided by. `dr_grpo` is Dr.GRPO's (Liu et
  al. 2025; TRL's `loss_type="dr_grpo"`, which divides by batch size x `max_completion_length`):
  a constant, the step's episodes x the most completion tokens one episode may sample
  (`max_new_tokens` x `max_turns`), so a token's gradient weight depends neither on its
  sequence's length (`sequence_mean`'s bias towards short successes and long failures) nor on
  how many tokens the step happened to sample (`token_mean`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qpa.train.rl.config import LossSettings
from qpa.train.rl.generation import Turn


@dataclass
class Sample:
    """One training sequence: `input_ids[:prompt_len]` is context; from `prompt_len` on,
    `mask[j]` says whether token `prompt_len + j` was sampled by the policy (1) or is
    environment feedback / template text between two packed turns (0).

    `sampler_logprobs`, when the sampler reported them (vLLM), has one entry per token from
    `prompt_len` on (like `mask`): the log-probability the sampler gave the token it sampled,
    NaN where none is known (feedback tokens, a turn without them). It feeds the truncated
    importance-sampling correction (`truncated_importance_weights`)."""

    input_ids: list[int]
    prompt_len: int
    mask: list[int]
    advantage: float
    episode: int = 0
    sampler_logprobs: list[float] | None = None

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def build_samples(
    turns: Sequence[Turn], advantage: float, *, pack: bool = True, episode: int = 0
) -> list[Sample]:
    """An episode's turns as training sequences (packed where prefixes line up; see module doc).

    A turn that carries `sampler_logprobs` (one per completion token, as a vLLM sampler
    reports them) passes them on to its sample; the other tokens of that sample get NaN.
    """
    samples: list[Sample] = []
    current: Sample | None = None
    for turn in turns:
        if not turn.completion_ids:
            continue
        logprobs = _turn_logprobs(turn)
        if (
            pack
            and current is not None
            and len(turn.prompt_ids) >= len(current.input_ids)
            and turn.prompt_ids[: len(current.input_ids)] == current.input_ids
        ):
            between = turn.prompt_ids[len(current.input_ids) :]
            if logprobs is not None or current.sampler_logprobs is not None:
                known = current.sampler_logprobs or [math.nan] * len(current.mask)
                current.sampler_logprobs = (
                    known
                    + [math.nan] * len(between)
                    + (logprobs or [math.nan] * len(turn.completion_ids))
                )
            current.input_ids += between + turn.completion_ids
            current.mask += [0] * len(between) + [1] * len(turn.completion_ids)
            continue
        current = Sample(
            input_ids=[*turn.prompt_ids, *turn.completion_ids],
            prompt_len=len(turn.prompt_ids),
            mask=[1] * len(turn.completion_ids),
            advantage=advantage,
            episode=episode,
            sampler_logprobs=logprobs,
        )
        samples.append(current)
    return samples


def _turn_logprobs(turn: Turn) -> list[float] | None:
    values = getattr(turn, "sampler_logprobs", None)
    if values is None:
        return None
    if len(values) != len(turn.completion_ids):
        raise ValueError(
            f"turn.sampler_logprobs: {len(values)} values for {len(turn.completion_ids)} "
            "completion tokens (one per sampled token)"
        )
    return [math.nan if v is None else float(v) for v in values]


@dataclass
class Batch:
    """Samples collated for one forward pass: prompts left-padded to `P`, completion regions
    right-padded to `C`, so every row's completion region is columns `P..P+C-1`."""

    input_ids: Any
    attention_mask: Any
    position_ids: Any
    loss_mask: Any
    advantages: Any
    prompt_width: int
    completion_width: int
    sampler_logprobs: Any = None  # [rows, C] (NaN where unknown) when any sample has them


def collate(samples: Sequence[Sample], pad_id: int, device: Any = None) -> Batch:
    import torch

    width_p = max(s.prompt_len for s in samples)
    width_c = max(len(s.input_ids) - s.prompt_len for s in samples)
    rows = len(samples)
    input_ids = torch.full((rows, width_p + width_c), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width_p + width_c), dtype=torch.long)
    mask = torch.zeros((rows, width_c), dtype=torch.float32)
    for row, sample in enumerate(samples):
        p, c = sample.prompt_len, len(sample.input_ids) - sample.prompt_len
        input_ids[row, width_p - p : width_p + c] = torch.tensor(sample.input_ids)
        attention[row, width_p - p : width_p + c] = 1
        mask[row, :c] = torch.tensor(sample.mask, dtype=torch.float32)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    sampler = None
    if any(s.sampler_logprobs is not None for s in samples):
        sampler = torch.full((rows, width_c), math.nan, dtype=torch.float32)
        for row, sample in enumerate(samples):
            if sample.sampler_logprobs is not None:
                if len(sample.sampler_logprobs) != len(sample.mask):
                    raise ValueError(
                        f"sample.sampler_logprobs: {len(sample.sampler_logprobs)} values for "
                        f"{len(sample.mask)} completion-region tokens"
                    )
                values = torch.tensor(sample.sampler_logprobs, dtype=torch.float32)
                sampler[row, : len(sample.mask)] = values
        sampler = sampler.to(device)
    return Batch(
        input_ids.to(device),
        attention.to(device),
        positions.to(device),
        mask.to(device),
        advantages.to(device),
        width_p,
        width_c,
        sampler,
    )


#: Above this many `rows x C x vocab` logits, `token_logprobs` takes the tiled path.
LOGITS_BUDGET = 1 << 24
#: Vocabulary entries per tile of the tiled path (a tile is at most 4096 tokens x this).
VOCAB_CHUNK = 8192


def token_logprobs(
    model: Any,
    batch: Batch,
    temperature: float = 1.0,
    *,
    max_logits: int | None = None,
    vocab_chunk: int | None = None,
) -> Any:
    """Log-probabilities of the completion-region tokens under `model`, shape [rows, C].

    `model` is a causal LM (or a DeepSpeed engine around one). When `rows * C * vocab` exceeds
    `max_logits` (default `LOGITS_BUDGET`), the logits are never materialised (see the module
    doc; tiles of `vocab_chunk`, default `VOCAB_CHUNK`, vocabulary entries); below it, one
    forward returns the `C + 1` last positions' logits, the cheaper path for small batches.
    Both give the same values (to float rounding) and the same gradients.
    """
    import torch

    if batch.prompt_width < 1:
        raise ValueError("batch.prompt_width: 0 (the first completion token needs a context)")
    budget = LOGITS_BUDGET if max_logits is None else max_logits
    module = getattr(model, "module", model)  # a DeepSpeed engine wraps the model
    head = module.get_output_embeddings()
    vocab = int(head.weight.shape[0]) if head is not None else 0
    rows, width_c = batch.input_ids.shape[0], batch.completion_width
    if head is None or rows * width_c * vocab <= budget or not _tileable(module, head):
        output = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=width_c + 1,
            use_cache=False,
        )
        logits = output.logits[:, :-1, :].float()
        if temperature != 1.0:
            logits = logits / temperature
        targets = batch.input_ids[:, batch.prompt_width :]
        picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    chunk = VOCAB_CHUNK if vocab_chunk is None else vocab_chunk
    return _tiled_logprobs(model, module, head, batch, temperature, chunk)


def _tileable(module: Any, head: Any) -> bool:
    """Whether the LM head is a plain projection (no logit scaling the tiles would skip)."""
    config = getattr(module, "config", None)
    text = config.get_text_config() if config is not None else None
    scaled = any(
        getattr(text, name, None) is not None
        for name in ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
    )
    return hasattr(module, "base_model") and isinstance(head, _linear()) and not scaled


def _linear() -> type:
    import torch

    return torch.nn.Linear


def _tiled_logprobs(
    model: Any, module: Any, head: Any, batch: Batch, temperature: float, vocab_chunk: int
) -> Any:
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    captured: dict[str, Any] = {}

    def keep(_module: Any, _inputs: Any, output: Any) -> None:
        captured["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    # The whole model runs (so a ZeRO-3 engine's hooks are armed as for any forward), scoring
    # only its last position; the backbone's final hidden states are taken on the way.
    handle = module.base_model.register_forward_hook(keep)
    try:
        model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=1,
            use_cache=False,
        )
    finally:
        handle.remove()
    width_p, width_c = batch.prompt_width, batch.completion_width
    # Position P - 1 + j predicts token P + j.
    hidden = captured["hidden"][:, width_p - 1 : width_p + width_c - 1, :]
    rows = hidden.shape[0]
    targets = batch.input_ids[:, width_p:].reshape(-1)
    softcap = getattr(module.config.get_text_config(), "final_logit_softcapping", None)
    with maybe_gather_lm_head_ctx(head.weight, head.bias):
        logprobs = ChunkedLogProbFunction.apply(
            hidden.reshape(rows * width_c, -1),
            head.weight,
            head.bias,
            targets,
            temperature,
            vocab_chunk,
            softcap,
            1.0,
            (),
        )[0]
    return logprobs.view(rows, width_c)


def truncated_importance_weights(
    old_logps: Any, sampler_logps: Any, cap: float, mask: Any = None
) -> Any:
    """Truncated importance sampling (TIS) for the sampler/trainer mismatch, per token:
    ``min(exp(old_logp - sampler_logp), cap)``, without gradient.

    `old_logps` are the trainer's log-probabilities of the sampled tokens under the rollout
    policy, `sampler_logps` the sampler's (vLLM's) own for the same tokens. Where the
    sampler's value is unknown (NaN) or `mask` is 0 the weight is exactly 1, as in TRL's
    `vllm_importance_sampling_mode="token_truncate"` (and verl's TIS).
    """
    import torch

    diff = old_logps.detach() - sampler_logps
    if mask is not None:
        diff = diff * mask
    diff = torch.nan_to_num(diff, nan=0.0)
    return torch.clamp(torch.exp(diff), max=cap)


def loss_normalizer(
    settings: LossSettings, *, tokens: int, samples: int, completion_budget: int
) -> float:
    """The divisor of the step's summed surrogate (over all ranks; see the module doc).

    `tokens` / `samples`: the step's trained tokens and training sequences; `completion_budget`:
    the step's episodes x the most completion tokens an episode may sample (`dr_grpo`).
    """
    if settings.loss_type == "token_mean":
        return float(max(1, tokens))
    if settings.loss_type == "sequence_mean":
        return float(max(1, samples))
    if completion_budget < 1:
        raise ValueError(
            f"loss.loss_type dr_grpo: completion_budget must be >= 1, got {completion_budget}"
        )
    return float(completion_budget)


def policy_loss(
    logps: Any,
    old_logps: Any,
    batch: Batch,
    settings: LossSettings,
    *,
    normalizer: float,
    ref_logps: Any = None,
    sampler_logps: Any = None,
) -> tuple[Any, dict[str, float]]:
    """GRPO's clipped surrogate (+ beta * k3 KL) summed over trained tokens / `normalizer`.

    `normalizer` is `loss_normalizer`'s (the step's trained-token count for `token_mean`, its
    sample count for `sequence_mean`, a constant for `dr_grpo`), so micro-batch losses add up to
    the step's loss. With the sampler's
    log-probabilities (`sampler_logps`, else the batch's `sampler_logprobs`) and
    `settings.importance_sampling`, each token's surrogate is weighted by
    `truncated_importance_weights(old_logps, sampler_logps, settings.importance_sampling_cap)`
    (before the KL term is added, as TRL does).
    """
    import torch

    mask = batch.loss_mask
    advantages = batch.advantages.unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    if sampler_logps is None:
        sampler_logps = batch.sampler_logprobs
    weights = None
    if sampler_logps is not None and settings.importance_sampling:
        weights = truncated_importance_weights(
            old_logps, sampler_logps, settings.importance_sampling_cap, mask
        )
        per_token = per_token * weights
    kl = None
    if ref_logps is not None and settings.beta > 0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1.0
        # DeepSeek-V3.2's unbiased reverse-KL gradient (TRL's `use_bias_correction_kl`).
        per_token = per_token + settings.beta * (kl * ratio if settings.kl_ratio_correction else kl)
    if settings.loss_type in ("token_mean", "dr_grpo"):
        loss = (per_token * mask).sum() / normalizer
    else:
        lengths = mask.sum(1).clamp(min=1.0)
        loss = ((per_token * mask).sum(1) / lengths).sum() / normalizer
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1.0)
        is_clipped = ((ratio < 1.0 - settings.clip_low) & (advantages < 0)) | (
            (ratio > 1.0 + settings.clip_high) & (advantages > 0)
        )
        stats = {
            "clip_fraction": float((is_clipped.float() * mask).sum() / tokens),
            "kl": float((kl * mask).sum() / tokens) if kl is not None else 0.0,
            "tokens": float(mask.sum()),
        }
        if weights is not None:
            stats["is_weight"] = float((weights * mask).sum() / tokens)
            stats["is_truncated"] = float(
                ((weights >= settings.importance_sampling_cap).float() * mask).sum() / tokens
            )
    return loss, stats
