"""qpa.bench.stats against hand-computed values."""

from __future__ import annotations

import math

import pytest

from qpa.bench.stats import (
    McNemar,
    binomial_two_sided_p,
    bootstrap_interval,
    mcnemar_exact,
    paired_bootstrap,
    pass_at_k,
    wilson_interval,
)


def test_wilson_14_of_60_matches_the_formula_by_hand() -> None:
    # p = 14/60, z^2 = 3.8416: centre = (p + z^2/120) / (1 + z^2/60) = 0.24938,
    # half = 1.96 * sqrt(p(1-p)/60 + z^2/14400) / (1 + z^2/60) = 0.10499.
    low, high = wilson_interval(14, 60)
    assert low == pytest.approx(0.14439, abs=1e-5)
    assert high == pytest.approx(0.35437, abs=1e-5)


def test_wilson_edges_are_exact_and_inside_the_unit_interval() -> None:
    assert wilson_interval(0, 60) == (0.0, pytest.approx(3.8416 / (60 + 3.8416)))
    low, high = wilson_interval(60, 60)
    assert high == 1.0
    assert low == pytest.approx(60 / (60 + 3.8416))
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_narrows_with_n_and_widens_with_z() -> None:
    small = wilson_interval(5, 20)
    large = wilson_interval(50, 200)
    assert large[1] - large[0] < small[1] - small[0]
    wide = wilson_interval(5, 20, z=2.576)
    assert wide[0] < small[0] and wide[1] > small[1]


@pytest.mark.parametrize(
    ("successes", "n", "z"), [(-1, 10, 1.96), (11, 10, 1.96), (1, -1, 1.96), (1, 2, 0.0)]
)
def test_wilson_rejects_bad_input(successes: int, n: int, z: float) -> None:
    with pytest.raises(ValueError):
        wilson_interval(successes, n, z)


def test_mcnemar_b3_c0_gives_p_one_quarter() -> None:
    result = mcnemar_exact([True, True, True, False], [False, False, False, False])
    assert result == McNemar(b=3, c=0, n=4, p_value=0.25)


def test_mcnemar_b13_c3() -> None:
    # 2 * (C(16,0) + C(16,1) + C(16,2) + C(16,3)) / 2^16 = 2 * 697 / 65536
    before = [True] * 13 + [False] * 3 + [True] * 10 + [False] * 20
    after = [False] * 13 + [True] * 3 + [True] * 10 + [False] * 20
    result = mcnemar_exact(before, after)
    assert (result.b, result.c, result.n) == (13, 3, 46)
    assert result.p_value == pytest.approx(2 * 697 / 65536)
    assert result.p_value == pytest.approx(0.0213, abs=1e-4)
    assert mcnemar_exact(after, before).p_value == result.p_value


def test_mcnemar_without_discordant_pairs_is_one() -> None:
    assert mcnemar_exact([True, False], [True, False]).p_value == 1.0
    assert mcnemar_exact([], []).p_value == 1.0


def test_mcnemar_rejects_unpaired_outcomes() -> None:
    with pytest.raises(ValueError, match="before has 2, after has 1"):
        mcnemar_exact([True, False], [True])


def test_binomial_two_sided_p_is_capped_at_one() -> None:
    assert binomial_two_sided_p(2, 4) == 1.0  # 2 * (1 + 4 + 6) / 16 > 1
    assert binomial_two_sided_p(0, 1) == 1.0
    assert binomial_two_sided_p(0, 5) == pytest.approx(2 / 32)


def test_pass_at_k_matches_chen_et_al() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(10, 8, 5) == 1.0
    assert pass_at_k(4, 0, 2) == 0.0


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_input(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_bootstrap_interval_brackets_the_mean_and_is_deterministic() -> None:
    values = [1.0] * 14 + [0.0] * 46
    low, high = bootstrap_interval(values)
    assert low < 14 / 60 < high
    assert (low, high) == bootstrap_interval(values)
    assert bootstrap_interval([0.5, 0.5]) == (0.5, 0.5)
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_interval([])


def test_paired_bootstrap_of_a_consistent_gain_excludes_zero() -> None:
    before = [0.0] * 20 + [1.0] * 20
    after = [1.0] * 20 + [1.0] * 20
    mean, low, high = paired_bootstrap(before, after)
    assert mean == pytest.approx(0.5)
    assert 0.0 < low <= mean <= high
    with pytest.raises(ValueError, match="before has 1, after has 2"):
        paired_bootstrap([0.0], [0.0, 1.0])


def test_bench_report_markdown_shows_wilson_intervals() -> None:
    from qpa.bench.report import render_markdown, wilson
    from qpa.bench.scoring import score
    from qpa.contract import Policy, Task, Trajectory, Verification

    policy = Policy(planner="oracle", model="m", harness_version="h1")
    trajectories = []
    for i in range(60):
        task = Task(
            id=f"t{i:02d}",
            split="test",
            domain="calendar",
            capabilities=["tool_use"],
            instruction="do it",
        )
        ok = i < 14
        trajectories.append(
            Trajectory(
                id=f"t{i:02d}#0",
                task=task,
                policy=policy,
                verification=Verification(done=True, success=ok, progress=float(ok)),
            )
        )
    report = score(trajectories)
    assert wilson(report.overall, report.episodes) == wilson_interval(14, 60)
    text = render_markdown(report)
    assert "| 95% CI (Wilson, 60 episodes) | 14.4% to 35.4% |" in text
    assert "| tool_use | 23.3% |" in text and "14.4% to 35.4% | 60 | 60 |" in text
