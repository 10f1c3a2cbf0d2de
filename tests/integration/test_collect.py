"""`qpa collect` end to end: local and remote environments, file and S3 stores, faults.

What is checked: k samples of every task land in parts with a manifest whose hashes verify;
through environment servers the result equals the local one; n shards cover every
(task, sample) exactly once and the last one writes the merged manifest; a crash that tore the
spool's last line resumes without loss or duplicates; corrupt lines and missing objects are
reported by URI and line; and an S3 outage in the middle of a collection (SeaweedFS killed and
restarted) loses and duplicates nothing, also when it outlasts the run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.seaweed import SeaweedS3
from helpers.uvicorn_thread import serve
from typer.testing import CliRunner

from qpa.api.v1alpha1 import Resolved, TaskBatch, TaskGenerator, TaskSource, dump_work_order
from qpa.api.v1alpha1.taskbatch import CollectSummary
from qpa.cli import app
from qpa.contract import CorruptLineError, Task, Trajectory, write_tasks
from qpa.data.collect import (
    CollectError,
    CollectProgress,
    CollectResult,
    collect,
    parse_shard,
    read_collected,
    shard_from_env,
)
from qpa.data.tasks import load_tasks, select_tasks
from qpa.envs.server import create_app
from qpa.harness.factory import PlannerSpec
from qpa.store import ArtifactNotFound, StoreConfig, open_store
from qpa.store.manifest import read_manifest, verify_manifest

ORACLE = PlannerSpec("oracle")


def suite_tasks(limit: int) -> list[Task]:
    """The first `limit` training tasks of the canonical suite, as `qpa collect --limit` picks."""
    return select_tasks(TaskSource(generator=TaskGenerator(), split="train", limit=limit))


TASKS = suite_tasks(12)


@contextlib.contextmanager
def serving(**options: Any) -> Iterator[str]:
    """An environment server in a background thread on a free loopback port; yields its URL."""
    with serve(create_app("sandbox", **options)) as url:
        yield url


def pairs(trajectories: list[Trajectory]) -> Counter[tuple[str, int]]:
    return Counter((t.task.id, t.sample) for t in trajectories)


def expected(tasks: list[Task], samples: int) -> Counter[tuple[str, int]]:
    return Counter((t.id, s) for t in tasks for s in range(samples))


def check_dataset(out: str, tasks: list[Task], samples: int, config: Any = None) -> None:
    """Everything collected exactly once, and the manifest describes exactly that."""
    collected = read_collected(out, config)
    assert pairs(collected) == expected(tasks, samples)
    store = open_store(out, config)
    manifest = read_manifest(store)
    assert manifest.kind == "trajectories" and verify_manifest(store) == []
    assert sorted(f.key for f in manifest.files) == store.list("parts/")
    assert manifest.counts["trajectories"] == manifest.rows == len(tasks) * samples
    assert manifest.counts["groups"] == len(tasks)
    assert manifest.lineage.task_count == len(tasks)
    assert manifest.lineage.policy["planner"] == "oracle"
    for trajectory in collected:
        assert trajectory.metadata["group"] == trajectory.task.id


def test_local_collection_groups_parts_manifest_and_resume(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    seen: list[CollectProgress] = []
    result = collect(
        TASKS, ORACLE, samples_per_task=3, out=out, concurrency=4, spool_dir=tmp_path / "spool",
        part_size=5, on_episode=lambda progress, _: seen.append(progress),
    )  # fmt: skip
    assert result.complete and result.ran == 36 == result.total and result.successes == 36
    # Sample s of 5 consecutive tasks per part: tasks 0-4, 5-9, 10-11 x 3 samples.
    assert [p.rows for p in result.parts] == [5] * 6 + [2] * 3
    assert result.parts[0].key == "parts/part-a00-t00000-s0000.jsonl"
    assert seen[-1].done == 36 and result.manifest_uri == (tmp_path / "out/manifest.json").as_uri()
    check_dataset(out, TASKS, 3)
    assert {t.metadata["shard"] for t in read_collected(out)} == {"0/1"}
    again = collect(TASKS, ORACLE, samples_per_task=3, out=out, spool_dir=tmp_path / "spool")
    assert again.ran == 0 and again.skipped == 36 and again.complete
    more = collect(TASKS, ORACLE, samples_per_task=4, out=out, spool_dir=tmp_path / "spool")
    assert more.ran == 12  # only the new sample of each task
    check_dataset(out, TASKS, 4)
    with pytest.raises(CollectError, match="another policy"):
        collect(
            TASKS, PlannerSpec("noop"), samples_per_task=1, out=out, spool_dir=tmp_path / "spool"
        )


def test_collection_through_environment_servers_matches_local(tmp_path: Path) -> None:
    local = collect(
        TASKS, ORACLE, samples_per_task=2, out=str(tmp_path / "local"), spool_dir=tmp_path
    )
    with serving(max_sessions=32) as first, serving(max_sessions=32) as second:
        remote = collect(
            TASKS, ORACLE, samples_per_task=2, out=str(tmp_path / "remote"),
            env_url=f"{first},{second}", concurrency=8, spool_dir=tmp_path,
        )  # fmt: skip
    assert remote.complete and remote.successes == local.successes == 24
    check_dataset(str(tmp_path / "remote"), TASKS, 2)
    manifest = read_manifest(open_store(tmp_path / "remote"))
    assert manifest.lineage.params["env"]["urls"] == [first, second]
    with pytest.raises(CollectError, match="not answering"):
        collect(TASKS, ORACLE, out=str(tmp_path / "x"), env_url=first, spool_dir=tmp_path)


def test_shards_cover_every_pair_exactly_once(seaweed: SeaweedS3, tmp_path: Path) -> None:
    config = seaweed.store_config()
    out = seaweed.root("shards")
    results: list[CollectResult] = []
    for index in range(3):
        results.append(
            collect(
                TASKS, ORACLE, samples_per_task=2, out=out, shard=(index, 3), store_config=config,
                spool_dir=tmp_path / "spool", part_size=3, concurrency=2,
            )
        )  # fmt: skip
    # 4 blocks of 3 tasks x 2 samples = 8 parts, part q = block * 2 + sample to shard q % 3
    assert [r.total for r in results] == [9, 9, 6]
    assert [r.manifest_uri is not None for r in results] == [False, False, True]
    check_dataset(out, TASKS, 2, config)
    shard_of = {(t.task.id, t.sample): t.metadata["shard"] for t in read_collected(out, config)}
    for position, task in enumerate(TASKS):
        for sample in range(2):
            assert shard_of[(task.id, sample)] == f"{((position // 3) * 2 + sample) % 3}/3"
    assert parse_shard("2/3") == (2, 3)
    assert shard_from_env(None, {"JOB_COMPLETION_INDEX": "4", "QPA_SHARD_COUNT": "5"}) == (4, 5)
    for bad in ("3/3", "x", "1/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


class _Crash(Exception):
    pass


def test_resume_after_a_crash_that_tore_the_spool(tmp_path: Path) -> None:
    out, spool = str(tmp_path / "out"), tmp_path / "spool"

    def crash_after_7(progress: CollectProgress, _: Trajectory) -> None:
        if progress.ran == 7:
            raise _Crash

    with pytest.raises(_Crash):
        collect(
            TASKS, ORACLE, samples_per_task=2, out=out, spool_dir=spool, part_size=100,
            concurrency=2, on_episode=crash_after_7,
        )  # fmt: skip
    # The process died mid-write: its part (sample 0 of the 12 tasks) is still open, 7 records
    # in it, and its last line cut short.
    (torn,) = spool.glob("*/open/*.jsonl")
    assert not list(spool.glob("*/ready/*.jsonl"))
    torn.write_bytes(torn.read_bytes() + b'{"id": "cut-short", "task": {"id')
    result = collect(TASKS, ORACLE, samples_per_task=2, out=out, spool_dir=spool, part_size=100)
    assert result.repaired and "cut short" in result.repaired[0]
    assert result.skipped == 7 and result.ran == 17 and result.complete
    check_dataset(out, TASKS, 2)


def test_corrupt_lines_and_missing_objects_are_reported(tmp_path: Path) -> None:
    tasks_file = tmp_path / "tasks.jsonl"
    write_tasks(tasks_file, TASKS[:3])
    assert [t.id for t in load_tasks(tasks_file)] == [t.id for t in TASKS[:3]]
    with open(tasks_file, "a") as stream:
        stream.write('{"id": "broken", "domain": 3}\n')
    with pytest.raises(CorruptLineError, match=r"tasks\.jsonl:4: corrupt line"):
        collect(tasks_file, ORACLE, out=str(tmp_path / "out"), spool_dir=tmp_path)
    with pytest.raises(ArtifactNotFound, match="nothing-here"):
        load_tasks(tmp_path / "nothing-here.jsonl")
    out = tmp_path / "out"
    collect(TASKS[:2], ORACLE, out=str(out), spool_dir=tmp_path)
    (part,) = sorted((out / "parts").glob("*.jsonl"))
    lines = part.read_bytes().splitlines()
    part.write_bytes(lines[0] + b"\n{not json\n")
    with pytest.raises(CorruptLineError, match=rf"{part.name}:2"):
        collect(TASKS[:2], ORACLE, out=str(out), spool_dir=tmp_path)
    runner = CliRunner()
    answer = runner.invoke(app, ["collect", "--tasks", str(tmp_path / "missing.jsonl"),
                                 "--out", str(tmp_path / "o2")])  # fmt: skip
    assert answer.exit_code == 2 and "missing.jsonl" in answer.output.replace("\n", "")


def test_cli_collect_with_shard_from_env_and_verify(tmp_path: Path) -> None:
    runner = CliRunner()
    out = str(tmp_path / "out")
    base = ["collect", "--limit", "6", "-k", "2", "--out", out, "--spool-dir", str(tmp_path)]
    for index in ("0", "1"):
        answer = runner.invoke(
            app, [*base, "--shard-from-env", "--shards", "2", "--json"],
            env={"JOB_COMPLETION_INDEX": index},
        )  # fmt: skip
        assert answer.exit_code == 0, answer.output
    summary = json.loads(answer.stdout[answer.stdout.index("{") :])
    assert summary["shard"] == "1/2" and summary["complete"] and summary["manifest"]
    check_dataset(out, suite_tasks(6), 2)
    verified = runner.invoke(app, ["data", "verify", out])
    assert verified.exit_code == 0 and "12 rows" in verified.output
    shown = runner.invoke(app, ["data", "manifest", out, "--json"])
    assert json.loads(shown.stdout)["counts"]["trajectories"] == 12
    bad = runner.invoke(app, [*base, "--shard", "2/2"])
    assert (bad.exit_code == 2 and "i/n" in bad.output) or "shard" in bad.output


def test_s3_outage_mid_collection_loses_and_duplicates_nothing(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    config = seaweed.store_config()
    out = seaweed.root("outage")
    peak = {"spooled": 0}

    def outage(progress: CollectProgress, _: Trajectory) -> None:
        peak["spooled"] = max(peak["spooled"], progress.spooled_parts)
        if progress.ran == 6:
            seaweed.kill()  # S3 is gone: parts pile up in the spool
        elif progress.ran == 18:
            time.sleep(0.5)  # let the uploader fail a few times first
            seaweed.start()

    try:
        result = collect(
            TASKS, ORACLE, samples_per_task=2, out=out, store_config=config, spool_dir=tmp_path,
            part_size=2, concurrency=2, on_episode=outage,
        )  # fmt: skip
    finally:
        seaweed.start()
    assert peak["spooled"] >= 3  # parts waited in the spool during the outage
    assert result.complete and result.ran == 24 and result.spooled_parts == 0
    assert sum(p.rows or 0 for p in result.parts) == 24
    check_dataset(out, TASKS, 2, config)


def test_s3_outage_outlasting_the_run_uploads_on_the_next_run(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    config: StoreConfig = seaweed.store_config()
    out = seaweed.root("long-outage")

    def outage(progress: CollectProgress, _: Trajectory) -> None:
        if progress.ran == 4:
            seaweed.kill()

    try:
        first = collect(
            TASKS, ORACLE, samples_per_task=2, out=out, store_config=config, spool_dir=tmp_path,
            part_size=4, concurrency=2, on_episode=outage, flush_timeout_s=0.5,
        )  # fmt: skip
        assert not first.complete and first.spooled_parts >= 4 and first.ran == 24
        assert first.manifest_uri is None and first.error
    finally:
        seaweed.start()
    second = collect(
        TASKS,
        ORACLE,
        samples_per_task=2,
        out=out,
        store_config=config,
        spool_dir=tmp_path,
        part_size=4,
    )
    assert second.ran == 0 and second.skipped == 24 and second.complete
    check_dataset(out, TASKS, 2, config)
    assert not list(second.spool_dir.glob("ready/*.jsonl"))
    shutil.rmtree(second.spool_dir)


def test_cli_collect_to_s3_with_credentials_from_the_environment(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    out = seaweed.root("cli")
    args = ["collect", "--limit", "4", "-k", "2", "--out", out, "--spool-dir", str(tmp_path)]
    answer = CliRunner().invoke(app, args)
    assert answer.exit_code == 0, answer.output
    check_dataset(out, suite_tasks(4), 2)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    denied = CliRunner().invoke(app, args)
    assert denied.exit_code == 2 and "access denied" in denied.output.replace("\n", " ")


def test_cli_collect_spec_runs_a_taskbatch_work_order(seaweed: SeaweedS3, tmp_path: Path) -> None:
    """`qpa collect --spec`: the TaskBatch's harness version is in every trajectory's policy,
    its capabilities select the tasks, and stdout is the typed `CollectSummary`. The output is
    in the object store (a TaskBatch takes s3:// outputs only)."""
    out = seaweed.root("spec-batch") + "/"
    store = {"endpoint": seaweed.endpoint, "secretRef": {"name": "seaweed"}}
    batch = TaskBatch.model_validate(
        {
            "metadata": {"name": "spec-batch", "namespace": "team-a"},
            "spec": {
                "source": {
                    "generator": {"seed": 0},
                    "split": "train",
                    "capabilities": ["memory"],
                    "limit": 3,
                },
                "policy": {"planner": "oracle", "harness": {"version": "harness-v7"}},
                "samplesPerTask": 2,
                "parallelism": 1,
                "maxTurns": 30,
                "outputUri": out,
                "store": store,
            },
        }
    )
    order = tmp_path / "workorder.yaml"
    order.write_text(dump_work_order(batch, Resolved(namespace="team-a", store=batch.spec.store)))
    answer = CliRunner().invoke(
        app,
        ["collect", "--spec", str(order)],
        env={"QPA_SPOOL_DIR": str(tmp_path / "spool"), **seaweed.env()},
    )
    assert answer.exit_code == 0, answer.output
    summary = CollectSummary.from_message(answer.stdout)
    assert summary is not None and summary.complete and summary.harness_version == "harness-v7"
    assert (summary.total, summary.ran, summary.shard) == (6, 6, "0/1")
    trajectories = read_collected(out, seaweed.store_config())
    assert len(trajectories) == 6
    assert {t.policy.harness_version for t in trajectories} == {"harness-v7"}
    assert all("memory" in t.task.capabilities for t in trajectories)
    assert read_manifest(open_store(out, seaweed.store_config())).name == "spec-batch"
    mixed = CliRunner().invoke(app, ["collect", "--spec", str(order), "--planner", "noop"])
    assert mixed.exit_code == 2 and "drop --planner" in mixed.output
