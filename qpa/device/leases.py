"""Leasing pooled phones: one `coordination.k8s.io/v1` Lease per phone, one holder at a time.

The bridge creates each phone's Lease (`qpa.device.bridge`) and keeps its health in the
`qpa.ai/state` annotation. A rollout (an environment server session, or `qpa run`) takes a
phone through `LeasedPhones.acquire`:

- **acquire**: list the pool's Leases, pick one whose state is `available` and that has no
  holder, and write `spec.holderIdentity`, `acquireTime`, `renewTime`, `leaseTransitions + 1`,
  state `leased` (and `qpa.ai/rolloutpool` when the pod belongs to a RolloutPool) with the
  `resourceVersion` it read: of two rollouts racing for one phone, the API server lets one win
  (409 for the other, which tries the next phone, and waits up to `acquire_timeout`).
- **renew**: a daemon thread rewrites `renewTime` every third of `leaseDurationSeconds`. It
  notices a lost claim (the Lease gone, another holder, or the bridge quarantined the phone)
  and reports it through `lost()`; the environment then ends the episode as environment-side.
- **release**: clear the holder; state `available`, or `quarantined` with the reason when the
  episode lost the phone.
- **a lost holder** (its pod died) stops renewing; once `renewTime + leaseDurationSeconds` has
  passed, the bridge resets the phone (force-stop and clear the packages recorded in
  `qpa.ai/packages`, home screen) and only then makes it `available` again.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from qpa.device import names
from qpa.device.kube import Conflict, Kube, KubeError
from qpa.envs.device.adb import parse_address
from qpa.envs.device.source import PhoneAddress, PhoneClaim, PhoneUnavailable

logger = logging.getLogger("qpa.device.leases")
DEFAULT_ACQUIRE_TIMEOUT_S = 30.0
POLL_S = 0.5
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- lease fields


def notes_of(lease: dict[str, Any]) -> dict[str, str]:
    return dict((lease.get("metadata") or {}).get("annotations") or {})


def holder_of(lease: dict[str, Any]) -> str | None:
    return (lease.get("spec") or {}).get("holderIdentity") or None


def state_of(lease: dict[str, Any]) -> str:
    state = notes_of(lease).get(names.STATE_ANNOTATION, "available")
    return state if state in names.PHONE_STATES else "available"


def expires_at(lease: dict[str, Any]) -> datetime | None:
    spec = lease.get("spec") or {}
    renewed = names.parse_time(spec.get("renewTime")) or names.parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return None
    return renewed + timedelta(seconds=duration)


def held(lease: dict[str, Any], now: datetime) -> bool:
    """A holder is named and its lease has not expired."""
    if holder_of(lease) is None:
        return False
    end = expires_at(lease)
    return end is None or end >= now


def expired_holder(lease: dict[str, Any], now: datetime) -> str | None:
    """The holder whose lease ran out without a release (None when there is none)."""
    holder = holder_of(lease)
    end = expires_at(lease)
    return holder if holder is not None and end is not None and end < now else None


def set_annotations(lease: dict[str, Any], values: dict[str, str | None]) -> None:
    meta = lease.setdefault("metadata", {})
    notes = meta.setdefault("annotations", {})
    for key, value in values.items():
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value


def clear_holder(lease: dict[str, Any]) -> None:
    spec = lease.setdefault("spec", {})
    for key in ("holderIdentity", "acquireTime", "renewTime"):
        spec.pop(key, None)
    (lease.get("metadata") or {}).get("labels", {}).pop(names.ROLLOUT_POOL_LABEL, None)


# --------------------------------------------------------------------------- claims


class LeaseClaim:
    """A phone held through its Lease, renewed in a daemon thread until released."""

    def __init__(
        self,
        kube: Kube,
        lease: dict[str, Any],
        holder: str,
        address: PhoneAddress,
        *,
        clock: Clock = _now,
    ) -> None:
        self.kube = kube
        self.name = str(lease["metadata"]["name"])
        self.holder = holder
        self._address = address
        self._clock = clock
        self._lease = lease
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        duration = int((lease.get("spec") or {}).get("leaseDurationSeconds") or 300)
        self.renew_every = max(duration / 3.0, 0.2)
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease-{self.name}", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> PhoneAddress:
        return self._address

    def lost(self) -> str | None:
        return self._lost

    def _update(self, change: Callable[[dict[str, Any]], None]) -> bool:
        """Apply `change` to the Lease while we hold it (re-read on 409); False when lost."""
        for _ in range(5):
            lease = self.kube.get_lease(self.name)
            if lease is None:
                self._lost = f"lease {self.name} was deleted"
                return False
            if holder_of(lease) != self.holder:
                self._lost = f"lease {self.name} is now held by {holder_of(lease) or 'nobody'}"
                return False
            change(lease)
            try:
                self._lease = self.kube.replace_lease(lease)
                return True
            except Conflict:
                continue
        raise KubeError(f"lease {self.name}: too many concurrent updates")

    def renew(self) -> bool:
        """Renew once; False (and `lost()` says why) when the claim is gone."""
        with self._lock:
            if self._lost is not None:
                return False
            current = self.kube.get_lease(self.name)
            if current is not None and state_of(current) in ("quarantined", "offline"):
                reason = notes_of(current).get(names.REASON_ANNOTATION, "")
                self._lost = f"the bridge marked the phone {state_of(current)}: {reason}"
                return False

            def touch(lease: dict[str, Any]) -> None:
                lease["spec"]["renewTime"] = names.micro_time(self._clock())

            return self._update(touch)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                if not self.renew():
                    logger.warning("lost phone lease: %s", self._lost)
                    return
            except KubeError as exc:  # keep trying until the lease would expire
                logger.warning("renewing lease %s failed: %s", self.name, exc)

    def record_packages(self, packages: Sequence[str]) -> None:
        value = ",".join(packages)
        if notes_of(self._lease).get(names.PACKAGES_ANNOTATION) == value:
            return
        with self._lock:
            if self._lost is None:
                try:
                    self._update(
                        lambda lease: set_annotations(lease, {names.PACKAGES_ANNOTATION: value})
                    )
                except KubeError as exc:
                    logger.warning("recording packages on %s failed: %s", self.name, exc)

    def release(self, *, healthy: bool = True, reason: str = "") -> None:
        self._stop.set()
        with self._lock:
            if self._lost is not None:
                return
            now = names.micro_time(self._clock())

            def give_back(lease: dict[str, Any]) -> None:
                clear_holder(lease)
                if healthy:
                    state = {names.STATE_ANNOTATION: "available", names.REASON_ANNOTATION: None}
                else:
                    state = {
                        names.STATE_ANNOTATION: "quarantined",
                        names.REASON_ANNOTATION: reason or "released as unhealthy",
                        names.SINCE_ANNOTATION: now,
                    }
                set_annotations(lease, state)

            try:
                self._update(give_back)
            except KubeError as exc:  # it will expire, and the bridge reclaims it
                logger.warning("releasing lease %s failed: %s", self.name, exc)
            self._lost = "released"
        if self._thread is not threading.current_thread():
            self._thread.join(5)


class LeasedPhones:
    """A `PhoneSource` over a DevicePool's phone Leases."""

    def __init__(
        self,
        kube: Kube,
        pool: str,
        *,
        adb_fallback: str | None = None,
        rollout_pool: str | None = None,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT_S,
        serials: Sequence[str] = (),
        clock: Clock = _now,
    ) -> None:
        if adb_fallback:
            parse_address(adb_fallback)  # fail fast on a malformed address
        self.kube = kube
        self.pool = pool
        self.adb_fallback = adb_fallback
        self.rollout_pool = rollout_pool or os.environ.get("QPA_ROLLOUT_POOL") or None
        self.acquire_timeout = acquire_timeout
        self.serials = set(serials)
        self._clock = clock

    def _address(self, lease: dict[str, Any]) -> PhoneAddress | None:
        notes = notes_of(lease)
        serial = notes.get(names.SERIAL_ANNOTATION)
        server = notes.get(names.ADB_SERVER_ANNOTATION) or self.adb_fallback
        if not serial or not server:
            return None
        try:
            host, port = parse_address(server)
        except ValueError:
            return None
        return PhoneAddress(serial, host, port)

    def _take(
        self, lease: dict[str, Any], holder: str, packages: Sequence[str]
    ) -> dict[str, Any] | None:
        now = names.micro_time(self._clock())
        spec = lease.setdefault("spec", {})
        spec.update(
            holderIdentity=holder,
            acquireTime=now,
            renewTime=now,
            leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
        )
        spec.setdefault("leaseDurationSeconds", 300)
        set_annotations(
            lease,
            {
                names.STATE_ANNOTATION: "leased",
                names.REASON_ANNOTATION: None,
                names.PACKAGES_ANNOTATION: ",".join(packages),
            },
        )
        if self.rollout_pool:
            lease["metadata"].setdefault("labels", {})[names.ROLLOUT_POOL_LABEL] = self.rollout_pool
        try:
            return self.kube.replace_lease(lease)
        except Conflict:
            return None  # someone else took it (or the bridge wrote it) first

    def acquire(self, *, holder: str, packages: Sequence[str]) -> PhoneClaim:
        deadline = time.monotonic() + self.acquire_timeout
        while True:
            try:
                leases = self.kube.list_leases(names.pool_selector(self.pool))
            except KubeError as exc:
                raise PhoneUnavailable(f"DevicePool {self.pool}: {exc}") from exc
            free: list[tuple[dict[str, Any], PhoneAddress]] = []
            for lease in leases:
                address = self._address(lease)
                if (
                    address is not None
                    and state_of(lease) == "available"
                    and holder_of(lease) is None
                    and (not self.serials or address.serial in self.serials)
                ):
                    free.append((lease, address))
            random.shuffle(free)  # spread rollouts over phones, fewer collisions
            for lease, address in free:
                try:
                    taken = self._take(lease, holder, packages)
                except KubeError as exc:
                    raise PhoneUnavailable(f"DevicePool {self.pool}: {exc}") from exc
                if taken is not None:
                    logger.info("%s leased %s", holder, address.serial)
                    return LeaseClaim(self.kube, taken, holder, address, clock=self._clock)
            if time.monotonic() >= deadline:
                states = [f"{notes_of(x).get(names.SERIAL_ANNOTATION)}={state_of(x)}"
                          for x in leases]  # fmt: skip
                raise PhoneUnavailable(
                    f"no available phone in DevicePool {self.pool} after "
                    f"{self.acquire_timeout:g}s (phones: {', '.join(states) or 'none'})"
                )
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
