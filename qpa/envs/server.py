"""The environment server behind `qpa env serve`: many concurrent episodes over HTTP + JSON.

OpenEnv-style endpoints, one environment per session id, so one server holds many episodes:

    POST   /reset      {task, session_id?}        -> {session_id, feedback}
    POST   /step       {session_id, action, seq?} -> {feedback}
    POST   /verify     {session_id}               -> Verification
    GET    /state?session_id=ID                   -> {session_id, task_id, steps, finished, state}
    GET    /tools?session_id=ID                   -> {tools: [ToolSpec]}
    DELETE /sessions/ID                           -> {deleted}
    GET    /health                                -> {status, kind, sessions, max_sessions, ...}
    GET    /ready                                 -> 200, or 503 while draining (readiness)
    GET    /metrics                               -> Prometheus text (sessions in use, capacity)
    POST   /drain      {timeout_s}                -> {drained, live, pod, waited_s}

Errors of the *request* (it cannot be understood, or names no live session) answer a JSON body
`{"error": {"kind", "message", "field"?}}` with a matching HTTP status: 400 malformed JSON,
401 missing or unknown bearer token (when tokens are configured), 408 a request not received
within the read timeout, 413 body too large, 404 unknown, expired or evicted session (or
another client's: exactly as an unknown one, on reset too), 409 out-of-order step, 422 a task or
action that breaks the contract (the field path is named; so is a non-finite number, `NaN`,
`Infinity` or a literal overflowing a double, anywhere in a body: JSON has none, though
Python's parsers accept them), 429 a client at its own session limit whose sessions are all
busy, 503 when live sessions hold every slot. 429 and 503 carry `Retry-After` (and
`retry_after_s` in the body, for the session channel).
Errors of the *episode* (unknown tool, bad tool arguments, actions after finish) are ordinary
200 `Feedback` with `status="error"`, exactly as the environment returns them in-process, so a
rollout cannot tell a local environment from a remote one. A bug anywhere answers 500 JSON and
the server keeps serving.

Sessions are bearer capabilities: a session is reachable only with its id, and ids are
unguessable (`secrets.token_urlsafe(32)`, 256 random bits; a client that chooses its own id on
reset, which makes reset idempotent and safe to retry, must give at least 32 URL-safe
characters). Nothing lists sessions. With a tokens file (`qpa.envs.tokens`) every request but
`/health` needs `Authorization: Bearer <token>`, and a session belongs to the client that created
it: another client's requests do not find it. Each session has a lock, so concurrent requests
to one session run one at a time while different sessions proceed independently. `seq` (the
number of steps the client has already applied since reset) makes a retried step safe: the
server replays the answer of a duplicate instead of applying it twice. Idle sessions expire
after `session_ttl_s`.

Abandoned sessions cannot lock anyone out, not even their own client. A client (its token's
identity, else its peer address) holds at most `max_sessions_per_client` sessions; at that
limit its new session takes the slot of its own least recently used session that no request
is using (its own idle sessions go first, oldest first), else 429. When every slot is taken, a
new session takes, in this order, the slot of: the client's own least recently used session
idle for `evict_idle_s`; anyone's; for a client holding less than its fair share
(`max_sessions` over the clients holding sessions, itself included), the least recently used
session not busy of the client holding the most; the client's own least recently used session
not busy. Only then 503: live sessions hold the capacity, `Retry-After` says when the least
recently used one will have been idle `evict_idle_s`. Both refusals are counted
(`qpa_env_sessions_refused_total{reason="client_busy"|"full"}`). A session busy with a request
is never evicted. An evicted session's id answers 404 `session_evicted` (to its own client;
another client's expired or evicted session is `unknown_session`).

A session lives in one pod's memory, so it is addressed to its pod. A server that knows its
pod (`PodIdentity`: the pod name and the pod's own base URL, from the downward API variables
`QPA_POD_NAME` and `QPA_ENV_ADVERTISE_URL` that a RolloutPool's pods get) answers a reset with
`pod` and `url` besides the session id; `RemoteEnv` then sends every later request of the
session to that URL, not to the pool's load-balanced Service, with the header
`qpa-session-pod: <pod>`. A request for a session this pod does not hold that names another
pod answers 404 `session_on_other_pod`, naming the owner; any unknown session names this pod.

Draining (a pod's preStop hook, `qpa env drain`): `POST /drain` with the drain key (the
random key `serve` writes to `drain_key_file`, readable only inside the pod) stops new
episodes (503 `draining`, so the client starts over on another pod; `/ready` answers 503 too)
and answers once no episode is live (a session reset and not yet done, idle less than the
session TTL) or after `timeout_s`. Steps, verify and close of live episodes keep working.
`/metrics` exports `qpa_env_sessions_in_use` (slots taken), `qpa_env_sessions_capacity`,
`qpa_env_sessions_live`, `qpa_env_draining`, `qpa_env_session_evictions_total` and
`qpa_env_sessions_refused_total`: what a
HorizontalPodAutoscaler scales a pool on (through a metrics adapter).

Slow clients are cut off: `serve` runs uvicorn with `TimedHttpToolsProtocol`, which closes a
connection (after a 408 when nothing was answered yet) whose request line, headers and body have
not all arrived `read_timeout_s` after the connection opened or the request began (half-sent
requests, slowloris). uvicorn's own `timeout_keep_alive` only covers the time between requests.

The hot path is kept lean: raw body -> pydantic `model_validate_json` (Rust) -> environment ->
pre-serialized JSON bytes. Environments whose calls are fast and CPU-bound (the sandbox) run
inline on the event loop; other kinds run in the thread pool so slow calls never stall the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import os
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Any, TypeVar

import orjson
import pydantic_core
from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qpa.contract import (
    Action,
    Delegate,
    Environment,
    Feedback,
    Finish,
    MessageUser,
    Task,
    ToolCall,
    UIAction,
)
from qpa.envs.factory import make_env
from qpa.envs.metrics import CHANNELS, PATH_OPS, EnvServerMetrics, op_of
from qpa.envs.tokens import AuthError, TokenTable

logger = logging.getLogger("qpa.envs.server")

DEFAULT_MAX_SESSIONS = 1024
DEFAULT_SESSION_TTL_S = 900.0
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_EVICT_IDLE_S = 60.0
DEFAULT_READ_TIMEOUT_S = 15.0
# Kinds whose calls are fast and CPU-bound: run inline on the event loop (no thread hop).
INLINE_KINDS = frozenset({"sandbox"})
# Session ids are capabilities: at least 32 URL-safe characters (token_urlsafe(32) gives 43).
SESSION_ID_PATTERN = r"^[A-Za-z0-9_\-]{32,128}$"
_EXPIRED_MEMORY = 10_000  # how many expired ids are remembered (to say "expired", not "unknown")
_JSON = "application/json"
_CLIENT = "qpa.client"  # the ASGI scope key holding the caller's identity
# No bearer token: probes, scrapers, and /drain (its own key: a preStop hook has no token).
_OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/drain"})
#: The header naming the pod a session lives on (sent by `RemoteEnv` once it knows it).
SESSION_POD_HEADER = "qpa-session-pod"
#: The header carrying the drain key (`POST /drain`).
DRAIN_KEY_HEADER = "qpa-drain-key"
#: Downward API variables a pool's pods set: the pod's name, its IP (or its own base URL).
POD_NAME_ENV = "QPA_POD_NAME"
ADVERTISE_URL_ENV = "QPA_ENV_ADVERTISE_URL"
POD_IP_ENV = "QPA_POD_IP"
#: Where `serve` writes the drain key (a pod's private /tmp); unset: no /drain.
DRAIN_KEY_FILE_ENV = "QPA_ENV_DRAIN_FILE"
MAX_DRAIN_S = 86400.0
#: The session channel: a WebSocket at this path speaking this subprotocol (module docstring).
CHANNEL_PATH = "/channel"
CHANNEL_SUBPROTOCOL = "qpa.env.v1"
#: uvicorn's WebSocket implementation for the channel (the `websockets` package's).
CHANNEL_WS_IMPLEMENTATION = "websockets-sansio"

SessionId = Annotated[str, StringConstraints(pattern=SESSION_ID_PATTERN)]
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


# --------------------------------------------------------------------------- request bodies


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResetRequest(_Body):
    """Start (or restart) an episode; a given session id is created when it does not exist."""

    task: Task
    session_id: SessionId | None = None


class StepRequest(_Body):
    """Apply one action. `seq` = steps this client already applied since reset (optional)."""

    session_id: SessionId
    action: Action
    seq: int | None = Field(default=None, ge=0)


class SessionRequest(_Body):
    session_id: SessionId


class DrainRequest(_Body):
    """Stop new episodes; answer when none is live or after `timeout_s` seconds."""

    timeout_s: float = Field(default=0.0, ge=0, le=MAX_DRAIN_S)


@dataclass(frozen=True)
class PodIdentity:
    """The pod a server runs in: its name and the base URL that reaches this pod alone."""

    name: str
    url: str | None = None

    @classmethod
    def from_env(cls, port: int, environ: Any = None) -> PodIdentity | None:
        """From `QPA_POD_NAME` and `QPA_ENV_ADVERTISE_URL`, else `http://<QPA_POD_IP>:<port>`
        (an IPv6 address in brackets); None outside a pod. A malformed value raises
        ValueError naming its variable."""
        env = os.environ if environ is None else environ
        name = (env.get(POD_NAME_ENV) or "").strip()
        if not name:
            return None
        url = (env.get(ADVERTISE_URL_ENV) or "").strip().rstrip("/") or None
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{ADVERTISE_URL_ENV}: {url!r} is not an http(s) URL")
        ip = (env.get(POD_IP_ENV) or "").strip()
        if url is None and ip:
            try:
                address = ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"{POD_IP_ENV}: {ip!r} is not an IP address") from None
            host = f"[{address}]" if address.version == 6 else str(address)
            url = f"http://{host}:{port}"
        return cls(name=name, url=url)


# --------------------------------------------------------------------------- errors


class ServerError(Exception):
    """A request the server refuses: becomes `{"error": {...}}` with an HTTP status."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.field = field
        self.headers = headers
        self.session_id = session_id


