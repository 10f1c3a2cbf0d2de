"""Malformed custom resources are refused alike by `qpa.api` and by the API server.

Each case patches a valid example (examples/*.yaml) and names the field the refusal must name.
Both sides get the same body: the pydantic model (the ValidationError's location) and the test
API server (tests/fakes/kube_api.py, which validates against crds/ with the CRD's patterns and
CEL rules, over HTTP as a client sees it: 422 Invalid with the field among the causes). Valid
edge cases (values at a bound, every scheme a field takes) are accepted by both. A refused update
leaves the stored object as it was; kubectl prints the field for a few of the cases.

The schema walk at the top fails on any string, array or map of any CRD without a bound, and on
any integer without both bounds: the API server's CEL cost estimates need them, and nothing a
user types should be unbounded.
"""

from __future__ import annotations

import copy
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from pydantic import ValidationError

from qpa.api.v1alpha1 import WorkOrder, WorkOrderError, resource_for_kind

ROOT = Path(__file__).resolve().parents[3]
NS = "default"
DELETE = object()


def example(kind: str, index: int = 0) -> dict[str, Any]:
    name = resource_for_kind(kind).info.singular
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / f"{name}.yaml").read_text()) if d]
    return copy.deepcopy([d for d in docs if d["kind"] == kind][index])


def patched(kind: str, index: int, changes: Mapping[str, Any]) -> dict[str, Any]:
    body = example(kind, index)
    for path, value in changes.items():
        node: Any = body
        head, bar, last_key = path.partition("|")  # `a.b|c.d`: the last key is `c.d`
        keys = head.split(".") + ([last_key] if bar else [])
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        last: Any = int(keys[-1]) if isinstance(node, list) else keys[-1]
        if value is DELETE:
            del node[last]
        else:
            node[last] = copy.deepcopy(value)
    return body


# --------------------------------------------------------------------------- bounds everywhere


def unbounded(node: Mapping[str, Any], path: str) -> Iterator[str]:
    """Every node of a schema a value of which has no upper bound (integers: no lower one)."""
    kind = node.get("type")
    if "enum" not in node:
        if (kind == "string" or node.get("x-kubernetes-int-or-string")) and "maxLength" not in node:
            yield f"{path}: string without maxLength"
        if kind == "array" and "maxItems" not in node:
            yield f"{path}: array without maxItems"
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            yield f"{path}: map without maxProperties"
        if kind == "integer" and not {"minimum", "maximum"} <= set(node):
            yield f"{path}: integer without minimum and maximum"
    for name, sub in (node.get("properties") or {}).items():
        if path == "" and name == "metadata":
            continue  # the API server's own ObjectMeta (checked below, with its own limits)
        yield from unbounded(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from unbounded(node["additionalProperties"], f"{path}{{}}")
    if isinstance(node.get("items"), Mapping):
        yield from unbounded(node["items"], f"{path}[]")


def test_every_string_array_map_and_integer_of_every_crd_is_bounded() -> None:
    files = sorted((ROOT / "crds").glob("qpa.ai_*.yaml"))
    assert len(files) == 5
    problems = []
    for file in files:
        crd = yaml.safe_load(file.read_text())
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            problems += [f"{file.name} {p}" for p in unbounded(schema, "")]
    assert not problems, "\n".join(problems)


def test_the_walk_finds_what_it_looks_for() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "array", "items": {"type": "string", "maxLength": 3}},
            "c": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            "d": {"type": "string", "enum": ["x"]},
            "e": {"x-kubernetes-int-or-string": True, "maxLength": 8},
        },
    }
    assert sorted(unbounded(schema, "")) == [
        ".a: string without maxLength",
        ".b: array without maxItems",
        ".c: map without maxProperties",
        ".c{}: integer without minimum and maximum",
    ]


# --------------------------------------------------------------------------- the cases

GIB = 1024**3
BIG = "x" * 600_000

