"""Turn what a planner model said into an `Action`, or into a `ParseFailure` it is told about.

One parser serves every backend. It reads, in order of preference:

- native tool calls (OpenAI function calling; `arguments` is a JSON string);
- a `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block (the text protocol that
  `render_tool_protocol` teaches; the same format as Qwen/Hermes tool calling);
- `<finish>answer</finish>`;
- a bare JSON object (`{"name": ..., "arguments": ...}` or a contract action with `type`),
  also inside a code fence.

Besides the environment's tools the model may call three pseudo-tools that the Harness handles:
`finish(answer)`, `message_user(text)` and `delegate(goal, tools, agent)`. `<think>` blocks are
ignored. Malformed output (no call, not JSON, arguments not an object), an unknown tool, or
arguments that break the tool's JSON schema come back as a `ParseFailure`, never an exception:
the Harness turns it into an error-feedback turn that is counted in the trajectory.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, ValidationError

from qpa.contract import (
    ACTION_ADAPTER,
    Action,
    Delegate,
    ErrorKind,
    Feedback,
    Finish,
    MessageUser,
    ToolCall,
    ToolSpec,
)
from qpa.harness.argcheck import Check, compile_schema
from qpa.harness.toolmemo import ToolObjectMemo

if TYPE_CHECKING:  # parsing sits below the backends: no runtime import of them
    from qpa.harness.backends.base import Completion

ParseFailureKind = Literal["malformed_output", "unknown_tool", "invalid_arguments"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
FINISH_OPEN, FINISH_CLOSE = "<finish>", "</finish>"
STOP_STRINGS: tuple[str, ...] = (TOOL_CALL_CLOSE, FINISH_CLOSE)
"""Where a text-protocol answer is complete: backends may stop generating there."""

_MAX_ERRORS = 5
_FEEDBACK_KIND = {"malformed_output": "malformed_action"}


class ParseFailure(BaseModel):
    """Why a model's output is not an action; `message` names the problem for the model."""

    model_config = ConfigDict(extra="forbid")

    kind: ParseFailureKind
    message: str
    raw: str = ""
    tool: str | None = None
    call_id: str | None = None

    def feedback(self) -> Feedback:
        """The error feedback for the turn, in the contract's error kinds.

        `malformed_output` is reported as `malformed_action` (the Harness could not parse the
        output into an action); the other kinds exist in the contract under the same name.
        """
        kinds = get_args(ErrorKind)
        kind = _FEEDBACK_KIND.get(self.kind, self.kind)
        if kind not in kinds:  # an older contract: the closest kind, the real one in the text
            return Feedback.fail("invalid_arguments", f"{self.kind}: {self.message}")
        return Feedback.fail(cast(ErrorKind, kind), self.message)

    def annotation(self) -> dict[str, Any]:
        """What to record in `Step.annotations["parse_failure"]` (planner-side detection)."""
        return {"kind": self.kind, "message": self.message, "tool": self.tool, "raw": self.raw}


# --------------------------------------------------------------------------- pseudo-tools

PSEUDO_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="finish",
        description="End the task. Give the final answer for the user, if the task asks for one.",
        parameters={
            "type": "object",
            "properties": {"answer": {"type": ["string", "null"], "description": "Final answer"}},
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="message_user",
        description="Say something to the user: a question, a confirmation request or a note.",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
            "required": ["text"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="delegate",
        description=(
            "Hand a self-contained part of the task to a sub-agent that may use only the listed "
            "tools; it reports back with its own finish."
        ),
        parameters={
            "type": "object",
            "properties": {
                "goal": {"type": "string", "minLength": 1},
                "tools": {"type": "array", "items": {"type": "string"}},
                "agent": {"type": "string", "minLength": 1},
            },
            "required": ["goal"],
            "additionalProperties": False,
        },
    ),
)
PSEUDO_TOOL_NAMES = frozenset(t.name for t in PSEUDO_TOOLS)
_PSEUDO_BY_NAME = {t.name: t for t in PSEUDO_TOOLS}


