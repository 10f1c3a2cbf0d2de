"""Parsers for what a phone prints: UI hierarchy XML, dumpsys sections, `content query` rows.

Everything here is a pure function of text, so it is tested without a phone. The XML comes from
the phone and is parsed with defusedxml (no entity expansion, no external references).
"""

from __future__ import annotations

import re
from typing import Any

from defusedxml import ElementTree
from pydantic import BaseModel, ConfigDict

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
_FOCUS = re.compile(r"mCurrentFocus=Window\{[^}]*?\s(\S+)/(\S+?)\}")
_FOCUSED_APP = re.compile(r"mFocusedApp=.*?\s([\w.]+)/([\w.$]+)")
_ROW = re.compile(r"^Row: \d+ (.*)$")
_CELL_SPLIT = re.compile(r", (?=[A-Za-z_][A-Za-z0-9_]*=)")
_XML_START = "<?xml"
_XML_END = "</hierarchy>"


class ScreenElement(BaseModel):
    """One meaningful view on the screen, with the point a tap should hit."""

    model_config = ConfigDict(extra="forbid")

    index: int
    cls: str
    text: str = ""
    id: str = ""
    desc: str = ""
    bounds: tuple[int, int, int, int]
    center: tuple[int, int]
    clickable: bool = False
    focused: bool = False
    scrollable: bool = False
    checked: bool | None = None
    package: str = ""

    def compact(self) -> dict[str, Any]:
        """The element for an observation: empty and false fields left out."""
        data = self.model_dump(exclude_defaults=True, exclude={"package"})
        data["index"], data["cls"] = self.index, self.cls
        data["center"] = list(self.center)
        data["bounds"] = list(self.bounds)
        return data


class Foreground(BaseModel):
    """The app and activity that has the focus."""

    model_config = ConfigDict(extra="forbid")

    package: str
    activity: str


def extract_xml(output: str) -> str:
    """The hierarchy document inside a command's output (dump messages around it dropped)."""
    start = output.find(_XML_START)
    end = output.rfind(_XML_END)
    if start < 0 or end < start:
        raise ValueError("no UI hierarchy in the output of uiautomator dump")
    return output[start : end + len(_XML_END)]


def parse_hierarchy(xml: str) -> list[ScreenElement]:
    """The elements a planner can see or act on (text, description, id, or clickable)."""
    try:
        root = ElementTree.fromstring(xml)
    except Exception as exc:  # ParseError and defusedxml's refusals
        raise ValueError(f"the UI hierarchy is not valid XML: {exc}") from None
    elements: list[ScreenElement] = []
    for node in root.iter("node"):
        attrs = node.attrib
        match = _BOUNDS.fullmatch(attrs.get("bounds", ""))
        if match is None:
            continue
        left, top, right, bottom = (int(v) for v in match.groups())
        clickable = attrs.get("clickable") == "true"
        text, desc = attrs.get("text", ""), attrs.get("content-desc", "")
        rid = attrs.get("resource-id", "")
        if not (text or desc or rid or clickable) or right <= left or bottom <= top:
            continue
        checkable = attrs.get("checkable") == "true"
        elements.append(
            ScreenElement(
                index=len(elements),
                cls=attrs.get("class", "").rsplit(".", 1)[-1],
                text=text,
                id=rid.split(":id/", 1)[-1],
                desc=desc,
                bounds=(left, top, right, bottom),
                center=((left + right) // 2, (top + bottom) // 2),
                clickable=clickable,
                focused=attrs.get("focused") == "true",
                scrollable=attrs.get("scrollable") == "true",
                checked=(attrs.get("checked") == "true") if checkable else None,
                package=attrs.get("package", ""),
            )
        )
    return elements


def parse_foreground(dumpsys_window: str) -> Foreground | None:
    """The focused app from `dumpsys window` (`mCurrentFocus`, else `mFocusedApp`)."""
    for pattern in (_FOCUS, _FOCUSED_APP):
        match = pattern.search(dumpsys_window)
        if match:
            package, activity = match.groups()
            if activity.startswith("."):
                activity = package + activity
            return Foreground(package=package, activity=activity)
    return None


def _value(text: str) -> Any:
    return None if text == "NULL" else text


def parse_content_rows(output: str) -> list[dict[str, Any]]:
    """Rows of `content query` (`Row: 0 a=1, b=x y`); `No result found.` is no rows.

    Values stay strings (`NULL` becomes None): the provider's types are not in the output.
    """
    rows = []
    for line in output.splitlines():
        match = _ROW.match(line.strip())
        if match is None:
            continue
        row: dict[str, Any] = {}
        for cell in _CELL_SPLIT.split(match.group(1)):
            key, sep, value = cell.partition("=")
            if sep:
                row[key.strip()] = _value(value)
        rows.append(row)
    return rows


def parse_dumpsys_fields(output: str) -> dict[str, str]:
    """`key: value` and `key=value` lines of a dumpsys section, keys as printed."""
    fields: dict[str, str] = {}
    for line in output.splitlines():
        line = line.strip()
        key, found, value = line.partition(": ")
        if not found:
            key, found, value = line.partition("=")
            if " " in key:
                continue
        if found and key:
            fields.setdefault(key.strip(), value.strip())
    return fields


class Battery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: int
    powered: bool


def parse_battery(output: str) -> Battery:
    """Level (0-100) and whether any charger is connected, from `dumpsys battery`."""
    fields = parse_dumpsys_fields(output)
    try:
        level, scale = int(fields["level"]), int(fields.get("scale", "100") or 100)
    except (KeyError, ValueError):
        raise ValueError("dumpsys battery printed no level") from None
    powered = any(
        fields.get(k) == "true"
        for k in ("AC powered", "USB powered", "Wireless powered", "Dock powered")
    )
    return Battery(level=round(100 * level / max(scale, 1)), powered=powered)


def parse_awake(output: str) -> bool:
    """Whether the screen is on, from `dumpsys power`."""
    fields = parse_dumpsys_fields(output)
    if "mWakefulness" in fields:
        return fields["mWakefulness"] == "Awake"
    if "Display Power" in fields:
        return fields["Display Power"].endswith("ON")
    raise ValueError("dumpsys power printed neither mWakefulness nor Display Power")
