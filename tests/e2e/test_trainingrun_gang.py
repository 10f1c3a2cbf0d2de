"""TrainingRun gang admission and disruptions end to end: `kubectl apply` → the real operator →
a suspended indexed Job → the test kubelet (tests/fakes/kubelet.py) runs what is admitted.

The kubelet's Node offers this machine's CPUs, memory and disk and no GPU
(`fakes.kubelet.host_allocatable`); `add_node` adds Nodes with other room. The operator reads
them and the Pods bound to them (`builders.admission`):

- a run whose ranks ask for GPUs stays suspended (no pod at all) with `Admitted=False`,
  `InsufficientCapacity` naming the shortage, which follows the cluster (a Node with one GPU
  appears: still short, by one), and fails at its `admissionTimeoutSeconds`;
- the example's SFT run on one CPU node (the tiny model and data in SeaweedFS, as in
  test_trainingrun.py) fits, is admitted and runs; its rank is evicted (`kubelet.disrupt`:
  `DisruptionTarget=True`, then SIGKILL), the Job fails by its podFailurePolicy, and with
  `backoffLimit: 0` the operator still starts attempt r1 (a disruption does not count), which
  completes the run; r0's Job and pods stay for their logs (`keepFailedAttempts: 1`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.test_trainingrun import (  # noqa: F401 (fixtures)
    SFT,
    native_ops,
    rank_pod,
    reported,
    sft_yaml,
    tiny_inputs,
    upload,
)
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.operator_runner import NS, example, operator, phase, status

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]


def conditions(kube: KubeAPIServer, name: str) -> dict[str, Any]:
    return {c["type"]: c for c in status(kube, "qtr", name).get("conditions") or []}


def admitted_message(kube: KubeAPIServer, name: str) -> str:
    return str(conditions(kube, name).get("Admitted", {}).get("message", ""))


def ranks(kube: KubeAPIServer, job: str) -> list[dict[str, Any]]:
    return kube.list_objects("pods", NS, f"job-name={job}")


async def test_a_run_that_does_not_fit_stays_suspended_and_fails_at_its_timeout(
    kube_api: KubeAPIServer, operator_env: Path, kubectl: Kubectl, kubelet: TestKubelet,
    tmp_path: Path,
) -> None:  # fmt: skip
    tr = example("trainingrun.yaml", 0)
    tr["metadata"]["name"] = "too-big"
    tr["spec"].update(
        nodes=2,
        gpusPerNode=1,
        datasets=[{"uri": "s3://qpa/default/datasets/sft/"}],
        workSize="1Gi",
        resources={"requests": {"cpu": "100m", "memory": "64Mi"}},
        scheduling={"admissionTimeoutSeconds": 8},
    )
    path = tmp_path / "too-big.yaml"
    path.write_text(yaml.safe_dump(tr))
    with operator():
        kubectl("apply", "-f", str(path))
        await kube_api.eventually(lambda: "short:" in admitted_message(kube_api, "too-big"))
        waiting = status(kube_api, "qtr", "too-big")
        assert waiting["phase"] == "Pending"
        admitted = conditions(kube_api, "too-big")["Admitted"]
        assert (admitted["status"], admitted["reason"]) == ("False", "InsufficientCapacity")
        assert admitted["message"] == (
            "room for 0 of 2 ranks (cpu=100m, ephemeral-storage=1Gi, memory=64Mi, "
            "nvidia.com/gpu=1 each) on 1 matching nodes; short: nvidia.com/gpu (2 needed, 0 free)"
        )
        job = kube_api.get("jobs", NS, "too-big-r0")
        assert job is not None and job["spec"]["suspend"] is True
        # a GPU node joins: one GPU is not room for two ranks, and the message says so
        kubelet.add_node("gpu-0", {}, {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1",
                                       "ephemeral-storage": "100Gi", "pods": "110"})  # fmt: skip
        await kube_api.eventually(
            lambda: "(2 needed, 1 free)" in admitted_message(kube_api, "too-big"), timeout=10
        )
        assert "room for 1 of 2 ranks" in admitted_message(kube_api, "too-big")
        failed = await phase(kube_api, "qtr", "too-big", "Failed", timeout=20)
        cond = {c["type"]: c for c in failed["conditions"]}
        assert cond["Failed"]["reason"] == "AdmissionTimeout"
        assert (cond["Admitted"]["status"], cond["Admitted"]["reason"]) == (
            "False", "InsufficientCapacity",
        )  # fmt: skip
        assert cond["Admitted"]["message"].startswith("not admitted within 8s: room for 1 of 2")
        assert kube_api.get("jobs", NS, "too-big-r0")["spec"]["suspend"] is True
        assert ranks(kube_api, "too-big-r0") == []  # no rank ever held anything
        rows = kubectl("get", "qtr", "too-big").stdout.split()
        assert "Failed" in rows


async def test_an_evicted_rank_restarts_the_gang_without_using_up_the_backoff_limit(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tiny_inputs: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    root = seaweed.root("e2e-trainingrun-gang")
    model = upload(seaweed, tiny_inputs["model"], f"{root}/models/tiny")
    data = upload(seaweed, tiny_inputs["data"], f"{root}/datasets/sft")
    out = f"{root}/trainingruns/{SFT}/"
    path = sft_yaml(tmp_path, seaweed, model, data, out)
    docs = list(yaml.safe_load_all(path.read_text()))
    spec = docs[-1]["spec"]
    # one node (a gang of one keeps the test short on two cores; test_a_run_that_does_not_fit
    # has two ranks), no counted failure allowed
    spec.update(nodes=1, backoffLimit=0, checkpointEvery=1, workSize="2Gi")
    spec["hyperparameters"]["maxSteps"] = 2
    path.write_text(yaml.safe_dump_all(docs))
    with operator(timeout=120), reported(kubelet):
        kubectl("apply", "-f", str(path))
        victim = await kubelet.eventually(lambda: rank_pod(kube_api, f"{SFT}-r0", 0), timeout=60)
        # the rank's pod can run before the status patch that records the admission lands
        await kube_api.eventually(
            lambda: conditions(kube_api, SFT).get("Admitted", {}).get("status") == "True"
        )
        admitted = conditions(kube_api, SFT)["Admitted"]
        assert admitted["status"] == "True" and admitted["message"].startswith(
            "all 1 ranks (cpu=500m, ephemeral-storage=2Gi, memory=1Gi each) fit on 1 matching"
        ), admitted
        kubelet.disrupt(victim)
        resumer = await kubelet.eventually(lambda: rank_pod(kube_api, f"{SFT}-r1", 0), timeout=90)
        done = await phase(kube_api, "qtr", SFT, "Succeeded", timeout=200)
        assert kube_api.get("pods", NS, resumer) is not None
    assert (done["restarts"], done["disruptions"]) == (1, 1)
    assert done["jobName"] == f"{SFT}-r1" and done["step"] == 2
    first = kube_api.get("jobs", NS, f"{SFT}-r0")
    assert first is not None  # kept for its logs
    failure = {c["type"]: c for c in first["status"]["conditions"]}["Failed"]
    assert failure["reason"] == "PodFailurePolicy"
    assert "has condition DisruptionTarget matching FailJob rule at index 0" in failure["message"]
    evicted = kube_api.get("pods", NS, victim)
    assert evicted is not None and evicted["status"]["phase"] == "Failed"
    assert any(c["type"] == "DisruptionTarget" for c in evicted["status"]["conditions"])
