"""One phone's shell through an adb server (adbutils), with failures sorted into two kinds.

`AdbPhone(serial, host, port).shell(command)` runs a command over the shell protocol v2 (exit
status, stdout and stderr apart) and returns a `ShellOutput`. Whatever goes wrong on the way
raises `DeviceError`, with `gone=True` when the phone or the adb server is not there any more
(unplugged, offline, unauthorized, the server refuses connections) and `gone=False` when it is
there but did not answer in time. Callers turn both into `environment_failure` feedback.

adbutils starts an adb server of its own (`adb start-server`, on the default port) when it cannot
reach one; `AdbServerClient` never does: a missing server is a failure to report, not something
to paper over on another port. It also asks the server's version once per client instead of
before every command. `$QPA_ADB_SOURCE_ADDRESS` (set on a device RolloutPool's pods to their pod
IP) is the local address connections leave from: the DevicePool bridge's adb gate admits peers
by pod IP.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import adbutils
from adbutils._adb import AdbConnection  # the connection class adbutils builds on
from adbutils.errors import AdbConnectionError, AdbError, AdbTimeout

DEFAULT_ADB_HOST = "127.0.0.1"
DEFAULT_ADB_PORT = 5037
DEFAULT_TIMEOUT_S = 20.0
SOURCE_ADDRESS_ENV = "QPA_ADB_SOURCE_ADDRESS"
_GONE_MARKERS = ("not found", "offline", "unauthorized", "no devices", "closed", "broken pipe")


class DeviceError(Exception):
    """A phone or its adb server failed; `gone` when it is not there at all."""

    def __init__(self, message: str, *, gone: bool) -> None:
        super().__init__(message)
        self.gone = gone


@dataclass(frozen=True)
class ShellOutput:
    """What one shell command printed and its exit status."""

    stdout: bytes
    stderr: bytes
    code: int

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


def parse_address(address: str, *, default_port: int = DEFAULT_ADB_PORT) -> tuple[str, int]:
    """`host:port` (or `host`) of an adb server; ValueError naming the address when malformed."""
    host, sep, port = address.strip().rpartition(":")
    if not sep:
        host, port = address.strip(), str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"adb server address {address!r} must be HOST:PORT")
    return host, int(port)


class _NoSpawnConnection(AdbConnection):
    """An adb server connection that fails instead of starting a server."""

    source: str | None = None
    target: tuple[str, int] = (DEFAULT_ADB_HOST, DEFAULT_ADB_PORT)

    def __init__(self, host: str, port: int, source: str | None = None) -> None:
        self.source, self.target = source, (host, port)
        super().__init__(host, port)

    def _safe_connect(self) -> Any:
        if not self.source:
            return self._create_socket()
        try:
            sock = socket.create_connection(self.target, timeout=3, source_address=(self.source, 0))
        except TimeoutError:
            raise AdbTimeout("connect to adb server timeout") from None
        except OSError as exc:
            raise AdbConnectionError(f"connect to adb server failed: {exc}") from exc
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(None)
        return sock


class AdbServerClient(adbutils.AdbClient):
    """An adbutils client for one adb server that it never starts itself."""

    def __init__(
        self,
        host: str = DEFAULT_ADB_HOST,
        port: int = DEFAULT_ADB_PORT,
        timeout: float = 10.0,
        *,
        source: str | None = None,
    ) -> None:
        super().__init__(host=host, port=port, socket_timeout=timeout)
        self._timeout = timeout
        self._version: int | None = None
        self.source = source if source is not None else os.environ.get(SOURCE_ADDRESS_ENV) or None

    def make_connection(self, timeout: float | None = None) -> AdbConnection:
        try:
            connection = _NoSpawnConnection(self.host, self.port, self.source)
        except TimeoutError:
            raise AdbTimeout("connect to adb server timeout") from None
        connection.conn.settimeout(timeout or self._timeout)
        return connection

    def server_version(self) -> int:
        if self._version is None:
            self._version = int(super().server_version())
        return self._version

    def states(self) -> dict[str, str]:
        """serial -> state (`device`, `offline`, `unauthorized`, ...) of every attached phone."""
        try:
            return {info.serial: info.state for info in self.list()}
        except (AdbError, OSError) as exc:
            raise DeviceError(f"adb server {self.host}:{self.port}: {exc}", gone=True) from exc

    def connect_address(self, address: str, *, reconnect: bool = False) -> str:
        """`adb connect` a network phone (`reconnect` first drops a stale transport)."""
        try:
            if reconnect:
                self.disconnect(address)
            return str(self.connect(address, timeout=10))
        except (AdbError, OSError) as exc:
            raise DeviceError(f"adb connect {address}: {exc}", gone=True) from exc


def classify(exc: BaseException, where: str) -> DeviceError:
    """The `DeviceError` an adbutils/socket exception means."""
    if isinstance(exc, DeviceError):
        return exc
    if isinstance(exc, AdbTimeout | socket.timeout | TimeoutError):
        return DeviceError(f"{where}: timed out ({exc})", gone=False)
    if isinstance(exc, AdbConnectionError | ConnectionError | EOFError):
        return DeviceError(f"{where}: connection lost ({exc})", gone=True)
    text = str(exc).lower()
    gone = isinstance(exc, OSError) or any(marker in text for marker in _GONE_MARKERS)
    return DeviceError(f"{where}: {exc}", gone=gone)


class AdbPhone:
    """One phone (by adb serial) on one adb server."""

    def __init__(
        self,
        serial: str,
        host: str = DEFAULT_ADB_HOST,
        port: int = DEFAULT_ADB_PORT,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        client: AdbServerClient | None = None,
    ) -> None:
        if not serial:
            raise ValueError("a phone needs its adb serial")
        self.serial = serial
        self.timeout = timeout
        self.client = client or AdbServerClient(host, port)
        self._device = self.client.device(serial)

    @property
    def server(self) -> str:
        return f"{self.client.host}:{self.client.port}"

    def shell(self, command: str, *, timeout: float | None = None) -> ShellOutput:
        """Run `command` (an `sh -c` line) on the phone; raises `DeviceError`."""
        try:
            result = self._device.shell2(
                command, timeout=timeout or self.timeout, encoding=None, v2=True
            )
        except Exception as exc:  # adbutils raises many types; all mean the same to callers
            raise classify(exc, f"{self.serial} via {self.server}") from exc
        return ShellOutput(bytes(result.stdout), bytes(result.stderr), int(result.returncode))

    def check(self, command: str, *, timeout: float | None = None) -> str:
        """stdout of a command that must succeed; raises `DeviceError` on a non-zero status."""
        out = self.shell(command, timeout=timeout)
        if out.code != 0:
            detail = out.error_text or out.text.strip() or f"exit status {out.code}"
            raise DeviceError(f"{self.serial}: `{command}` failed: {detail}", gone=False)
        return out.text

    def state(self) -> str:
        """The phone's adb state, or `missing` when the server does not list it."""
        return self.client.states().get(self.serial, "missing")
