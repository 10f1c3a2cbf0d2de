"""AgentDojo's tasks as qpa `Task`s: suites `agentdojo/<suite>` and `agentdojo/<suite>@<attack>`.

- `agentdojo/<suite>`: one task per user task, no attack (utility). Id
  `agentdojo.<suite>.<user_task>`.
- `agentdojo/<suite>@<attack>`: one task per (user task, injection task) pair, the attack's
  texts planted in the vectors the user task's ground truth reads (utility under attack, and
  whether the attacker's goal was reached). Id `agentdojo.<suite>.<attack>.<user_task>.<inj>`.

A task's world carries ids only (`world["_agentdojo"]`: suite, user task, injection task,
attack): the environment rebuilds the benchmark's state, injections and judges from the installed
package, so whoever resets an episode cannot bring a world or a judge of their own.

Splits are fixed by user task, so every pair of a user task is in one split: the first 8 hex
digits of sha256(`agentdojo/<suite>/<user_task>`) as a number modulo 10 give 0-5 train, 6-7
validation, 8-9 test. Reference plans are AgentDojo's ground truth (`ground_truth()` on the
task's own pre-environment) and a `finish` with its `GROUND_TRUTH_OUTPUT`. Payment tools the
user task's ground truth calls are the task's `confirmations`: AgentDojo has no confirmation
turn, so the request in the prompt is the user's consent.

Nine injection tasks ship no ground truth in 0.1.35 (workspace 6-13, travel 6): their goals
are still judged by `security()`, only no scripted attacker can play them
(`injection_plan` returns an empty list and `NO_INJECTION_PLAN` names them).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from typing import Any

from qpa.contract import Action, Finish, Split, Task, ToolCall
from qpa.envs.agentdojo import benchmark

WORLD_KEY = "_agentdojo"
SUITE_PREFIX = "agentdojo/"
#: The injection tasks without a ground truth in agentdojo 0.1.35.
NO_INJECTION_PLAN: frozenset[tuple[str, str]] = frozenset(
    {("workspace", f"injection_task_{n}") for n in range(6, 14)} | {("travel", "injection_task_6")}
)
_DIFFICULTY = {"EASY": 1, "MEDIUM": 2, "HARD": 3}


def split_of(suite_name: str, user_task: str) -> Split:
    """The fixed split of a user task (and of every pair built on it)."""
    digest = hashlib.sha256(f"agentdojo/{suite_name}/{user_task}".encode()).hexdigest()
    bucket = int(digest[:8], 16) % 10
    return "train" if bucket < 6 else "validation" if bucket < 8 else "test"


def parse_suite(name: str) -> tuple[str, str | None]:
    """`agentdojo/<suite>[@<attack>]` -> (suite, attack or None); KeyError naming what is wrong."""
    if not name.startswith(SUITE_PREFIX):
        raise KeyError(f"not an AgentDojo suite: {name!r} (agentdojo/<suite>[@<attack>])")
    rest = name.removeprefix(SUITE_PREFIX)
    suite_name, _, attack_name = rest.partition("@")
    if suite_name not in benchmark.SUITES:
        raise KeyError(
            f"unknown AgentDojo suite {suite_name!r} in {name!r} "
            f"(one of: {', '.join(benchmark.SUITES)})"
        )
    if attack_name and attack_name not in benchmark.ATTACKS:
        raise KeyError(
            f"unknown AgentDojo attack {attack_name!r} in {name!r} "
            f"(one of: {', '.join(benchmark.ATTACKS)})"
        )
    return suite_name, attack_name or None


def suite_names() -> list[str]:
    """The suites without an attack (with one: `agentdojo/<suite>@<attack>`)."""
    return [f"{SUITE_PREFIX}{s}" for s in benchmark.SUITES]


def _plain(value: Any) -> Any:
    """A ground-truth argument as JSON (dates as ISO text, models as dicts)."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def _calls(ground_truth: list[Any]) -> list[ToolCall]:
    return [ToolCall(tool=c.function, arguments=_plain(dict(c.args))) for c in ground_truth]


