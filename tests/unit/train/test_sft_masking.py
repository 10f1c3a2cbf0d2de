"""Turn-level error masking: labels cover exactly the trained assistant turns, and a masked turn
contributes exactly zero gradient through the trainer's own loss (TRL's `SFTTrainer`).

The proof of "zero gradient" is done two ways on the real training path (`plan_sft` →
`build_trainer` → `trainer.compute_loss`):

- a gradient hook on the final hidden states (the input of the LM head): the gradient at every
  position that predicts a token of the masked turn is exactly 0.0, while positions predicting
  trained tokens get non-zero gradients;
- with the erroneous turn last, the parameter gradients with the turn present (flagged) equal
  those with the turn absent (causal attention: nothing earlier can see it), and differ once
  the flag is removed (the test is sensitive).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from qpa.harness.backends.local import CHATML_TEMPLATE  # noqa: E402
from qpa.train.config import SFTConfig  # noqa: E402
from qpa.train.sft import (  # noqa: E402
    IGNORE_INDEX,
    SFTInputError,
    build_trainer,
    encode_conversation,
    plan_sft,
    prepare_dataset,
    repeat_indices,
)
from qpa.train.tiny import TinyConfig, make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Any:
    """One intra-op thread: on a 2-core machine whose other core is busy, two OpenMP threads
    wait on each other and a step takes ten times longer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CORPUS = [
    "You are a mobile planner agent. Call one tool per turn.",
    "Book a ride to the airport for two people tomorrow at nine.",
    '<tool_call>\n{"name": "rides_get_estimates", "arguments": {"pickup": "home"}}\n</tool_call>',
    '<tool_response>\n{"status": "ok", "result": [{"id": "est_1", "price": 12.5}]}\n'
    "</tool_response>",
    '<tool_response>\n{"status": "error", "error": "unknown_tool"}\n</tool_response>',
    '<tool_call>\n{"name": "finish", "arguments": {"answer": null}}\n</tool_call>',
    "<finish>Your ride is booked.</finish>",
] * 3

GOOD_1 = (
    '<tool_call>\n{"name": "rides_get_estimates", "arguments": {"pickup": "home"}}\n</tool_call>'
)
WRONG = '<tool_call>\n{"name": "open_menu", "arguments": {}}\n</tool_call>'
GOOD_2 = "<finish>Your ride is booked.</finish>"


def conversation(*, error_train: bool = False, error_last: bool = False) -> list[dict[str, Any]]:
    head = [
        {"role": "system", "content": "You are a mobile planner agent.", "train": False},
        {"role": "user", "content": "Book a ride to the airport.", "train": False},
        {"role": "assistant", "content": GOOD_1, "train": True},
        {"role": "user", "content": '<tool_response>\n{"status": "ok"}\n</tool_response>'},
    ]
    wrong = {"role": "assistant", "content": WRONG, "train": error_train}
    if error_last:
        return [*head, wrong]
    return [
        *head,
        wrong,
        {"role": "user", "content": '<tool_response>\n{"status": "error"}\n</tool_response>'},
        {"role": "assistant", "content": GOOD_2, "train": True},
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyConfig(
        vocab_size=400, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    )  # fmt: skip
    return make_tiny_checkpoint(tmp_path_factory.mktemp("mask-tiny"), config, corpus=CORPUS)


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)


