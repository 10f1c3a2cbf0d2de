"""Environment throughput and latency: in-process, over HTTP, against a plain-Python baseline.

Run: `.venv/bin/python benchmarks/env_throughput.py [--quick]` (about a minute; prints a table,
asserts nothing). What is measured, all in this one run on this machine:

- steps/s in-process on one core (the process pinned to one CPU), `SandboxEnv` with full
  argument validation, against a baseline in the same run: what a typical tool-use benchmark
  environment does (deepcopy of the world on reset, tool methods called directly with no
  argument validation, results as `json.dumps` strings);
- the same steps with the server's per-step work added (action parsed from JSON bytes,
  feedback serialized to JSON bytes): the in-process ceiling of the HTTP path;
- steps/s through `qpa env serve` on loopback (started here as a subprocess on a free port,
  pinned to another CPU when there is one), with one `RemoteEnv` client and with 16 concurrent
  sessions (16 threads, each its own `RemoteEnv`);
- reset and verification latency p50/p95 (in-process and over HTTP), the baseline's reset
  (deepcopy) and verification (replay the reference actions on a fresh copy, compare hashes);
- memory per live session: tracemalloc over 1000 live `SandboxEnv`s, each reset on a task.

Workload: the tasks of the canonical suite; an episode is reset, then the oracle's resolved
actions (Finish excluded) repeated to about 24 steps, then Finish. Steps/s counts every action
and divides by wall time *including* the resets, so it is a conservative number.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from qpa.contract import ACTION_ADAPTER, Action, Finish, MessageUser, Task, ToolCall
from qpa.envs.remote import RemoteEnv
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.engine import DEFAULT_START, App, World
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import dump_feedback
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

STEPS_PER_EPISODE = 24
MAX_EPISODES = 150  # the suite grows; the run time must not
Episode = tuple[Task, list[Action]]


# --------------------------------------------------------------------------- the baseline


class BaselineEnv:
    """A typical benchmark environment: deepcopy reset, direct calls, no argument validation."""

    def __init__(self) -> None:
        self.apps = all_apps()
        self.tools = all_tools()
        self.task: Task | None = None
        self.data: dict[str, Any] = {}
        self.instances: dict[str, App] = {}
        self.world: World | None = None
        self.finished = False

    def reset(self, task: Task) -> str:
        self.task = task
        self.finished = False
        self.data = copy.deepcopy({k: v for k, v in task.world.items() if not k.startswith("_")})
        start = task.world.get("_clock", {}).get("start", DEFAULT_START.isoformat())
        self.world = World(self.data, task.user, datetime.fromisoformat(start))
        names = dict.fromkeys([*task.apps, *(self.tools[t].app.name for t in task.tools)])
        self.instances = {name: self.apps[name](self.world) for name in names}
        return json.dumps({"tools": task.tools})

    def step(self, action: Action) -> str:
        assert self.world is not None
        self.world.tick()
        if isinstance(action, ToolCall):
            bound = self.tools[action.tool]
            try:
                result = bound.method(self.instances[bound.app.name], **action.arguments)
            except Exception as exc:
                return f"Error: {exc}"
            return json.dumps(result)
        if isinstance(action, MessageUser):
            self.data.setdefault("_user", {}).setdefault("messages", []).append(action.text)
            return json.dumps({"delivered": True})
        self.finished = True
        return json.dumps({"finished": True})

    def verify(self, reference: list[Action]) -> bool:
        """Replay the reference actions on a fresh copy and compare state hashes."""
        assert self.task is not None
        gold = BaselineEnv()
        gold.reset(self.task)
        for action in reference:
            gold.step(action)
        mine = hash(json.dumps(self.data, sort_keys=True, default=str))
        return mine == hash(json.dumps(gold.data, sort_keys=True, default=str))


# --------------------------------------------------------------------------- workload


def build_episodes(tasks: tuple[Task, ...], limit: int = MAX_EPISODES) -> list[Episode]:
    """Up to `limit` tasks spread over the suite, each with the oracle's resolved actions,
    padded by repetition to about 24 steps."""
    env = SandboxEnv()
    episodes = []
    for task in tasks[:: max(1, len(tasks) // limit)][:limit]:
        trajectory = run_episode(env, task, OraclePlanner())
        if not trajectory.success:
            continue
        body = [s.action for s in trajectory.steps if not isinstance(s.action, Finish)]
        if not body:
            continue
        repeats = max(1, (STEPS_PER_EPISODE - 1) // len(body))
        episodes.append((task, body * repeats + [Finish(answer=trajectory.answer)]))
    return episodes


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steps_per_second(run_once: Callable[[], int], seconds: float, repeats: int = 3) -> float:
    """Best of `repeats` windows of about `seconds` each (best-of damps machine noise)."""
    best = 0.0
    for _ in range(repeats):
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            steps += run_once()
        best = max(best, steps / (time.perf_counter() - started))
    return best


def qpa_round(env: SandboxEnv, episodes: list[Episode]) -> Callable[[], int]:
    def run() -> int:
        steps = 0
        for task, actions in episodes:
            env.reset(task)
            for action in actions:
                env.step(action)
            steps += len(actions)
        return steps

    return run


def qpa_json_round(env: SandboxEnv, episodes: list[Episode]) -> Callable[[], int]:
    """The server's per-step work without HTTP: parse the action from bytes, dump feedback."""
    wire = [(task, [ACTION_ADAPTER.dump_json(a) for a in actions]) for task, actions in episodes]
    validate = ACTION_ADAPTER.validate_json

    def run() -> int:
        steps = 0
        for task, actions in wire:
            env.reset(task)
            for raw in actions:
                dump_feedback(env.step(validate(raw)))
            steps += len(actions)
        return steps

    return run


