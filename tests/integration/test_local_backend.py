"""`LocalBackend` on a tiny checkpoint built at test time (no downloads, no hub).

A byte-level BPE tokenizer is trained on a few lines in well under a second and wrapped as a
`PreTrainedTokenizerFast` with a ChatML template; a 2-layer `Qwen3ForCausalLM` (hidden 64) is
built from a config. Both are saved with `save_pretrained` and loaded back by the backend. The
random model's output is gibberish: parsing it must give a `ParseFailure`, never a crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qpa.contract import ToolSpec
from qpa.harness.backends import BackendUnavailable, ChatMessage, LocalBackend, make_backend
from qpa.harness.backends.local import CHATML_TEMPLATE
from qpa.harness.parsing import ParseFailure, parse_completion

TOOLS = [
    ToolSpec(
        name="contacts_search",
        description="Find contacts by name.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
            "additionalProperties": False,
        },
    )
]
MESSAGES = [ChatMessage.system("You operate a phone."), ChatMessage.user("Find Ana's number.")]
CORPUS = [
    "You operate a phone. Find Ana's number.",
    '<tool_call>{"name": "contacts_search", "arguments": {"query": "Ana"}}</tool_call>',
    '<tool_response>[{"name": "Ana Lima", "phone": "+1-555-0101"}]</tool_response>',
    "<finish>Ana's number is +1-555-0101</finish>",
    "The tools below take JSON arguments described by a schema of properties and types.",
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_checkpoint(path: Path, *, chat_template: str | None = CHATML_TEMPLATE) -> Path:
    """Train a tokenizer and build a random tiny Qwen3 model; save both to `path`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = tokenizers.Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(CORPUS * 4, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)

    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"))


def test_generates_with_token_usage(checkpoint: Path) -> None:
    backend = LocalBackend(checkpoint, max_new_tokens=24)
    completion = backend.complete(MESSAGES, TOOLS)
    prompt = backend.render_prompt(MESSAGES, TOOLS)
    tokenizer: Any = backend._tokenizer
    assert completion.usage.prompt_tokens == len(
        tokenizer(prompt, add_special_tokens=False)["input_ids"]
    )
    assert 0 < completion.usage.completion_tokens <= 24
    assert completion.finish_reason in ("stop", "length")
    assert completion.protocol == "text" and not completion.tool_calls
    assert completion.latency_ms > 0 and completion.model == str(checkpoint)
    # greedy decoding is deterministic
    assert backend.complete(MESSAGES, TOOLS).text == completion.text


def test_prompt_uses_the_text_protocol_and_chat_template(checkpoint: Path) -> None:
    backend = LocalBackend(checkpoint)
    prompt = backend.render_prompt(MESSAGES, TOOLS)
    assert prompt.startswith("<|im_start|>system\nYou operate a phone.")
    assert '"name": "contacts_search"' in prompt and "<tool_call>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_random_model_output_is_a_parse_failure_not_a_crash(checkpoint: Path) -> None:
    backend = LocalBackend(checkpoint, max_new_tokens=16)
    history = [
        *MESSAGES,
        ChatMessage.assistant(
            '<tool_call>{"name": "contacts_search", "arguments": {"query": "Ana"}}'
        ),
        ChatMessage.user("<tool_response>[]</tool_response>"),
    ]
    for messages in (MESSAGES, history):
        result = parse_completion(backend.complete(messages, TOOLS), TOOLS)
        assert isinstance(result, ParseFailure)
        assert result.kind in ("malformed_output", "unknown_tool", "invalid_arguments")
        assert result.feedback().status == "error"


def test_tokenizer_without_a_chat_template_gets_chatml(tmp_path: Path) -> None:
    path = build_checkpoint(tmp_path / "plain", chat_template=None)
    backend = make_backend("local", model_path=str(path), max_new_tokens=4)
    assert isinstance(backend, LocalBackend)
    prompt = backend.render_prompt(MESSAGES, TOOLS)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert backend.complete(MESSAGES, TOOLS).usage.completion_tokens > 0


def test_missing_or_broken_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(FileNotFoundError):
        LocalBackend(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    backend = LocalBackend(empty)
    with pytest.raises(BackendUnavailable) as info:
        backend.complete(MESSAGES, TOOLS)
    assert info.value.cause is not None and str(empty) in str(info.value)


def test_importing_the_harness_never_imports_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import qpa.harness, qpa.harness.backends, qpa.harness.parsing, qpa.harness.noisy\n"
        "from qpa.harness.backends import LocalBackend\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # never run from the repository root: its operator/ folder shadows the stdlib module
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
