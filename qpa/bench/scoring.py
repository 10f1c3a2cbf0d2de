"""Scoring: trajectories in, one `Report` out (the `report.json` every release decision reads).

Definitions (all computed in `score`, the one place they are):

- A task's **success rate** is the share of its k samples that succeeded; `overall` (the
  headline) and every group score (`by_capability`, `by_domain`, `by_difficulty`) are the mean
  of it over the group's tasks. With k samples for every task this equals the share of
  successful episodes. A task with several capabilities counts in each of them.
- `pass_at_k[j]` is the unbiased estimator of "at least one of j samples succeeds",
  `1 - C(n-c, j) / C(n, j)` for a task with n samples and c successes, averaged over tasks;
  `pass_hat_k[j]` ("pass^j") is the estimator of "all j samples succeed", `C(c, j) / C(n, j)`.
  Both are given for j = 1..k (JSON keys are strings).
- `turns`, `tool_calls` and `output_tokens_per_task` are means per episode;
  `output_tokens_per_success` is the total output tokens divided by the successful episodes
  (what one success costs; null when nothing succeeded).
- Cost: tokens priced by a `PriceTable` (USD per 1M prompt / completion tokens for the policy's
  model), scaled to 1,000 episodes: `cost_per_1k_tasks` (prompt + completion) and
  `output_cost_per_1k_tasks` (completion only, the figure the paper quotes).
- `ci`: 95% percentile bootstrap intervals, resampling *tasks* with replacement (1000
  resamples, fixed seed, pure Python `random`, so the numbers are the same on every machine),
  for `overall` and each capability.
- `errors`: episodes that ended with `trajectory.error` (a cut budget, a dead server, ...),
  also counted by the side the error names (`environment`, `harness`, ...).
- `complete`: every expected task has its k samples (no episode missing).
- Collateral writes (state changes the task's verifier does not expect, from
  `Verification.collateral`; such an episode is never a success): `collateral_writes` counts
  the changed records over all episodes, `episodes_with_collateral` the episodes with at least
  one, `collateral_by_target` the records by `app.collection`; each group score and task
  outcome has both counts too. Environments that cannot tell (LLM-judged, device) count 0.

Only samples `0..k-1` count, and a (task, sample) pair counts once (the last one seen).
"""

from __future__ import annotations

import fnmatch
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpa.contract import CAPABILITIES, Capability, Policy, Trajectory

SCHEMA_VERSION: Literal[1] = 1
CI_LEVEL = 0.95
CI_RESAMPLES = 1000
CI_SEED = 0


def describe_validation_error(exc: ValidationError) -> str:
    """`field 'a.b': message; ...` for every error of a pydantic validation failure."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        message = str(error.get("msg"))
        parts.append(f"field '{where}': {message}" if where else message)
    return "; ".join(parts)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- prices


class ModelPrice(_Strict):
    """Price of one model in the table's currency per 1M tokens."""

    prompt_per_1m: float = Field(ge=0.0)
    completion_per_1m: float = Field(ge=0.0)


DEFAULT_PRICE = ModelPrice(prompt_per_1m=0.40, completion_per_1m=1.60)


class PriceTable(_Strict):
    """Per-model token prices, loadable from YAML.

    ```yaml
    currency: USD
    default: {prompt_per_1m: 0.40, completion_per_1m: 1.60}
    models:
      my-planner-27b: {prompt_per_1m: 0.60, completion_per_1m: 2.40}
      "qwen3-*": {prompt_per_1m: 0.30, completion_per_1m: 1.20}   # fnmatch patterns work
    ```

    A policy's model is looked up by exact name, then by the longest matching pattern, then
    falls back to `default`. The built-in default (0.40 / 1.60 USD per 1M prompt / completion
    tokens) is an illustrative price of a mid-size open-weights planner on a hosted endpoint,
    not a quote: pass your own table (`qpa bench run --prices prices.yaml`) for real numbers.
    Model-free planners (oracle, noisy) use no tokens, so they cost 0 under any table.
    """

    currency: str = Field(default="USD", min_length=1)
    default: ModelPrice = DEFAULT_PRICE
    models: dict[str, ModelPrice] = Field(default_factory=dict)

    def price_for(self, model: str) -> ModelPrice:
        if model in self.models:
            return self.models[model]
        patterns = sorted(
            (p for p in self.models if fnmatch.fnmatchcase(model, p)), key=len, reverse=True
        )
        return self.models[patterns[0]] if patterns else self.default


