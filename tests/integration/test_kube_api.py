"""The test API server (tests/fakes/kube_api.py) as the real clients see it.

Driven by the `kubernetes` client, the real `kubectl` v1.37 and a real kopf operator: what an
API server does and the operator relies on (server-set fields, generation, status subresource,
409/422, selectors, watches, garbage collection, CRDs, validation of custom resources against
crds/, fault injection).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer, write_kubeconfig
from fakes.kubectl import Kubectl, KubeTools

from qpa.api import RESOURCES, resource_for_kind

kubernetes = pytest.importorskip("kubernetes")
from kubernetes.client import ApiException  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GROUP, VERSION = "qpa.ai", "v1alpha1"
NS = "default"
JSON_PATCH = "application/json-patch+json"


def example(kind: str, index: int = 0) -> dict[str, Any]:
    plural = resource_for_kind(kind).info.singular
    docs = [d for d in yaml.safe_load_all((EXAMPLES / f"{plural}.yaml").read_text()) if d]
    return copy.deepcopy([d for d in docs if d["kind"] == kind][index])


def plural(kind: str) -> str:
    return resource_for_kind(kind).info.plural


def custom(client: Any) -> Any:
    return kubernetes.client.CustomObjectsApi(client)


def http(
    server: KubeAPIServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, dict(response.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def error_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body or "{}")
    return body


# --------------------------------------------------------------------------- discovery


def test_discovery_is_what_kopf_and_kubectl_expect(kube_api: KubeAPIServer) -> None:
    _, _, core = http(kube_api, "GET", "/api")
    assert core["versions"] == ["v1"]
    _, _, v1 = http(kube_api, "GET", "/api/v1")
    assert v1["groupVersion"] == "v1"
    names = {r["name"]: r for r in v1["resources"]}
    assert {"namespaces", "pods", "services", "configmaps", "events", "secrets"} <= set(names)
    assert names["namespaces"]["namespaced"] is False
    _, _, groups = http(kube_api, "GET", "/apis")
    group_names = {g["name"] for g in groups["groups"]}
    assert {
        "qpa.ai",
        "apps",
        "batch",
        "coordination.k8s.io",
        "serving.kserve.io",
        "apiextensions.k8s.io",
    } <= group_names
    _, _, qpa = http(kube_api, "GET", "/apis/qpa.ai/v1alpha1")
    assert qpa["groupVersion"] == "qpa.ai/v1alpha1"
    entries = {r["name"]: r for r in qpa["resources"]}
    for cls in RESOURCES:
        entry = entries[cls.info.plural]
        assert entry["kind"] == cls.info.kind and entry["namespaced"] is True
        assert {"list", "watch", "get", "create", "patch", "delete"} <= set(entry["verbs"])
        assert entry["shortNames"] == list(cls.info.short_names)
        assert entry["categories"] == ["qpa"]
        status = entries[f"{cls.info.plural}/status"]
        assert "shortNames" not in status and status["verbs"] == ["get", "patch", "update"]
    assert http(kube_api, "GET", "/apis/qpa.ai")[2]["preferredVersion"]["version"] == "v1alpha1"
    assert http(kube_api, "GET", "/version")[2]["gitVersion"].startswith("v1.37")
    assert http(kube_api, "GET", "/apis/nope.example.com/v1")[0] == 404


# --------------------------------------------------------------------------- objects


def test_create_sets_server_fields_and_defaults(kube_client: Any) -> None:
    body = example("TrainingRun")
    body["status"] = {"phase": "Succeeded"}  # ignored on create: status is a subresource
    created = custom(kube_client).create_namespaced_custom_object(
        GROUP, VERSION, NS, "trainingruns", body
    )
    meta = created["metadata"]
    assert meta["namespace"] == NS and meta["generation"] == 1
    assert len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert "status" not in created
    assert created["spec"]["deepspeed"]["gradientClipping"] == 1.0  # schema default
    assert created["spec"]["store"]["region"] == "us-east-1"
    listed = custom(kube_client).list_namespaced_custom_object(GROUP, VERSION, NS, "trainingruns")
    assert listed["kind"] == "TrainingRunList" and listed["apiVersion"] == "qpa.ai/v1alpha1"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["planner-sft"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])
    with pytest.raises(ApiException) as exists:
        custom(kube_client).create_namespaced_custom_object(
            GROUP, VERSION, NS, "trainingruns", example("TrainingRun")
        )
    assert exists.value.status == 409 and error_of(exists)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as missing:
        custom(kube_client).get_namespaced_custom_object(GROUP, VERSION, NS, "trainingruns", "x")
    assert missing.value.status == 404
    assert error_of(missing)["message"] == 'trainingruns.qpa.ai "x" not found'


def test_generate_name_and_namespaces(kube_client: Any) -> None:
    body = example("RolloutPool")
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "pool-"
    api = custom(kube_client)
    first = api.create_namespaced_custom_object(GROUP, VERSION, NS, "rolloutpools", body)
    second = api.create_namespaced_custom_object(GROUP, VERSION, NS, "rolloutpools", body)
    assert first["metadata"]["name"].startswith("pool-") and len(first["metadata"]["name"]) == 10
    assert first["metadata"]["name"] != second["metadata"]["name"]
    with pytest.raises(ApiException) as missing_ns:
        api.create_namespaced_custom_object(GROUP, VERSION, "nowhere", "rolloutpools", body)
    assert missing_ns.value.status == 404
    assert error_of(missing_ns)["message"] == 'namespaces "nowhere" not found'


def test_generation_and_resource_version_follow_real_rules(kube_api: KubeAPIServer) -> None:
    created = kube_api.create(example("TaskBatch"))
    rv0 = int(created["metadata"]["resourceVersion"])
    spec = kube_api.patch("qtb", NS, "nightly-tool-use", {"spec": {"parallelism": 8}})
    assert spec["metadata"]["generation"] == 2 and int(spec["metadata"]["resourceVersion"]) > rv0
    labels = kube_api.patch("qtb", NS, "nightly-tool-use", {"metadata": {"labels": {"x": "y"}}})
    assert labels["metadata"]["generation"] == 2
    assert labels["metadata"]["resourceVersion"] != spec["metadata"]["resourceVersion"]
    same = kube_api.patch("qtb", NS, "nightly-tool-use", {"spec": {"parallelism": 8}})
    assert same["metadata"]["resourceVersion"] == labels["metadata"]["resourceVersion"]
    status = kube_api.patch_status("qtb", NS, "nightly-tool-use", {"phase": "Running"})
    assert status["metadata"]["generation"] == 2 and status["status"]["phase"] == "Running"


def test_status_subresource_is_separate(kube_client: Any) -> None:
    api = custom(kube_client)
    api.create_namespaced_custom_object(GROUP, VERSION, NS, "trainingruns", example("TrainingRun"))
    main = api.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "trainingruns",
        "planner-sft",
        {"spec": {"checkpointEvery": 3}, "status": {"phase": "Failed"}},
    )
    assert main["spec"]["checkpointEvery"] == 3 and "status" not in main
    status = api.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        NS,
        "trainingruns",
        "planner-sft",
        {"spec": {"checkpointEvery": 9}, "status": {"phase": "Running", "step": 10}},
    )
    assert status["spec"]["checkpointEvery"] == 3 and status["status"]["phase"] == "Running"
    replaced = copy.deepcopy(status)
    replaced["status"] = {"phase": "Succeeded"}
    replaced["spec"]["checkpointEvery"] = 4
    after = api.replace_namespaced_custom_object(
        GROUP, VERSION, NS, "trainingruns", "planner-sft", replaced
    )
    assert after["spec"]["checkpointEvery"] == 4 and after["status"]["phase"] == "Running"
    assert after["metadata"]["generation"] == 3


def test_stale_writes_conflict(kube_api: KubeAPIServer, kube_client: Any) -> None:
    api = custom(kube_client)
    old = api.create_namespaced_custom_object(
        GROUP, VERSION, NS, "devicepools", example("DevicePool")
    )
    kube_api.patch("qdp", NS, "lab-phones", {"spec": {"adbPort": 5038}})
    with pytest.raises(ApiException) as replace:
        api.replace_namespaced_custom_object(GROUP, VERSION, NS, "devicepools", "lab-phones", old)
    assert replace.value.status == 409 and error_of(replace)["reason"] == "Conflict"
    assert "the object has been modified" in error_of(replace)["message"]
    stale = {"metadata": {"resourceVersion": old["metadata"]["resourceVersion"]}}
    with pytest.raises(ApiException) as merge:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "devicepools", "lab-phones", {**stale, "spec": {"adbPort": 1}}
        )
    assert merge.value.status == 409
    test_op: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/metadata/finalizers", "value": ["qpa.ai/x"]},
    ]
    with pytest.raises(ApiException) as json_patch:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "devicepools", "lab-phones", test_op, _content_type=JSON_PATCH
        )
    assert json_patch.value.status == 422, "kopf needs 422 here, not 500"
    assert "testing value /metadata/resourceVersion failed" in error_of(json_patch)["message"]
    current = kube_api.get("qdp", NS, "lab-phones")
    assert current is not None
    test_op[0]["value"] = current["metadata"]["resourceVersion"]
    patched = api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "devicepools", "lab-phones", test_op, _content_type=JSON_PATCH
    )
    assert patched["metadata"]["finalizers"] == ["qpa.ai/x"]
    with pytest.raises(ApiException) as precondition:
        api.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "devicepools",
            "lab-phones",
            body={"preconditions": {"resourceVersion": old["metadata"]["resourceVersion"]}},
        )
    assert precondition.value.status == 409


def test_label_and_field_selectors(kube_api: KubeAPIServer, kube_client: Any) -> None:
    labels = {
        "a": {"tier": "gpu", "team": "rl"},
        "b": {"tier": "cpu", "team": "rl"},
        "c": {"tier": "cpu"},
        "d": {},
    }
    for name, tags in labels.items():
        body = example("RolloutPool")
        body["metadata"] = {"name": name, "labels": tags}
        kube_api.create(body)
    api = custom(kube_client)

    def names(selector: str = "", fields: str = "") -> list[str]:
        items = api.list_namespaced_custom_object(
            GROUP, VERSION, NS, "rolloutpools", label_selector=selector, field_selector=fields
        )["items"]
        return [i["metadata"]["name"] for i in items]

    assert names("tier=cpu") == ["b", "c"]
    assert names("tier==gpu") == ["a"]
    assert names("tier!=cpu") == ["a", "d"]
    assert names("tier in (gpu, cpu),team") == ["a", "b"]
    assert names("tier notin (cpu)") == ["a", "d"]
    assert names("team") == ["a", "b"]
    assert names("!team") == ["c", "d"]
    assert names("tier=cpu,!team") == ["c"]
    assert names(fields="metadata.name=c") == ["c"]
    assert names(fields="metadata.name!=c,metadata.namespace=default") == ["a", "b", "d"]
    assert api.list_cluster_custom_object(GROUP, VERSION, "rolloutpools")["items"]
    with pytest.raises(ApiException) as bad:
        names("tier in cpu")
    assert bad.value.status == 400 and "unable to parse requirement" in error_of(bad)["message"]
    with pytest.raises(ApiException) as unsupported:
        names(fields="spec.image=x")
    assert unsupported.value.status == 400


def test_list_pages_with_limit_and_continue(kube_api: KubeAPIServer) -> None:
    for index in range(5):
        body = example("RolloutPool")
        body["metadata"] = {"name": f"pool-{index}"}
        kube_api.create(body)
    seen: list[str] = []
    token = ""
    while True:
        query = f"?limit=2&continue={token}" if token else "?limit=2"
        _, _, page = http(kube_api, "GET", f"/apis/qpa.ai/v1alpha1/rolloutpools{query}")
        seen += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert seen == [f"pool-{i}" for i in range(5)]


def test_owner_references_are_garbage_collected(kube_api: KubeAPIServer) -> None:
    owner = kube_api.create(example("TrainingRun"))
    other = kube_api.create(example("TrainingRun", 1))

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": "TrainingRun",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }

    job = kube_api.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "ranks", "ownerReferences": [ref(owner)]},
            "spec": {
                "completionMode": "Indexed",
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "rank", "image": "trainer"}],
                    }
                },
            },
        }
    )
    job_ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "ranks",
        "uid": job["metadata"]["uid"],
    }
    kube_api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "ranks-0", "ownerReferences": [job_ref]},
            "spec": {"containers": [{"name": "rank", "image": "trainer"}]},
        }
    )
    kube_api.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "shared", "ownerReferences": [ref(owner), ref(other)]},
        }
    )
    kube_api.delete("qtr", NS, "planner-sft")
    assert kube_api.get("jobs", NS, "ranks") is None
    assert kube_api.get("pods", NS, "ranks-0") is None, "dependents of dependents go too"
    assert kube_api.get("cm", NS, "shared") is not None, "another owner is alive"
    kube_api.delete("qtr", NS, "planner-care-rl", propagation="Background")
    assert kube_api.get("cm", NS, "shared") is None
    # Orphan keeps the dependent and drops the reference.
    owner = kube_api.create(example("TrainingRun"))
    kube_api.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "rdzv", "ownerReferences": [ref(owner)]},
        }
    )
    kube_api.delete("qtr", NS, "planner-sft", propagation="Orphan")
    orphan = kube_api.get("svc", NS, "rdzv")
    assert orphan is not None and "ownerReferences" not in orphan["metadata"]


def test_finalizers_hold_deletion(kube_api: KubeAPIServer, kube_client: Any) -> None:
    body = example("HarnessRelease")
    body["metadata"]["finalizers"] = ["qpa.ai/release"]
    kube_api.create(body)
    api = custom(kube_client)
    deleting = api.delete_namespaced_custom_object(GROUP, VERSION, NS, "harnessreleases", "planner")
    assert deleting["metadata"]["deletionTimestamp"]
    assert kube_api.get("qhr", NS, "planner") is not None
    with pytest.raises(ApiException) as new_finalizer:
        api.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "harnessreleases",
            "planner",
            {"metadata": {"finalizers": ["qpa.ai/release", "qpa.ai/other"]}},
        )
    assert new_finalizer.value.status == 422
    assert "no new finalizers can be added" in error_of(new_finalizer)["message"]
    api.patch_namespaced_custom_object(
        GROUP, VERSION, NS, "harnessreleases", "planner", {"metadata": {"finalizers": None}}
    )
    assert kube_api.get("qhr", NS, "planner") is None
    events = [event_type for event_type, _ in kube_api.events_for("qhr")]
    assert events == ["ADDED", "MODIFIED", "DELETED"]


def test_deleting_a_namespace_deletes_its_objects(kube_api: KubeAPIServer) -> None:
    kube_api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    kube_api.create(example("TaskBatch"), namespace="team-a")
    held = example("RolloutPool")
    held["metadata"]["finalizers"] = ["qpa.ai/pool"]
    kube_api.create(held, namespace="team-a")
    kube_api.delete("ns", None, "team-a")
    assert kube_api.get("qtb", "team-a", "nightly-tool-use") is None
    namespace = kube_api.get("ns", None, "team-a")
    assert namespace is not None and namespace["status"]["phase"] == "Terminating"
    kube_api.patch("qrp", "team-a", "sandbox", {"metadata": {"finalizers": None}})
    assert kube_api.get("ns", None, "team-a") is None


def test_watch_streams_events_as_json_lines(kube_api: KubeAPIServer, kube_client: Any) -> None:
    kube_api.create(example("TrainingRun"))
    api = custom(kube_client)
    listing = api.list_namespaced_custom_object(GROUP, VERSION, NS, "trainingruns")
    since = listing["metadata"]["resourceVersion"]

    def change() -> None:
        kube_api.patch_status("qtr", NS, "planner-sft", {"phase": "Running"})
        kube_api.create(example("TrainingRun", 1))
        kube_api.delete("qtr", NS, "planner-care-rl")

    threading.Timer(0.3, change).start()
    watch = kubernetes.watch.Watch()
    events = []
    for event in watch.stream(
        api.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        "trainingruns",
        resource_version=since,
        timeout_seconds=3,
    ):
        events.append((event["type"], event["object"]["metadata"]["name"]))
        if len(events) == 3:
            watch.stop()
    assert events == [
        ("MODIFIED", "planner-sft"),
        ("ADDED", "planner-care-rl"),
        ("DELETED", "planner-care-rl"),
    ]
    request = urllib.request.Request(
        kube_api.url + "/apis/qpa.ai/v1alpha1/trainingruns?watch=true&timeoutSeconds=1"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        lines = [json.loads(line) for line in response.read().splitlines() if line]
    assert [line["type"] for line in lines] == ["ADDED"], "initial state, then the timeout"


def test_watch_follows_label_selectors_and_expires_old_versions() -> None:
    with KubeAPIServer(history_limit=4) as server:
        body = example("RolloutPool")
        server.create(body)
        start = server.get("qrp", NS, "sandbox")
        assert start is not None

        def change() -> None:
            server.patch("qrp", NS, "sandbox", {"metadata": {"labels": {"watched": "yes"}}})
            server.patch("qrp", NS, "sandbox", {"metadata": {"labels": {"watched": None}}})

        threading.Timer(0.2, change).start()
        since = start["metadata"]["resourceVersion"]
        path = (
            "/apis/qpa.ai/v1alpha1/rolloutpools?watch=true&timeoutSeconds=1"
            f"&labelSelector=watched&resourceVersion={since}"
        )
        with urllib.request.urlopen(server.url + path, timeout=10) as response:
            types = [json.loads(line)["type"] for line in response.read().splitlines() if line]
        assert types == ["ADDED", "DELETED"]
        for index in range(6):
            server.patch("qrp", NS, "sandbox", {"spec": {"sessionsPerPod": 10 + index}})
        with urllib.request.urlopen(
            server.url + f"/apis/qpa.ai/v1alpha1/rolloutpools?watch=true&resourceVersion={since}",
            timeout=10,
        ) as response:
            gone = json.loads(response.read().splitlines()[0])
        assert gone["type"] == "ERROR" and gone["object"]["code"] == 410


def test_tables_carry_the_printer_columns(kube_api: KubeAPIServer) -> None:
    kube_api.create(example("TrainingRun"))
    kube_api.patch_status("qtr", NS, "planner-sft", {"phase": "Running", "step": 7})
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    _, _, table = http(
        kube_api,
        "GET",
        "/apis/qpa.ai/v1alpha1/namespaces/default/trainingruns",
        headers={"Accept": accept},
    )
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Stage", "Phase", "Step", "Nodes", "GPUs", "Checkpoint", "Age"]
    (row,) = table["rows"]
    assert row["cells"][:6] == ["planner-sft", "sft", "Running", 7, 2, 8]
    assert row["object"]["kind"] == "PartialObjectMetadata"


def test_patch_kinds_for_built_ins(kube_client: Any) -> None:
    core = kubernetes.client.CoreV1Api(kube_client)
    apps = kubernetes.client.AppsV1Api(kube_client)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    patched = core.patch_namespaced_config_map("cfg", NS, {"data": {"b": "2"}})  # strategic
    assert patched.data == {"a": "1", "b": "2"}
    deployment = {
        "metadata": {"name": "harness"},
        "spec": {
            "selector": {"matchLabels": {"app": "harness"}},
            "template": {
                "metadata": {"labels": {"app": "harness"}},
                "spec": {
                    "containers": [
                        {"name": "harness", "image": "harness:1"},
                        {"name": "sidecar", "image": "proxy:1"},
                    ]
                },
            },
        },
    }
    apps.create_namespaced_deployment(NS, deployment)
    patch = {
        "spec": {"template": {"spec": {"containers": [{"name": "harness", "image": "harness:2"}]}}}
    }
    result = apps.patch_namespaced_deployment("harness", NS, patch)
    images = {c.name: c.image for c in result.spec.template.spec.containers}
    assert images == {"harness": "harness:2", "sidecar": "proxy:1"}, "merged by name"


def test_unknown_fields_warn_or_fail_when_strict(kube_api: KubeAPIServer) -> None:
    body = example("DevicePool")
    body["spec"]["colour"] = "blue"
    path = "/apis/qpa.ai/v1alpha1/namespaces/default/devicepools"
    status, headers, created = http(kube_api, "POST", path, body)
    assert status == 201 and "colour" not in created["spec"]
    assert headers["Warning"] == '299 - "unknown field \\"spec.colour\\""'
    body["metadata"]["name"] = "strict"
    status, _, error = http(kube_api, "POST", path + "?fieldValidation=Strict", body)
    assert status == 400 and 'unknown field "spec.colour"' in error["message"]


def test_crds_are_objects_too(kube_api: KubeAPIServer) -> None:
    widget_crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    created = kube_api.create(widget_crd)
    assert created["status"]["acceptedNames"]["kind"] == "Widget"
    widget: dict[str, Any] = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 0},
    }
    status, _, error = http(
        kube_api, "POST", "/apis/example.com/v1/namespaces/default/widgets", widget
    )
    assert status == 422 and "spec.size" in error["message"]
    widget["spec"]["size"] = 2
    assert (
        http(kube_api, "POST", "/apis/example.com/v1/namespaces/default/widgets", widget)[0] == 201
    )
    broken = copy.deepcopy(widget_crd)
    broken["metadata"]["name"] = "gadgets.example.com"
    broken["spec"]["names"] = {"plural": "gadgets", "kind": "Gadget"}
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ] = {"size": {"description": "no type"}}
    status, _, error = http(
        kube_api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", broken
    )
    assert status == 422 and "type is required" in error["message"]
    kube_api.delete("crd", None, "widgets.example.com")
    assert http(kube_api, "GET", "/apis/example.com/v1")[0] == 404
    assert http(kube_api, "GET", "/apis/example.com/v1/widgets")[0] == 404


def test_fault_injection(kube_api: KubeAPIServer, kube_client: Any) -> None:
    api = custom(kube_client)
    kube_api.faults.fail_next(2, status=500, methods={"POST"})
    for _ in range(2):
        with pytest.raises(ApiException) as failed:
            api.create_namespaced_custom_object(
                GROUP, VERSION, NS, "taskbatches", example("TaskBatch")
            )
        assert failed.value.status == 500 and "injected" in error_of(failed)["message"]
    api.create_namespaced_custom_object(GROUP, VERSION, NS, "taskbatches", example("TaskBatch"))
    kube_api.faults.fail_next(1, status=429, resources={"taskbatches"}, retry_after=2)
    status, headers, body = http(kube_api, "GET", "/apis/qpa.ai/v1alpha1/taskbatches")
    assert status == 429 and headers["Retry-After"] == "2"
    assert body["details"]["retryAfterSeconds"] == 2
    kube_api.faults.fail_next(1, status=409, methods={"PATCH"}, subresource="status")
    status, _, body = http(
        kube_api,
        "GET",
        "/apis/qpa.ai/v1alpha1/namespaces/default/taskbatches/nightly-tool-use/status",
    )
    assert status == 200, "only PATCH on /status is hit"
    with pytest.raises(ApiException) as conflict:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, "taskbatches", "nightly-tool-use", {"status": {"phase": "Running"}}
        )
    assert conflict.value.status == 409
    kube_api.faults.clear()
    fault = kube_api.faults.fail_fraction(0.3, status=503, methods={"GET"})
    outcomes = [http(kube_api, "GET", "/apis/qpa.ai/v1alpha1/taskbatches")[0] for _ in range(60)]
    assert outcomes.count(503) == fault.injected and 8 <= fault.injected <= 30
    assert kube_api.faults.injected == fault.injected + 4


# --------------------------------------------------------------------------- validation


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        obj = obj[int(key)] if isinstance(obj, list) else obj.setdefault(key, {})
    if value is _DELETE:
        del obj[keys[-1]]
    elif isinstance(obj, list):
        obj[int(keys[-1])] = value
    else:
        obj[keys[-1]] = value


_DELETE = object()
LONG_NAME = "a" * 60

# (kind, example index, {path: value}, field named in the answer, words of the answer,
#  whether pydantic refuses it too)
MALFORMED: list[tuple[str, int, dict[str, Any], str, str, bool]] = [
    (
        "TrainingRun",
        0,
        {"spec.stage": "pretrain"},
        "spec.stage",
        'Unsupported value: "pretrain"',
        True,
    ),
    ("TrainingRun", 0, {"spec.baseModelUri": _DELETE}, "spec.baseModelUri", "Required value", True),
    (
        "TrainingRun",
        0,
        {"spec.baseModelUri": "ftp://models/x"},
        "spec.baseModelUri",
        "should match",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.nodes": 0},
        "spec.nodes",
        "Invalid value: 0: spec.nodes in body should be greater than or equal to 1",
        True,
    ),
    ("TrainingRun", 0, {"spec.nodes": "two"}, "spec.nodes", "must be of type integer", True),
    (
        "TrainingRun",
        0,
        {"spec.gpusPerNode": 17},
        "spec.gpusPerNode",
        "less than or equal to 16",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.deepspeed.zeroStage": 4},
        "spec.deepspeed.zeroStage",
        "Unsupported value: 4",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.deepspeed.zeroStage": 2, "spec.deepspeed.offloadParameters": "cpu"},
        "spec.deepspeed",
        "offloadParameters needs zeroStage 3",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.datasets.0.uri": "s3://qpa/x/"},
        "spec.datasets[0]",
        "set exactly one of taskBatchRef or uri",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.datasets.1.weight": 0},
        "spec.datasets[1].weight",
        "should be greater than 0",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.rl": {"rolloutPoolRef": {"name": "sandbox"}}},
        "spec",
        "stage rl needs rl settings",
        True,
    ),
    ("TrainingRun", 0, {"spec.datasets": []}, "spec", "stage sft needs at least one dataset", True),
    (
        "TrainingRun",
        0,
        {"spec.resume": False, "spec.resumeFrom": "s3://qpa/ckpt/"},
        "spec",
        "resumeFrom needs resume: true",
        True,
    ),
    ("TrainingRun", 0, {"spec.store": _DELETE}, "spec", "an s3:// outputUri needs store", True),
    (
        "TrainingRun",
        0,
        {"spec.hyperparameters.learningRate": 0},
        "spec.hyperparameters.learningRate",
        "greater than 0",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"spec.store.secretRef": _DELETE},
        "spec.store.secretRef",
        "Required value",
        True,
    ),
    (
        "TrainingRun",
        0,
        {"metadata.name": LONG_NAME},
        "metadata.name",
        "must be at most 52 characters",
        False,
    ),
    (
        "TrainingRun",
        0,
        {"metadata.name": "Planner_SFT"},
        "metadata.name",
        "RFC 1123 subdomain",
        False,
    ),
    (
        "TrainingRun",
        0,
        {"metadata.labels": {"qpa.ai/model": "not ok!"}},
        "metadata.labels",
        "a valid label must be",
        False,
    ),
    (
        "TrainingRun",
        1,
        {"spec.rl.care.lowSuccessThreshold": 0.9},
        "spec.rl.care",
        "lowSuccessThreshold must not exceed highSuccessThreshold",
        True,
    ),
    (
        "TrainingRun",
        1,
        {"spec.rl.samplesPerTask": 1},
        "spec.rl.samplesPerTask",
        "greater than or equal to 2",
        True,
    ),
    (
        "TrainingRun",
        1,
        {"spec.rl.rolloutPoolRef": _DELETE},
        "spec.rl.rolloutPoolRef",
        "Required value",
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.source.datasetUri": "s3://qpa/tasks.jsonl"},
        "spec.source",
        "set exactly one of generator or datasetUri",
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.source": {}},
        "spec.source",
        "set exactly one of generator or datasetUri",
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.samplesPerTask": 100},
        "spec.samplesPerTask",
        "less than or equal to 64",
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.planner": "gpt"},
        "spec.policy.planner",
        'Unsupported value: "gpt"',
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": _DELETE},
        "spec.policy",
        "planner openai needs modelUrl",
        True,
    ),
    ("TaskBatch", 0, {"spec.shards": 2}, "spec", "shards must be at least parallelism", True),
    (
        "TaskBatch",
        0,
        {"spec.source.capabilities": ["memory", "memory"]},
        "spec.source.capabilities[1]",
        'Duplicate value: "memory"',
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.source.split": "dev"},
        "spec.source.split",
        "Unsupported value",
        True,
    ),
    (
        "TaskBatch",
        0,
        {"spec.resources.requests.cpu": "lots"},
        "spec.resources.requests.cpu",
        "should match",
        True,
    ),
    ("TaskBatch", 0, {"spec.policy": _DELETE}, "spec.policy", "Required value", True),
    (
        "RolloutPool",
        0,
        {"spec.environment": "device"},
        "spec",
        "devicePoolRef is required for environment device",
        True,
    ),
    (
        "RolloutPool",
        0,
        {"spec.replicas": {"min": 5, "max": 2}},
        "spec.replicas",
        "replicas.min must not exceed replicas.max",
        True,
    ),
    (
        "RolloutPool",
        0,
        {"spec.environment": "llm_sim"},
        "spec",
        "llmSim is required for environment llm_sim",
        True,
    ),
    (
        "RolloutPool",
        0,
        {"spec.sessionsPerPod": 0},
        "spec.sessionsPerPod",
        "greater than or equal to 1",
        True,
    ),
    ("RolloutPool", 0, {"spec.image": ""}, "spec.image", "should match", True),
    (
        "DevicePool",
        0,
        {"spec.selector.maxAndroidVersion": 12},
        "spec.selector",
        "minAndroidVersion must not exceed maxAndroidVersion",
        True,
    ),
    (
        "DevicePool",
        0,
        {"spec.healthCheck.timeoutSeconds": 60},
        "spec.healthCheck",
        "timeoutSeconds must be below intervalSeconds",
        True,
    ),
    (
        "DevicePool",
        0,
        {"spec.nodeSelector": {"qpa.ai/device-node": 5}},
        "spec.nodeSelector.qpa.ai/device-node",
        "must be of type string",
        True,
    ),
    (
        "DevicePool",
        0,
        {"spec.selector.serials": ["R5CX", "R5CX"]},
        "spec.selector.serials[1]",
        "Duplicate value",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.model.gpus": 0},
        "spec.model",
        "runtime vllm needs gpus >= 1",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.canary.steps": [10, 50]},
        "spec.canary",
        "the last canary step must be 100",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.canary.steps": [50, 10, 100]},
        "spec.canary",
        "canary steps must increase",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.canary.steps": [10, 10, 100]},
        "spec.canary.steps[1]",
        "Duplicate value: 10",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.canary.steps": [0, 100]},
        "spec.canary.steps[0]",
        "greater than or equal to 1",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.benchmark.samples": 1},
        "spec",
        "benchmark.samples must be at least gate.minSamples",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.gate.minOverall": 1.5},
        "spec.gate.minOverall",
        "less than or equal to 1",
        True,
    ),
    (
        "HarnessRelease",
        0,
        {"spec.promotion": "yolo"},
        "spec.promotion",
        'Unsupported value: "yolo"',
        True,
    ),
    ("HarnessRelease", 0, {"spec.harness": _DELETE}, "spec.harness", "Required value", True),
]


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One server and client for the many malformed resources (they store nothing)."""
    with KubeAPIServer() as server:
        config = write_kubeconfig(tmp_path_factory.mktemp("kube") / "config", server.url)
        client = kubernetes.config.new_client_from_config(config_file=str(config))
        yield custom(client)
        client.close()


