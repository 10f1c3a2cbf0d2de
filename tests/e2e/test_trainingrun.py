"""TrainingRun end to end: `kubectl apply` → indexed Job of 2 DeepSpeed ranks → SeaweedFS.

`examples/trainingrun.yaml`, adjusted only for what this machine has: the base model is the tiny
Qwen3 (`qpa.train.tiny`, random weights) and the SFT data a few suite episodes, both uploaded to
the test SeaweedFS; the store is SeaweedFS (its keys in the Secret `spec.store.secretRef`
names); 2 nodes of one CPU rank each (`gpusPerNode: 0`), DeepSpeed ZeRO-2 (on gloo, torch
Adam), a few steps with a checkpoint every 2, short sequences, small pods. The real operator
renders the work order, the headless Service and the Job `<run>-r<attempt>`; the test kubelet
runs each pod as `qpa train launch ... -- qpa train <stage> --spec` (torchrun, rendezvous at
`<job>-0.<run>-ranks`); nothing about the Job, its pods or the checkpoints is forged.

- SFT: rank 1 is SIGKILLed once a checkpoint is complete in the store; attempt r0 fails (the
  ranks cannot go on without it), the operator starts r1, which resumes from the last
  checkpoint r0 completed and ends at `maxSteps`; the final model in `status.modelUri` loads
  with transformers.
- RL: the example's sandbox RolloutPool (one `qpa env serve` pod) and the RL run on 2 ranks,
  whose episodes run on the pool through `resolved.rolloutPoolUrl`, 2 steps on generated tokens.

The DeepSpeed CPU comm op both need is built once per machine (the kubelet's extensions folder):
the first run on a fresh machine spends a few minutes more.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.kubelet_runs import build_native_ops, reported
from helpers.operator_runner import NS, example, operator, phase

from qpa.store import open_store, resolve_local
from qpa.train.checkpoint import CHECKPOINT_DIR, COMPLETE, META_DIR

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.usefixtures("native_ops")]

SFT, RL = "planner-sft", "planner-care-rl"
SFT_STEPS, RL_STEPS = 10, 2
CONTEXT = 8192  # the suite's first prompt is ~5k tokens of the tiny tokenizer
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@pytest.fixture(scope="module")
def native_ops() -> None:
    build_native_ops()


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoint and a small SFT dataset (`save_to_disk`), built once (seconds)."""
    import datasets

    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, sft_rows_from_suite, suite_corpus

    root = tmp_path_factory.mktemp("tiny")
    config = TinyConfig(
        vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=CONTEXT,
    )  # fmt: skip
    model = make_tiny_checkpoint(
        root / "model", config, corpus=suite_corpus(conversations=4, instructions=300)
    )
    datasets.Dataset.from_list(sft_rows_from_suite(16, seed=1)).save_to_disk(str(root / "data"))
    return {"model": model, "data": root / "data"}


def upload(seaweed: SeaweedS3, folder: Path, uri: str) -> str:
    """Every file below `folder` to `uri`/; returns the prefix URI with a trailing slash."""
    store = open_store(uri, seaweed.store_config())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        store.put_file(path.relative_to(folder).as_posix(), path)
    return uri.rstrip("/") + "/"


