"""HarnessRelease end to end: `kubectl apply` → InferenceServices served by real processes →
benchmark Job → report in SeaweedFS → gate → canary → Promoted; a worse candidate rolled back.

`examples/harnessrelease.yaml`, adjusted only for this machine and small sizes: the model is a tiny
checkpoint in SeaweedFS served on the CPU (`runtime: huggingface`, `gpus: 0`; the stand-in
generates at most `FIXTURE_MAX_NEW_TOKENS` per request), the store is SeaweedFS with its keys in
the Secret `spec.store.secretRef` names, the Harness's YAML (ConfigMap `harness-v3`) a small prompt
and a 2-turn budget the benchmark runs each episode within, the benchmark 2 tasks x 1 sample in
the in-process sandbox, the gate thresholds the tiny model can pass (and no environment errors),
canary steps of 1 s and short timeouts. The real operator writes the InferenceServices and the
Job; the KServe stand-in (`fakes.kserve`) turns the InferenceServices into revisions whose Pods
the test kubelet runs: the model through KServe's storage initializer and an OpenAI-compatible
server over the tiny model, the Harness as `qpa harness serve`; the Job runs `qpa bench run
--spec` against the candidate model's Service and publishes its report to S3, which the operator
reads and gates. Nothing about the children's status is forged.

Three versions: harness-v3 (a first release: promoted without a canary), harness-v4 (walks the
canary 10 → 50 → 100 % of the Harness's traffic, then promoted; v3 becomes previous) and
harness-v5 with a gate asking for 90 % success, which the untrained model cannot reach: rolled
back, and v4's revision keeps all the traffic.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kserve import FIXTURE_MAX_NEW_TOKENS, ISVC_LABEL, REVISION_LABEL, KServe
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from fakes.seaweed import SeaweedS3
from helpers.operator_runner import NS, example, operator, phase

from qpa.bench.scoring import Report
from qpa.store import open_store
from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, suite_corpus

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

NAME = "planner"
HARNESS = f"{NAME}-harness"
TINY = TinyConfig(
    vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=2,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=8192,
)  # fmt: skip


@pytest.fixture
def release_env(operator_env: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator's settings; it reads the reports with its own store keys (the chart's
    objectStore Secret in its env), the release names the endpoint (`spec.store`)."""
    monkeypatch.setenv("QPA_OPERATOR_RELEASE_TICK", "0.2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.delenv("QPA_S3_ENDPOINT", raising=False)
    return operator_env


@pytest.fixture
def model_uri(seaweed: SeaweedS3, tmp_path: Path) -> str:
    """The tiny checkpoint, uploaded to SeaweedFS: the release's `model.uri`."""
    folder = make_tiny_checkpoint(
        tmp_path / "tiny", TINY, corpus=suite_corpus(conversations=4, instructions=300)
    )
    uri = seaweed.root("e2e-hr-model") + "/"
    store = open_store(uri, seaweed.store_config())
    for path in sorted(folder.iterdir()):
        store.put_file(path.name, path)
    return uri


def harness_config(version: str) -> dict[str, Any]:
    """The Harness version's ConfigMap: a small prompt (the adapter's smallest token budget, one
    tool of the scenario's) and a 2-turn budget, which the benchmark pod runs each episode within.
    """
    config = {"version": version, "token_budget": 100, "max_tools": 1, "max_turns": 2}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": version, "namespace": NS},
        "data": {"harness.yaml": yaml.safe_dump(config)},
    }


