"""DevicePool end to end: the bridge, phone Leases and leased device environments.

Real parts: the adb server (Debian's), the test phone speaking the ADB wire protocol, the
Kubernetes test API server (`fakes.kube_api`, CRDs installed, Leases served) driven through the
`kubernetes` client, `qpa env serve` and `qpa device bridge` as subprocesses. Checked: discovery
publishes Leases and merges the node's phones into the pool's status without touching other
nodes' entries; health probes quarantine and re-admit; two rollouts contend for one phone and
exactly one wins; a phone unplugged mid-episode ends the episode as an environment failure, is
quarantined and its lease released, and comes back after re-plugging; a lost holder's lease
expires and the phone is reset before anyone else gets it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes.adbd import AdbServer, FakeAdbd, free_port
from fakes.kube_api import KubeAPIServer
from fakes.phone import MESSAGES_URI

from qpa.api.v1alpha1 import DevicePoolSpec
from qpa.device import names
from qpa.device.bridge import Bridge, BridgeSettings
from qpa.device.kube import Kube
from qpa.device.leases import LeasedPhones
from qpa.envs.device import DeviceEnv, PhoneUnavailable, get_device_task
from qpa.envs.remote import RemoteEnv
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

NS, POOL, NODE = "default", "lab-phones", "node-a"
BIN = Path(sys.executable).parent
TASK = "device.messages.text_bob_running_late"


def devicepool(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "qpa.ai/v1alpha1",
        "kind": "DevicePool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {
            "leaseDurationSeconds": 10,
            "healthCheck": {
                "intervalSeconds": 2,
                "timeoutSeconds": 1,
                "failureThreshold": 1,
                "quarantineSeconds": 0,
            },
            **spec,
        },
    }


class Clocks:
    """The bridge's clocks: probes are due when the test says so; leases age on demand."""

    def __init__(self) -> None:
        self.tick = 0.0
        self.ahead = timedelta()

    def monotonic(self) -> float:
        return self.tick

    def now(self) -> datetime:
        return datetime.now(UTC) + self.ahead

    def next_probe(self) -> None:
        self.tick += 60.0


@pytest.fixture
def kube(kube_api: KubeAPIServer, kube_config: Path) -> Iterator[Kube]:
    kube_api.create(devicepool())
    client = Kube.connect(NS, str(kube_config))
    yield client
    client.close()


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def bridge(kube: Kube, adb_server: AdbServer, adbd: FakeAdbd, clocks: Clocks) -> Bridge:
    spec = DevicePoolSpec.model_validate(kube.get_devicepool(POOL)["spec"])
    settings = BridgeSettings(
        pool=POOL,
        node=NODE,
        spec=spec,
        adb_port=adb_server.port,
        advertise=f"127.0.0.1:{adb_server.port}",
        connect=(adbd.address,),
    )
    return Bridge(settings, kube, clock=clocks.now, monotonic=clocks.monotonic)


def lease(kube_api: KubeAPIServer, serial: str) -> dict[str, Any]:
    found = kube_api.get("leases", NS, names.lease_name(POOL, serial))
    assert found is not None, f"no Lease for {serial}"
    return found


def notes(kube_api: KubeAPIServer, serial: str) -> dict[str, str]:
    return lease(kube_api, serial)["metadata"].get("annotations", {})


def pool_status(kube_api: KubeAPIServer) -> dict[str, Any]:
    return (kube_api.get("devicepools", NS, POOL) or {}).get("status") or {}


def leased_env(kube: Kube, holder: str, timeout: float = 0.3) -> DeviceEnv:
    phones = LeasedPhones(kube, POOL, acquire_timeout=timeout)
    return DeviceEnv(phones=phones, holder=holder, timeout=3)


def test_the_bridge_publishes_phones_and_merges_its_node_into_the_status(
    bridge: Bridge, kube_api: KubeAPIServer, adbd: FakeAdbd, adb_server: AdbServer
) -> None:
    other = {"serial": "R5CT9", "node": "node-b", "state": "leased", "leasedBy": "x"}
    kube_api.patch_status("devicepools", NS, POOL, {"phones": [other], "total": 1, "leased": 1})
    assert adbd.address not in adb_server.devices()

    report = bridge.scan()
    assert adb_server.devices()[adbd.address] == "device"  # the bridge ran `adb connect`
    [phone] = report.phones
    assert (phone.serial, phone.node, phone.model, phone.android_version, phone.state) == (
        adbd.address, NODE, "Pixel 8", "14", "available"
    )  # fmt: skip
    published = lease(kube_api, adbd.address)
    labels = published["metadata"]["labels"]
    assert labels[names.POOL_LABEL] == POOL and labels[names.PART_OF_LABEL] == "qpa"
    assert (
        published["metadata"]["ownerReferences"][0]["uid"]
        == (kube_api.get("devicepools", NS, POOL)["metadata"]["uid"])
    )
    assert published["spec"]["leaseDurationSeconds"] == 10
    assert notes(kube_api, adbd.address)[names.ADB_SERVER_ANNOTATION] == bridge.settings.advertise
    status = pool_status(kube_api)
    assert [(p["serial"], p["node"], p["state"]) for p in status["phones"]] == [
        ("127.0.0.1:" + str(adbd.port), NODE, "available"),
        ("R5CT9", "node-b", "leased"),
    ]
    assert (status["total"], status["available"], status["leased"]) == (2, 1, 1)
    assert status["phones"][1]["leasedBy"] == "x"  # the other node's entry is untouched

    assert bridge.scan().writes == 0  # nothing changed, nothing written


