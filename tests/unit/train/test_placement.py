"""`qpa.train.placement`: device from the environment, dtype by device, model sources.

CUDA is simulated by patching `torch.cuda` (no GPU here); the Hub by patching
`huggingface_hub.snapshot_download` or setting `HF_HUB_OFFLINE` (nothing is downloaded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
import torch

from qpa.store import ResolveError
from qpa.train.config import ConfigError
from qpa.train.placement import (
    PlacementError,
    choose_device,
    choose_dtype,
    is_hub_id,
    resolve_model_source,
)
from qpa.train.rl.config import RLConfig


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node with two bf16-capable GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_this_ranks_gpu_on_a_gpu_node(gpus: None) -> None:
    assert choose_device("auto", environ={}) == torch.device("cuda", 0)
    assert choose_device(None, environ={"LOCAL_RANK": "1"}) == torch.device("cuda", 1)
    with pytest.raises(PlacementError, match=r"device: auto with LOCAL_RANK=2 names GPU 2.* 2"):
        choose_device("auto", environ={"LOCAL_RANK": "2"})


def test_an_explicit_device_wins(gpus: None) -> None:
    assert choose_device("cpu", environ={"LOCAL_RANK": "1"}) == torch.device("cpu")
    assert choose_device("cuda:1", environ={"LOCAL_RANK": "0"}) == torch.device("cuda", 1)
    assert choose_device("cuda", environ={"LOCAL_RANK": "1"}) == torch.device("cuda", 1)
    with pytest.raises(PlacementError, match="device: 'cuda:7' names GPU 7"):
        choose_device("cuda:7")


def test_cpu_only_where_there_is_no_gpu(no_gpu: None) -> None:
    assert choose_device("auto", environ={"LOCAL_RANK": "3"}) == torch.device("cpu")
    with pytest.raises(PlacementError, match="device: 'cuda' asks for CUDA"):
        choose_device("cuda")
    with pytest.raises(PlacementError, match=r"rl\.device: 'gpu' is not auto"):
        choose_device("gpu", field="rl.device")
    assert issubclass(PlacementError, ConfigError)


def test_dtype_by_device(gpus: None) -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert choose_dtype("auto", cpu) == torch.float32
    assert choose_dtype("auto", cuda) == torch.bfloat16  # frozen, or DeepSpeed bf16 masters
    # plain AdamW keeps no fp32 master: fp32 weights under bf16 autocast
    assert choose_dtype("auto", cuda, fp32_master=False) == torch.float32
    assert choose_dtype("bfloat16", cpu) == torch.bfloat16  # explicit wins
    assert choose_dtype("float32", cuda) == torch.float32
    with pytest.raises(PlacementError, match="model_dtype: 'fp16'"):
        choose_dtype("fp16", cuda)


def test_dtype_on_a_gpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert choose_dtype("auto", torch.device("cuda", 0)) == torch.float32


def test_hub_id_shape() -> None:
    assert is_hub_id("Qwen/Qwen3-0.6B") and is_hub_id("org/name@main")
    for text in ("runs/a/b", "/abs/dir", "name", "../x/y", "org/na--me", "org/name@"):
        assert not is_hub_id(text), text


def test_a_local_folder_wins_over_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "org" / "name"
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _refuse)
    assert resolve_model_source("org/name") == folder
    assert resolve_model_source(str(folder)) == folder


def _refuse(*args: Any, **kwargs: Any) -> str:
    raise AssertionError("the Hub must not be asked")


def test_a_hub_id_resolves_through_huggingface_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    calls: list[dict[str, Any]] = []

    def download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    got = resolve_model_source("Qwen/Qwen3-0.6B@abc123", cache_dir=tmp_path / "cache")
    assert got == snapshot
    assert calls == [
        {
            "repo_id": "Qwen/Qwen3-0.6B",
            "revision": "abc123",
            "cache_dir": tmp_path / "cache" / "hf",
            "local_files_only": False,
        }
    ]


def test_offline_hub_id_without_a_cached_snapshot_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResolveError) as info:
        resolve_model_source("Qwen/Qwen3-0.6B", field="tokenizer", cache_dir=tmp_path / "c")
    text = str(info.value)
    assert text.startswith("tokenizer Qwen/Qwen3-0.6B: no local folder")
    assert "HF_HUB_OFFLINE" in text


def test_neither_a_folder_nor_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _refuse)
    with pytest.raises(ResolveError, match=r"^model runs/a/b: is neither a local folder"):
        resolve_model_source("runs/a/b")


def test_rl_config_keeps_hub_ids_and_checks_the_device(tmp_path: Path) -> None:
    config = RLConfig(model="Qwen/Qwen3-0.6B", tokenizer="tok").relative_to(tmp_path)
    assert config.model == "Qwen/Qwen3-0.6B"
    assert config.tokenizer == str(tmp_path / "tok")  # not a hub id: a local path
    assert (tmp_path / "Qwen" / "Qwen3-0.6B").mkdir(parents=True) is None
    local = RLConfig(model="Qwen/Qwen3-0.6B").relative_to(tmp_path)
    assert local.model == str(tmp_path / "Qwen" / "Qwen3-0.6B")
    assert RLConfig(model="m").device == "auto" and RLConfig(model="m").model_dtype == "auto"
    with pytest.raises(ValueError, match="device"):
        RLConfig(model="m", device="gpu")


def test_rl_trainer_refuses_an_unresolvable_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_gpu: None
) -> None:
    from qpa.train.rl.trainer import RLTrainer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = RLConfig(model="org/missing-model", output_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"^model org/missing-model: no local folder"):
        RLTrainer(config, tasks=[])
