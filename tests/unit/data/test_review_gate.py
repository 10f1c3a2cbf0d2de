"""The review gate is enforced where data are read: a mixture's inputs, an SFT dataset and an
RL / collection task pool refuse pending, rejected or unpublished data, naming the dataset and its
state; published data, data whose manifest records `gate: automatic`, and a user's own files
without review metadata are read. A refusal changes nothing stored."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from qpa.api.v1alpha1 import TaskSource
from qpa.contract import Trajectory, write_tasks
from qpa.data.curate import curate, write_curated
from qpa.data.mix import MixConfig, mix
from qpa.data.review import (
    GateClosed,
    ReviewConfig,
    ReviewItem,
    create_queue,
    decide,
    load_queue,
    manifest_with_review,
    open_batch,
    publish,
    put_jsonl,
    require_published,
    review_state,
)
from qpa.data.tasks import select_tasks
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode
from qpa.store.manifest import DatasetManifest, Lineage, ManifestFile, write_manifest
from qpa.train.config import ConfigError
from qpa.train.rl.tasks import load_tasks

TRAIN = [t for t in generate_suite() if t.split == "train"]
AUTOMATIC = ReviewConfig(gate="automatic", sample_size=5)
MANUAL = ReviewConfig(sample_size=5)


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` with its SHA-256: what a refusal must leave as it was."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def accept_all(batch: Path) -> None:
    store = open_batch(batch)
    queue = load_queue(store)
    assert queue is not None
    for item in queue.items:
        decide(store, item.id, accept=True, reviewer="tester")


@pytest.fixture(scope="module")
def trajectories() -> list[Trajectory]:
    tasks = [t for t in TRAIN if t.capabilities == ["tool_use"]][:6]
    return [run_episode(SandboxEnv(), t, OraclePlanner()) for t in tasks]


def curated(root: Path, trajectories: list[Trajectory], review: ReviewConfig) -> Path:
    write_curated(open_batch(root), curate(trajectories), inputs=[], review=review)
    return root


def tasks_batch(root: Path, review: ReviewConfig) -> Path:
    """A generated-tasks batch as `qpa data generate` lays it out: rows, manifest, queue."""
    store = open_batch(root)
    tasks = TRAIN[:8]
    info, rows = put_jsonl(store, "tasks.jsonl", tasks)
    items = [ReviewItem(id=f"task:{t.id}", kind="task", ref=t.id) for t in tasks]
    queue = create_queue(store, "generate", items, review)
    manifest = DatasetManifest(
        name=root.name,
        kind="tasks",
        files=[ManifestFile.of(info, rows)],
        lineage=Lineage.for_tasks((t.id for t in tasks), generator="qpa.data.generate"),
    )
    write_manifest(store, "", manifest_with_review(manifest, queue))
    return root


# --------------------------------------------------------------------------- the decision


def test_states_of_a_batch_from_pending_to_published(tmp_path: Path) -> None:
    batch = tasks_batch(tmp_path / "gen", MANUAL)
    assert review_state(batch).state == "pending"
    assert review_state(batch / "tasks.jsonl").state == "pending"  # a file: its batch's state
    store = open_batch(batch)
    queue = load_queue(store)
    assert queue is not None
    for item in queue.items:
        decide(store, item.id, accept=False, reason="off-topic")
    assert review_state(batch).state == "rejected"
    accept_all(batch)
    found = review_state(batch)
    assert found.state == "unpublished" and "never published" in found.detail
    publish(store)
    assert review_state(batch).state == "published"
    assert review_state(tasks_batch(tmp_path / "auto", AUTOMATIC)).state == "automatic"
    mine = tmp_path / "mine.jsonl"
    write_tasks(mine, TRAIN[:2])
    assert review_state(mine).state == "unreviewed"  # a user's own file: no review metadata
    require_published(mine)


def test_a_reviewed_stage_output_without_review_metadata_is_unpublished(tmp_path: Path) -> None:
    store = open_batch(tmp_path / "mix")
    lineage = Lineage.for_tasks([TRAIN[0].id], generator="qpa.data.mix")
    write_manifest(store, "", DatasetManifest(name="m", kind="sft", lineage=lineage))
    with pytest.raises(GateClosed, match=r"review state unpublished: written by qpa\.data\.mix"):
        require_published(tmp_path / "mix" / "dataset")  # the mixture's dataset/ folder
    # collection output: its lineage names its tasks' generator, yet nobody reviews it as such
    other = open_batch(tmp_path / "trajectories")
    collected = Lineage.for_tasks([TRAIN[0].id], generator="qpa.data.generate")
    write_manifest(other, "", DatasetManifest(name="t", kind="trajectories", lineage=collected))
    assert review_state(tmp_path / "trajectories").state == "unreviewed"
    require_published((tmp_path / "trajectories").as_uri())


# --------------------------------------------------------------------------- the mixture


def test_a_mix_refuses_pending_and_unpublished_inputs_and_stores_nothing(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    source = curated(tmp_path / "curated", trajectories, MANUAL)
    out = tmp_path / "mix"
    before = tree(source)
    with pytest.raises(GateClosed) as refused:
        mix(open_batch(out), [str(source)], MixConfig(target_size=6))
    message = str(refused.value)
    assert f"dataset {source}: review state pending" in message
    assert "items await review" in message and "qpa data review" in message
    assert tree(source) == before and not out.exists()

    accept_all(source)
    before = tree(source)
    with pytest.raises(GateClosed, match=rf"dataset {source}: review state unpublished"):
        mix(open_batch(out), [str(source)], MixConfig(target_size=6))
    assert tree(source) == before and not out.exists()

    publish(open_batch(source))
    assert mix(open_batch(out), [str(source)], MixConfig(target_size=6)).rows > 0


def test_a_mix_reads_automatic_inputs_and_records_its_own_gate(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    source = curated(tmp_path / "curated", trajectories, AUTOMATIC)
    result = mix(
        open_batch(tmp_path / "auto"), [str(source)], MixConfig(target_size=6), review=AUTOMATIC
    )
    assert result.manifest.review == {"published": False, "queue": None, "gate": "automatic"}
    assert review_state(tmp_path / "auto").state == "automatic"
    manual = mix(
        open_batch(tmp_path / "manual"), [str(source)], MixConfig(target_size=6), review=MANUAL
    )
    assert manual.manifest.review == {"published": False, "queue": None, "gate": "manual"}
    assert review_state(tmp_path / "manual" / "dataset").state == "unpublished"


# --------------------------------------------------------------------------- SFT


def test_sft_refuses_a_pending_or_unpublished_mixture_naming_it(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    from qpa.train.config import SFTConfig
    from qpa.train.sft import SFTInputError, load_rows, plan_sft

    source = curated(tmp_path / "curated", trajectories, AUTOMATIC)
    rows = MixConfig(target_size=6, review_rows=True)
    mix(open_batch(tmp_path / "pending"), [str(source)], rows, review=MANUAL)
    mix(
        open_batch(tmp_path / "unpublished"), [str(source)], MixConfig(target_size=6), review=MANUAL
    )
    model = tmp_path / "model"  # exists: the gate is the first check that fails
    model.mkdir()
    for name, state in (("pending", "pending"), ("unpublished", "unpublished")):
        dataset = tmp_path / name / "dataset"
        before = tree(tmp_path / name)
        with pytest.raises(SFTInputError, match=rf"dataset {dataset}: review state {state}"):
            load_rows(str(dataset), cache_dir=tmp_path / "cache")
        run = tmp_path / f"run-{name}"
        config = SFTConfig(model=str(model), dataset=str(dataset), output_dir=str(run))
        with pytest.raises(SFTInputError, match=rf"dataset {dataset}: review state {state}"):
            plan_sft(config)
        assert tree(tmp_path / name) == before and not run.exists()
        assert not (tmp_path / "cache").exists()

    publish(open_batch(tmp_path / "unpublished"), AUTOMATIC)
    loaded = load_rows(str(tmp_path / "unpublished" / "dataset"), cache_dir=tmp_path / "cache")
    assert len(loaded.rows) > 0
    mix(open_batch(tmp_path / "auto"), [str(source)], MixConfig(target_size=6), review=AUTOMATIC)
    assert len(load_rows(str(tmp_path / "auto"), cache_dir=tmp_path / "cache").rows) > 0


# --------------------------------------------------------------------------- RL / collection


def test_rl_and_collection_task_pools_refuse_pending_datasets(tmp_path: Path) -> None:
    batch = tasks_batch(tmp_path / "gen", MANUAL)
    before = tree(batch)
    for ref in (batch.as_uri(), (batch / "tasks.jsonl").as_uri()):
        source = TaskSource(dataset_uri=ref)
        with pytest.raises(ConfigError, match=rf"tasks: dataset {ref}: review state pending"):
            load_tasks(source)
        with pytest.raises(GateClosed, match="review state pending"):
            select_tasks(source)  # what `qpa collect` and a TaskBatch's workers call
    assert tree(batch) == before
    accept_all(batch)
    with pytest.raises(ConfigError, match="review state unpublished"):
        load_tasks(TaskSource(dataset_uri=batch.as_uri()))
    publish(open_batch(batch))
    assert [t.id for t in load_tasks(TaskSource(dataset_uri=batch.as_uri()))] == [
        t.id for t in TRAIN[:8]
    ]
    automatic = tasks_batch(tmp_path / "auto", AUTOMATIC)
    assert len(load_tasks(TaskSource(dataset_uri=automatic.as_uri()))) == 8
    mine = tmp_path / "mine.jsonl"
    write_tasks(mine, TRAIN[:3])
    assert len(load_tasks(TaskSource(dataset_uri=mine.as_uri()))) == 3


# --------------------------------------------------------------------------- a TrainingRun's pod


def test_a_trainer_pods_refusal_reaches_the_trainingrun_status(
    tmp_path: Path, trajectories: list[Trajectory], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`qpa train sft` in a pod: the refusal is its termination message (`$QPA_STATUS_FILE`),
    which the operator turns into the TrainingRun's status message, naming the dataset."""
    import yaml
    from qpa_operator.builders import trainingrun
    from typer.testing import CliRunner

    from qpa.cli import app
    from qpa.cli.common import STATUS_FILE_ENV, write_refusal

    source = curated(tmp_path / "curated", trajectories, AUTOMATIC)
    rows = MixConfig(target_size=6, review_rows=True)
    mix(open_batch(tmp_path / "mix"), [str(source)], rows, review=MANUAL)
    dataset = (tmp_path / "mix").as_uri()
    (tmp_path / "model").mkdir()
    config = tmp_path / "sft.yaml"
    settings = {"model": str(tmp_path / "model"), "dataset": dataset}
    config.write_text(yaml.safe_dump({**settings, "output_dir": str(tmp_path / "run")}))
    log = tmp_path / "termination-log"
    log.touch()  # as the kubelet creates it: empty
    monkeypatch.setenv(STATUS_FILE_ENV, str(log))
    result = CliRunner().invoke(app, ["train", "sft", "--config", str(config)])
    assert result.exit_code == 2
    message = log.read_text()
    assert message.startswith(f"error: dataset {dataset}: review state pending: ")
    write_refusal("something else")  # the first word stands (a typed summary would, too)
    assert log.read_text() == message

    terminated = {"exitCode": 1, "message": message}  # torchrun's exit code, qpa's message
    pod = {
        "metadata": {"labels": {"app.kubernetes.io/component": "trainer", "qpa.ai/attempt": "0"}},
        "status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]},
    }
    refusal = trainingrun.pod_refusal(pod)
    assert refusal is not None and refusal[2].startswith(f"dataset {dataset}: review state pending")


