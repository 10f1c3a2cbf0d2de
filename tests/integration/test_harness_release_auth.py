"""The Harness a HarnessRelease with `spec.harness.auth.tokensSecretRef` renders authenticates:
`qpa harness serve` started with the builder's exact argv (only the addresses and the mounted
paths swapped for this machine's) refuses a wrong or missing-user token and another user's id."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from helpers.harness_process import serving
from qpa_operator.builders import Defaults, harnessrelease

from qpa.api import HarnessRelease, parse_resource
from qpa.envs.sandbox.suite import generate_suite
from qpa.envs.tokens import token_hash

ROOT = Path(__file__).resolve().parents[2]
QPA = str(Path(sys.executable).with_name("qpa"))
PREDICT = "/v1/models/harness:predict"
TASK = next(t for t in generate_suite() if t.split == "test")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def builder_argv() -> list[str]:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "harnessrelease.yaml").read_text())]
    body = copy.deepcopy(next(d for d in docs if d))
    body["metadata"].update(namespace="team-a", uid="uid-planner")
    body["spec"]["harness"]["auth"] = {"tokensSecretRef": {"name": "tokens", "key": "t.yaml"}}
    hr = parse_resource(body)
    assert isinstance(hr, HarnessRelease)
    isvc = harnessrelease.harness_service(hr, Defaults())
    argv: list[str] = isvc["spec"]["predictor"]["containers"][0]["command"]
    return argv


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("release-auth")
    tokens = tmp / "tokens.yaml"  # what the kubelet writes from the Secret key
    tokens.write_text(f"{token_hash('alice-secret-token')}: alice\n")
    config = tmp / "harness.yaml"
    config.write_text(f"version: harness-v3\nmemory_path: {tmp / 'memory.sqlite'}\n")
    port = free_port()
    here = {  # flag -> this machine's value (the pod's are cluster addresses and mount paths)
        "--tokens-file": str(tokens),
        "--harness-config": str(config),
        "--model-url": "http://127.0.0.1:9/openai/v1",
        "--host": "127.0.0.1",
        "--http-port": str(port),
    }
    argv = builder_argv()
    assert argv[argv.index("--tokens-file") + 1] == harnessrelease.TOKENS_PATH
    local = [QPA, *argv[1:]]
    for flag, value in here.items():
        local[local.index(flag) + 1] = value
    changed = {i for i, (a, b) in enumerate(zip(argv[1:], local[1:], strict=True)) if a != b}
    assert {local[1:][i - 1] for i in changed} <= set(here)  # only those flags' values differ
    with serving(local, port, {"HOME": str(tmp)}) as url:
        yield url


def predict(url: str, body: dict[str, Any], token: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}{PREDICT}", content=orjson.dumps(body), headers=headers, timeout=30)


def test_a_wrong_token_is_refused(served: str) -> None:
    response = predict(served, {"task_id": TASK.id}, "not-alices-token")
    assert response.status_code == 401, response.text
    assert response.json()["field"] == "Authorization"
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_known_token_cannot_act_as_another_user(served: str) -> None:
    """The mounted file was read: alice's token is known, and it is alice's only."""
    response = predict(served, {"task_id": TASK.id, "user_id": "bob"}, "alice-secret-token")
    assert response.status_code == 403, response.text
    assert response.json()["field"] == "user_id"
