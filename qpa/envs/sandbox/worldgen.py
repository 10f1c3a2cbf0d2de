"""Deterministic fake-world material for task templates: people, places, times, money, and
the app worlds several template modules build (calendar background, map places, rides,
flights and hotels).

Everything draws from a `random.Random` seeded per task, so the same (template, seed) always
builds the same world; the order of the draws is part of each builder's contract. Pools are
small and static: generation must stay fast.
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from qpa.envs.sandbox.apps.calendar import event_record
from qpa.envs.sandbox.apps.flights import AIRPORTS, booking_record
from qpa.envs.sandbox.apps.hotels import reservation_record
from qpa.envs.sandbox.engine import confirmation_code
from qpa.envs.sandbox.geo import NEIGHBORHOODS

if TYPE_CHECKING:
    from qpa.envs.sandbox.suite import TaskGen

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
TODAY = "2026-03-02"  # the sandbox's first day (its clock starts at 09:00)
WORKDAYS = [BASE_DAY + timedelta(days=d) for d in (1, 2, 3, 4, 7, 8, 9, 10, 11)]


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


def clock_time(minutes: int) -> str:
    """HH:MM for minutes after midnight."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


# --------------------------------------------------------------------------- calendar

BACKGROUND = [
    "Dentist",
    "Team standup",
    "Lunch with Sam",
    "School pickup",
    "Car service",
    "Yoga",
    "Focus time",
    "Parent meeting",
    "Haircut",
    "Book club",
    "Pharmacy run",
    "Piano lesson",
]


def _overlaps(start: datetime, end: datetime, taken: list[tuple[datetime, datetime]]) -> bool:
    return any(s < end and start < e for s, e in taken)


def background_events(
    g: TaskGen,
    n: int,
    *,
    avoid: list[tuple[datetime, datetime]] | None = None,
    days: list[datetime] | None = None,
    first_id: int = 101,
) -> list[dict[str, Any]]:
    """`n` unrelated events in the primary calendar that overlap nothing in `avoid`."""
    taken = list(avoid or [])
    events: list[dict[str, Any]] = []
    for _ in range(n * 6):
        if len(events) == n:
            break
        day = g.rng.choice(days or WORKDAYS)
        start = day.replace(hour=g.rng.randint(8, 18), minute=g.rng.choice([0, 30]))
        end = start + timedelta(minutes=g.rng.choice([30, 60, 90]))
        if _overlaps(start, end, taken):
            continue
        taken.append((start, end))
        events.append(
            event_record(
                f"ev_{first_id + len(events)}",
                g.rng.choice(BACKGROUND),
                iso(start),
                iso(end),
                location=g.rng.choice(["", "Home", "Downtown"]),
            )
        )
    return events


# --------------------------------------------------------------------------- map places

PLACE_NAMES: dict[str, list[str]] = {
    "cafe": [
        "Daily Grind",
        "Bean There",
        "Copper Kettle",
        "Morning Ritual",
        "Third Wave",
        "Steam & Leaf",
        "Little Roast",
        "Corner Cup",
    ],
    "restaurant": [
        "Trattoria Lume",
        "Saffron House",
        "The Green Fork",
        "Blue Lantern",
        "Casa Verde",
        "Noodle Bar 88",
        "Harvest Table",
        "Ember Grill",
    ],
    "bakery": [
        "Golden Crust",
        "Flour & Salt",
        "Rise Bakery",
        "Sweet Loaf",
        "Crumb Co",
        "Petit Four",
    ],
    "bar": [
        "The Tipsy Fox",
        "Lantern Bar",
        "Hops & Barley",
        "Velvet Room",
        "Night Owl",
        "Brass Tap",
    ],
    "gas_station": ["FuelStop", "QuickGas", "PetroMax", "GreenPump", "Route 9 Fuel", "Gas & Go"],
    "ev_charger": ["VoltHub", "Plaza Chargers", "AmpUp", "Spark Station", "EV Go Center"],
    "pharmacy": ["CarePlus Pharmacy", "Wellness Rx", "City Drugstore", "HealthMart", "Green Cross"],
    "supermarket": ["FreshMart", "Green Grocer", "Value Foods", "Market Hall", "Daily Basket"],
    "museum": [
        "Science Museum",
        "Modern Art Gallery",
        "History Hall",
        "Maritime Museum",
        "Photo Archive",
    ],
    "park": ["Willow Park", "Cedar Gardens", "Lakeside Green", "Fountain Square"],
    "gym": ["IronWorks Gym", "FlexZone", "Peak Fitness", "Core Studio", "Pulse Gym"],
    "parking": ["Central Parking", "Park & Go", "Lot 42", "Garage One"],
}
HOURS_OPEN = ["06:00-22:00", "07:00-21:00", "08:00-20:00", "00:00-24:00", "07:30-23:00"]
HOURS_CLOSED = ["11:00-23:00", "12:00-22:00", "17:00-23:59", "10:00-18:00"]
RATINGS = [round(3.0 + i / 10, 1) for i in range(20)]


