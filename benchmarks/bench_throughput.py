"""Benchmark throughput: `qpa bench run` with the oracle over the whole test split.

Run: `.venv/bin/python benchmarks/bench_throughput.py [--no-remote] [--limit N]` (well under
two minutes; prints a table, asserts nothing). Measured in this one run on this machine:

- tasks/s (episodes/s, k=1) of the runner with the oracle at concurrency 1 and 8, on in-process
  sandboxes: every episode run, serialized, appended and flushed to trajectories.jsonl;
- the same against an environment server (`qpa env serve`, started here as a subprocess on a
  free loopback port), where episodes wait on I/O and the worker threads overlap;
- resume: a rerun on a finished folder (reads and validates every line, runs nothing);
- report writing: scoring (incl. 5 bootstrap intervals of 1000 resamples), report.json,
  report.md and the two PNG plots, timed apart and together (`finish`).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from qpa.bench.report import plot_capabilities, plot_success_vs_tokens, render_markdown
from qpa.bench.run import BenchRun, finish, run_bench, select_tasks
from qpa.bench.scoring import score
from qpa.contract import Task
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.factory import PlannerSpec


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def env_server() -> Iterator[str]:
    qpa = Path(sys.executable).with_name("qpa")
    port = free_port()
    process = subprocess.Popen(
        [str(qpa), "env", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"qpa env serve exited with {process.returncode}")
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("qpa env serve did not come up") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def timed_run(
    tasks: list[Task], root: Path, name: str, concurrency: int, urls: list[str] | None = None
) -> tuple[BenchRun, float, float]:
    out = root / name
    start = time.perf_counter()
    run = run_bench(tasks, PlannerSpec("oracle"), out, concurrency=concurrency, env_urls=urls or [])
    elapsed = time.perf_counter() - start
    assert run.ran == len(tasks) and all(r.success for r in run.records), "oracle must pass"
    return run, len(tasks) / elapsed, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-remote", action="store_true", help="skip the env-server runs")
    parser.add_argument("--limit", type=int, default=None, help="fewer test tasks")
    args = parser.parse_args()

    t0 = time.perf_counter()
    tasks = select_tasks(generate_suite(), split="test", limit=args.limit)
    suite_s = time.perf_counter() - t0
    rows: list[tuple[str, str]] = [
        ("test tasks (k=1)", f"{len(tasks)}"),
        ("suite generation (once)", f"{suite_s:.2f} s"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        timed_run(tasks[:50], root, "warmup", 1)  # imports, caches
        run1, rate1, _ = timed_run(tasks, root, "local-c1", 1)
        _, rate8, _ = timed_run(tasks, root, "local-c8", 8)
        rows += [
            ("oracle, in-process, concurrency 1", f"{rate1:,.0f} tasks/s"),
            ("oracle, in-process, concurrency 8", f"{rate8:,.0f} tasks/s"),
        ]
        if not args.no_remote:
            with env_server() as url:
                timed_run(tasks[:20], root, "remote-warmup", 1, [url])
                _, remote1, _ = timed_run(tasks, root, "remote-c1", 1, [url])
                _, remote8, _ = timed_run(tasks, root, "remote-c8", 8, [url])
            rows += [
                ("oracle, env server, concurrency 1", f"{remote1:,.0f} tasks/s"),
                ("oracle, env server, concurrency 8", f"{remote8:,.0f} tasks/s"),
            ]

        start = time.perf_counter()
        resumed = run_bench(tasks, PlannerSpec("oracle"), root / "local-c1")
        resume_s = time.perf_counter() - start
        assert resumed.ran == 0 and len(resumed.records) == len(tasks)
        rows.append(("resume a finished folder (scan, run nothing)", f"{resume_s:.2f} s"))

        out = root / "local-c1"
        start = time.perf_counter()
        report = score(run1.records, samples=1, expected_tasks=run1.task_ids)
        score_s = time.perf_counter() - start
        start = time.perf_counter()
        (out / "r.json").write_text(report.model_dump_json(indent=2))
        (out / "r.md").write_text(render_markdown(report, plots=["a.png", "b.png"]))
        text_s = time.perf_counter() - start
        start = time.perf_counter()
        plot_capabilities(report, out / "a.png")
        plot_success_vs_tokens(report, out / "b.png")
        plots_s = time.perf_counter() - start
        start = time.perf_counter()
        finish(run1)
        finish_s = time.perf_counter() - start
        rows += [
            ("report: scoring + bootstrap CIs", f"{1000 * score_s:.0f} ms"),
            ("report: report.json + report.md", f"{1000 * text_s:.0f} ms"),
            (
                "report: 2 PNG plots (first use, incl. matplotlib import)",
                f"{1000 * plots_s:.0f} ms",
            ),
            ("report: all of it again (finish)", f"{1000 * finish_s:.0f} ms"),
        ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:>14}")


if __name__ == "__main__":
    main()