# (kind, example index, {path: value} (`a.b|k.e.y` when the last key holds dots), the field
#  both must name)
MALFORMED: list[tuple[str, int, dict[str, Any], str]] = [
    # credentials inside URIs
    ("TaskBatch", 0, {"spec.outputUri": "s3://AKIA123:s3cr3t@qpa/out/"}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.outputUri": "s3://key@qpa/out/"}, "spec.outputUri"),
    (
        "TaskBatch",
        0,
        {"spec.outputUri": "s3://qpa/out/?X-Amz-Credential=AKIA/x&X-Amz-Signature=ab"},
        "spec.outputUri",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "http://user:pass@planner.qpa.svc/v1"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://planner.example/v1?api_key=sk-123"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://planner.example/v1?x=1&token=abc"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://p.example/v1?sig=abc&se=2030"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.source.generator": DELETE, "spec.source.datasetUri": "s3://k:s@qpa/tasks.jsonl"},
        "spec.source.datasetUri",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.planner": "local", "spec.policy.modelUri": "hf://user:hf_token@org/model"},
        "spec.policy.modelUri",
    ),
    ("TrainingRun", 0, {"spec.baseModelUri": "s3://a:b@qpa/models/base/"}, "spec.baseModelUri"),
    (
        "TrainingRun",
        0,
        {"spec.datasets.1.uri": "s3://qpa/d/?X-Amz-Security-Token=abc"},
        "spec.datasets[1].uri",
    ),
    ("TrainingRun", 0, {"spec.outputUri": "s3://AKIA:secret@qpa/tr/"}, "spec.outputUri"),
    (
        "TrainingRun",
        0,
        {"spec.resumeFrom": "s3://qpa/ckpt/?access_key=AKIA&secret_key=x"},
        "spec.resumeFrom",
    ),
    ("HarnessRelease", 0, {"spec.model.uri": "gs://u:p@bucket/model/"}, "spec.model.uri"),
    ("HarnessRelease", 0, {"spec.reportUri": "s3://k:s@qpa/releases/"}, "spec.reportUri"),
    (
        "HarnessRelease",
        0,
        {"spec.store.endpoint": "http://AKIA:secret@minio.qpa-system.svc:9000"},
        "spec.store.endpoint",
    ),
    (
        "RolloutPool",
        0,
        {
            "spec.environment": "llm_sim",
            "spec.llmSim": {"modelUrl": "https://u:p@sim.example/v1"},
        },
        "spec.llmSim.modelUrl",
    ),
    (
        "RolloutPool",
        0,
        {
            "spec.environment": "llm_sim",
            "spec.llmSim": {"modelUrl": "https://sim.example/v1?password=hunter2"},
        },
        "spec.llmSim.modelUrl",
    ),
    # file:// and local paths where a pod writes or reads, or the operator reads
    ("TaskBatch", 0, {"spec.outputUri": "file:///data/out/"}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.outputUri": "/data/out/"}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.outputUri": "gs://bucket/out/"}, "spec.outputUri"),
    (
        "TaskBatch",
        0,
        {"spec.source.generator": DELETE, "spec.source.datasetUri": "file:///tasks.jsonl"},
        "spec.source.datasetUri",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.planner": "local", "spec.policy.modelUri": "file:///models/p/"},
        "spec.policy.modelUri",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.planner": "local", "spec.policy.modelUri": "gs://bucket/p/"},
        "spec.policy.modelUri",
    ),
    ("TrainingRun", 0, {"spec.outputUri": "file:///out/"}, "spec.outputUri"),
    ("TrainingRun", 0, {"spec.baseModelUri": "file:///models/base/"}, "spec.baseModelUri"),
    ("TrainingRun", 0, {"spec.baseModelUri": "models/base"}, "spec.baseModelUri"),
    ("TrainingRun", 0, {"spec.datasets.1.uri": "file:///d/"}, "spec.datasets[1].uri"),
    ("TrainingRun", 0, {"spec.datasets.1.uri": "pvc://claim/d/"}, "spec.datasets[1].uri"),
    ("TrainingRun", 0, {"spec.resumeFrom": "file:///ckpt/"}, "spec.resumeFrom"),
    ("HarnessRelease", 0, {"spec.reportUri": "file:///reports/"}, "spec.reportUri"),
    ("HarnessRelease", 0, {"spec.reportUri": "pvc://claim/reports/"}, "spec.reportUri"),
    ("HarnessRelease", 0, {"spec.model.uri": "file:///models/p/"}, "spec.model.uri"),
    ("HarnessRelease", 0, {"spec.model.uri": "s3://qpa/m/#frag"}, "spec.model.uri"),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "ftp://planner/v1"}, "spec.policy.modelUrl"),
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa:9000/out/"}, "spec.outputUri"),
    # resources: negative, zero, absurd, not quantities, limits below requests
    ("TaskBatch", 0, {"spec.resources.requests.cpu": "-1"}, "spec.resources.requests.cpu"),
    ("TaskBatch", 0, {"spec.resources.requests.cpu": -2}, "spec.resources.requests.cpu"),
    ("TaskBatch", 0, {"spec.resources.requests.cpu": "0"}, "spec.resources.requests.cpu"),
    ("TaskBatch", 0, {"spec.resources.requests.memory": "lots"}, "spec.resources.requests.memory"),
    ("TaskBatch", 0, {"spec.resources.requests.cpu": "2048"}, "spec.resources.requests"),
    ("TaskBatch", 0, {"spec.resources.requests.cpu": "1025000m"}, "spec.resources.requests"),
    ("TaskBatch", 0, {"spec.resources.limits.memory": "17Ti"}, "spec.resources.limits"),
    ("TaskBatch", 0, {"spec.resources.limits.memory": "1e30"}, "spec.resources.limits"),
    ("TaskBatch", 0, {"spec.resources.limits.memory": "512Mi"}, "spec.resources"),
    (
        "RolloutPool",
        0,
        {"spec.resources.limits": {"cpu": "500m"}},
        "spec.resources",
    ),
    (
        "RolloutPool",
        0,
        {"spec.resources.requests|ephemeral-storage": "100Ti"},
        "spec.resources.requests",
    ),
    (
        "TrainingRun",
        0,
        {"spec.resources": {"limits": {"nvidia.com/gpu": 65}}},
        "spec.resources.limits",
    ),
    (
        "TrainingRun",
        0,
        {"spec.resources": {"limits": {"nvidia.com/gpu": "500m"}}},
        "spec.resources.limits",
    ),
    (
        "HarnessRelease",
        0,
        {"spec.model.resources": {"requests": {"hugepages-2Mi": "2Pi"}}},
        "spec.model.resources.requests",
    ),
    (
        "HarnessRelease",
        0,
        {"spec.model.resources": {"requests": {f"r{i}": 1 for i in range(17)}}},
        "spec.model.resources.requests",
    ),
    (
        "HarnessRelease",
        0,
        {"spec.model.resources": {"requests": {"x" * 254: 1}}},
        "spec.model.resources.requests",
    ),
    # counts, timeouts, steps: both bounds
    ("TrainingRun", 0, {"spec.nodes": 513}, "spec.nodes"),
    ("TrainingRun", 0, {"spec.gpusPerNode": -1}, "spec.gpusPerNode"),
    ("TrainingRun", 0, {"spec.checkpointEvery": 10**9}, "spec.checkpointEvery"),
    ("TrainingRun", 1, {"spec.hyperparameters.maxSteps": 10**12}, "spec.hyperparameters.maxSteps"),
    ("TrainingRun", 0, {"spec.hyperparameters.seed": 2**31}, "spec.hyperparameters.seed"),
    ("TaskBatch", 0, {"spec.parallelism": 0}, "spec.parallelism"),
    ("TaskBatch", 0, {"spec.shards": 10**6}, "spec.shards"),
    ("TaskBatch", 0, {"spec.activeDeadlineSeconds": 10**9}, "spec.activeDeadlineSeconds"),
    ("TaskBatch", 0, {"spec.source.generator.seed": -1}, "spec.source.generator.seed"),
    ("RolloutPool", 0, {"spec.replicas.max": 100_000}, "spec.replicas.max"),
    ("RolloutPool", 0, {"spec.sessionTtlSeconds": -5}, "spec.sessionTtlSeconds"),
    ("HarnessRelease", 0, {"spec.benchmark.limit": 10**9}, "spec.benchmark.limit"),
    ("HarnessRelease", 0, {"spec.gate.minTasks": 10**9}, "spec.gate.minTasks"),
    ("HarnessRelease", 0, {"spec.model.maxModelLength": 10**9}, "spec.model.maxModelLength"),
    ("HarnessRelease", 0, {"spec.timeouts.deploySeconds": 10**7}, "spec.timeouts.deploySeconds"),
    (
        "DevicePool",
        0,
        {"spec.healthCheck.quarantineSeconds": 10**9},
        "spec.healthCheck.quarantineSeconds",
    ),
    # arrays and strings beyond their bound
    (
        "TaskBatch",
        0,
        {"spec.source.taskIds": [f"t{i}" for i in range(20_000)]},
        "spec.source.taskIds",
    ),
    ("TaskBatch", 0, {"spec.source.domains": [f"d{i}" for i in range(100)]}, "spec.source.domains"),
    ("TaskBatch", 0, {"spec.source.taskIds": ["x" * 300]}, "spec.source.taskIds[0]"),
    (
        "TrainingRun",
        0,
        {"spec.datasets": [{"uri": f"s3://qpa/d{i}/"} for i in range(65)]},
        "spec.datasets",
    ),
    ("HarnessRelease", 0, {"spec.canary.steps": list(range(1, 101))}, "spec.canary.steps"),
    (
        "DevicePool",
        0,
        {"spec.selector.serials": [f"S{i}" for i in range(2000)]},
        "spec.selector.serials",
    ),
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa/" + "x" * 3000}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.image": "ghcr.io/" + "x" * 2000}, "spec.image"),
    ("TaskBatch", 0, {"spec.policy.model": "m" * 300}, "spec.policy.model"),
    ("TaskBatch", 0, {"spec.store.region": "r" * 100}, "spec.store.region"),
    (
        "TrainingRun",
        0,
        {"spec.store.secretRef.accessKeyIdKey": "k" * 300},
        "spec.store.secretRef.accessKeyIdKey",
    ),
    ("HarnessRelease", 0, {"spec.harness.version": "v" * 64}, "spec.harness.version"),
    # metadata as a real API server checks it
    ("TaskBatch", 0, {"metadata.annotations": {"note": BIG}}, "metadata.annotations"),
    (
        "TrainingRun",
        0,
        {"metadata.annotations": {f"a{i}": "y" * 1000 for i in range(300)}},
        "metadata.annotations",
    ),
    ("RolloutPool", 0, {"metadata.annotations": {"bad key!": "x"}}, "metadata.annotations"),
    ("TaskBatch", 0, {"metadata.labels": {"qpa.ai/loop": "x" * 64}}, "metadata.labels"),
    ("TaskBatch", 0, {"metadata.labels": {"qpa.ai/loop": "-nightly"}}, "metadata.labels"),
    ("TaskBatch", 0, {"metadata.labels": {"Not_A_Domain/loop": "n"}}, "metadata.labels"),
    ("TaskBatch", 0, {"metadata.labels": {"a/b/c": "n"}}, "metadata.labels"),
    ("HarnessRelease", 0, {"metadata.labels": {"l" * 64: "n"}}, "metadata.labels"),
    ("TrainingRun", 0, {"metadata.name": "n" * 60}, "metadata.name"),
    ("TrainingRun", 0, {"metadata.name": "Planner_SFT"}, "metadata.name"),
]


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(depth):
        node = {"a": node}
    return node


