"""`RemoteEnv`: the `Environment` protocol over HTTP, against `qpa env serve`.

A rollout holding a `RemoteEnv` cannot tell it from the local environment: the feedback of a
step is the same JSON the environment produced in the server, parsed into the same `Feedback`.

- One keep-alive `httpx.Client` per instance (or a shared one passed in), one server session per
  instance. The session id is chosen here (`secrets.token_urlsafe(32)`: the id is the session's
  only key, so it must be unguessable), so `reset` is idempotent and safe to retry.
- A server with a tokens file needs `token` (default: the `QPA_ENV_TOKEN` variable), sent as
  `Authorization: Bearer <token>`.
- For plain-HTTP URLs the client's transport is `KeepAliveTransport`, an httpx transport on the
  standard library's `http.client`: the same requests and responses at about twice the rate of
  httpx's default transport (whose HTTP/1.1 state machine and pool cost ~200 us a request),
  which is what keeps a rollout's per-step overhead small. `https://` URLs use httpx's own.
- Idempotent calls (reset, verify, tools, state, close) retry connection errors and 5xx answers
  with exponential backoff (tenacity). A step is never retried blindly: it carries `seq`, the
  number of steps already applied since reset, and the server answers a duplicate from its
  record instead of applying it twice; so only transport failures are retried, and a 5xx on a
  step is reported, not repeated. The happy path makes exactly one request and no retry set-up.
- A session lives in one pod of a pool: the server's reset answer names the pod and its own
  URL, and every later call of the session (step, verify, tools, state, close) goes to that URL
  with `qpa-session-pod: <pod>`, never through the pool's load-balanced Service (`url`), so a
  reconnect, a mesh or a scale-down cannot land it on another pod. A reset goes to the session's
  pod too; if that pod is gone or draining (503 `draining`) the reset starts over through `url`.
  `follow_pod=False` keeps every call on `url` (a client outside the cluster, port-forwarded).
- What the server refuses becomes error `Feedback` where the protocol has room for it (reset and
  step: an action the contract rejects, a lost or expired session, a server bug); an unreachable
  server, and errors of `verify`/`tools`/`state`, raise `RemoteEnvError`.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import select
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Any, Literal, Protocol

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidState, ProtocolError
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from qpa.contract import Action, EnvKind, Feedback, Task, ToolSpec, Verification

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 3
TOKEN_ENV = "QPA_ENV_TOKEN"
SESSION_POD_HEADER = "qpa-session-pod"  # qpa.envs.server's (the client never imports it)
DRAIN_KEY_HEADER = "qpa-drain-key"
_NAMES = ("reset", "step", "verify", "state", "tools", "health")
CHANNEL_PATH = "/channel"  # qpa.envs.server's session channel and its subprotocol
CHANNEL_SUBPROTOCOL = "qpa.env.v1"
_PING_CHECK_S = 5.0  # idle longer than this: read pending pings before the next request
Channel = Literal["auto", "http", "websocket"]
_NO_EPISODE = "no episode: call reset(task) first"  # the sandbox's own words


class RemoteEnvError(RuntimeError):
    """The environment server could not be reached, or refused a call outside an episode."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        kind: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.field = field


class _Answered(Protocol):
    """What the client reads of an answer: an `httpx.Response` or a session channel reply."""

    @property
    def status_code(self) -> int: ...
    @property
    def content(self) -> bytes: ...
    @property
    def text(self) -> str: ...


class _RetryableStatus(Exception):
    def __init__(self, response: _Answered) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    feedback: Feedback
    session_id: str | None = None
    pod: str | None = None
    url: str | None = None


class _ToolsReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tools: list[ToolSpec]


def _server_error(response: _Answered) -> tuple[str, str, str | None]:
    """(kind, message, field) of a server error answer, whatever its body looks like."""
    try:
        error = orjson.loads(response.content)["error"]
        return str(error["kind"]), str(error["message"]), error.get("field")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        text = response.text[:300]
        return "http_error", f"HTTP {response.status_code}: {text}", None


