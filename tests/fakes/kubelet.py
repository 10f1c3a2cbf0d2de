"""A test kubelet: the Pods on the test API server (`fakes.kube_api`) run as local processes.

`TestKubelet(kube_api, root)` polls the API server (in-process, every `interval` seconds) and
plays, for every namespace:

- **the Job controller**: Pods from the template (`<job>-<suffix>`; Indexed Jobs: `<job>-<i>-`
  with `JOB_COMPLETION_INDEX`, the `batch.kubernetes.io/job-completion-index` label and
  annotation, hostname `<job>-<i>`), `parallelism`, `completions`, `backoffLimit`,
  `backoffLimitPerIndex` / `maxFailedIndexes`, `podFailurePolicy` (`FailJob`, `FailIndex`,
  `Ignore`, `Count` on exit codes and pod conditions), `activeDeadlineSeconds`, `suspend`; the
  status as the real controller writes it (active, ready, succeeded, failed, completedIndexes,
  failedIndexes, startTime, completionTime, conditions `SuccessCriteriaMet`+`Complete` or
  `FailureTarget`+`Failed` with the real reasons). A Pod deleted before it finished counts as
  failed. Retries wait `backoff * 2**(failures-1)` seconds (real: 10 s; scaled down).
- **the Deployment controller, without ReplicaSets**: Pods are owned by the Deployment itself
  and labelled `pod-template-hash`; it keeps `replicas` Pods, replaces deleted or failed ones,
  rolls to a new template (surge of one Pod; an old Pod goes when a new one is ready, or when
  the new one cannot start for a port the old one holds) and writes replicas, updatedReplicas,
  readyReplicas, availableReplicas (`minReadySeconds` ignored), observedGeneration, conditions.
- **the DaemonSet controller**: one Pod per Node whose labels match `nodeSelector` (affinity
  and taints ignored); `add_node()` creates Node objects. Status: desired/current/updated
  NumberScheduled, numberReady, numberAvailable, observedGeneration.
- **the scheduler**: a Pod without `spec.nodeName` goes to the first Node matching its
  `nodeSelector` (the kubelet's own Node first). Nodes report `status.capacity` and
  `allocatable` (the kubelet's own: this machine's CPUs, memory and disk, 110 pods; `add_node`
  takes others, e.g. GPUs), which the scheduler here does not check (nothing is refused for
  room), but the operator's gang admission reads.
- **one machine as every Node's kubelet**: each container runs as
  `unshare --user --map-root-user --mount --uts` + bash: the volumes (configMap with items,
  secret, emptyDir, projected, downwardAPI, persistentVolumeClaim as a shared folder, hostPath
  only for paths given in `host_paths`), `subPath`, the termination message file, a private
  `/tmp` and the Pod's `/etc/hosts` are materialized under `root` and bind-mounted at their real
  paths; then `exec env -i <env> <command> <args>` with Kubernetes `$(VAR)` expansion, `env`
  (`value`, `secretKeyRef`, `configMapKeyRef`, `fieldRef`) and `envFrom`. The hostname is the
  Pod's. Every image is the project's venv (`.venv/bin` first on PATH, the host's
  `TORCH_EXTENSIONS_DIR` for the native ops it builds once, as an image ships them); an image
  `.../qpa-<name>:<tag>` without `command`/`args` runs the `CMD` of `images/<name>/Dockerfile`.
  Init containers run in order first. Mount points missing on the host (`/etc/qpa/order`,
  `/dev/termination-log`) are created and removed again when the last kubelet stops; a volume
  over the repository's folder (the operator's `/work`) gets the repository bound back inside,
  so the image stays whole. Everything else of the file system is the host's.
- **Pod status** as a kubelet writes it: phase, podIP, conditions (PodScheduled, Initialized,
  ContainersReady, Ready; those others set, such as DisruptionTarget, are kept),
  containerStatuses (waiting / running / terminated with exitCode,
  reason, the termination message capped at 4096 bytes, or the log tail for
  `FallbackToLogsOnError`), restartCount; `restartPolicy` restarts exited containers with
  backoff; readiness and liveness probes (httpGet, tcpSocket, exec) on their period.
- **deletion**: a Pod that leaves the API server (deleted, or garbage-collected with its
  owner) runs each running container's `lifecycle.preStop` hook (exec inside the container,
  httpGet, as probes run; in parallel, bounded by the grace period), then gets SIGTERM on its
  process group (a container with no hook at once), SIGKILL after
  `terminationGracePeriodSeconds` from the deletion;
  `kill(pod)` SIGKILLs at once (a crash: its restartPolicy and controller react);
  `disrupt(pod)` is an eviction: `DisruptionTarget=True`, then SIGKILL. SIGKILL
  reaches every process below the container's, in its session or not.

Networking (the simplest faithful model): pods share the host's network namespace, as with
`hostNetwork`; each Pod gets its own loopback address (127.1.x.y) as podIP, so a server on
0.0.0.0 answers on it. Two Pods declaring the same `containerPort` cannot both run: the second
stays Pending (PodScheduled=False, Unschedulable, "didn't have free ports", as a hostPort
conflict) until no other pod holds the port; except the nodes of one Indexed Job (other
indexes), which in a cluster run side by side and where one index alone serves the declared
port (index 0's rendezvous of a TrainingRun's ranks: the others only connect to it). Each Pod's
`/etc/hosts` (rewritten in place as things change) maps every Service name (`svc` in its own
namespace, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`) and, for headless Services,
every endpoint Pod (`<hostname>.<subdomain>.<ns>.svc.cluster.local`, ready ones or all with
`publishNotReadyAddresses`). A Service whose every `port` equals its `targetPort` resolves to a
ready endpoint's podIP directly; any other Service gets its own address (127.0.x.y) and a
userspace proxy there (kube-proxy's old userspace mode) from `port` to the named or numbered
`targetPort` of ready endpoints, round robin. `url(service, namespace, port)` reaches a Service
from the test. Runs as root (as in CI); an unprivileged user needs user namespaces, the mount
points already on the host and `net.ipv4.ip_unprivileged_port_start` at or below the Service
ports. Not modelled: Endpoints/EndpointSlice objects, Service env vars, NetworkPolicies,
resource limits, startup probes, volume updates after start, image pulls.

API access, as a real cluster gives it: every container gets `KUBERNETES_SERVICE_HOST` /
`KUBERNETES_SERVICE_PORT` (+ `_HTTPS`, `KUBERNETES_PORT*`), pointing at a TLS front of the test
API server (127.0.0.1, a self-signed certificate made with `openssl` for IP 127.0.0.1, relaying
to the plain-HTTP server), and a Pod whose token is automounted (`automountServiceAccountToken`
of the Pod, else of its ServiceAccount, else true) gets `/var/run/secrets/kubernetes.io/
serviceaccount/{token,ca.crt,namespace}` read-only. So the `kubernetes` client's
`load_incluster_config()` (qpa's `Kube.connect`, kopf's `login_via_client`) and kopf's
`login_with_service_account` work unchanged in a pod; a kubeconfig could not stand in for them
(`Kube.connect` goes in-cluster whenever `KUBERNETES_SERVICE_HOST` is set, and in-cluster
config insists on https with the CA). The token is an opaque string (the server checks none).

    async def test_it(kube_api, kubelet):
        kube_api.create(job)
        await kubelet.eventually(lambda: job_done(kube_api.get("jobs", "default", "j")))
        print(kubelet.logs("j-0-abcde"))
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import copy
import datetime
import fcntl
import functools
import hashlib
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

from fakes.kube_api import ApiError, KubeAPIServer

__all__ = ["ConfigError", "TestKubelet", "kubelet"]

REPO_ROOT = Path(__file__).resolve().parents[2]
# The native ops DeepSpeed compiles on first use (its CPU shared-memory comm op, at every
# `init_distributed`): an image ships them built, so pods share one folder kept across test
# sessions (minutes of two cores to build). Its own folder, not the host's: pods build with the
# venv's ninja, whose log a host build with another ninja version would discard (and rebuild).
TORCH_EXTENSIONS = str(
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "qpa-test-kubelet"
    / "torch_extensions"
)
VENV_BIN = (
    REPO_ROOT / ".venv" / "bin" if (REPO_ROOT / ".venv").is_dir() else Path(sys.prefix) / "bin"
)
IMAGES_DIR = REPO_ROOT / "images"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MESSAGE_LIMIT = 4096  # bytes of a termination message Kubernetes keeps
LOG_FALLBACK_BYTES, LOG_FALLBACK_LINES = 2048, 80  # FallbackToLogsOnError's log tail
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MOUNT_REGISTRY = Path(
    "/run/qpa-test-kubelet" if os.access("/run", os.W_OK) else "/tmp/.qpa-test-kubelet"
)


class ConfigError(Exception):
    """A Pod that cannot start as written (missing ConfigMap/Secret key, forbidden hostPath)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds_since(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known names replaced, `$$` escapes, unknown kept."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


def format_indexes(indexes: set[int]) -> str:
    """`{0, 1, 2, 5}` -> `0-2,5`, as the Job controller writes completedIndexes."""
    parts, ordered = [], sorted(indexes)
    for _, run in itertools.groupby(enumerate(ordered), lambda pair: pair[1] - pair[0]):
        values = [v for _, v in run]
        parts.append(str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}")
    return ",".join(parts)


def _labels_match(selector: Mapping[str, str] | None, labels: Mapping[str, str] | None) -> bool:
    return all((labels or {}).get(k) == v for k, v in (selector or {}).items())


def _template_hash(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def owner_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A controller ownerReference to `obj` (for the children a controller creates)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _peers(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Pods of one Indexed Job at different indexes: the nodes of one distributed program."""
    la, lb = a["metadata"].get("labels") or {}, b["metadata"].get("labels") or {}
    index = "batch.kubernetes.io/job-completion-index"
    return (
        la.get(CONTROLLER_UID) is not None
        and la.get(CONTROLLER_UID) == lb.get(CONTROLLER_UID)
        and la.get(index) is not None
        and lb.get(index) is not None
        and la.get(index) != lb.get(index)
    )


def _condition(type_: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    cond = {"type": type_, "status": "True" if status else "False", "lastTransitionTime": _now()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


#: The Pod conditions a kubelet writes; any other (DisruptionTarget, readiness gates) it keeps.
KUBELET_CONDITIONS = frozenset(
    {"PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers"}
)


def _same_conditions(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`new`, keeping the old lastTransitionTime of conditions whose status did not change."""
    before = {c["type"]: c for c in old or []}
    result = []
    for cond in new:
        prior = before.get(cond["type"])
        if prior and prior.get("status") == cond["status"]:
            cond = {**cond, "lastTransitionTime": prior.get("lastTransitionTime")}
        result.append(cond)
    return result


def _merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A top-level merge patch turning `old` into `new` (removed keys become null)."""
    return {k: new.get(k) for k in set(old) | set(new) if old.get(k) != new.get(k)}


def image_command(image: str) -> list[str]:
    """The CMD of the project's image `.../qpa-<name>:<tag>` (images/<name>/Dockerfile)."""
    name = image.rsplit("/", 1)[-1].split(":")[0].split("@")[0].removeprefix("qpa-")
    dockerfile = IMAGES_DIR / name / "Dockerfile"
    if dockerfile.is_file():
        for line in reversed(dockerfile.read_text().splitlines()):
            if line.startswith("CMD "):
                return list(json.loads(line[4:]))
    raise ConfigError(f"image {image!r} has no command here: set the container's `command`")


# --------------------------------------------------------------------------- host mount points


class _MountPoints:
    """Empty mount points this kubelet created on the host; removed when the last one stops."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        MOUNT_REGISTRY.mkdir(parents=True, exist_ok=True)
        self._me = MOUNT_REGISTRY / f"{os.getpid()}-{id(self)}"
        with self._locked():
            self._me.write_text("")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(MOUNT_REGISTRY / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def ensure(self, path: Path, is_file: bool) -> None:
        """Create `path` (and missing parents) on the host, recording what was new."""
        if path.exists():
            return
        with self._locked():
            first = path
            while not first.parent.exists():
                first = first.parent
            record = MOUNT_REGISTRY / "created"
            with record.open("a") as out:
                out.write(f"{first}\n")
            if is_file:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            else:
                path.mkdir(parents=True, exist_ok=True)

    def release(self) -> None:
        with self._locked():
            self._me.unlink(missing_ok=True)
            others = [p for p in MOUNT_REGISTRY.iterdir() if p.name[0].isdigit()]
            if any(_pid_alive(int(p.name.split("-")[0])) for p in others):
                return
            record = MOUNT_REGISTRY / "created"
            for line in record.read_text().splitlines() if record.exists() else []:
                _remove_tree_of_empty(Path(line))
            record.unlink(missing_ok=True)
            for stale in others:
                stale.unlink(missing_ok=True)


def host_allocatable(root: Path) -> dict[str, str]:
    """What this machine offers as a Node: its CPUs, memory, the disk under `root`, 110 pods."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    disk = shutil.disk_usage(root if root.exists() else Path("/")).total
    return {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{memory // 1024}Ki",
        "ephemeral-storage": f"{disk // 1024}Ki",
        "pods": "110",
    }


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` now (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_tree(pid: int, sig: signal.Signals) -> None:
    """`sig` to the process group of a container's `pid`; SIGKILL to every process below it
    too, so processes that started sessions of their own (torchrun's workers) die with the
    container, as everything in a container's PID namespace does."""
    below = _descendants(pid) if sig == signal.SIGKILL else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for child in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, sig)


def _remove_tree_of_empty(path: Path) -> None:
    """Remove `path` if it holds only empty folders or empty files (what we created)."""
    if path.is_file() and not path.is_symlink():
        if path.stat().st_size == 0:
            path.unlink()
        return
    if not path.is_dir() or path.is_symlink():
        return
    for child in path.iterdir():
        _remove_tree_of_empty(child)
    with contextlib.suppress(OSError):
        path.rmdir()


# --------------------------------------------------------------------------- runtime state


@dataclass
class _Container:
    spec: dict[str, Any]
    init: bool
    log: Path
    message: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    next_start: float = 0.0
    ready: bool = False
    probe_ok: dict[str, int] = field(default_factory=dict)  # kind -> consecutive results (+/-)
    probe_due: dict[str, float] = field(default_factory=dict)
    probing: set[str] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def done(self) -> bool:
        return "terminated" in self.state and self.next_start == 0.0


@dataclass
class _Pod:
    obj: dict[str, Any]
    dir: Path
    ip: str
    containers: list[_Container]
    hosts: Path
    admitted: bool = False
    volumes: dict[str, Path] | None = None
    unschedulable: str = ""
    waiting: tuple[str, str] | None = None  # (reason, message) keeping the pod from starting
    started: str | None = None
    deleted_at: float | None = None
    kill_at: float | None = None
    written: dict[str, Any] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])

    @property
    def key(self) -> tuple[str, str]:
        return (self.obj["metadata"]["namespace"], self.obj["metadata"]["name"])

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.obj["spec"])

    def ports(self) -> set[int]:
        return {
            int(p["containerPort"])
            for c in self.spec.get("containers", [])
            for p in c.get("ports") or []
            if p.get("protocol", "TCP") == "TCP"
        }

    def alive(self) -> bool:
        return any(c.running for c in self.containers)


@dataclass
class _HostsEntry:
    """One /etc/hosts line: `names` for every pod, `local` ones for pods in `namespace` only."""

    ip: str
    namespace: str
    names: list[str]
    local: list[str]


@dataclass
class _JobMemo:
    """What the Job controller remembers between syncs (the real one keeps it in finalizers)."""

    counted: set[str] = field(default_factory=set)
    created: dict[str, int | None] = field(default_factory=dict)  # pod uid -> index
    removed: set[str] = field(default_factory=set)  # pods it deleted itself
    failures: dict[int | None, int] = field(default_factory=dict)
    next_try: dict[int | None, float] = field(default_factory=dict)
    completed: set[int] = field(default_factory=set)
    failed_indexes: set[int] = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    verdict: tuple[str, str, str] | None = None  # (Complete|Failed, reason, message)


# --------------------------------------------------------------------------- the kubelet


class TestKubelet:
    """Controllers + a kubelet for the test API server (see the module docstring)."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        api: KubeAPIServer,
        root: str | Path,
        *,
        node: str = "qpa-test-node",
        host_paths: Mapping[str, str | Path] | None = None,
        backoff: float = 0.2,
        interval: float = 0.1,
    ) -> None:
        self.api = api
        self.root = Path(root)
        self.node = node
        self.host_paths = {k: Path(v) for k, v in (host_paths or {}).items()}
        self.backoff = backoff
        self.interval = interval
        self.errors: list[str] = []
        self.hook_failures: list[str] = []  # "<pod>/<container>" whose preStop hook failed
        self._pods: dict[str, _Pod] = {}
        self._gone: list[_Pod] = []  # deleted pods still being terminated
        self._all: list[_Pod] = []  # every pod that ran, for logs and reports
        self._jobs: dict[str, _JobMemo] = {}
        self._ips = itertools.count(1)
        # Service addresses start at a random block of 127.0.2.0-127.0.253.255, so kubelets of
        # test processes running side by side do not bind the same address and port
        self._service_base = random.randrange(0, 254 * 240, 254)
        self._service_ips: dict[tuple[str, str], str] = {}
        self._service_addr: dict[tuple[str, str], tuple[str, dict[int, int]]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probes = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="probe")
        self._proxy = _Proxy()
        self._mounts: _MountPoints | None = None
        self.api_port = 0  # the API server's TLS front (KUBERNETES_SERVICE_PORT), once started
        self._api_ca = self.root / "api-tls" / "ca.crt"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        self._mounts = _MountPoints()
        self.add_node(self.node, {})
        self._proxy.start()
        self.api_port = self._proxy.tls_front(self._api_tls(), ("127.0.0.1", self.api.port))
        self._thread = threading.Thread(target=self._run, name="test-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        with self._lock:
            pods = list(self._pods.values()) + self._gone
            for pod in pods:
                self._signal(pod, signal.SIGKILL)
            for pod in pods:
                for c in pod.containers:
                    if c.proc is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            c.proc.wait(10)
        self._probes.shutdown(wait=False, cancel_futures=True)
        self._proxy.stop()
        if self._mounts is not None:
            self._mounts.release()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _api_tls(self) -> ssl.SSLContext:
        """A self-signed certificate for 127.0.0.1 (the pods' ca.crt) and its server context."""
        key = self._api_ca.with_name("tls.key")
        self._api_ca.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=kube-apiserver",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc",
             "-keyout", str(key), "-out", str(self._api_ca)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._api_ca, key)
        return context

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.sync()
            except Exception:  # recorded; the fixture fails the test with it
                self.errors.append(traceback.format_exc())
                if len(self.errors) > 20:
                    return
            self._stop.wait(self.interval)

    # ------------------------------------------------------------------ test helpers

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str],
        allocatable: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Ready Node object labelled `labels` (plus kubernetes.io/hostname and os), with
        `allocatable` as its capacity (default: this machine's, `host_allocatable`)."""
        all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": all_labels},
        }
        if self.api.get("nodes", None, name) is None:
            self.api.create(node)
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": _now(),
            "lastTransitionTime": _now(),
        }
        addresses = [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ]
        room = dict(allocatable) if allocatable is not None else host_allocatable(self.root)
        return self.api.patch_status(
            "nodes",
            None,
            name,
            {"conditions": [ready], "addresses": addresses, "capacity": room, "allocatable": room},
        )

    def _find(self, name: str, namespace: str) -> _Pod:
        with self._lock:
            for pod in reversed(self._all):
                if pod.key == (namespace, name):
                    return pod
        raise KeyError(f"pod {namespace}/{name} never ran on this kubelet")

    def logs(self, pod: str, namespace: str = "default", container: str | None = None) -> str:
        """Everything a container (the first by default) wrote, over all its restarts."""
        found = self._find(pod, namespace)
        c = next(c for c in found.containers if container in (None, c.name) and not c.init)
        return c.log.read_text(errors="replace") if c.log.exists() else ""

    def kill(self, pod: str, namespace: str = "default") -> None:
        """SIGKILL every process of the Pod at once (a crash)."""
        with self._lock:
            self._signal(self._find(pod, namespace), signal.SIGKILL)

    def disrupt(
        self,
        pod: str,
        namespace: str = "default",
        reason: str = "TerminationByKubelet",
        message: str = "The node was low on resource: memory.",
    ) -> None:
        """A disruption of the Pod (eviction, preemption, a drained node): the condition
        `DisruptionTarget=True` first, as the evicting component sets it, then SIGKILL; the Pod
        ends Failed with the condition, which a Job's podFailurePolicy can match."""
        with self._lock:
            found = self._find(pod, namespace)
            current = self.api.get("pods", namespace, pod) or {}
            conditions = [
                c
                for c in (current.get("status") or {}).get("conditions") or []
                if c.get("type") != "DisruptionTarget"
            ]
            conditions.append(_condition("DisruptionTarget", True, reason, message))
            self.api.patch_status("pods", namespace, pod, {"conditions": conditions})
            self._signal(found, signal.SIGKILL)

    def process_groups(self, pod: str, namespace: str = "default") -> list[int]:
        """The process group ids of the Pod's containers (ever started)."""
        found = self._find(pod, namespace)
        return [c.proc.pid for c in found.containers if c.proc is not None]

    def url(self, service: str, namespace: str = "default", port: int | None = None) -> str:
        """`http://ADDRESS:PORT` of a Service (its first port by default), from the test."""
        with self._lock:
            entry = self._service_addr.get((namespace, service))
        if entry is None:
            raise KeyError(f"service {namespace}/{service} has no address (no ready endpoint?)")
        address, ports = entry
        wanted = port if port is not None else next(iter(ports))
        if wanted not in ports:
            raise KeyError(f"service {namespace}/{service} has no port {wanted}")
        return f"http://{address}:{ports[wanted]}"

    def report(self, tail: int = 20) -> str:
        """Each Pod's phase, container states and the last lines of its logs."""
        lines = []
        with self._lock:
            pods = list(self._all)
        for pod in pods:
            ns, name = pod.key
            lines.append(f"pod {ns}/{name} phase={pod.written.get('phase')} ip={pod.ip}")
            for c in pod.containers:
                lines.append(f"  container {c.name}: {json.dumps(c.state)}")
                text = c.log.read_text(errors="replace") if c.log.exists() else ""
                lines.extend(f"    | {line}" for line in text.splitlines()[-tail:])
        return "\n".join(lines) or "(no pods ran)"

    async def eventually(self, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        """`kube_api.eventually`, with the Pods' states and log tails in the failure."""
        try:
            return await self.api.eventually(check, timeout=timeout, interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.report()}") from None

    # ------------------------------------------------------------------ the loop

    def sync(self) -> None:
        """One pass: the node (scheduling, processes, status), networking, controllers."""
        pods = self.api.list_objects("pods")
        nodes = {n["metadata"]["name"]: n for n in self.api.list_objects("nodes")}
        self._sync_node(pods, nodes)
        self._sync_network()
        pods = self.api.list_objects("pods")
        for job in self.api.list_objects("jobs"):
            self._sync_job(job, pods)
        live_jobs = {j["metadata"]["uid"] for j in self.api.list_objects("jobs")}
        for uid in set(self._jobs) - live_jobs:
            del self._jobs[uid]
        for deploy in self.api.list_objects("deployments"):
            self._sync_deployment(deploy, pods)
        for ds in self.api.list_objects("daemonsets"):
            self._sync_daemonset(ds, pods, nodes)

    # ------------------------------------------------------------------ node: pods

    def _sync_node(self, pods: list[dict[str, Any]], nodes: dict[str, Any]) -> None:
        seen = set()
        for obj in sorted(pods, key=lambda o: o["metadata"].get("creationTimestamp", "")):
            uid = obj["metadata"]["uid"]
            seen.add(uid)
            if obj["metadata"].get("deletionTimestamp"):
                if uid in self._pods:
                    self._terminate(self._pods.pop(uid))
                continue
            if not obj["spec"].get("nodeName"):
                self._schedule(obj, nodes)
                continue
            pod = self._pods.get(uid)
            if pod is None:
                pod = self._pods[uid] = self._new_pod(obj)
                self._all.append(pod)
            pod.obj = obj
            self._advance(pod)
            self._write_status(pod)
        for uid in set(self._pods) - seen:
            self._terminate(self._pods.pop(uid))
        now = time.monotonic()
        for pod in list(self._gone):
            if not pod.alive():
                self._gone.remove(pod)
            elif pod.kill_at is not None and now >= pod.kill_at:
                self._signal(pod, signal.SIGKILL)

    def _schedule(self, obj: dict[str, Any], nodes: dict[str, Any]) -> None:
        selector = obj["spec"].get("nodeSelector")
        names = [self.node, *sorted(set(nodes) - {self.node})]
        for name in names:
            if name in nodes and _labels_match(selector, nodes[name]["metadata"].get("labels")):
                meta = obj["metadata"]
                with contextlib.suppress(ApiError):
                    self.api.patch(
                        "pods", meta["namespace"], meta["name"], {"spec": {"nodeName": name}}
                    )
                return

    def _new_pod(self, obj: dict[str, Any]) -> _Pod:
        meta = obj["metadata"]
        folder = self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        n = next(self._ips)
        ip = f"127.1.{n // 254}.{n % 254 + 1}"
        containers = []
        for init, key in ((True, "initContainers"), (False, "containers")):
            for spec in obj["spec"].get(key) or []:
                cdir = folder / "containers" / spec["name"]
                (cdir / "tmp").mkdir(parents=True, exist_ok=True)
                containers.append(_Container(spec, init, cdir / "log", cdir / "termination-log"))
        hosts = folder / "hosts"
        hosts.write_text("127.0.0.1\tlocalhost\n")
        return _Pod(obj, folder, ip, containers, hosts)

    def _port_holder(self, pod: _Pod) -> str | None:
        """A pod (still running or about to) holding one of `pod`'s container ports."""
        wanted = pod.ports()
        holders = [p for p in self._pods.values() if p.admitted and not self._finished(p)]
        holders += [p for p in self._gone if p.alive()]
        for other in holders:
            if other is not pod and wanted & other.ports() and not _peers(pod.obj, other.obj):
                return "/".join(other.key)
        return None

    def _finished(self, pod: _Pod) -> bool:
        return pod.written.get("phase") in ("Succeeded", "Failed")

    def _advance(self, pod: _Pod) -> None:
        if self._finished(pod):
            return
        if not pod.admitted:
            holder = self._port_holder(pod)
            if holder is not None:
                ports = ",".join(map(str, sorted(pod.ports())))
                pod.unschedulable = (
                    "0/1 nodes are available: 1 node(s) didn't have free ports for the requested "
                    f"pod ports (port {ports} is held by pod {holder})."
                )
                return
            pod.unschedulable = ""
            pod.admitted = True
            pod.started = _now()
        if pod.volumes is None:
            try:
                pod.volumes = self._materialize(pod)
                pod.waiting = None
            except ConfigError as exc:
                pod.waiting = ("ContainerCreating", str(exc))
                return
        policy = pod.spec.get("restartPolicy", "Always")
        now = time.monotonic()
        for c in pod.containers:
            if c.proc is not None and not c.running and "running" in c.state:
                self._exited(pod, c, policy, now)
        inits = [c for c in pod.containers if c.init]
        pending_init = next((c for c in inits if not (c.done and self._succeeded(c))), None)
        if pending_init is not None:
            if pending_init.done:  # failed for good
                return
            if not pending_init.running and now >= pending_init.next_start:
                self._start(pod, pending_init)
            return
        for c in pod.containers:
            if not c.init and not c.running and not c.done and now >= c.next_start:
                self._start(pod, c)
            if c.running:
                self._probe(pod, c, now)

    @staticmethod
    def _succeeded(c: _Container) -> bool:
        return c.state.get("terminated", {}).get("exitCode") == 0

    def _exited(self, pod: _Pod, c: _Container, policy: str, now: float) -> None:
        assert c.proc is not None
        code = c.proc.returncode
        code = 128 - code if code < 0 else code
        message = c.message.read_bytes()[:MESSAGE_LIMIT].decode(errors="replace")
        if (
            not message
            and code
            and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            text = c.log.read_bytes()[-LOG_FALLBACK_BYTES:].decode(errors="replace")
            message = "\n".join(text.splitlines()[-LOG_FALLBACK_LINES:])
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.started_at,
            "finishedAt": _now(),
            "containerID": f"qpa://{c.proc.pid}",
        }
        if message:
            terminated["message"] = message
        c.state = {"terminated": terminated}
        c.ready = False
        # An init container that succeeded is done; a failed one retries under Always too.
        restart = (policy == "Always" and not c.init) or (policy != "Never" and code != 0)
        if restart:
            delay = min(self.backoff * 2**c.restarts, 300.0)
            c.next_start = now + delay
            c.last_state = c.state
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff" if code else "Completed",
                    "message": f"back-off {delay:.1f}s restarting failed container",
                }
            }
            c.restarts += 1
        else:
            c.next_start = 0.0

    # ------------------------------------------------------------------ volumes and env

    def _get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api.get(kind, namespace, name)

    def _data(
        self, kind: str, namespace: str, name: str, optional: bool
    ) -> dict[str, bytes] | None:
        obj = self._get(kind, namespace, name)
        if obj is None:
            if optional:
                return None
            raise ConfigError(
                f'{kind[:-1] if kind == "secrets" else "configmap"} "{name}" not found'
            )
        data = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        for k, v in (obj.get("data") or {}).items():
            data[k] = base64.b64decode(v) if kind == "secrets" else str(v).encode()
        for k, v in (obj.get("stringData") or {}).items():
            data[k] = str(v).encode()
        return data

    def _field(self, pod: _Pod, path: str) -> str:
        meta = pod.obj["metadata"]
        if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        values = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": pod.spec.get("nodeName", ""),
            "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default"),
            "status.podIP": pod.ip,
            "status.podIPs": pod.ip,
            "status.hostIP": "127.0.0.1",
        }
        if path not in values:
            raise ConfigError(f"fieldRef {path!r} is not supported by the test kubelet")
        return str(values[path])

    def _items(
        self, data: dict[str, bytes] | None, items: list[dict[str, Any]] | None, what: str
    ) -> dict[str, bytes]:
        if data is None:
            return {}
        if not items:
            return data
        chosen = {}
        for item in items:
            if item["key"] not in data:
                raise ConfigError(f"{what}: key {item['key']!r} not found")
            chosen[item["path"]] = data[item["key"]]
        return chosen

    def _source_files(self, pod: _Pod, source: Mapping[str, Any]) -> dict[str, bytes]:
        ns = pod.key[0]
        if "configMap" in source:
            cm = source["configMap"]
            data = self._data("configmaps", ns, cm["name"], bool(cm.get("optional")))
            return self._items(data, cm.get("items"), f"configMap {cm['name']}")
        if "secret" in source:
            sec = source["secret"]
            name = sec.get("secretName") or sec.get("name")
            data = self._data("secrets", ns, name, bool(sec.get("optional")))
            return self._items(data, sec.get("items"), f"secret {name}")
        if "downwardAPI" in source:
            return {
                i["path"]: self._field(pod, i["fieldRef"]["fieldPath"]).encode()
                for i in source["downwardAPI"].get("items") or []
            }
        if "serviceAccountToken" in source:
            return {source["serviceAccountToken"].get("path", "token"): self._token(pod)}
        raise ConfigError(f"volume source {sorted(source)} is not supported by the test kubelet")

    def _token(self, pod: _Pod) -> bytes:
        account = pod.spec.get("serviceAccountName") or "default"
        return f"qpa-test-kubelet:{pod.key[0]}:{account}".encode()

    def _automount(self, pod: _Pod) -> bool:
        """The Pod's automountServiceAccountToken, else its ServiceAccount's, else true."""
        if (own := pod.spec.get("automountServiceAccountToken")) is not None:
            return bool(own)
        name = pod.spec.get("serviceAccountName") or "default"
        account = self._get("serviceaccounts", pod.key[0], name) or {}
        return account.get("automountServiceAccountToken") is not False

    def _materialize(self, pod: _Pod) -> dict[str, Path]:
        """Each volume as a folder (or host path) under the pod's folder."""
        volumes: dict[str, Path] = {}
        if self._automount(pod):  # what the ServiceAccount admission's projected volume holds
            account = pod.dir / "serviceaccount"
            account.mkdir(parents=True, exist_ok=True)
            (account / "token").write_bytes(self._token(pod))
            (account / "ca.crt").write_bytes(self._api_ca.read_bytes())
            (account / "namespace").write_text(pod.key[0])
            volumes[SERVICE_ACCOUNT_DIR] = account
        for vol in pod.spec.get("volumes") or []:
            name, target = vol["name"], pod.dir / "volumes" / vol["name"]
            files: dict[str, bytes] = {}
            if "emptyDir" in vol:
                pass
            elif "hostPath" in vol:
                path = vol["hostPath"]["path"]
                if path not in self.host_paths:
                    raise ConfigError(f"volume {name}: hostPath {path} is not allowed here")
                volumes[name] = self.host_paths[path]
                continue
            elif "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                volumes[name] = self.root / "pvc" / pod.key[0] / claim
                volumes[name].mkdir(parents=True, exist_ok=True)
                continue
            elif "projected" in vol:
                for source in vol["projected"].get("sources") or []:
                    files.update(self._source_files(pod, source))
            else:
                files = self._source_files(pod, vol)
            target.mkdir(parents=True, exist_ok=True)
            for rel, content in files.items():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                (target / rel).write_bytes(content)
            volumes[name] = target
        return volumes

    def _env(self, pod: _Pod, c: _Container) -> dict[str, str]:
        ns = pod.key[0]
        env = {"PATH": f"{VENV_BIN}:{HOST_PATH}", "HOSTNAME": self._hostname(pod), "HOME": "/root"}
        env["TORCH_EXTENSIONS_DIR"] = TORCH_EXTENSIONS  # the image's native ops, built once
        api = ("127.0.0.1", str(self.api_port))  # the `kubernetes` Service, in every container
        env |= {
            "KUBERNETES_SERVICE_HOST": api[0],
            "KUBERNETES_SERVICE_PORT": api[1],
            "KUBERNETES_SERVICE_PORT_HTTPS": api[1],
            "KUBERNETES_PORT": f"tcp://{api[0]}:{api[1]}",
            f"KUBERNETES_PORT_{api[1]}_TCP": f"tcp://{api[0]}:{api[1]}",
        }
        for source in c.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            ref = source.get("configMapRef") or source.get("secretRef") or {}
            kind = "configmaps" if "configMapRef" in source else "secrets"
            data = self._data(kind, ns, ref["name"], bool(ref.get("optional"))) or {}
            env.update({prefix + k: v.decode(errors="replace") for k, v in data.items()})
        for var in c.spec.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = expand(str(var.get("value", "")), env)
                continue
            source = var["valueFrom"]
            if "fieldRef" in source:
                env[name] = self._field(pod, source["fieldRef"]["fieldPath"])
                continue
            kind = "configmaps" if "configMapKeyRef" in source else "secrets"
            ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
            if ref is None:
                raise ConfigError(f"env {name}: valueFrom {sorted(source)} is not supported")
            found = self._data(kind, ns, ref["name"], bool(ref.get("optional")))
            if found is None or ref["key"] not in found:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"env {name}: couldn't find key {ref['key']} in {ref['name']}")
            env[name] = found[ref["key"]].decode(errors="replace")
        return env

    def _hostname(self, pod: _Pod) -> str:
        return str(pod.spec.get("hostname") or pod.key[1])[:63]

    # ------------------------------------------------------------------ processes

    def _mount_table(self, pod: _Pod, c: _Container) -> list[tuple[str, Path, bool]]:
        """(target, source, read-only) in mount order, parents first."""
        assert pod.volumes is not None
        mounts: dict[str, tuple[Path, bool]] = {"/tmp": (c.message.parent / "tmp", False)}
        for m in c.spec.get("volumeMounts") or []:
            if m["name"] not in pod.volumes:
                raise ConfigError(f"volumeMounts {m['name']}: no volume of that name")
            source = pod.volumes[m["name"]] / m.get("subPath", "")
            mounts[os.path.normpath(m["mountPath"])] = (source, bool(m.get("readOnly")))
        if SERVICE_ACCOUNT_DIR in pod.volumes and SERVICE_ACCOUNT_DIR not in mounts:
            mounts[SERVICE_ACCOUNT_DIR] = (pod.volumes[SERVICE_ACCOUNT_DIR], True)
        mounts["/etc/hosts"] = (pod.hosts, False)
        mounts[c.spec.get("terminationMessagePath", "/dev/termination-log")] = (c.message, False)
        ordered = sorted(mounts.items(), key=lambda kv: kv[0].count("/"))
        result: list[tuple[str, Path, bool]] = []
        for target, (source, ro) in ordered:
            result.append((target, source, ro))
            if REPO_ROOT.is_relative_to(target):  # the image must stay whole
                result.append((str(REPO_ROOT), REPO_ROOT, False))
        return result

    def _mount_point(self, target: str, earlier: list[tuple[str, Path]], is_file: bool) -> None:
        """Create the mount point where it will be looked up: in an earlier mount, or the host."""
        for prior, source in reversed(earlier):
            if target != prior and Path(target).is_relative_to(prior):
                inside = source / os.path.relpath(target, prior)
                if not inside.exists():
                    inside.parent.mkdir(parents=True, exist_ok=True)
                    inside.touch() if is_file else inside.mkdir()
                return
        assert self._mounts is not None
        self._mounts.ensure(Path(target), is_file)

    def _script(self, pod: _Pod, c: _Container, argv: list[str], env: dict[str, str]) -> str:
        lines = ["set -e"]
        mounts = self._mount_table(pod, c)
        earlier: list[tuple[str, Path]] = []
        for fd, (target, source, _) in enumerate(mounts, start=10):
            if not source.exists():
                raise ConfigError(f"mount {target}: {source} does not exist")
            self._mount_point(target, earlier, source.is_file())
            earlier.append((target, source))
            lines.append(f"exec {fd}<{shlex.quote(str(source))}")
        for fd, (target, _, ro) in enumerate(mounts, start=10):
            t = shlex.quote(target)
            lines.append(f"mount --no-canonicalize --bind /proc/self/fd/{fd} {t}")
            if ro:
                lines.append(f"mount --no-canonicalize -o remount,bind,ro {t}")
        lines.append("exec " + " ".join(f"{fd}<&-" for fd in range(10, 10 + len(mounts))))
        lines.append(f"echo {shlex.quote(self._hostname(pod))} > /proc/sys/kernel/hostname")
        lines.append(f"cd {shlex.quote(c.spec.get('workingDir') or '/')}")
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        lines.append(f"exec env -i {assigns} {shlex.join(argv)}")
        return "\n".join(lines) + "\n"

    def _start(self, pod: _Pod, c: _Container) -> None:
        try:
            env = self._env(pod, c)
            command = [expand(str(a), env) for a in c.spec.get("command") or []]
            args = [expand(str(a), env) for a in c.spec.get("args") or []]
            if not command and not args:  # the image's CMD (no image here has an ENTRYPOINT)
                args = image_command(c.spec.get("image", ""))
            c.message.write_bytes(b"")
            script = self._script(pod, c, command + args, env)
        except ConfigError as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            return
        script_path = c.message.parent / "start.sh"
        script_path.write_text(script)
        with c.log.open("ab") as log:
            c.proc = subprocess.Popen(
                [
                    "unshare",
                    "--user",
                    "--map-root-user",
                    "--mount",
                    "--uts",
                    "--",
                    "bash",
                    str(script_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": HOST_PATH},
                cwd=str(c.message.parent),
            )
        c.env = env
        c.started_at = _now()
        c.state = {"running": {"startedAt": c.started_at}}
        c.ready = False
        c.probe_ok.clear()
        c.probe_due = {
            kind: time.monotonic() + float(c.spec[kind].get("initialDelaySeconds", 0))
            for kind in ("readinessProbe", "livenessProbe")
            if kind in c.spec
        }

    def _signal(self, pod: _Pod, sig: signal.Signals) -> None:
        for c in pod.containers:
            if c.proc is not None and c.proc.poll() is None:
                _signal_tree(c.proc.pid, sig)

    def _terminate(self, pod: _Pod) -> None:
        grace = pod.spec.get("terminationGracePeriodSeconds", 30)
        pod.deleted_at = time.monotonic()
        pod.kill_at = pod.deleted_at + float(grace if grace is not None else 30)
        self._gone.append(pod)
        if not grace:
            self._signal(pod, signal.SIGKILL)
            return
        for c in pod.containers:
            hook = (c.spec.get("lifecycle") or {}).get("preStop")
            if hook and c.running:
                threading.Thread(
                    target=self._pre_stop, args=(pod, c, hook), daemon=True, name="pre-stop"
                ).start()
            else:
                self._signal_container(c, signal.SIGTERM)

    def _pre_stop(self, pod: _Pod, c: _Container, hook: Mapping[str, Any]) -> None:
        """A container's preStop hook (as a probe, with the grace left as its timeout), then
        SIGTERM; the hook's failure is only reported, as kubelet's FailedPreStopHook event."""
        left = max(0.1, (pod.kill_at or time.monotonic()) - time.monotonic())
        if not self._run_probe(pod, c, {**hook, "timeoutSeconds": left}):
            self.hook_failures.append(f"{pod.key[1]}/{c.name}")
        with self._lock:
            if c.running:
                self._signal_container(c, signal.SIGTERM)

    # ------------------------------------------------------------------ probes

    def _probe(self, pod: _Pod, c: _Container, now: float) -> None:
        if "readinessProbe" not in c.spec:
            c.ready = True
        for kind, due in list(c.probe_due.items()):
            if now < due or kind in c.probing:
                continue
            probe = c.spec[kind]
            c.probe_due[kind] = now + float(probe.get("periodSeconds", 10))
            c.probing.add(kind)
            proc = c.proc
            future = self._probes.submit(self._run_probe, pod, c, probe)
            future.add_done_callback(functools.partial(self._probed, pod, c, kind, proc))

    def _probed(self, pod: _Pod, c: _Container, kind: str, proc: Any, future: Any) -> None:
        with self._lock:
            c.probing.discard(kind)
            if c.proc is not proc or future.cancelled():
                return
            ok = bool(future.result())
            probe = c.spec[kind]
            streak = c.probe_ok.get(kind, 0)
            streak = max(streak, 0) + 1 if ok else min(streak, 0) - 1
            c.probe_ok[kind] = streak
            if kind == "readinessProbe":
                if streak >= int(probe.get("successThreshold", 1)):
                    c.ready = True
                elif -streak >= int(probe.get("failureThreshold", 3)):
                    c.ready = False
            elif -streak >= int(probe.get("failureThreshold", 3)) and c.running:
                self._signal_container(c, signal.SIGKILL)

    @staticmethod
    def _signal_container(c: _Container, sig: signal.Signals) -> None:
        if c.proc is not None:
            _signal_tree(c.proc.pid, sig)

    def _run_probe(self, pod: _Pod, c: _Container, probe: Mapping[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "exec" in probe:
                assert c.proc is not None
                argv = [
                    "nsenter",
                    "-t",
                    str(c.proc.pid),
                    "-U",
                    "-m",
                    "--preserve-credentials",
                    "--",
                    "env",
                    "-i",
                    *[f"{k}={v}" for k, v in c.env.items()],
                    *probe["exec"]["command"],
                ]
                done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
                return done.returncode == 0
            action = probe.get("httpGet") or probe.get("tcpSocket") or {}
            port = self._container_port(pod, action.get("port"))
            host = action.get("host") or pod.ip
            if "tcpSocket" in probe:
                with socket.create_connection((host, port), timeout=timeout):
                    return True
            url = f"http://{host}:{port}{action.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                return 200 <= int(answer.status) < 400
        except Exception:
            return False

    def _container_port(self, pod: _Pod, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for c in pod.spec.get("containers", []):
            for p in c.get("ports") or []:
                if p.get("name") == port:
                    return int(p["containerPort"])
        raise ConfigError(f"no container port named {port!r}")

    # ------------------------------------------------------------------ pod status

    def _status(self, pod: _Pod) -> dict[str, Any]:
        inits = [c for c in pod.containers if c.init]
        mains = [c for c in pod.containers if not c.init]
        init_failed = any(c.done and not self._succeeded(c) for c in inits)
        if init_failed or (mains and all(c.done for c in mains)):
            failed = init_failed or any(not self._succeeded(c) for c in mains)
            phase = "Failed" if failed else "Succeeded"
        elif any(c.started_at for c in mains):
            phase = "Running"
        else:
            phase = "Pending"
        initialized = all(c.done and self._succeeded(c) for c in inits)
        ready = phase == "Running" and all(c.ready and c.running for c in mains)
        conditions = [
            _condition(
                "PodScheduled",
                not pod.unschedulable,
                "Unschedulable" if pod.unschedulable else "",
                pod.unschedulable,
            ),
            _condition("Initialized", initialized),
            _condition("ContainersReady", ready),
            _condition("Ready", ready),
        ]
        if pod.unschedulable:
            conditions = conditions[:1]
        status: dict[str, Any] = {"phase": phase, "conditions": conditions}
        if pod.admitted:
            status |= {
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "podIP": pod.ip,
                "podIPs": [{"ip": pod.ip}],
                "startTime": pod.started,
            }
            status["containerStatuses"] = [self._container_status(pod, c) for c in mains]
            if inits:
                status["initContainerStatuses"] = [self._container_status(pod, c) for c in inits]
        return status

    def _container_status(self, pod: _Pod, c: _Container) -> dict[str, Any]:
        state = c.state
        if pod.waiting is not None and "waiting" in state:
            state = {"waiting": {"reason": pod.waiting[0], "message": pod.waiting[1]}}
        result = {
            "name": c.name,
            "image": c.spec.get("image", ""),
            "imageID": "",
            "ready": c.ready and c.running,
            "started": c.running,
            "restartCount": c.restarts,
            "state": state,
        }
        if c.proc is not None:
            result["containerID"] = f"qpa://{c.proc.pid}"
        if c.last_state:
            result["lastState"] = c.last_state
        return result

    def _write_status(self, pod: _Pod) -> None:
        status = self._status(pod)
        # conditions other components own (DisruptionTarget, readiness gates) are kept
        foreign = [
            c
            for c in (pod.obj.get("status") or {}).get("conditions") or []
            if c.get("type") not in KUBELET_CONDITIONS
        ]
        status["conditions"] = _same_conditions(
            pod.written.get("conditions", []), status["conditions"] + foreign
        )
        if status == pod.written:
            return
        ns, name = pod.key
        with contextlib.suppress(ApiError):
            self.api.patch_status("pods", ns, name, _merge_diff(pod.written, status))
            pod.written = status

    # ------------------------------------------------------------------ networking

    def _sync_network(self) -> None:
        """Service addresses, proxies and every Pod's /etc/hosts."""
        running = [p for p in self._pods.values() if p.admitted and not self._finished(p)]
        hosts: list[_HostsEntry] = []
        routes: dict[tuple[str, int], list[tuple[str, int]]] = {}
        addresses: dict[tuple[str, str], tuple[str, dict[int, int]]] = {}
        for svc in self.api.list_objects("services"):
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            spec = svc.get("spec") or {}
            publish = bool(spec.get("publishNotReadyAddresses"))
            ends = [
                p
                for p in running
                if p.key[0] == ns
                and spec.get("selector")
                and _labels_match(spec["selector"], p.obj["metadata"].get("labels"))
                and (publish or self._runtime_ready(p))
            ]
            names = [f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
            ports = [int(p["port"]) for p in spec.get("ports") or []]
            targets = {
                int(p["port"]): p.get("targetPort", p["port"]) for p in spec.get("ports") or []
            }
            if spec.get("clusterIP") == "None":
                for end in ends:
                    hosts.append(_HostsEntry(end.ip, ns, names, [name]))
                    host = self._hostname(end)
                    if end.spec.get("subdomain") == name:
                        fqdn = f"{host}.{name}.{ns}"
                        long = [f"{fqdn}.svc.cluster.local", f"{fqdn}.svc", fqdn]
                        hosts.append(_HostsEntry(end.ip, ns, long, [f"{host}.{name}"]))
                if ends:
                    addresses[(ns, name)] = (ends[0].ip, {port: port for port in ports})
                continue
            pairs = {
                port: [(e.ip, self._endpoint_port(e, t)) for e in ends]
                for port, t in targets.items()
            }
            if all(str(port) == str(target) for port, target in targets.items()):
                if ends:  # port == targetPort everywhere: the name resolves to an endpoint
                    hosts.append(_HostsEntry(ends[0].ip, ns, names, [name]))
                    addresses[(ns, name)] = (ends[0].ip, {port: port for port in ports})
                continue
            ip = self._service_ips.setdefault((ns, name), self._next_service_ip())
            hosts.append(_HostsEntry(ip, ns, names, [name]))
            addresses[(ns, name)] = (ip, {port: port for port in ports})
            for port, found in pairs.items():
                routes[(ip, port)] = [(a, b) for a, b in found if b]
        self._service_addr = addresses
        self._proxy.update(routes)
        for pod in running:
            self._write_hosts(pod, hosts)

    def _runtime_ready(self, pod: _Pod) -> bool:
        mains = [c for c in pod.containers if not c.init]
        return bool(mains) and all(c.ready and c.running for c in mains)

    def _next_service_ip(self) -> str:
        n = (self._service_base + len(self._service_ips)) % (254 * 252)
        return f"127.0.{2 + n // 254}.{n % 254 + 1}"

    def _endpoint_port(self, pod: _Pod, target: Any) -> int:
        try:
            return self._container_port(pod, target)
        except ConfigError:
            return 0

    def _write_hosts(self, pod: _Pod, entries: list[_HostsEntry]) -> None:
        ns, host = pod.key[0], self._hostname(pod)
        own = f"{pod.ip}\t{host}"
        if sub := pod.spec.get("subdomain"):
            own = f"{pod.ip}\t{host}.{sub}.{ns}.svc.cluster.local {host}"
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost", own]
        for entry in entries:
            names = [*(entry.local if entry.namespace == ns else []), *entry.names]
            lines.append(f"{entry.ip}\t{' '.join(names)}")
        text = "\n".join(lines) + "\n"
        if pod.hosts.read_text() != text:
            with pod.hosts.open("r+") as out:  # in place: the bind mounts see the same inode
                out.truncate(0)
                out.write(text)

    # ------------------------------------------------------------------ controllers: Job

    def _create_pod(
        self,
        owner: Mapping[str, Any],
        template: Mapping[str, Any],
        generate_name: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        **spec_extra: Any,
    ) -> dict[str, Any] | None:
        meta = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": generate_name,
                "namespace": owner["metadata"]["namespace"],
                "labels": {**(meta.get("labels") or {}), **labels},
                "annotations": {**(meta.get("annotations") or {}), **(annotations or {})},
                "ownerReferences": [owner_ref(owner)],
            },
            "spec": {**copy.deepcopy(template["spec"]), **spec_extra},
        }
        try:
            return self.api.create(pod)
        except ApiError as exc:
            self.errors.append(f"creating a pod for {owner['metadata']['name']}: {exc}")
            return None

    def _delete_pod(self, pod: Mapping[str, Any]) -> None:
        with contextlib.suppress(ApiError):
            self.api.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _sync_job(self, job: dict[str, Any], all_pods: list[dict[str, Any]]) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        status = job.get("status") or {}
        uid, name = meta["uid"], meta["name"]
        memo = self._jobs.setdefault(uid, _JobMemo())
        done = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
        if done & {"Complete", "Failed"}:
            return
        pods = [p for p in all_pods if _owned_by(p, uid)]
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1))
        per_index = spec.get("backoffLimitPerIndex")
        limit = spec.get("backoffLimit", None if per_index is not None else 6)
        now = time.monotonic()
        verdict: tuple[str, str, str] | None = None
        # count finished pods once, and pods that vanished before finishing
        present = {p["metadata"]["uid"] for p in pods}
        for pod in pods:
            pod_uid, phase = pod["metadata"]["uid"], (pod.get("status") or {}).get("phase")
            index = self._index(pod) if indexed else None
            memo.created.setdefault(pod_uid, index)
            if phase not in ("Succeeded", "Failed") or pod_uid in memo.counted:
                continue
            memo.counted.add(pod_uid)
            if phase == "Succeeded":
                memo.succeeded += 1
                if index is not None:
                    memo.completed.add(index)
                continue
            action, why = self._failure_policy(spec, pod)
            if action == "Ignore":
                continue
            memo.failed += 1
            if action == "FailJob":
                verdict = verdict or ("Failed", "PodFailurePolicy", why)
            self._count_failure(memo, index, per_index, now, fail_index=action == "FailIndex")
        for pod_uid, index in list(memo.created.items()):
            if pod_uid not in present and pod_uid not in memo.counted:
                memo.counted.add(pod_uid)
                if pod_uid not in memo.removed:
                    memo.failed += 1
                    self._count_failure(memo, index, per_index, now, fail_index=False)
        active = [
            p
            for p in pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        ]
        new_status: dict[str, Any] = {"startTime": status.get("startTime")}
        conditions = list(status.get("conditions") or [])
        if spec.get("suspend"):
            for pod in active:
                memo.removed.add(pod["metadata"]["uid"])
                self._delete_pod(pod)
            active = []
            new_status["startTime"] = None
            conditions = [c for c in conditions if c["type"] != "Suspended"]
            conditions.append(_condition("Suspended", True, "JobSuspended", "Job suspended"))
        else:
            if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
                conditions = [c for c in conditions if c["type"] != "Suspended"]
                conditions.append(_condition("Suspended", False, "JobResumed", "Job resumed"))
            new_status["startTime"] = new_status["startTime"] or _now()
            deadline = spec.get("activeDeadlineSeconds")
            if limit is not None and memo.failed > int(limit):
                verdict = verdict or (
                    "Failed",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                )
            max_failed = spec.get("maxFailedIndexes")
            if max_failed is not None and len(memo.failed_indexes) > int(max_failed):
                verdict = verdict or (
                    "Failed",
                    "MaxFailedIndexesExceeded",
                    "Job has exceeded the specified maximal number of failed indexes",
                )
            if deadline is not None and _seconds_since(new_status["startTime"]) > float(deadline):
                verdict = verdict or (
                    "Failed",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                )
            if verdict is None:
                verdict = self._job_progress(
                    job, memo, active, indexed, completions, parallelism, now
                )
        if verdict is not None:
            for pod in active:
                memo.removed.add(pod["metadata"]["uid"])
                self._delete_pod(pod)
            active = []
            kind, reason, message = verdict
            if kind == "Complete":
                conditions += [
                    _condition("SuccessCriteriaMet", True, reason, message),
                    _condition("Complete", True, reason, message),
                ]
                new_status["completionTime"] = _now()
            else:
                conditions += [
                    _condition("FailureTarget", True, reason, message),
                    _condition("Failed", True, reason, message),
                ]
        ready = sum(
            1
            for p in active
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        new_status |= {
            "active": len(active) or None,
            "ready": ready,
            "terminating": 0,
            "succeeded": memo.succeeded or None,
            "failed": memo.failed or None,
            "conditions": conditions or None,
        }
        if indexed:
            new_status["completedIndexes"] = format_indexes(memo.completed)
            if per_index is not None:
                new_status["failedIndexes"] = format_indexes(memo.failed_indexes)
        current = {k: status.get(k) for k in new_status}
        if current != new_status:
            with contextlib.suppress(ApiError):
                self.api.patch_status(
                    "jobs", meta["namespace"], name, _merge_diff(current, new_status)
                )

    @staticmethod
    def _index(pod: Mapping[str, Any]) -> int | None:
        value = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
        return int(value) if value is not None else None

    def _count_failure(
        self, memo: _JobMemo, index: int | None, per_index: Any, now: float, *, fail_index: bool
    ) -> None:
        memo.failures[index] = memo.failures.get(index, 0) + 1
        count = memo.failures[index]
        memo.next_try[index] = now + min(self.backoff * 2 ** (count - 1), 360.0)
        if index is not None and per_index is not None and (fail_index or count > int(per_index)):
            memo.failed_indexes.add(index)

    @staticmethod
    def _failure_policy(spec: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[str, str]:
        """The action of the first podFailurePolicy rule the failed pod matches (else Count)."""
        status = pod.get("status") or {}
        meta = pod["metadata"]
        for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
            action = rule["action"]
            if codes := rule.get("onExitCodes"):
                for cs in status.get("containerStatuses") or []:
                    if codes.get("containerName") not in (None, cs["name"]):
                        continue
                    code = (cs.get("state") or {}).get("terminated", {}).get("exitCode")
                    if not code:
                        continue
                    inside = code in codes.get("values", [])
                    if inside == (codes.get("operator", "In") == "In"):
                        why = (
                            f"Container {cs['name']} for pod {meta['namespace']}/{meta['name']} "
                            f"failed with exit code {code} matching {action} rule at index {i}"
                        )
                        return action, why
            for want in rule.get("onPodConditions") or []:
                for cond in status.get("conditions") or []:
                    if cond.get("type") == want["type"] and cond.get("status") == want.get(
                        "status", "True"
                    ):
                        pod_name = f"{meta['namespace']}/{meta['name']}"
                        why = f"Pod {pod_name} has condition {want['type']} matching {action} rule"
                        return action, f"{why} at index {i}"
        return "Count", ""

    def _job_progress(
        self,
        job: dict[str, Any],
        memo: _JobMemo,
        active: list[dict[str, Any]],
        indexed: bool,
        completions: Any,
        parallelism: int,
        now: float,
    ) -> tuple[str, str, str] | None:
        """Create the pods the Job still needs; the verdict once nothing is left to run."""
        name = job["metadata"]["name"]
        template = job["spec"]["template"]
        uid = job["metadata"]["uid"]
        labels = {CONTROLLER_UID: uid, JOB_NAME: name, "controller-uid": uid, "job-name": name}
        success = ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
        if indexed:
            total = int(completions or parallelism)
            finished = memo.completed | memo.failed_indexes
            if len(finished) >= total and not active:
                if memo.failed_indexes:
                    return ("Failed", "FailedIndexes", "Job has failed indexes")
                return success
            running = {self._index(p) for p in active}
            free = parallelism - len(active)
            for index in range(total):
                if free <= 0:
                    break
                if index in finished or index in running or now < memo.next_try.get(index, 0):
                    continue
                env = {
                    "name": "JOB_COMPLETION_INDEX",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}
                    },
                }
                spec_template = copy.deepcopy(template)
                for c in [
                    *spec_template["spec"].get("initContainers", []),
                    *spec_template["spec"]["containers"],
                ]:
                    c["env"] = [env, *(c.get("env") or [])]
                created = self._create_pod(
                    job,
                    spec_template,
                    f"{name}-{index}-",
                    {**labels, INDEX_KEY: str(index)},
                    {INDEX_KEY: str(index)},
                    hostname=f"{name}-{index}",
                )
                if created is not None:
                    memo.created[created["metadata"]["uid"]] = index
                free -= 1
            return None
        if completions is None:
            if memo.succeeded and not active:
                return success
            wanted = 0 if memo.succeeded else parallelism - len(active)
        else:
            if memo.succeeded >= int(completions):
                return success
            wanted = min(parallelism, int(completions) - memo.succeeded) - len(active)
        if wanted > 0 and now >= memo.next_try.get(None, 0):
            for _ in range(wanted):
                created = self._create_pod(job, template, f"{name}-", labels)
                if created is not None:
                    memo.created[created["metadata"]["uid"]] = None
        return None

    # ------------------------------------------------------------------ Deployment, DaemonSet

    def _ready(self, pod: Mapping[str, Any]) -> bool:
        status = pod.get("status") or {}
        return status.get("phase") == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    def _sync_deployment(self, deploy: dict[str, Any], all_pods: list[dict[str, Any]]) -> None:
        meta, spec = deploy["metadata"], deploy.get("spec") or {}
        uid, name, ns = meta["uid"], meta["name"], meta["namespace"]
        replicas = int(spec.get("replicas", 1))
        template = spec["template"]
        current = _template_hash(template)
        pods = [
            p for p in all_pods if _owned_by(p, uid) and not p["metadata"].get("deletionTimestamp")
        ]
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                self._delete_pod(pod)
        pods = [
            p for p in pods if (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
        ]
        new = [
            p
            for p in pods
            if (p["metadata"].get("labels") or {}).get("pod-template-hash") == current
        ]
        old = [p for p in pods if p not in new]
        ready_new = [p for p in new if self._ready(p)]
        for pod in new[replicas:]:
            self._delete_pod(pod)
        new = new[:replicas]
        room = replicas + 1 - len(new) - len(old)
        for _ in range(min(replicas - len(new), max(room, 0))):
            self._create_pod(deploy, template, f"{name}-{current}-", {"pod-template-hash": current})
        blocked = any(self._port_blocked(p) for p in new)
        keep_old = max(0, replicas - len(ready_new) - (1 if blocked else 0))
        for pod in sorted(old, key=self._ready)[: max(0, len(old) - keep_old)]:
            self._delete_pod(pod)
        ready = sum(1 for p in pods if self._ready(p))
        available = ready >= replicas
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(pods) or None,
            "updatedReplicas": len(new) or None,
            "readyReplicas": ready or None,
            "availableReplicas": ready or None,
            "unavailableReplicas": max(0, replicas - ready) or None,
            "conditions": _same_conditions(
                (deploy.get("status") or {}).get("conditions") or [],
                [
                    _condition(
                        "Available",
                        available,
                        "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                        f"Deployment {'has' if available else 'does not have'} minimum "
                        "availability.",
                    ),
                    _condition(
                        "Progressing",
                        True,
                        "NewReplicaSetAvailable"
                        if not old and len(ready_new) == replicas
                        else "ReplicaSetUpdated",
                        f'Deployment "{name}" is progressing.',
                    ),
                ],
            ),
        }
        self._patch_status("deployments", ns, name, deploy.get("status") or {}, status)

    def _port_blocked(self, pod: Mapping[str, Any]) -> bool:
        conds = (pod.get("status") or {}).get("conditions") or []
        return any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds
        )

    def _patch_status(
        self, plural: str, ns: str, name: str, old: Mapping[str, Any], new: dict[str, Any]
    ) -> None:
        current = {k: old.get(k) for k in new}
        if current != new:
            with contextlib.suppress(ApiError):
                self.api.patch_status(plural, ns, name, _merge_diff(current, new))

    def _sync_daemonset(
        self, ds: dict[str, Any], all_pods: list[dict[str, Any]], nodes: dict[str, Any]
    ) -> None:
        meta, spec = ds["metadata"], ds.get("spec") or {}
        uid, name, ns = meta["uid"], meta["name"], meta["namespace"]
        template = spec["template"]
        current = _template_hash(template)
        selector = template["spec"].get("nodeSelector")
        wanted = {
            n for n, obj in nodes.items() if _labels_match(selector, obj["metadata"].get("labels"))
        }
        pods = [
            p for p in all_pods if _owned_by(p, uid) and not p["metadata"].get("deletionTimestamp")
        ]
        by_node: dict[str, dict[str, Any]] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            stale = (pod["metadata"].get("labels") or {}).get("controller-revision-hash") != current
            failed = (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")
            if node not in wanted or node in by_node or stale or failed:
                self._delete_pod(pod)
            else:
                by_node[node] = pod
        for node in sorted(wanted - set(by_node)):
            self._create_pod(
                ds, template, f"{name}-", {"controller-revision-hash": current}, nodeName=node
            )
        ready = sum(1 for p in by_node.values() if self._ready(p))
        status = {
            "observedGeneration": meta.get("generation", 1),
            "desiredNumberScheduled": len(wanted),
            "currentNumberScheduled": len(by_node),
            "updatedNumberScheduled": len(by_node),
            "numberReady": ready,
            "numberAvailable": ready or None,
            "numberUnavailable": max(0, len(wanted) - ready) or None,
            "numberMisscheduled": 0,
        }
        self._patch_status("daemonsets", ns, name, ds.get("status") or {}, status)


# --------------------------------------------------------------------------- service proxy


class _Proxy:
    """Userspace TCP proxy: one listener per (Service address, port), round robin to endpoints."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kubelet-proxy", daemon=True
        )
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._routes: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self._turn = itertools.count()
        self._fronts: list[asyncio.Server] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        async def close() -> None:
            for server in [*self._servers.values(), *self._fronts]:
                server.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def update(self, routes: dict[tuple[str, int], list[tuple[str, int]]]) -> None:
        self._routes = routes
        if set(routes) - set(self._servers):
            asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    async def _listen(self) -> None:
        for address in set(self._routes) - set(self._servers):
            with contextlib.suppress(OSError):  # the port is taken: tried again next sync
                handler = lambda r, w, a=address: self._relay(a, r, w)  # noqa: E731
                self._servers[address] = await asyncio.start_server(handler, *address)

    def tls_front(self, context: ssl.SSLContext, target: tuple[str, int]) -> int:
        """A TLS listener on a free 127.0.0.1 port relaying to `target`; returns the port."""

        async def listen() -> int:
            handler = lambda r, w: self._pipe_to(target, r, w)  # noqa: E731
            server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
            self._fronts.append(server)
            return int(server.sockets[0].getsockname()[1])

        return int(asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10))

    async def _relay(self, address: tuple[str, int], reader: Any, writer: Any) -> None:
        targets = self._routes.get(address) or []
        if not targets:
            writer.close()
            return
        await self._pipe_to(targets[next(self._turn) % len(targets)], reader, writer)

    async def _pipe_to(self, target: tuple[str, int], reader: Any, writer: Any) -> None:
        host, port = target
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def pipe(src: Any, dst: Any) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


# --------------------------------------------------------------------------- pytest fixture


@pytest.fixture
def kubelet(kube_api: KubeAPIServer, tmp_path: Path) -> Iterator[TestKubelet]:
    """A `TestKubelet` on `kube_api`; its errors fail the test, its report shows on failure."""
    with TestKubelet(kube_api, tmp_path / "kubelet") as node:
        yield node
        print(node.report())  # pytest shows it when the test failed
    if node.errors:
        pytest.fail("the test kubelet raised:\n" + "\n".join(node.errors))
