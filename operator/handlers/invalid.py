"""A stored resource the models refuse: said once on its status, never retried in a loop.

The API server's schema and `qpa.api` agree on what is valid (tests/unit/api/test_crd_bounds.py),
but an object stored before a CRD was tightened, or by a server that skipped validation, may
still not parse. Its handlers skip it (`views.parse` returns None) and `schedule_report` writes
`Ready=False` and `Stalled=True`, reason `InvalidSpec`, with the fields the models refuse,
once per generation, and logs it once: the next change of the spec is the next try, not a
timer. A failing write is logged and left: nothing here raises into a handler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError
from qpa_operator.builders.common import JsonDict
from qpa_operator.handlers.runtime import now, runtime
from qpa_operator.kube import ApiError, plural_of

from qpa.api.v1alpha1.base import Condition, ConditionStatus, set_condition

logger = logging.getLogger("qpa_operator")

REASON: Final = "InvalidSpec"
#: How many of the models' errors the condition names (the rest are counted).
SHOWN_ERRORS: Final = 5
#: (uid, generation) already reported by this process.
_REPORTED: set[tuple[str, int | None]] = set()
_TASKS: set[asyncio.Task[None]] = set()


def invalid_message(exc: ValidationError) -> str:
    """The refused fields, as `spec.podTemplate.affinity: Extra inputs are not permitted; ...`."""
    errors = exc.errors(include_url=False, include_input=False)
    shown = [
        ".".join(str(part) for part in error["loc"]) + ": " + error["msg"]
        for error in errors[:SHOWN_ERRORS]
    ]
    more = len(errors) - len(shown)
    tail = f" (and {more} more)" if more > 0 else ""
    return "the stored object does not parse: " + "; ".join(shown)[:2000] + tail


def invalid_status_patch(obj: Mapping[str, Any], message: str, when: datetime) -> JsonDict:
    """The status patch that says so: `Ready=False` and `Stalled=True` for this generation."""
    generation = (obj.get("metadata") or {}).get("generation")
    generation = generation if isinstance(generation, int) else None
    conditions: list[Condition] = []
    states: tuple[tuple[str, ConditionStatus], ...] = (("Ready", "False"), ("Stalled", "True"))
    for kind, state in states:
        conditions = set_condition(
            conditions, kind, state, REASON, message, observed_generation=generation, now=when
        )
    wire = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]
    return {"status": {"conditions": wire}}


def already_said(obj: Mapping[str, Any], message: str) -> bool:
    """Whether the stored status already carries this report for this generation."""
    meta = obj.get("metadata") or {}
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "Ready"
            and condition.get("reason") == REASON
            and condition.get("message") == message
            and condition.get("observedGeneration") == meta.get("generation")
        ):
            return True
    return False


async def report_invalid(obj: Mapping[str, Any], message: str) -> None:
    """Write the `InvalidSpec` conditions on `obj`'s status (logged, never raised, on failure)."""
    meta = obj.get("metadata") or {}
    name, namespace = str(meta.get("name")), meta.get("namespace")
    api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
    try:
        rt = await runtime()
        await rt.client.patch(
            api_version,
            plural_of(api_version, kind),
            namespace,
            name,
            invalid_status_patch(obj, message, now()),
            subresource="status",
        )
    except (ApiError, ValueError) as exc:
        logger.warning("%s %s/%s: cannot report %s: %s", kind, namespace, name, REASON, exc)


def schedule_report(obj: Mapping[str, Any], exc: ValidationError) -> bool:
    """Report `obj` as invalid once per generation; True when a report was scheduled."""
    meta = obj.get("metadata") or {}
    key = (str(meta.get("uid")), meta.get("generation"))
    if key in _REPORTED:
        return False
    _REPORTED.add(key)
    message = invalid_message(exc)
    logger.error("%s %s/%s: %s", obj.get("kind"), meta.get("namespace"), meta.get("name"), message)
    if already_said(obj, message):
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # outside the operator's loop (a unit test of a builder)
        return False
    task = loop.create_task(report_invalid(obj, message))
    _TASKS.add(task)  # keep a reference until it is done
    task.add_done_callback(_TASKS.discard)
    return True
