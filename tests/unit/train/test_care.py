"""CARE's rewards and success-anchored advantages (`qpa.train.care`): pure functions, no torch.

The headline example: two successes one output token apart. Vanilla GRPO standardisation turns
that into advantages of about +-1 (as strong as success vs failure); CARE keeps them ~1e-3 and
keeps success-vs-failure dominant.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from qpa.contract import (
    Feedback,
    MessageUser,
    Policy,
    Step,
    Task,
    ToolCall,
    Totals,
    Trajectory,
    Verification,
)
from qpa.train.care import (
    CareSettings,
    Outcome,
    anchor_scale,
    care_advantages,
    care_group,
    care_rewards,
    efficiency_costs,
    group_tier,
    success_rate,
    vanilla_advantages,
    vanilla_group,
    well_formed_share,
)


def win(tokens: int = 100, calls: int = 3) -> Outcome:
    return Outcome(success=True, progress=1.0, output_tokens=tokens, tool_calls=calls)


def loss(
    progress: float = 0.0, tokens: int = 100, calls: int = 3, well_formed: float = 1.0
) -> Outcome:
    return Outcome(
        success=False,
        progress=progress,
        output_tokens=tokens,
        tool_calls=calls,
        well_formed=well_formed,
    )


# --------------------------------------------------------------------------- the 1-token example


def test_one_token_difference_vanilla_blows_up_care_keeps_small() -> None:
    group = [win(100), win(101)]
    result = care_group(group)
    assert result.tier == "efficiency_refinement"
    assert result.rewards[0] > result.rewards[1]  # fewer tokens, higher reward
    assert result.rewards[0] - result.rewards[1] < 2e-3

    # GRPO's standardisation: exactly +-1 with the population std; TRL's Bessel-corrected std
    # and eps=1e-4 (comparable to a 1e-3 reward gap) still give about +-0.6.
    assert vanilla_advantages(result.rewards, eps=0.0, unbiased=False) == pytest.approx([1, -1])
    vanilla = vanilla_advantages(result.rewards)
    assert vanilla[0] > 0.6 and vanilla[1] < -0.6

    care = result.advantages
    assert result.anchored
    assert care[0] > 0 > care[1]  # still prefers the shorter success...
    assert max(abs(a) for a in care) < 2e-3  # ...but ~1000x less hard than vanilla
    assert abs(care[0]) / abs(vanilla[0]) < 3e-3

    # Add a failure: success-vs-failure dominates the token difference by orders of magnitude.
    mixed = care_advantages([win(100), win(101), loss()], CareSettings(high_success_threshold=0.6))
    gap_success_failure = min(mixed[0], mixed[1]) - mixed[2]
    gap_among_successes = abs(mixed[0] - mixed[1])
    assert gap_success_failure > 1.0
    assert gap_among_successes < 1e-2 * gap_success_failure


def test_saturated_group_efficiency_push_is_bounded_by_the_anchor() -> None:
    # Even a real difference (100 vs 300 tokens, 2 vs 6 calls) moves far less than a success.
    result = care_group([win(100, 2), win(300, 6)])
    assert result.advantages[0] > 0 > result.advantages[1]
    assert abs(result.advantages[0]) < 0.3
    assert max(abs(a) for a in vanilla_advantages(result.rewards)) > 0.7


# --------------------------------------------------------------------------- tiers


@pytest.mark.parametrize(
    ("rate", "tier"),
    [
        (0.0, "progress_shaping"),
        (0.125, "progress_shaping"),
        (0.2, "outcome_consolidation"),  # strict: "below low"
        (0.5, "outcome_consolidation"),
        (0.8, "outcome_consolidation"),  # strict: "above high"
        (0.875, "efficiency_refinement"),
        (1.0, "efficiency_refinement"),
    ],
)
def test_group_tier_thresholds(rate: float, tier: str) -> None:
    assert group_tier(rate) == tier


def test_tier_switches_and_bad_rates() -> None:
    assert (
        group_tier(0.0, CareSettings(low_success_threshold=0.0)) == "outcome_consolidation"
    )  # shaping off
    assert (
        group_tier(1.0, CareSettings(high_success_threshold=1.0)) == "outcome_consolidation"
    )  # refinement off
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            group_tier(bad)


def test_progress_shaping_gives_partial_credit_below_any_success() -> None:
    cfg = CareSettings()
    rewards = care_rewards([loss(0.0), loss(0.5), loss(1.0)], cfg)
    assert rewards == pytest.approx([0.0, 0.4, 0.8])
    with_success = care_rewards([win(), loss(1.0), loss(0.5), loss(0.0), *[loss()] * 4], cfg)
    assert success_rate([win(), *[loss()] * 7]) == 0.125
    assert with_success[0] == 1.0
    assert max(with_success[1:]) < with_success[0]


def test_outcome_consolidation_is_success_only() -> None:
    group = [win(10), win(500), loss(0.9), loss(0.1)]
    assert care_rewards(group) == [1.0, 1.0, 0.0, 0.0]
    # CARE equals vanilla GRPO in a mixed group: the outcome signal is left untouched.
    assert care_advantages(group) == pytest.approx(vanilla_advantages([1.0, 1.0, 0.0, 0.0]))


def test_format_weight_ranks_a_malformed_failure_below_a_well_formed_one() -> None:
    cfg = CareSettings(format_weight=0.1)
    # progress shaping: progress and format credit add up, still below a success
    shaped = care_rewards(
        [loss(0.0, well_formed=0.0), loss(0.0), loss(1.0), win()], cfg, tier="progress_shaping"
    )
    assert shaped == pytest.approx([0.0, 0.1, 0.9, 1.0])
    # an all-failure group that differs only in format has a signal (off by default: none)
    group = [loss(well_formed=0.0), loss(well_formed=0.5), loss(), loss()]
    assert all(a == 0.0 for a in care_advantages(group))
    advantages = care_advantages(group, cfg)
    assert advantages[0] < advantages[1] < advantages[2] == advantages[3]
    # outcome consolidation: failures get format credit only, successes stay at 1
    mixed = care_rewards([win(), win(), loss(0.9, well_formed=0.0), loss(0.1)], cfg)
    assert mixed == pytest.approx([1.0, 1.0, 0.0, 0.1])
    # efficiency refinement is untouched
    saturated = [win(), win(), win(), win(), loss(well_formed=0.0)]
    assert care_rewards(saturated, cfg, tier="efficiency_refinement")[-1] == 0.0
    with pytest.raises(ValidationError, match="progressWeight \\+ formatWeight"):
        CareSettings(progress_weight=0.8, format_weight=0.2)


def test_well_formed_share_counts_turns_the_harness_could_not_parse() -> None:
    task = Task(id="t", domain="d", capabilities=["tool_use"], instruction="do it")
    parsed = Step(index=0, action=ToolCall(tool="a", arguments={}), feedback=Feedback.ok())
    broken = Step(
        index=1,
        action=MessageUser(text="{not json"),
        feedback=Feedback.fail("malformed_action", "not a tool call"),
        annotations={"parse_failure": {"kind": "malformed_output"}},
    )
    trajectory = Trajectory(
        id="t#1", task=task, policy=Policy(planner="harness"), steps=[parsed, broken, parsed]
    )
    assert well_formed_share(trajectory) == pytest.approx(2 / 3)
    assert Outcome.of(trajectory).well_formed == pytest.approx(2 / 3)
    assert well_formed_share(trajectory.model_copy(update={"steps": []})) == 1.0


def test_efficiency_refinement_charges_successes_only() -> None:
    cfg = CareSettings(high_success_threshold=0.5)
    group = [win(100, 2), win(200, 4), loss(0.9, tokens=5, calls=0)]
    rewards = care_rewards(group, cfg)
    assert rewards[2] == 0.0  # a short failure is not a better failure
    costs = efficiency_costs(group, cfg)
    # group normalisation: mean tokens/calls of the successes are 150 / 3
    assert costs[0] == pytest.approx(0.1 * 100 / 150 + 0.05 * 2 / 3)
    assert rewards[0] == pytest.approx(1 - costs[0])
    assert 1 - cfg.max_cost <= rewards[1] < rewards[0] < 1


def test_budget_normalisation_and_cap() -> None:
    cfg = CareSettings(normalization="budget", token_norm=1000, call_norm=10)
    costs = efficiency_costs([win(500, 5), win(10_000, 100)], cfg)
    assert costs[0] == pytest.approx(0.1 * 0.5 + 0.05 * 0.5)
    assert costs[1] == pytest.approx(cfg.max_cost)  # each term capped


def test_vanilla_group_is_the_care_off_baseline() -> None:
    group = [win(100), win(101), loss(0.5), loss(0.0)]
    result = vanilla_group(group)
    assert result.rewards == [1.0, 1.0, 0.0, 0.0]
    assert result.tier == "outcome_consolidation"
    assert result.advantages == pytest.approx(vanilla_advantages(result.rewards))
    assert vanilla_advantages([]) == []
    assert vanilla_advantages([0.3]) == [0.0]


# --------------------------------------------------------------------------- the anchor


def test_anchor_scale_is_one_success_in_k() -> None:
    for k in (2, 4, 8, 16):
        split = [1.0] + [0.0] * (k - 1)
        mean = 1 / k
        population_std = math.sqrt(sum((r - mean) ** 2 for r in split) / k)
        assert anchor_scale(k) == pytest.approx(population_std)
    assert anchor_scale(1) == 1.0
    assert anchor_scale(4, CareSettings(success_value=2.0)) == pytest.approx(2 * anchor_scale(4))
    with pytest.raises(ValueError):
        anchor_scale(0)


def test_all_failure_progress_is_measured_in_success_units() -> None:
    group = [loss(0.0), loss(1 / 3), loss(2 / 3), loss(1.0)]
    result = care_group(group)
    assert result.tier == "progress_shaping" and result.anchored
    vanilla = vanilla_advantages(result.rewards)
    assert all(abs(c) < abs(v) for c, v in zip(result.advantages, vanilla, strict=True) if v)
    assert result.advantages == sorted(result.advantages)  # order kept


def test_uniform_groups_get_zero_advantage() -> None:
    for group in ([win(50), win(50)], [loss(), loss()], [win()]):
        assert care_advantages(group) == pytest.approx([0.0] * len(group))


def test_larger_anchor_pushes_less() -> None:
    group = [win(100), win(150), win(200)]
    small = care_advantages(group, CareSettings(success_value=0.5))
    large = care_advantages(group, CareSettings(success_value=2.0))
    assert abs(large[0]) < abs(small[0])


def test_success_anchor_off_standardises_every_group_as_grpo() -> None:
    group = [win(100), win(150), win(200)]
    anchored = care_group(group)
    plain = care_group(group, CareSettings(success_anchor=False))
    assert anchored.anchored and not plain.anchored
    assert plain.rewards == anchored.rewards  # the tiers still pick the rewards
    assert plain.advantages == pytest.approx(vanilla_advantages(plain.rewards))
    assert abs(plain.advantages[0]) > 10 * abs(anchored.advantages[0])
    mixed = [win(100), loss(0.5), loss(0.0)]
    assert care_group(mixed, CareSettings(success_anchor=False)).advantages == pytest.approx(
        care_group(mixed).advantages
    )


# --------------------------------------------------------------------------- monotonicity


@pytest.mark.parametrize("high", [0.5, 0.8])
def test_monotone_in_tokens_calls_progress_and_success(high: float) -> None:
    cfg = CareSettings(high_success_threshold=high)
    tokens = [win(t, 3) for t in (50, 80, 120, 200)]
    adv = care_advantages(tokens, cfg)
    assert adv == sorted(adv, reverse=True)
    calls = [win(100, c) for c in (1, 2, 4, 8)]
    adv = care_advantages(calls, cfg)
    assert adv == sorted(adv, reverse=True)
    progress = [loss(p) for p in (0.9, 0.6, 0.3, 0.0)]
    adv = care_advantages(progress, cfg)
    assert adv == sorted(adv, reverse=True)
    # Every success outranks every failure, whatever the tier.
    for group in (
        [win(900, 30), loss(1.0), loss(0.0), loss(0.0), loss(0.0), loss(0.0)],
        [win(900, 30), win(10, 1), loss(1.0, tokens=1, calls=0)],
        [win(900, 30), win(10, 1), win(10, 1), win(10, 1), loss(1.0, tokens=1, calls=0)],
    ):
        result = care_group(group, cfg)
        worst_win = min(a for a, o in zip(result.advantages, group, strict=True) if o.success)
        best_loss = max(a for a, o in zip(result.advantages, group, strict=True) if not o.success)
        assert worst_win > best_loss, result.tier


# --------------------------------------------------------------------------- config, inputs


def test_config_validation() -> None:
    CareSettings(low_success_threshold=0.0, high_success_threshold=1.0)
    with pytest.raises(ValidationError, match="must not exceed"):
        CareSettings(low_success_threshold=0.9, high_success_threshold=0.1)
    with pytest.raises(ValidationError, match="outranks every failure"):
        CareSettings(token_weight=0.4, call_weight=0.2, cost_cap=2.0)
    for bad in (
        {"low_success_threshold": -0.1},
        {"high_success_threshold": 1.1},
        {"progress_weight": 1.0},
        {"format_weight": -0.1},
        {"format_weight": 1.0},
        {"success_value": 0.0},
        {"low": 0.1},
        {"token_norm": 0},
        {"normalization": "median"},
        {"unknown": 1},
    ):
        with pytest.raises(ValidationError):
            CareSettings.model_validate(bad)
    with pytest.raises(ValueError):
        care_rewards([])


def test_trajectories_are_accepted_directly() -> None:
    task = Task(id="t", domain="d", capabilities=["tool_use"], instruction="do it")

    def trajectory(success: bool, progress: float, tokens: int, calls: int) -> Trajectory:
        return Trajectory(
            id=f"t#{tokens}",
            task=task,
            policy=Policy(planner="harness"),
            verification=Verification(done=True, success=success, progress=progress),
            totals=Totals(completion_tokens=tokens, tool_calls=calls),
        )

    group = [trajectory(True, 1.0, 100, 2), trajectory(False, 0.5, 40, 1)]
    assert Outcome.of(group[1]) == loss(0.5, tokens=40, calls=1)
    assert care_rewards(group) == care_rewards([Outcome.of(t) for t in group])
    empty = Trajectory(id="x", task=task, policy=Policy(planner="noop"))
    assert Outcome.of(empty) == Outcome(success=False)