def error_body(
    kind: str, message: str, field: str | None = None, retry_after_s: int | None = None
) -> bytes:
    error: dict[str, Any] = {"kind": kind, "message": message}
    if field is not None:
        error["field"] = field
    if retry_after_s is not None:
        error["retry_after_s"] = retry_after_s
    return orjson.dumps({"error": error})


def refusal_body(exc: ServerError) -> bytes:
    """The error contract's body of `exc`; a `Retry-After` it carries is in the body too, as
    `retry_after_s` (the session channel's replies have no headers)."""
    retry = (exc.headers or {}).get("Retry-After")
    seconds = int(retry) if retry is not None and retry.isdigit() else None
    return error_body(exc.kind, exc.message, exc.field, seconds)


def _error_response(exc: ServerError) -> Response:
    return Response(
        refusal_body(exc),
        status_code=exc.status,
        media_type=_JSON,
        headers=exc.headers,
    )


_ACTION_TAGS = frozenset(
    str(model.model_fields["type"].default)
    for model in (ToolCall, UIAction, MessageUser, Delegate, Finish)
)


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """`('action', 'tool_call', 'arguments')` -> `action.arguments`; list indexes as `[i]`.

    The discriminator tag pydantic puts after a union field is dropped: it names the variant
    tried, not a field of the request.
    """
    out = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _ACTION_TAGS and (previous == "action" or isinstance(previous, int)):
            pass
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out


def _from_validation(exc: ValidationError) -> ServerError:
    errors = exc.errors(include_url=False, include_context=False)
    for err in errors:
        if err["type"] == "json_invalid":
            return ServerError(400, "malformed_json", f"malformed JSON body: {err['msg']}")
    problems: list[str] = []
    first_field: str | None = None
    for err in errors[:5]:
        path = field_path(err["loc"])
        if not path:
            if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
                problems.append("the request body must be a JSON object")
            else:
                problems.append(str(err["msg"]))
            continue
        first_field = first_field or path
        if err["type"] == "missing":
            problems.append(f"missing field '{path}'")
        elif err["type"] == "extra_forbidden":
            problems.append(f"unexpected field '{path}'")
        else:
            problems.append(f"field '{path}': {err['msg']}")
    if len(errors) > 5:
        problems.append(f"and {len(errors) - 5} more")
    return ServerError(422, "invalid_request", "; ".join(problems), field=first_field)


def non_finite_field(body: bytes | str) -> str | None:
    """The path of the first non-finite number in a JSON body (`NaN`, `Infinity`, `-Infinity`,
    or a literal such as `1e400` that overflows to infinity), `body` for a bare one; else None.

    JSON has no such numbers, but Python's `json` and pydantic's parser accept them. orjson
    refuses them, so a body orjson parses has none (the common case: one fast parse); only a
    body it refuses is parsed again, permissively, to find the field. A body malformed in any
    other way answers None (the model's parser reports it).
    """
    try:
        orjson.loads(body)
        return None
    except orjson.JSONDecodeError:
        pass
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return field_path(loc) or "body"
        elif isinstance(value, dict):
            stack.extend((v, (*loc, k)) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, (*loc, i)) for i, v in reversed(list(enumerate(value))))
    return None


