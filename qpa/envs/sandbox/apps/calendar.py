"""Calendar: the user's and shared calendars; events, free slots, invitations, rescheduling."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.cow import FrozenList
from qpa.envs.sandbox.engine import (
    EMAIL,
    ISO_DATE,
    ISO_MINUTE,
    App,
    Limit,
    Offset,
    fail,
    page,
    parse_real_moment,
    tool,
    updates,
)

CLOCK = r"^\d{2}:\d{2}$"
SLOT_STEP = timedelta(minutes=30)

IsoDate = Annotated[str, Field(pattern=ISO_DATE, description="Day, YYYY-MM-DD")]
IsoDateTime = Annotated[str, Field(pattern=ISO_MINUTE, description="Local time, YYYY-MM-DDTHH:MM")]
ClockTime = Annotated[str, Field(pattern=CLOCK, description="Time of day, HH:MM (24-hour)")]
Email = Annotated[str, Field(pattern=EMAIL, description="Email address")]
EventId = Annotated[str, Field(min_length=1, description="Event id, e.g. ev_101")]
Response = Literal["accepted", "declined", "tentative"]


def _event_text(event: dict[str, Any]) -> str:
    """What `calendar_search_events` looks in: title, location and notes, lowered."""
    return " ".join(str(event.get(k, "")) for k in ("title", "location", "notes")).lower()


class CalendarInfo(TypedDict):
    id: str
    name: str
    owner: str
    email: str
    access: str  # owner | read | free_busy


class Event(TypedDict):
    id: str
    calendar_id: str
    title: str
    start: str
    end: str
    location: str
    attendees: list[str]
    organizer: str  # "me" or the organiser's email
    status: str  # confirmed | cancelled
    response: str  # my answer: accepted | declined | tentative | needs_action
    notes: str
    reminder_min: int | None
    recurrence: str | None  # None | daily | weekly | monthly
    repeat_count: int | None
    rescheduled_from: str | None
    cancel_note: str | None


class EventPage(TypedDict):
    events: list[Event]
    total: int
    offset: int
    next_offset: int | None


class Slot(TypedDict):
    start: str
    end: str


class Deleted(TypedDict):
    deleted: str


def calendar_record(
    cal_id: str, name: str, *, owner: str = "me", email: str = "", access: str = "owner"
) -> dict[str, Any]:
    """A calendar as stored in a task world (`primary` is the user's own)."""
    return {"id": cal_id, "name": name, "owner": owner, "email": email, "access": access}


def event_record(
    event_id: str,
    title: str,
    start: str,
    end: str,
    *,
    calendar_id: str = "primary",
    location: str = "",
    attendees: list[str] | None = None,
    organizer: str = "me",
    status: str = "confirmed",
    response: str = "accepted",
    notes: str = "",
    recurrence: str | None = None,
    repeat_count: int | None = None,
) -> dict[str, Any]:
    """An event as stored in a task world, with every field the tools read."""
    return {
        "id": event_id,
        "calendar_id": calendar_id,
        "title": title,
        "start": start,
        "end": end,
        "location": location,
        "attendees": list(attendees or []),
        "organizer": organizer,
        "status": status,
        "response": response,
        "notes": notes,
        "reminder_min": None,
        "recurrence": recurrence,
        "repeat_count": repeat_count,
        "rescheduled_from": None,
        "cancel_note": None,
    }


def _fmt(moment: datetime) -> str:
    return moment.isoformat(timespec="minutes")


def _occurrence(event: dict[str, Any], day: date) -> tuple[datetime, datetime] | None:
    """The event's start and end on `day` (expanding a recurrence), or None."""
    try:
        start = datetime.fromisoformat(event["start"])
        end = datetime.fromisoformat(event["end"])
    except (KeyError, TypeError, ValueError):
        return None
    if start.date() <= day <= end.date() and (
        start.date() == day or end.time() != datetime.min.time()
    ):
        return start, end
    rule = event.get("recurrence")
    if not rule or day < start.date():
        return None
    days = (day - start.date()).days
    if rule == "daily":
        n = days
    elif rule == "weekly":
        if days % 7:
            return None
        n = days // 7
    elif rule == "monthly":
        if day.day != start.day:
            return None
        n = (day.year - start.year) * 12 + day.month - start.month
    else:
        return None
    count = event.get("repeat_count")
    if count is not None and n >= count:
        return None
    shift = datetime.combine(day, start.time()) - start
    return start + shift, end + shift


class _DateIndex:
    """Which events of a committed list can occur on a day range (`_occurrence` is None outside
    it): a one-off event only between its start and end dates, a recurring one from its start
    date on, one whose dates do not parse never."""

    __slots__ = ("_ones", "_recurring", "_span", "_starts")

    def __init__(self, events: list[dict[str, Any]]) -> None:
        ones: list[tuple[date, int]] = []
        self._recurring: list[tuple[date, int]] = []
        self._span = 0
        for at, event in enumerate(events):
            try:
                start = datetime.fromisoformat(event["start"]).date()
                end = datetime.fromisoformat(event["end"]).date()
            except (KeyError, TypeError, ValueError):
                continue
            if event.get("recurrence"):
                self._recurring.append((start, at))
            elif end >= start:
                ones.append((start, at))
                self._span = max(self._span, (end - start).days)
        ones.sort()
        self._ones = ones
        self._starts = [start for start, _ in ones]

    def candidates(self, first: date, last: date) -> list[int]:
        """Positions (ascending) of the events that may occur between `first` and `last`."""
        low = bisect_left(self._starts, first - timedelta(days=self._span))
        high = bisect_right(self._starts, last)
        found = [at for _, at in self._ones[low:high]]
        found += [at for start, at in self._recurring if start <= last]
        found.sort()
        return found


def _blocks(event: dict[str, Any]) -> bool:
    """Whether an event makes its calendar busy."""
    return event.get("status") != "cancelled" and event.get("response") != "declined"


class CalendarApp(App):
    name = "calendar"
    title = "Calendar"
    description = (
        "Calendars of the user and of colleagues who share theirs: events, free slots, "
        "invitations, reminders, rescheduling and cancellations."
    )
    skills = {
        "reschedule": (
            "To move an event: find it with calendar_search_events (its id), check the target "
            "day with calendar_find_free_slots, then call calendar_reschedule_event(event_id, "
            "start) — the duration is kept unless you pass a new end. Never delete and re-create "
            "an event to move it: that loses its id, the attendees' answers and its history "
            "(rescheduling records the old start in `rescheduled_from`)."
        ),
        "cancel_meeting": (
            "An event you organise that has attendees cannot be deleted: call "
            "calendar_cancel_event with a short message for the attendees; it stays in the "
            "calendar marked cancelled. calendar_delete_event is only for events without "
            "attendees (or already cancelled ones). An invitation from someone else is answered "
            "with calendar_respond_to_invite('declined'), never deleted."
        ),
        "shared_calendars": (
            "Colleagues' calendars (calendar_list_calendars) are often free/busy only: "
            "calendar_list_events and calendar_get_event are refused for them, but "
            "calendar_find_free_slots works with their calendar_id. A time suits a group only if "
            "it appears in every person's free slots, including the user's own ('primary')."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"calendars": [calendar_record("primary", "Personal")], "events": []}

    # helpers ----------------------------------------------------------------------------
    def _calendar(self, calendar_id: str) -> dict[str, Any]:
        cal = self.first("calendars", id=calendar_id)
        if cal is None:
            raise fail(f"calendar '{calendar_id}' not found; see calendar_list_calendars")
        return cal

    def _readable(self, calendar_id: str) -> dict[str, Any]:
        cal = self._calendar(calendar_id)
        if cal.get("access") == "free_busy":
            raise fail(
                f"{cal.get('name', calendar_id)} shares free/busy only; "
                "use calendar_find_free_slots",
                "permission_denied",
            )
        return cal

    def _event(self, event_id: str) -> dict[str, Any]:
        record = self.find("events", event_id, what="event")
        self._readable(record.get("calendar_id", "primary"))
        return record

    def _own_event(self, event_id: str) -> dict[str, Any]:
        record = self._event(event_id)
        if record.get("organizer", "me") != "me":
            raise fail(
                f"'{record['title']}' is organised by {record['organizer']}; "
                "answer it with calendar_respond_to_invite"
            )
        if record.get("status") == "cancelled":
            raise fail(f"'{record['title']}' ({event_id}) is cancelled")
        return record

    def _writable(self, calendar_id: str) -> None:
        cal = self._calendar(calendar_id)
        if cal.get("access") != "owner":
            raise fail(
                f"{cal.get('name', calendar_id)} is not yours; you cannot add events to it",
                "permission_denied",
            )

    def _future(self, start: datetime) -> None:
        if start < self.world.now.replace(second=0, microsecond=0):
            raise fail(f"start {_fmt(start)} is in the past (now {self.world.iso_now()})")

    def _conflict(self, calendar_id: str, start: datetime, end: datetime, skip: str = "") -> None:
        for event in self.records("events"):
            if (
                event.get("calendar_id") != calendar_id
                or event.get("id") == skip
                or not _blocks(event)
            ):
                continue
            occ = _occurrence(event, start.date())
            if occ and occ[0] < end and start < occ[1]:
                raise fail(
                    f"conflicts with '{event['title']}' {_fmt(occ[0])}-{occ[1]:%H:%M} "
                    f"({event['id']}); pick a free slot or pass allow_overlap=true"
                )

    def _add_event(
        self,
        title: str,
        start: str,
        end: str,
        calendar_id: str,
        *,
        allow_overlap: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        """Store a new event in a calendar of the user's: the start must be in the future and,
        unless allow_overlap, the time free there."""
        s, e = self._window(start, end)
        self._writable(calendar_id)
        self._future(s)
        if not allow_overlap:
            self._conflict(calendar_id, s, e)
        record = event_record(
            self.world.new_id("ev"), title, _fmt(s), _fmt(e), calendar_id=calendar_id, **fields
        )
        self.records("events").append(record)
        return record

    def _window(self, start: str, end: str) -> tuple[datetime, datetime]:
        s, e = parse_real_moment(start, "start"), parse_real_moment(end, "end")
        if e <= s:
            raise fail(f"argument 'end': {end} is not after start {start}", "invalid_arguments")
        return s, e

    # reads ------------------------------------------------------------------------------
    @tool()
    def calendar_list_calendars(self) -> list[CalendarInfo]:
        """List the calendars on the phone: the user's own ('primary', ...) and shared ones."""
        return cast(list[CalendarInfo], self.records("calendars"))

    @tool()
    def calendar_list_events(
        self,
        date_from: IsoDate,
        date_to: IsoDate | None = None,
        calendar_id: str | None = None,
        include_cancelled: bool = False,
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
        offset: Offset = 0,
    ) -> EventPage:
        """List events between two days (inclusive), sorted by start; all readable calendars
        unless calendar_id is given. Paginated with limit/offset."""
        first = parse_real_moment(date_from, "date_from").date()
        last = parse_real_moment(date_to, "date_to").date() if date_to else first
        if last < first:
            raise fail(
                f"argument 'date_to': {date_to} is before date_from {date_from}",
                "invalid_arguments",
            )
        if (last - first).days > 62:
            raise fail("argument 'date_to': ranges are limited to 62 days", "invalid_arguments")
        if calendar_id is not None:
            self._readable(calendar_id)
        readable = {c["id"] for c in self.records("calendars") if c.get("access") != "free_busy"}
        days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
        events = self.records("events")
        candidates: Iterable[dict[str, Any]] = events
        if type(events) is FrozenList:
            # Committed: only the events that can occur in the range (by the date index kept
            # with the list), in list order, so the stable sort below orders them as before.
            index = events.derived("calendar.by_date", _DateIndex)
            candidates = [events[at] for at in index.candidates(first, last)]
        rows = []
        for event in candidates:
            cal = event.get("calendar_id", "primary")
            if (calendar_id is not None and cal != calendar_id) or cal not in readable:
                continue
            if event.get("status") == "cancelled" and not include_cancelled:
                continue
            if any(_occurrence(event, d) for d in days):
                rows.append(event)
        rows.sort(key=lambda e: str(e.get("start", "")))
        return cast(EventPage, page("events", rows, limit, offset))

    @tool()
    def calendar_search_events(
        self,
        query: Annotated[str, Field(min_length=1, description="Part of a title, place or note")],
        date_from: IsoDate | None = None,
        date_to: IsoDate | None = None,
        limit: Limit = 10,
    ) -> list[Event]:
        """Find events in readable calendars whose title, location or notes contain the query
        (case-insensitive), optionally only those starting within a day range; sorted by start."""
        q = query.lower()
        readable = {c["id"] for c in self.records("calendars") if c.get("access") != "free_busy"}
        rows = []
        events = self.records("events")
        # Committed: only the events the word index names for the query's words can hold it.
        found = self.text_candidates("events", "calendar.search", _event_text, q.split())
        for event in events if found is None else map(events.__getitem__, found):
            if event.get("calendar_id", "primary") not in readable:
                continue
            text = _event_text(event)
            day = str(event.get("start", ""))[:10]
            if q not in text or (date_from and day < date_from) or (date_to and day > date_to):
                continue
            rows.append(event)
        rows.sort(key=lambda e: str(e.get("start", "")))
        return cast(list[Event], rows[:limit])

    @tool()
    def calendar_get_event(self, event_id: EventId) -> Event:
        """Get one event by id."""
        return cast(Event, self._event(event_id))

    @tool()
    def calendar_find_free_slots(
        self,
        date: IsoDate,
        duration_min: Annotated[int, Field(ge=15, le=480, description="Length of the slot")],
        calendar_id: str = "primary",
        earliest: ClockTime = "08:00",
        latest: ClockTime = "18:00",
    ) -> list[Slot]:
        """Free slots of the given length on one day in a calendar (also works for free/busy
        calendars), starting every 30 minutes between earliest and latest."""
        self._calendar(calendar_id)
        day_start = parse_real_moment(f"{date}T{earliest}", "earliest")
        day_end = parse_real_moment(f"{date}T{latest}", "latest")
        if day_end <= day_start:
            raise fail(
                f"argument 'latest': {latest} is not after earliest {earliest}", "invalid_arguments"
            )
        busy = [
            occ
            for event in self.records("events")
            if event.get("calendar_id", "primary") == calendar_id and _blocks(event)
            for occ in [_occurrence(event, day_start.date())]
            if occ is not None
        ]
        length = timedelta(minutes=duration_min)
        slots: list[Slot] = []
        cursor = day_start
        while cursor + length <= day_end:
            stop = cursor + length
            if not any(b[0] < stop and cursor < b[1] for b in busy):
                slots.append({"start": _fmt(cursor), "end": _fmt(stop)})
            cursor += SLOT_STEP
        return slots

    # writes -----------------------------------------------------------------------------
    @tool("write")
    def calendar_create_event(
        self,
        title: Annotated[str, Field(min_length=1, max_length=120)],
        start: IsoDateTime,
        end: IsoDateTime,
        calendar_id: str = "primary",
        location: Annotated[str, Field(max_length=200)] = "",
        attendees: list[Email] = [],  # noqa: B006 - pydantic copies defaults
        notes: Annotated[str, Field(max_length=2000)] = "",
        reminder_min: Annotated[int | None, Field(ge=0, le=10080)] = None,
        allow_overlap: bool = False,
    ) -> Event:
        """Create an event in one of the user's calendars and invite attendees by email.
        Fails if it overlaps another event there unless allow_overlap is true."""
        record = self._add_event(
            title,
            start,
            end,
            calendar_id,
            allow_overlap=allow_overlap,
            location=location,
            attendees=list(dict.fromkeys(attendees)),
            notes=notes,
        )
        record["reminder_min"] = reminder_min
        return cast(Event, dict(record))

    @tool("write")
    def calendar_create_recurring_event(
        self,
        title: Annotated[str, Field(min_length=1, max_length=120)],
        start: IsoDateTime,
        end: IsoDateTime,
        frequency: Literal["daily", "weekly", "monthly"],
        count: Annotated[int, Field(ge=2, le=52, description="Number of occurrences")],
        calendar_id: str = "primary",
        location: Annotated[str, Field(max_length=200)] = "",
    ) -> Event:
        """Create a repeating event (daily, weekly or monthly, `count` times) starting at start.
        Fails if the first occurrence overlaps another event."""
        record = self._add_event(
            title,
            start,
            end,
            calendar_id,
            location=location,
            recurrence=frequency,
            repeat_count=count,
        )
        return cast(Event, dict(record))

    @tool("write")
    def calendar_update_event(
        self,
        event_id: EventId,
        title: Annotated[str | None, Field(min_length=1, max_length=120)] = None,
        location: Annotated[str | None, Field(max_length=200)] = None,
        notes: Annotated[str | None, Field(max_length=2000)] = None,
    ) -> Event:
        """Change an event's title, location or notes (only the given fields). To change its
        time use calendar_reschedule_event."""
        record = self._own_event(event_id)
        given = updates(
            "nothing to update: give title, location or notes",
            title=title,
            location=location,
            notes=notes,
        )
        record.update(given)
        return cast(Event, record)

    @tool("write")
    def calendar_reschedule_event(
        self,
        event_id: EventId,
        start: IsoDateTime,
        end: IsoDateTime | None = None,
        allow_overlap: bool = False,
    ) -> Event:
        """Move an event you organise to a new start (keeping its duration unless end is given);
        attendees keep their invitation. Fails on a conflict unless allow_overlap is true."""
        record = self._own_event(event_id)
        old_s, old_e = (
            parse_real_moment(record["start"], "start"),
            parse_real_moment(record["end"], "end"),
        )
        s = parse_real_moment(start, "start")
        e = parse_real_moment(end, "end") if end else s + (old_e - old_s)
        if e <= s:
            raise fail(f"argument 'end': {end} is not after start {start}", "invalid_arguments")
        self._future(s)
        if not allow_overlap:
            self._conflict(record.get("calendar_id", "primary"), s, e, skip=event_id)
        record["rescheduled_from"] = record["start"]
        record["start"], record["end"] = _fmt(s), _fmt(e)
        return cast(Event, record)

    @tool("write")
    def calendar_cancel_event(
        self,
        event_id: EventId,
        message: Annotated[
            str, Field(min_length=1, max_length=500, description="Note to attendees")
        ],
    ) -> Event:
        """Cancel an event you organise: it stays visible as cancelled and the attendees get
        the message."""
        record = self._own_event(event_id)
        record["status"] = "cancelled"
        record["cancel_note"] = message
        return cast(Event, record)

    @tool("write")
    def calendar_delete_event(self, event_id: EventId) -> Deleted:
        """Delete an event without attendees (or one already cancelled) from the calendar."""
        record = self._event(event_id)
        if record.get("organizer", "me") != "me":
            raise fail(
                f"you were invited to '{record['title']}'; "
                "decline it with calendar_respond_to_invite"
            )
        if record.get("attendees") and record.get("status") != "cancelled":
            raise fail(
                f"'{record['title']}' has {len(record['attendees'])} attendee(s); cancel it with "
                "calendar_cancel_event so they are told"
            )
        self.records("events").remove(record)
        return {"deleted": event_id}

    @tool("write")
    def calendar_add_attendees(
        self, event_id: EventId, emails: Annotated[list[Email], Field(min_length=1)]
    ) -> Event:
        """Invite more people (by email) to an event you organise."""
        record = self._own_event(event_id)
        new = [e for e in dict.fromkeys(emails) if e not in record["attendees"]]
        if not new:
            raise fail(f"everyone given is already invited to '{record['title']}'")
        record["attendees"].extend(new)
        return cast(Event, record)

    @tool("write")
    def calendar_remove_attendee(self, event_id: EventId, email: Email) -> Event:
        """Uninvite one attendee from an event you organise."""
        record = self._own_event(event_id)
        if email not in record["attendees"]:
            raise fail(f"{email} is not invited to '{record['title']}'")
        record["attendees"].remove(email)
        return cast(Event, record)

    @tool("write")
    def calendar_respond_to_invite(self, event_id: EventId, response: Response) -> Event:
        """Accept, decline or tentatively accept an invitation someone else organised."""
        record = self._event(event_id)
        if record.get("organizer", "me") == "me":
            raise fail(f"you organise '{record['title']}'; only invitations can be answered")
        if record.get("status") == "cancelled":
            raise fail(f"the organiser cancelled '{record['title']}'")
        record["response"] = response
        return cast(Event, record)

    @tool("write")
    def calendar_set_reminder(
        self,
        event_id: EventId,
        minutes_before: Annotated[int, Field(ge=0, le=10080, description="0 = at start")],
    ) -> Event:
        """Set when the phone reminds the user of an event (minutes before it starts)."""
        record = self._event(event_id)
        if record.get("status") == "cancelled":
            raise fail(f"'{record['title']}' is cancelled")
        record["reminder_min"] = minutes_before
        return cast(Event, record)
