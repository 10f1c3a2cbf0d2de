"""Operator scale: 500 TaskBatches from creation to Running, and API traffic at rest.

Run: `.venv/bin/python benchmarks/operator_scale.py [--objects 500] [--quiet-seconds 60]`
(about two minutes; prints a table and one JSON line, asserts nothing).

Everything runs in this one process on this machine, as the operator tests do: the test API
server (tests/fakes/kube_api.py: kmock taught what a real API server does, with qpa's CRDs) in
one thread, the real operator (`kopf run -A --standalone -m qpa_operator.main`, production
settings) in a `kopf.testing.KopfRunner` thread, and a stand-in for kube-controller-manager's
Job controller in the main thread: it marks each new collector Job started (`startTime`,
`active`), as the real one does within moments of the Job's creation.

Measured:

- wall time from the first TaskBatch created to all of them `Running` (objects are created
  in-process, without HTTP, as fast as the server takes them), and per-object latency
  (creation -> Running, seen by polling every 50 ms) p50/p95/max;
- the operator's API requests over that time, by client (kopf's own: watches, annotations,
  Events; qpa's client: children, statuses) and by verb/resource, and per object;
- requests per minute at rest: nothing changes for `--quiet-seconds`; with watches only (and
  the server's bookmarks keeping them alive) the operator should send nothing;
- a restart with every object converged: requests until the operator is quiet again.

The server runs in the same interpreter (one GIL for server, operator and the simulated Job
controller on 2 cores), so the wall times are an upper bound for the operator's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test API server lives in tests/fakes

import yaml  # noqa: E402
from fakes.kube_api import KubeAPIServer, parse_path  # noqa: E402
from kopf.testing import KopfRunner  # noqa: E402

OPERATOR = ["run", "-A", "--standalone", "-m", "qpa_operator.main"]
NS = "default"


def taskbatch(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "taskbatch.yaml").read_text())]
    body = copy.deepcopy(docs[0])
    body["metadata"] = {"name": name, "namespace": NS, "labels": {"bench": "operator-scale"}}
    return body


def point_clients_at(server: KubeAPIServer, folder: Path) -> None:
    path = server.write_kubeconfig(folder / "kubeconfig")
    os.environ["KUBECONFIG"] = str(path)
    import kubernetes.config.kube_config as kube_config

    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)  # read once, at import


LOGS: list[str] = []


@contextlib.contextmanager
def operator() -> Iterator[KopfRunner]:
    with KopfRunner(OPERATOR, timeout=600) as runner:
        yield runner
    LOGS.append(runner.output)
    if runner.exception is not None:
        raise RuntimeError(runner.output[-3000:]) from runner.exception


def operator_metrics() -> dict[str, float]:
    """The operator's own counters (it runs in this process): reconciles, children, writes."""
    from prometheus_client import REGISTRY

    wanted = (
        "qpa_operator_reconciles_total",
        "qpa_operator_children_total",
        "qpa_operator_status_writes_total",
        "qpa_operator_status_conflicts_total",
        "qpa_operator_reconcile_errors_total",
    )
    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in wanted and sample.value:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def log_problems(output: str) -> dict[str, int]:
    """The operator's WARNING/ERROR log lines, counted by message (object names removed)."""
    found: collections.Counter[str] = collections.Counter()
    for line in output.splitlines():
        if "[WARNING" not in line and "[ERROR" not in line:
            continue
        message = re.sub(r"\[[\w./-]+/[\w.-]+\]", "[obj]", line.split("] ", 2)[-1])
        message = re.sub(r"scale-\d+\S*", "scale-N", message)
        found[message[:160]] += 1
    return dict(found.most_common(12))


def classify(log: list[tuple[str, str, str, bool]]) -> dict[str, Any]:
    """Requests by client (kopf / qpa's client) and by `client VERB resource[/sub]`."""
    by_client: collections.Counter[str] = collections.Counter()
    by_verb: collections.Counter[str] = collections.Counter()
    for method, path, agent, watch in log:
        client = "kopf" if agent.startswith("kopf") else "qpa" if "qpa-operator" in agent else agent
        parsed = parse_path(path)
        if parsed is None or parsed.plural is None:
            resource, verb = "discovery", method
        else:
            resource = parsed.plural + (f"/{parsed.subresource}" if parsed.subresource else "")
            verb = "WATCH" if watch else "LIST" if method == "GET" and not parsed.name else method
        by_client[client] += 1
        by_verb[f"{client} {verb} {resource}"] += 1
    return {"total": len(log), "by_client": dict(by_client), "by_verb": dict(by_verb)}


async def until(check: Any, timeout: float, interval: float = 0.05) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"not done within {timeout} s")
        await asyncio.sleep(interval)
    return time.perf_counter() - start


