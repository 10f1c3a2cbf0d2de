"""The chart's `imagePullSecrets` and `podOverrides` reach every pod the operator creates:
rendered with helm, read back by `Defaults.from_env`, and seen in each kind's pods."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from helpers.chart import env_of, operator_container
from qpa_operator.builders import Defaults, harnessrelease, rolloutpool, taskbatch, trainingrun

from qpa.api import parse_resource

ROOT = Path(__file__).resolve().parents[3]
VALUES = {
    "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}],
    "podOverrides.serviceAccounts": ["trainer-identity"],
    "podOverrides.ephemeralStorageRequest": "3Gi",
    "podOverrides.scratchSizeLimit": "40Gi",
}


def example(file: str) -> Any:
    body = copy.deepcopy(
        next(d for d in yaml.safe_load_all((ROOT / "examples" / file).read_text()) if d)
    )
    body["metadata"].update(namespace="team-a", uid="uid-1")
    return parse_resource(body)


def test_the_charts_pull_secrets_and_pod_defaults_reach_every_pod(render: Any) -> None:
    defaults = Defaults.from_env(env_of(operator_container(render(VALUES))))
    assert defaults.image_pull_secrets == ("regcred", "mirror")
    assert defaults.pod_service_accounts == ("trainer-identity",)
    assert (defaults.ephemeral_storage_request, defaults.scratch_size_limit) == ("3Gi", "40Gi")
    release = example("harnessrelease.yaml")
    pods = [
        taskbatch.job(example("taskbatch.yaml"), defaults)["spec"]["template"]["spec"],
        rolloutpool.deployment(example("rolloutpool.yaml"), defaults)["spec"]["template"]["spec"],
        trainingrun.job(example("trainingrun.yaml"), 0, defaults)["spec"]["template"]["spec"],
        harnessrelease.bench_job(release, defaults)["spec"]["template"]["spec"],
        harnessrelease.harness_service(release, defaults)["spec"]["predictor"],
        harnessrelease.model_service(release, defaults)["spec"]["predictor"],
    ]
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    collector = pods[0]["containers"][0]
    assert collector["resources"]["requests"]["ephemeral-storage"] == "3Gi"
    assert {
        v["name"]: v["emptyDir"]["sizeLimit"] for v in pods[0]["volumes"] if "emptyDir" in v
    } == {
        "spool": "40Gi",
        "tmp": "40Gi",
    }


def test_by_default_no_pull_secret_and_no_service_account_is_allowed(render: Any) -> None:
    defaults = Defaults.from_env(env_of(operator_container(render())))
    assert (defaults.image_pull_secrets, defaults.pod_service_accounts) == ((), ())
    assert (defaults.ephemeral_storage_request, defaults.scratch_size_limit) == ("1Gi", "20Gi")
    pod = taskbatch.job(example("taskbatch.yaml"), defaults)["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in pod