class KeepAliveTransport(httpx.BaseTransport):
    """Plain HTTP/1.1 with keep-alive on `http.client`: one connection per thread and host.

    Failures surface as httpx's own exceptions (`ConnectError`, `ReadTimeout`, ...), so callers
    and retry policies cannot tell this transport from httpx's default one.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self, request: httpx.Request) -> http.client.HTTPConnection:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"{url.scheme}: only http", request=request)
        pool: dict[tuple[str, int], http.client.HTTPConnection] | None = getattr(
            self._local, "pool", None
        )
        if pool is None:
            pool = self._local.pool = {}
        key = (url.host, url.port or 80)
        connection = pool.get(key)
        if connection is None:
            connection = http.client.HTTPConnection(key[0], key[1], timeout=self.timeout)
            pool[key] = connection
            with self._lock:
                self._opened.append(connection)
        if connection.sock is None:
            try:
                connection.connect()
            except TimeoutError as exc:
                connection.close()
                raise httpx.ConnectTimeout(str(exc), request=request) from exc
            except OSError as exc:
                connection.close()
                raise httpx.ConnectError(str(exc), request=request) from exc
        return connection

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        connection = self._connection(request)
        try:
            connection.request(
                request.method,
                request.url.raw_path.decode("ascii"),
                body=request.content,
                headers=dict(request.headers),
            )
            answer = connection.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            connection.close()
            raise httpx.ReadTimeout(str(exc), request=request) from exc
        except (OSError, http.client.HTTPException) as exc:
            # Includes a keep-alive connection the server closed: reconnects on the next call.
            connection.close()
            raise httpx.RemoteProtocolError(
                f"{type(exc).__name__}: {exc}", request=request
            ) from exc
        if answer.will_close:
            connection.close()
        return httpx.Response(
            answer.status, headers=answer.getheaders(), content=content, request=request
        )

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for connection in opened:
            connection.close()


class _Answer:
    """A reply of the session channel, shaped as the parts of `httpx.Response` used here."""

    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class ChannelRefused(Exception):
    """The server does not offer the session channel (it answered the upgrade over HTTP)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.answer = _Answer(status, body)


