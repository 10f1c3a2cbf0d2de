"""Harness overhead per turn: everything the Harness does except the model's own time.

Runs the test split in one process, at the phone-scale world profile by default (hundreds of
contacts, thousands of messages: large JSON tool results), three ways:

- bare: the oracle planner straight against the sandbox (no prompt, no parsing, no adapter, no
  memory, no guard): the loop's own cost;
- today (the baseline, this same run): the full Harness as it was before its per-turn work was
  cut: each planner builds its Skill library, its adapter renders, counts and indexes the tools
  afresh (its caches lived and died with the planner, which a Harness builds per episode) and
  re-counts the whole exposure text, every tool call's arguments go through jsonschema, memory
  write-back splits every field name afresh at each comparison and gathers the registry's side
  effects per episode, and the provenance ledger splits each value's path afresh;
- now: the full Harness with the shared adapter caches, the fast argument check
  (`qpa.harness.argcheck`), the cached name splitting of write-back and the ledger, the
  adapter's remembered selections and relevance per (tool set, query terms, settings), and the
  ledger's facts (canonical form, digits) memoised per distinct string, a tool's cache key
  (name, description, app, canonical schema bytes) and its
  validators looked up once per tool object, and a trusted text's words and digit runs read
  once per distinct string.

`today` reverts every cache and memo above: it empties the adapter's before each episode (so
the "now" round after it starts with none, and its remembered selections, being per task, never
hit here: each task runs once per round), keys every tool and finds its validators by
content at every use (and empties those per-object memos before each episode, as it does the
trusted texts' memo), and reads each tool string's facts and each trusted text afresh. It
also reverts the third round's laziness: the ledger indexes every tool result as it is
recorded and searches each whole for every value (`provenance._lazy_results`), the guard works
out the request's scope and option words at the start of each episode
(`guard._lazy_checks`), and the per-tool-set renderings and header counts are emptied before
each episode. Not
reverted (inlined, so both runs have them): the ledger computing a tool value's canonical form
once instead of three times, precompiled digit patterns, write-back matching a field's name
before reading its value and reading each call's fields once, the ledger building a string's
`Origin` only when a trace returns one, BM25 scoring from postings, the raw model output
rendered only for a parse failure, the guard's choice scores taken from the instruction's own
relevance when its quoted text holds no term (relevance is a function of the query's terms),
the ledger reading the profile's fields without `model_dump`, a remembered exposure copied by
`model_construct`, a pseudo-tool found by name.

Both Harness runs drive a model backend that replays the plan (`OracleBackend`), whose own time
is measured and subtracted, as is the environment's. The two alternate in rounds, so machine
load falls on both alike. Aim: at most 0.5 ms per turn median.

The garbage collector's time is summed as it runs (`gc.callbacks`): a collection runs inside
whatever code allocates when a threshold is crossed, so the Harness is charged for collections
of what the environment allocated (a phone-profile world is rebuilt at reset when it fell out
of the environment's cache). The collector's time inside environment and backend calls goes
with them; "less GC" is the Harness's overhead without the collections that ran inside it, and
"GC in the Harness" those collections per turn.

    .venv/bin/python benchmarks/harness_overhead.py [--limit N] [--profile phone|default]
        [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from qpa.contract import Task, ToolCall, ToolSpec
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness import adapter as adapter_module
from qpa.harness import agent as agent_module
from qpa.harness import guard as guard_module
from qpa.harness import memory as memory_module
from qpa.harness import parsing, provenance
from qpa.harness.agent import HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.memory import MemoryStore
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode
from qpa.harness.skills import SkillLibrary

#: the clock of every measurement: wall time (`perf_counter`) or, with `--clock cpu`, this
#: process's CPU time (`process_time`), which other load on the machine does not inflate
CLOCK = time.perf_counter


class GcClock:
    """The time spent in Python's garbage collector (by `CLOCK`), summed as it runs: a
    collection runs inside whatever code allocates when a threshold is crossed, so part of
    what the Harness is charged is collecting what the environment's worlds allocated."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = CLOCK()
        else:
            self.seconds += CLOCK() - self._started


GC = GcClock()


class TimedBackend:
    """Wraps a backend and accumulates the time spent inside it (the 'model time')."""

    def __init__(self, inner: OracleBackend) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.gc_seconds = 0.0  # of `seconds`, in the garbage collector

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        t0, gc0 = CLOCK(), GC.seconds
        try:
            return self.inner.complete(messages, tools)
        finally:
            self.seconds += CLOCK() - t0
            self.gc_seconds += GC.seconds - gc0


