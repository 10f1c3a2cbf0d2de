"""Online RL (`qpa.train.rl`) end to end on a tiny model (hidden 64, 2 layers), on CPU.

A random tiny policy never solves a sandbox task, so most tests act in `ScoredSandbox`: the real
sandbox with a stand-in verifier whose outcome depends on the episode's index (a policy that
sometimes succeeds), so groups land in several CARE tiers and advantages are not all zero.

What is checked: CARE on and off both train (weights move, metrics logged with the tier mix);
environment-feedback tokens carry no loss and get exactly zero gradient; the same run works under
DeepSpeed ZeRO-2 and ZeRO-3 (world size 1, gloo, with a KL reference model); a resumed run (from
the local folder or from the checkpoint store) stops at the same final step; rollouts go through
a real environment server (`qpa.envs.server`) over HTTP.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.uvicorn_thread import serve

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from qpa.api.v1alpha1 import TaskGenerator  # noqa: E402
from qpa.contract import Task, Verification  # noqa: E402
from qpa.envs.sandbox import SandboxEnv  # noqa: E402
from qpa.envs.sandbox.suite import generate_suite  # noqa: E402
from qpa.train.config import ConfigError  # noqa: E402
from qpa.train.metrics import read_metrics  # noqa: E402
from qpa.train.rl import (  # noqa: E402
    GenerationFailed,
    LossSettings,
    RLConfig,
    RLTrainer,
    TaskSource,
    TokenBatcher,
    Turn,
    build_samples,
    collate,
    load_tasks,
    policy_loss,
    run_rl,
    sample_tasks,
    token_logprobs,
)
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


PATTERN = (1.0, 1.0, 1.0, 1 / 3, 1.0, 0.0)
"""Progress of the episode with index i in its step is PATTERN[i % 6] (1.0 = success): with
k=3 the first task's group always succeeds, the second's is mixed; with k=2 likewise."""


class ScoredSandbox(SandboxEnv):
    """The sandbox with a stand-in verifier: a random tiny policy never solves a task, so the
    outcome is set by the episode's index in its step (see PATTERN), deterministic and varied."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def verify(self) -> Verification:
        progress = PATTERN[self.index % len(PATTERN)]
        return Verification(done=True, success=progress == 1.0, progress=progress)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return make_tiny_checkpoint(out, TINY, corpus=suite_corpus(conversations=6))


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    return sorted(pool, key=lambda t: len(t.instruction))[:3]


