"""`qpa doctor` against a real (test) API server and a real S3 server: each finding and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.kube_api import KubeAPIServer
from fakes.seaweed import SeaweedS3
from typer.testing import CliRunner

from qpa.cli import app

runner = CliRunner()


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, Any]]]:
    result = runner.invoke(app, ["doctor", *args, "--json"], env=env)
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    return result.exit_code, checks


def operator_deployment(ready: int) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "qpa", "app.kubernetes.io/component": "operator"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "qpa-operator", "namespace": "qpa-system", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "operator", "image": "qpa-operator:1"}]},
            },
        },
    }


def test_no_cluster_names_the_fix(tmp_path: Path) -> None:
    code, checks = doctor("kind", env={"KUBECONFIG": str(tmp_path / "missing")})
    assert code == 1
    assert checks["API server"]["status"] == "missing"
    assert "kind create cluster" in checks["API server"]["fix"]
    assert checks["qpa.ai CRDs"]["status"] == "skipped"


def test_a_cluster_without_the_operator_then_with_it(
    kube_api: KubeAPIServer, kube_config: Path
) -> None:
    code, checks = doctor("kind")
    assert checks["API server"]["status"] == "ok"
    assert checks["qpa.ai CRDs"]["status"] == "ok"  # the test server installs crds/
    assert checks["operator"]["status"] == "missing" and "helm install" in checks["operator"]["fix"]
    assert code == 1
    kube_api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "qpa-system"}})
    kube_api.create(operator_deployment(ready=0))
    _, checks = doctor("kind")
    assert checks["operator"]["status"] == "missing"
    assert "has no ready pod" in checks["operator"]["detail"]
    kube_api.patch_status("deployments", "qpa-system", "qpa-operator", {"readyReplicas": 1})
    _, checks = doctor("kind")
    assert checks["operator"]["status"] == "ok"
    assert "qpa-system/qpa-operator" in checks["operator"]["detail"]


def test_gpu_cluster_needs_kserve_and_gpus(kube_api: KubeAPIServer, kube_config: Path) -> None:
    from kubernetes import client, config

    api = client.ApiextensionsV1Api(config.new_client_from_config(str(kube_config)))
    names = {crd.metadata.name for crd in api.list_custom_resource_definition().items}
    if "inferenceservices.serving.kserve.io" in names:  # the test server may ship KServe's CRD
        api.delete_custom_resource_definition("inferenceservices.serving.kserve.io")
    code, checks = doctor("gpu")
    assert code == 1
    kserve = checks["KServe"]
    assert kserve["status"] == "missing" and "docs/gpu-cluster.md" in kserve["fix"]
    assert checks["GPUs"]["status"] == "missing"
    assert "operator" in checks  # the GPU path checks the cluster path first
    kube_api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
    kube_api.patch_status("nodes", None, "gpu-1", {"allocatable": {"nvidia.com/gpu": "8"}})
    _, checks = doctor("gpu")
    assert checks["GPUs"]["status"] == "ok" and "8 allocatable" in checks["GPUs"]["detail"]


def test_the_store_is_checked_with_its_credentials(seaweed: SeaweedS3, tmp_path: Path) -> None:
    root = seaweed.root("doctor")
    seaweed.store_config()
    env = {**seaweed.env(), "KUBECONFIG": str(tmp_path / "none")}
    _, checks = doctor("kind", "--store", f"{root}/", env=env)
    assert checks["object store"]["status"] == "ok", checks["object store"]
    wrong = {**env, "AWS_SECRET_ACCESS_KEY": "not-the-key"}
    _, checks = doctor("kind", "--store", f"{root}/", env=wrong)
    assert checks["object store"]["status"] == "missing"
    assert "QPA_S3_ENDPOINT" in checks["object store"]["fix"]


def test_an_unknown_path_is_refused() -> None:
    result = runner.invoke(app, ["doctor", "laptop"])
    assert result.exit_code == 2 and "unknown path 'laptop'" in result.output


@pytest.mark.parametrize("path", ["local"])
def test_the_local_path_on_this_machine_is_ready(path: str) -> None:
    code, checks = doctor(path)
    assert code == 0 and checks["torch"]["status"] == "ok"
    assert set(checks) == {"python", "torch", "loop extra", "disk"}
