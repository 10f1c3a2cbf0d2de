"""examples/kind/: the GPU-less, key-less loop of docs/kind.md is valid and hangs together.

Each manifest parses as its qpa.api model and is accepted by the test API server, which
validates custom resources against crds/ (OpenAPI schema and CEL rules) as a real one does.
The four reference each other the way the loop runs (pool -> batch -> SFT -> release), need no
GPU, no vLLM and no API key Secret, and use the bundled store's Secret only; docs/kind.md walks
through every file and says what is true of kind's NetworkPolicy, Secrets and namespaces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fakes.kube_api import KubeAPIServer

from qpa.api import parse_resource
from qpa.harness.agent import HarnessConfig

ROOT = Path(__file__).resolve().parents[3]
KIND = ROOT / "examples" / "kind"
DOC = (ROOT / "docs" / "kind.md").read_text()


def manifests() -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted(KIND.glob("*.yaml")):
        (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
        docs[doc["kind"]] = doc
    assert set(docs) == {"ConfigMap", "RolloutPool", "TaskBatch", "TrainingRun", "HarnessRelease"}
    return docs


def resources() -> dict[str, dict[str, Any]]:
    """The qpa.ai resources of examples/kind/ (without the Harness ConfigMap)."""
    return {k: v for k, v in manifests().items() if k != "ConfigMap"}


def test_each_manifest_is_accepted_by_the_models_and_the_crds(kube_api: KubeAPIServer) -> None:
    kube_api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "qpa"}})
    for kind, doc in manifests().items():
        if kind != "ConfigMap":
            parse_resource(doc)
        stored = kube_api.create(doc, namespace="qpa")
        assert stored["kind"] == kind and stored["metadata"]["namespace"] == "qpa"


def test_the_loop_needs_no_gpu_no_vllm_and_no_api_key() -> None:
    docs = resources()
    pool, batch = docs["RolloutPool"]["spec"], docs["TaskBatch"]["spec"]
    sft, release = docs["TrainingRun"]["spec"], docs["HarnessRelease"]["spec"]
    assert pool["environment"] == "sandbox" and "devicePoolRef" not in pool
    assert batch["policy"]["planner"] == "local" and "apiKeySecretRef" not in batch["policy"]
    assert "modelUrl" not in batch["policy"]
    assert (sft["stage"], sft["gpusPerNode"], sft["nodes"]) == ("sft", 0, 1)
    assert (release["model"]["runtime"], release["model"]["gpus"]) == ("huggingface", 0)
    # the loop's chain: pool -> batch -> SFT of the batch's model on its data -> release of it
    assert batch["rolloutPoolRef"]["name"] == docs["RolloutPool"]["metadata"]["name"]
    assert release["benchmark"]["rolloutPoolRef"]["name"] == docs["RolloutPool"]["metadata"]["name"]
    assert sft["baseModelUri"] == batch["policy"]["modelUri"]
    # the SFT data: `qpa train tiny --sample-data`, copied next to the model (docs/kind.md)
    assert sft["datasets"] == [{"uri": "s3://qpa/qpa/datasets/kind-sft/"}]
    assert release["model"]["uri"] == sft["outputUri"] + "final/"
    secrets = {
        d["spec"]["store"]["secretRef"]["name"]
        for d in docs.values()
        if "store" in d.get("spec", {})
    }
    assert secrets == {"qpa-store"}


def test_the_batch_and_the_release_share_a_harness_the_tiny_model_fits() -> None:
    """The default Harness's prompt (6-7k tiny-tokenizer tokens) overflows the 4096 positions of
    `qpa train tiny`; examples/kind/harness.yaml is the smallest prompt, named by both."""
    docs = manifests()
    config_map = docs["ConfigMap"]
    name = config_map["metadata"]["name"]
    ref = {"name": name, "key": "harness.yaml"}
    batch_harness = docs["TaskBatch"]["spec"]["policy"]["harness"]
    release_harness = docs["HarnessRelease"]["spec"]["harness"]
    assert batch_harness["configMapRef"] == release_harness["configMapRef"] == ref
    config = HarnessConfig.model_validate(yaml.safe_load(config_map["data"]["harness.yaml"]))
    assert config.version == batch_harness["version"] == release_harness["version"] == name
    assert config.token_budget == 100 and config.max_tools == 1  # the adapter's smallest


def test_the_doc_walks_every_file_and_is_right_about_kind() -> None:
    for path in KIND.glob("*.yaml"):
        assert f"examples/kind/{path.name}" in DOC, path.name
    assert "qpa train tiny" in DOC  # where the store's tiny model comes from
    assert "--sample-data" in DOC and "s3://qpa/qpa/datasets/kind-sft/" in DOC  # the SFT data
    assert "qpa data review" in DOC and "qpa data publish" in DOC  # a batch's human gate
    assert "create secret generic qpa-store" in DOC
    assert "planner-api" in DOC and "no `planner-api` Secret" in DOC
    # kind >= 0.24's kindnet enforces NetworkPolicy; the old claim is gone
    assert "0.24" in DOC and "does not enforce" not in DOC
    # device RolloutPools share the DevicePool's (privileged) namespace
    assert "same namespace as its DevicePool" in DOC
