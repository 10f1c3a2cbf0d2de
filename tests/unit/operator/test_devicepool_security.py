"""DevicePool without escalation: nothing a pool says reaches the bridge's privileges.

- the image and the privileges are the operator's settings; `spec.bridgeImage` is refused by
  qpa.api (naming the field) and pruned as an unknown field by the API server (an error under
  `kubectl apply`'s strict field validation: tests/e2e/test_devicepool.py);
- every pod-spec field of the bridge but `nodeSelector` and the adb container port is the
  same whatever the pool says; `nodeSelector` always carries the admin's device labels;
- the CRD's CEL rule (through the test API server's schema validator) refuses a nodeSelector
  without `qpa.ai/device-node`, `{}` included;
- the Roles grant get/update on the pool's phone Leases by name only, never all Leases;
- the bridge's ingress policy admits the adb port from the pool's env-server pods only.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_schema import CustomResourceSchema
from qpa_operator.builders import devicepool, rolloutpool
from qpa_operator.builders.common import Defaults, MissingSetting, selector_labels

from qpa.api import DevicePool, RolloutPool, parse_resource
from qpa.device import names

ROOT = Path(__file__).resolve().parents[3]
D = Defaults()
ADMIN = Defaults(
    bridge_image="registry.example/qpa-device-bridge:7",
    device_node_selector=(("lab.example/phones", "usb"), ("qpa.ai/device-node", "true")),
)


def body(file: str = "devicepool.yaml", index: int = 0) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / file).read_text()) if d]
    doc = copy.deepcopy(docs[index])
    doc["metadata"].update(namespace="team-a", uid=f"uid-{doc['metadata']['name']}")
    return dict(doc)


def pool(**spec: Any) -> DevicePool:
    doc = body()
    doc["spec"].update(spec)
    resource = parse_resource(doc)
    assert isinstance(resource, DevicePool)
    return resource


def crd_schema() -> CustomResourceSchema:
    crd = yaml.safe_load((ROOT / "crds" / "qpa.ai_devicepools.yaml").read_text())
    return CustomResourceSchema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def server_errors(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(unknown fields pruned, validation errors) of the test API server for this spec."""
    doc = body()
    doc["spec"] = spec
    schema = crd_schema()
    unknown = schema.prune(doc)
    schema.default(doc)
    return [str(u) for u in unknown], [str(e) for e in schema.validate(doc, None)]


def pod_spec(resource: DevicePool, defaults: Defaults = ADMIN) -> dict[str, Any]:
    return dict(devicepool.daemonset(resource, defaults)["spec"]["template"]["spec"])


# --------------------------------------------------------------------------- image


def test_the_bridge_image_is_the_operators_and_a_pool_cannot_name_one() -> None:
    (container,) = pod_spec(pool())["containers"]
    assert container["image"] == "registry.example/qpa-device-bridge:7"
    with pytest.raises(ValueError, match=r"spec\.bridgeImage is no longer accepted"):
        pool(bridgeImage="evil.example/root:latest")
    unknown, errors = server_errors({**body()["spec"], "bridgeImage": "evil.example/root:1"})
    assert "spec.bridgeImage" in " ".join(unknown) and not errors  # pruned: never stored
    with pytest.raises(MissingSetting, match="QPA_OPERATOR_BRIDGE_IMAGE"):
        devicepool.daemonset(pool(), Defaults(bridge_image=""))


def test_nothing_the_pool_sets_reaches_the_privileged_pod_spec_but_narrower_nodes() -> None:
    plain = pool()
    wild = pool(
        nodeSelector={"qpa.ai/device-node": "false", "rack": "b7"},
        selector={"serials": ["R5CT1"], "models": ["Pixel 9"], "minAndroidVersion": 14},
        adbPort=15037,
        leaseDurationSeconds=86400,
        healthCheck={"intervalSeconds": 3600, "timeoutSeconds": 600, "failureThreshold": 100,
                     "quarantineSeconds": 604800},
    )  # fmt: skip
    a, b = pod_spec(plain), pod_spec(wild)
    assert b["nodeSelector"] == {
        "lab.example/phones": "usb",
        "qpa.ai/device-node": "true",
        "rack": "b7",
    }  # fmt: skip: the admin's labels win, the pool's extra one narrows
    assert b["containers"][0]["ports"] == [
        {"name": "adb", "containerPort": 15037, "protocol": "TCP"}
    ]
    for spec in (a, b):
        spec.pop("nodeSelector")
        spec["containers"][0].pop("ports")
    assert a == b  # security context, volumes, image, command, env, account: all the same
    (container,) = a["containers"]
    assert container["securityContext"]["privileged"] is True
    assert [v.get("hostPath") for v in a["volumes"] if "hostPath" in v] == [
        {"path": "/dev/bus/usb", "type": "Directory"}
    ]
    assert a["hostNetwork"] is False and a["hostPID"] is False and a["hostIPC"] is False
    assert all("hostPort" not in p for p in pod_spec(wild)["containers"][0]["ports"])