def non_finite_message(path: str) -> str:
    return (
        f"field '{path}': NaN and Infinity are not JSON numbers (nor is a number too large for "
        "a double); send a finite number"
    )


def _parse(model: type[M], body: bytes) -> M:
    if (path := non_finite_field(body)) is not None:
        raise ServerError(422, "invalid_request", non_finite_message(path), field=path)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _from_validation(exc) from None


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing (413) anything over `limit` bytes before buffering it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ServerError(400, "malformed_request", "invalid Content-Length header") from None
        if size > limit:
            raise ServerError(
                413, "body_too_large", f"request body of {size} bytes exceeds the limit of {limit}"
            )
        return await request.body()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServerError(
                413, "body_too_large", f"request body exceeds the limit of {limit} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- serialization


def _json_fallback(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(value, fallback=repr)


def dump_feedback(feedback: Feedback) -> bytes:
    """Feedback as JSON bytes, fields in contract order.

    orjson on a plain dict is the fast path (~1 us); observations it cannot encode as they are
    (non-string keys, integers beyond 64 bits) go through pydantic's serializer instead.
    """
    try:
        return orjson.dumps(
            {
                "status": feedback.status,
                "observation": feedback.observation,
                "error": feedback.error,
                "message": feedback.message,
                "done": feedback.done,
            },
            default=_json_fallback,
        )
    except TypeError:
        return feedback.__pydantic_serializer__.to_json(feedback, fallback=repr, warnings=False)


def _ok(payload: bytes) -> Response:
    return Response(payload, media_type=_JSON)


# --------------------------------------------------------------------------- sessions


@dataclass(eq=False)
class Session:
    """One live episode: its environment, its lock and the bookkeeping for safe retries."""

    id: str
    env: Environment
    last_used: float
    owner: str = ""
    lock: asyncio.Lock = dataclass_field(default_factory=asyncio.Lock)
    task_id: str | None = None
    steps: int = 0
    last_reply: bytes | None = None
    tools_json: bytes | None = None
    closed: bool = False
    done: bool = False  # the episode's last step answered done

    def live(self, now: float, ttl_s: float) -> bool:
        """An episode is running: reset, not done, not idle past the TTL (or mid-request)."""
        if self.closed or self.task_id is None or self.done:
            return False
        return self.lock.locked() or now - self.last_used <= ttl_s


class SessionStore:
    """Live sessions by id, in least-recently-used order, bounded in number, per client and in
    idle time (the rules are in the module docstring)."""

    def __init__(
        self,
        kind: str,
        *,
        max_sessions: int,
        session_ttl_s: float,
        env_options: dict[str, Any] | None = None,
        max_sessions_per_client: int | None = None,
        evict_idle_s: float = DEFAULT_EVICT_IDLE_S,
        bind_owner: bool = False,
    ) -> None:
        self.kind = kind
        self.max_sessions = max_sessions
        self.max_per_client = max_sessions_per_client or max_sessions
        self.session_ttl_s = session_ttl_s
        self.evict_idle_s = min(evict_idle_s, session_ttl_s)
        self.bind_owner = bind_owner
        self.env_options = dict(env_options or {})
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._owned: Counter[str] = Counter()
        # id -> (why it is gone, whose it was)
        self._expired: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self.evictions = 0
        #: new sessions refused because live sessions hold the capacity, by reason:
        #: `client_busy` (429, every session of the client is busy), `full` (503)
        self.refused: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def held_by(self, client: str) -> int:
        return self._owned[client]

    def live(self) -> int:
        """Episodes running now (what a drain waits for)."""
        now = time.monotonic()
        return sum(1 for s in self._sessions.values() if s.live(now, self.session_ttl_s))

    def _missing(self, session_id: str, client: str = "") -> ServerError:
        gone = self._expired.get(session_id)
        # another client's session, gone or not, is an id this client never had
        why = gone[0] if gone and (not self.bind_owner or gone[1] == client) else None
        if why == "expired":
            return ServerError(
                404,
                "session_expired",
                f"session '{session_id}' expired after {self.session_ttl_s:g}s idle; "
                "start a new episode with POST /reset",
                field="session_id",
            )
        if why == "evicted":
            return ServerError(
                404,
                "session_evicted",
                f"session '{session_id}' was idle and gave its slot to a new session; "
                "start a new episode with POST /reset",
                field="session_id",
            )
        return ServerError(
            404,
            "unknown_session",
            f"no session '{session_id}'; start one with POST /reset",
            field="session_id",
            session_id=session_id,
        )

    def get(self, session_id: str, client: str = "") -> Session:
        """The live session, or 404 saying whether it never existed, expired or was evicted
        (another client's session, when sessions are bound to tokens, does not exist)."""
        session = self._sessions.get(session_id)
        if session is None or (self.bind_owner and session.owner != client):
            raise self._missing(session_id, client)  # another client's: "unknown", never "yours"
        now = time.monotonic()
        if now - session.last_used > self.session_ttl_s and not session.lock.locked():
            self._drop(session, why="expired")
            raise self._missing(session_id, client)
        session.last_used = now
        self._sessions.move_to_end(session_id)
        return session

    def get_or_create(self, session_id: str, client: str = "") -> Session:
        """For reset: the live session of that id, or a new one (room made by the rules of the
        module docstring; 429 when every session of a client at its limit is busy, 503 when
        live sessions hold every slot; both with `Retry-After`, both counted in `refused`).
        Another client's session id answers 404, as an id that never existed does."""
        existing = self._sessions.get(session_id)
        if existing is not None:
            if self.bind_owner and existing.owner != client:
                raise self._missing(session_id, client)
            with contextlib.suppress(ServerError):
                return self.get(session_id, client)
        if self._owned[client] >= self.max_per_client:
            self.sweep()
        if self._owned[client] >= self.max_per_client and not self._evict_lru(
            owner=client, min_idle_s=0.0
        ):
            if self.max_per_client < self.max_sessions:
                self.refused["client_busy"] += 1
                raise ServerError(
                    429,
                    "too_many_sessions_for_client",
                    f"this client holds {self._owned[client]} sessions, its limit, and each is "
                    "busy with a request; close sessions (DELETE /sessions/{id}) or retry later",
                    headers={"Retry-After": "1"},
                )
            raise self._full()  # its limit is the whole server
        if len(self._sessions) >= self.max_sessions:
            self.sweep()
        if len(self._sessions) >= self.max_sessions and not self._make_room(client):
            raise self._full()
        session = Session(
            id=session_id,
            env=make_env(self.kind, **self.env_options),
            last_used=time.monotonic(),
            owner=client,
        )
        self._sessions[session_id] = session
        self._owned[client] += 1
        self._expired.pop(session_id, None)
        return session

    def _evict_lru(self, *, owner: str | None = None, min_idle_s: float | None = None) -> bool:
        """Evict the least recently used session not busy with a request (of `owner`, idle for
        at least `min_idle_s`, default `evict_idle_s`); whether one was."""
        idle_for = self.evict_idle_s if min_idle_s is None else min_idle_s
        deadline = time.monotonic() - idle_for
        for session in self._sessions.values():
            if session.last_used > deadline:
                return False  # every later session was used more recently still
            if session.lock.locked() or (owner is not None and session.owner != owner):
                continue
            self._drop(session, why="evicted")
            self.evictions += 1
            return True
        return False

    def _make_room(self, client: str) -> bool:
        """A slot for `client` on a full server: its own session idle for `evict_idle_s`,
        anyone's, a fair share's worth from the biggest holder, then its own least recently
        used session that no request is using; whether one was freed."""
        if self._evict_lru(owner=client) or self._evict_lru():
            return True
        holders = [c for c, n in self._owned.items() if n > 0]
        clients = len(set(holders) | {client})
        fair = max(1, self.max_sessions // clients)
        if self._owned[client] < fair:
            biggest = max(holders, key=lambda c: self._owned[c], default=None)
            if (
                biggest is not None
                and biggest != client
                and self._owned[biggest] > fair
                and self._evict_lru(owner=biggest, min_idle_s=0.0)
            ):
                return True
        return self._owned[client] > 0 and self._evict_lru(owner=client, min_idle_s=0.0)

    def _full(self) -> ServerError:
        """503: live sessions hold every slot (counted; `Retry-After`: until the least recently
        used one not busy with a request has been idle `evict_idle_s`, at least 1 s)."""
        self.refused["full"] += 1
        now = time.monotonic()
        idle = next((s for s in self._sessions.values() if not s.lock.locked()), None)
        wait = self.evict_idle_s - (now - idle.last_used) if idle is not None else 1.0
        retry = max(1, min(math.ceil(wait), math.ceil(self.evict_idle_s)))
        return ServerError(
            503,
            "too_many_sessions",
            f"all {self.max_sessions} session slots are held by live sessions; close sessions "
            f"(DELETE /sessions/{{id}}) or retry in {retry}s",
            headers={"Retry-After": str(retry)},
        )

    def remove(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._drop(session, why=None)
        return session

    def sweep(self) -> int:
        """Expire every idle session not busy with a request; the number expired."""
        deadline = time.monotonic() - self.session_ttl_s
        idle = [
            s for s in self._sessions.values() if s.last_used < deadline and not s.lock.locked()
        ]
        for session in idle:
            self._drop(session, why="expired")
        return len(idle)

    def close_all(self) -> None:
        for session in list(self._sessions.values()):
            self._drop(session, why=None)

    def _drop(self, session: Session, *, why: str | None) -> None:
        if self._sessions.pop(session.id, None) is not None:
            self._owned[session.owner] -= 1
            if self._owned[session.owner] <= 0:
                del self._owned[session.owner]
        session.closed = True
        if why is not None:
            self._expired[session.id] = (why, session.owner)
            while len(self._expired) > _EXPIRED_MEMORY:
                self._expired.popitem(last=False)
        try:
            session.env.close()
        except Exception:  # a failing close must not take the server down
            logger.exception("closing session %s failed", session.id)


def _check_open(session: Session) -> None:
    if session.closed:
        raise ServerError(
            404,
            "unknown_session",
            f"session '{session.id}' was closed while this request waited",
            field="session_id",
        )


# --------------------------------------------------------------------------- the service


class EnvService:
    """What the endpoints do, on raw bytes in and JSON bytes out (raises `ServerError`).

    Both the documented FastAPI routes and the ASGI fast path call these methods, so the
    behaviour is written once.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        inline: bool,
        identity: PodIdentity | None = None,
        metrics: EnvServerMetrics | None = None,
    ) -> None:
        self.store = store
        self.inline = inline
        self.identity = identity
        self.metrics = metrics
        self.channel = True  # the session channel is served (create_app's `channel`)
        self.draining = False
        # the handle's pod fields, pre-serialized: `,"pod":...,"url":...` or nothing
        self._handle = b""
        if identity is not None:
            self._handle = b',"pod":' + orjson.dumps(identity.name)
            if identity.url is not None:
                self._handle += b',"url":' + orjson.dumps(identity.url)

    def here(self) -> str:
        """This server, as error messages name it."""
        return f"pod '{self.identity.name}'" if self.identity is not None else "this server"

    def locate(self, exc: ServerError, claimed: str | None) -> ServerError:
        """An unknown session's error, naming the pod that owns it when the client said so."""
        if exc.kind != "unknown_session" or self.identity is None:
            return exc
        here = self.identity.name
        if claimed and claimed != here:
            return ServerError(
                404,
                "session_on_other_pod",
                f"session '{exc.session_id}' lives on pod '{claimed}', not on pod '{here}': "
                "send its requests to the address its reset answered (the pod's own URL), "
                "or start a new episode with POST /reset",
                field="session_id",
                session_id=exc.session_id,
            )
        return ServerError(
            exc.status,
            exc.kind,
            f"{exc.message} (on pod '{here}')",
            field=exc.field,
            session_id=exc.session_id,
        )

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.inline:
            return fn(*args)
        return await run_in_threadpool(fn, *args)

    async def reset(self, body: bytes, client: str = "") -> bytes:
        req = _parse(ResetRequest, body)
        if self.draining:
            raise ServerError(
                503,
                "draining",
                f"{self.here()} is draining (shutting down) and starts no new episode; "
                "reset through the pool's Service to start it on another pod",
                headers={"Retry-After": "0"},
            )
        session_id = req.session_id or secrets.token_urlsafe(32)
        session = self.store.get_or_create(session_id, client)
        async with session.lock:
            _check_open(session)
            feedback = await self._run(session.env.reset, req.task)
            session.task_id = req.task.id
            session.steps = 0
            session.last_reply = None
            session.tools_json = None
            session.done = feedback.done
            session.last_used = time.monotonic()
        if self.metrics is not None:
            self.metrics.resets.inc()
        return (
            b'{"session_id":'
            + orjson.dumps(session_id)
            + self._handle
            + b',"feedback":'
            + dump_feedback(feedback)
            + b"}"
        )

    async def step(self, body: bytes, client: str = "") -> bytes:
        req = _parse(StepRequest, body)
        session = self.store.get(req.session_id, client)
        async with session.lock:
            _check_open(session)
            seq = req.seq
            if seq is not None and seq != session.steps:
                if seq == session.steps - 1 and session.last_reply is not None:
                    return session.last_reply  # a retried step: the same answer, applied once
                raise ServerError(
                    409,
                    "sequence_conflict",
                    f"step seq {seq} does not follow the {session.steps} steps applied since reset",
                    field="seq",
                )
            feedback = await self._run(session.env.step, req.action)
            reply = b'{"feedback":' + dump_feedback(feedback) + b"}"
            session.steps += 1
            session.done = session.done or feedback.done
            session.last_reply = reply
            session.last_used = time.monotonic()
        if self.metrics is not None:
            self.metrics.steps.inc()
            if feedback.status == "error":
                self.metrics.episode_error(feedback.error)
        return reply

    async def verify(self, body: bytes, client: str = "") -> bytes:
        req = _parse(SessionRequest, body)
        session = self.store.get(req.session_id, client)
        async with session.lock:
            _check_open(session)
            verification = await self._run(session.env.verify)
        return verification.__pydantic_serializer__.to_json(verification)

    async def tools(self, session_id: str, client: str = "") -> bytes:
        session = self.store.get(session_id, client)
        async with session.lock:
            _check_open(session)
            if session.tools_json is None:
                specs = await self._run(session.env.tools)
                session.tools_json = orjson.dumps(
                    {"tools": [spec.model_dump(mode="json") for spec in specs]}
                )
            return session.tools_json

    async def state(self, session_id: str, client: str = "") -> bytes:
        session = self.store.get(session_id, client)
        async with session.lock:
            _check_open(session)
            snapshot = getattr(session.env, "state", None)
            data = await self._run(snapshot) if callable(snapshot) else None
            finished = getattr(session.env, "finished", None)
            payload = {
                "session_id": session.id,
                "task_id": session.task_id,
                "steps": session.steps,
                "finished": finished if isinstance(finished, bool) else None,
                "state": data,
            }
        return orjson.dumps(payload, default=_json_fallback)

    async def delete(self, session_id: str, client: str = "") -> bytes:
        session = self.store.get(session_id, client)
        async with session.lock:
            self.store.remove(session.id)
        return orjson.dumps({"deleted": session.id})

    # The session channel's operations on a `{"session_id": ...}` body (the HTTP routes take
    # the id from the query string or the path instead).
    async def tools_of(self, body: bytes, client: str = "") -> bytes:
        return await self.tools(_parse(SessionRequest, body).session_id, client)

    async def state_of(self, body: bytes, client: str = "") -> bytes:
        return await self.state(_parse(SessionRequest, body).session_id, client)

    async def delete_of(self, body: bytes, client: str = "") -> bytes:
        return await self.delete(_parse(SessionRequest, body).session_id, client)

    async def health_of(self, body: bytes, client: str = "") -> bytes:
        return self.health()

    def health(self) -> bytes:
        payload: dict[str, Any] = {
            "status": "ok",
            "kind": self.store.kind,
            "sessions": len(self.store),
            "max_sessions": self.store.max_sessions,
            "draining": self.draining,
            "channels": list(CHANNELS) if self.channel else ["http"],
        }
        if self.identity is not None:
            payload["pod"] = self.identity.name
        return orjson.dumps(payload)

    async def drain(self, body: bytes, poll_s: float = 0.1) -> bytes:
        """Stop new episodes, then wait (up to the request's `timeout_s`) for the live ones."""
        req = _parse(DrainRequest, body or b"{}")
        self.draining = True
        started = time.monotonic()
        deadline = started + req.timeout_s
        live = self.store.live()
        while live and time.monotonic() < deadline:
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            live = self.store.live()
        waited = time.monotonic() - started
        if live:
            logger.warning("drain: %d episodes still live after %.1fs", live, waited)
        return orjson.dumps(
            {
                "drained": live == 0,
                "live": live,
                "sessions": len(self.store),
                "pod": self.identity.name if self.identity else None,
                "waited_s": round(waited, 3),
            }
        )


class SessionMetrics(Collector):
    """The server's load as Prometheus metrics, read from the store when scraped."""

    def __init__(self, service: EnvService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        store = self.service.store
        values = (
            ("qpa_env_sessions_in_use", "Session slots taken (live or idle sessions).", len(store)),
            ("qpa_env_sessions_capacity", "Session slots of this server.", store.max_sessions),
            ("qpa_env_sessions_live", "Episodes running (reset, not done).", store.live()),
            (
                "qpa_env_draining",
                "1 while the server drains (no new episodes).",
                int(self.service.draining),
            ),
        )
        for name, text, value in values:
            gauge = GaugeMetricFamily(name, text, labels=["kind"])
            gauge.add_metric([store.kind], value)
            yield gauge
        evictions = CounterMetricFamily(
            "qpa_env_session_evictions", "Idle sessions that gave their slot.", labels=["kind"]
        )
        evictions.add_metric([store.kind], store.evictions)
        yield evictions
        refused = CounterMetricFamily(
            "qpa_env_sessions_refused",
            "New sessions refused because live sessions hold the capacity, by reason "
            "(client_busy: 429, full: 503).",
            labels=["kind", "reason"],
        )
        for reason in ("client_busy", "full"):
            refused.add_metric([store.kind, reason], store.refused[reason])
        yield refused


# --------------------------------------------------------------------------- ASGI layer


async def _send_json(
    send: Send, status: int, payload: bytes, headers: dict[str, str] | None = None
) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    if headers:
        raw.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


class _ClientGone(Exception):
    pass


def _header(scope: Scope, name: str) -> str | None:
    key = name.encode("latin-1")
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == key), None)


async def _receive_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The raw body from the ASGI channel, refusing (413) more than `limit` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                size = int(value)
            except ValueError:
                raise ServerError(
                    400, "malformed_request", "invalid Content-Length header"
                ) from None
            if size > limit:
                raise ServerError(
                    413,
                    "body_too_large",
                    f"request body of {size} bytes exceeds the limit of {limit}",
                )
            break
    chunks: list[bytes] | None = None
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ServerError(413, "body_too_large", f"request body exceeds the limit of {limit}")
        if not message.get("more_body", False):
            if chunks is None:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        if chunks is None:
            chunks = []
        chunks.append(chunk)


class _FastPath:
    """ASGI front of the FastAPI app: serves the hot endpoints and the session channel, guards
    the rest.

    POST /reset, /step and /verify go straight from the ASGI channel to `EnvService` (no
    routing, no `Request` object, no dependency resolution: about half the per-request cost of
    a FastAPI route). `WS /channel` is the session channel (see the module docstring).
    Everything else, including those paths with other methods, falls through to FastAPI. Any
    exception escaping either answers 500 JSON; the server keeps serving. Every request is
    counted in `metrics` (by operation, channel and status) when given.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        service: EnvService,
        max_body_bytes: int,
        enabled: bool = True,
        tokens: TokenTable | None = None,
        metrics: EnvServerMetrics | None = None,
        channel: bool = True,
    ) -> None:
        self.app = app
        self.channel_enabled = channel
        self.limit = max_body_bytes
        self.tokens = tokens
        self.service = service
        self.metrics = metrics
        self.routes: dict[str, Callable[[bytes, str], Awaitable[bytes]]] = (
            {"/reset": service.reset, "/step": service.step, "/verify": service.verify}
            if enabled
            else {}
        )
        self.operations: dict[bytes, tuple[str, Callable[[bytes, str], Awaitable[bytes]]]] = {
            b"reset": ("reset", service.reset),
            b"step": ("step", service.step),
            b"verify": ("verify", service.verify),
            b"tools": ("tools", service.tools_of),
            b"state": ("state", service.state_of),
            b"delete": ("delete", service.delete_of),
            b"health": ("health", service.health_of),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket" and scope["path"] == CHANNEL_PATH and self.channel_enabled:
            await self.channel(scope, receive, send)
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        metrics = self.metrics
        try:
            client = self.identify(scope)
        except ServerError as exc:
            await self._refuse(scope, send, exc, began)
            return
        scope[_CLIENT] = client
        handler = self.routes.get(scope["path"]) if scope["method"] == "POST" else None
        if handler is not None:
            try:
                payload = await handler(await _receive_body(scope, receive, self.limit), client)
            except ServerError as error:
                found = self.service.locate(error, _header(scope, SESSION_POD_HEADER))
                await self._refuse(scope, send, found, began)
            except _ClientGone:
                return
            except Exception as exc:
                await self._bug(scope, send, exc)
                self._count(scope, 500, began, "internal")
            else:
                await _send_json(send, 200, payload)
                if metrics is not None:
                    metrics.answered(
                        PATH_OPS[scope["path"]], "http", 200, time.perf_counter() - began
                    )
            return
        status = 0

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if status:
                logger.exception("bug after answering %s %s", scope["method"], scope["path"])
            else:
                await self._bug(scope, send, exc)
                status = 500
        if status:
            self._count(scope, status, began)

    def _count(self, scope: Scope, status: int, began: float, error: str | None = None) -> None:
        if self.metrics is None:
            return
        op = op_of(scope["method"], scope["path"])
        if error is not None:
            self.metrics.refused(op, error)
        self.metrics.answered(op, "http", status, time.perf_counter() - began)

    async def _refuse(self, scope: Scope, send: Send, exc: ServerError, began: float) -> None:
        await _send_json(send, exc.status, refusal_body(exc), exc.headers)
        self._count(scope, exc.status, began, exc.kind)

    # ------------------------------------------------------------------ the session channel
    async def channel(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`WS /channel`: one WebSocket carrying a client's requests, one reply each, in order.

        A request is a frame `<op> <JSON body>` (op: reset, step, verify, tools, state, delete,
        health; the body that op's HTTP endpoint takes, `{"session_id": ...}` for tools, state
        and delete), a reply `<status> <JSON body>`: the same status and body the HTTP endpoint
        answers, so the error contract is the HTTP one. The connection is authenticated once,
        at the upgrade (401 refuses it), and holds no session: sessions live in the store as
        for HTTP (a reconnect finds them; `seq` de-duplicates a step re-sent after one).
        """
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        try:
            client = self.identify(scope)
            if CHANNEL_SUBPROTOCOL not in scope.get("subprotocols", ()):
                raise ServerError(
                    400,
                    "unsupported_subprotocol",
                    f"the session channel speaks the '{CHANNEL_SUBPROTOCOL}' subprotocol "
                    "(Sec-WebSocket-Protocol)",
                    field="Sec-WebSocket-Protocol",
                )
            if self.service.draining:
                raise ServerError(
                    503,
                    "draining",
                    f"{self.service.here()} is draining",
                    headers={"Retry-After": "0"},
                )
        except ServerError as exc:
            await self._deny(scope, send, exc)
            return
        claimed = _header(scope, SESSION_POD_HEADER)
        await send({"type": "websocket.accept", "subprotocol": CHANNEL_SUBPROTOCOL})
        metrics = self.metrics
        if metrics is not None:
            metrics.channels.inc()
        operations, routes, limit, service = self.operations, self.routes, self.limit, self.service
        clock = time.perf_counter
        try:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return  # websocket.disconnect
                began = clock()
                frame = message.get("bytes")
                if frame is None:
                    frame = (message.get("text") or "").encode()
                name, _, body = frame.partition(b" ")
                op = "other"
                try:
                    entry = operations.get(name)
                    if entry is None:
                        raise ServerError(
                            400,
                            "unknown_operation",
                            f"unknown operation {name[:40]!r}; one of "
                            + ", ".join(sorted(o.decode() for o in operations)),
                        )
                    op = entry[0]
                    handler = routes.get(f"/{op}") or entry[1]  # the fast path's, if set
                    if len(body) > limit:
                        raise ServerError(
                            413,
                            "body_too_large",
                            f"request body of {len(body)} bytes exceeds the limit of {limit}",
                        )
                    reply = b"200 " + await handler(body, client)
                    status = 200
                except ServerError as error:
                    found = service.locate(error, claimed)
                    status = found.status
                    reply = b"%d " % status + refusal_body(found)
                    if metrics is not None:
                        metrics.refused(op, found.kind)
                except Exception as exc:
                    logger.exception("bug while serving %s on the session channel", op)
                    status = 500
                    reply = b"500 " + error_body(
                        "internal", f"internal error: {type(exc).__name__}: {exc}"
                    )
                    if metrics is not None:
                        metrics.refused(op, "internal")
                await send({"type": "websocket.send", "bytes": reply})
                if metrics is not None:
                    metrics.answered(op, "websocket", status, clock() - began)
        finally:
            if metrics is not None:
                metrics.channels.dec()

    async def _deny(self, scope: Scope, send: Send, exc: ServerError) -> None:
        """Refuse a WebSocket upgrade with the error contract's HTTP answer (where the server
        supports ASGI's denial responses; else the upgrade is closed: 403)."""
        if self.metrics is not None:
            self.metrics.refused("channel", exc.kind)
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        payload = refusal_body(exc)
        raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
        raw.extend(
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in (exc.headers or {}).items()
        )
        await send({"type": "websocket.http.response.start", "status": exc.status, "headers": raw})
        await send({"type": "websocket.http.response.body", "body": payload})

    def identify(self, scope: Scope) -> str:
        """The caller: its token's identity (401 without a known token), else its peer address."""
        if self.tokens is None:
            peer = scope.get("client")
            return f"peer:{peer[0]}" if peer else "peer:unknown"
        if scope["path"] in _OPEN_PATHS:
            return "anonymous"
        authorization = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None
        )
        try:
            return f"token:{self.tokens.identity(authorization)}"
        except AuthError as exc:
            raise ServerError(
                401,
                "unauthenticated",
                exc.message,
                field="Authorization",
                headers={"WWW-Authenticate": "Bearer"},
            ) from None

    @staticmethod
    async def _bug(scope: Scope, send: Send, exc: Exception) -> None:
        logger.exception("bug while serving %s %s", scope["method"], scope["path"])
        message = f"internal error: {type(exc).__name__}: {exc}"
        await _send_json(send, 500, error_body("internal", message))


# --------------------------------------------------------------------------- the app


class EnvServerApp(FastAPI):
    """FastAPI with the fast path in front of its whole middleware stack.

    The fast path sees every request first (about 10% less server CPU per step than as a
    middleware inside Starlette's stack) and hands the rest to FastAPI unchanged.
    """

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None:
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def behind(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The plain FastAPI application (routing, middleware, exception handlers)."""
        await super().__call__(scope, receive, send)


def _client(request: Request) -> str:
    """The caller's identity, as the fast path (which sees every request first) set it."""
    return str(request.scope.get(_CLIENT, ""))


def _body_doc(model: type[BaseModel], summary: str) -> dict[str, Any]:
    """OpenAPI text for endpoints that parse their raw body (no FastAPI body model)."""
    return {
        "requestBody": {
            "required": True,
            "description": f"{summary} (JSON object: {', '.join(model.model_fields)})",
            "content": {_JSON: {"schema": {"type": "object"}}},
        }
    }


def create_app(
    kind: str = "sandbox",
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_ttl_s: float = DEFAULT_SESSION_TTL_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    inline: bool | None = None,
    fast_path: bool = True,
    env_options: dict[str, Any] | None = None,
    max_sessions_per_client: int | None = None,
    evict_idle_s: float = DEFAULT_EVICT_IDLE_S,
    tokens: TokenTable | None = None,
    identity: PodIdentity | None = None,
    drain_key: str | None = None,
    channel: bool = True,
) -> EnvServerApp:
    """The environment server for one environment kind (a FastAPI application).

    `inline` runs environment calls on the event loop (default: for the sandbox, whose calls
    take microseconds); otherwise they run in the thread pool. `fast_path=False` serves every
    endpoint through FastAPI routing (same behaviour, slower). `max_sessions_per_client`
    (default: `max_sessions`) and `evict_idle_s` bound what one client holds; `tokens` requires
    a bearer token on every request but `/health`, `/ready`, `/metrics` and `/drain`.
    `identity` names the pod in session handles and errors; `drain_key` enables `POST /drain`
    (for callers sending it in `qpa-drain-key`). `channel=False` serves no session channel
    (`WS /channel`; clients then use HTTP). An unknown kind raises ValueError.
    """
    if max_sessions < 1 or session_ttl_s <= 0 or max_body_bytes < 1 or evict_idle_s <= 0:
        raise ValueError(
            "max_sessions, session_ttl_s, max_body_bytes and evict_idle_s must be positive"
        )
    if max_sessions_per_client is not None and not 1 <= max_sessions_per_client <= max_sessions:
        raise ValueError("max_sessions_per_client must be between 1 and max_sessions")
    # Fail fast on an unknown kind (ValueError) or bad options; warms the tool registries too.
    make_env(kind, **(env_options or {})).close()
    store = SessionStore(
        kind,
        max_sessions=max_sessions,
        session_ttl_s=session_ttl_s,
        env_options=env_options,
        max_sessions_per_client=max_sessions_per_client,
        evict_idle_s=evict_idle_s,
        bind_owner=tokens is not None,
    )
    registry = CollectorRegistry(auto_describe=False)
    counters = EnvServerMetrics(registry, kind)
    service = EnvService(
        store,
        inline=kind in INLINE_KINDS if inline is None else inline,
        identity=identity,
        metrics=counters,
    )
    service.channel = channel
    registry.register(SessionMetrics(service))
    limit = max_body_bytes

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def sweeper() -> None:
            interval = max(0.05, min(session_ttl_s / 4, 30.0))
            while True:
                await asyncio.sleep(interval)
                try:
                    if expired := store.sweep():
                        logger.info("expired %d idle sessions", expired)
                except Exception:
                    logger.exception("session sweep failed")

        task = asyncio.create_task(sweeper())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            store.close_all()

    app = EnvServerApp(
        title=f"qpa environment server ({kind})",
        summary="reset/step/verify episodes of one environment kind, many sessions at once",
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.service = service
    app.state.kind = kind
    app.state.registry = registry
    app.state.metrics = counters
    app.state.max_body_bytes = limit
    app.front = _FastPath(
        app.behind,
        service=service,
        max_body_bytes=limit,
        enabled=fast_path,
        tokens=tokens,
        metrics=counters,
        channel=channel,
    )

    def refused(request: Request, exc: ServerError) -> Response:
        counters.refused(op_of(request.method, request.url.path), exc.kind)
        return _error_response(exc)

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> Response:
        return refused(request, service.locate(exc, request.headers.get(SESSION_POD_HEADER)))

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = list(exc.errors())
        first = errors[0] if errors else {}
        loc = list(first.get("loc", ()))[1:]  # drop 'query' / 'path' / 'body'
        path = field_path(loc) or None
        what = "missing" if first.get("type") == "missing" else first.get("msg", "invalid")
        message = f"parameter '{path}': {what}" if path else str(what)
        return refused(request, ServerError(422, "invalid_request", message, field=path))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        # Starlette answers with this, then re-raises to the fast path, which logs it.
        message = f"internal error: {type(exc).__name__}: {exc}"
        return refused(request, ServerError(500, "internal", message))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kinds = {404: "not_found", 405: "method_not_allowed"}
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return refused(
            request, ServerError(exc.status_code, kinds.get(exc.status_code, "http_error"), message)
        )

    # The three POST routes document the endpoints (and serve them when fast_path=False).
    @app.post("/reset", openapi_extra=_body_doc(ResetRequest, "the task and optional session id"))
    async def reset(request: Request) -> Response:
        """Start an episode of `task` (in a new session, or restart the given one)."""
        return _ok(await service.reset(await _read_body(request, limit), _client(request)))

    @app.post("/step", openapi_extra=_body_doc(StepRequest, "the session and one action"))
    async def step(request: Request) -> Response:
        """Apply one action; episode-level problems come back as error feedback (200)."""
        return _ok(await service.step(await _read_body(request, limit), _client(request)))

    @app.post("/verify", openapi_extra=_body_doc(SessionRequest, "the session"))
    async def verify(request: Request) -> Response:
        """Judge the session's current state against its task's verifier."""
        return _ok(await service.verify(await _read_body(request, limit), _client(request)))

    @app.get("/state")
    async def state(
        request: Request, session_id: Annotated[str, Query(pattern=SESSION_ID_PATTERN)]
    ) -> Response:
        """A detached snapshot of the session's environment state."""
        return _ok(await service.state(session_id, _client(request)))

    @app.get("/tools")
    async def tools(
        request: Request, session_id: Annotated[str, Query(pattern=SESSION_ID_PATTERN)]
    ) -> Response:
        """The tools of the session's current episode."""
        return _ok(await service.tools(session_id, _client(request)))

    @app.delete("/sessions/{session_id}")
    async def delete_session(
        request: Request, session_id: Annotated[str, Path(pattern=SESSION_ID_PATTERN)]
    ) -> Response:
        """Close a session and free its slot."""
        return _ok(await service.delete(session_id, _client(request)))

    @app.get("/health")
    async def health() -> Response:
        """Liveness and load: kind and number of live sessions (200 while draining too)."""
        return _ok(service.health())

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 503 while draining, so the pool's Service sends no new session here."""
        if service.draining:
            raise ServerError(503, "draining", f"{service.here()} is draining")
        return _ok(service.health())

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus exposition: sessions in use, capacity, live episodes, draining."""
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.post("/drain", openapi_extra=_body_doc(DrainRequest, "how long to wait"))
    async def drain(request: Request) -> Response:
        """Stop new episodes and wait for the live ones (the pod's preStop hook)."""
        if drain_key is None:
            raise ServerError(
                403, "drain_disabled", "this server was started without a drain key file"
            )
        given = request.headers.get(DRAIN_KEY_HEADER) or ""
        if not hmac.compare_digest(given.encode(), drain_key.encode()):
            raise ServerError(
                403, "forbidden", "POST /drain needs the pod's drain key", field=DRAIN_KEY_HEADER
            )
        return _ok(await service.drain(await _read_body(request, limit)))

    from qpa.envs.openenv import mount_openenv  # OpenEnv's /ws, /schema, /metadata (no cycle)

    mount_openenv(app)
    return app


_TIMEOUT_BODY = error_body(
    "request_timeout", "the request was not received in time; the connection is closed"
)


def timed_protocol(read_timeout_s: float) -> type[Any]:
    """uvicorn's httptools protocol with a read deadline on every request (see module doc)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(HttpToolsProtocol):
        _read_deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._read_deadline is None:
                self._read_deadline = self.loop.call_later(read_timeout_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()  # a connection that sends nothing is cut off too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            self._disarm()  # the connection now belongs to the WebSocket protocol
            super().handle_websocket_upgrade()

        def _read_timed_out(self) -> None:
            self._read_deadline = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is None or not cycle.response_started:
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                    % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
                )
            # connection_lost marks the cycle disconnected: the app's receive() answers
            # http.disconnect and whatever it sends later is dropped.
            self.transport.close()

    return TimedHttpToolsProtocol


def uvicorn_config(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
) -> Any:
    """The uvicorn configuration `serve` runs `app` with (tests start servers with it too).

    The session channel's frames may be up to twice the app's body limit (a frame between the
    limit and that answers 413 like HTTP; a larger one closes the channel with 1009), carry no
    compression (CPU, not bandwidth, is what a rollout server runs out of), and the connection
    is pinged every 20 s (a client that answers no ping for 20 s more is disconnected).
    """
    import uvicorn

    if read_timeout_s <= 0:
        raise ValueError("read_timeout_s must be positive")
    state = getattr(app, "state", None)
    limit = int(getattr(state, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        server_header=False,
        timeout_keep_alive=75,
        http=timed_protocol(read_timeout_s),
        ws=CHANNEL_WS_IMPLEMENTATION,
        ws_max_size=2 * limit + 1024,
        ws_per_message_deflate=False,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
    )


def serve(
    kind: str = "sandbox",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_ttl_s: float = DEFAULT_SESSION_TTL_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    log_level: str = "warning",
    env_options: dict[str, Any] | None = None,
    max_sessions_per_client: int | None = None,
    evict_idle_s: float = DEFAULT_EVICT_IDLE_S,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    tokens: TokenTable | None = None,
    identity: PodIdentity | None = None,
    drain_key_file: str | None = None,
) -> None:
    """Run the server with uvicorn until interrupted (one process: sessions live in memory).

    `identity` defaults to the pod's (`PodIdentity.from_env`), `drain_key_file` to
    `$QPA_ENV_DRAIN_FILE`: a fresh drain key is written there (mode 0600) for
    `qpa env drain`; without one the server has no `/drain`.
    """
    import uvicorn

    identity = identity if identity is not None else PodIdentity.from_env(port)
    key_file = drain_key_file or os.environ.get(DRAIN_KEY_FILE_ENV) or None
    app = create_app(
        kind,
        max_sessions=max_sessions,
        session_ttl_s=session_ttl_s,
        max_body_bytes=max_body_bytes,
        env_options=env_options,
        max_sessions_per_client=max_sessions_per_client,
        evict_idle_s=evict_idle_s,
        tokens=tokens,
        identity=identity,
        drain_key=write_drain_key(key_file) if key_file else None,
    )
    config = uvicorn_config(
        app, host=host, port=port, log_level=log_level, read_timeout_s=read_timeout_s
    )
    uvicorn.Server(config).run()


def write_drain_key(path: str) -> str:
    """A fresh random drain key, written to `path` readable by this user only."""
    key = secrets.token_urlsafe(32)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale key of an earlier run (or someone else's file) goes first
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key)
    return key
