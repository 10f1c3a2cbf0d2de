"""qpa's GRPO loss (`qpa.train.rl.loss.policy_loss`) against TRL 1.16's own code.

TRL is called, never re-typed: the loss side is `GRPOTrainer._compute_loss` run on a minimal
object carrying exactly the attributes it reads (its per-token log-probabilities are the same
leaf tensor qpa's loss gets, so the gradients compared are d loss / d logp per token, which
the chain rule carries unchanged into the weights). The truncated importance-sampling ratio is
TRL's own block of `_generate_and_score_completions`, taken from its source by `inspect` and
run on our tensors (the method itself needs a generation backend). The tolerance is 1e-6
(absolute and relative, float32): both sides do the same float operations in a possibly
different order.

Then, on the tiny Qwen3 of `qpa.train.tiny`, a real optimizer step moves a positive-advantage
completion's log-probability up and a negative one's down, and with `ppo_epochs > 1` the clip
acts exactly where the ratio leaves [1 - eps_low, 1 + eps_high] (zero gradient there).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import textwrap
import types
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from qpa.train.rl.config import LossSettings
from qpa.train.rl.generation import Turn
from qpa.train.rl.loss import (
    Batch,
    Sample,
    build_samples,
    collate,
    policy_loss,
    token_logprobs,
    truncated_importance_weights,
)
from qpa.train.tiny import TinyConfig, build_model

TOL = 1e-6
ROWS, PROMPT, COMPLETION = 4, 3, 7


class _Accelerator:
    """The two collectives `_compute_loss` calls, for one process."""

    num_processes = 1
    is_main_process = True

    @staticmethod
    def gather(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def reduce(tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor


def _trl(
    settings: LossSettings,
    loss_type: str,
    *,
    accumulation: int = 1,
    use_vllm: bool = False,
) -> SimpleNamespace:
    """A stand-in `self` for `GRPOTrainer._compute_loss` with qpa's loss settings."""
    return SimpleNamespace(
        loss_type=loss_type,
        epsilon_low=settings.clip_low,
        epsilon_high=settings.clip_high,
        beta=settings.beta,
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=use_vllm,
        vllm_importance_sampling_correction=use_vllm,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_min=None,
        vllm_importance_sampling_clip_max=settings.importance_sampling_cap,
        current_gradient_accumulation_steps=accumulation,
        accelerator=_Accelerator(),
        model=SimpleNamespace(training=True),
        args=SimpleNamespace(
            delta=None,
            use_bias_correction_kl=settings.kl_ratio_correction,
            steps_per_generation=accumulation,
        ),
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def _trl_loss(
    fake: SimpleNamespace,
    logps: torch.Tensor,
    old: torch.Tensor,
    batch: Batch,
    *,
    ref: torch.Tensor | None = None,
    is_ratio: torch.Tensor | None = None,
    num_items: float | None = None,
) -> torch.Tensor:
    """TRL's loss of one micro-batch whose per-token log-probabilities are `logps`."""
    rows = logps.shape[0]
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (
        logps,
        torch.zeros_like(logps),
        None,
    )
    completion = batch.input_ids[:, batch.prompt_width :]
    inputs: dict[str, Any] = {
        "prompt_ids": batch.input_ids[:, : batch.prompt_width],
        "prompt_mask": batch.attention_mask[:, : batch.prompt_width],
        "completion_ids": completion,
        "completion_mask": batch.attention_mask[:, batch.prompt_width :],
        # Environment feedback inside a packed episode is TRL's tool_mask == 0.
        "tool_mask": batch.loss_mask,
        "advantages": batch.advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": torch.tensor(
            float(batch.loss_mask.sum()) if num_items is None else num_items
        ),
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    assert completion.shape[0] == rows
    return GRPOTrainer._compute_loss(fake, None, inputs)


def _trl_is_ratio(
    old: torch.Tensor, sampler: torch.Tensor, batch: Batch, cap: float
) -> torch.Tensor:
    """TRL's importance-sampling block of `_generate_and_score_completions`, run as written."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    begin = source.index("if self.use_vllm and self.vllm_importance_sampling_correction:\n")
    end = source.index("# Compute the per-token log probabilities for the reference model", begin)
    block = textwrap.dedent(source[begin:end])
    namespace: dict[str, Any] = {
        "self": _trl(LossSettings(importance_sampling_cap=cap), "dapo", use_vllm=True),
        "torch": torch,
        "math": math,
        "completion_mask": batch.attention_mask[:, batch.prompt_width :].float(),
        "tool_mask": batch.loss_mask,
        "old_per_token_logps": old,
        "sampling_per_token_logps": sampler,
    }
    exec(compile(block, "trl-is-block", "exec"), namespace)
    return namespace["vllm_importance_sampling_ratio"]


def _batch(seed: int, rows: int = ROWS) -> Batch:
    """Rows of unequal length, each with a feedback gap (mask 0) inside the completion."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for row in range(rows):
        length = COMPLETION - row % 3
        mask = [1] * length
        mask[length // 2] = 0
        samples.append(
            Sample(
                input_ids=torch.randint(3, 50, (PROMPT + length,), generator=g).tolist(),
                prompt_len=PROMPT,
                mask=mask,
                advantage=float(torch.randn((), generator=g)),
            )
        )
    return collate(samples, pad_id=0)


def _logps(batch: Batch, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logps leaf, old logps with ratios well inside and outside the clip range, ref logps)."""
    g = torch.Generator().manual_seed(seed)
    shape = batch.loss_mask.shape
    logps = (-torch.rand(shape, generator=g) * 3).requires_grad_(True)
    old = logps.detach() + torch.randn(shape, generator=g) * 0.4
    ref = logps.detach() + torch.randn(shape, generator=g) * 0.3
    return logps, old, ref


def _check(qpa_loss: torch.Tensor, trl_loss: torch.Tensor, leaves: list[torch.Tensor]) -> None:
    torch.testing.assert_close(qpa_loss, trl_loss, rtol=TOL, atol=TOL)
    for leaf in leaves:
        (g_qpa,) = torch.autograd.grad(qpa_loss, leaf, retain_graph=True)
        (g_trl,) = torch.autograd.grad(trl_loss, leaf, retain_graph=True)
        torch.testing.assert_close(g_qpa, g_trl, rtol=TOL, atol=TOL)
        assert g_qpa.abs().sum() > 0


# qpa's normalisations and the TRL loss types that compute the same thing on one micro-batch.
PAIRS = [("token_mean", "dapo"), ("token_mean", "bnpo"), ("sequence_mean", "grpo")]


# (beta, kl_ratio_correction): no KL, k3 KL, k3 KL times the ratio (TRL's default).
KL_CASES = [(0.0, False), (0.04, False), (0.04, True)]


@pytest.mark.parametrize(("qpa_type", "trl_type"), PAIRS)
@pytest.mark.parametrize(("beta", "kl_ratio_correction"), KL_CASES)
def test_loss_and_gradients_equal_trl(
    qpa_type: str, trl_type: str, beta: float, kl_ratio_correction: bool
) -> None:
    settings = LossSettings(
        loss_type=qpa_type,  # type: ignore[arg-type]
        clip_low=0.2,
        clip_high=0.28,
        beta=beta,
        kl_ratio_correction=kl_ratio_correction,
    )
    batch = _batch(0)
    logps, old, ref = _logps(batch, 1)
    ratio = torch.exp(logps.detach() - old)
    trained = batch.loss_mask.bool()
    assert (ratio[trained] > 1.28).any() and (ratio[trained] < 0.8).any()  # the clip acts
    normalizer = float(batch.loss_mask.sum()) if qpa_type == "token_mean" else float(ROWS)
    ours, _ = policy_loss(
        logps, old, batch, settings, normalizer=normalizer, ref_logps=ref if beta else None
    )
    theirs = _trl_loss(_trl(settings, trl_type), logps, old, batch, ref=ref if beta else None)
    _check(ours, theirs, [logps])


def test_on_policy_ratio_one_equals_trl() -> None:
    """One PPO epoch: old = logps.detach() on both sides (TRL's default path)."""
    settings = LossSettings()
    batch = _batch(2)
    logps, _, _ = _logps(batch, 3)
    ours, stats = policy_loss(
        logps, logps.detach(), batch, settings, normalizer=float(batch.loss_mask.sum())
    )
    theirs = _trl_loss(_trl(settings, "dapo"), logps, logps.detach(), batch)
    _check(ours, theirs, [logps])
    assert stats["clip_fraction"] == 0.0


@pytest.mark.parametrize(
    ("qpa_type", "trl_type"), [("token_mean", "dapo"), ("sequence_mean", "grpo")]
)
def test_micro_batches_add_up_to_trl_accumulation(qpa_type: str, trl_type: str) -> None:
    """Two micro-batches of one step: qpa's global normaliser equals TRL's with gradient
    accumulation (dapo: `num_items_in_batch` over the generation batch; grpo: mean / steps)."""
    settings = LossSettings(loss_type=qpa_type, clip_high=0.28)  # type: ignore[arg-type]
    batches = [_batch(4), _batch(5)]
    tokens = float(sum(b.loss_mask.sum() for b in batches))
    normalizer = tokens if qpa_type == "token_mean" else float(2 * ROWS)
    fake = _trl(settings, trl_type, accumulation=2)
    ours = theirs = torch.zeros(())
    leaves = []
    for seed, batch in enumerate(batches):
        logps, old, _ = _logps(batch, 10 + seed)
        leaves.append(logps)
        ours = ours + policy_loss(logps, old, batch, settings, normalizer=normalizer)[0]
        theirs = theirs + _trl_loss(fake, logps, old, batch, num_items=tokens)
    _check(ours, theirs, leaves)


def test_truncated_importance_sampling_hand_checked() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5 - math.log(5.0), math.nan]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    weights = truncated_importance_weights(old, sampler, cap=2.0, mask=mask)
    # exp(0.5), exp(-1), exp(log 5) = 5 -> capped at 2, unknown sampler value -> 1.
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 2.0, 1.0]])
    torch.testing.assert_close(weights, expected, rtol=TOL, atol=TOL)
    masked = truncated_importance_weights(old, sampler, cap=2.0, mask=torch.zeros_like(mask))
    assert torch.equal(masked, torch.ones_like(masked))


