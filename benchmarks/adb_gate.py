"""What the DevicePool bridge's adb gate costs: phone shell calls direct vs through the gate.

The real adb server (Debian's, loopback) with the test phone (`tests/fakes/adbd.py`) attached;
`AdbPhone.shell("echo x")` straight to the server, then through `qpa.device.proxy.AdbGate`
from an admitted peer address (127.0.0.2; the allowlist as the bridge keeps it, refreshed at
most every second), and the time a refused peer waits for its connection to be closed.

    .venv/bin/python benchmarks/adb_gate.py [--calls 300]
"""

from __future__ import annotations

import argparse
import logging
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test phone and adb server launcher

from fakes.adbd import AdbServer, FakeAdbd  # noqa: E402

from qpa.device.proxy import AdbGate, AllowedPeers  # noqa: E402
from qpa.envs.device import AdbPhone, AdbServerClient  # noqa: E402

ADMITTED, REFUSED = "127.0.0.2", "127.0.0.3"


def timed(label: str, count: int, fn: Callable[[], object]) -> float:
    fn()  # warm up
    samples = []
    start = time.perf_counter()
    for _ in range(count):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    rate = count / (time.perf_counter() - start)
    p50, p99 = statistics.median(samples), sorted(samples)[int(0.99 * (len(samples) - 1))]
    print(f"{label:34s} {rate:8.1f}/s   p50 {p50 * 1e3:6.2f} ms   p99 {p99 * 1e3:6.2f} ms")
    return rate


def refused_once(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=5, source_address=(REFUSED, 0)) as sock:
        sock.sendall(b"000chost:version")
        try:
            data = sock.recv(64)
        except ConnectionResetError:
            data = b""
    assert data == b"", data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    logging.getLogger("qpa.device.proxy").setLevel(logging.ERROR)  # one line per refusal
    with AdbServer() as server, FakeAdbd() as phone:
        server.connect(phone)
        direct = AdbPhone(phone.address, client=AdbServerClient("127.0.0.1", server.port))
        base = timed("AdbPhone.shell direct", args.calls, lambda: direct.check("echo x"))
        allowed = AllowedPeers(lambda: {ADMITTED})
        with AdbGate(("127.0.0.4", 0), ("127.0.0.1", server.port), allowed) as gate:
            host, port = gate.address
            client = AdbServerClient(host, port, source=ADMITTED)
            gated = AdbPhone(phone.address, client=client)
            through = timed("AdbPhone.shell through the gate", args.calls,
                            lambda: gated.check("echo x"))  # fmt: skip
            timed("refused peer (closed unanswered)", args.calls,
                  lambda: refused_once(gate.address))  # fmt: skip
            print(f"gate overhead: {100 * (1 - through / base):.1f}% of direct calls/s; "
                  f"admitted {gate.admitted}, refused {gate.refused}")  # fmt: skip


if __name__ == "__main__":
    main()
