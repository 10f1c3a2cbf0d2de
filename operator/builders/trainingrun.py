"""TrainingRun -> a work order, a headless Service and an indexed Job of DeepSpeed ranks.

- ConfigMap `<run>-order`: the work order (`qpa.api.v1alpha1.workorder`): the TrainingRun itself
  plus what the operator resolved (the object store: the spec's or the chart's, the RolloutPool's
  URL, the attempt, the dataset the data plan resolved). The ranks turn it into their config
  with `SFTConfig.from_trainingrun` / `RLConfig.from_trainingrun`: no spec value is translated
  here, none is put in argv;
- Service `<run>-ranks`: headless, `publishNotReadyAddresses`, the rendezvous of the ranks;
- Job `<run>-r<attempt>`: `nodes` completions run at once (`completionMode: Indexed`), each pod
  `qpa train launch --nodes N --gpus-per-node G --service <run>-ranks --job-name <job> ... --
  qpa train <stage> --spec /etc/qpa/order/workorder.yaml` in `/work`; node `i` is
  `JOB_COMPLETION_INDEX=i`, rank 0 is `<job>-0.<run>-ranks`. Pods request `nvidia.com/gpu: G`
  and mount a memory-backed `/dev/shm` (NCCL and the dataloaders need more than the default).
  The spec fields that shape the Job rather than the training (nodes, gpusPerNode, image,
  resources, workSize, scheduling, backoffLimit) are used here. `/work` is an emptyDir of
  `workSize`, which is also the pod's ephemeral-storage request (unless the spec's resources
  name one).
- Gang admission: every attempt's Job is created suspended (`spec.suspend: true`) and admitted
  whole. With a Kueue queue (`spec.scheduling.queueName`, else `Defaults.training_queue`) the
  Job carries `kueue.x-k8s.io/queue-name` and Kueue un-suspends it; without one the handler
  un-suspends it once `admission.gang_admission` finds room for every rank, and
  `trainingrun_status` fails the run when that has not happened within
  `scheduling.admissionTimeoutSeconds` (`Admitted=False`, `InsufficientCapacity`).
- `podFailurePolicy` (`FAILURE_RULES`): a pod with the `DisruptionTarget` condition
  (preemption, eviction, a drained or tainted node) fails the Job at once and the operator
  restarts the gang without counting it against `backoffLimit` (`status.disruptions`); exit
  codes that mean the input or the image is wrong (`BUG_EXIT_CODES`: 2, qpa refused its work
  order or arguments; 126/127, the image cannot run the command) fail the run for good.
- Job `<run>-data` (only when the data must be prepared): `qpa data curate` for every TaskBatch
  output, then `qpa data mix` of all inputs into `<outputUri>/data/mix/`, before any rank runs.

A multi-node job cannot lose one rank and go on, so a failed attempt is not retried pod by pod
(`backoffLimit: 0`): the operator starts attempt `r+1` as a new Job (up to `backoffLimit`
counted attempts when `resume` is on), and it resumes from the latest checkpoint. The Jobs of
the last `scheduling.keepFailedAttempts` failed attempts stay (their pods hold the logs);
`stale_attempts` names the older ones, which are deleted. Rank 0 leaves a
`TrainSummary` in its termination message (`QPA_STATUS_FILE`): step, checkpoints, final model.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from qpa_operator.builders import netpol, podtemplate, storeaccess
from qpa_operator.builders.admission import Verdict
from qpa_operator.builders.common import (
    LABEL_COMPONENT,
    TERMINATION_LOG,
    Defaults,
    JobState,
    JsonDict,
    PodParts,
    bounded_name,
    child_name,
    combine,
    empty_dir,
    env_var,
    gpu_placement,
    job_state,
    labels,
    metadata,
    owner_namespace,
    reason_word,
    resources,
    restricted_container_security,
    restricted_pod_security,
    rollout_pool_url,
    selector_labels,
    store_parts,
    terminated_container,
    with_spec_hash,
    work_order_config_map,
    work_order_name,
    work_order_parts,
)
from qpa_operator.builders.rolloutserver import GROUP_PORT as ROLLOUT_GROUP_PORT
from qpa_operator.builders.rolloutserver import children as rollout_children
from qpa_operator.builders.rolloutserver import rank_rules as rollout_rank_rules
from qpa_operator.builders.rolloutserver import url as rollout_url

from qpa.api import TrainingRun
from qpa.api.v1alpha1 import (
    KUEUE_QUEUE_LABEL,
    Resolved,
    TrainingRunStatus,
    TrainSummary,
    set_condition,
)
from qpa.api.v1alpha1.workorder import WORK_ORDER_PATH

COMPONENT: Final = "trainer"
DATA_COMPONENT: Final = "data"
CONTAINER: Final = "trainer"
DATA_CONTAINER: Final = "data"
#: How qpa starts the refusal a pod leaves as its termination message (`qpa.cli.common.die`).
REFUSAL_PREFIX: Final = "error:"
WORK_DIR: Final = "/work"
ATTEMPT_LABEL: Final = "qpa.ai/attempt"
#: why the operator admitted a Job, written with the patch that un-suspends it, so every
#: status refresh (whichever handler's lands last) reports the same admission message
ADMITTED_ANNOTATION: Final = "qpa.ai/admitted"
COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
GPU_RESOURCE: Final = "nvidia.com/gpu"
EPHEMERAL_STORAGE: Final = "ephemeral-storage"
#: Exit codes of the trainer's launch process that mean a retry would fail the same way:
#: 2 is qpa's refusal of its input (`die`: a bad work order, config or launcher argument),
#: 126/127 a command the image cannot run or does not have.
BUG_EXIT_CODES: Final = (2, 126, 127)
#: The Job's podFailurePolicy rules, in order, with what a failure by each means to the run.
FAILURE_RULES: Final[tuple[tuple[str, JsonDict], ...]] = (
    (
        "disruption",
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ),
    (
        "bug",
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                            "values": list(BUG_EXIT_CODES)},
        },
    ),
)  # fmt: skip
_RULE_INDEX: Final = re.compile(r"matching FailJob rule at index (\d+)")


def config_map_name(tr: TrainingRun) -> str:
    return work_order_name(tr)


def service_name(tr: TrainingRun) -> str:
    return child_name(tr, "ranks")


def job_name(tr: TrainingRun, attempt: int) -> str:
    return child_name(tr, f"r{attempt}")


def data_job_name(tr: TrainingRun) -> str:
    return child_name(tr, "data")


def queue_name(tr: TrainingRun, defaults: Defaults) -> str | None:
    """The Kueue LocalQueue that admits the ranks' Job, or None for the operator's own."""
    return tr.spec.scheduling.queue_name or defaults.training_queue


def pod_failure_policy() -> JsonDict:
    return {"rules": [dict(rule) for _, rule in FAILURE_RULES]}


def failure_kind(state: JobState) -> str:
    """Why a failed Job failed: `disruption`, `bug` (a podFailurePolicy rule) or `failure`."""
    if state.reason != "PodFailurePolicy":
        return "failure"
    match = _RULE_INDEX.search(state.message)
    index = int(match.group(1)) if match else -1
    return FAILURE_RULES[index][0] if 0 <= index < len(FAILURE_RULES) else "failure"


def suspended(job: Mapping[str, Any] | None) -> bool:
    return bool(job and (job.get("spec") or {}).get("suspend"))


def attempt_of(job: Mapping[str, Any]) -> int | None:
    value = ((job.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def stale_attempts(
    tr: TrainingRun, attempt: int, jobs: Iterable[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The ranks' Jobs to delete: those of attempts other than `attempt`, except the newest
    `scheduling.keepFailedAttempts` earlier ones (kept with their pods, for the logs)."""
    earlier: list[tuple[int, Mapping[str, Any]]] = []
    stale: list[Mapping[str, Any]] = []
    for job in jobs:
        number = attempt_of(job)
        if number is None or number == attempt:
            continue
        if number < attempt:
            earlier.append((number, job))
        else:
            stale.append(job)  # a later attempt than the status knows: left by a lost write
    earlier.sort(key=lambda item: item[0], reverse=True)
    keep = tr.spec.scheduling.keep_failed_attempts
    return stale + [job for _, job in earlier[keep:]]


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)]) + "/"


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
    weights: list[str] = []
    for ref, item in zip(refs, inputs, strict=True):
        if ref.task_batch_ref is not None:
            curated = _join(out, "data", "curated", ref.task_batch_ref.name)
            steps.append(
                ("qpa", "data", "curate", str(item["uri"]), "--out", curated, "--keep-existing")
            )
            mixed.append(curated)
        else:
            mixed.append(str(item["uri"]))
        if ref.weight != 1.0:
            weights += ["--input-weight", f"{mixed[-1]}={ref.weight:g}"]
    target = _join(out, "data", "mix")
    steps.append(("qpa", "data", "mix", *mixed, *weights, "--out", target))
    return DataPlan(dataset=target, steps=tuple(steps), inputs=inputs)


