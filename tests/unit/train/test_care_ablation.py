"""The CARE ablation's baselines: GRPO with the efficiency reward, Dr.GRPO's advantages and its
constant loss normaliser (`qpa.train.care`, `qpa.train.rl.loss`), with exact numbers.

The headline: four successes whose output tokens differ by 10%. GRPO with the efficiency reward
standardises that spread into advantages of +-1.2 (a success-vs-failure-sized push for a few
tokens); CARE's success anchor keeps them at +-0.023; Dr.GRPO's centring leaves the raw reward
difference (+-0.01).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from pydantic import ValidationError

from qpa.train.care import (
    CareSettings,
    Outcome,
    care_group,
    centered_advantages,
    vanilla_group,
)
from qpa.train.rl.config import LossSettings
from qpa.train.rl.loss import loss_normalizer, policy_loss


def _trl_harness() -> ModuleType:
    """test_policy_loss_vs_trl's way of calling TRL's own `_compute_loss` (tests are no package)."""
    path = Path(__file__).with_name("test_policy_loss_vs_trl.py")
    spec = importlib.util.spec_from_file_location("_qpa_trl_harness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def win(tokens: int, calls: int = 3) -> Outcome:
    return Outcome(success=True, progress=1.0, output_tokens=tokens, tool_calls=calls)


def fail(tokens: int = 100, calls: int = 3) -> Outcome:
    return Outcome(success=False, progress=0.5, output_tokens=tokens, tool_calls=calls)


SATURATED = [win(90), win(110), win(100), win(100)]  # costs 0.14, 0.16, 0.15, 0.15
BASELINE = CareSettings(enabled=False)
EFFICIENCY_GRPO = CareSettings(enabled=False, vanilla_reward="efficiency_refinement")
DR_GRPO = CareSettings(enabled=False, scale_rewards="none")


def test_centered_advantages_are_reward_minus_mean() -> None:
    assert centered_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert centered_advantages([1.0, 0.0, 0.0, 0.0]) == [0.75, -0.25, -0.25, -0.25]
    assert centered_advantages([]) == []


def test_dr_grpo_group_has_no_std_division() -> None:
    result = vanilla_group([win(100), fail(), fail(), fail()], DR_GRPO)
    assert result.rewards == [1.0, 0.0, 0.0, 0.0]
    assert result.advantages == [0.75, -0.25, -0.25, -0.25]
    assert result.scale == 1.0 and not result.anchored
    grpo = vanilla_group([win(100), fail(), fail(), fail()], BASELINE)
    assert grpo.advantages == pytest.approx([1.4997, -0.4999, -0.4999, -0.4999], abs=1e-4)


def test_efficiency_grpo_amplifies_a_token_spread_care_anchors_it() -> None:
    efficiency = vanilla_group(SATURATED, EFFICIENCY_GRPO, tier="efficiency_refinement")
    assert efficiency.rewards == pytest.approx([0.86, 0.84, 0.85, 0.85], abs=1e-12)
    # std of the rewards (Bessel) = sqrt(2e-4 / 3) = 0.0081650; 0.01 / (0.0081650 + 1e-4)
    assert efficiency.advantages == pytest.approx([1.20993, -1.20993, 0.0, 0.0], abs=1e-5)
    care = care_group(SATURATED, CareSettings())
    assert care.tier == "efficiency_refinement" and care.anchored
    assert care.scale == pytest.approx(3**0.5 / 4)  # kappa_4 = 0.4330
    assert care.advantages == pytest.approx([0.023094, -0.023094, 0.0, 0.0], abs=1e-6)
    dr = vanilla_group(SATURATED, DR_GRPO, tier="efficiency_refinement")
    assert dr.advantages == pytest.approx([0.01, -0.01, 0.0, 0.0], abs=1e-12)
    # without the efficiency reward, vanilla GRPO sees nothing to learn in this group
    assert vanilla_group(SATURATED, BASELINE).advantages == [0.0, 0.0, 0.0, 0.0]


def test_efficiency_grpo_keeps_every_success_above_every_failure() -> None:
    group = [win(60, 2), win(200, 8), fail(20, 1), fail(300, 9)]
    result = vanilla_group(group, EFFICIENCY_GRPO, tier="efficiency_refinement")
    assert min(result.advantages[:2]) > max(result.advantages[2:])
    assert result.rewards[2:] == [0.0, 0.0]  # a short failure gains nothing


def test_scale_rewards_is_validated() -> None:
    with pytest.raises(ValidationError, match="scale_rewards"):
        CareSettings(scale_rewards="batch")  # type: ignore[arg-type]
    assert CareSettings.model_validate({"scaleRewards": "none"}).scale_rewards == "none"


def test_loss_normalizer_per_type() -> None:
    def norm(loss_type: str, budget: int = 32 * 96 * 6) -> float:
        settings = LossSettings(loss_type=loss_type)  # type: ignore[arg-type]
        return loss_normalizer(settings, tokens=517, samples=40, completion_budget=budget)

    assert norm("token_mean") == 517.0
    assert norm("sequence_mean") == 40.0
    assert norm("dr_grpo") == 18432.0  # 8 tasks x 4 samples x 96 new tokens x 6 turns
    assert (
        loss_normalizer(LossSettings(), tokens=0, samples=0, completion_budget=0) == 1.0
    )  # an empty step divides by 1, never by 0
    with pytest.raises(ValueError, match=r"loss\.loss_type dr_grpo: completion_budget"):
        norm("dr_grpo", budget=0)
    with pytest.raises(ValidationError, match="loss_type"):
        LossSettings(loss_type="seq_mean_token_sum")  # type: ignore[arg-type]


def test_dr_grpo_loss_is_a_token_sum_over_a_constant() -> None:
    """Ratio 1: each trained token contributes -A; rows of 2 and 3 tokens, A = 1 and -0.5."""
    from qpa.train.rl.loss import Sample, collate

    samples = [
        Sample(input_ids=[5, 6, 7, 8], prompt_len=2, mask=[1, 1], advantage=1.0),
        Sample(input_ids=[5, 6, 9, 9, 9], prompt_len=2, mask=[1, 1, 1], advantage=-0.5),
    ]
    batch = collate(samples, pad_id=0)
    logps = torch.full(batch.loss_mask.shape, -1.0, requires_grad=True)
    settings = LossSettings(loss_type="dr_grpo")
    loss, stats = policy_loss(logps, logps.detach(), batch, settings, normalizer=10.0)
    assert float(loss.detach()) == pytest.approx(-0.05)  # (-2 + 1.5) / 10
    (grad,) = torch.autograd.grad(loss, logps)
    # every token of a row gets the same weight, whatever the row's length
    torch.testing.assert_close(grad, torch.tensor([[-0.1, -0.1, 0.0], [0.05, 0.05, 0.05]]))
    assert stats["tokens"] == 5.0


def test_dr_grpo_loss_equals_trl() -> None:
    """TRL's `loss_type="dr_grpo"` divides by rows x max_completion_length: the same constant."""
    trl = _trl_harness()
    settings = LossSettings(loss_type="dr_grpo", clip_high=0.28)
    batch = trl._batch(6)
    logps, old, _ = trl._logps(batch, 7)
    fake = trl._trl(settings, "dr_grpo")
    fake.max_completion_length = 96
    ours, _ = policy_loss(logps, old, batch, settings, normalizer=float(trl.ROWS * 96))
    trl._check(ours, trl._trl_loss(fake, logps, old, batch), [logps])
