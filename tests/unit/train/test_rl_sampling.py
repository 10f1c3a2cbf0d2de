"""Learnability-weighted RL task sampling (`qpa.train.rl.tasks`) and the trainer's drop-and-refill
of zero-variance groups (`RLTrainer._rollout_groups`), without a model: rollouts are stood in
by episodes whose success is fixed per task (easy: always, hard: never, mixed: half the time).
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from qpa.api.v1alpha1 import CareSettings, TaskSampling, TrainingRun, WorkOrder
from qpa.contract import Policy, Task, Trajectory, Verification
from qpa.train.care import Outcome, care_group, vanilla_group
from qpa.train.config import ConfigError
from qpa.train.rl import RLConfig, RLTrainer
from qpa.train.rl.generation import Episode
from qpa.train.rl.tasks import UNSEEN_PRIOR, LearnabilitySampler


def task(name: str) -> Task:
    return Task(id=name, domain="messaging", capabilities=["tool_use"], instruction=name)


EXAMPLE = Path(__file__).parents[3] / "examples" / "trainingrun.yaml"
POOL = [task(f"t{i}") for i in range(10)]


def sampler(**settings: Any) -> LearnabilitySampler:
    return LearnabilitySampler(POOL, TaskSampling(strategy="learnability", **settings), seed=3)


# --------------------------------------------------------------------------- the sampler


def test_weights_are_p_one_minus_p_plus_floor_and_unseen_tasks_get_the_prior() -> None:
    s = sampler(window=3, floor=0.05)
    assert s.success_rate("t0") == UNSEEN_PRIOR == 0.5
    assert s.weight("t0") == pytest.approx(0.25 + 0.05)
    s.record([("t1", 4, 4), ("t2", 0, 4), ("t3", 1, 4), ("t3", 3, 4)])
    assert s.success_rate("t1") == 1.0 and s.weight("t1") == pytest.approx(0.05)
    assert s.weight("t2") == pytest.approx(0.05)
    assert s.success_rate("t3") == pytest.approx(0.5)
    s.record([("t3", 4, 4), ("t3", 4, 4)])  # the window keeps the last 3: 3/4, 1, 1
    assert s.success_rate("t3") == pytest.approx((0.75 + 1 + 1) / 3)
    s.record([("t4", 0, 0)])  # a group with no trainable episode says nothing
    assert "t4" not in s.history


def test_draws_are_deterministic_in_seed_step_round_and_history() -> None:
    a, b = sampler(), sampler()
    assert [t.id for t in a.sample(4, step=7)] == [t.id for t in b.sample(4, step=7)]
    assert [t.id for t in a.sample(4, step=7, round_=1)] != [t.id for t in a.sample(4, step=7)]
    other = LearnabilitySampler(POOL, a.settings, seed=4)
    assert [t.id for t in other.sample(10, step=7)] != [t.id for t in a.sample(10, step=7)]
    b.record([("t0", 2, 2)])
    steps = range(20)
    assert [t.id for s in steps for t in a.sample(3, s)] != [
        t.id for s in steps for t in b.sample(3, s)
    ]


def test_without_replacement_excluding_what_the_step_rolled_out_then_wrapping() -> None:
    s = sampler()
    drawn = [t.id for t in s.sample(10, step=0)]
    assert sorted(drawn) == sorted(t.id for t in POOL)  # all distinct
    refill = [t.id for t in s.sample(3, step=0, round_=1, exclude={"t0", "t1", "t2"})]
    assert len(set(refill)) == 3 and not set(refill) & {"t0", "t1", "t2"}
    more = [t.id for t in s.sample(15, step=1)]
    assert len(more) == 15 and len(set(more[:10])) == 10
    # everything excluded: the whole pool again rather than nothing
    assert len(s.sample(2, step=2, exclude={t.id for t in POOL})) == 2


def test_draw_frequencies_follow_the_weights() -> None:
    """One task a draw: Efraimidis-Spirakis picks task i with probability w_i / sum(w)."""
    s = sampler(floor=0.02)
    s.record([(f"t{i}", 4, 4) for i in range(1, 10)])  # t0 unseen (0.27), others solved (0.02)
    counts = Counter(s.sample(1, step)[0].id for step in range(3000))
    expected = 0.27 / (0.27 + 9 * 0.02)
    assert counts["t0"] / 3000 == pytest.approx(expected, abs=0.03)
    assert all(counts[f"t{i}"] > 0 for i in range(1, 10))  # the floor: nothing starves


def test_state_round_trip() -> None:
    s = sampler(window=2)
    s.record([("t1", 1, 4), ("t1", 2, 4), ("t1", 3, 4), ("t5", 0, 4)])
    restored = sampler(window=2)
    restored.load_state(s.state())
    assert restored.state() == s.state() == {"history": {"t1": [0.5, 0.75], "t5": [0.0]}}
    assert [t.id for t in restored.sample(5, 9)] == [t.id for t in s.sample(5, 9)]


def test_a_group_is_dropped_only_when_its_rewards_are_all_equal() -> None:
    from qpa.train.rl.trainer import _signal

    care = CareSettings()
    failures = [Outcome(success=False, progress=p) for p in (0.0, 0.5, 0.0, 0.5)]
    same = [Outcome(success=False, progress=0.5)] * 4
    # all failed, but with different progress: CARE's progress shaping still teaches
    assert _signal(care_group(failures, care))
    assert not _signal(care_group(same, care))
    assert not _signal(vanilla_group(failures, care.model_copy(update={"enabled": False})))


# --------------------------------------------------------------------------- config


def config(**sampling: Any) -> RLConfig:
    return RLConfig.from_dict(
        {"model": "m", "tasks_per_step": 4, "samples_per_task": 4, "sampling": sampling}
    )


def test_config_accepts_the_settings_and_names_bad_fields() -> None:
    cfg = config(strategy="learnability", window=8, floor=0.1, refill_rounds=3)
    assert cfg.sampling == TaskSampling(
        strategy="learnability", window=8, floor=0.1, refill_rounds=3
    )
    assert config().sampling.strategy == "uniform"
    for bad, name in (
        ({"strategy": "greedy"}, "sampling.strategy"),
        ({"window": 0}, "sampling.window"),
        ({"floor": 0}, "sampling.floor"),
        ({"refill_rounds": -1}, "sampling.refill"),
    ):
        with pytest.raises(ConfigError, match=name):
            config(**bad)


def test_from_trainingrun_maps_spec_rl_sampling() -> None:
    doc = list(yaml.safe_load_all(EXAMPLE.read_text()))[1]
    assert doc["spec"]["stage"] == "rl"
    doc["spec"]["rl"]["sampling"] = {"strategy": "learnability", "window": 6, "refillRounds": 1}
    run = TrainingRun.model_validate(doc)
    order = WorkOrder.parse(
        {**run.to_k8s(), "resolved": {"rolloutPoolUrl": "http://pool:8080"}}, TrainingRun
    )
    cfg = RLConfig.from_trainingrun(order)
    assert cfg.sampling == TaskSampling(strategy="learnability", window=6, refill_rounds=1)
    doc["spec"]["rl"]["sampling"] = {"floor": 2}
    with pytest.raises(ValidationError, match="floor"):
        TrainingRun.model_validate(doc)


# --------------------------------------------------------------------------- drop and refill


SUCCESS = {"t0": (1, 1, 1, 1), "t1": (0, 0, 0, 0), "t2": (1, 0, 1, 0), "t3": (1, 1, 0, 1)}
"""Each task's k=4 outcomes: t0 always solved, t1 never, the others mixed; t4..t9 never."""


