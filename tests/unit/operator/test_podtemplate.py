"""`spec.podTemplate` merged into the pods the operator builds: every rule of
`builders.podtemplate.merge`, every refusal naming its field, and each kind's pods with a
template, validated against the real Kubernetes schemas (KServe's CRD for InferenceServices)
and the restricted Pod Security Standard.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes import kube_builtin
from fakes.kube_schema import CustomResourceSchema
from helpers.podsecurity import violations
from qpa_operator.builders import (
    Defaults,
    common,
    devicepool,
    harnessrelease,
    podtemplate,
    rolloutpool,
    taskbatch,
    trainingrun,
)
from qpa_operator.builders.podtemplate import PodTemplateRefused, merge

from qpa.api import parse_resource
from qpa.api.v1alpha1.podtemplate import PodTemplate

ROOT = Path(__file__).resolve().parents[3]
D = Defaults(
    image_pull_secrets=("chart-registry",),
    pod_service_accounts=("trainer-identity",),
    ephemeral_storage_request="2Gi",
    scratch_size_limit="30Gi",
)
FIELD = "spec.podTemplate"

#: What a platform team sets on a GPU cluster: every part of the template.
TEMPLATE: dict[str, Any] = {
    "serviceAccountName": "trainer-identity",
    "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ],
    "priorityClassName": "training-high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "team-registry"}],
    "volumes": [
        {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
        {"name": "cache", "emptyDir": {}},
    ],
    "volumeMounts": [
        {"name": "datasets", "mountPath": "/data", "readOnly": True},
        {"name": "cache", "mountPath": "/work/cache"},
    ],
    "env": [
        {"name": "NCCL_IB_HCA", "value": "mlx5"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ],
    "resources": {"limits": {"rdma/hca": "1"}},
    "scratchSizeLimit": "100Gi",
}


def pod(**extra: Any) -> dict[str, Any]:
    """A pod spec as the builders make one (operator volumes, mounts, env, security)."""
    return {
        "automountServiceAccountToken": False,
        "securityContext": common.restricted_pod_security(D),
        "containers": [
            {
                "name": "main",
                "image": "qpa",
                "command": ["qpa", "collect"],
                "env": [
                    {"name": "HOME", "value": "/tmp"},
                    {"name": "QPA_SPOOL_DIR", "value": "/s"},
                ],
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "work", "mountPath": "/work"},
                ],
                "securityContext": common.restricted_container_security(),
                "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "8"}},
            }
        ],
        "volumes": [
            common.empty_dir("tmp"),
            common.empty_dir("work"),
            common.empty_dir("dshm", memory=True),
        ],
        **extra,
    }


def refused(template: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(PodTemplateRefused) as error:
        merge(pod(**kwargs.pop("pod", {})), template, D, **kwargs)
    return str(error.value)


# --------------------------------------------------------------------------- merge rules


def test_every_part_of_the_template_lands_in_the_pod_and_the_operators_parts_stay() -> None:
    before = pod(
        nodeSelector={"qpa.ai/gpu": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
    )
    merged = merge(before, TEMPLATE, D)
    assert before == pod(
        nodeSelector={"qpa.ai/gpu": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
    )
    main = merged["containers"][0]
    assert merged["serviceAccountName"] == "trainer-identity"
    assert merged["automountServiceAccountToken"] is False  # the SA's token is never mounted
    assert merged["priorityClassName"] == "training-high"
    assert merged["runtimeClassName"] == "nvidia"
    assert merged["affinity"] == TEMPLATE["affinity"]
    assert merged["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "qpa.ai/gpu": "true",
    }
    # lists: the operator's first, then the template's
    assert merged["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        *TEMPLATE["tolerations"],
    ]
    assert merged["imagePullSecrets"] == [{"name": "chart-registry"}, {"name": "team-registry"}]
    assert [v["name"] for v in merged["volumes"]] == ["tmp", "work", "dshm", "datasets", "cache"]
    assert [m["mountPath"] for m in main["volumeMounts"]] == [
        "/tmp",
        "/work",
        "/data",
        "/work/cache",
    ]
    assert [e["name"] for e in main["env"]] == ["HOME", "QPA_SPOOL_DIR", "NCCL_IB_HCA", "NODE"]
    # an extended resource gets equal request and limit; the operator's resources stay
    assert main["resources"] == {
        "requests": {"cpu": "1", "ephemeral-storage": "2Gi", "rdma/hca": "1"},
        "limits": {"nvidia.com/gpu": "8", "rdma/hca": "1"},
    }
    # every disk emptyDir gets the template's scratch size; memory ones keep theirs
    sizes = {
        v["name"]: v["emptyDir"].get("sizeLimit") for v in merged["volumes"] if "emptyDir" in v
    }
    assert sizes == {"tmp": "100Gi", "work": "100Gi", "dshm": None, "cache": "100Gi"}
    # never touched: security, command, image
    assert merged["securityContext"] == before["securityContext"]
    assert main["securityContext"] == common.restricted_container_security()
    assert (main["command"], main["image"]) == (["qpa", "collect"], "qpa")


def test_without_a_template_the_chart_defaults_still_apply() -> None:
    merged = merge(pod(), None, D)
    assert merged["imagePullSecrets"] == [{"name": "chart-registry"}]
    assert merged["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "2Gi"
    assert {v["name"]: v["emptyDir"].get("sizeLimit") for v in merged["volumes"]} == {
        "tmp": "30Gi",
        "work": "30Gi",
        "dshm": None,
    }
    bare = merge(pod(), None, Defaults())
    assert "imagePullSecrets" not in bare  # no chart secrets, no empty list
    assert bare["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "1Gi"


def test_the_operators_map_keys_win_and_its_own_sizes_stay() -> None:
    operator_pod = pod(nodeSelector={"pool": "gpu"}, affinity={"podAffinity": {"x": 1}})
    operator_pod["volumes"][1]["emptyDir"]["sizeLimit"] = "50Gi"  # e.g. spec.workSize
    operator_pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] = "50Gi"
    merged = merge(
        operator_pod,
        {
            "nodeSelector": {"pool": "cpu", "zone": "a"},
            "affinity": {"podAffinity": {"y": 2}, "nodeAffinity": {"z": 3}},
        },
        D,
    )
    assert merged["nodeSelector"] == {"pool": "gpu", "zone": "a"}
    assert merged["affinity"] == {"podAffinity": {"x": 1}, "nodeAffinity": {"z": 3}}
    assert merged["volumes"][1]["emptyDir"]["sizeLimit"] == "50Gi"
    assert merged["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "50Gi"


def test_a_template_may_replace_the_default_ephemeral_storage_request() -> None:
    merged = merge(pod(), {"resources": {"requests": {"ephemeral-storage": "200Gi"}}}, D)
    assert merged["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "200Gi"


def test_duplicates_are_not_added_twice() -> None:
    template = {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "imagePullSecrets": [{"name": "chart-registry"}],
    }
    merged = merge(pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), template, D)
    assert merged["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert merged["imagePullSecrets"] == [{"name": "chart-registry"}]


def test_parts_left_out_of_a_pod_are_skipped_not_refused() -> None:
    model = {
        "model": {"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        "serviceAccountName": "storage",
    }
    merged = merge(model, TEMPLATE, D, container="model", parts=harnessrelease.MODEL_PARTS)
    assert merged["serviceAccountName"] == "storage"  # the operator's storage account
    assert "rdma/hca" not in merged["model"]["resources"]["limits"]
    assert merged["model"]["env"] == TEMPLATE["env"]
    assert merged["runtimeClassName"] == "nvidia"


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
            f"{FIELD}.volumes[0].hostPath: hostPath volumes are not allowed",
        ),
        (
            {"volumes": [{"name": "nfs", "nfs": {"server": "x", "path": "/"}}]},
            f"{FIELD}.volumes[0].nfs: nfs volumes are not allowed",
        ),
        (
            {"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]},
            f"{FIELD}.volumes[0]: set exactly one of",
        ),
        (
            {"volumes": [{"name": "work", "emptyDir": {}}]},
            f"{FIELD}.volumes[0].name: 'work' is a volume of the operator in this pod",
        ),
        (
            {"volumeMounts": [{"name": "tmp", "mountPath": "/scratch"}]},
            f"{FIELD}.volumeMounts[0].name: 'tmp' is not one of {FIELD}.volumes",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/work"}],
            },
            f"{FIELD}.volumeMounts[0].mountPath: /work is, or is above, /work",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/"}],
            },
            f"{FIELD}.volumeMounts[0].mountPath: an absolute path",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/var"}],
            },
            f"{FIELD}.volumeMounts[0].mountPath: /var is, or is above, /var/spool/qpa",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/etc/qpa/order/x"}],
            },
            f"{FIELD}.volumeMounts[0].mountPath: /etc/qpa/order/x is inside /etc/qpa",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/data/../work"}],
            },
            f"{FIELD}.volumeMounts[0]: no . or .. path segments",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [
                    {"name": "d", "mountPath": "/d", "mountPropagation": "Bidirectional"}
                ],
            },
            f"{FIELD}.volumeMounts[0].mountPropagation: not allowed",
        ),
        (
            {"env": [{"name": "HOME", "value": "/root"}]},
            f"{FIELD}.env[0].name: 'HOME' is set by the operator in this pod",
        ),
        (
            {"env": [{"name": "QPA_S3_ENDPOINT", "value": "http://evil"}]},
            f"{FIELD}.env[0].name: 'QPA_S3_ENDPOINT': QPA_* variables are the operator's",
        ),
        (
            {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
            f"{FIELD}.resources.limits.nvidia.com/gpu: the operator already sets nvidia.com/gpu",
        ),
        (
            {"resources": {"requests": {"cpu": "4"}}},
            f"{FIELD}.resources.requests.cpu: the operator already sets cpu",
        ),
        (
            {"resources": {"requests": {"rdma/hca": "1"}, "limits": {"rdma/hca": "2"}}},
            f"{FIELD}.resources: rdma/hca is an extended resource",
        ),
        (
            {"resources": {"requests": {"memory": "8Gi"}, "limits": {"memory": "1Gi"}}},
            f"{FIELD}.resources: the memory limit (1Gi) is below its request (8Gi)",
        ),
        (
            {"resources": {"limits": {"memory": "-1"}}},
            f"{FIELD}.resources.limits.memory: '-1' is not a positive quantity",
        ),
        (
            {"serviceAccountName": "cluster-admin-ish"},
            f"{FIELD}.serviceAccountName: ServiceAccount 'cluster-admin-ish' is not allowed by the "
            "operator (the chart's podOverrides.serviceAccounts: trainer-identity)",
        ),
        (
            {"hostNetwork": True},
            f"{FIELD}.hostNetwork: not allowed (pods never share the node's network)",
        ),
        ({"hostPID": True}, f"{FIELD}.hostPID: not allowed"),
        ({"securityContext": {"privileged": True}}, f"{FIELD}.securityContext: not allowed"),
        ({"containers": [{"name": "x", "image": "evil"}]}, f"{FIELD}.containers: not allowed"),
        (
            {"automountServiceAccountToken": True},
            f"{FIELD}.automountServiceAccountToken: not allowed",
        ),
        ({"nodeName": "control-plane"}, f"{FIELD}.nodeName: not a pod override"),
    ],
)
def test_each_refusal_names_the_field(template: dict[str, Any], message: str) -> None:
    assert message in refused(template)


def test_a_pod_running_as_the_operators_account_keeps_it() -> None:
    message = refused(
        {"serviceAccountName": "trainer-identity"}, pod={"serviceAccountName": "pool-env"}
    )
    assert message.startswith(
        f"{FIELD}.serviceAccountName: these pods run as the operator's ServiceAccount 'pool-env'"
    )


def test_without_an_allow_list_no_service_account_is_allowed() -> None:
    with pytest.raises(PodTemplateRefused, match=r"podOverrides\.serviceAccounts: none"):
        merge(pod(), {"serviceAccountName": "default"}, Defaults())


@pytest.mark.parametrize(
    "toleration", [{"operator": "Exists"}, {"operator": "Exists", "effect": "NoExecute"}]
)
def test_a_toleration_of_every_taint_needs_the_admins_consent(toleration: dict[str, Any]) -> None:
    """No key: every taint (of that effect) is tolerated, the control plane's too."""
    template = PodTemplate.model_validate({"tolerations": [toleration]})  # valid Kubernetes
    with pytest.raises(PodTemplateRefused) as refused_by_default:
        merge(pod(), template, Defaults())
    assert str(refused_by_default.value).startswith(f"{FIELD}.tolerations[0].key: ")
    assert "podOverrides.wildcardTolerations" in str(refused_by_default.value)
    allowed = Defaults.from_env({"QPA_OPERATOR_POD_WILDCARD_TOLERATIONS": "true"})
    assert toleration in merge(pod(), template, allowed)["tolerations"]
    with pytest.raises(ValueError, match="QPA_OPERATOR_POD_WILDCARD_TOLERATIONS"):
        Defaults.from_env({"QPA_OPERATOR_POD_WILDCARD_TOLERATIONS": "yes"})
    with pytest.raises(ValueError, match="without a key needs operator Exists"):
        PodTemplate.model_validate({"tolerations": [{"operator": "Equal", "value": "x"}]})