def test_truncated_importance_sampling_equals_trl() -> None:
    """TRL's token_truncate ratio on the same tensors, and the loss TRL weights with it."""
    settings = LossSettings(importance_sampling_cap=2.0, clip_high=0.28, beta=0.04)
    batch = _batch(6)
    logps, old, ref = _logps(batch, 7)
    g = torch.Generator().manual_seed(8)
    sampler = old + torch.randn(old.shape, generator=g) * 0.8
    sampler[0, 1] = math.nan  # a token vLLM could not score
    ours_w = truncated_importance_weights(
        old, sampler, settings.importance_sampling_cap, batch.loss_mask
    )
    trl_w = _trl_is_ratio(old, sampler, batch, settings.importance_sampling_cap)
    torch.testing.assert_close(ours_w, trl_w, rtol=TOL, atol=TOL)
    assert (ours_w == 2.0).any() and (ours_w < 1.0).any()

    batch.sampler_logprobs = sampler  # as collate sets it from Sample.sampler_logprobs
    normalizer = float(batch.loss_mask.sum())
    ours, stats = policy_loss(logps, old, batch, settings, normalizer=normalizer, ref_logps=ref)
    fake = _trl(settings, "dapo", use_vllm=True)
    theirs = _trl_loss(fake, logps, old, batch, ref=ref, is_ratio=trl_w)
    _check(ours, theirs, [logps])
    assert 0 < stats["is_truncated"] < 1
    # Off: the sampler's values are ignored and the loss is the uncorrected one.
    off = settings.model_copy(update={"importance_sampling": False})
    plain, _ = policy_loss(logps, old, batch, off, normalizer=normalizer, ref_logps=ref)
    uncorrected = _trl_loss(_trl(settings, "dapo"), logps, old, batch, ref=ref)
    _check(plain, uncorrected, [logps])