class PriceTableError(ValueError):
    """A price table file that cannot be read or does not fit `PriceTable`."""


def load_price_table(path: str | Path | None) -> PriceTable:
    """A `PriceTable` from YAML (None: the defaults); errors name the file and the field."""
    if path is None:
        return PriceTable()
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PriceTableError(f"price table {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PriceTableError(f"price table {path}: not YAML: {exc}") from None
    if data is None:
        return PriceTable()
    if not isinstance(data, dict):
        raise PriceTableError(f"price table {path}: expected a mapping at the top level")
    try:
        return PriceTable.model_validate(data)
    except ValidationError as exc:
        raise PriceTableError(f"price table {path}: {describe_validation_error(exc)}") from None


# --------------------------------------------------------------------------- the report


class GroupScore(_Strict):
    """Scores of one group of tasks (a capability, a domain, a difficulty)."""

    success: float = Field(ge=0.0, le=1.0)
    mean_progress: float = Field(ge=0.0, le=1.0)
    tasks: int = Field(ge=0)
    episodes: int = Field(ge=0)
    output_tokens: float = Field(default=0.0, ge=0.0, description="mean per episode")
    collateral_writes: int = Field(default=0, ge=0, description="records, all episodes")
    episodes_with_collateral: int = Field(default=0, ge=0)


class Interval(_Strict):
    """A bootstrap confidence interval of a success rate."""

    low: float = Field(ge=0.0, le=1.0)
    high: float = Field(ge=0.0, le=1.0)
    level: float = Field(default=CI_LEVEL, gt=0.0, lt=1.0)
    resamples: int = Field(default=CI_RESAMPLES, ge=1)
    seed: int = CI_SEED

    @model_validator(mode="after")
    def _ordered(self) -> Interval:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self


class TaskOutcome(_Strict):
    """One task's results over its samples (kept so reports can be compared task by task)."""

    domain: str
    capabilities: list[Capability] = Field(min_length=1)
    difficulty: int = Field(ge=1, le=5)
    samples: int = Field(ge=1)
    successes: int = Field(ge=0)
    progress: float = Field(ge=0.0, le=1.0, description="mean over samples")
    output_tokens: float = Field(default=0.0, ge=0.0, description="mean over samples")
    collateral_writes: int = Field(default=0, ge=0, description="records, all samples")
    episodes_with_collateral: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> TaskOutcome:
        if self.successes > self.samples:
            raise ValueError(f"successes ({self.successes}) exceed samples ({self.samples})")
        if self.episodes_with_collateral > self.samples:
            raise ValueError(
                f"episodes_with_collateral ({self.episodes_with_collateral}) exceed samples "
                f"({self.samples})"
            )
        return self

    @property
    def rate(self) -> float:
        return self.successes / self.samples


class Report(_Strict):
    """`report.json`: every score of one benchmark run of one policy on one suite split."""

    schema_version: Literal[1] = SCHEMA_VERSION
    suite: str = Field(min_length=1)
    split: str = Field(min_length=1)
    policy: Policy
    samples: int = Field(ge=1, description="k: samples per task")
    tasks: int = Field(ge=0, description="tasks scored")
    episodes: int = Field(ge=0, description="episodes scored")
    expected_tasks: int = Field(ge=0)
    missing_episodes: int = Field(ge=0)
    complete: bool
    overall: float = Field(ge=0.0, le=1.0)
    by_capability: dict[Capability, GroupScore]
    by_domain: dict[str, GroupScore]
    by_difficulty: dict[int, GroupScore]
    mean_progress: float = Field(ge=0.0, le=1.0)
    pass_at_k: dict[int, float]
    pass_hat_k: dict[int, float]
    turns: float = Field(ge=0.0, description="mean per episode")
    tool_calls: float = Field(ge=0.0, description="mean per episode")
    prompt_tokens_per_task: float = Field(ge=0.0)
    output_tokens_per_task: float = Field(ge=0.0)
    output_tokens_per_success: float | None = Field(default=None, ge=0.0)
    cost_per_1k_tasks: float = Field(ge=0.0)
    output_cost_per_1k_tasks: float = Field(ge=0.0)
    currency: str = "USD"
    price: ModelPrice
    ci: dict[str, Interval]
    errors: int = Field(ge=0)
    errors_by_side: dict[str, int] = Field(default_factory=dict)
    collateral_writes: int = Field(
        default=0, ge=0, description="records changed outside what the verifiers expect"
    )
    episodes_with_collateral: int = Field(default=0, ge=0)
    collateral_by_target: dict[str, int] = Field(default_factory=dict)
    per_task: dict[str, TaskOutcome]
    created_at: datetime

    @model_validator(mode="after")
    def _consistent(self) -> Report:
        if len(self.per_task) != self.tasks:
            raise ValueError(f"tasks ({self.tasks}) != number of per_task entries")
        if sum(o.samples for o in self.per_task.values()) != self.episodes:
            raise ValueError(f"episodes ({self.episodes}) != sum of per_task samples")
        if self.complete and self.missing_episodes:
            raise ValueError(f"complete is true but {self.missing_episodes} episodes are missing")
        if self.complete and self.tasks < self.expected_tasks:
            raise ValueError("complete is true but fewer tasks than expected were scored")
        if self.errors > self.episodes:
            raise ValueError(f"errors ({self.errors}) exceed episodes ({self.episodes})")
        if self.episodes_with_collateral > self.episodes:
            raise ValueError(
                f"episodes_with_collateral ({self.episodes_with_collateral}) exceed episodes "
                f"({self.episodes})"
            )
        if self.episodes_with_collateral > self.collateral_writes:
            raise ValueError(
                f"episodes_with_collateral ({self.episodes_with_collateral}) exceed "
                f"collateral_writes ({self.collateral_writes})"
            )
        for name, table in (("pass_at_k", self.pass_at_k), ("pass_hat_k", self.pass_hat_k)):
            for k, value in table.items():
                if not 1 <= k <= self.samples:
                    raise ValueError(f"{name}: k={k} outside 1..samples ({self.samples})")
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"{name}[{k}]: {value} is not a rate in [0, 1]")
        if self.tasks and "overall" not in self.ci:
            raise ValueError("ci: the 'overall' interval is missing")
        return self


