"""Tiny checkpoints: tokenizer from the suite's text, Qwen3 from a config, loadable by
`LocalBackend` (no hub, no downloads)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from qpa.harness.backends import ChatMessage, LocalBackend  # noqa: E402
from qpa.harness.backends.local import CHATML_TEMPLATE  # noqa: E402
from qpa.harness.parsing import ParseFailure, parse_completion  # noqa: E402
from qpa.train.tiny import (  # noqa: E402
    PROTOCOL_TOKENS,
    SPECIAL_TOKENS,
    TinyConfig,
    build_model,
    build_tokenizer,
    make_tiny_checkpoint,
    sft_rows_from_suite,
    suite_corpus,
)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Any:
    """One intra-op thread: on a 2-core machine whose other core is busy, two OpenMP threads
    wait on each other and a step takes ten times longer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL = TinyConfig(
    vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=2,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
)  # fmt: skip


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return suite_corpus(conversations=4, instructions=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), SMALL, corpus=corpus)


def test_corpus_is_the_suites_own_text(corpus: list[str]) -> None:
    text = "\n".join(corpus)
    from qpa.envs.sandbox.suite import generate_suite

    test_split = {t.instruction for t in generate_suite() if t.split == "test"}
    assert "contacts_search" in text and "<tool_call>" in text and "<tool_response>" in text
    assert "You are a mobile planner agent" in text and "# Tools" in text
    assert "### " in text or "resolve_person" in text  # Skills
    assert not any(line in test_split for line in corpus)  # the test split never leaks in


def test_tokenizer_trains_fast_and_keeps_protocol_tags(corpus: list[str]) -> None:
    started = time.perf_counter()
    tokenizer = build_tokenizer(corpus, 1024, SPECIAL_TOKENS)
    assert time.perf_counter() - started < 10.0  # well under a second on an idle machine
    assert len(tokenizer) <= 1024
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for tag in (*PROTOCOL_TOKENS, "<|im_start|>", "<|im_end|>"):
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    text = '<tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    # the parser must still see the tags after `skip_special_tokens` (as LocalBackend decodes)
    kept = tokenizer.decode(ids, skip_special_tokens=True)
    assert kept == text.replace("<|im_end|>", "")
    assert not isinstance(parse_completion(kept, []), ParseFailure)


def test_model_is_seeded_and_sized_from_the_config(corpus: list[str]) -> None:
    tokenizer = build_tokenizer(corpus[:200], 512)
    one, two = build_model(SMALL, tokenizer=tokenizer), build_model(SMALL, tokenizer=tokenizer)
    other = build_model(SMALL.model_copy(update={"seed": 1}), tokenizer=tokenizer)
    assert one.config.model_type == "qwen3" and one.config.num_hidden_layers == 2
    rows = one.get_input_embeddings().weight.shape[0]
    assert rows % 64 == 0 and len(tokenizer) <= rows < len(tokenizer) + 64
    assert one.config.eos_token_id == tokenizer.eos_token_id
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), two.parameters(), strict=True))
    assert not all(
        torch.equal(a, b) for a, b in zip(one.parameters(), other.parameters(), strict=True)
    )


def test_checkpoint_is_an_ordinary_hf_folder(checkpoint: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("config.json", "model.safetensors", "tokenizer.json", "qpa_tiny.json"):
        assert (checkpoint / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    assert model.config.vocab_size >= len(tokenizer)
    assert "generation" in tokenizer.chat_template
    manifest = json.loads((checkpoint / "qpa_tiny.json").read_text())
    assert manifest["tiny_config"]["hidden_size"] == 64
    assert manifest["tokenizer_size"] == len(tokenizer)


def test_local_backend_loads_and_runs_it(checkpoint: Path) -> None:
    backend = LocalBackend(checkpoint, max_new_tokens=12)
    messages = [ChatMessage.system("You operate a phone."), ChatMessage.user("Call Ana.")]
    prompt = backend.render_prompt(messages, [])
    tokenizer: Any = backend._tokenizer
    plain = [{"role": "system", "content": prompt.split("\n", 1)[1].split("<|im_end|>")[0]}]
    assert prompt.startswith("<|im_start|>system\nYou operate a phone.")
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.apply_chat_template(plain, tokenize=False) == tokenizer.apply_chat_template(
        plain, tokenize=False, chat_template=CHATML_TEMPLATE
    )
    completion = backend.complete(messages, [])
    assert 0 < completion.usage.completion_tokens <= 12
    parse_completion(completion, [])  # gibberish parses to an action or a failure, never raises


def test_sft_rows_have_the_dataset_shape() -> None:
    rows = sft_rows_from_suite(6, seed=3, error_rate=1.0)
    assert len(rows) == 6
    keys = {"messages", "task_id", "capabilities", "domain", "difficulty", "source", "weight"}
    for row in rows:
        assert keys | {"success"} == set(row)
        roles = [m["role"] for m in row["messages"]]
        assert roles[0] == "system" and roles[1] == "user" and set(roles) <= {
            "system", "user", "assistant"
        }  # fmt: skip
        flagged = [m for m in row["messages"] if m["role"] == "assistant" and not m["train"]]
        assert len(flagged) == 1 and "open_app_menu" in flagged[0]["content"]
        assert not any(m["train"] for m in row["messages"] if m["role"] != "assistant")
        assert row["success"] is True


def test_cli_builds_a_checkpoint_and_sample_data(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import qpa.cli.train  # noqa: F401  (registers `qpa train` until the CLI lists it)
    from qpa.cli import app

    result = CliRunner().invoke(
        app,
        [
            "train", "tiny", "--out", str(tmp_path / "tiny"), "--vocab-size", "512",
            "--hidden-size", "32", "--heads", "2", "--kv-heads", "1", "--conversations", "2",
            "--sample-data", str(tmp_path / "data"), "--sample-rows", "4",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tiny_config"]["hidden_size"] == 32 and report["sample_data"]["rows"] == 4
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    assert (tmp_path / "data" / "dataset_info.json").is_file()
