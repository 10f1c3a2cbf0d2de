"""`qpa mcp serve`: a task session's tools as an MCP server, driven by the `mcp` SDK's own client
over stdio (the client starts the command) and streamable HTTP, playing the oracle's plan to a
verified success; the round trip through qpa's own `mcp` environment kind; and `qpa mcp bench`
scoring an external MCP agent on suite tasks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fakes.mcp_app import PLANS_ENV, free_port, play_reference_plan
from mcp import Client, StdioServerParameters
from typer.testing import CliRunner

from qpa.bench.run import select_tasks
from qpa.cli import app
from qpa.contract import Task, read_trajectories
from qpa.envs.factory import make_env
from qpa.envs.mcp import McpEnv
from qpa.envs.sandbox.suite import generate_suite, get_task
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode
from qpa.mcp.bench import AgentRun, ThreadedMcpServer, run_agent_bench
from qpa.mcp.server import build_server
from qpa.mcp.session import TaskSession

pytestmark = pytest.mark.timeout(180)

QPA = str(Path(sys.executable).with_name("qpa"))
APP = str(Path(__file__).resolve().parents[1] / "fakes" / "mcp_app.py")
SEARCH_AND_SEND = "email.email_contact_by_name.test.000"  # contacts_search -> email_send(${0...})
PAYMENT = "food.food_best_open_restaurant.test.000"  # ends in a confirmed payment


def serve_argv(task_file: Path, *extra: str) -> list[str]:
    return [QPA, "--quiet", "mcp", "serve", "--task-file", str(task_file), *extra]


def task_file(tmp_path: Path, task_id: str) -> Path:
    """The suite task as a file (the server then needs no suite generation of its own)."""
    path = tmp_path / f"{task_id}.json"
    path.write_text(get_task(task_id).model_dump_json())
    return path


async def drive(client: Client, task_id: str) -> dict[str, Any]:
    """What an MCP agent would do: read the task, list tools, play the plan, ask for a verdict."""
    task = get_task(task_id)
    prompt = await client.get_prompt("task")
    assert prompt.messages[0].content.text == task.instruction
    assert task.instruction in (client.instructions or "")
    card = json.loads((await client.read_resource("qpa://task")).contents[0].text)
    assert card["id"] == task_id and card["instruction"] == task.instruction
    assert "verifier" not in card and "reference_plan" not in card  # nothing to cheat with
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert {"finish", "verify", "message_user"} <= set(tools)
    for name in task.tools or []:
        assert name in tools
    offered = [t for n, t in tools.items() if n not in ("finish", "verify", "message_user")]
    assert all(
        t.meta and t.meta["qpa/side_effect"] in ("read", "write", "payment") for t in offered
    )
    assert all(
        (t.annotations is not None and t.annotations.read_only_hint)
        == (t.meta["qpa/side_effect"] == "read")
        for t in offered
    )
    unknown = await client.call_tool("no_such_tool", {})
    assert unknown.is_error and unknown.content[0].text.startswith("unknown_tool:")
    await play_reference_plan(client, task)
    verdict = await client.call_tool("verify", {})
    assert verdict.structured_content is not None
    after = await client.call_tool("finish", {})
    assert after.is_error and "finished" in after.content[0].text
    return verdict.structured_content


def test_stdio_the_sdk_client_starts_the_server_and_plays_the_oracle(tmp_path: Path) -> None:
    record = tmp_path / "episodes.jsonl"
    argv = serve_argv(task_file(tmp_path, SEARCH_AND_SEND), "--record", str(record))
    params = StdioServerParameters(command=argv[0], args=argv[1:])

    async def main() -> dict[str, Any]:
        async with Client(params, read_timeout_seconds=60) as client:
            return await drive(client, SEARCH_AND_SEND)

    verdict = anyio.run(main)
    assert verdict["success"] is True and verdict["done"] is True, verdict
    deadline = time.monotonic() + 30  # the server records the episode as it exits
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    (episode,) = list(read_trajectories(record))
    assert episode.success and episode.policy.planner == "mcp-client"
    assert [s.action.type for s in episode.steps][-1] == "finish"
    assert episode.steps[0].feedback.error == "unknown_tool"  # the stray call is recorded too


def test_streamable_http_the_sdk_client_plays_the_oracle(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        serve_argv(
            task_file(tmp_path, SEARCH_AND_SEND), "--transport", "http", "--port", str(port)
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "qpa mcp serve did not start"
                time.sleep(0.2)

        async def main() -> dict[str, Any]:
            async with Client(url, read_timeout_seconds=60) as client:
                return await drive(client, SEARCH_AND_SEND)

        verdict = anyio.run(main)
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert verdict["success"] is True, verdict


def test_round_trip_through_the_mcp_environment_kind() -> None:
    """qpa's `mcp` kind against qpa's MCP server: the tools (payment included) come back whole,
    the runner's oracle succeeds, and the server's `verify` is the verifier tool."""
    task = get_task(PAYMENT)
    wrapped = task.model_copy(
        update={
            "world": {**task.world, "_mcp": {"verifier_tool": "verify", "finish_tool": "finish"}}
        }
    )
    session = TaskSession(make_env("sandbox"), task)
    with ThreadedMcpServer(session, expose_verify=True) as server:
        env = McpEnv(server.url, timeout=60, control_tools=("verify", "finish"))
        try:
            trajectory = run_episode(env, wrapped, OraclePlanner())
        finally:
            env.close()
    assert trajectory.error is None, trajectory.error
    assert trajectory.success, trajectory.verification
    assert session.done and session.verify().success  # the server's own episode agrees
    specs = {t.name: t for t in trajectory.tools}
    assert specs["food_checkout"].side_effect == "payment"
    assert specs["food_search_restaurants"].side_effect == "read"
    assert {"finish", "verify"}.isdisjoint(specs)  # the task's machinery is hidden


def test_bad_serve_input_names_the_option(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["mcp", "serve", "--task", "nope.task"])
    assert missing.exit_code == 2 and "--task" in missing.output and "nope.task" in missing.output
    broken = tmp_path / "task.json"
    broken.write_text('{"id": "x"}')
    bad = runner.invoke(app, ["mcp", "serve", "--task-file", str(broken)])
    assert bad.exit_code == 2 and "--task-file" in bad.output and "domain" in bad.output
    neither = runner.invoke(app, ["mcp", "serve"])
    assert neither.exit_code == 2 and "--task" in neither.output
    transport = runner.invoke(
        app, ["mcp", "serve", "--task-file", str(task_file(tmp_path, PAYMENT)), "--transport", "ws"]
    )
    assert transport.exit_code == 2 and "--transport" in transport.output


def test_a_control_tool_name_clash_is_refused() -> None:
    task = get_task(SEARCH_AND_SEND)

    class Clashing:
        kind = "sandbox"

        def reset(self, task: Any) -> Any:
            from qpa.contract import Feedback

            return Feedback.ok({})

        def tools(self) -> list[Any]:
            from qpa.contract import ToolSpec

            return [ToolSpec(name="verify", description="the app's own verify")]

        def close(self) -> None:
            pass

    with pytest.raises(ValueError, match="tools: the environment offers verify"):
        build_server(TaskSession(Clashing(), task))  # type: ignore[arg-type]


def plans_file(tmp_path: Path, tasks: list[Task]) -> Path:
    path = tmp_path / "plans.json"
    path.write_text(json.dumps({t.id: t.model_dump(mode="json") for t in tasks}))
    return path


def test_bench_scores_an_external_mcp_agent(tmp_path: Path) -> None:
    tasks = [get_task(SEARCH_AND_SEND), get_task(PAYMENT)]
    plans = {PLANS_ENV: str(plans_file(tmp_path, tasks))}
    good = AgentRun([sys.executable, APP, "oracle-agent", "{url}"], timeout_s=120, env=plans)
    report = run_agent_bench(tasks, good, tmp_path / "good")
    assert report.tasks == 2 and report.overall == 1.0
    episodes = list(read_trajectories(tmp_path / "good" / "trajectories.jsonl"))
    assert all(e.success and e.policy.planner == "mcp-client" for e in episodes)
    assert all(e.steps[-1].action.type == "finish" for e in episodes)
    assert json.loads((tmp_path / "good" / "report.json").read_text())["tasks"] == 2
    # an agent that fails is scored as a failure with its own words, not a crash
    bad = AgentRun([sys.executable, APP, "failing-agent"], timeout_s=60)
    failed = run_agent_bench(tasks[:1], bad, tmp_path / "bad")
    assert failed.overall == 0.0
    (episode,) = list(read_trajectories(tmp_path / "bad" / "trajectories.jsonl"))
    assert episode.error is not None and "exited with code 3" in episode.error
    assert "the agent gave up" in episode.error


def test_bench_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = select_tasks(generate_suite(), split="test", capabilities=["tool_use"], limit=1)
    monkeypatch.setenv(PLANS_ENV, str(plans_file(tmp_path, tasks)))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "--quiet",
            "mcp",
            "bench",
            "--agent",
            f"{sys.executable} {APP} oracle-agent",
            "--out",
            str(out),
            "--capability",
            "tool_use",
            "--limit",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 1 and summary["success"] == 1.0, result.output
    assert (out / "report.md").exists()
    refused = CliRunner().invoke(app, ["mcp", "bench", "--agent", "", "--out", str(out)])
    assert refused.exit_code == 2 and "agent" in refused.output
