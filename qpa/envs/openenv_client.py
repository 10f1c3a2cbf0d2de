"""`QpaEnv`: OpenEnv's own client (`openenv-core`'s `EnvClient`) for `qpa env serve`.

As OpenEnv environments ship theirs, qpa publishes its action, observation and state types as
subclasses of OpenEnv's (`QpaAction`, `QpaObservation`, `QpaState`) and a client class that
subclasses OpenEnv's `EnvClient`; the protocol and the mapping onto qpa's contract are in
`qpa.envs.openenv`. Needs the `openenv` extra (`pip install 'qpa[openenv]'`).

    env = QpaEnv(base_url="http://127.0.0.1:8000").sync()
    with env:
        result = env.reset(task=task)             # result.observation.tools: the episode's tools
        result = env.step(QpaAction(action=ToolCall(tool="contacts_search", arguments={...})))
        result = env.step(Finish())               # a bare qpa action works too
        result.reward, result.observation.verification   # 1.0 on a verified success

Any other OpenEnv client (`GenericEnvClient`, plain dictionaries) drives the same server; this
one adds typed results, qpa's `verify()` and `tools()` messages, and a bearer `token` for
servers started with a tokens file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action as OpenEnvAction
from openenv.core.env_server.types import Observation as OpenEnvObservation
from openenv.core.env_server.types import State as OpenEnvState
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from qpa.contract import ACTION_ADAPTER, Action, Task, ToolSpec, Verification
from qpa.envs.openenv import ActionFields, ObservationFields, StateFields


class QpaAction(OpenEnvAction, ActionFields):
    """One qpa action (`action`), as OpenEnv's `Action` (with its `metadata`)."""


class QpaObservation(OpenEnvObservation, ObservationFields):
    """qpa's feedback as OpenEnv's `Observation`: `done`, `reward` and qpa's fields."""


class QpaState(OpenEnvState, StateFields):
    """A qpa session's state as OpenEnv's `State` (`episode_id`, `step_count`, qpa's fields)."""


class QpaEnv(EnvClient[QpaAction, QpaObservation, QpaState]):
    """OpenEnv client of a qpa environment server (one WebSocket, one episode session)."""

    _ws: ClientConnection | None

    def __init__(self, base_url: str, *, token: str | None = None, **options: Any) -> None:
        """`base_url` is the server's (http:// or ws://); `token` its bearer token, if any;
        `options` go to OpenEnv's `EnvClient` (timeouts, message size)."""
        super().__init__(base_url, **options)
        self._token = token

    async def connect(self) -> QpaEnv:
        """Open the WebSocket (with the bearer token, when one is given). A refused handshake
        raises ConnectionError with the server's answer (status and qpa's error message)."""
        if self._ws is not None:
            return self
        local = any(host in self._ws_url.lower() for host in ("localhost", "127.0.0.1"))
        headers = {"Authorization": f"Bearer {self._token}"} if self._token is not None else {}
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=headers,
                proxy=None if local else True,  # as EnvClient.connect: no proxy to localhost
            )
        except InvalidStatus as exc:
            answer = exc.response.body.decode("utf-8", "replace") if exc.response.body else ""
            raise ConnectionError(
                f"{self._ws_url} refused the connection: HTTP {exc.response.status_code} {answer}"
            ) from exc
        except Exception as exc:
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    async def reset(
        self, task: Task | Mapping[str, Any] | None = None, **options: Any
    ) -> StepResult[QpaObservation]:
        """Start an episode of `task` (a qpa `Task` or its JSON); `options`: `episode_id`."""
        if task is not None:
            options["task"] = task.model_dump(mode="json") if isinstance(task, Task) else task
        result: StepResult[QpaObservation] = await super().reset(**options)
        return result

    async def verify(self) -> Verification:
        """The task's verification of the episode's current state (qpa's `verify` message)."""
        response = await self._send_and_receive({"type": "verify"})
        return Verification.model_validate(response.get("data", {}))

    async def tools(self) -> list[ToolSpec]:
        """The tools of the current episode (qpa's `tools` message)."""
        response = await self._send_and_receive({"type": "tools"})
        return [ToolSpec.model_validate(t) for t in response.get("data", {}).get("tools", [])]

    def _step_payload(self, action: QpaAction | Action) -> dict[str, Any]:
        if isinstance(action, QpaAction):
            payload: dict[str, Any] = action.model_dump(mode="json")
            return payload
        if isinstance(action, BaseModel):
            return {"action": ACTION_ADAPTER.dump_python(action, mode="json"), "metadata": {}}
        raise TypeError(f"a step takes a QpaAction or a qpa Action, not {type(action).__name__}")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[QpaObservation]:
        observation = QpaObservation.model_validate(
            {
                **payload.get("observation", {}),
                "done": payload.get("done", False),
                "reward": payload.get("reward"),
            }
        )
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
        )

    def _parse_state(self, payload: dict[str, Any]) -> QpaState:
        return QpaState.model_validate(payload)


__all__ = ["QpaAction", "QpaEnv", "QpaObservation", "QpaState"]
