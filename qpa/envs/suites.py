"""Task suites by name, whoever wrote them: the one place a suite's name becomes its tasks.

- `mobilepa` (and any other template suite): qpa's sandbox templates (`qpa.envs.sandbox.suite`).
- `device`: the phone tasks (`qpa.envs.device`).
- `agentdojo/<suite>` and `agentdojo/<suite>@<attack>`: AgentDojo's user tasks, alone or paired
  with its injection tasks under one attack (`qpa.envs.agentdojo`; the `benchmarks` extra).
- `bfcl/<category>`: BFCL v4 multi-turn (`qpa.envs.bfcl`; the `benchmarks` extra).

`suite_env_kind` says which environment kind plays a suite's tasks, so `qpa run`, `qpa bench
run` and `qpa collect` build the right one without special cases. Third-party suites have one
fixed task set: a suite seed other than the canonical one is refused for them.
"""

from __future__ import annotations

from qpa.contract import EnvKind, Task, WorldProfile
from qpa.envs.sandbox.suite import CANONICAL_SEED, generate_suite

AGENTDOJO_PREFIX = "agentdojo/"
BFCL_PREFIX = "bfcl/"


def suite_env_kind(name: str) -> EnvKind:
    """The environment kind that plays suite `name`."""
    if name.startswith(AGENTDOJO_PREFIX):
        return "agentdojo"
    if name.startswith(BFCL_PREFIX):
        return "bfcl"
    if name == "device":
        return "device"
    return "sandbox"


def is_third_party(name: str) -> bool:
    """Whether the suite is a public benchmark judged by its own checker."""
    return suite_env_kind(name) in ("agentdojo", "bfcl")


def load_suite(
    name: str, seed: int = CANONICAL_SEED, profile: WorldProfile = "default"
) -> tuple[Task, ...]:
    """Every task of suite `name`, all splits; `KeyError` with a readable message when unknown."""
    kind = suite_env_kind(name)
    if kind in ("agentdojo", "bfcl", "device"):
        if seed != CANONICAL_SEED:
            raise KeyError(f"suite {name!r} has one fixed task set: --seed must be 0, not {seed}")
        if profile != "default":
            raise KeyError(f"suite {name!r} has no world profiles: --world must be default")
    if kind == "agentdojo":
        from qpa.envs.agentdojo import agentdojo_tasks

        return agentdojo_tasks(name)
    if kind == "bfcl":
        from qpa.envs.bfcl import bfcl_tasks

        return bfcl_tasks(name.removeprefix(BFCL_PREFIX))
    if kind == "device":
        from qpa.envs.device import device_tasks

        return tuple(device_tasks())
    return generate_suite(name, seed, profile)


def third_party_suites() -> list[str]:
    """The public benchmarks' suite names without an attack (AgentDojo, BFCL)."""
    from qpa.envs.agentdojo.benchmark import SUITES as AGENTDOJO_SUITES
    from qpa.envs.bfcl import BFCL_CATEGORIES

    return [f"{AGENTDOJO_PREFIX}{s}" for s in AGENTDOJO_SUITES] + [
        f"{BFCL_PREFIX}{c}" for c in BFCL_CATEGORIES
    ]


def get_task(
    task_id: str,
    suite: str,
    seed: int = CANONICAL_SEED,
    profile: WorldProfile = "default",
) -> Task:
    """Task `task_id` of `suite`; `KeyError` naming both when there is none."""
    for task in load_suite(suite, seed, profile):
        if task.id == task_id:
            return task
    raise KeyError(f"no task {task_id!r} in suite {suite!r} (seed {seed})")
