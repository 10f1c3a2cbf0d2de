"""`DeviceEnv`: a real phone over adb behind the `Environment` protocol.

- **Phone**: from a `PhoneSource`: one named phone (`serial=` and `adb=HOST:PORT`) or a pool
  (`phones=`, e.g. `qpa.device.leases.LeasedPhones`); taken at the first reset, kept across the
  environment's episodes, given back at `close()`.
- **Reset** (every episode): wake the screen, force-stop and `pm clear` the task's packages
  (`task.world["_device"]`, see `qpa.envs.device.world`), go home, insert the task's seed rows
  into the apps' providers, launch the start app.
- **Observation**: the foreground app (`dumpsys window`) and the screen's elements from
  `uiautomator dump` (text, id, description, bounds, center, clickable, focused), plus a
  screenshot reference (`file://...png`) when `screenshot_dir` is set.
- **Actions**: `UIAction`s (tap, swipe, type, back, home, launch, intent) or the same gestures
  as device tool calls (`tools()`); `Finish` ends the episode, `MessageUser` is recorded.
- **Verification**: the task's `device` verifier answered by state queries on the phone
  (content providers, dumpsys, settings, properties), `fidelity="device"`.
- **Failures**: the phone or adb gone, adb errors, time-outs are `environment_failure` feedback,
  never exceptions. A lost phone ends the episode (`done=True`) and is given back as unhealthy
  (a pooled phone is quarantined and its lease released); three time-outs in a row count as lost.
"""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from qpa.contract import (
    Action,
    Delegate,
    EnvKind,
    Feedback,
    Finish,
    MessageUser,
    Task,
    ToolCall,
    ToolSpec,
    UIAction,
    Verification,
)
from qpa.envs.device.actions import (
    DEVICE_TOOLS,
    TOOL_NAMES,
    InvalidAction,
    command_for,
    failure_of,
    to_ui_action,
)
from qpa.envs.device.adb import DEFAULT_TIMEOUT_S, AdbPhone, DeviceError
from qpa.envs.device.parse import extract_xml, parse_foreground, parse_hierarchy
from qpa.envs.device.source import FixedPhone, PhoneClaim, PhoneSource, PhoneUnavailable
from qpa.envs.device.verify import unreachable, verify_device
from qpa.envs.device.world import WORLD_KEY, DeviceWorld, seed_commands

