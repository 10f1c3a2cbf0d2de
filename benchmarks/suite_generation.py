"""Suite generation and oracle throughput for `mobilepa`.

Prints, in one run: the time to generate the whole suite from its templates (aim <= 30 s),
against reading the same suite back from a JSON Lines file (the baseline a pre-built suite
file would give); and oracle throughput over the test split in tasks/s, in-process.

    .venv/bin/python benchmarks/suite_generation.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from qpa.contract import read_tasks, write_tasks
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import all_templates, generate_suite
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode


def main() -> None:
    t0 = time.perf_counter()
    all_templates()  # imports of app and template modules, counted separately
    imports_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tasks = generate_suite()
    generate_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "suite.jsonl"
        write_tasks(path, tasks)
        t0 = time.perf_counter()
        loaded = sum(1 for _ in read_tasks(path))
        load_s = time.perf_counter() - t0
        size_mb = path.stat().st_size / 1e6

    test = [t for t in tasks if t.split == "test"]
    env = SandboxEnv()
    t0 = time.perf_counter()
    solved = sum(run_episode(env, t, OraclePlanner()).success for t in test)
    oracle_s = time.perf_counter() - t0

    print(f"suite: {len(tasks)} tasks ({len(test)} test), {len(all_templates())} templates")
    print(f"{'import apps + templates':38}{imports_s:>9.2f} s")
    print(f"{'generate whole suite (aim <= 30 s)':38}{generate_s:>9.2f} s")
    print(
        f"{'baseline: read it from JSONL':38}{load_s:>9.2f} s  ({loaded} tasks, {size_mb:.1f} MB)"
    )
    print(f"{'oracle over test split':38}{len(test) / oracle_s:>9.0f} tasks/s  ({solved} solved)")


if __name__ == "__main__":
    main()
