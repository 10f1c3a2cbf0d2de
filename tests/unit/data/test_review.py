"""The human gate: sampled review queues, accept/reject with reasons, publish only past the gate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import qpa.cli.data_stages  # noqa: F401  (registers the stages on `qpa data`)
from qpa.cli import app
from qpa.contract import Task, write_tasks
from qpa.data.review import (
    GateClosed,
    ReviewConfig,
    ReviewError,
    ReviewItem,
    ReviewQueue,
    create_queue,
    decide,
    gates_for,
    is_published,
    load_queue,
    load_yaml_config,
    open_batch,
    publish,
    read_source,
    rejected_refs,
    sample_items,
)
from qpa.store import ArtifactStore
from qpa.store.manifest import (
    DatasetManifest,
    Lineage,
    ManifestFile,
    read_manifest,
    write_manifest,
)

runner = CliRunner()


def flat(text: str) -> str:
    """CLI output without whitespace (Rich wraps long lines anywhere)."""
    return "".join(text.split())


def items(n: int, kind: str = "sample") -> list[ReviewItem]:
    return [ReviewItem(id=f"{kind}:t{i:03d}", kind=kind, ref=f"t{i:03d}") for i in range(n)]


def batch(
    tmp_path: Path, name: str, n: int = 30, parents: list[str] | None = None, **config: Any
) -> tuple[ArtifactStore, ReviewQueue]:
    store = open_batch(tmp_path / name)
    write_manifest(
        store, "", DatasetManifest(name=name, kind="sft", lineage=Lineage(parents=parents or []))
    )
    queue = create_queue(store, "mix", items(n), ReviewConfig(**config))
    return store, queue


def test_a_configurable_deterministic_sample_goes_to_review(tmp_path: Path) -> None:
    config = ReviewConfig(sample_size=5, seed=1)
    first = sample_items(items(40) + items(40, "failure"), config)
    assert len(first) == 5 and first == sample_items(items(40) + items(40, "failure"), config)
    assert {i.kind for i in first} == {"sample", "failure"}  # spread over kinds
    assert sample_items(items(40), ReviewConfig(sample_size=5, seed=2)) != sample_items(
        items(40), ReviewConfig(sample_size=5, seed=1)
    )
    assert len(sample_items(items(3), config)) == 3
    _, queue = batch(tmp_path, "b", n=30, sample_size=7)
    assert len(queue.items) == 7 and queue.population == 30
    assert all(i.status == "pending" for i in queue.items)


def test_accept_and_reject_with_reasons(tmp_path: Path) -> None:
    store, queue = batch(tmp_path, "b", sample_size=4)
    a, b, *_ = queue.items
    with pytest.raises(ReviewError, match="needs a reason"):
        decide(store, a.id, accept=False)
    with pytest.raises(ReviewError, match="no item 'nope'"):
        decide(store, "nope", accept=True)
    decide(store, a.id, accept=True, reviewer="ana")
    rejected = decide(store, b.ref, accept=False, reason="instruction is ambiguous")  # by ref too
    assert rejected.status == "rejected" and rejected.reason == "instruction is ambiguous"
    saved = load_queue(store)
    assert saved is not None
    assert [i.status for i in saved.items[:2]] == ["accepted", "rejected"]
    assert saved.items[0].reviewer == "ana" and saved.items[0].decided_at is not None
    assert rejected_refs(store) == {b.ref}


def test_gate_passes_only_when_reviewed_within_the_reject_rate(tmp_path: Path) -> None:
    store, queue = batch(tmp_path, "b", sample_size=4, max_reject_rate=0.25)
    status = queue.status()
    assert not status.passed and "4 of 4 items await review" in status.detail
    for item in queue.items[:3]:
        decide(store, item.id, accept=True)
    decide(store, queue.items[3].id, accept=False, reason="wrong answer")
    loaded = load_queue(store)
    assert loaded is not None and loaded.status().passed  # 1 of 4 rejected = 25%
    decide(store, queue.items[2].id, accept=False, reason="duplicate")
    loaded = load_queue(store)
    assert loaded is not None and not loaded.status().passed
    assert "2 of 4 reviewed items rejected" in loaded.status().detail
    assert loaded.status(ReviewConfig(gate="automatic")).passed


def test_publish_refuses_until_every_gate_passes(tmp_path: Path) -> None:
    parent, parent_queue = batch(tmp_path, "curated", sample_size=2)
    store, queue = batch(tmp_path, "mix", sample_size=2, parents=[parent.root_uri])
    assert len(gates_for(store, ReviewConfig())) == 2
    with pytest.raises(GateClosed, match="2 of 2 items await review"):
        publish(store)
    for item in queue.items:
        decide(store, item.id, accept=True)
    with pytest.raises(GateClosed, match="curated"):  # the input's gate is still closed
        publish(store)
    for item in parent_queue.items:
        decide(parent, item.id, accept=True)
    result = publish(store)
    assert result.mode == "manual" and all(g.passed for g in result.gates)
    assert is_published(store)
    review = read_manifest(store).review
    assert review is not None and review["published"] is True


def test_automatic_gate_must_be_explicit(tmp_path: Path) -> None:
    store = open_batch(tmp_path / "plain")
    write_manifest(store, "", DatasetManifest(name="plain", kind="sft"))
    with pytest.raises(GateClosed, match="nothing was reviewed"):
        publish(store)
    config = tmp_path / "review.yaml"
    config.write_text("review:\n  gate: automatic\n")
    result = publish(store, load_yaml_config(str(config), ReviewConfig, section="review"))
    assert result.mode == "automatic" and is_published(store)


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    store = open_batch(tmp_path / "empty")
    with pytest.raises(ReviewError, match=r"review\.json: missing"):
        load_queue(store)
    store.put_bytes("review.json", b'{"batch": "x", "stage": "mix", "population": -1}')
    with pytest.raises(ReviewError, match=r"review.json: corrupt review queue: field 'population'"):
        load_queue(store)
    config = tmp_path / "review.yaml"
    config.write_text("gate: sometimes\n")
    with pytest.raises(ValueError, match=r"review.yaml: field 'gate'"):
        load_yaml_config(str(config), ReviewConfig)
    tasks = tmp_path / "tasks.jsonl"
    task = Task(id="t", domain="notes", capabilities=["tool_use"], instruction="Do it")
    write_tasks(tasks, [task, task])
    with open(tasks, "a", encoding="utf-8") as stream:
        stream.write("{not json\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:3: corrupt line"):
        list(read_source(str(tasks), Task))
    with pytest.raises(ValueError, match="nowhere: missing"):
        list(read_source(str(tmp_path / "nowhere"), Task))
    published = runner.invoke(app, ["data", "publish", str(tmp_path / "none")])
    assert published.exit_code == 2 and "manifest.json" in "".join(published.output.split())


def test_review_cli(tmp_path: Path) -> None:
    store, queue = batch(tmp_path, "b", sample_size=3)
    uri = str(tmp_path / "b")
    listed = runner.invoke(app, ["data", "review", "list", uri, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [i["id"] for i in json.loads(listed.output)] == [i.id for i in queue.items]
    status = runner.invoke(app, ["data", "review", "status", uri])
    assert status.exit_code == 1 and "closed" in flat(status.output)
    first, second, third = queue.items
    assert runner.invoke(app, ["data", "review", "accept", uri, first.id]).exit_code == 0
    no_reason = runner.invoke(app, ["data", "review", "reject", uri, second.id])
    assert no_reason.exit_code == 2  # --reason is required
    rejected = runner.invoke(
        app, ["data", "review", "reject", uri, second.id, "--reason", "bad plan"]
    )
    assert rejected.exit_code == 0 and "rejected(badplan)" in flat(rejected.output)
    unknown = runner.invoke(app, ["data", "review", "accept", uri, "nope"])
    assert unknown.exit_code == 2 and "noitem'nope'" in flat(unknown.output)
    refused = runner.invoke(app, ["data", "publish", uri])
    assert refused.exit_code == 2 and "awaitreview" in flat(refused.output)
    assert runner.invoke(app, ["data", "review", "accept", uri, third.id]).exit_code == 0
    left = runner.invoke(app, ["data", "review", "list", uri, "--json"])
    assert json.loads(left.output) == []
    closed = runner.invoke(app, ["data", "review", "status", uri, "--json"])
    assert json.loads(closed.output)["rejected"] == 1 and closed.exit_code == 1  # 33% > 10%
    config = tmp_path / "review.yaml"
    config.write_text("max_reject_rate: 0.5\n")
    opened = runner.invoke(app, ["data", "review", "status", uri, "--review-config", str(config)])
    assert opened.exit_code == 0 and "passed" in flat(opened.output)
    published = runner.invoke(app, ["data", "publish", uri, "--review-config", str(config)])
    assert published.exit_code == 0, published.output
    assert is_published(store)


def test_gates_follow_the_lineage_back_to_the_generated_tasks(tmp_path: Path) -> None:
    generated, gen_queue = batch(tmp_path, "generated", sample_size=2)
    collected = open_batch(tmp_path / "collected")  # a `qpa collect` output names its tasks file
    write_manifest(
        collected,
        "",
        DatasetManifest(
            name="c",
            kind="trajectories",
            lineage=Lineage(parents=[generated.uri("tasks.jsonl")]),
        ),
    )
    curated, cur_queue = batch(tmp_path, "curated", sample_size=2, parents=[collected.root_uri])
    mixed = open_batch(tmp_path / "mix")
    write_manifest(
        mixed,
        "",
        DatasetManifest(name="m", kind="sft", lineage=Lineage(parents=[curated.root_uri])),
    )
    assert [g.batch for g in gates_for(mixed)] == [curated.root_uri, generated.root_uri]
    for item in cur_queue.items:
        decide(curated, item.id, accept=True)
    with pytest.raises(GateClosed, match="generated"):
        publish(mixed)
    for item in gen_queue.items:
        decide(generated, item.id, accept=True)
    assert publish(mixed).mode == "manual"


def test_a_dataset_that_no_longer_matches_its_manifest_is_not_published(tmp_path: Path) -> None:
    store = open_batch(tmp_path / "d")
    info = store.put_bytes("rows.jsonl", b'{"a": 1}\n')
    write_manifest(
        store, "", DatasetManifest(name="d", kind="sft", files=[ManifestFile.of(info, 1)])
    )
    store.put_bytes("rows.jsonl", b'{"a": 2}\n{"a": 3}\n')
    with pytest.raises(GateClosed, match="does not match its manifest"):
        publish(store, ReviewConfig(gate="automatic"))
