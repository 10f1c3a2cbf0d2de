"""kind-config.yaml and the install docs: a control plane and a worker that is the chart's
device node; the `helm install` lines of docs/kind.md and docs/gpu-cluster.md render.

The worker carries every label of the chart's default node selectors (kind taints its control
plane once a worker exists, so every qpa pod lands on the worker), mounts the host's USB bus
for the device bridge, and has no GPU labels.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml
from helpers.chart import CHART, ROOT, HelmRun


def load() -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    return dict(config)


def worker() -> dict[str, Any]:
    nodes = load()["nodes"]
    assert [n["role"] for n in nodes] == ["control-plane", "worker"]
    return dict(nodes[1])


def test_the_worker_mounts_the_usb_bus() -> None:
    mounts = worker()["extraMounts"]
    assert {"hostPath": "/dev/bus/usb", "containerPath": "/dev/bus/usb"} in mounts


def test_the_worker_matches_the_charts_default_node_selectors() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    selectors = [
        values["devices"]["nodeSelector"],
        values["operator"]["nodeSelector"],
        values["objectStore"]["bundled"]["nodeSelector"],
    ]
    labels = worker()["labels"]
    assert values["devices"]["nodeSelector"], "the chart names no device-node label"
    for selector in selectors:
        assert selector.items() <= labels.items(), selector
    # GPU-less: nothing here may match a GPU selector, and the chart's default needs none
    assert values["gpu"]["nodeSelector"] == {}
    assert not [key for key in labels if "gpu" in key]


def test_the_device_example_selects_the_worker() -> None:
    pool = yaml.safe_load((ROOT / "examples" / "devicepool.yaml").read_text())
    assert pool["spec"]["nodeSelector"].items() <= worker()["labels"].items()


def documented_installs(doc: str) -> list[list[str]]:
    """The `helm install ...` command lines of a doc's shell blocks, continuations joined."""
    commands, current = [], ""
    for line in (ROOT / "docs" / doc).read_text().splitlines():
        text = line.strip()
        if current or text.startswith("helm install "):
            current += text.rstrip("\\") + " "
            if not text.endswith("\\"):
                commands.append(shlex.split(current))
                current = ""
    return commands


@pytest.mark.parametrize("doc", ["kind.md", "gpu-cluster.md"])
def test_the_documented_helm_install_renders(doc: str, helm_run: HelmRun) -> None:
    (command,) = documented_installs(doc)
    assert command[:2] == ["helm", "install"] and command[3] == "charts/qpa"
    result = helm_run("template", *command[2:])
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert "Deployment" in kinds and "ClusterRole" in kinds
