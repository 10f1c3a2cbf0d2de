"""TaskBatch -> a ConfigMap with the batch's task spec and an indexed Job of `qpa collect`.

Each of the Job's `shards` completions is one pod running

    qpa collect --out <outputUri> --samples <k> --shard-from-env --shards <N> --planner ...

so pod `i` (`JOB_COMPLETION_INDEX=i`) collects shard `i/N` of the tasks. `parallelism` pods run
at once; `backoffLimit` is per shard (`backoffLimitPerIndex`): a shard that keeps failing fails
the batch without stopping the others. Each pod leaves `qpa collect --json`'s summary of its
shard in its termination message; `taskbatch_status` adds them up with the Job's own counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

import yaml
from qpa_operator.builders import netpol
from qpa_operator.builders.common import (
    TERMINATION_LOG,
    Defaults,
    JobState,
    JsonDict,
    PodParts,
    api_key_parts,
    bounded_name,
    child_name,
    combine,
    empty_dir,
    env_var,
    harness_config_parts,
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
    store_parts,
    summary_wrapper,
    terminated_container,
    with_spec_hash,
)

from qpa.api import TaskBatch
from qpa.api.v1alpha1 import TaskBatchStatus, set_condition

COMPONENT: Final = "collector"
CONTAINER: Final = "collect"
SPEC_MOUNT: Final = "/etc/qpa/taskbatch"
SPEC_KEY: Final = "taskbatch.yaml"
SPOOL_DIR: Final = "/var/spool/qpa"
COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"

PHASE_RANK: Final = {None: -1, "Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}


#: Pods of an indexed Job are named `<job>-<index>` (a DNS label); shards go up to 10000.
JOB_NAME_LIMIT: Final = 63 - len("-9999")


def job_name(tb: TaskBatch) -> str:
    return bounded_name(tb, "collect", JOB_NAME_LIMIT)


def config_map_name(tb: TaskBatch) -> str:
    return child_name(tb, "tasks")


def shard_count(tb: TaskBatch) -> int:
    return tb.spec.shards or tb.spec.parallelism


def collect_args(tb: TaskBatch, defaults: Defaults) -> list[str]:
    """The `qpa collect` command line of every worker (flags as `qpa collect --help`)."""
    spec = tb.spec
    args = ["qpa", "collect", "--out", spec.output_uri]
    source = spec.source
    if source.dataset_uri is not None:
        args += ["--tasks", source.dataset_uri]
    elif source.generator is not None:
        gen = source.generator
        args += ["--suite", gen.suite, "--seed", str(gen.seed)]
    args += ["--split", source.split or "all"]
    if source.limit is not None:
        args += ["--limit", str(source.limit)]
    for domain in source.domains:
        args += ["--domain", domain]
    for capability in source.capabilities:
        args += ["--capability", capability]
    for task_id in source.task_ids:
        args += ["--task-id", task_id]
    args += [
        "--samples",
        str(spec.samples_per_task),
        "--shard-from-env",
        "--shards",
        str(shard_count(tb)),
        "--max-turns",
        str(spec.max_turns),
        "--name",
        tb.metadata.name or "taskbatch",
        "--spool-dir",
        SPOOL_DIR,
    ]
    policy = spec.policy
    args += ["--planner", policy.planner]
    if policy.model_url is not None:
        args += ["--model-url", policy.model_url, "--model", policy.model]
    if policy.model_uri is not None:
        args += ["--model-path", policy.model_uri]
    if policy.api_key_secret_ref is not None:
        args += ["--api-key-env", "QPA_API_KEY"]
    if policy.harness.config_map_ref is not None:
        _, path = harness_config_parts(policy.harness.config_map_ref)
        args += ["--harness-config", str(path)]
    if spec.rollout_pool_ref is not None:
        url = rollout_pool_url(spec.rollout_pool_ref.name, owner_namespace(tb), defaults)
        args += ["--env-url", url]
    args.append("--json")
    return args


def config_map(tb: TaskBatch, defaults: Defaults) -> JsonDict:
    """The batch's task spec (source, policy, sampling), as the workers' pods see it."""
    document = {
        "apiVersion": tb.api_version,
        "kind": tb.kind,
        "metadata": {"name": tb.metadata.name, "namespace": owner_namespace(tb)},
        "spec": tb.spec.to_k8s(),
    }
    body = yaml.safe_dump(document, sort_keys=True)
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(tb, config_map_name(tb), COMPONENT, defaults),
        "data": {SPEC_KEY: body},
    }
    return with_spec_hash(manifest)


def job(tb: TaskBatch, defaults: Defaults) -> JsonDict:
    spec = tb.spec
    harness_parts, _ = harness_config_parts(spec.policy.harness.config_map_ref)
    parts = combine(
        [
            PodParts(
                env=(
                    env_var("QPA_SHARD_COUNT", str(shard_count(tb))),
                    env_var("QPA_SPOOL_DIR", SPOOL_DIR),
                    env_var("QPA_TASKBATCH", tb.metadata.name or ""),
                    env_var("QPA_TASKBATCH_SPEC", f"{SPEC_MOUNT}/{SPEC_KEY}"),
                    env_var("QPA_HARNESS_VERSION", spec.policy.harness.version),
                    env_var("HOME", "/tmp"),
                ),
                volumes=(
                    empty_dir("spool"),
                    empty_dir("tmp"),
                    {"name": "taskbatch-spec", "configMap": {"name": config_map_name(tb)}},
                ),
                mounts=(
                    {"name": "spool", "mountPath": SPOOL_DIR},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "taskbatch-spec", "mountPath": SPEC_MOUNT, "readOnly": True},
                ),
            ),
            store_parts(spec.store or defaults.store),
            api_key_parts(spec.policy.api_key_secret_ref),
            harness_parts,
        ]
    )
    container: JsonDict = {
        "name": CONTAINER,
        "image": spec.image or defaults.image,
        "command": summary_wrapper("qpa-collect"),
        "args": collect_args(tb, defaults),
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    container_resources = resources(spec.resources)
    if container_resources:
        container["resources"] = container_resources
    job_spec: JsonDict = {
        "completionMode": "Indexed",
        "completions": shard_count(tb),
        "parallelism": spec.parallelism,
        "backoffLimitPerIndex": spec.backoff_limit,
        "template": {
            "metadata": {"labels": labels(tb, COMPONENT, defaults)},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": restricted_pod_security(defaults),
                "containers": [container],
                "volumes": list(parts.volumes),
            },
        },
    }
    if spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.active_deadline_seconds
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(tb, job_name(tb), COMPONENT, defaults),
        "spec": job_spec,
    }
    return with_spec_hash(manifest)


def egress_policy(tb: TaskBatch, defaults: Defaults) -> JsonDict:
    """Collectors reach DNS, the model, the object store and their RolloutPool only."""
    spec = tb.spec
    store = spec.store or defaults.store
    rules = []
    if spec.rollout_pool_ref is not None:
        pool = spec.rollout_pool_ref.name
        rules.append(netpol.pods_rule(netpol.component_pods("RolloutPool", pool, "env-server")))
    return netpol.egress_policy(
        tb,
        COMPONENT,
        defaults,
        endpoints=[spec.policy.model_url, store.endpoint if store else None],
        rules=rules,
    )


def children(tb: TaskBatch, defaults: Defaults) -> list[JsonDict]:
    """Every child of a TaskBatch, in creation order (the egress policy and the ConfigMap the
    pods need come before the Job)."""
    return [egress_policy(tb, defaults), config_map(tb, defaults), job(tb, defaults)]


#: Fields of a Job's spec that may change after creation (the pod template may not).
MUTABLE_JOB_FIELDS: Final = ("parallelism", "activeDeadlineSeconds")


# --------------------------------------------------------------------------- status


def shard_summary(pod: Mapping[str, Any]) -> tuple[int, JsonDict] | None:
    """(shard index, `qpa collect --json` summary) of a worker pod that finished its shard."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(COMPLETION_INDEX_LABEL)
    if raw is None:
        raw = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    try:
        index = int(str(raw))
    except ValueError:
        return None
    terminated = terminated_container(pod, CONTAINER)
    if terminated is None or terminated.get("exitCode") != 0:
        return None
    summary = parse_summary(terminated.get("message"))
    if summary is None:
        return None
    return index, summary


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def taskbatch_status(
    tb: TaskBatch,
    job: Mapping[str, Any] | None,
    shards: Mapping[int, Mapping[str, Any]],
    *,
    observed_generation: int | None,
    now: datetime,
) -> TaskBatchStatus:
    """The status a TaskBatch should have, from its Job and its finished shards' summaries.

    Never moves the phase backwards for the same Job (a stale view of the Job cannot undo a
    newer one); counts come from the summaries of shards whose pod exited 0.
    """
    current = tb.status or TaskBatchStatus()
    state: JobState = job_state(job)
    name = job_name(tb)
    if not state.exists:
        phase, reason, message = "Pending", "JobMissing", f"Job {name} does not exist yet"
    elif state.failed_for_good:
        phase = "Failed"
        reason = reason_word(state.reason, "JobFailed")
        message = state.message or f"Job {name} failed"
    elif state.complete:
        phase, reason, message = "Succeeded", "JobComplete", f"Job {name} completed"
    elif state.started:
        phase, reason = "Running", "JobRunning"
        message = (
            f"{state.completed_indexes or state.succeeded}/{shard_count(tb)} shards done, "
            f"{state.active} running"
        )
    else:
        phase, reason, message = "Pending", "JobCreated", f"Job {name} created, not started yet"

    if PHASE_RANK[phase] < PHASE_RANK[current.phase] and current.job_name == name:
        return current.model_copy(
            update={"observed_generation": observed_generation or current.observed_generation}
        )

    trajectories = successes = failures = pairs = 0
    for summary in shards.values():
        ran, skipped, won = (
            _int(summary.get("ran")),
            _int(summary.get("skipped")),
            _int(summary.get("successes")),
        )
        trajectories += ran + skipped
        successes += won
        failures += max(0, ran - won)
        pairs += _int(summary.get("total"))
    tasks = pairs // tb.spec.samples_per_task if pairs else current.tasks

    conditions = list(current.conditions)
    generation = observed_generation
    if phase in ("Pending", "Running"):
        conditions = set_condition(
            conditions, "Progressing", "True", reason, message,
            observed_generation=generation, now=now,
        )  # fmt: skip
    else:
        conditions = set_condition(
            conditions, "Progressing", "False", reason, message,
            observed_generation=generation, now=now,
        )  # fmt: skip
        conditions = set_condition(
            conditions,
            "Complete" if phase == "Succeeded" else "Failed",
            "True",
            reason,
            message,
            observed_generation=generation,
            now=now,
        )
    return TaskBatchStatus(
        phase=phase,
        observed_generation=observed_generation,
        conditions=conditions,
        tasks=tasks,
        trajectories=max(trajectories, current.trajectories if phase != "Pending" else 0),
        successes=max(successes, current.successes if phase != "Pending" else 0),
        failures=max(failures, current.failures if phase != "Pending" else 0),
        completed_shards=max(state.completed_indexes, state.succeeded),
        failed_shards=state.failed_indexes,
        job_name=name,
        output_uri=tb.spec.output_uri,
        start_time=state.start_time or current.start_time,
        completion_time=state.completion_time or current.completion_time,
    )
