"""Value swaps: copied values exchanged consistently; computed values, schemas, masks kept."""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

import pytest

from qpa.data.augment import MEMORY_HEADER, copied_values, phrased_days, swap_values
from qpa.data.mix import MixConfig


def call(tool: str, /, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"


def result(body: Any) -> str:
    return f"<tool_response>\n{json.dumps({'status': 'ok', 'result': body})}\n</tool_response>"


SYSTEM = (
    "Rules.\n\n# User\n\nThe user is Alex Morgan.\n\n"
    f"{MEMORY_HEADER} (evidence...)\n\n- alarm_sound=Birdsong (stated)\n\n"
    '# Tools and Skills for this scenario\n\n- contacts_create(name, phone): e.g. "Lena Diaz"'
)


def contact_row(name: str, phone: str, trajectory: str = "t1") -> dict[str, Any]:
    return {
        "trajectory_id": trajectory,
        "task_id": "contacts.add_new_contact.train.001",
        "messages": [
            {"role": "system", "content": SYSTEM, "train": False},
            {
                "role": "user",
                "content": f"Save {name} as a new contact with the number {phone}.",
                "train": False,
            },
            {"role": "assistant", "content": call("contacts_create", name=name, phone=phone)},
            {"role": "user", "content": result({"id": "c_9001", "name": name, "phone": phone})},
            {"role": "assistant", "content": "<finish></finish>", "train": True},
        ],
    }


def alarm_row(sound: str, time: str) -> dict[str, Any]:
    system = SYSTEM.replace("Birdsong", sound)
    return {
        "trajectory_id": f"alarm-{sound}",
        "task_id": "clock.alarm_with_preferred_sound.train.001",
        "messages": [
            {"role": "system", "content": system, "train": False},
            {"role": "user", "content": f"Set an alarm for {time} with the sound I like."},
            {
                "role": "assistant",
                "content": call("clock_create_alarm", time=time, sound=sound, snooze_min=10),
            },
            {"role": "user", "content": result({"id": "al_9001", "time": time, "sound": sound})},
        ],
    }


ROWS = [
    contact_row("Yusuf Patel", "+1-555-3041", "t1"),
    contact_row("Lena Diaz", "+1-555-8135", "t2"),
    contact_row("Priya Evans", "+1-555-4158", "t3"),
]


def test_copied_values_are_those_the_context_held_before_the_call() -> None:
    row = contact_row("Yusuf Patel", "+1-555-3041")
    assert copied_values(row["messages"]) == {
        "Yusuf Patel": ("contacts_create", "name"),
        "+1-555-3041": ("contacts_create", "phone"),
    }
    # the date is computed from "Friday, March 6", and only a later result echoes it
    messages = [
        {"role": "user", "content": "Skip my 'Work' alarm on Friday, March 6."},
        {"role": "assistant", "content": call("clock_skip_alarm_once", date="2026-03-06")},
        {"role": "user", "content": result({"skip_dates": ["2026-03-06"]})},
    ]
    assert copied_values(messages) == {}
    # remembered facts count; an integer of one digit and booleans never do
    alarm = alarm_row("Harp", "07:30")
    assert copied_values(alarm["messages"]) == {
        "07:30": ("clock_create_alarm", "time"),
        "Harp": ("clock_create_alarm", "sound"),
    }


def test_a_swap_replaces_each_copied_value_everywhere_with_another_of_its_argument() -> None:
    copies = swap_values(ROWS, 2, seed=0)
    assert len(copies) == 6
    names = {"Yusuf Patel", "Lena Diaz", "Priya Evans"}
    phones = {"+1-555-3041", "+1-555-8135", "+1-555-4158"}
    for copy in copies:
        original = next(r for r in ROWS if copy["trajectory_id"].startswith(r["trajectory_id"]))
        assert re.fullmatch(r"t\d~swap[01]", copy["trajectory_id"])
        old = copied_values(original["messages"])
        new = copied_values(copy["messages"])
        assert set(new.values()) == set(old.values())  # the same arguments, other values
        name = next(v for v, slot in new.items() if slot[1] == "name")
        phone = next(v for v, slot in new.items() if slot[1] == "phone")
        assert name in names - set(old) and phone in phones - set(old)
        user, assistant, tool = (m["content"] for m in copy["messages"][1:4])
        assert user == f"Save {name} as a new contact with the number {phone}."
        assert json.loads(assistant.split("\n")[1])["arguments"] == {"name": name, "phone": phone}
        assert name in tool and phone in tool
        rest = "\n".join(m["content"] for m in copy["messages"][1:])
        assert not any(v in rest for v in old)
        # the system prompt's schemas and Skills are left alone; masks are kept
        assert copy["messages"][0] == original["messages"][0]
        assert [m.get("train") for m in copy["messages"]] == [
            m.get("train") for m in original["messages"]
        ]
    assert swap_values(ROWS, 2, seed=0) == copies  # seeded
    assert swap_values(ROWS, 2, seed=1) != copies
    assert swap_values(ROWS, 0) == []


def test_remembered_facts_are_swapped_inside_the_memory_section_only() -> None:
    rows = [alarm_row("Harp", "07:30"), alarm_row("Radar", "06:15"), alarm_row("Ocean", "05:45")]
    for copy in swap_values(rows, 1, seed=3):
        original = next(r for r in rows if r["trajectory_id"] == copy["trajectory_id"][:-6])
        system = copy["messages"][0]["content"]
        sound = json.loads(copy["messages"][2]["content"].split("\n")[1])["arguments"]["sound"]
        assert f"- alarm_sound={sound} (stated)" in system
        before, after = original["messages"][0]["content"], system
        tools = after.index("# Tools and Skills")
        assert after[tools:] == before[before.index("# Tools and Skills") :]
        assert '"snooze_min": 10' in copy["messages"][2]["content"]  # one digit pair, not copied


def test_rows_whose_values_nest_or_cannot_move_are_left_out() -> None:
    nested = {
        "trajectory_id": "n",
        "messages": [
            {"role": "user", "content": "Text Yusuf: hi. His full name is Yusuf Patel."},
            {"role": "assistant", "content": call("contacts_search", query="Yusuf")},
            {"role": "assistant", "content": call("messaging_send", to="Yusuf Patel")},
        ],
    }
    alone = contact_row("Omar Khan", "+1-555-1111", "alone")
    assert swap_values([nested, alone], 3) == []  # one row: its values have no others to take


def skip_row(phrase: str, day: str, trajectory: str, *, alarm: str = "al_101") -> dict[str, Any]:
    listed = [{"id": alarm, "label": "Gym", "days": ["tue", "thu"], "snooze_min": 10}]
    return {
        "trajectory_id": trajectory,
        "task_id": "settings.skip_alarm_for_one_day.train.001",
        "messages": [
            {"role": "system", "content": SYSTEM, "train": False},
            {"role": "user", "content": f"I'm off on {phrase}, so skip my 'Gym' alarm then."},
            {"role": "assistant", "content": call("clock_list_alarms")},
            {"role": "user", "content": result(listed)},
            {
                "role": "assistant",
                "content": call("clock_skip_alarm_once", alarm_id=alarm, date=day),
            },
            {"role": "user", "content": result({"id": alarm, "skip_dates": [day]})},
            {"role": "assistant", "content": "<finish></finish>", "train": True},
        ],
    }


DAY_ROWS = [
    skip_row("Tuesday, March 3", "2026-03-03", "d1"),
    skip_row("Tuesday, March 10", "2026-03-10", "d2"),
    skip_row("Thursday, March 12", "2026-03-12", "d3"),
    skip_row("Thursday, March 5", "2026-03-05T07:00", "d4"),  # a timestamp opens with the day
    skip_row("Monday, March 9", "2026-03-09", "d5"),  # no other Monday in the mixture
]


def test_a_phrased_day_is_an_iso_day_a_call_writes_that_the_context_named() -> None:
    assert phrased_days(DAY_ROWS[0]["messages"]) == {date(2026, 3, 3)}
    assert phrased_days(DAY_ROWS[3]["messages"]) == {date(2026, 3, 5)}
    # "March 1" is not named by "March 10"; a day only a tool result echoes is not phrased
    assert phrased_days(skip_row("Tuesday, March 10", "2026-03-01", "x")["messages"]) == set()
    # computed: never copied whole (the alarm's id is)
    assert copied_values(DAY_ROWS[0]["messages"]) == {
        "al_101": ("clock_skip_alarm_once", "alarm_id")
    }


def test_a_day_swap_moves_the_day_and_its_phrase_to_another_on_the_same_weekday() -> None:
    assert swap_values(DAY_ROWS, 2, seed=0) == []  # without days: one alarm id, nothing to take
    copies = swap_values(DAY_ROWS, 2, seed=0, days=True)
    # one copy each (the weekday has one other day; the same copy is not made twice), none
    # for the only Monday
    assert sorted(c["trajectory_id"] for c in copies) == [
        "d1~swap0",
        "d2~swap0",
        "d3~swap0",
        "d4~swap0",
    ]
    moved = {c["trajectory_id"][:2]: c["messages"] for c in copies}
    assert moved["d1"][1]["content"] == "I'm off on Tuesday, March 10, so skip my 'Gym' alarm then."
    assert '"date": "2026-03-10"' in moved["d1"][4]["content"]
    assert (
        "2026-03-10" in moved["d1"][5]["content"] and "2026-03-03" not in moved["d1"][5]["content"]
    )
    assert moved["d2"][1]["content"].startswith("I'm off on Tuesday, March 3,")
    assert '"date": "2026-03-03"' in moved["d2"][4]["content"]
    assert moved["d3"][1]["content"].startswith("I'm off on Thursday, March 5,")
    # the timestamp keeps its time; the alarm's days and its snooze are untouched
    assert '"date": "2026-03-12T07:00"' in moved["d4"][4]["content"]
    assert moved["d4"][3] == DAY_ROWS[3]["messages"][3]
    assert all(m[0] == DAY_ROWS[0]["messages"][0] for m in moved.values())  # the system prompt
    assert swap_values(DAY_ROWS, 2, seed=0, days=True) == copies  # seeded


def test_a_day_swap_goes_with_the_value_swap_of_the_same_copy() -> None:
    rows = [
        skip_row("Tuesday, March 3", "2026-03-03", "e1", alarm="al_101"),
        skip_row("Tuesday, March 10", "2026-03-10", "e2", alarm="al_104"),
    ]
    copies = swap_values(rows, 1, seed=0, days=True)
    assert len(copies) == 2
    first = next(c for c in copies if c["trajectory_id"] == "e1~swap0")["messages"]
    arguments = json.loads(first[4]["content"].split("\n")[1])["arguments"]
    assert arguments == {"alarm_id": "al_104", "date": "2026-03-10"}
    assert first[1]["content"].startswith("I'm off on Tuesday, March 10,")
    assert "al_101" not in "".join(m["content"] for m in first[1:])


def test_value_swaps_are_bounded() -> None:
    with pytest.raises(ValueError, match="value_swaps"):
        MixConfig(value_swaps=-1)
    with pytest.raises(ValueError, match="value_swaps"):
        MixConfig(value_swaps=100)
