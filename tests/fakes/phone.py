"""An in-memory Android phone for tests: what `tests/fakes/adbd.py` answers shell commands from.

Not an emulator: a small model of the parts of a phone that qpa's device path touches, with
the command-line behaviour of the real tools, so the same adb commands drive it and a real phone:

- **properties** (`getprop [name]`), `wm size`, `echo`, `cat`/`rm` of files the phone wrote;
- **screens**: a launcher and two simulated apps whose screens change with input.
  `com.qpa.messages` (conversation list -> conversation with a compose field and a Send
  button; the `SENDTO smsto:<address>` intent with extra `sms_body` opens a prefilled draft)
  and `com.qpa.notes` (note list -> editor with title and body fields and a Save button);
- **input** (`input tap X Y`, `input text S` with `%s` for spaces, `input swipe`,
  `input keyevent BACK|HOME|WAKEUP|...`), **activities** (`am start -n PKG/ACT`,
  `am start -a ACTION -d DATA [-p PKG] [--es KEY VALUE]`, `monkey -p PKG -c
  android.intent.category.LAUNCHER 1`, `am force-stop PKG`), **packages** (`pm clear PKG`,
  `pm list packages`);
- **state queries**: `uiautomator dump [FILE]` (the real XML format), `dumpsys window`
  (`mCurrentFocus`), `dumpsys battery`, `dumpsys power` (`mWakefulness`), `screencap -p` (a PNG),
  `content query --uri URI` / `content insert --uri URI --bind COL:TYPE:VALUE` / `content delete`
  on each app's provider (the `Row: N col=value, ...` output of the real `content` tool);
- a tiny shell: `;`, `&&`, `||` and `> FILE` (`/dev/null` included), quoting as `sh`.

Tests change the phone directly (`phone.battery_level = 5`, `phone.screen_on = False`,
`phone.hang_seconds = 2.0`) to make probes fail. Every method is called from the adbd's event
loop thread; `lock` guards the state for tests that read it from another thread.
"""

from __future__ import annotations

import re
import shlex
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import quoteattr

__all__ = [
    "MESSAGES",
    "MESSAGES_URI",
    "NOTES",
    "NOTES_URI",
    "Node",
    "Phone",
    "Shell",
    "ShellResult",
]

WIDTH, HEIGHT = 1080, 2400
LAUNCHER = "com.android.launcher3"
LAUNCHER_ACTIVITY = "com.android.launcher3.Launcher"
MESSAGES = "com.qpa.messages"
NOTES = "com.qpa.notes"
MESSAGES_URI = "content://com.qpa.messages.provider/messages"
NOTES_URI = "content://com.qpa.notes.provider/notes"
KEYCODES = {"HOME": 3, "BACK": 4, "POWER": 26, "ENTER": 66, "DEL": 67, "WAKEUP": 224}


@dataclass
class ShellResult:
    """What one shell command line printed and its exit status."""

    stdout: str = ""
    stderr: str = ""
    code: int = 0


@dataclass
class Node:
    """One view of a screen, as `uiautomator dump` describes it."""

    cls: str
    bounds: tuple[int, int, int, int]
    text: str = ""
    rid: str = ""
    desc: str = ""
    clickable: bool = False
    focusable: bool = False
    focused: bool = False
    on_tap: Callable[[], None] | None = None

    def contains(self, x: int, y: int) -> bool:
        left, top, right, bottom = self.bounds
        return left <= x < right and top <= y < bottom


