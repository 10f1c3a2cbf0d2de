"""Two ranks on CPU (gloo, processes started as torchrun would) give the result of one process
holding the whole global batch: RL updates and SFT steps under DeepSpeed ZeRO-2 and ZeRO-3 (and
RL updates without DeepSpeed), and an RL run under ZeRO-3 killed mid-step resumes to the same
final step and weights.

The one-process reference runs here, in plain PyTorch / TRL without DeepSpeed, on the same
tiny checkpoint and the same global batch. Tolerance (fp32 throughout): weights within
`ATOL` (absolute) after the last step, losses and gradient norms within `RTOL` (relative).
Reductions happen in another order across ranks (and ZeRO partitions), so the results agree
to float32 rounding, not bit for bit (ZeRO-2 RL: 1.2e-6 apart). The faults this guards against
are far larger: a per-rank token normaliser moves the weights 7.6e-3 away, a pad pass that
trains (the KL term of a zero-advantage sample) 3.1e-3; pass counts that differ hang.

The RL shares are uneven on purpose (micro-batch size 1): rank 0 holds 4 sequences and rank 1
one in the first update; rank 0 none at all in the second. Without equal pass counts ZeRO-3
(parameters gathered on every forward) and ZeRO-2 (gradients reduced on every backward) hang;
with a KL term and two PPO epochs, a pad pass that carried any weight would change the result.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from helpers.multirank import Group

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
datasets = pytest.importorskip("datasets")

from safetensors.torch import load_file  # noqa: E402

from qpa.train.config import SFTConfig  # noqa: E402
from qpa.train.metrics import read_metrics  # noqa: E402
from qpa.train.rl import RLConfig, RLTrainer, Sample  # noqa: E402
from qpa.train.sft import train_sft  # noqa: E402
from qpa.train.tiny import (  # noqa: E402
    TinyConfig,
    make_tiny_checkpoint,
    sft_rows_from_suite,
    suite_corpus,
)

ATOL = 1e-5
RTOL = 1e-4
WEIGHTS_ATOL = 3e-5
"""Final weights of a DeepSpeed SFT run against one process: ZeRO partitions the parameters and
reduce-scatters the gradients, so float32 sums run in another order (measured: 1.1e-5 after two
steps under ZeRO-3 on an AVX-512 BF16 machine, below 1e-5 on an AVX2 one)."""

# All multi-rank work runs once, in the `runs` fixture: two groups of two rank processes (about
# 60-90 s on an idle 2-core machine; several minutes when other jobs share the cores). The
# groups' own deadlines fire first, with every rank's log in the message.
pytestmark = pytest.mark.timeout(600)

TINY = TinyConfig(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=2048,
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multirank")
    model = make_tiny_checkpoint(root / "tiny", TINY, corpus=suite_corpus(conversations=4))
    rows = sft_rows_from_suite(8, seed=3, error_rate=0.5)
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "data"))
    return {"root": root, "model": model, "data": root / "data"}


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest absolute difference of the tensors both hold (a saved folder leaves out the
    tied `lm_head.weight`)."""
    shared = a.keys() & b.keys()
    assert len(shared) >= len(b) - 1
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in shared)


def start_weights(inputs: dict[str, Path]) -> dict[str, Any]:
    return load_file(inputs["model"] / "model.safetensors")


# --------------------------------------------------------------------------- configs