class Places:
    """Builds map places with unique ids, names and addresses."""

    def __init__(self, g: TaskGen, start: int = 101) -> None:
        self.g = g
        self.next_id = start
        self.names: set[str] = set()
        self.addresses: set[str] = set()
        self.rows: list[dict[str, Any]] = []

    def address(self) -> str:
        while True:
            address = self.g.fake.address()
            if address not in self.addresses:
                self.addresses.add(address)
                return address

    def add(
        self,
        category: str,
        neighborhood: str,
        *,
        base: str | None = None,
        rating: float | None = None,
        open_now: bool | None = None,
        place_id: str | None = None,
    ) -> dict[str, Any]:
        rng = self.g.rng
        for _ in range(50):
            name = f"{base or rng.choice(PLACE_NAMES[category])} {neighborhood}"
            if name not in self.names:
                break
        else:
            raise RuntimeError("place names exhausted")
        self.names.add(name)
        is_open = rng.random() < 0.7 if open_now is None else open_now
        if place_id is None:
            place_id = f"pl_{self.next_id}"
            self.next_id += 1
        record = {
            "id": place_id,
            "name": name,
            "category": category,
            "address": self.address(),
            "neighborhood": neighborhood,
            "rating": rating if rating is not None else rng.choice(RATINGS),
            "price_level": rng.randint(1, 4),
            "hours": rng.choice(HOURS_OPEN if is_open else HOURS_CLOSED),
            "phone": self.g.fake.phone(),
        }
        self.rows.append(record)
        return record

    def fillers(self, n: int, *, exclude: tuple[str, ...] = ()) -> None:
        cats = [c for c in PLACE_NAMES if c not in exclude]
        for _ in range(n):
            self.add(self.g.rng.choice(cats), self.g.rng.choice(NEIGHBORHOODS))


def labels(home: str, work: str) -> list[dict[str, Any]]:
    """The maps app's home and work labels."""
    return [
        {"id": "home", "label": "home", "address": home},
        {"id": "work", "label": "work", "address": work},
    ]


# --------------------------------------------------------------------------- rides

# id, name, capacity, base fare, per km, minimum fare, schedulable
PRODUCTS: list[tuple[str, str, int, float, float, float, bool]] = [
    ("pool", "Pool", 2, 1.5, 0.85, 5.0, False),
    ("economy", "Economy", 4, 2.5, 1.1, 7.0, True),
    ("green", "Green", 4, 2.8, 1.2, 7.5, True),
    ("comfort", "Comfort", 4, 3.5, 1.5, 9.0, True),
    ("xl", "XL", 6, 4.0, 1.9, 11.0, True),
    ("black", "Black", 4, 7.0, 2.8, 18.0, True),
]
CLASS_WORDS = {pid: name for pid, name, *_ in PRODUCTS}  # "xl" -> "XL"
CARS = {
    "pool": ["Toyota Corolla", "Honda Fit", "Nissan Leaf"],
    "economy": ["Toyota Prius", "Honda Civic", "Kia Niro", "Hyundai Elantra"],
    "green": ["Tesla Model 3", "Hyundai Ioniq 5", "Chevrolet Bolt", "Polestar 2"],
    "comfort": ["Toyota Camry", "Honda Accord", "Volkswagen Passat", "Mazda 6"],
    "xl": ["Honda Odyssey", "Toyota Sienna", "Kia Carnival", "Chevrolet Suburban"],
    "black": ["Mercedes E-Class", "BMW 5 Series", "Audi A6", "Lincoln Continental"],
}


def a_ride(ride_class: str) -> str:
    """'an Economy ride', 'a Comfort ride'."""
    word = CLASS_WORDS[ride_class]
    return f"{'an' if word[0] in 'AEIOUX' else 'a'} {word} ride"


PLATE_LETTERS = "ABCDEFGHJKLMNPRSTUVWXYZ"


def plate(g: TaskGen) -> str:
    letters = "".join(g.rng.choice(PLATE_LETTERS) for _ in range(3))
    return f"{g.rng.randint(1, 9)}{letters}{g.rng.randint(100, 999)}"


def default_cards(g: TaskGen) -> list[dict[str, Any]]:
    brands = g.rng.sample(["Visa", "Mastercard", "Amex", "Discover"], 3)
    last4s = g.rng.sample(range(1000, 9999), 3)
    kinds = ["personal", "business", "personal"]
    return [
        {"id": f"pm_{i + 1}", "brand": b, "last4": str(n), "kind": k, "default": i == 0}
        for i, (b, n, k) in enumerate(zip(brands, last4s, kinds, strict=True))
    ]


