"""RL rollouts through a rollout server: `qpa rollout serve --backend hf` as a real process.

The server speaks the API TRL's `VLLMClient` uses against `trl vllm-serve` (vLLM's own server in
dev mode); the trainer runs with `generation.backend: vllm` against it (`qpa.train.rl.vllm`).
What is checked, on the tiny model on CPU, over 2 RL steps:

- every completion comes from the server (the trainer's own `generate` is never called), with
  the sampler's log-probability of each sampled token on every turn;
- the weights are synced at start-up and after each step over the gloo weight-sync group, from
  a trainer under DeepSpeed ZeRO-3 (gathered one parameter at a time; the group lives beside
  DeepSpeed's process group): the server's weight digest equals the trainer's each time, and it
  changes as the policy learns;
- the sampler's log-probs reach the loss (the batch's `sampler_logprobs` on every trained
  token), and they are right: at synced weights they equal the trainer's own log-probs of the
  same tokens (to 1e-4; only padding and batching differ);
- a server that is not there, and a tensor the server has no parameter for, fail clearly.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from qpa.contract import Task, Verification  # noqa: E402
from qpa.envs.sandbox import SandboxEnv  # noqa: E402
from qpa.envs.sandbox.suite import generate_suite  # noqa: E402
from qpa.train.rl import RLConfig, RLTrainer  # noqa: E402
from qpa.train.rl import trainer as trainer_module  # noqa: E402
from qpa.train.rl.loss import Batch  # noqa: E402
from qpa.train.rl.rollout_server import weights_digest  # noqa: E402
from qpa.train.rl.vllm import RolloutClient, RolloutServerError  # noqa: E402
from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, suite_corpus  # noqa: E402

TINY = TinyConfig(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=8192,
)
PATTERN = (1.0, 0.0, 1 / 3, 1.0)


class ScoredSandbox(SandboxEnv):
    """The sandbox with a stand-in verifier (a random tiny policy never solves a task), so
    groups have mixed outcomes and non-zero advantages."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def verify(self) -> Verification:
        progress = PATTERN[self.index % len(PATTERN)]
        return Verification(done=True, success=progress == 1.0, progress=progress)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return make_tiny_checkpoint(out, TINY, corpus=suite_corpus(conversations=6))


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    return sorted(pool, key=lambda t: len(t.instruction))[:2]


@contextlib.contextmanager
def rollout_server(model: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`qpa rollout serve --backend hf` on 127.0.0.1 (not waited for: the trainer's client
    waits for `/health`, so the server's start overlaps the trainer's set-up)."""
    port = free_port()
    argv = [str(Path(sys.executable).with_name("qpa")), "rollout", "serve", "--backend", "hf"]
    argv += ["--model", str(model), "--port", str(port), "--group-timeout", "60"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def output_of(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=20)
    return proc.stdout.read().decode() if proc.stdout else "no output"


@pytest.fixture(scope="module")
def server(checkpoint: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with rollout_server(checkpoint) as running:
        yield running


def trainer_digest(trainer: RLTrainer) -> str:
    with trainer.full_parameters():
        return weights_digest(trainer.model)


def server_digest(url: str) -> str:
    return str(httpx.get(f"{url}/qpa/weights/digest", timeout=10).json()["sha256"])


def test_trl_vllm_client_speaks_to_the_stand_in(
    server: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's own `VLLMClient` (its vLLM import check aside) against `--backend hf`: the
    server answers TRL's generation, info, world-size and prefix-cache calls as vLLM does."""
    from trl.generation import vllm_client

    url, proc = server
    try:
        RolloutClient(url, timeout_s=120).wait_ready()
    except RolloutServerError as exc:
        raise AssertionError(f"{exc}\n{output_of(proc)}") from exc
    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *args, **kwargs: True)
    client = vllm_client.VLLMClient(base_url=url, connection_timeout=10)
    assert client.get_world_size() == 1
    assert client.get_server_info()["weight_transfer_config"] == {"backend": "gloo"}
    prompts = [[5, 6, 7], [8, 9]]
    out = client.generate(prompts, n=2, max_tokens=4, temperature=0.9, logprobs=0)
    assert out["prompt_ids"] == prompts
    assert len(out["completion_ids"]) == 4
    for ids, logprobs, token_ids in zip(
        out["completion_ids"], out["logprobs"], out["logprob_token_ids"], strict=True
    ):
        assert 1 <= len(ids) <= 4
        assert [row[0] for row in token_ids] == ids  # the sampled token's own log-prob
        assert all(row[0] is not None and row[0] <= 0 for row in logprobs)
    client.reset_prefix_cache()

    # bad requests are refused with the field named, and open no weight-sync group
    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{url}{path}", json=body, timeout=30)

    too_long = post("/v1/completions", {"prompt": [[5] * 8192], "max_tokens": 1})
    assert too_long.status_code == 400 and "maximum context length is 8192" in too_long.text
    init = {"master_address": "127.0.0.1", "master_port": 1, "world_size": 3}
    refused = post("/init_weight_transfer_engine", {"init_info": init})
    assert refused.status_code == 400 and "init_info.world_size" in refused.text
    assert post("/update_weights", {"update_info": "x"}).status_code == 400


