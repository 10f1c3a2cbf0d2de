"""Clock: alarms (one-off and repeating), timers and world clocks."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import ISO_DATE, App, fail, parse_real_moment, tool

WEEK = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
SOUNDS = (
    "Radar",
    "Beacon",
    "Birdsong",
    "Harp",
    "Sunrise",
    "Ocean",
    "Bright Morning",
    "Classic Bell",
)
CITY_OFFSETS = {
    "London": 0,
    "Lisbon": 0,
    "Paris": 1,
    "Berlin": 1,
    "Cairo": 2,
    "Istanbul": 3,
    "Dubai": 4,
    "Mumbai": 5.5,
    "Singapore": 8,
    "Tokyo": 9,
    "Sydney": 11,
    "Auckland": 13,
    "Honolulu": -10,
    "Los Angeles": -8,
    "Denver": -7,
    "Chicago": -6,
    "New York": -5,
    "Sao Paulo": -3,
}

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
Sound = Literal[
    "Radar", "Beacon", "Birdsong", "Harp", "Sunrise", "Ocean", "Bright Morning", "Classic Bell"
]
City = Literal[
    "London",
    "Lisbon",
    "Paris",
    "Berlin",
    "Cairo",
    "Istanbul",
    "Dubai",
    "Mumbai",
    "Singapore",
    "Tokyo",
    "Sydney",
    "Auckland",
    "Honolulu",
    "Los Angeles",
    "Denver",
    "Chicago",
    "New York",
    "Sao Paulo",
]
AlarmTime = Annotated[str, Field(pattern=r"^\d{1,2}:\d{2}$", description="24-hour time, HH:MM")]
IsoDate = Annotated[str, Field(pattern=ISO_DATE, description="Day, YYYY-MM-DD")]
AlarmId = Annotated[str, Field(min_length=1, description="Alarm id, e.g. al_101")]
TimerId = Annotated[str, Field(min_length=1, description="Timer id, e.g. tm_9001")]
MAX_RUNNING_TIMERS = 5


class Alarm(TypedDict):
    id: str
    time: str
    label: str
    days: list[str]
    date: str | None
    enabled: bool
    sound: str
    snooze_min: int
    vibrate: bool
    skip_dates: list[str]


class Timer(TypedDict):
    id: str
    label: str
    duration_s: int
    remaining_s: int
    state: str  # running | paused | cancelled
    ends_at: str | None


class WorldClock(TypedDict):
    id: str
    city: str
    utc_offset: float


class Removed(TypedDict):
    removed: str


def alarm_record(
    alarm_id: str,
    time: str,
    label: str = "Alarm",
    *,
    days: list[str] | None = None,
    date: str | None = None,
    enabled: bool = True,
    sound: str = "Radar",
    snooze_min: int = 10,
) -> dict[str, Any]:
    """An alarm as stored in a task world."""
    return {
        "id": alarm_id,
        "time": time,
        "label": label,
        "days": [d for d in WEEK if d in set(days or [])],
        "date": date,
        "enabled": enabled,
        "sound": sound,
        "snooze_min": snooze_min,
        "vibrate": True,
        "skip_dates": [],
    }


def world_clock_record(clock_id: str, city: str) -> dict[str, Any]:
    return {"id": clock_id, "city": city, "utc_offset": CITY_OFFSETS.get(city, 0)}


def _hhmm(value: str, field: str = "time") -> str:
    hours, minutes = (int(part) for part in value.split(":"))
    if hours > 23 or minutes > 59:
        raise fail(
            f"argument '{field}': alarm time invalid: '{value}' (use 24-hour HH:MM, 00:00-23:59)",
            "invalid_arguments",
        )
    return f"{hours:02d}:{minutes:02d}"


class ClockApp(App):
    name = "clock"
    title = "Clock"
    description = "Alarms (one-off or repeating on weekdays), countdown timers and world clocks."
    skills = {
        "repeating_alarms": (
            "Repeating alarms take `days` as 3-letter lowercase codes: 'weekdays' = ['mon', "
            "'tue', 'wed', 'thu', 'fri'], 'weekends' = ['sat', 'sun'], 'every day' = all seven. "
            "A one-off alarm has days=[]; without a `date` (YYYY-MM-DD) it rings at the next "
            "occurrence of the time, so an alarm for a later day needs the date. Times are "
            "24-hour HH:MM ('7pm' = '19:00')."
        ),
        "skip_once": (
            "To keep a repeating alarm from ringing on one day only (a day off, a holiday), "
            "call clock_skip_alarm_once(alarm_id, date). Do not disable or delete it: that "
            "stops every later day too. One-off alarms cannot skip; disable them instead."
        ),
        "timers": (
            "A timer counts down from minutes+seconds; pause and resume keep the remaining time. "
            "At most 5 timers can run at once: cancel a finished one first."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"alarms": [], "timers": [], "world_clocks": []}

    # helpers ----------------------------------------------------------------------------
    def _check_date(self, date: str, time: str) -> str:
        moment = parse_real_moment(f"{date}T{time}", "date", what="a real date")
        if moment <= self.world.now:
            raise fail(
                f"argument 'date': {date} {time} has already passed (now {self.world.iso_now()})",
                "invalid_arguments",
            )
        return date

    def _duplicate(self, time: str, days: list[str], date: str | None, skip: str = "") -> None:
        for alarm in self.records("alarms"):
            if alarm.get("id") == skip or not alarm.get("enabled"):
                continue
            if (
                alarm.get("time") == time
                and alarm.get("days") == days
                and alarm.get("date") == date
            ):
                raise fail(
                    f"an alarm at {time} with the same days already exists ({alarm['id']}); "
                    "update it instead"
                )

    def _timer(self, timer_id: str) -> dict[str, Any]:
        return self.find("timers", timer_id, what="timer")

    # alarms -----------------------------------------------------------------------------
    @tool()
    def clock_list_alarms(self, enabled_only: bool = False) -> list[Alarm]:
        """List alarms sorted by time."""
        rows = [a for a in self.records("alarms") if a.get("enabled") or not enabled_only]
        rows.sort(key=lambda a: str(a.get("time", "")))
        return cast(list[Alarm], rows)

    @tool()
    def clock_list_sounds(self) -> list[str]:
        """The alarm sounds available."""
        return list(SOUNDS)

    @tool("write")
    def clock_create_alarm(
        self,
        time: AlarmTime,
        label: Annotated[str, Field(min_length=1, max_length=40)] = "Alarm",
        days: list[Day] = [],  # noqa: B006 - pydantic copies defaults
        date: IsoDate | None = None,
        sound: Sound = "Radar",
        snooze_min: Literal[5, 10, 15, 20, 30] = 10,
        vibrate: bool = True,
    ) -> Alarm:
        """Create an alarm: repeating on the given days, or one-off (no days) at the next
        occurrence of the time or on a given date."""
        hhmm = _hhmm(time)
        ordered: list[str] = [d for d in WEEK if d in set(days)]
        if ordered and date is not None:
            raise fail(
                "argument 'date': a repeating alarm (days given) cannot have a date",
                "invalid_arguments",
            )
        if date is not None:
            self._check_date(date, hhmm)
        self._duplicate(hhmm, ordered, date)
        record: Alarm = {
            "id": self.world.new_id("al"),
            "time": hhmm,
            "label": label,
            "days": ordered,
            "date": date,
            "enabled": True,
            "sound": sound,
            "snooze_min": snooze_min,
            "vibrate": vibrate,
            "skip_dates": [],
        }
        self.records("alarms").append(dict(record))
        return record

    @tool("write")
    def clock_update_alarm(
        self,
        alarm_id: AlarmId,
        time: AlarmTime | None = None,
        label: Annotated[str | None, Field(min_length=1, max_length=40)] = None,
        days: list[Day] | None = None,
        sound: Sound | None = None,
        snooze_min: Literal[5, 10, 15, 20, 30] | None = None,
    ) -> Alarm:
        """Change an alarm's time, label, days, sound or snooze length (only the given fields)."""
        alarm = self.find("alarms", alarm_id, what="alarm")
        changes: dict[str, Any] = {}
        if time is not None:
            changes["time"] = _hhmm(time)
        if days is not None:
            changes["days"] = [d for d in WEEK if d in set(days)]
            if changes["days"]:
                changes["date"] = None
        for key, value in (("label", label), ("sound", sound), ("snooze_min", snooze_min)):
            if value is not None:
                changes[key] = value
        if not changes:
            raise fail(
                "nothing to update: give time, label, days, sound or snooze_min",
                "invalid_arguments",
            )
        merged = {**alarm, **changes}
        if alarm.get("enabled"):
            self._duplicate(merged["time"], merged["days"], merged.get("date"), skip=alarm_id)
        alarm.update(changes)
        return cast(Alarm, alarm)

    @tool("write")
    def clock_set_alarm_enabled(self, alarm_id: AlarmId, enabled: bool) -> Alarm:
        """Switch an alarm on or off (off stops every occurrence)."""
        alarm = self.find("alarms", alarm_id, what="alarm")
        if (
            enabled
            and alarm.get("date")
            and parse_real_moment(f"{alarm['date']}T{alarm['time']}", "date", what="a real date")
            <= self.world.now
        ):
            raise fail(
                f"one-off alarm {alarm_id} was for {alarm['date']}, which has passed; "
                "set a new date"
            )
        alarm["enabled"] = enabled
        return cast(Alarm, alarm)

    @tool("write")
    def clock_delete_alarm(self, alarm_id: AlarmId) -> Removed:
        """Delete an alarm."""
        alarm = self.find("alarms", alarm_id, what="alarm")
        self.records("alarms").remove(alarm)
        return {"removed": alarm_id}

    @tool("write")
    def clock_skip_alarm_once(self, alarm_id: AlarmId, date: IsoDate) -> Alarm:
        """Keep a repeating alarm from ringing on one date; it rings as usual on other days."""
        alarm = self.find("alarms", alarm_id, what="alarm")
        if not alarm.get("days"):
            raise fail(f"'{alarm['label']}' ({alarm_id}) is a one-off alarm; disable it instead")
        if not alarm.get("enabled"):
            raise fail(f"'{alarm['label']}' ({alarm_id}) is switched off")
        moment = parse_real_moment(f"{date}T{alarm['time']}", "date", what="a real date")
        if moment <= self.world.now:
            raise fail(
                f"argument 'date': {date} {alarm['time']} has already passed", "invalid_arguments"
            )
        code = WEEK[moment.weekday()]
        if code not in alarm["days"]:
            raise fail(
                f"'{alarm['label']}' does not ring on {moment:%A} {date} (it rings "
                f"{', '.join(alarm['days'])})"
            )
        if date in alarm.setdefault("skip_dates", []):
            raise fail(f"'{alarm['label']}' already skips {date}")
        alarm["skip_dates"].append(date)
        alarm["skip_dates"].sort()
        return cast(Alarm, alarm)

    # timers -----------------------------------------------------------------------------
    @tool()
    def clock_list_timers(self) -> list[Timer]:
        """List timers with their remaining time."""
        out = []
        for timer in self.records("timers"):
            row = dict(timer)
            if timer.get("state") == "running" and timer.get("ends_at"):
                left = datetime.fromisoformat(timer["ends_at"]) - self.world.now
                row["remaining_s"] = max(0, int(left.total_seconds()))
            out.append(row)
        return cast(list[Timer], out)

    @tool("write")
    def clock_start_timer(
        self,
        minutes: Annotated[int, Field(ge=0, le=1439)],
        seconds: Annotated[int, Field(ge=0, le=59)] = 0,
        label: Annotated[str, Field(min_length=1, max_length=40)] = "Timer",
    ) -> Timer:
        """Start a countdown timer of minutes + seconds."""
        total = minutes * 60 + seconds
        if total == 0:
            raise fail("argument 'minutes': a timer needs a duration above 0", "invalid_arguments")
        running = [t for t in self.records("timers") if t.get("state") == "running"]
        if len(running) >= MAX_RUNNING_TIMERS:
            raise fail(f"{MAX_RUNNING_TIMERS} timers are already running; cancel one first")
        record: Timer = {
            "id": self.world.new_id("tm"),
            "label": label,
            "duration_s": total,
            "remaining_s": total,
            "state": "running",
            "ends_at": (self.world.now + timedelta(seconds=total)).isoformat(timespec="seconds"),
        }
        self.records("timers").append(dict(record))
        return record

    @tool("write")
    def clock_pause_timer(self, timer_id: TimerId) -> Timer:
        """Pause a running timer, keeping the time left."""
        timer = self._timer(timer_id)
        if timer.get("state") != "running":
            raise fail(f"timer {timer_id} is {timer.get('state')}, not running")
        left = datetime.fromisoformat(timer["ends_at"]) - self.world.now
        timer["remaining_s"] = max(0, int(left.total_seconds()))
        timer["state"], timer["ends_at"] = "paused", None
        return cast(Timer, timer)

    @tool("write")
    def clock_resume_timer(self, timer_id: TimerId) -> Timer:
        """Resume a paused timer."""
        timer = self._timer(timer_id)
        if timer.get("state") != "paused":
            raise fail(f"timer {timer_id} is {timer.get('state')}, not paused")
        timer["state"] = "running"
        end = self.world.now + timedelta(seconds=int(timer.get("remaining_s", 0)))
        timer["ends_at"] = end.isoformat(timespec="seconds")
        return cast(Timer, timer)

    @tool("write")
    def clock_cancel_timer(self, timer_id: TimerId) -> Timer:
        """Cancel a timer."""
        timer = self._timer(timer_id)
        if timer.get("state") == "cancelled":
            raise fail(f"timer {timer_id} is already cancelled")
        timer["state"], timer["ends_at"], timer["remaining_s"] = "cancelled", None, 0
        return cast(Timer, timer)

    # world clocks -----------------------------------------------------------------------
    @tool()
    def clock_list_world_clocks(self) -> list[WorldClock]:
        """List the cities shown on the world clock."""
        return cast(list[WorldClock], self.records("world_clocks"))

    @tool("write")
    def clock_add_world_clock(self, city: City) -> WorldClock:
        """Add a city to the world clock."""
        if any(c.get("city") == city for c in self.records("world_clocks")):
            raise fail(f"{city} is already on the world clock")
        record: WorldClock = {
            "id": self.world.new_id("wc"),
            "city": city,
            "utc_offset": CITY_OFFSETS[city],
        }
        self.records("world_clocks").append(dict(record))
        return record

    @tool("write")
    def clock_remove_world_clock(self, clock_id: Annotated[str, Field(min_length=1)]) -> Removed:
        """Remove a city from the world clock."""
        record = self.find("world_clocks", clock_id, what="world clock")
        self.records("world_clocks").remove(record)
        return {"removed": clock_id}
