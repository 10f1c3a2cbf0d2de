"""The loop's tiny checkpoint: a tokenizer with macro tokens, a random Qwen3, an induction warm-up.

`build_checkpoint` writes the checkpoint the closed loop starts from (`qpa loop`'s `tiny` stage):

- `build_tokenizer`: a byte-level BPE tokenizer (ChatML template of `qpa.train.tiny`) whose
  pre-tokenizer keeps words and numbers whole, plus *macro tokens*: lines of the Harness's fixed
  text that recur across episodes (`macro_lines`) each become one token;
- `qpa.train.tiny.build_model`: the random Qwen3 of a `TinyConfig`;
- `induction_warmup`: a few hundred steps teaching the random model to copy from its context,
  which SFT on tool calls (copying arguments from the instruction) builds on.

`oracle_trajectories` gives the oracle episodes whose Harness renderings feed the corpus.
Importing this module never imports torch or transformers; building does.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qpa.contract import Task, Trajectory
from qpa.data.render import render_trajectory
from qpa.envs.factory import make_env
from qpa.harness.agent import HarnessConfig
from qpa.harness.planners import OraclePlanner
from qpa.harness.runner import run_episode
from qpa.train.precision import resolve_bf16
from qpa.train.tiny import (
    EOS_TOKEN,
    PAD_TOKEN,
    PROTOCOL_TOKENS,
    SPECIAL_TOKENS,
    TINY_MANIFEST,
    TRAINING_CHAT_TEMPLATE,
    TinyConfig,
    build_model,
    suite_corpus,
)


class WarmupError(ValueError):
    """The warm-up cannot run with these settings (the message names the setting)."""


def oracle_trajectories(tasks: Iterable[Task]) -> list[Trajectory]:
    """The oracle's (reference plan's) episode of each task, in the sandbox."""
    env = make_env("sandbox")
    try:
        return [run_episode(env, task, OraclePlanner()) for task in tasks]
    finally:
        env.close()


def macro_lines(
    episodes: Iterable[Iterable[Sequence[Mapping[str, Any]]]],
    *,
    min_count: int = 2,
    min_chars: int = 12,
    limit: int = 6000,
) -> list[str]:
    """Lines of the Harness's fixed text that recur in at least `min_count` episodes.

    `episodes` holds, per episode, its conversations (the same episode rendered for one or
    more Harness versions); a line counts once per episode. Only the system prompt (rules, the
    tool protocol, tool and Skill lines, memory header) and the opening user turn (the quoting
    preface, the reset observation) are mined: what the model writes and the tool results it
    must read are never made opaque. The tokenizer makes each line a single token.
    """
    counts: Counter[str] = Counter()
    for conversations in episodes:
        lines: set[str] = set()
        for conversation in conversations:
            opening = True
            for message in conversation:
                role = message.get("role")
                if role == "assistant":
                    opening = False
                    continue
                if role == "user" and not opening:
                    continue
                lines.update(
                    line
                    for line in str(message.get("content") or "").split("\n")
                    if len(line) >= min_chars
                )
        counts.update(lines)
    frequent = [line for line, count in counts.most_common() if count >= min_count]
    return sorted(frequent[:limit])


def build_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int,
    macros: Sequence[str] = (),
    model_max_length: int = 4096,
) -> Any:
    """A byte-level BPE tokenizer (ChatML template of the tiny checkpoints) with macro tokens.

    Pre-tokenization splits text into words, runs of digits and runs of everything else
    (spaces, punctuation), so a word or a number is tokenized the same wherever it appears
    (copying an argument from the instruction into a call is then token for token), while the
    call syntax between arguments (`", "`, `": "`, `"}}`) can merge into a few tokens. `macros`
    are added as single,
    non-special tokens after the protocol tags (see `qpa.train.tiny`).
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    special = [t for t in SPECIAL_TOKENS if t not in PROTOCOL_TOKENS]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[A-Za-z]+|[0-9]+|[^A-Za-z0-9]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(list(texts), trainer)
    raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in PROTOCOL_TOKENS])
    if macros:
        raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in macros])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TRAINING_CHAT_TEMPLATE
    return tokenizer


