"""The rollout protocol's pure parts: announced tensors, parsed choices, and `qpa rollout serve`
refusing bad flags with the flag or field named (no model is loaded, nothing listens)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qpa.cli import app
from qpa.train.rl.vllm import (
    ParamMeta,
    RolloutServerError,
    _sampled,
    parse_update_info,
    update_info,
)

runner = CliRunner()


def test_update_info_round_trips_and_bad_ones_name_the_field() -> None:
    metas = [ParamMeta("a.weight", "bfloat16", (2, 3)), ParamMeta("b", "float32", (4,))]
    info = update_info(metas)
    assert info == {
        "names": ["a.weight", "b"],
        "dtype_names": ["bfloat16", "float32"],
        "shapes": [[2, 3], [4]],
    }
    assert parse_update_info(info) == metas
    with pytest.raises(ValueError, match=r"update_info: missing 'shapes'"):
        parse_update_info({"names": [], "dtype_names": []})
    with pytest.raises(ValueError, match="differ in length"):
        parse_update_info({"names": ["a"], "dtype_names": [], "shapes": [[1]]})


def test_a_choice_gives_ids_and_the_sampled_tokens_log_probs() -> None:
    choice = {"token_ids": [5, 7], "logprobs": {"token_logprobs": [-0.5, -1.25]}}
    sampled = _sampled(choice)
    assert (sampled.ids, sampled.logprobs) == ([5, 7], [-0.5, -1.25])
    assert _sampled({"token_ids": [5], "logprobs": None}).logprobs is None
    with pytest.raises(RolloutServerError, match="1 log-probs for 2 tokens"):
        _sampled({"token_ids": [5, 7], "logprobs": {"token_logprobs": [-0.5]}})
    with pytest.raises(RolloutServerError, match="without token_ids"):
        _sampled({"text": "hi"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "hf"], "--model: required"),
        (["--model", "m", "--backend", "sglang"], "backend"),
        (["--model", "m", "--dtype", "int3"], "dtype"),
        (["--model", "/nonexistent/model"], "model"),
    ],
)
def test_rollout_serve_refuses_bad_flags(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["rollout", "serve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
