"""`qpa mcp serve|bench`: a task's tools as an MCP server; MCP agents scored on a suite."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import anyio
import typer
from pydantic import ValidationError

from qpa.cli import app
from qpa.cli.common import die, err_console, print_json
from qpa.contract import CAPABILITIES, SPLITS, Task, write_trajectories
from qpa.envs.factory import env_kinds, make_env
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.envs.suites import get_task, load_suite

mcp_app = typer.Typer(
    help="Model Context Protocol: serve a task's tools to MCP agents, score MCP agents.",
    no_args_is_help=True,
)
app.add_typer(mcp_app, name="mcp", no_args_is_help=True)


def _load_task(task_id: str | None, task_file: Path | None, suite: str, seed: int) -> Task:
    if (task_id is None) == (task_file is None):
        die("--task: give a task id of the suite (--task) or a task file (--task-file)")
    if task_file is not None:
        try:
            text = task_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            die(f"--task-file: cannot read {task_file}: {exc.strerror or exc}")
        try:
            return Task.model_validate_json(text.splitlines()[0] if text else "{}")
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "<task>"
            die(f"--task-file: {task_file}: {where}: {error['msg']}")
    assert task_id is not None
    try:
        return get_task(task_id, suite, seed)
    except KeyError as exc:
        die(f"--task: {exc.args[0]}")


@mcp_app.command("serve")
def serve_command(
    task_id: Annotated[str | None, typer.Option("--task", help="Task id in the suite.")] = None,
    task_file: Annotated[
        Path | None, typer.Option(help="A task as JSON (first line of a JSON Lines file).")
    ] = None,
    suite: Annotated[str, typer.Option(help="Task suite.")] = DEFAULT_SUITE,
    seed: Annotated[int, typer.Option(help="Suite seed.")] = CANONICAL_SEED,
    kind: Annotated[str, typer.Option(help=f"Environment kind: {', '.join(env_kinds())}.")] = (
        "sandbox"
    ),
    transport: Annotated[
        str, typer.Option(help="stdio (the client starts this command) or http (streamable).")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="http: address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="http: TCP port.")] = 8000,
    verify_tool: Annotated[
        bool,
        typer.Option(
            "--verify-tool/--no-verify-tool",
            help="Offer `verify` (the task's verification) as a tool.",
        ),
    ] = True,
    record: Annotated[
        Path | None,
        typer.Option(help="Append the verified episode to this JSON Lines file at the end."),
    ] = None,
    max_turns: Annotated[int, typer.Option(min=1, help="Actions at most.")] = 200,
) -> None:
    """Serve one episode of a task as an MCP server: its tools, `finish`, `verify`, the prompt."""
    from qpa.mcp.server import build_server, run_stdio, serve_http
    from qpa.mcp.session import SessionError, TaskSession

    mode: Literal["stdio", "http"]
    if transport not in ("stdio", "http"):
        die(f"--transport: {transport!r} is not stdio or http")
    mode = "stdio" if transport == "stdio" else "http"
    task = _load_task(task_id, task_file, suite, seed)
    try:
        env = make_env(kind)
    except (ValueError, TypeError) as exc:
        die(f"--kind: {exc}")
    try:
        session = TaskSession(env, task, max_turns=max_turns)
    except SessionError as exc:
        env.close()
        die(str(exc))
    try:
        server = build_server(session, expose_verify=verify_tool)
        err_console.print(
            f"qpa mcp serve: task {task.id} ({len(session.tools())} tools) over "
            + ("stdio" if mode == "stdio" else f"http://{host}:{port}/mcp"),
            highlight=False,
        )
        if mode == "stdio":
            anyio.run(run_stdio, server)
        else:
            serve_http(server, host=host, port=port)
    except KeyboardInterrupt:
        pass
    finally:
        if record is not None:
            write_trajectories(record, [session.trajectory()], append=True)
        session.close()


@mcp_app.command("bench")
def bench_command(
    agent: Annotated[
        str,
        typer.Option(
            help="The agent's command line; it finds the task's MCP server in $QPA_MCP_URL "
            "(or where the command says {url})."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Output folder (trajectories and the report).")],
    suite: Annotated[str, typer.Option(help="Task suite.")] = DEFAULT_SUITE,
    seed: Annotated[int, typer.Option(help="Suite seed.")] = CANONICAL_SEED,
    split: Annotated[str, typer.Option(help=f"Split: {', '.join(SPLITS)}.")] = "test",
    domain: Annotated[list[str] | None, typer.Option(help="Only these domains.")] = None,
    capability: Annotated[
        list[str] | None, typer.Option(help=f"Only these: {', '.join(CAPABILITIES)}.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many tasks.")] = None,
    agent_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds one episode's agent may run.")
    ] = 300.0,
    kind: Annotated[str, typer.Option(help="Environment kind.")] = "sandbox",
) -> None:
    """Score an MCP-capable agent: one MCP server per task, the agent run against each."""
    from qpa.bench.run import BenchError, select_tasks
    from qpa.mcp.bench import AgentRun, run_agent_bench

    if split not in SPLITS:
        die(f"--split: {split!r} is not one of {', '.join(SPLITS)}")
    if kind not in env_kinds():
        die(f"--kind: unknown environment kind {kind!r}; choose from: {', '.join(env_kinds())}")
    try:
        tasks = select_tasks(
            load_suite(suite, seed),
            split=split,
            domains=domain or (),
            capabilities=capability or (),
            limit=limit,
        )
    except KeyError as exc:
        die(f"--suite: {exc.args[0]}")
    except BenchError as exc:
        die(str(exc))
    if not tasks:
        die("--split: no task matches the selection")
    try:
        run = AgentRun(agent, timeout_s=agent_timeout)
    except ValueError as exc:
        die(str(exc))

    def progress(trajectory: object) -> None:
        from qpa.contract import Trajectory

        assert isinstance(trajectory, Trajectory)
        mark = "ok  " if trajectory.success else "fail"
        err_console.print(f"{mark} {trajectory.task.id} {trajectory.error or ''}", highlight=False)

    report = run_agent_bench(tasks, run, out, kind=kind, on_episode=progress)
    err_console.print(
        f"{report.tasks} tasks, success {report.overall:.1%}; report in {out / 'report.md'}",
        highlight=False,
    )
    print_json({"tasks": report.tasks, "success": round(report.overall, 6), "out": str(out)})