def test_a_retried_curation_keeps_the_batch_a_reviewer_published(
    tmp_path: Path, trajectories: list[Trajectory]
) -> None:
    """The TrainingRun data Job curates with --keep-existing: its first attempt leaves a pending
    queue (the mix refuses it), a reviewer accepts and publishes, the retry keeps that batch and
    the mix reads it; new inputs are curated again."""
    from typer.testing import CliRunner

    from qpa.cli import app
    from qpa.contract import write_trajectories

    source = tmp_path / "taskbatch.jsonl"
    write_trajectories(source, trajectories)
    out = tmp_path / "curated"
    curate = ["data", "curate", str(source), "--out", str(out), "--keep-existing"]
    runner = CliRunner()
    assert runner.invoke(app, curate).exit_code == 0
    assert review_state(out).state == "pending"
    refused = runner.invoke(app, ["data", "mix", str(out), "--out", str(tmp_path / "mix")])
    assert refused.exit_code != 0 and "review state pending" in refused.output
    accept_all(out)
    publish(open_batch(out))
    published = tree(out)
    kept = runner.invoke(app, curate)
    assert kept.exit_code == 0 and "kept" in kept.output
    assert tree(out) == published and review_state(out).state == "published"
    assert (
        runner.invoke(app, ["data", "mix", str(out), "--out", str(tmp_path / "mix")]).exit_code == 0
    )
    other = tmp_path / "other.jsonl"
    write_trajectories(other, trajectories[:3])
    again = ["data", "curate", str(other), "--out", str(out), "--keep-existing"]
    assert runner.invoke(app, again).exit_code == 0
    assert review_state(out).state == "pending"  # other inputs: curated afresh
