"""OpenEnv's protocol on `qpa env serve`: the routes an `openenv-core` client drives, beside qpa's.

OpenEnv (github.com/meta-pytorch/OpenEnv, the `openenv-core` package) clients hold one WebSocket
per episode session: `EnvClient` connects to `<base>/ws` and exchanges JSON text messages

    {"type": "reset", "data": {task, episode_id?}} -> {"type": "observation", "data": RESULT}
    {"type": "step", "data": {action, metadata?}}  -> {"type": "observation", "data": RESULT}
    {"type": "state"}                              -> {"type": "state", "data": STATE}
    {"type": "close"}                              -> the session is closed, then the socket
    {"type": "verify"}                             -> {"type": "verification", "data": {...}}
    {"type": "tools"}                              -> {"type": "tools", "data": {"tools": [...]}}

where RESULT is OpenEnv's step result, `{"observation": {...}, "reward": r, "done": d}`, and
every refusal answers `{"type": "error", "data": {"message", "code", "kind", "status",
"field"?}}` (the connection stays open). `verify` and `tools` are qpa's additions (an OpenEnv
server answers an unknown type with an error, so OpenEnv's own clients never send them);
`qpa.envs.openenv_client.QpaEnv` uses them. Besides the socket: `GET /schema` (the JSON
schemas of the action, observation and state) and `GET /metadata` (name, description,
version), as an OpenEnv server serves them. qpa's `/health`, `/reset`, `/step` and `/state`
keep qpa's own bodies: OpenEnv's client never calls them (its HTTP routes are stateless).

The mapping onto qpa's contract (the fields are `ActionFields`, `ObservationFields` and
`StateFields`; the client's `QpaAction`, `QpaObservation`, `QpaState` subclass OpenEnv's
`Action`, `Observation`, `State` with them):

- reset: `task` is a qpa `Task` (required: a qpa episode is its task, so OpenEnv's `seed` has
  no meaning and is refused); `episode_id` an optional label, echoed by `state`. A second
  reset on the same socket restarts the episode in the same session.
- step: `action` is one qpa `Action` (`tool_call`, `ui`, `message_user`, `delegate`,
  `finish`). Episode errors (unknown tool, bad arguments) are ordinary observations with
  `status="error"`, exactly as qpa's own `/step` answers them.
- observation: the `Feedback` (`status`, `observation`, `error`, `message`, `done`); after a
  reset also the episode's `tools`; on the reply that ends the episode (`done` first true) the
  task's `verification` and the reward, 1.0 for a verified success and 0.0 otherwise. Every
  other reply has reward None (OpenEnv's "no signal"), so summing rewards counts an episode
  once. A client wanting progress-shaped rewards reads `verification.progress`.
- state: `episode_id` (the reset's label, else the session id), `step_count`, and qpa's
  `session_id`, `task_id`, `finished` and `state` (the environment's state snapshot).

One engine: every message goes through the server's `EnvService`, so a socket's session is an
ordinary session of the `SessionStore` (the same capacity, per-client limits, idle expiry,
eviction, draining, metrics and locks as qpa's HTTP sessions); it is closed when the socket
closes. Bearer tokens, when the server has them, are checked on the WebSocket handshake's
`Authorization` header (refused: the handshake answers 401 with qpa's JSON error body, as the
HTTP routes do); a session belongs to its token's client. A message over the server's
body limit, malformed JSON and a malformed message (the field named) get errors; a bug
answers an error too, and the server keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import metadata as importlib_metadata
from typing import Any, Literal

import orjson
from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from qpa.contract import Action, ErrorKind, ToolSpec, Verification
from qpa.envs.server import (
    EnvServerApp,
    EnvService,
    ServerError,
    _FastPath,
    _from_validation,
    error_body,
)

logger = logging.getLogger("qpa.envs.openenv")

#: OpenEnv's WebSocket error codes (`openenv.core.env_server.types.WSErrorCode`), by qpa kind.
_CODES: dict[str, str] = {
    "malformed_json": "INVALID_JSON",
    "invalid_request": "VALIDATION_ERROR",
    "unknown_message_type": "UNKNOWN_TYPE",
    "too_many_sessions": "CAPACITY_REACHED",
    "too_many_sessions_for_client": "CAPACITY_REACHED",
    "draining": "CAPACITY_REACHED",
    "internal": "EXECUTION_ERROR",
}
_SESSION_CODE = "SESSION_ERROR"  # unknown, expired, evicted session; no episode; unauthenticated
_MESSAGE_TYPES = ("reset", "step", "state", "close", "verify", "tools")
#: WebSocket close code for a handshake without a valid bearer token (RFC 6455: policy).
POLICY_VIOLATION = 1008


# --------------------------------------------------------------------------- published types


class ActionFields(BaseModel):
    """What a qpa step sends: one qpa action (the client's `QpaAction` adds OpenEnv's
    `metadata`)."""

    action: Action = Field(description="one qpa action, discriminated by its 'type'")


class ObservationFields(BaseModel):
    """What a qpa reset or step answers, besides OpenEnv's `done`, `reward` and `metadata`."""

    status: Literal["ok", "error"] = Field(
        default="ok", description="'error' when the action failed (see error, message)"
    )
    observation: Any = Field(default=None, description="the tool's or screen's result")
    error: ErrorKind | None = Field(default=None, description="the kind of episode error")
    message: str = Field(default="", description="a readable line about the result")
    tools: list[ToolSpec] | None = Field(
        default=None, description="the episode's tools (on the reset's observation)"
    )
    verification: Verification | None = Field(
        default=None, description="the task's verification (on the reply that ends the episode)"
    )


