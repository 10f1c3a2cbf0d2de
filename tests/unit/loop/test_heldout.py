"""The held-out sets (`make_heldout`, `task_content_hash`) and the eval/held-out preset settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from qpa.loop.presets import EvalSettings, HeldOutSettings, get_preset
from qpa.loop.stages import curriculum, make_heldout, task_content_hash


def test_heldout_sets_are_apart_from_training_and_each_other() -> None:
    preset = get_preset("small").model_copy(
        update={"heldout": HeldOutSettings(validation_per_template=3, test_per_template=5)}
    )
    training = curriculum(preset, "train")
    sets, summary = make_heldout(preset, training)
    assert {k: len(v) for k, v in sets.items()} == {"validation": 9, "test": 15}
    trained = {task_content_hash(t) for t in training}
    validation = {task_content_hash(t) for t in sets["validation"]}
    test = {task_content_hash(t) for t in sets["test"]}
    assert len(validation) == 9 and len(test) == 15
    assert not validation & test and not (validation | test) & trained
    assert {t.split for t in sets["test"]} == {"test"}
    assert all(t.source == "heldout" and ".s3" in t.id for t in sets["test"])
    assert summary["seed"] == 3 and summary["per_template"] == {"validation": 3, "test": 5}
    again, _ = make_heldout(preset, training)
    assert [t.id for t in again["test"]] == [t.id for t in sets["test"]]


def test_content_hash_ignores_identity_and_sees_the_answer() -> None:
    task = curriculum(get_preset("small"), "train")[0]
    renamed = task.model_copy(update={"id": "other", "split": "test", "seed": 7})
    assert task_content_hash(renamed) == task_content_hash(task)
    asked = task.model_copy(update={"instruction": task.instruction + " now"})
    assert task_content_hash(asked) != task_content_hash(task)


def test_removed_task_caps_keep_the_tasks_section_hash() -> None:
    tasks = get_preset("local").section("tasks")["tasks"]
    assert tasks["validation_per_template"] is None and tasks["test_per_template"] is None
    assert "heldout" not in get_preset("local").section("tasks")


def test_sampled_stages_must_be_eval_stages() -> None:
    with pytest.raises(ValidationError, match=r"eval\.sampled_stages: unknown rl"):
        EvalSettings(sampled_stages=["rl"])
    assert EvalSettings(samples=4, sampled_stages=["eval_rl"]).samples == 4
