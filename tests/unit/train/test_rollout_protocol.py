"""The rollout protocol's pure parts: announced tensors, parsed choices, and `qpa rollout serve`
refusing bad flags with the flag or field named (no model is loaded, nothing listens)."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from qpa.cli import app
from qpa.train.rl.vllm import (
    ParamMeta,
    RolloutClient,
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
    # a token the sampler gave no log-prob for stays unknown (NaN), not probability 1 (0.0)
    unknown = _sampled({"token_ids": [5, 7], "logprobs": {"token_logprobs": [None, -2.0]}})
    assert unknown.logprobs is not None and math.isnan(unknown.logprobs[0])
    assert unknown.logprobs[1] == -2.0
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


def fake_server(info: dict[str, Any] | None, seen: list[dict[str, Any]]) -> httpx.MockTransport:
    """vLLM's answers as a mock (`info`: `/server_info`'s `vllm_config`, None: not dev mode)."""

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "planner"}]})
        if path == "/server_info":
            return httpx.Response(404) if info is None else httpx.Response(200, json=info)
        if path == "/v1/completions":
            body = json.loads(request.content)
            seen.append(body)
            choices = [
                {"index": i, "token_ids": [3, 4], "logprobs": {"token_logprobs": [-0.1, -0.2]}}
                for i in range(len(body["prompt"]))
            ]
            return httpx.Response(200, json={"choices": choices[::-1]})  # any order
        return httpx.Response(500)

    return httpx.MockTransport(answer)


def test_the_client_asks_what_trl_asks_and_names_what_the_server_lacks() -> None:
    seen: list[dict[str, Any]] = []
    client = RolloutClient("http://vllm:8000", transport=fake_server({}, seen), timeout_s=1)
    client.wait_ready()
    assert client.model == "planner"
    out = client.generate([[1, 2], [3]], max_tokens=8, temperature=0.7, stop=["</finish>"])
    assert [(s.ids, s.logprobs) for s in out] == [([3, 4], [-0.1, -0.2])] * 2
    (body,) = seen
    assert body["model"] == "planner" and body["prompt"] == [[1, 2], [3]]
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert (body["logprobs"], body["n"], body["max_tokens"], body["temperature"]) == (0, 1, 8, 0.7)
    assert body["stop"] == ["</finish>"] and body["include_stop_str_in_output"]
    with pytest.raises(RolloutServerError, match="no weight-transfer engine"):
        client.open_communicator()
    plain = RolloutClient("http://vllm:8000", transport=fake_server(None, seen), timeout_s=1)
    with pytest.raises(RolloutServerError, match="VLLM_SERVER_DEV_MODE=1"):
        plain.open_communicator()
    assert client.generate([], max_tokens=1) == []
    with pytest.raises(RolloutServerError, match="push_weights before open_communicator"):
        client.push_weights([])


def test_only_the_main_process_joins_the_weight_group_and_pushes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rank generates through the server; rank 0 alone opens the communicator and pushes
    (the others wait at the barrier), as TRL does."""
    import contextlib
    from types import SimpleNamespace

    import torch

    from qpa.train.rl import RLConfig, RLTrainer
    from qpa.train.rl import vllm as vllm_module

    calls: list[tuple[int, str]] = []

    class FakeClient:
        def __init__(self, url: str, **kwargs: Any) -> None:
            self.rank = current
            calls.append((self.rank, f"client {url} group {kwargs['group_port']}"))

        def wait_ready(self) -> None:
            calls.append((self.rank, "ready"))

        def open_communicator(self, device: Any) -> None:
            calls.append((self.rank, "open"))

        def push_weights(self, named: Any) -> int:
            calls.append((self.rank, f"push {len(list(named))}"))
            return 0

    monkeypatch.setattr(vllm_module, "RolloutClient", FakeClient)
    config = RLConfig.from_dict(
        {"model": "m", "generation": {"backend": "vllm", "vllm_url": "http://s:8000"}}
    )
    for current in (0, 1):
        stub: Any = SimpleNamespace(
            config=config,
            rank=current,
            zero3=False,  # ZeRO-3's per-parameter gather: tests/integration/test_rollout_server.py
            device="cpu",
            model=torch.nn.Linear(2, 2),
            full_parameters=contextlib.nullcontext,
            _barrier=lambda rank=current: calls.append((rank, "barrier")),
        )
        stub._push_weights = lambda stub=stub: RLTrainer._push_weights(stub)
        RLTrainer._setup_vllm(stub)
    assert calls == [
        (0, "client http://s:8000 group 51216"),
        (0, "ready"),
        (0, "open"),
        (0, "push 2"),
        (0, "barrier"),
        (1, "client http://s:8000 group 51216"),
        (1, "ready"),
        (1, "barrier"),
    ]
