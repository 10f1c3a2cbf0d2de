"""The Harness as a KServe custom predictor: `qpa harness serve`.

A request names a user and a query (and optionally a suite task, an environment server URL, or
a whole task); the Harness runs the episode with its configured planner, Skills and memory and
answers with the final answer, the actions taken and the token usage. KServe's own endpoints
(`/v1/models/<name>:predict`, `/v2/health/ready`, `/v2/models/<name>/ready`, `/metrics`) are
served unchanged; the server binds to the host it is told.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.contract import Environment, Policy, Task
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.registry import all_apps
from qpa.envs.sandbox.suite import DEFAULT_SUITE, get_task
from qpa.harness.factory import PlannerFactory, PlannerSpec
from qpa.harness.runner import run_episode


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
    """What a caller sends to the Harness predictor."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1)
    query: str | None = Field(default=None, min_length=1)
    task_id: str | None = None
    task: Task | None = None
    suite: str = DEFAULT_SUITE
    env_url: str | None = None
    max_turns: int = Field(default=40, ge=1, le=200)


class HarnessResponse(BaseModel):
    answer: str | None
    success: bool | None
    actions: list[dict[str, Any]]
    usage: dict[str, int]
    turns: int
    error: str | None
    trajectory_id: str
    harness_version: str


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
    """KServe model whose `predict` runs one Harness episode per request."""

    def __init__(self, name: str, spec: PlannerSpec, *, env_url: str | None = None) -> None:
        super().__init__(name)
        self.spec = spec
        self.env_url = env_url
        self.factory = PlannerFactory(spec)
        self.ready = False

    def load(self) -> bool:
        """Ready once the planner's model is in memory (a `local` checkpoint, resolved from
        its path or URI when the spec was made); endpoint planners have nothing to load."""
        self.factory.warm()
        self.ready = True
        return self.ready

    def build_task(self, request: HarnessRequest) -> Task:
        if request.task is not None:
            task = request.task
        elif request.task_id is not None:
            task = get_task(request.task_id, request.suite)
        elif request.query is not None:
            return adhoc_task(request.user_id, request.query)
        else:
            raise ValueError("give one of 'query', 'task_id' or 'task'")
        user = task.user.model_copy(update={"user_id": request.user_id})
        update: dict[str, Any] = {"user": user}
        if request.query:
            update["instruction"] = request.query
        return task.model_copy(update=update)

    def run(self, request: HarnessRequest) -> HarnessResponse:
        task = self.build_task(request)
        env: Environment
        url = request.env_url or self.env_url
        if url:
            from qpa.envs.remote import RemoteEnv

            env = RemoteEnv(url)
        else:
            env = SandboxEnv()
        policy = Policy(
            planner=self.spec.name,
            model=self.spec.policy_model,
            harness_version=self.spec.harness.version,
        )
        try:
            trajectory = run_episode(
                env, task, self.factory(), policy=policy, max_turns=request.max_turns
            )
        finally:
            env.close()
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
        )

    async def predict(
        self,
        payload: Any,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        try:
            if isinstance(payload, bytes | str):  # a body sent without a JSON content type
                request = HarnessRequest.model_validate_json(payload)
            else:
                request = HarnessRequest.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<body>"
            raise kserve.errors.InvalidInput(f"field '{where}': {first.get('msg')}") from exc
        try:
            response = await asyncio.to_thread(self.run, request)
        except (KeyError, ValueError) as exc:
            raise kserve.errors.InvalidInput(str(exc.args[0] if exc.args else exc)) from exc
        return response.model_dump(mode="json")


def serve(model: HarnessModel, *, host: str, http_port: int) -> None:
    """Run KServe's REST server for `model` on host:port (KServe itself binds 0.0.0.0)."""
    from kserve.model_server import FASTAPI_APP_IMPORT_STRING
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
    asyncio.run(rest.start())
