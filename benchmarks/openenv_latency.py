"""OpenEnv's client against qpa's own: step latency and episode throughput of `qpa env serve`.

Run: `.venv/bin/python benchmarks/openenv_latency.py [--quick]` (about a minute; prints two
tables; asserts only that every episode was verified). One `qpa env serve` subprocess on a free
loopback port; the same episodes (the oracle's resolved actions of tasks spread over the
canonical suite, padded to about 24 steps by repetition as in `env_throughput.py`, so most do
not verify as successes) driven, one client at a time, by:

- the baseline: qpa's `RemoteEnv` over HTTP (keep-alive connection, the ASGI fast path);
- OpenEnv's `EnvClient` (`QpaEnv` through OpenEnv's `.sync()` wrapper) over the WebSocket
  `/ws` (`qpa.envs.openenv`), which also verifies the task on the step that ends the episode
  (the reward), where `RemoteEnv` needs a separate `verify` request (counted in its row);
- a bare WebSocket client (`websockets.sync`) sending the same OpenEnv messages: the
  protocol's cost without OpenEnv's client (its background event loop thread).

Printed per client: steps/s (every action, resets and the final verification included in the
wall time) and the p50/p95 latency of one step. Then the server's side alone, in this process
on CPU time (the number a loaded machine distorts least): one step through `EnvService.step`
(qpa's HTTP body; plus the episode's `verify`, spread over its steps) against the same step as
an OpenEnv message through `OpenEnvSession.handle` (which verifies on the last step), best of
three rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import websockets.sync.client
from env_throughput import Episode, build_episodes, free_port, percentile

from qpa.contract import ACTION_ADAPTER
from qpa.envs.openenv import OpenEnvSession
from qpa.envs.openenv_client import QpaAction, QpaEnv
from qpa.envs.remote import RemoteEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.server import EnvService, create_app


@contextmanager
def env_server(start_timeout_s: float = 120.0) -> Iterator[str]:
    """`qpa env serve` in a subprocess on a free loopback port; yields its URL."""
    qpa = Path(sys.executable).with_name("qpa")
    port = free_port()
    process = subprocess.Popen(
        [str(qpa), "env", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
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
        yield base
    finally:
        process.terminate()
        process.wait(10)


def run_remote(env: RemoteEnv, episodes: list[Episode], step_ms: list[float]) -> int:
    steps = 0
    for task, actions in episodes:
        env.reset(task)
        for action in actions:
            started = time.perf_counter()
            env.step(action)
            step_ms.append((time.perf_counter() - started) * 1000)
        env.verify()  # what the WebSocket does on the last step (the reward)
        steps += len(actions)
    return steps


def run_openenv(env: Any, episodes: list[Episode], step_ms: list[float]) -> int:
    steps = 0
    for task, actions in episodes:
        env.reset(task=task)
        result = None
        for action in actions:
            started = time.perf_counter()
            result = env.step(QpaAction(action=action))
            step_ms.append((time.perf_counter() - started) * 1000)
        assert result is not None and result.reward is not None  # verified on finish
        steps += len(actions)
    return steps


def run_bare(socket: Any, episodes: list[Episode], step_ms: list[float]) -> int:
    steps = 0
    for task, actions in episodes:
        socket.send(orjson.dumps({"type": "reset", "data": {"task": task.model_dump()}}))
        socket.recv()
        reply: dict[str, Any] = {}
        for action in actions:
            message = {"type": "step", "data": {"action": ACTION_ADAPTER.dump_python(action)}}
            started = time.perf_counter()
            socket.send(orjson.dumps(message))
            reply = orjson.loads(socket.recv())
            step_ms.append((time.perf_counter() - started) * 1000)
        assert reply["data"]["reward"] is not None, reply  # verified on finish
        steps += len(actions)
    return steps


def measure(
    run: Callable[[list[Episode], list[float]], int], episodes: list[Episode], seconds: float
) -> tuple[float, list[float]]:
    """Best steps/s of three windows of about `seconds` each; every step's latency."""
    best, samples = 0.0, []
    for _ in range(3):
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            steps += run(episodes, samples)
        best = max(best, steps / (time.perf_counter() - started))
    return best, samples


