"""Phone health probes the bridge runs: shell responsive, battery, screen.

`probe(phone, timeout)` returns the problems found (empty when healthy):

- the shell answers `echo` within the timeout;
- the battery is at `MIN_BATTERY` percent or more, or a charger is connected;
- the screen is on; a phone whose screen is off is woken (`KEYCODE_WAKEUP`) and checked again.

`reset_phone` is what the bridge does before a phone whose holder was lost is used again.
"""

from __future__ import annotations

from collections.abc import Sequence

from qpa.envs.device.actions import PACKAGE
from qpa.envs.device.adb import AdbPhone, DeviceError
from qpa.envs.device.parse import parse_awake, parse_battery

MIN_BATTERY = 15
_OK = "qpa-ok"


def probe(phone: AdbPhone, timeout: float) -> list[str]:
    """What is wrong with the phone (empty: healthy). A phone that is gone raises DeviceError."""
    try:
        answer = phone.shell(f"echo {_OK}", timeout=timeout)
    except DeviceError as exc:
        if exc.gone:
            raise
        return [f"shell not responsive: {exc}"]
    if _OK not in answer.text:
        return [f"shell answered {answer.text.strip()!r} to echo"]
    problems: list[str] = []
    try:
        battery = parse_battery(phone.check("dumpsys battery", timeout=timeout))
        if battery.level < MIN_BATTERY and not battery.powered:
            problems.append(f"battery at {battery.level}% and not charging")
        if not parse_awake(phone.check("dumpsys power", timeout=timeout)):
            phone.check("input keyevent KEYCODE_WAKEUP", timeout=timeout)
            if not parse_awake(phone.check("dumpsys power", timeout=timeout)):
                problems.append("screen stays off after a wake-up key")
    except DeviceError as exc:
        if exc.gone:
            raise
        problems.append(str(exc))
    except ValueError as exc:  # a dumpsys the parsers cannot read
        problems.append(str(exc))
    return problems


def reset_phone(phone: AdbPhone, packages: Sequence[str], timeout: float) -> None:
    """Force-stop and clear `packages`, then go home (before the phone is leased again)."""
    for package in packages:
        if not PACKAGE.match(package):
            continue  # an annotation is not a place to inject shell commands
        phone.check(f"am force-stop {package}", timeout=timeout)
        phone.check(f"pm clear {package}", timeout=timeout)
    phone.check("input keyevent KEYCODE_HOME", timeout=timeout)
