"""`spec.podTemplate` at admission: what the API server (the generated CRD: schema, pruning and
CEL, as tests/fakes/kube_schema.py runs them) and `qpa.api` refuse, with the same message."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_schema import CustomResourceSchema
from pydantic import ValidationError

from qpa.api import TaskBatch, parse_resource
from qpa.api.v1alpha1.podtemplate import PodTemplate

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "qpa.ai_taskbatches.yaml").read_text())
SERVER = CustomResourceSchema(CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
BASE = next(d for d in yaml.safe_load_all((ROOT / "examples" / "taskbatch.yaml").read_text()) if d)


def with_template(template: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    body["metadata"].update(namespace="team-a")
    body["spec"]["podTemplate"] = template
    return body


def server_errors(body: dict[str, Any]) -> str:
    body = copy.deepcopy(body)
    SERVER.prune(body)
    SERVER.default(body)
    return "\n".join(str(error) for error in SERVER.validate(body))


GOOD = {
    "serviceAccountName": "trainer-identity",
    "nodeSelector": {"pool": "gpu"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
            }
        }
    },
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
    "priorityClassName": "high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "regcred"}],
    "volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
        {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "a", "path": "a.yaml"}]}},
        {"name": "keys", "secret": {"secretName": "keys"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
        {"name": "csi", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}},
        {
            "name": "eph",
            "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}},
        },
    ],
    "volumeMounts": [
        {"name": "data", "mountPath": "/data"},
        {"name": "scratch", "mountPath": "/work/x"},
    ],
    "env": [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "token"}}},
    ],
    "resources": {"limits": {"rdma/hca": 1}},
    "scratchSizeLimit": "50Gi",
}


def test_a_full_template_is_accepted_by_both_and_kept_as_written() -> None:
    body = with_template(GOOD)
    assert server_errors(body) == ""
    parsed = parse_resource(body)
    assert isinstance(parsed, TaskBatch) and parsed.spec.pod_template is not None
    assert parsed.spec.pod_template.to_k8s()["volumes"][0] == GOOD["volumes"][0] | {
        "persistentVolumeClaim": {"claimName": "datasets", "readOnly": False}
    }


@pytest.mark.parametrize(
    ("template", "message"),
    [
        # the server prunes the unknown hostPath, then the volume has no source at all
        (
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "a volume sets exactly one of",
        ),
        (
            {"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]},
            "exactly one of",
        ),
        ({"volumes": [{"name": "work", "emptyDir": {}}]}, "is a volume name of the operator"),
        ({"env": [{"name": "QPA_S3_ENDPOINT", "value": "x"}]}, "or one the operator sets"),
        ({"env": [{"name": "HOME", "value": "/root"}]}, "or one the operator sets"),
        ({"env": [{"name": "ld_preload", "value": "/x.so"}]}, "a variable that changes how"),
        (
            {
                "env": [
                    {
                        "name": "A",
                        "value": "1",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    }
                ]
            },
            "set value or valueFrom, not both",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/work"}],
            },
            "mountPath is, or is above, /work",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/etc"}],
            },
            "mountPath is, or is above, /etc/qpa",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/var/run/secrets/eks.amazonaws.com"}],
            },
            "mountPath is inside /var/run/secrets",
        ),
        (
            {
                "volumes": [{"name": "d", "emptyDir": {}}],
                "volumeMounts": [{"name": "d", "mountPath": "/a/../work"}],
            },
            "mountPath: no . or .. segment",
        ),
        (
            {"volumeMounts": [{"name": "nothing", "mountPath": "/data"}]},
            "every volumeMounts[].name must be one of podTemplate.volumes",
        ),
        (
            {
                "volumes": [
                    {
                        "name": "d",
                        "ephemeral": {
                            "volumeClaimTemplate": {
                                "spec": {
                                    "dataSource": {"kind": "PersistentVolumeClaim", "name": "other"}
                                }
                            }
                        },
                    }
                ]
            },
            "dataSource",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]},
            "operator Exists takes no value",
        ),
        (
            {"resources": {"limits": {"nvidia.com/gpu": "0.5"}}},
            "nvidia.com/gpu must be a whole number",
        ),
    ],
)
def test_the_server_and_qpa_api_refuse_alike(template: dict[str, Any], message: str) -> None:
    body = with_template(template)
    assert message in server_errors(body)
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_resource(body)


def test_qpa_api_names_a_forbidden_volume_type() -> None:
    with pytest.raises(ValidationError, match="hostPath: hostPath volumes are not allowed"):
        PodTemplate.model_validate({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})


@pytest.mark.parametrize("field", ["hostNetwork", "securityContext", "containers", "privileged"])
def test_fields_that_are_not_overrides_do_not_exist(field: str) -> None:
    """The server drops them (pruning); `qpa.api` refuses them as unknown."""
    body = with_template({field: True})
    pruned = copy.deepcopy(body)
    SERVER.prune(pruned)
    assert field not in pruned["spec"]["podTemplate"]
    with pytest.raises(ValidationError, match=field):
        parse_resource(body)
