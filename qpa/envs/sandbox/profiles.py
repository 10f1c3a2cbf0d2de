"""World profiles: how full the phone is. `default` is the task's own world (a dozen records an
app); `phone` fills every app the task uses to a real phone's sizes, from the task's seed.

The filler is made of near-duplicates of the task's own records: each clone round copies every
record of a filled collection with new ids, people with the same first name and another last
name (new phone numbers and addresses), titles and names with a variant word ("Red Lantern
Express"), and every reference between records (a message's sender, an event's attendees, a
menu item's restaurant, a room's hotel) mapped consistently, so the filler is a coherent
phone. A task then needs searching, paging and choosing among look-alikes. The filler never
changes what the task asks or what its checks accept:

- clones come after the task's own records, dated 2 to 26 weeks earlier, already read / done /
  out of range, and never a default or favourite;
- a clone is dearer and rated lower than every record of the task's in its collection, so
  "the cheapest", "the best rated" and "the most popular" keep their answers;
- maps places are filled (and the location history's visits, naming the clones): a route
  ranks the places in the neighbourhoods it passes, so a clone of a place in a neighbourhood a
  route of the reference plan passes is moved to one no such route passes (`_PlaceRules`);
  elsewhere it keeps its original's neighbourhood, rated below every place of the task's;
- bills are filled as last months' bills of the same billers, already paid;
- collections the user owns one of each (payment cards, accounts, addresses, calendars,
  drivers, promos, flight and hotel bookings, home devices, alarms, settings) are not filled:
  a clone there would be a second thing the task's words name ("my 7:00 alarm", "the hall
  light", "my Lisbon booking");
- a clone that any of the task's checks would match (an `exists`, `count` or `absent` where on
  its collection) is dropped, and a collection under an `equals` check is not filled.

`fill_world(task, state)` is called once per world by the environment (`base_for`), whose
frozen result every session shares.
"""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta
from typing import Any

from qpa.contract import Task, ToolCall, WorldProfile
from qpa.envs.sandbox.apps.messaging import thread_id
from qpa.envs.sandbox.geo import NEIGHBORHOODS, route_via
from qpa.envs.sandbox.verify import _field_matches
from qpa.envs.sandbox.worldgen import FIRST, LAST, STREETS

# Records per collection at the phone profile (at least; a collection the task leaves empty
# stays empty: there is nothing of the task's to make look-alikes of).
PHONE_SIZES: dict[tuple[str, str], int] = {
    ("contacts", "contacts"): 320,
    ("messaging", "messages"): 2000,
    ("email", "messages"): 1000,
    ("calendar", "events"): 200,
    ("shop", "products"): 500,
    ("shop", "orders"): 60,
    ("food", "restaurants"): 120,
    ("food", "menu"): 600,
    ("food", "orders"): 60,
    ("music", "catalog"): 1000,
    ("music", "playlists"): 40,
    ("podcasts", "shows"): 60,
    ("podcasts", "episodes"): 600,
    ("notes", "notes"): 250,
    ("notes", "folders"): 12,
    ("reminders", "reminders"): 300,
    ("reminders", "lists"): 12,
    ("hotels", "hotels"): 80,
    ("hotels", "rooms"): 240,
    ("flights", "flights"): 300,
    ("rides", "rides"): 120,
    ("wallet", "transactions"): 600,
    ("home", "camera_events"): 300,
    ("settings", "wifi_networks"): 40,
    ("settings", "bluetooth_devices"): 20,
    ("maps", "places"): 200,
    ("maps", "timeline"): 60,
    ("wallet", "bills"): 36,
}
SIZES: dict[WorldProfile, dict[tuple[str, str], int]] = {"default": {}, "phone": PHONE_SIZES}