def store_secret(seaweed: SeaweedS3, name: str) -> dict[str, Any]:
    """The Secret `spec.store.secretRef` names, holding the SeaweedFS admin keys."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    }


def for_this_machine(tr: dict[str, Any], seaweed: SeaweedS3, model: str, out: str) -> None:
    """The example's run, on the tiny model in SeaweedFS: 2 CPU ranks, ZeRO-2, small pods."""
    spec = tr["spec"]
    spec["baseModelUri"] = model
    spec["outputUri"] = out
    spec["store"]["endpoint"] = seaweed.endpoint
    spec.update(nodes=2, gpusPerNode=0, checkpointEvery=2)
    spec["deepspeed"] = {"zeroStage": 2}
    spec["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}


def sft_yaml(tmp_path: Path, seaweed: SeaweedS3, model: str, data: str, out: str) -> Path:
    tr = example("trainingrun.yaml", 0)
    for_this_machine(tr, seaweed, model, out)
    spec = tr["spec"]
    spec["datasets"] = [{"uri": data}]
    spec["hyperparameters"].update(
        maxSteps=SFT_STEPS, gradientAccumulationSteps=1, maxSeqLength=256, epochs=1
    )
    path = tmp_path / "trainingrun-sft.yaml"
    path.write_text(
        yaml.safe_dump_all([store_secret(seaweed, spec["store"]["secretRef"]["name"]), tr])
    )
    return path


def complete_checkpoints(seaweed: SeaweedS3, out: str) -> list[int]:
    """Steps of the checkpoints in the store that rank 0 marked complete."""
    store = open_store(out, seaweed.store_config())
    steps = []
    for key in store.list("checkpoints/"):
        parts = key.split("/")
        if len(parts) == 4 and parts[2:] == [META_DIR, COMPLETE]:
            match = CHECKPOINT_DIR.match(parts[1])
            if match:
                steps.append(int(match.group(1)))
    return sorted(steps)


def rank_pod(kube_api: KubeAPIServer, job: str, index: int) -> str | None:
    """The running pod of node `index` of Job `job`."""
    for pod in kube_api.list_objects("pods", NS, f"job-name={job}"):
        labels = pod["metadata"].get("labels") or {}
        if (
            labels.get(INDEX_LABEL) == str(index)
            and pod.get("status", {}).get("phase") == "Running"
        ):
            return str(pod["metadata"]["name"])
    return None


def loads(model_uri: str, seaweed: SeaweedS3, cache: Path) -> Any:
    from transformers import AutoModelForCausalLM

    path = resolve_local(
        model_uri, field="modelUri", cache_dir=cache, store_config=seaweed.store_config()
    )
    return AutoModelForCausalLM.from_pretrained(path)


async def test_sft_on_two_ranks_resumes_after_a_killed_rank_and_its_model_loads(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tiny_inputs: dict[str, Path],
    tmp_path: Path,
) -> None:
    root = seaweed.root("e2e-trainingrun")
    model = upload(seaweed, tiny_inputs["model"], f"{root}/models/tiny")
    data = upload(seaweed, tiny_inputs["data"], f"{root}/datasets/sft")
    out = f"{root}/trainingruns/{SFT}/"
    with operator(timeout=120), reported(kubelet):
        kubectl("apply", "-f", str(sft_yaml(tmp_path, seaweed, model, data, out)))
        first = f"{SFT}-r0"
        victim = await kubelet.eventually(lambda: rank_pod(kube_api, first, 1), timeout=60)
        await kubelet.eventually(lambda: complete_checkpoints(seaweed, out), timeout=150)
        kubelet.kill(victim)  # rank 0 cannot go on alone: attempt r0 fails
        # Attempt r1's rank 0 starts once r0's has let go of the rendezvous port, so the
        # checkpoints complete now are all that r0 left.
        resumer = await kubelet.eventually(lambda: rank_pod(kube_api, f"{SFT}-r1", 0), timeout=90)
        left = complete_checkpoints(seaweed, out)
        done = await phase(kube_api, "qtr", SFT, "Succeeded", timeout=200)
        resumed = re.search(r'"resumed_step": (\d+)', kubelet.logs(resumer))
    assert left and left[-1] < SFT_STEPS, left  # killed mid-run
    assert resumed is not None and int(resumed.group(1)) == left[-1]  # the last complete one
    assert done["restarts"] == 1 and done["jobName"] == f"{SFT}-r1"
    assert done["step"] == SFT_STEPS
    assert complete_checkpoints(seaweed, out)[-1] == SFT_STEPS
    assert f"checkpoints/checkpoint-{SFT_STEPS}" in done["latestCheckpoint"]
    loaded = loads(done["modelUri"], seaweed, tmp_path / "cache")
    assert loaded.config.hidden_size == 64


def rl_yaml(tmp_path: Path, seaweed: SeaweedS3, model: str, out: str) -> Path:
    """The example's sandbox RolloutPool (one small pod) and its RL run, with the store's Secret."""
    pool = example("rolloutpool.yaml", 0)
    pool["spec"]["replicas"] = {"min": 1, "max": 1}
    del pool["spec"]["resources"]
    tr = example("trainingrun.yaml", 1)
    assert tr["spec"]["rl"]["rolloutPoolRef"]["name"] == pool["metadata"]["name"]
    for_this_machine(tr, seaweed, model, out)
    spec = tr["spec"]
    spec["rl"].update(samplesPerTask=2, tasksPerStep=1, maxTurns=1)
    spec["hyperparameters"].update(maxSteps=RL_STEPS, maxSeqLength=CONTEXT)
    path = tmp_path / "trainingrun-rl.yaml"
    secret = store_secret(seaweed, spec["store"]["secretRef"]["name"])
    path.write_text(yaml.safe_dump_all([secret, pool, tr]))
    return path


async def test_rl_on_two_ranks_with_rollouts_on_the_pool(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    seaweed: SeaweedS3,
    tiny_inputs: dict[str, Path],
    tmp_path: Path,
) -> None:
    root = seaweed.root("e2e-trainingrun-rl")
    model = upload(seaweed, tiny_inputs["model"], f"{root}/models/tiny")
    out = f"{root}/trainingruns/{RL}/"
    with operator(timeout=120), reported(kubelet):
        kubectl("apply", "-f", str(rl_yaml(tmp_path, seaweed, model, out)))
        done = await phase(kube_api, "qtr", RL, "Succeeded", timeout=200)
        ranks = kube_api.list_objects("pods", NS, f"job-name={RL}-r0")
        assert sorted(p["metadata"]["labels"][INDEX_LABEL] for p in ranks) == ["0", "1"]
        assert all(p["status"]["phase"] == "Succeeded" for p in ranks)
        rank0 = next(p for p in ranks if p["metadata"]["labels"][INDEX_LABEL] == "0")
        trained = re.search(r'"train_tokens": ([0-9.]+)', kubelet.logs(rank0["metadata"]["name"]))
        assert trained is not None and float(trained.group(1)) > 0  # the policy's own tokens
    assert done["restarts"] == 0
    assert done["step"] == RL_STEPS
    assert complete_checkpoints(seaweed, out) == [RL_STEPS]
    loaded = loads(done["modelUri"], seaweed, tmp_path / "cache")
    assert loaded.config.hidden_size == 64
