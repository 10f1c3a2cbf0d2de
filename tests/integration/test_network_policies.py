"""The operator applies its network policies and says what they leave closed.

The real operator (kopf) against the test API server: an LLM-simulated RolloutPool whose model
is an external host no allowlist covers gets its egress policy without any rule for that host,
its ingress policy, the condition `EgressAllowed=False` naming the host and the setting, and a
Warning Event; restarted with the host's CIDR in `QPA_OPERATOR_NETWORK_POLICY` (the chart's
`networkPolicy`), the operator patches the policy to that CIDR and the condition turns True.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.kube_api import KubeAPIServer
from fakes.kubectl import Kubectl

kopf = pytest.importorskip("kopf")
from helpers.operator_runner import event_reasons, exists, operator  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

NS = "default"
MODEL = "https://api.llm.example/v1"
POOL = f"""
apiVersion: qpa.ai/v1alpha1
kind: RolloutPool
metadata:
  name: sim
spec:
  environment: llm_sim
  llmSim:
    modelUrl: {MODEL}
    model: sim
  replicas: {{min: 1, max: 1}}
"""


def egress_condition(kube: KubeAPIServer) -> dict[str, Any] | None:
    pool = kube.get("rolloutpools", NS, "sim") or {}
    for condition in (pool.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "EgressAllowed":
            return dict(condition)
    return None


async def test_an_unlisted_external_model_stays_closed_and_is_reported(
    kube_api: KubeAPIServer,
    operator_env: Path,
    kubectl: Kubectl,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("QPA_OPERATOR_NETWORK_POLICY", raising=False)
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(POOL, encoding="utf-8")
    with operator():
        kubectl("apply", "-f", str(manifest))
        egress = await exists(kube_api, "networkpolicies", "sim-egress")
        ingress = await exists(kube_api, "networkpolicies", "sim-env-ingress")
        rules = egress["spec"]["egress"]
        assert [p for r in rules for p in r["to"] if "ipBlock" in p] == [
            {"ipBlock": {"cidr": "169.254.20.10/32"}}  # NodeLocal DNSCache: DNS only
        ]
        assert MODEL in egress["metadata"]["annotations"]["qpa.ai/egress-blocked"]
        assert ingress["spec"]["policyTypes"] == ["Ingress"]
        (source,) = ingress["spec"]["ingress"][0]["from"]
        assert source == {"podSelector": {"matchLabels": {"qpa.ai/env-client": "sim"}}}
        blocked = await kube_api.eventually(
            lambda: (c := egress_condition(kube_api)) and c["status"] == "False" and c
        )
        assert blocked["reason"] == "EndpointNotAllowlisted"
        assert MODEL in blocked["message"] and "networkPolicy.egress.external" in blocked["message"]
        await kube_api.eventually(
            lambda: "EndpointNotAllowlisted" in event_reasons(kube_api, "sim", NS)
        )

    allow = {"egress": {"external": [{"cidr": "203.0.113.0/24", "ports": [443]}]}}
    monkeypatch.setenv("QPA_OPERATOR_NETWORK_POLICY", json.dumps(allow))
    with operator():
        allowed = await kube_api.eventually(
            lambda: (c := egress_condition(kube_api)) and c["status"] == "True" and c
        )
        assert allowed["reason"] == "AllEndpointsAllowed"
        egress = kube_api.get("networkpolicies", NS, "sim-egress") or {}
        assert {
            "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        } in egress["spec"]["egress"]
        assert egress["metadata"]["annotations"]["qpa.ai/egress-blocked"] == ""
    assert event_reasons(kube_api, "sim", NS).count("EndpointNotAllowlisted") == 1
