"""The qpa operator's entry point: `kopf run -A -m qpa_operator.main` (the image's command).

Importing this module registers every handler (`qpa_operator.handlers`); the start-up handler
configures kopf:

- **peering**: one operator is active at a time; replicas share the peering object
  `qpa-operator` (cluster-wide with `-A`; the Helm chart installs kopf's peering CRDs).
  `--standalone` (or `QPA_OPERATOR_STANDALONE=true`) turns it off, as tests do;
- **persistence**: handler progress and the last handled spec live in `qpa.ai/*` annotations
  (the CRD schemas prune `status.kopf`); no finalizers are needed: children carry owner
  references and leftovers are cleaned from watch events;
- **events**: explicit Events only (`kopf.info`/`kopf.warn` on phase transitions), from INFO;
- **watches**: on child kinds only objects labelled `app.kubernetes.io/managed-by=qpa-operator`
  (phone Leases: `app.kubernetes.io/part-of=qpa`) are listed and watched;
- **metrics**: Prometheus `/metrics` on `QPA_OPERATOR_METRICS_PORT` when set;
- **namespaces**: cluster-wide (`kopf run --all-namespaces`, a `ClusterKopfPeering`), or
  namespace-scoped: `QPA_OPERATOR_NAMESPACES=a,b` with `kopf run --namespace=a --namespace=b`
  (the chart's `operator.watchNamespaces`; a `KopfPeering` in each). Then kopf's cluster
  scanning is off (`settings.scanning.disabled`: no CRD or Namespace list/watch, so no
  ClusterRole at all; CRDs installed after the operator started are seen at its next start),
  the start refuses a cluster-wide kopf or a `--namespace` outside the list, and the client
  refuses every request outside it (`qpa_operator.kube`).

Environment: `QPA_OPERATOR_IMAGE` (sandbox/collector), `QPA_OPERATOR_TRAINER_IMAGE`,
`QPA_OPERATOR_HARNESS_IMAGE`, `QPA_OPERATOR_BRIDGE_IMAGE`, `QPA_OPERATOR_STORE_ENDPOINT`/`_SECRET`/
`_REGION`, `QPA_OPERATOR_GPU_NODE_SELECTOR`/`_TOLERATIONS` (JSON), `QPA_CLUSTER_DOMAIN` (defaults
for the builders), `QPA_OPERATOR_PEERING` (peering name), `QPA_OPERATOR_PRIORITY` (an integer,
or `auto`: one per pod from `POD_NAME`, so replicas never tie), `QPA_OPERATOR_STANDALONE`,
`QPA_OPERATOR_METRICS_PORT`, `QPA_OPERATOR_RETRY_SCALE` (multiplies every backoff; tests use
0.1), `QPA_OPERATOR_EXIT_TIMEOUT` (seconds in-flight handlers get at shutdown; kopf: 2),
`QPA_OPERATOR_CONSISTENCY_TIMEOUT` (seconds to wait for the echo of kopf's own patches; 15),
`QPA_OPERATOR_NAMESPACES` (the served namespaces; unset: all).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from typing import Any

import kopf
from qpa_operator import handlers, metrics
from qpa_operator.builders.common import MANAGED_SELECTOR, PART_OF, Defaults
from qpa_operator.handlers import runtime
from qpa_operator.kube import served_namespaces

__all__ = ["handlers", "login", "settings_from_env"]

PEERING_NAME = "qpa-operator"
PREFIX = "qpa.ai"
#: Child kinds whose watches select only what the operator manages (group, version, plural).
MANAGED_RESOURCES = (
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("", "v1", "pods"),
    ("apps", "v1", "deployments"),
    ("apps", "v1", "daemonsets"),
    ("batch", "v1", "jobs"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("serving.kserve.io", "v1beta1", "inferenceservices"),
)
logger = logging.getLogger("qpa_operator")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _scaled(values: tuple[float, ...], scale: float) -> list[float]:
    return [round(v * scale, 3) for v in values]


def peering_priority(env: Any) -> int:
    """`QPA_OPERATOR_PRIORITY`: an integer, or `auto` for one derived from `POD_NAME`.

    kopf pauses every operator of a peering when two have the same priority, so the replicas
    of one Deployment (identical pods) need different ones: `auto` hashes the pod's name into
    1..2**30, and the replica with the highest runs while the others stand by.
    """
    raw = (env.get("QPA_OPERATOR_PRIORITY") or "").strip()
    if not raw:
        return 0
    if raw.lower() != "auto":
        try:
            return int(raw)
        except ValueError:
            msg = f"QPA_OPERATOR_PRIORITY: {raw!r} is neither an integer nor auto"
            raise ValueError(msg) from None
    pod = env.get("POD_NAME") or ""
    if not pod:
        raise ValueError("QPA_OPERATOR_PRIORITY=auto needs POD_NAME (the downward API)")
    return 1 + int.from_bytes(hashlib.sha256(pod.encode()).digest()[:4], "big") % (2**30)


def settings_from_env(settings: kopf.OperatorSettings, environ: Any = None) -> float:
    """Apply qpa's kopf settings; returns the retry scale."""
    env = os.environ if environ is None else environ
    scale = float(env.get("QPA_OPERATOR_RETRY_SCALE") or 1.0)

    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{PREFIX}/finalizer"

    settings.posting.enabled = True
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "qpa-operator"
    settings.posting.reporting_instance = env.get("POD_NAME") or "qpa-operator"

    if _truthy(env.get("QPA_OPERATOR_STANDALONE")):
        settings.peering.standalone = True
    if not settings.peering.standalone:
        if settings.peering.name == "default":  # not given on the command line
            settings.peering.name = env.get("QPA_OPERATOR_PEERING") or PEERING_NAME
        settings.peering.mandatory = True
        if settings.peering.priority == 0:  # not given with --priority
            settings.peering.priority = peering_priority(env)

    if served_namespaces(env) is not None:
        # Namespaced: kopf must not list/watch CRDs or Namespaces (cluster-scoped reads the
        # namespaced RBAC does not grant); it serves exactly the --namespace it was given.
        settings.scanning.disabled = True

    for resource in MANAGED_RESOURCES:
        settings.watching.label_selectors[resource] = MANAGED_SELECTOR
    settings.watching.label_selectors["coordination.k8s.io", "v1", "leases"] = (
        f"app.kubernetes.io/part-of={PART_OF}"
    )

    # How long kopf waits for the echo of its own patch before it handles older events as if
    # they were current (kopf: 5 s). On a loaded API server the echo comes later, and kopf
    # then runs a creation handler again: harmless (handlers are idempotent), but wasted.
    settings.persistence.consistency_timeout = float(
        env.get("QPA_OPERATOR_CONSISTENCY_TIMEOUT") or 15.0
    )
    if env.get("QPA_OPERATOR_EXIT_TIMEOUT"):
        settings.queueing.exit_timeout = float(env["QPA_OPERATOR_EXIT_TIMEOUT"])
    settings.networking.error_backoffs = _scaled((1, 1, 2, 3, 5, 8, 13, 21), scale)
    settings.queueing.error_delays = _scaled((1, 1, 2, 3, 5, 8, 13, 21, 34, 55), scale)
    settings.posting.default_backoffs = _scaled((1, 1, 2, 3, 5, 8, 13, 21), scale)
    return scale


