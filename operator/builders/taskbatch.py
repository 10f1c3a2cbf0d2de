"""TaskBatch -> a work order ConfigMap and an indexed Job of `qpa collect --spec`.

The ConfigMap holds the work order (`qpa.api.v1alpha1.workorder`): the TaskBatch itself plus what
the operator resolved for it (namespace, object store: the spec's or the chart's default, the
RolloutPool's URL). Each of the Job's `shards` completions is one pod running

    qpa collect --spec /etc/qpa/order/workorder.yaml

which builds its `CollectConfig` from the work order (`CollectConfig.from_taskbatch`), so pod `i`
(`JOB_COMPLETION_INDEX=i`) collects shard `i/N` of the tasks; no spec value is in the argv.
`parallelism` pods run at once; `backoffLimit` is per shard (`backoffLimitPerIndex`): a shard that
keeps failing fails the batch without stopping the others. Each pod leaves a `CollectSummary`
of its shard in its termination message; `taskbatch_status` adds them up with the Job's counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from qpa_operator.builders import netpol, podtemplate, storeaccess
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
from qpa.api.v1alpha1.taskbatch import API_KEY_ENV, CollectSummary
from qpa.api.v1alpha1.workorder import (
    WORK_ORDER_DIR,
    WORK_ORDER_KEY,
    WORK_ORDER_PATH,
    Resolved,
    dump_work_order,
)

COMPONENT: Final = "collector"
CONTAINER: Final = "collect"
SPOOL_DIR: Final = "/var/spool/qpa"
COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"

PHASE_RANK: Final = {None: -1, "Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}


#: Pods of an indexed Job are named `<job>-<index>` (a DNS label); shards go up to 10000.
JOB_NAME_LIMIT: Final = 63 - len("-9999")


def job_name(tb: TaskBatch) -> str:
    return bounded_name(tb, "collect", JOB_NAME_LIMIT)


def config_map_name(tb: TaskBatch) -> str:
    return child_name(tb, "order")


def shard_count(tb: TaskBatch) -> int:
    return tb.spec.shards or tb.spec.parallelism


def resolved(tb: TaskBatch, defaults: Defaults) -> Resolved:
    """What the workers need beyond the spec: namespace, object store, RolloutPool URL."""
    spec = tb.spec
    namespace = owner_namespace(tb)
    pool = spec.rollout_pool_ref
    return Resolved(
        namespace=namespace,
        store=spec.store or defaults.store,
        rollout_pool_url=rollout_pool_url(pool.name, namespace, defaults) if pool else None,
    )


#: The command line of every worker: the work order says everything else.
COLLECT_ARGS: Final = ("qpa", "collect", "--spec", WORK_ORDER_PATH)


def config_map(tb: TaskBatch, defaults: Defaults) -> JsonDict:
    """The batch's work order (the TaskBatch plus `resolved`), as the workers' pods read it."""
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(tb, config_map_name(tb), COMPONENT, defaults),
        "data": {WORK_ORDER_KEY: dump_work_order(tb, resolved(tb, defaults))},
    }
    return with_spec_hash(manifest)


def job(tb: TaskBatch, defaults: Defaults) -> JsonDict:
    spec = tb.spec
    harness_parts, _ = harness_config_parts(spec.policy.harness.config_map_ref)
    parts = combine(
        [
            PodParts(
                env=(env_var("QPA_SPOOL_DIR", SPOOL_DIR), env_var("HOME", "/tmp")),
                volumes=(
                    empty_dir("spool"),
                    empty_dir("tmp"),
                    {"name": "work-order", "configMap": {"name": config_map_name(tb)}},
                ),
                mounts=(
                    {"name": "spool", "mountPath": SPOOL_DIR},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "work-order", "mountPath": WORK_ORDER_DIR, "readOnly": True},
                ),
            ),
            store_parts(spec.store or defaults.store),
            api_key_parts(spec.policy.api_key_secret_ref, API_KEY_ENV),
            harness_parts,
        ]
    )
    container: JsonDict = {
        "name": CONTAINER,
        "image": spec.image or defaults.image,
        "command": summary_wrapper("qpa-collect"),
        "args": list(COLLECT_ARGS),
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
            "metadata": {"labels": pod_labels(tb, defaults)},
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
    return with_spec_hash(podtemplate.merge_into(manifest, spec.pod_template, defaults))


def egress_policy(tb: TaskBatch, defaults: Defaults) -> JsonDict:
    """Collectors reach DNS, the model (its endpoint, or where a local planner's weights come
    from), the object store and their RolloutPool's servers only."""
    spec = tb.spec
    store = spec.store or defaults.store
    rules = []
    if spec.rollout_pool_ref is not None:
        rules.append(netpol.env_pool_rule(spec.rollout_pool_ref.name))
    return netpol.egress_policy(
        tb,
        COMPONENT,
        defaults,
        endpoints=[
            spec.policy.model_url,
            netpol.model_source(spec.policy.model_uri),
            store.endpoint if store else None,
        ],
        rules=rules,
    )


def pod_labels(tb: TaskBatch, defaults: Defaults) -> dict[str, str]:
    """The collectors' labels; with a RolloutPool, the label its ingress policy admits."""
    result = labels(tb, COMPONENT, defaults)
    if tb.spec.rollout_pool_ref is not None:
        result[netpol.ENV_CLIENT_LABEL] = tb.spec.rollout_pool_ref.name
    return result


def children(tb: TaskBatch, defaults: Defaults) -> list[JsonDict]:
    """Every child of a TaskBatch, in creation order (the egress policy and the ConfigMap the
    pods need come before the Job). `OutsideStorePrefix` for a URI outside the namespace's store
    prefix (`storeaccess.check` raises)."""
    storeaccess.check(tb, defaults)
    return [egress_policy(tb, defaults), config_map(tb, defaults), job(tb, defaults)]


#: Fields of a Job's spec that may change after creation (the pod template may not).
MUTABLE_JOB_FIELDS: Final = ("parallelism", "activeDeadlineSeconds")


# --------------------------------------------------------------------------- status


def shard_summary(pod: Mapping[str, Any]) -> tuple[int, CollectSummary] | None:
    """(shard index, `CollectSummary`) of a worker pod that finished its shard."""
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
    summary = CollectSummary.from_message(terminated.get("message"))
    if summary is None:
        return None
    return index, summary


def taskbatch_status(
    tb: TaskBatch,
    job: Mapping[str, Any] | None,
    shards: Mapping[int, CollectSummary],
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
        # a retried shard resumes: its summary covers what earlier attempts wrote too
        shard_rows = summary.ran + summary.skipped
        shard_wins = summary.successes + summary.skipped_successes
        trajectories += shard_rows
        successes += shard_wins
        failures += max(0, shard_rows - shard_wins)
        pairs += summary.total
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