def baseline_round(env: BaselineEnv, episodes: list[Episode]) -> Callable[[], int]:
    def run() -> int:
        steps = 0
        for task, actions in episodes:
            env.reset(task)
            for action in actions:
                env.step(action)
            steps += len(actions)
        return steps

    return run


def latencies_ms(fn: Callable[[], Any], count: int) -> list[float]:
    samples = []
    clock = time.perf_counter_ns
    for _ in range(count):
        t0 = clock()
        fn()
        samples.append((clock() - t0) / 1e6)
    return samples


def cycle(items: list[Any]) -> Iterator[Any]:
    while True:
        yield from items


def memory_per_session(make: Callable[[], Any], tasks: list[Task], count: int) -> float:
    """Bytes held per live environment, each reset on a task (tracemalloc, after warm-up)."""
    warm = make()
    warm.reset(tasks[0])
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    live = []
    for i in range(count):
        env = make()
        env.reset(tasks[i % len(tasks)])
        live.append(env)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del live
    return (after - before) / count


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def env_server(cpu: int | None) -> Iterator[str]:
    """`qpa env serve` in a subprocess on a free loopback port (pinned to `cpu` if given)."""
    qpa = Path(sys.executable).with_name("qpa")
    port = free_port()
    process = subprocess.Popen(
        [str(qpa), "env", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent,
    )
    if cpu is not None:
        os.sched_setaffinity(process.pid, {cpu})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"qpa env serve exited: {process.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                httpx.get(f"{base}/health", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("qpa env serve did not come up") from None
                time.sleep(0.05)
        yield base
    finally:
        process.terminate()
        process.wait(10)


def remote_round(env: RemoteEnv, episodes: list[Episode]) -> Callable[[], int]:
    def run() -> int:
        steps = 0
        for task, actions in episodes:
            env.reset(task)
            for action in actions:
                env.step(action)
            steps += len(actions)
        return steps

    return run


def concurrent_steps_per_second(base: str, episodes: list[Episode], sessions: int, seconds: float) -> float:
    """Total steps/s of `sessions` threads, each its own RemoteEnv (own session, own socket)."""
    barrier = threading.Barrier(sessions + 1)
    counts = [0] * sessions
    stop = threading.Event()

    def worker(i: int) -> None:
        with RemoteEnv(base) as env:
            mine = episodes[i % len(episodes) :] + episodes[: i % len(episodes)]
            env.reset(mine[0][0])  # connect before the clock starts
            barrier.wait()
            for task, actions in cycle(mine):
                if stop.is_set():
                    return
                env.reset(task)
                for action in actions:
                    env.step(action)
                counts[i] += len(actions)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(sessions)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    done = sum(counts)
    elapsed = time.perf_counter() - started
    stop.set()
    for thread in threads:
        thread.join(30)
    return done / elapsed


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows (noisier)")
    parser.add_argument(
        "--pin-server", action="store_true", help="pin the server to the last CPU (quiet machines)"
    )
    args = parser.parse_args()
    window = 0.6 if args.quick else 1.5
    began = time.perf_counter()

    cpus = sorted(os.sched_getaffinity(0))
    client_cpu = cpus[0]
    server_cpu = cpus[-1] if len(cpus) > 1 and args.pin_server else None
    os.sched_setaffinity(0, {client_cpu})  # in-process numbers are one core by construction

    tasks = generate_suite()
    episodes = build_episodes(tasks)
    steps_per_round = sum(len(a) for _, a in episodes)
    print(
        f"# {len(episodes)} episodes ({steps_per_round} steps per round) from {len(tasks)} tasks; "
        f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs; in-process on CPU {client_cpu}, "
        f"server on CPU {server_cpu if server_cpu is not None else 'any'}",
        flush=True,
    )

    # in-process steps/s: qpa and the baseline alternate, best of three windows each
    env, baseline = SandboxEnv(), BaselineEnv()
    qpa_steps = steps_per_second(qpa_round(env, episodes), window)
    base_steps = steps_per_second(baseline_round(baseline, episodes), window)
    qpa_steps = max(qpa_steps, steps_per_second(qpa_round(env, episodes), window, repeats=1))
    json_steps = steps_per_second(qpa_json_round(env, episodes), window)

    # reset latency
    ring = cycle([task for task, _ in episodes])
    reset_warm = latencies_ms(lambda: env.reset(next(ring)), 20_000 if not args.quick else 5_000)
    fresh = [SandboxEnv() for _ in range(2000)]
    pairs = iter(zip(fresh, cycle([task for task, _ in episodes]), strict=False))
    reset_cold = latencies_ms(lambda: (lambda e, t: e.reset(t))(*next(pairs)), len(fresh))
    base_reset = latencies_ms(lambda: baseline.reset(next(ring)), 5_000)

    # verification latency (after the episode's actions, as at the end of a rollout)
    verify_samples: list[float] = []
    base_verify: list[float] = []
    for task, actions in episodes:
        env.reset(task)
        baseline.reset(task)
        for action in actions:
            env.step(action)
            baseline.step(action)
        verify_samples += latencies_ms(env.verify, 50)
        base_verify += latencies_ms(lambda a=actions: baseline.verify(a), 3)  # type: ignore[misc]

    # memory per live session
    task_list = [task for task, _ in episodes]
    qpa_memory = memory_per_session(SandboxEnv, task_list, 1000)
    base_memory = memory_per_session(BaselineEnv, task_list, 1000)
    del fresh

    # over HTTP: the scheduler places client and server (pinning suffers from noisy neighbours)
    os.sched_setaffinity(0, cpus)
    with env_server(server_cpu) as base:
        with RemoteEnv(base) as remote:
            http_steps = steps_per_second(remote_round(remote, episodes), window * 2, repeats=2)
            http_reset = latencies_ms(lambda: remote.reset(next(ring)), 1000)
            http_verify = latencies_ms(remote.verify, 1000)
        http16 = concurrent_steps_per_second(base, episodes, 16, window * 3)

    def ms(samples: list[float]) -> str:
        return f"{percentile(samples, 0.5):.3f} / {percentile(samples, 0.95):.3f} ms"

    rows = [
        ("steps/s in-process, 1 core, full validation", f"{qpa_steps:,.0f}", f"{base_steps:,.0f}", ">= 50,000"),
        ("  + action from JSON, feedback to JSON", f"{json_steps:,.0f}", "", ""),
        ("steps/s over HTTP, 1 client (RemoteEnv)", f"{http_steps:,.0f}", "", ">= 2,000"),
        ("steps/s over HTTP, 16 concurrent sessions", f"{http16:,.0f}", "", ">= 2,000"),
        ("reset p50 / p95, in-process (warm cache)", ms(reset_warm), ms(base_reset), "<= 0.2 ms"),
        ("reset p50 / p95, in-process (first reset)", ms(reset_cold), "", ""),
        ("reset p50 / p95, over HTTP (task upload)", ms(http_reset), "", ""),
        ("verify p50 / p95, in-process", ms(verify_samples), ms(base_verify), "<= 1 ms"),
        ("verify p50 / p95, over HTTP", ms(http_verify), "", ""),
        ("memory per live session (1000 sessions)", f"{qpa_memory / 1024:,.1f} KiB", f"{base_memory / 1024:,.1f} KiB", "<= 1 MB"),
    ]
    widths = [max(len(r[i]) for r in [*rows, ("metric", "qpa", "baseline", "aim")]) for i in range(4)]
    header = ("metric", "qpa", "baseline (same run)", "aim")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))))
    print(line)
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print(line)
    print(
        f"# baseline: deepcopy reset, direct tool calls without argument validation, json.dumps "
        f"results; baseline verify replays the reference actions on a fresh copy and compares "
        f"state hashes. Total run time {time.perf_counter() - began:.0f}s."
    )


if __name__ == "__main__":
    main()
