"""Every kind with every option set: restricted pods, and network policies that allow only what
is needed.

Each kind is built from maximal specs (every optional field filled, across the variants that
exclude each other: every environment kind of a RolloutPool, sft and rl TrainingRuns with RL
rollouts on a pool, a HarnessRelease with model + Harness + benchmark, TaskBatches with a
generator and with a dataset), with the admin settings a cluster would have (an external
allowlist, a mapped in-cluster store, the API server, a serving gateway). Checked:

- every pod but the device bridge passes the `restricted` Pod Security Standard;
- every NetworkPolicy is valid against the official Kubernetes schema (kubernetes-validate,
  the test API server's validator) and: no `0.0.0.0/0`/`::/0` or any prefix-0 block, no rule
  without peers or without ports (but the training ranks' own mesh), port 53 only in the two
  DNS rules (kube-dns pods, the node-local cache), every pod but KServe's model predictors
  selected by an egress policy, every server (env servers, InferenceServices, training ranks)
  by an ingress policy that selects exactly its pods;
- endpoint resolution by host shape; an external host no allowlist covers is not opened and
  is named on the policy (and by the handler's `EgressAllowed=False` condition).
"""

from __future__ import annotations

import copy
import ipaddress
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fakes.kube_builtin import check
from helpers import chart
from helpers.chart import HelmRun, Render
from helpers.podsecurity import violations
from pydantic import BaseModel
from qpa_operator import release
from qpa_operator.builders import (
    Defaults,
    devicepool,
    harnessrelease,
    netpol,
    rolloutpool,
    taskbatch,
    trainingrun,
)
from qpa_operator.builders.common import LABEL_COMPONENT
from qpa_operator.builders.netsettings import NetworkSettings
from qpa_operator.handlers.netpolicy import CONDITION, egress_status

from qpa.api import parse_resource
from qpa.api.v1alpha1 import HarnessReleaseStatus
from qpa.api.v1alpha1.podspec import OfficialPart

NS = "team-a"
STORE = "http://qpa-store.qpa-system.svc.cluster.local:8333"
EXTERNAL_MODEL = "https://api.llm.example/v1"
SETTINGS = NetworkSettings.model_validate(
    {
        "egress": {
            "external": [
                {"cidr": "203.0.113.0/24", "ports": [443], "hosts": ["api.llm.example"]},
                {"cidr": "198.51.100.0/24", "ports": [443], "hosts": ["*.huggingface.co",
                                                                       "huggingface.co"]},
            ],
            "services": [
                {
                    "host": "qpa-store.qpa-system",
                    "podLabels": {"app.kubernetes.io/component": "object-store",
                                  "app.kubernetes.io/instance": "qpa"},
                    "ports": [8333],
                }
            ],
            "apiServer": [{"cidr": "172.18.0.2", "ports": [6443]}],
        },
        "ingress": {
            "servingGateway": [{"namespace": "knative-serving", "podLabels": {"app": "activator"}}]
        },
    }
)  # fmt: skip
D = Defaults(network=SETTINGS, pod_service_accounts=("workload",))
STORE_SPEC = {
    "endpoint": STORE,
    "region": "eu-west-1",
    "secretRef": {"name": "qpa-store", "accessKeyIdKey": "id", "secretAccessKeyKey": "key"},
}
RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}


def resource(kind: str, name: str, spec: dict[str, Any]) -> Any:
    return parse_resource(
        {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": kind,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{kind}-{name}"},
            "spec": copy.deepcopy(spec),
        }
    )