PERSON_COLLECTIONS = {("contacts", "contacts")}
# Collections whose apps list them soonest first (and whose tasks live in the next weeks): their
# clones are dated months after the task's window instead of before it.
FUTURE = {("calendar", "events"), ("reminders", "reminders"), ("flights", "flights")}
# Collections other records refer to by name (a note's folder): their clones' names are mapped.
NAME_REFERENCED = {("notes", "folders"), ("reminders", "lists"), ("maps", "places")}
PLACES = ("maps", "places")
BILLS = ("wallet", "bills")
# Collections whose records name a map place by id: a clone naming a place that was not cloned
# (the places ran out of rounds, or the clone was dropped) is dropped too.
PLACE_REFERENCING = {("maps", "timeline")}
NAME_FIELDS = ("name", "title", "subject", "restaurant", "place_name", "hotel_name")
PRICE_FIELDS = ("price", "nightly_rate", "delivery_fee", "min_order", "fare", "amount")
RATING_FIELDS = ("rating", "popularity", "stars")
# What a filled-in record of a real phone already is: read, done, played, not connected.
QUIET: dict[str, Any] = {
    "read": True,
    "unread": False,
    "favorite": False,
    "pinned": False,
    "flagged": False,
    "starred": False,
    "default": False,
    "played": True,
    "connected": False,
    "in_range": False,
    "saved": False,
    "paired": False,
    "completed": True,
}
VARIANTS = [
    "Express", "Plus", "Classic", "Lite", "North", "Annex", "Select", "Mini", "Studio",
    "Prime", "West", "Two", "Max", "Corner", "Bay", "Park", "Square", "Loft", "Pro", "East",
]  # fmt: skip
_MOMENT = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?$")


def target_sizes(profile: WorldProfile, scale: float = 1.0) -> dict[tuple[str, str], int]:
    """The records per collection a profile fills to (`scale` multiplies them: benchmarks)."""
    return {key: max(1, round(n * scale)) for key, n in SIZES[profile].items()}


