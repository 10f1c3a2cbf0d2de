"""A TaskBatch's work order: every spec field reaches the pod's `CollectConfig` or the Job,
any valid spec builds a config, and the typed `CollectSummary` comes back into the status.

The work order goes the real way: the builder's ConfigMap, parsed as a `WorkOrder`, then
`CollectConfig.from_taskbatch`.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from qpa_operator.builders import taskbatch
from qpa_operator.builders.common import HARNESS_CONFIG_MOUNT, Defaults

from qpa.api import TaskBatch
from qpa.api.v1alpha1 import TaskBatchSpec, WorkOrder
from qpa.api.v1alpha1.podspec import OfficialPart
from qpa.api.v1alpha1.taskbatch import HARNESS_CONFIG_DIR, CollectSummary
from qpa.data.collect_config import CollectConfig

ROOT = Path(__file__).resolve().parents[3]
D = Defaults(pod_service_accounts=("collector",))
BASE: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "taskbatch.yaml").read_text())
BASE["metadata"].update(namespace="team-a", uid="u-1")
BASE["spec"]["source"].update(domains=["email"], taskIds=["a"])
BASE["spec"]["activeDeadlineSeconds"] = 3600


def resource(spec: dict[str, Any]) -> TaskBatch:
    return TaskBatch.model_validate({**BASE, "spec": spec})


def config_of(tb: TaskBatch, shard_index: int = 0) -> CollectConfig:
    document = yaml.safe_load(taskbatch.config_map(tb, D)["data"]["workorder.yaml"])
    order = WorkOrder.parse(document, TaskBatch)
    return CollectConfig.from_taskbatch(order, shard_index, environ={})


def observed(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a spec changes: the pod's collection config and the Job (and its egress)."""
    tb = resource(spec)
    rendered = {"job": taskbatch.job(tb, D), "egress": taskbatch.egress_policy(tb, D)}
    return config_of(tb).model_dump(mode="json"), rendered


def leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf field of a model, recursively, by wire (camelCase) name."""
    paths: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        inner = [a for a in get_args(info.annotation) if a is not type(None)] or [info.annotation]
        inner = [get_args(a)[0] if get_origin(a) is Annotated else a for a in inner]
        nested = [a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)]
        if get_origin(info.annotation) is list:  # a list of objects is one field
            nested = []
        if issubclass(model, OfficialPart):  # Kubernetes' own structure: its parts are leaves
            nested = []
        if nested:
            paths += leaf_paths(nested[0], (*prefix, alias))
        else:
            paths.append((*prefix, alias))
    return paths


def edit(spec: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value


# A change of every leaf (several edits where the model ties fields together).
CHANGES: dict[str, dict[str, Any]] = {
    "source.generator.suite": {"source.generator.suite": "device"},
    "source.generator.seed": {"source.generator.seed": 8},
    "source.datasetUri": {"source.generator": None, "source.datasetUri": "s3://qpa/t.jsonl"},
    "source.split": {"source.split": "validation"},
    "source.domains": {"source.domains": ["maps"]},
    "source.capabilities": {"source.capabilities": ["skills"]},
    "source.taskIds": {"source.taskIds": ["b"]},
    "source.limit": {"source.limit": 7},
    "policy.planner": {"policy.planner": "oracle"},
    "policy.modelUrl": {"policy.modelUrl": "http://other.qpa.svc/v1"},
    "policy.model": {"policy.model": "planner-2"},
    "policy.modelUri": {"policy.planner": "local", "policy.modelUri": "pvc://models/p"},
    "policy.apiKeySecretRef.name": {"policy.apiKeySecretRef.name": "other-key"},
    "policy.apiKeySecretRef.key": {"policy.apiKeySecretRef.key": "token"},
    "policy.harness.version": {"policy.harness.version": "harness-v9"},
    "policy.harness.configMapRef.name": {"policy.harness.configMapRef.name": "harness-v9"},
    "policy.harness.configMapRef.key": {"policy.harness.configMapRef.key": "h.yaml"},
    "rolloutPoolRef.name": {"rolloutPoolRef.name": "phones"},
    "samplesPerTask": {"samplesPerTask": 2},
    "parallelism": {"parallelism": 8},
    "shards": {"shards": 64},
    "maxTurns": {"maxTurns": 12},
    "outputUri": {"outputUri": "s3://qpa/other/"},
    "store.endpoint": {"store.endpoint": "http://s3.example:9000"},
    "store.region": {"store.region": "eu-west-1"},
    "store.secretRef.name": {"store.secretRef.name": "other-minio"},
    "store.secretRef.accessKeyIdKey": {"store.secretRef.accessKeyIdKey": "id"},
    "store.secretRef.secretAccessKeyKey": {"store.secretRef.secretAccessKeyKey": "secret"},
    "image": {"image": "registry.example/qpa:2"},
    "resources.requests": {"resources.requests": {"cpu": "2"}},
    "resources.limits": {"resources.limits": {"memory": "8Gi"}},
    "backoffLimit": {"backoffLimit": 5},
    "activeDeadlineSeconds": {"activeDeadlineSeconds": 60},
    **{
        f"podTemplate.{path}": {f"podTemplate.{key}": value for key, value in edits.items()}
        for path, edits in {
            "serviceAccountName": {"serviceAccountName": "collector"},
            "nodeSelector": {"nodeSelector": {"pool": "cpu"}},
            "affinity.nodeAffinity": {
                "affinity.nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "affinity.podAffinity": {
                "affinity.podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "zone"}
                    ]
                }
            },
            "affinity.podAntiAffinity": {
                "affinity.podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "host"}
                    ]
                }
            },
            "tolerations": {"tolerations": [{"key": "dedicated", "value": "qpa"}]},
            "priorityClassName": {"priorityClassName": "batch-low"},
            "runtimeClassName": {"runtimeClassName": "gvisor"},
            "imagePullSecrets": {"imagePullSecrets": [{"name": "registry"}]},
            "volumes": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]},
            "volumeMounts": {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            },
            "env": {"env": [{"name": "TEAM", "value": "a"}]},
            "resources.requests": {"resources.requests": {"rdma/hca": "1"}},
            "resources.limits": {"resources.limits": {"example.com/fpga": "1"}},
            "scratchSizeLimit": {"scratchSizeLimit": "5Gi"},
        }.items()
    },
}


def test_every_spec_field_reaches_the_pod_config_or_the_job() -> None:
    paths = {".".join(path) for path in leaf_paths(TaskBatchSpec)}
    assert paths == set(CHANGES), "a TaskBatch spec field without a change below"
    before = observed(copy.deepcopy(BASE["spec"]))
    for path, edits in CHANGES.items():
        spec = copy.deepcopy(BASE["spec"])
        for where, value in edits.items():
            edit(spec, where, value)
        assert observed(spec) != before, f"spec.{path} changes neither the pod nor the Job"


def test_the_work_order_maps_the_policy_and_resolved_fields() -> None:
    config = config_of(resource(BASE["spec"]), shard_index=5)
    planner = config.planner
    assert (planner.name, planner.model_url, planner.model) == (
        "openai", "http://planner-model.default.svc.cluster.local:8080/openai/v1", "planner",
    )  # fmt: skip
    assert planner.api_key_env == "QPA_API_KEY" and planner.harness_version == "harness-v3"
    assert planner.harness_config == Path(HARNESS_CONFIG_MOUNT) / "harness.yaml"
    assert HARNESS_CONFIG_DIR == HARNESS_CONFIG_MOUNT
    assert config.shard == (5, 32) and config.samples_per_task == 8 and config.max_turns == 40
    assert config.env_url == ["http://sandbox-env.team-a.svc.cluster.local"]
    assert config.store_config is not None
    assert config.store_config.endpoint == "http://minio.qpa-system.svc:9000"
    assert config.source is not None and config.source.capabilities == ["tool_use", "memory"]
    local = copy.deepcopy(BASE["spec"])
    local["policy"].update(planner="local", modelUri="hf://org/model@main")
    assert config_of(resource(local)).planner.model_uri == "hf://org/model@main"


# --------------------------------------------------------------------------- any valid spec


def strategy(
    annotation: Any, metadata: list[Any] | None = None, example: Any = None
) -> st.SearchStrategy[Any]:
    """Values of a field's type, honouring its bounds and pattern (then the model decides);
    a model's fields near `example`'s (see `model_strategy`)."""
    metadata = metadata or []
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return strategy(inner, [*metadata, *extra], example)
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy(a, metadata, example) for a in get_args(annotation)))
    if annotation is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_strategy(annotation, example if isinstance(example, dict) else None)
    if origin is list:
        return st.lists(strategy(get_args(annotation)[0]), max_size=3, unique_by=repr)
    if origin is dict:
        quantities = st.sampled_from(["1", "500m", "2Gi", 4])
        return st.dictionaries(st.sampled_from(["cpu", "memory"]), quantities, max_size=2)
    low = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), None)
    high = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), None)
    if annotation is int:
        return st.integers(min_value=low if low is not None else 0, max_value=high or 10_000)
    if annotation is bool:
        return st.booleans()
    pattern = next((m.pattern for m in metadata if hasattr(m, "pattern") and m.pattern), None)
    longest = next((m.max_length for m in metadata if isinstance(m, annotated_types.MaxLen)), 60)
    text = st.from_regex(pattern, fullmatch=True) if pattern else st.text(min_size=1)
    return text.filter(lambda s: 0 < len(s) <= min(longest, 60))


def model_strategy(
    model: type[BaseModel], example: dict[str, Any] | None = None
) -> st.SearchStrategy[dict[str, Any]]:
    """A model's fields; one `example` has is its value or any value, half and half (drawn
    wholly at random, a TaskBatch spec passes its cross-field rules too rarely for a fixed
    number of examples to be sure of any)."""
    fields = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        known = (example or {}).get(key)
        values = strategy(info.annotation, list(info.metadata), known)
        if not info.is_required():
            values = st.one_of(st.just(None), values)
        if known is not None:
            values = st.one_of(st.just(known).map(copy.deepcopy), values)
        fields[key] = values
    return st.fixed_dictionaries(fields).map(
        lambda d: {k: v for k, v in d.items() if v is not None}
    )


def valid_spec(data: dict[str, Any]) -> TaskBatchSpec | None:
    try:
        return TaskBatchSpec.model_validate(data)
    except ValidationError:
        return None


SPECS = (
    model_strategy(TaskBatchSpec, BASE["spec"])
    .map(valid_spec)
    .filter(lambda spec: spec is not None)
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(SPECS, st.integers(min_value=0, max_value=10_000))
def test_any_valid_spec_builds_a_collect_config(spec: TaskBatchSpec, index: int) -> None:
    tb = TaskBatch.model_validate({**BASE, "spec": spec.to_k8s()})
    config = config_of(tb, index % (spec.shards or spec.parallelism))
    assert config.out == spec.output_uri and config.source == spec.source
    assert config.planner.harness_version == spec.policy.harness.version


# --------------------------------------------------------------------------- the summary


def test_collect_summaries_round_trip_through_the_status() -> None:
    tb = resource(BASE["spec"])
    summaries = [
        CollectSummary(
            out="s3://o/",
            shard=f"{i}/32",
            total=16,
            ran=10,
            skipped=6,
            successes=i,
            skipped_successes=6 - i,
        )
        for i in range(3)
    ]
    shards = {}
    for index, summary in enumerate(summaries):
        message = "progress on stderr\n" + summary.to_message()
        pod = {
            "metadata": {"labels": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "status": {
                "containerStatuses": [
                    {
                        "name": "collect",
                        "state": {"terminated": {"exitCode": 0, "message": message}},
                    }
                ]
            },
        }
        found = taskbatch.shard_summary(pod)
        assert found == (index, summary)
        shards[index] = found[1]
    job = {
        "metadata": {"name": "nightly-tool-use-collect"},
        "status": {"startTime": "2026-01-01T00:00:00Z", "active": 3},
    }
    from datetime import UTC, datetime

    status = taskbatch.taskbatch_status(
        tb, job, shards, observed_generation=1, now=datetime(2026, 1, 1, tzinfo=UTC)
    )
    # resumed shards count what earlier attempts wrote: (0+6) + (1+5) + (2+4) successes of 48
    assert (status.trajectories, status.successes, status.failures, status.tasks) == (48, 18, 30, 6)
    assert CollectSummary.from_message('{"ran": 4}') is None  # an untyped summary is refused
