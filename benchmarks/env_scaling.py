"""Sandbox cost against world size: copy-on-write worlds against a deep-copy baseline.

Run: `.venv/bin/python benchmarks/env_scaling.py [--quick] [--clock cpu] [--per-tool]
[--factors 10 1000]` (a few minutes; prints a table and, as its last line, a JSON object for the
largest world; asserts nothing). `--clock cpu` times steps/s in this process's CPU time (the
machine's other load does not inflate it); `--per-tool` also prints each read tool's steady
time per call at each size.

The world: one phone with the apps the episode uses (contacts, messaging, email, calendar,
shop, notes, music), the worlds of the first test task that has each merged: the small world.
Sizes are multiples of the median world of the `mobilepa` suite (2,508 bytes of JSON, 1x): the
small world as it is, then filled with near-duplicates (`qpa.envs.sandbox.profiles`, the
`phone` profile's filler at a scale) to about 10x, 100x and 1000x (2.5 MB). At each size, in
this one run:

- qpa (`SandboxEnv`): reset on the same task (the world's frozen base is built once, cached;
  its build time is printed apart), verification after an episode of reads and two writes,
  steps/s on read calls (lookups by id, searches, list pages across the apps, with full
  argument validation; after one warm round, the median of five timed blocks), and memory
  per live session (tracemalloc over 50 live sessions, each reset and run through the
  episode, divided by 50);
- the baseline, as tau-bench does it: reset = `copy.deepcopy` of the world; the same tool
  methods on that plain copy (argument validation included, apps scanning lists as before);
  verification = replay the episode's actions on a fresh deep copy and compare the two
  states' hashes (sorted-key JSON, sha256); memory per session = what one deep copy holds.
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qpa.contract import Check, Finish, Task, ToolCall, VerifierSpec
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.engine import DEFAULT_START, World
from qpa.envs.sandbox.profiles import fill_world
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import generate_suite

FACTORS = (10, 100, 1000)
MEDIAN_WORLD_BYTES = 2508  # median JSON size of a mobilepa task's world (`qpa tasks stats`)
APPS = ("contacts", "messaging", "email", "calendar", "shop", "notes", "music")


def merged_task() -> Task:
    """One task whose world has the episode's apps: of each, the first test task's world."""
    world: dict[str, Any] = {}
    for task in generate_suite():
        for app in APPS:
            if task.split == "test" and app not in world and task.world.get(app):
                world[app] = task.world[app]
    apps = list(APPS)
    checks = [
        Check(name="a text was sent", op="exists", target="messaging.messages",
              where={"sender": "me", "text__icontains": "benchmark run"}),
        Check(name="the note has the line", op="exists", target="notes.notes",
              where={"body__icontains": "benchmark note"}),
    ]  # fmt: skip
    return Task(
        id="bench.env_scaling",
        domain="bench",
        capabilities=["tool_use"],
        instruction="Benchmark world.",
        seed=7,
        apps=apps,
        tools=[n for a in apps for n in all_apps()[a].bound_tools],
        world=world,
        verifier=VerifierSpec(checks=checks),
    )


def world_at(task: Task, factor: int) -> Task:
    """`task` with its world filled to about `factor` times the median world's JSON size."""
    want = factor * MEDIAN_WORLD_BYTES
    scale = 1.0
    for _ in range(8):  # the filler is about linear in its scale: a few secant steps
        fresh = orjson.loads(orjson.dumps(task.world))
        state = fill_world(task, fresh, scale=scale, profile="phone")
        got = len(orjson.dumps(state))
        if abs(got - want) / want < 0.08:
            break
        scale *= want / got
    return task.model_copy(update={"world": state, "id": f"{task.id}.x{factor}"})


