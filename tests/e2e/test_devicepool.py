"""DevicePool end to end: the bridge DaemonSet's pod publishes the phone, a device pool leases it.

From `kubectl apply` of `examples/devicepool.yaml` (adjusted: the free port of the test's adb
server as `adbPort`, fast health checks) with a Node labelled `qpa.ai/device-node=true`: the
real operator (in-process) writes the bridge DaemonSet, the test kubelet runs its pod's own
command (`qpa device bridge --spec ...`, in-cluster API access through the automounted token)
against the real adb server (Debian's) with the test phone (`fakes.adbd`) attached, and the
phone's Lease and the DevicePool's status appear. Then `examples/rolloutpool.yaml`'s device
pool: its `qpa env serve` pod leases the phone for one episode driven through the pool's
Service (`qpa.envs.remote`) and gives it back when the session closes.

Who reaches adb: the bridge's adb gate (its own proxy, `qpa.device.proxy`) listens on the
bridge pod's IP and forwards to the node's adb server only connections from running pods
labelled `qpa.ai/devicepool-client=<pool>` (the device RolloutPool's env server, which dials
from its pod IP); a stranger's connection is closed before adb sees a byte. And a DevicePool
that still names `spec.bridgeImage` is refused by `kubectl apply` (strict field validation).

Simplifications, all about the one privileged pod on one shared machine:

- the bridge's hostPath `/dev/bus/usb` is an empty temporary folder (`host_paths`): the phone
  is a network phone the node's adb server has `adb connect`ed, as a USB one would be listed;
- the node's adb server is started by the test (`adb -L tcp:PORT server nodaemon`, loopback,
  as the bridge would start it): the bridge finds it answering on 127.0.0.1 and starts none.
  Pods share the host's network here, each with its own loopback address as pod IP, so the
  gate's peer check sees each pod's own address.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.adbd import AdbServer, FakeAdbd
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl
from fakes.kubelet import TestKubelet
from helpers.operator_runner import example, operator, operator_env  # noqa: F401

from qpa.device import names
from qpa.envs.device import get_device_task
from qpa.envs.remote import RemoteEnv
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(150)]

NS, NODE, USB = "default", "lab-node-1", "/dev/bus/usb"
TASK = "device.messages.text_bob_running_late"


@pytest.fixture
def device_kubelet(kube_api: KubeAPIServer, tmp_path: Path) -> Iterator[TestKubelet]:
    """The test kubelet, with the bridge's hostPath /dev/bus/usb mapped to an empty folder."""
    usb = tmp_path / "usb"
    usb.mkdir()
    with TestKubelet(kube_api, tmp_path / "kubelet", host_paths={USB: usb}) as node:
        yield node
        print(node.report())
    assert not node.errors, node.errors


STRANGER = "127.0.0.3"


def adb_version(gate: tuple[str, int]) -> bytes:
    """`host:version` to the adb gate from a pod that is not the pool's env server."""
    with socket.create_connection(gate, timeout=5, source_address=(STRANGER, 0)) as sock:
        sock.sendall(b"000chost:version")
        with contextlib.suppress(ConnectionResetError):
            return sock.recv(64)
    return b""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def phones(kube_api: KubeAPIServer, pool: str) -> list[dict[str, Any]]:
    return list(
        ((kube_api.get("devicepools", NS, pool) or {}).get("status") or {}).get("phones") or []
    )


