"""qpa.train.precision: bf16 `auto` is on exactly where the device computes bf16 natively."""

from __future__ import annotations

import pytest
import torch

from qpa.train import precision


def test_explicit_settings_are_kept_whatever_the_device() -> None:
    assert precision.resolve_bf16(True, "cpu") is True
    assert precision.resolve_bf16(False, "cuda") is False


@pytest.mark.parametrize(("amx", "avx512_bf16", "expected"), [
    (False, False, False), (True, False, True), (False, True, True),
])  # fmt: skip
def test_auto_on_cpu_follows_the_cpu_probes(
    monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool, expected: bool
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert precision.resolve_bf16("auto", "cpu") is expected


def test_auto_on_cuda_needs_a_gpu_with_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.resolve_bf16("auto", "cuda") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert precision.resolve_bf16("auto", "cuda") is True
    assert precision.resolve_bf16("auto", "mps") is False


def test_the_warmup_records_what_it_ran_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from qpa.loop.presets import WarmupSettings
    from qpa.train.warmup import induction_warmup

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, max_position_embeddings=128)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    summary = induction_warmup(
        model, WarmupSettings(steps=2, batch_size=2, length=8), seed=0, log=lambda _: None
    )
    assert summary["bf16"] is False and summary["steps"] == 2