MAX_STEPS = 200
MAX_TIMEOUTS = 3
UI_DUMP = "/data/local/tmp/qpa-ui.xml"
OBSERVE = (
    "dumpsys window | grep -E 'mCurrentFocus|mFocusedApp'; "
    f"uiautomator dump {UI_DUMP} >/dev/null && cat {UI_DUMP}"
)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class DeviceEnv:
    """One phone; one episode at a time (servers hold one per session)."""

    kind: EnvKind = "device"

    def __init__(
        self,
        *,
        serial: str | None = None,
        adb: str | None = None,
        phones: PhoneSource | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_steps: int = MAX_STEPS,
        screenshot_dir: str | Path | None = None,
        holder: str | None = None,
    ) -> None:
        if phones is None:
            if not serial:
                raise ValueError(
                    "DeviceEnv needs a phone: serial= (with adb=HOST:PORT) or phones= (a pool)"
                )
            phones = FixedPhone(serial, adb) if adb else FixedPhone(serial)
        elif serial or adb:
            raise ValueError("DeviceEnv takes serial=/adb= or phones=, not both")
        if timeout <= 0 or max_steps < 1:
            raise ValueError("timeout and max_steps must be positive")
        self._source = phones
        self.timeout = timeout
        self.max_steps = max_steps
        self.screenshot_dir = Path(screenshot_dir) if screenshot_dir else None
        self.holder = holder or f"{socket.gethostname()}/{uuid.uuid4().hex[:8]}"
        self._claim: PhoneClaim | None = None
        self._phone: AdbPhone | None = None
        self._lost: str | None = None
        self._episodes = 0
        self._clear()

    def _clear(self) -> None:
        self._task: Task | None = None
        self._world = DeviceWorld()
        self._steps = 0
        self._timeouts = 0
        self._finished = False
        self._answer: str | None = None
        self.messages: list[str] = []

    @property
    def serial(self) -> str | None:
        return self._phone.serial if self._phone else None

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Task) -> Feedback:
        self._clear()
        self._episodes += 1
        try:
            world = DeviceWorld.model_validate(task.world.get(WORLD_KEY, {}))
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]
            where = ".".join(map(str, problem["loc"]))
            return Feedback.fail(
                "environment_failure",
                f"task world '{WORLD_KEY}.{where}' is invalid: {problem['msg']}",
            )
        packages = list(dict.fromkeys([*world.packages, *task.apps]))
        phone = self._ensure_phone(packages)
        if isinstance(phone, Feedback):
            return phone
        self._task, self._world = task, world
        try:
            self._reset_phone(phone, world, packages)
            observation = self._observe(phone)
        except DeviceError as exc:
            return self._device_failure(exc, "reset")
        return Feedback.ok(
            {
                "serial": phone.serial,
                "apps": packages,
                "tools": [t.name for t in DEVICE_TOOLS],
                **observation,
            }
        )

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
            return Feedback.fail(
                "precondition_failed", f"step budget of {self.max_steps} exhausted", done=True
            )
        if isinstance(action, Finish):
            self._finished = True
            self._answer = action.answer
            return Feedback.ok({"finished": True}, done=True)
        if isinstance(action, MessageUser):
            self.messages.append(action.text)
            return Feedback.ok({"delivered": True})
        if isinstance(action, Delegate):
            return Feedback.fail(
                "precondition_failed", "delegation is handled by the Harness, not the environment"
            )
        if isinstance(action, ToolCall):
            if action.tool not in TOOL_NAMES:
                known = ", ".join(sorted(TOOL_NAMES))
                return Feedback.fail(
                    "unknown_tool", f"no tool named '{action.tool}' on a phone; tools: {known}"
                )
            try:
                gesture = to_ui_action(action.tool, action.arguments)
            except InvalidAction as exc:
                return Feedback.fail("invalid_arguments", str(exc))
        else:
            gesture = action
        return self._gesture(gesture)

    def verify(self) -> Verification:
        task = self._task
        if task is None:
            return Verification(done=False, success=False, progress=0.0, fidelity="device")
        spec = task.verifier
        if spec.kind != "device":
            return unreachable(
                spec,
                f"a phone verifies 'device' verifiers; this task's verifier is {spec.kind!r}",
                finished=self._finished,
            )
        phone = self._live_phone()
        if isinstance(phone, Feedback):
            return unreachable(spec, phone.message, finished=self._finished)
        gone: list[DeviceError] = []

        def query(command: str) -> str:
            try:
                return phone.check(command)
            except DeviceError as exc:
                if exc.gone:
                    gone.append(exc)
                raise

        verification = verify_device(spec, query, self._answer, finished=self._finished)
        if gone:
            self._give_back(healthy=False, reason=str(gone[0]))
        return verification

    def tools(self) -> list[ToolSpec]:
        return list(DEVICE_TOOLS)

    def close(self) -> None:
        self._give_back(healthy=True, reason="")
        self._task = None

    # ------------------------------------------------------------------ extras
    def state(self) -> dict[str, Any]:
        """What the environment knows about its phone and episode (servers and debugging)."""
        return {
            "serial": self.serial,
            "holder": self.holder,
            "lost": self._lost,
            "steps": self._steps,
            "finished": self._finished,
            "messages": list(self.messages),
        }

    @property
    def finished(self) -> bool:
        return self._finished

    # ------------------------------------------------------------------ phone
    def _ensure_phone(self, packages: list[str]) -> AdbPhone | Feedback:
        if self._claim is not None and (reason := self._claim.lost()):
            self._claim, self._phone, self._lost = None, None, reason
        if self._claim is None:
            try:
                self._claim = self._source.acquire(holder=self.holder, packages=packages)
            except PhoneUnavailable as exc:
                return Feedback.fail("environment_failure", f"no phone: {exc}", done=True)
            address = self._claim.address
            self._phone = AdbPhone(address.serial, address.host, address.port, timeout=self.timeout)
            self._lost = None
        else:
            self._claim.record_packages(packages)
        assert self._phone is not None
        return self._phone

    def _live_phone(self) -> AdbPhone | Feedback:
        if self._claim is not None and (reason := self._claim.lost()):
            self._claim, self._phone, self._lost = None, None, reason
        if self._phone is None:
            why = self._lost or "no phone is held"
            return Feedback.fail("environment_failure", f"the phone is gone: {why}", done=True)
        return self._phone

    def _give_back(self, *, healthy: bool, reason: str) -> None:
        claim, self._claim, self._phone = self._claim, None, None
        if not healthy:
            self._lost = reason
        if claim is not None and claim.lost() is None:
            claim.release(healthy=healthy, reason=reason)

    def _device_failure(self, exc: DeviceError, during: str) -> Feedback:
        serial = self.serial or "phone"
        if not exc.gone:
            self._timeouts += 1
        lost = exc.gone or self._timeouts >= MAX_TIMEOUTS
        if lost:
            self._give_back(healthy=False, reason=f"{during}: {exc}")
        return Feedback.fail("environment_failure", f"{serial} ({during}): {exc}", done=lost)

    def _reset_phone(self, phone: AdbPhone, world: DeviceWorld, packages: list[str]) -> None:
        phone.check("input keyevent KEYCODE_WAKEUP")
        for package in packages:
            phone.check(f"am force-stop {package}")
            cleared = phone.check(f"pm clear {package}")
            if "Success" not in cleared:
                raise DeviceError(f"pm clear {package}: {cleared.strip()}", gone=False)
        phone.check("input keyevent KEYCODE_HOME")
        for command in seed_commands(world):
            phone.check(command)
        if world.start:
            out = phone.shell(f"monkey -p {world.start} -c android.intent.category.LAUNCHER 1")
            failure = failure_of(UIAction(op="launch"), out.text, out.error_text, out.code)
            if failure:
                raise DeviceError(f"launching {world.start}: {failure}", gone=False)

    def _gesture(self, action: UIAction) -> Feedback:
        try:
            command = command_for(action)
        except InvalidAction as exc:
            return Feedback.fail("invalid_arguments", f"{action.op}: {exc}")
        phone = self._live_phone()
        if isinstance(phone, Feedback):
            return phone
        try:
            out = phone.shell(command)
            failure = failure_of(action, out.text, out.error_text, out.code)
            if failure:
                self._timeouts = 0
                return Feedback.fail("precondition_failed", f"{action.op}: {failure}")
            observation = self._observe(phone)
        except DeviceError as exc:
            return self._device_failure(exc, action.op)
        self._timeouts = 0
        return Feedback.ok(observation)

    def _observe(self, phone: AdbPhone) -> dict[str, Any]:
        problem = ""
        for _ in range(2):  # uiautomator fails now and then while the screen animates
            out = phone.shell(OBSERVE)
            try:
                elements = parse_hierarchy(extract_xml(out.text))
            except ValueError as exc:
                problem = f"{exc} ({out.error_text or 'no error output'})"
                continue
            foreground = parse_foreground(out.text)
            observation: dict[str, Any] = {
                "foreground": foreground.model_dump() if foreground else None,
                "screen": [e.compact() for e in elements],
            }
            if self.screenshot_dir is not None:
                observation["screenshot"] = self._screenshot(phone)
            return observation
        raise DeviceError(f"cannot read the screen: {problem}", gone=False)

    def _screenshot(self, phone: AdbPhone) -> str:
        out = phone.shell("screencap -p")
        if out.code != 0 or not out.stdout.startswith(b"\x89PNG"):
            raise DeviceError(f"screencap failed: {out.error_text or 'no PNG'}", gone=False)
        assert self.screenshot_dir is not None and self._task is not None
        name = _UNSAFE.sub("_", f"{self._task.id}-{self._episodes:04d}-{self._steps:03d}.png")
        path = self.screenshot_dir / _UNSAFE.sub("_", phone.serial) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out.stdout)
        return path.resolve().as_uri()
