"""The phone-Lease contract shared by the bridge, the leasing environments and the operator.

One `coordination.k8s.io/v1` Lease per phone, named `<pool>-<phone>`, labelled with the pool
and the phone, carrying what the bridge saw in annotations and the leasing rollout in
`spec.holderIdentity`. The operator (`qpa_operator.builders.devicepool`) defines the same
names; it may not import qpa's computing layers, so they are written twice and a unit test
keeps the two in step.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Final

POOL_LABEL: Final = "qpa.ai/devicepool"
PHONE_LABEL: Final = "qpa.ai/phone"
ROLLOUT_POOL_LABEL: Final = "qpa.ai/rolloutpool"
#: On a pool's env-server pods: the only pods the bridge's adb gate admits (`qpa.device.proxy`).
CLIENT_LABEL: Final = "qpa.ai/devicepool-client"
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"
SERIAL_ANNOTATION: Final = "qpa.ai/serial"
NODE_ANNOTATION: Final = "qpa.ai/node"
MODEL_ANNOTATION: Final = "qpa.ai/model"
ANDROID_ANNOTATION: Final = "qpa.ai/android-version"
STATE_ANNOTATION: Final = "qpa.ai/state"
REASON_ANNOTATION: Final = "qpa.ai/reason"
LAST_SEEN_ANNOTATION: Final = "qpa.ai/last-seen"
# Written by the bridge and the leasing environments only (the operator does not read them):
ADB_SERVER_ANNOTATION: Final = "qpa.ai/adb-server"  # HOST:PORT of the adb server with the phone
SINCE_ANNOTATION: Final = "qpa.ai/since"  # when the state last changed
PACKAGES_ANNOTATION: Final = "qpa.ai/packages"  # apps the holder's episodes use (to clear)
PHONE_STATES: Final = ("available", "leased", "quarantined", "offline")

_UNSAFE = re.compile(r"[^a-z0-9]+")
_MAX_NAME = 253
_MAX_LABEL = 63


def phone_slug(serial: str) -> str:
    """A DNS-label-safe form of an adb serial; a hash keeps rewritten serials distinct.

    `R5CT1` -> `r5ct1`; `127.0.0.1:5555` -> `127-0-0-1-5555-<hash>`.
    """
    lowered = serial.lower()
    slug = _UNSAFE.sub("-", lowered).strip("-") or "phone"
    if slug == lowered and len(slug) <= _MAX_LABEL:
        return slug
    digest = hashlib.sha256(serial.encode()).hexdigest()[:8]
    return f"{slug[: _MAX_LABEL - 9].rstrip('-')}-{digest}"


def lease_name(pool: str, serial: str) -> str:
    """The Lease of a pool's phone: `<pool>-<phone slug>`."""
    return f"{pool}-{phone_slug(serial)}"[:_MAX_NAME]


def pool_selector(pool: str) -> str:
    return f"{POOL_LABEL}={pool}"


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime (`2026-01-01T00:00:00.000000Z`)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
