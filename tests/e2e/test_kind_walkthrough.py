"""docs/kind.md's walk-through, run: the files of examples/kind/ through the real operator.

The files are applied as docs/kind.md applies them, the Harness ConfigMap first
(`kubectl -n qpa apply -f examples/kind/<file>`, then `kubectl -n qpa wait
--for=condition=Ready`), into the namespace
`qpa` with the Secret `qpa-store` made by the doc's own `kubectl create secret generic` line
(holding the test store's keys), after the tiny model went into the store with `qpa train
tiny` (the doc's step 4). The test kubelet (`fakes.kubelet`) runs every pod the operator creates
as a local process, the KServe stand-in (`fakes.kserve`) the InferenceServices, SeaweedFS
(`fakes.seaweed`) is the store. What each file is changed in, and nothing else:

- every file: `spec.store.endpoint` is the test store's (the doc's is the chart's bundled
  store Service in `qpa-system`, which is not installed here);
- `qpa train tiny` with TINY's options (a smaller tokenizer corpus, 8 SFT rows);
- SIZES below: one task of one turn in one shard for the TaskBatch, 2 benchmark tasks; the
  SFT runs the 4 steps of TINY's 8 rows. Measured: 345 s on two cores shared with other work
  (load 9): the tiny model ~30 s, the pool ~15 s, the batch ~2 min (the local planner decodes
  512 tokens a turn), the SFT ~75 s, the release ~90 s; each stage proves its pods ran.

The URIs stay the doc's (`s3://qpa/qpa/...`: the test store gets the bucket `qpa` as the doc's
`s3 mb` makes it). Each stage reaches `Ready`: the pool's env server answers, the batch's
trajectories (the local planner's) are in the store, the SFT's final checkpoint is in the store
where the release takes it, and the release is promoted with its report in the store. Every pod
whose spec the operator writes meets the `restricted` Pod Security Standard.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kserve import ISVC_LABEL, KServe
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.kubelet_runs import build_native_ops, reported
from helpers.operator_runner import operator
from helpers.podsecurity import violations

from qpa.bench.scoring import Report
from qpa.data.collect import read_collected
from qpa.store import open_store, resolve_local

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.usefixtures("native_ops")]

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "examples" / "kind"
NS = "qpa"
BUCKET = "qpa"  # the doc's `aws s3 mb s3://qpa`
#: What the test shrinks, per file and field (the doc's values in examples/kind/).
SIZES: dict[str, dict[str, Any]] = {
    "taskbatch.yaml": {
        "source.limit": 1,
        "samplesPerTask": 1,
        "maxTurns": 1,
        "shards": 1,
        "parallelism": 1,
    },
    "harnessrelease.yaml": {"benchmark.limit": 2, "gate.minTasks": 2},
}
#: `qpa train tiny`'s options the test adds: a smaller tokenizer corpus and 8 SFT rows (4 steps).
TINY = ("--conversations", "4", "--sample-rows", "8")
MODEL_URI = f"s3://{BUCKET}/qpa/models/tiny/"
DATA_URI = f"s3://{BUCKET}/qpa/datasets/kind-sft/"
FILES = ("harness.yaml", "rolloutpool.yaml", "taskbatch.yaml", "trainingrun.yaml",
         "harnessrelease.yaml")  # fmt: skip


def set_path(spec: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        spec = spec[key]
    spec[leaf] = value


def for_the_test(file: str, seaweed: SeaweedS3, folder: Path) -> Path:
    """examples/kind/<file> with the test store's endpoint and SIZES; the path to apply."""
    (doc,) = [d for d in yaml.safe_load_all((KIND / file).read_text()) if d]
    spec = doc.get("spec") or {}
    if "store" in spec:
        assert spec["store"]["secretRef"] == {"name": "qpa-store"}, file
        spec["store"]["endpoint"] = seaweed.endpoint
    for dotted, value in SIZES.get(file, {}).items():
        set_path(spec, dotted, value)
    path = folder / file
    path.write_text(yaml.safe_dump(doc))
    return path


