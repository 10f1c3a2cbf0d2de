"""The bridge's adb gate in front of the real adb server: the pool's env pods get through,
any other peer is closed before a byte reaches adb.

Loopback stands in for the pod network: every 127.x.y.z address is local on Linux, so a client
bound to 127.0.0.2 is "the env pod at 127.0.0.2" and one bound to 127.0.0.3 is a stranger.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fakes.adbd import AdbServer, FakeAdbd

from qpa.device.proxy import AdbGate, AllowedPeers, client_selector, pod_addresses
from qpa.envs.device import AdbPhone, AdbServerClient, DeviceError

pytestmark = pytest.mark.timeout(60)
ENV_POD, STRANGER, GATE = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def pod(ip: str, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{ip}", **meta},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}}  # fmt: skip


@pytest.fixture
def gate(adb_server: AdbServer) -> Iterator[AdbGate]:
    allowed = AllowedPeers(lambda: pod_addresses([pod(ENV_POD)]))
    with AdbGate((GATE, 0), ("127.0.0.1", adb_server.port), allowed) as running:
        yield running


def adb_request(gate: AdbGate, source: str, service: bytes = b"host:version") -> bytes:
    """One raw smart-socket request through the gate from `source`; what came back."""
    with socket.create_connection(gate.address, timeout=5, source_address=(source, 0)) as sock:
        sock.sendall(b"%04x%s" % (len(service), service))
        chunks: list[bytes] = []
        with contextlib.suppress(ConnectionResetError):  # refused: closed with the request unread
            while data := sock.recv(4096):
                chunks.append(data)
                if len(b"".join(chunks)) >= 12:
                    break
        return b"".join(chunks)


def test_the_pools_env_pod_reaches_adb_and_a_stranger_is_refused(gate: AdbGate) -> None:
    answer = adb_request(gate, ENV_POD)
    assert answer.startswith(b"OKAY") and len(answer) >= 12  # OKAY + hex length + version
    assert adb_request(gate, STRANGER) == b""  # closed, nothing from adb
    assert (gate.admitted, gate.refused) == (1, 1)


def test_a_phone_shell_works_through_the_gate_only_from_the_env_pod(
    gate: AdbGate, adb_server: AdbServer, adbd: FakeAdbd
) -> None:
    adb_server.connect(adbd)
    host, port = gate.address
    allowed = AdbServerClient(host, port, source=ENV_POD)
    assert allowed.states() == {adbd.address: "device"}
    phone = AdbPhone(adbd.address, client=allowed, timeout=10)
    assert phone.check("echo through-the-gate").strip() == "through-the-gate"
    with pytest.raises(DeviceError) as refused:
        AdbServerClient(host, port, source=STRANGER).states()
    assert refused.value.gone


def test_the_source_address_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPA_ADB_SOURCE_ADDRESS", ENV_POD)
    assert AdbServerClient("10.0.0.9", 5037).source == ENV_POD
    monkeypatch.delenv("QPA_ADB_SOURCE_ADDRESS")
    assert AdbServerClient("10.0.0.9", 5037).source is None


def test_only_running_pods_addresses_are_allowed() -> None:
    pods = [
        pod("10.0.0.1"),
        pod("10.0.0.2", phase="Pending"),
        pod("10.0.0.3", phase="Succeeded"),
        pod("10.0.0.4", deletionTimestamp="2026-01-01T00:00:00Z"),
        {"metadata": {}, "status": {"phase": "Running", "podIPs": [{"ip": "fd00::5"}]}},
    ]
    assert pod_addresses(pods) == {"10.0.0.1", "fd00::5"}
    assert client_selector("lab") == "qpa.ai/devicepool-client=lab"


def test_the_allowlist_refreshes_for_a_new_pod_and_forgets_a_gone_one() -> None:
    clock = [0.0]
    current = {"10.0.0.1"}
    calls: list[float] = []

    def fetch() -> set[str]:
        calls.append(clock[0])
        return set(current)

    allowed = AllowedPeers(fetch, min_refresh_s=1.0, max_age_s=10.0, monotonic=lambda: clock[0])
    assert allowed.allows("10.0.0.1") and allowed.allows("::ffff:10.0.0.1")
    assert not allowed.allows("10.0.0.2") and len(calls) == 1  # refreshed a moment ago
    current.add("10.0.0.2")
    clock[0] = 1.5
    assert allowed.allows("10.0.0.2") and len(calls) == 2  # an unknown peer refreshes
    current.discard("10.0.0.1")
    clock[0] = 5.0
    assert allowed.allows("10.0.0.1")  # known and fresh enough: no listing per connection
    clock[0] = 11.6
    assert not allowed.allows("10.0.0.1")  # the list aged out: the gone pod is refused


def test_a_failed_listing_admits_nobody_new() -> None:
    state = {"fail": False}

    def fetch() -> set[str]:
        if state["fail"]:
            raise OSError("API server away")
        return {"10.0.0.1"}

    clock = [0.0]
    allowed = AllowedPeers(fetch, min_refresh_s=0.0, max_age_s=10.0, monotonic=lambda: clock[0])
    assert allowed.allows("10.0.0.1")
    state["fail"] = True
    clock[0] = 20.0
    assert allowed.allows("10.0.0.1") and not allowed.allows("10.0.0.9")
