"""`McpConnection`: a synchronous handle on one MCP server, spoken to with the `mcp` SDK's `Client`.

The `Environment` protocol is synchronous; the SDK is async. A connection runs the SDK in an
anyio `BlockingPortal` (an event loop in a thread of its own) and enters the SDK's `Client` there
once, so its cancel scopes live in one task for the connection's whole life; every call from the
environment is one `portal.call`. Transports: a URL is the streamable HTTP transport, a command
is the stdio transport (the SDK starts the server as a subprocess and owns it).

Anything the transport raises (refused connection, a subprocess that died, a timeout) becomes
`McpUnavailable` naming the server: the environment turns it into `environment_failure`
feedback, never an exception out of `step`.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Self

import anyio
import mcp_types as types
from anyio.from_thread import BlockingPortal
from mcp import Client, MCPError, StdioServerParameters
from pydantic import BaseModel, ConfigDict, Field, model_validator

#: JSON-RPC codes the SDK raises itself when the server never answers (not the server's errors).
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001

__all__ = ["McpConnection", "McpServerSpec", "McpUnavailable"]


class McpUnavailable(Exception):
    """The MCP server cannot be reached (or went away); the message names it and the cause."""


class McpServerSpec(BaseModel):
    """Where the MCP server is: a streamable HTTP `url`, or a stdio `command` (argv) to start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(default=None, min_length=1, description="Streamable HTTP endpoint.")
    command: list[str] | None = Field(
        default=None, min_length=1, description="stdio: the server's argv (started per env)."
    )
    env: dict[str, str] | None = Field(default=None, description="stdio: the subprocess env.")
    cwd: str | None = Field(default=None, description="stdio: the subprocess directory.")
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds one request may take.")

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.url is None) == (self.command is None):
            raise ValueError(
                "url: give the server's url (streamable HTTP) or its command (stdio), one of them"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url: {self.url!r} is not an http(s) URL")
        return self

    def describe(self) -> str:
        """The server as messages name it."""
        if self.url is not None:
            return self.url
        assert self.command is not None
        return "stdio:" + " ".join(self.command)

    def target(self) -> str | StdioServerParameters:
        """What the SDK's `Client` connects to."""
        if self.url is not None:
            return self.url
        assert self.command is not None
        return StdioServerParameters(
            command=self.command[0], args=self.command[1:], env=self.env, cwd=self.cwd
        )


class McpConnection:
    """One open MCP client session; call `close()` (or use `with`) to end it."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal | None = None
        self._client: Client | None = None
        _OPEN.add(self)
        try:
            self._portal = self._stack.enter_context(_daemon_portal())
            client = Client(spec.target(), read_timeout_seconds=spec.timeout_s, cache=None)
            self._client = self._stack.enter_context(
                self._portal.wrap_async_context_manager(client)
            )
        except Exception as exc:
            self._close_quietly()
            raise McpUnavailable(
                f"MCP server {spec.describe()}: cannot connect: {_why(exc)}"
            ) from exc

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def open(self) -> bool:
        return self._client is not None

    @property
    def server_name(self) -> str:
        """The name the server gave for itself (empty when it gave none)."""
        client = self._live()
        info = client.server_info
        return info.name if info is not None else ""

    @property
    def instructions(self) -> str | None:
        return self._live().instructions

    def list_tools(self) -> list[types.Tool]:
        """Every tool the server lists (all pages), fresh from the server."""
        client = self._live()
        portal = self._portal
        assert portal is not None

        async def walk() -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            for _ in range(1000):
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

        with self._translated("tools/list"):
            return portal.call(walk)
        raise AssertionError("unreachable")  # pragma: no cover

    def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call `name`; protocol errors (`MCPError`) pass through, transport failures become
        `McpUnavailable`."""
        client = self._live()
        portal = self._portal
        assert portal is not None

        async def call() -> types.CallToolResult:
            return await client.call_tool(name, arguments)

        with self._translated(f"tools/call {name}"):
            return portal.call(call)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """End the session (and the stdio subprocess); safe to call twice."""
        self._close_quietly()

    # ------------------------------------------------------------------ internals
    def _live(self) -> Client:
        if self._client is None:
            raise McpUnavailable(f"MCP server {self.spec.describe()}: the connection is closed")
        return self._client

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except MCPError as exc:
            if exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise  # the server answered: a protocol error, the caller's to read
            self._close_quietly()
            raise McpUnavailable(
                f"MCP server {self.spec.describe()}: {what} failed, the server is gone or "
                f"unreachable: {exc.message}"
            ) from exc
        except Exception as exc:
            self._close_quietly()
            raise McpUnavailable(
                f"MCP server {self.spec.describe()}: {what} failed, the server is gone or "
                f"unreachable: {_why(exc)}"
            ) from exc

    def _close_quietly(self) -> None:
        _OPEN.discard(self)
        self._client = None
        stack, self._stack = self._stack, contextlib.ExitStack()
        # A session whose server died may fail on the way out: it is closed either way.
        with contextlib.suppress(Exception):
            stack.close()
        self._portal = None


#: Connections not closed yet: closed at exit while their event loops still run (a stdio
#: server subprocess is then ended by its SDK transport, not orphaned).
_OPEN: weakref.WeakSet[McpConnection] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for connection in list(_OPEN):
        connection.close()


@contextlib.contextmanager
def _daemon_portal() -> Iterator[BlockingPortal]:
    """A blocking portal whose event loop runs in a daemon thread: a connection nobody closed
    never keeps the interpreter from exiting (anyio's own portal thread is joined at exit)."""
    handed: queue.Queue[BlockingPortal | BaseException] = queue.Queue()

    async def host() -> None:
        try:
            async with BlockingPortal() as portal:
                handed.put(portal)
                await portal.sleep_until_stopped()
        except BaseException as exc:  # pragma: no cover - the loop failed to start
            handed.put(exc)

    thread = threading.Thread(target=anyio.run, args=(host,), name="qpa-mcp-client", daemon=True)
    thread.start()
    got = handed.get()
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        # at interpreter teardown the loop can no longer answer: leave it to die with the process
        if not sys.is_finalizing():
            with contextlib.suppress(Exception):
                got.call(got.stop)
            thread.join(timeout=10)


def _why(exc: BaseException) -> str:
    """The innermost useful cause (anyio wraps transport failures in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text