def test_sampler_logprobs_travel_from_sample_to_batch() -> None:
    samples = [
        Sample([1, 2, 3, 4, 5], 2, [1, 0, 1], 1.0, sampler_logprobs=[-0.1, math.nan, -0.3]),
        Sample([1, 2, 6, 7], 2, [1, 1], -1.0),
    ]
    batch = collate(samples, pad_id=0)
    values = batch.sampler_logprobs
    assert values.shape == (2, 3)
    assert values[0, 0].item() == pytest.approx(-0.1) and values[0, 2].item() == pytest.approx(-0.3)
    assert torch.isnan(values[0, 1]) and torch.isnan(values[1]).all()
    assert collate(samples[1:], pad_id=0).sampler_logprobs is None
    with pytest.raises(ValueError, match="sampler_logprobs"):
        collate([Sample([1, 2, 3], 1, [1, 1], 1.0, sampler_logprobs=[-0.1])], pad_id=0)


def test_packed_turns_carry_their_sampler_logprobs() -> None:
    prompt, first, feedback, second = [5, 6], [20, 21], [30, 31, 32], [40]
    one, two = Turn(prompt, first), Turn([*prompt, *first, *feedback], second)
    one.sampler_logprobs = [-0.5, -1.5]  # as a rollout server reports them
    (sample,) = build_samples([one, two], advantage=1.0)
    assert sample.mask == [1, 1, 0, 0, 0, 1]
    values = sample.sampler_logprobs
    assert values is not None and values[:2] == [-0.5, -1.5]
    assert all(math.isnan(v) for v in values[2:])  # feedback, and a turn that had none
    assert build_samples([Turn(prompt, first)], advantage=1.0)[0].sampler_logprobs is None
    bad = Turn(prompt, first)
    bad.sampler_logprobs = [-0.5]
    with pytest.raises(ValueError, match=r"turn\.sampler_logprobs: 1 values for 2"):
        build_samples([bad], advantage=1.0)


