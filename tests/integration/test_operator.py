"""The qpa operator driven as a user drives it: `kubectl apply`, then watch what appears.

The real operator (`kopf run -A --standalone -m qpa_operator.main`) runs in a
`kopf.testing.KopfRunner` thread against the test API server (tests/fakes/kube_api.py); the
real kubectl v1.37 applies the examples and shows the printer columns. The tests play the
part of the cluster's controllers the server does not have: they mark Jobs started, complete
or failed, Deployments and DaemonSets ready, InferenceServices Ready, and create the pods'
termination messages and the bridges' phone Leases. Every kind has such a test, then:
restarts in the middle of reconciling 50 objects, and 10% injected API errors.

While the operator runs, tests wait with `await asyncio.sleep` (never `time.sleep`): the API
server and the operator live in other threads.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl

from qpa.api.v1alpha1 import (
    WORK_ORDER_KEY,
    WORK_ORDER_PATH,
    Checkpoint,
    DevicePool,
    RolloutPool,
    TaskBatch,
    TrainingRun,
    TrainSummary,
    WorkOrder,
)
from qpa.envs.serve_config import EnvServeConfig

kopf = pytest.importorskip("kopf")
from helpers.operator_runner import (  # noqa: E402
    NS,
    T0,
    command,
    container,
    event_reasons,
    example,
    exists,
    flag,
    job_complete,
    job_failed,
    mark_job,
    operator,
    owned,
    phase,
    status,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


# --------------------------------------------------------------------------- helpers


async def served_config(kube_api: KubeAPIServer, pool: str) -> EnvServeConfig:
    """The server settings a pool's pod derives from the work order ConfigMap it mounts."""
    config_map = await exists(kube_api, "configmaps", f"{pool}-order")
    order = WorkOrder.parse(yaml.safe_load(config_map["data"][WORK_ORDER_KEY]), RolloutPool)
    return EnvServeConfig.from_rolloutpool(order)


def stored(kube: KubeAPIServer, plural: str, name: str) -> dict[str, Any]:
    obj = kube.get(plural, NS, name)
    assert obj is not None, f"{plural}/{name} is missing"
    return obj