def fake_trainer(strategy: str, refill_rounds: int = 2, tasks_per_step: int = 4) -> RLTrainer:
    """An RLTrainer without a model: `rollout` returns episodes with SUCCESS's outcomes."""
    cfg = RLConfig.from_dict(
        {
            "model": "m",
            "tasks_per_step": tasks_per_step,
            "samples_per_task": 4,
            "sampling": {"strategy": strategy, "refill_rounds": refill_rounds},
            "care": {"enabled": False},
        }
    )
    trainer = RLTrainer.__new__(RLTrainer)
    trainer.config = cfg
    trainer.pool = list(POOL)
    trainer.sampler = (
        LearnabilitySampler(trainer.pool, cfg.sampling, cfg.seed)
        if strategy == "learnability"
        else None
    )
    trainer.rank, trainer.world_size = 0, 1
    trainer.rollouts = []  # type: ignore[attr-defined]

    def rollout(tasks: list[Task], *, step: int = 0, round_: int = 0) -> list[Episode]:
        trainer.rollouts.append([t.id for t in tasks])  # type: ignore[attr-defined]
        episodes = []
        for g, t in enumerate(tasks):
            for s, won in enumerate(SUCCESS.get(t.id, (0, 0, 0, 0))):
                trajectory = Trajectory(
                    id=f"{t.id}-{s}",
                    task=t,
                    policy=Policy(planner="harness"),
                    verification=Verification(done=True, success=bool(won), progress=won),
                )
                episodes.append(Episode(g, s, trajectory))
        return episodes

    trainer.rollout = rollout  # type: ignore[method-assign]
    return trainer


