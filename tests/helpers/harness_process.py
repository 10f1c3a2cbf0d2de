"""`qpa harness serve` as a real process for tests: started, waited for until ready, stopped.

`serving(argv, port)` runs the command (its stdout and stderr together), polls
`/v2/health/ready` on 127.0.0.1:`port` for up to a minute, fails with the process's output
when it exits or never gets ready, yields the base URL, and terminates it when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence

import httpx


@contextlib.contextmanager
def serving(argv: Sequence[str], port: int, env: Mapping[str, str] | None = None) -> Iterator[str]:
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            proc.kill()
            raise AssertionError(proc.stdout.read().decode() if proc.stdout else "no output")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