_PT = "spec.podTemplate"
# The second pass, by class (cases written as an attacker would, not from the rules): egress
# to addresses no workload should reach, URIs that hide traversal or credentials, pod templates
# that smuggle structure, and values a real API server or a pod would refuse.
MALFORMED += [
    # egress: metadata, link-local, loopback and unspecified addresses, however written
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://169.254.169.254/v1"}, "spec.policy.modelUrl"),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://2852039166/v1"}, "spec.policy.modelUrl"),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://0xA9FEA9FE/v1"}, "spec.policy.modelUrl"),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "http://0251.0376.0251.0376/"},
        "spec.policy.modelUrl",
    ),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://127.1:8080/v1"}, "spec.policy.modelUrl"),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://0.0.0.0/v1"}, "spec.policy.modelUrl"),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "http://metadata.google.internal/computeMetadata/v1"},
        "spec.policy.modelUrl",
    ),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://[fd00:ec2::254]/"}, "spec.policy.modelUrl"),
    ("HarnessRelease", 0, {"spec.store.endpoint": "http://169.254.169.254"}, "spec.store.endpoint"),
    (
        "RolloutPool",
        0,
        {"spec.environment": "llm_sim", "spec.llmSim": {"modelUrl": "http://169.254.170.2/v1"}},
        "spec.llmSim.modelUrl",
    ),
    # credentials and state in query strings and fragments: only allow-listed keys pass
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://p.example/v1?key=abc"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://p.example/v1?x-api-key=abc"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://p.example/v1#access_token=abc"},
        "spec.policy.modelUrl",
    ),
    (
        "TaskBatch",
        0,
        {"spec.policy.modelUrl": "https://p.example/v1?code=1"},
        "spec.policy.modelUrl",
    ),
    # traversal, plain, percent-encoded or with backslashes
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa/default/../other/"}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa/default/%2e%2e/other/"}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa/default/%2E%2E%2Fother/"}, "spec.outputUri"),
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa/default\\..\\other/"}, "spec.outputUri"),
    ("TrainingRun", 0, {"spec.baseModelUri": "s3://qpa/default/./x/"}, "spec.baseModelUri"),
    ("HarnessRelease", 0, {"spec.reportUri": "s3://qpa/default/releases/.."}, "spec.reportUri"),
    (
        "TrainingRun",
        0,
        {"spec.datasets.1.uri": "s3://qpa/default/d/%252e%252e/"},
        "spec.datasets[1].uri",
    ),
    # pod templates: structure the PodSpec schema does not have, nesting, loader and proxy
    # variables, claims cloned from other claims, keyless tolerations
    (
        "HarnessRelease",
        0,
        {f"{_PT}.affinity": {"nodeAffinity": {"bogus": {"x": 1}}}},
        f"{_PT}.affinity",
    ),
    ("HarnessRelease", 0, {f"{_PT}.affinity": {"nodeAffinity": _nested(300)}}, f"{_PT}.affinity"),
    (
        "TaskBatch",
        0,
        {
            f"{_PT}.affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": 7}]
                }
            }
        },
        f"{_PT}.affinity",
    ),
    (
        "TaskBatch",
        0,
        {f"{_PT}.env": [{"name": "LD_PRELOAD", "value": "/x.so"}]},
        f"{_PT}.env[0].name",
    ),
    (
        "TaskBatch",
        0,
        {f"{_PT}.env": [{"name": "https_proxy", "value": "http://e"}]},
        f"{_PT}.env[0].name",
    ),
    (
        "TaskBatch",
        0,
        {f"{_PT}.env": [{"name": "HTTPS_PROXY", "value": "http://e"}]},
        f"{_PT}.env[0].name",
    ),
    (
        "TrainingRun",
        0,
        {f"{_PT}.env": [{"name": "AWS_ENDPOINT_URL", "value": "http://e"}]},
        f"{_PT}.env[0].name",
    ),
    (
        "RolloutPool",
        0,
        {f"{_PT}.env": [{"name": "qpa_store_endpoint", "value": "http://e"}]},
        f"{_PT}.env[0].name",
    ),
    ("TaskBatch", 0, {f"{_PT}.env": [{"name": "PYTHONPATH", "value": "/x"}]}, f"{_PT}.env[0].name"),
    ("TaskBatch", 0, {f"{_PT}.env": [{"name": "Home", "value": "/x"}]}, f"{_PT}.env[0].name"),
    (
        "TaskBatch",
        0,
        {
            f"{_PT}.volumes": [
                {
                    "name": "scratch",
                    "ephemeral": {
                        "volumeClaimTemplate": {
                            "spec": {
                                "accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}},
                                "dataSource": {"kind": "PersistentVolumeClaim", "name": "other"},
                            }
                        }
                    },
                }
            ]
        },
        f"{_PT}.volumes[0].ephemeral.volumeClaimTemplate",
    ),
    (
        "TaskBatch",
        0,
        {
            f"{_PT}.volumes": [
                {
                    "name": "scratch",
                    "ephemeral": {
                        "volumeClaimTemplate": {
                            "spec": {
                                "accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}},
                                "dataSourceRef": {"kind": "VolumeSnapshot", "name": "snap"},
                            }
                        }
                    },
                }
            ]
        },
        f"{_PT}.volumes[0].ephemeral.volumeClaimTemplate",
    ),
    # (a toleration of every taint is valid Kubernetes: the operator refuses it unless the chart
    # allows it, tests/unit/operator/test_podtemplate.py); one with no key and operator Equal
    # is not
    (
        "TaskBatch",
        0,
        {f"{_PT}.tolerations": [{"operator": "Equal", "value": "x"}]},
        f"{_PT}.tolerations[0]",
    ),
    # values a real API server or a pod refuses
    ("TaskBatch", 0, {f"{_PT}.scratchSizeLimit": "1e400"}, f"{_PT}.scratchSizeLimit"),
    (
        "TaskBatch",
        0,
        {f"{_PT}.volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1e400"}}]},
        f"{_PT}.volumes[0].emptyDir.sizeLimit",
    ),
    ("TaskBatch", 0, {"spec.parallelism": 4.0}, "spec.parallelism"),
    ("TrainingRun", 0, {"spec.nodes": 2.5}, "spec.nodes"),
    ("HarnessRelease", 0, {"spec.harness.version": "v3\u200b"}, "spec.harness.version"),
    ("HarnessRelease", 0, {"spec.harness.version": "v3\nInjected: 1"}, "spec.harness.version"),
    ("HarnessRelease", 0, {"spec.harness.version": "../../etc/passwd"}, "spec.harness.version"),
    ("TaskBatch", 0, {"spec.policy.harness.version": "v3 --x"}, "spec.policy.harness.version"),
    ("TaskBatch", 0, {"spec.image": "--privileged"}, "spec.image"),
    ("RolloutPool", 0, {"spec.image": "ghcr.io/qpa/x:1 -it"}, "spec.image"),
    ("HarnessRelease", 0, {"spec.harness.image": "-v/:/host"}, "spec.harness.image"),
    ("DevicePool", 0, {"spec.selector.serials": ["ABC;rm -rf /"]}, "spec.selector.serials[0]"),
    ("DevicePool", 0, {"spec.selector.serials": ["$(id)"]}, "spec.selector.serials[0]"),
    ("TaskBatch", 0, {"spec.rolloutPoolRef.name": "pool.with.dots"}, "spec.rolloutPoolRef.name"),
    ("TaskBatch", 0, {"spec.policy.model": "planner\u0000"}, "spec.policy.model"),
    ("TaskBatch", 0, {"spec.policy.model": "m" * 1_000_000}, "spec.policy.model"),
]

