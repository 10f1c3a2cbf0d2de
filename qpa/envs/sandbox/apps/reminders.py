"""Reminders: to-dos in lists, with due times, priorities, flags, subtasks and repeats."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import (
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

IsoDateTime = Annotated[str, Field(pattern=ISO_MINUTE, description="Local time, YYYY-MM-DDTHH:MM")]
ReminderId = Annotated[str, Field(min_length=1, description="Reminder id, e.g. r_101")]
ListId = Annotated[str, Field(min_length=1, description="List id, e.g. rl_home")]
Priority = Literal["none", "low", "medium", "high"]
Repeat = Literal["never", "daily", "weekdays", "weekly", "monthly"]
Color = Literal["red", "orange", "yellow", "green", "blue", "purple", "gray"]


class Reminder(TypedDict):
    id: str
    list_id: str
    title: str
    notes: str
    due: str | None
    priority: str
    flagged: bool
    completed: bool
    completed_at: str | None
    parent_id: str | None
    repeat: str


class ReminderList(TypedDict):
    id: str
    name: str
    color: str
    open: int


class ReminderPage(TypedDict):
    reminders: list[Reminder]
    total: int
    offset: int
    next_offset: int | None


class Cleared(TypedDict):
    list_id: str
    removed: int


def list_record(list_id: str, name: str, color: str = "blue") -> dict[str, Any]:
    return {"id": list_id, "name": name, "color": color}


def reminder_record(
    reminder_id: str,
    title: str,
    list_id: str,
    *,
    due: str | None = None,
    priority: str = "none",
    flagged: bool = False,
    completed: bool = False,
    parent_id: str | None = None,
    repeat: str = "never",
    notes: str = "",
) -> dict[str, Any]:
    """A reminder as stored in a task world."""
    return {
        "id": reminder_id,
        "list_id": list_id,
        "title": title,
        "notes": notes,
        "due": due,
        "priority": priority,
        "flagged": flagged,
        "completed": completed,
        "completed_at": "2026-02-28T12:00" if completed else None,
        "parent_id": parent_id,
        "repeat": repeat,
    }


def _next_due(due: datetime, repeat: str) -> datetime:
    if repeat == "daily":
        return due + timedelta(days=1)
    if repeat == "weekdays":
        step = due + timedelta(days=1)
        while step.weekday() >= 5:
            step += timedelta(days=1)
        return step
    if repeat == "weekly":
        return due + timedelta(days=7)
    month = due.month % 12 + 1
    year = due.year + (1 if due.month == 12 else 0)
    for day in (due.day, 30, 29, 28):
        try:
            return due.replace(year=year, month=month, day=day)
        except ValueError:
            continue
    return due + timedelta(days=30)


class RemindersApp(App):
    name = "reminders"
    title = "Reminders"
    description = "To-do reminders in lists: due times, priorities, flags, subtasks, repeats."
    skills = {
        "subtasks": (
            "A reminder can have subtasks: reminders whose parent_id is its id (list them with "
            "reminders_list(parent_id=...)). A parent cannot be completed while any subtask is "
            "open: complete each open subtask first, then the parent. To add a step to a "
            "project, create it with parent_id set, in the parent's list. Moving or deleting a "
            "parent takes its subtasks along."
        ),
        "due_dates": (
            "Due times are ISO YYYY-MM-DDTHH:MM. To push a reminder to another day use "
            "reminders_update(due=...); reminders_snooze is only for short delays from now. "
            "'Overdue' means open (not completed) with a due time before now: "
            "reminders_list(due_before=<now>). Completing a repeating reminder moves its due "
            "time to the next occurrence instead of closing it."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"lists": [list_record("rl_reminders", "Reminders")], "reminders": []}

    # helpers ----------------------------------------------------------------------------
    def _list(self, list_id: str) -> dict[str, Any]:
        row = self.first("lists", id=list_id)
        if row is not None:
            return row
        known = ", ".join(f"{r['id']} ({r['name']})" for r in self.records("lists"))
        raise fail(f"list '{list_id}' not found (lists: {known})")

    def _open(self, reminder_id: str) -> dict[str, Any]:
        record = self.find("reminders", reminder_id, what="reminder")
        if record.get("completed"):
            raise fail(f"'{record['title']}' is already completed; reopen it with reminders_reopen")
        return record

    def _subtasks(self, reminder_id: str) -> list[dict[str, Any]]:
        return [r for r in self.records("reminders") if r.get("parent_id") == reminder_id]

    # reads ------------------------------------------------------------------------------
    @tool()
    def reminders_list_lists(self) -> list[ReminderList]:
        """List the reminder lists with how many open reminders each has."""
        # One pass over the reminders, not one per list.
        open_by_list = Counter(
            r.get("list_id") for r in self.records("reminders") if not r.get("completed")
        )
        return [
            {
                "id": lst["id"],
                "name": lst["name"],
                "color": lst.get("color", "blue"),
                "open": open_by_list.get(lst["id"], 0),
            }
            for lst in self.records("lists")
        ]

    @tool()
    def reminders_list(
        self,
        list_id: ListId | None = None,
        include_completed: bool = False,
        due_before: IsoDateTime | None = None,
        parent_id: ReminderId | None = None,
        flagged_only: bool = False,
        limit: Annotated[int, Field(ge=1, le=100)] = 50,
        offset: Offset = 0,
    ) -> ReminderPage:
        """List reminders sorted by due time (undated last), optionally one list's, those due
        before a time, a parent's subtasks, or flagged ones. Paginated with limit/offset."""
        if list_id is not None:
            self._list(list_id)
        if due_before is not None:
            parse_real_moment(due_before, "due_before")
        rows = [
            r
            for r in self.records("reminders")
            if (list_id is None or r.get("list_id") == list_id)
            and (include_completed or not r.get("completed"))
            and (due_before is None or (r.get("due") is not None and str(r["due"]) < due_before))
            and (parent_id is None or r.get("parent_id") == parent_id)
            and (not flagged_only or r.get("flagged"))
        ]
        rows.sort(key=lambda r: (r.get("due") is None, str(r.get("due") or "")))
        return cast(ReminderPage, page("reminders", rows, limit, offset))

    @tool()
    def reminders_search(
        self,
        query: Annotated[str, Field(min_length=1, description="Words in a title or notes")],
        include_completed: bool = False,
        limit: Limit = 10,
    ) -> list[Reminder]:
        """Find reminders whose title or notes contain the query (case-insensitive)."""
        q = query.lower()
        rows = [
            r
            for r in self.records("reminders")
            if (include_completed or not r.get("completed"))
            and (q in str(r.get("title", "")).lower() or q in str(r.get("notes", "")).lower())
        ]
        return cast(list[Reminder], rows[:limit])

    # writes -----------------------------------------------------------------------------
    @tool("write")
    def reminders_create_list(
        self, name: Annotated[str, Field(min_length=1, max_length=60)], color: Color = "blue"
    ) -> ReminderList:
        """Create a new reminder list."""
        if any(str(r.get("name", "")).lower() == name.lower() for r in self.records("lists")):
            raise fail(f"a list named '{name}' already exists")
        record = list_record(self.world.new_id("rl"), name, color)
        self.records("lists").append(record)
        return {"id": record["id"], "name": name, "color": color, "open": 0}

    @tool("write")
    def reminders_create(
        self,
        title: Annotated[str, Field(min_length=1, max_length=200)],
        list_id: ListId,
        due: IsoDateTime | None = None,
        priority: Priority = "none",
        notes: Annotated[str, Field(max_length=2000)] = "",
        parent_id: ReminderId | None = None,
        repeat: Repeat = "never",
    ) -> Reminder:
        """Add a reminder to a list, optionally due at a time, repeating, or as a subtask of
        another reminder (parent_id)."""
        self._list(list_id)
        if due is not None:
            parse_real_moment(due, "due")
        if repeat != "never" and due is None:
            raise fail("argument 'due': a repeating reminder needs a due time", "invalid_arguments")
        if parent_id is not None:
            parent = self.find("reminders", parent_id, what="parent reminder")
            if parent.get("parent_id"):
                raise fail(f"'{parent['title']}' is itself a subtask; subtasks cannot be nested")
            if parent.get("list_id") != list_id:
                raise fail(f"a subtask must be in its parent's list ({parent['list_id']})")
            if parent.get("completed"):
                raise fail(f"'{parent['title']}' is completed; reopen it before adding subtasks")
        record = reminder_record(
            self.world.new_id("r"),
            title,
            list_id,
            due=due,
            priority=priority,
            parent_id=parent_id,
            repeat=repeat,
            notes=notes,
        )
        self.records("reminders").append(record)
        return cast(Reminder, dict(record))

    @tool("write")
    def reminders_update(
        self,
        reminder_id: ReminderId,
        title: Annotated[str | None, Field(min_length=1, max_length=200)] = None,
        due: IsoDateTime | None = None,
        priority: Priority | None = None,
        notes: Annotated[str | None, Field(max_length=2000)] = None,
        repeat: Repeat | None = None,
    ) -> Reminder:
        """Change an open reminder's title, due time, priority, notes or repeat (only the given
        fields)."""
        record = self._open(reminder_id)
        if due is not None:
            parse_real_moment(due, "due")
        given = updates(
            "nothing to update: give title, due, priority, notes or repeat",
            title=title,
            due=due,
            priority=priority,
            notes=notes,
            repeat=repeat,
        )
        if given.get("repeat", record.get("repeat")) != "never" and not given.get(
            "due", record.get("due")
        ):
            raise fail(
                "argument 'repeat': a repeating reminder needs a due time", "invalid_arguments"
            )
        record.update(given)
        return cast(Reminder, record)

    @tool("write")
    def reminders_complete(self, reminder_id: ReminderId) -> Reminder:
        """Mark a reminder done. A repeating one moves on to its next due time instead."""
        record = self._open(reminder_id)
        open_subtasks = [r for r in self._subtasks(reminder_id) if not r.get("completed")]
        if open_subtasks:
            names = ", ".join(f"'{r['title']}'" for r in open_subtasks)
            raise fail(
                f"'{record['title']}' has {len(open_subtasks)} open subtask(s): {names}; "
                "complete them first"
            )
        if record.get("repeat", "never") != "never" and record.get("due"):
            record["due"] = _next_due(
                parse_real_moment(record["due"], "due"), record["repeat"]
            ).isoformat(timespec="minutes")
            return cast(Reminder, record)
        record["completed"] = True
        record["completed_at"] = self.world.iso_now()
        return cast(Reminder, record)

    @tool("write")
    def reminders_reopen(self, reminder_id: ReminderId) -> Reminder:
        """Mark a completed reminder as not done again."""
        record = self.find("reminders", reminder_id, what="reminder")
        if not record.get("completed"):
            raise fail(f"'{record['title']}' is not completed")
        record["completed"] = False
        record["completed_at"] = None
        return cast(Reminder, record)

    @tool("write")
    def reminders_delete(self, reminder_id: ReminderId) -> Cleared:
        """Delete a reminder (and its subtasks)."""
        record = self.find("reminders", reminder_id, what="reminder")
        doomed = {reminder_id, *(r["id"] for r in self._subtasks(reminder_id))}
        rows = self.records("reminders")
        rows[:] = [r for r in rows if r.get("id") not in doomed]
        return {"list_id": record["list_id"], "removed": len(doomed)}

    @tool("write")
    def reminders_flag(self, reminder_id: ReminderId, flagged: bool = True) -> Reminder:
        """Flag (or unflag) a reminder as important."""
        record = self.find("reminders", reminder_id, what="reminder")
        record["flagged"] = flagged
        return cast(Reminder, record)

    @tool("write")
    def reminders_move(self, reminder_id: ReminderId, list_id: ListId) -> Reminder:
        """Move a reminder (with its subtasks) to another list."""
        record = self.find("reminders", reminder_id, what="reminder")
        if record.get("parent_id"):
            raise fail(f"'{record['title']}' is a subtask; move its parent instead")
        self._list(list_id)
        if record.get("list_id") == list_id:
            raise fail(f"'{record['title']}' is already in {list_id}")
        for row in [record, *self._subtasks(reminder_id)]:
            row["list_id"] = list_id
        return cast(Reminder, record)

    @tool("write")
    def reminders_snooze(
        self, reminder_id: ReminderId, minutes: Literal[10, 30, 60, 1440]
    ) -> Reminder:
        """Snooze a due reminder: it becomes due again this many minutes from now."""
        record = self._open(reminder_id)
        if not record.get("due"):
            raise fail(f"'{record['title']}' has no due time to snooze")
        record["due"] = (self.world.now + timedelta(minutes=minutes)).isoformat(timespec="minutes")
        return cast(Reminder, record)

    @tool("write")
    def reminders_clear_completed(self, list_id: ListId) -> Cleared:
        """Delete every completed reminder in a list."""
        self._list(list_id)
        rows = self.records("reminders")
        keep = [r for r in rows if not (r.get("list_id") == list_id and r.get("completed"))]
        removed = len(rows) - len(keep)
        if not removed:
            raise fail(f"list {list_id} has no completed reminders")
        rows[:] = keep
        return {"list_id": list_id, "removed": removed}