# --------------------------------------------------------------------------- work order


def resolved(tr: TrainingRun, plan: DataPlan, defaults: Defaults, attempt: int = 0) -> Resolved:
    """What the ranks get beyond the spec: store, RolloutPool URL, attempt, prepared dataset."""
    namespace = owner_namespace(tr)
    rl = tr.spec.rl
    return Resolved(
        namespace=namespace,
        store=tr.spec.store or defaults.store,
        rollout_pool_url=rollout_pool_url(rl.rollout_pool_ref.name, namespace, defaults)
        if rl is not None
        else None,
        rollout_server_url=rollout_url(tr, defaults) if rl and rl.generation else None,
        rollout_group_port=ROLLOUT_GROUP_PORT if rl and rl.generation else None,
        attempt=attempt,
        dataset_uri=plan.dataset,
    )


def config_map(tr: TrainingRun, plan: DataPlan, defaults: Defaults, attempt: int = 0) -> JsonDict:
    """The work order of the ranks (`qpa train <stage> --spec`)."""
    return work_order_config_map(tr, resolved(tr, plan, defaults, attempt), COMPONENT, defaults)


# --------------------------------------------------------------------------- pods


def ranks_per_node(tr: TrainingRun) -> int:
    return max(1, tr.spec.gpus_per_node)