def assert_restricted(pod: dict[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}


def assert_owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> None:
    (ref,) = obj["metadata"]["ownerReferences"]
    assert ref["uid"] == owner["metadata"]["uid"] and ref["controller"] is True
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "qpa-operator"


def table(kubectl: Kubectl, *args: str) -> list[list[str]]:
    return [line.split() for line in kubectl("get", *args).stdout.splitlines()]


def job_started(kube: KubeAPIServer, name: str, active: int = 1) -> None:
    mark_job(kube, name, startTime=T0, active=active, ready=active)


def finished_pod(
    kube: KubeAPIServer,
    name: str,
    labels: dict[str, str],
    container_name: str,
    message: dict[str, Any],
    exit_code: int = 0,
) -> None:
    """A pod as a Job controller and kubelet leave it: terminated, with a termination message."""
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": container_name, "image": "qpa"}]},
        }
    )
    terminated = {"exitCode": exit_code, "reason": "Completed", "message": json.dumps(message)}
    kube.patch_status(
        "pods",
        NS,
        name,
        {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": container_name,
                    "image": "qpa",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        },
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def operator_posts(kube: KubeAPIServer, since: int = 0) -> list[str]:
    return [p for m, p, _, _ in kube.request_log(since) if m == "POST" and "/events" not in p]


# --------------------------------------------------------------------------- TaskBatch


async def test_taskbatch_runs_collect_as_an_indexed_job(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("QPA_OPERATOR_METRICS_PORT", str(port))
    monkeypatch.setenv("QPA_OPERATOR_METRICS_ADDRESS", "127.0.0.1")
    with operator():
        kubectl("apply", "-f", "examples/taskbatch.yaml")
        tb = await exists(kube_api, "qtb", "nightly-tool-use")
        job = await exists(kube_api, "jobs", "nightly-tool-use-collect")
        cm = await exists(kube_api, "configmaps", "nightly-tool-use-order")
        pending = await phase(kube_api, "qtb", "nightly-tool-use", "Pending")

        # The Job: indexed, one shard per completion, per-shard retries, the spec's resources.
        spec = job["spec"]
        assert spec["completionMode"] == "Indexed"
        assert (spec["completions"], spec["parallelism"], spec["backoffLimitPerIndex"]) == (
            32, 16, 3,
        )  # fmt: skip
        argv = command(job)
        assert argv[argv.index("qpa") :] == ["qpa", "collect", "--spec", WORK_ORDER_PATH]
        order = WorkOrder.parse(yaml.safe_load(cm["data"]["workorder.yaml"]), TaskBatch)
        assert order.resource.spec.samples_per_task == 8 and order.resolved.namespace == "default"
        assert order.resolved.rollout_pool_url == "http://sandbox-env.default.svc.cluster.local"
        c = container(job)
        assert c["resources"] == {
            "requests": {"cpu": "500m", "ephemeral-storage": "1Gi", "memory": "1Gi"},
            "limits": {"memory": "2Gi"},
        }
        env = {e["name"]: e for e in c["env"]}
        assert env["QPA_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "planner-api",
            "key": "apiKey",
        }
        assert env["QPA_S3_ACCESS_KEY_FILE"]["value"].startswith("/var/run/secrets/qpa/store/")
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert_restricted(pod)
        assert_owned_by(job, tb)
        assert_owned_by(cm, tb)
        assert "generator" in order.resource.spec.source.model_dump()
        assert pending["jobName"] == "nightly-tool-use-collect"
        assert pending["observedGeneration"] == 1

        rows = table(kubectl, "qtb")
        assert rows[0] == ["NAME", "PHASE", "POOL", "TASKS", "TRAJECTORIES", "SUCCESSES", "AGE"]
        assert rows[1][:6] == ["nightly-tool-use", "Pending", "sandbox", "0", "0", "0"]

        # The Job starts: Running. Two shards finish: their summaries add up.
        job_started(kube_api, "nightly-tool-use-collect", active=16)
        await phase(kube_api, "qtb", "nightly-tool-use", "Running")
        labels = {
            "qpa.ai/taskbatch": "nightly-tool-use",
            "app.kubernetes.io/managed-by": "qpa-operator",
        }
        for shard, (ran, won) in enumerate([(128, 100), (128, 90)]):
            summary = {"out": "s3://qpa/default/taskbatches/nightly-tool-use/",
                       "shard": f"{shard}/32",
                       "total": 128, "ran": ran, "skipped": 0, "successes": won,
                       "complete": True}  # fmt: skip
            finished_pod(
                kube_api,
                f"nightly-tool-use-collect-{shard}-x",
                {**labels, "batch.kubernetes.io/job-completion-index": str(shard)},
                "collect",
                summary,
            )
        await kube_api.eventually(
            lambda: status(kube_api, "qtb", "nightly-tool-use").get("trajectories") == 256
        )
        running = status(kube_api, "qtb", "nightly-tool-use")
        assert (running["successes"], running["failures"], running["tasks"]) == (190, 66, 32)

        # A spec change reaches the Job where a Job can change: parallelism.
        kubectl("patch", "qtb", "nightly-tool-use", "--type=merge", "-p",
                '{"spec":{"parallelism":24}}')  # fmt: skip
        await kube_api.eventually(
            lambda: (
                (kube_api.get("jobs", NS, "nightly-tool-use-collect") or {})["spec"]["parallelism"]
                == 24
            )
        )
        await kube_api.eventually(
            lambda: status(kube_api, "qtb", "nightly-tool-use").get("observedGeneration") == 2
        )

        job_complete(kube_api, "nightly-tool-use-collect", succeeded=32, completedIndexes="0-31")
        done = await phase(kube_api, "qtb", "nightly-tool-use", "Succeeded")
        assert done["completedShards"] == 32
        assert {c["type"]: c["status"] for c in done["conditions"]} == {
            "Progressing": "False",
            "Complete": "True",
            "Ready": "True",  # kstatus: Current (no Reconciling or Stalled left)
        }
        await kube_api.eventually(
            lambda: (
                {"Pending", "Running", "Succeeded"}
                <= set(event_reasons(kube_api, tb["metadata"]["name"]))
            )
        )
        assert "Succeeded" in kubectl("describe", "qtb", "nightly-tool-use").stdout

        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        text = scraped.decode()
        assert 'qpa_operator_objects{kind="TaskBatch",phase="Succeeded"} 1.0' in text
        assert 'qpa_operator_reconciles_total{kind="TaskBatch",reason="create"}' in text
        assert "qpa_operator_reconcile_duration_seconds_bucket" in text

        kubectl("delete", "qtb", "nightly-tool-use", "--wait=false")
        await kube_api.eventually(
            lambda: not owned(kube_api, "jobs", "TaskBatch", "nightly-tool-use")
        )
        assert not owned(kube_api, "configmaps", "TaskBatch", "nightly-tool-use")


async def test_a_failed_collect_job_fails_the_batch(
    kube_api: KubeAPIServer, operator_env: Path
) -> None:
    with operator():
        kube_api.create(example("taskbatch.yaml"))
        await exists(kube_api, "jobs", "nightly-tool-use-collect")
        mark_job(kube_api, "nightly-tool-use-collect", failedIndexes="3,7-8")
        job_failed(kube_api, "nightly-tool-use-collect", reason="FailedIndexes")
        failed = await phase(kube_api, "qtb", "nightly-tool-use", "Failed")
        assert failed["failedShards"] == 3
        cond = {c["type"]: c for c in failed["conditions"]}
        assert cond["Failed"]["status"] == "True" and cond["Failed"]["reason"] == "FailedIndexes"
        await kube_api.eventually(lambda: "Failed" in event_reasons(kube_api, "nightly-tool-use"))
        warnings = [e for e in kube_api.list_objects("events", NS) if e["reason"] == "Failed"]
        assert warnings and warnings[0]["type"] == "Warning"


async def test_a_store_uri_outside_the_namespaces_prefix_fails_the_resource_and_builds_nothing(
    kube_api: KubeAPIServer, operator_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's prefix (`s3://qpa/{namespace}/`): a TaskBatch writing into another
    namespace's prefix and a TrainingRun reading from it are Failed at once with the field
    named (no retry loop, no Job); once moved inside the prefix, the batch runs."""
    monkeypatch.setenv("QPA_OPERATOR_STORE_PREFIX", "s3://qpa/{namespace}/")
    batch = example("taskbatch.yaml")
    batch["spec"]["outputUri"] = "s3://qpa/team-b/taskbatches/stolen/"
    run = example("trainingrun.yaml")
    run["spec"]["baseModelUri"] = "s3://qpa/team-b/models/theirs/"
    with operator():
        kube_api.create(batch)
        kube_api.create(run)
        for plural, name, field in (("qtb", "nightly-tool-use", "spec.outputUri"),
                                    ("qtr", "planner-sft", "spec.baseModelUri")):  # fmt: skip
            failed = await phase(kube_api, plural, name, "Failed")
            cond = {c["type"]: c for c in failed["conditions"]}
            assert (cond["Failed"]["status"], cond["Failed"]["reason"]) == (
                "True",
                "OutsideStorePrefix",
            )
            assert field in cond["Failed"]["message"]
            assert "s3://qpa/default/" in cond["Failed"]["message"]
            assert cond["Ready"]["status"] == "False"
        assert kube_api.list_objects("jobs", NS) == []
        fixed = "s3://qpa/default/taskbatches/nightly-tool-use/"
        kube_api.patch("taskbatches", NS, "nightly-tool-use", {"spec": {"outputUri": fixed}})
        await exists(kube_api, "jobs", "nightly-tool-use-collect")


async def test_a_pod_template_the_operator_refuses_fails_the_resource_and_builds_nothing(
    kube_api: KubeAPIServer, operator_env: Path
) -> None:
    """A service account the chart does not allow for pod overrides (none by default): the
    TaskBatch, TrainingRun and RolloutPool are Failed with the field named, nothing runs under
    that account, and no retry loop; once the override goes, the batch runs."""
    borrowed = {"serviceAccountName": "cluster-deployer"}
    docs = [example(name) for name in ("taskbatch.yaml", "trainingrun.yaml", "rolloutpool.yaml")]
    for doc in docs:
        doc["spec"]["podTemplate"] = borrowed
    # a dataset already in the store: the run builds its pods at once (no batch to wait for)
    docs[1]["spec"]["datasets"] = [{"uri": "s3://qpa/default/datasets/curated/", "weight": 1.0}]
    with operator():
        for doc in docs:
            kube_api.create(doc)
        for plural, name in (("qtb", "nightly-tool-use"), ("qtr", "planner-sft"),
                             ("qrp", "sandbox")):  # fmt: skip
            failed = await phase(kube_api, plural, name, "Failed")
            cond = {c["type"]: c for c in failed["conditions"]}
            assert (cond["Failed"]["status"], cond["Failed"]["reason"]) == (
                "True",
                "PodTemplateRefused",
            )
            assert "spec.podTemplate.serviceAccountName" in cond["Failed"]["message"]
            assert "cluster-deployer" in cond["Failed"]["message"]
        assert kube_api.list_objects("jobs", NS) == []
        assert kube_api.list_objects("deployments", NS) == []
        kube_api.patch("taskbatches", NS, "nightly-tool-use", {"spec": {"podTemplate": None}})
        await exists(kube_api, "jobs", "nightly-tool-use-collect")


def lax_crd(file: str) -> dict[str, Any]:
    """A qpa CRD as an older, looser release might have shipped it: any spec is stored."""
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / file).read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema.pop("x-kubernetes-validations", None)
    return dict(crd)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"matchExpressions": []}
    for _ in range(depth):
        value = {"nodeSelectorTerms": value}
    return value


async def test_a_hostile_stored_pod_template_is_reported_once_and_never_loops_a_handler(
    kube_api: KubeAPIServer, operator_env: Path
) -> None:
    """Objects stored under looser CRDs (before an upgrade tightened them) with pod templates
    the models refuse: unknown structure nested 300 deep in `affinity`, a loader variable.
    Each handler says so once (`Ready=False`, `Stalled=True`, reason `InvalidSpec`, the field
    named) and builds nothing; no handler retries on a timer (the status is written once and
    the requests stop); a corrected spec is reconciled at once."""
    kube_api.apply(lax_crd("qpa.ai_harnessreleases.yaml"))
    kube_api.apply(lax_crd("qpa.ai_taskbatches.yaml"))
    hostile = {
        "affinity": {"nodeAffinity": {"preferred": nested(300)}},
        "env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}],
    }
    release_doc, batch = example("harnessrelease.yaml"), example("taskbatch.yaml")
    release_doc["spec"]["podTemplate"] = hostile
    batch["spec"]["podTemplate"] = hostile
    with operator():
        kube_api.create(release_doc)
        kube_api.create(batch)
        names = (("qhr", release_doc["metadata"]["name"]), ("qtb", batch["metadata"]["name"]))

        def reported() -> bool:
            reasons = [
                {c.get("reason") for c in status(kube_api, plural, name).get("conditions", [])}
                for plural, name in names
            ]
            return all("InvalidSpec" in r for r in reasons)

        await kube_api.eventually(reported)
        for plural, name in names:
            cond = {c["type"]: c for c in status(kube_api, plural, name)["conditions"]}
            assert (cond["Ready"]["status"], cond["Stalled"]["status"]) == ("False", "True")
            assert "podTemplate" in cond["Ready"]["message"]
            assert cond["Ready"]["observedGeneration"] == 1
        since = kube_api.request_count()
        await asyncio.sleep(4)  # a minute's timers at the tests' retry scale, and more
        writes = [
            (method, path)
            for method, path, _, watch in kube_api.request_log(since)
            if not watch and method in ("PATCH", "PUT", "POST", "DELETE")
        ]
        assert writes == [], writes
        for plural in ("jobs", "deployments", "inferenceservices", "configmaps"):
            assert kube_api.list_objects(plural, NS) == [], plural
        name = batch["metadata"]["name"]
        kube_api.patch("taskbatches", NS, name, {"spec": {"podTemplate": None}})
        await exists(kube_api, "jobs", f"{name}-collect")


# --------------------------------------------------------------------------- RolloutPool


async def test_rolloutpool_serves_environments_behind_a_service(
    kube_api: KubeAPIServer, operator_env: Path, kubectl: Kubectl
) -> None:
    with operator():
        kubectl("apply", "-f", "examples/rolloutpool.yaml")
        pool = await exists(kube_api, "qrp", "sandbox")
        deployment = await exists(kube_api, "deployments", "sandbox-env")
        service = await exists(kube_api, "services", "sandbox-env")
        hpa = await exists(kube_api, "horizontalpodautoscalers", "sandbox-env")

        # The pods' one input is the pool itself (its work order), read by `qpa env serve`.
        assert command(deployment) == ["qpa", "env", "serve", "--spec", WORK_ORDER_PATH]
        config = await served_config(kube_api, "sandbox")
        assert (config.kind, config.host, config.port) == ("sandbox", "0.0.0.0", 8000)
        assert (config.sessions_per_pod, config.session_ttl_seconds) == (32, 600)
        assert deployment["spec"]["replicas"] == 2
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert_restricted(pod)
        assert container(deployment)["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert container(deployment)["livenessProbe"]["httpGet"]["path"] == "/health"
        drain = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert drain[:3] == ["qpa", "env", "drain"] and pod["terminationGracePeriodSeconds"] > 120
        headless = await exists(kube_api, "services", "sandbox-env-pods")
        assert headless["spec"]["clusterIP"] == "None"
        assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "qpa_env_sessions_in_use"
        assert service["spec"]["ports"] == [
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
        ]
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
        for child in (deployment, service, hpa):
            assert_owned_by(child, pool)

        # Device-backed: wired to the DevicePool's bridges, allowed to take phone Leases.
        phones = await exists(kube_api, "deployments", "phones-env")
        phones_pod = phones["spec"]["template"]["spec"]
        assert phones_pod["serviceAccountName"] == "phones-env"
        assert phones_pod["automountServiceAccountToken"] is True
        device = await served_config(kube_api, "phones")
        assert (device.kind, device.device_pool) == ("device", "lab-phones")
        assert device.adb == "lab-phones-bridge.default.svc.cluster.local:5037"
        # the env servers are bound to the DevicePool's Role (phone Leases by name), own none
        binding = await exists(kube_api, "rolebindings", "phones-env-phones")
        assert binding["roleRef"]["name"] == "lab-phones-phones"
        assert kube_api.get("roles", NS, "phones-env") is None
        assert kube_api.get("horizontalpodautoscalers", NS, "phones-env") is None
        await kube_api.eventually(
            lambda: (
                {
                    c["type"]: c["status"]
                    for c in status(kube_api, "qrp", "phones").get("conditions", [])
                }.get("DevicePoolFound")
                == "False"
            )
        )

        await phase(kube_api, "qrp", "sandbox", "Pending")
        kube_api.patch_status("deployments", NS, "sandbox-env", {"replicas": 2, "readyReplicas": 1})
        await phase(kube_api, "qrp", "sandbox", "Degraded")
        kube_api.patch_status("deployments", NS, "sandbox-env", {"replicas": 2, "readyReplicas": 2})
        ready = await phase(kube_api, "qrp", "sandbox", "Ready")
        assert (ready["readyReplicas"], ready["capacity"], ready["leased"]) == (2, 64, 0)
        assert ready["free"] == 64
        # the autoscaler read the pods' sessions in use (13.5 on average over 2 pods): the
        # status follows its event, without asking any pod
        reading = {
            "currentReplicas": 2,
            "desiredReplicas": 2,
            "currentMetrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "qpa_env_sessions_in_use"},
                        "current": {"averageValue": "13500m"},
                    },
                }
            ],
        }
        kube_api.patch_status("horizontalpodautoscalers", NS, "sandbox-env", reading)
        await kube_api.eventually(
            lambda: status(kube_api, "qrp", "sandbox").get("free") == 37, timeout=15
        )
        assert status(kube_api, "qrp", "sandbox")["leased"] == 27
        idle = {"currentReplicas": 2, "desiredReplicas": 2, "currentMetrics": []}
        kube_api.patch_status("horizontalpodautoscalers", NS, "sandbox-env", idle)
        await kube_api.eventually(lambda: status(kube_api, "qrp", "sandbox").get("free") == 64)
        assert ready["serviceUrl"] == "http://sandbox-env.default.svc.cluster.local"

        kube_api.create(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": "sandbox-session-1",
                    "namespace": NS,
                    "labels": {"qpa.ai/rolloutpool": "sandbox", "app.kubernetes.io/part-of": "qpa"},
                },
                "spec": {
                    "holderIdentity": "nightly-tool-use-collect-0",
                    "leaseDurationSeconds": 60,
                },
            }
        )
        await kube_api.eventually(lambda: status(kube_api, "qrp", "sandbox").get("leased") == 1)
        rows = table(kubectl, "qrp")
        header = ["NAME", "ENVIRONMENT", "PHASE", "READY", "CAPACITY", "LEASED", "FREE", "AGE"]
        assert rows[0] == header
        assert ["sandbox", "sandbox", "Ready", "2", "64", "1", "63"] in [r[:7] for r in rows]

        # Drift: a deleted child comes back; a hand-edited one is left to its owner's spec.
        uid = stored(kube_api, "services", "sandbox-env")["metadata"]["uid"]
        kube_api.delete("services", NS, "sandbox-env")
        back = await kube_api.eventually(
            lambda: (
                (s := kube_api.get("services", NS, "sandbox-env"))
                and s["metadata"]["uid"] != uid
                and s
            )
        )
        assert back["spec"]["ports"][0]["port"] == 80

        # replicas.max down to min: the autoscaler goes, the Deployment keeps min replicas.
        kubectl("patch", "qrp", "sandbox", "--type=merge", "-p", '{"spec":{"replicas":{"max":2}}}')
        await kube_api.eventually(
            lambda: kube_api.get("horizontalpodautoscalers", NS, "sandbox-env") is None
        )

        kubectl("delete", "qrp", "sandbox", "phones", "--wait=false")
        await kube_api.eventually(lambda: not kube_api.list_objects("deployments", NS))
        for plural in ("services", "horizontalpodautoscalers", "roles", "rolebindings"):
            assert not kube_api.list_objects(
                plural, NS, "app.kubernetes.io/managed-by=qpa-operator"
            )


# --------------------------------------------------------------------------- DevicePool


def phone_lease(serial: str, node: str, **notes: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"lab-phones-{serial.lower()}",
            "namespace": NS,
            "labels": {
                "qpa.ai/devicepool": "lab-phones",
                "qpa.ai/phone": serial.lower(),
                "app.kubernetes.io/part-of": "qpa",
            },
            "annotations": {
                "qpa.ai/serial": serial,
                "qpa.ai/node": node,
                "qpa.ai/model": "Pixel 8",
                "qpa.ai/android-version": "14",
                **{f"qpa.ai/{k.replace('_', '-')}": v for k, v in notes.items()},
            },
        },
        "spec": {"leaseDurationSeconds": 300},
    }


async def test_devicepool_bridges_phones_from_device_nodes(
    kube_api: KubeAPIServer, operator_env: Path, kubectl: Kubectl
) -> None:
    with operator():
        kubectl("apply", "-f", "examples/devicepool.yaml")
        pool = await exists(kube_api, "qdp", "lab-phones")
        ds = await exists(kube_api, "daemonsets", "lab-phones-bridge")
        assert command(ds) == ["qpa", "device", "bridge", "--spec", WORK_ORDER_PATH]
        order_map = await exists(kube_api, "configmaps", "lab-phones-order")
        order = WorkOrder.parse(yaml.safe_load(order_map["data"][WORK_ORDER_KEY]), DevicePool)
        assert order.name == "lab-phones" and order.resource.spec.adb_port == 5037
        pod = ds["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"qpa.ai/device-node": "true"}
        assert container(ds)["securityContext"]["privileged"] is True
        assert {"name": "usb", "hostPath": {"path": "/dev/bus/usb", "type": "Directory"}} in pod[
            "volumes"
        ]
        assert pod["serviceAccountName"] == "lab-phones-bridge"
        assert order.resource.spec.selector.models == ["Pixel 8", "Pixel 7a"]
        svc = await exists(kube_api, "services", "lab-phones-bridge")
        assert svc["spec"]["clusterIP"] == "None"
        for child in (ds, order_map, svc):
            assert_owned_by(child, pool)
        await phase(kube_api, "qdp", "lab-phones", "Pending")

        kube_api.patch_status(
            "daemonsets", NS, "lab-phones-bridge",
            {"desiredNumberScheduled": 2, "numberReady": 2, "currentNumberScheduled": 2,
             "numberMisscheduled": 0},
        )  # fmt: skip
        kube_api.create(phone_lease("R5CT1", "lab-node-1"))
        leased = phone_lease("R5CT2", "lab-node-2")
        leased["spec"]["holderIdentity"] = "phones-env-abc"
        leased["spec"]["renewTime"] = "2099-01-01T00:00:00.000000Z"
        kube_api.create(leased)
        ready = await phase(kube_api, "qdp", "lab-phones", "Ready")
        await kube_api.eventually(lambda: status(kube_api, "qdp", "lab-phones").get("total") == 2)
        ready = status(kube_api, "qdp", "lab-phones")
        assert (ready["available"], ready["leased"], ready["quarantined"]) == (1, 1, 0)
        assert [(p["serial"], p["node"], p["state"]) for p in ready["phones"]] == [
            ("R5CT1", "lab-node-1", "available"),
            ("R5CT2", "lab-node-2", "leased"),
        ]
        assert ready["phones"][1]["leasedBy"] == "phones-env-abc"
        # the Roles now grant get/update on exactly these two Leases
        names = ["lab-phones-r5ct1", "lab-phones-r5ct2"]
        for role in ("lab-phones-bridge", "lab-phones-phones"):
            await kube_api.eventually(
                lambda r=role: (
                    [
                        rule.get("resourceNames")
                        for rule in (kube_api.get("roles", NS, r) or {}).get("rules", [])
                        if rule["resources"] == ["leases"] and "resourceNames" in rule
                    ]
                    == [names]
                )
            )

        kube_api.create(
            phone_lease("R5CT3", "lab-node-1", state="quarantined", reason="adb timeout")
        )
        degraded = await phase(kube_api, "qdp", "lab-phones", "Degraded")
        assert degraded["quarantined"] == 1
        rows = table(kubectl, "qdp")
        assert rows[0] == ["NAME", "PHASE", "PHONES", "AVAILABLE", "LEASED", "QUARANTINED", "AGE"]
        assert rows[1][:6] == ["lab-phones", "Degraded", "3", "1", "1", "1"]

        kubectl("delete", "qdp", "lab-phones", "--wait=false")
        await kube_api.eventually(
            lambda: kube_api.get("daemonsets", NS, "lab-phones-bridge") is None
        )
        # The bridge's Leases carry no owner reference here: the operator deletes them.
        await kube_api.eventually(lambda: not kube_api.list_objects("leases", NS))
        assert not kube_api.list_objects("roles", NS)


# --------------------------------------------------------------------------- TrainingRun


def gpu_node(kube: KubeAPIServer, name: str, gpus: int = 8) -> None:
    """A Ready GPU node with room for one of the examples' ranks (as its kubelet reports it)."""
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    room = {"cpu": "96", "memory": "1Ti", "ephemeral-storage": "2Ti", "pods": "110",
            "nvidia.com/gpu": str(gpus)}  # fmt: skip
    kube.patch_status(
        "nodes", None, name,
        {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": room},
    )  # fmt: skip


def condition_types(kube: KubeAPIServer, plural: str, name: str) -> set[str]:
    return {c["type"] for c in status(kube, plural, name).get("conditions", [])}


async def test_trainingrun_runs_deepspeed_ranks_and_resumes(
    kube_api: KubeAPIServer, operator_env: Path, kubectl: Kubectl
) -> None:
    for index in range(6):  # room for both runs: 4 + 2 nodes of 8 GPUs
        gpu_node(kube_api, f"gpu-{index}")
    with operator():
        kubectl("apply", "-f", "examples/taskbatch.yaml")
        kubectl("apply", "-f", "examples/trainingrun.yaml")

        # RL: no datasets to prepare, the ranks' Job at once, admitted whole (every rank fits).
        rl = await exists(kube_api, "qtr", "planner-care-rl")
        await exists(kube_api, "jobs", "planner-care-rl-r0")
        await kube_api.eventually(
            lambda: stored(kube_api, "jobs", "planner-care-rl-r0")["spec"]["suspend"] is False
        )
        # The Job is unsuspended before the status patch that records why lands: wait for both.
        await kube_api.eventually(
            lambda: "Admitted" in condition_types(kube_api, "qtr", "planner-care-rl")
        )
        admitted = {c["type"]: c for c in status(kube_api, "qtr", "planner-care-rl")["conditions"]}
        assert admitted["Admitted"]["status"] == "True", admitted
        assert admitted["Admitted"]["message"].startswith("all 4 ranks")
        job = stored(kube_api, "jobs", "planner-care-rl-r0")
        spec = job["spec"]
        assert [r["action"] for r in spec["podFailurePolicy"]["rules"]] == ["FailJob", "FailJob"]
        assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == (
            "Indexed", 4, 4,
        )  # fmt: skip
        assert spec["backoffLimit"] == 0
        argv = command(job)
        launch, stage = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
        assert launch[:3] == ["qpa", "train", "launch"]
        assert flag(launch, "--nodes") == "4" and flag(launch, "--gpus-per-node") == "8"
        assert flag(launch, "--service") == "planner-care-rl-ranks"
        assert flag(launch, "--job-name") == "planner-care-rl-r0"
        assert stage == ["qpa", "train", "rl", "--spec", WORK_ORDER_PATH]  # no spec value in argv
        c = container(job)
        assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        pod = spec["template"]["spec"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert pod["subdomain"] == "planner-care-rl-ranks"
        assert_restricted(pod)
        ranks = await exists(kube_api, "services", "planner-care-rl-ranks")
        assert ranks["spec"]["clusterIP"] == "None" and ranks["spec"]["publishNotReadyAddresses"]
        config = await exists(kube_api, "configmaps", "planner-care-rl-order")
        order = WorkOrder.parse(yaml.safe_load(config["data"][WORK_ORDER_KEY]), TrainingRun)
        assert (
            order.resource.spec.base_model_uri == "s3://qpa/default/trainingruns/planner-sft/final/"
        )
        assert order.resolved.rollout_pool_url == "http://sandbox-env.default.svc.cluster.local"
        assert order.resource.spec.rl is not None
        assert order.resource.spec.rl.care.low_success_threshold == 0.2
        assert order.resource.spec.rl.samples_per_task == 8
        for child in (job, ranks, config):
            assert_owned_by(child, rl)

        # SFT waits for its TaskBatch, then curates and mixes, then trains.
        waiting = await phase(kube_api, "qtr", "planner-sft", "Pending")
        reasons = {c["type"]: c["reason"] for c in waiting["conditions"]}
        assert reasons["DataReady"] == "WaitingForTaskBatch"
        assert kube_api.get("jobs", NS, "planner-sft-data") is None
        await exists(kube_api, "jobs", "nightly-tool-use-collect")
        job_complete(kube_api, "nightly-tool-use-collect", succeeded=32)
        data = await exists(kube_api, "jobs", "planner-sft-data")
        script = container(data)["command"][-1]
        assert "qpa data curate s3://qpa/default/taskbatches/nightly-tool-use/" in script
        assert (
            "qpa data mix" in script
            and "--out s3://qpa/default/trainingruns/planner-sft/data/mix/" in script
        )
        assert kube_api.get("jobs", NS, "planner-sft-r0") is None
        job_complete(kube_api, "planner-sft-data", succeeded=1)
        sft_job = await exists(kube_api, "jobs", "planner-sft-r0")
        assert command(sft_job)[command(sft_job).index("--") + 1 :][:3] == ["qpa", "train", "sft"]
        sft_order = WorkOrder.parse(
            yaml.safe_load(
                stored(kube_api, "configmaps", "planner-sft-order")["data"][WORK_ORDER_KEY]
            ),
            TrainingRun,
        )
        assert (
            sft_order.resolved.dataset_uri == "s3://qpa/default/trainingruns/planner-sft/data/mix/"
        )

        job_started(kube_api, "planner-sft-r0", active=2)
        await phase(kube_api, "qtr", "planner-sft", "Running")
        rows = table(kubectl, "qtr")
        assert rows[0] == ["NAME", "STAGE", "PHASE", "STEP", "NODES", "GPUS", "AGE"]
        assert ["planner-sft", "sft", "Running", "0", "2", "8"] in [r[:6] for r in rows]

        # Rank 0 reports, the attempt fails: attempt 1 resumes from the latest checkpoint.
        labels = {"qpa.ai/trainingrun": "planner-sft", "qpa.ai/attempt": "0",
                  "batch.kubernetes.io/job-completion-index": "0",
                  "app.kubernetes.io/managed-by": "qpa-operator"}  # fmt: skip
        ckpt = "s3://qpa/default/trainingruns/planner-sft/checkpoints/checkpoint-{}/"
        finished_pod(
            kube_api, "planner-sft-r0-0-abc", labels, "trainer",
            TrainSummary(run="planner-sft", stage="sft", step=400, loss=0.75, checkpoints=[
                Checkpoint(step=s, uri=ckpt.format(s)) for s in (200, 400)]).to_k8s(),
            exit_code=1,
        )  # fmt: skip
        job_failed(kube_api, "planner-sft-r0")
        resuming = await phase(kube_api, "qtr", "planner-sft", "Resuming")
        assert resuming["restarts"] == 1
        await exists(kube_api, "jobs", "planner-sft-r1")
        assert kube_api.get("jobs", NS, "planner-sft-r0") is not None  # kept for its logs
        await kube_api.eventually(lambda: status(kube_api, "qtr", "planner-sft").get("step") == 400)
        resumed = status(kube_api, "qtr", "planner-sft")
        assert resumed["latestCheckpoint"] == ckpt.format(400)
        assert [c["step"] for c in resumed["checkpoints"]] == [200, 400]
        assert resumed["metrics"]["loss"] == 0.75

        job_complete(kube_api, "planner-sft-r1", succeeded=2)
        done = await phase(kube_api, "qtr", "planner-sft", "Succeeded")
        assert done["modelUri"] == "s3://qpa/default/trainingruns/planner-sft/final/"
        await kube_api.eventually(lambda: "Resuming" in event_reasons(kube_api, "planner-sft"))

        kubectl("delete", "qtr", "planner-sft", "planner-care-rl", "--wait=false")
        await kube_api.eventually(lambda: not owned(kube_api, "jobs", "TrainingRun", "planner-sft"))
        assert not owned(kube_api, "services", "TrainingRun", "planner-care-rl")
        assert not owned(kube_api, "configmaps", "TrainingRun", "planner-sft")


# --------------------------------------------------------------------------- HarnessRelease


# --------------------------------------------------------------------------- reliability


def taskbatch(name: str) -> dict[str, Any]:
    body = example("taskbatch.yaml")
    body["metadata"] = {"name": name, "namespace": NS}
    body["spec"].pop("rolloutPoolRef")
    return body


def mark_new_jobs_started(kube: KubeAPIServer) -> None:
    for job in kube.list_objects("jobs", NS, "qpa.ai/taskbatch"):
        if not (job.get("status") or {}).get("startTime"):
            job_started(kube, job["metadata"]["name"])


def running_count(kube: KubeAPIServer) -> int:
    return sum(
        1
        for tb in kube.list_objects("qtb", NS)
        if (tb.get("status") or {}).get("phase") == "Running"
    )


async def converge(kube: KubeAPIServer, count: int, timeout: float = 60) -> None:
    def check() -> bool:
        mark_new_jobs_started(kube)
        return running_count(kube) == count

    await kube.eventually(check, timeout=timeout, interval=0.2)


def assert_no_duplicates(kube: KubeAPIServer, names: list[str]) -> None:
    jobs = kube.list_objects("jobs", NS, "qpa.ai/taskbatch")
    cms = kube.list_objects("configmaps", NS, "qpa.ai/taskbatch")
    assert sorted(j["metadata"]["name"] for j in jobs) == sorted(f"{n}-collect" for n in names)
    assert sorted(c["metadata"]["name"] for c in cms) == sorted(f"{n}-order" for n in names)
    for tb in kube.list_objects("qtb", NS):
        (job,) = [
            j for j in jobs if j["metadata"]["labels"]["qpa.ai/taskbatch"] == tb["metadata"]["name"]
        ]
        assert job["metadata"]["ownerReferences"][0]["uid"] == tb["metadata"]["uid"]


async def test_restarts_in_the_middle_of_reconciling_fifty_objects(
    kube_api: KubeAPIServer, operator_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Handlers in flight get 50 ms at shutdown (kopf gives 2 s): stops are nearly crashes;
    # a slow API server keeps the reconciles of the 50 objects in flight when they come.
    monkeypatch.setenv("QPA_OPERATOR_EXIT_TIMEOUT", "0.05")
    kube_api.faults.slow_down(0.2, methods={"POST", "PATCH"})
    names = [f"batch-{i:02d}" for i in range(50)]
    for name in names:
        kube_api.create(taskbatch(name))

    def count() -> int:
        return len(kube_api.list_objects("jobs", NS, "qpa.ai/taskbatch")) + len(
            kube_api.list_objects("configmaps", NS, "qpa.ai/taskbatch")
        )

    def handled() -> int:
        return sum(
            1
            for tb in kube_api.list_objects("qtb", NS)
            if "qpa.ai/last-handled-configuration" in (tb["metadata"].get("annotations") or {})
            and (tb.get("status") or {}).get("phase")
        )

    progress = [0]
    for target in (10, 40, 70):

        def reached(wanted: int = target) -> bool:
            return count() >= wanted

        with operator():
            # Stop as soon as part of the work is done: the other handlers are in flight.
            await kube_api.eventually(reached, timeout=30, interval=0.01)
        mark_new_jobs_started(kube_api)
        progress.append(count())
    assert progress == sorted(progress) and progress[1] < 100, progress
    children = progress[-1]
    kube_api.faults.clear()
    since = kube_api.request_count()
    with operator():
        await converge(kube_api, 50)
        await kube_api.eventually(lambda: handled() == 50)  # kopf recorded every spec too
    assert_no_duplicates(kube_api, names)
    # The last run created exactly what the interrupted ones had not: no POST was wasted.
    creates = [p for p in operator_posts(kube_api, since) if "/jobs" in p or "/configmaps" in p]
    assert len(creates) == 100 - children

    # A quiet restart of a converged operator writes nothing.
    since = kube_api.request_count()
    with operator():
        await asyncio.sleep(2.0)
        assert running_count(kube_api) == 50
    writes = [r for r in kube_api.request_log(since) if r[0] in ("POST", "PUT", "PATCH", "DELETE")]
    assert writes == [], writes
    assert_no_duplicates(kube_api, names)


async def test_everything_converges_with_ten_percent_api_errors(
    kube_api: KubeAPIServer, operator_env: Path
) -> None:
    names = [f"faulty-{i:02d}" for i in range(30)]
    pools = [f"pool-{i}" for i in range(5)]
    # 10% of requests fail: 500 and 429 on any verb, 409 on writes (where servers answer it).
    kube_api.faults.fail_fraction(0.034, status=500)
    kube_api.faults.fail_fraction(0.034, status=429)
    kube_api.faults.fail_fraction(0.034, status=409, methods={"POST", "PUT", "PATCH", "DELETE"})
    with operator():
        for name in names:
            kube_api.create(taskbatch(name))
        for name in pools:
            body = example("rolloutpool.yaml")
            body["metadata"] = {"name": name, "namespace": NS}
            kube_api.create(body)

        def pools_ready() -> bool:
            ready = 0
            for name in pools:
                dep = kube_api.get("deployments", NS, f"{name}-env")
                if dep is not None and not dep.get("status"):
                    kube_api.patch_status("deployments", NS, f"{name}-env",
                                          {"replicas": 2, "readyReplicas": 2})  # fmt: skip
                ready += status(kube_api, "qrp", name).get("phase") == "Ready"
            return ready == len(pools)

        await converge(kube_api, len(names), timeout=90)
        await kube_api.eventually(pools_ready, timeout=60, interval=0.2)
    assert kube_api.faults.injected > 10, kube_api.faults.log
    statuses = {s for s, _, _ in kube_api.faults.log}
    assert statuses == {500, 429, 409}
    assert_no_duplicates(kube_api, names)
    for name in pools:
        assert len(owned(kube_api, "deployments", "RolloutPool", name)) == 1
        assert len(owned(kube_api, "services", "RolloutPool", name)) == 2  # + headless