def release_yaml(
    tmp_path: Path, seaweed: SeaweedS3, model: str, reports: str, version: str, **gate: Any
) -> Path:
    """examples/harnessrelease.yaml for this machine (Harness `version`), with its Secret and
    Harness ConfigMap, as one file."""
    hr = example("harnessrelease.yaml")
    spec = hr["spec"]
    spec["model"].update(uri=model, runtime="huggingface", gpus=0, maxModelLength=8192)
    spec["harness"].update(version=version, configMapRef={"name": version, "key": "harness.yaml"})
    spec["benchmark"].update(limit=2, samples=1, concurrency=2, environment="sandbox")
    del spec["benchmark"]["rolloutPoolRef"]
    spec["gate"] = {
        "minOverall": 0.0,
        "maxCapabilityRegression": 0.05,
        "maxCostIncrease": 0.5,
        "maxEnvironmentErrorRate": 0.0,
        "minSamples": 1,
        "minTasks": 2,
        **gate,
    }
    spec["canary"] = {"steps": [10, 50, 100], "stepSeconds": 1}
    spec["rollout"].pop("analysis")  # readiness-only steps (live analysis: integration tests)
    spec["timeouts"] = {"deploySeconds": 180, "benchmarkSeconds": 180, "reportSeconds": 30}
    spec["reportUri"] = reports
    spec["store"]["endpoint"] = seaweed.endpoint
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": spec["store"]["secretRef"]["name"], "namespace": NS},
        "stringData": {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key},
    }
    path = tmp_path / f"hr-{version}.yaml"
    path.write_text(yaml.safe_dump_all([secret, harness_config(version), hr]))
    return path


def predictor_status(kube: KubeAPIServer, name: str = HARNESS) -> dict[str, Any]:
    isvc = kube.get("inferenceservices", NS, name) or {}
    return dict(((isvc.get("status") or {}).get("components") or {}).get("predictor") or {})


def report_of(seaweed: SeaweedS3, uri: str) -> Report:
    folder, file = uri.rsplit("/", 1)
    return Report.model_validate_json(open_store(folder, seaweed.store_config()).get_bytes(file))


def serving_versions(kube: KubeAPIServer) -> set[str]:
    """QPA_HARNESS_VERSION of the Running Pods the Harness's Service routes to."""
    service = kube.get("services", NS, f"{HARNESS}-predictor")
    assert service is not None
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    versions = set()
    for pod in kube.list_objects("pods", NS, selector):
        if (pod.get("status") or {}).get("phase") == "Running":
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            versions.add(str(env["QPA_HARNESS_VERSION"]))
    return versions


