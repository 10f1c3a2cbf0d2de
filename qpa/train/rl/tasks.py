"""The RL task pool (the `qpa.api` TaskSource, selected by `qpa.data.tasks.select_tasks`) and
which of its tasks a step samples.

Two strategies (`qpa.api.v1alpha1.TaskSampling.strategy`):

- `uniform` (`sample_tasks`): a seeded shuffle per epoch, consumed in order.
- `learnability` (`LearnabilitySampler`): a task's success rate p is the mean success share of
  its last `window` groups, its weight p(1-p) + `floor` (an unseen task counts as p = 0.5, the
  largest weight, so it is tried soon). p(1-p) is the variance of a group's success: a task the
  policy always or never solves gives GRPO no signal, one it solves half the time the most.

Every draw is a pure function of (pool, seed, step, round, history), and the history only ever
grows from outcomes every rank has (the trainer all-reduces them), so ranks agree on the tasks.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qpa.api.v1alpha1 import TaskSampling, TaskSource
from qpa.contract import Task
from qpa.train.config import (
    ConfigError,
)

#: The success rate assumed for a task with no group yet: p(1-p) is largest there.
UNSEEN_PRIOR = 0.5


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


def learnability(success_rate: float) -> float:
    """p(1-p): the variance of a group's success when each episode succeeds with p."""
    return success_rate * (1.0 - success_rate)


class LearnabilitySampler:
    """Learnability-weighted task draws over a pool, with the per-task outcome history.

    The history maps a task id to the success shares of its last `window` groups (copies of
    a task in the pool share one history; each copy is drawn on its own, so a task the mixture
    repeats keeps its extra weight).
    """

    def __init__(self, pool: Sequence[Task], settings: TaskSampling, seed: int) -> None:
        if not pool:
            raise ConfigError("tasks: the RL task pool is empty")
        self.pool = list(pool)
        self.settings = settings
        self.seed = seed
        self.history: dict[str, deque[float]] = {}

    # ------------------------------------------------------------------ estimates
    def success_rate(self, task_id: str) -> float:
        """The task's estimated success rate (`UNSEEN_PRIOR` before its first group)."""
        shares = self.history.get(task_id)
        return sum(shares) / len(shares) if shares else UNSEEN_PRIOR

    def learnability(self, task_id: str) -> float:
        """p(1-p) of the task's estimated success rate p."""
        return learnability(self.success_rate(task_id))

    def weight(self, task_id: str) -> float:
        return self.learnability(task_id) + self.settings.floor

    # ------------------------------------------------------------------ draws
    def sample(
        self, count: int, step: int, round_: int = 0, exclude: Iterable[str] = ()
    ) -> list[Task]:
        """`count` tasks for `step` (refill round `round_`), without replacement while the pool
        (less the task ids in `exclude`, those this step already rolled out) has enough; then
        the whole pool again. Weighted sampling without replacement by Efraimidis-Spirakis
        keys u^(1/w), seeded by (seed, step, round)."""
        rng = random.Random(f"learnability:{self.seed}:{step}:{round_}")
        skip = set(exclude)
        candidates = [i for i, task in enumerate(self.pool) if task.id not in skip]
        if not candidates:
            candidates = list(range(len(self.pool)))
        chosen: list[Task] = []
        while len(chosen) < count:
            keyed = sorted(
                candidates,
                key=lambda i: math.log(1.0 - rng.random()) / self.weight(self.pool[i].id),
                reverse=True,
            )
            chosen += [self.pool[i] for i in keyed[: count - len(chosen)]]
            candidates = list(range(len(self.pool)))
        return chosen

    # ------------------------------------------------------------------ history
    def record(self, outcomes: Iterable[tuple[str, float, float]]) -> None:
        """Add groups' outcomes as (task id, successes, episodes); empty groups are ignored."""
        for task_id, successes, episodes in outcomes:
            if episodes <= 0:
                continue
            shares = self.history.setdefault(task_id, deque(maxlen=self.settings.window))
            shares.append(successes / episodes)

    def state(self) -> dict[str, Any]:
        """The history as JSON (saved with a checkpoint, so a resumed run draws the same)."""
        return {"history": {k: list(v) for k, v in sorted(self.history.items())}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        window = self.settings.window
        self.history = {
            str(k): deque((float(x) for x in v), maxlen=window)
            for k, v in dict(state.get("history", {})).items()
        }


def learnable_pool(
    tasks: Sequence[Task],
    template_success: Mapping[str, float],
    size: int,
    seed: int,
    floor: float = 0.02,
) -> list[Task]:
    """An RL pool of `size` entries from `tasks`, each template's share in proportion to
    p(1-p) + `floor` of its success rate p on validation (`template_success`; a template
    without one counts as `UNSEEN_PRIOR`): the templates the policy solves sometimes get the
    draws, those it always or never solves few. Within a template its tasks are taken in a
    seeded shuffle, every task once before any twice. Shares are whole entries by largest
    remainder (`qpa.data.mix.apportion`); the result is sorted by task id (a pure function of
    the arguments)."""
    from qpa.data.mix import apportion

    if size < 1:
        raise ConfigError("round2.target_size: the RL pool needs at least one entry")
    by_template: dict[str, list[Task]] = {}
    for task in sorted(tasks, key=lambda t: t.id):
        by_template.setdefault(task.template or "", []).append(task)
    if not by_template:
        raise ConfigError("tasks: no task to build the RL pool from")
    names = sorted(by_template)
    weights = [learnability(template_success.get(n, UNSEEN_PRIOR)) + floor for n in names]
    pool: list[Task] = []
    for name, count in zip(names, apportion(size, weights, names, seed), strict=True):
        members = list(by_template[name])
        random.Random(f"learnable-pool:{seed}:{name}").shuffle(members)
        pool += [members[i % len(members)] for i in range(count)]
    return sorted(pool, key=lambda t: t.id)
