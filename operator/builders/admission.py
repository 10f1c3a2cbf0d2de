"""All-or-nothing admission of a TrainingRun's ranks when no Kueue queue admits them.

A multi-node run whose ranks are placed one by one can hold GPUs while its rendezvous waits
for ranks that have no room, and two such runs can hold each other's missing GPUs forever.
So each attempt's Job is created suspended, and the operator un-suspends it only when every
rank fits at once: `gang_admission` plays the scheduler's resource fit on what the API server
says (pure: Nodes, Pods and the other TrainingRun Jobs in, a `Verdict` out):

- a node is a candidate when it is Ready, not cordoned (`spec.unschedulable`), its labels match
  the rank pod's `nodeSelector` and required node affinity, and the pod tolerates each of its
  `NoSchedule`/`NoExecute` taints;
- a node's room is its `status.allocatable` less the requests of the pods bound to it that have
  not finished (a container's requests, else its limits; init containers as the scheduler
  counts them), `pods` included;
- ranks of other TrainingRun Jobs that were admitted (not suspended, not finished) but whose
  pods are not bound yet are placed first (first fit), so two runs admitted in one breath
  cannot both count the same free GPUs;
- then the `nodes` ranks of this Job are placed, first fit: admitted only if all of them fit.

The refusal names what is short (each resource the ranks need in total against what the
candidate nodes have free), or says that the room is spread across nodes so that no node holds
a whole rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from qpa.api.v1alpha1.base import parse_quantity

PODS: Final = "pods"
ADMITTED: Final = "Admitted"
INSUFFICIENT: Final = "InsufficientCapacity"
_BINARY: Final = (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024))

Resources = dict[str, Decimal]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one admission check: `reason` is `Admitted` or `InsufficientCapacity`."""

    admitted: bool
    reason: str
    message: str
    short: tuple[str, ...] = ()


def _quantity(value: Any) -> Decimal:
    try:
        return parse_quantity(value)
    except ValueError:
        return Decimal(0)


def _container_request(container: Mapping[str, Any]) -> Resources:
    spec = container.get("resources") or {}
    limits = {k: _quantity(v) for k, v in (spec.get("limits") or {}).items()}
    requests = {k: _quantity(v) for k, v in (spec.get("requests") or {}).items()}
    # the API server defaults a request to the limit where only the limit is set
    return {**limits, **requests}


