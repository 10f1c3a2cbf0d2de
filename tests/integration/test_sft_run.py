"""Real SFT runs on a tiny Qwen3 (CPU, seconds): checkpoints to the store, metrics, kill and
resume to the same weights, DeepSpeed ZeRO-2/3 (world size 1 over gloo, through the CLI), bad
inputs rejected before compute; plus the pure parts (DeepSpeed JSON, indexed-Job launch,
settings, checkpoint integrity, metrics)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from prometheus_client import REGISTRY  # noqa: E402

from qpa.train.checkpoint import (  # noqa: E402
    CheckpointError,
    CheckpointStore,
    latest_local,
    record_local,
    verify_local,
)
from qpa.train.config import ConfigError, DeepSpeedSettings, SFTConfig  # noqa: E402
from qpa.train.deepspeed import (  # noqa: E402
    deepspeed_config,
    free_port,
    hostfile_text,
    launch_argv,
    launch_env,
    local_rank_env,
)
from qpa.train.metrics import TrainMetrics, read_metrics  # noqa: E402
from qpa.train.sft import SFTInputError, repeat_indices, train_sft  # noqa: E402
from qpa.train.tiny import (  # noqa: E402
    TinyConfig,
    build_model,
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


TINY = TinyConfig(
    vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=2,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
)  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sft")
    corpus = suite_corpus(conversations=4, instructions=300)
    model = make_tiny_checkpoint(root / "tiny", TINY, corpus=corpus)
    rows = sft_rows_from_suite(16, seed=1, error_rate=0.5)
    for i, row in enumerate(rows):
        row["weight"] = 2.0 if i % 4 == 0 else 1.0
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "data"))
    return {"root": root, "model": model, "data": root / "data"}


def settings(inputs: dict[str, Path], out: Path, **extra: Any) -> SFTConfig:
    data: dict[str, Any] = {
        "name": out.name,
        "model": str(inputs["model"]),
        "dataset": str(inputs["data"]),
        "output_dir": str(out),
        "max_length": 512,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-3,
        "max_steps": 4,
        "checkpoint": {"every_steps": 2},
        "metrics": {"logging_steps": 1},
    }
    for key, value in extra.items():
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return SFTConfig.from_dict(data)


# --------------------------------------------------------------------------- real runs


def test_sft_run_checkpoints_metrics_and_a_loadable_model(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    config = settings(inputs, tmp_path / "run-a", checkpoint={"store": store.as_uri()})
    result = train_sft(config)
    assert result.global_step == 4 and result.train_loss is not None
    assert result.stats.masked_turns > 0 and result.stats.trainable_tokens > 0
    assert result.stats.examples > result.stats.rows - result.stats.rows_dropped  # weight 2 rows
    # checkpoints every 2 steps, complete and hashed, in the store
    checkpoints = CheckpointStore.open(store.as_uri(), config.store_prefix)
    assert checkpoints.steps() == [2, 4]
    assert result.checkpoint_uris == [checkpoints.uri(2), checkpoints.uri(4)]
    assert not verify_local(tmp_path / "run-a" / "checkpoint-4")
    # metrics: JSONL and Prometheus
    records = read_metrics(result.metrics_path or "")
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(r["output_tokens"] > 0 and r["tokens"] >= r["output_tokens"] for r in steps[1:])
    assert records[0]["step"] == 0 and records[0]["success_rate"] == 1.0
    labels = {"run": "run-a", "stage": "sft"}
    assert REGISTRY.get_sample_value("qpa_train_step", labels) == 4
    assert (REGISTRY.get_sample_value("qpa_train_output_tokens_total", labels) or 0) > 0
    assert REGISTRY.get_sample_value("qpa_train_loss", labels) == pytest.approx(steps[-1]["loss"])
    # the final model goes to the store and loads in the Harness's local backend
    assert result.final_uri == store.as_uri() + "/trainingruns/run-a/final"
    from qpa.harness.backends import ChatMessage, LocalBackend

    completion = LocalBackend(result.final_dir or "", max_new_tokens=4).complete(
        [ChatMessage.user("Call Ana.")], []
    )
    assert completion.usage.completion_tokens > 0


def test_killed_run_resumes_to_the_same_weights(inputs: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    class Killed(Exception):
        pass

    class KillAtStep5(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 5:
                raise Killed

    store = (tmp_path / "store").as_uri()
    whole = train_sft(settings(inputs, tmp_path / "whole", max_steps=6))
    with pytest.raises(Killed):
        train_sft(
            settings(inputs, tmp_path / "broken", max_steps=6, checkpoint={"store": store}),
            callbacks=[KillAtStep5()],
        )
    assert latest_local(tmp_path / "broken") is not None
    # lose the local folder too: the checkpoint must come back from the store, verified
    for folder in (tmp_path / "broken").glob("checkpoint-*"):
        import shutil

        shutil.rmtree(folder)
    resumed = train_sft(
        settings(
            inputs,
            tmp_path / "broken",
            max_steps=6,
            checkpoint={"store": store, "resume": "latest"},
        )
    )
    assert resumed.resumed_step == 4 and resumed.global_step == whole.global_step == 6
    assert resumed.resumed_from == CheckpointStore.open(store, "trainingruns/broken").uri(4)
    # same data order, optimizer moments, scheduler and RNG: bit-identical weights and state
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "broken" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a = torch.load(tmp_path / "whole" / "checkpoint-6" / "optimizer.pt", weights_only=False)
    opt_b = torch.load(tmp_path / "broken" / "checkpoint-6" / "optimizer.pt", weights_only=False)
    for key, state in opt_a["state"].items():
        assert torch.equal(state["exp_avg_sq"], opt_b["state"][key]["exp_avg_sq"])
        assert int(state["step"]) == int(opt_b["state"][key]["step"]) == 6


DRIVER = """
import json, sys
import torch.distributed as dist
from transformers import TrainerCallback
from qpa.train.config import SFTConfig
from qpa.train.sft import train_sft