POLICY = {
    "planner": "openai",
    "modelUrl": "http://planner-predictor.models.svc.cluster.local/v1",
    "model": "planner",
    "modelUri": "s3://qpa/models/planner/",
    "apiKeySecretRef": {"name": "planner-api", "key": "apiKey"},
    "harness": {"version": "harness-v3", "configMapRef": {"name": "harness-v3", "key": "h.yaml"}},
}
TASKBATCH = {
    "source": {
        "generator": {"suite": "mobilepa", "seed": 7},
        "split": "train",
        "domains": ["calendar"],
        "capabilities": ["tool_use", "memory"],
        "taskIds": ["t-1"],
        "limit": 64,
    },
    "policy": POLICY,
    "rolloutPoolRef": {"name": "sandbox"},
    "samplesPerTask": 4,
    "parallelism": 4,
    "shards": 8,
    "maxTurns": 30,
    "outputUri": "s3://qpa/taskbatches/max/",
    "store": STORE_SPEC,
    "image": "ghcr.io/qpa-ai/qpa-sandbox:0.1.0",
    "resources": RESOURCES,
    "backoffLimit": 2,
    "activeDeadlineSeconds": 3600,
}
POOL = {
    "image": "ghcr.io/qpa-ai/qpa-sandbox:0.1.0",
    "replicas": {"min": 1, "max": 4, "metric": "sessions", "targetPercent": 60},
    "sessionsPerPod": 8,
    "sessionTtlSeconds": 300,
    "port": 8000,
    "drainTimeoutSeconds": 90,
    "resources": RESOURCES,
}
LLM_SIM = {
    "modelUrl": EXTERNAL_MODEL,
    "model": "sim",
    "apiKeySecretRef": {"name": "sim-api", "key": "apiKey"},
}
CARE = {
    "enabled": True, "vanillaReward": "outcome_consolidation", "lowSuccessThreshold": 0.2,
    "highSuccessThreshold": 0.8, "progressWeight": 0.8, "tokenWeight": 0.1, "callWeight": 0.05,
    "normalization": "group", "tokenNorm": 1000.0, "callNorm": 10.0, "costCap": 1.0,
    "successAnchor": True, "successValue": 1.0, "epsilon": 1e-6,
}  # fmt: skip
TRAINING = {
    "baseModelUri": "hf://org/base-model",
    "datasets": [
        {"taskBatchRef": {"name": "max-generator"}, "weight": 2.0},
        {"uri": "s3://qpa/datasets/curated/", "weight": 1.0},
    ],
    "hyperparameters": {
        "learningRate": 1e-5, "epochs": 1.0, "maxSteps": 100, "perDeviceBatchSize": 1,
        "gradientAccumulationSteps": 8, "maxSeqLength": 4096, "seed": 3,
    },
    "deepspeed": {
        "zeroStage": 3, "offloadOptimizer": "cpu", "offloadParameters": "cpu", "bf16": True,
        "gradientClipping": 1.0,
    },
    "nodes": 2,
    "gpusPerNode": 4,
    "outputUri": "s3://qpa/trainingruns/max/",
    "store": STORE_SPEC,
    "checkpointEvery": 50,
    "keepCheckpoints": 2,
    "resume": True,
    "resumeFrom": "s3://qpa/trainingruns/max/checkpoints/step-50/",
    "backoffLimit": 2,
    "image": "ghcr.io/qpa-ai/qpa-trainer:0.1.0",
    "resources": RESOURCES,
    "workSize": "100Gi",
    "scheduling": {"queueName": "training", "admissionTimeoutSeconds": 1800,
                   "keepFailedAttempts": 2},
}  # fmt: skip
RELEASE = {
    "model": {
        "uri": "s3://qpa/trainingruns/max/final/", "runtime": "vllm", "servedModelName": "planner",
        "gpus": 1, "maxModelLength": 8192, "resources": RESOURCES, "dtype": "bfloat16",
    },
    "harness": {
        "image": "ghcr.io/qpa-ai/qpa-harness:0.1.0", "version": "harness-v4",
        "configMapRef": {"name": "harness-v4", "key": "harness.yaml"},
        "auth": {"tokensSecretRef": {"name": "harness-tokens", "key": "tokens.yaml"}},
    },
    "benchmark": {
        "suite": "mobilepa", "split": "test", "samples": 2, "limit": 50, "concurrency": 8,
        "environment": "sandbox", "rolloutPoolRef": {"name": "sandbox"},
    },
    "gate": {
        "minOverall": 0.5, "maxCapabilityRegression": 0.05, "maxCostIncrease": 0.1,
        "maxEnvironmentErrorRate": 0.1, "minSamples": 1, "minTasks": 10, "requireComplete": True,
    },
    "canary": {"steps": [10, 50, 100], "stepSeconds": 60},
    "rollout": {
        "deploymentMode": "Serverless",
        "analysis": {
            "intervalSeconds": 30, "minRequests": 20, "maxErrorRate": 0.02,
            "maxP95LatencySeconds": 2.5, "failureLimit": 1,
            "metricsUrl": "http://metrics.team-a.svc:9090/metrics",
            "prometheusUrl": "http://prometheus.monitoring:9090",
            "requestsMetric": "qpa_harness_requests_total",
            "latencyMetric": "qpa_harness_request_seconds",
        },
    },
    "timeouts": {"deploySeconds": 600, "benchmarkSeconds": 3600, "reportSeconds": 300},
    "promotion": "manual",
    "reportUri": "s3://qpa/releases/max/",
    "store": STORE_SPEC,
}  # fmt: skip
#: Every field of spec.podTemplate (and of its volume types, variables, tolerations).
POD_TEMPLATE = {
    "serviceAccountName": "workload",
    "nodeSelector": {"pool": "ml"},
    "affinity": {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    },
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute",
         "tolerationSeconds": 60},
    ],
    "priorityClassName": "batch-high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "team-registry"}],
    "volumes": [
        {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "a", "path": "a.yaml"}],
                                      "defaultMode": 0o444, "optional": True}},
        {"name": "keys", "secret": {"secretName": "keys", "items": [{"key": "k", "path": "k"}],
                                    "defaultMode": 0o440, "optional": False}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
        {"name": "cache", "emptyDir": {"medium": "", "sizeLimit": "10Gi"}},
        {"name": "claim", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}},
        {"name": "vault", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True,
                                  "fsType": "ext4", "volumeAttributes": {"provider": "vault"},
                                  "nodePublishSecretRef": {"name": "vault-creds"}}},
    ],
    "volumeMounts": [
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "cache", "mountPath": "/cache", "subPath": "hf"},
    ],
    "env": [
        {"name": "NCCL_IB_HCA", "value": "mlx5"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "k"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                           "divisor": "1Mi"}}},
    ],
    "resources": {"requests": {"rdma/hca": "1"}, "limits": {"rdma/hca": "1"}},
    "scratchSizeLimit": "20Gi",
}  # fmt: skip
for _spec in (TASKBATCH, POOL, TRAINING, RELEASE):
    _spec["podTemplate"] = POD_TEMPLATE
