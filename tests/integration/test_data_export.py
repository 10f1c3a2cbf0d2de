"""`qpa data export` / `import`: curated batches and mixtures as Hugging Face `datasets`, and back.

A real curated batch (oracle successes, recovering-oracle successes whose wrong call is masked,
failures kept with their diagnosis) and a real mixture of it are exported; `datasets` itself
(`load_dataset` on the folder, following the card's `configs`) and `huggingface_hub`'s card parser
read the result. The round trip gives the same rows and the same masks; the card names the
source manifest's hash and lineage; a missing or corrupt file is named in the error.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("datasets")

from qpa.cli import app
from qpa.contract import Trajectory
from qpa.data.curate import curate, write_curated
from qpa.data.export import (
    CARD_NAME,
    EXPORT_COLUMNS,
    MASK_COLUMN,
    export_dataset,
    read_card,
    read_export,
)
from qpa.data.mix import MixConfig, load_dataset_from_store, mix
from qpa.data.review import DataError, decide, load_queue, open_batch, publish
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.planners import NoopPlanner, OraclePlanner
from qpa.harness.recovery import RecoveringPlanner
from qpa.harness.runner import run_episode

runner = CliRunner()


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(curated batch, mixture of it), both reviewed and published."""
    root = tmp_path_factory.mktemp("flywheel")
    train = [t for t in generate_suite() if t.split == "train" and t.reference_plan]
    picked = train[::97][:6]
    trajectories: list[Trajectory] = [
        run_episode(SandboxEnv(), t, OraclePlanner()) for t in picked[:3]
    ]
    trajectories += [
        run_episode(SandboxEnv(), t, RecoveringPlanner(mistake_rate=1.0, seed=1))
        for t in picked[3:]
    ]
    trajectories += [run_episode(SandboxEnv(), t, NoopPlanner(), sample=1) for t in picked[:2]]
    curated = root / "curated"
    batch = open_batch(curated)
    write_curated(batch, curate(trajectories), inputs=[str(curated)])
    queue = load_queue(batch)
    assert queue is not None
    for item in queue.items:
        decide(batch, item.id, accept=True, reviewer="test")
    publish(batch)
    mixture = root / "mix"
    mix(open_batch(mixture), [str(curated)], MixConfig(target_size=12))
    publish(open_batch(mixture))  # the mixture's gate is its inputs': they passed
    return curated, mixture


def test_mixture_round_trip_same_rows_same_masks(
    batches: tuple[Path, Path], tmp_path: Path
) -> None:
    from datasets import load_dataset
    from huggingface_hub import DatasetCard

    _, mixture = batches
    out = tmp_path / "export"
    result = export_dataset(mixture, out, check=True)
    source = [dict(r) for r in load_dataset_from_store(open_batch(mixture))]
    assert result.card.splits == {"train": len(source)} and len(source) > 0

    # `datasets` reads the folder through the card's configs: chat-ready messages + mask
    loaded = load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
    assert list(loaded) == ["train"]
    train = loaded["train"]
    assert tuple(train.column_names) == EXPORT_COLUMNS and len(train) == len(source)
    for exported, original in zip(train, source, strict=True):
        assert exported["messages"] == [
            {"role": m["role"], "content": m["content"]} for m in original["messages"]
        ]
        assert exported[MASK_COLUMN] == [m["train"] for m in original["messages"]]
        assert exported["trajectory_id"] == original["trajectory_id"]

    # qpa's import gives back exactly the mixture's rows (messages with their train flags)
    card, rows = read_export(out)
    assert rows == {"train": source}
    manifest_bytes = (mixture / "manifest.json").read_bytes()
    assert card.source_manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest()
    manifest = json.loads(manifest_bytes)
    assert card.generator == "qpa.data.mix" and card.parents == manifest["lineage"]["parents"]
    assert card.tasks_sha256 == manifest["lineage"]["tasks_sha256"]
    assert {f.key for f in card.source_files} == {f["key"] for f in manifest["files"]}

    # the card is a Hub dataset card: YAML header the hub library parses
    hub = DatasetCard.load(out / CARD_NAME)
    assert hub.data.to_dict()["qpa"]["source_manifest_sha256"] == card.source_manifest_sha256
    assert hub.data.to_dict()["configs"][0]["data_files"][0]["split"] == "train"
    assert "## Lineage" in hub.text and manifest["lineage"]["parents"][0] in hub.text


