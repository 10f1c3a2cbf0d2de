"""`McpEnv`: a real app's MCP server behind the `Environment` protocol (environment kind `mcp`).

The tools come from the server's tool list: each MCP tool becomes a `ToolSpec` (its input schema is
the parameters, its output schema the result; its side effect is `read` when the server marks it
read-only, `payment` when the task's `payment_tools` or the tool's `qpa/side_effect` meta says so,
`write` otherwise). A task scopes and configures the server through `task.world["_mcp"]`
(`qpa.envs.mcp.spec.McpWorld`): a reset tool that seeds the app, a verifier tool, a finish tool
told of the planner's `Finish`, tools to hide. What the environment decides itself, before the
server sees a call: unknown or hidden tools (`unknown_tool`), arguments that break the tool's input
schema (`invalid_arguments`, naming the argument), payments the user has not confirmed
(`permission_denied`), UI gestures and delegation, the step budget.

A call's result becomes `Feedback`: structured content (or the text content, parsed as JSON
when it is JSON) is the observation; a result the server flags `isError` is an error feedback
whose kind is the text's `kind:` prefix when it is one of the contract's error kinds (what
`qpa mcp serve` writes), `precondition_failed` otherwise; a protocol error is
`invalid_arguments` (invalid params) or `environment_failure`. A server that is gone or never
answered gives `environment_failure` naming it, and the episode goes on (the runner verifies).
Tool output is data: it reaches the planner as an observation, through the Harness's guard and
quoting like any environment's.

Verification: with a verifier tool, the server's own `VerifierReport` (`fidelity:
programmatic`); otherwise the task's rubric judged by a chat model (`fidelity: llm_judged`, as
the `llm_sim` environment does). A task's `verifier.answer` is checked on top, as in the other
environments. Success needs the episode finished.

Where the server is: `url` (streamable HTTP) or `command` (stdio), or the `QPA_MCP_URL` /
`QPA_MCP_COMMAND` environment variables, which is how `qpa env serve --kind mcp` fronts one.

What a task may call is the server side's to say, never the task's: a task comes from whoever
resets an episode (a client of `qpa env serve`), so its `_mcp.reset_tool`, `verifier_tool` and
`finish_tool` must each be one of `control_tools` (`$QPA_MCP_CONTROL_TOOLS`, comma separated;
default none), checked before anything reaches the MCP server; control tools and
`hidden_tools` (`$QPA_MCP_HIDDEN_TOOLS`: an admin tool, say) are never offered to the planner
nor callable by it, whatever the task's `tools` or `hidden_tools` say, and a hidden tool is
never called at all. A RolloutPool's `mcp` settings set these variables in its pods.

Argument roles (`ToolSpec.roles`: which arguments name a recipient, a target record, an amount,
content, a URL, a credential or an option; the Harness's guard checks the sink roles against the
user's request) come, per tool, from the first of: the server side's reviewed roles file
(`roles_file`, `$QPA_MCP_ROLES_FILE`: a YAML mapping tool name -> {argument: role}; checked at
construction and against the server's tool list at reset, an error naming the file, tool and
argument); the tool's `qpa/roles` meta (what `qpa mcp serve` exports; one naming an argument its
input schema lacks or an unknown role is refused, the tool left undeclared and the reason kept in
`refused_roles`); the server's `readOnlyHint` (a read declares no sinks: `{}`). Otherwise the
tool declares none (`None`), and the guard's strict mode refuses its state changes. A
RolloutPool does not yet carry a roles file to its pods (set the variable and mount the file).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import mcp_types as types
import yaml
from jsonschema import Draft202012Validator
from mcp import MCPError
from pydantic import ValidationError

from qpa.contract import (
    Action,
    ArgRole,
    CheckResult,
    EnvKind,
    ErrorKind,
    Feedback,
    Task,
    ToolSpec,
    Verification,
)
from qpa.envs.llmsim.client import ChatClient
from qpa.envs.llmsim.env import describe_schema_errors
from qpa.envs.mcp.connection import McpConnection, McpServerSpec, McpUnavailable
from qpa.envs.mcp.judge import RubricJudge
from qpa.envs.mcp.spec import WORLD_KEY, McpWorld, VerifierReport
from qpa.envs.sandbox.verify import answer_matches

__all__ = [
    "COMMAND_ENV",
    "CONTROL_TOOLS_ENV",
    "HIDDEN_TOOLS_ENV",
    "MAX_STEPS",
    "ROLES_FILE_ENV",
    "ROLES_META",
    "URL_ENV",
    "McpEnv",
    "check_roles",
    "load_roles_file",
    "parse_tool_names",
    "tool_roles",
    "tool_spec",
]

log = logging.getLogger(__name__)

MAX_STEPS = 200
URL_ENV = "QPA_MCP_URL"
COMMAND_ENV = "QPA_MCP_COMMAND"
#: The tools a task may name as its reset, verifier or finish tool (comma separated).
CONTROL_TOOLS_ENV = "QPA_MCP_CONTROL_TOOLS"
#: The tools never offered nor called, in any role (comma separated).
HIDDEN_TOOLS_ENV = "QPA_MCP_HIDDEN_TOOLS"
#: The server side's reviewed roles file (YAML: tool name -> {argument: role}).
ROLES_FILE_ENV = "QPA_MCP_ROLES_FILE"
#: The task world's fields that name a control tool.
CONTROL_FIELDS = ("reset_tool", "verifier_tool", "finish_tool")
#: Meta keys `qpa mcp serve` sets on its tools, read back here (a qpa task round-trips whole).
SIDE_EFFECT_META = "qpa/side_effect"
APP_META = "qpa/app"
ROLES_META = "qpa/roles"
_ROLES: frozenset[str] = frozenset(ArgRole.__args__)  # type: ignore[attr-defined]
INVALID_PARAMS = -32602
_ERROR_KINDS: frozenset[str] = frozenset(ErrorKind.__args__)  # type: ignore[attr-defined]
_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]{0,63}$")
_WRAPPED = re.compile(r"^Error executing tool \S+: ")
#: What an MCP tool's name may be (the spec's characters, 1 to 128 of them; never a comma).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def parse_tool_names(value: str | Sequence[str] | None, field: str) -> frozenset[str]:
    """Tool names from a list or a comma-separated string (`None`: none); `ValueError` naming
    `field` for a name that cannot be an MCP tool's."""
    if value is None:
        return frozenset()
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
    else:
        names = list(value)
    bad = [n for n in names if not isinstance(n, str) or not TOOL_NAME.match(n)]
    if bad:
        raise ValueError(
            f"{field}: {', '.join(map(repr, bad))} is not an MCP tool name (1 to 128 letters, "
            "digits, '_', '-' or '.')"
        )
    return frozenset(names)