# Values at a bound and every scheme a field takes: both accept.
VALID: list[tuple[str, int, dict[str, Any]]] = [
    ("TaskBatch", 0, {"spec.resources": {"requests": {"cpu": "1024", "memory": "16Ti"}}}),
    (
        "TaskBatch",
        0,
        {"spec.resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "0.25"}}},
    ),
    ("TaskBatch", 0, {"spec.resources": {"requests": {"cpu": 2, "memory": "1.5Gi"}}}),
    (
        "TrainingRun",
        0,
        {"spec.resources": {"requests": {"nvidia.com/gpu": 64}, "limits": {"nvidia.com/gpu": 64}}},
    ),
    ("TaskBatch", 0, {"spec.policy.planner": "local", "spec.policy.modelUri": "hf://org/m@main"}),
    ("TaskBatch", 0, {"spec.policy.planner": "local", "spec.policy.modelUri": "pvc://models/p/"}),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "https://p.example:8443/v1?api-version=2024-06"}),
    ("TaskBatch", 0, {"spec.policy.modelUrl": "http://10.0.0.7:8000/v1"}),
    ("TaskBatch", 0, {"spec.source.taskIds": [f"t{i}" for i in range(10_000)]}),
    ("TaskBatch", 0, {"spec.outputUri": "s3://qpa/" + "x" * 2030}),
    ("TaskBatch", 0, {"spec.shards": 10_000, "spec.parallelism": 1024}),
    ("TaskBatch", 0, {"metadata.labels": {"qpa.ai/loop": "x" * 63}}),
    ("TaskBatch", 0, {"metadata.annotations": {"note": "y" * (256 * 1024 - 4)}}),
    ("TrainingRun", 0, {"spec.baseModelUri": "pvc://models/base/"}),
    ("TrainingRun", 0, {"spec.baseModelUri": "hf://org/planner-27b@v2"}),
    ("TrainingRun", 0, {"spec.nodes": 512, "spec.gpusPerNode": 16}),
    ("TrainingRun", 1, {"spec.hyperparameters.maxSteps": 100_000_000}),
    ("HarnessRelease", 0, {"spec.model.uri": "gs://bucket/models/planner/"}),
    ("HarnessRelease", 0, {"spec.model.uri": "hf://org/planner@main"}),
    ("HarnessRelease", 0, {"spec.model.uri": "pvc://models/planner/"}),
    ("HarnessRelease", 0, {"spec.canary.steps": list(range(81, 101))}),
    ("RolloutPool", 0, {"spec.replicas": {"min": 0, "max": 1000}}),
    (
        "RolloutPool",
        0,
        {"spec.environment": "llm_sim", "spec.llmSim": {"modelUrl": "https://sim.example/v1"}},
    ),
    ("DevicePool", 0, {"spec.selector.serials": [f"S{i}" for i in range(256)]}),
]


