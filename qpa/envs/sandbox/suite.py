"""Task suites from parametrised templates: deterministic, split-aware, collision-free.

A template is a function decorated with `@template(...)` in a module of
`qpa.envs.sandbox.templates`; it receives a `TaskGen` (seeded rng, faker, split) and returns the
task through `gen.task(...)`: instruction, world, checks, answer and a minimal reference plan.
`generate_suite(name, seed)` builds every split; the same seed always rebuilds the same suite,
and any other seed gives fresh variants whose ids and instructions never collide with the
canonical test split (which is never used for training or data generation).
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from qpa.contract import (
    Action,
    Capability,
    Check,
    MemoryItem,
    Split,
    Task,
    UserProfile,
    VerifierSpec,
    WorldProfile,
)
from qpa.envs.sandbox import templates as templates_package
from qpa.envs.sandbox.registry import all_apps
from qpa.envs.sandbox.worldgen import Faker

DEFAULT_SUITE = "mobilepa"
CANONICAL_SEED = 0
DEFAULT_COUNTS: dict[Split, int] = {"train": 10, "validation": 4, "test": 10}


@dataclass(frozen=True)
class TaskTemplate:
    name: str
    domain: str
    capabilities: tuple[Capability, ...]
    difficulty: int
    apps: tuple[str, ...]
    build: Callable[[TaskGen], Task]
    counts: dict[Split, int]
    suite: str = DEFAULT_SUITE


_TEMPLATES: dict[str, TaskTemplate] = {}


def template(
    *,
    domain: str,
    capabilities: list[Capability],
    apps: list[str],
    difficulty: int = 1,
    counts: dict[Split, int] | None = None,
    suite: str = DEFAULT_SUITE,
) -> Callable[[Callable[[TaskGen], Task]], Callable[[TaskGen], Task]]:
    """Register a task template (the function's name is the template's name)."""

    def register(fn: Callable[[TaskGen], Task]) -> Callable[[TaskGen], Task]:
        name = fn.__name__
        if name in _TEMPLATES:
            raise ValueError(f"duplicate template name {name!r}")
        _TEMPLATES[name] = TaskTemplate(
            name=name,
            domain=domain,
            capabilities=tuple(capabilities),
            difficulty=difficulty,
            apps=tuple(apps),
            build=fn,
            counts={**DEFAULT_COUNTS, **(counts or {})},
            suite=suite,
        )
        return fn

    return register


@dataclass
class TaskGen:
    """What a template gets: a seeded rng and faker, and `task(...)` to assemble the result."""

    template: TaskTemplate
    split: Split
    index: int
    seed: int
    task_id: str
    rng: random.Random = field(init=False)
    fake: Faker = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.fake = Faker(self.rng)

    def task(
        self,
        *,
        instruction: str,
        world: dict[str, dict[str, Any]],
        checks: list[Check],
        plan: list[Action],
        answer: str | None = None,
        answer_match: Literal["exact", "contains", "number", "all_of"] = "contains",
        memory: list[MemoryItem] | None = None,
        confirmations: list[str] | None = None,
        extra_apps: list[str] | None = None,
        difficulty: int | None = None,
    ) -> Task:
        tpl = self.template
        apps = list(dict.fromkeys([*tpl.apps, *(extra_apps or [])]))
        registry = all_apps()
        tools = [name for app in apps for name in registry[app].bound_tools]
        # Each task has its own user: memory seeded for one task never leaks into another.
        user = UserProfile(user_id="u-" + hashlib.sha256(self.task_id.encode()).hexdigest()[:12])
        return Task(
            id=self.task_id,
            user=user,
            suite=tpl.suite,
            split=self.split,
            domain=tpl.domain,
            capabilities=list(tpl.capabilities),
            difficulty=difficulty or tpl.difficulty,
            instruction=instruction,
            memory=memory or [],
            seed=self.seed,
            apps=apps,
            tools=tools,
            world=world,
            verifier=VerifierSpec(checks=checks, answer=answer, answer_match=answer_match),
            reference_plan=plan,
            confirmations=confirmations or [],
            source="template",
            template=tpl.name,
            lineage={"generator": "templates", "suite_seed": self.seed},
        )


@cache
def all_templates() -> dict[str, TaskTemplate]:
    for info in sorted(pkgutil.iter_modules(templates_package.__path__), key=lambda m: m.name):
        importlib.import_module(f"{templates_package.__name__}.{info.name}")
    return dict(sorted(_TEMPLATES.items()))


def _task_seed(suite_seed: int, template_name: str, split: str, index: int) -> int:
    digest = hashlib.sha256(f"{suite_seed}|{template_name}|{split}|{index}".encode()).digest()
    return int.from_bytes(digest[:6], "big")


def _task_id(tpl: TaskTemplate, split: str, index: int, suite_seed: int) -> str:
    base = f"{tpl.domain}.{tpl.name}.{split}.{index:03d}"
    return base if suite_seed == CANONICAL_SEED else f"{base}.s{suite_seed}"


def build_task(tpl: TaskTemplate, split: Split, index: int, suite_seed: int) -> Task:
    gen = TaskGen(
        template=tpl,
        split=split,
        index=index,
        seed=_task_seed(suite_seed, tpl.name, split, index),
        task_id=_task_id(tpl, split, index, suite_seed),
    )
    return tpl.build(gen)


@cache
def _canonical_test_instructions(suite: str) -> frozenset[str]:
    return frozenset(
        t.instruction for t in generate_suite(suite, CANONICAL_SEED) if t.split == "test"
    )


@cache
def generate_suite(
    suite: str = DEFAULT_SUITE, seed: int = CANONICAL_SEED, profile: WorldProfile = "default"
) -> tuple[Task, ...]:
    """Every task of the suite, all splits. Non-canonical seeds never reproduce a test task.

    At a `profile` other than the default the tasks are the same, their worlds filled to that
    profile (`qpa.envs.sandbox.profiles`), their ids suffixed with it (`....test.000.phone`)."""
    if profile != "default":
        return tuple(at_profile(t, profile) for t in generate_suite(suite, seed))
    tasks: list[Task] = []
    forbidden = frozenset() if seed == CANONICAL_SEED else _canonical_test_instructions(suite)
    for tpl in all_templates().values():
        if tpl.suite != suite:
            continue
        seen: set[str] = set()
        # Test first: a template with a small parameter space must never starve the test split.
        for split in ("test", "validation", "train"):
            index, made, attempts = 0, 0, 0
            while made < tpl.counts[split] and attempts < tpl.counts[split] * 20:
                attempts += 1
                task = build_task(tpl, split, index, seed)
                index += 1
                if task.instruction in forbidden or task.instruction in seen:
                    continue
                seen.add(task.instruction)
                tasks.append(task)
                made += 1
    if not tasks:
        raise KeyError(f"unknown suite {suite!r}")
    return tuple(tasks)


def at_profile(task: Task, profile: WorldProfile) -> Task:
    """`task` with its world filled to `profile` (built by the environment, from its seed)."""
    if profile == task.world_profile:
        return task
    base_id = task.id.removesuffix(f".{task.world_profile}")
    new_id = base_id if profile == "default" else f"{base_id}.{profile}"
    return task.model_copy(update={"world_profile": profile, "id": new_id})


def suite_names() -> list[str]:
    return sorted({t.suite for t in all_templates().values()})


def get_task(
    task_id: str,
    suite: str = DEFAULT_SUITE,
    seed: int = CANONICAL_SEED,
    profile: WorldProfile = "default",
) -> Task:
    for task in generate_suite(suite, seed, profile):
        if task.id == task_id:
            return task
    raise KeyError(f"no task {task_id!r} in suite {suite!r} (seed {seed})")