def check_roles(roles: Any, arguments: Sequence[str] | None, *, where: str) -> dict[str, ArgRole]:
    """`roles` (argument -> role) when it is a mapping naming only the contract's roles and, when
    `arguments` is given, only those arguments; `ValueError` starting with `where` otherwise."""
    if roles is None:
        return {}
    if not isinstance(roles, Mapping):
        raise ValueError(
            f"{where}: roles must be a mapping of argument -> role, not {type(roles).__name__}"
        )
    for argument, role in roles.items():
        if not isinstance(argument, str) or (arguments is not None and argument not in arguments):
            known = ", ".join(map(repr, arguments or ())) or "none"
            raise ValueError(
                f"{where}: argument {argument!r} is not in the tool's input schema "
                f"(arguments: {known})"
            )
        if role not in _ROLES:
            raise ValueError(
                f"{where}: argument {argument!r}: unknown role {role!r} (roles: "
                f"{', '.join(sorted(_ROLES))})"
            )
    return cast(dict[str, ArgRole], dict(roles))


def load_roles_file(path: str | os.PathLike[str], field: str) -> dict[str, dict[str, ArgRole]]:
    """A reviewed roles file (YAML: tool name -> {argument: role}); `ValueError` naming `field`,
    the file and the tool for anything else (its arguments are checked at reset, against the
    server's tool list)."""
    where = f"{field}: {os.fspath(path)}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: not YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{where}: must be a mapping of tool name -> {{argument: role}}, "
            f"not {type(data).__name__}"
        )
    out: dict[str, dict[str, ArgRole]] = {}
    for name, roles in data.items():
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ValueError(f"{where}: {name!r} is not an MCP tool name")
        out[name] = check_roles(roles, None, where=f"{where}: tool {name!r}")
    return out