async def test_bridge_pod_publishes_the_phone_and_a_device_pool_leases_it(
    kube_api: KubeAPIServer,
    kubectl: Kubectl,
    operator_env: Path,  # noqa: F811
    device_kubelet: TestKubelet,
    adb_server: AdbServer,
    adbd: FakeAdbd,
    tmp_path: Path,
) -> None:
    kubelet = device_kubelet
    kubelet.add_node(NODE, {"qpa.ai/device-node": "true"})
    adb_server.connect(adbd)  # the phone on the node (a network phone stands in for USB)
    pool = example("devicepool.yaml")
    pool["spec"]["adbPort"] = adb_server.port
    pool["spec"]["healthCheck"] |= {"intervalSeconds": 2, "timeoutSeconds": 1}
    phone_pool = example("rolloutpool.yaml", 1)
    phone_pool["spec"]["port"] = free_port()
    name = pool["metadata"]["name"]
    manifest = tmp_path / "devicepool.yaml"
    manifest.write_text(yaml.safe_dump(pool))
    with operator():
        legacy = tmp_path / "legacy.yaml"
        legacy.write_text(
            yaml.safe_dump({**pool, "spec": {**pool["spec"], "bridgeImage": "evil.example/x:1"}})
        )
        refused = kubectl("apply", "-f", legacy, check=False)  # a pool names no image
        assert refused.returncode != 0 and 'unknown field "spec.bridgeImage"' in refused.stderr
        kubectl("apply", "-f", manifest)
        found = await kubelet.eventually(lambda: phones(kube_api, name), timeout=60)
        assert [(p["serial"], p["node"], p["state"]) for p in found] == [
            (adbd.address, NODE, "available")
        ]
        lease_name = names.lease_name(name, adbd.address)
        lease = kube_api.get("leases", NS, lease_name)
        assert lease is not None

        def named_leases(role: str) -> list[str]:
            rules = (kube_api.get("roles", NS, role) or {}).get("rules") or []
            return [
                n for r in rules for n in r.get("resourceNames") or [] if "leases" in r["resources"]
            ]

        # the operator grants get/update on the new phone's Lease by name, to bridge and env servers
        for role in (f"{name}-bridge", f"{name}-phones"):
            assert await kubelet.eventually(lambda r=role: named_leases(r), timeout=30) == [
                lease_name
            ]
        (bridge,) = [
            p for p in kube_api.list_objects("pods", NS) if p["spec"].get("nodeName") == NODE
        ]
        bridge_ip = bridge["status"]["podIP"]
        # the bridge found the node's adb server (loopback only) and started none
        assert "starting the adb server" not in kubelet.logs(bridge["metadata"]["name"], NS)
        advertised = lease["metadata"]["annotations"][names.ADB_SERVER_ANNOTATION]
        assert advertised == f"{bridge_ip}:{adb_server.port}"
        # before any env server exists, the gate admits nobody (this test is a stranger)
        assert await asyncio.to_thread(adb_version, (bridge_ip, adb_server.port)) == b""

        manifest.write_text(yaml.safe_dump(phone_pool))
        kubectl("apply", "-f", manifest)
        pool_name = phone_pool["metadata"]["name"]
        await kubelet.eventually(
            lambda: ((kube_api.get("rolloutpools", NS, pool_name) or {}).get("status") or {}).get(
                "readyReplicas"
            ),
            timeout=60,
        )
        holders: list[str] = []

        def episode() -> bool:
            task = get_device_task(TASK)
            with RemoteEnv(kubelet.url(f"{pool_name}-env", NS)) as remote:
                first = remote.reset(task)
                assert first.status == "ok", first.message
                held = kube_api.get("leases", NS, lease_name) or {}
                holders.append(str(held["spec"].get("holderIdentity") or ""))
                return run_episode(remote, task, OraclePlanner()).success

        assert await asyncio.to_thread(episode)  # the env pod went through the bridge's gate
        # a stranger still gets nothing, while the env pod is admitted
        assert await asyncio.to_thread(adb_version, (bridge_ip, adb_server.port)) == b""
        assert "refused adb from 127.0.0.3" in kubelet.logs(bridge["metadata"]["name"], NS)
        assert holders and holders[0].startswith(f"{pool_name}-env-"), holders
        freed = kube_api.get("leases", NS, lease_name) or {}
        assert not freed["spec"].get("holderIdentity"), freed
