"""A trainer or data pod that refuses its input (e.g. a dataset the review gate refuses) leaves
`error: ...` as its termination message; the TrainingRun's status message carries it."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from qpa_operator.builders import trainingrun

from qpa.api import TrainingRun, parse_resource

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
WHY = (
    "dataset s3://qpa/team-a/mixes/m1: review state pending: 3 of 20 items await review; "
    "refusing to read it (review it with qpa data review list|accept|reject s3://qpa/team-a/"
    "mixes/m1, then publish it)"
)
FAILED = {
    "conditions": [
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        }
    ]
}


def load(index: int) -> TrainingRun:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "trainingrun.yaml").read_text()) if d]
    body = copy.deepcopy(docs[index])
    body["metadata"].update(namespace="team-a", uid=f"uid-{body['metadata']['name']}")
    run = parse_resource(body)
    assert isinstance(run, TrainingRun)
    return run


def pod(component: str, container: str, exit_code: int, message: str, attempt: int = 1) -> Any:
    labels = {"app.kubernetes.io/component": component, trainingrun.ATTEMPT_LABEL: str(attempt)}
    terminated = {"exitCode": exit_code, "message": message}
    return {
        "metadata": {"labels": labels},
        "status": {"containerStatuses": [{"name": container, "state": {"terminated": terminated}}]},
    }


def job(status: dict[str, Any], name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": status}


def test_pod_refusal_reads_the_error_line_of_a_failed_pod_only() -> None:
    trainer = pod(trainingrun.COMPONENT, trainingrun.CONTAINER, 1, f"error: {WHY}\n")
    assert trainingrun.pod_refusal(trainer) == ("trainer", 1, WHY)
    logs = f"Loading...\nerror: {WHY}\ntorch.distributed.elastic ChildFailedError\n"
    tail = pod(trainingrun.DATA_COMPONENT, trainingrun.DATA_CONTAINER, 2, logs, attempt=0)
    assert trainingrun.pod_refusal(tail) == ("data", 0, WHY)  # FallbackToLogsOnError's tail
    assert trainingrun.pod_refusal(pod("trainer", "trainer", 0, f"error: {WHY}")) is None
    assert trainingrun.pod_refusal(pod("trainer", "trainer", 1, "Traceback ...")) is None
    assert trainingrun.pod_refusal(pod("collector", "collect", 1, f"error: {WHY}")) is None


def test_a_refused_dataset_reaches_the_failed_and_resuming_status() -> None:
    tr = load(1)
    plan = trainingrun.data_plan(tr, {})
    last = tr.spec.backoff_limit
    name = trainingrun.job_name(tr, last)
    status = trainingrun.trainingrun_status(
        tr, attempt=last, job=job(FAILED, name), data_job=None, plan=plan, summaries=[],
        observed_generation=1, now=NOW, refusals=[("trainer", last, WHY), ("trainer", 0, "old")],
    )  # fmt: skip
    assert status.phase == "Failed"
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.message == (
        f"Job has reached the specified backoff limit; the pod refused its input: {WHY}"
    )
    retried = trainingrun.trainingrun_status(
        tr, attempt=0, job=job(FAILED, trainingrun.job_name(tr, 0)), data_job=None, plan=plan,
        summaries=[], observed_generation=1, now=NOW, refusals=[("trainer", 0, WHY)],
    )  # fmt: skip
    progressing = next(c for c in retried.conditions if c.type == "Progressing")
    assert retried.phase == "Resuming" and progressing.reason == "AttemptFailed"
    assert progressing.message.endswith(f"the pod refused its input: {WHY}")
    quiet = trainingrun.trainingrun_status(
        tr, attempt=last, job=job(FAILED, name), data_job=None, plan=plan, summaries=[],
        observed_generation=1, now=NOW, refusals=[("trainer", 0, WHY)],  # another attempt's
    )  # fmt: skip
    assert "refused" not in next(c for c in quiet.conditions if c.type == "Failed").message


def test_a_refused_mix_input_reaches_data_preparation_failed() -> None:
    tr = load(0)
    plan = trainingrun.data_plan(tr, {"nightly-tool-use": "s3://qpa/team-a/taskbatches/t/"})
    assert plan.steps
    status = trainingrun.trainingrun_status(
        tr, attempt=0, job=None, data_job=job(FAILED, trainingrun.data_job_name(tr)), plan=plan,
        summaries=[], observed_generation=1, now=NOW, refusals=[("data", 0, WHY)],
    )  # fmt: skip
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert status.phase == "Failed" and failed.reason == "DataPreparationFailed"
    assert "s3://qpa/team-a/mixes/m1: review state pending" in failed.message