class Table:
    """One content provider table: ordered rows with an `_id` column."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = ["_id", *columns]
        self.rows: list[dict[str, Any]] = []
        self.next_id = 1

    def insert(self, values: dict[str, Any]) -> dict[str, Any]:
        unknown = [k for k in values if k not in self.columns]
        if unknown:
            raise ValueError(f"no such column: {unknown[0]}")
        row = {c: values.get(c) for c in self.columns}
        row["_id"] = self.next_id
        self.next_id += 1
        self.rows.append(row)
        return row

    def clear(self) -> None:
        self.rows.clear()
        self.next_id = 1


# --------------------------------------------------------------------------- apps


class App:
    """A simulated app: an activity stack (its process) and provider tables (its data)."""

    package = ""
    label = ""
    main = ""

    def __init__(self, phone: Phone) -> None:
        self.phone = phone
        self.stack: list[dict[str, Any]] = []
        self.focus: str | None = None

    @property
    def activity(self) -> str:
        return self.stack[-1]["activity"] if self.stack else self.main

    def start(self, activity: str | None = None, **extras: Any) -> None:
        name = activity or self.main
        if name not in self.activities():
            raise ValueError(f"Activity class {{{self.package}/{name}}} does not exist.")
        if not self.stack or activity is not None or extras:
            self.stack.append({"activity": name, **extras})
        self.focus = None

    def back(self) -> bool:
        """Pop one activity; False when the app has nothing left to show."""
        if self.stack:
            self.stack.pop()
        self.focus = None
        return bool(self.stack)

    def kill(self) -> None:
        self.stack.clear()
        self.focus = None

    def clear_data(self) -> None:
        self.kill()

    def type_text(self, text: str) -> None:
        if self.focus is not None and self.stack:
            top = self.stack[-1]
            top[self.focus] = str(top.get(self.focus, "")) + text

    def delete_char(self) -> None:
        if self.focus is not None and self.stack:
            top = self.stack[-1]
            top[self.focus] = str(top.get(self.focus, ""))[:-1]

    def activities(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> list[Node]:
        raise NotImplementedError

    def intent(self, action: str, data: str, extras: dict[str, str]) -> None:
        raise ValueError(f"no activity of {self.package} handles {action}")

    def _field(self, key: str, bounds: tuple[int, int, int, int], rid: str) -> Node:
        top = self.stack[-1]

        def focus() -> None:
            self.focus = key

        return Node(
            "android.widget.EditText",
            bounds,
            text=str(top.get(key, "")),
            rid=f"{self.package}:id/{rid}",
            clickable=True,
            focusable=True,
            focused=self.focus == key,
            on_tap=focus,
        )


class Messages(App):
    package = MESSAGES
    label = "Messages"
    main = f"{MESSAGES}.ConversationListActivity"
    conversation = f"{MESSAGES}.ConversationActivity"

    def activities(self) -> list[str]:
        return [self.main, self.conversation]

    @property
    def table(self) -> Table:
        return self.phone.providers[MESSAGES_URI]

    def clear_data(self) -> None:
        super().clear_data()
        self.table.clear()

    def intent(self, action: str, data: str, extras: dict[str, str]) -> None:
        if action == "android.intent.action.SENDTO" and data.startswith(("smsto:", "sms:")):
            address = data.split(":", 1)[1]
            if not self.stack:
                self.start()
            self.start(self.conversation, address=address, draft=extras.get("sms_body", ""))
            return
        super().intent(action, data, extras)

    def addresses(self) -> list[str]:
        latest: dict[str, int] = {}
        for row in self.table.rows:
            latest[str(row["address"])] = int(row["_id"])
        return sorted(latest, key=lambda a: -latest[a])

    def render(self) -> list[Node]:
        top = self.stack[-1]
        if top["activity"] == self.main:
            nodes = [Node("android.widget.TextView", (0, 80, WIDTH, 240), text="Messages")]
            for i, address in enumerate(self.addresses()[:8]):
                y = 300 + i * 220

                def open_conversation(address: str = address) -> None:
                    self.start(self.conversation, address=address, draft="")

                last = [r for r in self.table.rows if r["address"] == address][-1]
                nodes.append(
                    Node(
                        "android.widget.TextView",
                        (0, y, WIDTH, y + 120),
                        text=address,
                        rid=f"{MESSAGES}:id/conversation_name",
                        clickable=True,
                        on_tap=open_conversation,
                    )
                )
                nodes.append(
                    Node(
                        "android.widget.TextView",
                        (0, y + 120, WIDTH, y + 200),
                        text=str(last["body"]),
                        rid=f"{MESSAGES}:id/conversation_snippet",
                    )
                )
            return nodes
        address = top["address"]
        nodes = [Node("android.widget.TextView", (0, 80, WIDTH, 240), text=address)]
        history = [r for r in self.table.rows if r["address"] == address][-6:]
        for i, row in enumerate(history):
            y = 300 + i * 200
            outgoing = row["type"] == "sent"
            nodes.append(
                Node(
                    "android.widget.TextView",
                    (300, y, 1040, y + 160) if outgoing else (40, y, 780, y + 160),
                    text=str(row["body"]),
                    rid=f"{MESSAGES}:id/{'message_out' if outgoing else 'message_in'}",
                )
            )
        nodes.append(self._field("draft", (40, 2150, 860, 2300), "compose"))
        nodes.append(
            Node(
                "android.widget.Button",
                (880, 2150, 1040, 2300),
                text="Send",
                rid=f"{MESSAGES}:id/send",
                clickable=True,
                on_tap=self._send,
            )
        )
        return nodes

    def _send(self) -> None:
        top = self.stack[-1]
        body = str(top.get("draft", "")).strip()
        if body:
            self.table.insert(
                {"address": top["address"], "body": body, "type": "sent", "date": self.phone.now()}
            )
            top["draft"] = ""


class Notes(App):
    package = NOTES
    label = "Notes"
    main = f"{NOTES}.NotesListActivity"
    editor = f"{NOTES}.NoteEditorActivity"

    def activities(self) -> list[str]:
        return [self.main, self.editor]

    @property
    def table(self) -> Table:
        return self.phone.providers[NOTES_URI]

    def clear_data(self) -> None:
        super().clear_data()
        self.table.clear()

    def render(self) -> list[Node]:
        top = self.stack[-1]
        if top["activity"] == self.main:
            nodes = [Node("android.widget.TextView", (0, 80, WIDTH, 240), text="Notes")]
            for i, row in enumerate(self.table.rows[:8]):
                y = 300 + i * 200

                def open_note(row: dict[str, Any] = row) -> None:
                    self.start(self.editor, note=row["_id"], title=row["title"], body=row["body"])

                nodes.append(
                    Node(
                        "android.widget.TextView",
                        (0, y, WIDTH, y + 160),
                        text=str(row["title"]),
                        rid=f"{NOTES}:id/note_title",
                        clickable=True,
                        on_tap=open_note,
                    )
                )
            nodes.append(
                Node(
                    "android.widget.Button",
                    (40, 2200, 1040, 2350),
                    text="New note",
                    rid=f"{NOTES}:id/new_note",
                    clickable=True,
                    on_tap=lambda: self.start(self.editor, note=None, title="", body=""),
                )
            )
            return nodes
        return [
            Node("android.widget.TextView", (0, 80, WIDTH, 240), text="Edit note"),
            self._field("title", (40, 300, 1040, 450), "title"),
            self._field("body", (40, 500, 1040, 1500), "body"),
            Node(
                "android.widget.Button",
                (40, 2200, 1040, 2350),
                text="Save",
                rid=f"{NOTES}:id/save",
                clickable=True,
                on_tap=self._save,
            ),
        ]

    def _save(self) -> None:
        top = self.stack[-1]
        values = {"title": str(top.get("title", "")), "body": str(top.get("body", ""))}
        existing = next((r for r in self.table.rows if r["_id"] == top.get("note")), None)
        if existing is not None:
            existing.update(values)
        elif values["title"] or values["body"]:
            self.table.insert(values)
        self.back()


# --------------------------------------------------------------------------- the phone


@dataclass
class Phone:
    """The simulated phone: properties, apps, providers, files, battery and screen."""

    serial: str = "QPA0000001"
    model: str = "Pixel 8"
    android_version: str = "14"
    battery_level: int = 87
    charging: bool = True
    screen_on: bool = True
    hang_seconds: float = 0.0  # every shell command sleeps this long first (a stuck phone)
    providers: dict[str, Table] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self.providers = {
            MESSAGES_URI: Table(["address", "body", "type", "date"]),
            NOTES_URI: Table(["title", "body"]),
        }
        self.apps: dict[str, App] = {a.package: a for a in (Messages(self), Notes(self))}
        self.recents: list[str] = []  # packages, foreground last
        self._clock = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms

    # -------------------------------------------------------------- state
    def now(self) -> int:
        self._clock += 1000
        return self._clock

    @property
    def properties(self) -> dict[str, str]:
        return {
            "ro.serialno": self.serial,
            "ro.product.model": self.model,
            "ro.product.manufacturer": "Google",
            "ro.product.name": "qpa_phone",
            "ro.product.device": "qpa_phone",
            "ro.build.version.release": self.android_version,
            "ro.build.version.sdk": str(20 + int(self.android_version.split(".")[0])),
            "sys.boot_completed": "1",
        }

    @property
    def foreground(self) -> App | None:
        while self.recents and not self.apps[self.recents[-1]].stack:
            self.recents.pop()
        return self.apps[self.recents[-1]] if self.recents else None

    def focus_name(self) -> str:
        app = self.foreground
        return f"{app.package}/{app.activity}" if app else f"{LAUNCHER}/{LAUNCHER_ACTIVITY}"

    def bring_to_front(self, app: App) -> None:
        if app.package in self.recents:
            self.recents.remove(app.package)
        self.recents.append(app.package)

    def launch(self, package: str, activity: str | None = None, **extras: Any) -> None:
        app = self.apps.get(package)
        if app is None:
            raise ValueError(f"no package {package}")
        app.start(activity, **extras)
        self.bring_to_front(app)

    def screen(self) -> list[Node]:
        app = self.foreground
        if app is None:
            nodes = [Node("android.widget.TextView", (0, 80, WIDTH, 240), text="Home")]
            for i, other in enumerate(self.apps.values()):
                x = 100 + i * 400

                def open_app(package: str = other.package) -> None:
                    self.launch(package)

                nodes.append(
                    Node(
                        "android.widget.TextView",
                        (x, 400, x + 300, 700),
                        text=other.label,
                        desc=other.label,
                        clickable=True,
                        on_tap=open_app,
                    )
                )
            return nodes
        return app.render()

    # -------------------------------------------------------------- input
    def tap(self, x: int, y: int) -> None:
        if not self.screen_on:
            return
        for node in reversed(self.screen()):
            if node.clickable and node.contains(x, y):
                if node.on_tap is not None:
                    node.on_tap()
                return

    def keyevent(self, code: int) -> None:
        if code == KEYCODES["WAKEUP"]:
            self.screen_on = True
        elif code == KEYCODES["POWER"]:
            self.screen_on = not self.screen_on
        elif not self.screen_on:
            return
        elif code == KEYCODES["HOME"]:
            # The launcher shows; apps keep their activity stacks (their processes live on).
            self.recents.clear()
        elif code == KEYCODES["BACK"]:
            app = self.foreground
            if app is not None and not app.back():
                self.recents.remove(app.package)
        elif code == KEYCODES["DEL"]:
            app = self.foreground
            if app is not None:
                app.delete_char()

    def type_text(self, text: str) -> None:
        app = self.foreground
        if app is not None and self.screen_on:
            app.type_text(text)

    # -------------------------------------------------------------- hierarchy
    def hierarchy_xml(self) -> str:
        focus = self.foreground
        package = focus.package if focus else LAUNCHER
        nodes = self.screen() if self.screen_on else []
        parts = [
            "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>",
            '<hierarchy rotation="0">',
            _node_open(
                0, Node("android.widget.FrameLayout", (0, 0, WIDTH, HEIGHT)), package, close=False
            ),
        ]
        parts.extend(_node_open(i, n, package, close=True) for i, n in enumerate(nodes))
        parts.append("</node></hierarchy>")
        return "".join(parts)


def _node_open(index: int, node: Node, package: str, *, close: bool) -> str:
    left, top, right, bottom = node.bounds
    attrs = {
        "index": str(index),
        "text": node.text,
        "resource-id": node.rid,
        "class": node.cls,
        "package": package,
        "content-desc": node.desc,
        "checkable": "false",
        "checked": "false",
        "clickable": str(node.clickable).lower(),
        "enabled": "true",
        "focusable": str(node.focusable).lower(),
        "focused": str(node.focused).lower(),
        "scrollable": "false",
        "long-clickable": "false",
        "password": "false",
        "selected": "false",
        "bounds": f"[{left},{top}][{right},{bottom}]",
    }
    body = " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items())
    return f"<node {body} />" if close else f"<node {body}>"


# --------------------------------------------------------------------------- the shell


class Shell:
    """Runs one `sh -c` command line against a `Phone` (the subset the device path uses)."""

    def __init__(self, phone: Phone) -> None:
        self.phone = phone
        self._png: bytes | None = None
        self._stdin = b""

    def run(self, line: str) -> tuple[bytes, bytes, int]:
        """stdout, stderr and exit status of a command line."""
        phone = self.phone
        if phone.hang_seconds:
            time.sleep(phone.hang_seconds)
        with phone.lock:
            phone.log.append(line)
            try:
                lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|>")
                lexer.whitespace_split = True
                tokens = list(lexer)
            except ValueError as exc:
                return b"", f"/system/bin/sh: syntax error: {exc}\n".encode(), 2
            out, err, code = bytearray(), bytearray(), 0
            for op, stages, target in _commands(tokens):
                if (op == "&&" and code != 0) or (op == "||" and code == 0):
                    continue
                stdin = b""
                for argv in stages:  # a pipeline: each stage reads the previous one's stdout
                    stdin, stderr, code = self._command(argv, stdin)
                    err += stderr
                if target is None:
                    out += stdin
                elif target != "/dev/null":
                    phone.files[target] = stdin
            return bytes(out), bytes(err), code

    def _command(self, argv: list[str], stdin: bytes = b"") -> tuple[bytes, bytes, int]:
        name, args = argv[0], argv[1:]
        self._stdin = stdin
        handler = getattr(self, f"_cmd_{name.replace('-', '_')}", None)
        if handler is None:
            return b"", f"/system/bin/sh: {name}: inaccessible or not found\n".encode(), 127
        try:
            result: Any = handler(args)
        except (ValueError, IndexError, KeyError) as exc:
            return b"", f"Error: {exc}\n".encode(), 1
        if isinstance(result, bytes):
            return result, b"", 0
        if isinstance(result, ShellResult):
            return result.stdout.encode(), result.stderr.encode(), result.code
        return str(result).encode(), b"", 0

    # -------------------------------------------------------------- commands
    def _cmd_echo(self, args: list[str]) -> str:
        return " ".join(args) + "\n"

    def _cmd_grep(self, args: list[str]) -> ShellResult:
        flags = [a for a in args if a.startswith("-")]
        pattern = next(a for a in args if not a.startswith("-"))
        regex = re.compile(pattern if "-E" in flags else re.escape(pattern))
        lines = self._stdin.decode(errors="replace").splitlines(keepends=True)
        found = [line for line in lines if regex.search(line)]
        return ShellResult(stdout="".join(found), code=0 if found else 1)

    def _cmd_getprop(self, args: list[str]) -> str:
        props = self.phone.properties
        if args:
            return props.get(args[0], "") + "\n"
        return "".join(f"[{k}]: [{v}]\n" for k, v in sorted(props.items()))

    def _cmd_wm(self, args: list[str]) -> str:
        if args[:1] != ["size"]:
            raise ValueError("usage: wm size")
        return f"Physical size: {WIDTH}x{HEIGHT}\n"

    def _cmd_cat(self, args: list[str]) -> ShellResult | bytes:
        if args[0] not in self.phone.files:
            return ShellResult(stderr=f"cat: {args[0]}: No such file or directory\n", code=1)
        return self.phone.files[args[0]]

    def _cmd_rm(self, args: list[str]) -> str:
        for path in (a for a in args if not a.startswith("-")):
            self.phone.files.pop(path, None)
        return ""

    def _cmd_uiautomator(self, args: list[str]) -> str:
        if args[:1] != ["dump"]:
            raise ValueError("usage: uiautomator dump [FILE]")
        path = args[1] if len(args) > 1 else "/sdcard/window_dump.xml"
        self.phone.files[path] = self.phone.hierarchy_xml().encode()
        return f"UI hierchary dumped to: {path}\n"

    def _cmd_screencap(self, args: list[str]) -> bytes:
        if "-p" not in args:
            raise ValueError("only PNG output (-p) is supported")
        if self._png is None:
            self._png = _png(WIDTH // 4, HEIGHT // 4)
        return self._png

    def _cmd_input(self, args: list[str]) -> ShellResult:
        phone = self.phone
        if args and args[0] in ("touchscreen", "keyboard"):
            args = args[1:]
        kind, rest = args[0], args[1:]
        if kind == "tap":
            phone.tap(int(float(rest[0])), int(float(rest[1])))
        elif kind == "text":
            phone.type_text(" ".join(rest).replace("%s", " "))
        elif kind == "swipe":
            if len(rest) < 4:
                return ShellResult(stderr="Error: input swipe needs x1 y1 x2 y2\n", code=1)
            for value in rest[:5]:
                int(float(value))  # the real tool refuses what is not a number; lists never scroll
        elif kind == "keyevent":
            for key in rest:
                code = int(key) if key.isdigit() else KEYCODES.get(key.removeprefix("KEYCODE_"))
                if code is None:
                    return ShellResult(stderr=f"Unknown keycode: {key}\n", code=1)
                phone.keyevent(code)
        else:
            return ShellResult(stderr=f"Error: Unknown command: {kind}\n", code=1)
        return ShellResult()

    def _cmd_am(self, args: list[str]) -> ShellResult:
        phone = self.phone
        if args[0] == "force-stop":
            app = phone.apps.get(args[1])
            if app is not None:
                app.kill()
            return ShellResult()
        if args[0] != "start":
            return ShellResult(stderr=f"Error: unknown command '{args[0]}'\n", code=1)
        opts = _intent_options(args[1:])
        component, action = opts.get("-n"), opts.get("-a", "")
        try:
            if component:
                package, _, activity = str(component).partition("/")
                if activity.startswith("."):
                    activity = package + activity
                phone.launch(package, activity or None)
            elif action:
                package = str(opts.get("-p", ""))
                apps = [phone.apps[package]] if package in phone.apps else phone.apps.values()
                for app in apps:
                    try:
                        app.intent(action, str(opts.get("-d", "")), opts["extras"])
                    except ValueError:
                        continue
                    phone.bring_to_front(app)
                    break
                else:
                    raise ValueError(f"No Activity found to handle Intent {{ act={action} }}")
            else:
                raise ValueError("Intent has no component or action")
        except ValueError as exc:
            return ShellResult(stdout="Starting: Intent\n", stderr=f"Error: {exc}\n", code=1)
        return ShellResult(stdout=f"Starting: Intent {{ cmp={phone.focus_name()} }}\n")

    def _cmd_monkey(self, args: list[str]) -> ShellResult:
        package = args[args.index("-p") + 1]
        if package not in self.phone.apps:
            return ShellResult(stdout="** No activities found to run, monkey aborted.\n", code=252)
        self.phone.launch(package)
        return ShellResult(stdout="  bash arg: -p\nEvents injected: 1\n")

    def _cmd_pm(self, args: list[str]) -> ShellResult:
        phone = self.phone
        if args[0] == "clear":
            app = phone.apps.get(args[-1])
            if app is None:
                return ShellResult(stdout="Failed\n", code=1)
            app.clear_data()
            return ShellResult(stdout="Success\n")
        if args[:2] == ["list", "packages"]:
            return ShellResult(
                stdout="".join(f"package:{p}\n" for p in [LAUNCHER, *sorted(phone.apps)])
            )
        return ShellResult(stderr=f"Unknown command: {args[0]}\n", code=1)

    def _cmd_dumpsys(self, args: list[str]) -> str:
        phone = self.phone
        service = args[0] if args else ""
        if service == "battery":
            status = 2 if phone.charging else 3
            return (
                "Current Battery Service state:\n"
                f"  AC powered: {str(phone.charging).lower()}\n  USB powered: false\n"
                f"  status: {status}\n  health: 2\n  present: true\n"
                f"  level: {phone.battery_level}\n  scale: 100\n  temperature: 250\n"
            )
        if service == "power":
            awake = "Awake" if phone.screen_on else "Asleep"
            state = "ON" if phone.screen_on else "OFF"
            return (
                "POWER MANAGER (dumpsys power)\n"
                f"  mWakefulness={awake}\nDisplay Power: state={state}\n"
            )
        if service == "window":
            focus = phone.focus_name()
            return (
                "WINDOW MANAGER WINDOWS (dumpsys window windows)\n"
                f"  mCurrentFocus=Window{{4f2a u0 {focus}}}\n"
                f"  mFocusedApp=ActivityRecord{{9b1 u0 {focus} t12}}\n"
            )
        raise ValueError(f"Can't find service: {service}")

    def _cmd_content(self, args: list[str]) -> ShellResult:
        verb, opts = args[0], _content_options(args[1:])
        uri = str(opts.get("--uri", ""))
        table = self.phone.providers.get(uri)
        if table is None:
            return ShellResult(
                stderr=f"Error while accessing provider:{uri.split('/')[2] if '//' in uri else uri}"
                "\njava.lang.IllegalArgumentException: Unknown URI\n",
                code=1,
            )
        if verb == "query":
            rows = table.rows
            if not rows:
                return ShellResult(stdout="No result found.\n")
            lines = [
                f"Row: {i} "
                + ", ".join(f"{c}={'NULL' if r[c] is None else r[c]}" for c in table.columns)
                for i, r in enumerate(rows)
            ]
            return ShellResult(stdout="\n".join(lines) + "\n")
        if verb == "insert":
            table.insert(opts["binds"])
            return ShellResult()
        if verb == "delete":
            table.clear()
            return ShellResult()
        return ShellResult(stderr=f"Unsupported operation: {verb}\n", code=1)


def _commands(tokens: list[str]) -> list[tuple[str, list[list[str]], str | None]]:
    """Split tokens into (operator before, pipeline stages, stdout redirect) commands."""
    commands: list[tuple[str, list[list[str]], str | None]] = []
    op, stages, target = ";", [[]], None
    it = iter(tokens)
    for token in it:
        if token in (";", "&&", "||"):
            commands.append((op, stages, target))
            op, stages, target = token, [[]], None
        elif token == "|":
            stages.append([])
        elif token == ">":
            target = next(it, "/dev/null")
        else:
            stages[-1].append(token)
    commands.append((op, stages, target))
    return [(o, [s for s in st if s], t) for o, st, t in commands if any(st)]


def _cell(value: Any) -> str:
    return "NULL" if value is None else str(value)


def _intent_options(args: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"extras": {}}
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in ("--es", "--ei", "--ez"):
            opts["extras"][args[i + 1]] = args[i + 2]
            i += 3
        elif flag in ("-n", "-a", "-d", "-p", "-c", "-t"):
            opts[flag] = args[i + 1]
            i += 2
        elif flag in ("-W", "-S"):
            i += 1
        else:
            raise ValueError(f"Unknown option: {flag}")
    return opts


def _content_options(args: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"binds": {}}
    i = 0
    while i < len(args):
        flag = args[i]
        if flag == "--bind":
            name, kind, value = args[i + 1].split(":", 2)
            opts["binds"][name] = int(value) if kind in ("i", "l") else value
        elif flag in ("--uri", "--where", "--projection", "--sort", "--user"):
            opts[flag] = args[i + 1]
        else:
            raise ValueError(f"Unsupported argument: {flag}")
        i += 2
    return opts


def _png(width: int, height: int) -> bytes:
    """A valid grey PNG of the given size (what `screencap -p` returns)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + b"\x80\x80\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
