"""Restricted pod security for every pod qpa runs, and egress policies for the episode pods.

Every pod spec the operator's builders render (all five kinds, from the examples) and every
pod of the chart must meet the Kubernetes `restricted` Pod Security Standard: non-root,
read-only root filesystem, no privilege escalation, all capabilities dropped, seccomp
RuntimeDefault, no host namespaces or host paths. The DevicePool's bridge (adb on the node's
USB bus) is the one privileged pod, and the test asserts it is the only exception. Pods get no
service-account token unless they talk to the API (the operator; device-backed pods that hold
phone Leases, through a Role on leases only).

Collector (TaskBatch) and environment-server (RolloutPool) pods each get a NetworkPolicy that
selects exactly them and denies all egress but DNS, the endpoints they are given and the qpa
pods they talk to; the rules are checked against the other builders' pod labels.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.chart import FULL, Render, pod_specs
from qpa_operator.builders import (
    Defaults,
    devicepool,
    harnessrelease,
    netpol,
    rolloutpool,
    taskbatch,
    trainingrun,
)

from qpa.api import parse_resource

ROOT = Path(__file__).resolve().parents[3]
D = Defaults()
NS = "team-a"


def load(file: str) -> list[Any]:
    found = []
    for i, doc in enumerate(
        d for d in yaml.safe_load_all((ROOT / "examples" / file).read_text()) if d
    ):
        body = copy.deepcopy(doc)
        body["metadata"].update(namespace=NS, uid=f"uid-{file}-{i}")
        found.append(parse_resource(body))
    return found


def built() -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner kind, child) for every child the builders make from the examples."""
    for tb in load("taskbatch.yaml"):
        yield from (("TaskBatch", c) for c in taskbatch.children(tb, D))
    for pool in load("rolloutpool.yaml"):
        yield from (("RolloutPool", c) for c in rolloutpool.children(pool, D))
    for dp in load("devicepool.yaml"):
        yield from (("DevicePool", c) for c in devicepool.children(dp, D))
    for tr in load("trainingrun.yaml"):
        outputs = {"nightly-tool-use": "s3://qpa/taskbatches/nightly-tool-use/"}
        plan = trainingrun.data_plan(tr, outputs)
        yield from (
            ("TrainingRun", c)
            for c in trainingrun.children(tr, D, attempt=0, plan=plan, data_ready=True)
        )
        data = trainingrun.data_job(tr, plan, D)
        if data is not None:
            yield ("TrainingRun", data)
    for hr in load("harnessrelease.yaml"):
        for child in [*harnessrelease.services(hr, D), harnessrelease.bench_job(hr, D)]:
            yield ("HarnessRelease", child)


