"""`token_logprobs`: the tiled LM head equals full logits, and its memory stays bounded.

The tiled path (`trl.kernels.ChunkedLogProbFunction` over the backbone's hidden states) must
give the full-logits values to 1e-6 (float32 at |log p| ~ 8) and the same weight gradients
(1e-5), with several vocabulary tiles, a temperature and packed rows. For memory, every tensor
any aten op produces during the forward and backward of a 2k-token, 50k-vocabulary call is
recorded (a `TorchDispatchMode`): the largest stays a tile (<= 4096 tokens x `VOCAB_CHUNK`),
far below the [seq, vocab] logits the plain path would make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from qpa.train.rl.loss import LOGITS_BUDGET, VOCAB_CHUNK, Batch, Sample, collate, token_logprobs
from qpa.train.tiny import TinyConfig, build_model

SMALL = TinyConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
)


def _packed_batch(vocab: int, seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for length, prompt in ((40, 10), (33, 5), (25, 12)):
        mask = [1] * (length - prompt)
        mask[3:6] = [0, 0, 0]  # environment feedback packed between two turns
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        rows.append(Sample(ids, prompt, mask, 1.0))
    return collate(rows, pad_id=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tiled_equals_full_logits(temperature: float) -> None:
    model = build_model(SMALL, vocab_size=3000)
    batch = _packed_batch(3000)
    full = token_logprobs(model, batch, temperature)  # small: the full-logits path
    tiled = token_logprobs(model, batch, temperature, max_logits=0, vocab_chunk=448)
    assert tiled.shape == full.shape == (3, 30)
    torch.testing.assert_close(tiled, full, rtol=1e-6, atol=1e-6)
    params = list(model.parameters())
    mask = batch.loss_mask
    g_full = torch.autograd.grad((full * mask).sum(), params)
    g_tiled = torch.autograd.grad((tiled * mask).sum(), params)
    for a, b in zip(g_tiled, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_wrapped_model_is_unwrapped() -> None:
    """A DeepSpeed engine is called as the model and exposes it as `.module`."""
    model = build_model(SMALL, vocab_size=512)

    class Engine:
        def __init__(self, module: Any) -> None:
            self.module = module

        def __call__(self, **kwargs: Any) -> Any:
            return self.module(**kwargs)

    batch = _packed_batch(512)
    torch.testing.assert_close(
        token_logprobs(Engine(model), batch, max_logits=0, vocab_chunk=100),
        token_logprobs(model, batch),
        rtol=1e-6,
        atol=1e-6,
    )


class _LargestTensor(TorchDispatchMode):
    """Records the largest numel of any tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.op = ""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.numel() > self.largest:
                self.largest, self.op = value.numel(), str(func)
        return out


def test_long_sequence_large_vocab_stays_within_a_tile() -> None:
    vocab, seq, prompt = 50_048, 2048, 16
    model = build_model(SMALL, vocab_size=vocab)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (seq,), generator=g).tolist()
    batch = collate([Sample(ids, prompt, [1] * (seq - prompt), 1.0)], pad_id=0)
    completion = seq - prompt
    full_logits = completion * vocab
    assert full_logits > LOGITS_BUDGET  # so the default call takes the tiled path
    weights = max(p.numel() for p in model.parameters())
    with _LargestTensor() as seen:
        logps = token_logprobs(model, batch)
        (logps * batch.loss_mask).sum().backward()
    tile = min(completion, 4096) * VOCAB_CHUNK
    assert logps.shape == (1, completion) and torch.isfinite(logps).all()
    # The largest tensor is a tile or a weight-shaped gradient, never [seq, vocab] logits.
    assert seen.largest <= max(tile, weights), (seen.largest, seen.op)
    assert seen.largest * 5 < full_logits, (seen.largest, seen.op)
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_tiled_path_under_deepspeed_zero3_matches_the_full_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ZeRO-3 the LM head is partitioned and used outside its own forward: the tiled
    path gathers it (TRL's `maybe_gather_lm_head_ctx`). One RL update (two PPO epochs, a KL
    reference engine) gives the same loss, KL and gradient norm as the full-logits path."""
    import qpa.train.rl.loss as loss_module
    from qpa.train.rl.config import RLConfig
    from qpa.train.rl.trainer import RLTrainer
    from qpa.train.tiny import make_tiny_checkpoint, suite_corpus

    model = make_tiny_checkpoint(
        tmp_path / "model",
        SMALL.model_copy(update={"hidden_size": 64, "head_dim": 32}),
        corpus=suite_corpus(conversations=2),
    )
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(torch.randint(5, 300, (20,), generator=g).tolist(), 8, [1] * 12, advantage)
        for advantage in (1.0, -0.5, 0.7)
    ]
    stats: dict[str, dict[str, float]] = {}
    for mode, budget in (("full", 1 << 40), ("tiled", 0)):
        monkeypatch.setattr(loss_module, "LOGITS_BUDGET", budget)
        config = RLConfig.from_dict(
            {
                "model": str(model),
                "output_dir": str(tmp_path / mode),
                "steps": 1,
                "deepspeed": {"enabled": True, "zero_stage": 3},
                "loss": {"beta": 0.05, "ppo_epochs": 2},
                "optim": {"learning_rate": 0.01},
            }
        )
        trainer = RLTrainer(config, tasks=[])
        assert trainer.zero3
        stats[mode] = trainer.update(samples)
        trainer.close()
    for key in ("loss", "kl", "grad_norm", "clip_fraction"):
        assert stats["tiled"][key] == pytest.approx(stats["full"][key], rel=1e-5), key
    assert stats["full"]["grad_norm"] > 0 and stats["full"]["kl"] > 0