#: A device pool's env servers keep the operator's ServiceAccount (their phone Leases).
DEVICE_POD_TEMPLATE = {k: v for k, v in POD_TEMPLATE.items() if k != "serviceAccountName"}


def taskbatches() -> list[Any]:
    with_dataset = copy.deepcopy(TASKBATCH)
    del with_dataset["source"]["generator"]
    with_dataset["source"]["datasetUri"] = "s3://qpa/datasets/tasks/"
    return [
        resource("TaskBatch", "max-generator", TASKBATCH),
        resource("TaskBatch", "max-dataset", with_dataset),
    ]


def pools() -> list[Any]:
    return [
        resource("RolloutPool", "sandbox", {**POOL, "environment": "sandbox"}),
        resource("RolloutPool", "sim", {**POOL, "environment": "llm_sim", "llmSim": LLM_SIM}),
        resource(
            "RolloutPool",
            "phones",
            {
                **POOL,
                "environment": "device",
                "devicePoolRef": {"name": "lab-phones"},
                "podTemplate": DEVICE_POD_TEMPLATE,
            },
        ),
        resource("RolloutPool", "notes", {**POOL, "environment": "mcp", "mcp": MCP_URL}),
        resource("RolloutPool", "notes-stdio", {**POOL, "environment": "mcp", "mcp": MCP_STDIO}),
    ]


#: An mcp pool fronting an in-cluster MCP server, and one running a stdio server of its image.
MCP_URL = {
    "url": "http://notes-mcp.apps.svc:8000/mcp",
    "controlTools": ["reset_notes", "check_notes"],
    "hiddenTools": ["admin_wipe"],
}
MCP_STDIO = {"command": ["python", "-m", "notes_mcp"], "controlTools": ["reset_notes"]}


def runs() -> list[Any]:
    sft = {**TRAINING, "stage": "sft", "sft": {"turnMasking": True}}
    rl = {
        **TRAINING,
        "stage": "rl",
        "datasets": [{"taskBatchRef": {"name": "max-generator"}, "weight": 1.0}],
        "rl": {
            "rolloutPoolRef": {"name": "sandbox"}, "samplesPerTask": 4, "tasksPerStep": 4,
            "maxTurns": 20, "care": CARE,
        },
    }  # fmt: skip
    return [resource("TrainingRun", "max-sft", sft), resource("TrainingRun", "max-rl", rl)]


def devicepools() -> list[Any]:
    return [resource("DevicePool", "lab-phones", {})]


def releases() -> list[Any]:
    return [resource("HarnessRelease", "max-release", RELEASE)]


def release_variants() -> list[Any]:
    """The maximal release and one with the other `harness.auth` mode (a proxy's header)."""
    header = copy.deepcopy(RELEASE)
    header["harness"]["auth"] = {
        "identityHeader": "x-auth-request-user",
        "proxySelector": {"app": "oauth2-proxy"},
        "proxyNamespace": "auth",
        "proxySecretRef": {"name": "harness-proxy", "key": "secret"},
    }
    return [*releases(), resource("HarnessRelease", "max-release-header", header)]


def _unset(model: BaseModel, path: str) -> Iterator[str]:
    for name, field in type(model).model_fields.items():
        here = f"{path}.{field.alias or name}"
        value = getattr(model, name)
        if name not in model.model_fields_set:
            yield here
        if isinstance(value, OfficialPart):
            continue  # Kubernetes' own structure (affinity): set as a whole
        if isinstance(value, BaseModel):
            yield from _unset(value, here)
        elif isinstance(value, list):  # a field of the items is set when any item sets it
            items = [set(_unset(i, f"{here}[]")) for i in value if isinstance(i, BaseModel)]
            yield from set.intersection(*items) if items else set()


@pytest.mark.parametrize(
    ("variants", "exclusive"),
    [
        (taskbatches, set()),
        (pools, {"spec.llmSim", "spec.devicePoolRef", "spec.mcp"}),
        (runs, {"spec.sft", "spec.rl"}),
        (
            release_variants,
            {
                "spec.harness.auth.tokensSecretRef",
                "spec.harness.auth.identityHeader",
                "spec.harness.auth.proxySelector",
                "spec.harness.auth.proxyNamespace",
                "spec.harness.auth.proxySecretRef",
            },
        ),
    ],
    ids=["TaskBatch", "RolloutPool", "TrainingRun", "HarnessRelease"],
)
def test_the_maximal_specs_set_every_field(variants: Any, exclusive: set[str]) -> None:
    """Every field of the spec is set in at least one variant (the maximal specs stay so when
    a field is added); `exclusive` fields are set in the variants they belong to."""
    unset_everywhere: set[str] | None = None
    for item in variants():
        missing = set(_unset(item.spec, "spec"))
        unset_everywhere = missing if unset_everywhere is None else unset_everywhere & missing
    assert unset_everywhere == set()
    for field in exclusive:
        assert any(field not in set(_unset(i.spec, "spec")) for i in variants()), field


