"""The tasks a `TaskSource` names: one origin (a generated suite or a dataset), one selection.

`select_tasks(source)` is what `qpa collect`, a TaskBatch's workers and RL use to turn the
`qpa.api` `TaskSource` into tasks:

- **Origin.** `generator`: `load_suite(suite, seed)` (qpa's templates, or a public benchmark:
  `agentdojo/...`, `bfcl/...`). `datasetUri`: a tasks JSON Lines file,
  or a dataset prefix holding a `manifest.json`: a `tasks` dataset's rows are the tasks; any
  other kind (SFT, trajectories) contributes the canonical suite's tasks its lineage names.
  A dataset whose review is pending or unpublished is refused (`GateClosed`, naming it and
  its state) unless its manifest records `gate: automatic` (`qpa.data.review.require_published`).
- **Filters.** `split`, `domains`, `capabilities` (a task exercising any of them) and `taskIds`,
  each off when unset or empty. A task id that is not in the origin is an error.
- **Limit.** At most `limit` tasks, taken round-robin across domains (each domain's tasks in
  origin order) so a small selection still covers every domain; the result keeps origin order.

An empty selection is an error naming the source, never an empty batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from qpa.api.v1alpha1 import TaskSource
from qpa.contract import CorruptLineError, Task
from qpa.data.review import require_published
from qpa.store import ArtifactNotFound, StoreConfig, open_object, open_store
from qpa.store.manifest import read_manifest


class TaskSelectionError(ValueError):
    """A task source that selects no task or names a task its origin does not hold."""


def select_tasks(source: TaskSource, store_config: StoreConfig | None = None) -> list[Task]:
    """The tasks of `source`, filtered and limited (see the module doc)."""
    origin = _origin(source, store_config)
    known = {task.id for task in origin}
    missing = [task_id for task_id in source.task_ids if task_id not in known]
    if missing:
        raise TaskSelectionError(
            f"source.taskIds: not in {_describe(source)}: {', '.join(missing[:10])}"
            + (f" (and {len(missing) - 10} more)" if len(missing) > 10 else "")
        )
    wanted = set(source.task_ids)
    capabilities = set(source.capabilities)
    chosen = [
        task
        for task in origin
        if (source.split is None or task.split == source.split)
        and (not source.domains or task.domain in source.domains)
        and (not capabilities or capabilities.intersection(task.capabilities))
        and (not wanted or task.id in wanted)
    ]
    if not chosen:
        raise TaskSelectionError(
            f"source: no task of {_describe(source)} matches "
            f"(split={source.split}, domains={source.domains or 'all'}, "
            f"capabilities={source.capabilities or 'all'}, "
            f"taskIds={len(source.task_ids) or 'all'})"
        )
    return limit_tasks(chosen, source.limit)


def limit_tasks(tasks: Sequence[Task], limit: int | None) -> list[Task]:
    """At most `limit` of `tasks`, round-robin across domains, in the given order."""
    if limit is None or limit >= len(tasks):
        return list(tasks)
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_domain[task.domain].append(task)
    queues = [list(reversed(by_domain[domain])) for domain in sorted(by_domain)]
    picked: set[str] = set()
    while len(picked) < limit:
        for queue in queues:
            if queue and len(picked) < limit:
                picked.add(queue.pop().id)
    return [task for task in tasks if task.id in picked]


def _describe(source: TaskSource) -> str:
    if source.generator is not None:
        return f"suite {source.generator.suite} (seed {source.generator.seed})"
    return str(source.dataset_uri)


def _origin(source: TaskSource, store_config: StoreConfig | None) -> list[Task]:
    from qpa.envs.suites import load_suite

    if source.generator is not None:
        try:
            return list(load_suite(source.generator.suite, source.generator.seed))
        except KeyError as exc:
            raise TaskSelectionError(f"source.generator.suite: {exc.args[0]}") from None
    assert source.dataset_uri is not None  # the model's rule: exactly one origin
    require_published(source.dataset_uri, store_config=store_config)  # the review gate
    return load_tasks(source.dataset_uri, store_config)


def load_tasks(location: str | Path, config: StoreConfig | None = None) -> list[Task]:
    """Tasks from a JSON Lines file or object (`tasks.jsonl`, `s3://b/p/tasks.jsonl`) or from a
    dataset prefix holding a `manifest.json` (see the module doc).

    Raises `ArtifactNotFound` naming the URI, or `CorruptLineError` naming URI and line.
    """
    text = str(location)
    store, key = open_object(text, config)
    try:
        return _parse_tasks(store.get_bytes(key), store.uri(key))
    except ArtifactNotFound:
        pass
    dataset = open_store(text, config)
    try:
        manifest = read_manifest(dataset)
    except ArtifactNotFound:
        raise ArtifactNotFound(store.uri(key), "no such tasks file or dataset") from None
    if manifest.kind != "tasks":
        return _named_tasks(manifest.lineage.tasks, dataset.uri("manifest.json"))
    tasks: list[Task] = []
    for entry in manifest.files:
        if entry.key.endswith(".jsonl"):
            tasks += _parse_tasks(dataset.get_bytes(entry.key), dataset.uri(entry.key))
    return tasks


def _named_tasks(ids: Sequence[str], where: str) -> list[Task]:
    """The canonical suite's tasks a dataset's lineage names (in suite order)."""
    from qpa.envs.sandbox.suite import generate_suite

    if not ids:
        raise TaskSelectionError(f"{where}: holds no tasks and its lineage names none")
    wanted = set(ids)
    return [task for task in generate_suite() if task.id in wanted]


def _parse_tasks(data: bytes, source: str) -> list[Task]:
    tasks: list[Task] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(Task.model_validate_json(line))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
            raise CorruptLineError(source, number, f"{where}: {first.get('msg')}") from None
    return tasks


__all__ = ["TaskSelectionError", "limit_tasks", "load_tasks", "select_tasks"]