# --------------------------------------------------------------------------- episodes


@dataclass(frozen=True)
class EpisodeRecord:
    """What scoring needs of one trajectory (a few hundred bytes instead of the whole episode)."""

    task_id: str
    sample: int
    suite: str
    split: str
    domain: str
    capabilities: tuple[Capability, ...]
    difficulty: int
    policy: Policy
    success: bool
    progress: float
    turns: int
    tool_calls: int
    prompt_tokens: int
    completion_tokens: int
    error: str | None
    # `app.collection` of each collateral write (one per changed record).
    collateral: tuple[str, ...] = ()

    @classmethod
    def of(cls, trajectory: Trajectory) -> EpisodeRecord:
        task, totals, verification = trajectory.task, trajectory.totals, trajectory.verification
        return cls(
            task_id=task.id,
            sample=trajectory.sample,
            suite=task.suite,
            split=task.split,
            domain=task.domain,
            capabilities=tuple(task.capabilities),
            difficulty=task.difficulty,
            policy=trajectory.policy,
            success=trajectory.success,
            progress=verification.progress if verification is not None else 0.0,
            turns=totals.turns,
            tool_calls=totals.tool_calls,
            prompt_tokens=totals.prompt_tokens,
            completion_tokens=totals.completion_tokens,
            error=trajectory.error,
            collateral=tuple(c.target for c in verification.collateral)
            if verification is not None
            else (),
        )

    @property
    def key(self) -> tuple[str, int]:
        return (self.task_id, self.sample)


def error_side(error: str) -> str:
    """The side an episode error names (`environment: ...` -> `environment`)."""
    head, sep, _ = error.partition(":")
    return head.strip() if sep and head.strip().isidentifier() else "unknown"


