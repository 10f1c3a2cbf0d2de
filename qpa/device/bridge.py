"""`qpa device bridge`: one per device node (the DevicePool's DaemonSet), phones -> Leases + status.

Every `scan_seconds` the bridge:

1. makes sure the node's adb server runs (`AdbServerProcess`, over the node's `/dev/bus/usb`,
   on the pod's loopback only: other pods reach it through the adb gate, `qpa.device.proxy`,
   which admits only the pool's env servers) and `adb connect`s the network phones it was
   given (again after they drop off);
2. lists the attached phones (serial, adb state) and reads each new one's model and Android
   version (`getprop`); phones outside the pool's `selector` are left alone;
3. probes each phone every `healthCheck.intervalSeconds` (`qpa.device.health.probe`); after
   `failureThreshold` failed probes in a row the phone is **quarantined**, and it is
   **re-admitted** once a probe passes again and `quarantineSeconds` have gone by since;
4. publishes every phone as its Lease (`qpa.device.names`): creates it (owned by the
   DevicePool) or updates its annotations when something changed; a phone of this node that is
   no longer attached is `offline` (a quarantined one stays quarantined);
5. **reclaims** phones whose holder stopped renewing: resets the phone (force-stop and clear the
   holder's packages, home screen), clears the holder, makes it available;
6. merges this node's phones into `status.phones` of the DevicePool (status subresource, guarded
   by `resourceVersion`, retried on 409): other nodes' entries are kept as they are.

Writes happen only when something changed (state, reason, model, a probe's `last-seen`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from qpa.api import DevicePool
from qpa.api.v1alpha1 import DeviceFilter, DevicePoolSpec, Phone, WorkOrder
from qpa.device import names
from qpa.device.health import probe, reset_phone
from qpa.device.kube import Conflict, Kube, KubeError, NotFound
from qpa.device.leases import (
    clear_holder,
    expired_holder,
    held,
    holder_of,
    notes_of,
    set_annotations,
    state_of,
)
from qpa.envs.device.adb import AdbPhone, AdbServerClient, DeviceError

logger = logging.getLogger("qpa.device.bridge")
Clock = Callable[[], datetime]
STATUS_RETRIES = 5


def _now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- the adb server


class AdbServerProcess:
    """The node's adb server, started by the bridge when nothing answers on its port.

    It listens on 127.0.0.1 only (never `adb -a`: the server has no authentication); the
    RolloutPool's environment servers reach it through the bridge's adb gate. Restarted when
    it exits.
    """

    def __init__(self, port: int, *, adb: str | None = None) -> None:
        self.port = port
        self.adb = adb or shutil.which("adb") or "adb"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        # `tcp:PORT` is the loopback address only (this adb takes no host name in -L)
        return [self.adb, "-L", f"tcp:{self.port}", "server", "nodaemon"]

    def reachable(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
        ):
            return True
        return False

    def ensure(self, wait_s: float = 15.0) -> None:
        """Start the server unless one answers; raises DeviceError when it will not start."""
        if self.reachable():
            return
        if self.process is None or self.process.poll() is not None:
            logger.info("starting the adb server: %s", " ".join(self.command()))
            try:
                self.process = subprocess.Popen(
                    self.command(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            except OSError as exc:
                raise DeviceError(f"cannot start the adb server: {exc}", gone=True) from exc
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.reachable():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise DeviceError(f"the adb server did not listen on port {self.port}", gone=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None


# --------------------------------------------------------------------------- decisions


def matches(selector: DeviceFilter, serial: str, model: str, android: str) -> bool:
    """Whether a phone joins the pool under its `selector`."""
    if selector.serials and serial not in selector.serials:
        return False
    if selector.models and model not in selector.models:
        return False
    major = android.split(".", 1)[0]
    if selector.min_android_version is not None or selector.max_android_version is not None:
        if not major.isdigit():
            return False
        if selector.min_android_version is not None and int(major) < selector.min_android_version:
            return False
        if selector.max_android_version is not None and int(major) > selector.max_android_version:
            return False
    return True


@dataclass(frozen=True)
class Health:
    """What the bridge knows of a phone right now."""

    attached: bool  # listed by adb in state `device`
    failures: int  # failed probes in a row
    problems: tuple[str, ...] = ()
    adb_state: str = "device"


def next_state(
    lease: dict[str, Any] | None,
    health: Health,
    spec: DevicePoolSpec,
    now: datetime,
) -> tuple[str, str | None, datetime]:
    """(state, reason, since) of a phone's Lease after what the bridge saw.

    Quarantine outlives being unplugged; offline ends as soon as the phone is back and healthy;
    leasing stays with the holder (`leased` while held).
    """
    current = state_of(lease) if lease is not None else "available"
    notes = notes_of(lease) if lease is not None else {}
    since = names.parse_time(notes.get(names.SINCE_ANNOTATION)) or now
    reason = notes.get(names.REASON_ANNOTATION)
    in_use = lease is not None and held(lease, now)
    threshold = spec.health_check.failure_threshold
    if not health.attached:
        why = "not attached" if health.adb_state == "missing" else f"adb state {health.adb_state}"
        if current == "quarantined":
            return "quarantined", f"{reason or 'quarantined'}; {why}", since
        return "offline", why, since if current == "offline" else now
    if health.failures >= threshold:
        why = "; ".join(health.problems) or "health checks failed"
        return "quarantined", why, since if current == "quarantined" else now
    if current == "quarantined":
        waited = now - since >= timedelta(seconds=spec.health_check.quarantine_seconds)
        if health.failures == 0 and waited:
            return ("leased" if in_use else "available"), None, now
        return "quarantined", reason, since
    if current == "offline":
        return ("leased" if in_use else "available"), None, now
    if current == "leased" and holder_of(lease or {}) is None:
        return "available", None, now
    return current, None, since


def phone_entry(lease: dict[str, Any], now: datetime) -> Phone | None:
    """The `status.phones` entry a Lease stands for (as the operator computes it)."""
    notes = notes_of(lease)
    serial, node = notes.get(names.SERIAL_ANNOTATION), notes.get(names.NODE_ANNOTATION)
    if not serial or not node:
        return None
    state = state_of(lease)
    if state == "leased" and not held(lease, now):
        state = "available"
    return Phone(
        serial=serial,
        node=node,
        model=notes.get(names.MODEL_ANNOTATION) or None,
        android_version=notes.get(names.ANDROID_ANNOTATION) or None,
        state=state,
        leased_by=holder_of(lease) if state == "leased" else None,
        reason=notes.get(names.REASON_ANNOTATION) or None,
        last_seen=names.parse_time(notes.get(names.LAST_SEEN_ANNOTATION)),
    )


def merged_status(status: dict[str, Any], node: str, mine: Iterable[Phone]) -> dict[str, Any]:
    """`status.phones` with this node's entries replaced by `mine`, and the counts."""
    others = [
        p for p in status.get("phones") or [] if isinstance(p, dict) and p.get("node") != node
    ]
    mine_wire = [p.to_k8s() for p in mine]
    mine_serials = {p["serial"] for p in mine_wire}
    phones = sorted(
        [p for p in others if p.get("serial") not in mine_serials] + mine_wire,
        key=lambda p: str(p.get("serial")),
    )
    count = {s: sum(1 for p in phones if p.get("state") == s) for s in names.PHONE_STATES}
    return {
        "phones": phones,
        "total": len(phones),
        "available": count["available"],
        "leased": count["leased"],
        "quarantined": count["quarantined"],
    }