def test_health_probes_quarantine_and_readmit(
    bridge: Bridge, kube_api: KubeAPIServer, adbd: FakeAdbd, clocks: Clocks
) -> None:
    bridge.scan()
    adbd.phone.battery_level, adbd.phone.charging = 5, False
    clocks.next_probe()
    [phone] = bridge.scan().phones
    assert phone.state == "quarantined" and "battery at 5%" in (phone.reason or "")
    assert pool_status(kube_api)["quarantined"] == 1

    adbd.phone.charging = True
    adbd.phone.screen_on = False
    clocks.next_probe()
    [phone] = bridge.scan().phones
    assert phone.state == "available" and phone.reason is None
    assert adbd.phone.screen_on  # the probe woke the screen up
    assert pool_status(kube_api)["available"] == 1


def test_two_rollouts_one_phone_exactly_one_wins(
    bridge: Bridge, kube: Kube, kube_api: KubeAPIServer, adbd: FakeAdbd
) -> None:
    bridge.scan()
    task = get_device_task(TASK)
    first, second = leased_env(kube, "rollout-a"), leased_env(kube, "rollout-b")
    assert first.reset(task).status == "ok"
    held = lease(kube_api, adbd.address)
    assert held["spec"]["holderIdentity"] == "rollout-a"
    assert notes(kube_api, adbd.address)[names.STATE_ANNOTATION] == "leased"
    assert notes(kube_api, adbd.address)[names.PACKAGES_ANNOTATION] == "com.qpa.messages"
    busy = second.reset(task)
    assert busy.error == "environment_failure" and "no available phone" in busy.message
    [phone] = bridge.scan().phones
    assert (phone.state, phone.leased_by) == ("leased", "rollout-a")

    first.close()
    assert "holderIdentity" not in lease(kube_api, adbd.address)["spec"]
    assert run_episode(second, task, OraclePlanner()).success
    second.close()

    # A real race: eight rollouts acquire at once, the API server lets exactly one win.
    phones = LeasedPhones(kube, POOL, acquire_timeout=0)
    barrier, won, refused = threading.Barrier(8), [], []

    def race(i: int) -> None:
        barrier.wait()
        try:
            won.append(phones.acquire(holder=f"racer-{i}", packages=[]))
        except PhoneUnavailable:
            refused.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert (len(won), len(refused)) == (1, 7)
    assert lease(kube_api, adbd.address)["spec"]["holderIdentity"] == won[0].holder
    won[0].release()


def test_unplugged_mid_episode_quarantined_released_and_back_after_replug(
    bridge: Bridge, kube: Kube, kube_api: KubeAPIServer, adbd: FakeAdbd, clocks: Clocks
) -> None:
    bridge.scan()
    task = get_device_task(TASK)
    env = leased_env(kube, "rollout-a")

    class UnplugAfterTwo(OraclePlanner):
        def decide(self, last):  # type: ignore[no-untyped-def]
            if last is not None and last.index == 1:
                adbd.unplug()
            return super().decide(last)

    trajectory = run_episode(env, task, UnplugAfterTwo())
    assert trajectory.steps[-1].feedback.error == "environment_failure"
    assert trajectory.steps[-1].feedback.done and not trajectory.success
    gone = lease(kube_api, adbd.address)
    assert "holderIdentity" not in gone["spec"]  # released at once, not left to expire
    assert notes(kube_api, adbd.address)[names.STATE_ANNOTATION] == "quarantined"
    assert adbd.address in notes(kube_api, adbd.address)[names.REASON_ANNOTATION]

    clocks.next_probe()
    adbd.phone.log.clear()
    [phone] = bridge.scan().phones
    # the probe sees the unplug as adb does ("offline") or, when it lands first, as the tap's
    # closed connection ("not attached"): either way the phone is quarantined with the cause
    unplugged = ("offline", "not attached")
    assert phone.state == "quarantined" and any(w in (phone.reason or "") for w in unplugged)
    assert pool_status(kube_api)["quarantined"] == 1
    other = leased_env(kube, "rollout-b")
    assert other.reset(task).error == "environment_failure"  # nobody gets a quarantined phone

    adbd.replug()
    clocks.next_probe()
    [phone] = bridge.scan().phones  # reconnects, probes, re-admits
    assert phone.state == "available"
    assert run_episode(other, task, OraclePlanner()).success
    other.close()
    env.close()


