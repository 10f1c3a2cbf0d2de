"""TRL's own `GRPOTrainer` on qpa environments (`qpa.train.trl_grpo`), on the tiny model, on CPU.

Two real `GRPOTrainer.train()` runs: CARE (two steps, in `ScoredSandbox`, the real sandbox with a
stand-in verifier whose outcome depends on the episode's index, so groups differ and advantages
are not all zero: the weights must move, and TRL's advantages must be CARE's), and the plain
verification reward (one step, the real sandbox and its real verifier, spied on: TRL's rewards
must be what `verify()` returned). The rest checks the pieces without a model: the reward
mapping's identity (TRL's centring of the scaled CARE rewards is CARE's advantage), the packing
of turns into TRL's layout, and the refusals (wrong `scale_rewards`, unknown tasks, groups that
are not one task).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from trl import GRPOConfig  # noqa: E402

from qpa.api.v1alpha1 import CareSettings  # noqa: E402
from qpa.contract import Task, Verification  # noqa: E402
from qpa.envs.sandbox import SandboxEnv  # noqa: E402
from qpa.envs.sandbox.suite import generate_suite  # noqa: E402
from qpa.train.care import Outcome, care_group  # noqa: E402
from qpa.train.config import ConfigError  # noqa: E402
from qpa.train.rl import Turn  # noqa: E402
from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, suite_corpus  # noqa: E402
from qpa.train.trl_grpo import (  # noqa: E402
    CareReward,
    QpaRolloutSettings,
    build_grpo_trainer,
    pack_turns,
    task_dataset,
    task_id_of,
    task_prompt,
    verification_reward,
)

TINY = TinyConfig(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=8192,
)
PATTERN = (1.0, 1.0, 1.0, 1 / 3, 1.0, 0.0)
"""Progress of episode i (1.0 = success): with k=2 and two tasks a step holds an all-success
group and a mixed one, so CARE's anchor and its plain standardisation both show."""


class ScoredSandbox(SandboxEnv):
    """The sandbox with a stand-in verifier (a random tiny policy never solves a task)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def verify(self) -> Verification:
        progress = PATTERN[self.index % len(PATTERN)]
        return Verification(done=True, success=progress == 1.0, progress=progress)


class SpySandbox(SandboxEnv):
    """The real sandbox and its real verifier; every verification it gave is kept."""

    seen: list[Verification] = []

    def verify(self) -> Verification:
        result = super().verify()
        SpySandbox.seen.append(result)
        return result


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return make_tiny_checkpoint(out, TINY, corpus=suite_corpus(conversations=2))


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    return sorted(pool, key=lambda t: len(t.instruction))[:2]


def grpo_args(out: Path, steps: int, **overrides: Any) -> GRPOConfig:
    values: dict[str, Any] = {
        "output_dir": str(out),
        "per_device_train_batch_size": 4,  # 2 tasks x 2 generations per step
        "num_generations": 2,
        "max_completion_length": 8,
        "max_steps": steps,
        "learning_rate": 1e-2,
        "beta": 0.0,
        "scale_rewards": "none",
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
    }
    values.update(overrides)
    return GRPOConfig(**values)


SETTINGS = QpaRolloutSettings(
    harness={"token_budget": 100, "max_tools": 1, "max_turns": 2}, max_new_tokens=8
)


def test_care_grpo_two_steps(checkpoint: Path, tasks: list[Task], tmp_path: Path) -> None:
    """Two GRPOTrainer steps with CARE: the steps ran, the weights moved, and the advantages
    TRL trained on are CARE's, computed from the verification of qpa's episodes."""
    trainer, rollout = build_grpo_trainer(
        checkpoint,
        tasks,
        grpo_args(tmp_path / "care", 2),
        settings=SETTINGS,
        reward="care",
        environment=ScoredSandbox,
    )
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    failed = [t.error for t in rollout.trajectories if (t.error or "").startswith("environment:")]
    assert not failed, f"the sandbox failed its episodes: {failed}"
    assert trainer.state.global_step == 2
    assert rollout.calls == 2 and len(rollout.trajectories) == 8
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    assert all(h["rewards/qpa_care/mean"] == h["reward"] for h in logs)
    assert any(h["grad_norm"] > 0 for h in logs)
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # The last step: every episode verified by its environment (the pattern by episode index),
    # and TRL's advantages equal CARE's group by group (TRL keeps the last generation batch).
    records = rollout.records
    assert [r.trajectory.verification.progress for r in records] == [
        PATTERN[i % len(PATTERN)] for i in range(4, 8)
    ]
    expected: list[float] = []
    for start in (0, 2):
        group = [r.trajectory for r in records[start : start + 2]]
        assert len({t.task.id for t in group}) == 1
        expected += care_group(group, CareSettings()).advantages
    assert list(trainer._logs["advantages"]) == pytest.approx(expected, abs=1e-5)
    assert any(abs(a) > 0.1 for a in expected)
    # env_mask: the sampled tokens train, whatever lies between two packed turns does not
    for record in records:
        packed = record.packed
        sampled = [t for t in record.episode.turns if t.completion_ids]
        trained = sampled[: len(sampled) - packed.unpacked_turns]
        assert len(packed.env_mask) == len(packed.completion_ids)
        assert sum(packed.env_mask) == sum(len(t.completion_ids) for t in trained)
        assert packed.prompt_ids == sampled[0].prompt_ids


def test_verification_reward_is_the_sandbox_verifier(
    checkpoint: Path, tasks: list[Task], tmp_path: Path
) -> None:
    """One GRPOTrainer step with the plain reward, in the real sandbox: TRL's rewards are what
    the sandbox's verifier said about each episode (success 1.0, else 0.5 x progress)."""
    SpySandbox.seen = []
    trainer, rollout = build_grpo_trainer(
        str(checkpoint),
        tasks,
        grpo_args(tmp_path / "verify", 1, scale_rewards="group"),
        settings=SETTINGS,
        reward="verification",
        progress_weight=0.5,
        environment=lambda _index: SpySandbox(),
    )
    trainer.train()
    assert trainer.state.global_step == 1
    assert len(SpySandbox.seen) == 4
    by_trajectory = [r.trajectory.verification for r in rollout.records]
    assert sorted(v.progress for v in by_trajectory) == sorted(v.progress for v in SpySandbox.seen)
    expected = [1.0 if v.success else 0.5 * v.progress for v in by_trajectory]
    assert list(trainer._logs["rewards"]["qpa_verification"]) == pytest.approx(expected)
    assert any(value > 0 for value in expected)  # the verifier's partial credit, not a constant


