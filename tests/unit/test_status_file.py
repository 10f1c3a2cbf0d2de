"""`qpa train` hands its summary to the operator through `$QPA_STATUS_FILE` (the pod's
termination log): compact JSON, cut to the termination-message limit, newest checkpoints kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpa.cli.common import STATUS_FILE_ENV, STATUS_FILE_LIMIT, write_status_file


def test_nothing_is_written_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATUS_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    write_status_file({"global_step": 3})
    assert list(tmp_path.iterdir()) == []


def test_a_small_summary_is_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(STATUS_FILE_ENV, str(target))
    summary = {"global_step": 400, "final_uri": "s3://qpa/run/final/", "train_loss": 0.25}
    write_status_file(summary)
    assert json.loads(target.read_text()) == summary
    assert "\n" not in target.read_text() and " " not in target.read_text()


def test_a_large_summary_keeps_the_newest_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(STATUS_FILE_ENV, str(target))
    uris = [f"s3://qpa/trainingruns/planner-sft/checkpoints/checkpoint-{s}/" for s in range(500)]
    write_status_file({"global_step": 499, "checkpoint_uris": uris, "final_uri": "s3://qpa/final/"})
    written = target.read_bytes()
    assert len(written) <= STATUS_FILE_LIMIT
    data = json.loads(written)
    assert data["global_step"] == 499 and data["final_uri"] == "s3://qpa/final/"
    kept = data["checkpoint_uris"]
    assert 0 < len(kept) < len(uris) and kept == uris[-len(kept) :]


def test_an_oversized_scalar_is_dropped_before_the_summary_breaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(STATUS_FILE_ENV, str(target))
    write_status_file({"global_step": 7, "metrics_path": "x" * 10_000})
    assert json.loads(target.read_text()) == {"global_step": 7}
