"""Fixtures of the install tests: the chart rendered by the real `helm` (v4, from .venv/bin).

`render(values)` runs `helm template` once per distinct set of values for the whole session
(the chart does not change during a run), so tests may ask for the same rendering as often as
they like; `helm_run(...)` runs any other helm command from the repository root.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from helpers.chart import CHART, NAMESPACE, RELEASE, ROOT, HelmRun, Render, set_args


@pytest.fixture(scope="session")
def helm_run(kube_tools: Any) -> HelmRun:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(kube_tools.helm), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
        )

    return run


@pytest.fixture(scope="session")
def render(helm_run: HelmRun) -> Render:
    cache: dict[str, list[dict[str, Any]]] = {}

    def rendered(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        key = json.dumps(values or {}, sort_keys=True)
        if key not in cache:
            result = helm_run(
                "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
                *set_args(values or {}),
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            cache[key] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        return cache[key]

    return rendered