def _arguments(tool: types.Tool) -> list[str]:
    properties = (tool.input_schema or {}).get("properties") or {}
    return list(properties) if isinstance(properties, Mapping) else []


def tool_roles(
    tool: types.Tool, *, side_effect: str = "write"
) -> tuple[dict[str, ArgRole] | None, str | None]:
    """A tool's roles as its server declares them (its `qpa/roles` meta, else `{}` for a tool
    annotated read-only whose side effect is `read`, else `None`) and, when the meta was refused
    (an argument its input schema lacks, an unknown role), why."""
    meta = tool.meta or {}
    if ROLES_META in meta:
        try:
            return check_roles(
                meta[ROLES_META], _arguments(tool), where=f"tool {tool.name!r}: meta {ROLES_META}"
            ), None
        except ValueError as exc:
            return None, str(exc)
    read_only = tool.annotations is not None and tool.annotations.read_only_hint
    return ({} if read_only and side_effect == "read" else None), None


def tool_spec(
    tool: types.Tool,
    *,
    app: str,
    payment: bool = False,
    roles: Mapping[str, ArgRole] | None = None,
) -> ToolSpec:
    """The planner's view of an MCP tool; `roles` (checked already, say from a reviewed roles
    file) wins over what the server declares (`tool_roles`)."""
    meta = tool.meta or {}
    declared = meta.get(SIDE_EFFECT_META)
    if payment or declared == "payment":
        side_effect = "payment"
    elif declared in ("read", "write", "egress"):
        side_effect = declared
    elif tool.annotations is not None and tool.annotations.read_only_hint:
        side_effect = "read"
    else:
        side_effect = "write"
    if roles is not None:
        own: dict[str, ArgRole] | None = dict(roles)
    else:
        own, _ = tool_roles(tool, side_effect=side_effect)
    return ToolSpec(
        name=tool.name,
        description=tool.description or tool.title or tool.name,
        app=str(meta.get(APP_META) or app),
        parameters=dict(tool.input_schema) or {"type": "object", "properties": {}},
        result=dict(tool.output_schema or {}),
        side_effect=side_effect,
        roles=own,
    )


def _observation(result: types.CallToolResult) -> Any:
    """What a planner sees of a successful result: structured content, else the text."""
    if result.structured_content is not None:
        return result.structured_content
    parts: list[Any] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            try:
                parts.append(json.loads(block.text))
            except ValueError:
                parts.append(block.text)
        else:  # images, audio, links: named, never inlined
            parts.append({"content": block.type, **_describe_block(block)})
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts


def _describe_block(block: Any) -> dict[str, Any]:
    keys = ("mime_type", "uri", "name")
    return {k: getattr(block, k) for k in keys if getattr(block, k, None) is not None}


def _text(result: types.CallToolResult) -> str:
    texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, default=str)
    return "the tool reported an error"


def _error_feedback(name: str, result: types.CallToolResult) -> Feedback:
    text = _text(result).strip()
    # SDK servers wrap a tool's exception: "Error executing tool NAME: <the exception's text>"
    bare = _WRAPPED.sub("", text, count=1)
    prefix, sep, rest = bare.partition(":")
    if sep and prefix.strip() in _ERROR_KINDS:
        kind: ErrorKind = prefix.strip()  # type: ignore[assignment]
        return Feedback.fail(kind, f"{name}: {rest.strip() or bare}")
    return Feedback.fail("precondition_failed", f"{name}: {bare}")


