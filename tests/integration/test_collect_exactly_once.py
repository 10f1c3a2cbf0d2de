"""Exactly-once collection (issue 25): no rerun, retried shard or racing writer lands a
trajectory twice, and verification names duplicates and missing rows.

What is checked, against SeaweedFS where S3 matters: the issue's sequence (an S3 outage that
outlasts the run, a rerun with the spool lost, then the first spool flushed by a later run)
ends with every (task, sample) once, the late spool's parts dropped as already filled; two
collectors racing on one shard with their own spools write every pair once; a `qpa collect`
process SIGKILLed mid-run resumes from its spool and finishes exactly once; a second attempt
gets its own parts; another task list is refused; a planted duplicate and a missing part are
named by `qpa data verify`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from fakes.seaweed import SeaweedS3
from typer.testing import CliRunner

from qpa.api.v1alpha1 import TaskGenerator, TaskSource
from qpa.cli import app
from qpa.contract import Task, Trajectory, write_tasks
from qpa.data.collect import CollectError, CollectProgress, CollectResult, collect, read_collected
from qpa.data.tasks import select_tasks
from qpa.harness.factory import PlannerSpec
from qpa.store import StoreConfig, open_store
from qpa.store.manifest import audit_trajectories, read_manifest, verify_manifest

ORACLE = PlannerSpec("oracle")
TASKS = select_tasks(TaskSource(generator=TaskGenerator(), split="train", limit=12))


def counted(out: str, config: StoreConfig | None = None) -> Counter[tuple[str, int]]:
    return Counter((t.task.id, t.sample) for t in read_collected(out, config))


def exactly_once(out: str, tasks: list[Task], samples: int, config: StoreConfig | None) -> None:
    found = counted(out, config)
    assert found == Counter((t.id, s) for t in tasks for s in range(samples))
    store = open_store(out, config)
    assert verify_manifest(store) == []
    assert read_manifest(store).counts["trajectories"] == len(tasks) * samples


def test_outage_rerun_without_the_spool_then_the_old_spool(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    config = seaweed.store_config()
    out = seaweed.root("issue25")
    old, fresh = tmp_path / "old-spool", tmp_path / "new-spool"

    def outage(progress: CollectProgress, _: Trajectory) -> None:
        if progress.ran == 6:
            seaweed.kill()  # down for longer than the run

    try:
        first = collect(
            TASKS, ORACLE, samples_per_task=2, out=out, store_config=config, spool_dir=old,
            part_size=4, concurrency=2, on_episode=outage, flush_timeout_s=0.5,
        )  # fmt: skip
        assert not first.complete and first.spooled_parts >= 3
    finally:
        seaweed.start()
    # The user reruns elsewhere (a new pod, a new machine): the spool is not there.
    second = collect(
        TASKS, ORACLE, samples_per_task=2, out=out, store_config=config, spool_dir=fresh,
        part_size=4,
    )  # fmt: skip
    assert second.complete and second.ran == 24 - second.skipped and second.ran > 0
    # Later the first spool is flushed too: every part it holds is already filled.
    third = collect(
        TASKS, ORACLE, samples_per_task=2, out=out, store_config=config, spool_dir=old,
        part_size=4,
    )  # fmt: skip
    assert third.complete and third.ran == 0
    assert len(third.superseded) == first.spooled_parts
    exactly_once(out, TASKS, 2, config)


def test_two_collectors_racing_on_one_shard(seaweed: SeaweedS3, tmp_path: Path) -> None:
    config = seaweed.store_config()
    out = seaweed.root("race")
    results: list[CollectResult] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(2)

    def worker(name: str) -> None:
        try:
            gate.wait()
            results.append(
                collect(
                    TASKS,
                    ORACLE,
                    samples_per_task=3,
                    out=out,
                    store_config=config,
                    spool_dir=tmp_path / name,
                    part_size=3,
                    concurrency=2,
                )
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and len(results) == 2 and all(r.complete for r in results)
    assert sum(r.ran for r in results) >= 36  # both ran (much of) the shard
    exactly_once(out, TASKS, 3, config)
    assert len(open_store(out, config).list("parts/")) == 12  # 4 blocks x 3 samples


def test_a_sigkilled_collector_resumes_exactly_once(tmp_path: Path) -> None:
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks(tasks_file, TASKS)
    out = tmp_path / "out"
    command = [
        str(Path(sys.executable).with_name("qpa")), "collect", "--tasks", str(tasks_file),
        "-k", "4", "--out", str(out), "--part-size", "3", "-j", "2",
        "--spool-dir", str(tmp_path / "spool"),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while len(list((out / "parts").glob("*.jsonl"))) < 2 and process.poll() is None:
        assert time.monotonic() < deadline, "no part was written"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # mid-run: parts open in the spool
    process.wait(10)
    assert process.returncode == -signal.SIGKILL
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming" in rerun.stdout
    exactly_once(str(out), TASKS, 4, None)


def test_attempts_layout_and_verification(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    spool = tmp_path / "spool"
    collect(TASKS, ORACLE, samples_per_task=1, out=out, spool_dir=spool, part_size=6)
    again = collect(TASKS, ORACLE, samples_per_task=1, out=out, spool_dir=spool, attempt=1)
    assert again.ran == 12 and {p.key for p in again.parts} == {
        "parts/part-a01-t00000-s0000.jsonl",
        "parts/part-a01-t00001-s0000.jsonl",
    }
    assert Counter(t.metadata["attempt"] for t in read_collected(out)) == {0: 12, 1: 12}
    assert verify_manifest(open_store(out)) == []
    with pytest.raises(CollectError, match="another task list"):
        collect(TASKS[:5], ORACLE, out=out, spool_dir=spool)
    with pytest.raises(CollectError, match="attempt"):
        collect(TASKS, ORACLE, out=out, spool_dir=spool, attempt=-1)
    # A duplicate planted by hand, and a part removed: both named.
    root = tmp_path / "out" / "parts"
    first, second = sorted(root.glob("part-a01-*.jsonl"))
    (root / "part-copy.jsonl").write_bytes(first.read_bytes())
    second.unlink()
    runner = CliRunner()
    answer = runner.invoke(app, ["data", "verify", out])
    assert answer.exit_code == 1
    text = answer.output.replace("\n", " ")
    assert "appears 2 times" in text and "part-copy.jsonl" in text
    assert "missing" in text
    audit = audit_trajectories(open_store(out))
    assert audit.duplicates == 6 and audit.lost == 6