class StateFields(BaseModel):
    """qpa's part of a session's state, besides OpenEnv's `episode_id` and `step_count`."""

    session_id: str | None = Field(default=None, description="the qpa session id")
    task_id: str | None = Field(default=None, description="the task of the current episode")
    finished: bool | None = Field(default=None, description="whether the episode finished")
    state: Any = Field(default=None, description="the environment's state snapshot")


class WireAction(ActionFields):
    """The step message's `data`, as `GET /schema` publishes it (OpenEnv's `Action` fields)."""

    model_config = ConfigDict(extra="forbid", title="QpaAction")

    metadata: dict[str, Any] = Field(default_factory=dict)


class WireObservation(ObservationFields):
    """An observation, as `GET /schema` publishes it (OpenEnv's `Observation` fields)."""

    model_config = ConfigDict(extra="forbid", title="QpaObservation")

    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class WireState(StateFields):
    """A session's state, as `GET /schema` publishes it (OpenEnv's `State` fields)."""

    model_config = ConfigDict(extra="allow", title="QpaState")

    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)


# --------------------------------------------------------------------------- messages


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    data: dict[str, Any] | None = None


class _ResetData(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: Any  # validated as a qpa Task by the service (errors name 'task.<field>')
    episode_id: str | None = Field(default=None, max_length=255)


class _StepData(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Any  # validated as a qpa Action by the service (errors name 'action.<field>')
    metadata: dict[str, Any] = Field(default_factory=dict)


def _validate(model: type[_Message | _ResetData | _StepData], value: Any) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise _from_validation(exc) from None


def _code(exc: ServerError) -> str:
    if exc.kind in _CODES:
        return _CODES[exc.kind]
    if exc.status in (401, 403, 404, 409):
        return _SESSION_CODE
    return "VALIDATION_ERROR" if exc.status in (400, 413, 422) else "EXECUTION_ERROR"


_NOT_PLAIN = object()
_STEP_KEYS = frozenset({"type", "data"})
_STEP_DATA_KEYS = frozenset({"action", "metadata"})


def _plain_step(raw: bytes) -> Any:
    """A well-formed step message's action JSON, else `_NOT_PLAIN` (the models then name what
    is wrong): most messages are steps, and orjson plus two key checks cost a fraction of
    validating the envelope with pydantic before the service validates the action."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _NOT_PLAIN
    if type(message) is not dict or message.get("type") != "step" or message.keys() - _STEP_KEYS:
        return _NOT_PLAIN
    data = message.get("data")
    if type(data) is not dict or "action" not in data or data.keys() - _STEP_DATA_KEYS:
        return _NOT_PLAIN
    if type(data.get("metadata", {})) is not dict:
        return _NOT_PLAIN
    return data["action"]


def error_message(exc: ServerError) -> bytes:
    """A refusal as OpenEnv's error message (its code, qpa's kind, status and field)."""
    data: dict[str, Any] = {
        "message": exc.message,
        "code": _code(exc),
        "kind": exc.kind,
        "status": exc.status,
    }
    if exc.field is not None:
        data["field"] = exc.field
    return orjson.dumps({"type": "error", "data": data})


def _result(feedback: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """OpenEnv's step result from qpa's feedback JSON (reward and done outside the
    observation, as OpenEnv's `serialize_observation` puts them)."""
    reward = extra.pop("reward", None)
    observation = {
        "status": feedback["status"],
        "observation": feedback.get("observation"),
        "error": feedback.get("error"),
        "message": feedback.get("message", ""),
        **extra,
    }
    return {"observation": observation, "reward": reward, "done": bool(feedback["done"])}


class OpenEnvSession:
    """One WebSocket's episode session: OpenEnv messages in, OpenEnv messages out (bytes)."""

    def __init__(self, service: EnvService, client: str, limit: int) -> None:
        self.service = service
        self.client = client
        self.limit = limit
        self.session_id: str | None = None
        self.episode_id: str | None = None
        self.done = False

    async def handle(self, raw: bytes) -> bytes | None:
        """The answer to one message; None after `close` (the caller closes the socket)."""
        try:
            if len(raw) > self.limit:
                raise ServerError(
                    413,
                    "body_too_large",
                    f"message of {len(raw)} bytes exceeds the limit of {self.limit}",
                )
            action = _plain_step(raw)
            if action is not _NOT_PLAIN:  # the hot path: no envelope models
                return self._reply("observation", await self.step(action))
            try:
                message = _Message.model_validate_json(raw)
            except ValidationError as exc:
                raise _from_validation(exc) from None
            return await self._dispatch(message)
        except ServerError as exc:
            return error_message(self.service.locate(exc, None))
        except Exception as exc:
            logger.exception("bug while answering an OpenEnv message")
            return error_message(
                ServerError(500, "internal", f"internal error: {type(exc).__name__}: {exc}")
            )

    async def _dispatch(self, message: _Message) -> bytes | None:
        kind = message.type
        if kind == "reset":
            data = self._data(message, required=True)
            return self._reply("observation", await self.reset(_validate(_ResetData, data)))
        if kind == "step":
            data = self._data(message, required=True)
            return self._reply("observation", await self.step(_validate(_StepData, data).action))
        if kind in ("state", "close", "verify", "tools") and message.data:
            raise ServerError(
                422,
                "invalid_request",
                f"unexpected field 'data': a {kind} message carries none",
                field="data",
            )
        if kind == "state":
            return self._reply("state", await self.state())
        if kind == "close":
            await self.close()
            return None
        if kind == "verify":
            return b'{"type":"verification","data":' + await self.verify() + b"}"
        if kind == "tools":
            return b'{"type":"tools","data":' + await self._tools(self._live()) + b"}"
        raise ServerError(
            422,
            "unknown_message_type",
            f"unknown message type {kind!r}; this server answers {', '.join(_MESSAGE_TYPES)}",
            field="type",
        )

    @staticmethod
    def _data(message: _Message, *, required: bool) -> dict[str, Any]:
        if message.data is None and required:
            raise ServerError(
                422,
                "invalid_request",
                f"missing field 'data': a {message.type} message carries its arguments there",
                field="data",
            )
        return message.data or {}

    @staticmethod
    def _reply(kind: str, data: dict[str, Any]) -> bytes:
        return orjson.dumps({"type": kind, "data": data})

    def _live(self) -> str:
        if self.session_id is None:
            raise ServerError(
                409,
                "no_episode",
                "no episode on this connection: send a reset message with the task first",
                field="type",
            )
        return self.session_id

    async def _tools(self, session_id: str) -> bytes:
        return await self.service.tools(session_id, self.client)

    async def reset(self, data: _ResetData) -> dict[str, Any]:
        body = orjson.dumps({"task": data.task, "session_id": self.session_id})
        reply = orjson.loads(await self.service.reset(body, self.client))
        self.session_id = str(reply["session_id"])
        self.episode_id = data.episode_id
        feedback = reply["feedback"]
        self.done = bool(feedback["done"])
        tools = orjson.loads(await self._tools(self.session_id))["tools"]
        extra: dict[str, Any] = {"tools": tools}
        if self.done:
            extra.update(await self._ending())
        return _result(feedback, **extra)

    async def step(self, action: Any) -> dict[str, Any]:
        """Apply one action (its JSON, validated by the service: errors name 'action.<field>')."""
        session_id = self._live()
        body = orjson.dumps({"session_id": session_id, "action": action})
        feedback = orjson.loads(await self.service.step(body, self.client))["feedback"]
        extra: dict[str, Any] = {}
        if feedback["done"] and not self.done:
            self.done = True
            extra = await self._ending()
        return _result(feedback, **extra)

    async def _ending(self) -> dict[str, Any]:
        verification = orjson.loads(await self.verify())
        return {"verification": verification, "reward": 1.0 if verification["success"] else 0.0}

    async def verify(self) -> bytes:
        body = orjson.dumps({"session_id": self._live()})
        return await self.service.verify(body, self.client)

    async def state(self) -> dict[str, Any]:
        if self.session_id is None:
            return WireState().model_dump()
        snapshot = orjson.loads(await self.service.state(self.session_id, self.client))
        return {
            "episode_id": self.episode_id or snapshot["session_id"],
            "step_count": snapshot["steps"],
            "session_id": snapshot["session_id"],
            "task_id": snapshot["task_id"],
            "finished": snapshot["finished"],
            "state": snapshot["state"],
        }

    async def close(self) -> None:
        """Close the session (idempotent; an already expired or evicted one is gone anyway)."""
        session_id, self.session_id = self.session_id, None
        if session_id is not None:
            with contextlib.suppress(ServerError):
                await self.service.delete(session_id, self.client)


# --------------------------------------------------------------------------- routes


def _version() -> str:
    try:
        return importlib_metadata.version("qpa")
    except importlib_metadata.PackageNotFoundError:
        return "0.0.0"


async def _receive(websocket: WebSocket) -> bytes:
    """The next message's bytes (text or binary frame); WebSocketDisconnect when it closed."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
    text = message.get("text")
    if text is not None:
        return str(text).encode()
    return bytes(message.get("bytes") or b"")


async def _refuse(websocket: WebSocket, exc: ServerError) -> None:
    """Refuse the handshake: qpa's HTTP error (401 with its JSON body) where the server can
    answer a WebSocket handshake with a response, else an OpenEnv error message and a close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        body = error_body(exc.kind, exc.message, exc.field)
        response = Response(body, exc.status, headers=exc.headers, media_type="application/json")
        await websocket.send_denial_response(response)
        return
    await websocket.accept()
    await websocket.send_text(error_message(exc).decode())
    await websocket.close(code=POLICY_VIOLATION, reason=exc.kind)


def mount_openenv(app: EnvServerApp) -> None:
    """Add OpenEnv's routes (`/ws`, `/schema`, `/metadata`) to an app from `create_app`."""
    service: EnvService = app.state.service
    front = app.front
    if not isinstance(front, _FastPath):
        raise TypeError("mount_openenv needs an app made by qpa.envs.server.create_app")
    kind = str(app.state.kind)
    schemas = orjson.dumps(
        {
            "action": WireAction.model_json_schema(),
            "observation": WireObservation.model_json_schema(),
            "state": WireState.model_json_schema(),
        }
    )
    about = orjson.dumps(
        {
            "name": f"qpa-{kind}",
            "description": (
                f"qpa's {kind} environment: a mobile personal-assistant task per episode "
                "(reset with a qpa Task, step with qpa actions, verified on finish)"
            ),
            "readme_content": None,
            "version": _version(),
            "author": "qpa",
            "documentation_url": None,
        }
    )

    @app.get("/schema", tags=["OpenEnv"])
    async def openenv_schema() -> Response:
        """OpenEnv: the JSON schemas of the action, observation and state."""
        return Response(schemas, media_type="application/json")

    @app.get("/metadata", tags=["OpenEnv"])
    async def openenv_metadata() -> Response:
        """OpenEnv: the environment's name, description and version."""
        return Response(about, media_type="application/json")

    @app.websocket("/ws")
    async def openenv_socket(websocket: WebSocket) -> None:
        """OpenEnv: one episode session per connection (messages in the module doc)."""
        try:
            client = front.identify(websocket.scope)
        except ServerError as exc:
            await _refuse(websocket, exc)
            return
        await websocket.accept()
        session = OpenEnvSession(service, client, front.limit)
        try:
            while True:
                answer = await session.handle(await _receive(websocket))
                if answer is None:
                    break
                await websocket.send_text(answer.decode())
        except WebSocketDisconnect:
            pass
        finally:
            await session.close()
        with contextlib.suppress(RuntimeError):  # the client may have closed first
            await websocket.close()