def test_the_pool_spec_reaches_the_bridge_only_as_its_work_order() -> None:
    resource = pool(adbPort=15037)
    manifest = devicepool.daemonset(resource, ADMIN)
    text = yaml.safe_dump(manifest["spec"]["template"]["spec"])
    assert "Pixel 8" not in text and "workorder.yaml" in text  # filters live in the ConfigMap


# --------------------------------------------------------------------------- nodes


def test_node_selector_must_name_the_device_label_in_the_crd_and_the_model() -> None:
    for selector in ({}, {"kubernetes.io/os": "linux"}):
        _, errors = server_errors({"nodeSelector": selector})
        assert any("qpa.ai/device-node" in e for e in errors), errors
        with pytest.raises(ValueError, match=r"nodeSelector must contain qpa\.ai/device-node"):
            pool(nodeSelector=selector)
    assert server_errors({"nodeSelector": {"qpa.ai/device-node": "true", "rack": "b7"}}) == (
        [],
        [],
    )
    assert server_errors({}) == ([], [])  # the default names it
    _, too_many = server_errors(
        {"nodeSelector": {"qpa.ai/device-node": "true", **{f"k{i}": "v" for i in range(16)}}}
    )
    assert too_many
    _, bad_value = server_errors({"nodeSelector": {"qpa.ai/device-node": "x y"}})
    assert bad_value
    with pytest.raises(ValueError, match="label keys"):
        pool(nodeSelector={"qpa.ai/device-node": "true", "-bad": "x"})


def test_the_admins_device_labels_are_always_on_the_daemonset() -> None:
    for resource in (pool(), pool(nodeSelector={"qpa.ai/device-node": "no", "zone": "a"})):
        selector = pod_spec(resource)["nodeSelector"]
        assert {k: selector[k] for k in dict(ADMIN.device_node_selector)} == dict(
            ADMIN.device_node_selector
        )
    with pytest.raises(MissingSetting, match="QPA_OPERATOR_DEVICE_NODE_SELECTOR"):
        devicepool.daemonset(pool(), Defaults(device_node_selector=()))


def test_the_device_node_setting_comes_from_the_chart_and_is_never_empty() -> None:
    env = {"QPA_OPERATOR_DEVICE_NODE_SELECTOR": '{"lab.example/phones": "usb"}'}
    assert Defaults.from_env(env).device_node_selector == (("lab.example/phones", "usb"),)
    assert Defaults.from_env({}).device_node_selector == (("qpa.ai/device-node", "true"),)
    with pytest.raises(ValueError, match="at least one device-node label"):
        Defaults.from_env({"QPA_OPERATOR_DEVICE_NODE_SELECTOR": "{}"})
    with pytest.raises(ValueError, match="strings"):
        Defaults.from_env({"QPA_OPERATOR_DEVICE_NODE_SELECTOR": '{"a": 1}'})


def test_adb_port_is_an_unprivileged_container_port() -> None:
    _, errors = server_errors({"adbPort": 22})
    assert errors
    with pytest.raises(ValueError, match="adbPort"):
        pool(adbPort=22)


# --------------------------------------------------------------------------- RBAC


def phone_lease(pool_name: str, serial: str, name: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name or names.lease_name(pool_name, serial),
            "labels": {names.POOL_LABEL: pool_name},
            "annotations": {names.SERIAL_ANNOTATION: serial},
        }
    }


def roles(resource: DevicePool, leases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        c["metadata"]["name"]: c
        for c in devicepool.children(resource, ADMIN, leases)
        if c["kind"] == "Role"
    }


def lease_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role["rules"] if r["resources"] == ["leases"]]