def pod_request(pod_spec: Mapping[str, Any]) -> Resources:
    """What the scheduler reserves for a pod: its containers' sum, at least each init
    container's (they run one at a time), plus one of the node's `pods`."""
    total: Resources = {}
    for container in pod_spec.get("containers") or []:
        for name, value in _container_request(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod_spec.get("initContainers") or []:
        for name, value in _container_request(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    total[PODS] = Decimal(1)
    return {k: v for k, v in total.items() if v > 0}


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of `tolerations` tolerates `taint` (Kubernetes' matching rules)."""
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _affinity_holds(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: any one term, all its expressions."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions") or [])
        for term in terms
    )


def node_matches(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """Whether the scheduler could place the pod on `node` at all (resources aside)."""
    if not _ready(node) or (node.get("spec") or {}).get("unschedulable"):
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    if not _affinity_holds(pod_spec, labels):
        return False
    tolerations = pod_spec.get("tolerations") or []
    return all(
        tolerates(tolerations, taint)
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def free_by_node(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, Resources]:
    """Each node's allocatable less the requests of the unfinished pods bound to it."""
    free: dict[str, Resources] = {}
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        free[str(node["metadata"]["name"])] = {k: _quantity(v) for k, v in allocatable.items()}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name not in free or _finished(pod):
            continue
        room = free[node_name]
        for name, value in pod_request(pod.get("spec") or {}).items():
            room[name] = room.get(name, Decimal(0)) - value
    return free


def _fits(room: Resources, request: Resources) -> bool:
    return all(room.get(name, Decimal(0)) >= value for name, value in request.items())


def _place(
    free: dict[str, Resources], candidates: list[str], request: Resources, count: int
) -> int:
    """Place up to `count` pods first fit on `candidates`, taking their room; how many fit."""
    placed = 0
    for name in candidates:
        room = free[name]
        while placed < count and _fits(room, request):
            for resource, value in request.items():
                room[resource] = room.get(resource, Decimal(0)) - value
            placed += 1
        if placed == count:
            break
    return placed


def _job_finished(job: Mapping[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def unbound_ranks(
    jobs: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], *, exclude: str = ""
) -> list[tuple[Mapping[str, Any], int]]:
    """(pod spec, count) of the ranks of admitted, unfinished Jobs that are not bound yet."""
    bound: dict[str, int] = {}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") and not _finished(pod):
            for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
                if ref.get("kind") == "Job":
                    bound[str(ref.get("uid"))] = bound.get(str(ref.get("uid")), 0) + 1
    pending = []
    for job in jobs:
        spec = job.get("spec") or {}
        if _uid(job) == exclude or spec.get("suspend") or _job_finished(job):
            continue
        wanted = int(spec.get("parallelism") or 0)
        missing = wanted - bound.get(_uid(job), 0)
        if missing > 0:
            pending.append(((spec.get("template") or {}).get("spec") or {}, missing))
    return pending


def quantity_text(resource: str, value: Decimal) -> str:
    """A quantity as people write it (`8`, `500m`, `32Gi`)."""
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, scale in _BINARY:
            if value >= scale and value % scale == 0:
                return f"{value // scale}{suffix}"
            if value >= scale * 10:
                return f"{(value / scale).quantize(Decimal('0.1'))}{suffix}"
        return str(value.normalize())
    if value != value.to_integral_value():
        return f"{(value * 1000).to_integral_value()}m"
    return str(int(value))


def _listing(request: Resources) -> str:
    return ", ".join(
        f"{name}={quantity_text(name, value)}"
        for name, value in sorted(request.items())
        if name != PODS
    )


def gang_admission(
    job: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    jobs: Iterable[Mapping[str, Any]] = (),
) -> Verdict:
    """Whether every rank of the suspended Indexed `job` fits on the cluster right now."""
    spec = job.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    ranks = int(spec.get("parallelism") or spec.get("completions") or 1)
    request = pod_request(pod_spec)
    all_nodes = list(nodes)
    pod_list = list(pods)
    free = free_by_node(all_nodes, pod_list)
    for other_spec, count in unbound_ranks(jobs, pod_list, exclude=_uid(job)):
        others = sorted(n["metadata"]["name"] for n in all_nodes if node_matches(n, other_spec))
        _place(free, others, pod_request(other_spec), count)
    candidates = sorted(n["metadata"]["name"] for n in all_nodes if node_matches(n, pod_spec))
    each = _listing(request) or "no resources"
    if not candidates:
        return Verdict(
            False,
            INSUFFICIENT,
            f"no schedulable node matches the rank pods' nodeSelector, affinity and "
            f"tolerations ({len(all_nodes)} nodes; {ranks} ranks of {each} each)",
            ("nodes",),
        )
    available = {name: dict(free[name]) for name in candidates}
    placed = _place(available, candidates, request, ranks)
    if placed >= ranks:
        return Verdict(
            True,
            ADMITTED,
            f"all {ranks} ranks ({each} each) fit on {len(candidates)} matching nodes",
        )
    short = []
    for name, value in sorted(request.items()):
        needed = value * ranks
        have = sum((max(free[n].get(name, Decimal(0)), Decimal(0)) for n in candidates), Decimal(0))
        if have < needed:
            short.append(
                f"{name} ({quantity_text(name, needed)} needed, {quantity_text(name, have)} free)"
            )
    head = f"room for {placed} of {ranks} ranks ({each} each) on {len(candidates)} matching nodes"
    if short:
        message = f"{head}; short: {', '.join(short)}"
    else:
        message = f"{head}: the free resources are spread so that no node holds a whole rank"
    names = tuple(s.split(" ", 1)[0] for s in short) or ("fragmented",)
    return Verdict(False, INSUFFICIENT, message, names)


__all__ = [
    "ADMITTED",
    "INSUFFICIENT",
    "Verdict",
    "free_by_node",
    "gang_admission",
    "node_matches",
    "pod_request",
    "quantity_text",
    "tolerates",
    "unbound_ranks",
]
