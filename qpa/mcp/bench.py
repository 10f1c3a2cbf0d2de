"""Score an external MCP-capable agent on a suite: one MCP server per task, the agent as a process.

For each task, `run_agent_bench` resets a fresh environment on it, serves that `TaskSession`
over streamable HTTP on a free loopback port (without the `verify` tool: the agent must not
probe its score) and runs the agent's command with the server's URL in `$QPA_MCP_URL` (and in
any `{url}` of the command), the task id in `$QPA_TASK_ID`. The agent reads the task from the
server (its instructions, the `task` prompt or the `qpa://task` resource), calls tools, and
calls `finish`; when it exits (or its time is up: it is killed, the episode is verified as it
stands) the session is verified and recorded as a `Trajectory` under planner `mcp-client`.
The episodes and the benchmark report go where `qpa bench run` writes them
(`trajectories.jsonl`, `report.json`, `report.md`, via `qpa.bench.evaluate.score_episodes`),
so `qpa bench report/compare/gate` read them as any other run.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn

from qpa.bench.evaluate import score_episodes
from qpa.bench.scoring import Report
from qpa.contract import Policy, Task, Trajectory
from qpa.envs.factory import make_env
from qpa.mcp.server import build_server, http_app
from qpa.mcp.session import MCP_CLIENT_PLANNER, SessionError, TaskSession

__all__ = [
    "AGENT_TASK_ENV",
    "AGENT_URL_ENV",
    "AgentRun",
    "ThreadedMcpServer",
    "run_agent_bench",
    "run_agent_episode",
]

AGENT_URL_ENV = "QPA_MCP_URL"
AGENT_TASK_ENV = "QPA_TASK_ID"
STDERR_TAIL = 2000


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class ThreadedMcpServer:
    """One session's MCP server over streamable HTTP, in a background thread (`with` it)."""

    def __init__(
        self, session: TaskSession, host: str = "127.0.0.1", *, expose_verify: bool = False
    ) -> None:
        server = build_server(session, expose_verify=expose_verify)
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}/mcp"
        config = uvicorn.Config(
            http_app(server, host=host), host=host, port=self.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ThreadedMcpServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the MCP server for {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class AgentRun:
    """How to run the agent: its argv (`{url}` is replaced), extra env, a time limit."""

    def __init__(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("agent: the agent command is empty")
        if timeout_s <= 0:
            raise ValueError("agent_timeout: must be more than 0 seconds")
        self.argv = argv
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.cwd = str(cwd) if cwd is not None else None

    def name(self) -> str:
        return Path(self.argv[0]).name if len(self.argv) == 1 else shlex.join(self.argv)[:200]


def run_agent_episode(
    task: Task, agent: AgentRun, *, kind: str = "sandbox", host: str = "127.0.0.1"
) -> Trajectory:
    """One episode of `task` played by the agent; never raises for the agent's failures."""
    env = make_env(kind)
    policy = Policy(planner=MCP_CLIENT_PLANNER, model=agent.name())
    try:
        session = TaskSession(env, task, policy=policy)
    except SessionError as exc:
        env.close()
        return Trajectory(
            id=f"{task.id}#0",
            task=task,
            env_kind=env.kind,
            policy=policy,
            error=f"environment: {exc}",
        )
    try:
        with ThreadedMcpServer(session, host) as server:
            error = _run_agent(agent, server.url, task.id)
        return session.trajectory(error=error)
    finally:
        session.close()


def _run_agent(agent: AgentRun, url: str, task_id: str) -> str | None:
    """Run the agent against `url`; the trajectory's error, or None when it exited cleanly."""
    argv = [part.replace("{url}", url) for part in agent.argv]
    environ = {**os.environ, **agent.env, AGENT_URL_ENV: url, AGENT_TASK_ENV: task_id}
    try:
        process = subprocess.Popen(
            argv,
            env=environ,
            cwd=agent.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        return f"planner: agent command {argv[0]!r} could not start: {exc.strerror or exc}"
    try:
        _, stderr = process.communicate(timeout=agent.timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return f"planner: agent timed out after {agent.timeout_s:g}s"
    if process.returncode != 0:
        tail = (stderr or "").strip()[-STDERR_TAIL:]
        return f"planner: agent exited with code {process.returncode}: {tail}"
    return None


def run_agent_bench(
    tasks: Sequence[Task],
    agent: AgentRun,
    out: str | Path,
    *,
    kind: str = "sandbox",
    on_episode: Callable[[Trajectory], None] | None = None,
) -> Report:
    """Every task played by the agent, scored into `out` (trajectories and the bench report)."""
    trajectories: list[Trajectory] = []
    for task in tasks:
        trajectory = run_agent_episode(task, agent, kind=kind)
        trajectories.append(trajectory)
        if on_episode is not None:
            on_episode(trajectory)
    return score_episodes(trajectories, list(tasks), Path(out))