# --------------------------------------------------------------------------- the bridge


@dataclass
class BridgeSettings:
    pool: str
    node: str
    spec: DevicePoolSpec
    adb_host: str = "127.0.0.1"
    adb_port: int = 5037
    advertise: str | None = None  # HOST:PORT other pods reach this adb server at (the gate)
    gate: tuple[str, int] | None = None  # where the adb gate listens (the pod IP, adbPort)
    connect: tuple[str, ...] = ()  # network phones (`adb connect`)
    command_timeout: float | None = None  # defaults to healthCheck.timeoutSeconds
    namespace: str | None = None  # the pool's namespace (default: the client's)

    @classmethod
    def from_devicepool(
        cls, order: WorkOrder[DevicePool], *, node: str, pod_ip: str | None
    ) -> BridgeSettings:
        """A bridge pod's settings: the pool's spec and name from its work order, the node and
        the pod's address from the pod. The adb server listens on the pod's loopback at
        `adbPort`; the adb gate on `<pod IP>:adbPort` (what other pods dial, written into each
        phone Lease)."""
        spec = order.resource.spec
        return cls(
            pool=order.name,
            node=node,
            spec=spec,
            adb_port=spec.adb_port,
            # HOST:PORT split at the last colon, so an IPv6 pod IP needs no brackets
            advertise=f"{pod_ip}:{spec.adb_port}" if pod_ip else None,
            gate=(pod_ip, spec.adb_port) if pod_ip else None,
            namespace=order.resolved.namespace,
        )


@dataclass
class _Known:
    """What the bridge remembers about an attached phone between scans."""

    model: str
    android: str
    failures: int = 0
    problems: tuple[str, ...] = ()
    next_probe: float = 0.0
    last_ok: datetime | None = None


