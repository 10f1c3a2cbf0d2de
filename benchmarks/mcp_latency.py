"""What MCP costs per step: the sandbox in-process against the same episodes through MCP.

Run: `.venv/bin/python benchmarks/mcp_latency.py [--tasks N]` (prints a table, asserts nothing).
The oracle's episodes of N test tasks of the canonical suite (tool use, no delegation) run by
qpa's runner three ways:

- the baseline: `SandboxEnv` in-process;
- `mcp-http`: qpa's `mcp` environment kind (the `mcp` SDK's client) against qpa's MCP server for
  the task's session (`qpa.mcp`, the SDK's low-level server) over streamable HTTP, in-process
  on a loopback port (uvicorn in a thread);
- `mcp-stdio`: the same client against `qpa mcp serve --transport stdio` as a subprocess (its
  start-up, about one Python start with the SDK imported, is reported apart).

Through MCP, verification is a tool call too (the server's `verify`, as the task's verifier
tool), and `finish` reaches the server (the task's finish tool). Printed per way: the p50/p95 of
one step's latency as the runner measures it, the episodes' wall time, and the successes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from qpa.bench.run import select_tasks
from qpa.contract import Task, Trajectory
from qpa.envs.factory import make_env
from qpa.envs.mcp import McpEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode
from qpa.mcp.bench import ThreadedMcpServer
from qpa.mcp.session import TaskSession

QPA = str(Path(sys.executable).with_name("qpa"))


def tasks(count: int) -> list[Task]:
    chosen = [
        t
        for t in select_tasks(generate_suite(), split="test", capabilities=["tool_use"])
        if t.reference_plan and all(a.type != "delegate" for a in t.reference_plan)
    ]
    return select_tasks(chosen, split="test", limit=count)


#: qpa's MCP server's machinery, which these tasks name as their verifier and finish tools.
CONTROL = ("verify", "finish")


def through_mcp(task: Task) -> Task:
    world = {**task.world, "_mcp": {"verifier_tool": "verify", "finish_tool": "finish"}}
    return task.model_copy(update={"world": world})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(name: str, runs: list[Trajectory], wall: float, extra: str = "") -> str:
    steps = [s.duration_ms for t in runs for s in t.steps]
    ok = sum(t.success for t in runs)
    return (
        f"{name:<10} {len(steps):>6} {percentile(steps, 0.5):>9.2f} {percentile(steps, 0.95):>9.2f}"
        f" {statistics.mean(steps):>9.2f} {wall:>8.2f} {ok:>4}/{len(runs):<4} {extra}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    args = parser.parse_args()
    chosen = tasks(args.tasks)
    lines = [
        f"{'way':<10} {'steps':>6} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9} {'wall s':>8} ok"
    ]

    t0 = time.perf_counter()
    base = [run_episode(make_env("sandbox"), t, OraclePlanner()) for t in chosen]
    lines.append(row("sandbox", base, time.perf_counter() - t0))

    http: list[Trajectory] = []
    t0 = time.perf_counter()
    for task in chosen:
        session = TaskSession(make_env("sandbox"), task)
        with ThreadedMcpServer(session, expose_verify=True) as server:
            env = McpEnv(server.url, control_tools=CONTROL)
            http.append(run_episode(env, through_mcp(task), OraclePlanner()))
            env.close()
    lines.append(row("mcp-http", http, time.perf_counter() - t0))

    stdio: list[Trajectory] = []
    starts: list[float] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for task in chosen:
            path = Path(tmp) / f"{task.id}.json"
            path.write_text(task.model_dump_json())
            argv = [QPA, "--quiet", "mcp", "serve", "--task-file", str(path)]
            # a loaded machine starts Python slowly
            env = McpEnv(command=argv, timeout=120, control_tools=CONTROL)
            started = time.perf_counter()
            env.reset(through_mcp(task))  # connects: starts the server
            starts.append(time.perf_counter() - started)
            stdio.append(run_episode(env, through_mcp(task), OraclePlanner()))
            env.close()
    wall = time.perf_counter() - t0 - sum(starts)
    lines.append(
        row("mcp-stdio", stdio, wall, f"(+ server start p50 {percentile(starts, 0.5):.2f}s)")
    )
    print(f"{len(chosen)} tasks, oracle plans; one step = env.step as the runner times it")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