async def measure(objects: int, quiet_seconds: float, timeout: float) -> dict[str, Any]:
    results: dict[str, Any] = {"objects": objects}
    with tempfile.TemporaryDirectory() as folder, KubeAPIServer() as server:
        point_clients_at(server, Path(folder))
        kube = server.kube
        with operator():
            await until(lambda: server.request_count() > 10, timeout=60)
            await asyncio.sleep(2.0)  # watches open, indexes listed
            mark = server.request_count()

            names = [f"scale-{i:04d}" for i in range(objects)]
            created: dict[str, float] = {}
            running: dict[str, float] = {}
            start = time.perf_counter()
            for name in names:
                server.create(taskbatch(name))
                created[name] = time.perf_counter()
            create_s = time.perf_counter() - start

            def controller_and_progress() -> bool:
                def step() -> None:
                    for job in kube.list_objects("jobs", NS, "qpa.ai/taskbatch"):
                        if not (job.get("status") or {}).get("startTime"):
                            kube.patch_status(
                                "jobs",
                                NS,
                                job["metadata"]["name"],
                                {"startTime": "2026-01-01T00:00:00Z", "active": 16, "ready": 16},
                            )
                    now = time.perf_counter()
                    for tb in kube.list_objects("taskbatches", NS):
                        name = tb["metadata"]["name"]
                        if (tb.get("status") or {}).get("phase") == "Running":
                            running.setdefault(name, now)

                server.call(step)
                return len(running) == objects

            await until(controller_and_progress, timeout=timeout)
            total_s = time.perf_counter() - start
            log = server.request_log(mark)
            results["operator_metrics"] = operator_metrics()
            latencies = sorted(running[n] - created[n] for n in names)
            results["to_running"] = {
                "wall_s": round(total_s, 2),
                "create_s": round(create_s, 2),
                "objects_per_s": round(objects / total_s, 1),
                "latency_p50_s": round(statistics.median(latencies), 2),
                "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 2),
                "latency_max_s": round(latencies[-1], 2),
                "requests": classify(log),
                "requests_per_object": round(len(log) / objects, 2),
            }

            # At rest: let the last events and Event posts drain, then count.
            await asyncio.sleep(5.0)
            mark = server.request_count()
            await asyncio.sleep(quiet_seconds)
            quiet = server.request_log(mark)
            results["at_rest"] = {
                "seconds": quiet_seconds,
                "requests": classify(quiet),
                "requests_per_minute": round(len(quiet) * 60.0 / quiet_seconds, 2),
            }

        # A restart with everything converged.
        mark = server.request_count()
        start = time.perf_counter()
        with operator():
            await asyncio.sleep(10.0)
        restart = server.request_log(mark)
        writes = [r for r in restart if r[0] in ("POST", "PUT", "PATCH", "DELETE")]
        results["restart"] = {
            "seconds": round(time.perf_counter() - start, 1),
            "requests": classify(restart),
            "writes": len(writes),
        }
        results["operator_log_problems"] = log_problems("\n".join(LOGS))
        problems = [e for e in server.errors if type(e).__name__ != "KubernetesError"]
        results["server_errors"] = [repr(e) for e in problems[:5]]
    return results


def report(results: dict[str, Any]) -> None:
    run = results["to_running"]
    print(f"\n{results['objects']} TaskBatches -> Running (test API server, one process)")
    print(f"  wall time            {run['wall_s']:>8} s   ({run['objects_per_s']} objects/s)")
    print(f"  creating them        {run['create_s']:>8} s")
    print(
        f"  latency p50/p95/max  {run['latency_p50_s']} / {run['latency_p95_s']} / "
        f"{run['latency_max_s']} s"
    )
    print(
        f"  API requests         {run['requests']['total']:>8}   "
        f"({run['requests_per_object']} per object) {run['requests']['by_client']}"
    )
    for key, count in sorted(run["requests"]["by_verb"].items(), key=lambda kv: -kv[1]):
        print(f"    {count:>6}  {key}")
    print("  operator counters:")
    for key, value in sorted(results["operator_metrics"].items()):
        print(f"    {value:>6.0f}  {key}")
    rest = results["at_rest"]
    print(f"\nAt rest for {rest['seconds']} s: {rest['requests_per_minute']} requests/minute")
    for key, count in sorted(rest["requests"]["by_verb"].items(), key=lambda kv: -kv[1]):
        print(f"    {count:>6}  {key}")
    restart = results["restart"]
    print(
        f"\nRestart with {results['objects']} converged objects: "
        f"{restart['requests']['total']} requests in {restart['seconds']} s, "
        f"{restart['writes']} writes"
    )
    for key, count in sorted(restart["requests"]["by_verb"].items(), key=lambda kv: -kv[1]):
        print(f"    {count:>6}  {key}")
    if results["operator_log_problems"]:
        print("\noperator warnings/errors (count, message):")
        for message, count in results["operator_log_problems"].items():
            print(f"    {count:>6}  {message}")
    if results["server_errors"]:
        print(f"\nserver errors: {results['server_errors']}")
    print("\n" + json.dumps(results, sort_keys=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--quiet-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    os.environ.setdefault("QPA_OPERATOR_RETRY_SCALE", "1.0")
    report(asyncio.run(measure(args.objects, args.quiet_seconds, args.timeout)))


if __name__ == "__main__":
    main()
