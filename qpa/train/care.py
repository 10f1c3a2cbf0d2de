"""CARE: Competence-Aware Reward-and-Advantage Engineering, as pure functions.

RL for a planner samples a *group* of k trajectories of one task and scores each one against the
others. CARE makes two choices per group, both from the group's own evidence.

1. **Which reward (the tier).** The group's success rate ``rho = (1/k) sum_i s_i`` says how
   competent the policy already is at this task, and selects what is worth learning from it:

   - ``progress_shaping`` when ``rho < low``: ``r_i = 1`` if s_i else ``w_p * p_i + w_f * f_i``;
   - ``outcome_consolidation`` when ``low <= rho <= high``: ``r_i = 1`` if s_i else
     ``w_f * f_i``;
   - ``efficiency_refinement`` when ``rho > high``: ``r_i = s_i * (1 - cost_i)``;

   with ``s_i`` in {0, 1} the verifier's success, ``p_i`` in [0, 1] its progress (the share of
   checks passed), ``w_p = progress_weight``, ``f_i`` in [0, 1] the share of its turns whose
   model output parsed as a tool call (no ``parse_failure``: not malformed, no unknown tool, no
   invalid arguments), ``w_f = format_weight`` (0 by default, ``w_p + w_f < 1``), and the
   efficiency cost

       cost_i = w_tok * min(n_i / N_tok, cap) + w_call * min(c_i / N_call, cap)

   where ``n_i`` is the trajectory's output (completion) tokens and ``c_i`` its tool calls. The
   normalisers ``N_tok, N_call`` are, with ``normalization="group"`` (default), the mean output
   tokens and mean tool calls of the group's *successful* trajectories (at least 1), so the cost
   is relative to what success takes on this task; with ``normalization="budget"`` they are the
   fixed ``token_norm`` / ``call_norm``.

   Why: a group that almost always fails has (nearly) no outcome signal, so partial progress is
   the only thing to learn from; a mixed group has a clean success-vs-failure signal that shaping
   would only blur (the format term, when on, only ranks a malformed failure below a well-formed
   one: a planner whose failures are mostly unparsable output gets a signal from groups that
   otherwise all score 0); a saturated group has nothing left to learn about *whether* to
   succeed, only about doing it with fewer tokens and calls. The rules keep every success
   strictly above every failure in each tier: ``w_p + w_f < 1`` in progress shaping, and
   ``(w_tok + w_call) * cap < 1`` in efficiency refinement (validated). Only successes pay the
   efficiency cost: a failure must never become "better" by being short, which would reward
   giving up early.

2. **How to scale the advantage (the success anchor).** GRPO standardises per group,
   ``A_i = (r_i - mean(r)) / (std(r) + eps)`` (std Bessel-corrected, eps 1e-4, as TRL computes
   it). When every trajectory succeeded, ``std(r)`` is only
   the spread of the efficiency costs, which can be arbitrarily small, and dividing by it turns a
   one-token difference between two successes into advantages of about +-1: as strong a push as a
   success against a failure. That is what makes vanilla RL over-compress reasoning or skip tool
   calls once a task is mastered. CARE anchors the scale on what a success is worth:

       kappa_k = success_value * sqrt(k - 1) / k
       A_i     = (r_i - mean(r)) / (std(r) + eps)            if 0 < #successes < k
       A_i     = (r_i - mean(r)) / max(std(r), kappa_k)      if #successes in {0, k}

   ``kappa_k`` is the (population) standard deviation of a group of k in which exactly one
   trajectory is worth ``success_value`` (one success, default 1.0) more than the rest: the smallest
   spread a real success-vs-failure difference can produce. A group that holds both outcomes has
   a genuine outcome signal and is standardised exactly as GRPO does (CARE equals vanilla GRPO
   there). A group that is all-success or all-failure has no outcome signal: any spread it has
   comes from sub-success differences (tokens, calls, partial progress), which are therefore
   measured in units of one success; the scale is never below the group's own spread, so
   nothing is amplified beyond vanilla. A one-token difference between two successes gets
   advantages of about +-0.001 instead of +-1, partial progress counts as a fraction of a
   success, and in every group the success-vs-failure split dominates any efficiency difference
   among successes.

With ``success_anchor`` off, every group is standardised as GRPO does (``std + eps``) while the
tiers still pick the rewards: the anchor's effect measured on its own.

3. **The baselines CARE is measured against** (``enabled: false``, `vanilla_group`): one reward
   tier for every group (``vanilla_reward``) and one advantage rule (``scale_rewards``, TRL's
   name and values):

   - vanilla GRPO: ``vanilla_reward: outcome_consolidation``, ``scale_rewards: group``:
     ``A_i = (s_i - mean(s)) / (std(s) + eps)``;
   - GRPO with the efficiency reward: ``vanilla_reward: efficiency_refinement``, ``scale_rewards:
     group``: ``r_i = s_i * (1 - cost_i)`` in every group, standardised as GRPO does (no tiers, no
     anchor: a one-token difference between two successes is pushed as hard as a success
     against a failure);
   - Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``scale_rewards: none``,
     ``A_i = r_i - mean(r)`` (`centered_advantages`: no division by the group's std, which
     over-weights groups whose rewards barely differ), together with the loss normaliser
     ``loss_type: dr_grpo`` (`qpa.train.rl.loss.loss_normalizer`: a constant instead of
     per-token or per-sequence means).

The settings are `qpa.api.v1alpha1.CareSettings`, the same model the TrainingRun CRD's
`spec.rl.care`, `RLConfig.care` and the loop preset use (``low_success_threshold`` is ``low``
above, ``high_success_threshold`` ``high``, ``token_weight``/``call_weight`` ``w_tok``/``w_call``).

Within a group, advantages are an increasing affine function of the reward, so CARE never
reorders trajectories, it only changes how hard each group pushes. Everything here is pure
Python (no torch), deterministic and cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from qpa.api.v1alpha1.trainingrun import CARE_TIERS, VANILLA_EPS, CareSettings, CareTier
from qpa.contract import Trajectory


@dataclass(frozen=True)
class Outcome:
    """What CARE needs to know about one trajectory."""

    success: bool
    progress: float = 0.0
    output_tokens: int = 0
    tool_calls: int = 0
    well_formed: float = 1.0  # share of turns whose model output parsed (`format_weight`)

    @classmethod
    def of(cls, trajectory: Trajectory) -> Outcome:
        """From a recorded trajectory: verifier success/progress, output tokens, tool calls and
        the share of well-formed turns."""
        verification = trajectory.verification
        totals = trajectory.totals
        return cls(
            success=bool(verification is not None and verification.success),
            progress=float(verification.progress) if verification is not None else 0.0,
            output_tokens=int(totals.completion_tokens),
            tool_calls=int(totals.tool_calls),
            well_formed=well_formed_share(trajectory),
        )


def well_formed_share(trajectory: Trajectory) -> float:
    """The share of a trajectory's turns whose model output the Harness parsed as a tool call
    (a turn it recorded a ``parse_failure`` for is not); 1.0 for an episode with no turn
    (nothing it said was malformed)."""
    steps = trajectory.steps
    if not steps:
        return 1.0
    return sum("parse_failure" not in step.annotations for step in steps) / len(steps)


GroupMember = Outcome | Trajectory


@dataclass(frozen=True)
class GroupResult:
    """CARE's verdict on one group: tier, success rate, rewards and advantages (same order)."""

    tier: CareTier
    success_rate: float
    rewards: list[float]
    advantages: list[float]
    scale: float
    anchored: bool  # the success anchor set the scale (an all-success or all-failure group)