def _plan(suite_name: str, user_task: Any, planted: dict[str, str]) -> list[Action]:
    pre = user_task.init_environment(benchmark.environment(suite_name, planted))
    actions: list[Action] = list(_calls(user_task.ground_truth(pre)))
    actions.append(Finish(answer=user_task.GROUND_TRUTH_OUTPUT or None))
    return actions


def _task(suite_name: str, user_id: str, injection_id: str | None, attack: str | None) -> Task:
    s = benchmark.suite(suite_name)
    user_task = s.user_tasks[user_id]
    planted = (
        benchmark.injections(suite_name, user_id, injection_id, attack)
        if injection_id and attack
        else {}
    )
    plan = _plan(suite_name, user_task, planted)
    effects = benchmark.effects()[suite_name]
    payments = sorted(
        {a.tool for a in plan if isinstance(a, ToolCall) and effects.get(a.tool) == "payment"}
    )
    difficulty = _DIFFICULTY.get(user_task.DIFFICULTY.name, 2) + (1 if injection_id else 0)
    if injection_id and attack:
        task_id = f"agentdojo.{suite_name}.{attack}.{user_id}.{injection_id}"
        suite_label = f"{SUITE_PREFIX}{suite_name}@{attack}"
    else:
        task_id = f"agentdojo.{suite_name}.{user_id}"
        suite_label = f"{SUITE_PREFIX}{suite_name}"
    world = {
        WORLD_KEY: {
            "suite": suite_name,
            "user_task": user_id,
            "injection_task": injection_id,
            "attack": attack,
        }
    }
    return Task(
        id=task_id,
        suite=suite_label,
        split=split_of(suite_name, user_id),
        domain=suite_name,
        capabilities=["tool_use"],
        difficulty=min(difficulty, 5),
        instruction=user_task.PROMPT,
        apps=[suite_name],
        tools=[t.name for t in s.tools],
        world=world,
        reference_plan=plan,
        confirmations=payments,
        source="agentdojo",
        template=f"{suite_name}.{user_id}",
        lineage={
            "benchmark": "agentdojo",
            "version": benchmark.VERSION,
            "benchmark_version": benchmark.BENCHMARK_VERSION,
            "suite": suite_name,
            "user_task": user_id,
            "injection_task": injection_id,
            "attack": attack,
        },
    )


@functools.cache
def agentdojo_tasks(name: str) -> tuple[Task, ...]:
    """Every task of `agentdojo/<suite>` or `agentdojo/<suite>@<attack>`, in AgentDojo's order."""
    suite_name, attack = parse_suite(name)
    s = benchmark.suite(suite_name)
    users = sorted(s.user_tasks, key=lambda t: int(t.rsplit("_", 1)[1]))
    if attack is None:
        return tuple(_task(suite_name, u, None, None) for u in users)
    injections = sorted(s.injection_tasks, key=lambda t: int(t.rsplit("_", 1)[1]))
    return tuple(_task(suite_name, u, i, attack) for u in users for i in injections)


def injected_texts(task: Task) -> dict[str, str]:
    """The texts the task's attack plants (vector -> text); empty for a task with no attack."""
    ref = task.world.get(WORLD_KEY, {})
    if not ref.get("injection_task") or not ref.get("attack"):
        return {}
    return benchmark.injections(
        ref["suite"], ref["user_task"], ref["injection_task"], ref["attack"]
    )


def injection_plan(task: Task) -> list[ToolCall]:
    """The attacker's goal as calls (the injection task's ground truth), for a planner that obeys
    what it reads; empty when the task has no attack or the injection task ships none."""
    ref = task.world.get(WORLD_KEY, {})
    suite_name, injection_id = ref.get("suite"), ref.get("injection_task")
    if not suite_name or not injection_id:
        return []
    injection_task = benchmark.suite(suite_name).injection_tasks[injection_id]
    user_task = benchmark.suite(suite_name).user_tasks[ref["user_task"]]
    pre = user_task.init_environment(benchmark.environment(suite_name, injected_texts(task)))
    return _calls(injection_task.ground_truth(pre))
