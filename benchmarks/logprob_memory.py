"""Peak memory and time of `token_logprobs` (forward + backward): full logits vs the tiled LM head.

Each mode runs in its own process (peak RSS on CPU, `torch.cuda.max_memory_allocated` on CUDA)
on a randomly initialised one-layer Qwen3 of the given vocabulary, one sequence of `--seq`
tokens. Prints one JSON line per mode.

    .venv/bin/python benchmarks/logprob_memory.py --vocab 50048 --seq 2048
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def measure(mode: str, vocab: int, seq: int, hidden: int) -> dict[str, float | str | int]:
    import torch

    from qpa.train.rl.loss import Sample, collate, token_logprobs
    from qpa.train.tiny import TinyConfig, build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = TinyConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=max(4096, seq),
    )
    model = build_model(config, vocab_size=vocab).to(device)
    ids = torch.randint(0, vocab, (seq,)).tolist()
    batch = collate([Sample(ids, 16, [1] * (seq - 16), 1.0)], pad_id=0, device=device)
    budget = 1 << 62 if mode == "full" else 0
    token_logprobs(model, batch, max_logits=budget).sum().backward()  # warm-up (imports)
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    logps = token_logprobs(model, batch, max_logits=budget)
    (logps * batch.loss_mask).sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak_mb = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    return {
        "mode": mode,
        "device": device.type,
        "vocab": vocab,
        "seq": seq,
        "seconds": round(seconds, 3),
        "peak_mb": round(peak_mb, 1),  # CPU: the process's peak RSS (model + warm-up included)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50048)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--mode", choices=["full", "tiled"], default=None)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.vocab, args.seq, args.hidden)))
        return
    for mode in ("full", "tiled"):
        argv = [sys.argv[0], "--mode", mode, "--vocab", str(args.vocab), "--seq", str(args.seq)]
        argv += ["--hidden", str(args.hidden)]
        subprocess.run([sys.executable, *argv], check=True)


if __name__ == "__main__":
    main()
