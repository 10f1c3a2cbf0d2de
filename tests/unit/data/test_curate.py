"""Curation: validity, failures kept with their diagnosis, turn flags, attribution, dedupe."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import qpa.cli.data_stages  # noqa: F401  (registers the stages on `qpa data`)
from qpa.cli import app
from qpa.contract import (
    CorruptLineError,
    Feedback,
    Task,
    ToolCall,
    Trajectory,
    write_trajectories,
)
from qpa.data.curate import (
    CurateConfig,
    curate,
    dedupe,
    diagnosis_of,
    load_trajectories,
    minhash,
    shingles,
    similarity,
    write_curated,
)
from qpa.data.review import DataError, jsonl_bytes, load_queue, open_batch
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.noisy import NoisyPlanner
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode
from qpa.store.manifest import DatasetManifest, ManifestFile, read_manifest, write_manifest

SUITE = generate_suite()
TRAIN = [t for t in SUITE if t.split == "train"]


def task_of(template: str, split: str = "train") -> Task:
    return next(t for t in SUITE if t.template == template and t.split == split)


def oracle(task: Task, sample: int = 0) -> Trajectory:
    return run_episode(SandboxEnv(), task, OraclePlanner(), sample=sample)


def faulty(task: Task, sample: int = 0) -> Trajectory:
    return run_episode(SandboxEnv(), task, NoisyPlanner(fault_rate=1.0, seed=sample), sample=sample)


@pytest.fixture(scope="module")
def batch() -> list[Trajectory]:
    tasks = TRAIN[::60][:12]
    out = [oracle(t, s) for t in tasks for s in (0, 1)]  # 2 identical samples each: duplicates
    out += [faulty(t, 2) for t in tasks]
    return out


def test_successes_and_failures_are_split_and_failures_keep_their_diagnosis(
    batch: list[Trajectory],
) -> None:
    result = curate(batch)
    assert result.successes and result.failures and not result.rejected
    assert all(t.success for t in result.successes)
    assert all(not t.success for t in result.failures)
    for t in result.failures:
        diagnosis = t.metadata["diagnosis"]
        assert diagnosis["side"] in ("model", "harness", "environment") and diagnosis["cause"]
        assert t.metadata["curation"]["sft_eligible"] is False
        diagnosed = diagnosis_of(t)
        assert diagnosed is not None and diagnosed.trajectory_id == t.id
    # nothing is silently dropped: every input is kept, a duplicate, or rejected
    kept = len(result.successes) + len(result.failures)
    assert kept + len(result.duplicates) + len(result.rejected) == len(batch)


def test_every_trajectory_carries_its_capability_attribution(batch: list[Trajectory]) -> None:
    result = curate(batch)
    for t in [*result.successes, *result.failures]:
        caps = t.metadata["curation"]["capabilities"]
        assert caps["declared"] == list(t.task.capabilities)
        assert set(caps["exercised"]) <= {"tool_use", "memory", "skills", "subagent"}
        if t.success:
            assert "tool_use" in caps["exercised"] or not any(
                s.action.type == "tool_call" for s in t.steps
            )
    memory = curate([oracle(task_of("text_partner_from_memory"))]).successes[0]
    assert "memory" in memory.metadata["curation"]["capabilities"]["exercised"]
    delegating = curate([oracle(task_of("triage_three_mailboxes"))]).successes[0]
    assert "subagent" in delegating.metadata["curation"]["capabilities"]["exercised"]


def test_identical_samples_are_deduplicated_deterministically(batch: list[Trajectory]) -> None:
    result = curate(batch)
    assert len(result.duplicates) == 12  # the second oracle sample of each task
    assert all(
        dropped.endswith("#1") and kept.endswith("#0")
        for dropped, kept in result.duplicates.items()
    )
    shuffled = list(batch)
    random.Random(7).shuffle(shuffled)
    again = curate(shuffled)
    assert [t.id for t in again.successes] == [t.id for t in result.successes]
    assert again.duplicates == result.duplicates
    kept = next(t for t in result.successes if t.id.endswith("#0"))
    assert kept.metadata["curation"]["task_samples"] == {"samples": 3, "successes": 2}


def test_near_duplicates_need_the_same_actions_and_near_identical_instructions() -> None:
    task = task_of("add_new_contact")
    base = oracle(task)
    twin = base.model_copy(deep=True, update={"id": "twin#0"})
    twin.task = task.model_copy(update={"id": "other", "instruction": task.instruction + " Thanks"})
    far = base.model_copy(deep=True, update={"id": "far#0"})
    far.task = task.model_copy(update={"id": "far", "instruction": "Something else entirely now"})
    kept, dropped = dedupe([base, twin, far], CurateConfig(near_duplicate_threshold=0.6))
    assert dropped == {"twin#0": base.id}
    assert {t.id for t in kept} == {base.id, "far#0"}
    a, b = shingles("book a table for two at eight"), shingles("book a table for two at nine")
    assert 0.3 < similarity(minhash(a), minhash(b)) < 1.0
    assert similarity(minhash(a), minhash(a)) == 1.0


def test_erroneous_turns_are_flagged_for_masking() -> None:
    task = task_of("add_new_contact")
    trajectory = oracle(task)
    bad = trajectory.steps[0].model_copy(
        update={
            "action": ToolCall(tool="contacts_teleport", arguments={}),
            "feedback": Feedback.fail("unknown_tool", "no tool named 'contacts_teleport'"),
            "annotations": {},
        }
    )
    steps = [bad, *trajectory.steps]
    for index, step in enumerate(steps):
        step.index = index
    trajectory.steps = steps
    curated = curate([trajectory]).successes[0]
    assert curated.steps[0].annotations == {"train": False, "mask_reason": "unknown_tool"}
    assert all("train" not in s.annotations for s in curated.steps[1:])
    assert curated.metadata["curation"]["flagged_steps"] == [0]
    assert "train" not in trajectory.steps[0].annotations  # the input is not mutated


def test_the_diagnosed_mistake_of_a_model_side_failure_is_masked() -> None:
    failures = [
        t
        for t in curate([faulty(t) for t in TRAIN[::90][:8]]).failures
        if t.metadata["diagnosis"]["side"] == "model"
        and t.metadata["diagnosis"]["step"] is not None
    ]
    assert failures
    for t in failures:
        step = t.metadata["diagnosis"]["step"]
        assert t.steps[step].annotations["train"] is False
        assert step in t.metadata["curation"]["flagged_steps"]


def test_invalid_trajectories_are_rejected_with_reasons() -> None:
    good = oracle(task_of("add_new_contact"))
    test_split = oracle(task_of("add_new_contact", split="test"))
    unverified = good.model_copy(deep=True, update={"id": "unverified#0", "verification": None})
    renumbered = good.model_copy(deep=True, update={"id": "renumbered#0"})
    renumbered.steps[0].index = 5
    leaked = good.model_copy(deep=True, update={"id": "leak#0"})
    leaked.task = good.task.model_copy(update={"instruction": test_split.task.instruction})
    result = curate([good, test_split, unverified, renumbered, leaked, good])
    reasons = {r.trajectory_id: r.reasons[0].split(":")[0] for r in result.rejected}
    assert reasons == {
        test_split.id: "test_split",
        "unverified#0": "verification_missing",
        "renumbered#0": "step_index",
        "leak#0": "test_instruction",
    } | {good.id: "duplicate_id"}
    assert [t.id for t in result.successes] == [good.id]


def test_environment_side_failures_never_enter_the_sft_set() -> None:
    trajectory = oracle(task_of("add_new_contact"))
    trajectory.error = "environment: env server went away"
    result = curate([trajectory])
    assert not result.successes
    assert result.failures[0].metadata["curation"]["environment_failure"].startswith("episode")


def test_written_batch_has_sets_manifest_and_review_queue(
    batch: list[Trajectory], tmp_path: Path
) -> None:
    store = open_batch(tmp_path / "curated")
    result = curate(batch)
    manifest = write_curated(store, result, inputs=[str(tmp_path / "in.jsonl")])
    assert manifest.kind == "curated" and manifest.counts["successes"] == len(result.successes)
    assert {f.key for f in manifest.files} >= {
        "successes.jsonl",
        "failures.jsonl",
        "rejected.jsonl",
    }
    assert read_manifest(store).lineage.generator == "qpa.data.curate"
    queue = load_queue(store)
    kept = len(result.successes) + len(result.failures)
    assert queue is not None and len(queue.items) == 20 and queue.population == kept
    assert {i.kind for i in queue.items} == {"sample", "failure"}
    again = load_trajectories([str(tmp_path / "curated")])  # a curated batch reads its sets
    assert len(again) == manifest.counts["successes"] + manifest.counts["failures"]


def test_corrupt_lines_and_missing_files_are_named(batch: list[Trajectory], tmp_path: Path) -> None:
    path = tmp_path / "trajs.jsonl"
    write_trajectories(path, batch[:3])
    with open(path, "a", encoding="utf-8") as stream:
        stream.write('{"id": "broken", "task": \n')
    with pytest.raises(CorruptLineError) as error:
        load_trajectories([str(path)])
    assert error.value.line_no == 4 and str(path) in str(error.value)
    with pytest.raises(DataError, match=r"nope\.jsonl: missing"):
        load_trajectories([str(tmp_path / "nope.jsonl")])
    result = CliRunner().invoke(app, ["data", "curate", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "trajs.jsonl:4" in "".join(result.output.split())


def test_cli_curate_writes_the_batch(batch: list[Trajectory], tmp_path: Path) -> None:
    path = tmp_path / "trajs.jsonl"
    write_trajectories(path, batch)
    out = tmp_path / "curated"
    result = CliRunner().invoke(app, ["data", "curate", str(path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    expected = curate(batch).summary()
    assert summary == expected and summary["duplicates"] == 12
    assert (out / "failures.jsonl").read_text().count("\n") == summary["failures"]


def test_a_collected_batch_is_read_through_its_manifest(
    batch: list[Trajectory], tmp_path: Path
) -> None:
    store = open_batch(tmp_path / "collected")
    first = store.put_bytes("parts/part-0.jsonl", jsonl_bytes(batch[:5])[0])
    second = store.put_bytes("parts/part-1.jsonl", jsonl_bytes(batch[5:9])[0])
    manifest = DatasetManifest(
        name="c", kind="trajectories", files=[ManifestFile.of(first, 5), ManifestFile.of(second, 4)]
    )
    write_manifest(store, "", manifest)
    assert [t.id for t in load_trajectories([store.root_uri])] == [t.id for t in batch[:9]]
    store.delete("manifest.json")  # without a manifest: the parts
    assert len(load_trajectories([str(tmp_path / "collected")])) == 9


def test_skill_governed_writes_are_read_from_the_trajectorys_tools() -> None:
    from qpa.data.curate import exercised_capabilities

    trajectory = oracle(task_of("schedule_text"))
    assert "skills" in trajectory.task.capabilities
    assert "skills" in exercised_capabilities(trajectory)
    # every recorded tool a read: no write went through, whatever the sandbox would say
    reads = [t.model_copy(update={"side_effect": "read"}) for t in trajectory.tools]
    assert "skills" not in exercised_capabilities(trajectory.model_copy(update={"tools": reads}))
    # written before tools were recorded: an unknown effect is not claimed as a write
    old = trajectory.model_copy(update={"tools": []})
    assert "skills" not in exercised_capabilities(old)
    assert "tool_use" in exercised_capabilities(old)