def test_there_are_at_least_thirty_malformed_cases() -> None:
    assert len(MALFORMED) >= 30


@pytest.mark.parametrize(
    ("kind", "index", "changes", "field", "words", "pydantic_too"),
    MALFORMED,
    ids=[f"{c[0]}:{c[3]}:{c[4][:40]}" for c in MALFORMED],
)
def test_malformed_custom_resources_are_rejected(
    shared_api: Any,
    kind: str,
    index: int,
    changes: dict[str, Any],
    field: str,
    words: str,
    pydantic_too: bool,
) -> None:
    body = example(kind, index)
    for path, value in changes.items():
        _set(body, path, value)
    with pytest.raises(ApiException) as rejected:
        shared_api.create_namespaced_custom_object(GROUP, VERSION, NS, plural(kind), body)
    error = error_of(rejected)
    assert rejected.value.status == 422 and error["reason"] == "Invalid", error
    name = body["metadata"]["name"]
    assert error["message"].startswith(f'{kind}.qpa.ai "{name}" is invalid: ')
    assert f"{field}: " in error["message"] or field == "metadata.name", error["message"]
    assert words in error["message"], error["message"]
    assert (
        field in [cause["field"] for cause in error["details"]["causes"]]
        or field == "metadata.name"
    )
    if pydantic_too:
        with pytest.raises(ValueError):
            resource_for_kind(kind).model_validate(body)


