"""TrainingRun gang scheduling, as pure builders: the suspended Job and its Kueue label, the
podFailurePolicy and what each failure means for the next attempt, the kept attempts, the
`/work` size, the `Admitted` condition and its timeout, and `admission.gang_admission` (the
operator's all-or-nothing fit over Nodes and Pods)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_builtin import check
from qpa_operator.builders import Defaults, admission, trainingrun
from qpa_operator.builders.common import JobState, job_state

from qpa.api import TrainingRun, parse_resource

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"


def run(**spec: Any) -> TrainingRun:
    """The example's RL run (4 nodes x 8 GPUs) at the defaults of what these tests look at
    (resources, workSize, scheduling), with `spec` laid over it."""
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "trainingrun.yaml").read_text())]
    body = copy.deepcopy(docs[1])
    body["metadata"].update(namespace="team-a", uid="uid-run")
    for field in ("resources", "workSize", "scheduling"):
        body["spec"].pop(field, None)
    body["spec"].update(spec)
    resource = parse_resource(body)
    assert isinstance(resource, TrainingRun)
    return resource


def ranks_job(tr: TrainingRun, attempt: int = 0, defaults: Defaults | None = None) -> Any:
    job = trainingrun.job(tr, attempt, defaults or Defaults())
    job["metadata"]["uid"] = f"job-uid-{attempt}"
    job["metadata"]["creationTimestamp"] = NOW.isoformat().replace("+00:00", "Z")
    return job


# --------------------------------------------------------------------------- the Job


def test_every_attempt_starts_suspended_with_the_failure_policy_and_a_bounded_work() -> None:
    tr = run(workSize="80Gi")
    job = ranks_job(tr, 2)
    spec = job["spec"]
    assert spec["suspend"] is True
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (4, 4, 0)
    disruption, bug = spec["podFailurePolicy"]["rules"]
    assert disruption == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert bug == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2, 126, 127]},
    }
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["ephemeral-storage"] == "80Gi"
    assert container["resources"]["requests"][GPU] == "8"
    work = next(v for v in pod["volumes"] if v["name"] == "work")
    assert work["emptyDir"] == {"sizeLimit": "80Gi"}
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    result = check(job)
    assert not result.errors and not result.unknown, (result.errors, result.unknown)


def test_an_ephemeral_storage_request_in_the_spec_wins_over_the_work_size() -> None:
    tr = run(resources={"requests": {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "200Gi"}})
    requests = ranks_job(tr)["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["ephemeral-storage"] == "200Gi"
    assert (requests["cpu"], requests["memory"]) == ("8", "64Gi")


def test_a_kueue_queue_from_the_spec_or_the_chart_labels_the_suspended_job() -> None:
    label = "kueue.x-k8s.io/queue-name"
    own = ranks_job(run(scheduling={"queueName": "team-a-gpus"}))
    assert own["metadata"]["labels"][label] == "team-a-gpus" and own["spec"]["suspend"] is True
    charted = ranks_job(run(), defaults=Defaults(training_queue="shared"))
    assert charted["metadata"]["labels"][label] == "shared"
    both = ranks_job(run(scheduling={"queueName": "mine"}), defaults=Defaults(training_queue="x"))
    assert both["metadata"]["labels"][label] == "mine"
    assert Defaults.from_env({"QPA_OPERATOR_TRAINING_QUEUE": " shared "}).training_queue == "shared"
    assert Defaults.from_env({}).training_queue is None


# --------------------------------------------------------------------------- failures


def failed(reason: str, message: str) -> JobState:
    return job_state(
        {
            "metadata": {"name": "j"},
            "status": {
                "conditions": [
                    {"type": "FailureTarget", "status": "True", "reason": reason},
                    {"type": "Failed", "status": "True", "reason": reason, "message": message},
                ]
            },
        }
    )


DISRUPTED = failed(
    "PodFailurePolicy",
    "Pod team-a/r-r0-1-x has condition DisruptionTarget matching FailJob rule at index 0",
)
BUG = failed(
    "PodFailurePolicy",
    "Container trainer for pod team-a/r-r0-0-x failed with exit code 2 matching FailJob rule "
    "at index 1",
)
CRASH = failed("BackoffLimitExceeded", "Job has reached the specified backoff limit")


def test_a_disruption_never_counts_a_bug_never_retries_a_crash_counts() -> None:
    tr = run(backoffLimit=1)
    assert [trainingrun.failure_kind(s) for s in (DISRUPTED, BUG, CRASH)] == [
        "disruption", "bug", "failure",
    ]  # fmt: skip
    assert trainingrun.next_attempt(tr, 5, DISRUPTED, disruptions=5) == 6
    assert trainingrun.next_attempt(tr, 0, BUG) is None
    assert trainingrun.next_attempt(tr, 0, CRASH) == 1
    assert trainingrun.next_attempt(tr, 1, CRASH) is None  # the one counted attempt is spent
    assert trainingrun.next_attempt(tr, 3, CRASH, disruptions=3) == 4  # 3 were disruptions
    assert trainingrun.next_attempt(run(backoffLimit=0), 0, DISRUPTED) == 1
    assert trainingrun.next_attempt(run(resume=False), 0, DISRUPTED) is None


def status_of(tr: TrainingRun, job: Any, **kwargs: Any) -> Any:
    plan = trainingrun.data_plan(tr, {})
    return trainingrun.trainingrun_status(
        tr, attempt=kwargs.pop("attempt", 0), job=job, data_job=None, plan=plan, summaries=[],
        observed_generation=1, now=kwargs.pop("now", NOW), **kwargs,
    )  # fmt: skip


def conditions(status: Any) -> dict[str, Any]:
    return {c.type: c for c in status.conditions}


def test_a_disrupted_attempt_resumes_and_a_bug_fails_the_run() -> None:
    tr = run(backoffLimit=0)
    job = ranks_job(tr)
    job["spec"]["suspend"] = False
    failure = {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}
    job["status"] = {"conditions": [{**failure, "message": DISRUPTED.message}]}
    resuming = status_of(tr, job)
    assert resuming.phase == "Resuming"
    assert conditions(resuming)["Progressing"].reason == "AttemptDisrupted"
    job["status"]["conditions"][0]["message"] = BUG.message
    done = status_of(run(backoffLimit=3), job)
    assert done.phase == "Failed" and conditions(done)["Failed"].reason == "BugExitCode"


def test_the_last_failed_attempts_are_kept_and_older_ones_go() -> None:
    jobs = [{"metadata": {"name": f"r-r{i}", "labels": {trainingrun.ATTEMPT_LABEL: str(i)}}}
            for i in range(5)]  # fmt: skip
    names = lambda found: sorted(j["metadata"]["name"] for j in found)  # noqa: E731
    assert names(trainingrun.stale_attempts(run(), 4, jobs)) == ["r-r0", "r-r1", "r-r2"]
    keep_two = run(scheduling={"keepFailedAttempts": 2})
    assert names(trainingrun.stale_attempts(keep_two, 4, jobs)) == ["r-r0", "r-r1"]
    keep_none = run(scheduling={"keepFailedAttempts": 0})
    assert names(trainingrun.stale_attempts(keep_none, 4, jobs)) == ["r-r0", "r-r1", "r-r2", "r-r3"]
    # a Job of a later attempt than the status knows (a lost status write) goes too
    assert names(trainingrun.stale_attempts(run(), 2, jobs)) == ["r-r0", "r-r3", "r-r4"]


# --------------------------------------------------------------------------- Admitted


def test_a_run_that_does_not_fit_waits_then_fails_at_its_timeout() -> None:
    tr = run(scheduling={"admissionTimeoutSeconds": 600})
    job = ranks_job(tr)
    short = admission.Verdict(False, "InsufficientCapacity", "room for 1 of 4 ranks; short: gpu")
    waiting = status_of(tr, job, verdict=short)
    assert waiting.phase == "Pending"
    admitted = conditions(waiting)["Admitted"]
    assert (admitted.status, admitted.reason) == ("False", "InsufficientCapacity")
    assert admitted.message == "room for 1 of 4 ranks; short: gpu"
    assert "suspended until all 4 ranks fit" in conditions(waiting)["Progressing"].message

    # a later refresh without a new check keeps the shortage; past the timeout: Failed
    later = tr.model_copy(update={"status": waiting})
    still = status_of(later, job, now=NOW + timedelta(seconds=599))
    assert still.phase == "Pending" and conditions(still)["Admitted"].message == admitted.message
    over = status_of(later, job, now=NOW + timedelta(seconds=601))
    assert over.phase == "Failed"
    cond = conditions(over)
    assert (cond["Admitted"].status, cond["Admitted"].reason) == ("False", "InsufficientCapacity")
    assert cond["Admitted"].message == "not admitted within 600s: room for 1 of 4 ranks; short: gpu"
    assert cond["Failed"].reason == "AdmissionTimeout"
    assert cond["Progressing"].status == "False"


def test_kueue_queued_then_admitted_and_no_timeout_applies() -> None:
    tr = run(scheduling={"queueName": "gpus", "admissionTimeoutSeconds": 1})
    job = ranks_job(tr)
    queued = status_of(tr, job, queue="gpus", now=NOW + timedelta(days=1))
    assert queued.phase == "Pending"
    assert conditions(queued)["Admitted"].reason == "QueuedInKueue"
    job["spec"]["suspend"] = False
    admitted = status_of(tr.model_copy(update={"status": queued}), job, queue="gpus")
    assert conditions(admitted)["Admitted"].status == "True"
    assert conditions(admitted)["Admitted"].reason == "AdmittedByKueue"


def test_the_operators_admission_sets_admitted_true_with_what_fit() -> None:
    tr = run()
    job = ranks_job(tr)
    job["spec"]["suspend"] = False
    fit = admission.Verdict(True, "Admitted", "all 4 ranks fit")
    status = status_of(tr, job, verdict=fit)
    assert status.phase == "Pending"  # admitted, the pods are not there yet
    assert (conditions(status)["Admitted"].status, conditions(status)["Admitted"].message) == (
        "True", "all 4 ranks fit",
    )  # fmt: skip


# --------------------------------------------------------------------------- gang_admission


def node(name: str, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", **extra: Any) -> Any:
    allocatable = {"cpu": cpu, "memory": memory, "ephemeral-storage": "1Ti", "pods": "110"}
    if gpus:
        allocatable[GPU] = str(gpus)
    spec = {"taints": extra.pop("taints", [])}
    if extra.pop("cordoned", False):
        spec["unschedulable"] = True
    ready = "False" if extra.pop("not_ready", False) else "True"
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **extra}},
        "spec": spec,
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": ready}]},
    }


GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


def bound_pod(node_name: str, gpus: int, phase: str = "Running", owner: str = "") -> Any:
    pod: dict[str, Any] = {
        "metadata": {"name": f"p-{node_name}-{gpus}", "ownerReferences": []},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {GPU: str(gpus)}}}],
        },
        "status": {"phase": phase},
    }
    if owner:
        pod["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": owner}]
    return pod


def test_all_ranks_fit_on_tainted_gpu_nodes_the_ranks_tolerate() -> None:
    tr = run(nodes=2, resources={"requests": {"cpu": "16", "memory": "128Gi"}})
    nodes = [node(f"gpu-{i}", taints=[GPU_TAINT]) for i in range(2)]
    verdict = admission.gang_admission(ranks_job(tr), nodes, [])
    assert verdict.admitted and verdict.reason == "Admitted", verdict
    assert verdict.message == (
        "all 2 ranks (cpu=16, ephemeral-storage=50Gi, memory=128Gi, nvidia.com/gpu=8 each) fit on "
        "2 matching nodes"
    )


def test_a_shortage_names_the_resource_with_needed_and_free() -> None:
    tr = run(nodes=2)
    nodes = [node("gpu-0"), node("gpu-1"), node("cpu-0", gpus=0)]
    busy = [bound_pod("gpu-1", 6)]
    verdict = admission.gang_admission(ranks_job(tr), nodes, busy)
    assert not verdict.admitted and verdict.reason == "InsufficientCapacity"
    assert verdict.message == (
        "room for 1 of 2 ranks (ephemeral-storage=50Gi, nvidia.com/gpu=8 each) on 3 matching "
        "nodes; short: nvidia.com/gpu (16 needed, 10 free)"
    )
    assert verdict.short == (GPU,)
    # a finished pod holds nothing
    done = admission.gang_admission(ranks_job(tr), nodes, [bound_pod("gpu-1", 6, "Succeeded")])
    assert done.admitted


def test_room_spread_over_nodes_is_no_room_for_a_rank() -> None:
    tr = run(nodes=1)
    nodes = [node("gpu-0", gpus=4), node("gpu-1", gpus=4)]
    verdict = admission.gang_admission(ranks_job(tr), nodes, [])
    assert not verdict.admitted
    assert verdict.message.endswith("no node holds a whole rank") and verdict.short == (
        "fragmented",
    )


def test_only_ready_uncordoned_matching_tolerated_nodes_count() -> None:
    tr = run(nodes=1)
    job = ranks_job(tr, defaults=Defaults(gpu_node_selector=(("pool", "a100"),)))
    for unusable in (
        node("n", pool="h100"),  # selector
        node("n", pool="a100", cordoned=True),
        node("n", pool="a100", not_ready=True),
        node("n", pool="a100", taints=[{"key": "team", "value": "b", "effect": "NoSchedule"}]),
        node("n", pool="a100", taints=[{"key": "x", "effect": "NoExecute"}]),
    ):
        verdict = admission.gang_admission(job, [unusable], [])
        assert not verdict.admitted and verdict.message.startswith("no schedulable node"), unusable
    tolerable = node("n", pool="a100", taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    assert admission.gang_admission(job, [tolerable], []).admitted


def test_required_node_affinity_is_honoured() -> None:
    job = ranks_job(run(nodes=1))
    job["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "h200"]},
                                  {"key": "spot", "operator": "DoesNotExist"}]}]}}}  # fmt: skip
    assert admission.gang_admission(job, [node("a", gpu="h200")], []).admitted
    assert not admission.gang_admission(job, [node("a", gpu="a100")], []).admitted
    assert not admission.gang_admission(job, [node("a", gpu="h100", spot="true")], []).admitted


def test_admitted_ranks_not_bound_yet_hold_their_room() -> None:
    """Two runs checked one after the other: the first one's ranks have no pods yet, but the
    second must not count their GPUs as free."""
    first = ranks_job(run(nodes=2), 0)
    first["metadata"]["uid"] = "first"
    first["spec"]["suspend"] = False
    second = ranks_job(run(nodes=2), 0)
    second["metadata"]["uid"] = "second"
    nodes = [node(f"gpu-{i}") for i in range(3)]
    verdict = admission.gang_admission(second, nodes, [], [first, second])
    assert not verdict.admitted and "room for 1 of 2 ranks" in verdict.message
    # once one of the first run's ranks is bound, it is counted on its node instead
    one_bound = [bound_pod("gpu-0", 8, owner="first")]
    again = admission.gang_admission(second, nodes, one_bound, [first, second])
    assert not again.admitted and "room for 1 of 2 ranks" in again.message
    # a finished first run holds nothing
    first["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert admission.gang_admission(second, nodes, [], [first, second]).admitted


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [("cpu", "0.5", "500m"), ("cpu", "16", "16"), ("memory", "34359738368", "32Gi"),
     ("memory", "1536Mi", "1536Mi"), (GPU, "8", "8")],
)  # fmt: skip
def test_quantities_read_as_people_write_them(resource: str, value: str, text: str) -> None:
    from qpa.api.v1alpha1.base import parse_quantity

    assert admission.quantity_text(resource, parse_quantity(value)) == text


def test_pod_request_counts_limits_only_containers_and_init_containers_at_their_peak() -> None:
    spec = {
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {GPU: "2"}}},
            {"name": "b", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
        ],
    }
    request = admission.pod_request(spec)
    assert {k: str(v) for k, v in request.items()} == {
        "cpu": "4", GPU: "2", "memory": str(1024**3), "pods": "1",
    }  # fmt: skip


def test_the_admission_message_is_the_jobs_whichever_refresh_lands_last() -> None:
    tr = run()
    job = ranks_job(tr)
    job["spec"]["suspend"] = False
    why = "all 4 ranks (gpu=8 each) fit on 4 matching nodes"
    job["metadata"].setdefault("annotations", {})[trainingrun.ADMITTED_ANNOTATION] = why
    # a refresh that did not make the check itself (a Job or pod event) still says why
    refreshed = conditions(status_of(tr, job))["Admitted"]
    assert (refreshed.status, refreshed.message) == ("True", why)
    # and a stale generic message from an earlier refresh does not stick
    generic = status_of(tr, {**job, "metadata": {**job["metadata"], "annotations": {}}})
    assert conditions(generic)["Admitted"].message == "all 4 ranks admitted at once"
    later = tr.model_copy(update={"status": generic})
    assert conditions(status_of(later, job))["Admitted"].message == why
