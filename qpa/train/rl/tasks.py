"""The RL task pool (the `qpa.api` TaskSource, selected by `qpa.data.tasks.select_tasks`) and
which of its tasks a step samples."""

from __future__ import annotations

import random
from collections.abc import Sequence

from qpa.api.v1alpha1 import TaskSource
from qpa.contract import Task
from qpa.train.config import (
    ConfigError,
)


def load_tasks(source: TaskSource) -> list[Task]:
    """The task pool of `source` (`qpa.data.tasks.select_tasks`: one origin, one selection);
    a source that cannot be read or selects nothing is a `ConfigError` naming it."""
    from qpa.data.tasks import select_tasks
    from qpa.store import StoreError

    try:
        return select_tasks(source)
    except (ValueError, StoreError) as exc:
        raise ConfigError(f"tasks: {exc}") from None


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