@dataclass
class ScanReport:
    """What one scan did (for logs and tests)."""

    attached: dict[str, str] = field(default_factory=dict)  # serial -> adb state
    phones: list[Phone] = field(default_factory=list)  # this node's phones as published
    writes: int = 0
    reclaimed: list[str] = field(default_factory=list)


class Bridge:
    """Discovers, probes and publishes one node's phones (see the module docstring)."""

    def __init__(
        self,
        settings: BridgeSettings,
        kube: Kube,
        *,
        adb: AdbServerClient | None = None,
        clock: Clock = _now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.adb = adb or AdbServerClient(settings.adb_host, settings.adb_port)
        self.clock = clock
        self.monotonic = monotonic
        self.known: dict[str, _Known] = {}
        self.timeout = float(settings.command_timeout or settings.spec.health_check.timeout_seconds)

    @property
    def spec(self) -> DevicePoolSpec:
        return self.settings.spec

    def _phone(self, serial: str) -> AdbPhone:
        return AdbPhone(serial, timeout=self.timeout, client=self.adb)

    # ------------------------------------------------------------------ discovery
    def discover(self) -> dict[str, str]:
        """serial -> adb state; network phones that dropped off are connected again."""
        try:
            states = self.adb.states()
        except DeviceError as exc:
            logger.warning("%s", exc)
            return {}
        retry = False
        for address in self.settings.connect:
            if states.get(address) != "device":
                try:
                    self.adb.connect_address(address, reconnect=address in states)
                    retry = True
                except DeviceError as exc:
                    logger.info("%s", exc)
        if retry:
            with contextlib.suppress(DeviceError):
                states = self.adb.states()
        return states

    def _identify(self, serial: str) -> _Known | None:
        known = self.known.get(serial)
        if known is not None:
            return known
        try:
            text = self._phone(serial).check(
                "getprop ro.product.model; getprop ro.build.version.release"
            )
        except DeviceError as exc:
            logger.info("cannot identify %s yet: %s", serial, exc)
            return None
        lines = [*text.splitlines(), "", ""]
        known = _Known(model=lines[0].strip(), android=lines[1].strip())
        self.known[serial] = known
        return known

    def _probe(self, serial: str, known: _Known) -> bool:
        """Probe when due; False when the phone turned out to be gone."""
        if self.monotonic() < known.next_probe:
            return True
        known.next_probe = self.monotonic() + self.spec.health_check.interval_seconds
        try:
            problems = probe(self._phone(serial), self.timeout)
        except DeviceError:
            return False
        known.problems = tuple(problems)
        known.failures = known.failures + 1 if problems else 0
        if not problems:
            known.last_ok = self.clock()
        return True

    # ------------------------------------------------------------------ one scan
    def scan(self) -> ScanReport:
        report = ScanReport(attached=self.discover())
        try:
            pool = self.kube.get_devicepool(self.settings.pool)
        except NotFound:
            logger.warning("DevicePool %s does not exist: nothing to publish", self.settings.pool)
            return report
        leases = {
            notes_of(lease).get(names.SERIAL_ANNOTATION, ""): lease
            for lease in self.kube.list_leases(names.pool_selector(self.settings.pool))
        }
        healths: dict[str, Health] = {}
        for serial, state in report.attached.items():
            if state != "device":
                continue
            known = self._identify(serial)
            if known is None or not matches(self.spec.selector, serial, known.model, known.android):
                continue
            if self._probe(serial, known):
                healths[serial] = Health(True, known.failures, known.problems)
            else:
                healths[serial] = Health(False, known.failures, (), "offline")
        for serial, lease in leases.items():
            node = notes_of(lease).get(names.NODE_ANNOTATION)
            if serial and serial not in healths and node == self.settings.node:
                self.known.pop(serial, None)  # re-identified when it comes back
                healths[serial] = Health(False, 0, (), report.attached.get(serial, "missing"))
        now = self.clock()
        for serial, health in sorted(healths.items()):
            published = self._publish(pool, serial, health, leases.get(serial), now, report)
            if published is not None and health.attached:
                published = self._reclaim(published, now, report)
            if published is not None:
                leases[serial] = published
        mine = [
            p
            for lease in leases.values()
            if notes_of(lease).get(names.NODE_ANNOTATION) == self.settings.node
            and (p := phone_entry(lease, now)) is not None
        ]
        report.phones = sorted(mine, key=lambda p: p.serial)
        self._update_status(report.phones, report)
        return report

    def _publish(
        self,
        pool: dict[str, Any],
        serial: str,
        health: Health,
        lease: dict[str, Any] | None,
        now: datetime,
        report: ScanReport,
    ) -> dict[str, Any] | None:
        state, reason, since = next_state(lease, health, self.spec, now)
        known = self.known.get(serial)
        wanted: dict[str, str | None] = {
            names.SERIAL_ANNOTATION: serial,
            names.NODE_ANNOTATION: self.settings.node,
            names.STATE_ANNOTATION: state,
            names.REASON_ANNOTATION: reason,
            names.SINCE_ANNOTATION: names.micro_time(since),
        }
        if self.settings.advertise:
            wanted[names.ADB_SERVER_ANNOTATION] = self.settings.advertise
        if known is not None:
            wanted[names.MODEL_ANNOTATION] = known.model or None
            wanted[names.ANDROID_ANNOTATION] = known.android or None
            if known.last_ok is not None:
                wanted[names.LAST_SEEN_ANNOTATION] = names.micro_time(known.last_ok)
        if lease is None:
            if not health.attached:
                return None
            body = self._new_lease(pool, serial)
            set_annotations(body, wanted)
            try:
                created = self.kube.create_lease(body)
            except Conflict:  # created meanwhile (another scan, a restart): next scan updates
                return None
            report.writes += 1
            return created
        current = notes_of(lease)
        if all(current.get(k) == v for k, v in wanted.items()):
            return lease
        set_annotations(lease, wanted)
        try:
            updated = self.kube.replace_lease(lease)
        except Conflict:  # a rollout took or gave back the phone: decide again next scan
            return None
        report.writes += 1
        return updated

    def _new_lease(self, pool: dict[str, Any], serial: str) -> dict[str, Any]:
        meta = pool.get("metadata") or {}
        owner = {
            "apiVersion": DevicePool.model_fields["api_version"].default,
            "kind": "DevicePool",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "controller": False,
            "blockOwnerDeletion": False,
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": names.lease_name(self.settings.pool, serial),
                "namespace": self.kube.namespace,
                "labels": {
                    names.POOL_LABEL: self.settings.pool,
                    names.PHONE_LABEL: names.phone_slug(serial),
                    names.PART_OF_LABEL: "qpa",
                },
                "ownerReferences": [owner] if meta.get("uid") else [],
            },
            "spec": {"leaseDurationSeconds": self.spec.lease_duration_seconds},
        }

    def _reclaim(
        self, lease: dict[str, Any], now: datetime, report: ScanReport
    ) -> dict[str, Any] | None:
        """Reset and free a phone whose holder's lease expired."""
        holder = expired_holder(lease, now)
        if holder is None:
            return lease
        serial = notes_of(lease)[names.SERIAL_ANNOTATION]
        packages = [p for p in notes_of(lease).get(names.PACKAGES_ANNOTATION, "").split(",") if p]
        try:
            reset_phone(self._phone(serial), packages, self.timeout)
        except DeviceError as exc:
            logger.warning("cannot reset %s after %s's lease expired: %s", serial, holder, exc)
            return lease
        clear_holder(lease)
        state = state_of(lease)
        set_annotations(
            lease,
            {
                names.STATE_ANNOTATION: "available" if state in ("leased", "available") else state,
                names.REASON_ANNOTATION: f"reset after the lease of {holder} expired",
                names.PACKAGES_ANNOTATION: None,
            },
        )
        try:
            updated = self.kube.replace_lease(lease)
        except Conflict:
            return None
        report.writes += 1
        report.reclaimed.append(serial)
        logger.info("reclaimed %s from %s (lease expired) and reset it", serial, holder)
        return updated

    def _update_status(self, mine: list[Phone], report: ScanReport) -> None:
        for _ in range(STATUS_RETRIES):
            pool = self.kube.get_devicepool(self.settings.pool)
            status = pool.get("status") or {}
            wanted = merged_status(status, self.settings.node, mine)
            if all(status.get(k) == v for k, v in wanted.items()):
                return
            patch = {
                "metadata": {"resourceVersion": pool["metadata"]["resourceVersion"]},
                "status": wanted,
            }
            try:
                self.kube.patch_devicepool_status(self.settings.pool, patch)
                report.writes += 1
                return
            except Conflict:
                continue
        logger.warning("DevicePool %s status: too many concurrent writers", self.settings.pool)

    # ------------------------------------------------------------------ loop
    def run(
        self,
        stop: threading.Event,
        scan_seconds: float = 5.0,
        server: AdbServerProcess | None = None,
    ) -> None:
        """Scan every `scan_seconds` until `stop` is set; errors are logged, never fatal."""
        while not stop.is_set():
            try:
                if server is not None:
                    server.ensure()
                report = self.scan()
                logger.info(
                    "scan: %d attached, %d published, %d writes",
                    len(report.attached),
                    len(report.phones),
                    report.writes,
                )
            except (KubeError, DeviceError) as exc:
                logger.warning("scan failed: %s", exc)
            stop.wait(scan_seconds)