def random_samples(count: int, seed: int) -> list[dict[str, Any]]:
    """Sequences of varied length; masks with an untrained stretch (packed turns' feedback)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [rng.randrange(16, 1000) for _ in range(rng.randrange(4, 12))]
        completion = [rng.randrange(16, 1000) for _ in range(rng.randrange(4, 14))]
        mask = [1] * len(completion)
        if len(completion) > 8:
            mask[3:6] = [0, 0, 0]
        advantage = [1.2, -0.7, 0.0, 0.4, -1.5][i % 5]
        out.append(
            {
                "input_ids": prompt + completion,
                "prompt_len": len(prompt),
                "mask": mask,
                "advantage": advantage,
            }
        )
    return out


BATCHES = [random_samples(5, seed=1), random_samples(4, seed=2)]
SHARES = [[[0, 1, 2, 3], [4]], [[], [0, 1, 2, 3]]]  # rank 0 / rank 1 sample indices


def rl_update_config(model: Path, out: Path, stage: int | None) -> dict[str, Any]:
    return {
        "name": "multirank-rl",
        "model": str(model),
        "output_dir": str(out),
        "seed": 1,
        "loss": {"micro_batch_size": 1, "beta": 0.05, "ppo_epochs": 2},
        "optim": {"learning_rate": 1e-3, "max_grad_norm": 1.0},
        "deepspeed": {"enabled": stage is not None, "zero_stage": stage or 2},
    }


def sft_config(inputs: dict[str, Path], out: Path, stage: int | None, batch: int) -> dict[str, Any]:
    return {
        "name": out.name,
        "model": str(inputs["model"]),
        "dataset": str(inputs["data"]),
        "output_dir": str(out),
        "max_length": 512,
        "per_device_train_batch_size": batch,
        "learning_rate": 1e-3,
        "max_steps": 2,
        "checkpoint": {"every_steps": 100},
        "metrics": {"logging_steps": 1},
        "deepspeed": {"enabled": stage is not None, "zero_stage": stage or 2},
    }


KILL_STAGE = 3


def rl_run_config(model: Path, out: Path) -> dict[str, Any]:
    return {
        "name": "multirank-run",
        "model": str(model),
        "output_dir": str(out),
        "steps": 2,
        "tasks_per_step": 1,
        "samples_per_task": 2,
        "seed": 1,
        "harness": {"token_budget": 100, "max_tools": 1, "max_turns": 2},
        "generation": {"max_new_tokens": 8},
        "loss": {"micro_batch_size": 1},
        "optim": {"learning_rate": 0.01},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
        "deepspeed": {"enabled": True, "zero_stage": KILL_STAGE},
    }


def step_losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


# --------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def runs(inputs: dict[str, Path]) -> dict[str, Path]:
    """Two ranks, one process each, running in order: the RL updates (plain PyTorch, ZeRO-2,
    ZeRO-3) and the SFT steps (ZeRO-2, ZeRO-3), an unkilled 2-step RL run, and the same run
    killed in step 2; then two new ranks resuming the killed run. The one-process references
    run here meanwhile."""
    root = inputs["root"] / "ranks"
    model = inputs["model"]
    jobs: list[dict[str, Any]] = []
    for stage in (0, 2, 3):
        jobs.append(
            {
                "mode": "rl_update",
                "config": rl_update_config(model, root / f"rl-zero{stage}", stage or None),
                "batches": BATCHES,
                "shares": SHARES,
                "out": str(root / f"rl-zero{stage}.pt"),
            }
        )
    for stage in (2, 3):
        jobs.append(
            {
                "mode": "sft",
                "config": sft_config(inputs, root / f"sft-zero{stage}", stage, batch=1),
                "out": str(root / f"sft-zero{stage}.json"),
            }
        )
    whole, killed = root / "rl-whole", root / "rl-killed"
    jobs.append(
        {"mode": "rl_run", "config": rl_run_config(model, whole), "out": str(whole / "r.json")}
    )
    jobs.append({"mode": "rl_run", "config": rl_run_config(model, killed), "kill_in_step": 2})
    group = Group(jobs, world_size=2, cwd=root)
    references(inputs)
    group.wait(timeout=360, expect_killed=True)
    resume = {
        "mode": "rl_run",
        "config": rl_run_config(model, killed),
        "resume": True,
        "out": str(killed / "r.json"),
    }
    Group([resume], world_size=2, cwd=root).wait(timeout=180)
    return {"root": root, "whole": whole, "killed": killed}


def references(inputs: dict[str, Path]) -> None:
    """One process, plain PyTorch (RL) and plain TRL (SFT), each global batch whole."""
    root = inputs["root"] / "reference"
    config = RLConfig.from_dict(rl_update_config(inputs["model"], root / "rl", None))
    trainer = RLTrainer(config, tasks=[])
    history = [trainer.update([Sample(**s) for s in batch]) for batch in BATCHES]
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    torch.save({"history": history, "state": state}, root / "rl.pt")
    train_sft(SFTConfig.from_dict(sft_config(inputs, root / "sft", None, batch=2)))


# --------------------------------------------------------------------------- RL update


@pytest.mark.parametrize("stage", [0, 2, 3], ids=["plain", "zero2", "zero3"])
def test_rl_update_on_two_ranks_equals_one_process(
    inputs: dict[str, Path], runs: dict[str, Path], stage: int
) -> None:
    got = torch.load(runs["root"] / f"rl-zero{stage}.pt", weights_only=False)
    ref = torch.load(inputs["root"] / "reference" / "rl.pt", weights_only=False)
    for mine, one in zip(got["history"], ref["history"], strict=True):
        assert mine["micro_batches"] == 4  # the most any rank needs, run by both
        assert mine["train_tokens"] == one["train_tokens"]  # one global normaliser
        for key in ("loss", "grad_norm", "kl", "clip_fraction"):
            assert mine[key] == pytest.approx(one[key], rel=RTOL, abs=1e-7), key
    assert got["history"][1]["padded_micro_batches"] == 4  # rank 0 had nothing of its own
    assert got["history"][0]["kl"] > 0  # the second PPO epoch moved away from the reference
    assert max_diff(got["state"], start_weights(inputs)) > 100 * ATOL  # it trained
    assert max_diff(got["state"], ref["state"]) < ATOL


# --------------------------------------------------------------------------- SFT


@pytest.mark.parametrize("stage", [2, 3])
def test_sft_on_two_ranks_equals_one_process(
    inputs: dict[str, Path], runs: dict[str, Path], stage: int
) -> None:
    result = json.loads((runs["root"] / f"sft-zero{stage}.json").read_text())
    assert result["global_step"] == 2
    reference = inputs["root"] / "reference" / "sft"
    assert step_losses(runs["root"] / f"sft-zero{stage}") == pytest.approx(
        step_losses(reference), rel=RTOL
    )
    state = load_file(Path(result["final_dir"]) / "model.safetensors")
    assert max_diff(state, start_weights(inputs)) > 100 * ATOL
    assert max_diff(state, load_file(reference / "final" / "model.safetensors")) < WEIGHTS_ATOL


# --------------------------------------------------------------------------- kill and resume


def test_rl_killed_mid_run_resumes_to_the_same_final_step_and_weights(
    runs: dict[str, Path],
) -> None:
    whole = json.loads((runs["whole"] / "r.json").read_text())
    resumed = json.loads((runs["killed"] / "r.json").read_text())
    assert whole["final_step"] == resumed["final_step"] == 2
    assert resumed["resumed_from"] == 1  # the checkpoint of the last step before the kill
    assert [h["loss"] for h in resumed["history"]] == [whole["history"][-1]["loss"]]
    records = read_metrics(runs["killed"] / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    # rank 0 logs the whole step: 1 task x k=2 on each of the 2 ranks
    assert all(h["episodes"] == 4 and h["groups"] == 2 for h in whole["history"])
    assert all(r["episodes"] == 4 for r in records)
    a = load_file(Path(whole["final_dir"]) / "model.safetensors")
    b = load_file(Path(resumed["final_dir"]) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