class TimedEnv:
    """The sandbox with the time spent in each of its calls (reset and verify too) summed up:
    the environment's time, subtracted from the episode's."""

    def __init__(self, inner: SandboxEnv) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.seconds = 0.0
        self.gc_seconds = 0.0  # of `seconds`, in the garbage collector

    def _timed(self, name: str, *args: Any) -> Any:
        t0, gc0 = CLOCK(), GC.seconds
        try:
            return getattr(self.inner, name)(*args)
        finally:
            self.seconds += CLOCK() - t0
            self.gc_seconds += GC.seconds - gc0

    def reset(self, task: Task) -> Any:
        return self._timed("reset", task)

    def step(self, action: Any) -> Any:
        return self._timed("step", action)

    def verify(self) -> Any:
        return self._timed("verify")

    def tools(self) -> Any:
        return self._timed("tools")

    def close(self) -> None:
        self.inner.close()


@contextlib.contextmanager
def todays_harness() -> Iterator[None]:
    """The Harness's per-turn path before this change: no shared adapter caches (each
    planner starts empty, as each had its own), jsonschema for every call's arguments."""
    original = parsing._validator

    def jsonschema_only(spec: ToolSpec) -> tuple[Any, Any]:
        validator, _ = parsing._content_validator(spec)  # looked up by content at every call
        return validator, None

    estimate = adapter_module.estimate_tokens
    registry_skills = agent_module._registry_skills
    core, side_effects, leaf_key, facts = (
        memory_module._core,
        memory_module._side_effects,
        provenance._leaf_key,
        provenance._facts,
    )
    parsing._validator = jsonschema_only  # type: ignore[assignment]
    # the whole exposure text re-counted; the Skill library built per planner
    adapter_module.estimate_tokens = lambda text: estimate(text)  # type: ignore[assignment]
    agent_module._registry_skills = SkillLibrary.from_registry  # type: ignore[assignment]
    # memory write-back: field names split afresh at every comparison, the registry's side
    # effects gathered per episode; the ledger's leaf keys split per value
    memory_module._core = core.__wrapped__  # type: ignore[assignment]
    memory_module._side_effects = lambda tools: (  # type: ignore[assignment]
        side_effects(tools)
        if tools is not None
        else dict(memory_module._registry_side_effects.__wrapped__())
    )
    provenance._leaf_key = leaf_key.__wrapped__  # type: ignore[assignment]
    # the ledger reads each tool string's facts afresh (no memo per distinct string)
    provenance._facts = provenance.value_facts
    # the ledger indexes every tool result as it is recorded and searches each for every value
    provenance._lazy_results = False
    # the guard works out the request's scope and option words at the start of each episode
    guard_module._lazy_checks = False
    # each tool keyed by its content at every use; each trusted text read afresh
    tool_key, parts = adapter_module._tool_key, provenance._parts
    adapter_module._tool_key = adapter_module._content_key
    provenance._parts = provenance.text_parts
    try:
        yield
    finally:
        parsing._validator = original  # type: ignore[assignment]
        adapter_module.estimate_tokens = estimate  # type: ignore[assignment]
        agent_module._registry_skills = registry_skills  # type: ignore[assignment]
        memory_module._core = core  # type: ignore[assignment]
        memory_module._side_effects = side_effects  # type: ignore[assignment]
        provenance._leaf_key = leaf_key  # type: ignore[assignment]
        provenance._facts = facts
        provenance._lazy_results = True
        guard_module._lazy_checks = True
        adapter_module._tool_key = tool_key
        provenance._parts = parts


def forget_adapter_caches() -> None:
    for cache in (adapter_module._RENDERED, adapter_module._SKILLS_RENDERED,
                  adapter_module._INDICES, adapter_module._SKILL_INDICES,
                  adapter_module._SELECTIONS, adapter_module._RELEVANCE,
                  adapter_module._TOOL_KEYS, parsing._BY_OBJECT,
                  adapter_module._SET_RENDERED, adapter_module._HEADER_TOKENS):  # fmt: skip
        cache.clear()
    provenance._cached_text_parts.cache_clear()


Round = tuple[list[float], float, int, int, list[float], float]


