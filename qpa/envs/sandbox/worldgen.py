"""Deterministic fake-world material for task templates: people, places, times, money.

Everything draws from a `random.Random` seeded per task, so the same (template, seed) always
builds the same world. Pools are small and static: generation must stay fast.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

FIRST = [
    "Alice", "Bruno", "Chen", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kemi", "Lena", "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara",
    "Umar", "Vera", "Wei", "Ximena", "Yusuf", "Zoe",
]  # fmt: skip
LAST = [
    "Adams", "Baker", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Huang", "Ito", "Jensen",
    "Kowalski", "Lopez", "Meyer", "Nakamura", "Okafor", "Patel", "Rossi", "Silva", "Tanaka",
    "Ueda", "Volkov", "Wright", "Young", "Zhang",
]  # fmt: skip
STREETS = ["Oak", "Maple", "Cedar", "Pine", "Elm", "Birch", "Harbor", "Lake", "Hill", "River"]
PLACES = [
    "Central Station", "City Airport", "Grand Library", "Riverside Mall", "Union Square",
    "Tech Park", "Seaside Hotel", "Old Town Museum", "Sports Arena", "Botanical Garden",
]  # fmt: skip
TOPICS = [
    "budget review", "project sync", "dentist", "team lunch", "yoga class", "1:1 with manager",
    "parent meeting", "car service", "design review", "book club", "gym session", "interview",
]  # fmt: skip
BASE_DAY = datetime(2026, 3, 2)


class Faker:
    """A seeded generator of realistic, mutually consistent records."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._used_names: set[str] = set()

    def name(self) -> str:
        for _ in range(100):
            name = f"{self.rng.choice(FIRST)} {self.rng.choice(LAST)}"
            if name not in self._used_names:
                self._used_names.add(name)
                return name
        raise RuntimeError("name pool exhausted")

    def phone(self) -> str:
        return f"+1-555-{self.rng.randint(1000, 9999)}"

    def email(self, name: str) -> str:
        return name.lower().replace(" ", ".") + "@example.com"

    def address(self) -> str:
        return f"{self.rng.randint(1, 250)} {self.rng.choice(STREETS)} Street"

    def place(self) -> str:
        return self.rng.choice(PLACES)

    def day(self, offset_max: int = 6) -> datetime:
        return BASE_DAY + timedelta(days=self.rng.randint(0, offset_max))

    def slot(self, day: datetime | None = None, *, earliest: int = 8, latest: int = 18) -> datetime:
        base = day or self.day()
        return base.replace(
            hour=self.rng.randint(earliest, latest), minute=self.rng.choice([0, 30])
        )

    def money(self, low: float, high: float) -> float:
        return round(self.rng.uniform(low, high), 2)

    def pick(self, items: list[Any], k: int = 1) -> list[Any]:
        return self.rng.sample(items, k)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="minutes")