def violations(pod: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the `restricted` Pod Security Standard (empty: none)."""
    found = []
    security = pod.get("securityContext") or {}
    if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        found.append("pod seccompProfile")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(flag)
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']}")
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    for container in containers:
        name = container["name"]
        ctx = container.get("securityContext") or {}
        if ctx.get("privileged"):
            found.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        if ctx.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: readOnlyRootFilesystem")
        if ctx.get("capabilities", {}).get("drop") != ["ALL"] or ctx["capabilities"].get("add"):
            found.append(f"{name}: capabilities")
        non_root = ctx.get("runAsNonRoot", security.get("runAsNonRoot"))
        user = ctx.get("runAsUser", security.get("runAsUser"))
        if non_root is not True or user == 0:
            found.append(f"{name}: runs as root")
        if ctx.get("seccompProfile", security.get("seccompProfile", {})).get("type") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            found.append(f"{name}: seccompProfile")
    return found


def test_every_builder_pod_is_restricted_but_the_device_bridge() -> None:
    exceptions, checked = [], 0
    for kind, child in built():
        for pod in pod_specs(child):
            checked += 1
            problems = violations(pod)
            if problems:
                exceptions.append((kind, child["kind"], child["metadata"]["name"], problems))
    assert checked >= 8
    assert [e[:3] for e in exceptions] == [("DevicePool", "DaemonSet", "lab-phones-bridge")]
    problems = exceptions[0][3]
    assert "bridge: privileged" in problems and "hostPath volume usb" in problems


def test_only_pods_that_hold_leases_get_a_token() -> None:
    children = list(built())
    roles = {c["metadata"]["name"]: c for _, c in children if c["kind"] == "Role"}
    with_token = []
    for kind, child in children:
        for pod in pod_specs(child):
            if "predictor" in child.get("spec", {}):
                continue  # KServe's predictor: its own service account, set by KServe
            if pod.get("automountServiceAccountToken") is not False:
                account = pod.get("serviceAccountName")
                assert account in roles, f"{child['metadata']['name']}: token without a Role"
                for rule in roles[account]["rules"]:  # Leases, or the pod's own objects
                    assert rule["resources"] == ["leases"] or rule.get("resourceNames"), rule
                with_token.append((kind, child["metadata"]["name"]))
    assert sorted(with_token) == [
        ("DevicePool", "lab-phones-bridge"),
        ("RolloutPool", "phones-env"),
    ]


def test_chart_pods_are_restricted(render: Render) -> None:
    pods = [
        (doc["metadata"]["name"], pod)
        for doc in render(FULL)
        for pod in pod_specs(doc)
        if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")
    ]
    assert {name for name, _ in pods} == {"qpa-operator", "qpa-store"}
    for name, pod in pods:
        assert violations(pod) == [], name
        # the operator talks to the API server; nothing else of the chart does
        assert pod["automountServiceAccountToken"] is (name == "qpa-operator"), name


# --------------------------------------------------------------------------- egress


def pod_labels(child: dict[str, Any]) -> dict[str, str]:
    return dict(child["spec"]["template"]["metadata"]["labels"])


def selects(policy_or_rule: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy_or_rule["matchLabels"]
    return all(labels.get(k) == v for k, v in wanted.items())


def test_episode_pods_are_each_selected_by_one_egress_policy() -> None:
    for kind, file in (("TaskBatch", "taskbatch.yaml"), ("RolloutPool", "rolloutpool.yaml")):
        builder = taskbatch if kind == "TaskBatch" else rolloutpool
        for resource in load(file):
            children = builder.children(resource, D)
            policies = [c for c in children if c["kind"] == "NetworkPolicy"]
            assert [p["metadata"]["name"] for p in policies] == [f"{resource.metadata.name}-egress"]
            (policy,) = policies
            assert policy["spec"]["policyTypes"] == ["Egress"]
            assert policy["spec"]["egress"][0] == netpol.dns_rule()
            workloads = [c for c in children if c["kind"] in ("Job", "Deployment")]
            assert workloads
            for workload in workloads:
                assert selects(policy["spec"]["podSelector"], pod_labels(workload))


def test_collectors_reach_dns_model_store_and_their_pool_only() -> None:
    (tb,) = load("taskbatch.yaml")
    policy = taskbatch.egress_policy(tb, D)
    egress = policy["spec"]["egress"]
    # modelUrl http://planner-predictor.qpa.svc.cluster.local/v1, store minio.qpa-system.svc:9000
    namespaces = [
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for rule in egress[1:]
        for peer in rule["to"]
        if "namespaceSelector" in peer
    ]
    assert namespaces == ["qpa", "qpa-system"]
    (pool_rule,) = [r for r in egress if "podSelector" in r["to"][0] and len(r["to"][0]) == 1]
    pools = {p.metadata.name: p for p in load("rolloutpool.yaml")}
    env_server = rolloutpool.deployment(pools[tb.spec.rollout_pool_ref.name], D)
    assert selects(pool_rule["to"][0]["podSelector"], pod_labels(env_server))
    assert not selects(
        pool_rule["to"][0]["podSelector"], pod_labels(rolloutpool.deployment(pools["phones"], D))
    )
    assert len(egress) == 4  # DNS, model, store, pool: nothing else


def test_sandbox_servers_reach_only_dns_and_device_servers_their_bridges() -> None:
    sandbox, phones = load("rolloutpool.yaml")
    assert rolloutpool.egress_policy(sandbox, D)["spec"]["egress"] == [netpol.dns_rule()]
    egress = rolloutpool.egress_policy(phones, D)["spec"]["egress"]
    (dp,) = load("devicepool.yaml")
    bridge = devicepool.daemonset(dp, D)
    assert selects(egress[1]["to"][0]["podSelector"], pod_labels(bridge))
    assert egress[2] == netpol.api_server_rule() and len(egress) == 3


def _ns(name: str) -> list[dict[str, Any]]:
    return [{"to": [{"namespaceSelector": {"matchLabels": {netpol.NAMESPACE_LABEL: name}}}]}]


def _ip(cidr: str, port: int) -> list[dict[str, Any]]:
    return [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}]


ANYWHERE_443 = [
    {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.1.2.3:8000/v1", _ip("10.1.2.3/32", 8000)),
        ("https://[2001:db8::1]/v1", _ip("2001:db8::1/128", 443)),
        ("http://vllm/v1", _ns(NS)),
        ("http://vllm.models.svc:8000", _ns("models")),
        ("http://vllm.models.svc.cluster.local", _ns("models")),
        ("https://api.openai.example/v1", ANYWHERE_443),
    ],
)
def test_endpoint_rules_by_host_shape(url: str, expected: list[dict[str, Any]]) -> None:
    assert netpol.endpoint_rules(url, NS, D) == expected


def test_two_label_hosts_allow_the_namespace_and_the_port() -> None:
    rules = netpol.endpoint_rules("http://minio.qpa-system:9000", NS, D)
    assert rules[0]["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "qpa-system"
    }
    assert rules[1]["ports"] == [{"protocol": "TCP", "port": 9000}]
    with pytest.raises(ValueError, match="no host"):
        netpol.endpoint_rules("http:///v1", NS, D)