# ------------------------------------------------------------------ on the tiny model
def _tiny() -> Any:
    config = TinyConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return build_model(config, vocab_size=128)


def _two_completions() -> Batch:
    """One prompt, two different completions: advantage +1 and -1."""
    prompt = [5, 9, 17, 33]
    return collate(
        [
            Sample([*prompt, 40, 41, 42, 43], len(prompt), [1, 1, 1, 1], 1.0),
            Sample([*prompt, 60, 61, 62, 63], len(prompt), [1, 1, 1, 1], -1.0),
        ],
        pad_id=0,
    )


@pytest.mark.parametrize("max_logits", [None, 0])  # qpa's full-logits and tiled paths
def test_end_to_end_on_the_tiny_model_equals_trl(max_logits: int | None) -> None:
    """TRL's whole path, model included: its fused LM head (`add_fused_lm_head`) and
    `_get_per_token_logps_and_entropies` compute the log-probs at the sampling temperature,
    `_compute_loss` the loss; the weight gradients equal qpa's `token_logprobs` +
    `policy_loss` (1e-5: two different log-prob kernels)."""
    from trl.trainer.utils import add_fused_lm_head

    temperature = 0.7
    model = _tiny()
    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 120, (4,), generator=g).tolist()
    samples = [
        Sample([*prompt, *torch.randint(3, 120, (n,), generator=g).tolist()], 4, mask, adv)
        for n, mask, adv in ((5, [1, 1, 0, 1, 1], 1.0), (3, [1, 1, 1], -0.7), (4, [1] * 4, 0.4))
    ]
    batch = collate(samples, pad_id=0)
    settings = LossSettings(clip_high=0.28, beta=0.04)
    with torch.no_grad():
        old = token_logprobs(model, batch, temperature) + 0.3 * torch.randn(
            batch.loss_mask.shape, generator=g
        )
        ref = old - 0.2
    params = [p for p in model.parameters() if p.requires_grad]

    logps = token_logprobs(model, batch, temperature, max_logits=max_logits)
    ours, _ = policy_loss(
        logps, old, batch, settings, normalizer=float(batch.loss_mask.sum()), ref_logps=ref
    )
    g_ours = torch.autograd.grad(ours, params)

    fake = _trl(settings, "dapo")
    fake.accelerator.autocast = contextlib.nullcontext
    fake._get_per_token_logps_and_entropies = types.MethodType(
        GRPOTrainer._get_per_token_logps_and_entropies, fake
    )
    completion = batch.input_ids[:, batch.prompt_width :]
    inputs = {
        "prompt_ids": batch.input_ids[:, : batch.prompt_width],
        "prompt_mask": batch.attention_mask[:, : batch.prompt_width],
        "completion_ids": completion,
        "completion_mask": batch.attention_mask[:, batch.prompt_width :],
        "tool_mask": batch.loss_mask,
        "advantages": batch.advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": batch.loss_mask.sum(),
    }
    theirs = GRPOTrainer._compute_loss(fake, model, inputs)
    g_theirs = torch.autograd.grad(theirs, params)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_ours, g_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert sum(float(x.abs().sum()) for x in g_ours) > 0