def fill_world(
    task: Task, state: dict[str, Any], *, scale: float = 1.0, profile: WorldProfile | None = None
) -> dict[str, Any]:
    """`state` (the task's world, a detached copy) filled to `task.world_profile` (or
    `profile`), deterministically from the task's seed. Mutates and returns `state`."""
    sizes = target_sizes(profile or task.world_profile, scale)
    if not sizes:
        return state
    rng = random.Random(f"{task.seed}|filler")
    blocked = _blocked(task)
    filled = [
        (app, c)
        for (app, c) in sizes
        if isinstance(state.get(app), dict)
        and isinstance(state[app].get(c), list)
        and state[app][c]
        and all(isinstance(r, dict) and "id" in r for r in state[app][c])
        and (app, c) not in blocked["equals"]
    ]
    if not filled:
        return state
    places = _PlaceRules.of(task, state) if PLACES in filled else None
    if places is not None and not places.free:
        filled.remove(PLACES)  # every neighbourhood is on a route the task ranks
        places = None
    if PLACES not in filled:
        filled = [key for key in filled if key not in PLACE_REFERENCING]
    if not filled:
        return state
    core = {key: list(state[key[0]][key[1]]) for key in filled}
    rounds = max(-(-sizes[key] // len(rows)) - 1 for key, rows in core.items())
    names = _Names(rng, state)
    ids = {str(r["id"]) for rows in core.values() for r in rows}
    bounds = {key: _bounds(rows) for key, rows in core.items()}
    for r in range(1, rounds + 1):
        mapping = _round_mapping(r, core, names, rng)
        moved = places.round(r, core[PLACES], mapping, rng) if places is not None else {}
        for key, rows in core.items():
            target = state[key[0]][key[1]]
            if len(target) >= sizes[key]:
                continue
            for row in rows:
                if len(target) >= sizes[key]:
                    break
                clone = _clone(key, row, r, mapping, rng, bounds[key])
                if key == PLACES:
                    if clone["id"] not in moved:
                        continue  # no free name for it this round
                    clone["neighborhood"] = moved[clone["id"]]
                if key in PLACE_REFERENCING and clone.get("place_id") not in ids:
                    continue
                if str(clone["id"]) in ids or _matched(blocked["where"].get(key, []), clone):
                    continue
                ids.add(str(clone["id"]))
                target.append(clone)
    return state


class _PlaceRules:
    """Where map-place clones may lie. A route ranks the places in the neighbourhoods it passes
    (`maps_search_places(along_route=...)` by detour, `maps_add_stop` accepts only them), so a
    look-alike there could be the better stop or a second "usual" one: a clone of a place in a
    neighbourhood that a route of the task's reference plan passes is moved to one no such
    route passes (its name names the new neighbourhood). Elsewhere a clone keeps its
    original's neighbourhood (rated below every place of the task's, so "the best-rated café in
    Riverside" keeps its answer). Each clone gets a new address and phone number."""

    def __init__(self, ranked: set[str], used: set[str], addresses: set[str]) -> None:
        self.ranked = ranked
        self.free = [n for n in NEIGHBORHOODS if n not in ranked]
        self.names = used
        self.addresses = addresses

    @classmethod
    def of(cls, task: Task, state: dict[str, Any]) -> _PlaceRules | None:
        """The rules for `task`'s places, or None when a route of its plan cannot be known
        before the plan runs (an address read from a tool's answer) and the plan ranks places
        along a route."""
        maps = state["maps"]
        ranked: set[str] = set()
        for action in task.reference_plan or []:
            if not isinstance(action, ToolCall) or action.tool != "maps_get_directions":
                continue
            ends = [action.arguments.get("origin"), action.arguments.get("destination")]
            if all(isinstance(e, str) and "${" not in e for e in ends):
                start, end = (_resolve_place(maps, str(e)) for e in ends)
                ranked.update(route_via(start, end))
            elif _plan_ranks(task):
                return None
        places = maps["places"]
        return cls(
            ranked,
            {str(p.get("name")) for p in places},
            {str(p.get("address", "")).lower() for p in places},
        )

    def round(
        self, r: int, rows: list[dict[str, Any]], mapping: dict[str, str], rng: random.Random
    ) -> dict[str, str]:
        """Round `r`'s clones: each one's neighbourhood by its id (a clone without one has no
        free name this round), its name, address and phone number put in `mapping`."""
        out: dict[str, str] = {}
        variant = _variant(r)
        for row in rows:
            name, hood = str(row.get("name", "")), str(row.get("neighborhood", ""))
            base = name.removesuffix(f" {hood}") if name.endswith(f" {hood}") else name
            hoods = rng.sample(self.free, len(self.free)) if hood in self.ranked else [hood]
            for candidate in hoods:
                new = f"{base} {candidate} {variant}" if base != name else f"{name} {variant}"
                if new not in self.names:
                    break
            else:
                continue
            self.names.add(new)
            mapping[name] = new
            out[mapping[str(row["id"])]] = candidate
            if isinstance(row.get("address"), str):
                mapping[row["address"]] = self._address(rng)
            if isinstance(row.get("phone"), str):
                mapping[row["phone"]] = f"+1-557-{rng.randint(1000, 9999)}-{rng.randint(10, 99)}"
        return out

    def _address(self, rng: random.Random) -> str:
        while True:
            address = f"{rng.randint(1000, 9899)} {rng.choice(STREETS)} Road"
            if address.lower() not in self.addresses:
                self.addresses.add(address.lower())
                return address


def _plan_ranks(task: Task) -> bool:
    return any(
        isinstance(a, ToolCall) and (a.tool == "maps_add_stop" or "along_route" in a.arguments)
        for a in task.reference_plan or []
    )


def _resolve_place(maps: dict[str, Any], where: str) -> str:
    """The address `maps_get_directions` resolves a label, place name or address to."""
    key = where.strip().lower()
    for label in maps.get("labels", []):
        if label.get("label") == key:
            return str(label["address"])
    for place in maps.get("places", []):
        if (
            str(place.get("name", "")).lower() == key
            or str(place.get("address", "")).lower() == key
        ):
            return str(place["address"])
    return where.strip()


def _blocked(task: Task) -> dict[str, Any]:
    equals: set[tuple[str, str]] = set()
    where: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for check in task.verifier.checks:
        parts = check.target.split(".")
        if len(parts) < 2:
            continue
        key = (parts[0], parts[1])
        if check.op == "equals" or len(parts) > 2:
            equals.add(key)
        elif check.op in ("exists", "count", "absent"):
            where.setdefault(key, []).append(check.where)
    return {"equals": equals, "where": where}


def _matched(wheres: list[dict[str, Any]], record: dict[str, Any]) -> bool:
    return any(all(_field_matches(record, k, v) for k, v in w.items()) for w in wheres)


class _Names:
    """People for clones: the same first name as the original, a last name no one in the
    world has with it; unique phone numbers (a range the task's worlds never use)."""

    def __init__(self, rng: random.Random, state: dict[str, Any]) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.phones: set[str] = set()
        for app in state.values():
            if isinstance(app, dict):
                for rows in app.values():
                    if isinstance(rows, list):
                        for r in rows:
                            if isinstance(r, dict) and isinstance(r.get("name"), str):
                                self.used.add(r["name"])

    def person(self, name: str) -> str:
        first = name.split(" ")[0] if name else self.rng.choice(FIRST)
        for _ in range(60):
            candidate = f"{first} {self.rng.choice(LAST)}"
            if candidate not in self.used:
                break
        else:  # every last name taken with this first name: a middle initial
            for _ in range(200):
                letter = self.rng.choice("ABCDEFGHJKLMNPRSTW")
                candidate = f"{first} {letter}. {self.rng.choice(LAST)}"
                if candidate not in self.used:
                    break
        self.used.add(candidate)
        return candidate

    def phone(self) -> str:
        while True:
            number = f"+1-556-{self.rng.randint(1000, 9999)}-{self.rng.randint(10, 99)}"
            if number not in self.phones:
                self.phones.add(number)
                return number


def _round_mapping(
    r: int, core: dict[tuple[str, str], list[dict[str, Any]]], names: _Names, rng: random.Random
) -> dict[str, str]:
    """Round `r`'s map from the task's identifying values (ids, people's names, phones and
    emails) to the clones': applied to every string of every clone, so references agree."""
    mapping: dict[str, str] = {}
    for (app, c), rows in core.items():
        named = (app, c) in NAME_REFERENCED
        for row in rows:
            rid = str(row["id"])
            mapping[rid] = _clone_id(rid, r)
            if named and isinstance(row.get("name"), str):
                mapping[row["name"]] = f"{row['name']} {_variant(r)}"
            if (app, c) == ("email", "messages"):
                _map_correspondent(mapping, names, r, row.get("sender"), row.get("sender_name"))
            if (app, c) in PERSON_COLLECTIONS:
                name = str(row.get("name", ""))
                person = names.person(name)
                mapping.setdefault(name, person)
                if isinstance(row.get("phone"), str):
                    mapping[row["phone"]] = names.phone()
                if isinstance(row.get("email"), str):
                    handle = person.lower().replace(". ", ".").replace(" ", ".")
                    mapping[row["email"]] = f"{handle}{r}@example.net"
                if isinstance(row.get("address"), str):
                    mapping[row["address"]] = (
                        f"{rng.randint(251, 999)} {rng.choice(STREETS)} Avenue"
                    )
    return mapping


def _map_correspondent(
    mapping: dict[str, str], names: _Names, r: int, address: Any, name: Any
) -> None:
    """An email's sender, as another person (the user's own addresses are never senders of
    the task's mail worth mapping: they stay)."""
    if not isinstance(address, str) or address in mapping or "alex.morgan" in address:
        return
    if isinstance(name, str) and name in mapping:
        person = mapping[name]
    else:
        person = names.person(name if isinstance(name, str) else "")
        if isinstance(name, str) and name:
            mapping[name] = person
    handle = person.lower().replace(". ", ".").replace(" ", ".")
    mapping[address] = f"{handle}{r}@{address.rpartition('@')[2] or 'example.net'}"


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _clone_id(rid: str, r: int) -> str:
    """`c_100` -> `c_300100` in round 3 (an id like the app's own); `primary` -> `primary_3`."""
    numbered = _NUMBERED.match(rid)
    if numbered and numbered.group(1):
        return f"{numbered.group(1)}{r * 100000 + int(numbered.group(2))}"
    return f"{rid}_{r}"


def _variant(r: int) -> str:
    return VARIANTS[(r - 1) % len(VARIANTS)] + ("" if r <= len(VARIANTS) else f" {r}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bounds(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """The lowest and highest value of each price and rating field over the task's records."""
    out: dict[tuple[str, str], float] = {}
    for field in (*PRICE_FIELDS, *RATING_FIELDS):
        values = [row[field] for row in rows if _number(row.get(field))]
        if values:
            out[(field, "min")] = min(values)
            out[(field, "max")] = max(values)
    return out


def _clone(
    key: tuple[str, str],
    row: dict[str, Any],
    r: int,
    mapping: dict[str, str],
    rng: random.Random,
    bounds: dict[tuple[str, str], float],
) -> dict[str, Any]:
    shift = timedelta(days=14 + (r * 7) % 168, hours=rng.randint(0, 9))
    if key in FUTURE:
        shift = -timedelta(days=70 + (r * 7) % 168)
    variant = _variant(r)

    def value(v: Any) -> Any:
        if isinstance(v, str):
            if v in mapping:
                return mapping[v]
            if _MOMENT.match(v):
                return _shifted(v, shift)
            return v
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [value(x) for x in v]
        return v

    clone: dict[str, Any] = {k: value(v) for k, v in row.items()}
    person = key in PERSON_COLLECTIONS
    for field in NAME_FIELDS:
        original = row.get(field)
        if isinstance(original, str) and original and not person and original not in mapping:
            clone[field] = f"{original} {variant}"
    for field in PRICE_FIELDS:  # dearer than anything of the task's
        top = bounds.get((field, "max"))
        if _number(row.get(field)) and top is not None:
            clone[field] = round(top * (1.05 + 0.01 * (r % 10)) + 1 + 0.01 * (r % 7), 2)
    for field in RATING_FIELDS:  # rated below anything of the task's
        low = bounds.get((field, "min"))
        if _number(row.get(field)) and low is not None:
            if isinstance(row[field], int):
                clone[field] = max(int(low) - 1 - r % 3, 0)
            else:
                clone[field] = round(max(low - 0.1 * (1 + r % 3), 0.0), 1)
    for field, quiet in QUIET.items():
        if field in clone and isinstance(clone[field], bool):
            clone[field] = quiet
    if key == BILLS and _number(row.get("amount_due")):  # earlier bills of the biller: paid
        clone["amount_due"] = round(row["amount_due"] * rng.uniform(0.85, 1.15), 2)
        clone["paid_amount"] = clone["amount_due"]
        clone["status"] = "paid"
    if key == ("messaging", "messages"):
        peer = clone.get("sender") if clone.get("to") == "me" else clone.get("to")
        if isinstance(peer, str):
            clone["thread"] = thread_id(peer)
    return clone


def _shifted(moment: str, shift: timedelta) -> str:
    if "T" not in moment:
        return (datetime.fromisoformat(moment) - shift).date().isoformat()
    seconds = moment.count(":") == 2
    shifted = datetime.fromisoformat(moment) - shift
    return shifted.isoformat(timespec="seconds" if seconds else "minutes")


def world_stats(state: dict[str, Any]) -> dict[str, int]:
    """Records per `app.collection` of a world (the lists only)."""
    return {
        f"{app}.{c}": len(rows)
        for app, collections in state.items()
        if isinstance(collections, dict)
        for c, rows in collections.items()
        if isinstance(rows, list)
    }
