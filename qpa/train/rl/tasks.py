"""The RL task pool: where tasks come from and which ones a step samples."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from qpa.contract import Task, read_tasks
from qpa.train.config import (
    ConfigError,
)
from qpa.train.rl.config import TaskSource


def load_tasks(source: TaskSource) -> list[Task]:
    """The task pool of `source` (filtered, in a stable order); raises if it is empty."""
    from qpa.envs.sandbox.suite import generate_suite

    suite_tasks: list[Task] | None = None

    def suite() -> list[Task]:
        nonlocal suite_tasks
        if suite_tasks is None:
            suite_tasks = list(generate_suite(source.suite, source.suite_seed))
        return suite_tasks

    wanted: set[str] = set(source.ids)
    if source.file:
        pool = _read_task_file(source.file)
    elif source.dataset:
        pool, named = _read_dataset_tasks(source.dataset)
        if named:
            wanted = wanted & named if wanted else named
            if not pool:
                pool = suite()
    else:
        pool = suite()
    tasks = [
        t
        for t in pool
        if (source.split is None or t.split == source.split)
        and (not wanted or t.id in wanted)
        and (not source.domains or t.domain in source.domains)
    ]
    if source.limit is not None:
        tasks = tasks[: source.limit]
    if not tasks:
        raise ConfigError("tasks: no task matches (check split, ids, domains, file, dataset)")
    return tasks


def _read_task_file(location: str) -> list[Task]:
    if "://" not in location:
        return list(read_tasks(location))
    import tempfile

    from qpa.store import open_object

    store, key = open_object(location)
    with tempfile.TemporaryDirectory() as tmp:
        local = store.get_file(key, Path(tmp) / "tasks.jsonl")
        return list(read_tasks(local))


def _read_dataset_tasks(location: str) -> tuple[list[Task], set[str]]:
    """(tasks held by the dataset, task ids its lineage names) of a dataset with a manifest."""
    import tempfile

    from qpa.store import open_store
    from qpa.store.manifest import read_manifest

    store = open_store(location if "://" in location else Path(location))
    manifest = read_manifest(store)
    tasks: list[Task] = []
    if manifest.kind == "tasks":
        with tempfile.TemporaryDirectory() as tmp:
            for index, item in enumerate(manifest.files):
                local = store.get_file(item.key, Path(tmp) / f"part-{index}.jsonl")
                tasks += list(read_tasks(local))
    return tasks, set(manifest.lineage.tasks)


def sample_tasks(pool: Sequence[Task], count: int, seed: int, step: int) -> list[Task]:
    """`count` tasks for `step`: a seeded shuffle of the pool per epoch, consumed in order.

    Step s takes positions [s*count, (s+1)*count) of the concatenated per-epoch shuffles, so
    every task is seen once per epoch and the sequence depends only on (pool, seed, step).
    """
    chosen: list[Task] = []
    n = len(pool)
    start = step * count
    for position in range(start, start + count):
        epoch, offset = divmod(position, n)
        order = list(range(n))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        chosen.append(pool[order[offset]])
    return chosen
