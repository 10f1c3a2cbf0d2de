"""Parsers of what phones print: hierarchy XML, dumpsys, content rows (no phone needed)."""

from __future__ import annotations

import pytest

from qpa.envs.device.parse import (
    extract_xml,
    parse_awake,
    parse_battery,
    parse_content_rows,
    parse_foreground,
    parse_hierarchy,
)

# As a Pixel prints it (trimmed): nested nodes, an empty container, a checkable switch.
HIERARCHY = """UI hierchary dumped to: /dev/tty
<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation="0">
<node index="0" text="" resource-id="" class="android.widget.FrameLayout"
 package="com.android.settings"
content-desc="" checkable="false" checked="false" clickable="false" enabled="true"
  focusable="false"
 focused="false" scrollable="false" long-clickable="false" password="false" selected="false"
 bounds="[0,0][1080,2400]">
 <node index="0" text="Wi-Fi" resource-id="android:id/title" class="android.widget.TextView"
package="com.android.settings" content-desc="" checkable="false" checked="false"
   clickable="false"
  enabled="true" focusable="false" focused="false" scrollable="false" long-clickable="false"
  password="false" selected="false" bounds="[48,300][600,360]" />
 <node index="1" text="" resource-id="android:id/switch_widget" class="android.widget.Switch"
package="com.android.settings" content-desc="Wi-Fi" checkable="true" checked="true"
   clickable="true"
  enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false"
  password="false" selected="false" bounds="[900,280][1032,380]" />
<node index="2" text="" resource-id="" class="android.widget.LinearLayout"
  package="com.android.settings"
content-desc="" checkable="false" checked="false" clickable="false" enabled="true"
   focusable="false"
  focused="false" scrollable="true" long-clickable="false" password="false" selected="false"
  bounds="[0,400][1080,2400]" />
</node></hierarchy>"""


def test_hierarchy_keeps_what_a_planner_can_see_or_act_on() -> None:
    elements = parse_hierarchy(extract_xml(HIERARCHY))
    assert [(e.cls, e.text, e.id, e.desc) for e in elements] == [
        ("TextView", "Wi-Fi", "title", ""),
        ("Switch", "", "switch_widget", "Wi-Fi"),
    ]
    switch = elements[1]
    assert switch.center == (966, 330) and switch.clickable and switch.checked is True
    assert switch.compact() == {
        "index": 1, "cls": "Switch", "id": "switch_widget", "desc": "Wi-Fi",
        "bounds": [900, 280, 1032, 380], "center": [966, 330], "clickable": True,
        "checked": True,
    }  # fmt: skip
    assert elements[0].checked is None  # not checkable: no checked field at all


def test_malformed_or_hostile_xml_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="no UI hierarchy"):
        extract_xml("ERROR: could not get idle state.")
    with pytest.raises(ValueError, match="not valid XML"):
        parse_hierarchy("<hierarchy><node></hierarchy>")
    bomb = (
        '<?xml version="1.0"?><!DOCTYPE h [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
        '<hierarchy><node text="&b;" bounds="[0,0][1,1]"/></hierarchy>'
    )
    with pytest.raises(ValueError, match="not valid XML"):
        parse_hierarchy(bomb)


def test_foreground_from_dumpsys_window() -> None:
    text = (
        "  mCurrentFocus=Window{b3c1a2e u0 com.google.android.apps.messaging/"
        "com.google.android.apps.messaging.ui.ConversationListActivity}\n"
    )
    foreground = parse_foreground(text)
    assert foreground is not None
    assert foreground.package == "com.google.android.apps.messaging"
    assert foreground.activity.endswith("ConversationListActivity")
    short = parse_foreground("  mFocusedApp=ActivityRecord{1 u0 com.android.settings/.Settings t9}")
    assert short is not None and short.activity == "com.android.settings.Settings"
    assert parse_foreground("mCurrentFocus=null") is None


def test_content_rows_keep_commas_inside_values() -> None:
    output = (
        "Row: 0 _id=1, address=Bob, body=milk, eggs, bread, type=sent, date=NULL\n"
        "Row: 1 _id=2, address=Alice, body=ok, type=inbox, date=1767225601000\n"
    )
    rows = parse_content_rows(output)
    assert rows[0] == {
        "_id": "1", "address": "Bob", "body": "milk, eggs, bread", "type": "sent", "date": None,
    }  # fmt: skip
    assert rows[1]["date"] == "1767225601000"
    assert parse_content_rows("No result found.\n") == []


def test_battery_and_screen() -> None:
    battery = parse_battery(
        "Current Battery Service state:\n  AC powered: false\n  USB powered: true\n"
        "  level: 42\n  scale: 100\n"
    )
    assert (battery.level, battery.powered) == (42, True)
    with pytest.raises(ValueError, match="no level"):
        parse_battery("Can't find service: battery")
    assert parse_awake("POWER MANAGER\n  mWakefulness=Asleep\n") is False
    assert parse_awake("Display Power: state=ON\n") is True
    with pytest.raises(ValueError, match="mWakefulness"):
        parse_awake("nothing useful")
