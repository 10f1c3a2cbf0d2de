"""What the network policies leave closed, reported on the resource (fail closed, said aloud).

An endpoint no admin allowlist covers is not opened by the resource's egress policy
(`builders.netpol`): its pods cannot reach it. `report_egress` turns that into the condition
`EgressAllowed=False` (reason `EndpointNotAllowlisted`, the message naming each endpoint and
the chart setting that would open it) and one Warning Event when it becomes so; once every
endpoint is allowed again the condition turns True. A resource that never had a blocked
endpoint gets no such condition at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, TypeVar

import kopf
from pydantic import BaseModel
from qpa_operator.builders import netpol
from qpa_operator.handlers.runtime import now
from qpa_operator.handlers.status import write_status

from qpa.api import CustomResource
from qpa.api.v1alpha1 import set_condition

logger = logging.getLogger("qpa_operator")

CONDITION: Final = "EgressAllowed"
BLOCKED_REASON: Final = "EndpointNotAllowlisted"
ALLOWED_REASON: Final = "AllEndpointsAllowed"

R = TypeVar("R", bound=CustomResource)


def egress_message(blocked: Iterable[str]) -> str:
    items = list(blocked)
    return "not reachable, no egress rule opens it: " + "; ".join(items)


def egress_status(resource: CustomResource, blocked: list[str], when: Any) -> BaseModel | None:
    """The resource's status with `EgressAllowed` set, or None when nothing changes."""
    status = getattr(resource, "status", None)
    if status is None:
        return None  # the first status write comes from the kind's own refresh
    had = [c for c in status.conditions if c.type == CONDITION]
    if not blocked and not had:
        return None
    state: Literal["True", "False"] = "False" if blocked else "True"
    reason = BLOCKED_REASON if blocked else ALLOWED_REASON
    message = egress_message(blocked) if blocked else "every endpoint is allowed"
    if had and (had[0].status, had[0].message) == (state, message):
        return None
    conditions = set_condition(
        status.conditions,
        CONDITION,
        state,
        reason,
        message,
        observed_generation=resource.metadata.generation,
        now=when,
    )
    result: BaseModel = status.model_copy(update={"conditions": conditions})
    return result


async def report_egress(
    cls: type[R],
    obj: Mapping[str, Any],
    children: Iterable[Mapping[str, Any]],
    *,
    reread: Callable[[], Mapping[str, Any] | None] | None = None,
) -> None:
    """Set `EgressAllowed` from the policies among `children`; warn when it turns False."""
    blocked = netpol.blocked_endpoints(children)
    turned: list[bool] = []

    def compute(resource: R) -> BaseModel | None:
        desired = egress_status(resource, blocked, now())
        turned.append(desired is not None and bool(blocked))
        return desired

    change = await write_status(cls, obj, compute, reread=reread, announce_phases=False)
    if blocked and change.written and turned and turned[-1]:
        meta = obj.get("metadata") or {}
        body: Any = {
            "apiVersion": obj.get("apiVersion"),
            "kind": cls.info.kind,
            "metadata": {key: meta.get(key) for key in ("name", "namespace", "uid")},
        }
        try:
            kopf.warn(kopf.Body(body), reason=BLOCKED_REASON, message=egress_message(blocked))
        except LookupError:  # outside a kopf context: no event queue
            logger.warning("%s %s: %s", cls.info.kind, meta.get("name"), egress_message(blocked))
