"""A RolloutPool of `environment: mcp` run by the operator, and its pod's command run for real.

The real operator (`KopfRunner`, as tests/integration/test_operator.py runs it) against the test
API server (tests/fakes/kube_api.py, which checks the CRD's schema and CEL rules) turns the pool
into a Deployment; the test then plays the kubelet for one pod: it starts the container's own
command line (`qpa env serve --spec FILE`, the work order from the pool's ConfigMap) with the
container's own variables, and drives it as rollouts do (`RemoteEnv`). The MCP server is the
notes app with an admin tool (tests/fakes/mcp_admin_app.py): the pool's `mcp.url` reaches it,
its `mcp.controlTools` let a task reset and verify, and a client naming the admin tool (as a
control tool, or among the planner's tools) never reaches it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.kube_api import ApiError, KubeAPIServer
from fakes.mcp_admin_app import ADMIN, CONTROL, SHARE_WORLD, AdminNotesServer, task

from qpa.api.v1alpha1 import WORK_ORDER_KEY, WORK_ORDER_PATH
from qpa.contract import ToolCall
from qpa.envs.remote import RemoteEnv
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

kopf = pytest.importorskip("kopf")
from helpers.operator_runner import NS, command, container, exists, operator  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def mcp_pool(name: str, mcp: dict[str, Any] | None, port: int = 8000) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "environment": "mcp",
        "replicas": {"min": 1, "max": 1},
        "sessionsPerPod": 4,
        "port": port,
    }
    if mcp is not None:
        spec["mcp"] = mcp
    return {
        "apiVersion": "qpa.ai/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def notes() -> Iterator[AdminNotesServer]:
    with AdminNotesServer() as server:
        yield server


def pod_process(deployment: dict[str, Any], order: str, tmp: Path) -> subprocess.Popen[bytes]:
    """The pool's container as a kubelet starts it: its args (the work order path pointed at a
    copy of the ConfigMap's file) and its literal variables (the downward API's left out)."""
    main = container(deployment)
    spec_file = tmp / "workorder.yaml"
    spec_file.write_text(order)
    argv = [str(spec_file) if a == WORK_ORDER_PATH else a for a in command(deployment)]
    assert argv[:3] == ["qpa", "env", "serve"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QPA_MCP_")}
    for variable in main["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
    env["HOME"] = str(tmp)
    env["QPA_ENV_DRAIN_FILE"] = str(tmp / "drain.key")
    qpa = [sys.executable, "-c", "from qpa.cli import main; main()"]
    return subprocess.Popen([*qpa, *argv[1:]], env=env, cwd=tmp)


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, f"qpa env serve exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "qpa env serve did not start"
        time.sleep(0.3)


async def test_the_operator_runs_an_mcp_pool_whose_pods_keep_to_the_allow_list(
    kube_api: KubeAPIServer,
    operator_env: Path,
    notes: AdminNotesServer,
    tmp_path: Path,
) -> None:
    port = _port()
    settings = {"url": notes.url, "controlTools": list(CONTROL), "hiddenTools": [ADMIN]}
    with operator():
        kube_api.create(mcp_pool("notes", settings, port=port))
        deployment = await exists(kube_api, "deployments", "notes-env")
        config_map = await exists(kube_api, "configmaps", "notes-order")
        policy = await exists(kube_api, "networkpolicies", "notes-egress")
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    assert env["QPA_MCP_URL"] == notes.url  # the pool's mcp.url, as the pods' variable
    assert env["QPA_MCP_CONTROL_TOOLS"] == "reset_notes,check_notes"
    assert env["QPA_MCP_HIDDEN_TOOLS"] == ADMIN
    # the MCP server's address is what the pods' egress opens (beyond DNS)
    opened = [
        r for r in policy["spec"]["egress"] if any(p.get("port") == notes.port for p in r["ports"])
    ]
    assert opened and opened[0]["to"] == [{"ipBlock": {"cidr": "127.0.0.1/32"}}]

    process = pod_process(deployment, config_map["data"][WORK_ORDER_KEY], tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        with RemoteEnv(url) as remote:
            for field in ("reset_tool", "verifier_tool", "finish_tool"):
                refused = remote.reset(task({**SHARE_WORLD, field: ADMIN}))
                assert refused.error == "permission_denied", refused
                assert f"_mcp.{field}" in refused.message and ADMIN in refused.message
            offered = remote.reset(task({}, tools=["search_notes", ADMIN]))
            assert offered.error == "permission_denied" and ADMIN in offered.message
            assert remote.reset(task({})).status == "ok"
            assert remote.step(ToolCall(tool=ADMIN, arguments={})).error == "unknown_tool"
            trajectory = run_episode(remote, task(SHARE_WORLD), OraclePlanner())
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert trajectory.error is None, trajectory.error
    assert trajectory.success and trajectory.env_kind == "mcp"
    assert {t.name for t in trajectory.tools}.isdisjoint({*CONTROL, ADMIN})
    notes.untouched()
    assert notes.state["shares"] == [{"note_id": "n1", "email": "sam@example.com"}]


async def test_the_api_server_refuses_an_mcp_pool_without_its_server(
    kube_api: KubeAPIServer, operator_env: Path
) -> None:
    """The CRD's rules, as the API server applies them (no operator needed to refuse)."""
    with pytest.raises(ApiError, match="mcp is required for environment mcp"):
        kube_api.create(mcp_pool("bare", None))
    with pytest.raises(ApiError, match=r"set url .* or command"):
        kube_api.create(mcp_pool("neither", {"controlTools": ["reset_notes"]}))
    with pytest.raises(ApiError, match="a control tool or a hidden one"):
        kube_api.create(
            mcp_pool(
                "both",
                {
                    "url": "http://notes.apps:8000/mcp",
                    "controlTools": [ADMIN],
                    "hiddenTools": [ADMIN],
                },
            )
        )
    sandbox = mcp_pool("sandbox-with-mcp", {"url": "http://notes.apps:8000/mcp"})
    sandbox["spec"]["environment"] = "sandbox"
    with pytest.raises(ApiError, match="allowed only there"):
        kube_api.create(sandbox)