def trained_text(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    encoded = encode_conversation(tokenizer, messages)
    return tokenizer.decode([t for t in encoded.labels if t != IGNORE_INDEX])


# --------------------------------------------------------------------------- labels


def test_labels_are_exactly_the_trained_assistant_turns(tokenizer: Any) -> None:
    encoded = encode_conversation(tokenizer, conversation())
    assert len(encoded.labels) == len(encoded.input_ids)
    assert encoded.trained_turns == 2 and encoded.masked_turns == 1
    assert trained_text(tokenizer, conversation()) == f"{GOOD_1}<|im_end|>{GOOD_2}<|im_end|>"
    # every label is either its own token or ignored: no shifted or foreign ids
    assert all(label in (IGNORE_INDEX, token) for label, token in zip(
        encoded.labels, encoded.input_ids, strict=True
    ))  # fmt: skip
    # the erroneous turn, the prompts and the tool responses are all ignored
    assert WRONG not in trained_text(tokenizer, conversation())
    flagged = trained_text(tokenizer, conversation(error_train=True))
    assert flagged == f"{GOOD_1}<|im_end|>{WRONG}<|im_end|>{GOOD_2}<|im_end|>"


def test_turn_masking_off_trains_every_assistant_turn(tokenizer: Any) -> None:
    """`sft.turn_masking: false` (the CRD's `spec.sft.turnMasking`) ignores the `train` flags."""
    encoded = encode_conversation(tokenizer, conversation(), turn_masking=False)
    assert encoded.trained_turns == 3 and encoded.masked_turns == 0
    text = tokenizer.decode([t for t in encoded.labels if t != IGNORE_INDEX])
    assert text == f"{GOOD_1}<|im_end|>{WRONG}<|im_end|>{GOOD_2}<|im_end|>"


def test_labels_agree_with_trl_generation_masks(tokenizer: Any) -> None:
    """The tiny chat template's `{% generation %}` markers (what TRL's `assistant_only_loss`
    reads) mask exactly what qpa's offset-based labels mask."""
    for messages in (conversation(), conversation(error_train=True), conversation(error_last=True)):
        encoded = encode_conversation(tokenizer, messages)
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert list(rendered["input_ids"]) == encoded.input_ids
        ours = [int(label != IGNORE_INDEX) for label in encoded.labels]
        assert list(rendered["assistant_masks"]) == ours


def test_rendering_is_what_the_local_backend_sends(tokenizer: Any) -> None:
    messages = conversation()
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    ours = tokenizer.apply_chat_template(messages, tokenize=False)
    assert ours == tokenizer.apply_chat_template(
        plain, tokenize=False, chat_template=CHATML_TEMPLATE
    )


def test_other_chat_templates_work_when_content_is_verbatim(tokenizer: Any) -> None:
    """A Qwen-style template that adds an empty think block before assistant content."""
    template = CHATML_TEMPLATE.replace(
        "'<|im_start|>' + message['role'] + '\\n' + message['content']",
        "'<|im_start|>' + message['role'] + '\\n' + ('<think>\\n\\n</think>\\n\\n' "
        "if message['role'] == 'assistant' else '') + message['content']",
    )
    assert "<think>" in template
    encoded = encode_conversation(tokenizer, conversation(), chat_template=template)
    text = tokenizer.decode([t for t in encoded.labels if t != IGNORE_INDEX])
    assert text == f"{GOOD_1}<|im_end|>{GOOD_2}<|im_end|>"
    mangled = CHATML_TEMPLATE.replace("message['content']", "message['content'] | upper")
    with pytest.raises(SFTInputError, match="verbatim"):
        encode_conversation(tokenizer, conversation(), chat_template=mangled)


def test_truncation_keeps_the_start(tokenizer: Any) -> None:
    full = encode_conversation(tokenizer, conversation())
    cut = encode_conversation(tokenizer, conversation(), max_length=20)
    assert cut.truncated and cut.input_ids == full.input_ids[:20]
    assert cut.labels == full.labels[:20]


def test_repeat_weighting_is_proportional_and_seeded() -> None:
    weights = [1.0, 3.0, 0.0, 0.5]
    picked = repeat_indices(weights * 200, seed=7)
    assert picked == repeat_indices(weights * 200, seed=7)
    counts = [sum(1 for i in picked if i % 4 == k) for k in range(4)]
    assert counts[2] == 0
    assert 2.5 < counts[1] / counts[0] < 3.5 and 0.35 < counts[3] / counts[0] < 0.65
    assert abs(len(picked) - 800) < 60  # mean weight normalised to 1
    assert repeat_indices([1.0, 1.0, 1.0], seed=0) == [0, 1, 2]
    with pytest.raises(SFTInputError):
        repeat_indices([1.0, -1.0], seed=0)


def test_prepare_dataset_drops_untrainable_rows_and_counts(tokenizer: Any) -> None:
    nothing = [{**m, "train": False} for m in conversation()]
    rows = datasets.Dataset.from_list(
        [
            {"messages": conversation(), "weight": 1.0, "success": True, "source": "oracle"},
            {"messages": nothing, "weight": 1.0, "success": False, "source": "policy"},
        ]
    )
    dataset, stats = prepare_dataset(rows, tokenizer, name="mix", max_length=512)
    assert dataset.column_names == ["input_ids", "labels"] and len(dataset) == 1
    assert stats.rows == 2 and stats.rows_dropped == 1 and stats.masked_turns == 1 + 3
    assert stats.success_rate == 1.0 and stats.sources == {"oracle": 1}
    only_nothing = datasets.Dataset.from_list([{"messages": nothing}])
    with pytest.raises(SFTInputError, match="dataset empty-mix has no trainable tokens"):
        prepare_dataset(only_nothing, tokenizer, name="empty-mix", max_length=512)
    with pytest.raises(SFTInputError, match="no 'messages' column"):
        prepare_dataset(
            datasets.Dataset.from_list([{"text": "x"}]), tokenizer, name="t", max_length=8
        )


# --------------------------------------------------------------------------- gradients


def make_trainer(checkpoint: Path, tmp_path: Path, rows: list[list[dict[str, Any]]]) -> Any:
    data = tmp_path / f"data-{len(list(tmp_path.iterdir()))}"
    datasets.Dataset.from_list([{"messages": m} for m in rows]).save_to_disk(str(data))
    config = SFTConfig(
        name="mask",
        model=str(checkpoint),
        dataset=str(data),
        output_dir=str(tmp_path / "run"),
        max_length=512,
        per_device_train_batch_size=1,
        learning_rate=1e-3,
        max_steps=1,
        weighting="none",
    )
    plan = plan_sft(config)
    trainer, _, _ = build_trainer(plan)
    return trainer, plan


def loss_and_grads(trainer: Any, example: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """The trainer's own loss on one example; parameter gradients; d loss / d hidden states."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    captured: dict[str, Any] = {}

    def keep(_module: Any, _inputs: Any, output: Any) -> None:
        output.retain_grad()
        captured["hidden"] = output

    handle = model.model.norm.register_forward_hook(keep)
    try:
        batch = trainer.data_collator([example])
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
    finally:
        handle.remove()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, captured["hidden"].grad[0].detach().clone()


def test_masked_turn_positions_get_exactly_zero_gradient(checkpoint: Path, tmp_path: Path) -> None:
    trainer, plan = make_trainer(checkpoint, tmp_path, [conversation()])
    example = plan.dataset[0]
    labels = example["labels"]
    _, grads, hidden_grad = loss_and_grads(trainer, example)
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    # position t predicts token t+1: its gradient is non-zero exactly when label t+1 is trained
    predicts_trained = [labels[t + 1] != IGNORE_INDEX for t in range(len(labels) - 1)]
    norms = hidden_grad.abs().sum(dim=-1).tolist()
    for t, trained in enumerate(predicts_trained):
        if trained:
            assert norms[t] > 0.0, f"position {t} predicts a trained token but got no gradient"
        else:
            assert norms[t] == 0.0, f"position {t} predicts an untrained token: {norms[t]}"
    # the masked turn is in the middle of the sequence and its tokens are present as input
    wrong_ids = plan.tokenizer(WRONG, add_special_tokens=False)["input_ids"]
    ids = example["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i : i + len(wrong_ids)] == wrong_ids)
    assert start + len(wrong_ids) < len(ids) - 5
    assert all(norms[t] == 0.0 for t in range(start - 1, start + len(wrong_ids) - 1))


def test_a_masked_last_turn_changes_no_gradient(checkpoint: Path, tmp_path: Path) -> None:
    without = conversation(error_last=True)[:-1]
    rows = [conversation(error_last=True), without, conversation(error_last=True, error_train=True)]
    trainer, _ = make_trainer(checkpoint, tmp_path, rows)
    from qpa.train.sft import encode_conversation as encode

    examples = [
        {"input_ids": e.input_ids, "labels": e.labels}
        for e in (encode(trainer.processing_class, r) for r in rows)
    ]
    assert examples[1]["input_ids"] == examples[0]["input_ids"][: len(examples[1]["input_ids"])]
    assert len(examples[0]["input_ids"]) > len(examples[1]["input_ids"])
    loss_with, grads_with, _ = loss_and_grads(trainer, examples[0])
    loss_without, grads_without, _ = loss_and_grads(trainer, examples[1])
    loss_flagged_off, grads_trained, _ = loss_and_grads(trainer, examples[2])
    assert torch.allclose(loss_with, loss_without, rtol=0, atol=1e-6)
    assert grads_with.keys() == grads_without.keys()
    for name, grad in grads_with.items():
        assert torch.allclose(grad, grads_without[name], rtol=1e-5, atol=1e-7), name
    # training on the erroneous turn would change the gradient: the comparison is sensitive
    assert not torch.allclose(loss_with, loss_flagged_off)
    assert any(
        not torch.allclose(grad, grads_trained[name], rtol=1e-3, atol=1e-6)
        for name, grad in grads_with.items()
    )
