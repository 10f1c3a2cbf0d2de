"""The bridge's decisions (pure functions) and its contract with the operator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import typer
import yaml
from qpa_operator.builders import devicepool as operator_devicepool
from qpa_operator.builders.common import Defaults

from qpa.api import DevicePool
from qpa.api.v1alpha1 import DeviceFilter, DevicePoolSpec, Phone
from qpa.device import names
from qpa.device.bridge import AdbServerProcess, Health, matches, merged_status, next_state
from qpa.device.leases import expired_holder, held
from qpa.envs.device import parse_address

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SPEC = DevicePoolSpec.model_validate(
    {"healthCheck": {"intervalSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 3,
                     "quarantineSeconds": 600}}
)  # fmt: skip
HEALTHY = Health(attached=True, failures=0)


def lease(state: str, *, holder: str | None = None, renewed: datetime | None = None,
          since: datetime | None = None, reason: str | None = None) -> dict[str, Any]:  # fmt: skip
    notes = {names.STATE_ANNOTATION: state}
    if since:
        notes[names.SINCE_ANNOTATION] = names.micro_time(since)
    if reason:
        notes[names.REASON_ANNOTATION] = reason
    spec: dict[str, Any] = {"leaseDurationSeconds": 300}
    if holder:
        spec |= {"holderIdentity": holder, "renewTime": names.micro_time(renewed or NOW)}
    return {"metadata": {"annotations": notes}, "spec": spec}


def test_the_lease_contract_matches_the_operator() -> None:
    for name in (
        "POOL_LABEL", "PHONE_LABEL", "ROLLOUT_POOL_LABEL", "SERIAL_ANNOTATION", "NODE_ANNOTATION",
        "MODEL_ANNOTATION", "ANDROID_ANNOTATION", "STATE_ANNOTATION", "REASON_ANNOTATION",
        "LAST_SEEN_ANNOTATION", "PHONE_STATES",
    ):  # fmt: skip
        assert getattr(names, name) == getattr(operator_devicepool, name), name
    # the operator reads what the bridge writes the same way
    lease_body = lease("leased", holder="pod-x")
    lease_body["metadata"]["annotations"] |= {
        names.SERIAL_ANNOTATION: "R5CT1", names.NODE_ANNOTATION: "n1",
    }  # fmt: skip
    operator_view = operator_devicepool.phone_from_lease(lease_body, NOW)
    assert operator_view is not None
    assert (operator_view.state, operator_view.leased_by) == ("leased", "pod-x")


def test_lease_names_are_dns_safe_and_distinct() -> None:
    assert names.lease_name("lab", "R5CT1") == "lab-r5ct1"
    network = names.phone_slug("127.0.0.1:5555")
    assert network.startswith("127-0-0-1-5555-") and len(network) <= 63
    assert names.phone_slug("127.0.0.1:5555") != names.phone_slug("127.0.0.1-5555")
    assert len(names.phone_slug("x" * 200)) <= 63


def test_holders_expire() -> None:
    assert held(lease("leased", holder="a"), NOW)
    stale = lease("leased", holder="a", renewed=NOW - timedelta(seconds=301))
    assert not held(stale, NOW) and expired_holder(stale, NOW) == "a"
    assert expired_holder(lease("available"), NOW) is None


def test_state_transitions() -> None:
    failing = Health(attached=True, failures=3, problems=("battery at 5% and not charging",))
    state, reason, since = next_state(lease("available"), failing, SPEC, NOW)
    assert (state, reason, since) == ("quarantined", "battery at 5% and not charging", NOW)
    # fewer failures than the threshold: still in the pool
    assert next_state(lease("available"), Health(True, 2), SPEC, NOW)[0] == "available"
    # re-admitted only after quarantineSeconds, and only when the last probe passed
    recent = lease("quarantined", since=NOW - timedelta(seconds=60), reason="x")
    assert next_state(recent, HEALTHY, SPEC, NOW)[:2] == ("quarantined", "x")
    old = lease("quarantined", since=NOW - timedelta(seconds=601), reason="x")
    assert next_state(old, HEALTHY, SPEC, NOW)[:2] == ("available", None)
    # unplugged: offline, but a quarantine outlives it
    gone = Health(attached=False, failures=0, adb_state="missing")
    assert next_state(lease("available"), gone, SPEC, NOW)[:2] == ("offline", "not attached")
    assert next_state(old, gone, SPEC, NOW)[0] == "quarantined"
    # back from offline: straight in, to its holder if the lease is still held
    assert next_state(lease("offline"), HEALTHY, SPEC, NOW)[0] == "available"
    assert next_state(lease("offline", holder="a"), HEALTHY, SPEC, NOW)[0] == "leased"
    assert next_state(lease("leased", holder="a"), HEALTHY, SPEC, NOW)[0] == "leased"
    assert next_state(None, HEALTHY, SPEC, NOW)[0] == "available"


def test_selector_filters_phones() -> None:
    pixel = DeviceFilter(models=["Pixel 8"], min_android_version=13, max_android_version=14)
    assert matches(pixel, "A", "Pixel 8", "14")
    assert not matches(pixel, "A", "Pixel 7a", "14")
    assert not matches(pixel, "A", "Pixel 8", "12")
    assert not matches(pixel, "A", "Pixel 8", "15.1")
    assert not matches(pixel, "A", "Pixel 8", "UpsideDownCake")
    assert matches(DeviceFilter(), "A", "anything", "")
    assert not matches(DeviceFilter(serials=["B"]), "A", "x", "14")


def test_status_merge_keeps_other_nodes() -> None:
    status = {
        "phones": [
            {"serial": "B1", "node": "n2", "state": "leased", "leasedBy": "r"},
            {"serial": "A1", "node": "n1", "state": "available"},
            {"serial": "A2", "node": "n1", "state": "available"},
        ]
    }
    mine = [Phone(serial="A1", node="n1", state="quarantined", reason="screen")]
    merged = merged_status(status, "n1", mine)
    assert [(p["serial"], p["state"]) for p in merged["phones"]] == [
        ("A1", "quarantined"), ("B1", "leased"),
    ]  # fmt: skip
    assert (merged["total"], merged["leased"], merged["quarantined"]) == (2, 1, 1)
    # a phone moved from another node is listed once, under its new node
    moved = merged_status(status, "n3", [Phone(serial="B1", node="n3", state="available")])
    assert [(p["serial"], p["node"]) for p in moved["phones"]] == [
        ("A1", "n1"), ("A2", "n1"), ("B1", "n3"),
    ]  # fmt: skip


def test_the_daemonset_runs_the_real_bridge_command(tmp_path: Path) -> None:
    from qpa.cli import app

    example = next(d for d in yaml.safe_load_all(Path("examples/devicepool.yaml").read_text()) if d)
    example["metadata"] |= {"namespace": "default", "uid": "0b6f6a2e-1"}
    pool = DevicePool.model_validate(example)
    argv = list(operator_devicepool.BRIDGE_ARGS)
    group: Any = typer.main.get_command(app)
    command = group.commands["device"].commands["bridge"]
    known = {opt for param in command.params for opt in param.opts}
    assert {w for w in argv if w.startswith("--")} <= known
    ds = operator_devicepool.daemonset(pool, Defaults())
    env = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"NODE_NAME", "POD_NAMESPACE", "POD_IP"} <= env
    role = next(c for c in operator_devicepool.children(pool, Defaults()) if c["kind"] == "Role")
    status_rule = next(r for r in role["rules"] if r["resources"] == ["devicepools/status"])
    assert status_rule["resourceNames"] == ["lab-phones"] and status_rule["verbs"] == [
        "get", "patch",
    ]  # fmt: skip
    # the work order the ConfigMap carries is what the bridge reads
    from qpa.api.v1alpha1 import WORK_ORDER_KEY, WorkOrder
    from qpa.device.bridge import BridgeSettings

    cm = operator_devicepool.config_map(pool, Defaults())
    config = tmp_path / WORK_ORDER_KEY
    config.write_text(cm["data"][WORK_ORDER_KEY])
    order = WorkOrder.load(config, DevicePool)
    settings = BridgeSettings.from_devicepool(order, node="node-1", pod_ip="10.1.2.3")
    assert (settings.pool, settings.spec, settings.namespace) == (
        "lab-phones",
        pool.spec,
        "default",
    )
    assert (settings.adb_port, settings.advertise) == (5037, "10.1.2.3:5037")
    assert settings.gate == ("10.1.2.3", 5037)
    v6 = BridgeSettings.from_devicepool(order, node="node-1", pod_ip="fd00::5")
    assert (v6.advertise, v6.gate) == ("fd00::5:5037", ("fd00::5", 5037))
    assert parse_address(v6.advertise) == ("fd00::5", 5037)  # what the env servers dial


def test_adb_server_command_line_listens_on_loopback_only() -> None:
    assert AdbServerProcess(5037, adb="adb").command() == [
        "adb", "-L", "tcp:5037", "server", "nodaemon",
    ]  # fmt: skip