def rides_world(
    g: TaskGen,
    *,
    unavailable: tuple[str, ...] | set[str] = (),
    surge: dict[str, float] | None = None,
    places: list[dict[str, Any]] | None = None,
    cards: list[dict[str, Any]] | None = None,
    rides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A rides app state: six classes, one driver each (busy for unavailable classes)."""
    products, drivers = [], []
    for i, (pid, name, cap, base, per_km, min_fare, sched) in enumerate(PRODUCTS):
        products.append(
            {
                "id": pid,
                "name": name,
                "capacity": cap,
                "base_fare": base,
                "per_km": per_km,
                "min_fare": min_fare,
                "surge_multiplier": (surge or {}).get(pid, 1.0),
                "pickup_eta_min": g.rng.randint(2, 9),
                "schedulable": sched,
            }
        )
        drivers.append(
            {
                "id": f"drv_{i + 1}",
                "name": g.fake.name(),
                "product": pid,
                "car": g.rng.choice(CARS[pid]),
                "plate": plate(g),
                "rating": round(g.rng.uniform(4.6, 5.0), 2),
                "available": pid not in unavailable,
            }
        )
    return {
        "products": products,
        "drivers": drivers,
        "places": places or [],
        "payment_methods": cards or default_cards(g),
        "rides": rides or [],
        "promos": [
            {
                "id": "promo_1",
                "code": "SPRING5",
                "discount": 5.0,
                "expires": "2026-04-30",
                "status": "available",
            }
        ],
    }


# --------------------------------------------------------------------------- flights and hotels

USER = "Alex Morgan"
BOOKED_BEFORE = "2026-02-01T12:00"  # when bookings that predate a task were made
Airport = tuple[str, str, str, str]
TERMINALS = ["1", "2", "3", "4", "5", "7", "A", "B", "C", "D", "E"]
CHAINS = {
    "MER": "Meridian",
    "LUM": "Lumen Suites",
    "PRK": "Parkside Hotels",
    "NOM": "Nomad House",
    "CRS": "Crescent Resorts",
}
HOTEL_BASES = [
    "Harborview",
    "Grand Central",
    "Riverside",
    "Old Town",
    "Skyline",
    "Garden Court",
    "Bayfront",
    "Union Square",
    "Lakeshore",
    "Midtown",
    "Station Plaza",
    "Park Lane",
]
ROOM_TYPES = [
    ("standard_queen", 2),
    ("standard_king", 2),
    ("double_queen", 4),
    ("deluxe_king", 3),
    ("junior_suite", 3),
    ("suite", 4),
]
AMENITIES = ["wifi", "pool", "gym", "spa", "parking", "breakfast", "restaurant", "pet_friendly"]


def international_pair(g: TaskGen, *, domestic: bool | None = None) -> tuple[Airport, Airport]:
    """Two airports in different cities; domestic (US-US), international, or either."""
    while True:
        a, b = g.rng.sample(AIRPORTS, 2)
        if a[1] == b[1]:
            continue
        if domestic is True and not (a[3] == b[3] == "US"):
            continue
        if domestic is False and (a[3] == b[3] or a[3] != "US"):
            continue
        return a, b


class FlightBook:
    """Builds flight records with unique ids and flight numbers."""

    def __init__(self, g: TaskGen) -> None:
        self.g = g
        self.rows: list[dict[str, Any]] = []
        self.numbers: set[str] = set()
        self.durations: dict[tuple[str, str], int] = {}

    def add(
        self,
        airline: str,
        origin: str,
        dest: str,
        date: str,
        *,
        price: float | None = None,
        stops: int = 0,
        depart: str | None = None,
        arrive_before: str | None = None,
        seats: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        rng = self.g.rng
        intl = AIRPORT_COUNTRY[origin] != AIRPORT_COUNTRY[dest]
        base = self.durations.setdefault(
            (origin, dest), rng.randint(420, 690) if intl else rng.randint(80, 330)
        )
        duration = base + stops * rng.randint(60, 150)
        if arrive_before:
            limit = int(arrive_before[:2]) * 60 + int(arrive_before[3:])
            start = max(5, limit - duration - rng.randint(0, 60))
        elif depart:
            start = int(depart[:2]) * 60 + int(depart[3:])
        else:
            start = rng.randint(6 * 60, max(6 * 60, min(22 * 60, 23 * 60 + 50 - duration)))
            start -= start % 5
        while True:
            number = f"{airline} {rng.randint(100, 2999)}"
            if number not in self.numbers:
                self.numbers.add(number)
                break
        fare = price if price is not None else float(rng.randint(89, 640))
        record = {
            "id": f"fl_{101 + len(self.rows)}",
            "airline": airline,
            "flight_no": number,
            "origin": origin,
            "destination": dest,
            "date": date,
            "depart": clock_time(start),
            "arrive": clock_time((start + duration) % (24 * 60)),
            "duration_min": duration,
            "stops": stops,
            "aircraft": rng.choice(["A320", "A321neo", "737 MAX 8", "787-9", "A350-900", "E175"]),
            "fares": {
                "economy": fare,
                "premium_economy": round(fare * 1.6, 2),
                "business": round(fare * 3.2, 2),
            },
            "seats_left": {
                "economy": rng.randint(2, 9),
                "premium_economy": rng.randint(1, 6),
                "business": rng.randint(1, 4),
                **(seats or {}),
            },
            "international": intl,
            "departure_terminal": rng.choice(TERMINALS),
            "arrival_terminal": rng.choice(TERMINALS),
            "gate": f"{rng.choice('ABCDE')}{rng.randint(1, 40)}",
            "baggage_claim": str(rng.randint(1, 14)),
            "status": "on_time",
            "delay_min": 0,
            "taken_seats": [],
        }
        self.rows.append(record)
        return record


AIRPORT_COUNTRY = {a[0]: a[3] for a in AIRPORTS}


def booking_for(
    flight: dict[str, Any], booking_id: str, g: TaskGen, *, cabin: str = "economy"
) -> dict[str, Any]:
    """A booking made before the task (booked 2026-02-01) for the user."""
    return booking_record(
        booking_id,
        confirmation_code(f"{booking_id}|{flight['id']}|{g.seed}"),
        flight,
        cabin=cabin,
        traveler_name=USER,
        booked_at=BOOKED_BEFORE,
    )


class HotelBook:
    """Builds hotels and their rooms with unique ids and names."""

    def __init__(self, g: TaskGen) -> None:
        self.g = g
        self.hotels: list[dict[str, Any]] = []
        self.rooms: list[dict[str, Any]] = []
        self.names: set[str] = set()

    def add(
        self,
        city: str,
        *,
        chain: str | None = None,
        rates: list[float] | None = None,
        refundable: list[bool] | None = None,
        sold_out: list[list[str]] | None = None,
        amenities: list[str] | None = None,
    ) -> dict[str, Any]:
        rng = self.g.rng
        chain = chain or rng.choice(list(CHAINS))
        while True:
            name = f"{CHAINS[chain]} {rng.choice(HOTEL_BASES)}"
            if name not in self.names:
                self.names.add(name)
                break
        hotel = {
            "id": f"h_{101 + len(self.hotels)}",
            "name": name,
            "chain": chain,
            "chain_name": CHAINS[chain],
            "city": city,
            "neighborhood": rng.choice(NEIGHBORHOODS),
            "address": self.g.fake.address(),
            "stars": rng.randint(2, 5),
            "rating": round(rng.uniform(3.4, 4.9), 1),
            "amenities": amenities if amenities is not None else sorted(rng.sample(AMENITIES, 4)),
            "phone": self.g.fake.phone(),
            "check_in_time": "15:00",
            "check_out_time": "11:00",
        }
        self.hotels.append(hotel)
        count = len(rates) if rates else rng.randint(2, 3)
        prices = rates or sorted(float(p) for p in rng.sample(range(89, 420), count))
        types = rng.sample(ROOM_TYPES, count)
        for i in range(count):
            room_type, guests = types[i]
            self.rooms.append(
                {
                    "id": f"rm_{101 + len(self.rooms)}",
                    "hotel_id": hotel["id"],
                    "room_type": room_type,
                    "max_guests": guests,
                    "nightly_rate": prices[i],
                    "refundable": refundable[i] if refundable else rng.random() < 0.6,
                    "breakfast": rng.random() < 0.4,
                    "sold_out_dates": sold_out[i] if sold_out else [],
                }
            )
        return hotel

    def rooms_of(self, hotel: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in self.rooms if r["hotel_id"] == hotel["id"]]


def reservation_for(
    hotel: dict[str, Any],
    room: dict[str, Any],
    check_in: str,
    check_out: str,
    reservation_id: str,
    g: TaskGen,
) -> dict[str, Any]:
    """A reservation for one guest, the user, made before the task (booked 2026-02-01)."""
    nights = (date.fromisoformat(check_out) - date.fromisoformat(check_in)).days
    stay = {
        "check_in": check_in,
        "check_out": check_out,
        "nights": nights,
        "guests": 1,
        "nightly_rate": room["nightly_rate"],
        "total": round(room["nightly_rate"] * nights, 2),
        "refundable": room["refundable"],
        "breakfast": room["breakfast"],
    }
    return reservation_record(
        reservation_id,
        confirmation_code(f"{reservation_id}|{hotel['id']}|{g.seed}|hotel"),
        hotel,
        room,
        stay,
        guest_name=USER,
        booked_at=BOOKED_BEFORE,
    )