# --------------------------------------------------------------------------- both sides


def k8s_path(loc: tuple[Any, ...]) -> str:
    """pydantic's location as the API server writes a field path (`a.b[0].c`)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def pydantic_fields(kind: str, body: dict[str, Any]) -> list[str] | None:
    """The field paths pydantic names in refusing `body` (None when it accepts it)."""
    try:
        resource_for_kind(kind).model_validate(copy.deepcopy(body))
    except ValidationError as error:
        return [k8s_path(e["loc"]) for e in error.errors()]
    return None


def names(path: str, field: str) -> bool:
    """`path` is `field` or a part of it (a map key, a union branch pydantic adds)."""
    return path == field or path.startswith((f"{field}.", f"{field}["))


def server_names(causes: list[tuple[str, str]], field: str) -> bool:
    """A cause names `field`; a rule of the whole object (metadata.name's length) has no
    field of its own, and names it in its message."""
    return any(
        names(path, field) or (not path and f": {field} " in message) for path, message in causes
    )


@pytest.fixture(scope="module")
def server() -> Iterator[KubeAPIServer]:
    """One test API server for the many malformed resources (they store nothing)."""
    with KubeAPIServer() as kube:
        yield kube


def call(
    server: KubeAPIServer, method: str, path: str, body: Any = None, content: str = ""
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.url + path, data=data, method=method)
    request.add_header("Content-Type", content or "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def collection(kind: str) -> str:
    return f"/apis/qpa.ai/v1alpha1/namespaces/{NS}/{resource_for_kind(kind).info.plural}"


def server_causes(
    server: KubeAPIServer, kind: str, body: dict[str, Any]
) -> list[tuple[str, str]] | None:
    """(field, message) of each cause of the API server's refusal of `body` (None when it
    stores it; then it is deleted again). It is sent as `kubectl apply` sends it, with
    `fieldValidation=Strict`: an unknown field is then a 400 strict decoding error naming it
    (without, a server drops unknown fields, so they reach nothing either)."""
    code, answer = call(server, "POST", collection(kind) + "?fieldValidation=Strict", body)
    if code == 201:
        call(server, "DELETE", f"{collection(kind)}/{answer['metadata']['name']}")
        return None
    if code == 400 and "strict decoding error" in answer.get("message", ""):
        unknown = re.findall(r'unknown field "([^"]+)"', answer["message"])
        return [(path, "unknown field") for path in unknown]
    assert code == 422 and answer["reason"] == "Invalid", answer
    assert answer["message"].startswith(f'{kind}.qpa.ai "{body["metadata"]["name"]}" is invalid')
    return [(c["field"], c["message"]) for c in answer["details"]["causes"]]


def test_there_are_at_least_seventy_malformed_cases() -> None:
    assert len(MALFORMED) >= 70
    assert len({(kind, index, repr(changes)) for kind, index, changes, _ in MALFORMED}) == len(
        MALFORMED
    )


@pytest.mark.parametrize(
    ("kind", "index", "changes", "field"),
    MALFORMED,
    ids=[f"{c[0]}:{c[3]}:{i}" for i, c in enumerate(MALFORMED)],
)
def test_both_refuse_the_malformed_resource_naming_the_field(
    server: KubeAPIServer, kind: str, index: int, changes: dict[str, Any], field: str
) -> None:
    body = patched(kind, index, changes)
    by_pydantic = pydantic_fields(kind, body)
    assert by_pydantic is not None, f"qpa.api accepts {changes}"
    assert any(names(path, field) for path in by_pydantic), by_pydantic
    by_server = server_causes(server, kind, body)
    assert by_server is not None, f"the API server accepts {changes}"
    assert server_names(by_server, field), by_server


@pytest.mark.parametrize(
    ("kind", "index", "changes"), VALID, ids=[f"{c[0]}:{i}" for i, c in enumerate(VALID)]
)
def test_both_accept_the_edge_case(
    server: KubeAPIServer, kind: str, index: int, changes: dict[str, Any]
) -> None:
    body = patched(kind, index, changes)
    assert pydantic_fields(kind, body) is None
    assert server_causes(server, kind, body) is None


def test_the_examples_themselves_are_accepted_by_both(server: KubeAPIServer) -> None:
    for kind, index in sorted({(c[0], c[1]) for c in MALFORMED}):
        body = example(kind, index)
        assert pydantic_fields(kind, body) is None
        assert server_causes(server, kind, body) is None


# --------------------------------------------------------------------------- the pod side


@pytest.mark.parametrize(
    ("kind", "changes", "field"),
    [
        ("TaskBatch", {"spec.outputUri": "s3://AKIA:secret@qpa/out/"}, "spec.outputUri"),
        ("TaskBatch", {"spec.outputUri": "file:///data/out/"}, "spec.outputUri"),
        ("TrainingRun", {"spec.baseModelUri": "file:///models/base/"}, "spec.baseModelUri"),
        ("HarnessRelease", {"spec.reportUri": "s3://qpa/r/?X-Amz-Signature=ab"}, "spec.reportUri"),
        ("TaskBatch", {"resolved.reportUri": "s3://k:s@qpa/r/"}, "resolved.reportUri"),
        ("TaskBatch", {"resolved.modelUrl": "http://p/v1?api_key=sk-1"}, "resolved.modelUrl"),
    ],
)
def test_a_pod_refuses_the_same_work_order(kind: str, changes: dict[str, Any], field: str) -> None:
    """The pod's input is the resource (WorkOrder): what the CRD refuses, the pod refuses."""
    body = patched(kind, 0, {k: v for k, v in changes.items() if k.startswith(("spec", "meta"))})
    body["resolved"] = {k.split(".", 1)[1]: v for k, v in changes.items() if k.startswith("res")}
    with pytest.raises(WorkOrderError) as refused:
        WorkOrder.parse(body, resource_for_kind(kind))
    where = field.removeprefix("resolved.") if field.startswith("resolved.") else field
    assert f"{where}: " in str(refused.value), refused.value