def train_args(tr: TrainingRun, attempt: int, defaults: Defaults) -> list[str]:
    """`qpa train launch ... -- qpa train <stage> --spec WORK_ORDER_PATH` of every node."""
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
    return [*launch, "qpa", "train", spec.stage, "--spec", WORK_ORDER_PATH]


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
                volumes=(empty_dir("work", size_limit=str(tr.spec.work_size)), empty_dir("tmp")),
                mounts=(
                    {"name": "work", "mountPath": WORK_DIR},
                    {"name": "tmp", "mountPath": "/tmp"},
                ),
            ),
            work_order_parts(tr),
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
        "workingDir": WORK_DIR,
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
    requests = container_resources.setdefault("requests", {})
    requests.setdefault(EPHEMERAL_STORAGE, str(spec.work_size))
    container_resources["requests"] = dict(sorted(requests.items()))
    container["resources"] = container_resources
    pod_labels = {**labels(tr, COMPONENT, defaults), ATTEMPT_LABEL: str(attempt)}
    if spec.rl is not None:  # admitted by the RolloutPool's ingress policy
        pod_labels[netpol.ENV_CLIENT_LABEL] = spec.rl.rollout_pool_ref.name
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
    pod_spec = podtemplate.merge(pod_spec, spec.pod_template, defaults)
    meta = metadata(tr, job_name(tr, attempt), COMPONENT, defaults)
    meta["labels"][ATTEMPT_LABEL] = str(attempt)
    queue = queue_name(tr, defaults)
    if queue is not None:
        meta["labels"][KUEUE_QUEUE_LABEL] = queue
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            # admitted whole: by Kueue, or by the operator once every rank has room
            "suspend": True,
            "backoffLimit": 0,
            "podFailurePolicy": pod_failure_policy(),
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }
    return with_spec_hash(manifest)


