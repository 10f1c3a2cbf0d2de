"""RolloutPool's scale subresource: `kubectl scale` and an HPA size a pool like a Deployment.

The CRD maps an `autoscaling/v1` Scale onto `.spec.replicas.min` (the warm pods),
`.status.replicas` and `.status.labelSelector`; the test API server serves `/scale` through
those paths (as kube-apiserver does) and validates the result like any update, so a size
above `replicas.max` is refused with the rule's message. Through the operator, the new size
reaches the pool's HorizontalPodAutoscaler floor, or its Deployment once min equals max.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl

pytestmark = pytest.mark.timeout(120)

NS = "default"


def pool(name: str, low: int, high: int) -> dict[str, Any]:
    doc = next(d for d in yaml.safe_load_all(Path("examples/rolloutpool.yaml").read_text()) if d)
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["replicas"] = {"min": low, "max": high}
    return dict(doc)


def apply(kubectl: Kubectl, tmp_path: Path, body: dict[str, Any]) -> None:
    path = tmp_path / f"{body['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(body))
    kubectl("apply", "-f", str(path))


def test_kubectl_scale_writes_the_warm_size_and_reads_the_scale(
    kube_api: KubeAPIServer, kubectl: Kubectl, tmp_path: Path
) -> None:
    apply(kubectl, tmp_path, pool("sandbox", 1, 4))
    selector = "qpa.ai/rolloutpool=sandbox"
    kube_api.patch_status("rolloutpools", NS, "sandbox", {"replicas": 1, "labelSelector": selector})
    scaled = kubectl("scale", "rolloutpool/sandbox", "--replicas=3")
    assert "rolloutpool.qpa.ai/sandbox scaled" in scaled.stdout
    stored = kube_api.get("qrp", NS, "sandbox")
    assert stored is not None
    assert stored["spec"]["replicas"] == {"min": 3, "max": 4, "targetPercent": 70}  # defaulted
    assert stored["metadata"]["generation"] == 2
    assert stored["status"]["replicas"] == 1  # status is the controller's, untouched

    scale = json.loads(kubectl("get", "qrp", "sandbox", "--subresource=scale", "-o", "json").stdout)
    assert (scale["apiVersion"], scale["kind"]) == ("autoscaling/v1", "Scale")
    assert scale["spec"] == {"replicas": 3}
    assert scale["status"] == {"replicas": 1, "selector": selector}

    # preconditions make kubectl GET the scale and PUT it back
    kubectl("scale", "qrp/sandbox", "--current-replicas=3", "--replicas=2")
    assert kube_api.get("qrp", NS, "sandbox")["spec"]["replicas"]["min"] == 2
    stale = kubectl("scale", "qrp/sandbox", "--current-replicas=3", "--replicas=4", check=False)
    assert stale.returncode != 0
    assert "Expected replicas to be 3, was 2" in stale.stderr

    # more than replicas.max: the CRD's rule refuses it, naming the fields
    over = kubectl("scale", "qrp/sandbox", "--replicas=5", check=False)
    assert over.returncode != 0
    assert "replicas.min must not exceed replicas.max" in over.stderr
    assert kube_api.get("qrp", NS, "sandbox")["spec"]["replicas"]["min"] == 2

    discovery = json.loads(kubectl("get", "--raw", "/apis/qpa.ai/v1alpha1").stdout)
    entry = next(r for r in discovery["resources"] if r["name"] == "rolloutpools/scale")
    assert (entry["group"], entry["version"], entry["kind"]) == ("autoscaling", "v1", "Scale")
    assert not any(r["name"] == "taskbatches/scale" for r in discovery["resources"])


kopf = pytest.importorskip("kopf")
from helpers.operator_runner import exists, operator, phase  # noqa: E402


@pytest.mark.asyncio
async def test_kubectl_scale_resizes_the_pool_through_the_operator(
    kube_api: KubeAPIServer, operator_env: Path, kubectl: Kubectl, tmp_path: Path
) -> None:
    with operator():
        apply(kubectl, tmp_path, pool("sandbox", 1, 4))
        hpa = await exists(kube_api, "horizontalpodautoscalers", "sandbox-env")
        assert hpa["spec"]["minReplicas"] == 1
        pending = await phase(kube_api, "qrp", "sandbox", "Pending")
        assert pending["labelSelector"].startswith("app.kubernetes.io/")
        ready = {c["type"]: c for c in pending["conditions"]}["Ready"]
        assert (ready["status"], ready["observedGeneration"]) == ("False", 1)

        # with an autoscaler, the scale sets its floor
        kubectl("scale", "qrp/sandbox", "--replicas=3")
        await kube_api.eventually(
            lambda: (
                kube_api.get("horizontalpodautoscalers", NS, "sandbox-env")["spec"]["minReplicas"]
                == 3
            )
        )
        # at replicas.max there is nothing left to autoscale: the Deployment gets the size
        kubectl("scale", "qrp/sandbox", "--replicas=4")
        await kube_api.eventually(
            lambda: kube_api.get("horizontalpodautoscalers", NS, "sandbox-env") is None
        )
        await kube_api.eventually(
            lambda: kube_api.get("deployments", NS, "sandbox-env")["spec"]["replicas"] == 4
        )
        selector = kube_api.get("qrp", NS, "sandbox")["status"]["labelSelector"]
        labels = kube_api.get("deployments", NS, "sandbox-env")["spec"]["selector"]["matchLabels"]
        assert selector == ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

        kube_api.patch_status("deployments", NS, "sandbox-env", {"replicas": 4, "readyReplicas": 4})
        done = await phase(kube_api, "qrp", "sandbox", "Ready")
        conditions = {c["type"]: c for c in done["conditions"]}
        assert conditions["Ready"]["status"] == "True"
        assert conditions["Ready"]["observedGeneration"] == done["observedGeneration"] == 3
        assert "Reconciling" not in conditions and "Stalled" not in conditions
        scale = json.loads(
            kubectl("get", "qrp", "sandbox", "--subresource=scale", "-o", "json").stdout
        )
        assert scale["spec"]["replicas"] == 4 and scale["status"]["replicas"] == 4
        waited = kubectl("wait", "qrp/sandbox", "--for=condition=Ready", "--timeout=5s")
        assert "condition met" in waited.stdout
