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
  sessions (16 threads, each its own `RemoteEnv`), over HTTP (today's path, the baseline) and
  over the session channel (`WS /channel`, what `RemoteEnv` uses when the server offers it),
  the two alternating in rounds so machine load falls on both alike; with the server's and the
  clients' CPU time per step (CPU time depends less on what else the machine runs);
- reset and verification latency p50/p95 (in-process and over HTTP), the baseline's reset
  (deepcopy) and verification (replay the reference actions on a fresh copy, compare hashes);
- memory per live session: tracemalloc over 1000 live `SandboxEnv`s, each reset on a task;
  the server's resident memory per live session (1000 sessions opened over HTTP); and what
  one long-lived session accumulates when reset on many distinct tasks.

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
def env_server(cpu: int | None) -> Iterator[tuple[str, int]]:
    """`qpa env serve` in a subprocess on a free loopback port (pinned to `cpu` if given);
    yields its URL and process id."""
    qpa = Path(sys.executable).with_name("qpa")
    port = free_port()
    process = subprocess.Popen(
        [str(qpa), "env", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent,
    )
    if cpu is not None:
        os.sched_setaffinity(process.pid, {cpu})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"qpa env serve exited with {process.returncode}")
            try:
                httpx.get(f"{base}/health", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("qpa env serve did not come up") from None
                time.sleep(0.05)
        yield base, process.pid
    finally:
        process.terminate()
        process.wait(10)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_request_us(pid: int, env: RemoteEnv, episodes: list[Episode]) -> tuple[float, float]:
    """Server and client CPU microseconds per request (steps and resets) over one round.

    CPU time, unlike wall time, hardly depends on what else the machine runs.
    """
    server0, client0, requests = process_cpu_s(pid), time.process_time(), 0
    for task, actions in episodes:
        env.reset(task)
        for action in actions:
            env.step(action)
        requests += 1 + len(actions)
    server = (process_cpu_s(pid) - server0) / requests * 1e6
    return server, (time.process_time() - client0) / requests * 1e6


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def server_rss_per_session(base: str, pid: int, tasks: list[Task], count: int) -> float:
    """Resident memory the server gains per live session (`count` resets, distinct sessions)."""
    bodies = [b'{"task":' + task.__pydantic_serializer__.to_json(task) + b"}" for task in tasks]
    with httpx.Client(base_url=base, timeout=30) as client:
        client.get("/health")
        before = rss_bytes(pid)
        ids = [
            client.post("/reset", content=bodies[i % len(bodies)]).json()["session_id"]
            for i in range(count)
        ]
        after = rss_bytes(pid)
        for session_id in ids:
            client.delete(f"/sessions/{session_id}")
    return (after - before) / count


def session_growth(make: Callable[[], Any], tasks: list[Task]) -> float:
    """Bytes one environment holds after resets on every task, minus after one reset."""
    env = make()
    gc.collect()
    tracemalloc.start()
    env.reset(tasks[0])
    gc.collect()
    one = tracemalloc.get_traced_memory()[0]
    for task in tasks:
        env.reset(task)
    env.reset(tasks[0])
    gc.collect()
    many = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return float(many - one)


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


def concurrent_steps_per_second(
    base: str, episodes: list[Episode], sessions: int, seconds: float, channel: str = "auto"
) -> float:
    """Total steps/s of `sessions` threads, each its own RemoteEnv (own session, own socket)."""
    barrier = threading.Barrier(sessions + 1)
    counts = [0] * sessions
    stop = threading.Event()

    def worker(i: int) -> None:
        with RemoteEnv(base, channel=channel) as env:  # type: ignore[arg-type]
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


def channel_rounds(
    base: str, pid: int, episodes: list[Episode], sessions: int, seconds: float, rounds: int
) -> dict[str, dict[str, float]]:
    """HTTP and the session channel alternating: best steps/s, and the median server and
    client CPU microseconds per step, of each."""
    samples: dict[str, list[tuple[float, float, float]]] = {"http": [], "websocket": []}
    for _ in range(rounds):
        for channel in ("http", "websocket"):
            server0, client0 = process_cpu_s(pid), time.process_time()
            started = time.perf_counter()
            rate = concurrent_steps_per_second(base, episodes, sessions, seconds, channel)
            steps = max(1.0, rate * (time.perf_counter() - started))
            samples[channel].append(
                (
                    rate,
                    (process_cpu_s(pid) - server0) / steps * 1e6,
                    (time.process_time() - client0) / steps * 1e6,
                )
            )
    return {
        channel: {
            "steps_per_s": max(r for r, _, _ in rows),
            "server_us": sorted(s for _, s, _ in rows)[len(rows) // 2],
            "client_us": sorted(c for _, _, c in rows)[len(rows) // 2],
        }
        for channel, rows in samples.items()
    }


# --------------------------------------------------------------------------- main


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    header = ("metric", "qpa", "baseline (same run)", "aim")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    rule = "  ".join("-" * w for w in widths)

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(rule, line(header), rule, *map(line, rows), rule, sep="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
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
    task_list = [task for task, _ in episodes]
    print(
        f"# {len(episodes)} episodes ({sum(len(a) for _, a in episodes)} steps a round) from "
        f"{len(tasks)} tasks; python {sys.version.split()[0]}; {os.cpu_count()} CPUs; "
        f"in-process on CPU {client_cpu}; server on CPU "
        f"{server_cpu if server_cpu is not None else 'any'}",
        flush=True,
    )

    # in-process steps/s: qpa and the baseline alternate, best of the windows each
    env, baseline = SandboxEnv(), BaselineEnv()
    qpa_steps = steps_per_second(qpa_round(env, episodes), window)
    base_steps = steps_per_second(baseline_round(baseline, episodes), window)
    qpa_steps = max(qpa_steps, steps_per_second(qpa_round(env, episodes), window, repeats=1))
    base_steps = max(base_steps, steps_per_second(baseline_round(baseline, episodes), window, 1))
    json_steps = steps_per_second(qpa_json_round(env, episodes), window)

    # reset latency: warm (this env has seen the task), first (a fresh env), baseline (deepcopy)
    ring = cycle(task_list)
    reset_warm = latencies_ms(lambda: env.reset(next(ring)), 5_000 if args.quick else 20_000)
    fresh = iter([(SandboxEnv(), task) for _, task in zip(range(2000), ring, strict=False)])

    def first_reset() -> None:
        new_env, task = next(fresh)
        new_env.reset(task)

    reset_first = latencies_ms(first_reset, 2000)
    base_reset = latencies_ms(lambda: baseline.reset(next(ring)), 5_000)

    # verification latency, at the end of each episode as in a rollout
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

    # memory: per live session, and what one long-lived session accumulates
    qpa_memory = memory_per_session(SandboxEnv, task_list, 1000)
    base_memory = memory_per_session(BaselineEnv, task_list, 1000)
    qpa_growth = session_growth(SandboxEnv, task_list)
    base_growth = session_growth(BaselineEnv, task_list)

    # over HTTP; the scheduler places client and server unless --pin-server
    os.sched_setaffinity(0, cpus)
    with env_server(server_cpu) as (base, pid):
        one: dict[str, float] = {}
        for channel in ("http", "websocket", "http", "websocket"):
            with RemoteEnv(base, channel=channel) as remote:  # type: ignore[arg-type]
                rate = steps_per_second(remote_round(remote, episodes), window * 2, repeats=1)
                one[channel] = max(one.get(channel, 0.0), rate)
        with RemoteEnv(base, channel="http") as remote:
            server_cpu_us, client_cpu_us = cpu_per_request_us(pid, remote, episodes)
        with RemoteEnv(base) as remote:
            ws_server_cpu_us, ws_client_cpu_us = cpu_per_request_us(pid, remote, episodes)
            http_reset = latencies_ms(lambda: remote.reset(next(ring)), 1000)
            http_verify = latencies_ms(remote.verify, 1000)
        sixteen = channel_rounds(base, pid, episodes, 16, window * 2, rounds=3)
        server_rss = server_rss_per_session(base, pid, task_list, 1000)
    http_steps, ws_steps = one["http"], one["websocket"]
    http16, ws16 = sixteen["http"]["steps_per_s"], sixteen["websocket"]["steps_per_s"]

    def ms(samples: list[float]) -> str:
        return f"{percentile(samples, 0.5):.3f} / {percentile(samples, 0.95):.3f} ms"

    def kib(value: float) -> str:
        return f"{value / 1024:,.1f} KiB"

    print_table(
        [
            (
                "steps/s in-process, 1 core, full validation",
                f"{qpa_steps:,.0f}",
                f"{base_steps:,.0f}",
                ">= 50,000",
            ),
            ("  + action from JSON, feedback to JSON", f"{json_steps:,.0f}", "", ""),
            (
                "steps/s served, 1 client (channel | HTTP)",
                f"{ws_steps:,.0f}",
                f"{http_steps:,.0f}",
                "",
            ),
            (
                "steps/s served, 16 sessions (channel | HTTP)",
                f"{ws16:,.0f}",
                f"{http16:,.0f}",
                f"2x: {ws16 / max(1.0, http16):.2f}x",
            ),
            (
                "  server CPU per step, 16 sessions",
                f"{sixteen['websocket']['server_us']:,.0f} us",
                f"{sixteen['http']['server_us']:,.0f} us",
                "",
            ),
            (
                "  client CPU per step, 16 sessions",
                f"{sixteen['websocket']['client_us']:,.0f} us",
                f"{sixteen['http']['client_us']:,.0f} us",
                "",
            ),
            (
                "  server CPU per request, 1 client",
                f"{ws_server_cpu_us:,.0f} us",
                f"{server_cpu_us:,.0f} us",
                "",
            ),
            (
                "  client CPU per request, 1 client",
                f"{ws_client_cpu_us:,.0f} us",
                f"{client_cpu_us:,.0f} us",
                "",
            ),
            ("reset p50 / p95, in-process", ms(reset_warm), ms(base_reset), "<= 0.2 ms"),
            ("reset p50 / p95, in-process, first on an env", ms(reset_first), "", ""),
            ("reset p50 / p95, served (task upload)", ms(http_reset), "", ""),
            ("verify p50 / p95, in-process", ms(verify_samples), ms(base_verify), "<= 1 ms"),
            ("verify p50 / p95, served", ms(http_verify), "", ""),
            (
                "memory per live session (1000 sessions)",
                kib(qpa_memory),
                kib(base_memory),
                "<= 1 MB",
            ),
            ("  server RSS per live session (1000, HTTP)", kib(server_rss), "", ""),
            (
                f"one session's growth over {len(task_list)} distinct tasks",
                kib(qpa_growth),
                kib(base_growth),
                "",
            ),
        ]
    )
    print(
        "# baseline: deepcopy reset, direct tool calls without argument validation, json.dumps "
        "results; its verify replays the reference actions on a fresh copy and compares state "
        "hashes. Served rows: baseline = HTTP (today's path), qpa = the session channel, "
        "alternating rounds. Steps/s are the best of several windows. "
        f"Run time {time.perf_counter() - began:.0f}s."
    )


if __name__ == "__main__":
    main()
