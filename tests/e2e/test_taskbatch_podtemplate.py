"""A TaskBatch's `spec.podTemplate` end to end: `kubectl apply` → the real operator merges the
template into the Job → the test kubelet runs the collector with the template's variables (a
plain value and one from the downward API) and scratch size, and the batch still succeeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.operator_runner import NS, example, operator, phase

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

NAME = "nightly-tool-use"
TEMPLATE = {
    "env": [
        {"name": "TEAM_TAG", "value": "alpha-$(HOME)"},
        {"name": "RUNS_ON", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ],
    "imagePullSecrets": [{"name": "team-registry"}],
    "scratchSizeLimit": "3Gi",
}


def store_secret(seaweed: SeaweedS3, name: str) -> dict[str, Any]:
    """The Secret `spec.store.secretRef` names, holding the SeaweedFS keys."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    }


def batch_yaml(tmp_path: Path, seaweed: SeaweedS3, out: str) -> Path:
    tb = example("taskbatch.yaml")
    spec = tb["spec"]
    spec["source"]["limit"] = 2
    spec["policy"] = {"planner": "oracle", "harness": {"version": "harness-v3"}}
    del spec["rolloutPoolRef"]
    spec.update(samplesPerTask=1, parallelism=1, shards=1, maxTurns=20, podTemplate=TEMPLATE)
    spec["outputUri"] = out + "/"
    spec["store"]["endpoint"] = seaweed.endpoint
    del spec["resources"]
    path = tmp_path / "taskbatch.yaml"
    path.write_text(
        yaml.safe_dump_all([store_secret(seaweed, spec["store"]["secretRef"]["name"]), tb])
    )
    return path


async def test_the_collector_runs_with_the_templates_variables(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tmp_path: Path,
) -> None:
    out = seaweed.root("e2e-taskbatch-podtemplate")
    with operator():
        kubectl("apply", "-f", str(batch_yaml(tmp_path, seaweed, out)))
        await phase(kube_api, "qtb", NAME, "Succeeded", timeout=90)
        (pod,) = kube_api.list_objects("pods", NS, f"qpa.ai/taskbatch={NAME}")
    spec = pod["spec"]
    assert {"name": "team-registry"} in spec["imagePullSecrets"]
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in spec["volumes"] if "emptyDir" in v} == {
        "spool": "3Gi",
        "tmp": "3Gi",
    }
    # what the process was started with (`env -i`): the template's values, expanded by the
    # kubelet after the operator's own (HOME), and the node it was scheduled to
    ran = kubelet._find(pod["metadata"]["name"], NS).containers[0].env
    assert ran["TEAM_TAG"] == "alpha-/tmp"
    assert ran["RUNS_ON"] == spec["nodeName"] and ran["RUNS_ON"]
    assert pod["status"]["phase"] == "Succeeded"