def _outcomes(group: Sequence[GroupMember]) -> list[Outcome]:
    if not group:
        raise ValueError("a group needs at least one trajectory")
    return [m if isinstance(m, Outcome) else Outcome.of(m) for m in group]


def success_rate(group: Sequence[GroupMember]) -> float:
    """``rho``: the share of the group's trajectories that succeeded."""
    outcomes = _outcomes(group)
    return sum(o.success for o in outcomes) / len(outcomes)


def group_tier(rate: float, config: CareSettings | None = None) -> CareTier:
    """The tier a group with success rate ``rate`` is trained in (strict thresholds)."""
    if not 0.0 <= rate <= 1.0 or math.isnan(rate):
        raise ValueError(f"success rate must be in [0, 1], got {rate}")
    cfg = config or CareSettings()
    if rate < cfg.low_success_threshold:
        return "progress_shaping"
    if rate > cfg.high_success_threshold:
        return "efficiency_refinement"
    return "outcome_consolidation"


def efficiency_costs(
    group: Sequence[GroupMember], config: CareSettings | None = None
) -> list[float]:
    """``cost_i`` for every member (failures get one too, but it is only charged to successes)."""
    cfg = config or CareSettings()
    outcomes = _outcomes(group)
    if cfg.normalization == "budget":
        n_ref, c_ref = cfg.token_norm, cfg.call_norm
    else:
        winners = [o for o in outcomes if o.success] or outcomes
        n_ref = max(1.0, sum(o.output_tokens for o in winners) / len(winners))
        c_ref = max(1.0, sum(o.tool_calls for o in winners) / len(winners))
    return [
        cfg.token_weight * min(o.output_tokens / n_ref, cfg.cost_cap)
        + cfg.call_weight * min(o.tool_calls / c_ref, cfg.cost_cap)
        for o in outcomes
    ]


