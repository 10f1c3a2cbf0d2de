"""The Harness end to end over real HTTP: an OpenAI-compatible model server, `qpa run`, and the
Harness served as a KServe predictor (`qpa harness serve`) on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fakes.openai_server import FakeOpenAI, Reply, ToolCallReply, scripted
from helpers.harness_process import serving
from typer.testing import CliRunner

from qpa.cli import app
from qpa.contract import read_trajectories
from qpa.envs.sandbox.suite import generate_suite

TASK = next(t for t in generate_suite() if t.template == "add_new_contact" and t.split == "test")
PLAN = TASK.reference_plan or []
CREATE_ARGS = PLAN[0].arguments  # type: ignore[union-attr]
QPA = str(Path(sys.executable).with_name("qpa"))


def solving_model() -> FakeOpenAI:
    return FakeOpenAI(
        scripted(
            Reply.calls(ToolCallReply("contacts_create", CREATE_ARGS)),
            Reply.calls(ToolCallReply("finish", {"answer": "saved"})),
        )
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_qpa_run_with_an_openai_endpoint(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    with solving_model() as server:
        result = CliRunner().invoke(
            app,
            [
                "run",
                "--task",
                TASK.id,
                "--planner",
                "openai",
                "--model-url",
                server.base_url,
                "--model",
                "fake-model",
                "--out",
                str(out),
            ],
        )
        assert result.exit_code == 0, result.output
        assert server.requests[0].tools, "native function calling offers the tools"
        assert server.requests[0].model == "fake-model"
    (trajectory,) = read_trajectories(out)
    assert trajectory.success and trajectory.answer == "saved"
    assert trajectory.policy.planner == "openai" and trajectory.policy.model == "fake-model"
    assert trajectory.totals.completion_tokens > 0 and trajectory.totals.prompt_tokens > 0


def test_unreachable_model_fails_the_episode_as_environment_side(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    result = CliRunner().invoke(
        app,
        ["run", "--task", TASK.id, "--planner", "openai", "--model-url", dead, "--out", str(out)],
    )
    assert result.exit_code == 1
    (trajectory,) = read_trajectories(out)
    assert trajectory.error and trajectory.error.startswith("environment:")
    assert "model endpoint" in trajectory.error and "Connect" in trajectory.error


def test_model_flags_are_validated() -> None:
    runner = CliRunner()
    no_url = runner.invoke(app, ["run", "--task", TASK.id, "--planner", "openai"])
    assert no_url.exit_code == 2 and "--model-url" in no_url.output
    no_path = runner.invoke(
        app, ["run", "--task", TASK.id, "--planner", "local", "--model-uri", "/nope"]
    )
    assert no_path.exit_code == 2 and "/nope" in no_path.output


@pytest.fixture
def harness_server() -> Iterator[tuple[str, FakeOpenAI]]:
    with solving_model() as model:
        port = free_port()
        argv = [
            QPA,
            "harness",
            "serve",
            "--planner",
            "openai",
            "--model-url",
            model.base_url,
            "--host",
            "127.0.0.1",
            "--http-port",
            str(port),
        ]
        with serving(argv, port) as url:
            yield url, model


def test_harness_served_as_a_kserve_predictor(harness_server: tuple[str, FakeOpenAI]) -> None:
    url, _model = harness_server
    assert httpx.get(f"{url}/v2/models/harness/ready").status_code == 200
    response = httpx.post(
        f"{url}/v1/models/harness:predict", json={"user_id": "u-42", "task_id": TASK.id}, timeout=60
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True and body["answer"] == "saved"
    assert [a["type"] for a in body["actions"]] == ["tool_call", "finish"]
    assert body["usage"]["completion_tokens"] > 0
    assert body["harness_version"] == "harness-v1"
    # no authentication configured: anonymous callers, memory thrown away after the episode
    assert body["user_id"] == "u-42" and body["memory"] == "ephemeral"
    ssrf = httpx.post(
        f"{url}/v1/models/harness:predict",
        json={"user_id": "u-42", "task_id": TASK.id, "env_url": "http://127.0.0.1:1/"},
        timeout=10,
    )
    assert ssrf.status_code == 400 and ssrf.json()["field"] == "env_url"
    bad = httpx.post(f"{url}/v1/models/harness:predict", json={"query": "hi"}, timeout=10)
    assert bad.status_code == 400 and "user_id" in bad.text
    unknown = httpx.post(
        f"{url}/v1/models/harness:predict", json={"user_id": "u", "task_id": "ghost"}, timeout=10
    )
    assert unknown.status_code == 400 and "ghost" in unknown.text
    listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
    port = url.rsplit(":", 1)[1]
    assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
