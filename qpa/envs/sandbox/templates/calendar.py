"""Calendar tasks: book, tell, move and cancel events; usual times; shared calendars."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from qpa.contract import Check, Delegate, Finish, ToolCall
from qpa.envs.sandbox.apps.calendar import calendar_record, event_record
from qpa.envs.sandbox.authoring import contacts_world, day_phrase, recall, texted, texts_sent
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import BACKGROUND, WORKDAYS, background_events, iso

# --------------------------------------------------------------------------- world

MEETINGS = [
    "Budget review",
    "Project sync",
    "Design review",
    "Quarterly planning",
    "Hiring debrief",
    "Roadmap chat",
    "Contract review",
    "Coffee catch-up",
    "Vendor call",
    "Launch prep",
    "Sprint retro",
    "Board prep",
    "Client check-in",
    "Offsite planning",
    "Pricing workshop",
    "Security review",
]
ROOMS = [
    "Room 4B",
    "Room 2A",
    "the Atrium",
    "Cafe Lumen",
    "the Boardroom",
    "Studio 7",
    "the Library room",
    "Harbor Room",
]


def hm(moment: datetime) -> str:
    return f"{moment:%H:%M}"


def _calendar_world(
    events: list[dict[str, Any]], calendars: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "calendars": [calendar_record("primary", "Personal"), *(calendars or [])],
        "events": events,
    }


# --------------------------------------------------------------------------- tool_use


@template(domain="calendar", capabilities=["tool_use"], apps=["calendar", "contacts"], difficulty=2)
def book_meeting_with_contact(g: TaskGen) -> Any:
    people = contacts_world(g.fake, favorite_rate=0.25)
    guest = g.rng.choice(people)
    day = g.rng.choice(WORKDAYS)
    start = day.replace(hour=g.rng.randint(9, 16), minute=g.rng.choice([0, 30]))
    minutes = g.rng.choice([30, 45, 60])
    end = start + timedelta(minutes=minutes)
    topic, room = g.rng.choice(MEETINGS), g.rng.choice(ROOMS)
    events = background_events(g, 6, avoid=[(start, end)])
    return g.task(
        instruction=(
            f"Set up a {minutes}-minute '{topic}' with {guest['name']} on {day_phrase(day)} at "
            f"{hm(start)} in {room}, and invite them."
        ),
        world={"calendar": _calendar_world(events), "contacts": {"contacts": people}},
        checks=[
            Check(
                name="meeting booked with the guest",
                target="calendar.events",
                where={
                    "title": topic,
                    "start": iso(start),
                    "end": iso(end),
                    "attendees__contains": guest["email"],
                    "location__icontains": room.removeprefix("the "),
                },
            ),
            Check(
                name="booked once",
                target="calendar.events",
                op="count",
                where={"title": topic},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": guest["name"]}),
            ToolCall(
                tool="calendar_create_event",
                arguments={
                    "title": topic,
                    "start": iso(start),
                    "end": iso(end),
                    "location": room,
                    "attendees": ["${0.0.email}"],
                },
            ),
            Finish(),
        ],
    )


@template(
    domain="calendar",
    capabilities=["tool_use"],
    apps=["calendar", "contacts", "messaging"],
    difficulty=3,
)
def text_meeting_details(g: TaskGen) -> Any:
    people = contacts_world(g.fake, favorite_rate=0.25)
    friend = g.rng.choice(people)
    day, other_day = g.rng.sample(WORKDAYS, 2)
    start = day.replace(hour=g.rng.randint(9, 17), minute=g.rng.choice([0, 15, 30, 45]))
    decoy_start = other_day.replace(hour=g.rng.randint(8, 17), minute=g.rng.choice([0, 30]))
    topic = g.rng.choice(MEETINGS)
    room, decoy_room = g.rng.sample(ROOMS, 2)
    target = event_record(
        "ev_201",
        topic,
        iso(start),
        iso(start + timedelta(hours=1)),
        location=room,
        attendees=[friend["email"]],
    )
    decoy = event_record(
        "ev_202",
        topic,
        iso(decoy_start),
        iso(decoy_start + timedelta(hours=1)),
        location=decoy_room,
    )
    avoid = [(start, start + timedelta(hours=1)), (decoy_start, decoy_start + timedelta(hours=1))]
    events = [*background_events(g, 5, avoid=avoid), target, decoy]
    g.rng.shuffle(events)
    text = f"The {topic} on {day_phrase(day)} starts at {hm(start)} in {room}."
    return g.task(
        instruction=(
            f"Text {friend['name']} the start time (24-hour) and the place of my '{topic}' on "
            f"{day_phrase(day)}."
        ),
        world={
            "calendar": _calendar_world(events),
            "contacts": {"contacts": people},
            "messaging": {"messages": []},
        },
        checks=[
            Check(
                name="time and place texted",
                target="messaging.messages",
                where={
                    "to": friend["phone"],
                    "sender": "me",
                    "text__contains": hm(start),
                    "text__icontains": room.removeprefix("the "),
                },
            ),
            texts_sent(1, "one text only"),
        ],
        plan=[
            ToolCall(tool="calendar_search_events", arguments={"query": topic}),
            ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${1.0.phone}", "text": text}),
            Finish(),
        ],
    )


# --------------------------------------------------------------------------- skills


@template(domain="calendar", capabilities=["skills"], apps=["calendar"], difficulty=3)
def reschedule_to_first_free_slot(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 4, favorite_rate=0.25)
    day, target_day = g.rng.sample(WORKDAYS, 2)
    minutes = g.rng.choice([30, 60])
    start = day.replace(hour=g.rng.randint(9, 11), minute=g.rng.choice([0, 30]))
    end = start + timedelta(minutes=minutes)
    topic = g.rng.choice(MEETINGS)
    guests = [p["email"] for p in g.rng.sample(people, g.rng.randint(1, 2))]
    meeting = event_record(
        "ev_301", topic, iso(start), iso(end), attendees=guests, location=g.rng.choice(ROOMS)
    )
    frm = g.rng.choice([12, 13])
    cursor = target_day.replace(hour=frm)
    blockers: list[dict[str, Any]] = []
    for i in range(g.rng.randint(1, 3)):
        length = timedelta(minutes=g.rng.choice([30, 60]))
        blockers.append(
            event_record(f"ev_31{i}", g.rng.choice(BACKGROUND), iso(cursor), iso(cursor + length))
        )
        cursor += length
    new_start, new_end = cursor, cursor + timedelta(minutes=minutes)
    later = new_end + timedelta(minutes=g.rng.choice([30, 60]))
    blockers.append(
        event_record(
            "ev_319", g.rng.choice(BACKGROUND), iso(later), iso(later + timedelta(hours=1))
        )
    )
    taken = [(start, end), (target_day.replace(hour=frm), later + timedelta(hours=1))]
    events = [*background_events(g, 4, avoid=taken), meeting, *blockers]
    return g.task(
        instruction=(
            f"Move my '{topic}' on {day_phrase(day)} to the first free time on "
            f"{day_phrase(target_day)} from {frm}:00 onwards."
        ),
        world={"calendar": _calendar_world(events)},
        checks=[
            Check(
                name="same event moved (not re-created)",
                target="calendar.events",
                where={
                    "id": "ev_301",
                    "start": iso(new_start),
                    "end": iso(new_end),
                    "rescheduled_from": iso(start),
                    "attendees": guests,
                },
            ),
            Check(
                name="no duplicate",
                target="calendar.events",
                op="count",
                where={"title": topic},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(tool="calendar_search_events", arguments={"query": topic}),
            ToolCall(
                tool="calendar_find_free_slots",
                arguments={
                    "date": f"{target_day:%Y-%m-%d}",
                    "duration_min": minutes,
                    "earliest": f"{frm}:00",
                },
            ),
            ToolCall(
                tool="calendar_reschedule_event",
                arguments={"event_id": "${0.0.id}", "start": iso(new_start)},
            ),
            Finish(),
        ],
        difficulty=3 if len(blockers) <= 2 else 4,
    )


REASONS = [
    "",
    " because I'm off sick",
    " since the client pulled out",
    " as I'm travelling",
    " because the room is double-booked",
    " since half the team is away",
]


@template(domain="calendar", capabilities=["skills"], apps=["calendar", "contacts"], difficulty=2)
def cancel_meeting_with_attendees(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 6, favorite_rate=0.25)
    day, other_day = g.rng.sample(WORKDAYS, 2)
    topic = g.rng.choice(MEETINGS)
    start = day.replace(hour=g.rng.randint(9, 16), minute=g.rng.choice([0, 30]))
    guests = [p["email"] for p in g.rng.sample(people, g.rng.randint(2, 3))]
    target = event_record(
        "ev_401",
        topic,
        iso(start),
        iso(start + timedelta(hours=1)),
        attendees=guests,
        location=g.rng.choice(ROOMS),
    )
    events = [target]
    twin = g.rng.random() < 0.5
    checks = [
        Check(
            name="meeting cancelled with a note",
            target="calendar.events",
            where={"id": "ev_401", "status": "cancelled", "cancel_note__ne": None},
        ),
        Check(
            name="nothing else cancelled",
            target="calendar.events",
            op="count",
            where={"status": "cancelled"},
            expect=1,
        ),
    ]
    if twin:
        other = other_day.replace(hour=start.hour, minute=start.minute)
        events.append(
            event_record(
                "ev_402", topic, iso(other), iso(other + timedelta(hours=1)), attendees=guests
            )
        )
        checks.append(
            Check(
                name="the other occurrence kept",
                target="calendar.events",
                where={"id": "ev_402", "status": "confirmed"},
            )
        )
    avoid = [(datetime.fromisoformat(e["start"]), datetime.fromisoformat(e["end"])) for e in events]
    events = [*background_events(g, 5, avoid=avoid), *events]
    g.rng.shuffle(events)
    reason = g.rng.choice(REASONS)
    return g.task(
        instruction=(
            f"Call off the '{topic}' on {day_phrase(day)}{reason} — make sure the attendees hear "
            "about it."
        ),
        world={"calendar": _calendar_world(events), "contacts": {"contacts": people}},
        checks=checks,
        plan=[
            ToolCall(tool="calendar_search_events", arguments={"query": topic}),
            ToolCall(
                tool="calendar_cancel_event",
                arguments={
                    "event_id": "ev_401",
                    "message": f"Sorry, the {topic} on {day_phrase(day)} is cancelled.",
                },
            ),
            Finish(),
        ],
        difficulty=3 if twin else 2,
    )


# --------------------------------------------------------------------------- memory

ACTIVITIES = [
    ("gym", "Gym"),
    ("swim", "Swimming"),
    ("yoga", "Yoga"),
    ("run", "Running"),
    ("piano practice", "Piano practice"),
    ("climbing", "Climbing"),
    ("tennis", "Tennis"),
    ("meditation", "Meditation"),
]


@template(domain="calendar", capabilities=["memory"], apps=["calendar"], difficulty=2)
def block_usual_activity_time(g: TaskGen) -> Any:
    activity, title = g.rng.choice(ACTIVITIES)
    day = g.rng.choice(WORKDAYS)
    slots = [(7, 0), (7, 30), (8, 0), (12, 0), (12, 30), (17, 30), (18, 0), (18, 30), (19, 0)]
    (h1, m1), (h2, m2) = g.rng.sample(slots, 2)
    minutes = g.rng.choice([45, 60, 90])
    right = day.replace(hour=h1, minute=m1)
    wrong = day.replace(hour=h2, minute=m2)
    span = timedelta(minutes=minutes)
    memory = recall(
        g.rng,
        f"usual_{activity.replace(' ', '_')}_time",
        hm(right),
        hm(wrong),
        noise=[("preferred_meeting_room", g.rng.choice(ROOMS))],
    )
    events = background_events(g, 6, avoid=[(right, right + span), (wrong, wrong + span)])
    return g.task(
        instruction=(
            f"Put my usual {activity} time on {day_phrase(day)} in my calendar as a "
            f"{minutes}-minute '{title}' block."
        ),
        world={"calendar": _calendar_world(events)},
        checks=[
            Check(
                name="blocked at the remembered time",
                target="calendar.events",
                where={"title": title, "start": iso(right), "end": iso(right + span)},
            ),
            Check(
                name="blocked once",
                target="calendar.events",
                op="count",
                where={"title": title},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(
                tool="calendar_create_event",
                arguments={"start": iso(right), "end": iso(right + span), "title": title},
            ),
            Finish(),
        ],
        memory=memory,
    )


@template(
    domain="calendar",
    capabilities=["memory", "tool_use"],
    apps=["calendar", "contacts", "messaging"],
    difficulty=3,
)
def book_with_usual_length_and_text(g: TaskGen) -> Any:
    people = contacts_world(g.fake, favorite_rate=0.25)
    guest = g.rng.choice(people)
    day = g.rng.choice(WORKDAYS)
    start = day.replace(hour=g.rng.randint(9, 16), minute=g.rng.choice([0, 15, 30, 45]))
    right, wrong = g.rng.sample([25, 30, 45, 50, 60], 2)
    end = start + timedelta(minutes=right)
    topic = g.rng.choice(MEETINGS)
    memory = recall(
        g.rng,
        "default_meeting_length",
        f"{right} minutes",
        f"{wrong} minutes",
        noise=[("preferred_meeting_room", g.rng.choice(ROOMS))],
    )
    events = background_events(g, 6, avoid=[(start, start + timedelta(minutes=60))])
    return g.task(
        instruction=(
            f"Book '{topic}' with {guest['name']} on {day_phrase(day)} at {hm(start)} for my "
            "usual meeting length, invite them, and text them the start time."
        ),
        world={
            "calendar": _calendar_world(events),
            "contacts": {"contacts": people},
            "messaging": {"messages": []},
        },
        checks=[
            Check(
                name="meeting has the usual length",
                target="calendar.events",
                where={
                    "title": topic,
                    "start": iso(start),
                    "end": iso(end),
                    "attendees__contains": guest["email"],
                },
            ),
            Check(
                name="booked once",
                target="calendar.events",
                op="count",
                where={"title": topic},
                expect=1,
            ),
            texted(
                "guest told the time",
                {"to": guest["phone"], "sender": "me", "text__contains": hm(start)},
            ),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": guest["name"]}),
            ToolCall(
                tool="calendar_create_event",
                arguments={
                    "title": topic,
                    "start": iso(start),
                    "end": iso(end),
                    "attendees": ["${0.0.email}"],
                },
            ),
            ToolCall(
                tool="messaging_send",
                arguments={
                    "to": "${0.0.phone}",
                    "text": f"'{topic}' is booked for {day_phrase(day)} at {hm(start)}.",
                },
            ),
            Finish(),
        ],
        memory=memory,
    )


# --------------------------------------------------------------------------- subagent


def _shared_calendar(cal_id: str, person: dict[str, Any]) -> dict[str, Any]:
    return calendar_record(
        cal_id, person["name"], owner=person["name"], email=person["email"], access="free_busy"
    )


def _busy_hours(
    g: TaskGen, hours: list[int], owners: list[str], free: set[int]
) -> dict[str, set[int]]:
    """Per owner, the busy hours: every hour not in `free` is busy for at least one owner."""
    busy: dict[str, set[int]] = {o: set() for o in owners}
    for hour in hours:
        if hour in free:
            continue
        chosen = [o for o in owners if g.rng.random() < 0.5] or [g.rng.choice(owners)]
        for owner in chosen:
            busy[owner].add(hour)
    return busy


def _hour_events(
    day: datetime, cal_id: str, hours: set[int], prefix: str, g: TaskGen
) -> list[dict[str, Any]]:
    """One-hour events at the given hours (colleagues' calendars only show 'Busy')."""
    return [
        event_record(
            f"{prefix}{h}",
            "Busy" if cal_id != "primary" else g.rng.choice(BACKGROUND),
            iso(day.replace(hour=h)),
            iso(day.replace(hour=h + 1)),
            calendar_id=cal_id,
        )
        for h in sorted(hours)
    ]


@template(domain="calendar", capabilities=["subagent"], apps=["calendar"], difficulty=4)
def book_common_free_hour(g: TaskGen) -> Any:
    a, b = contacts_world(g.fake, 2, favorite_rate=0.25)
    day = g.rng.choice(WORKDAYS)
    date = f"{day:%Y-%m-%d}"
    hours = list(range(9, 17))
    common = g.rng.choice(hours)
    busy = _busy_hours(g, hours, ["primary", "cal_a", "cal_b"], {common})
    events = [
        *_hour_events(day, "primary", busy["primary"], "ev_5", g),
        *_hour_events(day, "cal_a", busy["cal_a"], "ev_6", g),
        *_hour_events(day, "cal_b", busy["cal_b"], "ev_7", g),
    ]
    topic = g.rng.choice(MEETINGS)
    start = day.replace(hour=common)
    end = start + timedelta(hours=1)
    cals = [_shared_calendar("cal_a", a), _shared_calendar("cal_b", b)]

    def scout(cal_id: str, person: dict[str, Any], agent: str) -> list[Any]:
        free = [f"{h:02d}:00" for h in hours if h not in busy[cal_id]]
        return [
            Delegate(
                goal=f"List {person['name']}'s free one-hour slots on {date} between 09:00 "
                "and 17:00",
                tools=["calendar_list_calendars", "calendar_find_free_slots"],
                agent=agent,
            ),
            ToolCall(
                tool="calendar_find_free_slots",
                arguments={
                    "date": date,
                    "duration_min": 60,
                    "calendar_id": cal_id,
                    "earliest": "09:00",
                    "latest": "17:00",
                },
            ),
            Finish(answer=f"{person['name']} is free at " + ", ".join(free)),
        ]

    return g.task(
        instruction=(
            f"Find a one-hour slot on {day_phrase(day)} between 9:00 and 17:00 when {a['name']}, "
            f"{b['name']} and I are all free, and book '{topic}' then with both of them invited."
        ),
        world={"calendar": _calendar_world(events, cals)},
        checks=[
            Check(
                name=f"booked in the common slot with {a['name']}",
                target="calendar.events",
                where={
                    "title": topic,
                    "start": iso(start),
                    "end": iso(end),
                    "attendees__contains": a["email"],
                },
            ),
            Check(
                name=f"{b['name']} invited",
                target="calendar.events",
                where={"title": topic, "start": iso(start), "attendees__contains": b["email"]},
            ),
            Check(
                name="booked once",
                target="calendar.events",
                op="count",
                where={"title": topic},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(tool="calendar_list_calendars", arguments={}),
            *scout("cal_a", a, "scout_a"),
            *scout("cal_b", b, "scout_b"),
            ToolCall(
                tool="calendar_find_free_slots",
                arguments={
                    "date": date,
                    "duration_min": 60,
                    "earliest": "09:00",
                    "latest": "17:00",
                },
            ),
            ToolCall(
                tool="calendar_create_event",
                arguments={
                    "title": topic,
                    "start": iso(start),
                    "end": iso(end),
                    "attendees": ["${0.1.email}", "${0.2.email}"],
                },
            ),
            Finish(),
        ],
    )


@template(domain="calendar", capabilities=["subagent", "skills"], apps=["calendar"], difficulty=4)
def move_meeting_to_shared_free_time(g: TaskGen) -> Any:
    (mate,) = contacts_world(g.fake, 1, favorite_rate=0.25)
    day = g.rng.choice(WORKDAYS)
    date = f"{day:%Y-%m-%d}"
    frm = g.rng.choice([12, 13])
    first = g.rng.randint(frm + 1, 16)
    hours = list(range(frm, 17))
    busy = _busy_hours(g, [h for h in hours if h < first], ["primary", "cal_a"], set())
    for hour in hours:
        if hour > first:
            for owner in ("primary", "cal_a"):
                if g.rng.random() < 0.4:
                    busy[owner].add(hour)
    topic = g.rng.choice(MEETINGS)
    old = day.replace(hour=g.rng.choice([9, 10]))
    meeting = event_record(
        "ev_801",
        topic,
        iso(old),
        iso(old + timedelta(hours=1)),
        attendees=[mate["email"]],
        location=g.rng.choice(ROOMS),
    )
    events = [
        meeting,
        *_hour_events(day, "primary", busy["primary"], "ev_8", g),
        *_hour_events(day, "cal_a", busy["cal_a"], "ev_9", g),
    ]
    new = day.replace(hour=first)
    free_mate = [f"{h:02d}:00" for h in hours if h not in busy["cal_a"]]
    return g.task(
        instruction=(
            f"My '{topic}' with {mate['name']} on {day_phrase(day)} has to move later: put it at "
            f"the first time from {frm}:00 that day when both {mate['name']} and I are free."
        ),
        world={"calendar": _calendar_world(events, [_shared_calendar("cal_a", mate)])},
        checks=[
            Check(
                name="same event moved to the shared free hour",
                target="calendar.events",
                where={
                    "id": "ev_801",
                    "start": iso(new),
                    "end": iso(new + timedelta(hours=1)),
                    "rescheduled_from": iso(old),
                    "attendees__contains": mate["email"],
                },
            ),
            Check(
                name="no duplicate",
                target="calendar.events",
                op="count",
                where={"title": topic},
                expect=1,
            ),
        ],
        plan=[
            Delegate(
                goal=f"List {mate['name']}'s free one-hour slots on {date} from {frm}:00",
                tools=["calendar_list_calendars", "calendar_find_free_slots"],
                agent="teammate",
            ),
            ToolCall(
                tool="calendar_find_free_slots",
                arguments={
                    "date": date,
                    "duration_min": 60,
                    "calendar_id": "cal_a",
                    "earliest": f"{frm}:00",
                },
            ),
            Finish(answer=f"{mate['name']} is free at " + ", ".join(free_mate)),
            ToolCall(
                tool="calendar_search_events",
                arguments={"query": topic, "date_from": date, "date_to": date},
            ),
            ToolCall(
                tool="calendar_find_free_slots",
                arguments={"date": date, "duration_min": 60, "earliest": f"{frm}:00"},
            ),
            ToolCall(
                tool="calendar_reschedule_event",
                arguments={"event_id": "${3.0.id}", "start": iso(new)},
            ),
            Finish(),
        ],
        difficulty=5 if first - frm >= 3 else 4,
    )