def harness_round(
    sandbox: SandboxEnv, tasks: list[Task], memory: MemoryStore, *, today: bool
) -> Round:
    """Per-episode overhead per turn, total overhead seconds, turns and successes; then the
    per-episode overhead per turn less the garbage collector's time in it, and the collector's
    total seconds in the Harness."""
    per_turn: list[float] = []
    per_turn_less_gc: list[float] = []
    overhead_s, turns, successes, gc_s = 0.0, 0, 0, 0.0
    with todays_harness() if today else contextlib.nullcontext():
        for task in tasks:
            if today:
                forget_adapter_caches()
            backend = TimedBackend(OracleBackend(task))
            planner = HarnessPlanner(backend, memory=memory)
            env = TimedEnv(sandbox)
            t1, gc1 = CLOCK(), GC.seconds
            trajectory = run_episode(env, task, planner)  # type: ignore[arg-type]
            elapsed = CLOCK() - t1
            overhead = elapsed - backend.seconds - env.seconds
            collected = GC.seconds - gc1 - backend.gc_seconds - env.gc_seconds
            n = max(1, trajectory.totals.turns)
            turns += trajectory.totals.turns
            overhead_s += overhead
            gc_s += collected
            successes += bool(trajectory.success)
            per_turn.append(overhead / n)
            per_turn_less_gc.append((overhead - collected) / n)
    return per_turn, overhead_s, turns, successes, per_turn_less_gc, gc_s


def result_sizes(env: SandboxEnv, tasks: list[Task]) -> list[int]:
    """Bytes of each read call's JSON result along the reference plans (how big tool output is)."""
    sizes = []
    for task in tasks:
        env.reset(task)
        for action in task.reference_plan or []:
            feedback = env.step(action)
            if isinstance(action, ToolCall) and feedback.status == "ok":
                sizes.append(len(orjson.dumps(feedback.observation, default=str)))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--limit", type=int, default=200, help="tasks from the test split")
    parser.add_argument("--profile", default="phone", help="world profile (phone, default)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of each")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="wall time or process CPU time"
    )
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    tasks = [t for t in generate_suite(profile=args.profile) if t.split == "test"][: args.limit]
    env = SandboxEnv()
    memory = MemoryStore(":memory:")
    sizes = sorted(result_sizes(env, tasks))

    timed = TimedEnv(env)
    t0 = CLOCK()
    base_turns = sum(run_episode(timed, t, OraclePlanner()).totals.turns for t in tasks)  # type: ignore[arg-type]
    base_s = CLOCK() - t0 - timed.seconds

    harness_round(env, tasks[:20], memory, today=False)  # warm imports and the registries
    gc.callbacks.append(GC)
    runs: dict[str, list[Round]] = {"today": [], "now": []}
    for _ in range(args.rounds):
        for mode in ("today", "now"):
            runs[mode].append(harness_round(env, tasks, memory, today=mode == "today"))

    def best(mode: str) -> Round:
        return min(runs[mode], key=lambda r: statistics.median(r[0]))

    print(
        f"tasks: {len(tasks)} (test split, profile {args.profile}); tool results: median "
        f"{statistics.median(sizes) / 1024:.1f} KiB, p95 "
        f"{sizes[int(0.95 * (len(sizes) - 1))] / 1024:.1f} KiB, max {sizes[-1] / 1024:.1f} KiB"
    )
    print(f"{f'per turn, {args.clock} time (best of {args.rounds})':36}{'today':>12}{'now':>12}")
    today, now = best("today"), best("now")
    print(f"{'bare oracle loop (env excluded)':36}{base_s / base_turns * 1e3:>9.3f} ms")
    for label, pick in (
        ("Harness overhead (median episode)", lambda r: statistics.median(r[0])),
        ("Harness overhead (p95 episode)", lambda r: statistics.quantiles(r[0], n=20)[-1]),
        ("Harness overhead (mean)", lambda r: r[1] / max(1, r[2])),
        ("  less GC (median episode)", lambda r: statistics.median(r[4])),
        ("  GC in the Harness (mean)", lambda r: r[5] / max(1, r[2])),
    ):
        print(f"{label:36}{pick(today) * 1e3:>9.3f} ms{pick(now) * 1e3:>9.3f} ms")
    print(f"{'Harness successes':36}{today[3]:>12}{now[3]:>12}")
    print("aim: Harness overhead <= 0.5 ms per turn (median)")


if __name__ == "__main__":
    main()
