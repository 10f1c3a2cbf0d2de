"""The operator's pure builders: every kind's children, names, labels, security, status.

No API server here: the builders take parsed custom resources (the examples a user applies)
and return manifests and statuses, so every rule is checked on plain dicts. The command lines
the containers run are checked against the real `qpa` CLI's options.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from qpa_operator.builders import (
    Defaults,
    common,
    devicepool,
    harnessrelease,
    rolloutpool,
    taskbatch,
    trainingrun,
)
from qpa_operator.handlers.apply import drift_patch
from qpa_operator.handlers.status import merge_diff

from qpa.api import DevicePool, HarnessRelease, RolloutPool, TaskBatch, TrainingRun, parse_resource
from qpa.api.v1alpha1 import (
    MAX_NAME_LENGTH,
    WORK_ORDER_DIR,
    WORK_ORDER_KEY,
    WORK_ORDER_PATH,
    Checkpoint,
    TrainSummary,
    WorkOrder,
)
from qpa.api.v1alpha1.taskbatch import CollectSummary

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
D = Defaults()
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TB_OUTPUTS = {"nightly-tool-use": "s3://qpa/default/taskbatches/nightly-tool-use/"}


def load(file: str, index: int = 0, name: str | None = None) -> Any:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]
    body = copy.deepcopy(docs[index])
    if name is not None:
        body["metadata"]["name"] = name
    body["metadata"].update(namespace="team-a", uid=f"uid-{body['metadata']['name']}")
    return parse_resource(body)


def children_of(resource: Any) -> list[dict[str, Any]]:
    if isinstance(resource, TaskBatch):
        return taskbatch.children(resource, D)
    if isinstance(resource, RolloutPool):
        return rolloutpool.children(resource, D)
    if isinstance(resource, DevicePool):
        return devicepool.children(resource, D)
    if isinstance(resource, TrainingRun):
        plan = trainingrun.data_plan(resource, TB_OUTPUTS)
        return trainingrun.children(resource, D, attempt=0, plan=plan, data_ready=True)
    assert isinstance(resource, HarnessRelease)
    return [*harnessrelease.services(resource, D), harnessrelease.bench_job(resource, D)]


RESOURCES = [
    ("taskbatch.yaml", 0),
    ("rolloutpool.yaml", 0),
    ("rolloutpool.yaml", 1),
    ("devicepool.yaml", 0),
    ("trainingrun.yaml", 0),
    ("trainingrun.yaml", 1),
    ("harnessrelease.yaml", 0),
]


@pytest.fixture(params=RESOURCES, ids=lambda p: f"{p[0]}#{p[1]}")
def resource(request: pytest.FixtureRequest) -> Any:
    return load(*request.param)


def pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = obj.get("spec") or {}
    if "template" in spec:
        yield spec["template"]["spec"]
    if "predictor" in spec and "containers" in spec["predictor"]:
        yield spec["predictor"]


def walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


# --------------------------------------------------------------------------- every kind


def test_every_kind_builds_children_with_labels_and_owner_references(resource: Any) -> None:
    built = children_of(resource)
    assert built
    kind = resource.kind
    for child in built:
        meta = child["metadata"]
        assert meta["name"].startswith(f"{resource.metadata.name}-")
        assert meta["namespace"] == "team-a"
        labels = meta["labels"]
        assert labels[common.kind_label(kind)] == resource.metadata.name
        assert labels["app.kubernetes.io/managed-by"] == "qpa-operator"
        assert labels["app.kubernetes.io/instance"] == resource.metadata.name
        assert labels["app.kubernetes.io/part-of"] == "qpa"
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= set(labels)
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": kind,
            "name": resource.metadata.name,
            "uid": resource.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert common.HASH_ANNOTATION in meta["annotations"]
        for pod in pod_specs(child):
            template_labels = child["spec"].get("template", {}).get("metadata", {}).get("labels")
            if template_labels is not None:
                assert template_labels[common.kind_label(kind)] == resource.metadata.name
                assert template_labels["app.kubernetes.io/managed-by"] == "qpa-operator"
            assert pod.get("enableServiceLinks", False) is False


def test_builders_are_pure_and_names_idempotent(resource: Any) -> None:
    first, second = children_of(resource), children_of(resource)
    assert first == second
    names = [(c["kind"], c["metadata"]["name"]) for c in first]
    assert len(names) == len(set(names))


def test_the_spec_hash_follows_the_spec_only(resource: Any) -> None:
    def hashes(obj: Any) -> dict[tuple[str, str], str | None]:
        return {
            (c["kind"], c["metadata"]["name"]): common.spec_hash_of(c) for c in children_of(obj)
        }

    before = hashes(resource)
    relabelled = resource.model_copy(deep=True)
    relabelled.metadata.labels["extra"] = "x"
    assert hashes(relabelled) == before
    changed = resource.model_copy(deep=True)
    if isinstance(changed, TaskBatch):
        changed.spec.parallelism += 1
    elif isinstance(changed, RolloutPool):
        changed.spec.sessions_per_pod += 1
    elif isinstance(changed, DevicePool):
        changed.spec.lease_duration_seconds += 1
    elif isinstance(changed, TrainingRun):
        changed.spec.checkpoint_every += 1
    else:
        changed.spec.model.uri = "s3://qpa/models/other/"
    assert hashes(changed) != before


def test_no_wildcards_and_no_inlined_secrets(resource: Any) -> None:
    for child in children_of(resource):
        for value in walk(child):
            assert value != "*", child["metadata"]["name"]
        for rule in child.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert child["kind"] != "Secret"
        for pod in pod_specs(child):
            for container in pod["containers"]:
                for env in container.get("env", []):
                    secretish = any(w in env["name"] for w in ("KEY", "SECRET", "TOKEN"))
                    if secretish and "value" in env:
                        assert env["value"].startswith("/var/run/secrets/"), env


def test_restricted_security_everywhere_but_the_bridge(resource: Any) -> None:
    for child in children_of(resource):
        for pod in pod_specs(child):
            volumes = pod.get("volumes", [])
            privileged = any(c["securityContext"].get("privileged") for c in pod["containers"])
            if child["kind"] == "DaemonSet":
                assert privileged
                assert {"path": "/dev/bus/usb", "type": "Directory"} in [
                    v["hostPath"] for v in volumes if "hostPath" in v
                ]
                continue
            assert not privileged
            assert not any("hostPath" in v for v in volumes)
            assert pod["securityContext"] == {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            }
            for container in pod["containers"]:
                assert container["securityContext"] == {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                }
            talks_to_api = pod.get("serviceAccountName") is not None
            assert pod["automountServiceAccountToken"] is talks_to_api


def test_the_longest_names_stay_dns_labels() -> None:
    long = "x" * MAX_NAME_LENGTH
    for file, index in RESOURCES:
        resource = load(file, index, name=long)
        for child in children_of(resource):
            name = child["metadata"]["name"]
            if child["kind"] in ("Service", "Job"):
                assert len(name) <= 63, name
            if child["kind"] == "Job" and child["spec"].get("completionMode") == "Indexed":
                # pod hostnames are <job>-<index>
                assert len(f"{name}-{child['spec']['completions'] - 1}") <= 63
            if child["kind"] == "InferenceService":
                assert len(f"{name}-predictor-00001") <= 63


# --------------------------------------------------------------------------- commands


def options(*path: str) -> set[str]:
    from qpa.cli import app

    command: Any = typer.main.get_command(app)
    for part in path:
        assert part in command.commands, f"`qpa {' '.join(path)}` does not exist"
        command = command.commands[part]
    return {opt for param in command.params for opt in param.opts + param.secondary_opts}


def used_flags(argv: list[str]) -> set[str]:
    return {word for word in argv if word.startswith("--")}


def test_collect_runs_the_real_command_with_index_sharding() -> None:
    tb = load("taskbatch.yaml")
    job = taskbatch.job(tb, D)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["sh", "-c"]
    argv = container["args"]
    assert argv == ["qpa", "collect", "--spec", "/etc/qpa/order/workorder.yaml"]
    assert used_flags(argv) <= options("collect")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 32
    assert job["spec"]["backoffLimitPerIndex"] == 3 and "backoffLimit" not in job["spec"]


def test_env_serve_harness_serve_and_bench_run_use_real_options() -> None:
    argv = list(rolloutpool.SERVE_ARGS)
    assert argv[:3] == ["qpa", "env", "serve"]
    assert used_flags(argv) == {"--spec"} <= options("env", "serve")
    hr = load("harnessrelease.yaml")
    harness = harnessrelease.harness_service(hr, D)["spec"]["predictor"]["containers"][0]
    assert harness["command"][:3] == ["qpa", "harness", "serve"]
    assert used_flags(harness["command"]) <= options("harness", "serve")
    bench = harnessrelease.bench_job(hr, D)["spec"]["template"]["spec"]["containers"][0]
    assert bench["command"][:3] == ["qpa", "bench", "run"]
    assert used_flags(bench["command"]) == {"--spec"} <= options("bench", "run")


def test_training_launches_the_real_train_commands() -> None:
    for index, stage in ((0, "sft"), (1, "rl")):
        tr = load("trainingrun.yaml", index)
        argv = trainingrun.train_args(tr, 0, D)
        launch, run = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
        assert used_flags(launch) <= options("train", "launch")
        assert run == ["qpa", "train", stage, "--spec", WORK_ORDER_PATH]
        assert used_flags(run) <= options("train", stage)


def test_data_preparation_uses_the_real_data_commands() -> None:
    tr = load("trainingrun.yaml")
    plan = trainingrun.data_plan(tr, TB_OUTPUTS)
    assert [step[:3] for step in plan.steps] == [
        ("qpa", "data", "curate"),
        ("qpa", "data", "mix"),
    ]
    assert used_flags(list(plan.steps[0])) <= options("data", "curate")
    assert used_flags(list(plan.steps[1])) <= options("data", "mix")


# --------------------------------------------------------------------------- per kind


def test_taskbatch_config_map_carries_the_work_order() -> None:
    tb = load("taskbatch.yaml")
    cm = taskbatch.config_map(tb, D)
    order = yaml.safe_load(cm["data"]["workorder.yaml"])
    assert order["spec"]["source"]["capabilities"] == ["tool_use", "memory"]
    assert order["spec"]["samplesPerTask"] == 8
    assert order["resolved"]["rolloutPoolUrl"] == "http://sandbox-env.team-a.svc.cluster.local"


def test_rolloutpool_autoscales_between_min_and_max_and_wires_devices() -> None:
    sandbox, phones = load("rolloutpool.yaml", 0), load("rolloutpool.yaml", 1)
    kinds = [c["kind"] for c in rolloutpool.children(sandbox, D)]
    assert kinds == [
        "NetworkPolicy", "NetworkPolicy", "ConfigMap", "Deployment", "Service", "Service",
        "HorizontalPodAutoscaler",
    ]  # fmt: skip
    assert rolloutpool.unmanaged_fields(sandbox) == ("spec.replicas",)
    phone_kinds = [c["kind"] for c in rolloutpool.children(phones, D)]
    assert phone_kinds == [
        "NetworkPolicy", "NetworkPolicy", "ServiceAccount", "RoleBinding", "ConfigMap",
        "Deployment", "Service", "Service",
    ]  # fmt: skip
    assert rolloutpool.unmanaged_fields(phones) == ()
    # the env servers' rights are the DevicePool's `<pool>-phones` Role (leases by name)
    (binding,) = [c for c in rolloutpool.children(phones, D) if c["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == devicepool.phones_role_name("lab-phones")


def test_training_pods_get_gpus_shared_memory_and_a_rendezvous() -> None:
    tr = load("trainingrun.yaml", 1)
    job = trainingrun.job(tr, 2, D)
    assert job["metadata"]["name"] == "planner-care-rl-r2"
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (4, 4, 0)
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "32", "ephemeral-storage": "100Gi", "memory": "192Gi",
                     "nvidia.com/gpu": "8"},  # ephemeral-storage: the workSize
        "limits": {"memory": "256Gi", "nvidia.com/gpu": "8"},
    }  # fmt: skip
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert pod["subdomain"] == "planner-care-rl-ranks"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["template"]["metadata"]["labels"][trainingrun.ATTEMPT_LABEL] == "2"
    service = trainingrun.service(tr, D)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == common.selector_labels(tr, trainingrun.COMPONENT)
    cpu = tr.model_copy(deep=True)
    cpu.spec.gpus_per_node = 0
    cpu_pod = trainingrun.job(cpu, 0, D)["spec"]["template"]["spec"]
    assert cpu_pod["containers"][0]["resources"] == {
        "requests": {"cpu": "32", "ephemeral-storage": "100Gi", "memory": "192Gi"},
        "limits": {"memory": "256Gi"},
    }
    assert "tolerations" not in cpu_pod
    assert "--gpus-per-node" in (argv := trainingrun.train_args(cpu, 0, D))
    assert argv[argv.index("--gpus-per-node") + 1] == "1"


def test_training_work_order_carries_the_run_and_what_was_resolved() -> None:
    sft = load("trainingrun.yaml", 0)
    plan = trainingrun.data_plan(sft, TB_OUTPUTS)
    cm = trainingrun.config_map(sft, plan, D, attempt=2)
    assert cm["metadata"]["name"] == "planner-sft-order"
    order = WorkOrder.parse(yaml.safe_load(cm["data"][WORK_ORDER_KEY]), TrainingRun)
    assert order.resource.spec == sft.spec
    assert order.resolved.dataset_uri == "s3://qpa/default/trainingruns/planner-sft/data/mix/"
    assert order.resolved.attempt == 2 and order.resolved.store == sft.spec.store
    assert order.resolved.rollout_pool_url is None
    rl = load("trainingrun.yaml", 1)
    rl.spec.store = None
    rl_order = trainingrun.resolved(rl, trainingrun.data_plan(rl, {}), D)
    assert rl_order.store == D.store  # the chart's store when the spec names none
    url = common.rollout_pool_url("sandbox", common.owner_namespace(rl), D)
    assert rl_order.rollout_pool_url == url
    job = trainingrun.job(sft, 0, D)["spec"]["template"]["spec"]
    mounts = job["containers"][0]["volumeMounts"]
    assert {"name": "work-order", "mountPath": WORK_ORDER_DIR, "readOnly": True} in mounts
    assert {"name": "work-order", "configMap": {"name": "planner-sft-order"}} in job["volumes"]
    assert job["containers"][0]["workingDir"] == trainingrun.WORK_DIR


def test_data_plans() -> None:
    sft = load("trainingrun.yaml", 0)
    waiting = trainingrun.data_plan(sft, {})
    assert waiting.waiting_for == ("nightly-tool-use",) and waiting.dataset is None
    assert not any(
        c["kind"] == "Job" and c["metadata"]["name"].endswith("-r0")
        for c in trainingrun.children(sft, D, attempt=0, plan=waiting, data_ready=True)
    )
    single = sft.model_copy(deep=True)
    single.spec.datasets = single.spec.datasets[1:]
    plan = trainingrun.data_plan(single, {})
    assert plan.dataset == "s3://qpa/default/datasets/curated-2026-01/" and not plan.steps
    assert trainingrun.data_job(single, plan, D) is None


def test_devicepool_bridge_config_roundtrips_through_the_api() -> None:
    pool = load("devicepool.yaml")
    cm = devicepool.config_map(pool, D)
    from qpa.api.v1alpha1 import WORK_ORDER_KEY, DevicePool, WorkOrder

    order = WorkOrder.parse(yaml.safe_load(cm["data"][WORK_ORDER_KEY]), DevicePool)
    assert order.resource.spec == pool.spec and order.name == pool.metadata.name
    ds = devicepool.daemonset(pool, D)
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations == common.work_order_hash(cm)


def test_harnessrelease_candidates_get_their_own_benchmark() -> None:
    hr = load("harnessrelease.yaml")
    other = hr.model_copy(deep=True)
    other.spec.harness.version = "harness-v4"
    assert harnessrelease.bench_job_name(hr, D) != harnessrelease.bench_job_name(other, D)
    assert harnessrelease.bench_job_name(hr, D) == harnessrelease.bench_job_name(
        load("harnessrelease.yaml"), D
    )
    model = harnessrelease.model_service(hr, D)
    assert model["apiVersion"] == "serving.kserve.io/v1beta1"
    assert model["spec"]["predictor"]["model"]["runtime"] == "kserve-huggingfaceserver"


# --------------------------------------------------------------------------- statuses


def job(status: dict[str, Any], name: str = "nightly-tool-use-collect") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": status}


def test_taskbatch_status_follows_the_job_and_never_regresses() -> None:
    tb = load("taskbatch.yaml")
    pending = taskbatch.taskbatch_status(tb, job({}), {}, observed_generation=1, now=NOW)
    assert pending.phase == "Pending" and pending.job_name == "nightly-tool-use-collect"
    running_job = job({"startTime": "2026-01-01T00:00:00Z", "active": 16})
    tb.status = taskbatch.taskbatch_status(tb, running_job, {}, observed_generation=1, now=NOW)
    assert tb.status.phase == "Running"
    stale = taskbatch.taskbatch_status(tb, job({}), {}, observed_generation=1, now=NOW)
    assert stale.phase == "Running"
    shards = {
        0: CollectSummary(
            out="s3://o/",
            shard="0/32",
            total=128,
            ran=100,
            skipped=28,
            successes=60,
            skipped_successes=20,
        )
    }
    counted = taskbatch.taskbatch_status(tb, running_job, shards, observed_generation=1, now=NOW)
    assert (counted.trajectories, counted.successes, counted.failures, counted.tasks) == (
        128, 80, 48, 16,
    )  # fmt: skip
    again = taskbatch.taskbatch_status(tb, running_job, {}, observed_generation=1, now=NOW)
    assert again.conditions == tb.status.conditions  # no new transition time when unchanged


SUMMARY = CollectSummary(out="s3://o/", shard="3/32", total=8, ran=4, skipped=4, successes=2)


def test_shard_summaries_come_from_finished_pods_only() -> None:
    pod: dict[str, Any] = {
        "metadata": {"labels": {"batch.kubernetes.io/job-completion-index": "3"}},
        "status": {
            "containerStatuses": [
                {
                    "name": "collect",
                    "state": {"terminated": {"exitCode": 0, "message": SUMMARY.to_message()}},
                }
            ]
        },
    }
    assert taskbatch.shard_summary(pod) == (3, SUMMARY)
    failed = copy.deepcopy(pod)
    failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 1
    assert taskbatch.shard_summary(failed) is None
    logs = copy.deepcopy(pod)
    logs["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "Traceback ..."
    assert taskbatch.shard_summary(logs) is None


def test_trainingrun_attempts_and_summaries() -> None:
    tr = load("trainingrun.yaml", 1)
    failed = common.job_state(job({"conditions": [{"type": "Failed", "status": "True"}]}))
    assert trainingrun.next_attempt(tr, 0, failed) == 1
    assert trainingrun.next_attempt(tr, tr.spec.backoff_limit, failed) is None
    no_resume = tr.model_copy(deep=True)
    no_resume.spec.resume = False
    assert trainingrun.next_attempt(no_resume, 0, failed) is None
    plan = trainingrun.data_plan(tr, {})
    status = trainingrun.trainingrun_status(
        tr,
        attempt=1,
        job=job({"conditions": [{"type": "Complete", "status": "True"}]}, "planner-care-rl-r1"),
        data_job=None,
        plan=plan,
        summaries=[
            (
                0,
                TrainSummary(
                    run="planner-care-rl",
                    stage="rl",
                    step=40,
                    checkpoints=[Checkpoint(step=40, uri="s3://x/checkpoint-40/")],
                ),
            )
        ],
        observed_generation=1,
        now=NOW,
    )
    assert status.phase == "Succeeded" and status.restarts == 1 and status.step == 40
    assert status.latest_checkpoint == "s3://x/checkpoint-40/"
    assert status.model_uri == "s3://qpa/default/trainingruns/planner-care-rl/final/"


def test_train_summary_round_trips_through_the_termination_message() -> None:
    """What `qpa train sft|rl` writes (`TrainSummary.to_message`) is what the status shows."""
    tr = load("trainingrun.yaml", 0)
    sent = TrainSummary(
        run="planner-sft",
        stage="sft",
        step=400,
        total_steps=400,
        checkpoints=[
            Checkpoint(
                step=s, uri=f"s3://qpa/default/trainingruns/planner-sft/checkpoints/checkpoint-{s}/"
            )
            for s in (100, 200, 300, 400)
        ],
        model_uri="s3://qpa/default/trainingruns/planner-sft/final/",
        loss=0.25,
        metrics={"tokens_per_second": 1234.5},
        resumed_from="s3://qpa/default/trainingruns/planner-sft/checkpoints/checkpoint-100/",
        resumed_step=100,
    )
    pod: dict[str, Any] = {
        "metadata": {
            "labels": {trainingrun.ATTEMPT_LABEL: "1", trainingrun.COMPLETION_INDEX_LABEL: "0"}
        },
        "status": {
            "containerStatuses": [
                {
                    "name": trainingrun.CONTAINER,
                    "state": {"terminated": {"exitCode": 0, "message": sent.to_message()}},
                }
            ]
        },
    }
    found = trainingrun.rank0_summary(pod)
    assert found == (1, sent)
    plan = trainingrun.data_plan(tr, TB_OUTPUTS)
    done = job({"conditions": [{"type": "Complete", "status": "True"}]}, "planner-sft-r1")
    status = trainingrun.trainingrun_status(
        tr, attempt=1, job=done, data_job=job({"succeeded": 1, "conditions": [
            {"type": "Complete", "status": "True"}]}, "planner-sft-data"),
        plan=plan, summaries=[found], observed_generation=1, now=NOW,
    )  # fmt: skip
    assert (status.step, status.total_steps, status.model_uri) == (400, 400, sent.model_uri)
    assert [c.step for c in status.checkpoints] == [200, 300, 400]  # keepCheckpoints: 3
    assert status.metrics == {"tokens_per_second": 1234.5, "loss": 0.25}
    garbled = copy.deepcopy(pod)
    garbled["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        '{"globalStep": 3, "final_uri": "s3://x/"}'  # old spellings are not a TrainSummary
    )
    assert trainingrun.rank0_summary(garbled) is None


def test_devicepool_status_lists_phones_from_leases() -> None:
    pool = load("devicepool.yaml")
    lease: dict[str, Any] = {
        "metadata": {
            "labels": {"qpa.ai/devicepool": "lab-phones"},
            "annotations": {"qpa.ai/serial": "A1", "qpa.ai/node": "n1", "qpa.ai/model": "Pixel 8"},
        },
        "spec": {
            "holderIdentity": "pod-x",
            "renewTime": "2025-12-31T23:59:00Z",
            "leaseDurationSeconds": 300,
        },
    }
    expired = copy.deepcopy(lease)
    expired["metadata"]["annotations"]["qpa.ai/serial"] = "B2"
    expired["spec"]["renewTime"] = "2025-12-31T00:00:00Z"
    ds = {"status": {"desiredNumberScheduled": 1, "numberReady": 1}}
    status = devicepool.devicepool_status(
        pool, ds, [lease, expired], observed_generation=1, now=NOW
    )
    assert [(p.serial, p.state, p.leased_by) for p in status.phones] == [
        ("A1", "leased", "pod-x"),
        ("B2", "available", None),
    ]
    assert status.phase == "Ready" and (status.total, status.leased) == (2, 1)
    nodes = devicepool.devicepool_status(
        pool, {"status": {"desiredNumberScheduled": 0}}, [], observed_generation=1, now=NOW
    )
    assert nodes.phase == "Pending" and nodes.conditions[0].reason == "NoDeviceNodes"


def test_rolloutpool_status_counts_capacity() -> None:
    pool = load("rolloutpool.yaml", 0)
    deployment = {"status": {"replicas": 3, "readyReplicas": 3}}
    status = rolloutpool.rolloutpool_status(
        pool, deployment, leased=5, phones_available=None, device_pool_found=None,
        observed_generation=1, defaults=D, now=NOW,
    )  # fmt: skip
    assert (status.phase, status.capacity, status.leased) == ("Ready", 96, 5)
    stuck = {
        "status": {
            "conditions": [
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
            ]
        }
    }
    failed = rolloutpool.rolloutpool_status(
        pool, stuck, leased=0, phones_available=None, device_pool_found=None,
        observed_generation=1, defaults=D, now=NOW,
    )  # fmt: skip
    assert failed.phase == "Failed"


# --------------------------------------------------------------------------- patches


def test_drift_patches_touch_only_what_the_operator_manages() -> None:
    pool = load("rolloutpool.yaml", 0)
    desired = rolloutpool.deployment(pool, D)
    live = copy.deepcopy(desired)
    live["metadata"]["ownerReferences"].append({"uid": "other", "kind": "X", "name": "x"})
    patch = drift_patch(desired, live, unmanaged=("spec.replicas",))
    assert "replicas" not in patch["spec"] and "template" in patch["spec"]
    assert [r["uid"] for r in patch["metadata"]["ownerReferences"]] == ["other", "uid-sandbox"]
    job_patch = drift_patch(
        taskbatch.job(load("taskbatch.yaml"), D), {}, mutable_spec=("parallelism",)
    )
    assert job_patch["spec"] == {"parallelism": 16}


def test_merge_diff_is_a_minimal_merge_patch() -> None:
    old = {"phase": "Pending", "tasks": 0, "conditions": [{"type": "A"}], "gone": 1}
    new = {"phase": "Running", "tasks": 0, "conditions": [{"type": "A"}, {"type": "B"}]}
    assert merge_diff(old, new) == {
        "phase": "Running",
        "conditions": [{"type": "A"}, {"type": "B"}],
        "gone": None,
    }
