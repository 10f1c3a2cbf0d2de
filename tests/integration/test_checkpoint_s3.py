"""SFT and RL checkpoints through a real S3 server (SeaweedFS `weed mini`), with the training
process SIGKILLed in the middle of a checkpoint upload; base models loaded from `s3://`.

Each test starts a real `qpa train sft|rl` process on a tiny model whose base checkpoint is an
`s3://` URI (uploaded to SeaweedFS first; the Hugging Face Hub is made unreachable), with
checkpoints going to SeaweedFS. `QPA_CHECKPOINT_UPLOAD_DELAY_S` slows each object of an upload
(timing only), the test polls the bucket and SIGKILLs the process group as soon as the first
objects of the second checkpoint have landed, before its `COMPLETE.json`. Then, as a new pod
with an empty working folder would, a resumed run must pick the last *complete* checkpoint
(never the partial one), redo the rest and end at the same final step as an unkilled run (for
SFT on CPU: with bit-identical weights).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.seaweed import SeaweedS3

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from qpa.store import open_store  # noqa: E402
from qpa.train.checkpoint import (  # noqa: E402
    COMPLETE,
    META_DIR,
    UPLOAD_DELAY_ENV,
    CheckpointError,
    CheckpointStore,
)
from qpa.train.tiny import (  # noqa: E402
    TinyConfig,
    make_tiny_checkpoint,
    sft_rows_from_suite,
    suite_corpus,
)

TINY = TinyConfig(
    vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=8192,
)  # fmt: skip
DELAY_S = 0.25  # per object: a checkpoint of ~14 objects takes over 3 s to upload
QPA = str(Path(sys.executable).with_name("qpa"))
# Two trainer processes start per test (torch, transformers, TRL imports): on a loaded machine
# that alone can take minutes.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedS3) -> dict[str, Any]:
    """A tiny model (local, and uploaded to SeaweedFS), an SFT dataset and a tasks file."""
    from qpa.contract import write_tasks
    from qpa.envs.sandbox.suite import generate_suite

    root = tmp_path_factory.mktemp("ckpt-s3")
    model = make_tiny_checkpoint(
        root / "tiny", TINY, corpus=suite_corpus(conversations=2, instructions=60)
    )
    model_uri = seaweed.root("base-model")
    bucket = open_store(model_uri, seaweed.store_config())
    for path in sorted(p for p in model.rglob("*") if p.is_file()):
        bucket.put_file(path.relative_to(model).as_posix(), path)
    datasets.Dataset.from_list(sft_rows_from_suite(12, seed=1, error_rate=0.5)).save_to_disk(
        str(root / "data")
    )
    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    write_tasks(root / "tasks.jsonl", sorted(pool, key=lambda t: len(t.instruction))[:3])
    return {"root": root, "model": model, "model_uri": model_uri, "data": root / "data"}


def child_env(seaweed: SeaweedS3, **extra: str) -> dict[str, str]:
    """The trainer's environment: S3 endpoint and keys, no Hub (offline, and unreachable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QPA_", "AWS_"))}
    env.update(seaweed.env())
    env.update(
        HF_HUB_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",  # the discard port: any Hub call fails at once
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def objects(seaweed: SeaweedS3, uri: str) -> list[str]:
    """Every object name below `uri` (a raw listing, behind the store's back)."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listing = seaweed.client().list_objects(bucket, prefix=prefix + "/", recursive=True)
    return sorted(str(o.object_name)[len(prefix) + 1 :] for o in listing)


def kill_during_upload(
    seaweed: SeaweedS3, process: subprocess.Popen[bytes], checkpoint_uri: str, log: Path
) -> list[str]:
    """SIGKILL the process group once some objects of `checkpoint_uri` are in the bucket but
    not its `COMPLETE.json`; the objects that had landed."""
    marker = f"{META_DIR}/{COMPLETE}"
    deadline = time.monotonic() + 600  # a safety net: the trainer ends on its own anyway
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the trainer exited ({process.returncode}) before the kill:\n"
                        + log.read_text()[-3000:])  # fmt: skip
        landed = objects(seaweed, checkpoint_uri)
        assert marker not in landed, "the upload completed before the kill"
        if landed:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
            assert process.returncode == -signal.SIGKILL
            return landed
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail("no checkpoint object landed in time:\n" + log.read_text()[-3000:])


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def assert_partial(seaweed: SeaweedS3, checkpoints: CheckpointStore, step: int) -> None:
    """Checkpoint `step` has objects in the store but does not count."""
    landed = objects(seaweed, checkpoints.uri(step))
    assert landed and f"{META_DIR}/{COMPLETE}" not in landed
    assert step not in checkpoints.steps()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        checkpoints.download(step, Path("/nonexistent/never-written"))


# --------------------------------------------------------------------------- SFT


def sft_settings(inputs: dict[str, Any], out: Path, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "ckpt-sft",
        "model": str(inputs["model"]),
        "dataset": str(inputs["data"]),
        "output_dir": str(out),
        "max_length": 384,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-3,
        "max_steps": 6,
        "checkpoint": {"every_steps": 2, "keep_last": 3},
        "metrics": {"logging_steps": 1},
    }
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return data


def test_sft_killed_during_a_checkpoint_upload_resumes_from_the_last_complete_one(
    inputs: dict[str, Any], seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    from qpa.train.config import SFTConfig
    from qpa.train.sft import train_sft

    store_uri = seaweed.root("sft-ckpt")
    from_s3 = {
        "model": inputs["model_uri"],
        "checkpoint": {"store": store_uri, "resume": "auto"},
    }
    # 1. the killed run: a real `qpa train sft` process, base model from s3://
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump(sft_settings(inputs, tmp_path / "killed", **from_s3)))
    log = tmp_path / "killed.log"
    process = start(
        [QPA, "train", "sft", "--config", str(config)],
        child_env(seaweed, **{UPLOAD_DELAY_ENV: str(DELAY_S)}),
        log,
    )
    checkpoints = CheckpointStore(
        open_store(store_uri, seaweed.store_config()), "trainingruns/ckpt-sft"
    )
    landed = kill_during_upload(seaweed, process, checkpoints.uri(4), log)
    assert checkpoints.steps() == [2]  # uploads go in order: 2 was complete, 4 is not
    assert_partial(seaweed, checkpoints, 4)
    assert len(landed) < len(objects(seaweed, checkpoints.uri(2)))

    # 2. the unkilled reference (in this process, local model: the same weights)
    whole = train_sft(SFTConfig.from_dict(sft_settings(inputs, tmp_path / "whole")))
    assert whole.global_step == 6

    # 3. a new pod (empty working folder) resumes: from checkpoint 2, never the partial 4
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resumed = train_sft(SFTConfig.from_dict(sft_settings(inputs, tmp_path / "pod-2", **from_s3)))
    assert resumed.resumed_step == 2 and resumed.resumed_from == checkpoints.uri(2)
    assert resumed.global_step == whole.global_step == 6
    assert checkpoints.steps() == [2, 4, 6]  # the partial one was replaced, then completed
    assert resumed.final_uri is not None
    assert f"final/{META_DIR}/{COMPLETE}" in objects(seaweed, checkpoints.uri())
    # the base model came from SeaweedFS, into the run's input cache
    cached = list((tmp_path / "pod-2" / ".inputs").rglob("model.safetensors"))
    assert cached and cached[0].read_bytes() == (inputs["model"] / "model.safetensors").read_bytes()
    # same data order, optimizer, scheduler and RNG from the checkpoint: identical weights
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "pod-2" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # and checkpoint 4, redone, is what the unkilled run saved at step 4
    redone = checkpoints.download(4, tmp_path / "check" / "checkpoint-4")
    ref = load_file(tmp_path / "whole" / "checkpoint-4" / "model.safetensors")
    got = load_file(redone / "model.safetensors")
    assert all(torch.equal(ref[k], got[k]) for k in ref)


# --------------------------------------------------------------------------- RL


def rl_settings(inputs: dict[str, Any], out: Path, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "ckpt-rl",
        "model": str(inputs["model"]),
        "output_dir": str(out),
        "steps": 3,
        "tasks_per_step": 2,
        "samples_per_task": 2,
        "seed": 1,
        "tasks": {"dataset_uri": (inputs["root"] / "tasks.jsonl").as_uri()},
        "harness": {"token_budget": 100, "max_tools": 1, "max_turns": 2},
        "generation": {"max_new_tokens": 8},
        "loss": {"micro_batch_size": 8},
        "optim": {"learning_rate": 0.01},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
    }
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    return data


def test_rl_killed_during_a_checkpoint_upload_resumes_from_the_last_complete_one(
    inputs: dict[str, Any], seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qpa.train.rl import RLConfig, RLTrainer, run_rl

    store_uri = seaweed.root("rl-ckpt")
    from_s3 = {
        "model": inputs["model_uri"],
        "checkpoint": {"store": store_uri, "resume": "auto"},
    }
    config = tmp_path / "rl.yaml"
    config.write_text(yaml.safe_dump(rl_settings(inputs, tmp_path / "killed", **from_s3)))
    log = tmp_path / "killed.log"
    process = start(
        [QPA, "train", "rl", "--config", str(config)],
        child_env(seaweed, **{UPLOAD_DELAY_ENV: str(DELAY_S)}),
        log,
    )
    checkpoints = CheckpointStore(
        open_store(store_uri, seaweed.store_config()), "trainingruns/ckpt-rl"
    )
    kill_during_upload(seaweed, process, checkpoints.uri(2), log)
    assert checkpoints.steps() == [1]
    assert_partial(seaweed, checkpoints, 2)
    # the killed process's own folder holds checkpoint 2 whole (hashed before the upload)
    killed_state = tmp_path / "killed" / "checkpoint-2" / "rl_state.json"
    assert json.loads(killed_state.read_text())["step"] == 2

    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the same pod restarted, against a store that lacks its newest checkpoint (as a kill
    # mid-upload leaves it): it resumes from its own folder and uploads that checkpoint
    other = seaweed.root("rl-other")
    same_pod = rl_settings(
        inputs, tmp_path / "killed", model=inputs["model_uri"],
        checkpoint={"store": other, "resume": "auto"},
    )  # fmt: skip
    trainer = RLTrainer(RLConfig.from_dict(same_pod))
    assert trainer.step == trainer.resumed_from == 2
    trainer.close()
    uploaded = CheckpointStore(open_store(other, seaweed.store_config()), "trainingruns/ckpt-rl")
    assert uploaded.steps() == [2]
    # a new pod (empty folder) resumes from the store: the last complete checkpoint, 1
    resumed = run_rl(RLConfig.from_dict(rl_settings(inputs, tmp_path / "pod-2", **from_s3)))
    assert resumed.resumed_from == 1  # the last complete checkpoint, not the partial 2
    assert resumed.final_step == 3  # where an unkilled run ends (`steps`; RL samples, so the
    # weights are not compared: test_sft_killed_... compares them for SFT)
    assert len(resumed.history) == 2  # steps 2 and 3 redone
    assert checkpoints.steps() == [1, 2, 3]
    assert resumed.final_uri is not None and resumed.final_uri.endswith(
        "trainingruns/ckpt-rl/final"
    )
    assert list((tmp_path / "pod-2" / "cache").rglob("model.safetensors"))  # base from s3://