def episode(state: dict[str, Any]) -> list[ToolCall]:
    """Read calls across the apps (ids and queries taken from the world), then two writes."""
    calls: list[ToolCall] = []

    def first(app: str, collection: str) -> dict[str, Any]:
        rows = state.get(app, {}).get(collection) or [{}]
        return dict(rows[len(rows) // 2])

    contact = first("contacts", "contacts")
    email = first("email", "messages")
    event = first("calendar", "events")
    product = first("shop", "products")
    note = first("notes", "notes")
    track = first("music", "catalog")
    if contact:
        calls += [
            ToolCall(tool="contacts_get", arguments={"contact_id": contact["id"]}),
            ToolCall(tool="contacts_search", arguments={"query": contact["name"].split()[0]}),
        ]
    if email:
        calls += [
            ToolCall(tool="email_get", arguments={"message_id": email["id"]}),
            ToolCall(tool="email_list", arguments={"limit": 20}),
        ]
    if event:
        calls += [
            ToolCall(tool="calendar_get_event", arguments={"event_id": event["id"]}),
            ToolCall(
                tool="calendar_list_events", arguments={"date_from": "2026-03-02", "limit": 20}
            ),
        ]
    if product:
        calls.append(ToolCall(tool="shop_get_product", arguments={"product_id": product["id"]}))
    if note:
        calls += [
            ToolCall(tool="notes_get", arguments={"note_id": note["id"]}),
            ToolCall(tool="notes_list_folders", arguments={}),
        ]
    if track:
        calls.append(ToolCall(tool="music_get_track", arguments={"track_id": track["id"]}))
    calls.append(ToolCall(tool="messaging_list_threads", arguments={"limit": 20}))
    if email:  # text searches: a word of the message's subject, of a text message
        words = email.get("subject", "").split()
        if words:
            calls.append(ToolCall(tool="email_search", arguments={"query": words[0]}))
    text = first("messaging", "messages").get("text", "")
    if text.split():
        calls.append(ToolCall(tool="messaging_search", arguments={"text": text.split()[0]}))
    reads = calls
    writes = [
        ToolCall(tool="messaging_send", arguments={"to": "+1-555-0199", "text": "benchmark run"}),
    ]
    if note:
        writes.append(
            ToolCall(
                tool="notes_append", arguments={"note_id": note["id"], "text": "benchmark note"}
            )
        )
    return [*reads, *writes]


def usable(task: Task, calls: list[ToolCall]) -> list[ToolCall]:
    """The calls this world answers without an error (a tool the merged world lacks is out)."""
    env = SandboxEnv()
    env.reset(task)
    tools = all_tools()
    return [c for c in calls if c.tool in tools and env.step(c).status == "ok"]


# --------------------------------------------------------------------------- baseline


class DeepCopyEnv:
    """tau-bench's way: a deep copy of the world per reset, tools mutating it in place,
    verification by replaying the actions on a fresh copy and comparing state hashes."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.apps = all_apps()
        self.tools = all_tools()
        world = {k: v for k, v in task.world.items() if not k.startswith("_")}
        w = World(world, task.user, DEFAULT_START)
        for name in task.apps:
            self.apps[name](w)  # the apps' defaults, once
        self.pristine = w.state
        self.reset()

    def reset(self) -> None:
        self.state = copy.deepcopy(self.pristine)
        self.world = World(self.state, self.task.user, DEFAULT_START)
        self.instances = {name: self.apps[name](self.world) for name in self.task.apps}
        self.actions: list[ToolCall] = []

    def step(self, call: ToolCall) -> Any:
        bound = self.tools[call.tool]
        parsed = bound.args_model.model_validate(call.arguments)
        self.world.tick()
        self.actions.append(call)
        result = bound.method(self.instances[bound.app.name], **parsed.__dict__)
        return orjson.loads(orjson.dumps(result))

    def verify(self) -> bool:
        replay = DeepCopyEnv.__new__(DeepCopyEnv)
        replay.task, replay.apps, replay.tools, replay.pristine = (
            self.task, self.apps, self.tools, self.pristine,
        )  # fmt: skip
        replay.reset()
        for call in self.actions:
            replay.step(call)
        return _hash(replay.state) == _hash(self.state)


def _hash(state: Any) -> str:
    return hashlib.sha256(orjson.dumps(state, option=orjson.OPT_SORT_KEYS)).hexdigest()


# --------------------------------------------------------------------------- measures


def _ms(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def per_tool(task: Task, reads: list[ToolCall], clock: Any, n: int = 50) -> dict[str, float]:
    """Each read call's steady time (µs, median of `n` after one warm call) in one session."""
    env = SandboxEnv()
    env.reset(task)
    out: dict[str, float] = {}
    for call in reads:
        env.step(call)
        times = []
        for _ in range(n):
            env._steps = 0
            t0 = clock()
            env.step(call)
            times.append(clock() - t0)
        out[call.tool] = statistics.median(times) * 1e6
    return out


def alternating(
    small: tuple[Task, list[ToolCall]], large: tuple[Task, list[ToolCall]], clock: Any, blocks: int
) -> tuple[float, float]:
    """Steps/s on the read calls of the small and the large world, measured in alternating
    blocks (small, large, small, ...) so that the machine's load weighs on both alike: the
    median block rate of each."""
    sessions = []
    for task, calls in (small, large):
        env = SandboxEnv()
        env.reset(task)
        reads = [c for c in calls if all_tools()[c.tool].spec.side_effect == "read"]
        for call in reads:  # warm
            env.step(call)
        sessions.append((env, reads))
    rates: list[list[float]] = [[], []]
    for _ in range(blocks):
        for k, (env, reads) in enumerate(sessions):
            t0 = clock()
            for _ in range(10):
                for call in reads:
                    env.step(call)
                env._steps = 0
            rates[k].append(10 * len(reads) / (clock() - t0))
    return statistics.median(rates[0]), statistics.median(rates[1])


def measure(task: Task, calls: list[ToolCall], quick: bool, clock: Any) -> dict[str, float]:
    reads = [c for c in calls if all_tools()[c.tool].spec.side_effect == "read"]
    n = 5 if quick else 15
    # qpa
    env = SandboxEnv()
    t0 = time.perf_counter()
    env.reset(task)  # builds and caches the base
    build_ms = (time.perf_counter() - t0) * 1000
    reset_ms = _ms(lambda: env.reset(task), n * 4)

    def run_episode() -> None:
        env.reset(task)
        for call in calls:
            env.step(call)
        env.step(Finish())

    run_episode()
    verify_ms = _ms(env.verify, n)
    assert env.verify().success, "the episode must satisfy its check"
    rounds = 20 if quick else 60
    blocks = 5
    env.reset(task)
    for call in reads:  # one warm round: a session's first reads build nothing twice
        env.step(call)
    rates = []
    for _ in range(blocks):
        t0 = clock()
        for _ in range(rounds // blocks):
            for call in reads:
                env.step(call)
            env._steps = 0  # stay under the step budget: this measures tool calls only
        rates.append((rounds // blocks) * len(reads) / (clock() - t0))
    steps_per_s = statistics.median(rates)
    sessions = 50
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    live = []
    for _ in range(sessions):
        one = SandboxEnv()
        one.reset(task)
        for call in calls:
            one.step(call)
        live.append(one)
    session_bytes = (tracemalloc.get_traced_memory()[0] - before) / sessions
    tracemalloc.stop()
    overlay_bytes = live[0].session_bytes()
    del live
    # baseline
    base = DeepCopyEnv(task)
    b_reset_ms = _ms(base.reset, n)
    base.reset()
    for call in calls:
        base.step(call)
    b_verify_ms = _ms(base.verify, max(3, n // 3))
    assert base.verify()
    base.reset()
    brounds = max(2, rounds // 10) if len(orjson.dumps(task.world)) > 500_000 else rounds
    t0 = clock()
    for _ in range(brounds):
        for call in reads:
            base.step(call)
    b_steps = brounds * len(reads) / (clock() - t0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = copy.deepcopy(base.pristine)
    b_session_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del held
    return {
        "build_ms": build_ms,
        "reset_ms": reset_ms,
        "verify_ms": verify_ms,
        "steps_per_s": steps_per_s,
        "session_bytes": session_bytes,
        "overlay_bytes": overlay_bytes,
        "baseline_reset_ms": b_reset_ms,
        "baseline_verify_ms": b_verify_ms,
        "baseline_steps_per_s": b_steps,
        "baseline_session_bytes": b_session_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="steps/s and per-tool times in wall time or in this process's CPU time",
    )
    parser.add_argument("--per-tool", action="store_true", help="print each read tool's time")
    parser.add_argument(
        "--factors",
        type=int,
        nargs="+",
        default=list(FACTORS),
        help="world sizes after the small world, as multiples of the median world",
    )
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    small = merged_task()
    rows = []
    worlds = []
    for factor in (0, *args.factors):
        task = small if factor == 0 else world_at(small, factor)
        calls = usable(task, episode(task.world))
        worlds.append((task, calls))
        size = len(orjson.dumps(task.world))
        row = {"factor": round(size / MEDIAN_WORLD_BYTES), "world_bytes": size, "calls": len(calls)}
        row.update(measure(task, calls, args.quick, clock))
        rows.append(row)
        if args.per_tool:
            reads = [c for c in calls if all_tools()[c.tool].spec.side_effect == "read"]
            times = per_tool(task, reads, clock)
            row["per_tool_us"] = times  # type: ignore[assignment]
            print("       " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)
        print(
            f"{row['factor']:>5}x {row['world_bytes']:>10,} B | qpa reset {row['reset_ms']:.4f} ms "
            f"verify {row['verify_ms']:.3f} ms {row['steps_per_s']:>8,.0f} steps/s "
            f"{row['session_bytes'] / 1024:>7.1f} KiB/session (overlay {row['overlay_bytes']:,} B; "
            f"base built once in {row['build_ms']:.0f} ms) | baseline reset "
            f"{row['baseline_reset_ms']:.3f} ms verify {row['baseline_verify_ms']:.2f} ms "
            f"{row['baseline_steps_per_s']:>8,.0f} steps/s "
            f"{row['baseline_session_bytes'] / 1024:>8.1f} KiB/session",
            flush=True,
        )
    last = rows[-1]
    small_alt, large_alt = alternating(worlds[0], worlds[-1], clock, 10 if args.quick else 30)
    print(
        f"alternating blocks: small world {small_alt:,.0f} steps/s, largest {large_alt:,.0f} "
        f"steps/s, ratio {small_alt / large_alt:.2f}",
        flush=True,
    )
    summary = {
        "world_bytes": last["world_bytes"],
        "reset_ms": round(last["reset_ms"], 4),
        "verify_ms": round(last["verify_ms"], 4),
        "steps_per_s": round(last["steps_per_s"]),
        "small_world_steps_per_s": round(rows[0]["steps_per_s"]),
        "steps_ratio": round(rows[0]["steps_per_s"] / last["steps_per_s"], 2),
        "alternating_small_steps_per_s": round(small_alt),
        "alternating_steps_per_s": round(large_alt),
        "alternating_steps_ratio": round(small_alt / large_alt, 2),
        "clock": args.clock,
        "baseline_reset_ms": round(last["baseline_reset_ms"], 3),
        "baseline_verify_ms": round(last["baseline_verify_ms"], 3),
        "baseline_steps_per_s": round(last["baseline_steps_per_s"]),
        "session_bytes": round(last["session_bytes"]),
        "baseline_session_bytes": round(last["baseline_session_bytes"]),
        "reset_speedup": round(last["baseline_reset_ms"] / last["reset_ms"], 1),
        "verify_speedup": round(last["baseline_verify_ms"] / last["verify_ms"], 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