def release_children() -> list[dict[str, Any]]:
    """What a release in its canary step applies: stable and candidate models, the Harness at
    50%, the benchmark Job; plus their network policies (as the handler applies them)."""
    (hr,) = releases()
    stable_model = hr.spec.model.model_copy(update={"uri": "s3://qpa/models/stable/"})
    stable = harnessrelease.candidate(hr, D).model_copy(update={"model": stable_model})
    status = HarnessReleaseStatus(phase="Benchmarking", stable=stable)
    desired = release.children(hr, status, D)
    apply = list(desired.apply)
    assert [c["kind"] for c in apply].count("InferenceService") == 3
    return [*harnessrelease.network_policies(hr, D, apply), *apply]


def built() -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner kind, child) for every child of every maximal resource."""
    for tb in taskbatches():
        yield from (("TaskBatch", c) for c in taskbatch.children(tb, D))
    for pool in pools():
        yield from (("RolloutPool", c) for c in rolloutpool.children(pool, D))
    for dp in devicepools():
        yield from (("DevicePool", c) for c in devicepool.children(dp, D))
    for tr in runs():
        outputs = {"max-generator": "s3://qpa/taskbatches/max/"}
        plan = trainingrun.data_plan(tr, outputs)
        for child in trainingrun.children(tr, D, attempt=1, plan=plan, data_ready=True):
            yield ("TrainingRun", child)
    yield from (("HarnessRelease", c) for c in release_children())


CHILDREN = list(built())
POLICIES = [c for _, c in CHILDREN if c["kind"] == "NetworkPolicy"]


def pods() -> list[tuple[str, dict[str, Any], dict[str, str], dict[str, Any]]]:
    """(owner kind, child, the pod's labels, the pod spec) of every pod the children run."""
    found = []
    for kind, child in CHILDREN:
        spec = child.get("spec") or {}
        if "template" in spec:
            found.append((kind, child, dict(spec["template"]["metadata"]["labels"]),
                          spec["template"]["spec"]))  # fmt: skip
        elif "predictor" in spec:  # KServe labels the predictor pods with the isvc's name
            labels = {**child["metadata"]["labels"], netpol.ISVC_LABEL: child["metadata"]["name"]}
            found.append((kind, child, labels, spec["predictor"]))
    return found


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the builders use matchLabels only
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def test_every_pod_but_the_bridge_is_restricted() -> None:
    exceptions = []
    for kind, child, _, pod in pods():
        if "containers" not in pod:
            continue  # the model predictor: KServe's runtime container, not ours
        problems = violations(pod)
        if problems:
            exceptions.append((kind, child["kind"], child["metadata"]["name"], problems))
    assert [e[:3] for e in exceptions] == [("DevicePool", "DaemonSet", "lab-phones-bridge")]
    checked = [p for p in pods() if "containers" in p[3]]
    # 2 collectors, 5 pools (2 mcp), 2 rank Jobs, the SFT run's data Job, bridge, Harness, benchmark
    assert len(checked) == 13


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p["metadata"]["name"])
def test_policies_are_valid_kubernetes_objects(policy: dict[str, Any]) -> None:
    verdict = check(policy)
    assert verdict.errors == [] and verdict.unknown == []


