"""Where a device environment gets its phone: one named phone, or a claim on a pooled one.

`DeviceEnv` asks a `PhoneSource` for a `PhoneClaim` at its first reset and gives it back at
close. `FixedPhone` is a phone named by serial (`qpa run --env device --serial S`): no leasing,
the caller owns the phone. A pooled source (`qpa.device.leases.LeasedPhones`) takes one
`coordination.k8s.io/v1` Lease per phone and reports a lost lease through `lost()`; on release
it says whether the phone stayed healthy, so an unplugged phone is quarantined, not handed on.
"""

from __future__ import annotations

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


@dataclass
class _FixedClaim:
    address: PhoneAddress

    def lost(self) -> str | None:
        return None

    def record_packages(self, packages: Sequence[str]) -> None:
        return None

    def release(self, *, healthy: bool = True, reason: str = "") -> None:
        return None


class FixedPhone:
    """One phone named by serial on one adb server (`HOST:PORT`); nothing is leased."""

    def __init__(self, serial: str, adb: str = f"{DEFAULT_ADB_HOST}:{DEFAULT_ADB_PORT}") -> None:
        if not serial:
            raise ValueError("a fixed phone needs its adb serial")
        host, port = parse_address(adb)
        self.address = PhoneAddress(serial, host, port)

    def acquire(self, *, holder: str, packages: Sequence[str]) -> PhoneClaim:
        return _FixedClaim(self.address)
