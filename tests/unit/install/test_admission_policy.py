"""The chart's ValidatingAdmissionPolicy: privileged pods only from the operator's bridge.

The policy is rendered with `helm template`, validated against the official schemas
(kubernetes-validate, strict), and its CEL evaluated the way the API server does (variables in
order, then the validation) with the project's CEL evaluator (tests/fakes/kube_cel.py) against
the bridge exactly as the operator builds it (the DaemonSet and its pod, with the chart's bridge
image from the operator's environment) and against pods and DaemonSets that must be refused.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fakes.kube_cel import evaluate
from helpers.chart import NAMESPACE, RELEASE, Render, env_of, find, operator_container
from qpa_operator.builders import devicepool
from qpa_operator.builders.common import Defaults

from qpa.api import DevicePool, parse_resource

ROOT = Path(__file__).resolve().parents[3]
K8S_VERSION = "1.37.0"
POLICY = f"{RELEASE}-privileged-pods"
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-operator"
DS_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
USER = "alice@example.com"


def policy_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "ValidatingAdmissionPolicy", POLICY)


def admit(
    policy: dict[str, Any],
    obj: dict[str, Any],
    user: str,
    *,
    old: dict[str, Any] | None = None,
    subresource: str = "",
) -> bool:
    """Whether the policy lets `user` write `obj` (CREATE, or UPDATE of `old`)."""
    request = {
        "operation": "UPDATE" if old is not None else "CREATE",
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "subResource": subresource,
    }
    values: dict[str, Any] = {}
    scope = {"object": obj, "oldObject": old, "request": request, "variables": values}
    for variable in policy["spec"]["variables"]:
        values[variable["name"]] = evaluate(variable["expression"], scope)
    results = [evaluate(v["expression"], scope) for v in policy["spec"]["validations"]]
    assert all(isinstance(r, bool) for r in results)
    return all(results)


def bridge_image(docs: list[dict[str, Any]]) -> str:
    return env_of(operator_container(docs))["QPA_OPERATOR_BRIDGE_IMAGE"]


def bridge_daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    body = next(
        d for d in yaml.safe_load_all((ROOT / "examples" / "devicepool.yaml").read_text()) if d
    )
    body["metadata"].update(namespace="team-a", uid="uid-lab-phones")
    pool = parse_resource(body)
    assert isinstance(pool, DevicePool)
    return devicepool.daemonset(pool, Defaults(bridge_image=bridge_image(docs)))


def pod_of(daemonset: dict[str, Any]) -> dict[str, Any]:
    """The pod the DaemonSet controller creates from the template."""
    template = copy.deepcopy(daemonset["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": "lab-phones-bridge-x7k2q",
            "namespace": "team-a",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": daemonset["metadata"]["name"],
                    "uid": "u1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {**template["spec"], "nodeName": "lab-node-1"},
    }


def plain_pod(**spec: Any) -> dict[str, Any]:
    container = {"name": "app", "image": "registry.example/app:1"}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "namespace": "team-a", "labels": {"app": "x"}},
        "spec": {"containers": [container], **spec},
    }


@pytest.fixture(scope="module")
def docs(render: Render) -> list[dict[str, Any]]:
    return render()


def test_policy_and_binding_are_valid_objects_on_by_default(docs: list[dict[str, Any]]) -> None:
    policy = policy_of(docs)
    binding = find(docs, "ValidatingAdmissionPolicyBinding", POLICY)
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expression == {
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": ["kube-system", "kube-node-lease", "kube-public"],
    }  # fmt: skip
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {r for rule in rules for r in rule["resources"]} == {
        "pods", "pods/ephemeralcontainers", "daemonsets",
    }  # fmt: skip


def test_values_disable_it_and_namespaced_installs_bind_their_namespaces(render: Render) -> None:
    off = render({"devices.admissionPolicy.enabled": False})
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
    served = render({"operator.watchNamespaces": ["team-a", "team-b"]})
    binding = find(served, "ValidatingAdmissionPolicyBinding", POLICY)
    (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert (expression["operator"], expression["values"]) == ("In", ["team-a", "team-b"])
    warn = render({"devices.admissionPolicy.validationActions": ["Warn", "Audit"]})
    assert find(warn, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]["validationActions"] == [
        "Warn",
        "Audit",
    ]


def test_the_operators_bridge_is_admitted(docs: list[dict[str, Any]]) -> None:
    policy, daemonset = policy_of(docs), bridge_daemonset(docs)
    pod = pod_of(daemonset)
    assert pod["spec"]["containers"][0]["securityContext"]["privileged"] is True
    assert admit(policy, daemonset, OPERATOR_SA)
    assert admit(policy, pod, DS_CONTROLLER)
    assert admit(policy, pod, "system:kube-controller-manager")
    relabelled = copy.deepcopy(pod)
    relabelled["metadata"]["labels"]["team"] = "a"
    assert admit(policy, relabelled, USER, old=pod)  # metadata updates keep working
    gc = copy.deepcopy(daemonset)
    gc["metadata"]["finalizers"] = []
    assert admit(policy, gc, "system:serviceaccount:kube-system:generic-garbage-collector",
                 old=daemonset)  # fmt: skip


def test_ordinary_pods_are_untouched(docs: list[dict[str, Any]]) -> None:
    policy = policy_of(docs)
    assert admit(policy, plain_pod(), USER)
    bind = plain_pod(container={"securityContext": {"capabilities": {
        "add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}})  # fmt: skip
    assert admit(policy, bind, USER)


@pytest.mark.parametrize(
    "case",
    [
        "privileged",
        "hostpath-usb",
        "hostpath-root",
        "capability",
        "host-network",
        "host-pid",
        "host-port",
        "escalation",
        "privileged-init",
    ],
)
def test_escalating_pods_of_anyone_else_are_refused(docs: list[dict[str, Any]], case: str) -> None:
    pods = {
        "privileged": plain_pod(container={"securityContext": {"privileged": True}}),
        "hostpath-usb": plain_pod(volumes=[{"name": "usb", "hostPath": {"path": "/dev/bus/usb"}}]),
        "hostpath-root": plain_pod(volumes=[{"name": "r", "hostPath": {"path": "/"}}]),
        "capability": plain_pod(
            container={"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}
        ),
        "host-network": plain_pod(hostNetwork=True),
        "host-pid": plain_pod(hostPID=True),
        "host-port": plain_pod(container={"ports": [{"containerPort": 80, "hostPort": 80}]}),
        "escalation": plain_pod(container={"securityContext": {"allowPrivilegeEscalation": True}}),
        "privileged-init": plain_pod(
            initContainers=[
                {"name": "i", "image": "busybox", "securityContext": {"privileged": True}}
            ]
        ),
    }
    policy = policy_of(docs)
    assert not admit(policy, pods[case], USER)
    # the DaemonSet controller cannot launder it either (not the bridge's shape)
    owned = copy.deepcopy(pods[case])
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": True}
    ]
    assert not admit(policy, owned, DS_CONTROLLER)


def test_what_only_looks_like_the_bridge_is_refused(docs: list[dict[str, Any]]) -> None:
    policy, daemonset = policy_of(docs), bridge_daemonset(docs)
    pod = pod_of(daemonset)
    # the bridge's very pod, created by a user (not by the DaemonSet controller)
    assert not admit(policy, pod, USER)
    # ... or by the controller but without a DaemonSet controlling it
    orphan = copy.deepcopy(pod)
    orphan["metadata"].pop("ownerReferences")
    assert not admit(policy, orphan, DS_CONTROLLER)
    # the bridge DaemonSet written by anyone but the operator
    assert not admit(policy, daemonset, USER)
    # another image, even from the operator and the controller
    other = copy.deepcopy(daemonset)
    other["spec"]["template"]["spec"]["containers"][0]["image"] = "evil.example/root:1"
    assert not admit(policy, other, OPERATOR_SA)
    assert not admit(policy, pod_of(other), DS_CONTROLLER)
    # an image swapped into the running bridge pod
    swapped = copy.deepcopy(pod)
    swapped["spec"]["containers"][0]["image"] = "evil.example/root:1"
    assert not admit(policy, swapped, USER, old=pod)
    # a privileged ephemeral container added to it
    debug = copy.deepcopy(pod)
    debug["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "image": bridge_image(docs), "securityContext": {"privileged": True}}
    ]
    assert not admit(policy, debug, USER, old=pod, subresource="ephemeralcontainers")
    # more host access than /dev/bus/usb, or host networking, on the bridge's own shape
    wider = copy.deepcopy(daemonset)
    wider["spec"]["template"]["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    assert not admit(policy, wider, OPERATOR_SA)
    networked = copy.deepcopy(daemonset)
    networked["spec"]["template"]["spec"]["hostNetwork"] = True
    assert not admit(policy, networked, OPERATOR_SA)
    # not labelled as the operator's bridge
    unlabelled = copy.deepcopy(daemonset)
    unlabelled["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "me"
    assert not admit(policy, unlabelled, OPERATOR_SA)
    # a template change by someone else than the operator
    edited = copy.deepcopy(daemonset)
    edited["spec"]["template"]["metadata"]["labels"]["x"] = "y"
    assert not admit(policy, edited, USER, old=daemonset)


def test_the_charts_device_labels_reach_the_operator_and_never_empty(
    render: Render, helm_run: Any, tmp_path: Path
) -> None:
    docs = render({"devices.nodeSelector": {"lab.example/phones": "usb"}})
    defaults = Defaults.from_env(env_of(operator_container(docs)))
    assert defaults.device_node_selector == (  # helm merges maps: the default label stays
        ("lab.example/phones", "usb"), ("qpa.ai/device-node", "true"),
    )  # fmt: skip
    emptied = tmp_path / "values.yaml"
    emptied.write_text("devices:\n  nodeSelector:\n    qpa.ai/device-node: null\n")
    refused = helm_run("template", RELEASE, "charts/qpa", "--namespace", NAMESPACE, "-f", emptied)
    assert refused.returncode != 0 and "nodeSelector" in refused.stderr, refused.stderr