def _peers(policy: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for direction, key in (("egress", "to"), ("ingress", "from")):
        for rule in policy["spec"].get(direction) or []:
            for peer in rule.get(key) or []:
                yield direction, rule, peer


def test_no_policy_allows_every_address_or_an_open_rule() -> None:
    mesh = []
    for policy in POLICIES:
        for _, _, peer in _peers(policy):
            if "ipBlock" in peer:
                network = ipaddress.ip_network(peer["ipBlock"]["cidr"])
                assert network.prefixlen > 0, policy["metadata"]["name"]
                assert "except" not in peer["ipBlock"]
            assert peer, f"{policy['metadata']['name']}: an empty peer selects everything"
        for direction, key in (("egress", "to"), ("ingress", "from")):
            for rule in policy["spec"].get(direction) or []:
                assert rule.get(key), f"{policy['metadata']['name']}: {direction} without peers"
                if not rule.get("ports"):
                    mesh.append((policy["metadata"]["name"], direction, rule))
                else:
                    assert all(p.get("port") for p in rule["ports"]), rule
    # the one port-less kind of rule: a training run's ranks to and from each other
    for name, direction, rule in mesh:
        (peer,) = rule["to" if direction == "egress" else "from"]
        labels = peer["podSelector"]["matchLabels"]
        assert set(peer) == {"podSelector"} and labels["app.kubernetes.io/component"] == "trainer"
        assert name.startswith(labels["app.kubernetes.io/instance"] + "-")
    assert sorted(n for n, _, _ in mesh) == [
        "max-rl-egress", "max-rl-ranks-ingress", "max-sft-egress", "max-sft-ranks-ingress",
    ]  # fmt: skip


def test_dns_goes_to_kube_dns_and_the_node_local_cache_only() -> None:
    dns = netpol.dns_rules(SETTINGS)
    assert dns == [
        {
            "to": [{"namespaceSelector": {"matchLabels": {netpol.NAMESPACE_LABEL: "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            "to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
    ]  # fmt: skip
    for policy in POLICIES:
        egress = policy["spec"].get("egress")
        if egress is None:
            continue
        assert egress[:2] == dns, policy["metadata"]["name"]
        for rule in egress[2:]:
            assert all(p.get("port") != 53 for p in rule.get("ports") or []), rule
            if not rule.get("ports"):  # would open 53 too: only a run's ranks to each other
                (peer,) = rule["to"]
                assert peer["podSelector"]["matchLabels"][LABEL_COMPONENT] == "trainer"
            assert all("ipBlock" not in peer or peer["ipBlock"]["cidr"] != "169.254.20.10/32"
                       for peer in rule["to"])  # fmt: skip


def test_node_local_dns_can_be_set_or_switched_off() -> None:
    custom = NetworkSettings.model_validate(
        {"dns": {"nodeLocalCidrs": ["169.254.25.10", "10.96.0.10/32"], "namespace": "dns",
                 "podLabels": {"app": "coredns"}}}
    )  # fmt: skip
    rules = netpol.dns_rules(custom)
    assert rules[0]["to"][0]["podSelector"] == {"matchLabels": {"app": "coredns"}}
    assert rules[1]["to"] == [
        {"ipBlock": {"cidr": "169.254.25.10/32"}},
        {"ipBlock": {"cidr": "10.96.0.10/32"}},
    ]
    off = NetworkSettings.model_validate({"dns": {"nodeLocalCidrs": []}})
    assert len(netpol.dns_rules(off)) == 1


def test_every_pod_is_selected_by_an_egress_policy_but_the_model_predictors() -> None:
    egress = [p for p in POLICIES if "Egress" in p["spec"]["policyTypes"]]
    uncovered = []
    for kind, child, labels, _ in pods():
        chosen = [p for p in egress if selects(p["spec"]["podSelector"], labels)]
        assert len(chosen) <= 1, [p["metadata"]["name"] for p in chosen]
        if not chosen:
            uncovered.append((kind, child["metadata"]["labels"]["app.kubernetes.io/component"]))
    # KServe's model predictors (storage initializer, runtime) and the bridge (the device
    # helper's policy) are the only pods without an egress policy of ours
    assert sorted(set(uncovered)) == [
        ("DevicePool", "device-bridge"), ("HarnessRelease", "model"),
    ]  # fmt: skip


def test_every_server_has_an_ingress_policy_selecting_exactly_its_pods() -> None:
    ingress = [p for p in POLICIES if "Ingress" in p["spec"]["policyTypes"]]
    everyone = pods()
    servers = [
        (kind, child, labels)
        for kind, child, labels, pod in everyone
        if child["kind"] == "InferenceService"
        or any(c.get("ports") for c in pod.get("containers") or [])
    ]
    names = {child["metadata"]["name"] for _, child, _ in servers}
    assert len(servers) == 5 + 2 + 3 + 1  # env servers (2 mcp), rank Jobs, isvcs, bridge
    for kind, child, labels in servers:
        chosen = [p for p in ingress if selects(p["spec"]["podSelector"], labels)]
        if kind == "DevicePool" and not chosen:
            continue  # the bridge's adb ingress policy is the device pool builder's
        assert len(chosen) == 1, child["metadata"]["name"]
        (policy,) = chosen
        others = [
            other["metadata"]["name"]
            for _, other, other_labels, _ in everyone
            if other is not child and selects(policy["spec"]["podSelector"], other_labels)
        ]
        assert others == [], (policy["metadata"]["name"], others)
        assert policy["spec"]["ingress"], policy["metadata"]["name"]
    ours = [p for p in ingress if p["metadata"]["labels"][LABEL_COMPONENT] != "device-bridge"]
    assert len(ours) == len(servers) - 1
    assert names  # every server named above


def _sources(policy_name: str) -> list[dict[str, Any]]:
    (policy,) = [p for p in POLICIES if p["metadata"]["name"] == policy_name]
    return [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]


def _selected(peer: dict[str, Any]) -> list[str]:
    """Names of the children whose pods `peer` selects (same namespace peers only)."""
    if "namespaceSelector" in peer:
        return [f"ns:{peer['namespaceSelector']['matchLabels'][netpol.NAMESPACE_LABEL]}"]
    return sorted(
        child["metadata"]["name"]
        for _, child, labels, _ in pods()
        if selects(peer["podSelector"], labels)
    )


def test_env_servers_admit_only_the_pods_that_use_their_pool() -> None:
    (peer,) = _sources("sandbox-env-ingress")
    # both TaskBatches, the RL run's ranks (not the SFT run's), the benchmark
    assert _selected(peer) == [
        "max-dataset-collect", "max-generator-collect", "max-release-bench-" +
        harnessrelease.candidate_id(releases()[0], D), "max-rl-r1",
    ]  # fmt: skip
    (policy,) = [p for p in POLICIES if p["metadata"]["name"] == "sandbox-env-ingress"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert _selected(_sources("sim-env-ingress")[0]) == []  # nobody uses the sim pool


def test_inference_services_admit_the_benchmark_the_harness_and_the_gateway() -> None:
    (hr,) = releases()
    bench = harnessrelease.bench_job_name(hr, D)
    harness = harnessrelease.harness_name(hr)
    model = harnessrelease.model_name(hr)
    model_from = [_selected(p) for p in _sources(f"{model}-ingress")]
    assert model_from == [[bench], [harness], ["ns:knative-serving"]]
    assert [_selected(p) for p in _sources(f"{harness}-ingress")] == [
        [bench],
        ["ns:knative-serving"],
    ]
    (gateway,) = [p for p in _sources(f"{harness}-ingress") if "namespaceSelector" in p]
    assert gateway["podSelector"] == {"matchLabels": {"app": "activator"}}
    (policy,) = [p for p in POLICIES if p["metadata"]["name"] == f"{model}-ingress"]
    assert policy["spec"]["ingress"][0]["ports"] == [
        {"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 8012}
    ]  # fmt: skip


def test_training_ranks_admit_only_their_own_run() -> None:
    assert [_selected(p) for p in _sources("max-rl-ranks-ingress")] == [["max-rl-r1"]]
    assert [_selected(p) for p in _sources("max-sft-ranks-ingress")] == [["max-sft-r1"]]


def _egress(name: str) -> list[dict[str, Any]]:
    (policy,) = [p for p in POLICIES if p["metadata"]["name"] == name]
    return list(policy["spec"]["egress"][2:])  # after DNS


def test_collectors_reach_the_model_the_store_and_their_pool_only() -> None:
    assert _egress("max-generator-egress") == [
        netpol.pods_rule({netpol.ISVC_LABEL: "planner"}, [8080, 8012], "models"),
        netpol.pods_rule(
            {"app.kubernetes.io/component": "object-store", "app.kubernetes.io/instance": "qpa"},
            [8333],
            "qpa-system",
        ),
        netpol.env_pool_rule("sandbox"),
    ]


def test_device_env_servers_reach_their_bridges_adb_and_the_api_server_only() -> None:
    bridge = devicepool.daemonset(devicepools()[0], D)
    rules = _egress("phones-egress")
    assert len(rules) == 2
    (peer,) = rules[0]["to"]
    assert selects(peer["podSelector"], bridge["spec"]["template"]["metadata"]["labels"])
    assert rules[0]["ports"] == [{"protocol": "TCP", "port": "adb"}]
    assert rules[1] == {
        "to": [{"ipBlock": {"cidr": "172.18.0.2/32"}}],
        "ports": [{"protocol": "TCP", "port": 6443}],
    }
    assert _egress("sandbox-egress") == []  # a sandbox pool reaches DNS only


def test_llm_sim_pools_and_hf_models_go_out_only_through_the_allowlist() -> None:
    assert _egress("sim-egress") == [
        {
            "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        }
    ]
    hf = {
        "to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    assert hf in _egress("max-sft-egress") and hf in _egress("max-rl-egress")
    assert netpol.blocked_endpoints(POLICIES) == []


def test_an_external_host_no_allowlist_covers_is_not_opened_and_is_named() -> None:
    bare = Defaults()  # no allowlist, no API server setting
    (_, sim, phones, *_) = pools()
    policy = rolloutpool.egress_policy(sim, bare)
    assert policy["spec"]["egress"] == netpol.dns_rules(bare.network)
    blocked = netpol.blocked_endpoints([policy])
    where = "api.llm.example:443: add a CIDR for it to networkPolicy.egress.external"
    assert blocked == [f"{EXTERNAL_MODEL} ({where})"]
    assert netpol.blocked_endpoints([rolloutpool.egress_policy(phones, bare)]) == [
        "the API server (set networkPolicy.egress.apiServer)"
    ]
    # the allowlist entry of another host or port does not cover it either
    other = Defaults(network=NetworkSettings.model_validate(
        {"egress": {"external": [{"cidr": "203.0.113.0/24", "ports": [8443]},
                                 {"cidr": "192.0.2.0/24", "ports": [443], "hosts": ["*.other"]}]}}
    ))  # fmt: skip
    assert netpol.blocked_endpoints([rolloutpool.egress_policy(sim, other)]) == blocked


def test_blocked_endpoints_become_a_condition_and_clear_again() -> None:
    (hr,) = releases()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert egress_status(hr, ["x"], now) is None  # no status yet: the kind's refresh goes first
    hr = hr.model_copy(update={"status": HarnessReleaseStatus(phase="Deploying")})
    assert egress_status(hr, [], now) is None  # never blocked: no condition at all
    status = egress_status(hr, ["https://a.example/v1 (a.example:443: ...)"], now)
    assert status is not None
    (cond,) = [c for c in status.conditions if c.type == CONDITION]
    assert (cond.status, cond.reason) == ("False", "EndpointNotAllowlisted")
    assert "https://a.example/v1" in cond.message
    blocked = hr.model_copy(update={"status": status})
    assert egress_status(blocked, ["https://a.example/v1 (a.example:443: ...)"], now) is None
    cleared = egress_status(blocked, [], now)
    assert cleared is not None
    (cond,) = [c for c in cleared.conditions if c.type == CONDITION]
    assert (cond.status, cond.reason) == ("True", "AllEndpointsAllowed")


def _ns(name: str, port: int) -> list[dict[str, Any]]:
    peer = {"namespaceSelector": {"matchLabels": {netpol.NAMESPACE_LABEL: name}}}
    return [{"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}]


def _ip(cidr: str, port: int) -> list[dict[str, Any]]:
    return [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.1.2.3:8000/v1", _ip("10.1.2.3/32", 8000)),
        ("https://[2001:db8::1]/v1", _ip("2001:db8::1/128", 443)),
        (
            "http://vllm:8000/v1",
            [{"to": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8000}]}],
        ),
        ("http://vllm.models.svc:8000", _ns("models", 8000)),
        ("http://vllm.models.svc.cluster.local", _ns("models", 80)),
        (
            "http://m-predictor.models.svc/v1",
            [netpol.pods_rule({netpol.ISVC_LABEL: "m"}, [8080, 8012], "models")],
        ),
        (
            "http://m-predictor-00002.team-a.svc/v1",
            [netpol.pods_rule({netpol.ISVC_LABEL: "m"}, [8080, 8012])],
        ),
        ("http://sandbox-env.team-a.svc.cluster.local", [netpol.env_pool_rule("sandbox")]),
        ("https://api.llm.example/v1", _ip("203.0.113.0/24", 443)),
        ("https://cdn.huggingface.co", _ip("198.51.100.0/24", 443)),
        ("https://api.openai.example/v1", []),
        ("http://minio.qpa-system:9000", _ns("qpa-system", 9000)),
    ],
)
def test_endpoint_rules_by_host_shape(url: str, expected: list[dict[str, Any]]) -> None:
    rules, blocked = netpol.endpoint_rules(url, NS, D)
    assert rules == expected
    assert bool(blocked) == (expected == [])


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8333",  # loopback: denied by default
        "http://localhost:8000/v1",  # RFC 6761: loopback whatever DNS says
        "http://api.localhost/v1",
        "https://[::1]/v1",
        "http://169.254.169.254/latest",  # metadata: denied whatever the settings say
        "http://[fe80::1]/v1",
        "http://[::ffff:169.254.169.254]/",
    ],
)
def test_an_endpoint_in_a_denied_range_is_never_opened(url: str) -> None:
    for defaults in (D, Defaults(network=SETTINGS)):
        rules, blocked = netpol.endpoint_rules(url, NS, defaults)
        assert rules == [] and len(blocked) == 1
        assert url in blocked[0] and netpol.DENIED_SETTING in blocked[0]
    # the admin's list drops loopback (the single-machine path), never the metadata ranges
    local = Defaults(network=NetworkSettings.model_validate({"egress": {"denied": []}}))
    rules, blocked = netpol.endpoint_rules(url, NS, local)
    metadata = "169.254" in url or "fe80" in url
    assert bool(blocked) == metadata and bool(rules) != metadata


def test_a_name_resolving_into_a_denied_range_is_refused_at_reconcile_time() -> None:
    """DNS at reconcile time: the allowlist covers the name, the address it resolves to is
    the admin's denied range (or the metadata service): not opened, the address named."""
    settings = NetworkSettings.model_validate(
        {
            "egress": {
                "external": [{"cidr": "10.0.0.0/8", "ports": [443], "hosts": ["*.corp.example"]}],
                "denied": ["10.20.0.0/16", "127.0.0.0/8"],
            }
        }
    )
    answers = {
        "nodes.corp.example": ("10.20.0.7",),
        "meta.corp.example": ("10.1.0.1", "169.254.169.254"),
        "models.corp.example": ("10.1.0.9",),
    }
    defaults = Defaults(network=settings, resolve=lambda host: answers.get(host, ()))
    for host, address in (("nodes", "10.20.0.7"), ("meta", "169.254.169.254")):
        rules, (why,) = netpol.endpoint_rules(f"https://{host}.corp.example/v1", NS, defaults)
        assert rules == [] and f"resolves to {address}" in why
    rules, blocked = netpol.endpoint_rules("https://models.corp.example/v1", NS, defaults)
    assert rules == _ip("10.0.0.0/8", 443) and blocked == []


def test_the_operator_resolves_with_dns_and_unit_defaults_do_not() -> None:
    from qpa_operator.builders import resolver

    assert Defaults().resolve("localhost") == ()
    assert Defaults.from_env({}).resolve is resolver.dns_addresses
    assert any(ipaddress.ip_address(a).is_loopback for a in resolver.dns_addresses("localhost"))
    assert resolver.dns_addresses("no-such-host.invalid") == ()  # RFC 6761: never resolves
    assert Defaults.from_env({}).network.egress.denied == ("127.0.0.0/8", "::1/128")
    with pytest.raises(ValueError, match=r"networkPolicy\.egress\.denied\.0"):
        NetworkSettings.from_env({"QPA_OPERATOR_NETWORK_POLICY": '{"egress": {"denied": ["x"]}}'})


def test_settings_refuse_everything_and_name_the_field() -> None:
    for cidr in ("0.0.0.0/0", "::/0"):
        with pytest.raises(ValueError, match=r"networkPolicy\.egress\.external\.0\.cidr"):
            NetworkSettings.from_env(
                {"QPA_OPERATOR_NETWORK_POLICY": f'{{"egress": {{"external": '
                                                f'[{{"cidr": "{cidr}", "ports": [443]}}]}}}}'}
            )  # fmt: skip
    with pytest.raises(ValueError, match=r"networkPolicy\.egress\.external\.0\.ports"):
        NetworkSettings.from_env(
            {"QPA_OPERATOR_NETWORK_POLICY": '{"egress": {"external": [{"cidr": "10.0.0.0/8"}]}}'}
        )
    with pytest.raises(ValueError, match="not JSON"):
        NetworkSettings.from_env({"QPA_OPERATOR_NETWORK_POLICY": "{"})
    with pytest.raises(ValueError, match=r"name\.namespace"):
        NetworkSettings.model_validate(
            {"egress": {"services": [{"host": "store", "podLabels": {"a": "b"}, "ports": [1]}]}}
        )


def test_the_api_server_defaults_to_the_kubernetes_service_the_operator_sees() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    settings = Defaults.from_env(env).network
    assert [(e.cidr, e.ports) for e in settings.egress.api_server] == [("10.96.0.1/32", (443,))]
    given = {**env, "QPA_OPERATOR_NETWORK_POLICY":
             '{"egress": {"apiServer": [{"cidr": "172.18.0.2/32", "ports": [6443]}]}}'}  # fmt: skip
    (entry,) = Defaults.from_env(given).network.egress.api_server
    assert (entry.cidr, entry.ports) == ("172.18.0.2/32", (6443,))


def test_the_chart_passes_its_settings_and_names_the_bundled_store(render: Render) -> None:
    docs = render(
        {
            **chart.FULL,
            "networkPolicy.egress.external": [{"cidr": "203.0.113.0/24", "ports": [443]}],
            "networkPolicy.dns.nodeLocalCidrs": ["169.254.25.10/32"],
        }
    )
    env = chart.env_of(chart.operator_container(docs))
    defaults = Defaults.from_env(env)
    network = defaults.network
    assert [(e.cidr, e.ports) for e in network.egress.external] == [("203.0.113.0/24", (443,))]
    assert network.dns.node_local_cidrs == ("169.254.25.10/32",)
    store = chart.find(docs, "Deployment", f"{chart.RELEASE}-store")
    store_labels = store["spec"]["template"]["metadata"]["labels"]
    assert defaults.store is not None
    rules, blocked = netpol.endpoint_rules(defaults.store.endpoint, NS, defaults)
    (rule,) = rules
    assert blocked == [] and rule["ports"] == [{"protocol": "TCP", "port": 8333}]
    assert rule["to"][0]["namespaceSelector"]["matchLabels"] == {
        netpol.NAMESPACE_LABEL: chart.NAMESPACE
    }
    assert selects(rule["to"][0]["podSelector"], store_labels)


SETTING = "networkPolicy.egress.external"


def test_the_chart_refuses_an_allowlist_of_everything(helm_run: HelmRun) -> None:
    for cidr in ("0.0.0.0/0", "::/0"):
        value = json.dumps([{"cidr": cidr, "ports": [443]}])
        result = helm_run(
            "template",
            chart.RELEASE,
            str(chart.CHART),
            f"--set-json=networkPolicy.egress.external={value}",
        )
        assert result.returncode != 0 and "networkPolicy/egress/external/0/cidr" in result.stderr


def test_a_local_planner_from_hugging_face_goes_out_through_the_allowlist() -> None:
    spec = copy.deepcopy(TASKBATCH)
    spec["policy"] = {**POLICY, "planner": "local", "modelUri": "hf://org/planner"}
    del spec["policy"]["modelUrl"]
    tb = resource("TaskBatch", "local-planner", spec)
    hf = _ip("198.51.100.0/24", 443)[0]
    assert hf in _egress_of(taskbatch.egress_policy(tb, D))
    assert netpol.model_source("pvc://models/planner") is None
    assert netpol.model_source("s3://qpa/models/x/") is None
    assert netpol.model_source("https://models.example/x") == "https://models.example/x"


def _egress_of(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return list(policy["spec"]["egress"])