def with_pseudo_tools(tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    """The tools plus the Harness's pseudo-tools (for native function calling)."""
    names = {t.name for t in tools}
    return [*tools, *(p for p in PSEUDO_TOOLS if p.name not in names)]


# --------------------------------------------------------------------------- the text protocol


def _tool_line(tool: ToolSpec) -> str:
    return json.dumps(
        {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
        ensure_ascii=False,
        sort_keys=False,
    )


def render_tool_protocol(tools: Sequence[ToolSpec], *, include_pseudo: bool = True) -> str:
    """The text-protocol instructions: the tools' schemas and how to call them in plain text."""
    listed = with_pseudo_tools(tools) if include_pseudo else list(tools)
    lines = "\n".join(_tool_line(t) for t in listed)
    return (
        "# Tools\n\n"
        "You may call the tools below. Each line gives a tool's name, what it does and the JSON "
        "schema of its arguments:\n\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "To call a tool, answer with exactly one block (one call per turn) and stop:\n"
        f"{TOOL_CALL_OPEN}\n"
        '{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}\n'
        f"{TOOL_CALL_CLOSE}\n"
        "The result comes back in the next message inside <tool_response></tool_response>.\n"
        f"When the task is done, answer with {FINISH_OPEN}final answer for the user{FINISH_CLOSE} "
        f"(leave it empty when there is nothing to report).\n"
        "Use only the tools listed, with only the arguments their schemas define. To ask or tell "
        "the user something call message_user; to hand part of the task to a sub-agent call "
        "delegate."
    )


def format_tool_call(name: str, arguments: str | dict[str, Any]) -> str:
    """An assistant tool call written in the text protocol."""
    args: Any = arguments
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            args = arguments
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def format_tool_response(content: str) -> str:
    """A tool result written in the text protocol."""
    return f"<tool_response>\n{content}\n</tool_response>"


# --------------------------------------------------------------------------- parsing

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FINISH = re.compile(r"<finish\s*/>|<finish>(.*?)(?:</finish>|$)", re.DOTALL)
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)
_ACTION_TYPES = {"tool_call", "ui", "message_user", "delegate", "finish"}
_VALIDATORS: dict[tuple[str, bytes], tuple[Draft202012Validator | None, Check | None]] = {}
_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS  # a schema's content, as a key


def _strip_thinking(text: str) -> str:
    text = _THINK.sub("", text)
    if "</think>" in text:  # the opening tag was in the prompt
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:  # unfinished thinking is no answer
        text = text.split("<think>", 1)[0]
    return text.strip()


def _strip_fence(text: str) -> str:
    text = text.strip()
    match = _FENCE.match(text)
    return match.group(1).strip() if match else text


def _load_object(text: str) -> dict[str, Any] | str:
    """The JSON object in `text` (tolerating fences and trailing text), or why there is none."""
    body = _strip_fence(text)
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        start = body.find("{")
        if start < 0:
            return f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        try:
            value, _ = json.JSONDecoder().raw_decode(body[start:])
        except json.JSONDecodeError as inner:
            return f"not JSON ({inner.msg} at line {inner.lineno} column {inner.colno})"
    if not isinstance(value, dict):
        return f"not a JSON object (got {type(value).__name__})"
    return value


def _raw_of(completion: Completion | str) -> str:
    if isinstance(completion, str):
        return completion
    if not completion.tool_calls:
        return completion.text
    calls = [{"name": c.name, "arguments": c.arguments} for c in completion.tool_calls]
    return (completion.text + "\n" if completion.text else "") + json.dumps(
        calls, ensure_ascii=False
    )


def parse_completion(
    completion: Completion | str,
    tools: Sequence[ToolSpec],
    *,
    validate_arguments: bool = True,
) -> Action | ParseFailure:
    """The action the model chose, or a `ParseFailure` naming what is wrong with its output.

    When a completion carries several tool calls, the first is taken (one action per turn).
    `validate_arguments` checks arguments against each tool's JSON schema.
    """
    parser = _Parser(tools, completion, validate_arguments)
    if not isinstance(completion, str) and completion.tool_calls:
        call = completion.tool_calls[0]
        arguments = _decode_arguments(call.arguments)
        if isinstance(arguments, str):
            return parser.fail(
                "malformed_output",
                f"arguments of the call to '{call.name}' are {arguments}",
                tool=call.name,
                call_id=call.id or None,
            )
        return parser.build(call.name, arguments, call.id or None)
    text = completion if isinstance(completion, str) else completion.text
    return parser.text(_strip_thinking(text or ""))


def _decode_arguments(value: Any) -> dict[str, Any] | str:
    """Arguments as a dict, or a phrase saying why they are not a JSON object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        if not value.strip():
            return {}
        loaded = _load_object(value)
        return loaded
    return f"not a JSON object (got {type(value).__name__})"


class _Parser:
    def __init__(
        self, tools: Sequence[ToolSpec], completion: Completion | str, validate: bool
    ) -> None:
        self.tools = {t.name: t for t in tools}
        self.completion = completion
        self.validate = validate

    @property
    def raw(self) -> str:
        """The model's output as text (`_raw_of`): only a failure quotes it, so only a
        failure renders it."""
        return _raw_of(self.completion)

    def fail(
        self,
        kind: ParseFailureKind,
        message: str,
        *,
        tool: str | None = None,
        call_id: str | None = None,
    ) -> ParseFailure:
        return ParseFailure(kind=kind, message=message, raw=self.raw, tool=tool, call_id=call_id)

    # ---------------------------------------------------------------- text forms
    def text(self, text: str) -> Action | ParseFailure:
        call = _TOOL_CALL.search(text)
        finish = _FINISH.search(text)
        if finish is not None and (call is None or finish.start() < call.start()):
            answer = (finish.group(1) or "").strip()
            return Finish(answer=answer or None)
        if call is not None:
            return self.payload(call.group(1), "the <tool_call> block")
        if "{" in text:
            return self.payload(text, "the output")
        if not text:
            return self.fail(
                "malformed_output",
                "empty output: answer with a <tool_call>{...}</tool_call> block or "
                "<finish>answer</finish>",
            )
        return self.fail(
            "malformed_output",
            'no tool call found: answer with a <tool_call>{"name": ..., "arguments": {...}}'
            "</tool_call> block or <finish>answer</finish>",
        )

    def payload(self, text: str, where: str) -> Action | ParseFailure:
        loaded = _load_object(text)
        if isinstance(loaded, str):
            return self.fail("malformed_output", f"{where} is {loaded}")
        payload = loaded
        if isinstance(payload.get("function"), dict):  # {"function": {"name", "arguments"}}
            payload = payload["function"]
        kind = payload.get("type")
        if kind in _ACTION_TYPES and kind != "tool_call" and "name" not in payload:
            try:
                return ACTION_ADAPTER.validate_python(payload)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or '<action>'}: {e['msg']}"
                    for e in exc.errors(include_url=False)[:_MAX_ERRORS]
                )
                return self.fail("invalid_arguments", f"invalid '{kind}' action: {problems}")
        name = payload.get("name", payload.get("tool"))
        if not isinstance(name, str) or not name.strip():
            return self.fail(
                "malformed_output",
                f'{where} names no tool: expected {{"name": "<tool>", "arguments": {{...}}}}',
            )
        args: Any = next(
            (payload[k] for k in ("arguments", "parameters", "args") if k in payload), None
        )
        arguments = _decode_arguments(args)
        if isinstance(arguments, str):
            return self.fail(
                "malformed_output", f"arguments of the call to '{name}' are {arguments}", tool=name
            )
        call_id = payload.get("id") if isinstance(payload.get("id"), str) else None
        return self.build(name, arguments, call_id)

    # ---------------------------------------------------------------- actions
    def build(
        self, name: str, arguments: dict[str, Any], call_id: str | None
    ) -> Action | ParseFailure:
        name = name.strip()
        if name.startswith("functions."):
            name = name[len("functions.") :]
        spec = self.tools.get(name)
        if spec is not None:
            problem = self.check(spec, arguments)
            if problem:
                return self.fail("invalid_arguments", problem, tool=name, call_id=call_id)
            return ToolCall(tool=name, arguments=arguments, call_id=call_id)
        if name in PSEUDO_TOOL_NAMES:
            return self.pseudo(name, arguments, call_id)
        return self.fail("unknown_tool", self.unknown(name), tool=name, call_id=call_id)

    def unknown(self, name: str) -> str:
        names = sorted(self.tools) + sorted(PSEUDO_TOOL_NAMES)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        listed = ", ".join(names) if len(names) <= 30 else ", ".join(names[:30]) + ", ..."
        return f"unknown tool '{name}'{hint} Available tools: {listed}"

    def check(
        self, spec: ToolSpec, arguments: dict[str, Any], *, force: bool = False
    ) -> str | None:
        if not (self.validate or force):
            return None
        validator, plainly_valid = _validator(spec)
        if validator is None or (plainly_valid is not None and plainly_valid(arguments)):
            return None  # a flat schema's fast yes; any doubt goes to jsonschema (argcheck)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path)))
        if not errors:
            return None
        problems = []
        for error in errors[:_MAX_ERRORS]:
            where = ".".join(str(p) for p in error.absolute_path)
            problems.append(f"argument '{where}': {error.message}" if where else error.message)
        return f"invalid arguments for '{spec.name}': " + "; ".join(problems)

    def pseudo(
        self, name: str, arguments: dict[str, Any], call_id: str | None
    ) -> Action | ParseFailure:
        arguments = dict(arguments)
        for key in ("answer", "text", "goal", "agent"):
            value = arguments.get(key)
            if value is not None and not isinstance(value, str):
                arguments[key] = value if isinstance(value, list | dict) else json.dumps(value)
        spec = _PSEUDO_BY_NAME[name]
        problem = self.check(spec, arguments, force=True)  # never build an invalid action
        if problem:
            return self.fail("invalid_arguments", problem, tool=name, call_id=call_id)
        if name == "finish":
            answer = arguments.get("answer")
            return Finish(answer=answer if answer else None)
        if name == "message_user":
            return MessageUser(text=arguments["text"])
        scoped = list(arguments.get("tools") or [])
        outside = [t for t in scoped if t not in self.tools]
        if outside:
            return self.fail(
                "invalid_arguments",
                f"delegate: tools not available here: {', '.join(outside)}",
                tool=name,
                call_id=call_id,
            )
        return Delegate(goal=arguments["goal"], tools=scoped, agent=arguments.get("agent") or "sub")


Validators = tuple[Draft202012Validator | None, Check | None]


def _content_validator(spec: ToolSpec) -> Validators:
    """The validator and fast check of a tool's schema, by its name and canonical content."""
    try:
        content = orjson.dumps(spec.parameters, default=str, option=_CANONICAL)
    except orjson.JSONEncodeError:  # what orjson cannot write (a huge integer): the slow way
        content = json.dumps(spec.parameters, sort_keys=True, default=str).encode()
    key = (spec.name, content)
    if key not in _VALIDATORS:
        try:
            Draft202012Validator.check_schema(spec.parameters)
            validator = Draft202012Validator(spec.parameters)
            _VALIDATORS[key] = (validator, compile_schema(spec.parameters))
        except SchemaError:  # a tool with a broken schema is left to the environment
            _VALIDATORS[key] = (None, None)
        if len(_VALIDATORS) > 4096:
            _VALIDATORS.pop(next(iter(_VALIDATORS)))
    return _VALIDATORS[key]


#: `_content_validator` per tool object (`qpa.harness.toolmemo`): a tool set is offered to every
#: turn of an episode, and an environment offers the same objects to every episode
_VALIDATOR_MEMO: ToolObjectMemo[Validators] = ToolObjectMemo(
    _content_validator, lambda spec: (spec.name, spec.parameters)
)
_BY_OBJECT = _VALIDATOR_MEMO.entries
_memo_validator = _VALIDATOR_MEMO
#: how the parser finds a tool's validators (the benchmark's "today" path swaps in
#: `_content_validator`)
_validator = _memo_validator