def test_immutable_fields_are_kept_as_created(shared_api: Any) -> None:
    body = example("TrainingRun")
    body["metadata"]["name"] = "immutable-stage"
    shared_api.create_namespaced_custom_object(GROUP, VERSION, NS, "trainingruns", body)
    with pytest.raises(ApiException) as changed:
        shared_api.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "trainingruns", "immutable-stage", {"spec": {"stage": "rl"}}
        )
    assert changed.value.status == 422
    assert 'spec.stage: Invalid value: "string": stage is immutable' in error_of(changed)["message"]
    shared_api.delete_namespaced_custom_object(
        GROUP, VERSION, NS, "trainingruns", "immutable-stage"
    )


# --------------------------------------------------------------------------- kubectl


def test_kubectl_drives_the_emulator(kubectl: Kubectl, kube_api: KubeAPIServer) -> None:
    applied = kubectl("apply", "-f", "examples/trainingrun.yaml")
    assert "trainingrun.qpa.ai/planner-sft created" in applied.stdout
    kube_api.patch_status("qtr", NS, "planner-sft", {"phase": "Running", "step": 42})
    table = kubectl("get", "qtr").stdout.splitlines()
    assert table[0].split() == ["NAME", "STAGE", "PHASE", "STEP", "NODES", "GPUS", "AGE"]
    assert table[2].split()[:6] == ["planner-sft", "sft", "Running", "42", "2", "8"]
    assert "CHECKPOINT" in kubectl("get", "qtr", "-o", "wide").stdout
    assert "trainingrun.qpa.ai/planner-care-rl" in kubectl("get", "qpa").stdout
    described = kubectl("describe", "qtr", "planner-sft").stdout
    assert "Kind:         TrainingRun" in described and "Zero Stage:" in described
    assert re.search(r"^\s+Phase:\s+Running$", described, re.MULTILINE)
    # nodes is immutable (world size); checkpointEvery changes like any spec field
    kubectl("patch", "qtr", "planner-sft", "--type=merge", "-p", '{"spec":{"checkpointEvery":3}}')
    stored = kube_api.get("qtr", NS, "planner-sft")
    assert stored is not None and stored["spec"]["checkpointEvery"] == 3
    assert stored["metadata"]["generation"] == 2
    kubectl(
        "patch", "qtr", "planner-sft", "--subresource=status", "--type=merge",
        "-p", '{"status":{"step":43}}',
    )  # fmt: skip
    assert "43" in kubectl("get", "qtr", "planner-sft", "-o", "jsonpath={.status.step}").stdout
    strategic = kubectl(
        "patch", "qtr", "planner-sft", "-p", '{"spec":{"checkpointEvery":4}}', check=False
    )
    assert strategic.returncode != 0 and "merge-patch" in strategic.stderr
    again = kubectl("apply", "-f", "examples/trainingrun.yaml").stdout
    assert "planner-care-rl unchanged" in again
    deleted = kubectl("delete", "qtr", "planner-sft", "--wait=false")
    assert 'trainingrun.qpa.ai "planner-sft" deleted' in deleted.stdout
    assert "planner-sft" not in kubectl("get", "qtr").stdout