async def wait_ready(kubectl: Kubectl, resource: str, timeout: int) -> None:
    """The doc's `kubectl -n qpa wait --for=condition=Ready <resource>` (off the event loop)."""
    await asyncio.to_thread(
        kubectl,
        "-n", NS, "wait", "--for=condition=Ready", resource, f"--timeout={timeout}s",
        timeout=timeout + 10,
    )  # fmt: skip


def create(kubectl: Kubectl, *args: str) -> None:
    """The doc's `kubectl create ...` line: rendered by kubectl, sent as JSON (`apply -f -`),
    since the test API server reads no protobuf (the body `kubectl create` sends)."""
    rendered = kubectl("create", *args, "--dry-run=client", "-o", "json").stdout
    kubectl("apply", "-f", "-", input=rendered)


def status(kube_api: KubeAPIServer, plural: str, name: str) -> dict[str, Any]:
    return dict((kube_api.get(plural, NS, name) or {}).get("status") or {})


def pods(kube_api: KubeAPIServer, selector: str) -> list[dict[str, Any]]:
    return kube_api.list_objects("pods", NS, selector)


@pytest.fixture
def walk_env(operator_env: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator reads release reports with its own store keys (the chart's objectStore
    Secret in its env); a short release tick."""
    monkeypatch.setenv("QPA_OPERATOR_RELEASE_TICK", "0.2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.delenv("QPA_S3_ENDPOINT", raising=False)
    return operator_env


@pytest.fixture(scope="module")
def native_ops() -> None:
    build_native_ops()


def tiny_model_into_the_store(seaweed: SeaweedS3, folder: Path) -> str:
    """The doc's step 4: `qpa train tiny --out ... --sample-data ...` (TINY's sizes), the model
    copied to s3://qpa/qpa/models/tiny/, the SFT data to s3://qpa/qpa/datasets/kind-sft/."""
    model, data = folder / "qpa-tiny", folder / "qpa-tiny-sft"
    qpa = str(Path(sys.executable).parent / "qpa")
    subprocess.run(
        [qpa, "train", "tiny", "--out", str(model), "--sample-data", str(data), *TINY],
        check=True, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    client = seaweed.client()
    if not client.bucket_exists(BUCKET):
        client.make_bucket(BUCKET)
    for local, uri in ((model, MODEL_URI), (data, DATA_URI)):
        store = open_store(uri, seaweed.store_config())
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            store.put_file(path.relative_to(local).as_posix(), path)
    return MODEL_URI


async def test_the_kind_walkthrough_runs_the_loop(
    kube_api: KubeAPIServer,
    walk_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    kserve: KServe,
    seaweed: SeaweedS3,
    tmp_path: Path,
) -> None:
    files = {f: for_the_test(f, seaweed, tmp_path) for f in FILES}
    model_uri = tiny_model_into_the_store(seaweed, tmp_path)
    create(kubectl, "namespace", NS)
    kubectl("label", "ns", NS, "pod-security.kubernetes.io/enforce=restricted")
    create(
        kubectl, "-n", NS, "secret", "generic", "qpa-store",
        f"--from-literal=accessKeyId={seaweed.access_key}",
        f"--from-literal=secretAccessKey={seaweed.secret_key}",
    )  # fmt: skip
    with operator(timeout=120), reported(kubelet):
        # ---- the Harness version of the batch and the release (a ConfigMap)
        kubectl("-n", NS, "apply", "-f", str(files["harness.yaml"]))
        # ---- the sandbox RolloutPool: Ready with one env server that answers
        kubectl("-n", NS, "apply", "-f", str(files["rolloutpool.yaml"]))
        await wait_ready(kubectl, "qrp/sandbox", 60)
        (server,) = pods(kube_api, "qpa.ai/rolloutpool=sandbox")
        assert server["status"]["phase"] == "Running"
        pool = status(kube_api, "qrp", "sandbox")
        health = urllib.request.urlopen(kubelet.url("sandbox-env", NS) + "/health", timeout=5)
        assert health.status == 200, pool

        # ---- the TaskBatch: its pods run the local planner on the store's tiny model
        batch_spec = yaml.safe_load(files["taskbatch.yaml"].read_text())["spec"]
        assert batch_spec["policy"] == {
            "planner": "local", "modelUri": model_uri, "model": "tiny",
            "harness": {
                "version": "kind-harness-v1",
                "configMapRef": {"name": "kind-harness-v1", "key": "harness.yaml"},
            },
        }  # fmt: skip
        kubectl("-n", NS, "apply", "-f", str(files["taskbatch.yaml"]))
        await wait_ready(kubectl, "qtb/kind-tool-use", 240)
        batch = status(kube_api, "qtb", "kind-tool-use")
        shards = pods(kube_api, "qpa.ai/taskbatch=kind-tool-use")
        assert len(shards) == batch_spec["shards"]
        assert {p["status"]["phase"] for p in shards} == {"Succeeded"}
        trajectories = read_collected(batch_spec["outputUri"], seaweed.store_config())
        assert len(trajectories) == batch["trajectories"] == SIZES["taskbatch.yaml"]["source.limit"]
        assert {t.policy.planner for t in trajectories} == {"local"}
        assert {t.policy.harness_version for t in trajectories} == {"kind-harness-v1"}

        # ---- the TrainingRun: SFT of the tiny model on the oracle episodes, on the CPU
        kubectl("-n", NS, "apply", "-f", str(files["trainingrun.yaml"]))
        await wait_ready(kubectl, "qtr/kind-sft", 180)
        run = status(kube_api, "qtr", "kind-sft")
        (rank,) = pods(kube_api, "job-name=kind-sft-r0")
        assert rank["status"]["phase"] == "Succeeded"
        assert run["modelUri"].rstrip("/") == "s3://qpa/qpa/trainingruns/kind-sft/final"
        assert run["step"] == 4  # 8 rows, batches of 2, one epoch
        final = resolve_local(
            run["modelUri"], field="modelUri", cache_dir=tmp_path / "cache",
            store_config=seaweed.store_config(),
        )  # fmt: skip
        assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()

        # ---- the HarnessRelease: the SFT model on the CPU behind the Harness, gated, promoted
        kubectl("-n", NS, "apply", "-f", str(files["harnessrelease.yaml"]))
        await wait_ready(kubectl, "qhr/kind-planner", 240)
        release = status(kube_api, "qhr", "kind-planner")
        assert release["phase"] == "Promoted" and release["decision"] == "promote"
        report_uri = release["stable"]["reportUri"]
        folder, file = report_uri.rsplit("/", 1)
        report = Report.model_validate_json(
            open_store(folder, seaweed.store_config()).get_bytes(file)
        )
        assert report.tasks == SIZES["harnessrelease.yaml"]["benchmark.limit"]
        assert report.policy.model == "planner"
        models = json.loads(
            urllib.request.urlopen(
                kubelet.url(f"{model_isvc(kube_api)}-predictor", NS) + "/openai/v1/models"
            ).read()
        )
        assert [m["id"] for m in models["data"]] == ["planner"]

        # Every pod whose spec the operator writes meets the namespace's `restricted` Pod
        # Security Standard; the model server's pod is KServe's (its ServingRuntime's and storage
        # initializer's securityContext: docs/kind.md, Security).
        model = model_isvc(kube_api)
        ours = [
            p for p in kube_api.list_objects("pods", NS)
            if (p["metadata"].get("labels") or {}).get(ISVC_LABEL) != model
        ]  # fmt: skip
        assert len(ours) >= 4  # env server, collector, SFT rank, Harness, benchmark
        assert {p["metadata"]["name"]: violations(p["spec"]) for p in ours} == {
            p["metadata"]["name"]: [] for p in ours
        }


def model_isvc(kube_api: KubeAPIServer) -> str:
    (name,) = [
        i["metadata"]["name"]
        for i in kube_api.list_objects("inferenceservices", NS)
        if i["metadata"]["name"] != "kind-planner-harness"
    ]
    return str(name)