def care_rewards(
    group: Sequence[GroupMember],
    config: CareSettings | None = None,
    *,
    tier: CareTier | None = None,
) -> list[float]:
    """Each member's reward under the group's tier (or under ``tier`` when given)."""
    cfg = config or CareSettings()
    outcomes = _outcomes(group)
    chosen = tier or group_tier(success_rate(outcomes), cfg)
    if chosen == "progress_shaping":
        return [
            1.0
            if o.success
            else cfg.progress_weight * _unit(o.progress) + cfg.format_weight * _unit(o.well_formed)
            for o in outcomes
        ]
    if chosen == "outcome_consolidation":
        return [1.0 if o.success else cfg.format_weight * _unit(o.well_formed) for o in outcomes]
    costs = efficiency_costs(outcomes, cfg)
    return [(1.0 - c) if o.success else 0.0 for o, c in zip(outcomes, costs, strict=True)]


def _unit(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def _mean_std(values: Sequence[float], *, unbiased: bool) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    squares = sum((v - mean) ** 2 for v in values)
    return mean, math.sqrt(squares / (n - 1 if unbiased else n))


def vanilla_advantages(
    rewards: Sequence[float], *, eps: float = VANILLA_EPS, unbiased: bool = True
) -> list[float]:
    """GRPO's group standardisation ``(r - mean) / (std + eps)`` (TRL's: Bessel-corrected std).

    With ``unbiased=False`` the population std is used, as in the DeepSeekMath paper's notation.
    """
    if not rewards:
        return []
    mean, std = _mean_std(rewards, unbiased=unbiased)
    return [(r - mean) / (std + eps) for r in rewards]


def centered_advantages(rewards: Sequence[float]) -> list[float]:
    """Dr.GRPO's advantages ``r - mean(r)``: the group baseline, no std division."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def anchor_scale(k: int, config: CareSettings | None = None) -> float:
    """``kappa_k = success_value * sqrt(k - 1) / k``: the spread of a one-success-in-k split."""
    if k < 1:
        raise ValueError("k must be >= 1")
    cfg = config or CareSettings()
    return cfg.success_value * (math.sqrt(k - 1) / k if k > 1 else 1.0)


def care_group(
    group: Sequence[GroupMember],
    config: CareSettings | None = None,
    *,
    tier: CareTier | None = None,
) -> GroupResult:
    """Tier, rewards and success-anchored advantages of one group (see the module doc)."""
    cfg = config or CareSettings()
    outcomes = _outcomes(group)
    rate = success_rate(outcomes)
    chosen = tier or group_tier(rate, cfg)
    rewards = care_rewards(outcomes, cfg, tier=chosen)
    wins = sum(o.success for o in outcomes)
    mean, std = _mean_std(rewards, unbiased=True)
    anchored = cfg.success_anchor and wins in (0, len(outcomes))
    scale = max(std, anchor_scale(len(outcomes), cfg)) if anchored else std + cfg.epsilon
    advantages = [(r - mean) / scale for r in rewards]
    return GroupResult(chosen, rate, rewards, advantages, scale, anchored)


def care_advantages(
    group: Sequence[GroupMember], config: CareSettings | None = None
) -> list[float]:
    """CARE's success-anchored advantages of one group, in the group's order."""
    return care_group(group, config).advantages


def vanilla_group(
    group: Sequence[GroupMember],
    config: CareSettings | None = None,
    *,
    tier: CareTier = "outcome_consolidation",
    eps: float = VANILLA_EPS,
) -> GroupResult:
    """The ``--care off`` baseline: one fixed reward (outcome by default) for every group, and
    GRPO's advantages (``config.scale_rewards: group``) or Dr.GRPO's (``none``: ``r - mean``,
    reported with scale 1)."""
    cfg = config or CareSettings()
    outcomes = _outcomes(group)
    rewards = care_rewards(outcomes, cfg, tier=tier)
    if cfg.scale_rewards == "none":
        return GroupResult(
            tier, success_rate(outcomes), rewards, centered_advantages(rewards), 1.0, False
        )
    _, std = _mean_std(rewards, unbiased=True)
    advantages = vanilla_advantages(rewards, eps=eps)
    return GroupResult(tier, success_rate(outcomes), rewards, advantages, std + eps, False)


__all__ = [
    "CARE_TIERS",
    "VANILLA_EPS",
    "CareSettings",
    "CareTier",
    "GroupMember",
    "GroupResult",
    "Outcome",
    "anchor_scale",
    "care_advantages",
    "care_group",
    "care_rewards",
    "centered_advantages",
    "efficiency_costs",
    "group_tier",
    "success_rate",
    "vanilla_advantages",
    "vanilla_group",
    "well_formed_share",
]
