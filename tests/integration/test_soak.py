"""The reduced soak (`benchmarks/soak.py --quick`): the full soak's code path, about a minute.

What is checked: 240 trajectories collected by two supervised `qpa collect` processes through
two `qpa env serve` servers into SeaweedFS, while the fault loop SIGKILLs the S3 server, an
environment server and a collector (each at least once) and starts a twin collector on a
running shard, end with every (task, sample) written exactly once: nothing duplicated,
nothing lost, and manifest verification (hashes and identities) finds no problem.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fakes.seaweed import find_weed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from soak import QUICK, run_soak


@pytest.mark.skipif(find_weed() is None, reason="SeaweedFS `weed` not installed")
def test_quick_soak_collects_exactly_once_through_kills(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_soak(QUICK, keep=tmp_path, log=lines.append)
    assert not report.timed_out, lines
    assert report.expected == 240
    assert (report.written, report.distinct, report.duplicated, report.lost) == (240, 240, 0, 0)
    assert report.verify_problems == []
    assert all(report.faults.get(kind, 0) >= 1 for kind in ("s3", "env", "collector")), lines
    assert report.collector_runs > QUICK.shards  # a killed collector was started again
    assert report.exactly_once
