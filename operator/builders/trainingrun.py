"""TrainingRun -> a training config, a headless Service and an indexed Job of DeepSpeed ranks.

- ConfigMap `<run>-config`: `train.yaml`, the `qpa train sft|rl --config` file rendered from
  the spec (model, data, hyperparameters, DeepSpeed, CARE, checkpoints in the object store
  with `resume: auto`, so every start continues from the newest complete checkpoint);
- Service `<run>-ranks`: headless, `publishNotReadyAddresses`, the rendezvous of the ranks;
- Job `<run>-r<attempt>`: `nodes` completions run at once (`completionMode: Indexed`), each pod
  `qpa train launch --nodes N --gpus-per-node G --service <run>-ranks --job-name <job> ... --
  qpa train <stage> --config /etc/qpa/train/train.yaml`; node `i` is `JOB_COMPLETION_INDEX=i`,
  rank 0 is `<job>-0.<run>-ranks`. Pods request `nvidia.com/gpu: G` and mount a memory-backed
  `/dev/shm` (NCCL and the dataloaders need more than the container default).
- Job `<run>-data` (only when the data must be prepared): `qpa data curate` for every TaskBatch
  output, then `qpa data mix` of all inputs into `<outputUri>/data/mix/`, before any rank runs.

A multi-node job cannot lose one rank and go on, so a failed attempt is not retried pod by pod
(`backoffLimit: 0`): the operator starts attempt `r+1` as a new Job (up to `backoffLimit`
attempts when `resume` is on), and it resumes from the latest checkpoint. Rank 0 leaves a JSON
summary in its termination message (`QPA_STATUS_FILE`): step, checkpoints, final model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from urllib.parse import urlsplit

import yaml
from qpa_operator.builders.common import (
    TERMINATION_LOG,
    Defaults,
    JobState,
    JsonDict,
    PodParts,
    child_name,
    combine,
    content_hash,
    empty_dir,
    env_var,
    gpu_placement,
    job_state,
    labels,
    metadata,
    owner_namespace,
    parse_summary,
    reason_word,
    resources,
    restricted_container_security,
    restricted_pod_security,
    rollout_pool_url,
    selector_labels,
    store_parts,
    terminated_container,
    with_spec_hash,
)

from qpa.api import TrainingRun
from qpa.api.v1alpha1 import Checkpoint, TrainingRunStatus, set_condition

COMPONENT: Final = "trainer"
DATA_COMPONENT: Final = "data"
CONTAINER: Final = "trainer"
CONFIG_MOUNT: Final = "/etc/qpa/train"
CONFIG_KEY: Final = "train.yaml"
WORK_DIR: Final = "/work"
ATTEMPT_LABEL: Final = "qpa.ai/attempt"
COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
GPU_RESOURCE: Final = "nvidia.com/gpu"


def config_map_name(tr: TrainingRun) -> str:
    return child_name(tr, "config")


def service_name(tr: TrainingRun) -> str:
    return child_name(tr, "ranks")


def job_name(tr: TrainingRun, attempt: int) -> str:
    return child_name(tr, f"r{attempt}")


def data_job_name(tr: TrainingRun) -> str:
    return child_name(tr, "data")


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)]) + "/"


def store_root_and_prefix(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b/` -> (`s3://bucket`, `a/b`): a checkpoint store root and run prefix."""
    parts = urlsplit(uri)
    path = parts.path.strip("/")
    if parts.scheme == "s3":
        return f"s3://{parts.netloc}", path
    head, _, tail = path.rpartition("/")
    return f"{parts.scheme}:///{head}" if head else f"{parts.scheme}:///", tail


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DataPlan:
    """What the trainer reads, and the commands (if any) that prepare it first."""

    dataset: str | None
    steps: tuple[tuple[str, ...], ...] = ()
    waiting_for: tuple[str, ...] = ()  # TaskBatches whose output is not known yet
    inputs: tuple[JsonDict, ...] = field(default_factory=tuple)


