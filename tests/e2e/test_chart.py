"""The chart installed as GitOps tools apply it, and its operator Deployment run as a real pod.

`helm template qpa charts/qpa -n qpa-system --include-crds | kubectl apply -f -` against the
test API server, in both install modes (cluster-wide; namespace-scoped with
`operator.watchNamespaces`) (`fakes.kube_api`): the chart's CRDs, kopf's peering CRDs, the RBAC, the
ServiceAccount, the ClusterKopfPeering and the operator Deployment all pass the server's
checks. The test kubelet (`fakes.kubelet`) then runs the Deployment's pod: the operator image
maps to this venv, so the container's own command (`kopf run ... -m qpa_operator.main`) runs,
logs in from inside the pod (in-cluster config: the automounted ServiceAccount token and the
`KUBERNETES_SERVICE_*` env), and reconciles `examples/rolloutpool.yaml`'s sandbox pool into
its Deployment. Values adjusted for one shared machine only: free ports for the liveness
endpoint and the pool, metrics off (its port would be shared with anything else running).

`helm install` / `helm upgrade` are not tested: with `--disable-openapi-validation` (and the
CRDs not pre-installed, so helm may own them) helm 4.3 still fails on the test server, which
reads JSON bodies only, because helm's storage driver posts its release Secret (or, with
`HELM_DRIVER=configmap`, ConfigMap) as protobuf: "the test API server reads JSON bodies only,
not protobuf". Checked by hand; nothing in the product works around it.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl, KubeTools
from fakes.kubelet import TestKubelet
from helpers.chart import CHART, NAMESPACE, RELEASE, set_args
from helpers.operator_runner import example

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(obj: dict[str, Any] | None) -> bool:
    status = (obj or {}).get("status") or {}
    return bool(status.get("readyReplicas"))


#: namespace-scoped mode: the operator serves WATCHED only; OTHER is a namespace it ignores
WATCHED, OTHER = "team-a", "default"


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
async def test_helm_template_applied_runs_the_operator_which_reconciles_a_pool(
    kube_api: KubeAPIServer,
    kubectl: Kubectl,
    kube_tools: KubeTools,
    kubelet: TestKubelet,
    tmp_path: Path,
    mode: str,
) -> None:
    """Both install modes: cluster-wide reconciles a pool in `default`; namespace-scoped
    (operator.watchNamespaces: [team-a]: a Role, RoleBinding and KopfPeering there, no
    ClusterRole, kopf --namespace=team-a) reconciles the pool in team-a and leaves the same
    pool in `default` untouched (no status, no children, no handler ran for it)."""
    values: dict[str, Any] = {"operator.livenessPort": free_port(), "metrics.enabled": False}
    namespaced = mode == "namespaced"
    if namespaced:
        values["operator.watchNamespaces"] = [WATCHED]
    rendered = subprocess.run(
        [str(kube_tools.helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--include-crds", *set_args(values)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    # Namespaces and CRDs first, then the rest (Flux's order; Argo CD retries instead): kubectl
    # reads the server's OpenAPI once, so a ClusterKopfPeering cannot go in the same apply as
    # the CRD that defines it (a real server answers the same)
    namespaces = [NAMESPACE, *([WATCHED] if namespaced else [])]
    docs = [
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces),
        *(d for d in yaml.safe_load_all(rendered) if d),
    ]
    first = [d for d in docs if d["kind"] in ("Namespace", "CustomResourceDefinition")]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(first))
    rest = [d for d in docs if d not in first]
    applied = kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rest)).stdout
    assert f"deployment.apps/{RELEASE}-operator created" in applied, applied
    if namespaced:
        assert "clusterrole" not in applied and "clusterkopfpeering" not in applied, applied
        assert f"role.rbac.authorization.k8s.io/{RELEASE}-operator created" in applied, applied
        assert "kopfpeering.kopf.dev/qpa-operator created" in applied, applied
    else:
        assert "clusterkopfpeering.kopf.dev/qpa-operator created" in applied, applied
    operator = f"{RELEASE}-operator"

    pool = example("rolloutpool.yaml")
    pool["spec"] |= {"port": free_port(), "replicas": {"min": 1, "max": 1}}
    name = pool["metadata"]["name"]
    served = WATCHED if namespaced else "default"
    pools = [{**pool, "metadata": {**pool["metadata"], "namespace": served}}]
    if namespaced:  # the same pool where the operator must not act, applied first
        pools.insert(0, {**pool, "metadata": {**pool["metadata"], "namespace": OTHER}})
    manifest = tmp_path / "rolloutpool.yaml"
    manifest.write_text(yaml.safe_dump_all(pools))
    kubectl("apply", "-f", manifest)
    await kubelet.eventually(
        lambda: ready(kube_api.get("deployments", NAMESPACE, operator)), timeout=60
    )

    def pool_ready() -> dict[str, Any] | None:
        status = (kube_api.get("rolloutpools", served, name) or {}).get("status") or {}
        return status if status.get("phase") == "Ready" else None

    status = await kubelet.eventually(pool_ready, timeout=60)
    assert status["readyReplicas"] == 1
    child = kube_api.get("deployments", served, f"{name}-env")
    assert child is not None and ready(child)
    assert child["metadata"]["ownerReferences"][0]["name"] == name
    (operator_pod,) = kube_api.list_objects("pods", NAMESPACE)
    logs = kubelet.logs(operator_pod["metadata"]["name"], NAMESPACE)
    assert "Activity 'login' succeeded" in logs, logs
    assert f"[{served}/{name}] Handler 'rolloutpool_reconcile' succeeded" in logs, logs
    if namespaced:
        ignored = kube_api.get("rolloutpools", OTHER, name) or {}
        assert not ignored.get("status"), ignored
        assert not any(a.startswith("qpa.ai/") for a in ignored["metadata"].get("annotations", {}))
        assert kube_api.get("deployments", OTHER, f"{name}-env") is None
        assert f"[{OTHER}/{name}]" not in logs, logs