#: The data pod's share (curation and mixing stream record by record; never BestEffort).
DATA_RESOURCES: Final[JsonDict] = {
    "requests": {"cpu": "1", "memory": "2Gi"},
    "limits": {"memory": "8Gi"},
}


def data_job(tr: TrainingRun, plan: DataPlan, defaults: Defaults) -> JsonDict | None:
    """One pod that curates and mixes the inputs, or None when nothing needs preparing."""
    if not plan.steps:
        return None
    parts = _pod_parts(tr, defaults)
    script = " && ".join(" ".join(_quote(word) for word in step) for step in plan.steps)
    container: JsonDict = {
        "name": DATA_CONTAINER,
        "image": tr.spec.image or defaults.trainer_image,
        "command": ["sh", "-c", f"set -e; {script}"],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "resources": copy.deepcopy(DATA_RESOURCES),
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
    return with_spec_hash(podtemplate.merge_into(manifest, tr.spec.pod_template, defaults))


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


def egress_policy(tr: TrainingRun, defaults: Defaults) -> JsonDict:
    """Ranks reach DNS, the store, the base model's host, their RolloutPool (RL) and each
    other (every port: NCCL opens ephemeral ones)."""
    spec = tr.spec
    store = spec.store or defaults.store
    ranks = selector_labels(tr, COMPONENT)
    rules: list[JsonDict] = [{"to": [netpol.pods_peer(ranks)]}]
    if spec.rl is not None:
        rules.append(netpol.env_pool_rule(spec.rl.rollout_pool_ref.name))
    rules += rollout_rank_rules(tr)[0]  # the rollout server, if any: every port
    return netpol.egress_policy(
        tr,
        COMPONENT,
        defaults,
        endpoints=[store.endpoint if store else None, netpol.model_source(spec.base_model_uri)],
        rules=rules,
    )


def data_egress_policy(tr: TrainingRun, defaults: Defaults) -> JsonDict:
    """The data Job reaches DNS and the store only."""
    store = tr.spec.store or defaults.store
    return netpol.egress_policy(
        tr,
        DATA_COMPONENT,
        defaults,
        endpoints=[store.endpoint if store else None],
        part="data",
    )


def ingress_policy(tr: TrainingRun, defaults: Defaults) -> JsonDict:
    """Into the ranks only from the same run's ranks (rendezvous and NCCL, every port)."""
    ranks = selector_labels(tr, COMPONENT)
    return netpol.ingress_policy(
        tr,
        bounded_name(tr, "ranks", 63 - len("-ingress")),
        COMPONENT,
        defaults,
        pod_selector=ranks,
        sources=[([netpol.pods_peer(ranks), *rollout_rank_rules(tr)[1]], None)],
    )


def network_policies(tr: TrainingRun, defaults: Defaults) -> list[JsonDict]:
    return [
        egress_policy(tr, defaults),
        data_egress_policy(tr, defaults),
        ingress_policy(tr, defaults),
    ]


def children(
    tr: TrainingRun,
    defaults: Defaults,
    *,
    attempt: int,
    plan: DataPlan,
    data_ready: bool,
) -> list[JsonDict]:
    """The run's children for `attempt`; the ranks' Job only once the data is ready; none
    for a URI outside the namespace's store prefix (`storeaccess.check` raises)."""
    storeaccess.check(tr, defaults)
    result = [
        *network_policies(tr, defaults),
        config_map(tr, plan, defaults, attempt),
        service(tr, defaults),
        *rollout_children(tr, defaults, selector_labels(tr, COMPONENT)),
    ]
    prepare = data_job(tr, plan, defaults)
    if prepare is not None:
        result.append(prepare)
    if data_ready and not plan.waiting_for:
        result.append(job(tr, attempt, defaults))
    return result


# --------------------------------------------------------------------------- status


def next_attempt(
    tr: TrainingRun, attempt: int, state: JobState, disruptions: int = 0
) -> int | None:
    """The attempt to start after `attempt` failed, or None when the run has failed for good.

    A disruption starts the next attempt whatever the count; a bug never does; any other
    failure does while fewer than `backoffLimit` attempts (less the disrupted ones) failed.
    """
    if not state.failed_for_good or not tr.spec.resume:
        return None
    kind = failure_kind(state)
    if kind == "bug":
        return None
    if kind == "disruption":
        return attempt + 1
    return attempt + 1 if attempt - disruptions < tr.spec.backoff_limit else None


def _created(job: Mapping[str, Any] | None) -> datetime | None:
    stamp = ((job or {}).get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def admission_timed_out(tr: TrainingRun, job: Mapping[str, Any] | None, now: datetime) -> bool:
    """The attempt's suspended Job has waited longer than `admissionTimeoutSeconds`."""
    created = _created(job)
    if created is None or not suspended(job):
        return False
    return (now - created).total_seconds() > tr.spec.scheduling.admission_timeout_seconds


def rank0_summary(pod: Mapping[str, Any]) -> tuple[int, TrainSummary] | None:
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
    summary = TrainSummary.from_message(terminated.get("message"))
    return (attempt, summary) if summary is not None else None


def pod_refusal(pod: Mapping[str, Any]) -> tuple[str, int, str] | None:
    """(component, attempt, why) of a trainer or data pod whose container exited non-zero and
    left qpa's refusal (`error: ...`, e.g. a dataset the review gate refuses) in its
    termination message; None for any other pod. Under torchrun the exit code is the
    launcher's (1), so the message, not the code, says that the input was refused."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    component = str(pod_labels.get(LABEL_COMPONENT, ""))
    container = {COMPONENT: CONTAINER, DATA_COMPONENT: DATA_CONTAINER}.get(component)
    terminated = terminated_container(pod, container) if container else None
    if terminated is None or not terminated.get("exitCode"):
        return None
    lines = [line.strip() for line in str(terminated.get("message") or "").splitlines()]
    refusals = [line for line in lines if line.startswith(REFUSAL_PREFIX)]
    if not refusals:
        return None
    try:
        attempt = int(pod_labels.get(ATTEMPT_LABEL, "0"))
    except ValueError:
        attempt = 0
    return component, attempt, refusals[-1][len(REFUSAL_PREFIX) :].strip()


def _with_refusal(message: str, why: str | None) -> str:
    return f"{message}; the pod refused its input: {why}" if why else message


def trainingrun_status(
    tr: TrainingRun,
    *,
    attempt: int,
    job: Mapping[str, Any] | None,
    data_job: Mapping[str, Any] | None,
    plan: DataPlan,
    summaries: Iterable[tuple[int, TrainSummary]],
    observed_generation: int | None,
    now: datetime,
    queue: str | None = None,
    verdict: Verdict | None = None,
    refusals: Iterable[tuple[str, int, str]] = (),
) -> TrainingRunStatus:
    """The status of a run from its current attempt's Job, its data Job and rank-0 summaries.

    `queue` is the Kueue queue admitting the Job (None: the operator admits it); `verdict`
    the operator's admission check of this reconcile, if it made one (else the `Admitted`
    condition's message stands). `refusals` (`pod_refusal` of the run's pods) put why a
    failed pod refused its input (e.g. the dataset and its review state) into the message.
    """
    current = tr.status or TrainingRunStatus()
    state = job_state(job)
    data = job_state(data_job)
    name = job_name(tr, attempt)
    refused = {
        component: min(why for c, a, why in refusals if c == component and a == at)
        for component, at in ((DATA_COMPONENT, 0), (COMPONENT, attempt))
        if any(c == component and a == at for c, a, _ in refusals)
    }
    waiting = suspended(job) and not state.finished
    previous = next((c for c in current.conditions if c.type == "Admitted"), None)
    if verdict is not None and not verdict.admitted:
        shortage = verdict.message
    elif previous is not None and previous.status == "False" and previous.message:
        shortage = (
            previous.message.split(": ", 1)[-1]
            if previous.message.startswith("not admitted within")
            else previous.message
        )
    else:
        shortage = "waiting for the operator's admission check"
    timeout = tr.spec.scheduling.admission_timeout_seconds
    if plan.waiting_for:
        phase, reason = "Pending", "WaitingForTaskBatch"
        message = "waiting for TaskBatch " + ", ".join(plan.waiting_for) + " to succeed"
    elif plan.steps and data.failed_for_good:
        phase, reason = "Failed", "DataPreparationFailed"
        message = _with_refusal(
            data.message or f"Job {data_job_name(tr)} failed", refused.get(DATA_COMPONENT)
        )
    elif plan.steps and not data.complete:
        phase, reason = "Pending", "PreparingData"
        message = f"Job {data_job_name(tr)} curates and mixes the datasets"
    elif state.failed_for_good:
        retry = next_attempt(tr, attempt, state, current.disruptions)
        kind = failure_kind(state)
        if retry is None:
            phase = "Failed"
            reason = "BugExitCode" if kind == "bug" else reason_word(state.reason, "JobFailed")
            message = _with_refusal(state.message or f"Job {name} failed", refused.get(COMPONENT))
        elif kind == "disruption":
            phase, reason = "Resuming", "AttemptDisrupted"
            message = (
                f"Job {name} was disrupted ({state.message}); attempt {retry} resumes from the "
                "latest checkpoint, not counted against backoffLimit"
            )
        else:
            phase, reason = "Resuming", "AttemptFailed"
            message = _with_refusal(
                f"Job {name} failed; attempt {retry} resumes from the latest checkpoint",
                refused.get(COMPONENT),
            )
    elif state.complete:
        phase, reason, message = "Succeeded", "JobComplete", f"Job {name} completed"
    elif waiting and queue is not None:
        phase = "Pending" if attempt == 0 else "Resuming"
        reason = "QueuedInKueue"
        message = f"Job {name} waits for Kueue (LocalQueue {queue}) to admit all its ranks"
    elif waiting and admission_timed_out(tr, job, now):
        phase, reason = "Failed", "AdmissionTimeout"
        message = f"not admitted within {timeout}s: {shortage}"
    elif waiting:
        phase = "Pending" if attempt == 0 else "Resuming"
        reason = "InsufficientCapacity" if verdict is not None or previous else "AwaitingAdmission"
        message = f"Job {name} suspended until all {tr.spec.nodes} ranks fit: {shortage}"
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
        step = max(step, summary.step)
        total = summary.total_steps if summary.total_steps is not None else total
        for checkpoint in summary.checkpoints:
            checkpoints[checkpoint.step] = checkpoint
        model_uri = summary.model_uri or model_uri
        metrics.update(summary.metrics)
        if summary.loss is not None:
            metrics["loss"] = summary.loss
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
    if waiting:
        admit_reason = "QueuedInKueue" if queue is not None else reason
        if admit_reason == "AdmissionTimeout":
            admit_reason = "InsufficientCapacity"
        conditions = set_condition(
            conditions, "Admitted", "False", admit_reason,
            message if queue is not None or phase == "Failed" else shortage,
            observed_generation=generation, now=now,
        )  # fmt: skip
    elif state.exists and not state.finished:
        recorded = ((job or {}).get("metadata") or {}).get("annotations") or {}
        admitted = (
            verdict.message if verdict is not None and verdict.admitted
            else str(recorded[ADMITTED_ANNOTATION]) if recorded.get(ADMITTED_ANNOTATION)
            else previous.message if previous is not None and previous.status == "True"
            else f"all {tr.spec.nodes} ranks admitted at once"
        )  # fmt: skip
        conditions = set_condition(
            conditions, "Admitted", "True", "AdmittedByKueue" if queue is not None else "Admitted",
            admitted, observed_generation=generation, now=now,
        )  # fmt: skip
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
        disruptions=current.disruptions,
        job_name=name if not plan.waiting_for and not (plan.steps and not data.complete) else None,
        start_time=current.start_time or state.start_time,
        completion_time=state.completion_time if terminal else None,
    )
