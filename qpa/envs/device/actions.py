"""UI actions on a phone: validation, the adb shell command each one is, and the device tools.

A planner drives a phone either with `UIAction`s (`{"type": "ui", "op": "tap", "x": .., "y": ..}`)
or with tool calls of the device tools below (`tap`, `swipe`, `type_text`, `press_back`,
`press_home`, `launch_app`, `start_intent`), which are the same gestures for models that only
speak function calling. `to_ui_action` turns such a call into a `UIAction`; `command_for` turns a
`UIAction` into the shell line that performs it, or raises `InvalidAction` naming the field.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from jsonschema import Draft202012Validator
from pydantic import ValidationError

from qpa.contract import ToolSpec, UIAction

PACKAGE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+$")
ACTIVITY = re.compile(r"^\.?[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")
INTENT_ACTION = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")
EXTRA_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")
MAX_TEXT = 1000
MAX_COORDINATE = 100_000
SWIPE_MS = 300
KEY_BACK, KEY_HOME = 4, 3


class InvalidAction(ValueError):
    """An action the phone cannot perform as given; the message names the field."""


def _coordinate(action: UIAction, name: str) -> int:
    value = getattr(action, name)
    if value is None:
        raise InvalidAction(f"'{action.op}' needs '{name}'")
    if not 0 <= value <= MAX_COORDINATE:
        raise InvalidAction(f"'{name}' must be a screen coordinate >= 0, got {value}")
    return int(value)


def _package(action: UIAction, *, required: bool) -> str | None:
    if action.package is None:
        if required:
            raise InvalidAction(f"'{action.op}' needs 'package'")
        return None
    if not PACKAGE.match(action.package):
        raise InvalidAction(f"'package' {action.package!r} is not an Android package name")
    return action.package


def _component(action: UIAction, package: str | None) -> str | None:
    if action.activity is None:
        return None
    if package is None:
        raise InvalidAction("'activity' needs 'package'")
    if not ACTIVITY.match(action.activity):
        raise InvalidAction(f"'activity' {action.activity!r} is not an activity class name")
    return f"{package}/{action.activity}"


def _typed_text(text: str | None) -> str:
    if not text:
        raise InvalidAction("'type' needs a non-empty 'text'")
    if len(text) > MAX_TEXT:
        raise InvalidAction(f"'text' is longer than {MAX_TEXT} characters")
    if not text.isascii() or any(c in text for c in "\n\r\t"):
        raise InvalidAction("'text': `input text` types printable ASCII only (no newlines)")
    if "%s" in text:
        raise InvalidAction("'text' must not contain '%s' (input text reads it as a space)")
    return shlex.quote(text.replace(" ", "%s"))


def command_for(action: UIAction) -> str:
    """The adb shell line performing `action`; raises `InvalidAction`."""
    op = action.op
    if op == "tap":
        return f"input tap {_coordinate(action, 'x')} {_coordinate(action, 'y')}"
    if op == "swipe":
        points = [_coordinate(action, n) for n in ("x", "y", "x2", "y2")]
        return "input swipe " + " ".join(map(str, points)) + f" {SWIPE_MS}"
    if op == "type":
        return f"input text {_typed_text(action.text)}"
    if op == "back":
        return f"input keyevent {KEY_BACK}"
    if op == "home":
        return f"input keyevent {KEY_HOME}"
    if op == "launch":
        package = _package(action, required=True)
        component = _component(action, package)
        if component is not None:
            return f"am start -W -n {shlex.quote(component)}"
        return f"monkey -p {package} -c android.intent.category.LAUNCHER 1"
    # intent
    if not action.action or not INTENT_ACTION.match(action.action):
        raise InvalidAction("'intent' needs 'action', e.g. android.intent.action.VIEW")
    package = _package(action, required=False)
    parts = ["am", "start", "-W", "-a", shlex.quote(action.action)]
    if action.data:
        parts += ["-d", shlex.quote(action.data)]
    component = _component(action, package)
    if component is not None:
        parts += ["-n", shlex.quote(component)]
    elif package is not None:
        parts += ["-p", package]
    for key, value in (action.extras or {}).items():
        if not EXTRA_KEY.match(key):
            raise InvalidAction(f"'extras' key {key!r} is not a valid extra name")
        parts += ["--es", key, shlex.quote(value)]
    return " ".join(parts)


def failure_of(action: UIAction, stdout: str, stderr: str, code: int) -> str | None:
    """Why the phone refused the action (the tools print errors and often still exit 0)."""
    text = f"{stdout}\n{stderr}"
    if action.op in ("launch", "intent"):
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("Error") or "monkey aborted" in line:
                return line
    if code != 0:
        return stderr.strip() or stdout.strip() or f"exit status {code}"
    return None


# --------------------------------------------------------------------------- device tools


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> ToolSpec:
    """A device tool. Every gesture is a `write`: the environment cannot tell what it touches (a
    tap may send, delete or pay; even `press_back` can keep a draft), so none is a harmless read."""
    return ToolSpec(
        name=name,
        description=description,
        app="device",
        parameters={
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
        result={"type": "object"},
        side_effect="write",
    )


_INT = {"type": "integer", "minimum": 0}
DEVICE_TOOLS: tuple[ToolSpec, ...] = (
    _spec("tap", "Tap the screen at (x, y), e.g. an element's center.", {"x": _INT, "y": _INT},
          ["x", "y"]),
    _spec("swipe", "Swipe from (x, y) to (x2, y2), e.g. to scroll.",
          {"x": _INT, "y": _INT, "x2": _INT, "y2": _INT}, ["x", "y", "x2", "y2"]),
    _spec("type_text", "Type ASCII text into the focused field (tap the field first).",
          {"text": {"type": "string", "minLength": 1}}, ["text"]),
    _spec("press_back", "Press the back button.", {}, []),
    _spec("press_home", "Go to the home screen.", {}, []),
    _spec("launch_app", "Open an app by package name (optionally a given activity).",
          {"package": {"type": "string"}, "activity": {"type": "string"}}, ["package"]),
    _spec("start_intent",
          "Start an activity intent: an action (android.intent.action.SENDTO, ...), an "
          "optional data URI (smsto:Bob), target package and string extras.",
          {"action": {"type": "string"}, "data": {"type": "string"},
           "package": {"type": "string"},
           "extras": {"type": "object", "additionalProperties": {"type": "string"}}},
          ["action"]),
)  # fmt: skip
_TOOL_OPS = {
    "tap": "tap",
    "swipe": "swipe",
    "type_text": "type",
    "press_back": "back",
    "press_home": "home",
    "launch_app": "launch",
    "start_intent": "intent",
}
TOOL_NAMES = frozenset(_TOOL_OPS)


_VALIDATORS = {spec.name: Draft202012Validator(spec.parameters) for spec in DEVICE_TOOLS}


def to_ui_action(tool: str, arguments: dict[str, Any]) -> UIAction:
    """The `UIAction` a device tool call stands for; raises `InvalidAction` (KeyError: unknown)."""
    op = _TOOL_OPS[tool]
    errors = sorted(_VALIDATORS[tool].iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
        problems = "; ".join(
            f"'{'.'.join(map(str, e.absolute_path)) or '<arguments>'}': {e.message}" for e in errors
        )
        raise InvalidAction(f"{tool}: {problems}")
    try:
        return UIAction.model_validate({**arguments, "type": "ui", "op": op})
    except ValidationError as exc:  # the schema and the model agree; kept for safety
        raise InvalidAction(f"{tool}: {exc.errors(include_url=False)[0]['msg']}") from None