def make_config(model: Path, out: Path, **overrides: Any) -> RLConfig:
    data: dict[str, Any] = {
        "name": "rl-test",
        "model": str(model),
        "output_dir": str(out),
        "steps": 2,
        "tasks_per_step": 2,
        "samples_per_task": 2,
        "seed": 1,
        "harness": {"token_budget": 100, "max_tools": 1, "max_turns": 2},
        "generation": {"max_new_tokens": 8},
        "loss": {"micro_batch_size": 8},
        "optim": {"learning_rate": 0.01},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return RLConfig.from_dict(data)


def weights(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def moved(before: dict[str, Any], model: Any) -> float:
    after = model.state_dict()
    return max(float((after[k] - v).abs().max()) for k, v in before.items())


def scored(index: int) -> SandboxEnv:
    return ScoredSandbox(index)


# --------------------------------------------------------------------------- config and tasks


def test_example_config_and_task_sources(tasks: list[Task], tmp_path: Path) -> None:
    from qpa.contract import write_tasks
    from qpa.store import FileStore
    from qpa.store.manifest import DatasetManifest, Lineage, ManifestFile, write_manifest

    example = RLConfig.from_yaml(Path(__file__).parents[2] / "examples" / "local" / "rl.yaml")
    assert example.care.enabled and example.samples_per_task >= 2
    off = RLConfig.from_yaml(
        Path(__file__).parents[2] / "examples" / "local" / "rl.yaml", {"care.enabled": False}
    )
    assert not off.care.enabled and off.care.low_success_threshold == 0.2
    assert example.tasks.generator is not None and example.tasks.split == "train"
    with pytest.raises(ConfigError, match="care"):
        RLConfig.from_dict(
            {"model": "m", "care": {"low_success_threshold": 0.9, "high_success_threshold": 0.1}}
        )
    with pytest.raises(ConfigError, match="vllm_url"):
        RLConfig.from_dict({"model": "m", "generation": {"backend": "vllm"}})

    # a tasks JSONL, filtered by ids (the qpa.api TaskSource, selected by qpa.data)
    write_tasks(tmp_path / "tasks.jsonl", tasks)
    jsonl = (tmp_path / "tasks.jsonl").as_uri()
    chosen = load_tasks(TaskSource(dataset_uri=jsonl, task_ids=[tasks[1].id]))
    assert [t.id for t in chosen] == [tasks[1].id]
    # a dataset of tasks (rows) and a dataset naming its tasks (lineage) over the suite
    store = FileStore(tmp_path / "data")
    info = store.put_bytes("tasks/part-0.jsonl", (tmp_path / "tasks.jsonl").read_bytes())
    part = ManifestFile.of(info, len(tasks), key="part-0.jsonl")  # keys: relative to the prefix
    manifest = DatasetManifest(name="t", kind="tasks", files=[part])
    write_manifest(store, "tasks", manifest)
    rows = TaskSource(dataset_uri=(tmp_path / "data" / "tasks").as_uri())
    assert len(load_tasks(rows)) == len(tasks)
    named = DatasetManifest(name="s", kind="sft", lineage=Lineage.for_tasks([tasks[0].id]))
    write_manifest(store, "sft", named)
    lineage = TaskSource(dataset_uri=(tmp_path / "data" / "sft").as_uri())
    assert [t.id for t in load_tasks(lineage)] == [tasks[0].id]
    with pytest.raises(ConfigError, match="nope"):
        load_tasks(TaskSource(generator=TaskGenerator(), task_ids=["nope"]))

    # every task once per epoch, the same sequence for the same seed
    first = [t.id for step in range(3) for t in sample_tasks(tasks, 1, 7, step)]
    assert sorted(first) == sorted(t.id for t in tasks)
    assert first == [t.id for step in range(3) for t in sample_tasks(tasks, 1, 7, step)]


# --------------------------------------------------------------------------- CARE on / off


@pytest.mark.parametrize("care", [True, False], ids=["care_on", "care_off"])
def test_rl_steps_train_and_log(
    checkpoint: Path, tasks: list[Task], tmp_path: Path, care: bool
) -> None:
    config = make_config(checkpoint, tmp_path, care={"enabled": care})
    trainer = RLTrainer(config, tasks=tasks, environment=scored)
    start = weights(trainer.model)
    results = [trainer.train_step(), trainer.train_step()]
    assert trainer.step == 2

    tiers = Counter(t for r in results for g in r.groups for t in [g.tier])
    if care:
        assert set(tiers) == {"efficiency_refinement", "outcome_consolidation"}, tiers
    else:
        assert set(tiers) == {"outcome_consolidation"}  # vanilla: one fixed reward
    assert any(a != 0 for r in results for g in r.groups for a in g.advantages)
    assert moved(start, trainer.model) > 0  # the policy was updated

    for result in results:
        assert len(result.episodes) == 2 * 2
        for episode in result.episodes:
            assert episode.turns, "every episode asks the model at least once"
            assert episode.trajectory.totals.completion_tokens == sum(
                len(t.completion_ids) for t in episode.turns
            )

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        for key in (
            "loss",
            "reward",
            "success_rate",
            "output_tokens_mean",
            "tool_calls_mean",
            "rollout_s",
            "update_s",
        ):
            assert key in record, key
        assert set(record["care_tiers"]) == {
            "progress_shaping",
            "outcome_consolidation",
            "efficiency_refinement",
        }
        assert record["output_tokens"] > 0
    assert trainer.metrics.value("qpa_train_step") == 2
    assert (tmp_path / "checkpoint-2" / "model" / "config.json").exists()
    assert (tmp_path / "checkpoint-2" / "qpa_checkpoint.json").exists()  # hashed: complete


# --------------------------------------------------------------------------- masking


def test_environment_feedback_tokens_get_zero_gradient(checkpoint: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    # Two turns that pack into one sequence: prompt | completion | feedback | completion.
    prompt, first, feedback, second = [5, 6, 7, 8], [20, 21, 22], [30, 31, 32, 33], [40, 41]
    turns = [
        Turn(prompt, first),
        Turn([*prompt, *first, *feedback], second),
        Turn([9, 9, 9], [50]),  # a sub-agent's own conversation: not a prefix, a new sample
    ]
    samples = build_samples(turns, advantage=1.5)
    assert len(samples) == 2
    packed = samples[0]
    assert packed.input_ids == [*prompt, *first, *feedback, *second]
    assert packed.prompt_len == len(prompt)
    assert packed.mask == [1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert build_samples(turns, advantage=1.0, pack=False)[1].mask == [1, 1]

    batch = collate(samples, pad_id=0)
    captured: dict[str, Any] = {}

    def keep(_module: Any, _inputs: Any, output: Any) -> None:
        output.retain_grad()
        captured["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    logps = token_logprobs(model, batch)
    handle.remove()
    loss, _ = policy_loss(logps, logps.detach(), batch, LossSettings(), normalizer=6.0)
    loss.backward()
    grad = captured["logits"].grad  # [rows, C + 1, vocab]; position j predicts token P + j
    per_position = grad[:, :-1, :].abs().sum(-1)
    mask = batch.loss_mask.bool()
    assert torch.all(per_position[~mask] == 0), "feedback/padding positions got gradient"
    assert torch.all(per_position[mask] > 0)
    assert torch.all(grad[:, -1, :] == 0)


def test_trained_tokens_are_exactly_the_sampled_ones(
    checkpoint: Path, tasks: list[Task], tmp_path: Path
) -> None:
    config = make_config(checkpoint, tmp_path, harness={"max_turns": 3}, tasks_per_step=1)
    trainer = RLTrainer(config, tasks=tasks, environment=scored)
    episodes = trainer.rollout(tasks[:1])
    for episode in episodes:
        samples = build_samples(episode.turns, 1.0)
        trained = [
            token
            for s in samples
            for token, m in zip(s.input_ids[s.prompt_len :], s.mask, strict=True)
            if m
        ]
        assert trained == [t for turn in episode.turns for t in turn.completion_ids]
        # The environment's answers are in the prompts, never among the trained tokens.
        for later in episode.turns[1:]:
            assert len(later.prompt_ids) > len(episode.turns[0].prompt_ids)


def test_token_batcher_answers_waiting_episodes_in_one_batch() -> None:
    calls: list[list[list[int]]] = []

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        calls.append(prompts)
        if any(p[0] < 0 for p in prompts):
            raise RuntimeError("out of memory")
        return [[p[0] * 10] for p in prompts]

    def run(values: list[int]) -> tuple[list[Any], TokenBatcher]:
        batcher = TokenBatcher(generate, max_batch=8)
        out: list[Any] = [None] * len(values)

        def worker(i: int) -> None:
            try:
                out[i] = batcher.submit([values[i]], (0, i))
                out[i] = [out[i], batcher.submit([values[i] + 1], (0, i))]
            except GenerationFailed as exc:
                out[i] = exc
            finally:
                batcher.leave()

        batcher.enter(len(values))
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(values))]
        for thread in threads:
            thread.start()
        batcher.serve()
        for thread in threads:
            thread.join()
        return out, batcher

    out, batcher = run([1, 2, 3, 4])
    assert out == [[[10], [20]], [[20], [30]], [[30], [40]], [[40], [50]]]
    assert batcher.calls == 2 and [len(c) for c in calls] == [4, 4]  # all episodes at once
    assert calls[0] == [[1], [2], [3], [4]]  # ordered by episode, whatever the thread timing
    calls.clear()
    out, batcher = run([-1, 2])
    assert all(isinstance(o, GenerationFailed) for o in out)
    assert isinstance(batcher.failure, RuntimeError)


# --------------------------------------------------------------------------- DeepSpeed


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_world_size_one(
    checkpoint: Path, tasks: list[Task], tmp_path: Path, stage: int
) -> None:
    pytest.importorskip("deepspeed")
    config = make_config(
        checkpoint,
        tmp_path,
        deepspeed={"enabled": True, "zero_stage": stage},
        loss={"beta": 0.05},  # with a reference model (under ZeRO-3: an inference engine)
    )
    trainer = RLTrainer(config, tasks=tasks, environment=scored)
    assert trainer.engine is not None
    with trainer.full_parameters():
        start = weights(trainer.model)
    result = trainer.train()
    assert result.final_step == 2
    with trainer.full_parameters():
        assert moved(start, trainer.model) > 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["micro_batches"] >= 1 for r in records)
    assert records[-1]["kl"] > 0  # the policy moved away from the reference
    saved = tmp_path / "checkpoint-2"
    assert (saved / "deepspeed").is_dir()
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(saved / "model", local_files_only=True)
    with trainer.full_parameters():
        for name, value in trainer.model.state_dict().items():
            assert torch.allclose(reloaded.state_dict()[name], value.float()), name


# --------------------------------------------------------------------------- resume


def test_resume_reaches_the_same_final_step(
    checkpoint: Path, tasks: list[Task], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    store = tmp_path / "store"
    config = make_config(checkpoint, out, steps=3, checkpoint={"store": str(store)})
    first = RLTrainer(config, tasks=tasks, environment=scored)
    first.train_step()
    first.train_step()  # "killed" after step 2 (checkpoints every step)
    del first

    resumed_config = config.model_copy(
        update={"checkpoint": config.checkpoint.model_copy(update={"resume": "latest"})}
    )
    second = RLTrainer(resumed_config, tasks=tasks, environment=scored)
    assert second.step == second.resumed_from == 2
    result = second.train()
    assert result.final_step == 3 and result.resumed_from == 2
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    assert kept == ["checkpoint-2", "checkpoint-3"]  # keep_last=2
    assert result.final_dir is not None and (result.final_dir / "config.json").exists()
    assert result.final_uri is not None and result.final_uri.endswith("trainingruns/rl-test/final")

    # A new pod with an empty working folder resumes from the store; nothing is left to do.
    again = run_rl(
        resumed_config.model_copy(update={"output_dir": str(tmp_path / "fresh")}),
        tasks=tasks,
        resume=True,
    )
    assert again.final_step == 3 and again.resumed_from == 3

    with pytest.raises(ConfigError, match="no complete checkpoint"):
        RLTrainer(
            resumed_config.model_copy(
                update={
                    "output_dir": str(tmp_path / "empty"),
                    "checkpoint": resumed_config.checkpoint.model_copy(update={"store": None}),
                }
            ),
            tasks=tasks,
        )


# --------------------------------------------------------------------------- env server


@contextlib.contextmanager
def serving(counts: Counter[str]) -> Iterator[str]:
    """A sandbox environment server in a thread (counting requests by path); yields its URL."""

    from qpa.envs.server import create_app

    app = create_app("sandbox", max_sessions=32)

    async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            counts[scope["path"]] += 1
        await app(scope, receive, send)

    with serve(counted) as url:
        yield url


def _answered(exposition: str) -> Counter[str]:
    """Successful requests by operation (every channel) from an env server's `/metrics`."""
    from prometheus_client.parser import text_string_to_metric_families

    answered: Counter[str] = Counter()
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "qpa_env_requests_total" and sample.labels["code"] == "200":
                answered[sample.labels["op"]] += int(sample.value)
    return answered


def test_rollouts_through_an_env_server(
    checkpoint: Path, tasks: list[Task], tmp_path: Path
) -> None:
    counts: Counter[str] = Counter()
    with serving(counts) as url:
        config = make_config(checkpoint, tmp_path, steps=1)
        result = run_rl(config, env_urls=[url], tasks=tasks)
        served = _answered(httpx.get(f"{url}/metrics").text)
    assert result.final_step == 1
    # the rollouts use the session channel (RemoteEnv's default), so count what the server
    # answered over any channel, not HTTP paths
    assert served["reset"] == 2 * 2  # one server session per episode
    assert served["verify"] >= 2 * 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[0]["episodes"] == 4 and records[0]["environment_failures"] == 0