def test_a_lost_holders_lease_expires_and_the_phone_is_reset_before_reuse(
    bridge: Bridge, kube: Kube, kube_api: KubeAPIServer, adbd: FakeAdbd, clocks: Clocks
) -> None:
    bridge.scan()
    task = get_device_task(TASK)
    ghost = leased_env(kube, "ghost")
    assert ghost.reset(task).status == "ok"
    assert adbd.phone.providers[MESSAGES_URI].rows  # seeded by the episode
    # The holder's pod is gone: nothing renews and its lease runs out.
    clocks.ahead = timedelta(seconds=60)
    report = bridge.scan()
    assert report.reclaimed == [adbd.address]
    assert adbd.phone.providers[MESSAGES_URI].rows == []  # pm clear of the recorded packages
    assert "am force-stop com.qpa.messages" in adbd.phone.log
    freed = lease(kube_api, adbd.address)
    assert "holderIdentity" not in freed["spec"]
    assert "expired" in notes(kube_api, adbd.address)[names.REASON_ANNOTATION]
    # The ghost learns it lost the phone at its next renewal; its steps fail, nothing crashes.
    claim = ghost._claim
    assert claim is not None and claim.renew() is False  # type: ignore[attr-defined]
    lost = ghost.step(get_device_task(TASK).reference_plan[0])  # type: ignore[index]
    assert lost.error == "environment_failure" and "held by nobody" in lost.message
    newcomer = leased_env(kube, "rollout-b")
    assert run_episode(newcomer, task, OraclePlanner()).success
    newcomer.close()


def _env(kube_config: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID_", "ADB_"))}
    env.update(KUBECONFIG=str(kube_config), HOME=str(home), POD_NAMESPACE=NS)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return env


def test_env_server_of_a_device_rollout_pool_leases_per_session(
    bridge: Bridge, kube_api: KubeAPIServer, kube_config: Path, adbd: FakeAdbd, tmp_path: Path
) -> None:
    bridge.scan()
    port = free_port()
    env = _env(kube_config, tmp_path) | {"QPA_DEVICE_POOL": POOL, "QPA_ROLLOUT_POOL": "phones"}
    server = subprocess.Popen(
        [str(BIN / "qpa"), "env", "serve", "--kind", "device", "--port", str(port),
         "--acquire-timeout", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "qpa env serve did not start"
                time.sleep(0.1)
        with RemoteEnv(f"http://127.0.0.1:{port}") as remote:
            task = get_device_task(TASK)
            first = remote.reset(task)
            assert first.status == "ok", first.message
            held = lease(kube_api, adbd.address)
            assert held["metadata"]["labels"][names.ROLLOUT_POOL_LABEL] == "phones"
            assert held["spec"]["holderIdentity"]
            assert run_episode(remote, task, OraclePlanner()).success
        # closing the session gives the phone back
        freed = lease(kube_api, adbd.address)
        assert "holderIdentity" not in freed["spec"]
        assert names.ROLLOUT_POOL_LABEL not in freed["metadata"]["labels"]
    finally:
        server.terminate()
        server.wait(10)


def test_bridge_command_starts_its_adb_server_and_publishes(
    kube: Kube, kube_api: KubeAPIServer, kube_config: Path, adbd: FakeAdbd, tmp_path: Path
) -> None:
    config = tmp_path / "devicepool.yaml"
    config.write_text(json.dumps(kube.get_devicepool(POOL)["spec"]))
    port = free_port()
    result = subprocess.run(
        [str(BIN / "qpa"), "device", "bridge", "--pool", POOL, "--config", str(config),
         "--node", NODE, "--adb-port", str(port), "--connect", adbd.address, "--once"],
        env=_env(kube_config, tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [phone] = json.loads(result.stdout)
    assert (phone["serial"], phone["state"], phone["model"]) == (
        adbd.address,
        "available",
        "Pixel 8",
    )
    assert lease(kube_api, adbd.address)
    with pytest.raises(OSError):  # the adb server it started is stopped with it
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()

    config.write_text("healthCheck: {intervalSeconds: 1, timeoutSeconds: 5}\n")
    bad = subprocess.run(
        [str(BIN / "qpa"), "device", "bridge", "--pool", POOL, "--config", str(config),
         "--node", NODE, "--once"],
        env=_env(kube_config, tmp_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "below intervalSeconds" in bad.stderr.replace("\n", "")
