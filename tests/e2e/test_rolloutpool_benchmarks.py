"""RolloutPools of the public benchmarks end to end: `kubectl apply` of
examples/rolloutpool-benchmarks.yaml's pool (environment `agentdojo` or `bfcl`) → a Deployment of
`qpa env serve --kind <kind>` run by the test kubelet → an episode through the pool's Service
judged by the benchmark's own checker → a TaskBatch of that suite whose collector runs its
episodes on the pool, every trajectory of the pool's kind and solved by the oracle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.operator_runner import NS, example, operator, phase

from qpa.data.collect import read_collected
from qpa.envs.remote import RemoteEnv
from qpa.envs.suites import load_suite

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

#: (pool document in the example, a suite its kind plays, tasks the batch collects)
CASES = {
    "agentdojo": (0, "agentdojo/banking@important_instructions", 6),
    "bfcl": (1, "bfcl/multi_turn_base", 4),
}


def pool_yaml(tmp_path: Path, index: int) -> Path:
    pool = example("rolloutpool-benchmarks.yaml", index)
    del pool["spec"]["resources"]
    pool["spec"]["replicas"] = {"min": 1, "max": 1}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


def batch_yaml(tmp_path: Path, seaweed: SeaweedS3, pool: str, suite: str, n: int, out: str) -> Path:
    tb = example("taskbatch.yaml")
    tb["metadata"]["name"] = f"{pool}-batch"
    spec = tb["spec"]
    spec["source"] = {"generator": {"suite": suite}, "split": "train", "limit": n}
    spec["rolloutPoolRef"] = {"name": pool}
    spec["policy"] = {"planner": "oracle", "harness": {"version": "harness-v3"}}
    spec.update(samplesPerTask=1, parallelism=1, shards=1, maxTurns=60)
    spec["outputUri"] = out + "/"
    spec["store"]["endpoint"] = seaweed.endpoint
    spec.pop("resources", None)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": spec["store"]["secretRef"]["name"], "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    }
    path = tmp_path / "taskbatch.yaml"
    path.write_text(yaml.safe_dump_all([secret, tb]))
    return path


@pytest.mark.parametrize("kind", sorted(CASES))
async def test_a_benchmark_pool_serves_its_suite_and_a_taskbatch_collects_on_it(
    kind: str,
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tmp_path: Path,
) -> None:
    index, suite, n = CASES[kind]
    out = seaweed.root(f"e2e-{kind}-pool")
    task = next(t for t in load_suite(suite) if t.split == "test")
    with operator():
        kubectl("apply", "-f", str(pool_yaml(tmp_path, index)))
        await phase(kube_api, "qrp", kind, "Ready", timeout=90)
        order = kube_api.get("configmaps", NS, f"{kind}-order")["data"]["workorder.yaml"]
        assert f"environment: {kind}" in order  # the pod's work order is the resource

        # one episode through the Service: the benchmark's judge decides, on the pod
        with RemoteEnv(kubelet.url(f"{kind}-env", NS)) as env:
            assert env.kind == kind
            assert env.reset(task).status == "ok"
            assert {t.name for t in env.tools()} >= {
                a.tool for a in task.reference_plan or [] if a.type == "tool_call"
            }
            for action in task.reference_plan or []:
                env.step(action)
            verdict = env.verify()
            assert verdict.success, verdict.checks
            # a task whose world names nothing of the benchmark is refused, naming the field
            bad = task.model_copy(update={"world": {}})
            refused = env.reset(bad)
            assert refused.status == "error" and "world._" in refused.message

        kubectl("apply", "-f", str(batch_yaml(tmp_path, seaweed, kind, suite, n, out)))
        done = await phase(kube_api, "qtb", f"{kind}-batch", "Succeeded", timeout=150)

    trajectories = read_collected(out, seaweed.store_config())
    assert len(trajectories) == n == done["trajectories"]
    assert {t.env_kind for t in trajectories} == {kind}
    assert all(t.task.suite == suite for t in trajectories)
    assert all(t.success for t in trajectories), [
        (t.task.id, t.verification) for t in trajectories if not t.success
    ]
