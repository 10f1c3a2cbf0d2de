"""Device environment throughput through the real adb server, against plain adbutils calls.

Everything goes over the wire: `DeviceEnv` -> adbutils -> Debian's adb server (loopback) -> TCP
transport -> the test phone's adbd (`tests/fakes/adbd.py`). A real phone adds its own time
(`uiautomator dump` alone takes 0.5-2 s there), so these numbers are the overhead qpa and adb
put on top of the phone, not a phone's speed.

- baseline: `adbutils.AdbClient.device(serial).shell("input tap X Y")`, the plain library call;
- `AdbPhone.shell`: the same through qpa's client (shell protocol v2 with exit status, never
  starting a server, the server's version asked once instead of per command);
- `DeviceEnv.step`: one gesture plus the observation (foreground app + UI hierarchy, parsed);
- `DeviceEnv.reset` (force-stop, pm clear, seed rows, home) and `verify` (provider queries).

    .venv/bin/python benchmarks/device_throughput.py [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test phone and adb server launcher

import adbutils  # noqa: E402
from fakes.adbd import AdbServer, FakeAdbd  # noqa: E402

from qpa.contract import UIAction  # noqa: E402
from qpa.envs.device import AdbPhone, DeviceEnv, get_device_task  # noqa: E402


def timed(label: str, count: int, fn: Callable[[int], object]) -> float:
    """Run fn(i) count times; print calls/s and latency percentiles; return calls/s."""
    fn(0)  # warm up (connections, feature lists)
    samples = []
    start = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - t0)
    rate = count / (time.perf_counter() - start)
    samples.sort()
    p50 = statistics.median(samples) * 1000
    p95 = samples[int(0.95 * (len(samples) - 1))] * 1000
    print(f"{label:<44} {rate:8.1f}/s   p50 {p50:6.2f} ms   p95 {p95:6.2f} ms")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    n = args.steps
    with AdbServer() as server, FakeAdbd() as adbd:
        server.connect(adbd)
        adb = f"127.0.0.1:{server.port}"
        print(f"adb server 127.0.0.1:{server.port}, phone {adbd.address}, {n} calls each\n")
        plain = adbutils.AdbClient(host="127.0.0.1", port=server.port).device(adbd.address)
        base = timed("baseline: adbutils shell('input tap')", n,
                     lambda i: plain.shell(f"input tap {i % 1000} 100"))  # fmt: skip
        phone = AdbPhone(adbd.address, "127.0.0.1", server.port)
        ours = timed("AdbPhone.shell('input tap') (v2, exit code)", n,
                     lambda i: phone.shell(f"input tap {i % 1000} 100"))  # fmt: skip

        env = DeviceEnv(serial=adbd.address, adb=adb)
        task = get_device_task("device.messages.text_bob_running_late")
        env.reset(task)
        gestures = [UIAction(op="home"), UIAction(op="launch", package="com.qpa.messages")]
        steps = timed("DeviceEnv.step (gesture + observation)", n,
                      lambda i: env.step(gestures[i % 2]))  # fmt: skip
        resets = timed("DeviceEnv.reset (clear + seed + observe)", max(n // 10, 5),
                       lambda i: env.reset(task))  # fmt: skip
        timed("DeviceEnv.verify (2 provider checks)", max(n // 10, 5), lambda i: env.verify())
        env.close()
    print(
        f"\none step = {steps and base / steps:.1f} baseline shell calls of time "
        f"(a step is 2 adb round trips: the gesture, then dumpsys + uiautomator + cat); "
        f"qpa's shell vs adbutils: {ours / base:.2f}x; episode of 10 steps + reset: "
        f"{1000 * (10 / steps + 1 / resets):.0f} ms"
    )


if __name__ == "__main__":
    main()
