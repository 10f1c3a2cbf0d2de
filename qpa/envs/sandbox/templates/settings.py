"""Settings and clock tasks: display, Wi-Fi, alarms, Do Not Disturb, permissions, trip prep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from qpa.contract import Check, Delegate, Finish, ToolCall
from qpa.envs.sandbox.apps.calendar import calendar_record, event_record
from qpa.envs.sandbox.apps.clock import CITY_OFFSETS, SOUNDS, alarm_record, world_clock_record
from qpa.envs.sandbox.apps.notes import folder_record, note_record
from qpa.envs.sandbox.apps.settings import (
    RINGTONES,
    bluetooth_record,
    permission_record,
    system_record,
    wifi_record,
)
from qpa.envs.sandbox.authoring import day_phrase, recall
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import BASE_DAY, WORKDAYS, background_events, iso

WEEK = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
TIMEOUTS = {
    15: "15 seconds",
    30: "30 seconds",
    60: "1 minute",
    120: "2 minutes",
    300: "5 minutes",
    600: "10 minutes",
}
LABELS = ["Work", "Gym", "School run", "Meds", "Dog walk", "Early shift", "Swim", "Standup"]


def _alarms(g: TaskGen, labels: list[str], first_id: int = 101) -> list[dict[str, Any]]:
    """Alarms with distinct labels at distinct morning times, a mix of repeating and one-off."""
    times = g.rng.sample(
        [f"{h:02d}:{m:02d}" for h in range(5, 10) for m in (0, 15, 30, 45)], len(labels)
    )
    rows = []
    for i, (label, hhmm) in enumerate(zip(labels, times, strict=True)):
        days = g.rng.choice([WEEK[:5], WEEK[5:], WEEK, ["mon", "wed", "fri"], []])
        rows.append(
            alarm_record(
                f"al_{first_id + i}",
                hhmm,
                label,
                days=days,
                sound=g.rng.choice(SOUNDS),
                enabled=g.rng.random() < 0.85,
            )
        )
    return rows


# --------------------------------------------------------------------------- skills


@template(domain="settings", capabilities=["skills"], apps=["settings"], difficulty=2)
def set_manual_brightness(g: TaskGen) -> Any:
    current = g.rng.choice(range(10, 100, 5))
    level = g.rng.choice([v for v in range(10, 100, 5) if v != current])
    now_timeout = g.rng.choice(list(TIMEOUTS))
    timeout = g.rng.choice([t for t in TIMEOUTS if t != now_timeout])
    system = system_record(
        auto_brightness=True,
        brightness=current,
        screen_timeout_s=now_timeout,
        dark_mode=g.rng.random() < 0.5,
    )
    return g.task(
        instruction=(
            f"Set my screen brightness to {level}% and make the screen turn off after "
            f"{TIMEOUTS[timeout]}."
        ),
        world={"settings": {"system": system}},
        checks=[
            Check(
                name="brightness set",
                target="settings.system.brightness",
                op="equals",
                expect=level,
            ),
            Check(
                name="auto-brightness off",
                target="settings.system.auto_brightness",
                op="equals",
                expect=False,
            ),
            Check(
                name="screen timeout set",
                target="settings.system.screen_timeout_s",
                op="equals",
                expect=timeout,
            ),
        ],
        plan=[
            ToolCall(
                tool="settings_toggle", arguments={"setting": "auto_brightness", "enabled": False}
            ),
            ToolCall(tool="settings_set_screen_timeout", arguments={"seconds": timeout}),
            ToolCall(tool="settings_set_brightness", arguments={"level": level}),
            Finish(),
        ],
    )


REASONS = [
    "I'm off",
    "It's a public holiday",
    "I'm travelling",
    "I'm working from home",
    "I'm on leave",
]


@template(domain="settings", capabilities=["skills"], apps=["clock"], difficulty=2)
def skip_alarm_for_one_day(g: TaskGen) -> Any:
    labels = g.rng.sample(LABELS, g.rng.randint(4, 5))
    alarms = _alarms(g, labels)
    target = alarms[0]
    target["enabled"] = True
    target["days"] = g.rng.choice([WEEK[:5], WEEK, ["mon", "tue", "thu"], ["tue", "wed", "fri"]])
    day = g.rng.choice([d for d in WORKDAYS if WEEK[d.weekday()] in target["days"]])
    date = f"{day:%Y-%m-%d}"
    g.rng.shuffle(alarms)
    reason = g.rng.choice(REASONS)
    return g.task(
        instruction=(
            f"{reason} on {day_phrase(day)}, so my '{target['label']}' alarm shouldn't go off that "
            "day — keep it for the other days."
        ),
        world={"clock": {"alarms": alarms}},
        checks=[
            Check(
                name="alarm skips just that date",
                target="clock.alarms",
                where={
                    "id": target["id"],
                    "enabled": True,
                    "skip_dates": [date],
                    "days": target["days"],
                },
            ),
            Check(
                name="no alarm added or removed",
                target="clock.alarms",
                op="count",
                expect=len(alarms),
            ),
        ],
        plan=[
            ToolCall(tool="clock_list_alarms", arguments={}),
            ToolCall(
                tool="clock_skip_alarm_once", arguments={"alarm_id": target["id"], "date": date}
            ),
            Finish(),
        ],
    )


SSID_BASES = [
    "LumenCafe",
    "HarborHotel",
    "Office",
    "CityLibrary",
    "CoWork",
    "Airport",
    "FitGym",
    "Clinic",
]
WORDS = ["maple", "otter", "violet", "copper", "lantern", "harbor", "summit", "pepper"]


@template(
    domain="settings", capabilities=["skills", "tool_use"], apps=["settings", "notes"], difficulty=3
)
def join_wifi_with_saved_password(g: TaskGen) -> Any:
    bases = g.rng.sample(SSID_BASES, 4)
    ssid = f"{bases[0]}-{g.rng.randint(10, 99)}"
    lookalike = f"{bases[0]}-Guest"

    def pw() -> str:
        return f"{g.rng.choice(WORDS)}{g.rng.randint(100, 999)}{g.rng.choice(WORDS)}"

    secret, other_secret, third = pw(), pw(), pw()
    nets = [
        wifi_record("w_101", ssid, password=secret, signal=g.rng.randint(2, 4)),
        wifi_record("w_102", lookalike, password=other_secret, signal=g.rng.randint(1, 4)),
        wifi_record("w_103", f"{bases[1]}-{g.rng.randint(10, 99)}", password=third, signal=2),
        wifi_record("w_104", f"{bases[2]} Free", secured=False, signal=3),
        wifi_record("w_105", "Home-5G", password="homesweethome1", saved=True, in_range=False),
    ]
    g.rng.shuffle(nets)
    lines = [f"{lookalike}: {other_secret}", f"{ssid}: {secret}", f"{nets[0]['ssid']}: {third}"]
    g.rng.shuffle(lines)
    notes = [
        note_record("n_101", "Wi-Fi passwords", "\n".join(lines)),
        note_record("n_102", "Packing list", "Charger, adapter, passport"),
        note_record("n_103", "Door codes", f"Office: {g.rng.randint(1000, 9999)}"),
    ]
    wifi_on = g.rng.random() < 0.5
    plan: list[Any] = (
        []
        if wifi_on
        else [ToolCall(tool="settings_toggle", arguments={"setting": "wifi", "enabled": True})]
    )
    plan += [
        ToolCall(tool="notes_search", arguments={"query": "Wi-Fi passwords"}),
        ToolCall(tool="settings_connect_wifi", arguments={"ssid": ssid, "password": secret}),
        Finish(),
    ]
    return g.task(
        instruction=f"Connect my phone to the '{ssid}' Wi-Fi.",
        world={
            "settings": {"system": system_record(wifi=wifi_on), "wifi_networks": nets},
            "notes": {"folders": [folder_record("f_notes", "Notes")], "notes": notes},
        },
        checks=[
            Check(
                name="connected to the network",
                target="settings.system.wifi_network",
                op="equals",
                expect=ssid,
            ),
            Check(
                name="network saved",
                target="settings.wifi_networks",
                where={"ssid": ssid, "saved": True, "connected": True},
            ),
        ],
        plan=plan,
        difficulty=2 if wifi_on else 3,
    )


# --------------------------------------------------------------------------- tool_use

APPS = [
    "Maps",
    "Snapgram",
    "RideNow",
    "FitTrack",
    "Weatherly",
    "NewsDaily",
    "ShopMart",
    "PuzzleQuest",
    "BankEasy",
    "Podcasts",
    "ChatterBox",
    "PhotoLab",
]
PERMISSIONS = ["camera", "location", "microphone", "contacts"]
REVOKE_PHRASES = [
    "Take {p} access away from every app except {keep}.",
    "Revoke the {p} permission from all apps but {keep}.",
]


@template(domain="settings", capabilities=["tool_use"], apps=["settings"], difficulty=3)
def revoke_permission_but_one(g: TaskGen) -> Any:
    perm = g.rng.choice(PERMISSIONS)
    apps = g.rng.sample(APPS, 8)
    granted = apps[: g.rng.randint(3, 5)]
    keep = g.rng.choice(granted)
    rows = []
    for i, app in enumerate(apps):
        rows.append(permission_record(f"p_{101 + i}", app, perm, app in granted))
    for i, app in enumerate(g.rng.sample(apps, 6)):
        other = g.rng.choice([p for p in PERMISSIONS if p != perm] + ["notifications"])
        rows.append(permission_record(f"p_{201 + i}", app, other, g.rng.random() < 0.6))
    g.rng.shuffle(rows)
    other_granted = sum(1 for r in rows if r["permission"] != perm and r["granted"])
    revoke = [a for a in granted if a != keep]
    return g.task(
        instruction=g.rng.choice(REVOKE_PHRASES).format(p=perm, keep=keep),
        world={"settings": {"system": system_record(), "app_permissions": rows}},
        checks=[
            Check(
                name=f"only {keep} keeps {perm}",
                target="settings.app_permissions",
                op="count",
                where={"permission": perm, "granted": True},
                expect=1,
            ),
            Check(
                name=f"{keep} still has it",
                target="settings.app_permissions",
                where={"app": keep, "permission": perm, "granted": True},
            ),
            Check(
                name="other permissions untouched",
                target="settings.app_permissions",
                op="count",
                where={"permission__ne": perm, "granted": True},
                expect=other_granted,
            ),
        ],
        plan=[
            ToolCall(
                tool="settings_list_app_permissions",
                arguments={"permission": perm, "granted_only": True},
            ),
            *(
                ToolCall(
                    tool="settings_set_app_permission",
                    arguments={"app": a, "permission": perm, "granted": False},
                )
                for a in revoke
            ),
            Finish(),
        ],
        difficulty=3 if len(revoke) <= 3 else 4,
    )


# --------------------------------------------------------------------------- memory

WHEN = [
    ("tomorrow", []),
    ("on weekdays", WEEK[:5]),
    ("on weekends", WEEK[5:]),
    ("every day", WEEK),
    ("on Mondays and Thursdays", ["mon", "thu"]),
]


@template(domain="settings", capabilities=["memory"], apps=["clock"], difficulty=2)
def alarm_with_preferred_sound(g: TaskGen) -> Any:
    alarms = _alarms(g, g.rng.sample(LABELS, 3))
    taken = {a["time"] for a in alarms}
    hhmm = g.rng.choice(
        [
            f"{h:02d}:{m:02d}"
            for h in range(5, 10)
            for m in (0, 15, 30, 45)
            if f"{h:02d}:{m:02d}" not in taken
        ]
    )
    when, days = g.rng.choice(WHEN)
    right, wrong = g.rng.sample(SOUNDS, 2)
    memory = recall(
        g.rng, "alarm_sound", right, wrong, noise=[("ringtone", g.rng.choice(RINGTONES))]
    )
    return g.task(
        instruction=f"Set an alarm for {hhmm} {when} with the sound I like.",
        world={"clock": {"alarms": alarms}},
        checks=[
            Check(
                name="alarm with the preferred sound",
                target="clock.alarms",
                where={"time": hhmm, "days": days, "sound": right, "enabled": True},
            ),
            Check(
                name="one alarm added", target="clock.alarms", op="count", expect=len(alarms) + 1
            ),
        ],
        plan=[
            ToolCall(
                tool="clock_create_alarm", arguments={"time": hhmm, "days": days, "sound": right}
            ),
            Finish(),
        ],
        memory=memory,
        difficulty=2 if days else 1,
    )


DND_DAYS = [
    ("every night", WEEK),
    ("on school nights", ["sun", "mon", "tue", "wed", "thu"]),
    ("on weekdays", WEEK[:5]),
    ("on Fridays and Saturdays", ["fri", "sat"]),
]
DND_NAMES = ["Sleep", "Night", "Bedtime", "Quiet hours", "Rest"]
DND_INTROS = ["", "I keep getting woken up. ", "New routine: ", "Please help me sleep better. "]
SLEEP = ["22:00-06:00", "22:30-06:30", "23:00-07:00", "23:30-07:30", "00:00-08:00", "21:30-05:30"]


@template(domain="settings", capabilities=["memory"], apps=["settings"], difficulty=3)
def dnd_for_usual_sleep(g: TaskGen) -> Any:
    right, wrong = (hours.split("-") for hours in g.rng.sample(SLEEP, 2))
    favs = g.rng.choice(["yes", "no"])
    memory = [
        *recall(g.rng, "usual_bedtime", right[0], wrong[0]),
        *recall(g.rng, "usual_wake_time", right[1], wrong[1]),
        *recall(
            g.rng,
            "dnd_allow_favorites",
            favs,
            "no" if favs == "yes" else "yes",
            noise=[("screen_brightness", "40%")],
        ),
    ]
    g.rng.shuffle(memory)
    phrase, spoken_days = g.rng.choice(DND_DAYS)
    days = [d for d in WEEK if d in spoken_days]
    name = g.rng.choice(DND_NAMES)
    start, end = right
    existing = {
        "id": "dnd_101",
        "name": "Work focus",
        "start": "09:00",
        "end": "12:00",
        "days": WEEK[:5],
        "allow_favorites": True,
        "enabled": True,
    }
    return g.task(
        instruction=(
            f"{g.rng.choice(DND_INTROS)}Create a Do Not Disturb schedule called '{name}' for my "
            f"usual sleeping hours {phrase}, letting my favourites through if that's what I prefer."
        ),
        world={"settings": {"system": system_record(), "dnd_schedules": [existing]}},
        checks=[
            Check(
                name="schedule matches the remembered hours",
                target="settings.dnd_schedules",
                where={
                    "name": name,
                    "start": start,
                    "end": end,
                    "days": days,
                    "allow_favorites": favs == "yes",
                },
            ),
            Check(name="one schedule added", target="settings.dnd_schedules", op="count", expect=2),
        ],
        plan=[
            ToolCall(
                tool="settings_create_dnd_schedule",
                arguments={
                    "start": start,
                    "end": end,
                    "days": days,
                    "name": name,
                    "allow_favorites": favs == "yes",
                },
            ),
            Finish(),
        ],
        memory=memory,
    )


# --------------------------------------------------------------------------- subagent


@template(
    domain="settings",
    capabilities=["subagent", "tool_use"],
    apps=["calendar", "clock"],
    difficulty=4,
)
def prepare_clock_for_flight(g: TaskGen) -> Any:
    city, home_city = g.rng.sample(
        sorted(c for c in CITY_OFFSETS if c not in ("London", "Lisbon")), 2
    )
    day = BASE_DAY + timedelta(days=g.rng.randint(1, 6))
    depart = day.replace(hour=g.rng.randint(9, 20), minute=g.rng.choice([0, 15, 30, 45]))
    hours = g.rng.choice([2, 3, 4])
    ring = depart - timedelta(hours=hours)
    back = depart + timedelta(days=g.rng.randint(3, 6), hours=g.rng.choice([-3, 2]))
    flight = event_record(
        "ev_901",
        f"Flight to {city}",
        iso(depart),
        iso(depart + timedelta(hours=3)),
        location="City Airport",
    )
    home = event_record(
        "ev_902",
        f"Flight to {home_city}",
        iso(back),
        iso(back + timedelta(hours=3)),
        location=f"{city} Airport",
    )
    events = [
        *background_events(
            g, 5, avoid=[(depart - timedelta(hours=4), depart + timedelta(hours=3))]
        ),
        flight,
        home,
    ]
    clocks = [
        world_clock_record(f"wc_{101 + i}", c)
        for i, c in enumerate(["London", "Lisbon"][: g.rng.randint(1, 2)])
    ]
    alarms = _alarms(g, g.rng.sample(LABELS, 2))
    date = f"{day:%Y-%m-%d}"
    return g.task(
        instruction=(
            f"I'm flying to {city} this week. Check my calendar for the flight, set a one-off "
            f"alarm {hours} hours before it leaves labelled 'Flight', and add {city} to my world "
            "clocks."
        ),
        world={
            "calendar": {"calendars": [calendar_record("primary", "Personal")], "events": events},
            "clock": {"alarms": alarms, "world_clocks": clocks},
        },
        checks=[
            Check(
                name="alarm before departure",
                target="clock.alarms",
                where={
                    "time": f"{ring:%H:%M}",
                    "date": date,
                    "label": "Flight",
                    "days": [],
                    "enabled": True,
                },
            ),
            Check(
                name=f"{city} on the world clock", target="clock.world_clocks", where={"city": city}
            ),
            Check(
                name="one city added",
                target="clock.world_clocks",
                op="count",
                expect=len(clocks) + 1,
            ),
        ],
        plan=[
            Delegate(
                goal=f"Find when my flight to {city} departs",
                tools=["calendar_search_events"],
                agent="calendar_scout",
            ),
            ToolCall(tool="calendar_search_events", arguments={"query": f"Flight to {city}"}),
            Finish(answer=f"The flight to {city} departs {iso(depart)}"),
            Delegate(
                goal=f"Add {city} to my world clocks",
                tools=["clock_list_world_clocks", "clock_add_world_clock"],
                agent="world_clock",
            ),
            ToolCall(tool="clock_add_world_clock", arguments={"city": city}),
            Finish(answer=f"{city} added"),
            ToolCall(
                tool="clock_create_alarm",
                arguments={"time": f"{ring:%H:%M}", "label": "Flight", "date": date},
            ),
            Finish(),
        ],
    )


HEADPHONES = [
    "Pixel Buds Pro",
    "Sony WH-1000XM5",
    "AirPods Pro",
    "Jabra Elite 8",
    "Bose QC Ultra",
    "Beats Fit Pro",
]
ACTIVITIES = ["run", "workout", "bike ride", "walk"]


@template(
    domain="settings", capabilities=["subagent", "memory"], apps=["settings", "clock"], difficulty=4
)
def workout_audio_and_timer(g: TaskGen) -> Any:
    right, wrong = g.rng.sample(HEADPHONES, 2)
    devices = [
        bluetooth_record("bt_101", right, "headphones"),
        bluetooth_record("bt_102", wrong, "headphones"),
        bluetooth_record("bt_103", "Car Audio", "car"),
        bluetooth_record("bt_104", "Galaxy Watch", "watch"),
    ]
    g.rng.shuffle(devices)
    memory = recall(
        g.rng, "usual_headphones", right, wrong, noise=[("alarm_sound", g.rng.choice(SOUNDS))]
    )
    volume = g.rng.randint(3, 9)
    minutes = g.rng.choice([20, 25, 30, 40, 45, 60])
    activity = g.rng.choice(ACTIVITIES)
    label = activity.capitalize()
    system = system_record(
        bluetooth=False, media_volume=g.rng.choice([v for v in range(0, 11) if v != volume])
    )
    return g.task(
        instruction=(
            f"Get me set for my {activity}: connect my usual headphones, put the media volume at "
            f"{volume}, and start a {minutes}-minute timer labelled '{label}'."
        ),
        world={
            "settings": {"system": system, "bluetooth_devices": devices},
            "clock": {"alarms": [], "timers": []},
        },
        checks=[
            Check(
                name="usual headphones connected",
                target="settings.bluetooth_devices",
                where={"name": right, "connected": True},
            ),
            Check(
                name="other headphones not connected",
                target="settings.bluetooth_devices",
                op="absent",
                where={"name": wrong, "connected": True},
            ),
            Check(
                name="media volume",
                target="settings.system.media_volume",
                op="equals",
                expect=volume,
            ),
            Check(
                name="timer running",
                target="clock.timers",
                where={"duration_s": minutes * 60, "label": label, "state": "running"},
            ),
            Check(name="one timer", target="clock.timers", op="count", expect=1),
        ],
        plan=[
            Delegate(
                goal=f"Turn on Bluetooth, connect my {right} and set media volume to {volume}",
                tools=[
                    "settings_toggle",
                    "settings_list_bluetooth_devices",
                    "settings_connect_bluetooth",
                    "settings_set_volume",
                ],
                agent="audio",
            ),
            ToolCall(tool="settings_toggle", arguments={"setting": "bluetooth", "enabled": True}),
            ToolCall(tool="settings_list_bluetooth_devices", arguments={}),
            ToolCall(tool="settings_connect_bluetooth", arguments={"device_id": "bt_101"}),
            ToolCall(tool="settings_set_volume", arguments={"stream": "media", "level": volume}),
            Finish(answer=f"Headphones connected, media volume {volume}"),
            Delegate(
                goal=f"Start a {minutes}-minute timer labelled '{label}'",
                tools=["clock_start_timer"],
                agent="timer",
            ),
            ToolCall(tool="clock_start_timer", arguments={"minutes": minutes, "label": label}),
            Finish(answer="timer started"),
            Finish(),
        ],
        memory=memory,
    )