# --------------------------------------------------------------------------- updates


@pytest.mark.parametrize(
    ("method", "content"),
    [("PATCH", "application/merge-patch+json"), ("PUT", "application/json")],
)
def test_a_refused_update_leaves_the_stored_object_unchanged(
    server: KubeAPIServer, method: str, content: str
) -> None:
    body = example("TaskBatch")
    body["metadata"]["name"] = f"kept-{method.lower()}"
    code, stored = call(server, "POST", collection("TaskBatch"), body)
    assert code == 201, stored
    where = f"{collection('TaskBatch')}/{body['metadata']['name']}"
    bad_changes = [
        {"spec": {"outputUri": "s3://AKIA:secret@qpa/out/"}},
        {"spec": {"resources": {"requests": {"cpu": "-1"}}}},
        {"metadata": {"annotations": {"note": BIG}}},
        {"spec": {"source": {"taskIds": [f"t{i}" for i in range(20_000)]}}},
    ]
    for change in bad_changes:
        if method == "PUT":
            update = copy.deepcopy(stored)
            for key, value in change.items():
                update[key] = {**update[key], **value}
        else:
            update = change
        code, answer = call(server, method, where, update, content)
        assert code == 422, answer
        _, now = call(server, "GET", where)
        assert now == stored  # spec, metadata, resourceVersion and generation as they were
    call(server, "DELETE", where)


