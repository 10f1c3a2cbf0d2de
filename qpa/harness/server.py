"""The Harness as a KServe custom predictor: `qpa harness serve`.

A request names a query, a suite task or a whole task (and, optionally, the user it acts for);
the Harness runs the episode with its configured planner, Skills and memory and answers with the
final answer, the actions taken and the token usage. KServe's own endpoints
(`/v2/health/ready`, `/v2/models/<name>/ready`, `/metrics`, ...) are served unchanged; the
server binds to the host it is told.

What a caller cannot do (the server's configuration, `HarnessServeConfig`, decides instead):

- **choose the environment.** Episodes run in the environment server the Harness was started
  with (`--env-url`, e.g. a RolloutPool's Service) or in an in-process sandbox; a request that
  names `env_url`, or any other unknown field, is refused (400, the field named).
- **act as another user.** With bearer tokens (`--tokens-file`) or a trusted proxy's identity
  header (`--identity-header`, honoured only on a request that carries the proxy's shared
  secret, `--proxy-secret-file`, in `X-Qpa-Proxy-Secret`: one that reaches the pod without the
  proxy is 401 and touches no memory), the caller's user id comes from its credentials: a request's
  `user_id`, when given, must be that id (else 403), and the episode reads and writes that
  user's memory only. Without credentials configured, callers are anonymous: each episode gets a
  fresh memory that is thrown away, so no request reads or writes any user's stored memory
  (`--insecure-single-user ID` is the development mode in which every caller is user ID).
- **confirm payments for the user.** Which payment tools the user confirmed comes from the
  caller's own top-level `confirm` field, and only from an authenticated caller; a request's
  `task` carrying `confirmations` is refused (400, `task.confirmations`). A suite task
  (`task_id`) keeps the confirmations its suite gives it.
- **send numbers JSON does not have.** `NaN`, `Infinity` or a literal overflowing a double
  anywhere in the body is refused (400, the field named).

Every bad request gets a 4xx JSON answer `{"error": message, "kind": kind, "field": path}`:
400 malformed JSON or a field that breaks the request schema, 401 missing or unknown
credentials, 403 another user's id, 404 an unknown route or model, 413 a body over the limit
(`max_body_bytes`); requests must arrive within `read_timeout_seconds` (else 408 and the
connection is closed). The predict route is answered in front of KServe's stack, so no input can
reach a code path that answers 500; every other non-GET route (`:explain`, v2 `infer`, the model
repository's `load`/`unload`) answers 404.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from qpa.api.v1alpha1.rules import PROXY_SECRET_HEADER
from qpa.contract import Environment, Policy, Task
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.registry import all_apps
from qpa.envs.sandbox.suite import DEFAULT_SUITE, get_task
from qpa.envs.server import (
    ServerError,
    field_path,
    non_finite_field,
    non_finite_message,
    timed_protocol,
)
from qpa.envs.tokens import IDENTITY_PATTERN, AuthError, TokenTable
from qpa.harness.agent import HarnessPlanner
from qpa.harness.factory import PlannerFactory, PlannerSpec
from qpa.harness.memory import MemoryStore
from qpa.harness.metrics import IN_FLIGHT, episode_recorded, error_recorded, recorded
from qpa.harness.runner import run_episode
from qpa.harness.serve_config import HarnessServeConfig

logger = logging.getLogger("qpa.harness.server")

MAX_QUERY_CHARS = 8000
TASK_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,200}$"
SUITE_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"
_IDENTITY = re.compile(IDENTITY_PATTERN)
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"
MAX_CONFIRMATIONS = 64
#: The shortest proxy secret accepted (characters, after stripping surrounding whitespace).
MIN_PROXY_SECRET_CHARS = 32


def _import_kserve() -> Any:
    # kserve parses sys.argv at import time; keep our own CLI flags away from its parser.
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        import kserve
    finally:
        sys.argv = argv
    return kserve


kserve = _import_kserve()


class HarnessRequest(BaseModel):
    """What a caller sends to the Harness predictor (never an environment: see the module)."""

    model_config = ConfigDict(extra="forbid")

    user_id: str | None = Field(default=None, pattern=IDENTITY_PATTERN)
    query: str | None = Field(default=None, min_length=1, max_length=MAX_QUERY_CHARS)
    task_id: str | None = Field(default=None, pattern=TASK_ID_PATTERN)
    task: Task | None = None
    suite: str = Field(default=DEFAULT_SUITE, pattern=SUITE_PATTERN)
    max_turns: int = Field(default=40, ge=1, le=200)
    #: payment tools the (authenticated) caller confirms for this episode
    confirm: list[Annotated[str, StringConstraints(pattern=TOOL_NAME_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_CONFIRMATIONS
    )

    @model_validator(mode="after")
    def _what_to_do(self) -> Self:
        if self.task is not None and self.task_id is not None:
            raise ValueError("task_id: give 'task_id' or 'task', not both")
        if self.task is None and self.task_id is None and self.query is None:
            raise ValueError("query: give one of 'query', 'task_id' or 'task'")
        if self.task is not None and self.task.confirmations:
            raise ValueError(
                "task.confirmations: a task cannot bring its own payment confirmations; the "
                "caller confirms payment tools in the request's 'confirm' field"
            )
        return self


class HarnessResponse(BaseModel):
    answer: str | None
    success: bool | None
    actions: list[dict[str, Any]]
    usage: dict[str, int]
    turns: int
    error: str | None
    trajectory_id: str
    harness_version: str
    user_id: str
    memory: Literal["persistent", "ephemeral"]


class RequestRefused(ServerError):
    """A request the server refuses: a 4xx JSON answer naming the field (KServe's error shape:
    `{"error": message, "kind": ..., "field": ...}`, not the env server's nested one)."""

    def body(self) -> bytes:
        return orjson.dumps({"error": self.message, "kind": self.kind, "field": self.field})


@dataclass(frozen=True)
class Caller:
    """Who sent a request: an authenticated user id, or None for an anonymous caller."""

    user_id: str | None

    @property
    def memory(self) -> Literal["persistent", "ephemeral"]:
        return "ephemeral" if self.user_id is None else "persistent"


class ProxySecretError(ValueError):
    """The proxy secret file cannot be read or is too short to be a secret."""


class ProxySecret:
    """The secret a trusted proxy sends in `X-Qpa-Proxy-Secret`, from a file (a mounted
    Secret), re-read when the file changes (a rotated Secret); compared in constant time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._secret = b""
        self._load()

    def _load(self) -> None:
        try:
            stat = os.stat(self.path)
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp == self._stamp:
                return
            with open(self.path, "rb") as handle:
                secret = handle.read(4096).strip()
        except OSError as exc:
            raise ProxySecretError(f"cannot read {self.path}: {exc.strerror}") from None
        if len(secret) < MIN_PROXY_SECRET_CHARS:
            raise ProxySecretError(
                f"{self.path}: the proxy secret must be at least {MIN_PROXY_SECRET_CHARS} "
                "characters"
            )
        self._secret, self._stamp = secret, stamp

    def matches(self, given: str | None) -> bool:
        if given is None:
            return False
        try:
            self._load()
        except ProxySecretError:
            logger.exception("proxy secret: keeping the last one read")
        return hmac.compare_digest(given.encode("latin-1", "replace"), self._secret)


class Authenticator:
    """Maps a request's headers to its `Caller`, as `HarnessServeConfig` says."""

    def __init__(
        self,
        config: HarnessServeConfig,
        tokens: TokenTable | None = None,
        proxy: ProxySecret | None = None,
    ) -> None:
        self.config = config
        self.tokens = tokens
        if tokens is None and config.tokens_file:
            self.tokens = TokenTable(config.tokens_file)
        self.proxy = proxy
        if proxy is None and config.proxy_secret_file:
            self.proxy = ProxySecret(config.proxy_secret_file)

    def caller(self, headers: Mapping[str, str]) -> Caller:
        config = self.config
        if config.insecure_single_user:
            return Caller(config.insecure_single_user)
        if not config.authenticates and self.tokens is None:
            return Caller(None)
        authorization = headers.get("authorization")
        if self.tokens is not None and (authorization or not config.identity_header):
            try:
                return Caller(self.tokens.identity(authorization))
            except AuthError as exc:
                raise _unauthenticated(exc.message, "Authorization") from None
        header = str(config.identity_header)
        value = headers.get(header)
        proof = headers.get(PROXY_SECRET_HEADER)
        if value is None and proof is None:
            raise _unauthenticated(f"missing the '{header}' identity header", header)
        if self.proxy is None or not self.proxy.matches(proof):
            # the header did not provably come from the proxy: whoever set it is no one
            raise _unauthenticated(
                f"the '{header}' identity header is trusted only from the proxy, which proves "
                f"itself with '{PROXY_SECRET_HEADER}'; this request did not come through it",
                PROXY_SECRET_HEADER,
            )
        if value is None:
            raise _unauthenticated(f"missing the '{header}' identity header", header)
        if not _IDENTITY.fullmatch(value):
            raise _unauthenticated(f"the '{header}' header is not a user id", header)
        return Caller(value)


def _unauthenticated(message: str, field: str) -> RequestRefused:
    return RequestRefused(
        401, "unauthenticated", message, field=field, headers={"WWW-Authenticate": "Bearer"}
    )


def parse_request(body: bytes | str | Mapping[str, Any]) -> HarnessRequest:
    """A `HarnessRequest` from a raw or decoded body; RequestRefused names the field."""
    if isinstance(body, bytes | str) and (path := non_finite_field(body)) is not None:
        raise RequestRefused(400, "invalid_input", non_finite_message(path), field=path)
    try:
        if isinstance(body, bytes | str):
            return HarnessRequest.model_validate_json(body)
        return HarnessRequest.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc) from None