# --------------------------------------------------------------------------- every kind


def example(file: str, index: int = 0, **spec: Any) -> Any:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / file).read_text()) if d]
    body = copy.deepcopy(docs[index])
    body["metadata"].update(namespace="team-a", uid="uid-1")
    body["spec"].update(spec)
    return parse_resource(body)


KSERVE = CustomResourceSchema(
    yaml.safe_load(
        (
            ROOT
            / "tests"
            / "fakes"
            / "vendor"
            / "kserve"
            / "serving.kserve.io_inferenceservices.yaml"
        ).read_text()
    )["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
)


def valid(obj: dict[str, Any]) -> None:
    """As the API server checks it: Kubernetes' strict schemas, or KServe's CRD."""
    if obj["kind"] == "InferenceService":
        body = copy.deepcopy(obj)
        unknown = KSERVE.prune(body)
        assert not unknown, unknown
        assert not KSERVE.validate(body), KSERVE.validate(body)
        return
    checked = kube_builtin.check(obj)
    assert not checked.errors and not checked.unknown, (checked.errors, checked.unknown)


def pods_of(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod-level spec, main container) of a Job, Deployment or InferenceService."""
    spec = obj["spec"]
    if "template" in spec:
        pod_spec = spec["template"]["spec"]
        return pod_spec, pod_spec["containers"][0]
    predictor = spec["predictor"]
    return predictor, (predictor.get("containers") or [predictor.get("model")])[0]


def assert_template_applied(
    obj: dict[str, Any], *, resources: bool = True, account: bool = True
) -> None:
    valid(obj)
    pod_spec, main = pods_of(obj)
    if "containers" in pod_spec:
        assert not violations(pod_spec), violations(pod_spec)
    if account:
        assert pod_spec["serviceAccountName"] == "trainer-identity"
    assert pod_spec["priorityClassName"] == "training-high"
    assert pod_spec["runtimeClassName"] == "nvidia"
    assert pod_spec["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert {"name": "team-registry"} in pod_spec["imagePullSecrets"]
    assert {"name": "chart-registry"} in pod_spec["imagePullSecrets"]
    assert TEMPLATE["tolerations"][0] in pod_spec["tolerations"]
    assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in main["env"]
    assert {"name": "datasets", "mountPath": "/data", "readOnly": True} in main["volumeMounts"]
    assert "datasets" in [v["name"] for v in pod_spec["volumes"]]
    assert main["resources"]["requests"]["ephemeral-storage"]
    if resources:
        assert main["resources"]["limits"]["rdma/hca"] == "1"
    for volume in pod_spec["volumes"]:
        if "emptyDir" in volume and volume["emptyDir"].get("medium") != "Memory":
            assert volume["emptyDir"]["sizeLimit"]


def test_a_taskbatch_worker_pod_carries_the_template() -> None:
    tb = example("taskbatch.yaml", podTemplate=TEMPLATE)
    assert_template_applied(taskbatch.job(tb, D))


def test_a_rolloutpool_server_pod_carries_the_template() -> None:
    pool = example("rolloutpool.yaml", podTemplate=TEMPLATE)
    assert_template_applied(rolloutpool.deployment(pool, D))


def test_a_trainingrun_rank_and_data_pod_carry_the_template() -> None:
    tr = example("trainingrun.yaml", podTemplate=TEMPLATE)
    assert_template_applied(trainingrun.job(tr, 0, D))
    plan = trainingrun.data_plan(tr, {"nightly-tool-use": "s3://qpa/default/taskbatches/n/"})
    data = trainingrun.data_job(tr, plan, D)
    assert data is not None
    assert_template_applied(data)
    requests = data["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert (requests["cpu"], requests["memory"]) == ("1", "2Gi")  # never BestEffort


def test_a_harnessrelease_applies_the_template_to_its_predictors_and_benchmark() -> None:
    hr = example("harnessrelease.yaml", podTemplate=TEMPLATE)
    assert_template_applied(harnessrelease.harness_service(hr, D))
    assert_template_applied(harnessrelease.bench_job(hr, D))
    model = harnessrelease.model_service(hr, D)
    assert_template_applied(model, resources=False, account=False)
    assert "rdma/hca" not in model["spec"]["predictor"]["model"]["resources"].get("limits", {})


def test_a_device_pool_env_server_keeps_its_phone_lease_account() -> None:
    pool = example("rolloutpool.yaml", 1, podTemplate={"serviceAccountName": "trainer-identity"})
    assert pool.spec.device_pool_ref is not None
    with pytest.raises(PodTemplateRefused, match="operator's ServiceAccount 'phones-env'"):
        rolloutpool.deployment(pool, D)


@pytest.mark.parametrize("file", ["taskbatch.yaml", "rolloutpool.yaml"])
def test_sandboxes_and_env_servers_refuse_a_host_path_even_past_the_api(file: str) -> None:
    """qpa.api refuses it already; the merge refuses it too, for a template that did not pass
    through qpa.api (an older CRD, a hand-made object)."""
    resource = example(file)
    built = (
        taskbatch.job(resource, D)
        if file == "taskbatch.yaml"
        else rolloutpool.deployment(resource, D)
    )
    pod_spec, _ = pods_of(built)
    with pytest.raises(
        PodTemplateRefused, match=r"volumes\[0\]\.hostPath: hostPath volumes are not allowed"
    ):
        podtemplate.merge(pod_spec, {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, D)


def test_every_kind_gets_the_chart_pull_secrets_and_disk_requests_without_a_template() -> None:
    built = [
        taskbatch.job(example("taskbatch.yaml"), D),
        rolloutpool.deployment(example("rolloutpool.yaml"), D),
        trainingrun.job(example("trainingrun.yaml"), 0, D),
        harnessrelease.harness_service(example("harnessrelease.yaml"), D),
        harnessrelease.model_service(example("harnessrelease.yaml"), D),
        harnessrelease.bench_job(example("harnessrelease.yaml"), D),
        devicepool.daemonset(example("devicepool.yaml"), D),  # no template: the admin's pods
    ]
    for obj in built:
        valid(obj)
        pod_spec, main = pods_of(obj)
        assert pod_spec["imagePullSecrets"] == [{"name": "chart-registry"}], obj["metadata"]["name"]
        assert main["resources"]["requests"]["ephemeral-storage"], obj["metadata"]["name"]
        for volume in pod_spec.get("volumes") or []:
            if "emptyDir" in volume and volume["emptyDir"].get("medium") != "Memory":
                assert volume["emptyDir"]["sizeLimit"], (obj["metadata"]["name"], volume)


def test_defaults_come_from_the_charts_variables() -> None:
    defaults = Defaults.from_env(
        {
            "QPA_OPERATOR_IMAGE_PULL_SECRETS": "regcred, team-registry,,regcred",
            "QPA_OPERATOR_POD_SERVICE_ACCOUNTS": "trainer-identity",
            "QPA_OPERATOR_EPHEMERAL_STORAGE_REQUEST": "4Gi",
            "QPA_OPERATOR_SCRATCH_SIZE_LIMIT": "80Gi",
        }
    )
    assert defaults.image_pull_secrets == ("regcred", "team-registry")
    assert defaults.pod_service_accounts == ("trainer-identity",)
    assert (defaults.ephemeral_storage_request, defaults.scratch_size_limit) == ("4Gi", "80Gi")
    base = Defaults.from_env({})
    assert (base.image_pull_secrets, base.pod_service_accounts) == ((), ())
    assert (base.ephemeral_storage_request, base.scratch_size_limit) == ("1Gi", "20Gi")
    with pytest.raises(ValueError, match="QPA_OPERATOR_SCRATCH_SIZE_LIMIT"):
        Defaults.from_env({"QPA_OPERATOR_SCRATCH_SIZE_LIMIT": "lots"})
    with pytest.raises(ValueError, match="QPA_OPERATOR_EPHEMERAL_STORAGE_REQUEST"):
        Defaults.from_env({"QPA_OPERATOR_EPHEMERAL_STORAGE_REQUEST": "0"})