# --------------------------------------------------------------------------- no model


def test_care_reward_centred_by_trl_is_care_advantage() -> None:
    outcomes = [
        Outcome(True, 1.0, 40, 3),
        Outcome(True, 1.0, 44, 3),
        Outcome(False, 0.5, 60, 5),
        Outcome(True, 1.0, 30, 2),
        Outcome(False, 0.0, 10, 1),
        Outcome(False, 0.25, 12, 1),
    ]
    care = CareSettings()
    reward = CareReward(care, 3)
    values = reward.group_values(
        [("a", o) for o in outcomes[:3]] + [("b", o) for o in outcomes[3:]]
    )
    for start in (0, 3):
        block = [v for v in values[start : start + 3] if v is not None]
        mean = sum(block) / len(block)
        centred = [v - mean for v in block]  # TRL's advantage with scale_rewards="none"
        assert centred == pytest.approx(care_group(outcomes[start : start + 3], care).advantages)
    # an environment failure is unscorable (None), and CARE scores the rest of its group
    values = reward.group_values([("a", outcomes[0]), ("a", None), ("a", outcomes[2])])
    assert values[1] is None
    kept = [v for v in values if v is not None]
    assert [v - sum(kept) / 2 for v in kept] == pytest.approx(
        care_group([outcomes[0], outcomes[2]], care).advantages
    )


def test_care_reward_reads_the_rollouts_well_formed_share() -> None:
    reward = CareReward(CareSettings(format_weight=0.1), 3)
    columns = {
        "prompts": [[]] * 3,
        "completions": [[]] * 3,
        "qpa_task_id": ["a"] * 3,
        "qpa_success": [False] * 3,
        "qpa_progress": [0.5] * 3,
        "qpa_output_tokens": [20] * 3,
        "qpa_tool_calls": [2] * 3,
        "qpa_env_failure": [False] * 3,
    }
    # without the column (older rollouts) every turn counts as parsed: one value, no signal
    assert len(set(reward(**columns))) == 1
    values = reward(**columns, qpa_well_formed=[0.0, 0.5, 1.0])
    assert values[0] is not None and values[1] is not None and values[2] is not None
    assert values[0] < values[1] < values[2]
    assert [r for g in reward.last_groups for r in g.rewards] == pytest.approx([0.4, 0.45, 0.5])


def test_care_reward_refuses_mixed_groups() -> None:
    reward = CareReward(CareSettings(), 2)
    with pytest.raises(ValueError, match="a group must be num_generations=2 samples of one task"):
        reward.group_values([("a", Outcome(True)), ("b", Outcome(False))])
    with pytest.raises(ValueError, match="not whole groups"):
        reward.group_values([("a", Outcome(True))] * 3)


def test_builder_refuses_settings_that_would_change_care(tasks: list[Task], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"scale_rewards: 'group'; reward 'care' with CARE on"):
        build_grpo_trainer("unused", tasks, grpo_args(tmp_path, 1, scale_rewards="group"))
    off = CareSettings(enabled=False)
    with pytest.raises(ConfigError, match=r"CARE off needs 'group'"):
        build_grpo_trainer("unused", tasks, grpo_args(tmp_path, 1), care=off)
    with pytest.raises(ValueError, match="reward_funcs: set by build_grpo_trainer"):
        build_grpo_trainer("unused", tasks, grpo_args(tmp_path, 1), reward_funcs=[])


def test_prompts_carry_their_task(tasks: list[Task]) -> None:
    dataset = task_dataset(tasks)
    assert dataset.column_names == ["prompt", "task_id", "domain", "capabilities", "difficulty"]
    assert [task_id_of(row["prompt"]) for row in dataset] == [t.id for t in tasks]
    assert task_prompt(tasks[0])[1] == {"role": "user", "content": tasks[0].instruction}
    with pytest.raises(ValueError, match="no system message 'qpa-task: '"):
        task_id_of([{"role": "user", "content": "hello"}])
    with pytest.raises(ValueError, match="appears 2 times"):
        task_dataset([tasks[0], tasks[0]])
    with pytest.raises(ValueError, match="progress_weight"):
        verification_reward(1.0)


def test_pack_turns_masks_feedback_and_counts_unpacked() -> None:
    first = Turn([1, 2, 3], [10, 11])
    second = Turn([1, 2, 3, 10, 11, 7, 8], [12])  # extends: 7, 8 are feedback
    stray = Turn([5, 6], [13])  # a sub-agent's own conversation: does not extend
    packed = pack_turns([first, second, stray], [9], 0)
    assert packed.prompt_ids == [1, 2, 3]
    assert packed.completion_ids == [10, 11, 7, 8, 12]
    assert packed.env_mask == [1, 1, 0, 0, 1]
    assert packed.unpacked_turns == 1
    empty = pack_turns([], [9, 9], 0)
    assert (empty.prompt_ids, empty.completion_ids, empty.env_mask) == ([9, 9], [0], [0])