def data_plan(tr: TrainingRun, taskbatch_outputs: Mapping[str, str]) -> DataPlan:
    """Resolve the spec's datasets: a single dataset is read as is, several are mixed.

    `taskbatch_outputs` maps the names of finished TaskBatches to their output URIs; a
    referenced TaskBatch not in it is waited for. Trajectories of a TaskBatch are curated
    (`qpa data curate`) before they are mixed (`qpa data mix`); an RL run reads one TaskBatch's
    output directly (its manifest names the tasks).
    """
    refs = tr.spec.datasets
    missing = tuple(
        ref.task_batch_ref.name
        for ref in refs
        if ref.task_batch_ref is not None and ref.task_batch_ref.name not in taskbatch_outputs
    )
    inputs = tuple(
        {
            "source": f"taskbatch/{ref.task_batch_ref.name}" if ref.task_batch_ref else "uri",
            "uri": taskbatch_outputs.get(ref.task_batch_ref.name, "")
            if ref.task_batch_ref
            else ref.uri,
            "weight": ref.weight,
        }
        for ref in refs
    )
    if missing:
        return DataPlan(dataset=None, waiting_for=missing, inputs=inputs)
    if not refs:
        return DataPlan(dataset=None)
    if len(refs) == 1 and (refs[0].uri is not None or tr.spec.stage == "rl"):
        return DataPlan(dataset=str(inputs[0]["uri"]), inputs=inputs)
    out = tr.spec.output_uri
    steps: list[tuple[str, ...]] = []
    mixed: list[str] = []
    for ref, item in zip(refs, inputs, strict=True):
        if ref.task_batch_ref is not None:
            curated = _join(out, "data", "curated", ref.task_batch_ref.name)
            steps.append(("qpa", "data", "curate", str(item["uri"]), "--out", curated))
            mixed.append(curated)
        else:
            mixed.append(str(item["uri"]))
    target = _join(out, "data", "mix")
    steps.append(("qpa", "data", "mix", *mixed, "--out", target))
    return DataPlan(dataset=target, steps=tuple(steps), inputs=inputs)


# --------------------------------------------------------------------------- config


def _deepspeed(tr: TrainingRun) -> JsonDict:
    ds = tr.spec.deepspeed
    settings: JsonDict = {
        "enabled": True,
        "zero_stage": ds.zero_stage,
        "offload_optimizer": ds.offload_optimizer != "none",
        "offload_param": ds.offload_parameters != "none",
        "bf16": "auto" if ds.bf16 else False,
    }
    nvme = {}
    if ds.offload_optimizer == "nvme":
        nvme["offload_optimizer"] = {"device": "nvme", "nvme_path": f"{WORK_DIR}/nvme"}
    if ds.offload_parameters == "nvme":
        nvme["offload_param"] = {"device": "nvme", "nvme_path": f"{WORK_DIR}/nvme"}
    if nvme:
        settings["extra"] = {"zero_optimization": nvme}
    return settings


def _checkpoint(tr: TrainingRun, attempt: int) -> JsonDict:
    spec = tr.spec
    root, prefix = store_root_and_prefix(spec.output_uri)
    settings: JsonDict = {
        "every_steps": spec.checkpoint_every,
        "keep_last": spec.keep_checkpoints,
        "store": root,
        "prefix": prefix,
        "resume": "auto" if spec.resume else "never",
    }
    if spec.resume_from is not None and attempt == 0:
        settings["resume_from"] = spec.resume_from
    return settings


def training_config(tr: TrainingRun, plan: DataPlan, attempt: int = 0) -> JsonDict:
    """The `qpa train sft|rl --config` file of the run (keys as `qpa.train` reads them)."""
    spec = tr.spec
    hp = spec.hyperparameters
    name = tr.metadata.name or "train"
    common: JsonDict = {
        "name": name,
        "model": spec.base_model_uri,
        "output_dir": f"{WORK_DIR}/run",
        "seed": hp.seed,
        "bf16": "auto" if spec.deepspeed.bf16 else False,
        "deepspeed": _deepspeed(tr),
        "checkpoint": _checkpoint(tr, attempt),
    }
    if spec.stage == "sft":
        config: JsonDict = {
            **common,
            "dataset": plan.dataset,
            "max_length": hp.max_seq_length,
            "per_device_train_batch_size": hp.per_device_batch_size,
            "gradient_accumulation_steps": hp.gradient_accumulation_steps,
            "learning_rate": hp.learning_rate,
            "num_train_epochs": hp.epochs,
            "max_steps": hp.max_steps if hp.max_steps is not None else -1,
            "max_grad_norm": spec.deepspeed.gradient_clipping or 1.0,
            "metrics": {"logging_steps": 10},
        }
        return config
    rl = spec.rl
    if rl is None:  # guarded by the spec's rules
        raise ValueError("stage rl needs rl settings")
    tasks: JsonDict = {"dataset": plan.dataset} if plan.dataset else {"split": "train"}
    config = {
        **common,
        "samples_per_task": rl.group_size,
        "tasks": tasks,
        "harness": {"max_turns": rl.max_turns},
        "loss": {"micro_batch_size": hp.per_device_batch_size},
        "optim": {
            "learning_rate": hp.learning_rate,
            "max_grad_norm": spec.deepspeed.gradient_clipping or 1.0,
        },
        "care": {
            "enabled": True,
            "low": rl.care.low_success_threshold,
            "high": rl.care.high_success_threshold,
            "progress_weight": rl.care.progress_weight,
            "token_weight": rl.care.efficiency_weight,
        },
        "metrics": {"logging_steps": 1},
    }
    if hp.max_steps is not None:
        config["steps"] = hp.max_steps
    return config


