"""TaskBatch end to end: `kubectl apply` → indexed Job → `qpa collect` processes → SeaweedFS.

`examples/taskbatch.yaml`, adjusted only for what this machine has: the store is the test
SeaweedFS (its keys in the Secret `spec.store.secretRef` names), the output a fresh prefix, the
planner `oracle` (no model endpoint here), 6 tasks x 2 samples in 3 shards, no RolloutPool (the
in-process sandbox). The real operator renders the Job; the test kubelet runs its pods as
`qpa collect --spec` processes that write to S3; nothing about the Job or its pods is forged.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.operator_runner import NS, example, operator, phase

from qpa.data.collect import read_collected
from qpa.store import open_store
from qpa.store.manifest import DatasetManifest

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

NAME = "nightly-tool-use"
TASKS, SAMPLES, SHARDS = 6, 2, 3


def store_secret(seaweed: SeaweedS3, name: str) -> dict[str, Any]:
    """The Secret `spec.store.secretRef` names, holding the SeaweedFS admin keys."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    }


def batch_yaml(tmp_path: Path, seaweed: SeaweedS3, out: str) -> Path:
    """examples/taskbatch.yaml for this machine, with the store's Secret, as one file."""
    tb = example("taskbatch.yaml")
    spec = tb["spec"]
    spec["source"]["limit"] = TASKS
    spec["policy"] = {"planner": "oracle", "harness": {"version": "harness-v3"}}
    del spec["rolloutPoolRef"]
    spec.update(samplesPerTask=SAMPLES, parallelism=SHARDS, shards=SHARDS, maxTurns=20)
    spec["outputUri"] = out + "/"
    spec["store"]["endpoint"] = seaweed.endpoint
    del spec["resources"]
    path = tmp_path / "taskbatch.yaml"
    secret = store_secret(seaweed, spec["store"]["secretRef"]["name"])
    path.write_text(yaml.safe_dump_all([secret, tb]))
    return path


def bucket_holds(seaweed: SeaweedS3, out: str) -> tuple[Counter[tuple[str, int]], int, int]:
    """(every (task, sample) in the parts with its count, successes, failures) under `out`."""
    trajectories = read_collected(out, seaweed.store_config())
    pairs = Counter((t.task.id, t.sample) for t in trajectories)
    successes = sum(t.success for t in trajectories)
    return pairs, successes, len(trajectories) - successes


def verified_manifest(seaweed: SeaweedS3, out: str) -> DatasetManifest:
    """manifest.json under `out`, every part it lists read back against its hash and size."""
    store = open_store(out, seaweed.store_config())
    manifest = DatasetManifest.model_validate_json(store.get_bytes("manifest.json"))
    for entry in manifest.files:
        data = store.get_bytes(entry.key)  # verified against the stored hash
        assert len(data) == entry.size, entry.key
        assert sum(1 for line in data.splitlines() if line.strip()) == entry.rows, entry.key
    listed = {k for k in store.list("parts/") if k.endswith(".jsonl")}
    assert listed == {f.key for f in manifest.files}, "parts the manifest does not list"
    return manifest


def assert_status_matches_bucket(status: dict[str, Any], seaweed: SeaweedS3, out: str) -> None:
    pairs, successes, failures = bucket_holds(seaweed, out)
    assert set(pairs.values()) == {1}, f"duplicated pairs: {pairs}"
    assert len(pairs) == TASKS * SAMPLES
    assert len({task for task, _ in pairs}) == TASKS
    assert {sample for _, sample in pairs} == set(range(SAMPLES))
    manifest = verified_manifest(seaweed, out)
    counts = manifest.counts
    assert counts["trajectories"] == len(pairs) and counts["tasks"] == TASKS
    assert (counts["successes"], counts["failures"]) == (successes, failures)
    assert manifest.extra["shards"] == SHARDS
    assert status["tasks"] == TASKS
    assert status["trajectories"] == len(pairs)
    assert (status["successes"], status["failures"]) == (successes, failures)
    assert status["completedShards"] == SHARDS
    assert status["outputUri"] == out + "/"


def shard_pods(kube_api: KubeAPIServer) -> list[dict[str, Any]]:
    return kube_api.list_objects("pods", NS, f"qpa.ai/taskbatch={NAME}")


async def test_three_shards_write_what_the_status_counts(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tmp_path: Path,
) -> None:
    out = seaweed.root("e2e-taskbatch")
    with operator():
        kubectl("apply", "-f", str(batch_yaml(tmp_path, seaweed, out)))
        done = await phase(kube_api, "qtb", NAME, "Succeeded", timeout=90)
        pods = shard_pods(kube_api)
        assert len(pods) == SHARDS  # one pod per shard, none retried
        assert all(p["status"]["phase"] == "Succeeded" for p in pods)
        await kubelet.eventually(
            lambda: kube_api.get("qtb", NS, NAME)["status"]["trajectories"] == TASKS * SAMPLES
        )
        done = kube_api.get("qtb", NS, NAME)["status"]
    assert_status_matches_bucket(done, seaweed, out)


async def test_a_shard_killed_mid_run_is_retried_with_nothing_lost_or_duplicated(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tmp_path: Path,
) -> None:
    out = seaweed.root("e2e-taskbatch-kill")
    with operator():
        kubectl("apply", "-f", str(batch_yaml(tmp_path, seaweed, out)))

        def running_shard_1() -> str | None:
            for pod in shard_pods(kube_api):
                labels = pod["metadata"]["labels"]
                if (
                    labels.get("batch.kubernetes.io/job-completion-index") == "1"
                    and (pod.get("status") or {}).get("phase") == "Running"
                ):
                    return str(pod["metadata"]["name"])
            return None

        victim = await kubelet.eventually(running_shard_1)
        kubelet.kill(victim)
        done = await phase(kube_api, "qtb", NAME, "Succeeded", timeout=90)
        killed = kube_api.get("pods", NS, victim)
        terminated = killed["status"]["containerStatuses"][0]["state"]["terminated"]
        assert killed["status"]["phase"] == "Failed" and terminated["exitCode"] == 137
        retries = [
            p
            for p in shard_pods(kube_api)
            if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
            and p["metadata"]["name"] != victim
        ]
        assert [p["status"]["phase"] for p in retries] == ["Succeeded"]
        job = kube_api.get("jobs", NS, f"{NAME}-collect")
        assert job["status"]["failed"] == 1 and job["status"]["completedIndexes"] == "0-2"
        await kubelet.eventually(
            lambda: kube_api.get("qtb", NS, NAME)["status"]["trajectories"] == TASKS * SAMPLES
        )
        done = kube_api.get("qtb", NS, NAME)["status"]
    assert_status_matches_bucket(done, seaweed, out)
