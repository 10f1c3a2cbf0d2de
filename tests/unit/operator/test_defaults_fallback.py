"""A DevicePool or HarnessRelease that leaves an image or its store unset gets the operator's.

The chart hands the operator its images and object store (`Defaults.from_env`); a resource's
own setting wins, an unset one falls back, and when neither gives a value the builders raise
`MissingSetting` naming the field. The CRDs leave those fields optional.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from qpa_operator import release
from qpa_operator.builders import Defaults, devicepool
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders.common import STORE_SECRET_MOUNT, MissingSetting, spec_hash_of

from qpa.api import DevicePool, HarnessRelease, parse_resource
from qpa.api.v1alpha1 import WORK_ORDER_KEY, HarnessReleaseStatus, ObjectStore

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
STORE = ObjectStore.model_validate(
    {"endpoint": "http://minio.qpa-system:9000", "secretRef": {"name": "qpa-store"}}
)
CHART = Defaults(
    harness_image="registry.example/qpa-harness:7",
    bridge_image="registry.example/qpa-device-bridge:7",
    store=STORE,
)


def example(file: str) -> dict[str, Any]:
    body = copy.deepcopy(yaml.safe_load((ROOT / "examples" / file).read_text()))
    body["metadata"].update(namespace="team-a", uid=f"uid-{body['metadata']['name']}")
    return dict(body)


def pool(**spec: Any) -> DevicePool:
    body = example("devicepool.yaml")
    body["spec"].update(spec)
    resource = parse_resource(body)
    assert isinstance(resource, DevicePool)
    return resource


def release_of(*, image: str | None = None, report_uri: str = "s3://qpa/releases/") -> Any:
    body = example("harnessrelease.yaml")
    body["spec"]["harness"].pop("image")
    if image is not None:
        body["spec"]["harness"]["image"] = image
    body["spec"].pop("store", None)
    body["spec"]["reportUri"] = report_uri
    resource = parse_resource(body)
    assert isinstance(resource, HarnessRelease)
    return resource


def containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]
    pod = spec["template"]["spec"] if "template" in spec else spec["predictor"]
    return list(pod["containers"])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# --------------------------------------------------------------------------- DevicePool


def test_a_devicepool_runs_the_operators_bridge_image_only() -> None:
    (bridge,) = containers(devicepool.daemonset(pool(), CHART))
    assert bridge["image"] == "registry.example/qpa-device-bridge:7"
    with pytest.raises(ValueError, match=r"spec\.bridgeImage is no longer accepted"):
        pool(bridgeImage="lab.example/bridge:9")  # a pool never picks the privileged image
    config = devicepool.config_map(pool(), CHART)["data"][WORK_ORDER_KEY]
    assert "bridgeImage" not in yaml.safe_load(config)["spec"]


def test_a_new_default_bridge_image_rolls_the_bridges() -> None:
    before = devicepool.daemonset(pool(), CHART)
    after = devicepool.daemonset(pool(), Defaults(bridge_image="registry.example/bridge:8"))
    assert spec_hash_of(before) != spec_hash_of(after)


def test_no_bridge_image_names_the_operator_setting() -> None:
    with pytest.raises(MissingSetting, match=r"DevicePool team-a/lab-phones: the operator has no"):
        devicepool.children(pool(), Defaults(bridge_image=""))
    with pytest.raises(MissingSetting, match="QPA_OPERATOR_BRIDGE_IMAGE"):
        devicepool.daemonset(pool(), Defaults(bridge_image=""))


# --------------------------------------------------------------------------- HarnessRelease


def test_a_release_without_harness_image_serves_and_benchmarks_the_operators() -> None:
    hr = release_of()
    assert hr.spec.harness.image is None
    (served,) = containers(builder.harness_service(hr, CHART))
    (bench,) = containers(builder.bench_job(hr, CHART))
    assert served["image"] == bench["image"] == "registry.example/qpa-harness:7"
    version = builder.candidate(hr, CHART)
    assert version.harness_image == version.harness.image == "registry.example/qpa-harness:7"
    # the same version as a release that names that image: promotion writes it explicitly
    explicit = release_of(image="registry.example/qpa-harness:7")
    assert builder.candidate(explicit, CHART) == version
    assert builder.bench_job_name(explicit, CHART) == builder.bench_job_name(hr, CHART)
    # the resource's own image wins
    own = release_of(image="team.example/harness:3")
    (served,) = containers(builder.harness_service(own, CHART))
    assert served["image"] == "team.example/harness:3"
    assert builder.candidate(own, CHART).id != version.id


def test_a_new_default_harness_image_is_a_new_candidate_benchmarked_first() -> None:
    hr = release_of()
    newer = Defaults(harness_image="registry.example/qpa-harness:8", store=STORE)
    assert builder.candidate(hr, newer).id != builder.candidate(hr, CHART).id
    assert builder.bench_job_name(hr, newer) != builder.bench_job_name(hr, CHART)
    assert builder.report_prefix(hr, newer) != builder.report_prefix(hr, CHART)
    # the state machine sees a new candidate: a Promoted release deploys and benchmarks it
    status = HarnessReleaseStatus(phase="Promoted", candidate=builder.candidate(hr, CHART))
    status.stable = status.candidate
    settled = hr.model_copy(update={"status": status})
    assert not release.wants_report(settled, None, newer)
    decision = release.next_step(settled, release.Observed(now=NOW), newer)
    assert decision.status.candidate is not None
    assert decision.status.candidate.harness_image == "registry.example/qpa-harness:8"
    assert decision.status.phase == "Deploying"


def test_no_harness_image_anywhere_names_the_field() -> None:
    hr = release_of()
    bare = Defaults(harness_image="", store=STORE)
    for build in (
        lambda: builder.candidate(hr, bare),
        lambda: builder.harness_service(hr, bare),
        lambda: builder.bench_job(hr, bare),
        lambda: release.children(hr, None, bare),
    ):
        with pytest.raises(MissingSetting) as error:
            build()
        assert "HarnessRelease team-a/planner: spec.harness.image is not set" in str(error.value)
        assert "QPA_OPERATOR_HARNESS_IMAGE" in str(error.value)


def test_an_s3_report_uri_without_store_uses_the_operators() -> None:
    hr = release_of()
    assert hr.spec.store is None and hr.spec.report_uri.startswith("s3://")
    job = builder.bench_job(hr, CHART)
    (bench,) = containers(job)
    env = env_of(bench)
    assert env["QPA_S3_ENDPOINT"] == "http://minio.qpa-system:9000"
    assert env["QPA_S3_ACCESS_KEY_FILE"].startswith(STORE_SECRET_MOUNT)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["store-credentials"]["secret"]["secretName"] == "qpa-store"


def test_an_s3_report_uri_without_any_store_names_the_field() -> None:
    hr = release_of()
    with pytest.raises(MissingSetting, match=r"team-a/planner: spec\.store is not set") as error:
        builder.bench_job(hr, Defaults())
    assert "spec.reportUri" in str(error.value) and "objectStore" in str(error.value)
    # a file:// report is refused: nothing on a cluster can read the pod's local disk
    with pytest.raises(ValueError, match=r"spec\.reportUri\n.*must be an s3:// URI"):
        release_of(report_uri="file:///reports/")


# --------------------------------------------------------------------------- the CRDs


def test_the_crds_leave_images_and_the_store_to_the_operator() -> None:
    def spec_schema(plural: str) -> dict[str, Any]:
        crd = yaml.safe_load((ROOT / "crds" / f"qpa.ai_{plural}.yaml").read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        return dict(schema["properties"]["spec"])

    pools = spec_schema("devicepools")
    assert "bridgeImage" not in pools["properties"]  # the admin's setting, never a pool's
    releases = spec_schema("harnessreleases")
    harness = releases["properties"]["harness"]
    assert "image" in harness["properties"] and "image" not in harness["required"]
    assert "store" not in releases["required"]
    rules = [r["rule"] for r in releases.get("x-kubernetes-validations", [])]
    assert not [r for r in rules if "store" in r]