def test_leases_are_granted_by_name_and_only_the_pools_phones() -> None:
    resource = pool()
    leases = [
        phone_lease("lab-phones", "R5CT1"),
        phone_lease("lab-phones", "127.0.0.1:5555"),
        phone_lease("lab-phones", "X1", name="kube-scheduler"),  # labelled, but not a phone name
        phone_lease("other-pool", "Z9"),
    ]
    found = roles(resource, leases)
    phone_names = sorted(
        [names.lease_name("lab-phones", "R5CT1"), names.lease_name("lab-phones", "127.0.0.1:5555")]
    )
    bridge, env = found["lab-phones-bridge"], found["lab-phones-phones"]
    assert lease_rules(bridge) == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["create", "list"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": phone_names, "verbs": ["get", "update"]},
    ]  # fmt: skip
    assert lease_rules(env) == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": phone_names, "verbs": ["get", "update"]},
    ]  # fmt: skip
    for role in (bridge, env):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert ("delete" not in rule["verbs"] and "patch" not in rule["verbs"]) or (
                rule["resources"] == ["devicepools/status"]
            )
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]} in bridge["rules"]


def test_no_phone_yet_means_no_named_rule_never_an_empty_resource_names() -> None:
    for role in roles(pool(), []).values():
        for rule in role["rules"]:
            assert rule.get("resourceNames", ["x"]) != []
            if rule["resources"] == ["leases"]:
                assert set(rule["verbs"]) <= {"list", "create"}


def test_a_new_phone_changes_the_roles_spec_hash() -> None:
    before = roles(pool(), [])["lab-phones-phones"]
    after = roles(pool(), [phone_lease("lab-phones", "R5CT1")])["lab-phones-phones"]
    assert before["metadata"]["annotations"] != after["metadata"]["annotations"]


def test_operator_and_bridge_name_phone_leases_alike() -> None:
    for serial in ("R5CT1", "127.0.0.1:5555", "x" * 200, "Pixel_8-a", "---"):
        assert devicepool.lease_name("lab", serial) == names.lease_name("lab", serial)
    assert devicepool.CLIENT_LABEL == names.CLIENT_LABEL


def device_rolloutpool() -> RolloutPool:
    resource = parse_resource(body("rolloutpool.yaml", 1))
    assert isinstance(resource, RolloutPool) and resource.spec.device_pool_ref is not None
    return resource


def test_env_servers_bind_to_the_pools_phones_role_and_own_no_role() -> None:
    rp = device_rolloutpool()
    kinds = [c["kind"] for c in rolloutpool.children(rp, ADMIN)]
    assert "Role" not in kinds
    (binding,) = [c for c in rolloutpool.children(rp, ADMIN) if c["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lab-phones-phones",
    }  # fmt: skip
    assert binding["metadata"]["name"] == "phones-env-phones"  # never the old `phones-env`
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": rolloutpool.account_name(rp), "namespace": "team-a"}
    ]


# --------------------------------------------------------------------------- network


def matches(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_the_bridge_accepts_adb_only_from_its_pools_env_servers() -> None:
    resource = pool(adbPort=15037)
    (policy,) = [c for c in devicepool.children(resource, ADMIN) if c["kind"] == "NetworkPolicy"]
    bridge_labels = devicepool.daemonset(resource, ADMIN)["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["spec"]["podSelector"], bridge_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 15037}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # this namespace only: no namespaceSelector, no ipBlock
    rp = device_rolloutpool()
    env_labels = rolloutpool.deployment(rp, ADMIN)["spec"]["template"]["metadata"]["labels"]
    assert matches(peer["podSelector"], env_labels)
    sandbox = parse_resource(body("rolloutpool.yaml", 0))
    sandbox_labels = rolloutpool.deployment(sandbox, ADMIN)["spec"]["template"]["metadata"][
        "labels"
    ]
    assert not matches(peer["podSelector"], sandbox_labels)
    other = copy.deepcopy(rp)
    assert other.spec.device_pool_ref is not None
    other.spec.device_pool_ref.name = "other-phones"
    other_labels = rolloutpool.deployment(other, ADMIN)["spec"]["template"]["metadata"]["labels"]
    assert not matches(peer["podSelector"], other_labels)
    # the Deployment's selector is unchanged by the client label (it is on the pods only)
    selector = rolloutpool.deployment(rp, ADMIN)["spec"]["selector"]["matchLabels"]
    assert selector == selector_labels(rp, rolloutpool.COMPONENT)


def test_env_servers_dial_adb_from_their_pod_ip() -> None:
    (container,) = rolloutpool.deployment(device_rolloutpool(), ADMIN)["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["QPA_ADB_SOURCE_ADDRESS"]["value"] == "$(POD_IP)"
