"""`select_tasks`: one origin (suite or dataset), one selection rule, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpa.api.v1alpha1 import TaskGenerator, TaskSource
from qpa.contract import write_tasks
from qpa.data.tasks import TaskSelectionError, limit_tasks, select_tasks
from qpa.envs.sandbox.suite import generate_suite
from qpa.store import open_store
from qpa.store.manifest import DatasetManifest, Lineage, ManifestFile, write_manifest

SUITE = generate_suite()
TRAIN = [t for t in SUITE if t.split == "train"]


def suite(**fields: object) -> TaskSource:
    return TaskSource.model_validate({"generator": {}, **fields})


def test_filters_apply_to_the_generated_suite() -> None:
    chosen = select_tasks(suite(split="validation", domains=["email", "maps"]))
    assert chosen and {t.split for t in chosen} == {"validation"}
    assert {t.domain for t in chosen} == {"email", "maps"}
    assert len(select_tasks(suite())) == len(SUITE)


def test_capabilities_keep_tasks_exercising_any_of_them() -> None:
    chosen = select_tasks(suite(split="train", capabilities=["memory", "subagent"]))
    expected = [t for t in TRAIN if {"memory", "subagent"} & set(t.capabilities)]
    assert [t.id for t in chosen] == [t.id for t in expected]
    assert len(chosen) < len(TRAIN)


def test_limit_takes_tasks_round_robin_across_domains_in_origin_order() -> None:
    chosen = select_tasks(suite(split="train", limit=13))
    assert len({t.domain for t in chosen}) == 13  # the suite's 13 domains, one each
    order = {t.id: i for i, t in enumerate(SUITE)}
    assert [order[t.id] for t in chosen] == sorted(order[t.id] for t in chosen)
    assert limit_tasks(TRAIN[:5], 10) == TRAIN[:5]


def test_task_ids_select_and_an_unknown_id_is_named() -> None:
    ids = [TRAIN[3].id, TRAIN[0].id]
    assert [t.id for t in select_tasks(suite(task_ids=ids))] == [TRAIN[0].id, TRAIN[3].id]
    with pytest.raises(TaskSelectionError, match=r"source\.taskIds: .*nope"):
        select_tasks(suite(task_ids=[TRAIN[0].id, "nope"]))


def test_an_empty_selection_is_an_error_naming_the_source() -> None:
    with pytest.raises(TaskSelectionError, match="no task of suite mobilepa"):
        select_tasks(suite(domains=["no-such-domain"]))
    with pytest.raises(TaskSelectionError, match=r"source\.generator\.suite: unknown suite"):
        select_tasks(TaskSource(generator=TaskGenerator(suite="nope")))


def test_a_dataset_origin_gets_the_same_rule(tmp_path: Path) -> None:
    file = tmp_path / "tasks.jsonl"
    write_tasks(file, TRAIN[:40])
    source = TaskSource(dataset_uri=file.as_uri(), limit=5, domains=[TRAIN[0].domain])
    expected = limit_tasks([t for t in TRAIN[:40] if t.domain == TRAIN[0].domain], 5)
    assert select_tasks(source) == expected


def test_a_dataset_prefix_reads_task_rows_or_its_lineage(tmp_path: Path) -> None:
    store = open_store(tmp_path / "tasks")
    store.put_bytes(
        "part-0.jsonl", b"".join(t.model_dump_json().encode() + b"\n" for t in TRAIN[:3])
    )
    entry = ManifestFile(key="part-0.jsonl", sha256="0" * 64, size=1, rows=3)
    write_manifest(store, "", DatasetManifest(name="t", kind="tasks", files=[entry]))
    rows = select_tasks(TaskSource(dataset_uri=(tmp_path / "tasks").as_uri()))
    assert [t.id for t in rows] == [t.id for t in TRAIN[:3]]

    sft = open_store(tmp_path / "sft")
    named = Lineage.for_tasks([TRAIN[7].id, TRAIN[2].id])
    write_manifest(sft, "", DatasetManifest(name="s", kind="sft", files=[], lineage=named))
    chosen = select_tasks(TaskSource(dataset_uri=(tmp_path / "sft").as_uri()))
    assert [t.id for t in chosen] == [TRAIN[2].id, TRAIN[7].id]