# --------------------------------------------------------------------------- kubectl


KUBECTL_CASES = [
    ("TaskBatch", {"spec.outputUri": "s3://AKIA:secret@qpa/out/"}, "spec.outputUri"),
    ("TrainingRun", {"spec.outputUri": "file:///out/"}, "spec.outputUri"),
    ("TaskBatch", {"spec.resources.requests.cpu": "-1"}, "spec.resources.requests.cpu"),
    # 300 KB: kubectl doubles it (last-applied-configuration); the test server takes 3 MiB
    # bodies, as kube-apiserver does
    ("TaskBatch", {"metadata.annotations": {"note": "x" * 300_000}}, "metadata.annotations"),
]


def test_kubectl_apply_prints_the_field(kubectl: Kubectl, tmp_path: Path) -> None:
    for number, (kind, changes, field) in enumerate(KUBECTL_CASES):
        path = tmp_path / f"bad-{number}.yaml"
        path.write_text(yaml.safe_dump(patched(kind, 0, changes)))
        result = kubectl("apply", "-f", str(path), check=False)
        assert result.returncode != 0, result.stdout
        assert f"{field}: " in result.stderr, result.stderr
    assert "No resources found" in kubectl("get", "taskbatches,trainingruns", check=False).stderr


# --------------------------------------------------------------------------- the server's limits


def test_a_body_over_the_servers_limit_is_refused_naming_the_limit(server: KubeAPIServer) -> None:
    body = patched("TaskBatch", 0, {"metadata.annotations": {"note": "x" * (4 * 1024 * 1024)}})
    code, answer = call(server, "POST", collection("TaskBatch"), body)
    assert code == 413 and answer["kind"] == "Status", answer
    assert answer["reason"] == "RequestEntityTooLarge" and "3145728 bytes" in answer["message"]
    # under the limit, an oversized field is named (not a bare 413)
    body = patched("TaskBatch", 0, {"spec.policy.model": "m" * 2_000_000})
    assert server_names(server_causes(server, "TaskBatch", body) or [], "spec.policy.model")


def test_a_body_nested_past_the_decoders_depth_is_a_bad_request(server: KubeAPIServer) -> None:
    deep = "[" * 5000 + "]" * 5000
    text = json.dumps(example("TaskBatch"))[:-1] + f', "x": {deep}}}'
    request = urllib.request.Request(
        server.url + collection("TaskBatch"), data=text.encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert "depth" in json.loads(refused.value.read())["message"]
    code, _ = call(server, "GET", collection("TaskBatch"))
    assert code == 200  # the server is still there
