"""Where a device environment gets its phone: one named phone, or a claim on a pooled one.

`DeviceEnv` asks a `PhoneSource` for a `PhoneClaim` at its first reset and gives it back at
close. `FixedPhone` is a phone named by serial (`qpa run --env device --serial S`): no leasing,
the caller owns the phone. A pooled source (`qpa.device.leases.LeasedPhones`) takes one
`coordination.k8s.io/v1` Lease per phone and reports a lost lease through `lost()`; on release
it says whether the phone stayed healthy, so an unplugged phone is quarantined, not handed on.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from qpa.envs.device.adb import DEFAULT_ADB_HOST, DEFAULT_ADB_PORT, parse_address


class PhoneUnavailable(Exception):
    """No phone could be had (none free, none matching, the pool unreachable)."""


@dataclass(frozen=True)
class PhoneAddress:
    """A phone's adb serial and the adb server it is attached to."""

    serial: str
    host: str = DEFAULT_ADB_HOST
    port: int = DEFAULT_ADB_PORT


@runtime_checkable
class PhoneClaim(Protocol):
    """The right to use one phone until `release`."""

    @property
    def address(self) -> PhoneAddress: ...

    def lost(self) -> str | None:
        """Why the claim is no longer held (lease lost, phone quarantined); None while held."""
        ...

    def record_packages(self, packages: Sequence[str]) -> None:
        """The apps the episode now uses (what to clear should the holder be lost)."""
        ...

    def release(self, *, healthy: bool = True, reason: str = "") -> None:
        """Give the phone back; `healthy=False` quarantines it with `reason`."""
        ...


@runtime_checkable
class PhoneSource(Protocol):
    """Hands out phones, one claim per environment."""

    def acquire(self, *, holder: str, packages: Sequence[str]) -> PhoneClaim:
        """A phone for `holder`, whose episodes use `packages`; raises `PhoneUnavailable`."""
        ...


class _FixedClaim:
    def __init__(self, owner: FixedPhone, holder: str) -> None:
        self._owner = owner
        self.holder = holder

    @property
    def address(self) -> PhoneAddress:
        return self._owner.address

    def lost(self) -> str | None:
        return None

    def record_packages(self, packages: Sequence[str]) -> None:
        return None

    def release(self, *, healthy: bool = True, reason: str = "") -> None:
        self._owner._give_back(self)


class FixedPhone:
    """One phone named by serial on one adb server (`HOST:PORT`); one claim at a time.

    Nothing is written anywhere: the caller owns the phone. A second `acquire` before the
    first claim is released raises `PhoneUnavailable` (two episodes never share a phone).
    """

    def __init__(self, serial: str, adb: str = f"{DEFAULT_ADB_HOST}:{DEFAULT_ADB_PORT}") -> None:
        if not serial:
            raise ValueError("a fixed phone needs its adb serial")
        host, port = parse_address(adb)
        self.address = PhoneAddress(serial, host, port)
        self._lock = threading.Lock()
        self._claim: _FixedClaim | None = None

    def acquire(self, *, holder: str, packages: Sequence[str]) -> PhoneClaim:
        with self._lock:
            if self._claim is not None:
                raise PhoneUnavailable(
                    f"phone {self.address.serial} is in use by {self._claim.holder}"
                )
            self._claim = _FixedClaim(self, holder)
            return self._claim

    def _give_back(self, claim: _FixedClaim) -> None:
        with self._lock:
            if self._claim is claim:
                self._claim = None
