"""The bridge's adb gate: a TCP proxy that admits only its pool's environment servers.

The node's adb server has no authentication: whoever reaches its port drives every phone. So
the bridge runs it on the pod's loopback only and listens on `<pod IP>:adbPort` itself
(`AdbGate`): a connection is forwarded to the adb server only when the peer's address is the
IP of a running pod labelled `qpa.ai/devicepool-client=<pool>` in the pool's namespace (the env
servers of RolloutPools whose `devicePoolRef` names the pool), as the bridge lists them through
its Role (`AllowedPeers`). Anything else is closed before a byte reaches adb. The
NetworkPolicy `<pool>-bridge-ingress` says the same to the CNI; this gate holds without one.

The allowlist is refreshed at most every `min_refresh_s` when an unknown peer knocks (so a new
env pod is admitted at once) and at least every `max_age_s` (so a deleted pod's address stops
being admitted soon after); a failed listing keeps the last list and admits nobody new.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from qpa.device import names

logger = logging.getLogger("qpa.device.proxy")
BUFFER = 65536


def client_selector(pool: str) -> str:
    """The label selector of the pods allowed to reach `pool`'s adb servers."""
    return f"{names.CLIENT_LABEL}={pool}"


def _normal(address: str) -> str:
    """One spelling per address (`::ffff:10.0.0.1` is 10.0.0.1)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def pod_addresses(pods: Iterable[dict[str, Any]]) -> set[str]:
    """IPs of the running, not terminating pods among `pods` (every `status.podIPs` entry)."""
    found: set[str] = set()
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        ips = [entry.get("ip") for entry in status.get("podIPs") or []] + [status.get("podIP")]
        found |= {_normal(str(ip)) for ip in ips if ip}
    return found


class AllowedPeers:
    """The addresses the gate admits, from `fetch` (the client pods' IPs), cached."""

    def __init__(
        self,
        fetch: Callable[[], set[str]],
        *,
        min_refresh_s: float = 1.0,
        max_age_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.min_refresh_s = min_refresh_s
        self.max_age_s = max_age_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._addresses: set[str] = set()
        self._fetched_at: float | None = None

    def _refresh(self) -> None:
        self._fetched_at = self._monotonic()
        try:
            self._addresses = {_normal(a) for a in self._fetch()}
        except Exception as exc:  # the API may be away: keep what was admitted, add nobody
            logger.warning("cannot list the pool's env-server pods: %s", exc)

    def allows(self, address: str) -> bool:
        peer = _normal(address)
        with self._lock:
            now = self._monotonic()
            age = None if self._fetched_at is None else now - self._fetched_at
            stale = age is None or age >= self.max_age_s
            unknown = peer not in self._addresses and (age is None or age >= self.min_refresh_s)
            if stale or unknown:
                self._refresh()
            return peer in self._addresses


class AdbGate:
    """Listens on `listen` and pipes admitted connections to the adb server at `upstream`."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        allowed: AllowedPeers,
        *,
        connect_timeout: float = 5.0,
    ) -> None:
        self.upstream = upstream
        self.allowed = allowed
        self.connect_timeout = connect_timeout
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self._server = socket.socket(family, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(listen)
        self._server.listen(64)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self.refused = 0
        self.admitted = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AdbGate:
        self._thread = threading.Thread(target=self._accept_loop, name="adb-gate", daemon=True)
        self._thread.start()
        logger.info("adb gate on %s:%d -> %s:%d", *self.address, *self.upstream)
        return self

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> AdbGate:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, peer = self._server.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(client, str(peer[0])), name="adb-gate-conn", daemon=True
            ).start()

    def _serve(self, client: socket.socket, peer: str) -> None:
        with client:
            if not self.allowed.allows(peer):
                self.refused += 1
                logger.warning("refused adb from %s: not an env server of the pool", peer)
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=self.connect_timeout)
            except OSError as exc:
                logger.warning("adb server %s:%d unreachable: %s", *self.upstream, exc)
                return
            self.admitted += 1
            with upstream:
                upstream.settimeout(None)
                back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                back.start()
                _pipe(client, upstream)
                back.join()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy until `src` ends, then end `dst`'s sending side."""
    with contextlib.suppress(OSError):
        while data := src.recv(BUFFER):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