def test_curated_export_keeps_masked_turns_and_failures(
    batches: tuple[Path, Path], tmp_path: Path
) -> None:
    curated, _ = batches
    out = tmp_path / "curated-export"
    result = export_dataset(curated, out, check=True)
    assert set(result.card.splits) == {"successes", "failures"}
    assert result.card.splits["failures"] > 0
    card, rows = read_export(out)
    assert card.source_kind == "curated" and card.harness is not None
    masked = [
        m
        for r in rows["successes"]
        for m in r["messages"]
        if m["role"] == "assistant" and not m["train"]
    ]
    assert masked, "the recovering oracle's wrong calls are exported as masked turns"
    assert all(not r["success"] for r in rows["failures"])
    assert all(r["success"] for r in rows["successes"])
    assert rows == {k: [dict(r) for r in v] for k, v in result.rows.items()}


def test_cli_export_import_and_bad_input(batches: tuple[Path, Path], tmp_path: Path) -> None:
    _, mixture = batches
    out = tmp_path / "cli"
    done = runner.invoke(app, ["data", "export", str(mixture), "--out", str(out), "--check"])
    assert done.exit_code == 0, done.output
    assert "round trip ok" in done.output
    jsonl = tmp_path / "rows.jsonl"
    done = runner.invoke(app, ["data", "import", str(out), "--out", str(jsonl), "--json"])
    assert done.exit_code == 0, done.output
    info = json.loads(done.output)
    assert info["written"]["rows"] == info["splits"]["train"]["rows"]
    first = json.loads(jsonl.read_text().splitlines()[0])
    assert all(set(m) == {"role", "content", "train"} for m in first["messages"])
    # qpa's SFT reads the imported rows as its dataset, masks included
    from qpa.train.sft import load_rows

    loaded = load_rows(str(jsonl), cache_dir=tmp_path / "sft-cache").rows
    _, exported = read_export(out)
    assert len(loaded) == len(exported["train"])
    assert [[m["train"] for m in r["messages"]] for r in loaded] == [
        [m["train"] for m in r["messages"]] for r in exported["train"]
    ]

    # a missing source, a missing Parquet file, a corrupt one, a corrupt card: named
    done = runner.invoke(app, ["data", "export", str(tmp_path / "nope"), "--out", str(out)])
    assert done.exit_code != 0 and "nope: missing" in done.output
    parquet = out / read_card(out).files[0].path
    original = parquet.read_bytes()
    parquet.write_bytes(original[: len(original) // 2])
    with pytest.raises(DataError, match=r"train-00000-of-00001\.parquet: sha256 .* recorded"):
        read_export(out)
    card_text = (out / CARD_NAME).read_text()
    fixed_sha = hashlib.sha256(parquet.read_bytes()).hexdigest()
    (out / CARD_NAME).write_text(card_text.replace(read_card(out).files[0].sha256, fixed_sha))
    with pytest.raises(DataError, match=r"train-00000-of-00001\.parquet: corrupt parquet"):
        read_export(out)
    parquet.unlink()
    done = runner.invoke(app, ["data", "import", str(out)])
    assert done.exit_code != 0 and "parquet: missing (listed in README.md)" in done.output
    (out / CARD_NAME).write_text("---\nqpa: [unclosed\n---\n")
    with pytest.raises(DataError, match=r"README\.md: YAML header is not YAML"):
        read_card(out)
    (out / CARD_NAME).write_text("---\nqpa: {source: x}\n---\n")
    with pytest.raises(DataError, match=r"README\.md: qpa section: field 'source_kind'"):
        read_card(out)
    (out / CARD_NAME).unlink()
    with pytest.raises(DataError, match=r"README\.md: missing \(no dataset card\)"):
        read_card(out)


def test_mask_that_trains_a_user_turn_is_refused(
    batches: tuple[Path, Path], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    _, mixture = batches
    out = tmp_path / "tampered"
    export_dataset(mixture, out)
    card = read_card(out)
    path = out / card.files[0].path
    table = pq.read_table(path).to_pylist()
    table[0][MASK_COLUMN] = [True] * len(table[0][MASK_COLUMN])
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(path)), path)
    text = (out / CARD_NAME).read_text()
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / CARD_NAME).write_text(text.replace(card.files[0].sha256, sha))
    with pytest.raises(DataError, match=r"row 0: train_mask trains a 'system' message"):
        read_export(out)
