"""The test kubelet (fakes.kubelet) runs real processes for Jobs, Deployments and DaemonSets.

Small shell and python commands only: each test proves one thing the e2e tests rely on.
"""

from __future__ import annotations

import base64
import os
import urllib.request
from typing import Any

import psutil
import pytest
from fakes.kube_api import KubeAPIServer
from fakes.kubelet import REPO_ROOT, TestKubelet, expand, format_indexes, image_command

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

NS = "default"


def job(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A Job running `sh -c script` in one container named `main`."""
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}],
    }
    pod_spec |= spec.pop("pod", {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}, **spec},
    }


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def pods_of(kube: KubeAPIServer, app: str) -> list[dict[str, Any]]:
    return kube.list_objects("pods", NS, f"app={app}")


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    state = pod["status"]["containerStatuses"][0]["state"]
    return dict(state.get("terminated") or {})


async def test_helpers_expand_and_format_indexes() -> None:
    env = {"A": "x", "B": "y"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "x-y-$(C)-$(A)"
    assert format_indexes({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert format_indexes(set()) == ""


async def test_indexed_job_completes_with_termination_messages(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    script = 'printf "index=$JOB_COMPLETION_INDEX host=$(hostname)" > /dev/termination-log'
    kube_api.create(job("idx", script, completions=3, parallelism=3, completionMode="Indexed"))
    done = await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "idx"), "Complete"))
    assert done["reason"] == "CompletionsReached"
    status = kube_api.get("jobs", NS, "idx")["status"]
    assert status["completedIndexes"] == "0-2"
    assert status["succeeded"] == 3 and "active" not in status
    assert status["startTime"] and status["completionTime"]
    assert condition(kube_api.get("jobs", NS, "idx"), "SuccessCriteriaMet")
    pods = pods_of(kube_api, "idx")
    messages = sorted(terminated(p)["message"] for p in pods)
    assert messages == [f"index={i} host=idx-{i}" for i in range(3)]
    for pod in pods:
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == index
        assert pod["metadata"]["name"].startswith(f"idx-{index}-")
        assert pod["status"]["phase"] == "Succeeded"
        assert terminated(pod)["exitCode"] == 0 and terminated(pod)["reason"] == "Completed"


async def test_env_from_secret_configmap_and_fieldref_and_a_configmap_volume(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kube_api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {"token": base64.b64encode(b"s3cret").decode()},
        }
    )
    kube_api.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "order"},
            "data": {"workorder.yaml": "kind: TaskBatch\n", "level": "debug"},
        }
    )
    script = (
        'echo "$TOKEN|$LEVEL|$POD|$NS|$IP|$NODE|$GREETING" > /dev/termination-log;'
        " cat /etc/qpa/order/workorder.yaml >> /dev/termination-log;"
        " touch /etc/qpa/order/x 2>/dev/null && echo writable >> /dev/termination-log;"
        " ls /etc/qpa/order >> /dev/termination-log"
    )
    spec = job("env", script)
    container = spec["spec"]["template"]["spec"]["containers"][0]

    def ref(kind: str, name: str, key: str) -> dict[str, Any]:
        return {"valueFrom": {kind: {"name": name, "key": key}}}

    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    container["env"] = [
        {"name": "TOKEN", **ref("secretKeyRef", "creds", "token")},
        {"name": "LEVEL", **ref("configMapKeyRef", "order", "level")},
        {"name": "POD", **field("metadata.name")},
        {"name": "NS", **field("metadata.namespace")},
        {"name": "IP", **field("status.podIP")},
        {"name": "NODE", **field("spec.nodeName")},
        {"name": "GREETING", "value": "hello $(POD)"},
    ]
    container["volumeMounts"] = [{"name": "order", "mountPath": "/etc/qpa/order", "readOnly": True}]
    spec["spec"]["template"]["spec"]["volumes"] = [
        {
            "name": "order",
            "configMap": {
                "name": "order",
                "items": [{"key": "workorder.yaml", "path": "workorder.yaml"}],
            },
        }
    ]
    existed = os.path.exists("/etc/qpa/order")
    kube_api.create(spec)
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "env"), "Complete"))
    pod = pods_of(kube_api, "env")[0]
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    lines = terminated(pod)["message"].splitlines()
    assert lines[0] == f"s3cret|debug|{name}|default|{ip}|qpa-test-node|hello {name}"
    assert lines[1:] == ["kind: TaskBatch", "workorder.yaml"]  # read-only, one item only
    kubelet.stop()
    assert os.path.exists("/etc/qpa/order") == existed  # the mount point is removed again


async def test_a_killed_pod_is_retried_per_index_and_an_ignore_rule_does_not_count(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    # index 0 sleeps until killed, then succeeds on its retry (a marker file in a hostPath)
    marker = kubelet.root / "shared"
    marker.mkdir(parents=True)
    kubelet.host_paths["/shared"] = marker
    script = (
        'if [ "$JOB_COMPLETION_INDEX" = 1 ]; then exit 0; fi;'
        " if [ -e /shared/tried ]; then exit 0; fi; touch /shared/tried; exec sleep 300"
    )
    spec = job(
        "retry",
        script,
        completions=2,
        parallelism=2,
        completionMode="Indexed",
        backoffLimitPerIndex=1,
        maxFailedIndexes=0,
        pod={"volumes": [{"name": "shared", "hostPath": {"path": "/shared"}}]},
    )
    spec["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "shared", "mountPath": "/shared"}
    ]
    kube_api.create(spec)

    def sleeping() -> str | None:
        for pod in pods_of(kube_api, "retry"):
            if (pod.get("status") or {}).get("phase") == "Running" and (marker / "tried").exists():
                return str(pod["metadata"]["name"])
        return None

    victim = await kubelet.eventually(sleeping)
    kubelet.kill(victim)
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "retry"), "Complete"))
    status = kube_api.get("jobs", NS, "retry")["status"]
    assert status["failed"] == 1 and status["completedIndexes"] == "0-1"
    assert status.get("failedIndexes", "") == ""
    killed = kube_api.get("pods", NS, victim)
    assert killed["status"]["phase"] == "Failed"
    assert terminated(killed)["exitCode"] == 137 and terminated(killed)["reason"] == "Error"

    # the same crash under a podFailurePolicy Ignore rule: retried, not counted
    (marker / "tried").unlink()
    policy = {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}}]}
    spec["metadata"]["name"] = "ignored"
    spec["spec"]["template"]["metadata"]["labels"]["app"] = "ignored"
    spec["spec"] |= {"backoffLimitPerIndex": 0, "podFailurePolicy": policy}
    kube_api.create(spec)
    victim = await kubelet.eventually(
        lambda: (marker / "tried").exists() and sleeping_in(kube_api, "ignored")
    )
    kubelet.kill(victim)
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "ignored"), "Complete"))
    status = kube_api.get("jobs", NS, "ignored")["status"]
    assert "failed" not in status and status["completedIndexes"] == "0-1"


def sleeping_in(kube: KubeAPIServer, app: str) -> str | None:
    for pod in pods_of(kube, app):
        if (pod.get("status") or {}).get("phase") == "Running":
            return str(pod["metadata"]["name"])
    return None


async def test_fail_job_rule_and_backoff_limit(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    kube_api.create(job("fatal", "exit 42", backoffLimit=5, podFailurePolicy=policy))
    kube_api.create(
        job(
            "flaky",
            "echo broken; exit 3",
            backoffLimit=1,
            pod={
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "command": ["sh", "-c", "echo broken >&2; exit 3"],
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                    }
                ]
            },
        )
    )
    fatal = await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "fatal"), "Failed"))
    assert fatal["reason"] == "PodFailurePolicy"
    assert "failed with exit code 42 matching FailJob rule at index 0" in fatal["message"]
    flaky = await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "flaky"), "Failed"))
    assert flaky["reason"] == "BackoffLimitExceeded"
    assert kube_api.get("jobs", NS, "flaky")["status"]["failed"] == 2
    pod = pods_of(kube_api, "flaky")[0]
    assert terminated(pod)["message"] == "broken"  # FallbackToLogsOnError: the log's tail
    assert "broken" in kubelet.logs(pod["metadata"]["name"])


async def test_deleting_a_job_kills_its_processes(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kube_api.create(
        job(
            "long",
            "sleep 300 & sleep 301; wait",
            parallelism=2,
            completions=2,
            pod={"terminationGracePeriodSeconds": 1},
        )
    )
    await kubelet.eventually(
        lambda: (
            len(
                [
                    p
                    for p in pods_of(kube_api, "long")
                    if p.get("status", {}).get("phase") == "Running"
                ]
            )
            == 2
        )
    )
    status = await kubelet.eventually(
        lambda: (kube_api.get("jobs", NS, "long") or {}).get("status")
    )
    assert status["active"] == 2
    groups = [
        g for p in pods_of(kube_api, "long") for g in kubelet.process_groups(p["metadata"]["name"])
    ]

    def members() -> list[int]:
        found = []
        for proc in psutil.process_iter(["pid"]):
            with_group = None
            try:
                with_group = os.getpgid(proc.pid)
            except ProcessLookupError:
                continue
            if with_group in groups and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        return found

    # two shells, two sleeps each (the shells may still be starting their sleeps)
    await kubelet.eventually(lambda: len(members()) >= 4)
    kube_api.delete("jobs", NS, "long")
    await kubelet.eventually(lambda: not members(), timeout=10)
    assert pods_of(kube_api, "long") == []


def deployment(name: str, replicas: int, port: int, **container: Any) -> dict[str, Any]:
    spec = {
        "name": "web",
        "image": "qpa",
        "command": ["python", "-m", "http.server", str(port)],
        "ports": [{"name": "http", "containerPort": port}],
        **container,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [spec]}},
        },
    }


def service(name: str, port: int, target: Any, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"app": name},
            "ports": [{"port": port, "targetPort": target}],
            **spec,
        },
    }


def fetch(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except OSError:
        return None


async def test_deployment_behind_a_service_is_reachable_and_heals(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kube_api.create(deployment("web", 2, 18321))
    kube_api.create(service("web", 80, "http"))
    # one host network: the second replica waits for the port, as with a hostPort
    pending = await kubelet.eventually(
        lambda: [
            p
            for p in pods_of(kube_api, "web")
            if any(
                c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
    )
    assert "didn't have free ports" in pending[0]["status"]["conditions"][0]["message"]
    ready = await kubelet.eventually(
        lambda: (kube_api.get("deployments", NS, "web").get("status") or {}).get("readyReplicas")
    )
    assert ready == 1
    await kubelet.eventually(lambda: fetch(kubelet.url("web", NS, 80)) == 200)
    # a client in a pod reaches it by its DNS name on port 80
    probe = job(
        "client",
        'python -c "import urllib.request as u; '
        "print(u.urlopen('http://web.default.svc.cluster.local/').status)\" "
        "> /dev/termination-log; wget -q -O- http://web/ >/dev/null",
    )
    kube_api.create(probe)
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "client"), "Complete"))
    assert terminated(pods_of(kube_api, "client")[0])["message"].strip() == "200"
    # a crash: the container restarts in place (restartPolicy Always)
    running = next(p for p in pods_of(kube_api, "web") if p["status"].get("phase") == "Running")
    kubelet.kill(running["metadata"]["name"])
    restarted = await kubelet.eventually(
        lambda: kube_api.get("pods", NS, running["metadata"]["name"])["status"][
            "containerStatuses"
        ][0]["restartCount"]
    )
    assert restarted == 1
    # a deleted pod is replaced, and the Service answers again
    kube_api.delete("pods", NS, running["metadata"]["name"])
    await kubelet.eventually(
        lambda: len(pods_of(kube_api, "web")) == 2 and fetch(kubelet.url("web", NS, 80)) == 200
    )
    status = kube_api.get("deployments", NS, "web")["status"]
    assert status["replicas"] == 2 and status["updatedReplicas"] == 2
    assert status["observedGeneration"] == 1


async def test_rolling_a_deployment_to_a_new_template(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kube_api.create(deployment("roll", 1, 18322))
    first = await kubelet.eventually(
        lambda: [
            p for p in pods_of(kube_api, "roll") if p.get("status", {}).get("phase") == "Running"
        ]
    )
    kube_api.patch(
        "deployments", NS, "roll", {"spec": {"template": {"metadata": {"annotations": {"v": "2"}}}}}
    )

    def rolled() -> bool:
        pods = pods_of(kube_api, "roll")
        status = kube_api.get("deployments", NS, "roll").get("status") or {}
        return (
            len(pods) == 1
            and pods[0]["metadata"]["uid"] != first[0]["metadata"]["uid"]
            and status.get("observedGeneration") == 2
            and status.get("readyReplicas") == 1
        )

    await kubelet.eventually(rolled)


async def test_readiness_probe_gates_ready(kube_api: KubeAPIServer, kubelet: TestKubelet) -> None:
    probe = {"exec": {"command": ["test", "-e", "/tmp/ready"]}, "periodSeconds": 1}
    web = deployment("gate", 1, 18323, readinessProbe=probe)
    web["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "sh",
        "-c",
        "sleep 1.5; touch /tmp/ready; exec sleep 300",
    ]
    kube_api.create(web)
    pod = await kubelet.eventually(
        lambda: [
            p for p in pods_of(kube_api, "gate") if p.get("status", {}).get("phase") == "Running"
        ]
    )
    name = pod[0]["metadata"]["name"]
    assert not kube_api.get("pods", NS, name)["status"]["containerStatuses"][0]["ready"]
    await kubelet.eventually(lambda: condition(kube_api.get("pods", NS, name), "Ready"))
    http = deployment(
        "gate-http",
        1,
        18324,
        readinessProbe={"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    )
    kube_api.create(http)
    await kubelet.eventually(
        lambda: (
            (kube_api.get("deployments", NS, "gate-http").get("status") or {}).get("readyReplicas")
            == 1
        )
    )


async def test_daemonset_lands_only_on_matching_nodes(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kubelet.add_node("phone-host", {"qpa.ai/devices": "true"})
    kubelet.add_node("plain", {})
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "bridge", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "bridge"}},
            "template": {
                "metadata": {"labels": {"app": "bridge"}},
                "spec": {
                    "nodeSelector": {"qpa.ai/devices": "true"},
                    "containers": [{"name": "b", "image": "qpa", "command": ["sleep", "300"]}],
                },
            },
        },
    }
    kube_api.create(ds)
    status = await kubelet.eventually(
        lambda: (
            (s := kube_api.get("daemonsets", NS, "bridge").get("status") or {}).get("numberReady")
            == 1
            and s
        )
    )
    assert status["desiredNumberScheduled"] == 1 and status["currentNumberScheduled"] == 1
    pods = pods_of(kube_api, "bridge")
    assert [p["spec"]["nodeName"] for p in pods] == ["phone-host"]
    kubelet.add_node("phone-host-2", {"qpa.ai/devices": "true"})
    await kubelet.eventually(
        lambda: (
            (kube_api.get("daemonsets", NS, "bridge").get("status") or {}).get("numberReady") == 2
        )
    )


async def test_headless_service_names_each_indexed_pod(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kube_api.create(
        service("ranks", 29500, 29500, clusterIP="None", publishNotReadyAddresses=True)
        | {
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "ranks"},
                "ports": [{"port": 29500}],
            }
        }
    )
    script = (
        "sleep 0.5; getent hosts ranks-0.ranks.default.svc.cluster.local ranks-1.ranks | "
        "awk '{print $1}' | sort -u | wc -l > /dev/termination-log"
    )
    kube_api.create(
        job(
            "ranks",
            script,
            completions=2,
            parallelism=2,
            completionMode="Indexed",
            pod={"subdomain": "ranks"},
        )
    )
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "ranks"), "Complete"))
    assert [terminated(p)["message"].strip() for p in pods_of(kube_api, "ranks")] == ["2", "2"]


async def test_image_cmd_and_a_volume_over_the_repository(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    assert image_command("ghcr.io/qpa-ai/qpa-sandbox:0.1.0")[:3] == ["qpa", "env", "serve"]
    # the operator mounts emptyDirs at /work and /tmp: the image (this venv) stays whole
    script = (
        'echo hi > /work/out && python -c "import qpa, sys; print(sys.prefix)"'
        " > /dev/termination-log && ls -A /tmp >> /dev/termination-log"
    )
    spec = job(
        "image",
        script,
        pod={"volumes": [{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]},
    )
    spec["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "work", "mountPath": "/work"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    kube_api.create(spec)
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "image"), "Complete"))
    prefix, *in_tmp = terminated(pods_of(kube_api, "image")[0])["message"].splitlines()
    assert prefix == str(REPO_ROOT / ".venv")
    # the pod's /tmp is its own emptyDir: nothing of the host's /tmp shows, only the mount
    # point of the repository bound back in when the checkout itself lives under /tmp
    inside = REPO_ROOT.relative_to("/tmp").parts[:1] if REPO_ROOT.is_relative_to("/tmp") else ()
    assert in_tmp == list(inside)


async def test_active_deadline_and_suspend(kube_api: KubeAPIServer, kubelet: TestKubelet) -> None:
    kube_api.create(job("slow", "sleep 300", activeDeadlineSeconds=1))
    kube_api.create(job("later", "true", suspend=True))
    late = await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "slow"), "Failed"))
    assert late["reason"] == "DeadlineExceeded"
    await kubelet.eventually(lambda: not pods_of(kube_api, "slow"))  # its pod is deleted
    assert condition(kube_api.get("jobs", NS, "later"), "Suspended")
    assert pods_of(kube_api, "later") == []
    kube_api.patch("jobs", NS, "later", {"spec": {"suspend": False}})
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "later"), "Complete"))


IN_CLUSTER = """
import kubernetes, pathlib
kubernetes.config.load_incluster_config()  # https + ca.crt + token, as in a real cluster
cm = kubernetes.client.CoreV1Api().read_namespaced_config_map("settings", "default")
ns = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text()
pathlib.Path("/dev/termination-log").write_text(cm.data["color"] + " " + ns)
"""


async def test_pods_reach_the_api_server_with_in_cluster_config(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    kube_api.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
         "data": {"color": "teal"}},
        NS,
    )  # fmt: skip
    api_job = job("api", "true")
    api_job["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", IN_CLUSTER]
    kube_api.create(api_job)
    # automountServiceAccountToken false (the pod's, or its ServiceAccount's): no token, but
    # the `kubernetes` Service's env vars are there as in any pod
    kube_api.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "quiet"},
         "automountServiceAccountToken": False},
        NS,
    )  # fmt: skip
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    probe = f"test -e {token} && echo token || echo none; echo $KUBERNETES_SERVICE_HOST"
    for name, pod in (
        ("off", {"automountServiceAccountToken": False}),
        ("quiet", {"serviceAccountName": "quiet"}),
    ):
        kube_api.create(job(name, f"({probe}) > /dev/termination-log", pod=pod))
    for name in ("api", "off", "quiet"):
        await kubelet.eventually(lambda n=name: condition(kube_api.get("jobs", NS, n), "Complete"))
    assert terminated(pods_of(kube_api, "api")[0])["message"] == "teal default"
    for name in ("off", "quiet"):
        assert terminated(pods_of(kube_api, name)[0])["message"].split() == ["none", "127.0.0.1"]


async def test_indexed_peers_declaring_one_port_run_side_by_side(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    """The nodes of one Indexed Job (a TrainingRun's ranks) all declare the rendezvous port and
    run at once: index 1 does not wait for index 0 to end."""
    peers = job("peers", "sleep 3", completions=2, parallelism=2, completionMode="Indexed")
    container = peers["spec"]["template"]["spec"]["containers"][0]
    container["ports"] = [{"name": "rendezvous", "containerPort": 29511}]
    kube_api.create(peers)

    def running() -> int:
        return sum(
            p.get("status", {}).get("phase") == "Running" for p in pods_of(kube_api, "peers")
        )

    await kubelet.eventually(lambda: running() == 2)
    await kubelet.eventually(lambda: condition(kube_api.get("jobs", NS, "peers"), "Complete"))


async def test_a_kill_reaches_processes_in_sessions_of_their_own(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    """torchrun starts its workers in new sessions; a SIGKILLed pod takes them along."""
    kube_api.create(job("escape", "setsid sleep 300 & echo $! > /tmp/pid; wait"))
    await kubelet.eventually(
        lambda: any(
            p.get("status", {}).get("phase") == "Running" for p in pods_of(kube_api, "escape")
        )
    )
    (pod,) = pods_of(kube_api, "escape")
    (group,) = kubelet.process_groups(pod["metadata"]["name"])

    def escaped() -> list[int]:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if (
                    proc.info["cmdline"] == ["sleep", "300"]
                    and os.getsid(proc.pid) != os.getsid(group)
                    and group in [p.pid for p in proc.parents()]
                ):
                    found.append(proc.pid)
            except (psutil.Error, ProcessLookupError):
                continue
        return found

    (sleeper,) = await kubelet.eventually(escaped)
    kubelet.kill(pod["metadata"]["name"])
    await kubelet.eventually(
        lambda: (
            not psutil.pid_exists(sleeper)
            or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
        ),
        timeout=10,
    )


async def test_an_init_container_runs_once_before_a_deployments_container(
    kube_api: KubeAPIServer, kubelet: TestKubelet
) -> None:
    web = deployment("init", 1, 18341)
    pod_spec = web["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "shared", "emptyDir": {}}]
    pod_spec["initContainers"] = [
        {
            "name": "fetch",
            "image": "qpa",
            "command": ["sh", "-c", "echo fetched >> /shared/log"],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }
    ]
    main = pod_spec["containers"][0]
    main["command"] = ["sh", "-c", "cat /shared/log && exec sleep 300"]
    main["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    kube_api.create(web)
    await kubelet.eventually(
        lambda: (
            (kube_api.get("deployments", NS, "init").get("status") or {}).get("readyReplicas") == 1
        )
    )
    (pod,) = pods_of(kube_api, "init")
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert kubelet.logs(pod["metadata"]["name"]).count("fetched") == 1  # ran once, not again
