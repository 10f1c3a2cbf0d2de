"""Statistics for success rates: intervals, a paired test, and pass@k.

Every report that states a success rate states its uncertainty with these, and every claim that
one stage beats another is a paired test on the same tasks:

- `wilson_interval(successes, n)`: the Wilson score interval of a binomial proportion (it stays
  inside [0, 1] and is sensible at 0/n and n/n, unlike the normal approximation);
- `mcnemar_exact(before, after)`: McNemar's exact test on paired outcomes of the same tasks,
  b = tasks only `before` solved, c = tasks only `after` solved, two-sided p from the binomial
  (b + c, 1/2) (the concordant pairs carry no information about the difference);
- `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. 2021 (n samples, c successes);
- `bootstrap_interval(values)`: a percentile bootstrap of a mean over tasks (e.g. pass@1 from k
  sampled episodes per task, where episodes of one task are not independent);
- `paired_bootstrap(before, after)`: a percentile bootstrap of the mean difference, resampling
  tasks (pairs) with replacement.

Exact math (`math.comb`, pure Python `random` with a fixed seed): the numbers are the same on
every machine and there is no scipy dependency.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from qpa.bench.scoring import pass_at_k as _pass_at_k
from qpa.bench.scoring import quantile

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


class McNemar(BaseModel):
    """McNemar's exact test on paired binary outcomes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    b: int = Field(ge=0, description="pairs that succeeded before and failed after")
    c: int = Field(ge=0, description="pairs that failed before and succeeded after")
    n: int = Field(ge=0, description="pairs compared")
    p_value: float = Field(ge=0.0, le=1.0, description="two-sided exact binomial p on b + c")
    test: str = "mcnemar_exact"


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of `successes` out of `n` (z = 1.96: 95%).

    n = 0 gives (0.0, 1.0): no data, no information.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    if z <= 0:
        raise ValueError(f"z must be > 0, got {z}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    # Exact bounds at the edges (the formula gives them up to rounding).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


def binomial_two_sided_p(k: int, n: int) -> float:
    """Two-sided exact binomial p of k successes in n trials at p = 1/2 (1.0 when n == 0).

    With p = 1/2 the distribution is symmetric, so the two-sided p is twice the smaller tail,
    capped at 1.
    """
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 1.0
    tail_k = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(tail_k + 1))
    # Integer arithmetic until the one division: exact for any n.
    return min(1.0, 2 * tail / 2**n)


def mcnemar_exact(before: Sequence[bool], after: Sequence[bool]) -> McNemar:
    """McNemar's exact test: `before[i]` and `after[i]` are the outcomes of the same task i."""
    if len(before) != len(after):
        raise ValueError(
            f"paired outcomes differ in length: before has {len(before)}, after has {len(after)}"
        )
    b = sum(1 for x, y in zip(before, after, strict=True) if x and not y)
    c = sum(1 for x, y in zip(before, after, strict=True) if y and not x)
    return McNemar(b=b, c=c, n=len(before), p_value=binomial_two_sided_p(b, b + c))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of P(at least one of k samples succeeds): `1 - C(n-c, k) / C(n, k)`.

    n samples of a task, c of them successes (Chen et al. 2021, "Evaluating Large Language
    Models Trained on Code"). pass@1 is c / n.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    return _pass_at_k(n, c, k)


def bootstrap_interval(
    values: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (one value per task)."""
    if not values:
        raise ValueError("bootstrap_interval needs at least one value")
    _check_level(level, resamples)
    n = len(values)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = (1.0 - level) / 2
    return (quantile(means, alpha), quantile(means, 1.0 - alpha))


def paired_bootstrap(
    before: Sequence[float],
    after: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float, float]:
    """(mean difference after - before, low, high): a percentile bootstrap over paired tasks."""
    if len(before) != len(after):
        raise ValueError(
            f"paired values differ in length: before has {len(before)}, after has {len(after)}"
        )
    if not before:
        raise ValueError("paired_bootstrap needs at least one pair")
    differences = [y - x for x, y in zip(before, after, strict=True)]
    low, high = bootstrap_interval(differences, level=level, resamples=resamples, seed=seed)
    return (sum(differences) / len(differences), low, high)


def _check_level(level: float, resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