class Killed(Exception):
    pass

class KillAtStep3(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            raise Killed

try:
    train_sft(SFTConfig.from_yaml(sys.argv[1]), callbacks=[KillAtStep3()])
except Killed:
    print(json.dumps({"killed_at": 3, "backend": dist.get_backend()}))
# finish through the command line, in the same process: `qpa train sft --config ... --resume`
import qpa.cli.train
from qpa.cli import app
app(["train", "sft", "--config", sys.argv[1], "--resume"], standalone_mode=False)
"""


def _run_driver(config: Path, cwd: Path, port: int) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    # never from the repository root: its operator/ folder shadows the stdlib module
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(config)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_zero2_and_zero3_on_cpu_with_gloo_killed_and_resumed(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """One process per ZeRO stage (both at once): a run killed after step 3, then
    `qpa train sft --resume` continuing from the step-2 checkpoint (DeepSpeed restores its own
    optimizer shards) to step 4."""
    processes = {}
    for stage in (2, 3):
        config = settings(
            inputs,
            tmp_path / f"zero{stage}",
            deepspeed={"enabled": True, "zero_stage": stage},
            checkpoint={"store": str(tmp_path / "store")},
            metrics={"logging_steps": 2},
        )
        path = tmp_path / f"zero{stage}.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(exclude_none=True)))
        processes[stage] = _run_driver(path, tmp_path, free_port())
    for stage, process in processes.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-4000:]
        killed = json.loads(next(x for x in out.splitlines() if x.startswith('{"killed_at"')))
        assert killed == {"killed_at": 3, "backend": "gloo"}
        result = json.loads(out[out.index("{\n") :])
        assert result["resumed_step"] == 2 and result["global_step"] == 4, stage
        checkpoint = tmp_path / f"zero{stage}" / "checkpoint-4"
        assert list((checkpoint / "global_step4").glob("*optim_states.pt")), stage
        assert not verify_local(checkpoint)
        assert (Path(result["final_dir"]) / "model.safetensors").is_file()
        steps = CheckpointStore.open(tmp_path / "store", f"trainingruns/zero{stage}").steps()
        assert steps == [2, 4], stage


def test_sft_from_a_trainingrun_work_order(
    inputs: dict[str, Path], tmp_path: Path, seaweed: Any
) -> None:
    """What a TrainingRun's rank runs: the builder's work order, `qpa train sft --spec`, the
    typed summary in the termination message. `turnMasking: false` reaches the trainer. Model,
    data and output are in the object store (a TrainingRun takes no file:// URIs)."""
    from qpa_operator.builders import trainingrun as builder
    from qpa_operator.builders.common import Defaults

    from qpa.api.v1alpha1 import WORK_ORDER_KEY, TrainingRun, TrainSummary
    from qpa.store import open_store

    uris = {}
    for name in ("model", "data"):
        uris[name] = seaweed.root(f"spec-sft-{name}")
        bucket = open_store(uris[name], seaweed.store_config())
        for path in sorted(p for p in inputs[name].rglob("*") if p.is_file()):
            bucket.put_file(path.relative_to(inputs[name]).as_posix(), path)
    out = seaweed.root("spec-sft-out") + "/"

    run = TrainingRun.model_validate(
        {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "spec-sft", "namespace": "team-a", "uid": "u1"},
            "spec": {
                "stage": "sft",
                "baseModelUri": uris["model"],
                "datasets": [{"uri": uris["data"]}],
                "sft": {"turnMasking": False},
                "hyperparameters": {
                    "learningRate": 1e-3,
                    "maxSteps": 2,
                    "perDeviceBatchSize": 2,
                    "gradientAccumulationSteps": 1,
                    "maxSeqLength": 512,
                },
                "gpusPerNode": 0,
                "outputUri": out,
                "store": {"endpoint": seaweed.endpoint, "secretRef": {"name": "qpa-s3"}},
                "checkpointEvery": 1,
            },
        }
    )
    defaults = Defaults()
    plan = builder.data_plan(run, {})
    order = tmp_path / "workorder.yaml"
    order.write_text(builder.config_map(run, plan, defaults)["data"][WORK_ORDER_KEY])
    status = tmp_path / "termination-log"
    command = builder.train_args(run, 0, defaults)
    stage = command[command.index("--") + 1 :]
    assert stage[:3] == ["qpa", "train", "sft"] and "--spec" in stage
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "QPA_STATUS_FILE": str(status),
        **seaweed.env(),
    }
    qpa = str(Path(sys.executable).parent / "qpa")
    done = subprocess.run(
        [qpa, *stage[1:-1], str(order)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout[done.stdout.index("{\n") :])
    assert result["stats"]["masked_turns"] == 0  # every assistant turn trained
    summary = TrainSummary.from_message(status.read_text())
    assert summary is not None and summary.stage == "sft" and summary.step == 2
    assert [c.step for c in summary.checkpoints] == [1, 2] and summary.loss is not None
    assert summary.model_uri == out + "final"
    assert (tmp_path / "run" / "final").is_dir()  # the pod's working folder


# --------------------------------------------------------------------------- bad inputs


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    import qpa.train.sft as sft

    def refuse(plan: Any) -> Any:
        raise AssertionError("weights were loaded: compute started before the inputs were checked")

    monkeypatch.setattr(sft, "load_model", refuse)


@pytest.mark.usefixtures("no_compute")
def test_bad_inputs_are_rejected_before_compute(inputs: dict[str, Path], tmp_path: Path) -> None:
    # a dataset without a single trainable token
    rows = sft_rows_from_suite(3, seed=2, error_rate=0.0)
    for row in rows:
        for message in row["messages"]:
            message["train"] = False
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "masked"))
    with pytest.raises(
        SFTInputError, match=re.escape(f"dataset {tmp_path / 'masked'} has no trainable")
    ):
        train_sft(settings(inputs, tmp_path / "r1", dataset=str(tmp_path / "masked")))
    # a tokenizer that does not match the model's embedding
    from transformers import AutoTokenizer

    small = build_model(TINY, vocab_size=256)
    small.save_pretrained(tmp_path / "small")
    AutoTokenizer.from_pretrained(inputs["model"]).save_pretrained(tmp_path / "small")
    with pytest.raises(SFTInputError, match=r"does not match the model: it has \d+ tokens"):
        train_sft(settings(inputs, tmp_path / "r2", model=str(tmp_path / "small")))
    # missing base checkpoint, missing resume checkpoint, nothing to resume from
    with pytest.raises(SFTInputError, match=re.escape(f"base checkpoint {tmp_path / 'nowhere'}")):
        train_sft(settings(inputs, tmp_path / "r3", model=str(tmp_path / "nowhere")))
    with pytest.raises(SFTInputError, match=re.escape(f"resume checkpoint {tmp_path / 'gone'}")):
        train_sft(
            settings(inputs, tmp_path / "r4", checkpoint={"resume_from": str(tmp_path / "gone")})
        )
    with pytest.raises(SFTInputError, match="resume: no complete checkpoint in"):
        train_sft(settings(inputs, tmp_path / "r5", checkpoint={"resume": "latest"}))
    store = (tmp_path / "store").as_uri()
    with pytest.raises(SFTInputError, match=r"resume checkpoint file://.*no complete checkpoint"):
        train_sft(settings(inputs, tmp_path / "r6", checkpoint={"resume_from": store + "/x"}))
    # and the CLI says so in one line, with exit code 2
    from typer.testing import CliRunner

    import qpa.cli.train  # noqa: F401  (registers `qpa train` until the CLI lists it)
    from qpa.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"model": str(tmp_path / "nowhere"), "dataset": "x"}))
    result = CliRunner().invoke(app, ["train", "sft", "--config", str(bad)])
    assert result.exit_code == 2 and "nowhere" in result.output
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"model": "m", "dataset": "d", "learning_rat": 1}))
    result = CliRunner().invoke(app, ["train", "sft", "--config", str(typo)])
    assert result.exit_code == 2 and "learning_rat" in result.output