def config_map(tr: TrainingRun, plan: DataPlan, defaults: Defaults, attempt: int = 0) -> JsonDict:
    data = {
        CONFIG_KEY: yaml.safe_dump(training_config(tr, plan, attempt), sort_keys=False),
        "datasets.yaml": yaml.safe_dump({"inputs": list(plan.inputs)}, sort_keys=False),
    }
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(tr, config_map_name(tr), COMPONENT, defaults),
        "data": data,
    }
    return with_spec_hash(manifest)


# --------------------------------------------------------------------------- pods


def ranks_per_node(tr: TrainingRun) -> int:
    return max(1, tr.spec.gpus_per_node)


def train_args(tr: TrainingRun, attempt: int, defaults: Defaults) -> list[str]:
    """`qpa train launch ... -- qpa train <stage> --config ...` of every node."""
    spec = tr.spec
    launch = [
        "qpa", "train", "launch",
        "--nodes", str(spec.nodes),
        "--gpus-per-node", str(ranks_per_node(tr)),
        "--service", service_name(tr),
        "--job-name", job_name(tr, attempt),
        "--namespace", owner_namespace(tr),
        "--port", str(defaults.rendezvous_port),
        "--launcher", "torchrun",
        "--",
    ]  # fmt: skip
    stage = ["qpa", "train", spec.stage, "--config", f"{CONFIG_MOUNT}/{CONFIG_KEY}"]
    if spec.stage == "rl" and spec.rl is not None:
        stage += ["--care", "on"]
        url = rollout_pool_url(spec.rl.rollout_pool_ref.name, owner_namespace(tr), defaults)
        stage += ["--env-url", url]
    return launch + stage


def _pod_parts(tr: TrainingRun, defaults: Defaults) -> PodParts:
    return combine(
        [
            PodParts(
                env=(
                    env_var("QPA_TRAININGRUN", tr.metadata.name or ""),
                    env_var("QPA_STATUS_FILE", TERMINATION_LOG),
                    env_var("HOME", f"{WORK_DIR}/home"),
                    env_var("HF_HOME", f"{WORK_DIR}/hf"),
                    env_var("TRITON_CACHE_DIR", f"{WORK_DIR}/triton"),
                ),
                volumes=(
                    {"name": "config", "configMap": {"name": config_map_name(tr)}},
                    empty_dir("work"),
                    empty_dir("tmp"),
                ),
                mounts=(
                    {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
                    {"name": "work", "mountPath": WORK_DIR},
                    {"name": "tmp", "mountPath": "/tmp"},
                ),
            ),
            store_parts(tr.spec.store or defaults.store),
        ]
    )


def job(tr: TrainingRun, attempt: int, defaults: Defaults) -> JsonDict:
    spec = tr.spec
    parts = _pod_parts(tr, defaults) + PodParts(
        volumes=(empty_dir("dshm", memory=True),),
        mounts=({"name": "dshm", "mountPath": "/dev/shm"},),
    )
    container: JsonDict = {
        "name": CONTAINER,
        "image": spec.image or defaults.trainer_image,
        "command": train_args(tr, attempt, defaults),
        "ports": [
            {"name": "rendezvous", "containerPort": defaults.rendezvous_port, "protocol": "TCP"}
        ],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    container_resources = resources(spec.resources, gpus=spec.gpus_per_node)
    if container_resources:
        container["resources"] = container_resources
    pod_labels = {**labels(tr, COMPONENT, defaults), ATTEMPT_LABEL: str(attempt)}
    pod_spec: JsonDict = {
        "restartPolicy": "Never",
        "subdomain": service_name(tr),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_security(defaults),
        "containers": [container],
        "volumes": list(parts.volumes),
    }
    if spec.gpus_per_node > 0:
        pod_spec.update(gpu_placement(defaults, GPU_RESOURCE))
    meta = metadata(tr, job_name(tr, attempt), COMPONENT, defaults)
    meta["labels"][ATTEMPT_LABEL] = str(attempt)
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }
    return with_spec_hash(manifest)


def data_job(tr: TrainingRun, plan: DataPlan, defaults: Defaults) -> JsonDict | None:
    """One pod that curates and mixes the inputs, or None when nothing needs preparing."""
    if not plan.steps:
        return None
    parts = _pod_parts(tr, defaults)
    script = " && ".join(" ".join(_quote(word) for word in step) for step in plan.steps)
    container: JsonDict = {
        "name": "data",
        "image": tr.spec.image or defaults.trainer_image,
        "command": ["sh", "-c", f"set -e; {script}"],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
    }
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(tr, data_job_name(tr), DATA_COMPONENT, defaults),
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": tr.spec.backoff_limit,
            "template": {
                "metadata": {"labels": labels(tr, DATA_COMPONENT, defaults)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": restricted_pod_security(defaults),
                    "containers": [container],
                    "volumes": list(parts.volumes),
                },
            },
        },
    }
    return with_spec_hash(manifest)


