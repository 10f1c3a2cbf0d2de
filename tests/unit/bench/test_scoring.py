"""Scoring: every number of `report.json` from hand-made trajectories with known answers."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from qpa.bench.scoring import (
    EpisodeRecord,
    ModelPrice,
    PriceTable,
    PriceTableError,
    Report,
    bootstrap_interval,
    error_side,
    load_price_table,
    pass_at_k,
    pass_hat_k,
    score,
)
from qpa.contract import Policy, Task, Totals, Trajectory, Verification

POLICY = Policy(planner="openai", model="planner-27b", harness_version="h1")


def traj(
    task_id: str,
    sample: int = 0,
    *,
    success: bool = True,
    progress: float | None = None,
    capabilities: tuple[str, ...] = ("tool_use",),
    domain: str = "email",
    difficulty: int = 2,
    turns: int = 4,
    tool_calls: int = 3,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    error: str | None = None,
    policy: Policy = POLICY,
    split: str = "test",
) -> Trajectory:
    task = Task(
        id=task_id,
        split=split,
        domain=domain,
        capabilities=list(capabilities),
        difficulty=difficulty,
        instruction="do it",
    )
    return Trajectory(
        id=f"{task_id}#{sample}",
        task=task,
        policy=policy,
        sample=sample,
        verification=Verification(
            done=True,
            success=success,
            progress=progress if progress is not None else (1.0 if success else 0.0),
        ),
        totals=Totals(
            turns=turns,
            tool_calls=tool_calls,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        ),
        error=error,
    )


# --------------------------------------------------------------------------- estimators


def brute_force(n: int, c: int, k: int, all_of: bool) -> float:
    """Exact probability over every k-subset of n samples of which c succeeded."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    hits = sum((all(s) if all_of else any(s)) for s in subsets)
    return hits / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_pass_at_k_and_pass_hat_k_match_the_combinatorial_definition(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert math.isclose(pass_at_k(n, c, k), brute_force(n, c, k, all_of=False))
            assert math.isclose(pass_hat_k(n, c, k), brute_force(n, c, k, all_of=True))
    with pytest.raises(ValueError):
        pass_at_k(n, 0, n + 1)


def test_bootstrap_interval_is_reproducible_and_brackets_the_mean() -> None:
    values = [1.0] * 70 + [0.0] * 30
    first = bootstrap_interval(values, stream="overall")
    assert first == bootstrap_interval(values, stream="overall")
    assert first.low < 0.7 < first.high
    assert 0.05 < first.high - first.low < 0.25
    wide = bootstrap_interval(values[::10], stream="overall")
    assert wide.high - wide.low > first.high - first.low
    assert bootstrap_interval([1.0] * 20).model_dump(include={"low", "high"}) == {
        "low": 1.0,
        "high": 1.0,
    }


# --------------------------------------------------------------------------- score


def sample_run() -> list[Trajectory]:
    return [
        # t1: memory+skills, 2/2
        traj("t1", 0, capabilities=("memory", "skills"), domain="email", completion_tokens=100),
        traj("t1", 1, capabilities=("memory", "skills"), domain="email", completion_tokens=300),
        # t2: tool_use, 1/2
        traj("t2", 0, domain="maps", difficulty=3, completion_tokens=200, prompt_tokens=1000),
        traj(
            "t2",
            1,
            domain="maps",
            difficulty=3,
            success=False,
            progress=0.5,
            turns=10,
            tool_calls=9,
            completion_tokens=400,
            error="harness: turn budget of 10 exhausted",
        ),
        # t3: subagent+tool_use, 0/2
        traj(
            "t3",
            0,
            capabilities=("tool_use", "subagent"),
            domain="maps",
            success=False,
            error="environment: RemoteEnvError: gone",
        ),
        traj("t3", 1, capabilities=("tool_use", "subagent"), domain="maps", success=False),
    ]


def test_score_computes_every_field() -> None:
    report = score(sample_run(), samples=2)
    assert (report.suite, report.split, report.policy) == ("mobilepa", "test", POLICY)
    assert (report.samples, report.tasks, report.episodes) == (2, 3, 6)
    assert report.complete and report.missing_episodes == 0 and report.expected_tasks == 3
    assert math.isclose(report.overall, (1.0 + 0.5 + 0.0) / 3)
    caps = report.by_capability
    assert list(caps) == ["tool_use", "memory", "skills", "subagent"]  # canonical order
    assert math.isclose(caps["tool_use"].success, 0.25) and caps["tool_use"].tasks == 2
    assert caps["memory"].success == 1.0 and caps["skills"].episodes == 2
    assert caps["subagent"].success == 0.0
    assert set(report.by_domain) == {"email", "maps"}
    assert math.isclose(report.by_domain["maps"].success, 0.25)
    assert set(report.by_difficulty) == {2, 3}
    assert math.isclose(report.mean_progress, (1.0 + 0.75 + 0.0) / 3)
    assert math.isclose(report.pass_at_k[1], report.overall)
    assert math.isclose(report.pass_at_k[2], (1 + 1 + 0) / 3)
    assert math.isclose(report.pass_hat_k[2], (1 + 0 + 0) / 3)
    assert math.isclose(report.turns, (4 * 5 + 10) / 6)
    assert math.isclose(report.tool_calls, (3 * 5 + 9) / 6)
    assert math.isclose(report.output_tokens_per_task, 1000 / 6)
    assert math.isclose(report.output_tokens_per_success, 1000 / 3)  # type: ignore[arg-type]
    assert report.errors == 2 and report.errors_by_side == {"environment": 1, "harness": 1}
    assert report.per_task["t2"].successes == 1 and report.per_task["t2"].samples == 2
    assert set(report.ci) == {"overall", "tool_use", "memory", "skills", "subagent"}
    assert report.ci["overall"].low <= report.overall <= report.ci["overall"].high


def test_cost_uses_the_price_table_by_exact_name_pattern_or_default() -> None:
    runs = sample_run()
    prompt, completion = 1000, 1000  # totals over 6 episodes
    table = PriceTable(
        default=ModelPrice(prompt_per_1m=1.0, completion_per_1m=2.0),
        models={
            "planner-*": ModelPrice(prompt_per_1m=10.0, completion_per_1m=20.0),
            "planner-2*": ModelPrice(prompt_per_1m=0.5, completion_per_1m=4.0),
        },
    )
    report = score(runs, table)
    assert report.price == ModelPrice(prompt_per_1m=0.5, completion_per_1m=4.0)  # longest match
    expected = (prompt * 0.5 + completion * 4.0) / 1e6 / 6 * 1000
    assert math.isclose(report.cost_per_1k_tasks, expected)
    assert math.isclose(report.output_cost_per_1k_tasks, completion * 4.0 / 1e6 / 6 * 1000)
    exact = PriceTable(models={"planner-27b": ModelPrice(prompt_per_1m=0, completion_per_1m=1)})
    assert score(runs, exact).price.completion_per_1m == 1
    assert score(runs).price == PriceTable().default  # documented default
    free = [traj("o1", policy=Policy(planner="oracle"))]
    assert score(free, table).cost_per_1k_tasks == 0.0  # no tokens, no cost


def test_missing_episodes_make_a_partial_report() -> None:
    runs = sample_run()[:-1]  # t3 sample 1 lost
    report = score(runs, samples=2)
    assert not report.complete and report.missing_episodes == 1
    assert report.per_task["t3"].samples == 1
    assert report.pass_at_k[2] == pytest.approx(1.0)  # only tasks with 2 samples count for k=2
    expected = score(runs, samples=2, expected_tasks=["t1", "t2", "t3", "t4"])
    assert expected.missing_episodes == 3 and expected.expected_tasks == 4
    assert expected.tasks == 3


def test_selection_extra_samples_and_duplicates() -> None:
    runs = [*sample_run(), traj("t1", 2, success=False), traj("other", 0)]
    report = score(runs, samples=2, expected_tasks=["t1", "t2", "t3"])
    assert report.tasks == 3 and report.episodes == 6 and "other" not in report.per_task
    # the last record of a (task, sample) pair wins
    report = score([traj("t1", 0, success=False), traj("t1", 0, success=True)])
    assert report.overall == 1.0 and report.episodes == 1
    # records and trajectories score the same
    assert score([EpisodeRecord.of(t) for t in sample_run()]).overall == score(sample_run()).overall


def test_score_refuses_nothing_and_mixtures() -> None:
    with pytest.raises(ValueError, match="no episodes"):
        score([])
    with pytest.raises(ValueError, match="policies"):
        score([traj("a"), traj("b", policy=Policy(planner="oracle"))])
    with pytest.raises(ValueError, match="splits"):
        score([traj("a"), traj("b", split="validation")])


def test_report_round_trips_through_json() -> None:
    report = score(sample_run())
    again = Report.model_validate_json(report.model_dump_json())
    assert again == report
    assert '"2":{' in report.model_dump_json()  # int keys become strings, and come back


def test_error_side() -> None:
    assert error_side("environment: RemoteEnvError: x") == "environment"
    assert error_side("harness: turn budget") == "harness"
    assert error_side("something odd") == "unknown"


def test_price_table_yaml(tmp_path: Path) -> None:
    good = tmp_path / "prices.yaml"
    good.write_text(
        "currency: EUR\nmodels:\n  m1: {prompt_per_1m: 1, completion_per_1m: 3}\n",
        encoding="utf-8",
    )
    table = load_price_table(good)
    assert table.currency == "EUR" and table.price_for("m1").completion_per_1m == 3
    assert table.price_for("other") == PriceTable().default
    assert load_price_table(None) == PriceTable()
    bad = tmp_path / "bad.yaml"
    for text, field in [
        ("models:\n  m1: {prompt_per_1m: -1, completion_per_1m: 3}\n", "models.m1.prompt_per_1m"),
        ("default: {prompt_per_1m: 1}\n", "default.completion_per_1m"),
        ("currenzy: USD\n", "currenzy"),
    ]:
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(PriceTableError, match=field.replace(".", r"\.")):
            load_price_table(bad)
    with pytest.raises(PriceTableError, match="cannot read"):
        load_price_table(tmp_path / "nope.yaml")