def test_datasets_from_a_store_prefix_a_jsonl_file_and_weights(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """A mixture as `qpa data mix` writes it (`manifest.json` + `dataset/` under a store
    prefix, weights already drawn as copies), verified by hash; a JSON Lines file; weights."""
    from qpa.store import open_store, sha256_file
    from qpa.train.sft import plan_sft

    rows = sft_rows_from_suite(4, seed=5, error_rate=0.0)
    for i, row in enumerate(rows):
        row["trajectory_id"] = f"{row['task_id']}#0"
        row["weight"] = 3.0 if i == 0 else 1.0
    local = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(local))
    store = open_store((tmp_path / "store").as_uri())
    files = []
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        key = f"dataset/{path.relative_to(local).as_posix()}"
        info = store.put_file(f"mixes/m1/{key}", path)
        files.append({"key": key, "sha256": info.sha256, "size": info.size})
    manifest = {
        "name": "m1",
        "kind": "sft",
        "files": files,
        "lineage": {"generator": "qpa.data.mix"},
        # as the loop's mixes: no human review, so the manifest records the automatic gate
        # (without it the review gate refuses the mixture as unpublished)
        "review": {"published": False, "queue": None, "gate": "automatic"},
    }
    store.put_bytes("mixes/m1/manifest.json", json.dumps(manifest).encode())
    uri = store.uri("mixes/m1")
    plan = plan_sft(settings(inputs, tmp_path / "p1", dataset=uri))
    assert plan.stats.rows == 4 and plan.stats.weighting == "none" and plan.stats.examples == 4
    # the same rows as a JSON Lines file: weights applied by repetition (auto -> repeat)
    jsonl = tmp_path / "rows.jsonl"
    plain = [{k: v for k, v in r.items() if k != "trajectory_id"} for r in rows]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in plain))
    plan = plan_sft(settings(inputs, tmp_path / "p2", dataset=str(jsonl)))
    order = repeat_indices([3.0, 1.0, 1.0, 1.0], seed=plan.config.seed)
    assert plan.stats.weighting == "repeat" and plan.stats.examples == len(order)
    assert order.count(0) == 2  # weight 3 of a mean 1.5: twice; the others 2/3 of a time each
    # a file of the mixture that does not match its manifest is refused before compute
    arrow = next((tmp_path / "store" / "mixes" / "m1" / "dataset").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes() + b"tampered")
    assert sha256_file(arrow)[0] != next(f["sha256"] for f in files if f["key"].endswith(".arrow"))
    with pytest.raises(SFTInputError, match="does not match its SHA-256"):
        plan_sft(settings(inputs, tmp_path / "p3", dataset=uri))