class SessionChannel:
    """A client of the server's session channel (`WS /channel`, subprotocol `qpa.env.v1`).

    A blocking WebSocket on one socket, driven through the `websockets` package's Sans-I/O
    protocol (handshake, framing, masking, pings, close): `call(op, body)` sends one request
    frame and reads frames until its reply; pings that arrived meanwhile are answered. No
    background thread: a call costs a `sendall` and a `recv`. Transport failures raise httpx's
    own exceptions (`ConnectError`, `ReadTimeout`, `RemoteProtocolError`), so the retry policy
    of `RemoteEnv` treats them as it treats HTTP's; after one the channel is closed, and the
    next call reconnects. `connect` raises `ChannelRefused` when the server answers the upgrade
    with an HTTP status instead (no channel there, or a refusal such as 401).
    """

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        url = httpx.URL(base_url)
        scheme = "wss" if url.scheme == "https" else "ws"
        path = url.raw_path.decode("ascii").rstrip("/") + CHANNEL_PATH
        self.uri = parse_uri(f"{scheme}://{url.netloc.decode('ascii')}{path}")
        self.headers = {k: v for k, v in headers.items() if k not in ("content-type", "accept")}
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._protocol: ClientProtocol | None = None
        self._idle_since = 0.0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the socket and upgrade it (ChannelRefused when the server will not)."""
        self.close()
        request = self._request()
        uri = self.uri
        try:
            sock = socket.create_connection((uri.host, uri.port), timeout=self.timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc), request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if uri.secure:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=uri.host)
            protocol = ClientProtocol(
                uri, subprotocols=[Subprotocol(CHANNEL_SUBPROTOCOL)], max_size=None
            )
            handshake = protocol.connect()
            for name, value in self.headers.items():
                handshake.headers[name] = value
            protocol.send_request(handshake)
            sock.sendall(b"".join(protocol.data_to_send()))
            response = None
            while response is None:
                data = sock.recv(65536)
                if data:
                    protocol.receive_data(data)
                else:
                    protocol.receive_eof()
                for event in protocol.events_received():
                    if isinstance(event, Response):
                        response = event
                if response is None and not data:
                    raise httpx.RemoteProtocolError(
                        "the server closed the connection during the upgrade", request=request
                    )
        except ssl.SSLError as exc:
            sock.close()
            raise httpx.ConnectError(str(exc), request=request) from exc
        except TimeoutError as exc:
            sock.close()
            raise httpx.ReadTimeout(str(exc), request=request) from exc
        except OSError as exc:
            sock.close()
            raise httpx.RemoteProtocolError(
                f"{type(exc).__name__}: {exc}", request=request
            ) from exc
        except BaseException:
            sock.close()
            raise
        if response.status_code != 101 or protocol.handshake_exc is not None:
            sock.close()
            raise ChannelRefused(response.status_code, bytes(response.body or b""))
        self._sock, self._protocol = sock, protocol
        self._idle_since = time.monotonic()

    def call(self, op: bytes, body: bytes) -> _Answer:
        """One request on the channel and its reply (connecting first when needed)."""
        if self._sock is None:
            self.connect()
        sock, protocol = self._sock, self._protocol
        assert sock is not None and protocol is not None
        try:
            if time.monotonic() - self._idle_since > _PING_CHECK_S:
                self._pending(sock, protocol)  # answer pings that came while we were idle
            protocol.send_binary(op + b" " + body)
            sock.sendall(b"".join(protocol.data_to_send()))
            reply = self._reply(sock, protocol)
        except TimeoutError as exc:
            self.close()
            raise httpx.ReadTimeout(str(exc), request=self._request()) from exc
        except (OSError, ProtocolError, InvalidState, _Closed) as exc:
            self.close()
            raise httpx.RemoteProtocolError(
                f"session channel: {type(exc).__name__}: {exc}", request=self._request()
            ) from exc
        self._idle_since = time.monotonic()
        status, _, content = reply.partition(b" ")
        try:
            return _Answer(int(status), content)
        except ValueError:
            self.close()
            raise httpx.RemoteProtocolError(
                f"session channel: malformed reply {reply[:60]!r}", request=self._request()
            ) from None

    def _request(self) -> httpx.Request:
        """The request httpx's exceptions name (built only when one is raised)."""
        scheme = "https" if self.uri.secure else "http"
        return httpx.Request("GET", f"{scheme}://{self.uri.host}:{self.uri.port}{CHANNEL_PATH}")

    def _reply(self, sock: socket.socket, protocol: ClientProtocol) -> bytes:
        parts: list[bytes] = []
        while True:
            for frame in protocol.events_received():
                if not isinstance(frame, Frame):
                    continue
                if frame.opcode in (Opcode.BINARY, Opcode.TEXT) or (
                    frame.opcode is Opcode.CONT and parts
                ):
                    parts.append(bytes(frame.data))
                    if frame.fin:
                        outgoing = protocol.data_to_send()  # pongs queued by the protocol
                        if outgoing:
                            sock.sendall(b"".join(outgoing))
                        return parts[0] if len(parts) == 1 else b"".join(parts)
                elif frame.opcode is Opcode.CLOSE:
                    raise _Closed(f"closed by the server ({protocol.close_code})")
            outgoing = protocol.data_to_send()
            if outgoing:
                sock.sendall(b"".join(outgoing))
            data = sock.recv(65536)
            if not data:
                protocol.receive_eof()
                raise _Closed("the server closed the connection")
            protocol.receive_data(data)

    @staticmethod
    def _pending(sock: socket.socket, protocol: ClientProtocol) -> None:
        """Read what arrived while idle (pings: answered; a close: raises)."""
        while select.select([sock], [], [], 0)[0]:
            data = sock.recv(65536)
            if not data:
                raise _Closed("the server closed the idle connection")
            protocol.receive_data(data)
            for frame in protocol.events_received():
                if isinstance(frame, Frame) and frame.opcode is Opcode.CLOSE:
                    raise _Closed(f"closed by the server ({protocol.close_code})")
            outgoing = protocol.data_to_send()
            if outgoing:
                sock.sendall(b"".join(outgoing))

    def close(self) -> None:
        """Close the connection (with a close frame when it is still open)."""
        sock, protocol = self._sock, self._protocol
        self._sock = self._protocol = None
        if sock is None:
            return
        with contextlib.suppress(Exception):
            if protocol is not None and protocol.state is State.OPEN:
                protocol.send_close(1000)
                sock.sendall(b"".join(protocol.data_to_send()))
        with contextlib.suppress(OSError):
            sock.close()


class _Closed(Exception):
    pass


