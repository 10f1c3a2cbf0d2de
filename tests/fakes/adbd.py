"""A test phone on the wire: an asyncio adbd speaking the ADB protocol, and a real adb server.

No phone can be attached here and no device-side adbd exists on PyPI, so `FakeAdbd` plays the
phone's end of a TCP transport (what `adb connect HOST:PORT` reaches on a real phone with
wireless debugging): 24-byte message headers (`CNXN`, `OPEN`, `OKAY`, `WRTE`, `CLSE`; no `AUTH`,
the phone trusts every host), one stream per `OPEN` with `WRTE`/`OKAY` flow control, and the
services `shell:CMD` (v1: raw output), `shell,v2,...:CMD` (the shell protocol's stdout/stderr/exit
packets; advertised as the `shell_v2` feature) and `exec:CMD`. Commands run against a
`tests.fakes.phone.Phone` in a worker thread, so a hung command never stalls other streams.

`unplug()` stops listening and drops every connection (a cable pulled mid-episode); `replug()`
listens again on the same port. The real adb server (Debian's `adb`) is what qpa talks to:

- `adb_server` fixture: `adb -L tcp:127.0.0.1:PORT server nodaemon` on a free port with a
  temporary `$HOME` (so it never touches `~/.android`), stopped after the test;
- `adbd` fixture: a fresh `FakeAdbd` (its `phone` is the model tests inspect and change);
- `adb_phone` fixture: both, connected (`adb connect 127.0.0.1:PORT`) and listed as `device`.

Register with `pytest_plugins = ["fakes.adbd"]` in tests/conftest.py. The `adb` binary must be
installed (`.ci/run` and `make test` install Debian's package).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fakes.phone import Phone, Shell

__all__ = [
    "AdbPhone",
    "AdbServer",
    "FakeAdbd",
    "adb_phone",
    "adb_server",
    "adbd",
    "free_port",
]

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_AUTH = 0x48545541
VERSION = 0x01000001  # skips checksums on both sides
MAX_PAYLOAD = 256 * 1024
FEATURES = ("shell_v2", "cmd", "stat_v2", "ls_v2", "fixed_push_mkdir", "apex")
# shell protocol v2 packet ids
SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT = 1, 2, 3
_HEADER = struct.Struct("<6I")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _message(command: int, arg0: int, arg1: int, data: bytes = b"") -> bytes:
    checksum = sum(data) & 0xFFFFFFFF
    return _HEADER.pack(command, arg0, arg1, len(data), checksum, command ^ 0xFFFFFFFF) + data


def _shell_packet(kind: int, data: bytes) -> bytes:
    return struct.pack("<BI", kind, len(data)) + data


# --------------------------------------------------------------------------- the adbd


class _Stream:
    """One service stream: our id, the server's id, and the ack of our last WRTE."""

    def __init__(self, local: int, remote: int) -> None:
        self.local = local
        self.remote = remote
        self.acked = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class _Transport:
    """One TCP connection from an adb server."""

    def __init__(
        self, adbd: FakeAdbd, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.adbd = adbd
        self.reader = reader
        self.writer = writer
        self.max_payload = MAX_PAYLOAD
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        if not self.writer.is_closing():
            self.writer.write(_message(command, arg0, arg1, data))

    async def serve(self) -> None:
        try:
            while True:
                header = await self.reader.readexactly(_HEADER.size)
                command, arg0, arg1, length, _check, magic = _HEADER.unpack(header)
                if magic != command ^ 0xFFFFFFFF or length > MAX_PAYLOAD * 4:
                    return  # garbage on the wire: drop the connection, as adbd does
                data = await self.reader.readexactly(length) if length else b""
                self.handle(command, arg0, arg1, data)
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            for stream in list(self.streams.values()):
                if stream.task is not None:
                    stream.task.cancel()
            self.streams.clear()
            self.writer.close()

    def handle(self, command: int, arg0: int, arg1: int, data: bytes) -> None:
        if command == A_CNXN:
            self.max_payload = max(4096, min(arg1, MAX_PAYLOAD))
            self.send(A_CNXN, VERSION, MAX_PAYLOAD, self.adbd.banner())
        elif command == A_OPEN:
            service = data.rstrip(b"\x00").decode("utf-8", "replace")
            local = self.next_id
            self.next_id += 1
            runner = self.adbd.service(service)
            if runner is None:
                self.send(A_CLSE, 0, arg0)  # refused
                return
            stream = _Stream(local, arg0)
            self.streams[local] = stream
            self.send(A_OKAY, local, arg0)
            stream.task = asyncio.create_task(self.run(stream, runner))
        elif command == A_OKAY:
            stream = self.streams.get(arg1)
            if stream is not None:
                stream.acked.set()
        elif command == A_WRTE:
            # stdin (or the shell protocol's close-stdin packet): acknowledged, not used
            if arg1 in self.streams:
                self.send(A_OKAY, arg1, arg0)
        elif command == A_CLSE:
            stream = self.streams.pop(arg1, None)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
        # A_AUTH / A_SYNC / anything else: ignored (this phone never asks for AUTH)

    async def run(self, stream: _Stream, runner: Any) -> None:
        try:
            payload: bytes = await runner()
            for start in range(0, len(payload), self.max_payload):
                stream.acked.clear()
                self.send(
                    A_WRTE, stream.local, stream.remote, payload[start : start + self.max_payload]
                )
                await self.writer.drain()
                await stream.acked.wait()
            self.send(A_CLSE, stream.local, stream.remote)
            await self.writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            self.streams.pop(stream.local, None)


class FakeAdbd:
    """A simulated phone's adbd on 127.0.0.1, in its own thread and event loop."""

    def __init__(self, phone: Phone | None = None, port: int | None = None) -> None:
        self.phone = phone or Phone()
        self.shell = Shell(self.phone)
        self.port = port or free_port()
        self.opened: list[str] = []  # every service opened, in order
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._transports: set[_Transport] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def banner(self) -> bytes:
        props = self.phone.properties
        fields = [
            f"ro.product.name={props['ro.product.name']}",
            f"ro.product.model={props['ro.product.model']}",
            f"ro.product.device={props['ro.product.device']}",
            f"features={','.join(FEATURES)}",
        ]
        return ("device::" + ";".join(fields) + ";").encode()

    def service(self, name: str) -> Any:
        """A coroutine function answering the service, or None when it is refused."""
        self.opened.append(name)
        kind, _, command = name.partition(":")
        options = kind.split(",")
        if options[0] not in ("shell", "exec") or not command:
            return None
        v2 = options[0] == "shell" and "v2" in options[1:]

        async def answer() -> bytes:
            out, err, code = await asyncio.to_thread(self.shell.run, command)
            if v2:
                parts = [_shell_packet(SHELL_STDOUT, out)] if out else []
                if err:
                    parts.append(_shell_packet(SHELL_STDERR, err))
                parts.append(_shell_packet(SHELL_EXIT, bytes([code & 0xFF])))
                return b"".join(parts)
            return out if options[0] == "exec" else out + err

        return answer

    # -------------------------------------------------------------- lifecycle
    def start(self) -> FakeAdbd:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"adbd-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(10)
        self.replug()
        return self

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> None:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            if sock is not None:  # one small message per round trip: never wait for Nagle
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport = _Transport(self, reader, writer)
            self._transports.add(transport)
            try:
                await transport.serve()
            finally:
                self._transports.discard(transport)

        self._server = await asyncio.start_server(
            accept, "127.0.0.1", self.port, reuse_address=True
        )

    async def _drop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for transport in list(self._transports):
            transport.writer.transport.abort()
        await asyncio.sleep(0)

    def replug(self) -> None:
        """Listen (again) on the same port."""
        if self._server is None:
            self._call(self._listen())

    def unplug(self) -> None:
        """Stop listening and drop every connection, as when the cable is pulled."""
        self._call(self._drop())

    @property
    def plugged(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        if self._loop is None:
            return
        self.unplug()
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeAdbd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- the adb server


def find_adb() -> str:
    path = shutil.which("adb")
    if path is None:
        raise RuntimeError(
            "the `adb` binary is not installed: `apt-get install adb` (.ci/run and the "
            "Makefile's dev install do it)"
        )
    return path


class AdbServer:
    """The real adb server on 127.0.0.1:PORT, with a private $HOME (its keys live there)."""

    def __init__(self, port: int | None = None, home: Path | None = None) -> None:
        self.adb = find_adb()
        self.port = port or free_port()
        self._tmp = None if home else tempfile.TemporaryDirectory(prefix="qpa-adb-")
        self.home = home or Path(self._tmp.name)  # type: ignore[union-attr]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID_", "ADB_"))}
        env.update(HOME=str(self.home), ANDROID_ADB_SERVER_PORT=str(self.port))
        return env

    def start(self) -> AdbServer:
        self.process = subprocess.Popen(
            [self.adb, "-L", f"tcp:{self.port}", "server", "nodaemon"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.home / "adb-server.log").open("wb"),
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.home / "adb-server.log").read_text(errors="replace")
                raise RuntimeError(f"adb server exited with {self.process.returncode}: {log}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return self
            time.sleep(0.02)
        raise RuntimeError("the adb server did not listen within 20 s")

    def command(self, *args: str, timeout: float = 20) -> str:
        """Run the adb client against this server; its stdout (stderr appended)."""
        result = subprocess.run(
            [self.adb, "-L", f"tcp:{self.port}", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return result.stdout + result.stderr

    def devices(self) -> dict[str, str]:
        """serial -> state, as `adb devices` lists them."""
        lines = self.command("devices").splitlines()[1:]
        return dict(line.split("\t", 1) for line in lines if "\t" in line)

    def connect(self, adbd: FakeAdbd, timeout: float = 10) -> str:
        """`adb connect` the phone and wait until it is listed as `device`; its serial."""
        deadline = time.monotonic() + timeout
        while True:
            self.command("connect", adbd.address)
            if self.devices().get(adbd.address) == "device":
                return adbd.address
            if time.monotonic() > deadline:
                raise RuntimeError(f"{adbd.address} not listed as a device: {self.devices()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> AdbServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class AdbPhone:
    """A fake phone connected to a real adb server: what a test drives through adb."""

    server: AdbServer
    adbd: FakeAdbd

    @property
    def serial(self) -> str:
        return self.adbd.address

    @property
    def phone(self) -> Phone:
        return self.adbd.phone

    @property
    def adb_address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def adb_server() -> Iterator[AdbServer]:
    """A real adb server on a free 127.0.0.1 port with a temporary $HOME."""
    with AdbServer() as server:
        yield server


@pytest.fixture
def adbd() -> Iterator[FakeAdbd]:
    """A simulated phone's adbd on a free 127.0.0.1 port (not yet connected to a server)."""
    with FakeAdbd() as daemon:
        yield daemon


@pytest.fixture
def adb_phone(adb_server: AdbServer, adbd: FakeAdbd) -> AdbPhone:
    """The simulated phone, `adb connect`ed to the real adb server and listed as `device`."""
    adb_server.connect(adbd)
    return AdbPhone(adb_server, adbd)