def test_rl_through_the_rollout_server(
    server: tuple[str, subprocess.Popen[bytes]],
    checkpoint: Path,
    tasks: list[Task],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_local_generation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the trainer generated with its own model")

    monkeypatch.setattr(trainer_module, "hf_generate", no_local_generation)
    seen: list[tuple[Any, Any]] = []  # (batch, old log-probs) of every loss call
    real_loss = trainer_module.policy_loss

    def spy_loss(*args: Any, **kwargs: Any) -> Any:
        batch = next(a for a in args if isinstance(a, Batch))
        seen.append((batch, args[1].detach().clone()))
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", spy_loss)

    url, proc = server
    config = RLConfig.from_dict(
        {
            "name": "rl-rollout",
            "model": str(checkpoint),
            "output_dir": str(tmp_path / "run"),
            "steps": 2,
            "tasks_per_step": 2,
            "samples_per_task": 2,
            "seed": 3,
            "harness": {"token_budget": 100, "max_tools": 1, "max_turns": 2},
            "generation": {
                "backend": "vllm",
                "max_new_tokens": 8,
                "vllm_url": url,
                "vllm_group_port": free_port(),
                "vllm_timeout_s": 120,
            },
            "loss": {"micro_batch_size": 8},
            "optim": {"learning_rate": 0.05},
            "checkpoint": {"every_steps": 10, "save_final": False},
            # ZeRO-3: weights are gathered one parameter at a time for the push, and the
            # weight-sync group lives beside DeepSpeed's own process group
            "deepspeed": {"enabled": True, "zero_stage": 3},
        }
    )
    try:
        trainer = RLTrainer(config, tasks=tasks, environment=ScoredSandbox)
    except RolloutServerError as exc:
        raise AssertionError(f"{exc}\n{output_of(proc)}") from exc
    try:
        # the starting weights were pushed at set-up: the server holds the trainer's
        assert trainer.zero3
        start = trainer_digest(trainer)
        assert server_digest(url) == start
        digests = [start]
        for step in (1, 2):
            seen.clear()
            result = trainer.train_step()
            assert result.metrics["weight_sync_s"] > 0
            turns = [turn for episode in result.episodes for turn in episode.turns]
            assert turns and all(t.sampler_logprobs is not None for t in turns)
            for turn in turns:
                assert turn.sampler_logprobs is not None
                assert len(turn.sampler_logprobs) == len(turn.completion_ids)
                assert all(v <= 0.0 and math.isfinite(v) for v in turn.sampler_logprobs)
            # the loss got the sampler's log-probs, and they are the synced policy's
            assert seen, "no loss was computed"
            for batch, old in seen:
                sampler = batch.sampler_logprobs
                assert sampler is not None
                trained = batch.loss_mask > 0
                assert not torch.isnan(sampler[trained]).any()
                gap = (sampler[trained] - old[trained]).abs().max()
                assert float(gap) < 1e-4, (step, float(gap))
            # so the truncated importance weights are 1 and none is cut (the step's metrics)
            assert abs(result.metrics["is_weight"] - 1.0) < 1e-3, result.metrics
            assert result.metrics["is_truncated"] == 0.0
            # the step's new weights reached the server
            digest = server_digest(url)
            assert digest == trainer_digest(trainer), step
            assert digest not in digests, step  # the policy moved, and so did the server
            digests.append(digest)
            assert trainer._vllm is not None
        with pytest.raises(RolloutServerError, match="nope: no such parameter"):
            trainer._vllm.push_weights([("nope", torch.zeros(2))])
        assert server_digest(url) == digests[-1]
    finally:
        trainer.close()


def test_unreachable_server_is_a_clear_error() -> None:
    client = RolloutClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    with pytest.raises(RolloutServerError, match=r"not ready after 0\.5 s"):
        client.wait_ready()
    with pytest.raises(ValueError, match=r"generation\.vllm_url"):
        RolloutClient("http://:80")


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_the_operator_starts_the_rollout_server_of_a_trainingrun(
    kube_api: Any, operator_env: Path
) -> None:
    """The real operator against the test API server: a TrainingRun with spec.rl.generation
    gets the server's Deployment, Service and policies (owned by the run, validated by the
    server against the official schemas), and its ranks' work order names the server."""
    from helpers.operator_runner import example, exists, operator

    from qpa.api.v1alpha1 import WORK_ORDER_KEY, TrainingRun, WorkOrder

    run = example("trainingrun.yaml", 1)
    run["spec"]["rl"]["generation"] = {"backend": "vllm", "gpus": 1, "maxModelLength": 4096}
    name = run["metadata"]["name"]
    with operator():
        kube_api.create(run)
        tr = await exists(kube_api, "qtr", name)
        deployment = await exists(kube_api, "deployments", f"{name}-rollout")
        service = await exists(kube_api, "services", f"{name}-rollout")
        ingress = await exists(kube_api, "networkpolicies", f"{name}-rollout-ingress")
        egress = await exists(kube_api, "networkpolicies", f"{name}-rollout-egress")
        config = await exists(kube_api, "configmaps", f"{name}-order")
        for child in (deployment, service, ingress, egress):
            (ref,) = child["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["uid"]) == ("TrainingRun", tr["metadata"]["uid"])
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["command"][:3] == ["qpa", "rollout", "serve"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert service["spec"]["ports"][0]["port"] == 8000
        order = WorkOrder.parse(yaml.safe_load(config["data"][WORK_ORDER_KEY]), TrainingRun)
        namespace = tr["metadata"]["namespace"]
        assert order.resolved.rollout_server_url == (
            f"http://{name}-rollout.{namespace}.svc.cluster.local:8000"
        )
        assert order.resolved.rollout_group_port == 51216
        assert order.resource.spec.rl is not None and order.resource.spec.rl.generation
        assert order.resource.spec.rl.generation.max_model_length == 4096