def test_base_checkpoint_from_an_object_store_uri(
    inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seaweed: Any
) -> None:
    """A real checkpoint is just a URI: its objects are downloaded once (into the run's
    `.inputs` cache, through `qpa.store.resolve_local`), then reused."""
    from qpa.store import open_store
    from qpa.store.s3 import S3Store
    from qpa.train.sft import plan_sft

    uri = seaweed.root("sft-base")
    bucket = open_store(uri, seaweed.store_config())
    for path in sorted(p for p in inputs["model"].rglob("*") if p.is_file()):
        bucket.put_file(path.relative_to(inputs["model"]).as_posix(), path)
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    fetched: list[str] = []
    real = S3Store.get_file

    def get_file(self: S3Store, key: str, path: str | Path) -> Path:
        fetched.append(key)
        return real(self, key, path)

    monkeypatch.setattr(S3Store, "get_file", get_file)
    config = settings(inputs, tmp_path / "from-s3", model=uri)
    plan = plan_sft(config)
    assert plan.model_dir.is_relative_to(tmp_path / "from-s3" / ".inputs")
    assert (plan.model_dir / "model.safetensors").is_file() and "model.safetensors" in fetched
    count = len(fetched)
    plan_sft(config)  # the second time the download is reused
    assert len(fetched) == count
    missing = seaweed.root("sft-none")
    with pytest.raises(SFTInputError, match=f"base checkpoint {missing}: nothing"):
        plan_sft(settings(inputs, tmp_path / "none", model=missing))