def test_learnability_drops_zero_variance_groups_and_refills_them() -> None:
    trainer = fake_trainer("learnability", refill_rounds=2, tasks_per_step=3)
    episodes, kept, metrics = trainer._rollout_groups(step=1)
    rounds = trainer.rollouts  # type: ignore[attr-defined]
    # every round rolls out as many tasks as the previous one dropped, never one twice a step
    assert len(rounds[0]) == 3
    for before, after in itertools.pairwise(rounds):
        dropped = sum(1 for t in before if t not in ("t2", "t3"))
        assert len(after) == dropped
    flat = [t for r in rounds for t in r]
    assert len(flat) == len(set(flat))
    # only the mixed tasks' groups reach the update
    assert sorted(m[0].trajectory.task.id for m, _ in kept) == ["t2", "t3"]
    assert all(any(a != 0 for a in result.advantages) for _, result in kept)
    assert len(episodes) == 4 * len(flat)
    assert metrics["groups_dropped"] == len(flat) - 2
    assert metrics["groups_refilled"] == len(flat) - 3
    # learnability of the groups rolled out: 0.25 for t2, 3/16 for t3, 0 for the rest
    assert metrics["mean_learnability"] == pytest.approx((0.25 + 3 / 16) / len(flat))
    # what the sampler learned: every rolled-out task's success share
    assert trainer.sampler is not None
    assert trainer.sampler.success_rate("t0") == 1.0
    assert trainer.sampler.success_rate("t3") == 0.75
    assert all(trainer.sampler.history[t] for t in flat)


def test_refill_rounds_bound_the_replacements() -> None:
    trainer = fake_trainer("learnability", refill_rounds=0)
    _, kept, metrics = trainer._rollout_groups(step=1)
    assert len(trainer.rollouts) == 1  # type: ignore[attr-defined]
    assert metrics["groups_refilled"] == 0
    assert metrics["groups_dropped"] == 4 - len(kept)
    trainer = fake_trainer("learnability", refill_rounds=1)
    _, _, metrics = trainer._rollout_groups(step=1)
    assert len(trainer.rollouts) <= 2  # type: ignore[attr-defined]
    assert metrics["refill_rounds"] <= 1


def test_uniform_keeps_every_group_as_before() -> None:
    trainer = fake_trainer("uniform")
    _, kept, metrics = trainer._rollout_groups(step=1)
    assert len(trainer.rollouts) == 1 and len(kept) == 4  # type: ignore[attr-defined]
    assert metrics["groups_dropped"] == metrics["groups_refilled"] == 0