# --------------------------------------------------------------------------- statistics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of P(at least one of k samples succeeds), n samples, c successes."""
    if k > n:
        raise ValueError(f"k={k} exceeds the {n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of P(all k samples succeed) (pass^k), n samples, c successes."""
    if k > n:
        raise ValueError(f"k={k} exceeds the {n} samples")
    return math.comb(c, k) / math.comb(n, k)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default method)."""
    position = (len(sorted_values) - 1) * q
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] * (1 - weight) + sorted_values[upper] * weight


def bootstrap_means(
    values: Sequence[float], *, resamples: int = CI_RESAMPLES, seed: int | str = CI_SEED
) -> list[float]:
    """Means of `resamples` resamples of `values` drawn with replacement (sorted)."""
    n = len(values)
    rng = random.Random(seed)
    choices = rng.choices
    means = [sum(choices(values, k=n)) / n for _ in range(resamples)]
    means.sort()
    return means


def bootstrap_interval(
    values: Sequence[float],
    *,
    level: float = CI_LEVEL,
    resamples: int = CI_RESAMPLES,
    seed: int = CI_SEED,
    stream: str = "",
) -> Interval:
    """Percentile bootstrap interval of the mean of `values` (rates in [0, 1]).

    `stream` names the group, so each group draws its own reproducible random stream.
    """
    if not values:
        return Interval(low=0.0, high=0.0, level=level, resamples=resamples, seed=seed)
    means = bootstrap_means(values, resamples=resamples, seed=f"{seed}|{stream}")
    tail = (1.0 - level) / 2.0
    low = min(max(quantile(means, tail), 0.0), 1.0)
    high = min(max(quantile(means, 1.0 - tail), 0.0), 1.0)
    return Interval(low=low, high=high, level=level, resamples=resamples, seed=seed)


# --------------------------------------------------------------------------- scoring


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


def _group(
    outcomes: dict[str, TaskOutcome], key: Callable[[TaskOutcome], Iterable[Any]]
) -> dict[Any, list[TaskOutcome]]:
    groups: dict[Any, list[TaskOutcome]] = defaultdict(list)
    for outcome in outcomes.values():
        for name in key(outcome):
            groups[name].append(outcome)
    return groups


def _group_score(outcomes: list[TaskOutcome]) -> GroupScore:
    episodes = sum(o.samples for o in outcomes)
    return GroupScore(
        success=_mean(o.rate for o in outcomes),
        mean_progress=_mean(o.progress for o in outcomes),
        tasks=len(outcomes),
        episodes=episodes,
        output_tokens=sum(o.output_tokens * o.samples for o in outcomes) / episodes
        if episodes
        else 0.0,
        collateral_writes=sum(o.collateral_writes for o in outcomes),
        episodes_with_collateral=sum(o.episodes_with_collateral for o in outcomes),
    )


def score(
    trajectories: Iterable[Trajectory | EpisodeRecord],
    prices: PriceTable | None = None,
    *,
    samples: int | None = None,
    expected_tasks: Collection[str] | None = None,
    seed: int = CI_SEED,
    resamples: int = CI_RESAMPLES,
) -> Report:
    """Score a benchmark run.

    `samples` is k (default: the most samples any task has); `expected_tasks` the task ids the
    run was meant to cover (default: those seen), which decides `complete`. Episodes of other
    tasks, and samples >= k, are ignored. Raises `ValueError` when nothing is left to score or
    the episodes mix suites, splits or policies.
    """
    prices = prices or PriceTable()
    latest: dict[tuple[str, int], EpisodeRecord] = {}
    for item in trajectories:
        record = item if isinstance(item, EpisodeRecord) else EpisodeRecord.of(item)
        latest[record.key] = record
    expected = set(expected_tasks) if expected_tasks is not None else None
    k = samples if samples is not None else 1 + max((s for _, s in latest), default=0)
    if k < 1:
        raise ValueError(f"samples must be at least 1, got {k}")
    records = [
        r for r in latest.values() if r.sample < k and (expected is None or r.task_id in expected)
    ]
    if not records:
        raise ValueError("no episodes to score")
    for name, values in (
        ("suites", {r.suite for r in records}),
        ("splits", {r.split for r in records}),
        ("policies", {r.policy.model_dump_json() for r in records}),
    ):
        if len(values) > 1:
            shown = ", ".join(sorted(values)) if name != "policies" else "see trajectories"
            raise ValueError(f"episodes of {len(values)} different {name} ({shown}): score apart")
    first = records[0]

    by_task: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for record in records:
        by_task[record.task_id].append(record)
    outcomes: dict[str, TaskOutcome] = {}
    for task_id in sorted(by_task):
        group = by_task[task_id]
        outcomes[task_id] = TaskOutcome(
            domain=group[0].domain,
            capabilities=list(group[0].capabilities),
            difficulty=group[0].difficulty,
            samples=len(group),
            successes=sum(r.success for r in group),
            progress=min(1.0, max(0.0, _mean(r.progress for r in group))),
            output_tokens=_mean(r.completion_tokens for r in group),
            collateral_writes=sum(len(r.collateral) for r in group),
            episodes_with_collateral=sum(bool(r.collateral) for r in group),
        )

    wanted = expected if expected is not None else set(outcomes)
    missing = sum(max(0, k - (outcomes[t].samples if t in outcomes else 0)) for t in wanted)
    episodes = len(records)
    successes = sum(r.success for r in records)
    prompt = sum(r.prompt_tokens for r in records)
    completion = sum(r.completion_tokens for r in records)
    price = prices.price_for(first.policy.model)
    per_episode_cost = (
        (prompt * price.prompt_per_1m + completion * price.completion_per_1m) / 1e6 / episodes
    )
    per_episode_output_cost = completion * price.completion_per_1m / 1e6 / episodes

    capability_groups = _group(outcomes, lambda o: o.capabilities)
    by_capability = {
        c: _group_score(capability_groups[c]) for c in CAPABILITIES if c in capability_groups
    }
    domain_groups = _group(outcomes, lambda o: [o.domain])
    difficulty_groups = _group(outcomes, lambda o: [o.difficulty])

    rates = [o.rate for o in outcomes.values()]
    ci = {"overall": bootstrap_interval(rates, seed=seed, resamples=resamples, stream="overall")}
    for capability in by_capability:
        ci[capability] = bootstrap_interval(
            [o.rate for o in capability_groups[capability]],
            seed=seed,
            resamples=resamples,
            stream=capability,
        )

    pass_k: dict[int, float] = {}
    pass_hat: dict[int, float] = {}
    for j in range(1, k + 1):
        eligible = [o for o in outcomes.values() if o.samples >= j]
        if eligible:
            pass_k[j] = _mean(pass_at_k(o.samples, o.successes, j) for o in eligible)
            pass_hat[j] = _mean(pass_hat_k(o.samples, o.successes, j) for o in eligible)

    errors = [r.error for r in records if r.error]
    collateral = Counter(target for r in records for target in r.collateral)
    return Report(
        suite=first.suite,
        split=first.split,
        policy=first.policy,
        samples=k,
        tasks=len(outcomes),
        episodes=episodes,
        expected_tasks=len(wanted),
        missing_episodes=missing,
        complete=missing == 0,
        overall=_mean(rates),
        by_capability=by_capability,
        by_domain={d: _group_score(domain_groups[d]) for d in sorted(domain_groups)},
        by_difficulty={d: _group_score(difficulty_groups[d]) for d in sorted(difficulty_groups)},
        mean_progress=_mean(o.progress for o in outcomes.values()),
        pass_at_k=pass_k,
        pass_hat_k=pass_hat,
        turns=_mean(r.turns for r in records),
        tool_calls=_mean(r.tool_calls for r in records),
        prompt_tokens_per_task=prompt / episodes,
        output_tokens_per_task=completion / episodes,
        output_tokens_per_success=completion / successes if successes else None,
        cost_per_1k_tasks=per_episode_cost * 1000.0,
        output_cost_per_1k_tasks=per_episode_output_cost * 1000.0,
        currency=prices.currency,
        price=price,
        ci=ci,
        errors=len(errors),
        errors_by_side=dict(sorted(Counter(error_side(e) for e in errors).items())),
        collateral_writes=sum(collateral.values()),
        episodes_with_collateral=sum(bool(r.collateral) for r in records),
        collateral_by_target=dict(sorted(collateral.items())),
        per_task=outcomes,
        created_at=datetime.now(UTC),
    )
