"""Smart-home tasks: lights, thermostats (eco mode), locks (jams, guest codes), away scenes,
bedtime routines from memory, and room/camera sweeps split across sub-agents."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from qpa.contract import Check, Delegate, Finish, ToolCall
from qpa.envs.sandbox.authoring import (
    PlanBuilder,
    conflicting_memory,
    contacts_world,
    texted,
    texts_sent,
)
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import BASE_DAY

ROOMS = [
    "Living Room",
    "Kitchen",
    "Bedroom",
    "Office",
    "Hallway",
    "Bathroom",
    "Garage",
    "Dining Room",
    "Kids Room",
    "Guest Room",
    "Basement",
    "Sunroom",
]
LIGHT_KINDS = ["Ceiling Light", "Lamp", "Spotlights", "Floor Lamp", "Pendant", "Light Strip"]
LOCKS = [
    ("Front Door", "Hallway"),
    ("Back Door", "Kitchen"),
    ("Garage Door", "Garage"),
    ("Side Door", "Hallway"),
    ("Patio Door", "Living Room"),
]
CAMERAS = [
    "Front Porch Camera",
    "Driveway Camera",
    "Backyard Camera",
    "Garage Camera",
    "Side Gate Camera",
    "Nursery Camera",
    "Living Room Camera",
]
CITIES = [
    "Lisbon",
    "Denver",
    "Osaka",
    "Toronto",
    "Nairobi",
    "Oslo",
    "Austin",
    "Seville",
    "Hanoi",
    "Dublin",
    "Montreal",
    "Cusco",
]
ROLES = [
    ("dog walker", "dog_walker"),
    ("cleaner", "cleaner"),
    ("babysitter", "babysitter"),
    ("plant sitter", "plant_sitter"),
    ("handyman", "handyman"),
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TODAY = BASE_DAY  # a Monday; the sandbox clock starts at 09:00


class HomeBuilder:
    """Builds a home world: rooms and devices with sequential ids."""

    def __init__(self, rng: random.Random, rooms: list[str], pin: str | None = None) -> None:
        self.rng = rng
        self.rooms: list[dict[str, Any]] = [
            {
                "name": r,
                "floor": 0
                if r in ("Kitchen", "Hallway", "Garage", "Living Room")
                else rng.choice([0, 1]),
            }
            for r in rooms
        ]
        self.devices: list[dict[str, Any]] = []
        self.pin = pin or f"{rng.randint(1000, 9999)}"
        self._n = 600

    def _id(self) -> str:
        self._n += 1
        return f"d_{self._n}"

    def _room(self, room: str) -> None:
        if room not in [r["name"] for r in self.rooms]:
            self.rooms.append({"name": room, "floor": 0})

    def light(self, room: str, *, on: bool | None = None, online: bool = True) -> dict[str, Any]:
        self._room(room)
        taken = {d["name"] for d in self.devices}
        kind = next(
            k for k in self.rng.sample(LIGHT_KINDS, len(LIGHT_KINDS)) if f"{room} {k}" not in taken
        )
        d = {
            "id": self._id(),
            "name": f"{room} {kind}",
            "room": room,
            "type": "light",
            "online": online,
            "on": self.rng.random() < 0.5 if on is None else on,
            "brightness": self.rng.choice([30, 50, 70, 100]),
            "color": "warm",
        }
        self.devices.append(d)
        return d

    def thermostat(
        self, room: str, *, mode: str = "heat", current: float | None = None
    ) -> dict[str, Any]:
        self._room(room)
        cur = (
            current
            if current is not None
            else self.rng.choice([18.0, 18.5, 19.0, 19.5, 20.0, 20.5, 21.0])
        )
        d = {
            "id": self._id(),
            "name": f"{room} Thermostat",
            "room": room,
            "type": "thermostat",
            "online": True,
            "mode": mode,
            "target_c": self.rng.choice([19.0, 20.0, 21.0]),
            "current_c": cur,
            "min_c": 10.0,
            "max_c": 30.0,
        }
        self.devices.append(d)
        return d

    def lock(
        self, name: str, room: str, *, locked: bool = False, jammed: bool = False
    ) -> dict[str, Any]:
        self._room(room)
        d = {
            "id": self._id(),
            "name": name,
            "room": room,
            "type": "lock",
            "online": True,
            "locked": locked,
            "jammed": jammed,
            "battery": self.rng.randint(35, 100),
        }
        self.devices.append(d)
        return d

    def camera(self, name: str, room: str = "Hallway", *, online: bool = True) -> dict[str, Any]:
        self._room(room)
        d = {
            "id": self._id(),
            "name": name,
            "room": room,
            "type": "camera",
            "online": online,
            "recording": False,
            "motion_alerts": True,
        }
        self.devices.append(d)
        return d

    def plug(self, name: str, room: str) -> dict[str, Any]:
        self._room(room)
        d = {
            "id": self._id(),
            "name": name,
            "room": room,
            "type": "plug",
            "online": True,
            "on": self.rng.random() < 0.5,
        }
        self.devices.append(d)
        return d

    def state(self, **extra: Any) -> dict[str, Any]:
        state: dict[str, Any] = {
            "rooms": self.rooms,
            "devices": self.devices,
            "scenes": [],
            "camera_events": [],
            "guest_codes": [],
            "security": {"mode": "disarmed", "changed": None},
            "settings": {"pin": self.pin},
        }
        state.update(extra)
        return state


def furnish(b: HomeBuilder, rooms: list[str], lights: tuple[int, int] = (1, 2)) -> None:
    for room in rooms:
        for _ in range(b.rng.randint(*lights)):
            b.light(room)


def relative_day(offset: int) -> str:
    if offset == 1:
        return "tomorrow"
    return "on " + WEEKDAYS[(TODAY + timedelta(days=offset)).weekday()]


# --------------------------------------------------------------------------- templates


@template(domain="smart_home", capabilities=["tool_use"], apps=["home"], difficulty=1)
def room_lights_brightness(g: TaskGen) -> Any:
    rooms = g.fake.pick(ROOMS, 5)
    b = HomeBuilder(g.rng, rooms)
    furnish(b, rooms[1:])
    room = rooms[0]
    mine = [b.light(room, on=False), b.light(room, on=False)]
    if g.rng.random() < 0.4:
        mine.append(b.light(room, on=False, online=False))
    b.thermostat(g.rng.choice(rooms))
    level = g.rng.choice(range(10, 101, 5))
    others_on = sum(1 for d in b.devices if d["type"] == "light" and d["room"] != room and d["on"])
    online = [d for d in mine if d["online"]]
    return g.task(
        instruction=f"Turn on the {room} lights at {level}% brightness.",
        world={"home": b.state()},
        checks=[
            *(
                Check(
                    name=f"{d['name']} on at {level}%",
                    target="home.devices",
                    where={"id": d["id"], "on": True, "brightness": level},
                )
                for d in online
            ),
            Check(
                name="other rooms untouched",
                target="home.devices",
                op="count",
                where={"type": "light", "room__ne": room, "on": True},
                expect=others_on,
            ),
        ],
        plan=[
            ToolCall(
                tool="home_set_room_lights",
                arguments={"room": room, "on": True, "brightness": level},
            ),
            Finish(),
        ],
    )


@template(domain="smart_home", capabilities=["skills", "tool_use"], apps=["home"], difficulty=2)
def thermostat_out_of_eco(g: TaskGen) -> Any:
    rooms = g.fake.pick(ROOMS, 5)
    b = HomeBuilder(g.rng, rooms)
    furnish(b, rooms)
    room = rooms[0]
    current = g.rng.choice([17.0, 18.5, 19.0, 20.5, 22.0, 23.5])
    device = b.thermostat(room, mode="eco", current=current)
    b.thermostat(rooms[1], mode=g.rng.choice(["heat", "eco"]))
    target = g.rng.choice(
        [t / 2 for t in range(32, 53) if t / 2 not in (current, device["target_c"])]
    )
    mode = "heat" if target > current else "cool"
    return g.task(
        instruction=f"Set the {room} thermostat to {target:g}°C.",
        world={"home": b.state()},
        checks=[
            Check(
                name="target set and mode active",
                target="home.devices",
                where={
                    "id": device["id"],
                    "target_c": target,
                    "mode__in": ["heat", "cool", "auto"],
                },
            ),
        ],
        plan=[
            ToolCall(tool="home_list_devices", arguments={"room": room, "type": "thermostat"}),
            ToolCall(
                tool="home_set_thermostat_mode", arguments={"device_id": "${0.0.id}", "mode": mode}
            ),
            ToolCall(
                tool="home_set_thermostat", arguments={"device_id": "${0.0.id}", "target_c": target}
            ),
            Finish(),
        ],
    )


@template(domain="smart_home", capabilities=["memory", "tool_use"], apps=["home"], difficulty=3)
def bedtime_routine_from_memory(g: TaskGen) -> Any:
    rooms = ["Bedroom", *g.fake.pick([r for r in ROOMS if r != "Bedroom"], 4)]
    b = HomeBuilder(g.rng, rooms)
    furnish(b, rooms)
    room = g.rng.choice(rooms[1:])
    for _ in range(2 - sum(1 for d in b.devices if d["room"] == room)):
        b.light(room)
    for d in b.devices:
        if d["room"] == room:
            d["on"] = True
    thermo = b.thermostat("Bedroom", mode="heat")
    b.thermostat(rooms[1], mode="heat")
    doors = [b.lock(n, r, locked=g.rng.random() < 0.3) for n, r in g.fake.pick(LOCKS, 3)]
    door_i = g.rng.randrange(len(doors))
    door = doors[door_i]
    door["locked"] = False
    temps = g.rng.sample(["17", "17.5", "18", "18.5", "19", "19.5", "16.5"], 3)
    memory = conflicting_memory(
        g.rng, "bedtime_temperature", f"{temps[0]} °C", [f"{t} °C" for t in temps[1:]]
    )
    right = float(temps[0])
    opener = g.rng.choice(["Bedtime:", "I'm going to bed.", "Good night routine:"])
    return g.task(
        instruction=(
            f"{opener} set the bedroom to my usual night temperature, switch off the "
            f"{room} lights and lock the {door['name'].lower()}."
        ),
        world={"home": b.state()},
        memory=memory,
        checks=[
            Check(
                name="bedroom at the usual night temperature",
                target="home.devices",
                where={"id": thermo["id"], "target_c": right},
            ),
            Check(
                name=f"{room} lights off",
                target="home.devices",
                op="absent",
                where={"room": room, "type": "light", "on": True},
            ),
            Check(
                name="door locked", target="home.devices", where={"id": door["id"], "locked": True}
            ),
        ],
        plan=[
            ToolCall(tool="home_list_devices", arguments={"room": "Bedroom", "type": "thermostat"}),
            ToolCall(
                tool="home_set_thermostat", arguments={"device_id": "${0.0.id}", "target_c": right}
            ),
            ToolCall(tool="home_set_room_lights", arguments={"room": room, "on": False}),
            ToolCall(tool="home_list_devices", arguments={"type": "lock"}),
            ToolCall(tool="home_lock", arguments={"device_id": f"${{3.{door_i}.id}}"}),
            Finish(),
        ],
    )


@template(domain="smart_home", capabilities=["skills"], apps=["home"], difficulty=4)
def away_mode_scene(g: TaskGen) -> Any:
    rooms = g.fake.pick(ROOMS, 4)
    b = HomeBuilder(g.rng, rooms)
    furnish(b, rooms, (1, 2))
    for d in g.rng.sample([d for d in b.devices if d["type"] == "light"], 2):
        d["on"] = True
    thermos = [b.thermostat(r, mode="heat") for r in g.fake.pick(rooms, g.rng.randint(1, 2))]
    locks = [
        b.lock(n, r, locked=g.rng.random() < 0.3)
        for n, r in g.fake.pick(LOCKS, g.rng.randint(2, 3))
    ]
    locks[0]["locked"] = False
    jammed = g.rng.random() < 0.5
    if jammed:
        g.rng.choice(locks)["jammed"] = True
    b.plug("Coffee Maker Plug", "Kitchen")
    b.camera(g.rng.choice(CAMERAS))
    lights = [d for d in b.devices if d["type"] == "light"]
    existing = [
        {
            "id": "sc_1",
            "name": "Movie Night",
            "last_run": None,
            "actions": [{"device_id": lights[0]["id"], "command": "on", "value": None}],
        },
        {
            "id": "sc_2",
            "name": "Good Morning",
            "last_run": "2026-03-01T07:00",
            "actions": [
                {"device_id": thermos[0]["id"], "command": "set_temperature", "value": 21.0}
            ],
        },
    ]
    actions: list[dict[str, Any]] = [{"device_id": d["id"], "command": "lock"} for d in locks]
    actions += [{"device_id": d["id"], "command": "set_mode", "value": "eco"} for d in thermos]
    actions += [{"device_id": d["id"], "command": "off"} for d in lights]
    plan = PlanBuilder()
    plan.call("home_list_devices")
    for d in locks:
        if d["jammed"]:
            plan.call("home_recalibrate_lock", device_id=d["id"])
    scene = plan.call("home_create_scene", name="Away", actions=actions)
    plan.call("home_run_scene", scene_id=f"${{{scene}.id}}")
    plan.call("home_set_security", mode="away", pin=b.pin)
    plan.add(Finish())
    span = g.rng.choice(
        ["the weekend", "three days", "a week", "two weeks", "the night", "five days"]
    )
    why = g.rng.choice(["a work trip to", "a family visit in", "a holiday in", "a conference in"])
    idx = len(existing)
    n_locks, n_thermos = len(locks), len(thermos)
    return g.task(
        instruction=(
            f"I'm leaving for {span} ({why} {g.rng.choice(CITIES)}). Put the house in away "
            f"mode; the alarm PIN is {b.pin}."
        ),
        world={"home": b.state(scenes=existing)},
        checks=[
            Check(
                name="Away scene created and run",
                target="home.scenes",
                where={"name": "Away", "last_run__ne": None},
            ),
            Check(
                name="scene locks first",
                op="equals",
                target=f"home.scenes.{idx}.actions.0.command",
                expect="lock",
            ),
            Check(
                name="then thermostats to eco",
                op="equals",
                target=f"home.scenes.{idx}.actions.{n_locks}.value",
                expect="eco",
            ),
            Check(
                name="lights off last",
                op="equals",
                target=f"home.scenes.{idx}.actions.{n_locks + n_thermos + len(lights) - 1}.command",
                expect="off",
            ),
            Check(
                name="all doors locked",
                target="home.devices",
                op="absent",
                where={"type": "lock", "locked": False},
            ),
            Check(
                name="thermostats in eco",
                target="home.devices",
                op="absent",
                where={"type": "thermostat", "mode__ne": "eco"},
            ),
            Check(
                name="lights off",
                target="home.devices",
                op="absent",
                where={"type": "light", "on": True},
            ),
            Check(
                name="security armed away", op="equals", target="home.security.mode", expect="away"
            ),
        ],
        plan=plan.steps,
        difficulty=5 if jammed else 4,
    )


@template(
    domain="smart_home",
    capabilities=["memory", "tool_use"],
    apps=["home", "contacts", "messaging"],
    difficulty=3,
)
def guest_code_from_memory(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 7)
    right, wrong1, wrong2 = people[0], people[1], people[2]
    role, key = g.rng.choice(ROLES)
    memory = conflicting_memory(g.rng, key, right["name"], [wrong1["name"], wrong2["name"]])
    offset = g.rng.randint(1, 6)
    day = (TODAY + timedelta(days=offset)).date().isoformat()
    h1 = g.rng.randint(7, 15)
    h2 = h1 + g.rng.randint(1, 4)
    code = f"{g.rng.randint(100000, 999999)}"
    valid_from, valid_until = f"{day}T{h1:02d}:00", f"{day}T{h2:02d}:00"
    pin = f"{g.rng.randint(1000, 9999)}"
    while pin in f"{code} {day} {h1}:00-{h2}:00":
        pin = f"{g.rng.randint(1000, 9999)}"
    b = HomeBuilder(g.rng, g.fake.pick(ROOMS, 4), pin=pin)
    doors = [b.lock(n, r, locked=True) for n, r in g.fake.pick(LOCKS, 2)]
    door_i = g.rng.randrange(2)
    door = doors[door_i]
    furnish(b, [r["name"] for r in b.rooms][:3])
    text = f"Your code for the {door['name'].lower()} is {code}, valid {day} {h1}:00-{h2}:00."
    return g.task(
        instruction=(
            f"Give my {role} access to the {door['name'].lower()} {relative_day(offset)} from "
            f"{h1}:00 to {h2}:00 with the code {code}, and text them the code."
        ),
        world={"home": b.state(), "contacts": {"contacts": people}, "messaging": {"messages": []}},
        memory=memory,
        checks=[
            Check(
                name="guest code for the right person",
                target="home.guest_codes",
                where={
                    "lock_id": door["id"],
                    "guest_name": right["name"],
                    "code": code,
                    "valid_from": valid_from,
                    "valid_until": valid_until,
                    "active": True,
                },
            ),
            texted("code texted to them", {"to": right["phone"], "text__contains": code}),
            Check(
                name="no text to the others",
                target="messaging.messages",
                op="absent",
                where={"to__in": [wrong1["phone"], wrong2["phone"]]},
            ),
            Check(
                name="master PIN never shared",
                target="messaging.messages",
                op="absent",
                where={"text__contains": b.pin},
            ),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": right["name"]}),
            ToolCall(tool="home_list_devices", arguments={"type": "lock"}),
            ToolCall(
                tool="home_create_guest_code",
                arguments={
                    "lock_id": f"${{1.{door_i}.id}}",
                    "guest_name": right["name"],
                    "code": code,
                    "valid_from": valid_from,
                    "valid_until": valid_until,
                },
            ),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": text}),
            Finish(),
        ],
    )


@template(
    domain="smart_home",
    capabilities=["skills", "tool_use"],
    apps=["home", "contacts", "messaging"],
    difficulty=3,
)
def jammed_lock_then_notify(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 7)
    person = g.rng.choice(people)
    b = HomeBuilder(g.rng, g.fake.pick(ROOMS, 4))
    furnish(b, [r["name"] for r in b.rooms])
    doors = [b.lock(n, r, locked=g.rng.random() < 0.5) for n, r in g.fake.pick(LOCKS, 3)]
    door_i = g.rng.randrange(3)
    door = doors[door_i]
    door.update({"locked": False, "jammed": True})
    text = g.rng.choice(["The {d} is locked now.", "Locked the {d}, all good.", "{D} is locked."])
    text = text.format(d=door["name"].lower(), D=door["name"])
    return g.task(
        instruction=f"Lock the {door['name'].lower()} and text {person['name']} that it's locked.",
        world={"home": b.state(), "contacts": {"contacts": people}, "messaging": {"messages": []}},
        checks=[
            Check(
                name="door locked",
                target="home.devices",
                where={"id": door["id"], "locked": True, "jammed": False},
            ),
            texted("person told", {"to": person["phone"], "text__icontains": "locked"}),
            texts_sent(1, "one text"),
        ],
        plan=[
            ToolCall(tool="home_list_devices", arguments={"type": "lock"}),
            ToolCall(tool="home_recalibrate_lock", arguments={"device_id": f"${{0.{door_i}.id}}"}),
            ToolCall(tool="home_lock", arguments={"device_id": f"${{0.{door_i}.id}}"}),
            ToolCall(tool="contacts_search", arguments={"query": person["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${3.0.phone}", "text": text}),
            Finish(),
        ],
    )


@template(domain="smart_home", capabilities=["subagent", "tool_use"], apps=["home"], difficulty=4)
def sweep_three_rooms(g: TaskGen) -> Any:
    rooms = g.fake.pick(ROOMS, 5)
    chosen = rooms[:3]
    b = HomeBuilder(g.rng, rooms)
    temps = g.rng.sample([18.5, 19.5, 20.5, 21.5, 22.5, 23.5], 3)
    for room, temp in zip(chosen, temps, strict=True):
        b.thermostat(room, current=temp)
        for _ in range(g.rng.randint(1, 3)):
            b.light(room)
        b.light(room, on=True)
    furnish(b, rooms[3:])
    for d in b.devices:
        if d["room"] in rooms[3:] and d["type"] == "light":
            d["on"] = True
    others_on = sum(1 for d in b.devices if d["type"] == "light" and d["room"] not in chosen)
    plan = PlanBuilder()
    parts = []
    for room, temp in zip(chosen, temps, strict=True):
        plan.add(
            Delegate(
                goal=f"In the {room}: switch off every light that is on; report the temperature.",
                tools=["home_list_devices", "home_set_light"],
                agent=f"room_{room.lower().replace(' ', '_')}",
            )
        )
        listed = plan.call("home_list_devices", room=room)
        in_room = [d for d in b.devices if d["room"] == room]
        for i, d in enumerate(in_room):
            if d["type"] == "light" and d["on"]:
                plan.call("home_set_light", device_id=f"${{{listed}.{i}.id}}", on=False)
        plan.add(Finish(answer=f"{room}: {temp} °C"))
        parts.append(f"{temp}")
    plan.add(Finish(answer="; ".join(f"{r}: {t} °C" for r, t in zip(chosen, temps, strict=True))))
    return g.task(
        instruction=(
            f"Check the {chosen[0]}, {chosen[1]} and {chosen[2]}: switch off any lights left "
            "on there and tell me the current temperature in each."
        ),
        world={"home": b.state()},
        checks=[
            *(
                Check(
                    name=f"{room} lights off",
                    target="home.devices",
                    op="absent",
                    where={"room": room, "type": "light", "on": True},
                )
                for room in chosen
            ),
            Check(
                name="other rooms untouched",
                target="home.devices",
                op="count",
                where={"type": "light", "room__in": rooms[3:], "on": True},
                expect=others_on,
            ),
        ],
        answer="|".join(parts),
        answer_match="all_of",
        plan=plan.steps,
    )


@template(domain="smart_home", capabilities=["subagent", "tool_use"], apps=["home"], difficulty=4)
def camera_people_sweep(g: TaskGen) -> Any:
    rooms = g.fake.pick(ROOMS, 3)
    b = HomeBuilder(g.rng, rooms)
    names = g.fake.pick(CAMERAS, 5)
    cams = [b.camera(n, g.rng.choice(rooms)) for n in names]
    chosen = cams[:3]
    hour = g.rng.randint(0, 6)
    after = f"2026-03-02T{hour:02d}:00"
    seen = [True, False, g.rng.random() < 0.5]
    g.rng.shuffle(seen)
    events: list[dict[str, Any]] = []

    def event(cam: dict[str, Any], kind: str, time: str) -> None:
        events.append(
            {
                "id": f"ev_{700 + len(events)}",
                "camera_id": cam["id"],
                "kind": kind,
                "time": time,
                "description": f"{kind} detected by {cam['name']}",
            }
        )

    def moment(lo: int, hi: int) -> str:
        minutes = g.rng.randint(lo, hi)
        return (TODAY + timedelta(minutes=minutes)).isoformat(timespec="minutes")

    counts = []
    for cam, saw in zip(chosen, seen, strict=True):
        n = g.rng.randint(1, 3) if saw else 0
        for _ in range(n):
            event(cam, "person", moment(hour * 60 + 1, 8 * 60 + 50))
        event(
            cam, g.rng.choice(["motion", "package", "vehicle"]), moment(hour * 60 + 1, 8 * 60 + 50)
        )
        event(cam, "person", moment(-600, hour * 60 - 1))
        counts.append(n)
    for cam in cams[3:]:
        event(cam, "person", moment(hour * 60 + 1, 8 * 60 + 50))
    plan = PlanBuilder()
    for cam, n in zip(chosen, counts, strict=True):
        plan.add(
            Delegate(
                goal=f"Count people detected by the {cam['name']} since {after}.",
                tools=["home_camera_events"],
                agent=f"cam_{cam['id']}",
            )
        )
        plan.call("home_camera_events", camera_id=cam["id"], kind="person", after=after)
        plan.add(Finish(answer=f"{cam['name']}: {n} people"))
    hits = [c for c, n in zip(chosen, counts, strict=True) if n]
    misses = [c for c, n in zip(chosen, counts, strict=True) if not n]
    for cam in hits:
        plan.call("home_set_camera", device_id=cam["id"], recording=True)
    plan.add(Finish(answer="People seen by: " + ", ".join(c["name"] for c in hits)))
    return g.task(
        instruction=(
            f"Check the {chosen[0]['name']}, {chosen[1]['name']} and {chosen[2]['name']} for "
            f"people detected since {hour}:00 this morning. Start recording on each one that "
            "saw someone and tell me which ones did."
        ),
        world={"home": b.state(camera_events=events)},
        checks=[
            *(
                Check(
                    name=f"{c['name']} recording",
                    target="home.devices",
                    where={"id": c["id"], "recording": True},
                )
                for c in hits
            ),
            Check(
                name="no recording where nobody was seen",
                target="home.devices",
                op="absent",
                where={"id__in": [c["id"] for c in misses + cams[3:]], "recording": True},
            ),
        ],
        answer="|".join(c["name"] for c in hits),
        answer_match="all_of",
        plan=plan.steps,
    )