def test_global_outcomes_place_each_rank_groups_in_its_slots() -> None:
    trainer = fake_trainer("learnability")
    trainer.rank, trainer.world_size = 1, 2
    trainer._all_reduce_sum = lambda values: values  # type: ignore[method-assign]
    episodes = trainer.rollout([POOL[0], POOL[2]])
    scored = trainer.score(episodes)
    # rank 1's groups 0 and 1 are the drawn tasks 1 and 3 of four
    assert trainer._global_outcomes(4, scored) == [
        (0, 0, False),
        (4, 4, False),
        (0, 0, False),
        (2, 4, True),
    ]


# --------------------------------------------------------------------------- the loop's RL


def test_loop_presets_carry_the_sampling_to_the_rl_config_and_the_trainingrun() -> None:
    from qpa.harness.agent import HarnessConfig
    from qpa.loop.cluster import cluster_resources
    from qpa.loop.presets import PRESET_NAMES, get_preset
    from qpa.loop.stages import rl_config

    local, long = get_preset("local"), get_preset("local-long")
    assert "local-long" in PRESET_NAMES and long.name == "local-long"
    assert long.budget_s <= 3600 and local.budget_s <= 900
    assert local.rl.sampling.strategy == long.rl.sampling.strategy == "learnability"
    episodes = [p.rl.steps * p.rl.tasks_per_step * p.rl.samples_per_task for p in (local, long)]
    assert episodes[1] >= 4 * episodes[0]
    # everything but the RL stage (and the budget) is the local preset's: same SFT, same sets
    same = {"name", "description", "budget_s", "rl"}
    assert local.model_dump(exclude=same) == long.model_dump(exclude=same)
    cfg = rl_config(Path("/tmp/rl"), long, Path("/tmp/model"), HarnessConfig(), seed=2)
    assert cfg.sampling == long.rl.sampling and cfg.steps == long.rl.steps
    cluster = get_preset("cluster")
    run = next(
        d
        for d in cluster_resources(cluster)
        if d["kind"] == "TrainingRun" and d["spec"]["stage"] == "rl"
    )
    assert run["spec"]["rl"]["sampling"] == cluster.rl.sampling.to_k8s()
    assert TrainingRun.model_validate(run).spec.rl is not None


# --------------------------------------------------------------------------- the learnable pool


def templated(name: str, template: str) -> Task:
    return task(name).model_copy(update={"template": template})


TEMPLATED = [
    templated(f"{t}{i}", t) for t in ("always", "half", "never", "unknown") for i in range(5)
]


def test_learnable_pool_shares_entries_by_validation_learnability() -> None:
    from qpa.train.rl.tasks import learnable_pool

    success = {"always": 1.0, "half": 0.5, "never": 0.0}
    pool = learnable_pool(TEMPLATED, success, size=60, seed=0)
    counts = Counter(t.template for t in pool)
    assert sum(counts.values()) == 60
    # weights 0.02, 0.27, 0.02 and 0.27 (no validation rate: p = 0.5)
    assert counts == {"always": 2, "half": 28, "never": 2, "unknown": 28}
    # every task of a template once before any twice
    halves = Counter(t.id for t in pool if t.template == "half")
    assert set(halves) == {f"half{i}" for i in range(5)}
    assert max(halves.values()) - min(halves.values()) <= 1
    assert [t.id for t in pool] == sorted(t.id for t in pool)
    assert learnable_pool(TEMPLATED, success, size=60, seed=0) == pool


def test_learnable_pool_refuses_an_empty_pool_or_size() -> None:
    from qpa.train.rl.tasks import learnable_pool

    with pytest.raises(ConfigError, match="no task"):
        learnable_pool([], {}, size=4, seed=0)
    with pytest.raises(ConfigError, match=r"round2\.target_size"):
        learnable_pool(TEMPLATED, {}, size=0, seed=0)
