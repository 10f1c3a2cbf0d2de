"""Training data from episodes (packed samples, collation) and the GRPO loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qpa.train.rl.config import LossSettings
from qpa.train.rl.generation import Turn


@dataclass
class Sample:
    """One training sequence: `input_ids[:prompt_len]` is context; from `prompt_len` on,
    `mask[j]` says whether token `prompt_len + j` was sampled by the policy (1) or is
    environment feedback / template text between two packed turns (0)."""

    input_ids: list[int]
    prompt_len: int
    mask: list[int]
    advantage: float
    episode: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def build_samples(
    turns: Sequence[Turn], advantage: float, *, pack: bool = True, episode: int = 0
) -> list[Sample]:
    """An episode's turns as training sequences (packed where prefixes line up; see module doc)."""
    samples: list[Sample] = []
    current: Sample | None = None
    for turn in turns:
        if not turn.completion_ids:
            continue
        if (
            pack
            and current is not None
            and len(turn.prompt_ids) >= len(current.input_ids)
            and turn.prompt_ids[: len(current.input_ids)] == current.input_ids
        ):
            between = turn.prompt_ids[len(current.input_ids) :]
            current.input_ids += between + turn.completion_ids
            current.mask += [0] * len(between) + [1] * len(turn.completion_ids)
            continue
        current = Sample(
            input_ids=[*turn.prompt_ids, *turn.completion_ids],
            prompt_len=len(turn.prompt_ids),
            mask=[1] * len(turn.completion_ids),
            advantage=advantage,
            episode=episode,
        )
        samples.append(current)
    return samples


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
    return Batch(
        input_ids.to(device),
        attention.to(device),
        positions.to(device),
        mask.to(device),
        advantages.to(device),
        width_p,
        width_c,
    )


def token_logprobs(model: Any, batch: Batch, temperature: float = 1.0) -> Any:
    """Log-probabilities of the completion-region tokens under `model`, shape [rows, C]."""
    import torch

    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.completion_width + 1,
        use_cache=False,
    )
    logits = output.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, batch.prompt_width :]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def policy_loss(
    logps: Any,
    old_logps: Any,
    batch: Batch,
    settings: LossSettings,
    *,
    normalizer: float,
    ref_logps: Any = None,
) -> tuple[Any, dict[str, float]]:
    """GRPO's clipped surrogate (+ beta * k3 KL) summed over trained tokens / `normalizer`.

    `normalizer` is the step's trained-token count (`token_mean`) or sample count
    (`sequence_mean`), so micro-batch losses add up to the step's loss.
    """
    import torch

    mask = batch.loss_mask
    advantages = batch.advantages.unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    kl = None
    if ref_logps is not None and settings.beta > 0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + settings.beta * kl
    if settings.loss_type == "token_mean":
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
    return loss, stats