class RemoteEnv:
    """An environment served by `qpa env serve` at `url` (e.g. `http://127.0.0.1:8000`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = 0.1,
        session_id: str | None = None,
        client: httpx.Client | None = None,
        kind: EnvKind | None = None,
        token: str | None = None,
        follow_pod: bool = True,
        channel: Channel = "auto",
    ) -> None:
        if channel not in ("auto", "http", "websocket"):
            raise ValueError(f"channel: {channel!r} is not one of 'auto', 'http', 'websocket'")
        self.url = url.rstrip("/")
        self.follow_pod = follow_pod
        self.pod: str | None = None  # the pod holding the session (from the reset answer)
        self.pod_url: str | None = None
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.session_id = session_id or secrets.token_urlsafe(32)
        # The hot path hands requests straight to the keep-alive transport: `Client.send` adds
        # auth, redirect, cookie and event-hook machinery (~80 us a call) this client never uses.
        self._owns_client = client is None
        self._transport: httpx.BaseTransport | None = None
        if client is None:
            self._transport = (
                KeepAliveTransport(timeout)
                if httpx.URL(self.url).scheme == "http"
                else httpx.HTTPTransport()
            )
            client = httpx.Client(timeout=timeout, transport=self._transport)
        self._client = client
        self._timeout_s = timeout
        self._timeout = {"timeout": httpx.Timeout(timeout).as_dict()}
        # The session channel: "auto" uses it when the server offers it (and this client owns
        # its transport: a client passed in decides how requests travel).
        self.channel: Channel = channel
        if channel == "auto" and not self._owns_client:
            self.channel = "http"
        self._ws: SessionChannel | None = None
        self._ws_lock = threading.Lock()
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        headers = {"content-type": "application/json", "accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._base_headers = headers
        self._headers = httpx.Headers(headers)
        self._urls: dict[str, httpx.URL] = {}
        self._session_url = httpx.URL(self.url)
        self._route(None, None)
        self._sid_json = orjson.dumps(self.session_id)
        self._session_body = b'{"session_id":' + self._sid_json + b"}"
        self._kind: EnvKind | None = kind
        self._active = False  # an episode is running in the server session
        self._created = False  # the server session exists (close() deletes it)
        self._lost: str | None = None  # why the session vanished mid-episode
        self._seq = 0
        self._tools: list[ToolSpec] | None = None

    def _route(self, pod: str | None, pod_url: str | None) -> None:
        """Send the session's calls to `pod_url` (its pod), or to the pool's `url` (None)."""
        if (pod, pod_url) == (self.pod, self.pod_url) and self._urls:
            return
        self.pod, self.pod_url = pod, pod_url
        base = pod_url or self.url
        self._urls = {name: httpx.URL(f"{base}/{name}") for name in _NAMES}
        self._session_url = httpx.URL(f"{base}/sessions/{self.session_id}")
        headers = dict(self._base_headers)
        if pod is not None:
            headers[SESSION_POD_HEADER] = pod
        self._headers = httpx.Headers(headers)
        ws: SessionChannel | None = getattr(self, "_ws", None)
        if ws is not None:  # the channel reconnects to the new address (naming the pod)
            ws.close()
            self._ws = None

    @property
    def transport(self) -> str:
        """How the requests travel now: `websocket` (the session channel) or `http`."""
        return "websocket" if self._ws is not None else "http"

    def _follow(self, reply: _Reply) -> None:
        """Pin the session to the pod the reset answer named (same scheme as the pool's)."""
        if not self.follow_pod or not reply.pod or not reply.url:
            return
        target = reply.url.rstrip("/")
        if httpx.URL(target).scheme != httpx.URL(self.url).scheme:
            return  # never downgrade https, nor send a token somewhere unexpected
        self._route(reply.pod, target)

    # ------------------------------------------------------------------ protocol
    @property
    def kind(self) -> EnvKind:
        """The served environment's kind (asked of the server once)."""
        if self._kind is None:
            self._kind = self.health()["kind"]
        return self._kind

    @kind.setter
    def kind(self, value: EnvKind) -> None:
        self._kind = value

    def reset(self, task: Task) -> Feedback:
        body = (
            b'{"session_id":'
            + self._sid_json
            + b',"task":'
            + task.__pydantic_serializer__.to_json(task)
            + b"}"
        )
        self._active = False
        self._lost = None
        self._tools = None
        self._seq = 0
        response = self._reset_request(body)
        if response.status_code == 200:
            reply = self._parse(response)
            self._follow(reply)
            self._active = self._created = True
            return reply.feedback
        kind, message, _ = _server_error(response)
        if response.status_code in (429, 503):
            return Feedback.fail("transient", f"server busy ({kind}): {message}")
        return Feedback.fail("environment_failure", f"reset refused ({kind}): {message}")

    def _reset_request(self, body: bytes) -> _Answered:
        """Reset on the session's pod; when it is gone or draining, start over via the pool."""
        if self.pod_url is None:
            return self._call("reset", body)
        try:
            response: _Answered | None = self._call("reset", body)
        except RemoteEnvError:
            response = None
        if response is not None and response.status_code not in (404, 503):
            return response
        if response is not None and response.status_code == 503:
            # draining or full: free the old episode's slot there (a drain waits for it)
            with contextlib.suppress(RemoteEnvError):
                self._call("delete")
        self._route(None, None)  # its pod is gone, draining or no longer knows it
        return self._call("reset", body)

    def step(self, action: Action) -> Feedback:
        if not self._active:
            return Feedback.fail("precondition_failed", _NO_EPISODE)
        body = (
            b'{"session_id":'
            + self._sid_json
            + b',"seq":'
            + str(self._seq).encode()
            + b',"action":'
            + action.__pydantic_serializer__.to_json(action, warnings=False)
            + b"}"
        )
        # Safe to retry on transport errors only: the server de-duplicates by seq.
        response = self._call("step", body, retry_status=False)
        status = response.status_code
        if status == 200:
            self._seq += 1
            return self._parse(response).feedback
        kind, message, _ = _server_error(response)
        if status in (413, 422):  # the action itself was refused; nothing was applied
            return Feedback.fail("invalid_arguments", f"action refused ({kind}): {message}")
        if status in (404, 409):  # the session is gone or out of step: the episode is over
            if status == 404:
                self._active = self._created = False
                self._route(None, None)
            self._lost = f"{kind}: {message}"
            return Feedback.fail("environment_failure", self._lost, done=True)
        return Feedback.fail("environment_failure", f"server error ({kind}): {message}")

    def verify(self) -> Verification:
        if self._lost is not None:  # the episode cannot be judged: say so, environment-side
            raise RemoteEnvError(f"episode lost on the server: {self._lost}", kind="session_lost")
        if not self._active:
            return Verification(done=False, success=False, progress=0.0)
        response = self._checked("verify")
        try:
            return Verification.model_validate_json(response.content)
        except ValidationError as exc:
            raise RemoteEnvError(f"verify: unreadable answer: {exc}") from None

    def tools(self) -> list[ToolSpec]:
        if not self._active:
            return []
        if self._tools is None:
            response = self._checked("tools")
            try:
                self._tools = _ToolsReply.model_validate_json(response.content).tools
            except ValidationError as exc:
                raise RemoteEnvError(f"tools: unreadable answer: {exc}") from None
        return list(self._tools)

    def close(self) -> None:
        """Delete the server session (best effort) and close an owned HTTP client."""
        try:
            if self._created:
                self._active = self._created = False
                # When the server is gone, its session expires there.
                with contextlib.suppress(RemoteEnvError):
                    self._call("delete")
                self._route(None, None)
        finally:
            if self._ws is not None:
                self._ws.close()
            if self._owns_client:
                self._client.close()

    # ------------------------------------------------------------------ extras
    def state(self) -> dict[str, Any]:
        """The server's detached snapshot of this session's environment state."""
        if not self._active:
            return {}
        response = self._checked("state")
        data = orjson.loads(response.content).get("state")
        return data if isinstance(data, dict) else {}

    def health(self) -> dict[str, Any]:
        response = self._checked("health")
        data: dict[str, Any] = orjson.loads(response.content)
        return data

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ transport
    def _query_url(self, name: str) -> httpx.URL:
        return self._urls[name].copy_merge_params({"session_id": self.session_id})

    def _parse(self, response: _Answered) -> _Reply:
        try:
            return _Reply.model_validate_json(response.content)
        except ValidationError as exc:
            raise RemoteEnvError(f"unreadable answer from {self.url}: {exc}") from None

    def _send(self, method: str, url: httpx.URL, content: bytes | None) -> httpx.Response:
        request = httpx.Request(
            method, url, content=content, headers=self._headers, extensions=self._timeout
        )
        if self._transport is None:
            return self._client.send(request)
        response = self._transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response

    def _http(self, op: str, body: bytes) -> tuple[str, httpx.URL, bytes | None]:
        """The HTTP request of a channel operation: method, URL and body."""
        if op in ("reset", "step", "verify"):
            return "POST", self._urls[op], body
        if op in ("tools", "state"):
            return "GET", self._query_url(op), None
        if op == "delete":
            return "DELETE", self._session_url, None
        return "GET", self._urls[op], None

    def _channel(self) -> SessionChannel | None:
        """The session channel, opened on first use when the server offers it (else None)."""
        if self.channel == "http":
            return None
        if self._ws is None:
            channel = SessionChannel(self.pod_url or self.url, dict(self._headers), self._timeout_s)
            try:
                channel.connect()
            except ChannelRefused as refused:
                if self.channel == "websocket":
                    kind, message, _ = _server_error(refused.answer)
                    raise RemoteEnvError(
                        f"the server refused the session channel: {kind}: {message}",
                        status=refused.answer.status_code,
                        kind=kind,
                    ) from None
                self.channel = "http"  # the server does not offer it: HTTP from now on
                return None
            self._ws = channel
        return self._ws

    def _attempt(self, op: str, body: bytes, retry_status: bool) -> _Answered:
        channel = self._channel()
        response: _Answered
        if channel is not None:
            with self._ws_lock:
                response = channel.call(op.encode(), body)
        else:
            response = self._send(*self._http(op, body))
        if retry_status and response.status_code >= 500:
            raise _RetryableStatus(response)
        return response

    def _call(self, op: str, body: bytes | None = None, *, retry_status: bool = True) -> _Answered:
        """One request; on a transport error (and on 5xx when `retry_status`) retry with backoff.

        Returns the last answer (maybe a 5xx); raises `RemoteEnvError` when no answer came.
        """
        if body is None:
            body = self._session_body if op != "health" else b"{}"
        try:
            return self._attempt(op, body, retry_status)  # the fast path
        except (httpx.TransportError, _RetryableStatus) as exc:
            failure: Exception = exc
        if self.retries:
            retrying = Retrying(
                stop=stop_after_attempt(self.retries),
                wait=wait_exponential(multiplier=self.backoff_s, max=2.0),
                retry=retry_if_exception_type((httpx.TransportError, _RetryableStatus)),
                reraise=True,
            )
            try:
                for attempt in retrying:
                    with attempt:
                        return self._attempt(op, body, retry_status)
            except (httpx.TransportError, _RetryableStatus) as exc:
                failure = exc
        if isinstance(failure, _RetryableStatus):
            return failure.response
        method, url, _ = self._http(op, body)
        raise RemoteEnvError(
            f"{method} {url}: {type(failure).__name__}: {failure} "
            f"(after {self.retries + 1} attempts)"
        ) from failure

    def _checked(self, op: str) -> _Answered:
        response = self._call(op)
        if response.status_code != 200:
            kind, message, field = _server_error(response)
            if response.status_code == 404:
                self._active = self._created = False
                self._route(None, None)
            method, url, _ = self._http(op, b"")
            raise RemoteEnvError(
                f"{method} {url.path}: {kind}: {message}",
                status=response.status_code,
                kind=kind,
                field=field,
            )
        return response


def drain(url: str, key: str, timeout_s: float, *, slack_s: float = 10.0) -> dict[str, Any]:
    """Ask the server at `url` to drain (`POST /drain`): no new episodes, then wait up to
    `timeout_s` for the live ones. Returns its answer; raises `RemoteEnvError` when refused."""
    try:
        response = httpx.post(
            f"{url.rstrip('/')}/drain",
            content=orjson.dumps({"timeout_s": timeout_s}),
            headers={"content-type": "application/json", DRAIN_KEY_HEADER: key},
            timeout=timeout_s + slack_s,
        )
    except httpx.TransportError as exc:
        raise RemoteEnvError(f"POST {url}/drain: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        kind, message, field = _server_error(response)
        raise RemoteEnvError(
            f"POST /drain: {kind}: {message}", status=response.status_code, kind=kind, field=field
        )
    answer: dict[str, Any] = orjson.loads(response.content)
    return answer