def _quote(word: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./:=@+-]+", word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def service(tr: TrainingRun, defaults: Defaults) -> JsonDict:
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(tr, service_name(tr), COMPONENT, defaults),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(tr, COMPONENT),
            "ports": [
                {
                    "name": "rendezvous",
                    "port": defaults.rendezvous_port,
                    "targetPort": defaults.rendezvous_port,
                    "protocol": "TCP",
                }
            ],
        },
    }
    return with_spec_hash(manifest)


def children(
    tr: TrainingRun,
    defaults: Defaults,
    *,
    attempt: int,
    plan: DataPlan,
    data_ready: bool,
) -> list[JsonDict]:
    """The run's children for `attempt`; the ranks' Job only once the data is ready."""
    result = [config_map(tr, plan, defaults, attempt), service(tr, defaults)]
    prepare = data_job(tr, plan, defaults)
    if prepare is not None:
        result.append(prepare)
    if data_ready and not plan.waiting_for:
        result.append(job(tr, attempt, defaults))
    return result


def config_fingerprint(tr: TrainingRun, plan: DataPlan) -> str:
    return content_hash(training_config(tr, plan))


# --------------------------------------------------------------------------- status


def next_attempt(tr: TrainingRun, attempt: int, state: JobState) -> int | None:
    """The attempt to start after `attempt` failed, or None when the run has failed for good."""
    if not state.failed_for_good or not tr.spec.resume:
        return None
    return attempt + 1 if attempt < tr.spec.backoff_limit else None


def _step_of(uri: str) -> int | None:
    match = re.search(r"checkpoint-(\d+)/?$", uri)
    return int(match.group(1)) if match else None


def rank0_summary(pod: Mapping[str, Any]) -> tuple[int, JsonDict] | None:
    """(attempt, summary) from the termination message of node 0 of an attempt."""
    meta = pod.get("metadata") or {}
    pod_labels = meta.get("labels") or {}
    if str(pod_labels.get(COMPLETION_INDEX_LABEL, "0")) != "0":
        return None
    try:
        attempt = int(pod_labels.get(ATTEMPT_LABEL, "0"))
    except ValueError:
        return None
    terminated = terminated_container(pod, CONTAINER)
    if terminated is None:
        return None
    summary = parse_summary(terminated.get("message"))
    return (attempt, summary) if summary is not None else None


