"""RolloutPool end to end: `kubectl apply` → Deployment of `qpa env serve` behind its Service →
a TaskBatch whose collectors run their episodes on the pool, through the Service's DNS name.

`examples/rolloutpool.yaml`'s sandbox pool with one replica (the test kubelet runs one pod per
containerPort at a time: pods share the host's network), and `examples/taskbatch.yaml` adjusted
for this machine (SeaweedFS store, oracle planner, one shard of 30 tasks x 2 samples) keeping its
`rolloutPoolRef`. The pool's pod is SIGKILLed while the collector holds sessions on it: the
episodes in flight end environment-side, are reported and run again once the Deployment's
restarted pod is Ready again, and the batch completes with every (task, sample) exactly once.
Before that, a session reset through the Service is pinned to the pod's own address; at the
end the pod is deleted while an episode runs on it: its preStop hook drains it (new episodes
refused, the live one finished there) before it stops, and a new pod takes over.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.operator_runner import NS, example, operator, phase

from qpa.contract import Finish, Task
from qpa.data.collect import read_collected
from qpa.envs.remote import RemoteEnv

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

POOL, BATCH = "sandbox", "nightly-tool-use"
TASKS, SAMPLES = 30, 2


def pool_yaml(tmp_path: Path) -> Path:
    pool = example("rolloutpool.yaml", 0)
    pool["spec"]["replicas"] = {"min": 1, "max": 1}
    del pool["spec"]["resources"]
    path = tmp_path / "rolloutpool.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


def batch_yaml(tmp_path: Path, seaweed: SeaweedS3, out: str) -> Path:
    """examples/taskbatch.yaml on the pool, for this machine, with the store's Secret."""
    tb = example("taskbatch.yaml")
    spec = tb["spec"]
    spec["source"]["limit"] = TASKS
    spec["policy"] = {"planner": "oracle", "harness": {"version": "harness-v3"}}
    spec.update(samplesPerTask=SAMPLES, parallelism=1, shards=1, maxTurns=20)
    spec["outputUri"] = out + "/"
    spec["store"]["endpoint"] = seaweed.endpoint
    del spec["resources"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": spec["store"]["secretRef"]["name"], "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    }
    path = tmp_path / "taskbatch.yaml"
    path.write_text(yaml.safe_dump_all([secret, tb]))
    return path


def pool_pods(kube_api: KubeAPIServer) -> list[dict[str, Any]]:
    return [
        p
        for p in kube_api.list_objects("pods", NS)
        if (p["metadata"].get("ownerReferences") or [{}])[0].get("name") == f"{POOL}-env"
    ]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def answer_of(url: str) -> int | None:
    """The HTTP status of a GET, None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)
    except OSError:
        return None


def live_sessions(kubelet: TestKubelet) -> int:
    """Sessions the pool's server holds now, asked through its Service (0 when unreachable)."""
    try:
        url = kubelet.url(f"{POOL}-env", NS) + "/health"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(json.loads(answer.read())["sessions"])
    except (KeyError, OSError):
        return 0