async def service_cpu_us(service: EnvService, episodes: list[Episode]) -> float:
    """CPU microseconds per step through qpa's service (HTTP bodies), verification included."""
    spent, steps = 0.0, 0
    for task, actions in episodes:
        reply = await service.reset(orjson.dumps({"task": task.model_dump(mode="json")}))
        session = orjson.loads(reply)["session_id"]
        for action in actions:
            body = orjson.dumps(
                {"session_id": session, "action": ACTION_ADAPTER.dump_python(action)}
            )
            started = time.process_time()
            await service.step(body)
            spent += time.process_time() - started
        started = time.process_time()
        await service.verify(orjson.dumps({"session_id": session}))
        spent += time.process_time() - started
        await service.delete(session)
        steps += len(actions)
    return spent / steps * 1e6


async def openenv_cpu_us(service: EnvService, episodes: list[Episode]) -> float:
    """CPU microseconds per step as OpenEnv messages (verified on the last step)."""
    spent, steps = 0.0, 0
    for task, actions in episodes:
        session = OpenEnvSession(service, "bench", 1 << 22)
        await session.handle(orjson.dumps({"type": "reset", "data": {"task": task.model_dump()}}))
        for action in actions:
            data = {"action": ACTION_ADAPTER.dump_python(action)}
            message = orjson.dumps({"type": "step", "data": data})
            started = time.process_time()
            await session.handle(message)
            spent += time.process_time() - started
        await session.close()
        steps += len(actions)
    return spent / steps * 1e6


async def server_side(episodes: list[Episode]) -> tuple[float, float]:
    service: EnvService = create_app("sandbox").state.service
    qpa, openenv = [], []
    for _ in range(3):
        qpa.append(await service_cpu_us(service, episodes))
        openenv.append(await openenv_cpu_us(service, episodes))
    return min(qpa), min(openenv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, fewer tasks")
    args = parser.parse_args()
    seconds = 1.0 if args.quick else 3.0
    episodes = build_episodes(generate_suite(), limit=10 if args.quick else 40)
    rows: list[tuple[str, float, list[float]]] = []
    with env_server() as base:
        with RemoteEnv(base) as remote:
            rows.append(
                (
                    "qpa RemoteEnv, HTTP (baseline)",
                    *measure(lambda e, s: run_remote(remote, e, s), episodes, seconds),
                )
            )
        with QpaEnv(base_url=base).sync() as openenv:
            rows.append(
                (
                    "OpenEnv EnvClient (QpaEnv), /ws",
                    *measure(lambda e, s: run_openenv(openenv, e, s), episodes, seconds),
                )
            )
        with websockets.sync.client.connect(base.replace("http", "ws") + "/ws") as bare:
            rows.append(
                (
                    "bare WebSocket, OpenEnv messages",
                    *measure(lambda e, s: run_bare(bare, e, s), episodes, seconds),
                )
            )
    print(f"{len(episodes)} episodes, {sum(len(a) for _, a in episodes)} steps per round")
    print(f"{'client':<36} {'steps/s':>9} {'step p50 ms':>12} {'step p95 ms':>12}")
    for name, rate, samples in rows:
        p50, p95 = percentile(samples, 0.5), percentile(samples, 0.95)
        print(f"{name:<36} {rate:>9.0f} {p50:>12.3f} {p95:>12.3f}")
    qpa_us, openenv_us = asyncio.run(server_side(episodes))
    print(f"\n{'server side, CPU per step':<36} {'us':>9} {'x baseline':>12}")
    print(f"{'EnvService.step, HTTP body (baseline)':<36} {qpa_us:>9.1f} {1.0:>12.2f}")
    ratio = openenv_us / qpa_us
    print(f"{'OpenEnvSession.handle, /ws message':<36} {openenv_us:>9.1f} {ratio:>12.2f}")


if __name__ == "__main__":
    main()