def test_kubectl_reports_validation_errors_with_the_field(kubectl: Kubectl, tmp_path: Path) -> None:
    body = example("TrainingRun")
    body["spec"]["nodes"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    result = kubectl("apply", "-f", str(path), check=False)
    assert result.returncode != 0
    assert "spec.nodes: Invalid value: 0" in result.stderr


def test_kubectl_applies_crds_selects_labels_and_lists_resources(kubectl: Kubectl) -> None:
    crds = kubectl("apply", "-f", "crds/").stdout
    assert "customresourcedefinition.apiextensions.k8s.io/trainingruns.qpa.ai" in crds
    resources = kubectl("api-resources", "--api-group=qpa.ai").stdout
    for cls in RESOURCES:
        assert f"{cls.info.plural}" in resources and f" {cls.info.short_names[0]} " in resources
    kubectl("apply", "-f", "examples/rolloutpool.yaml")
    kubectl("label", "qrp", "sandbox", "tier=cpu")
    selected = kubectl("get", "qrp", "-l", "tier=cpu", "-o", "name").stdout.split()
    assert selected == ["rolloutpool.qpa.ai/sandbox"]
    pods = kubectl("get", "qrp", "-l", "tier!=cpu", "-o", "name").stdout.split()
    assert pods == ["rolloutpool.qpa.ai/phones"]


def test_the_wheel_also_carries_helm(kube_tools: KubeTools) -> None:
    result = subprocess.run(
        [str(kube_tools.helm), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("v4.")


# --------------------------------------------------------------------------- kopf


@pytest.mark.asyncio
async def test_kopf_operator_runs_against_the_emulator(
    kube_api: KubeAPIServer, kube_config: Path
) -> None:
    kopf = pytest.importorskip("kopf")
    from kopf.testing import KopfRunner

    registry = kopf.OperatorRegistry()
    seen: dict[str, list[Any]] = {"created": [], "updated": [], "deleted": []}

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: Any, **_: Any) -> None:
        settings.persistence.finalizer = "qpa.ai/test"
        settings.networking.error_backoffs = [0.1, 0.2, 0.3]

    @kopf.on.create("qpa.ai", "v1alpha1", "trainingruns", registry=registry)
    def created(name: str, body: Any, patch: Any, **_: Any) -> None:
        seen["created"].append(name)
        kopf.info(body, reason="Reconciling", message="status set to Running")
        patch.status["phase"] = "Running"
        patch.status["step"] = 1

    @kopf.on.update("qpa.ai", "v1alpha1", "trainingruns", field="spec.checkpointEvery",
                    registry=registry)  # fmt: skip
    def updated(new: int, patch: Any, **_: Any) -> None:
        seen["updated"].append(new)
        patch.status["step"] = new

    @kopf.on.delete("qpa.ai", "v1alpha1", "trainingruns", registry=registry)
    def deleted(name: str, **_: Any) -> None:
        seen["deleted"].append(name)

    with KopfRunner(["run", "-A", "--standalone"], registry=registry, timeout=60) as runner:
        await asyncio.sleep(0.5)
        # Injected server errors on PATCH: kopf retries them (error_backoffs) and converges.
        kube_api.faults.fail_next(2, status=500, methods={"PATCH"})
        kube_api.create(example("TrainingRun"))

        def running() -> dict[str, Any] | None:
            obj = kube_api.get("qtr", NS, "planner-sft")
            return obj if obj and obj.get("status", {}).get("phase") == "Running" else None

        obj = await kube_api.eventually(running)
        assert obj["metadata"]["finalizers"] == ["qpa.ai/test"]
        kube_api.patch("qtr", NS, "planner-sft", {"spec": {"checkpointEvery": 5}})
        await kube_api.eventually(
            lambda: (
                (kube_api.get("qtr", NS, "planner-sft") or {}).get("status", {}).get("step") == 5
            )
        )
        kube_api.delete("qtr", NS, "planner-sft")
        await kube_api.eventually(lambda: kube_api.get("qtr", NS, "planner-sft") is None)
        events = await kube_api.eventually(lambda: kube_api.list_objects("events", NS))
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None
    assert seen == {"created": ["planner-sft"], "updated": [5], "deleted": ["planner-sft"]}
    assert kube_api.faults.injected == 2
    (event,) = events
    assert event["involvedObject"]["name"] == "planner-sft" and event["reason"] == "Reconciling"
    assert "Traceback" not in runner.output, runner.output
