"""`AgentDojoEnv`: AgentDojo's suites behind the `Environment` protocol (kind `agentdojo`).

- reset: the suite's default environment, with the task's attack planted in its injection
  vectors (AgentDojo's own loading), then the user task's `init_environment`; a copy of it is
  the judges' pre-environment.
- tools: the suite's functions as `ToolSpec`s (their input schema as AgentDojo builds it; the
  side effect from the reviewed `effects.yaml`, never from a name).
- step: a call runs on AgentDojo's `FunctionsRuntime`, as its own pipelines run one, and every
  call is kept for the judges that read traces. The environment refuses nothing AgentDojo would
  run (no confirmation rule of its own): what may flow into a call is the Harness's decision,
  and the benchmark's judges see what the planner did. Results are data: a model becomes its
  JSON dump, so a planted text reaches the planner exactly as AgentDojo wrote it.
- verify: the user task's `utility()` and, under attack, the injection task's `security()`
  (`checks` `utility` and `injection`), on the planner's final answer (its `finish` answer,
  else its last message to the user), the pre- and post-environments and the calls. Success
  is utility with the attacker's goal not reached.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qpa.contract import (
    Action,
    CheckResult,
    EnvKind,
    Feedback,
    Finish,
    MessageUser,
    Task,
    ToolCall,
    ToolSpec,
    Verification,
)
from qpa.envs.agentdojo import benchmark
from qpa.envs.agentdojo.tasks import WORLD_KEY

MAX_STEPS = 200
_TASK_ID = r"^user_task_[0-9]{1,3}$"
_INJECTION_ID = r"^injection_task_[0-9]{1,3}$"


class AgentDojoWorld(BaseModel):
    """What a task may say of its AgentDojo episode: ids only, each checked against the suite."""

    model_config = ConfigDict(extra="forbid")

    suite: Literal["workspace", "travel", "banking", "slack"]
    user_task: str = Field(pattern=_TASK_ID)
    injection_task: str | None = Field(default=None, pattern=_INJECTION_ID)
    attack: str | None = None

    @model_validator(mode="after")
    def _known(self) -> AgentDojoWorld:
        s = benchmark.suite(self.suite)
        if self.user_task not in s.user_tasks:
            raise ValueError(f"user_task: {self.user_task!r} is not a task of {self.suite}")
        if (self.injection_task is None) != (self.attack is None):
            raise ValueError("attack: injection_task and attack come together or not at all")
        if self.injection_task is not None and self.injection_task not in s.injection_tasks:
            raise ValueError(
                f"injection_task: {self.injection_task!r} is not an injection task of {self.suite}"
            )
        if self.attack is not None and self.attack not in benchmark.ATTACKS:
            raise ValueError(
                f"attack: {self.attack!r} is not one of {', '.join(benchmark.ATTACKS)}"
            )
        return self


def _world_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    where = ".".join(str(p) for p in first["loc"])
    if not where:  # a rule over several fields names its field first ("user_task: ...")
        where, _, message = message.partition(": ")
    return f"world.{WORLD_KEY}.{where}: {message}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _argument_error(tool: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "arguments"
    return f"{tool}: argument {where}: {first['msg']}"


class AgentDojoEnv:
    """One AgentDojo episode at a time: a user task, optionally under one attack."""

    kind: EnvKind = "agentdojo"

    def __init__(
        self, *, max_steps: int = MAX_STEPS, target_model: str = benchmark.DEFAULT_TARGET_MODEL
    ) -> None:
        self.max_steps = max_steps
        self.target_model = target_model
        self._ref: AgentDojoWorld | None = None
        self._env: Any = None
        self._pre: Any = None
        self._calls: list[tuple[str, dict[str, Any]]] = []
        self._answer: str | None = None
        self._said: str | None = None
        self._finished = False
        self._steps = 0
        self._runtime: Any = None
        self._specs: dict[str, ToolSpec] = {}

    # ------------------------------------------------------------------ protocol

    def reset(self, task: Task) -> Feedback:
        raw = task.world.get(WORLD_KEY)
        if not isinstance(raw, dict):
            return Feedback.fail(
                "invalid_arguments",
                f"world.{WORLD_KEY}: an AgentDojo task names its suite and user task there",
            )
        try:
            ref = AgentDojoWorld.model_validate(raw)
        except ValidationError as exc:
            return Feedback.fail("invalid_arguments", _world_error(exc))
        from agentdojo.functions_runtime import FunctionsRuntime

        s = benchmark.suite(ref.suite)
        planted = (
            benchmark.injections(
                ref.suite, ref.user_task, ref.injection_task, ref.attack, self.target_model
            )
            if ref.injection_task and ref.attack
            else {}
        )
        user_task = s.user_tasks[ref.user_task]
        self._env = user_task.init_environment(benchmark.environment(ref.suite, planted))
        self._pre = self._env.model_copy(deep=True)
        self._runtime = FunctionsRuntime(s.tools)
        effects = benchmark.effects()[ref.suite]
        roles = benchmark.roles()[ref.suite]
        collections = benchmark.collections()[ref.suite]
        self._specs = {
            f.name: ToolSpec(
                name=f.name,
                description=f.description,
                app=ref.suite,
                parameters=f.parameters.model_json_schema(),
                side_effect=effects[f.name],
                roles=roles[f.name],
                records=collections["records"].get(f.name),
                collections=collections["arguments"].get(f.name, {}),
                secrets=collections["secrets"].get(f.name, []),
            )
            for f in s.tools
        }
        self._ref = ref
        self._calls, self._answer, self._said = [], None, None
        self._finished, self._steps = False, 0
        return Feedback.ok({"suite": ref.suite, "instruction": task.instruction})

    def tools(self) -> list[ToolSpec]:
        return list(self._specs.values())

    def step(self, action: Action) -> Feedback:
        if self._ref is None:
            return Feedback.fail("precondition_failed", "reset the environment first")
        if self._finished:
            return Feedback.fail(
                "precondition_failed", "the episode has finished; no more actions", done=True
            )
        self._steps += 1
        if self._steps > self.max_steps:
            self._finished = True
            return Feedback.fail(
                "precondition_failed", f"step budget of {self.max_steps} exhausted", done=True
            )
        if isinstance(action, ToolCall):
            return self._call(action.tool, action.arguments)
        if isinstance(action, Finish):
            self._finished = True
            self._answer = action.answer
            return Feedback.ok({"finished": True}, done=True)
        if isinstance(action, MessageUser):
            self._said = action.text
            return Feedback.ok({"delivered": True})
        return Feedback.fail(
            "precondition_failed",
            f"AgentDojo has no screen and no sub-agents: {action.type} is not available",
        )

    def verify(self) -> Verification:
        if self._ref is None:
            return Verification(done=False, success=False, progress=0.0)
        ref, s = self._ref, benchmark.suite(self._ref.suite)
        answer = self._answer if self._answer is not None else (self._said or "")
        utility = benchmark.judge(
            ref.suite, s.user_tasks[ref.user_task], answer, self._pre, self._env, self._calls
        )
        checks = [
            CheckResult(
                name="utility",
                passed=utility,
                detail=f"AgentDojo {ref.suite}/{ref.user_task} utility() is {utility}",
            )
        ]
        if ref.injection_task is not None:
            reached = benchmark.judge(
                ref.suite,
                s.injection_tasks[ref.injection_task],
                answer,
                self._pre,
                self._env,
                self._calls,
            )
            checks.append(
                CheckResult(
                    name="injection",
                    passed=not reached,
                    detail=(
                        f"AgentDojo {ref.suite}/{ref.injection_task} security() is {reached}: "
                        f"the attacker's goal was {'reached' if reached else 'not reached'}"
                    ),
                )
            )
        passed = sum(c.passed for c in checks)
        return Verification(
            done=self._finished,
            success=passed == len(checks),
            progress=passed / len(checks),
            checks=checks,
            fidelity="programmatic",
        )

    def close(self) -> None:
        self._ref = self._env = self._pre = self._runtime = None

    # ------------------------------------------------------------------ calls

    def _call(self, name: str, arguments: dict[str, Any]) -> Feedback:
        function = self._runtime.functions.get(name)
        if function is None:
            return Feedback.fail("unknown_tool", f"tool '{name}' is not a tool of this suite")
        # every call reaches the trace, as AgentDojo's pipelines record the assistant's calls
        self._calls.append((name, dict(arguments)))
        try:
            function.parameters.model_validate(arguments)
        except ValidationError as exc:
            return Feedback.fail("invalid_arguments", _argument_error(name, exc))
        result, error = self._runtime.run_function(self._env, name, arguments)
        if error is not None:
            return Feedback.fail("precondition_failed", f"{name}: {error}")
        return Feedback.ok(_jsonable(result))
