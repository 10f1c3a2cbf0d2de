"""Restricted pod security for every pod qpa runs (from the examples and the chart).

Every pod spec the operator's builders render (all five kinds, from the examples) and every
pod of the chart must meet the Kubernetes `restricted` Pod Security Standard: non-root,
read-only root filesystem, no privilege escalation, all capabilities dropped, seccomp
RuntimeDefault, no host namespaces or host paths. The DevicePool's bridge (adb on the node's
USB bus) is the one privileged pod, and the test asserts it is the only exception. Pods get no
service-account token unless they talk to the API (the operator; device-backed pods that hold
phone Leases, through a Role on leases only).

Network policies, and pod security for every kind with every option set, are checked in
`test_network_policies.py`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from helpers.chart import FULL, Render, pod_specs
from helpers.podsecurity import violations
from qpa_operator.builders import (
    Defaults,
    devicepool,
    harnessrelease,
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


READ = {"get", "list", "watch"}


def test_only_pods_that_hold_leases_get_a_token() -> None:
    children = list(built())
    roles = {c["metadata"]["name"]: c for _, c in children if c["kind"] == "Role"}
    bound: dict[str, list[str]] = {}  # service account -> the Roles bound to it
    for _, binding in children:
        if binding["kind"] == "RoleBinding":
            for subject in binding["subjects"]:
                bound.setdefault(subject["name"], []).append(binding["roleRef"]["name"])
    with_token = []
    for kind, child in children:
        for pod in pod_specs(child):
            if "predictor" in child.get("spec", {}):
                continue  # KServe's predictor: its own service account, set by KServe
            if pod.get("automountServiceAccountToken") is not False:
                account = pod.get("serviceAccountName")
                names = bound.get(account) or []
                assert names, f"{child['metadata']['name']}: token without a Role"
                for rule in (r for name in names for r in roles[name]["rules"]):
                    # Leases, the pod's own objects by name, or reading pods (the bridge's
                    # proxy checks who connects)
                    reads_pods = rule["resources"] == ["pods"] and set(rule["verbs"]) <= READ
                    assert (
                        rule["resources"] == ["leases"] or rule.get("resourceNames") or reads_pods
                    ), rule
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