def build_checkpoint(
    out: Path,
    *,
    trajectories: Sequence[Trajectory],
    harnesses: Sequence[HarnessConfig],
    tokenizer_settings: Any,
    model_config: TinyConfig,
    warmup_settings: Any,
    corpus_seed: int,
    warmup_seed: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """A tiny checkpoint in `out` and its manifest: a tokenizer (corpus: the suite's
    train/validation text and `trajectories` rendered for each of `harnesses`, macro tokens for
    their recurring prompt lines, see `TokenizerSettings`), a random Qwen3 of `model_config`,
    warmed up by `induction_warmup`."""
    settings = tokenizer_settings
    episodes = [[render_trajectory(t, h) for h in harnesses] for t in trajectories]
    conversations = [c for pair in episodes for c in pair]
    macros: list[str] = []
    if settings.macro_lines:
        macros = macro_lines(
            episodes,
            min_count=settings.macro_min_count,
            min_chars=settings.macro_min_chars,
            limit=settings.macro_max,
        )
    corpus = suite_corpus(conversations=20, seed=corpus_seed)
    chat = build_tokenizer(["x"], vocab_size=300)  # only its chat template renders the corpus
    corpus += [
        str(
            chat.apply_chat_template(
                [{"role": m["role"], "content": m["content"]} for m in c], tokenize=False
            )
        )
        for c in conversations
    ]
    tokenizer = build_tokenizer(
        corpus,
        vocab_size=settings.vocab_size,
        macros=macros,
        model_max_length=model_config.max_position_embeddings,
    )
    model = build_model(model_config, tokenizer=tokenizer)
    passages = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in corpus]
    warmup = induction_warmup(
        model,
        warmup_settings,
        seed=warmup_seed,
        passages=passages,
        separator=tokenizer.convert_tokens_to_ids("Ġ"),
        log=log,
    )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    lengths = [
        len(
            tokenizer(
                str(
                    tokenizer.apply_chat_template(
                        [{"role": m["role"], "content": m["content"]} for m in c], tokenize=False
                    )
                )
            )["input_ids"]
        )
        for c in conversations[::2]
    ]
    manifest = {
        "tiny_config": model_config.model_dump(),
        "tokenizer_size": len(tokenizer),
        "bpe_vocab_size": settings.vocab_size,
        "macro_tokens": len(macros),
        "parameters": sum(p.numel() for p in model.parameters()),
        "mean_conversation_tokens": round(sum(lengths) / max(1, len(lengths)), 1),
        "warmup": warmup,
    }
    (out / TINY_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(
        f"tiny: {manifest['parameters'] / 1e6:.2f}M parameters, {len(tokenizer)} tokens "
        f"({len(macros)} macro lines), {manifest['mean_conversation_tokens']} tokens/conversation"
    )
    return manifest


def induction_warmup(
    model: Any,
    settings: Any,
    *,
    seed: int,
    passages: Sequence[Sequence[int]] = (),
    separator: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Teach a random model to copy from its context (see `WarmupSettings`): a token span,
    filler, the span again, next-token loss on the repeat, AdamW, bf16 autocast where the device
    has native bf16 (`settings.bf16`, `qpa.train.precision`). A share
    `settings.text_share` of the rows are windows of `passages` (tokenized corpus text), the
    others random tokens of `[token_low, token_high)`."""
    if settings.steps <= 0:
        return {"steps": 0}
    import torch

    rng = random.Random(seed)
    low = settings.token_low
    high = min(settings.token_high, int(model.get_input_embeddings().num_embeddings))
    if high - low < 2:
        raise WarmupError(f"warm-up token range [{low}, {high}) is empty")
    device = next(iter(model.parameters())).device
    bf16 = resolve_bf16(getattr(settings, "bf16", "auto"), device.type)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    model.train()
    clock = time.perf_counter()
    first = last = float("nan")
    n = settings.length
    long_enough = [list(p) for p in passages if len(p) >= n]

    def row() -> list[int]:
        draw = rng.random()
        if long_enough and draw < settings.text_share:
            passage = rng.choice(long_enough)
            start = rng.randrange(len(passage) - n + 1)
            return passage[start : start + n]
        if separator is not None and draw < settings.text_share + settings.spaced_share:
            # words of 1-3 random tokens between separators, as text is tokenized: copying
            # them needs to look past the separator (the token before it is what identifies)
            tokens: list[int] = []
            while len(tokens) < n:
                tokens += [rng.randrange(low, high) for _ in range(rng.randint(1, 3))]
                tokens.append(separator)
            return tokens[:n]
        return [rng.randrange(low, high) for _ in range(n)]

    def example() -> tuple[list[int], list[int]]:
        # span, filler, span again: spans of varied length at varied distances, so the model
        # learns to find the earlier occurrence (induction), not a fixed offset
        span = row()[: rng.randint(max(2, n // 4), n)]
        filler = [rng.randrange(low, high) for _ in range(rng.randint(0, n // 2))]
        prefix = span + filler
        return prefix + span, [-100] * len(prefix) + span

    for step in range(settings.steps):
        batch = [example() for _ in range(settings.batch_size)]
        width = max(len(tokens) for tokens, _ in batch)
        # right padding needs no attention mask: a causal model never looks ahead
        ids = torch.tensor(
            [tokens + [0] * (width - len(tokens)) for tokens, _ in batch], device=device
        )
        labels = torch.tensor(
            [target + [-100] * (width - len(target)) for _, target in batch], device=device
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())
        first = value if step == 0 else first
        last = value
    model.eval()
    summary = {
        "steps": settings.steps,
        "first_loss": round(first, 4),
        "final_loss": round(last, 4),
        "seconds": round(time.perf_counter() - clock, 1),
        "bf16": bf16,
    }
    log(f"tiny: induction warm-up {settings.steps} steps, copy loss {first:.2f} -> {last:.3f}")
    return summary


__all__ = [
    "WarmupError",
    "build_checkpoint",
    "build_tokenizer",
    "induction_warmup",
    "macro_lines",
    "oracle_trajectories",
]
