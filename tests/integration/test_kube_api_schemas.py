"""The test API server checks built-in objects and InferenceServices as a real one does, serves
`/openapi/v3` so kubectl validates, and breaks watches and lists on request.

Built-in kinds go against the official Kubernetes 1.37 schemas (fakes.kube_builtin),
InferenceServices against KServe's own CRD (tests/fakes/vendor/kserve/); kubectl runs with its
default `--validate=strict` and gets the field named.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import ApiError, KubeAPIServer
from fakes.kubectl import Kubectl

NS = "default"


def job(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ranks"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "rank", "image": "qpa", **container}],
                }
            },
        },
    }


def isvc(**predictor: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "planner"},
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "huggingface"},
                    "storageUri": "s3://qpa/models/planner/",
                },
                **predictor,
            }
        },
    }


def http(server: KubeAPIServer, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_built_in_objects_are_checked_against_the_kubernetes_schemas(
    kube_api: KubeAPIServer,
) -> None:
    assert kube_api.create(job())["spec"]["completions"] == 2
    with pytest.raises(ApiError) as wrong_type:
        kube_api.create({**job(), "metadata": {"name": "typed"}} | {"spec": {"completions": "two"}})
    assert wrong_type.value.code == 422
    fields = {c["field"] for c in wrong_type.value.details["causes"]}
    assert {"spec.completions", "spec.template"} <= fields
    with pytest.raises(ApiError) as unknown:
        kube_api.create({**job(imagePullPolice="Always"), "metadata": {"name": "typo"}})
    assert unknown.value.code == 400
    assert 'unknown field "spec.template.spec.containers[0].imagePullPolice"' in str(unknown.value)
    with pytest.raises(ApiError) as no_image:
        kube_api.create({**job(image=""), "metadata": {"name": "no-image"}})
    assert "spec.template.spec.containers[0].image: Required value" in str(no_image.value)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "pool"},
        "spec": {
            "selector": {"matchLabels": {"app": "pool"}},
            "template": {
                "metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "env", "image": "qpa"}]},
            },
        },
    }
    with pytest.raises(ApiError) as unselected:
        kube_api.create(deployment)
    assert "spec.template.metadata.labels" in str(unselected.value)
    assert "`selector` does not match template `labels`" in str(unselected.value)
    # Updates are checked too: a status a controller writes wrong is refused.
    with pytest.raises(ApiError) as bad_status:
        kube_api.patch_status("jobs", NS, "ranks", {"succeeded": "all"})
    assert "status.succeeded" in str(bad_status.value)


def test_unknown_built_in_fields_are_dropped_when_the_client_asks(kube_api: KubeAPIServer) -> None:
    body = job(imagePullPolice="Always")
    request = urllib.request.Request(
        kube_api.url + f"/apis/batch/v1/namespaces/{NS}/jobs?fieldValidation=Warn",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        assert "imagePullPolice" in response.headers["Warning"]
    stored = kube_api.get("jobs", NS, "ranks")
    assert stored is not None
    assert "imagePullPolice" not in stored["spec"]["template"]["spec"]["containers"][0]


def test_inference_services_are_checked_against_kserves_crd(kube_api: KubeAPIServer) -> None:
    crd = kube_api.get("crd", None, "inferenceservices.serving.kserve.io")
    assert crd is not None and crd["status"]["acceptedNames"]["shortNames"] == ["isvc"]
    created = kube_api.create(isvc(minReplicas=1))
    assert created["spec"]["predictor"]["minReplicas"] == 1
    with pytest.raises(ApiError) as wrong:
        kube_api.create({**isvc(minReplicas="one"), "metadata": {"name": "wrong"}})
    assert wrong.value.code == 422
    assert "spec.predictor.minReplicas" in str(wrong.value)
    pruned = kube_api.create({**isvc(replicaz=2), "metadata": {"name": "typo"}})
    assert "replicaz" not in pruned["spec"]["predictor"]
    assert 'unknown field "spec.predictor.replicaz"' in kube_api.kube.warnings


def test_openapi_v3_lists_group_versions_with_the_kinds_and_field_validation(
    kube_api: KubeAPIServer,
) -> None:
    status, root = http(kube_api, "/openapi/v3")
    assert status == 200
    for key in (
        "api/v1",
        "apis/batch/v1",
        "apis/qpa.ai/v1alpha1",
        "apis/serving.kserve.io/v1beta1",
    ):
        assert root["paths"][key]["serverRelativeURL"].startswith(f"/openapi/v3/{key}?hash=")
    status, batch = http(kube_api, root["paths"]["apis/batch/v1"]["serverRelativeURL"])
    assert status == 200
    patch = batch["paths"]["/apis/batch/v1/namespaces/{namespace}/jobs/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "batch",
        "version": "v1",
        "kind": "Job",
    }
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    assert "io.k8s.api.batch.v1.JobSpec" in batch["components"]["schemas"]
    _, qpa = http(kube_api, "/openapi/v3/apis/qpa.ai/v1alpha1")
    schema = qpa["components"]["schemas"]["ai.qpa.v1alpha1.TrainingRun"]
    assert schema["x-kubernetes-group-version-kind"][0]["kind"] == "TrainingRun"
    assert http(kube_api, "/openapi/v3/apis/nothing/v1")[0] == 404


def test_kubectl_validates_by_default_and_names_the_field(
    kubectl: Kubectl, kube_api: KubeAPIServer, tmp_path: Path
) -> None:
    applied = kubectl("apply", "-f", "examples/trainingrun.yaml")
    assert "trainingrun.qpa.ai/planner-sft created" in applied.stdout
    docs = [d for d in yaml.safe_load_all(Path("examples/trainingrun.yaml").read_text()) if d]
    typo = copy.deepcopy(docs[0])
    typo["metadata"]["name"] = "typo"
    typo["spec"]["checkpointEvry"] = 10
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(typo))
    refused = kubectl("apply", "-f", str(tmp_path / "typo.yaml"), check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.checkpointEvry"' in refused.stderr
    assert kube_api.get("qtr", NS, "typo") is None
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(argz=["run"])))
    refused = kubectl("apply", "-f", str(tmp_path / "job.yaml"), check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.template.spec.containers[0].argz"' in refused.stderr
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(args=["run"])))
    assert "job.batch/ranks created" in kubectl("apply", "-f", str(tmp_path / "job.yaml")).stdout


# --------------------------------------------------------------------------- watch faults


def watch_lines(server: KubeAPIServer, query: str, timeout: float = 5) -> list[dict[str, Any]]:
    """The events of one watch until the server ends it (or cuts it)."""
    url = f"{server.url}/api/v1/namespaces/{NS}/configmaps?watch=true&{query}"
    events = []
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            for line in response:
                events.append(json.loads(line))
    except Exception as exc:  # a cut connection ends the stream with an error
        events.append({"type": "CUT", "error": type(exc).__name__})
    return events


def config_map(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


def test_watches_expire_or_drop_and_lists_go_stale_on_request(kube_api: KubeAPIServer) -> None:
    for i in range(3):
        kube_api.create(config_map(f"cm-{i}"))
    kube_api.faults.expire_watches(count=1, resources={"configmaps"})
    expired = watch_lines(kube_api, "timeoutSeconds=2")
    assert [e["type"] for e in expired] == ["ERROR"]
    assert expired[0]["object"]["code"] == 410
    fine = watch_lines(kube_api, "timeoutSeconds=1")
    assert [e["type"] for e in fine] == ["ADDED"] * 3

    kube_api.faults.drop_watches(count=1, after=0.3, resources={"configmaps"})
    started = time.monotonic()
    cut = watch_lines(kube_api, "timeoutSeconds=30")
    assert time.monotonic() - started < 5, "the connection was cut, long before the timeout"
    assert [e["type"] for e in cut if e["type"] != "CUT"] == ["ADDED"] * 3

    current = http(kube_api, f"/api/v1/namespaces/{NS}/configmaps")[1]
    kube_api.delete("configmaps", NS, "cm-0")
    kube_api.create(config_map("cm-3"))
    kube_api.faults.stale_lists(count=1, lag=2, resources={"configmaps"})
    _, stale = http(kube_api, f"/api/v1/namespaces/{NS}/configmaps")
    assert stale["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    assert [o["metadata"]["name"] for o in stale["items"]] == ["cm-0", "cm-1", "cm-2"]
    # Watching on from the stale list's version brings the client up to date.
    since = stale["metadata"]["resourceVersion"]
    caught_up = watch_lines(kube_api, f"resourceVersion={since}&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in caught_up] == [
        ("DELETED", "cm-0"),
        ("ADDED", "cm-3"),
    ]
    _, fresh = http(kube_api, f"/api/v1/namespaces/{NS}/configmaps")
    assert [o["metadata"]["name"] for o in fresh["items"]] == ["cm-1", "cm-2", "cm-3"]
    assert {s for s, _, _ in kube_api.faults.log} == {410, 0, 200}


@pytest.mark.asyncio
async def test_an_async_client_sees_a_cut_watch(kube_api: KubeAPIServer) -> None:
    kube_api.create(config_map("cm"))
    kube_api.faults.drop_watches(count=1, after=0.2)
    started = time.monotonic()
    events = await asyncio.to_thread(watch_lines, kube_api, "timeoutSeconds=30")
    assert time.monotonic() - started < 5
    assert events[0]["type"] == "ADDED"
