"""`qpa train|bench` hand their typed summary to the operator through `$QPA_STATUS_FILE` (the
pod's termination log): compact JSON of the summary model, cut to the termination-message limit
with the newest checkpoints kept, read back by the operator with the same model."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpa.api.v1alpha1 import Checkpoint, TrainSummary
from qpa.cli.common import STATUS_FILE_ENV, STATUS_FILE_LIMIT, write_summary


def test_nothing_is_written_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATUS_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    write_summary(TrainSummary(run="r", stage="sft", step=3))
    assert list(tmp_path.iterdir()) == []


def test_a_small_summary_is_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(STATUS_FILE_ENV, str(target))
    summary = TrainSummary(
        run="r", stage="sft", step=400, model_uri="s3://qpa/run/final/", loss=0.25
    )
    write_summary(summary)
    text = target.read_text()
    assert TrainSummary.from_message(text) == summary
    assert "\n" not in text and " " not in text and '"modelUri"' in text


def test_a_large_summary_keeps_the_newest_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "termination-log"
    monkeypatch.setenv(STATUS_FILE_ENV, str(target))
    checkpoints = [
        Checkpoint(step=s, uri=f"s3://qpa/trainingruns/planner-sft/checkpoints/checkpoint-{s}/")
        for s in range(500)
    ]
    summary = TrainSummary(
        run="planner-sft", stage="sft", step=499, checkpoints=checkpoints, model_uri="s3://q/f/"
    )
    write_summary(summary)
    written = target.read_bytes()
    assert len(written) <= STATUS_FILE_LIMIT
    read = TrainSummary.from_message(written.decode())
    assert read is not None and read.step == 499 and read.model_uri == "s3://q/f/"
    kept = read.checkpoints
    assert 0 < len(kept) < len(checkpoints) and kept == checkpoints[-len(kept) :]
