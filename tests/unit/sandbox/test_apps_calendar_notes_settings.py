"""Calendar, notes, reminders, settings and clock apps and their task templates.

App behaviour is exercised through `SandboxEnv.step` on one small, rich world: every tool's happy
path, the domain failures (conflicts, not found, invalid arguments naming the field) and the
state rules the Skills describe. Template tests check capability coverage and that the memory
and skills tasks really depend on the remembered value / the documented procedure.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from helpers.sandbox_steps import call, ok, open_env, record

from qpa.contract import Action, MemoryItem, Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.apps.calendar import calendar_record, event_record
from qpa.envs.sandbox.apps.clock import alarm_record, world_clock_record
from qpa.envs.sandbox.apps.notes import folder_record, note_record
from qpa.envs.sandbox.apps.reminders import list_record, reminder_record
from qpa.envs.sandbox.apps.settings import (
    bluetooth_record,
    permission_record,
    system_record,
    wifi_record,
)
from qpa.envs.sandbox.authoring import EVIDENCE_RANK, recall
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import all_templates, generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

APPS = ("calendar", "notes", "reminders", "settings", "clock")
DOMAINS = ("calendar", "notes", "settings")
MY_TOOLS = sorted(n for n, b in all_tools().items() if b.app.name in APPS)
MY_TASKS = [t for t in generate_suite() if t.domain in DOMAINS]


def _world() -> dict[str, Any]:
    timer = {
        "id": "tm_1",
        "label": "Eggs",
        "duration_s": 300,
        "remaining_s": 120,
        "state": "paused",
        "ends_at": None,
    }
    return {
        "calendar": {
            "calendars": [
                calendar_record("primary", "Personal"),
                calendar_record(
                    "cal_dana",
                    "Dana Lee",
                    owner="Dana Lee",
                    email="dana@example.com",
                    access="free_busy",
                ),
            ],
            "events": [
                event_record(
                    "ev_1",
                    "Team sync",
                    "2026-03-03T10:00",
                    "2026-03-03T11:00",
                    attendees=["sam@example.com"],
                    location="Room 2",
                ),
                event_record("ev_2", "Dentist", "2026-03-03T14:00", "2026-03-03T14:30"),
                event_record(
                    "ev_3",
                    "Offsite",
                    "2026-03-04T09:00",
                    "2026-03-04T12:00",
                    organizer="boss@example.com",
                    response="needs_action",
                    attendees=["me@example.com"],
                ),
                event_record(
                    "ev_4",
                    "Yoga",
                    "2026-03-02T18:00",
                    "2026-03-02T19:00",
                    recurrence="weekly",
                    repeat_count=4,
                ),
                event_record(
                    "ev_5", "Busy", "2026-03-03T09:00", "2026-03-03T12:00", calendar_id="cal_dana"
                ),
                event_record(
                    "ev_6",
                    "Old party",
                    "2026-03-03T16:00",
                    "2026-03-03T17:00",
                    attendees=["kim@example.com"],
                    status="cancelled",
                ),
                event_record(
                    "ev_7",
                    "Maybe lunch",
                    "2026-03-03T12:00",
                    "2026-03-03T13:00",
                    organizer="kim@example.com",
                    response="declined",
                ),
            ],
        },
        "notes": {
            "folders": [folder_record("f_notes", "Notes"), folder_record("f_lists", "Lists")],
            "notes": [
                note_record(
                    "n_1",
                    "Grocery list",
                    "Weekly shop",
                    folder="Lists",
                    checklist=[{"text": "milk", "done": False}, {"text": "eggs", "done": True}],
                ),
                note_record("n_2", "Ideas", "first idea", tags=["misc"]),
                {**note_record("n_3", "Old draft", "draft"), "deleted": True},
                note_record("n_4", "Grocery list ideas", "grocery list for the party"),
            ],
        },
        "reminders": {
            "lists": [list_record("rl_home", "Home"), list_record("rl_work", "Work")],
            "reminders": [
                reminder_record("r_1", "Move house", "rl_home", due="2026-03-10T09:00"),
                reminder_record("r_2", "Pack books", "rl_home", parent_id="r_1"),
                reminder_record(
                    "r_3", "Pay rent", "rl_home", due="2026-03-01T09:00", completed=True
                ),
                reminder_record(
                    "r_4", "Take vitamins", "rl_home", due="2026-03-06T08:00", repeat="weekdays"
                ),
                reminder_record("r_5", "Call mum", "rl_home"),
                reminder_record("r_6", "Send report", "rl_work", due="2026-02-27T17:00"),
            ],
        },
        "settings": {
            "system": system_record(auto_brightness=True, bluetooth=True),
            "wifi_networks": [
                wifi_record("w_1", "Home", password="homepass1", saved=True),
                wifi_record("w_2", "Cafe", password="latte1234"),
                wifi_record("w_3", "Far away", password="faraway12", in_range=False),
                wifi_record("w_4", "Free", secured=False),
            ],
            "bluetooth_devices": [
                bluetooth_record("bt_1", "Buds", "headphones", connected=True),
                bluetooth_record("bt_2", "Speaker", "speaker", paired=False),
                bluetooth_record("bt_3", "Old watch", "watch", paired=False, in_range=False),
                bluetooth_record("bt_4", "Car", "car"),
            ],
            "dnd_schedules": [
                {
                    "id": "dnd_1",
                    "name": "Sleep",
                    "start": "23:00",
                    "end": "07:00",
                    "days": ["mon"],
                    "allow_favorites": False,
                    "enabled": True,
                }
            ],
            "app_permissions": [
                permission_record("p_1", "Maps", "location", True),
                permission_record("p_2", "Snapgram", "camera", True),
                permission_record("p_3", "Snapgram", "location", False),
            ],
        },
        "clock": {
            "alarms": [
                alarm_record("al_1", "07:00", "Work", days=["mon", "tue", "wed", "thu", "fri"]),
                alarm_record("al_2", "06:00", "Flight", date="2026-03-05"),
            ],
            "timers": [timer],
            "world_clocks": [world_clock_record("wc_1", "London")],
        },
        "contacts": {"contacts": []},
    }


def _task(world: dict[str, Any] | None = None) -> Task:
    return Task(
        id="unit.apps.000",
        domain="calendar",
        capabilities=["tool_use"],
        instruction="unit test",
        apps=[*APPS, "contacts"],
        world=world if world is not None else _world(),
    )


@pytest.fixture
def env() -> SandboxEnv:
    return open_env(_task())


# --------------------------------------------------------------------------- registry


def test_apps_ship_many_typed_tools_and_skills() -> None:
    assert len(MY_TOOLS) >= 50
    tools = all_tools()
    for name in MY_TOOLS:
        spec = tools[name].spec
        assert name.startswith(f"{spec.app}_"), name
        assert spec.description and spec.result, name
        assert spec.parameters["additionalProperties"] is False
    for app in APPS:
        assert all_apps()[app].skills, app


# Every tool of the five apps, called once in an order where each call succeeds.
HAPPY_PATH: list[tuple[str, dict[str, Any]]] = [
    ("calendar_list_calendars", {}),
    ("calendar_list_events", {"date_from": "2026-03-02", "date_to": "2026-03-09", "limit": 2}),
    ("calendar_search_events", {"query": "sync"}),
    ("calendar_get_event", {"event_id": "ev_1"}),
    (
        "calendar_find_free_slots",
        {"date": "2026-03-03", "duration_min": 60, "earliest": "09:00", "latest": "13:00"},
    ),
    (
        "calendar_create_event",
        {
            "title": "Lunch",
            "start": "2026-03-05T12:00",
            "end": "2026-03-05T13:00",
            "attendees": ["x@example.com"],
        },
    ),
    (
        "calendar_create_recurring_event",
        {
            "title": "Standup",
            "start": "2026-03-05T09:00",
            "end": "2026-03-05T09:15",
            "frequency": "weekly",
            "count": 4,
        },
    ),
    ("calendar_update_event", {"event_id": "ev_1", "location": "Room 1"}),
    ("calendar_reschedule_event", {"event_id": "ev_1", "start": "2026-03-03T15:00"}),
    ("calendar_add_attendees", {"event_id": "ev_1", "emails": ["kim@example.com"]}),
    ("calendar_remove_attendee", {"event_id": "ev_1", "email": "sam@example.com"}),
    ("calendar_set_reminder", {"event_id": "ev_1", "minutes_before": 15}),
    ("calendar_respond_to_invite", {"event_id": "ev_3", "response": "declined"}),
    ("calendar_cancel_event", {"event_id": "ev_1", "message": "Sorry, cancelled"}),
    ("calendar_delete_event", {"event_id": "ev_2"}),
    ("notes_list_folders", {}),
    ("notes_list", {"folder": "Lists"}),
    ("notes_search", {"query": "grocery"}),
    ("notes_get", {"note_id": "n_1"}),
    ("notes_create", {"title": "Trip", "body": "Pack light", "tags": ["travel"]}),
    ("notes_append", {"note_id": "n_2", "text": "second idea"}),
    ("notes_update", {"note_id": "n_2", "title": "Ideas 2026"}),
    ("notes_create_folder", {"name": "Work"}),
    ("notes_move", {"note_id": "n_2", "folder": "Work"}),
    ("notes_tag", {"note_id": "n_2", "tag": "work"}),
    ("notes_untag", {"note_id": "n_2", "tag": "misc"}),
    ("notes_pin", {"note_id": "n_2"}),
    ("notes_add_checklist_item", {"note_id": "n_1", "text": "bread"}),
    ("notes_check_item", {"note_id": "n_1", "text": "eggs", "done": False}),
    ("notes_share", {"note_id": "n_1", "email": "sam@example.com", "permission": "edit"}),
    ("notes_delete", {"note_id": "n_2"}),
    ("notes_restore", {"note_id": "n_2"}),
    ("reminders_list_lists", {}),
    ("reminders_list", {"list_id": "rl_home"}),
    ("reminders_search", {"query": "rent", "include_completed": True}),
    ("reminders_create_list", {"name": "Garden", "color": "green"}),
    ("reminders_create", {"title": "Book the van", "list_id": "rl_home", "parent_id": "r_1"}),
    ("reminders_update", {"reminder_id": "r_5", "due": "2026-03-04T10:00"}),
    ("reminders_snooze", {"reminder_id": "r_5", "minutes": 60}),
    ("reminders_flag", {"reminder_id": "r_5"}),
    ("reminders_move", {"reminder_id": "r_5", "list_id": "rl_work"}),
    ("reminders_complete", {"reminder_id": "r_4"}),
    ("reminders_reopen", {"reminder_id": "r_3"}),
    ("reminders_complete", {"reminder_id": "r_3"}),
    ("reminders_clear_completed", {"list_id": "rl_home"}),
    ("reminders_delete", {"reminder_id": "r_1"}),
    ("settings_get_all", {}),
    ("settings_toggle", {"setting": "auto_brightness", "enabled": False}),
    ("settings_set_brightness", {"level": 30}),
    ("settings_set_volume", {"stream": "media", "level": 3}),
    ("settings_set_screen_timeout", {"seconds": 120}),
    ("settings_set_font_size", {"size": "large"}),
    ("settings_set_ringtone", {"sound": "Marimba"}),
    ("settings_set_do_not_disturb", {"enabled": True, "until": "2026-03-02T12:00"}),
    ("settings_list_wifi_networks", {}),
    ("settings_connect_wifi", {"ssid": "Cafe", "password": "latte1234"}),
    ("settings_forget_wifi", {"ssid": "Home"}),
    ("settings_list_bluetooth_devices", {}),
    ("settings_pair_bluetooth", {"device_id": "bt_2"}),
    ("settings_connect_bluetooth", {"device_id": "bt_2"}),
    ("settings_unpair_bluetooth", {"device_id": "bt_1"}),
    (
        "settings_create_dnd_schedule",
        {
            "start": "22:30",
            "end": "06:30",
            "days": ["sun", "fri"],
            "name": "Night",
            "allow_favorites": True,
        },
    ),
    ("settings_list_dnd_schedules", {}),
    ("settings_delete_dnd_schedule", {"schedule_id": "dnd_1"}),
    ("settings_list_app_permissions", {"permission": "location"}),
    ("settings_set_app_permission", {"app": "maps", "permission": "location", "granted": False}),
    ("clock_list_alarms", {}),
    ("clock_list_sounds", {}),
    ("clock_create_alarm", {"time": "6:45", "days": ["fri", "mon"], "sound": "Harp"}),
    ("clock_update_alarm", {"alarm_id": "al_1", "label": "Office"}),
    ("clock_set_alarm_enabled", {"alarm_id": "al_2", "enabled": False}),
    ("clock_skip_alarm_once", {"alarm_id": "al_1", "date": "2026-03-04"}),
    ("clock_delete_alarm", {"alarm_id": "al_2"}),
    ("clock_start_timer", {"minutes": 10, "label": "Tea"}),
    ("clock_list_timers", {}),
    ("clock_pause_timer", {"timer_id": "tm_9001"}),
    ("clock_resume_timer", {"timer_id": "tm_9001"}),
    ("clock_cancel_timer", {"timer_id": "tm_9001"}),
    ("clock_add_world_clock", {"city": "Tokyo"}),
    ("clock_list_world_clocks", {}),
    ("clock_remove_world_clock", {"clock_id": "wc_1"}),
]


def test_every_tool_has_a_happy_path_or_a_reference_plan() -> None:
    in_plans = {a.tool for t in MY_TASKS for a in t.reference_plan or [] if isinstance(a, ToolCall)}
    covered = in_plans | {name for name, _ in HAPPY_PATH}
    assert set(MY_TOOLS) <= covered, sorted(set(MY_TOOLS) - covered)
    assert {name for name, _ in HAPPY_PATH} == set(MY_TOOLS)


def test_happy_path_of_every_tool(env: SandboxEnv) -> None:
    results = {}
    for name, arguments in HAPPY_PATH:
        results[name] = ok(env, name, **arguments)
    page = results["calendar_list_events"]
    assert page["total"] >= 4 and len(page["events"]) == 2 and page["next_offset"] == 2
    assert [s["start"][-5:] for s in results["calendar_find_free_slots"]] == [
        "09:00",
        "11:00",
        "11:30",
        "12:00",
    ]
    assert results["notes_search"][0]["id"] == "n_1"  # exact title first, then title, then body
    assert results["clock_create_alarm"]["time"] == "06:45"
    assert results["clock_create_alarm"]["days"] == ["mon", "fri"]
    state = env.state()
    moved = record(env, "calendar.events", "ev_1")
    assert (moved["status"], moved["rescheduled_from"]) == ("cancelled", "2026-03-03T10:00")
    assert moved["attendees"] == ["kim@example.com"]
    assert not any(e["id"] == "ev_2" for e in state["calendar"]["events"])
    assert record(env, "calendar.events", "ev_3")["response"] == "declined"
    grocery = record(env, "notes.notes", "n_1")
    assert {"text": "bread", "done": False} in grocery["checklist"]
    assert {"text": "eggs", "done": False} in grocery["checklist"]
    assert grocery["shared_with"] == [{"email": "sam@example.com", "permission": "edit"}]
    ideas = record(env, "notes.notes", "n_2")
    assert (ideas["folder"], ideas["tags"], ideas["body"]) == (
        "Work",
        ["work"],
        "first idea\nsecond idea",
    )
    reminder_ids = {r["id"] for r in state["reminders"]["reminders"]}
    assert not reminder_ids & {"r_1", "r_2", "r_3", "r_9001"}  # subtasks go with the parent
    assert (
        record(env, "reminders.reminders", "r_4")["due"] == "2026-03-09T08:00"
    )  # weekdays: Fri -> Mon
    assert record(env, "reminders.reminders", "r_5")["list_id"] == "rl_work"
    system = state["settings"]["system"]
    assert (system["brightness"], system["media_volume"], system["wifi_network"]) == (30, 3, "Cafe")
    assert system["dnd_until"] == "2026-03-02T12:00"
    devices = {d["id"]: d for d in state["settings"]["bluetooth_devices"]}
    assert devices["bt_2"]["connected"] and not devices["bt_1"]["paired"]
    night = next(s for s in state["settings"]["dnd_schedules"] if s["name"] == "Night")
    assert night["days"] == ["fri", "sun"]
    assert record(env, "clock.alarms", "al_1")["skip_dates"] == ["2026-03-04"]
    assert record(env, "clock.timers", "tm_9001")["state"] == "cancelled"
    assert [c["city"] for c in state["clock"]["world_clocks"]] == ["Tokyo"]


# --------------------------------------------------------------------------- failures

FAILURES: list[tuple[str, dict[str, Any], str, str]] = [
    # calendar
    (
        "calendar_create_event",
        {"title": "X", "start": "2026-03-03T10:30", "end": "2026-03-03T11:30"},
        "precondition_failed",
        "conflicts with 'Team sync'",
    ),
    (
        "calendar_create_event",
        {"title": "X", "start": "2026-03-16T18:30", "end": "2026-03-16T19:30"},
        "precondition_failed",
        "conflicts with 'Yoga'",
    ),
    (
        "calendar_create_event",
        {"title": "X", "start": "2026-03-03T10:00", "end": "2026-03-03T09:00"},
        "invalid_arguments",
        "argument 'end'",
    ),
    (
        "calendar_create_event",
        {"title": "X", "start": "2026-02-30T10:00", "end": "2026-03-03T11:00"},
        "invalid_arguments",
        "argument 'start'",
    ),
    (
        "calendar_create_event",
        {"title": "X", "start": "tomorrow 10am", "end": "2026-03-03T11:00"},
        "invalid_arguments",
        "argument 'start'",
    ),
    (
        "calendar_create_event",
        {"title": "X", "start": "2026-03-01T10:00", "end": "2026-03-01T11:00"},
        "precondition_failed",
        "in the past",
    ),
    (
        "calendar_create_event",
        {
            "title": "X",
            "start": "2026-03-05T10:00",
            "end": "2026-03-05T11:00",
            "calendar_id": "cal_dana",
        },
        "permission_denied",
        "not yours",
    ),
    (
        "calendar_create_event",
        {
            "title": "X",
            "start": "2026-03-05T10:00",
            "end": "2026-03-05T11:00",
            "attendees": ["not-an-email"],
        },
        "invalid_arguments",
        "argument 'attendees.0'",
    ),
    (
        "calendar_create_event",
        {"title": "X", "start": "2026-03-05T10:00", "end": "2026-03-05T11:00", "colour": "red"},
        "invalid_arguments",
        "unexpected argument 'colour'",
    ),
    (
        "calendar_create_recurring_event",
        {
            "title": "X",
            "start": "2026-03-05T10:00",
            "end": "2026-03-05T11:00",
            "frequency": "yearly",
            "count": 3,
        },
        "invalid_arguments",
        "argument 'frequency'",
    ),
    (
        "calendar_get_event",
        {"event_id": "ev_404"},
        "precondition_failed",
        "event 'ev_404' not found",
    ),
    ("calendar_get_event", {"event_id": "ev_5"}, "permission_denied", "free/busy only"),
    (
        "calendar_list_events",
        {"date_from": "2026-03-03", "calendar_id": "cal_dana"},
        "permission_denied",
        "free/busy only",
    ),
    (
        "calendar_list_events",
        {"date_from": "2026-03-05", "date_to": "2026-03-03"},
        "invalid_arguments",
        "argument 'date_to'",
    ),
    (
        "calendar_list_events",
        {"date_from": "2026-03-03", "limit": 0},
        "invalid_arguments",
        "argument 'limit'",
    ),
    (
        "calendar_find_free_slots",
        {"date": "2026-03-03", "duration_min": 60, "earliest": "15:00", "latest": "09:00"},
        "invalid_arguments",
        "argument 'latest'",
    ),
    (
        "calendar_find_free_slots",
        {"date": "2026-03-03", "duration_min": 5},
        "invalid_arguments",
        "argument 'duration_min'",
    ),
    (
        "calendar_find_free_slots",
        {"date": "2026-03-03", "duration_min": 30, "calendar_id": "cal_x"},
        "precondition_failed",
        "calendar 'cal_x' not found",
    ),
    (
        "calendar_delete_event",
        {"event_id": "ev_1"},
        "precondition_failed",
        "cancel it with calendar_cancel_event",
    ),
    ("calendar_delete_event", {"event_id": "ev_3"}, "precondition_failed", "decline it"),
    (
        "calendar_respond_to_invite",
        {"event_id": "ev_1", "response": "accepted"},
        "precondition_failed",
        "you organise",
    ),
    (
        "calendar_respond_to_invite",
        {"event_id": "ev_3", "response": "maybe"},
        "invalid_arguments",
        "argument 'response'",
    ),
    (
        "calendar_reschedule_event",
        {"event_id": "ev_3", "start": "2026-03-05T09:00"},
        "precondition_failed",
        "organised by boss@example.com",
    ),
    (
        "calendar_reschedule_event",
        {"event_id": "ev_2", "start": "2026-03-03T10:30"},
        "precondition_failed",
        "conflicts with 'Team sync'",
    ),
    (
        "calendar_reschedule_event",
        {"event_id": "ev_2", "start": "2026-03-02T08:00"},
        "precondition_failed",
        "in the past",
    ),
    (
        "calendar_cancel_event",
        {"event_id": "ev_6", "message": "again"},
        "precondition_failed",
        "is cancelled",
    ),
    (
        "calendar_cancel_event",
        {"event_id": "ev_1", "message": ""},
        "invalid_arguments",
        "argument 'message'",
    ),
    ("calendar_update_event", {"event_id": "ev_1"}, "invalid_arguments", "nothing to update"),
    (
        "calendar_add_attendees",
        {"event_id": "ev_1", "emails": ["sam@example.com"]},
        "precondition_failed",
        "already invited",
    ),
    (
        "calendar_remove_attendee",
        {"event_id": "ev_1", "email": "zed@example.com"},
        "precondition_failed",
        "not invited",
    ),
    (
        "calendar_set_reminder",
        {"event_id": "ev_1", "minutes_before": -5},
        "invalid_arguments",
        "argument 'minutes_before'",
    ),
    (
        "calendar_reschedule_event",
        {"event_id": "ev_2", "start": "9999-12-31T23:30"},
        "invalid_arguments",
        "outside 2000-2100",
    ),
    # notes
    (
        "notes_create",
        {"title": "Pie", "folder": "Recipes"},
        "precondition_failed",
        "folder 'Recipes' not found",
    ),
    (
        "notes_create",
        {"title": "grocery list", "folder": "Lists"},
        "precondition_failed",
        "already has a note titled",
    ),
    (
        "notes_create",
        {"title": "Pie", "tags": ["Big Tag"]},
        "invalid_arguments",
        "argument 'tags.0'",
    ),
    (
        "notes_add_checklist_item",
        {"note_id": "n_1", "text": "Eggs"},
        "precondition_failed",
        "untick it",
    ),
    (
        "notes_add_checklist_item",
        {"note_id": "n_1", "text": "milk"},
        "precondition_failed",
        "already on",
    ),
    (
        "notes_check_item",
        {"note_id": "n_1", "text": "caviar"},
        "precondition_failed",
        "no item 'caviar'",
    ),
    ("notes_append", {"note_id": "n_3", "text": "more"}, "precondition_failed", "Recently Deleted"),
    (
        "notes_append",
        {"note_id": "n_404", "text": "more"},
        "precondition_failed",
        "note 'n_404' not found",
    ),
    ("notes_tag", {"note_id": "n_2", "tag": "misc"}, "precondition_failed", "already tagged"),
    ("notes_untag", {"note_id": "n_2", "tag": "work"}, "precondition_failed", "not tagged"),
    ("notes_restore", {"note_id": "n_2"}, "precondition_failed", "not deleted"),
    ("notes_delete", {"note_id": "n_3"}, "precondition_failed", "already in Recently Deleted"),
    (
        "notes_move",
        {"note_id": "n_1", "folder": "lists"},
        "precondition_failed",
        "already in 'Lists'",
    ),
    ("notes_create_folder", {"name": "lists"}, "precondition_failed", "already exists"),
    ("notes_update", {"note_id": "n_2"}, "invalid_arguments", "nothing to update"),
    ("notes_share", {"note_id": "n_2", "email": "sam"}, "invalid_arguments", "argument 'email'"),
    ("notes_list", {"offset": -1}, "invalid_arguments", "argument 'offset'"),
    # reminders
    ("reminders_complete", {"reminder_id": "r_3"}, "precondition_failed", "already completed"),
    (
        "reminders_complete",
        {"reminder_id": "r_1"},
        "precondition_failed",
        "1 open subtask(s): 'Pack books'",
    ),
    (
        "reminders_create",
        {"title": "Gym", "list_id": "rl_home", "repeat": "daily"},
        "invalid_arguments",
        "argument 'due'",
    ),
    (
        "reminders_create",
        {"title": "Tape", "list_id": "rl_home", "parent_id": "r_2"},
        "precondition_failed",
        "cannot be nested",
    ),
    (
        "reminders_create",
        {"title": "Tape", "list_id": "rl_work", "parent_id": "r_1"},
        "precondition_failed",
        "parent's list",
    ),
    (
        "reminders_create",
        {"title": "Tape", "list_id": "rl_nope"},
        "precondition_failed",
        "list 'rl_nope' not found",
    ),
    (
        "reminders_create",
        {"title": "Tape", "list_id": "rl_home", "priority": "urgent"},
        "invalid_arguments",
        "argument 'priority'",
    ),
    (
        "reminders_snooze",
        {"reminder_id": "r_5", "minutes": 60},
        "precondition_failed",
        "no due time",
    ),
    (
        "reminders_snooze",
        {"reminder_id": "r_6", "minutes": 45},
        "invalid_arguments",
        "argument 'minutes'",
    ),
    (
        "reminders_move",
        {"reminder_id": "r_2", "list_id": "rl_work"},
        "precondition_failed",
        "move its parent",
    ),
    ("reminders_reopen", {"reminder_id": "r_5"}, "precondition_failed", "is not completed"),
    (
        "reminders_update",
        {"reminder_id": "r_3", "title": "Pay rent!"},
        "precondition_failed",
        "already completed",
    ),
    (
        "reminders_update",
        {"reminder_id": "r_5", "repeat": "weekly"},
        "invalid_arguments",
        "argument 'repeat'",
    ),
    ("reminders_clear_completed", {"list_id": "rl_work"}, "precondition_failed", "no completed"),
    ("reminders_list", {"due_before": "2026-03-02"}, "invalid_arguments", "argument 'due_before'"),
    ("reminders_create_list", {"name": "home"}, "precondition_failed", "already exists"),
    (
        "reminders_delete",
        {"reminder_id": "r_404"},
        "precondition_failed",
        "reminder 'r_404' not found",
    ),
    # settings
    ("settings_set_brightness", {"level": 40}, "precondition_failed", "auto-brightness is on"),
    ("settings_set_brightness", {"level": 150}, "invalid_arguments", "argument 'level'"),
    (
        "settings_set_volume",
        {"stream": "alarm", "level": 0},
        "invalid_arguments",
        "argument 'level'",
    ),
    (
        "settings_set_volume",
        {"stream": "media", "level": 11},
        "invalid_arguments",
        "argument 'level'",
    ),
    (
        "settings_set_volume",
        {"stream": "bass", "level": 3},
        "invalid_arguments",
        "argument 'stream'",
    ),
    ("settings_set_screen_timeout", {"seconds": 45}, "invalid_arguments", "argument 'seconds'"),
    (
        "settings_toggle",
        {"setting": "nfc", "enabled": True},
        "invalid_arguments",
        "argument 'setting'",
    ),
    (
        "settings_connect_wifi",
        {"ssid": "Cafe", "password": "wrongpass"},
        "precondition_failed",
        "incorrect password",
    ),
    ("settings_connect_wifi", {"ssid": "Cafe"}, "precondition_failed", "give its password"),
    (
        "settings_connect_wifi",
        {"ssid": "Cafe", "password": "short"},
        "invalid_arguments",
        "argument 'password'",
    ),
    ("settings_connect_wifi", {"ssid": "Nowhere"}, "precondition_failed", "'Nowhere' not found"),
    (
        "settings_connect_wifi",
        {"ssid": "Far away", "password": "faraway12"},
        "precondition_failed",
        "out of range",
    ),
    ("settings_forget_wifi", {"ssid": "Cafe"}, "precondition_failed", "not a saved network"),
    ("settings_connect_bluetooth", {"device_id": "bt_2"}, "precondition_failed", "pair it"),
    ("settings_pair_bluetooth", {"device_id": "bt_3"}, "precondition_failed", "not in range"),
    ("settings_pair_bluetooth", {"device_id": "bt_1"}, "precondition_failed", "already paired"),
    (
        "settings_unpair_bluetooth",
        {"device_id": "bt_404"},
        "precondition_failed",
        "'bt_404' not found",
    ),
    (
        "settings_set_do_not_disturb",
        {"enabled": True, "until": "2026-03-01T12:00"},
        "precondition_failed",
        "not in the future",
    ),
    (
        "settings_set_do_not_disturb",
        {"enabled": False, "until": "2026-03-05T12:00"},
        "invalid_arguments",
        "argument 'until'",
    ),
    (
        "settings_create_dnd_schedule",
        {"start": "22:00", "end": "22:00", "days": ["mon"], "name": "X"},
        "invalid_arguments",
        "argument 'end'",
    ),
    (
        "settings_create_dnd_schedule",
        {"start": "22:00", "end": "06:00", "days": []},
        "invalid_arguments",
        "argument 'days'",
    ),
    (
        "settings_create_dnd_schedule",
        {"start": "22:00", "end": "06:00", "days": ["weekdays"]},
        "invalid_arguments",
        "argument 'days.0'",
    ),
    (
        "settings_create_dnd_schedule",
        {"start": "24:00", "end": "06:00", "days": ["mon"]},
        "invalid_arguments",
        "argument 'start'",
    ),
    (
        "settings_create_dnd_schedule",
        {"start": "22:00", "end": "06:00", "days": ["mon"]},
        "precondition_failed",
        "'Sleep' already exists",
    ),
    (
        "settings_set_app_permission",
        {"app": "Maps", "permission": "camera", "granted": True},
        "precondition_failed",
        "never asked",
    ),
    # clock
    ("clock_create_alarm", {"time": "25:00"}, "invalid_arguments", "alarm time invalid"),
    ("clock_create_alarm", {"time": "07:75"}, "invalid_arguments", "argument 'time'"),
    ("clock_create_alarm", {"time": "7am"}, "invalid_arguments", "argument 'time'"),
    (
        "clock_create_alarm",
        {"time": "07:30", "days": ["weekdays"]},
        "invalid_arguments",
        "argument 'days.0'",
    ),
    (
        "clock_create_alarm",
        {"time": "07:30", "days": ["mon"], "date": "2026-03-09"},
        "invalid_arguments",
        "argument 'date'",
    ),
    (
        "clock_create_alarm",
        {"time": "07:30", "date": "2026-03-01"},
        "invalid_arguments",
        "already passed",
    ),
    (
        "clock_create_alarm",
        {"time": "7:00", "days": ["fri", "thu", "wed", "tue", "mon"]},
        "precondition_failed",
        "already exists (al_1)",
    ),
    (
        "clock_create_alarm",
        {"time": "07:30", "sound": "Foghorn"},
        "invalid_arguments",
        "argument 'sound'",
    ),
    (
        "clock_skip_alarm_once",
        {"alarm_id": "al_2", "date": "2026-03-05"},
        "precondition_failed",
        "one-off",
    ),
    (
        "clock_skip_alarm_once",
        {"alarm_id": "al_1", "date": "2026-03-07"},
        "precondition_failed",
        "does not ring on Saturday",
    ),
    (
        "clock_skip_alarm_once",
        {"alarm_id": "al_1", "date": "2026-03-02"},
        "invalid_arguments",
        "already passed",
    ),
    ("clock_update_alarm", {"alarm_id": "al_1"}, "invalid_arguments", "nothing to update"),
    (
        "clock_delete_alarm",
        {"alarm_id": "al_404"},
        "precondition_failed",
        "alarm 'al_404' not found",
    ),
    ("clock_start_timer", {"minutes": 0}, "invalid_arguments", "argument 'minutes'"),
    ("clock_start_timer", {"minutes": 5, "seconds": 75}, "invalid_arguments", "argument 'seconds'"),
    ("clock_pause_timer", {"timer_id": "tm_1"}, "precondition_failed", "not running"),
    (
        "clock_cancel_timer",
        {"timer_id": "tm_404"},
        "precondition_failed",
        "timer 'tm_404' not found",
    ),
    (
        "clock_add_world_clock",
        {"city": "London"},
        "precondition_failed",
        "already on the world clock",
    ),
    ("clock_add_world_clock", {"city": "Atlantis"}, "invalid_arguments", "argument 'city'"),
]


@pytest.mark.parametrize(
    ("tool", "arguments", "kind", "needle"),
    FAILURES,
    ids=[f"{f[0]}-{i}" for i, f in enumerate(FAILURES)],
)
def test_domain_failures_are_structured_feedback(
    env: SandboxEnv, tool: str, arguments: dict[str, Any], kind: str, needle: str
) -> None:
    before = env.state()
    feedback = call(env, tool, **arguments)
    assert (feedback.status, feedback.error) == ("error", kind), feedback.message
    assert needle in feedback.message
    assert env.state() == before, "a failed call must not change state"


def test_failures_cover_every_app() -> None:
    apps = Counter(all_tools()[tool].app.name for tool, *_ in FAILURES)
    assert all(apps[a] >= 8 for a in APPS), apps


# --------------------------------------------------------------------------- behaviour


def test_reschedule_keeps_the_event_and_may_overlap_itself(env: SandboxEnv) -> None:
    moved = ok(env, "calendar_reschedule_event", event_id="ev_1", start="2026-03-03T10:30")
    assert (moved["id"], moved["start"], moved["end"]) == (
        "ev_1",
        "2026-03-03T10:30",
        "2026-03-03T11:30",
    )
    assert moved["rescheduled_from"] == "2026-03-03T10:00"
    assert moved["attendees"] == ["sam@example.com"]
    longer = ok(
        env,
        "calendar_reschedule_event",
        event_id="ev_1",
        start="2026-03-05T10:00",
        end="2026-03-05T12:00",
    )
    assert longer["end"] == "2026-03-05T12:00" and longer["rescheduled_from"] == "2026-03-03T10:30"
    assert sum(e["title"] == "Team sync" for e in env.state()["calendar"]["events"]) == 1


def test_free_slots_skip_cancelled_and_declined_and_expand_recurrence(env: SandboxEnv) -> None:
    slots = ok(
        env,
        "calendar_find_free_slots",
        date="2026-03-03",
        duration_min=60,
        earliest="11:00",
        latest="17:00",
    )
    starts = [s["start"][-5:] for s in slots]
    assert "12:00" in starts  # declined invitation does not block
    assert "16:00" in starts  # cancelled event does not block
    assert "14:00" not in starts and "13:30" not in starts  # the dentist does
    evening = ok(
        env,
        "calendar_find_free_slots",
        date="2026-03-30",
        duration_min=60,
        earliest="17:00",
        latest="20:00",
    )
    assert [s["start"][-5:] for s in evening] == ["17:00", "17:30", "18:00", "18:30", "19:00"]
    weekly = ok(
        env,
        "calendar_find_free_slots",
        date="2026-03-16",
        duration_min=60,
        earliest="17:00",
        latest="20:00",
    )
    assert [s["start"][-5:] for s in weekly] == [
        "17:00",
        "19:00",
    ]  # the 3rd weekly Yoga blocks 18-19
    dana = ok(
        env,
        "calendar_find_free_slots",
        date="2026-03-03",
        duration_min=60,
        calendar_id="cal_dana",
        earliest="09:00",
        latest="13:00",
    )
    assert [s["start"][-5:] for s in dana] == ["12:00"]
    overlap = ok(
        env,
        "calendar_create_event",
        title="Call",
        start="2026-03-03T10:15",
        end="2026-03-03T10:45",
        allow_overlap=True,
    )
    assert overlap["id"] == "ev_9001"


def test_list_events_includes_recurring_occurrences_and_paginates(env: SandboxEnv) -> None:
    week = ok(env, "calendar_list_events", date_from="2026-03-09", date_to="2026-03-15")
    assert [e["id"] for e in week["events"]] == ["ev_4"]
    first = ok(env, "calendar_list_events", date_from="2026-03-02", date_to="2026-03-04", limit=2)
    rest = ok(
        env,
        "calendar_list_events",
        date_from="2026-03-02",
        date_to="2026-03-04",
        limit=10,
        offset=first["next_offset"],
    )
    assert first["total"] == rest["total"] == 5  # cancelled hidden, Dana's free/busy hidden
    assert rest["next_offset"] is None
    everything = ok(
        env,
        "calendar_list_events",
        date_from="2026-03-02",
        date_to="2026-03-04",
        include_cancelled=True,
    )
    assert everything["total"] == 6


def test_cancel_then_delete_is_allowed(env: SandboxEnv) -> None:
    ok(env, "calendar_cancel_event", event_id="ev_1", message="Off sick")
    assert ok(env, "calendar_delete_event", event_id="ev_1") == {"deleted": "ev_1"}


def test_subtasks_must_be_completed_before_the_parent(env: SandboxEnv) -> None:
    assert call(env, "reminders_complete", reminder_id="r_1").status == "error"
    ok(env, "reminders_complete", reminder_id="r_2")
    done = ok(env, "reminders_complete", reminder_id="r_1")
    assert done["completed"] and done["completed_at"]


def test_overdue_listing_and_repeating_completion(env: SandboxEnv) -> None:
    overdue = ok(env, "reminders_list", due_before="2026-03-02T09:00")
    assert [r["id"] for r in overdue["reminders"]] == ["r_6"]
    ok(
        env,
        "reminders_create",
        title="Water plants",
        list_id="rl_home",
        due="2026-03-02T20:00",
        repeat="daily",
    )
    done = ok(env, "reminders_complete", reminder_id="r_9001")
    assert (done["completed"], done["due"]) == (False, "2026-03-03T20:00")
    snoozed = ok(env, "reminders_snooze", reminder_id="r_6", minutes=1440)
    assert snoozed["due"].startswith("2026-03-03T09:")


def test_airplane_mode_and_audio_devices(env: SandboxEnv) -> None:
    ok(env, "settings_connect_wifi", ssid="Home")
    car = ok(env, "settings_connect_bluetooth", device_id="bt_4")
    assert car["connected"]
    assert not record(env, "settings.bluetooth_devices", "bt_1")["connected"]  # one audio device
    system = ok(env, "settings_toggle", setting="airplane_mode", enabled=True)
    assert (system["wifi"], system["bluetooth"], system["wifi_network"]) == (False, False, None)
    assert not any(d["connected"] for d in env.state()["settings"]["bluetooth_devices"])
    assert call(env, "settings_list_wifi_networks").error == "precondition_failed"
    assert "Bluetooth is off" in call(env, "settings_list_bluetooth_devices").message
    ok(env, "settings_toggle", setting="wifi", enabled=True)
    nets = ok(env, "settings_list_wifi_networks")
    assert "password" not in nets[0] and "Far away" not in {n["ssid"] for n in nets}


def test_battery_saver_caps_screen_timeout(env: SandboxEnv) -> None:
    ok(env, "settings_set_screen_timeout", seconds=600)
    system = ok(env, "settings_toggle", setting="battery_saver", enabled=True)
    assert system["screen_timeout_s"] == 60
    feedback = call(env, "settings_set_screen_timeout", seconds=300)
    assert feedback.error == "precondition_failed" and "battery saver" in feedback.message


def test_timers_keep_remaining_time_and_are_capped(env: SandboxEnv) -> None:
    resumed = ok(env, "clock_resume_timer", timer_id="tm_1")
    assert resumed["state"] == "running" and resumed["remaining_s"] == 120
    paused = ok(env, "clock_pause_timer", timer_id="tm_1")
    assert paused["remaining_s"] == 90  # one action = 30 s
    for minutes in range(1, 6):
        ok(env, "clock_start_timer", minutes=minutes)
    feedback = call(env, "clock_start_timer", minutes=9)
    assert feedback.error == "precondition_failed" and "already running" in feedback.message


def test_skipping_twice_and_alarm_updates(env: SandboxEnv) -> None:
    ok(env, "clock_skip_alarm_once", alarm_id="al_1", date="2026-03-03")
    again = call(env, "clock_skip_alarm_once", alarm_id="al_1", date="2026-03-03")
    assert again.error == "precondition_failed" and "already skips" in again.message
    ok(env, "clock_create_alarm", time="08:00", days=["sat"])
    clash = call(env, "clock_update_alarm", alarm_id="al_1", time="08:00", days=["sat"])
    assert clash.error == "precondition_failed" and "already exists" in clash.message
    ok(env, "clock_set_alarm_enabled", alarm_id="al_1", enabled=False)
    off = call(env, "clock_skip_alarm_once", alarm_id="al_1", date="2026-03-04")
    assert "switched off" in off.message


# --------------------------------------------------------------------------- templates


def test_each_domain_has_enough_templates_and_capabilities() -> None:
    per_domain: dict[str, Counter[str]] = defaultdict(Counter)
    names: Counter[str] = Counter()
    for tpl in all_templates().values():
        if tpl.domain in DOMAINS:
            names[tpl.domain] += 1
            per_domain[tpl.domain].update(tpl.capabilities)
    for domain in DOMAINS:
        assert names[domain] >= 7, domain
        for capability in ("tool_use", "memory", "skills", "subagent"):
            assert per_domain[domain][capability] >= 2, (domain, capability)


def test_templates_fill_every_split_with_distinct_instructions() -> None:
    by_template: dict[str, set[str]] = defaultdict(set)
    for task in MY_TASKS:
        assert 1 <= task.difficulty <= 5
        by_template[task.template or ""].add(task.instruction)
    for name, instructions in by_template.items():
        assert len(instructions) == 24, name


def test_oracle_passes_noop_and_greedy_wrong_fail_in_my_domains() -> None:
    env = SandboxEnv()
    for task in MY_TASKS[::3]:
        assert run_episode(env, task, make_planner("oracle")).success, task.id
        assert not run_episode(env, task, make_planner("noop")).success, task.id
        assert not run_episode(env, task, make_planner("greedy_wrong")).success, task.id


def test_subagent_plans_delegate_and_hand_back() -> None:
    for task in MY_TASKS:
        if "subagent" not in task.capabilities:
            continue
        kinds = [a.type for a in task.reference_plan or []]
        assert "delegate" in kinds, task.id
        assert kinds[-1] == "finish" and kinds.count("finish") == kinds.count("delegate") + 1, (
            task.id
        )


@pytest.mark.parametrize("seed", range(40))
def test_recall_resolves_to_the_right_value(seed: int) -> None:
    items = recall(random.Random(seed), "k", "right", "wrong", noise=[("other", "x")])
    assert len([m for m in items if m.key == "k"]) == 2
    best = max(
        (m for m in items if m.key == "k"), key=lambda m: (EVIDENCE_RANK[m.evidence], m.time)
    )
    assert best.value == "right"


def _loser(memory: list[MemoryItem], key: str) -> str:
    items = [m for m in memory if m.key == key]
    best = max(items, key=lambda m: (EVIDENCE_RANK[m.evidence], m.time))
    return next(m.value for m in items if m.value != best.value)


def _run_plan(task: Task, plan: list[Action]) -> bool:
    changed = task.model_copy(update={"reference_plan": plan})
    return run_episode(SandboxEnv(), changed, make_planner("oracle")).success


def _tasks(template: str) -> list[Task]:
    found = [t for t in MY_TASKS if t.template == template]
    assert found, template
    return found[:6]


def _swap(plan: list[Action], tool: str, **arguments: Any) -> list[Action]:
    out: list[Action] = []
    for action in plan:
        if isinstance(action, ToolCall) and action.tool == tool:
            action = action.model_copy(update={"arguments": {**action.arguments, **arguments}})
        out.append(action)
    return out


def test_memory_tasks_fail_with_the_stale_value() -> None:
    for task in _tasks("block_usual_activity_time"):
        key = next(m.key for m in task.memory if m.key.startswith("usual_"))
        create = next(a for a in task.reference_plan or [] if isinstance(a, ToolCall))
        day, length = create.arguments["start"][:11], _length(create.arguments)
        start = day + _loser(task.memory, key)
        plan = _swap(
            task.reference_plan or [],
            "calendar_create_event",
            start=start,
            end=_plus(start, length),
        )
        assert not _run_plan(task, plan), task.id
    for task in _tasks("alarm_with_preferred_sound"):
        wrong = _loser(task.memory, "alarm_sound")
        assert not _run_plan(
            task, _swap(task.reference_plan or [], "clock_create_alarm", sound=wrong)
        )
    for task in _tasks("remind_with_usual_list_and_time"):
        key = next(m.key for m in task.memory if m.key.endswith("_reminders_list"))
        wrong = f"rl_{_loser(task.memory, key).lower()}"
        assert not _run_plan(
            task, _swap(task.reference_plan or [], "reminders_create", list_id=wrong)
        )
    for task in _tasks("dnd_for_usual_sleep"):
        start = _loser(task.memory, "usual_bedtime")
        plan = _swap(task.reference_plan or [], "settings_create_dnd_schedule", start=start)
        assert not _run_plan(task, plan)
    for task in _tasks("append_to_usual_note"):
        key = next(m.key for m in task.memory if m.key.endswith("_note"))
        plan = _swap(task.reference_plan or [], "notes_search", query=_loser(task.memory, key))
        assert not _run_plan(task, plan)


def test_skills_tasks_fail_without_the_procedure() -> None:
    for task in _tasks("reschedule_to_first_free_slot"):
        moved = next(
            a
            for a in task.reference_plan or []
            if isinstance(a, ToolCall) and a.tool == "calendar_reschedule_event"
        )
        event = next(e for e in task.world["calendar"]["events"] if e["id"] == "ev_301")
        start = moved.arguments["start"]
        length = _minutes(event["end"]) - _minutes(event["start"])
        stop = _minutes(start) + length
        end = f"{start[:11]}{stop // 60:02d}:{stop % 60:02d}"
        recreate: list[Action] = [
            ToolCall(
                tool="calendar_cancel_event", arguments={"event_id": "ev_301", "message": "moving"}
            ),
            ToolCall(
                tool="calendar_create_event",
                arguments={
                    "title": event["title"],
                    "start": start,
                    "end": end,
                    "attendees": event["attendees"],
                },
            ),
        ]
        assert not _run_plan(task, recreate), task.id
    for task in _tasks("skip_alarm_for_one_day"):
        skip = next(
            a
            for a in task.reference_plan or []
            if isinstance(a, ToolCall) and a.tool == "clock_skip_alarm_once"
        )
        disable = ToolCall(
            tool="clock_set_alarm_enabled",
            arguments={"alarm_id": skip.arguments["alarm_id"], "enabled": False},
        )
        assert not _run_plan(task, [disable]), task.id
    for task in _tasks("add_to_grocery_list"):
        items = [
            c.where["checklist__contains"]["text"]
            for c in task.verifier.checks
            if "checklist__contains" in c.where
        ]
        rewrite = ToolCall(
            tool="notes_append", arguments={"note_id": "n_301", "text": ", ".join(items)}
        )
        assert not _run_plan(task, [rewrite]), task.id
    for task in _tasks("set_manual_brightness"):
        plan = [
            a
            for a in task.reference_plan or []
            if not (isinstance(a, ToolCall) and a.tool == "settings_toggle")
        ]
        assert not _run_plan(task, plan), task.id
    for task in _tasks("complete_project_with_subtasks"):
        direct: list[Action] = [
            ToolCall(tool="reminders_complete", arguments={"reminder_id": "r_500"})
        ]
        assert not _run_plan(task, direct), task.id
    for task in _tasks("cancel_meeting_with_attendees"):
        delete: list[Action] = [
            ToolCall(tool="calendar_delete_event", arguments={"event_id": "ev_401"})
        ]
        assert not _run_plan(task, delete), task.id
    for task in _tasks("join_wifi_with_saved_password"):
        guess = _swap(task.reference_plan or [], "settings_connect_wifi", password="password123")
        assert not _run_plan(task, guess), task.id


def _minutes(stamp: str) -> int:
    return int(stamp[11:13]) * 60 + int(stamp[14:16])


def _length(arguments: dict[str, Any]) -> int:
    return _minutes(arguments["end"]) - _minutes(arguments["start"])


def _plus(stamp: str, minutes: int) -> str:
    total = _minutes(stamp) + minutes
    return f"{stamp[:11]}{total // 60:02d}:{total % 60:02d}"