# --------------------------------------------------------------------------- pure parts


def test_deepspeed_config_from_settings() -> None:
    zero2 = deepspeed_config(DeepSpeedSettings(enabled=True, zero_stage=2), cuda=False)
    assert zero2["bf16"] == {"enabled": "auto"}
    assert zero2["optimizer"]["params"]["torch_adam"] is True
    assert zero2["zero_optimization"]["stage"] == 2
    assert zero2["train_micro_batch_size_per_gpu"] == "auto"
    zero3 = deepspeed_config(
        DeepSpeedSettings(
            zero_stage=3,
            offload_optimizer=True,
            offload_param=True,
            extra={"zero_optimization": {"sub_group_size": 1000}},
        ),
        cuda=True,
    )
    zero = zero3["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"]["device"] == "cpu" and zero["sub_group_size"] == 1000
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert "torch_adam" not in zero3["optimizer"]["params"]  # fused Adam on GPUs
    with pytest.raises(ValueError, match="offload_param needs zero_stage 3"):
        DeepSpeedSettings(zero_stage=2, offload_param=True)


def test_launch_env_and_argv_for_an_indexed_job() -> None:
    env = launch_env(
        nodes=2, gpus_per_node=8, service="tr-x", port=29500, job_name="tr-x-train",
        namespace="ml", environ={"JOB_COMPLETION_INDEX": "1"},
    )  # fmt: skip
    assert env == {
        "MASTER_ADDR": "tr-x-train-0.tr-x.ml.svc",
        "MASTER_PORT": "29500",
        "NNODES": "2",
        "NPROC_PER_NODE": "8",
        "NODE_RANK": "1",
        "WORLD_SIZE": "16",
        "RANK": "8",
        "LOCAL_RANK": "0",
    }
    argv = launch_argv(["qpa", "train", "sft", "--config", "/etc/qpa/sft.yaml"], env)
    assert argv[:7] == [
        "torchrun", "--nnodes=2", "--nproc-per-node=8", "--node-rank=1",
        "--master-addr=tr-x-train-0.tr-x.ml.svc", "--master-port=29500", "--no-python",
    ]  # fmt: skip
    assert argv[7:] == ["qpa", "train", "sft", "--config", "/etc/qpa/sft.yaml"]
    ds = launch_argv(["qpa", "train", "sft"], env, launcher="deepspeed", hostfile="/etc/hosts.ds")
    assert "--no_ssh" in ds and "--node_rank=1" in ds and "--hostfile=/etc/hosts.ds" in ds
    assert hostfile_text(2, 8, "tr-x", "tr-x-train").splitlines() == [
        "tr-x-train-0.tr-x slots=8",
        "tr-x-train-1.tr-x slots=8",
    ]
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX"):
        launch_env(nodes=2, environ={})
    with pytest.raises(ValueError, match="outside"):
        launch_env(2, nodes=2, environ={})
    with pytest.raises(ValueError, match="hostfile"):
        launch_argv(["qpa"], env, launcher="deepspeed")
    # ranks as processes on one machine (tests, benchmarks): what torchrun --standalone sets
    assert local_rank_env(1, 2, 4321) == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4321", "RANK": "1", "WORLD_SIZE": "2",
        "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0",
    }  # fmt: skip
    with pytest.raises(ValueError, match="outside"):
        local_rank_env(2, 2, 4321)
    from typer.testing import CliRunner

    import qpa.cli.train  # noqa: F401
    from qpa.cli import app

    result = CliRunner().invoke(
        app,
        ["train", "launch", "--nodes", "2", "--gpus-per-node", "4", "--service", "svc",
         "--index", "0", "--dry-run", "--", "qpa", "train", "sft", "--config", "c.yaml"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["env"]["RANK"] == "0" and plan["argv"][-5:] == [
        "qpa", "train", "sft", "--config", "c.yaml"
    ]  # fmt: skip


def test_settings_map_to_trl_and_reject_unknown_fields(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "local" / "sft.yaml"
    config = SFTConfig.from_yaml(path, {"deepspeed.zero_stage": 3, "trl.logging_first_step": False})
    assert config.deepspeed.zero_stage == 3 and config.checkpoint.resume == "auto"
    args = config.to_trl(bf16=False, gradient_checkpointing=False)
    assert args.save_steps == config.checkpoint.every_steps and args.save_strategy == "steps"
    assert args.bf16 is False and args.activation_checkpointing is False
    assert args.logging_first_step is False and args.max_length == config.max_length
    assert config.resolve_gradient_checkpointing(64) is False
    assert config.resolve_gradient_checkpointing(4096) is True
    with pytest.raises(ConfigError, match=r"unknown trl\.SFTConfig fields: no_such_field"):
        config.model_copy(update={"trl": {"no_such_field": 1}}).to_trl()
    with pytest.raises(ConfigError, match=r"deepspeed\.zero_stage"):
        SFTConfig.from_dict({"model": "m", "dataset": "d", "deepspeed": {"zero_stage": 5}})


def test_checkpoint_integrity_and_latest(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoint-3"
    (folder / "global_step3").mkdir(parents=True)
    (folder / "trainer_state.json").write_text('{"global_step": 3}')
    (folder / "global_step3" / "shard.pt").write_bytes(b"x" * 100)
    record_local(folder, 3)
    store = CheckpointStore.open(tmp_path / "store", "trainingruns/t")
    assert store.latest() is None
    store.upload(folder, 3)
    assert store.steps() == [3] and store.latest() is not None
    restored = store.download(3, tmp_path / "restore" / "checkpoint-3")
    assert (restored / "global_step3" / "shard.pt").read_bytes() == b"x" * 100
    assert not verify_local(restored)
    # corruption is caught, locally and in the store
    (folder / "global_step3" / "shard.pt").write_bytes(b"y" * 100)
    assert verify_local(folder) and latest_local(tmp_path / "run") is None
    object_path = tmp_path / "store" / "trainingruns/t/checkpoints/checkpoint-3/trainer_state.json"
    object_path.write_text('{"global_step": 4}')
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        store.download(3, tmp_path / "again")
    # an upload without COMPLETE (a node died) does not count
    other = CheckpointStore.open(tmp_path / "store", "trainingruns/u")
    other.upload(folder, 5, nodes=2)
    assert other.steps() == []


def test_metrics_jsonl_and_prometheus(tmp_path: Path) -> None:
    metrics = TrainMetrics("m1", "rl", jsonl=tmp_path / "m.jsonl", textfile=tmp_path / "m.prom")
    metrics.log(1, loss=0.5, reward=0.25, success_rate=0.5, output_tokens=100, tokens=400,
                care_tiers={"progress_shaping": 1, "outcome_consolidation": 3})  # fmt: skip
    metrics.log(2, loss=float("nan"), reward=0.75, output_tokens=50)
    records = read_metrics(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == [1, 2] and "loss" not in records[1]
    assert records[0]["care_tiers"] == {
        "progress_shaping": 0.25, "outcome_consolidation": 0.75, "efficiency_refinement": 0.0
    }  # fmt: skip
    assert metrics.value("qpa_train_reward") == 0.75
    assert metrics.value("qpa_train_output_tokens_total") == 150
    assert metrics.value("qpa_train_care_tier_share", tier="outcome_consolidation") == 0.75
    text = (tmp_path / "m.prom").read_text()
    assert 'qpa_train_reward{run="m1",stage="rl"} 0.75' in text
    with pytest.raises(ValueError, match="unknown CARE tiers"):
        metrics.log(3, care_tiers={"greedy": 1})