async def test_release_promotes_through_the_canary_and_rolls_back_a_worse_candidate(
    kube_api: KubeAPIServer,
    release_env: Path,
    kubectl: Kubectl,
    kubelet: TestKubelet,
    kserve: KServe,
    seaweed: SeaweedS3,
    model_uri: str,
    tmp_path: Path,
) -> None:
    reports = seaweed.root("e2e-hr-reports") + "/"
    with operator(timeout=120):
        # ---- harness-v3: the first release, promoted once its benchmark passes the gate
        kubectl(
            "apply", "-f", str(release_yaml(tmp_path, seaweed, model_uri, reports, "harness-v3"))
        )
        v3 = await phase(kube_api, "qhr", NAME, "Promoted", timeout=150)
        assert v3["stable"]["harnessVersion"] == "harness-v3"
        assert any("first release" in r for r in v3["reasons"])
        report = report_of(seaweed, v3["stable"]["reportUri"])
        assert v3["stable"]["reportUri"].startswith(reports + f"{NAME}/")
        assert report.tasks == 2 and report.complete
        assert report.policy.model == "planner" and report.policy.harness_version == "harness-v3"
        # the Harness version's 2-turn budget bounded each episode; the model never refused one
        assert 1 <= report.turns <= 2 and "environment" not in report.errors_by_side
        assert report.output_tokens_per_task <= 2 * FIXTURE_MAX_NEW_TOKENS
        bench_pods = kube_api.list_objects("pods", NS, "app.kubernetes.io/component=benchmark")
        assert [p["status"]["phase"] for p in bench_pods] == ["Succeeded"]
        (model_isvc,) = [
            i["metadata"]["name"]
            for i in kube_api.list_objects("inferenceservices", NS)
            if i["metadata"]["name"] != HARNESS
        ]
        model_pods = kube_api.list_objects("pods", NS, f"{ISVC_LABEL}={model_isvc}")
        (model_pod,) = [p["metadata"]["name"] for p in model_pods]
        assert "chat/completions" in kubelet.logs(model_pod)  # the benchmark asked the model
        models = json.loads(
            urllib.request.urlopen(
                kubelet.url(f"{model_isvc}-predictor") + "/openai/v1/models"
            ).read()
        )
        assert [m["id"] for m in models["data"]] == ["planner"]

        # ---- harness-v4: benchmarked at 0 % of the traffic, then the canary walks
        percents: list[int] = []  # the shares of v4's revision, as they change
        split_routes: set[frozenset[str]] = set()  # what the Service routes to during the split
        v3_revision = predictor_status(kube_api)["latestRolledoutRevision"]

        def canary_done() -> bool:
            current = predictor_status(kube_api)
            latest = [
                t
                for t in current.get("traffic") or []
                if t.get("latestRevision") and t.get("revisionName") != v3_revision
            ]
            if latest and (not percents or percents[-1] != latest[0]["percent"]):
                percents.append(int(latest[0]["percent"]))
            if latest and latest[0]["percent"] in (10, 50):
                split_routes.add(frozenset(serving_versions(kube_api)))
            hr = kube_api.get("qhr", NS, NAME) or {}
            status = hr.get("status") or {}
            return (
                status.get("phase") == "Promoted"
                and status.get("stable", {}).get("harnessVersion") == "harness-v4"
            )

        kubectl(
            "apply", "-f", str(release_yaml(tmp_path, seaweed, model_uri, reports, "harness-v4"))
        )
        await kube_api.eventually(canary_done, timeout=150, interval=0.05)
        assert [p for p in percents if p in (10, 50, 100)] == [10, 50, 100], percents
        assert percents[0] in (0, 10), percents  # no traffic before its benchmark passed
        both = frozenset({"harness-v3", "harness-v4"})
        assert both in split_routes, split_routes  # the Service routed to both revisions
        v4 = await phase(kube_api, "qhr", NAME, "Promoted")
        assert v4["previous"]["harnessVersion"] == "harness-v3"
        report_of(seaweed, v4["stable"]["reportUri"])  # its own report, in S3
        await kube_api.eventually(lambda: serving_versions(kube_api) == {"harness-v4"})
        rolled_out = predictor_status(kube_api)["latestRolledoutRevision"]

        # ---- harness-v5 with a gate the untrained model cannot pass: rolled back
        worse = release_yaml(tmp_path, seaweed, model_uri, reports, "harness-v5", minOverall=0.9)
        kubectl("apply", "-f", str(worse))
        v5 = await phase(kube_api, "qhr", NAME, "RolledBack", timeout=150)
        assert v5["decision"] == "rollback" and v5["stable"]["harnessVersion"] == "harness-v4"
        rejected = {c["type"]: c for c in v5["conditions"]}["Rejected"]
        assert rejected["reason"] == "GateFailed" and "overall" in rejected["message"]
        assert v5["trafficPercent"] == 0
        harness = predictor_status(kube_api)
        shares = {t["revisionName"]: t["percent"] for t in harness["traffic"]}
        assert shares[rolled_out] == 100 and shares[harness["latestCreatedRevision"]] == 0
        assert harness["latestRolledoutRevision"] == rolled_out
        assert serving_versions(kube_api) == {"harness-v4"}
        ready = kubelet.url(f"{HARNESS}-predictor") + "/v2/models/harness/ready"
        assert urllib.request.urlopen(ready).status == 200  # the stable revision answers
        service = kube_api.get("services", NS, f"{HARNESS}-predictor")
        assert service is not None and service["spec"]["selector"] == {REVISION_LABEL: rolled_out}