def test_a_step_raises_positive_and_lowers_negative_completions() -> None:
    torch.manual_seed(0)
    model = _tiny()
    batch = _two_completions()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = token_logprobs(model, batch).detach().sum(1)
    logps = token_logprobs(model, batch)
    loss, _ = policy_loss(
        logps, logps.detach(), batch, LossSettings(), normalizer=float(batch.loss_mask.sum())
    )
    loss.backward()
    optimizer.step()
    after = token_logprobs(model, batch).detach().sum(1)
    assert after[0] > before[0], "the positive-advantage completion did not become likelier"
    assert after[1] < before[1], "the negative-advantage completion did not become less likely"


def test_clip_acts_exactly_outside_the_ratio_range_with_ppo_epochs() -> None:
    """Epoch 1 moves the policy (an SGD step); in epoch 2 the ratio leaves the range on most
    tokens, and exactly those (ratio > 1 + eps_high with A > 0, < 1 - eps_low with A < 0)
    get zero gradient; every other trained token keeps one."""
    torch.manual_seed(0)
    model = _tiny()
    batch = _two_completions()
    settings = LossSettings(ppo_epochs=2, clip_low=0.2, clip_high=0.28)
    normalizer = float(batch.loss_mask.sum())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.no_grad():
        old = token_logprobs(model, batch)
    for epoch in range(settings.ppo_epochs):
        logps = token_logprobs(model, batch)
        logps.retain_grad()
        loss, stats = policy_loss(logps, old, batch, settings, normalizer=normalizer)
        optimizer.zero_grad()
        loss.backward()
        if epoch == 0:
            optimizer.step()
    ratio = torch.exp(logps.detach() - old)
    advantages = batch.advantages.unsqueeze(1)
    clipped = ((ratio > 1 + settings.clip_high) & (advantages > 0)) | (
        (ratio < 1 - settings.clip_low) & (advantages < 0)
    )
    # lr 0.5: the positive completion's ratios rise past 1.28 but for one token (~1.0), the
    # negative one's fall below 0.8.
    assert clipped.sum() >= 4 and (~clipped).any(), ratio
    assert (ratio[0] > 1).sum() >= 3 and torch.all(ratio[1] < 1), ratio
    grad = logps.grad
    assert grad is not None
    assert torch.all(grad[clipped] == 0)
    assert torch.all(grad[~clipped] != 0)
    assert stats["clip_fraction"] == pytest.approx(float(clipped.float().mean()))
    # Outside the range on the other side (the ratio moved against the advantage), the
    # unclipped term is the minimum and its gradient stays: PPO's pessimistic bound.
    inside = (ratio >= 1 - settings.clip_low) & (ratio <= 1 + settings.clip_high)
    against = ~inside & ~clipped
    assert torch.all(grad[against] != 0)
