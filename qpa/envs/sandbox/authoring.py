"""Helpers for task-template authors: what several template modules share.

Templates import shared helpers from here (and world builders from `worldgen`), never from each
other. Everything draws from the task's seeded `random.Random`, so `(template, seed)` still
fixes the task; note that the order of the draws is part of each helper's contract (changing it
changes every task built with the helper).

- plans: `ref`, `near`, `PlanBuilder` (step indexes for `${i.path}` references).
- memory: the winner rule (`EVIDENCE_RANK`, `memory_winner`: strongest evidence, then newest)
  and builders of conflicting or stale memories that resolve to the right value: `remembered`,
  `conflicting_pair`, `conflicting_memory`, `recall`; `side_memory` and `past_time`.
- people and pools: `contacts_world`, `phone_book`, `card_pool`, `ADDRESSES`.
- phrasing: `day_phrase`.
- checks shared by domains: `texted`, `texts_sent` (the messaging app's outbox).
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from typing import Any, get_args

from qpa.contract import Action, Check, Delegate, Evidence, Finish, MemoryItem, ToolCall
from qpa.envs.sandbox.engine import DEFAULT_START
from qpa.envs.sandbox.worldgen import Faker

# --------------------------------------------------------------------------- plans


def ref(step: int, path: str = "") -> str:
    """A `${step.path}` reference to the observation of an earlier plan step."""
    return "${" + f"{step}{'.' + path if path else ''}" + "}"


def near(field: str, value: float, tol: float = 0.006) -> dict[str, float]:
    """`where` conditions matching a money value to the cent (robust to float noise)."""
    return {f"{field}__gte": round(value - tol, 4), f"{field}__lte": round(value + tol, 4)}


class PlanBuilder:
    """A reference plan under construction; each method returns the new step's index, for
    `${i.path}` references (`ref(i, path)`)."""

    def __init__(self) -> None:
        self.steps: list[Action] = []

    def add(self, action: Action) -> int:
        self.steps.append(action)
        return len(self.steps) - 1

    def call(self, tool: str, **arguments: Any) -> int:
        return self.add(ToolCall(tool=tool, arguments=arguments))

    def delegate(self, goal: str, tools: list[str], agent: str) -> int:
        return self.add(Delegate(goal=goal, tools=tools, agent=agent))

    def finish(self, answer: str | None = None) -> list[Action]:
        """Append `Finish(answer)` and return the plan (also closes a sub-agent's part)."""
        self.add(Finish(answer=answer))
        return self.steps


# --------------------------------------------------------------------------- memory

EVIDENCE: tuple[Evidence, ...] = get_args(Evidence)  # strongest first
EVIDENCE_RANK: dict[str, int] = {e: len(EVIDENCE) - 1 - i for i, e in enumerate(EVIDENCE)}
_WEAKER = {"stated": ["confirmed", "observed", "inferred"], "confirmed": ["observed", "inferred"]}
NOISE_MEMORY = [
    ("coffee_order", "oat flat white"),
    ("home_city", "Portland"),
    ("preferred_airline", "Harbor Air"),
    ("dietary", "vegetarian"),
    ("gym_days", "Tuesday and Thursday"),
    ("partner_name", "Sam"),
    ("news_source", "Morning Brief"),
]
SIDE_MEMORY = [
    ("diet", "vegetarian"),
    ("seat_preference", "aisle"),
    ("music", "jazz in the car"),
    ("language", "English"),
    ("coffee_order", "flat white"),
    ("hotel_floor", "high floor"),
]


def memory_winner(items: list[MemoryItem], key: str) -> str:
    """The value a careful agent uses: strongest evidence first, then the newest."""
    rows = [m for m in items if m.key == key]
    return max(rows, key=lambda m: (EVIDENCE_RANK[m.evidence], m.time)).value


def _resolved(items: list[MemoryItem], key: str, right: str) -> list[MemoryItem]:
    assert memory_winner(items, key) == right, "memory scenario must resolve to the right value"
    return items


def _last_year_and_this(rng: random.Random) -> tuple[datetime, datetime]:
    """An older moment (March-November 2025) and a newer one (January-February 2026)."""
    older = datetime(2025, rng.randint(3, 11), rng.randint(1, 28), rng.randint(8, 20))
    newer = datetime(2026, rng.randint(1, 2), rng.randint(1, 27), rng.randint(8, 20))
    return older, newer


def _days_before_start(rng: random.Random, lo_days: int, hi_days: int) -> datetime:
    """A moment `lo_days..hi_days` days before the sandbox's start (2026-03-02 09:00)."""
    return DEFAULT_START - timedelta(days=rng.randint(lo_days, hi_days), hours=rng.randint(0, 12))


def remembered(
    rng: random.Random, key: str, right: str, wrong: str, source: str = "history"
) -> list[MemoryItem]:
    """Two conflicting memories for one key; `right` wins by stronger evidence or, at equal
    evidence, by being newer (the other one is stale)."""
    older, newer = _last_year_and_this(rng)
    if rng.random() < 0.5:
        strong = rng.randint(0, 2)
        weak = rng.randint(strong + 1, 3)
        items = [
            MemoryItem(key=key, value=right, evidence=EVIDENCE[strong], source=source, time=older),
            MemoryItem(key=key, value=wrong, evidence=EVIDENCE[weak], source=source, time=newer),
        ]
    else:
        evidence = rng.choice(EVIDENCE)
        items = [
            MemoryItem(key=key, value=wrong, evidence=evidence, source=source, time=older),
            MemoryItem(key=key, value=right, evidence=evidence, source=source, time=newer),
        ]
    rng.shuffle(items)
    return _resolved(items, key, right)


def conflicting_pair(
    rng: random.Random, key: str, right: str, wrong: str, *, source: str = "chat"
) -> list[MemoryItem]:
    """Two memories for one key where `right` must win (the maps/rides/travel variant of
    `remembered`: the weaker distractor comes from app usage).

    Either `right` has stronger evidence but is older (the newer, weaker one is a distractor),
    or both have the same evidence and `right` is newer (the older one is stale).
    """
    weakest_first = EVIDENCE[::-1]
    older, newer = _last_year_and_this(rng)
    if rng.random() < 0.5:
        high = rng.randint(1, 3)
        low = rng.randint(0, high - 1)
        items = [
            MemoryItem(
                key=key, value=right, evidence=weakest_first[high], source=source, time=older
            ),
            MemoryItem(
                key=key, value=wrong, evidence=weakest_first[low], source="usage", time=newer
            ),
        ]
    else:
        same = rng.choice(weakest_first)
        items = [
            MemoryItem(key=key, value=right, evidence=same, source=source, time=newer),
            MemoryItem(key=key, value=wrong, evidence=same, source=source, time=older),
        ]
    rng.shuffle(items)
    return _resolved(items, key, right)


def conflicting_memory(
    rng: random.Random, key: str, right: str, wrong: list[str], *, noise: int = 2
) -> list[MemoryItem]:
    """Memory where `key` has conflicting or stale values (one or two wrong ones) and `right` is
    the one to use, plus `noise` unrelated memories.

    Scenarios: the right value has stronger evidence but is older than a weakly supported newer
    one; or equal evidence and the right value is simply newer (the other is stale); or both.
    """
    scenario = rng.choice(["stronger_older", "newer_same", "mixed"])
    items: list[MemoryItem] = []

    def add(value: str, evidence: str, lo: int, hi: int, source: str = "user") -> None:
        item = MemoryItem(
            key=key,
            value=value,
            evidence=evidence,
            source=source,
            time=_days_before_start(rng, lo, hi),
        )
        items.append(item)

    if scenario == "stronger_older":
        ev = rng.choice(["stated", "confirmed"])
        add(right, ev, 60, 150)
        add(wrong[0], rng.choice(_WEAKER[ev]), 2, 40, "inferred_from_activity")
    elif scenario == "newer_same":
        ev = rng.choice(["stated", "confirmed", "observed"])
        add(right, ev, 2, 40)
        add(wrong[0], ev, 90, 300)
    else:
        add(right, "confirmed", 20, 50)
        add(wrong[0], "confirmed", 120, 300)
        add(wrong[-1], rng.choice(["observed", "inferred"]), 1, 10, "inferred_from_activity")
    for nkey, nvalue in rng.sample(NOISE_MEMORY, noise):
        items.append(
            MemoryItem(
                key=nkey, value=nvalue, evidence="stated", time=_days_before_start(rng, 5, 200)
            )
        )
    rng.shuffle(items)
    return _resolved(items, key, right)


def recall(
    rng: random.Random,
    key: str,
    right: str,
    wrong: str,
    *,
    noise: list[tuple[str, str]] | None = None,
) -> list[MemoryItem]:
    """Memory about `key` with conflicting or stale evidence whose winner is `right`, plus the
    given `noise` memories.

    Scenarios: a strong old item against a weaker new one, two equally strong items where the
    newer wins, or a weak stale item and a strong recent one.
    """
    scenario = rng.choice(["strong_old", "same_newer", "strong_new"])
    early = datetime(2025, rng.randint(6, 10), rng.randint(1, 28), 12, 0)
    late = datetime(2026, rng.randint(1, 2), rng.randint(1, 27), 12, 0)
    if scenario == "strong_old":
        ev_right = rng.choice(["stated", "confirmed"])
        ev_wrong = rng.choice(["observed", "inferred"])
        t_right, t_wrong = early, late
    elif scenario == "same_newer":
        ev_right = ev_wrong = rng.choice(["stated", "confirmed", "observed"])
        t_right, t_wrong = late, early
    else:
        ev_right = rng.choice(["stated", "confirmed"])
        ev_wrong = rng.choice(["observed", "inferred"])
        t_right, t_wrong = late, early
    items = [
        MemoryItem(key=key, value=right, evidence=ev_right, source="chat", time=t_right),
        MemoryItem(key=key, value=wrong, evidence=ev_wrong, source="usage", time=t_wrong),
    ]
    for other_key, value in noise or []:
        items.append(MemoryItem(key=other_key, value=value, evidence="confirmed", source="chat"))
    rng.shuffle(items)
    return _resolved(items, key, right)


def side_memory(rng: random.Random) -> MemoryItem:
    """An unrelated memory, so the relevant one has to be picked out."""
    key, value = rng.choice(SIDE_MEMORY)
    return MemoryItem(key=key, value=value, evidence="stated", source="chat")


def past_time(rng: random.Random, *, max_days: int = 14, min_minutes: int = 30) -> str:
    """An ISO minute before the sandbox start (2026-03-02T09:00)."""
    minutes = rng.randint(min_minutes, max_days * 24 * 60)
    return (DEFAULT_START - timedelta(minutes=minutes)).isoformat(timespec="minutes")


# --------------------------------------------------------------------------- people and pools

CONTACT_GROUPS = ["family", "work", "friends", "gym"]
FRIEND_GROUPS = ["family", "work", "friends"]


def contacts_world(
    fake: Faker,
    n: int = 8,
    *,
    first_id: int = 100,
    favorite_rate: float = 0.2,
    unique_phones: bool = False,
    groups: list[str] = CONTACT_GROUPS,
) -> list[dict[str, Any]]:
    """`n` contacts records (the `contacts` app's schema) with ids `c_<first_id>`, ...; each is a
    favorite with probability `favorite_rate` (no draw at all when it is 0)."""
    people: list[dict[str, Any]] = []
    phones: set[str] = set()
    for i in range(n):
        name = fake.name()
        phone = fake.phone()
        while unique_phones and phone in phones:
            phone = fake.phone()
        phones.add(phone)
        people.append(
            {
                "id": f"c_{first_id + i}",
                "name": name,
                "phone": phone,
                "email": fake.email(name),
                "address": fake.address(),
                "favorite": favorite_rate > 0 and fake.rng.random() < favorite_rate,
                "groups": fake.pick(groups, 1),
            }
        )
    return people


def phone_book(
    fake: Faker, n: int = 8, *, first_id: int = 100, groups: list[str] = CONTACT_GROUPS
) -> list[dict[str, Any]]:
    """Contacts with distinct phone numbers and no favorites: where a phone number identifies
    the person (payments, ETA sharing, texting a driver's plate)."""
    return contacts_world(
        fake, n, first_id=first_id, favorite_rate=0.0, unique_phones=True, groups=groups
    )


def card_pool(rng: random.Random, n: int, prefix: str = "pm") -> list[dict[str, Any]]:
    """Saved cards with distinct, human-readable labels ('Visa ending 4242')."""
    brands = rng.sample(["Visa", "Mastercard", "Amex", "Discover"], n)
    digits = rng.sample(range(1000, 10000), n)
    return [
        {
            "id": f"{prefix}_{i + 1}",
            "label": f"{brand} ending {last4}",
            "brand": brand,
            "last4": str(last4),
            "status": "active",
            "available": float(rng.choice([800, 1200, 2500, 5000])),
        }
        for i, (brand, last4) in enumerate(zip(brands, digits, strict=True))
    ]


ADDRESSES = [
    {"id": "addr_1", "label": "home", "address": "12 Harbor Street"},
    {"id": "addr_2", "label": "work", "address": "400 Market Avenue"},
    {"id": "addr_3", "label": "gym", "address": "88 River Road"},
    {"id": "addr_4", "label": "parents'", "address": "5 Cedar Lane"},
]


# --------------------------------------------------------------------------- phrasing


def day_phrase(day: date | str) -> str:
    """'Tuesday, March 3' for a date, a datetime or an ISO day."""
    moment = date.fromisoformat(day) if isinstance(day, str) else day
    return f"{moment:%A}, {moment:%B} {moment.day}"


# --------------------------------------------------------------------------- checks


def texted(name: str, where: dict[str, Any]) -> Check:
    """A text message matching `where` is in the messaging app (`to`, `text__contains`, ...)."""
    return Check(name=name, target="messaging.messages", where=where)


def texts_sent(expect: int, name: str) -> Check:
    """The user sent exactly `expect` text messages."""
    return Check(
        name=name, target="messaging.messages", op="count", where={"sender": "me"}, expect=expect
    )