class NamespacesMismatch(kopf.PermanentError):
    """kopf was started for other namespaces than `QPA_OPERATOR_NAMESPACES` names."""


def check_namespaces(settings: kopf.OperatorSettings, argv: list[str], environ: Any = None) -> None:
    """Refuse to start when kopf would serve namespaces outside `QPA_OPERATOR_NAMESPACES`.

    kopf knows its namespaces from the command line only (`--namespace`/`-n`, or
    `--all-namespaces`/`-A`, which sets `settings.peering.clusterwide`): each given must be
    one of the served ones, and cluster-wide is refused.
    """
    served = served_namespaces(os.environ if environ is None else environ)
    if served is None:
        return
    names = ", ".join(sorted(served))
    if settings.peering.clusterwide:
        raise NamespacesMismatch(
            f"QPA_OPERATOR_NAMESPACES names {names}, but kopf runs cluster-wide "
            "(--all-namespaces): run it with --namespace for each of them"
        )
    # only a kopf command line says (tests start kopf in-process, with their own argv)
    given = kopf_namespaces(argv) if argv and os.path.basename(argv[0]) == "kopf" else []
    outside = sorted(set(given) - served)
    if outside:
        raise NamespacesMismatch(
            f"kopf was started for {', '.join(outside)}, outside QPA_OPERATOR_NAMESPACES "
            f"({names}): the operator reconciles nothing outside its namespaces"
        )


def kopf_namespaces(argv: list[str]) -> list[str]:
    """The values of `--namespace`/`-n` on a kopf command line."""
    found: list[str] = []
    for index, arg in enumerate(argv):
        if arg in ("--namespace", "-n") and index + 1 < len(argv):
            found.append(argv[index + 1])
        elif arg.startswith("--namespace="):
            found.append(arg.partition("=")[2])
        elif arg.startswith("-n") and len(arg) > 2 and not arg.startswith("--"):
            found.append(arg[2:])
    return found


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    check_namespaces(settings, sys.argv)
    scale = settings_from_env(settings)
    runtime.configure(defaults=Defaults.from_env(), retry_scale=scale)
    metrics.OBJECTS.clear()
    port = os.environ.get("QPA_OPERATOR_METRICS_PORT")
    if port:
        metrics.serve(int(port), os.environ.get("QPA_OPERATOR_METRICS_ADDRESS", "0.0.0.0"))


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await runtime.shutdown()
    metrics.stop()


def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_via_client(**kwargs)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own login (in-cluster or kubeconfig); the operator's client reuses it."""
    info = _login(**kwargs)
    runtime.remember_login(info, lambda: _login(logger=logger))
    return info
