"""Helpers of the install tests (tests/unit/install): the chart's paths and rendered objects."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "qpa"
RELEASE, NAMESPACE = "qpa", "qpa-system"

#: `render(values)` -> the rendered objects; `helm_run(*args)` -> the finished helm process
Render = Callable[..., list[dict[str, Any]]]
HelmRun = Callable[..., subprocess.CompletedProcess[str]]

#: Everything optional switched on: the bundled store, persistence, a ServiceMonitor, GPU
#: placement, an extra env var, two replicas.
FULL: dict[str, Any] = {
    "objectStore.bundled.enabled": True,
    "objectStore.secretName": "qpa-store",
    "objectStore.bundled.persistence.enabled": True,
    "metrics.serviceMonitor.enabled": True,
    "gpu.nodeSelector": {"nvidia.com/gpu.present": "true"},
    "gpu.tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
    "operator.replicas": 2,
    "operator.extraEnv": [{"name": "QPA_OPERATOR_RETRY_SCALE", "value": "1.0"}],
}


def set_args(values: dict[str, Any]) -> list[str]:
    return [f"--set-json={key}={json.dumps(value)}" for key, value in sorted(values.items())]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} rendered"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = find(docs, "Deployment", f"{RELEASE}-operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """Plain `value` variables of a container (downward-API ones map to their field path)."""
    result = {}
    for var in container.get("env") or []:
        if "value" in var:
            result[var["name"]] = var["value"]
        else:
            result[var["name"]] = var["valueFrom"].get("fieldRef", {}).get("fieldPath", "")
    return result


def pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Pod specs inside a workload (Deployment, DaemonSet, Job) or a KServe predictor."""
    spec = obj.get("spec") or {}
    if "template" in spec:
        yield spec["template"]["spec"]
    if "predictor" in spec and "containers" in spec["predictor"]:
        yield spec["predictor"]
