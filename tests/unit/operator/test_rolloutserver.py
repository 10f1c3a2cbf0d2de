"""The rollout server a TrainingRun's `spec.rl.generation` starts (`builders.rolloutserver`).

Checked: the Deployment runs the real `qpa rollout serve --spec` on the run's work order, with a
`/health` readiness probe, GPUs requested (and GPU placement) for vLLM and none for an hf server
with `gpus: 0`; the Service forwards the port of the URL the ranks' work order carries (with the
weight-sync port); every object is owned by the TrainingRun, labelled, and valid against the
official Kubernetes schemas; the ranks and the server reach each other (and nothing else gets
in); without `spec.rl.generation` nothing of it is built; the CRD rules refuse an impossible
generation spec, naming the field; the rank and server configs come from the same work order.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from fakes.kube_builtin import check
from pydantic import ValidationError
from qpa_operator.builders import rolloutserver, trainingrun
from qpa_operator.builders.common import LABEL_COMPONENT, Defaults

from qpa.api import TrainingRun, parse_resource
from qpa.api.v1alpha1 import TrainingRunStatus, WorkOrder
from qpa.api.v1alpha1.workorder import WORK_ORDER_PATH

EXAMPLES = Path(__file__).parents[3] / "examples"
D = Defaults()


def rl_run(generation: dict[str, Any] | None) -> TrainingRun:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "trainingrun.yaml").read_text()) if d]
    body = copy.deepcopy(next(d for d in docs if d["spec"]["stage"] == "rl"))
    body["metadata"].update(namespace="team-a", uid="uid-rl")
    if generation is not None:
        body["spec"]["rl"]["generation"] = generation
    resource = parse_resource(body)
    assert isinstance(resource, TrainingRun)
    return resource


def children(tr: TrainingRun) -> list[dict[str, Any]]:
    plan = trainingrun.data_plan(tr, {})
    return trainingrun.children(tr, D, attempt=0, plan=plan, data_ready=True)


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def serve_options() -> set[str]:
    from qpa.cli import app

    command: Any = typer.main.get_command(app)
    serve = command.commands["rollout"].commands["serve"]
    return {opt for param in serve.params for opt in param.opts}


def test_vllm_generation_starts_a_gpu_rollout_server_the_ranks_are_wired_to() -> None:
    tr = rl_run({"backend": "vllm", "gpus": 2, "tensorParallel": 2, "maxModelLength": 8192})
    objects = by_kind_name(children(tr))
    name = f"{tr.metadata.name}-rollout"
    deployment = objects[("Deployment", name)]
    service = objects[("Service", name)]

    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["qpa", "rollout", "serve", "--spec", WORK_ORDER_PATH]
    assert {"--spec"} <= serve_options()
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"] == {
        "requests": {
            "cpu": "8",
            "ephemeral-storage": "1Gi",
            "memory": "64Gi",
            "nvidia.com/gpu": "2",
        },
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
    }  # never BestEffort: CPU and memory per GPU beside the GPUs
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert container["image"] == D.trainer_image
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    # the same work order ConfigMap as the ranks
    order_map = objects[("ConfigMap", trainingrun.config_map_name(tr))]
    assert any(
        v.get("configMap", {}).get("name") == order_map["metadata"]["name"] for v in pod["volumes"]
    )

    assert service["spec"]["ports"] == [
        {"name": "http", "port": rolloutserver.PORT, "targetPort": "http", "protocol": "TCP"}
    ]
    selector = service["spec"]["selector"]
    assert selector[LABEL_COMPONENT] == "rollout-server"
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= selector.items()

    for obj in (deployment, service):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-rl"
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "TrainingRun"
        assert obj["metadata"]["labels"][LABEL_COMPONENT] == "rollout-server"
    for obj in rolloutserver.children(tr, D, trainingrun.selector_labels(tr, "trainer")):
        verdict = check(obj)
        assert not verdict.errors and not verdict.unknown, (obj["kind"], verdict)

    # the ranks' work order: the server's URL (the Service's port) and the rendezvous port
    order = WorkOrder.parse(
        yaml.safe_load(next(iter(order_map["data"].values()))), TrainingRun, source="test"
    )
    assert order.resolved.rollout_server_url == (
        f"http://{name}.team-a.svc.cluster.local:{rolloutserver.PORT}"
    )
    assert order.resolved.rollout_group_port == rolloutserver.GROUP_PORT

    from qpa.train.rl.config import RLConfig
    from qpa.train.rl.rollout_server import RolloutServeConfig, vllm_command

    rl = RLConfig.from_trainingrun(order)
    assert rl.generation.backend == "vllm"
    assert rl.generation.vllm_url == order.resolved.rollout_server_url
    assert rl.generation.vllm_group_port == rolloutserver.GROUP_PORT
    served = RolloutServeConfig.from_trainingrun(order)
    assert (served.backend, served.port, served.host) == ("vllm", rolloutserver.PORT, "0.0.0.0")
    assert served.model == tr.spec.base_model_uri
    argv = vllm_command(served, "/work/model")
    assert argv[argv.index("serve") + 1] == "/work/model"
    for flag, value in (
        ("--tensor-parallel-size", "2"),
        ("--max-model-len", "8192"),
        ("--port", str(rolloutserver.PORT)),
        ("--weight-transfer-config", '{"backend": "nccl"}'),
        ("--logprobs-mode", "processed_logprobs"),
        ("--served-model-name", tr.metadata.name),
    ):
        assert argv[argv.index(flag) + 1] == value, flag


@pytest.mark.parametrize(
    ("phase", "replicas"),
    [(None, 1), ("Running", 1), ("Resuming", 1), ("Succeeded", 0), ("Failed", 0)],
)
def test_a_finished_run_keeps_no_rollout_server_pod(phase: str | None, replicas: int) -> None:
    tr = rl_run({"backend": "vllm"})
    if phase is not None:
        tr = tr.model_copy(update={"status": TrainingRunStatus(phase=phase)})
    assert rolloutserver.deployment(tr, D)["spec"]["replicas"] == replicas


def test_network_policies_let_exactly_ranks_and_server_reach_each_other() -> None:
    tr = rl_run({"backend": "vllm"})
    objects = by_kind_name(children(tr))
    ranks = trainingrun.selector_labels(tr, "trainer")
    server = rolloutserver.selector_labels(tr, "rollout-server")
    name = f"{tr.metadata.name}-rollout"

    ingress = objects[("NetworkPolicy", f"{name}-ingress")]["spec"]
    assert ingress["podSelector"]["matchLabels"] == server
    assert ingress["ingress"] == [{"from": [{"podSelector": {"matchLabels": ranks}}]}]
    egress = objects[("NetworkPolicy", f"{tr.metadata.name}-rollout-egress")]["spec"]
    assert egress["podSelector"]["matchLabels"] == server
    assert {"to": [{"podSelector": {"matchLabels": ranks}}]} in egress["egress"]
    assert all(rule.get("to") for rule in egress["egress"])  # nothing open to everywhere

    rank_egress = objects[("NetworkPolicy", f"{tr.metadata.name}-egress")]["spec"]["egress"]
    assert {"to": [{"podSelector": {"matchLabels": server}}]} in rank_egress
    rank_ingress = next(
        o["spec"]
        for (kind, _), o in objects.items()
        if kind == "NetworkPolicy"
        and o["spec"]["podSelector"]["matchLabels"] == ranks
        and o["spec"]["policyTypes"] == ["Ingress"]
    )
    peers = rank_ingress["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": server}} in peers


def test_hf_backend_without_gpus_and_no_generation_at_all() -> None:
    tr = rl_run({"backend": "hf", "gpus": 0, "image": "registry.local/qpa-trainer:cpu"})
    deployment = rolloutserver.deployment(tr, D)
    pod = deployment["spec"]["template"]["spec"]
    assert "tolerations" not in pod
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "ephemeral-storage": "1Gi", "memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }
    assert pod["containers"][0]["image"] == "registry.local/qpa-trainer:cpu"

    plain = rl_run(None)
    assert rolloutserver.children(plain, D, {}) == []
    assert not [o for o in children(plain) if o["metadata"]["name"].endswith("-rollout")]
    plan = trainingrun.data_plan(plain, {})
    resolved = trainingrun.resolved(plain, plan, D)
    assert resolved.rollout_server_url is None and resolved.rollout_group_port is None
    with pytest.raises(ValueError, match=r"spec\.rl\.generation"):
        rolloutserver.deployment(plain, D)


@pytest.mark.parametrize(
    ("generation", "message"),
    [
        ({"backend": "vllm", "gpus": 0}, "backend vllm needs gpus >= 1"),
        ({"backend": "vllm", "gpus": 1, "tensorParallel": 2}, "tensorParallel <= gpus"),
        ({"backend": "hf", "gpus": 2, "tensorParallel": 2}, "tensorParallel must be 1"),
        ({"backend": "sglang"}, "backend"),
        ({"maxModelLength": 0}, "maxModelLength"),
    ],
)
def test_impossible_generation_specs_are_refused(generation: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        rl_run(generation)


def test_a_work_order_without_the_server_url_is_refused() -> None:
    from qpa.train.config import ConfigError
    from qpa.train.rl.config import RLConfig

    tr = rl_run({"backend": "vllm"})
    plan = trainingrun.data_plan(tr, {})
    good = trainingrun.resolved(tr, plan, D)
    order = WorkOrder[TrainingRun](
        resource=tr, resolved=good.model_copy(update={"rollout_server_url": None})
    )
    with pytest.raises(ConfigError, match=r"resolved\.rolloutServerUrl"):
        RLConfig.from_trainingrun(order)