class McpEnv:
    """One MCP server's tools as an environment; one episode at a time, one connection."""

    kind: EnvKind = "mcp"

    def __init__(
        self,
        url: str | None = None,
        *,
        command: list[str] | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 30.0,
        judge_url: str | None = None,
        judge_model: str = "",
        judge_api_key_env: str | None = None,
        judge_client: ChatClient | None = None,
        max_steps: int = MAX_STEPS,
        control_tools: str | Sequence[str] | None = None,
        hidden_tools: str | Sequence[str] | None = None,
        roles_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if url is None and command is None:
            url = os.environ.get(URL_ENV) or None
            command = os.environ.get(COMMAND_ENV) or None
        if isinstance(command, str):
            command = shlex.split(command)
        if url is None and not command:
            raise ValueError(
                f"url: the mcp environment needs its server's url (streamable HTTP) or command "
                f"(stdio), as options or as ${URL_ENV} / ${COMMAND_ENV}"
            )
        try:
            self.server = McpServerSpec(
                url=url, command=command, env=dict(env) if env else None, cwd=cwd, timeout_s=timeout
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ValueError(str(error["msg"]).removeprefix("Value error, ")) from None
        if max_steps < 1:
            raise ValueError("max_steps: must be at least 1")
        if control_tools is None:
            control = parse_tool_names(os.environ.get(CONTROL_TOOLS_ENV), f"${CONTROL_TOOLS_ENV}")
        else:
            control = parse_tool_names(control_tools, "control_tools")
        hidden_field = "hidden_tools" if hidden_tools is not None else f"${HIDDEN_TOOLS_ENV}"
        if hidden_tools is None:
            hidden = parse_tool_names(os.environ.get(HIDDEN_TOOLS_ENV), hidden_field)
        else:
            hidden = parse_tool_names(hidden_tools, hidden_field)
        both = sorted(control & hidden)
        if both:
            raise ValueError(
                f"{hidden_field}: {', '.join(map(repr, both))} also listed as control tools; a "
                "hidden tool is never called, a control tool is called as a task's machinery"
            )
        if roles_file is None:
            roles_file = os.environ.get(ROLES_FILE_ENV) or None
            roles_field = f"${ROLES_FILE_ENV}"
        else:
            roles_field = "roles_file"
        #: The server side's reviewed roles (tool -> argument -> role), winning over the server's.
        self.roles_file = os.fspath(roles_file) if roles_file is not None else None
        self.reviewed_roles = load_roles_file(roles_file, roles_field) if roles_file else {}
        self._roles_field = roles_field
        #: Tools whose server-declared roles were refused at the last reset, and why.
        self.refused_roles: dict[str, str] = {}
        #: What a task may name as `_mcp.reset_tool` / `verifier_tool` / `finish_tool`.
        self.control_tools = control
        #: What is never offered nor called, whatever a task says.
        self.hidden_tools = hidden
        self.max_steps = max_steps
        if judge_client is None and judge_url:
            judge_client = ChatClient(judge_url, judge_model, api_key_env=judge_api_key_env)
            self._owns_judge = True
        else:
            self._owns_judge = False
        self._judge_client = judge_client
        self.judge = RubricJudge(judge_client) if judge_client is not None else None
        self._connection: McpConnection | None = None
        self._closed = False
        self._clear()

    def _clear(self) -> None:
        self._task: Task | None = None
        self._world = McpWorld()
        self._server_tools: dict[str, types.Tool] = {}
        self._allowed: dict[str, ToolSpec] = {}
        self._validators: dict[str, Draft202012Validator] = {}
        self._events: list[dict[str, Any]] = []
        self._steps = 0
        self._finished = False
        self._answer: str | None = None

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Task) -> Feedback:
        self._clear()
        if self._closed:
            return Feedback.fail("environment_failure", "the environment is closed")
        try:
            world = McpWorld.model_validate(task.world.get(WORLD_KEY, {}))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            return Feedback.fail(
                "environment_failure", f"task world '{WORLD_KEY}.{where}': {error['msg']}"
            )
        refused = self._refused(world, task)
        if refused is not None:
            return refused
        try:
            connection = self._connect()
            listed = connection.list_tools()
            app = world.app or connection.server_name or "mcp"
        except McpUnavailable as exc:
            return Feedback.fail("environment_failure", str(exc))
        server_tools = {t.name: t for t in listed}
        special = [n for n in (world.reset_tool, world.verifier_tool, world.finish_tool) if n]
        missing = [n for n in [*special, *world.payment_tools] if n not in server_tools]
        missing += [n for n in task.tools if n not in server_tools]
        if missing:
            return Feedback.fail(
                "environment_failure",
                f"the MCP server {self.server.describe()} has no tool named "
                f"{', '.join(repr(n) for n in dict.fromkeys(missing))}",
            )
        hidden = {*special, *world.hidden_tools, *self.control_tools, *self.hidden_tools}
        names = [n for n in (task.tools or list(server_tools)) if n not in hidden]
        bad = [n for n in names if not _NAME.match(n)]
        if bad:
            return Feedback.fail(
                "environment_failure",
                f"MCP tool names {', '.join(map(repr, bad))} are not valid tool names "
                "(letters, digits, underscores; a letter first): hide them or rename them",
            )
        problem = self._check_reviewed_roles(server_tools)
        if problem is not None:
            return Feedback.fail("environment_failure", problem)
        payment = set(world.payment_tools)
        allowed = {
            n: tool_spec(
                server_tools[n], app=app, payment=n in payment, roles=self.reviewed_roles.get(n)
            )
            for n in names
        }
        self.refused_roles = {}
        for n, spec in allowed.items():
            if n in self.reviewed_roles:
                continue
            _, why = tool_roles(server_tools[n], side_effect=spec.side_effect)
            if why is not None:
                self.refused_roles[n] = why
                log.warning("%s: %s; the tool declares no roles", self.server.describe(), why)
        self._task, self._world, self._server_tools = task, world, server_tools
        self._allowed = allowed
        self._validators = {n: Draft202012Validator(s.parameters) for n, s in allowed.items()}
        seeded: Any = None
        if world.reset_tool:
            feedback = self._call_server(world.reset_tool, world.reset_arguments)
            if feedback.status == "error":
                self._task = None
                return Feedback.fail(
                    "environment_failure",
                    f"reset tool '{world.reset_tool}' failed: {feedback.message}",
                )
            seeded = feedback.observation
        observation: dict[str, Any] = {
            "user": task.user.name,
            "app": app,
            "server": self.server.describe(),
            "tools": list(allowed),
        }
        if seeded is not None:
            observation["reset"] = seeded
        return Feedback.ok(observation)

    def step(self, action: Action) -> Feedback:
        if self._task is None:
            return Feedback.fail("precondition_failed", "no episode: call reset(task) first")
        if self._finished:
            return Feedback.fail(
                "precondition_failed", "the episode has finished; no more actions", done=True
            )
        self._steps += 1
        if self._steps > self.max_steps:
            self._finished = True
            return self._record(
                action,
                Feedback.fail(
                    "precondition_failed", f"step budget of {self.max_steps} exhausted", done=True
                ),
            )
        if action.type == "tool_call":
            feedback = self._tool_call(action.tool, action.arguments)
        elif action.type == "finish":
            feedback = self._finish(action.answer)
        elif action.type == "message_user":
            feedback = Feedback.ok({"delivered": True})
        elif action.type == "delegate":
            feedback = Feedback.fail(
                "precondition_failed", "delegation is handled by the Harness, not the environment"
            )
        else:
            feedback = Feedback.fail(
                "precondition_failed", "an MCP server has no screen: UI gestures are not available"
            )
        return self._record(action, feedback)

    def verify(self) -> Verification:
        task = self._task
        if task is None:
            return Verification(done=False, success=False, progress=0.0)
        spec = task.verifier
        if self._world.verifier_tool:
            results, progress, passed_all = self._verifier_tool(self._world.verifier_tool)
            fidelity = "programmatic"
        elif spec.kind == "rubric" and spec.rubric:
            results = self._rubric(task)
            progress, passed_all = None, None
            fidelity = "llm_judged"
        elif spec.answer is not None:
            results, progress, passed_all, fidelity = [], None, None, "programmatic"
        else:
            results = [
                CheckResult(
                    name="verifier",
                    passed=False,
                    detail=f"an mcp task is verified by a verifier tool (world.{WORLD_KEY}."
                    f"verifier_tool) or a rubric; this task has neither (verifier kind "
                    f"{spec.kind!r})",
                )
            ]
            progress, passed_all, fidelity = None, None, "programmatic"
        if spec.answer is not None:
            ok = answer_matches(self._answer, spec.answer, spec.answer_match)
            results.append(
                CheckResult(
                    name="answer",
                    passed=ok,
                    detail=f"expected {spec.answer!r}, got {self._answer!r}",
                )
            )
            if passed_all is not None:
                passed_all = passed_all and ok
        passed = sum(r.passed for r in results)
        if passed_all is None:
            passed_all = bool(results) and passed == len(results)
        if progress is None:
            progress = passed / len(results) if results else 0.0
        return Verification(
            done=self._finished,
            success=self._finished and passed_all,
            progress=progress,
            checks=results,
            fidelity=fidelity,
        )

    def tools(self) -> list[ToolSpec]:
        return list(self._allowed.values())

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._owns_judge and self._judge_client is not None:
            self._judge_client.close()
        self._closed = True
        self._clear()

    # ------------------------------------------------------------------ extras
    @property
    def finished(self) -> bool:
        return self._finished

    def record(self) -> list[dict[str, Any]]:
        """The episode's record (what a rubric judge sees), detached."""
        copied: list[dict[str, Any]] = json.loads(json.dumps(self._events, default=str))
        return copied

    # ------------------------------------------------------------------ internals
    def _refused(self, world: McpWorld, task: Task) -> Feedback | None:
        """A task asking for a tool the server side does not let it have (checked before any
        call reaches the MCP server), or None."""
        for field in CONTROL_FIELDS:
            name = getattr(world, field)
            if name is not None and name not in self.control_tools:
                allowed = ", ".join(map(repr, sorted(self.control_tools))) or "none"
                return Feedback.fail(
                    "permission_denied",
                    f"task world '{WORLD_KEY}.{field}': tool {name!r} is not one of this "
                    f"server's control tools (allowed: {allowed}; the server's operator lists "
                    f"them in ${CONTROL_TOOLS_ENV} or a RolloutPool's mcp.controlTools)",
                )
        for name in task.tools:
            if name in self.hidden_tools or name in self.control_tools:
                what = "hidden by" if name in self.hidden_tools else "a control tool of"
                return Feedback.fail(
                    "permission_denied",
                    f"task tools: {name!r} is {what} this server, never the planner's",
                )
        return None

    def _check_reviewed_roles(self, server_tools: Mapping[str, types.Tool]) -> str | None:
        """Why the reviewed roles file does not fit the server's tools (a tool it lacks, an
        argument a tool's input schema lacks), or None."""
        where = f"{self._roles_field}: {self.roles_file}"
        for name, roles in self.reviewed_roles.items():
            tool = server_tools.get(name)
            if tool is None:
                return (
                    f"{where}: tool {name!r}: the MCP server {self.server.describe()} has no "
                    "tool of that name"
                )
            try:
                check_roles(roles, _arguments(tool), where=f"{where}: tool {name!r}")
            except ValueError as exc:
                return str(exc)
        return None

    def _connect(self) -> McpConnection:
        if self._connection is None or not self._connection.open:
            self._connection = McpConnection(self.server)
        return self._connection

    def _record(self, action: Action, feedback: Feedback) -> Feedback:
        event: dict[str, Any] = {"action": action.model_dump(mode="json", exclude_none=True)}
        if feedback.status == "ok":
            event["result"] = feedback.observation
        else:
            event["error"] = {"kind": feedback.error, "message": feedback.message}
        self._events.append(event)
        return feedback

    def _tool_call(self, name: str, arguments: dict[str, Any]) -> Feedback:
        spec = self._allowed.get(name)
        if spec is None:
            if name in self._server_tools:
                return Feedback.fail(
                    "unknown_tool", f"tool '{name}' is not available in this scenario"
                )
            return Feedback.fail(
                "unknown_tool", f"no tool named '{name}' on the MCP server {self.server.describe()}"
            )
        task = self._task
        assert task is not None
        if spec.side_effect == "payment" and name not in task.confirmations:
            return Feedback.fail(
                "permission_denied", f"'{name}' moves money and the user has not confirmed it"
            )
        errors = list(self._validators[name].iter_errors(arguments))
        if errors:
            return Feedback.fail("invalid_arguments", f"{name}: {describe_schema_errors(errors)}")
        return self._call_server(name, arguments)

    def _finish(self, answer: str | None) -> Feedback:
        """End the episode; a task's finish tool hears of it first (and may refuse)."""
        tool = self._world.finish_tool
        if tool:
            arguments = {"answer": answer} if answer is not None else {}
            sent = self._call_server(tool, arguments)
            if sent.status == "error":
                return sent
        self._finished = True
        self._answer = answer
        return Feedback.ok({"finished": True}, done=True)

    def _call_server(self, name: str, arguments: dict[str, Any]) -> Feedback:
        try:
            result = self._connect().call_tool(name, arguments)
        except McpUnavailable as exc:
            return Feedback.fail("environment_failure", str(exc))
        except MCPError as exc:
            kind: ErrorKind = (
                "invalid_arguments" if exc.code == INVALID_PARAMS else ("environment_failure")
            )
            return Feedback.fail(kind, f"{name}: {exc.message}")
        if result.is_error:
            return _error_feedback(name, result)
        return Feedback.ok(_observation(result))

    def _verifier_tool(self, name: str) -> tuple[list[CheckResult], float | None, bool | None]:
        arguments = dict(self._world.verifier_arguments)
        schema = self._server_tools[name].input_schema or {}
        if "answer" in (schema.get("properties") or {}):
            arguments.setdefault("answer", self._answer)
        feedback = self._call_server(name, arguments)
        if feedback.status == "error":
            failed = CheckResult(
                name=name, passed=False, detail=f"verifier tool failed: {feedback.message}"
            )
            return [failed], 0.0, False
        try:
            report = VerifierReport.model_validate(feedback.observation)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "<report>"
            failed = CheckResult(
                name=name,
                passed=False,
                detail=f"verifier tool answered no usable report: {where}: {error['msg']}",
            )
            return [failed], 0.0, False
        checks = [CheckResult(name=c.name, passed=c.passed, detail=c.detail) for c in report.checks]
        if not checks:
            checks = [CheckResult(name=name, passed=report.success)]
        progress = report.progress
        if progress is None:
            progress = sum(c.passed for c in checks) / len(checks)
        return checks, progress, report.success

    def _rubric(self, task: Task) -> list[CheckResult]:
        if self.judge is None:
            return [
                CheckResult(
                    name=item,
                    passed=False,
                    detail="no judge configured: a rubric needs judge_url (or judge_client)",
                )
                for item in task.verifier.rubric
            ]
        try:
            return self.judge.judge(task, self._events, self._answer, finished=self._finished)
        except Exception as exc:  # a bug here must not kill the rollout
            detail = f"judging crashed: {type(exc).__name__}: {exc}"
            return [CheckResult(name=i, passed=False, detail=detail) for i in task.verifier.rubric]
