"""The operator's kopf settings, API paths and credentials, without an API server."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
from qpa_operator.kube import ApiError, _credentials, object_path, plural_of, resource_path
from qpa_operator.main import settings_from_env


def test_peering_is_on_and_named_unless_standalone() -> None:
    settings = kopf.OperatorSettings()
    scale = settings_from_env(settings, {})
    assert scale == 1.0
    assert settings.peering.name == "qpa-operator" and settings.peering.mandatory
    assert not settings.peering.standalone
    named = kopf.OperatorSettings()
    settings_from_env(named, {"QPA_OPERATOR_PEERING": "team-a"})
    assert named.peering.name == "team-a"
    alone = kopf.OperatorSettings()
    settings_from_env(alone, {"QPA_OPERATOR_STANDALONE": "true"})
    assert alone.peering.standalone and not alone.peering.mandatory
    cli = kopf.OperatorSettings()
    cli.peering.standalone = True  # `kopf run --standalone` sets it before start-up
    settings_from_env(cli, {})
    assert cli.peering.standalone


def test_state_lives_in_qpa_annotations_and_watches_are_selected() -> None:
    settings = kopf.OperatorSettings()
    settings_from_env(settings, {"QPA_OPERATOR_RETRY_SCALE": "0.1"})
    progress = settings.persistence.progress_storage
    diffbase = settings.persistence.diffbase_storage
    assert isinstance(progress, kopf.AnnotationsProgressStorage) and progress.prefix == "qpa.ai"
    assert isinstance(diffbase, kopf.AnnotationsDiffBaseStorage) and diffbase.prefix == "qpa.ai"
    jobs = settings.watching.label_selectors["batch", "v1", "jobs"]
    assert jobs == "app.kubernetes.io/managed-by=qpa-operator"
    assert settings.watching.label_selectors["coordination.k8s.io", "v1", "leases"] == (
        "app.kubernetes.io/part-of=qpa"
    )
    backoffs = settings.networking.error_backoffs
    assert isinstance(backoffs, list) and backoffs[:2] == [0.1, 0.1]


def test_paths_of_every_managed_kind() -> None:
    assert resource_path("v1", "configmaps", "ns", "x") == "/api/v1/namespaces/ns/configmaps/x"
    assert (
        resource_path("qpa.ai/v1alpha1", "taskbatches", "ns", "tb", "status")
        == "/apis/qpa.ai/v1alpha1/namespaces/ns/taskbatches/tb/status"
    )
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "n"}}
    assert object_path(job, collection=True) == "/apis/batch/v1/namespaces/n/jobs"
    assert plural_of("serving.kserve.io/v1beta1", "InferenceService") == "inferenceservices"
    with pytest.raises(ValueError, match="does not manage"):
        plural_of("v1", "PersistentVolume")  # cluster-scoped: never the operator's


def test_api_errors_tell_conflicts_from_existing_objects() -> None:
    assert ApiError(409, "AlreadyExists", "x").already_exists
    assert ApiError(409, "Conflict", "x").conflict
    assert not ApiError(409, "AlreadyExists", "x").conflict
    assert ApiError(404, "NotFound", "x").not_found


def test_credentials_follow_kopfs_connection(tmp_path: Path) -> None:
    info = kopf.ConnectionInfo(server="https://10.0.0.1:443", token="abc", insecure=True)
    headers, context = _credentials(info, tmp_path)
    assert headers == {"Authorization": "Bearer abc"} and context is False
    basic = kopf.ConnectionInfo(server="http://127.0.0.1:8080", username="u", password="p")
    headers, context = _credentials(basic, tmp_path)
    assert headers == {"Authorization": "Basic dTpw"} and context is None


def test_replicas_get_distinct_priorities_so_peering_never_ties() -> None:
    from qpa_operator.main import peering_priority

    assert peering_priority({}) == 0
    assert peering_priority({"QPA_OPERATOR_PRIORITY": "100"}) == 100
    one = peering_priority({"QPA_OPERATOR_PRIORITY": "auto", "POD_NAME": "qpa-operator-abc-1"})
    two = peering_priority({"QPA_OPERATOR_PRIORITY": "auto", "POD_NAME": "qpa-operator-abc-2"})
    assert 1 <= one <= 2**30 and 1 <= two <= 2**30 and one != two
    settings = kopf.OperatorSettings()
    settings_from_env(settings, {"QPA_OPERATOR_PRIORITY": "auto", "POD_NAME": "qpa-operator-x"})
    assert settings.peering.priority == peering_priority(
        {"QPA_OPERATOR_PRIORITY": "auto", "POD_NAME": "qpa-operator-x"}
    )
    with pytest.raises(ValueError, match="QPA_OPERATOR_PRIORITY"):
        peering_priority({"QPA_OPERATOR_PRIORITY": "high"})
    with pytest.raises(ValueError, match="POD_NAME"):
        peering_priority({"QPA_OPERATOR_PRIORITY": "auto"})


def test_defaults_from_the_charts_variables() -> None:
    from qpa_operator.builders import Defaults

    defaults = Defaults.from_env(
        {
            "QPA_OPERATOR_IMAGE": "reg/sandbox:1",
            "QPA_OPERATOR_HARNESS_IMAGE": "reg/harness:1",
            "QPA_OPERATOR_BRIDGE_IMAGE": "reg/bridge:1",
            "QPA_OPERATOR_STORE_ENDPOINT": "http://store.qpa-system.svc:8333",
            "QPA_OPERATOR_STORE_SECRET": "qpa-store",
            "QPA_OPERATOR_GPU_NODE_SELECTOR": '{"nvidia.com/gpu.present": "true"}',
            "QPA_OPERATOR_GPU_TOLERATIONS": '[{"key": "gpu", "operator": "Exists"}]',
        }
    )
    assert (defaults.image, defaults.harness_image, defaults.bridge_image) == (
        "reg/sandbox:1",
        "reg/harness:1",
        "reg/bridge:1",
    )
    assert defaults.store is not None and defaults.store.secret_ref.name == "qpa-store"
    assert defaults.gpu_node_selector == (("nvidia.com/gpu.present", "true"),)
    assert defaults.gpu_tolerations == ({"key": "gpu", "operator": "Exists"},)
    assert Defaults.from_env({}) == Defaults()
    with pytest.raises(ValueError, match="QPA_OPERATOR_GPU_TOLERATIONS"):
        Defaults.from_env({"QPA_OPERATOR_GPU_TOLERATIONS": "{not json"})
    with pytest.raises(ValueError, match="QPA_OPERATOR_GPU_NODE_SELECTOR"):
        Defaults.from_env({"QPA_OPERATOR_GPU_NODE_SELECTOR": "[1]"})
    with pytest.raises(ValueError, match="go together"):
        Defaults.from_env({"QPA_OPERATOR_STORE_ENDPOINT": "http://s3:9000"})
    with pytest.raises(ValueError, match="QPA_OPERATOR_STORE"):
        Defaults.from_env(
            {"QPA_OPERATOR_STORE_ENDPOINT": "ftp://x", "QPA_OPERATOR_STORE_SECRET": "s"}
        )