def _checkpoints(summary: Mapping[str, Any]) -> list[Checkpoint]:
    found: list[Checkpoint] = []
    for item in summary.get("checkpoints") or []:
        if isinstance(item, Mapping) and isinstance(item.get("uri"), str):
            step = item.get("step")
            step = step if isinstance(step, int) else _step_of(item["uri"])
            if step is not None:
                found.append(Checkpoint(step=step, uri=item["uri"], time=item.get("time")))
    for uri in summary.get("checkpoint_uris") or summary.get("checkpointUris") or []:
        if isinstance(uri, str) and (step := _step_of(uri)) is not None:
            found.append(Checkpoint(step=step, uri=uri))
    return found


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def trainingrun_status(
    tr: TrainingRun,
    *,
    attempt: int,
    job: Mapping[str, Any] | None,
    data_job: Mapping[str, Any] | None,
    plan: DataPlan,
    summaries: Iterable[tuple[int, Mapping[str, Any]]],
    observed_generation: int | None,
    now: datetime,
) -> TrainingRunStatus:
    """The status of a run from its current attempt's Job, its data Job and rank-0 summaries."""
    current = tr.status or TrainingRunStatus()
    state = job_state(job)
    data = job_state(data_job)
    name = job_name(tr, attempt)
    if plan.waiting_for:
        phase, reason = "Pending", "WaitingForTaskBatch"
        message = "waiting for TaskBatch " + ", ".join(plan.waiting_for) + " to succeed"
    elif plan.steps and data.failed_for_good:
        phase, reason = "Failed", "DataPreparationFailed"
        message = data.message or f"Job {data_job_name(tr)} failed"
    elif plan.steps and not data.complete:
        phase, reason = "Pending", "PreparingData"
        message = f"Job {data_job_name(tr)} curates and mixes the datasets"
    elif state.failed_for_good:
        retry = next_attempt(tr, attempt, state)
        if retry is None:
            phase, reason = "Failed", reason_word(state.reason, "JobFailed")
            message = state.message or f"Job {name} failed"
        else:
            phase, reason = "Resuming", "AttemptFailed"
            message = f"Job {name} failed; attempt {retry} resumes from the latest checkpoint"
    elif state.complete:
        phase, reason, message = "Succeeded", "JobComplete", f"Job {name} completed"
    elif state.started and state.active + state.succeeded > 0:
        phase = "Running" if attempt == 0 or state.ready > 0 else "Resuming"
        reason = "RanksRunning" if phase == "Running" else "Resuming"
        message = f"{state.ready}/{tr.spec.nodes} nodes ready (attempt {attempt})"
    else:
        phase = "Pending" if attempt == 0 else "Resuming"
        reason = "JobCreated" if state.exists else "JobMissing"
        message = f"Job {name} " + ("created, not started yet" if state.exists else "not there")

    rank = {"Pending": 0, "Resuming": 0, "Running": 1, "Succeeded": 2, "Failed": 2}
    stale = (
        current.restarts == attempt
        and current.job_name == name
        and current.phase is not None
        and rank[phase] < rank.get(current.phase, 0)
    )
    if stale:
        return current.model_copy(
            update={"observed_generation": observed_generation or current.observed_generation}
        )

    step, total, metrics = current.step, current.total_steps, dict(current.metrics)
    checkpoints = {c.step: c for c in current.checkpoints}
    model_uri = current.model_uri
    for _, summary in sorted(summaries, key=lambda item: item[0]):
        for key in ("step", "global_step", "globalStep", "final_step"):
            if isinstance(summary.get(key), int):
                step = max(step, summary[key])
        for key in ("total_steps", "totalSteps"):
            if isinstance(summary.get(key), int):
                total = summary[key]
        for checkpoint in _checkpoints(summary):
            checkpoints[checkpoint.step] = checkpoint
        for key in ("model_uri", "modelUri", "final_uri"):
            if isinstance(summary.get(key), str):
                model_uri = summary[key]
        reported = summary.get("metrics")
        if isinstance(reported, Mapping):
            metrics.update({k: v for k, v in reported.items() if _number(v) is not None})
        if (loss := _number(summary.get("train_loss"))) is not None:
            metrics["loss"] = loss
    kept = [checkpoints[s] for s in sorted(checkpoints)][-tr.spec.keep_checkpoints :]
    if phase == "Succeeded" and model_uri is None:
        model_uri = _join(tr.spec.output_uri, "final")

    generation = observed_generation
    conditions = list(current.conditions)
    if plan.steps or plan.waiting_for:
        ready = not plan.waiting_for and data.complete
        conditions = set_condition(
            conditions,
            "DataReady",
            "True" if ready else "False",
            "DataPrepared" if ready else reason if phase == "Pending" else "DataNotReady",
            f"training data at {plan.dataset}" if ready else message,
            observed_generation=generation,
            now=now,
        )
    terminal = phase in ("Succeeded", "Failed")
    conditions = set_condition(
        conditions, "Progressing", "False" if terminal else "True", reason, message,
        observed_generation=generation, now=now,
    )  # fmt: skip
    if terminal:
        conditions = set_condition(
            conditions, "Complete" if phase == "Succeeded" else "Failed", "True", reason, message,
            observed_generation=generation, now=now,
        )  # fmt: skip
    return TrainingRunStatus(
        phase=phase,
        observed_generation=observed_generation,
        conditions=conditions,
        step=step,
        total_steps=total,
        metrics=metrics,
        checkpoints=kept,
        latest_checkpoint=kept[-1].uri if kept else None,
        model_uri=model_uri if phase == "Succeeded" else current.model_uri,
        restarts=attempt,
        job_name=name if not plan.waiting_for and not (plan.steps and not data.complete) else None,
        start_time=current.start_time or state.start_time,
        completion_time=state.completion_time if terminal else None,
    )
