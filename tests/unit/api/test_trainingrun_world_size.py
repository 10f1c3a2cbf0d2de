"""A TrainingRun's world size (`nodes`, `gpusPerNode`) is fixed: the API server refuses a
change with the CRD's CEL transition rule (`self == oldSelf`), as a real one does, so no
attempt ever runs ranks of two sizes (the old bug: a changed `nodes` patched only the Job's
parallelism, and torchrun waited for ranks that never came). Everything else stays editable.
The test API server (tests/fakes/kube_api.py) evaluates the rules of crds/ over HTTP."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer

ROOT = Path(__file__).resolve().parents[3]
RUNS = "/apis/qpa.ai/v1alpha1/namespaces/default/trainingruns"


@pytest.fixture(scope="module")
def server() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as kube:
        yield kube


def call(server: KubeAPIServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.url + path, data=data, method=method)
    content = "application/merge-patch+json" if method == "PATCH" else "application/json"
    request.add_header("Content-Type", content)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def created(server: KubeAPIServer, name: str) -> dict[str, Any]:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "trainingrun.yaml").read_text()))
    body = copy.deepcopy(docs[0])
    body["metadata"] = {"name": name, "namespace": "default"}
    code, stored = call(server, "POST", RUNS, body)
    assert code == 201, stored
    return dict(stored)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("nodes", 3, 'spec.nodes: Invalid value: "integer": nodes is immutable: the ranks\' world'),
        ("gpusPerNode", 4, 'spec.gpusPerNode: Invalid value: "integer": gpusPerNode is immutable'),
    ],
)
def test_the_world_size_cannot_change(
    server: KubeAPIServer, field: str, value: int, words: str
) -> None:
    name = f"size-{field.lower()}"
    stored = created(server, name)
    code, answer = call(server, "PATCH", f"{RUNS}/{name}", {"spec": {field: value}})
    assert code == 422 and answer["reason"] == "Invalid", answer
    assert words in answer["message"], answer["message"]
    assert "resumeFrom" in answer["message"]  # the message says how to go on
    assert f"spec.{field}" in [c["field"] for c in answer["details"]["causes"]]
    _, now = call(server, "GET", f"{RUNS}/{name}")
    assert now == stored  # nothing changed, not even the resourceVersion
    call(server, "DELETE", f"{RUNS}/{name}")


def test_other_fields_and_an_unchanged_size_still_update(server: KubeAPIServer) -> None:
    stored = created(server, "size-kept")
    same = {"nodes": stored["spec"]["nodes"], "gpusPerNode": stored["spec"]["gpusPerNode"]}
    change = {"spec": {**same, "backoffLimit": 5, "scheduling": {"keepFailedAttempts": 3}}}
    code, answer = call(server, "PATCH", f"{RUNS}/size-kept", change)
    assert code == 200, answer
    assert answer["spec"]["backoffLimit"] == 5
    assert answer["spec"]["scheduling"]["keepFailedAttempts"] == 3
    assert answer["metadata"]["generation"] == stored["metadata"]["generation"] + 1
    call(server, "DELETE", f"{RUNS}/size-kept")


def test_the_crd_defaults_scheduling_and_the_work_size(server: KubeAPIServer) -> None:
    stored = created(server, "size-defaults")
    assert stored["spec"]["scheduling"] == {
        "admissionTimeoutSeconds": 3600,
        "keepFailedAttempts": 1,
    }
    assert stored["spec"]["workSize"] == "50Gi"
    bad = copy.deepcopy(stored)
    del bad["metadata"]["resourceVersion"]
    bad["metadata"]["name"] = "size-bad-queue"
    bad["spec"]["scheduling"] = {"queueName": "Team_A"}
    code, answer = call(server, "POST", RUNS, bad)
    assert code == 422 and "spec.scheduling.queueName" in answer["message"], answer
    call(server, "DELETE", f"{RUNS}/size-defaults")
