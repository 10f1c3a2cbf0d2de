"""An ASGI app served by uvicorn in a background thread on 127.0.0.1, for tests.

`serve(app)` binds a free loopback port itself (no race between picking and binding), waits
until uvicorn has started, yields the base URL, and stops the server when the block ends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


def loopback_socket() -> socket.socket:
    """A socket bound to a free 127.0.0.1 port, for an app that must know its URL first."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serve(
    app: Any, config: uvicorn.Config | None = None, sock: socket.socket | None = None
) -> Iterator[str]:
    """Serve `app` (or `config`, whose app it is) until the block ends, on `sock` (default: a
    fresh `loopback_socket()`); yields its base URL."""
    sock = sock or loopback_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(config or uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
