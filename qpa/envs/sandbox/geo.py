"""Simulated geography shared by the maps and rides apps and their task templates.

Distances, the neighbourhoods a route passes through, detours and travel times per mode are pure
functions of the address strings (and of the departure time, for rush-hour traffic), so a ride
and a driving route between the same addresses agree, and templates compute exactly what the
tools report.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from datetime import datetime

NEIGHBORHOODS = [
    "Downtown",
    "Riverside",
    "Old Town",
    "Harbor District",
    "University Hill",
    "Midtown",
    "Eastside",
    "Westgate",
    "Parkview",
    "Northshore",
]
TOLL = 4.5


def _hash(*parts: str) -> int:
    return zlib.crc32("|".join(p.strip().lower() for p in parts).encode())


def distance_km(a: str, b: str) -> float:
    """Road distance between two addresses (symmetric, 1.5 to 26.4 km; 0 for the same one)."""
    x, y = sorted((a.strip().lower(), b.strip().lower()))
    if x == y:
        return 0.0
    return round(1.5 + (_hash(x, y) % 250) / 10, 1)


def neighborhood_of(address: str) -> str:
    return NEIGHBORHOODS[_hash(address) % len(NEIGHBORHOODS)]


def route_via(origin: str, destination: str) -> list[str]:
    """The two neighbourhoods a route from origin to destination passes through."""
    h = _hash(origin, destination)
    first = h % len(NEIGHBORHOODS)
    second = (first + 1 + (h // 16) % (len(NEIGHBORHOODS) - 1)) % len(NEIGHBORHOODS)
    return [NEIGHBORHOODS[first], NEIGHBORHOODS[second]]


def rush_hour(moment: datetime) -> bool:
    hhmm = moment.strftime("%H:%M")
    return "07:00" <= hhmm < "09:30" or "16:30" <= hhmm < "19:00"


def travel_minutes(
    distance: float, mode: str, moment: datetime, avoid: Iterable[str] = (), key: str = ""
) -> int:
    """Door-to-door minutes for a mode; driving is slower in rush hour and with detours."""
    avoid = set(avoid)
    if mode == "driving":
        minutes = 3 + distance * 2.0 * (1.8 if rush_hour(moment) else 1.0)
        if "highways" in avoid:
            minutes *= 1.25
        if "tolls" in avoid and distance > 6:
            minutes *= 1.15
    elif mode == "transit":
        minutes = 8 + distance * 2.8 + (_hash(key) % 3) * 4
    elif mode == "cycling":
        minutes = 2 + distance * 4
    else:
        minutes = distance * 12
    return max(1, round(minutes))


def tolls_for(distance: float, mode: str, avoid: Iterable[str] = ()) -> float:
    return TOLL if mode == "driving" and distance > 6 and "tolls" not in set(avoid) else 0.0


def detour_minutes(place_id: str, origin: str, destination: str) -> int:
    return 1 + _hash(place_id, origin, destination) % 9


def is_open(hours: str, moment: datetime) -> bool:
    start, _, end = hours.partition("-")
    now = moment.strftime("%H:%M")
    return start <= now < end
