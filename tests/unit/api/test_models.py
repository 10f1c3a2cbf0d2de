"""qpa.api.v1alpha1: the five custom resources as pydantic models."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from qpa.api import v1alpha1 as api
from qpa.api.v1alpha1 import (
    API_VERSION,
    RESOURCES,
    DevicePool,
    HarnessRelease,
    RolloutPool,
    TaskBatch,
    TrainingRun,
    parse_resource,
    resource_for_kind,
    set_condition,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
EXAMPLE_FILES = ["taskbatch", "rolloutpool", "devicepool", "trainingrun", "harnessrelease"]


def example_docs() -> list[dict[str, Any]]:
    docs = []
    for name in EXAMPLE_FILES:
        docs += [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]
    return docs


def example(kind: str, index: int = 0) -> dict[str, Any]:
    return [d for d in example_docs() if d["kind"] == kind][index]


def test_every_kind_has_an_example_and_the_names_of_the_design() -> None:
    kinds = {d["kind"] for d in example_docs()}
    assert kinds == {cls.info.kind for cls in RESOURCES}
    short = {cls.info.kind: cls.info.short_names for cls in RESOURCES}
    assert short == {
        "TaskBatch": ("qtb",),
        "RolloutPool": ("qrp",),
        "DevicePool": ("qdp",),
        "TrainingRun": ("qtr",),
        "HarnessRelease": ("qhr",),
    }
    assert API_VERSION == f"{api.GROUP}/{api.VERSION}" == "qpa.ai/v1alpha1"


@pytest.mark.parametrize("doc", example_docs(), ids=lambda d: d["metadata"]["name"])
def test_examples_parse_and_round_trip_in_camel_case(doc: dict[str, Any]) -> None:
    resource = parse_resource(doc)
    wire = resource.to_k8s()
    assert wire["apiVersion"] == API_VERSION and wire["kind"] == doc["kind"]
    # Everything the user wrote survives (defaults are added, nothing is renamed or lost).
    assert _contains(wire["spec"], doc["spec"]), json.dumps(wire["spec"])
    assert "_" not in "".join(_keys(wire["spec"])), "wire keys are camelCase"
    assert type(resource).model_validate(wire) == resource


def _contains(big: Any, small: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(_contains(big.get(k), v) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(big) == len(small) and all(map(_contains, big, small))
    return bool(big == small)


def _keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        keys = [k for k in value if "/" not in k and "." not in k]  # map keys are data
        return keys + [k for v in value.values() for k in _keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


STORE = api.ObjectStore(
    endpoint="http://minio.qpa-system.svc:9000", secret_ref=api.StoreSecretRef(name="qpa-minio")
)


def test_snake_and_camel_names_are_both_accepted() -> None:
    camel = api.TaskBatchSpec.model_validate(example("TaskBatch")["spec"])
    snake = api.TaskBatchSpec(
        source=api.TaskSource(dataset_uri="s3://qpa/tasks/x.jsonl"),
        policy=api.PolicyEndpoint(planner="oracle"),
        samples_per_task=4,
        output_uri="s3://qpa/data/out/",
        store=STORE,
    )
    assert camel.samples_per_task == 8
    assert snake.to_k8s()["samplesPerTask"] == 4
    assert snake.to_k8s()["source"] == {
        "datasetUri": "s3://qpa/tasks/x.jsonl",
        "domains": [],
        "capabilities": [],
        "taskIds": [],
    }


def test_defaults_fill_in_nested_settings() -> None:
    spec = api.TrainingRunSpec.model_validate(
        {
            "stage": "rl",
            "baseModelUri": "s3://m/base/",
            "rl": {"rolloutPoolRef": {"name": "sandbox"}},
            "outputUri": "s3://qpa/out/",
            "store": STORE.to_k8s(),
        }
    )
    assert spec.deepspeed.zero_stage == 2 and spec.deepspeed.offload_optimizer == "none"
    assert spec.rl is not None and spec.rl.care.success_anchor is True
    assert spec.rl.care.low_success_threshold < spec.rl.care.high_success_threshold
    assert spec.nodes == 1 and spec.gpus_per_node == 8 and spec.resume is True
    release = api.HarnessReleaseSpec.model_validate(
        {
            "model": {"uri": "s3://m/x/"},
            "harness": {"image": "img:1", "version": "h1"},
            "reportUri": "s3://qpa/r/",
        }
    )
    assert release.canary.steps == [10, 50, 100] and release.gate.min_overall == 0.5
    assert DevicePool.model_validate(example("DevicePool")).spec.node_selector == {
        "qpa.ai/device-node": "true"
    }


CROSS_FIELD_CASES: list[tuple[type[Any], dict[str, Any], str]] = [
    (api.TaskSource, {}, "exactly one of generator or datasetUri"),
    (
        api.TaskSource,
        {"generator": {}, "datasetUri": "s3://a/b"},
        "exactly one of generator or datasetUri",
    ),
    (api.PolicyEndpoint, {"planner": "openai"}, "planner openai needs modelUrl"),
    (api.PolicyEndpoint, {"planner": "local"}, "planner local needs modelUri"),
    (api.ReplicaRange, {"min": 3, "max": 2}, "replicas.min must not exceed replicas.max"),
    (api.DeviceFilter, {"minAndroidVersion": 14, "maxAndroidVersion": 12}, "must not exceed"),
    (api.DeviceFilter, {"serials": ["a", "a"]}, "must be unique"),
    (api.DeviceHealthCheck, {"intervalSeconds": 10, "timeoutSeconds": 10}, "below interval"),
    (api.DatasetRef, {}, "exactly one of taskBatchRef or uri"),
    (api.CareSettings, {"lowSuccessThreshold": 0.9}, "must not exceed highSuccessThreshold"),
    (api.CareSettings, {"tokenWeight": 0.4, "callWeight": 0.2}, "outranks every failure"),
    (api.DeepSpeedSettings, {"offloadParameters": "cpu"}, "needs zeroStage 3"),
    (api.DeepSpeedSettings, {"zeroStage": 0, "offloadOptimizer": "cpu"}, "zeroStage 1, 2 or 3"),
    (api.ModelServing, {"uri": "s3://m/", "gpus": 0}, "runtime vllm needs gpus >= 1"),
    (api.CanarySettings, {"steps": [10, 50]}, "last canary step must be 100"),
    (api.CanarySettings, {"steps": [50, 10, 100]}, "must increase"),
    (
        api.TaskSource,
        {"generator": {}, "capabilities": ["memory", "memory"]},
        "must be unique",
    ),
    (api.TaskSource, {"generator": {}, "taskIds": ["a", "a"]}, "must be unique"),
]


@pytest.mark.parametrize(
    ("model", "data", "message"), CROSS_FIELD_CASES, ids=[c[2] for c in CROSS_FIELD_CASES]
)
def test_cross_field_rules_are_enforced_by_pydantic(
    model: type[Any], data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        model.model_validate(data)


def test_spec_level_rules() -> None:
    base = example("TrainingRun")["spec"]
    with pytest.raises(ValidationError, match="stage rl needs rl settings"):
        api.TrainingRunSpec.model_validate({**base, "stage": "rl", "sft": None})
    with pytest.raises(ValidationError, match="resumeFrom needs resume: true"):
        api.TrainingRunSpec.model_validate(
            {**base, "resume": False, "resumeFrom": "s3://qpa/ckpt/1/"}
        )
    with pytest.raises(ValidationError, match="needs store"):
        api.TrainingRunSpec.model_validate({**base, "store": None})
    with pytest.raises(ValidationError, match="stage sft needs at least one dataset"):
        api.TrainingRunSpec.model_validate({**base, "datasets": []})
    release = example("HarnessRelease")["spec"]
    with pytest.raises(ValidationError, match=r"benchmark\.samples must be at least"):
        api.HarnessReleaseSpec.model_validate(
            {**release, "benchmark": {"samples": 1}, "gate": {"minSamples": 2}}
        )
    pool = example("RolloutPool")["spec"]
    with pytest.raises(ValidationError, match="devicePoolRef is required"):
        api.RolloutPoolSpec.model_validate({**pool, "environment": "device"})
    with pytest.raises(ValidationError, match="shards must be at least parallelism"):
        api.TaskBatchSpec.model_validate({**example("TaskBatch")["spec"], "shards": 2})


def test_every_cel_rule_has_a_python_twin_and_a_message() -> None:
    models = {
        obj
        for obj in vars(api).values()
        if isinstance(obj, type) and issubclass(obj, api._Model) and obj is not api._Model
    }
    rules = [rule for model in models for rule in model.RULES]
    assert len([r for r in rules if r.cel]) >= 15
    for rule in rules:
        assert rule.message and callable(rule.check)


def test_conditions_keep_their_transition_time_until_the_status_changes() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = set_condition([], "Ready", "False", "Starting", now=t0)
    same = set_condition(first, "Ready", "False", "StillStarting", now=t0 + timedelta(minutes=1))
    flipped = set_condition(same, "Ready", "True", "Running", now=t0 + timedelta(minutes=2))
    assert same[0].last_transition_time == t0 and same[0].reason == "StillStarting"
    assert flipped[0].last_transition_time == t0 + timedelta(minutes=2)
    both = set_condition(flipped, "Progressing", "True", "Training", now=t0)
    assert [c.type for c in both] == ["Ready", "Progressing"]
    wire = api.TrainingRunStatus(conditions=both).to_k8s()["conditions"][0]
    assert wire == {
        "type": "Ready",
        "status": "True",
        "reason": "Running",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:02:00Z",
    }
    with pytest.raises(ValidationError):
        api.Condition.model_validate(
            {"type": "Ready", "status": "Maybe", "reason": "X", "lastTransitionTime": t0}
        )


def test_lookup_by_kind_plural_and_short_name() -> None:
    assert resource_for_kind("TrainingRun") is TrainingRun
    assert resource_for_kind("harnessreleases") is HarnessRelease
    assert resource_for_kind("qrp") is RolloutPool
    assert resource_for_kind("taskbatch") is TaskBatch
    with pytest.raises(KeyError, match=r"unknown qpa\.ai kind"):
        resource_for_kind("Pod")
    with pytest.raises(ValueError, match=r"apiVersion must be qpa\.ai/v1alpha1"):
        parse_resource({"apiVersion": "v1", "kind": "TrainingRun"})


def test_owner_reference_points_children_at_their_resource() -> None:
    doc = example("TrainingRun")
    run = TrainingRun.model_validate(doc)
    with pytest.raises(ValueError, match="uid"):
        run.owner_reference()
    run.metadata.uid = "1234"
    ref = run.owner_reference().to_k8s()
    assert ref == {
        "apiVersion": "qpa.ai/v1alpha1",
        "kind": "TrainingRun",
        "name": "planner-sft",
        "uid": "1234",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_gate_settings_mirror_the_bench_gate_spec() -> None:
    from qpa.bench.gate import GateSpec

    settings = api.GateSettings()
    assert set(api.GateSettings.model_fields) == set(GateSpec.model_fields)
    assert GateSpec.model_validate(settings.model_dump()) == GateSpec()


def test_vocabularies_match_the_rest_of_qpa() -> None:
    from qpa.contract.models import CAPABILITIES, SPLITS
    from qpa.envs.factory import env_kinds
    from qpa.harness.factory import PLANNER_NAMES

    assert set(typing.get_args(api.Capability)) == set(CAPABILITIES)
    assert set(typing.get_args(api.Split)) == set(SPLITS)
    assert set(typing.get_args(api.Planner)) == set(PLANNER_NAMES)
    assert set(env_kinds()) <= set(typing.get_args(api.EnvironmentKind))


def test_the_api_package_imports_only_pydantic() -> None:
    code = (
        "import sys, qpa.api, qpa.api.crdgen\n"
        "qpa_mods = sorted(m for m in sys.modules if m.startswith('qpa.') and "
        "not m.startswith('qpa.api'))\n"
        "third = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'yaml', 'typer', 'httpx', 'fastapi', 'torch', 'jsonschema', 'kopf', 'kubernetes'})\n"
        "print(qpa_mods, third)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True
    )
    assert result.stdout.strip() == "[] []", result.stdout


@pytest.mark.parametrize("key", [".", "..", "...", "..hidden", "a/b", "a b", ""])
def test_config_map_keys_kubernetes_refuses_are_refused_naming_the_field(key: str) -> None:
    # a key is a file name in the mounted volume: "." would mount onto the folder itself
    with pytest.raises(ValidationError) as caught:
        api.ConfigMapKeySelector(name="harness", key=key)
    assert caught.value.errors()[0]["loc"] == ("key",)


@pytest.mark.parametrize("key", ["harness.yaml", ".hidden", "a..b", "-x", "A_1"])
def test_config_map_keys_kubernetes_accepts_are_accepted(key: str) -> None:
    assert api.ConfigMapKeySelector(name="harness", key=key).key == key