def _refusal(exc: ValidationError) -> RequestRefused:
    errors = exc.errors(include_url=False, include_context=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return RequestRefused(
            400, "malformed_json", f"malformed JSON body: {first['msg']}", field="body"
        )
    path = field_path(first["loc"])
    if first["type"] in ("model_type", "model_attributes_type", "dict_type") and not path:
        return RequestRefused(
            400, "invalid_input", "the request body must be a JSON object", field="body"
        )
    if not path:  # a rule across fields names its field first ("query: ...")
        message = str(first["msg"]).removeprefix("Value error, ")
        field, _, _ = message.partition(":")
        return RequestRefused(400, "invalid_input", message, field=field or None)
    if first["type"] == "extra_forbidden":
        if path == "env_url":
            return RequestRefused(
                400,
                "invalid_input",
                "field 'env_url': a request cannot choose the environment; episodes run in "
                "the one the server was configured with (--env-url)",
                field="env_url",
            )
        return RequestRefused(400, "invalid_input", f"unexpected field '{path}'", field=path)
    if first["type"] == "missing":
        return RequestRefused(400, "invalid_input", f"missing field '{path}'", field=path)
    return RequestRefused(400, "invalid_input", f"field '{path}': {first['msg']}", field=path)


def _task_refused(trajectory: Any) -> str | None:
    """Why the environment refused a caller's own task at reset (its content, not an outage)."""
    if trajectory.steps:
        return None
    error: str = trajectory.error or ""
    abort = trajectory.metadata.get("abort", {})
    if error.startswith("environment: reset failed:") and "server busy" not in error:
        return error.removeprefix("environment: reset failed:").strip()
    if abort.get("component") == "env.reset" and abort.get("exception") != "RemoteEnvError":
        return error.removeprefix("environment:").strip()
    return None


def adhoc_task(user_id: str, query: str) -> Task:
    """A free-form query on a fresh phone with every sandbox app installed."""
    digest = hashlib.sha256(f"{user_id}|{query}".encode()).hexdigest()[:12]
    return Task(
        id=f"adhoc.{digest}",
        suite="adhoc",
        domain="adhoc",
        capabilities=["tool_use"],
        instruction=query,
        apps=list(all_apps()),
        source="request",
    )


class HarnessModel(kserve.Model):  # type: ignore[name-defined]
    """KServe model whose requests each run one Harness episode."""

    def __init__(
        self,
        name: str,
        spec: PlannerSpec,
        *,
        config: HarnessServeConfig | None = None,
        authenticator: Authenticator | None = None,
    ) -> None:
        super().__init__(name)
        self.spec = spec
        self.config = config or HarnessServeConfig(name=name)
        self.env_url = self.config.env_url
        self.auth = authenticator or Authenticator(self.config)
        self.factory = PlannerFactory(spec)
        self.ready = False

    def load(self) -> bool:
        """Ready once the planner's model is in memory (a `local` checkpoint, resolved from
        its path or URI when the spec was made); endpoint planners have nothing to load."""
        self.factory.warm()
        self.ready = True
        return self.ready

    def admit(self, request: HarnessRequest, caller: Caller) -> tuple[Task, str]:
        """The task to run and the user it runs for; RequestRefused when the caller may not."""
        if caller.user_id is not None:
            if request.user_id is not None and request.user_id != caller.user_id:
                raise RequestRefused(
                    403,
                    "forbidden",
                    "field 'user_id': the caller may act only for its own user",
                    field="user_id",
                )
            user = caller.user_id
        elif request.confirm:
            raise RequestRefused(
                401,
                "unauthenticated",
                "field 'confirm': only an authenticated caller confirms payments",
                field="confirm",
                headers={"WWW-Authenticate": "Bearer"},
            )
        elif request.user_id is None:
            raise RequestRefused(400, "invalid_input", "missing field 'user_id'", field="user_id")
        else:
            user = request.user_id
        return self.build_task(request, user), user

    def build_task(self, request: HarnessRequest, user_id: str) -> Task:
        if request.task is not None:
            task = request.task
        elif request.task_id is not None:
            try:
                task = get_task(request.task_id, request.suite)
            except KeyError as exc:
                message = str(exc.args[0] if exc.args else exc)
                field = "suite" if message.startswith("unknown suite") else "task_id"
                raise RequestRefused(400, "invalid_input", message, field=field) from None
            except ValueError as exc:
                raise RequestRefused(400, "invalid_input", str(exc), field="suite") from None
        else:
            task = adhoc_task(user_id, str(request.query))
        user = task.user.model_copy(update={"user_id": user_id})
        update: dict[str, Any] = {"user": user}
        if request.confirm:  # the caller's own confirmations, besides a suite task's
            mine = [t for t in request.confirm if t not in task.confirmations]
            update["confirmations"] = [*task.confirmations, *mine]
        if request.query and task.source != "request":
            update["instruction"] = request.query
        return task.model_copy(update=update)

    def run(self, task: Task, request: HarnessRequest, caller: Caller) -> HarnessResponse:
        env: Environment
        if self.env_url:
            from qpa.envs.remote import RemoteEnv

            env = RemoteEnv(self.env_url)
        else:
            env = SandboxEnv()
        planner = self.factory()
        ephemeral: MemoryStore | None = None
        if caller.memory == "ephemeral" and isinstance(planner, HarnessPlanner):
            ephemeral = planner.memory = MemoryStore()  # nothing of any stored user's memory
        policy = Policy(
            planner=self.spec.name,
            model=self.spec.policy_model,
            harness_version=self.spec.harness.version,
        )
        in_flight = IN_FLIGHT.labels(model=self.name)
        in_flight.inc()
        try:
            trajectory = run_episode(env, task, planner, policy=policy, max_turns=request.max_turns)
        finally:
            in_flight.dec()
            env.close()
            if ephemeral is not None:
                ephemeral.close()
        episode_recorded(self.name, trajectory)
        refused = _task_refused(trajectory) if request.task is not None else None
        if refused is not None:
            raise RequestRefused(
                400,
                "invalid_input",
                f"field 'task': the environment cannot start this task: {refused}",
                field="task",
            )
        totals = trajectory.totals
        return HarnessResponse(
            answer=trajectory.answer,
            success=trajectory.verification.success if trajectory.verification else None,
            actions=[
                {"agent": s.agent, **s.action.model_dump(mode="json"), "status": s.feedback.status}
                for s in trajectory.steps
            ],
            usage={
                "prompt_tokens": totals.prompt_tokens,
                "completion_tokens": totals.completion_tokens,
                "tool_calls": totals.tool_calls,
            },
            turns=totals.turns,
            error=trajectory.error,
            trajectory_id=trajectory.id,
            harness_version=self.spec.harness.version,
            user_id=task.user.user_id,
            memory=caller.memory,
        )

    async def answer(
        self, body: bytes | str | Mapping[str, Any], headers: Mapping[str, str]
    ) -> bytes:
        """One request, end to end: authenticate, validate, run; RequestRefused on bad input."""
        caller = self.auth.caller(headers)
        request = parse_request(body)
        task, _ = self.admit(request, caller)
        response = await asyncio.to_thread(self.run, task, request, caller)
        return response.__pydantic_serializer__.to_json(response)

    async def predict(
        self,
        payload: Any,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """KServe's entry point (in-process use; `serve` answers the route in front of it)."""
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        try:
            raw = await self.answer(payload, lowered)
        except RequestRefused as exc:
            raise kserve.errors.InvalidInput(exc.message) from exc
        result: dict[str, Any] = orjson.loads(raw)
        return result


async def _read_body(receive: Receive, scope: Scope, limit: int) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise RequestRefused(400, "malformed_request", "invalid Content-Length") from None
            if declared > limit:
                raise RequestRefused(
                    413, "body_too_large", f"request body of {declared} bytes exceeds {limit}"
                )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestRefused(413, "body_too_large", f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(
    send: Send, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class HarnessFront:
    """ASGI front of KServe's app: answers the predict route itself, refuses every other
    request that is not a GET (explain, v2 infer, the model repository's load and unload, which
    would let any caller unload the model), and passes GETs (health, readiness, metrics)
    through."""

    def __init__(self, app: ASGIApp, model: HarnessModel) -> None:
        self.app = app
        self.model = model
        self.predict_path = f"/v1/models/{model.name}:predict"
        self.limit = model.config.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path != self.predict_path and scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)  # health, readiness, metadata, metrics
            return
        if path == self.predict_path:  # counted for the release's canary analysis
            send = recorded(send, self.model.name)
        try:
            if path != self.predict_path:
                raise RequestRefused(
                    404,
                    "not_found",
                    f"{scope['method']} {path}: this predictor answers only "
                    f"POST {self.predict_path} (and GET health, readiness and metrics)",
                )
            if scope["method"] != "POST":
                raise RequestRefused(405, "method_not_allowed", f"use POST {self.predict_path}")
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            caller = self.model.auth.caller(headers)  # before reading a body: 401 is cheap
            request = parse_request(await _read_body(receive, scope, self.limit))
            task, _ = self.model.admit(request, caller)
            if not self.model.ready:
                raise RequestRefused(503, "not_ready", "the Harness is still loading")
            response = await asyncio.to_thread(self.model.run, task, request, caller)
        except RequestRefused as exc:
            error_recorded(self.model.name, exc.kind)
            await _send(send, exc.status, exc.body(), exc.headers)
            return
        except ConnectionAbortedError:
            return
        except Exception as exc:  # a bug: answer it, log it, keep serving
            error_recorded(self.model.name, "internal")
            logger.exception("bug while serving %s", path)
            body = orjson.dumps(
                {"error": f"internal error: {type(exc).__name__}", "kind": "internal"}
            )
            await _send(send, 500, body)
            return
        await _send(send, 200, response.__pydantic_serializer__.to_json(response))


def serve(model: HarnessModel, *, host: str, http_port: int) -> None:
    """Run KServe's REST server for `model` on host:port (KServe itself binds 0.0.0.0), with the
    predict route answered by `HarnessFront` and a read timeout on every request."""
    from kserve.model_server import FASTAPI_APP_IMPORT_STRING
    from kserve.model_server import app as kserve_app
    from kserve.protocol.rest.server import RESTServer

    model.load()
    server = kserve.ModelServer(http_port=http_port, enable_grpc=False, workers=1)
    server.register_model(model)
    rest = RESTServer(
        FASTAPI_APP_IMPORT_STRING,
        server.dataplane,
        server.model_repository_extension,
        http_port,
        workers=1,
    )
    rest.config.host = host
    rest.config.app = HarnessFront(kserve_app, model)
    rest.config.http = timed_protocol(model.config.read_timeout_seconds)
    asyncio.run(rest.start())