async def test_collectors_run_on_the_pool_and_survive_its_pod_dying_mid_episode(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tmp_path: Path,
) -> None:
    out = seaweed.root("e2e-rolloutpool")
    with operator():
        kubectl("apply", "-f", str(pool_yaml(tmp_path)))
        pool = await phase(kube_api, "qrp", POOL, "Ready", timeout=60)
        (first,) = pool_pods(kube_api)
        assert ready(first)  # through the readiness probe on /health
        assert pool["readyReplicas"] == 1
        assert live_sessions(kubelet) == 0  # the Service answers from the test too

        # a session is addressed to its pod: a reset through the Service answers the pod's own
        # URL (its podIP from the downward API), where the rest of the session goes
        task = Task(
            id="e2e-handle", domain="messaging", capabilities=["tool_use"], instruction="hi"
        )
        with RemoteEnv(kubelet.url(f"{POOL}-env", NS), kind="sandbox") as env:
            assert env.reset(task).status == "ok"
            assert env.pod == first["metadata"]["name"]
            assert env.pod_url == f"http://{first['status']['podIP']}:8000"
            assert env.verify().done is False  # answered by the pod, at its own address
            with urllib.request.urlopen(f"{env.pod_url}/metrics", timeout=2) as answer:
                assert 'qpa_env_sessions_in_use{kind="sandbox"} 1.0' in answer.read().decode()
        assert live_sessions(kubelet) == 0  # closed on its pod

        kubectl("apply", "-f", str(batch_yaml(tmp_path, seaweed, out)))
        await kubelet.eventually(lambda: live_sessions(kubelet) > 0, timeout=60)
        kubelet.kill(first["metadata"]["name"])  # the collector holds sessions on it now

        done = await phase(kube_api, "qtb", BATCH, "Succeeded", timeout=120)
        (collector,) = kube_api.list_objects("pods", NS, f"qpa.ai/taskbatch={BATCH}")
        order = kube_api.get("configmaps", NS, f"{BATCH}-order")["data"]["workorder.yaml"]
        assert f"http://{POOL}-env.{NS}.svc.cluster.local" in order  # resolved.rolloutPoolUrl
        log = kubelet.logs(collector["metadata"]["name"])
        assert "environment:" in log and "retry 1/" in log, log[-3000:]

        # The pod's container was restarted (restartPolicy Always, as a kubelet does; a pod
        # that went away would be replaced by the Deployment) and serves again, Ready.
        def serving_again() -> dict[str, Any] | None:
            for pod in pool_pods(kube_api):
                restarts = pod["status"]["containerStatuses"][0]["restartCount"]
                fresh = pod["metadata"]["uid"] != first["metadata"]["uid"] or restarts >= 1
                if fresh and ready(pod):
                    return pod
            return None

        serving = await kubelet.eventually(serving_again, timeout=30)
        await phase(kube_api, "qrp", POOL, "Ready", timeout=30)

        # A pod going away drains: its preStop hook (`qpa env drain`, run inside the pod) stops
        # new episodes and holds the pod while an episode is live; then SIGTERM ends it, long
        # before its grace period (drainTimeoutSeconds 120 + 15), and a new pod takes over.
        with RemoteEnv(kubelet.url(f"{POOL}-env", NS), kind="sandbox") as env:
            assert env.reset(task).status == "ok"
            assert env.pod == serving["metadata"]["name"] and env.pod_url
            kube_api.delete("pods", NS, env.pod)
            await kubelet.eventually(lambda: answer_of(f"{env.pod_url}/ready") == 503, timeout=30)
            await asyncio.sleep(1.0)
            assert answer_of(f"{env.pod_url}/health") == 200  # still there: the episode is live
            assert env.step(Finish()).done
            await kubelet.eventually(lambda: answer_of(f"{env.pod_url}/health") is None, timeout=20)
        assert not kubelet.hook_failures

        def replaced() -> bool:
            return any(
                ready(p) and p["metadata"]["uid"] != serving["metadata"]["uid"]
                for p in pool_pods(kube_api)
            )

        await kubelet.eventually(replaced, timeout=30)

    trajectories = read_collected(out, seaweed.store_config())
    pairs = [(t.task.id, t.sample) for t in trajectories]
    assert len(pairs) == len(set(pairs)) == TASKS * SAMPLES  # nothing lost, nothing twice
    assert all(t.env_kind == "sandbox" for t in trajectories)
    retried = [t for t in trajectories if t.metadata.get("env_failures")]
    assert retried, "no episode was hit by the pod's death"
    assert all(f.startswith("environment:") for t in retried for f in t.metadata["env_failures"])
    assert all(t.success for t in trajectories)  # the oracle: only the environment could fail
    assert (done["trajectories"], done["successes"], done["failures"]) == (
        len(pairs),
        len(pairs),
        0,
    )
