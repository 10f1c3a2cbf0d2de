"""Rides, maps, flights and hotels apps: happy paths and realistic failures through
`SandboxEnv.step`, plus the rides/maps/travel task templates end to end."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from helpers.sandbox_steps import ok, open_env, refused

from qpa.contract import CAPABILITIES, Task
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.geo import NEIGHBORHOODS, route_via
from qpa.envs.sandbox.registry import all_apps
from qpa.envs.sandbox.suite import all_templates, generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

MY_DOMAINS = ("rides", "maps", "travel")
MY_APPS = ("rides", "maps", "flights", "hotels")
PAYMENTS = [
    "rides_request",
    "rides_add_tip",
    "flights_book",
    "flights_change_booking",
    "flights_add_bags",
    "hotels_book",
    "hotels_modify_reservation",
]


def make_env(world: dict[str, Any], *, confirmations: list[str] | None = None) -> SandboxEnv:
    task = Task(
        id="unit.apps",
        domain="unit",
        capabilities=["tool_use"],
        instruction="unit test",
        apps=list(world),
        world=world,
        confirmations=PAYMENTS if confirmations is None else confirmations,
    )
    return open_env(task)


# --------------------------------------------------------------------------- worlds


def product(pid: str, capacity: int, surge: float = 1.0, schedulable: bool = True) -> dict:
    return {
        "id": pid,
        "name": pid.title(),
        "capacity": capacity,
        "base_fare": 2.5,
        "per_km": 1.2,
        "min_fare": 7.0,
        "surge_multiplier": surge,
        "pickup_eta_min": 4,
        "schedulable": schedulable,
    }


def driver(i: int, pid: str, available: bool = True) -> dict:
    return {
        "id": f"drv_{i}",
        "name": f"Driver {i}",
        "product": pid,
        "car": "Toyota Prius",
        "plate": f"7ABC{100 + i}",
        "rating": 4.9,
        "available": available,
    }


def completed_ride(ride_id: str, when: str) -> dict:
    return {
        "id": ride_id,
        "status": "completed",
        "pickup": "12 Harbor Street",
        "dropoff": "400 Market Avenue",
        "stops": [],
        "ride_class": "economy",
        "passengers": 1,
        "estimate_id": None,
        "fare": 24.0,
        "surge_multiplier": 1.0,
        "surge_confirmation_id": None,
        "payment_method_id": "pm_1",
        "pickup_note": "",
        "driver": {"name": "Driver 9", "car": "Kia Niro", "plate": "8XYZ900", "rating": 4.8},
        "requested_at": when,
        "scheduled_for": None,
        "pickup_eta_min": 3,
        "completed_at": when,
        "rating": None,
        "tip": 0.0,
        "cancellation_fee": 0.0,
    }


def rides_world() -> dict[str, Any]:
    return {
        "rides": {
            "products": [
                product("pool", 2, schedulable=False),
                product("economy", 4),
                product("comfort", 4, surge=1.5),
                product("xl", 6),
            ],
            "drivers": [
                driver(1, "pool"),
                driver(2, "economy"),
                driver(3, "comfort"),
                driver(4, "xl", available=False),
            ],
            "places": [{"id": "pl_1", "label": "home", "address": "12 Harbor Street"}],
            "payment_methods": [
                {
                    "id": "pm_1",
                    "brand": "Visa",
                    "last4": "4242",
                    "kind": "personal",
                    "default": True,
                },
                {
                    "id": "pm_2",
                    "brand": "Amex",
                    "last4": "1005",
                    "kind": "business",
                    "default": False,
                },
            ],
            "rides": [completed_ride("ride_1", "2026-03-01T20:00")],
            "promos": [
                {
                    "id": "p1",
                    "code": "SPRING5",
                    "discount": 5.0,
                    "expires": "2026-04-30",
                    "status": "available",
                },
                {
                    "id": "p2",
                    "code": "OLD10",
                    "discount": 10.0,
                    "expires": "2026-01-31",
                    "status": "available",
                },
            ],
        }
    }


HOME, DEST = "12 Harbor Street", "400 Market Avenue"


def maps_world() -> dict[str, Any]:
    via = route_via(HOME, DEST)
    off = next(n for n in NEIGHBORHOODS if n not in via)

    def place(pid: str, name: str, category: str, hood: str, hours: str = "07:00-22:00") -> dict:
        return {
            "id": pid,
            "name": name,
            "category": category,
            "address": f"{pid[-1]}0 Lake Street",
            "neighborhood": hood,
            "rating": 4.0 + int(pid[-1]) / 10,
            "price_level": 2,
            "hours": hours,
            "phone": "+1-555-2000",
        }

    return {
        "maps": {
            "places": [
                place("pl_1", "Daily Grind On Route", "cafe", via[0]),
                place("pl_2", "Bean There Off Route", "cafe", off),
                place("pl_3", "Night Owl", "bar", via[1], hours="17:00-23:59"),
            ],
            "labels": [
                {"id": "home", "label": "home", "address": HOME},
                {"id": "work", "label": "work", "address": DEST},
            ],
            "timeline": [
                {
                    "id": "v_1",
                    "date": "2026-02-27",
                    "arrived": "12:00",
                    "left": "13:00",
                    "place_id": "pl_3",
                    "place_name": "Night Owl",
                    "address": "30 Lake Street",
                },
            ],
        }
    }


def flight(
    fid: str,
    airline: str,
    origin: str,
    dest: str,
    date: str,
    depart: str,
    economy: float,
    *,
    seats: int = 5,
    duration: int = 420,
    intl: bool = True,
) -> dict:
    return {
        "id": fid,
        "airline": airline,
        "flight_no": f"{airline} {100 + int(fid[-1])}",
        "origin": origin,
        "destination": dest,
        "date": date,
        "depart": depart,
        "arrive": "20:00",
        "duration_min": duration,
        "stops": 0,
        "aircraft": "A321neo",
        "fares": {"economy": economy, "business": economy * 3},
        "seats_left": {"economy": seats, "business": 2},
        "international": intl,
        "departure_terminal": "4",
        "arrival_terminal": "5",
        "gate": "B22",
        "baggage_claim": "7",
        "status": "on_time",
        "delay_min": 0,
        "taken_seats": [],
    }


def booking(bid: str, f: dict, *, cabin: str = "economy") -> dict:
    return {
        "id": bid,
        "pnr": f"PNR{bid[-3:]}",
        "flight_id": f["id"],
        "airline": f["airline"],
        "flight_no": f["flight_no"],
        "origin": f["origin"],
        "destination": f["destination"],
        "date": f["date"],
        "depart": f["depart"],
        "arrive": f["arrive"],
        "cabin": cabin,
        "passengers": 1,
        "traveler_name": "Alex Morgan",
        "fare_per_passenger": f["fares"][cabin],
        "price_paid": f["fares"][cabin],
        "fare_difference_paid": 0.0,
        "change_fee_paid": 0.0,
        "travel_credit": 0.0,
        "status": "confirmed",
        "seat": None,
        "bags": 0,
        "bags_paid": 0.0,
        "frequent_flyer": None,
        "passport": None,
        "meal": None,
        "checked_in": False,
        "boarding_pass": None,
        "international": f["international"],
        "booked_at": "2026-02-01T12:00",
    }


def flights_world() -> dict[str, Any]:
    f1 = flight("fl_1", "NW", "JFK", "LHR", "2026-03-03", "08:00", 500.0)
    f2 = flight("fl_2", "NW", "JFK", "LHR", "2026-03-10", "09:00", 650.0)
    f3 = flight("fl_3", "BH", "JFK", "LHR", "2026-03-10", "07:00", 300.0)
    f4 = flight("fl_4", "SW", "JFK", "BOS", "2026-03-12", "10:00", 99.0, duration=75, intl=False)
    f5 = flight("fl_5", "NW", "JFK", "LHR", "2026-03-11", "09:00", 420.0, seats=0)
    f6 = flight("fl_6", "NW", "JFK", "LHR", "2026-03-12", "09:00", 450.0)
    f7 = flight("fl_7", "NW", "JFK", "CDG", "2026-03-10", "18:00", 520.0)
    return {
        "flights": {
            "flights": [f1, f2, f3, f4, f5, f6, f7],
            "bookings": [
                booking("bk_101", f1),
                booking("bk_102", f4),
                booking("bk_103", f2, cabin="business"),
            ],
        }
    }


def hotels_world() -> dict[str, Any]:
    def room(rid: str, hotel: str, rate: float, refundable: bool, sold_out: list[str]) -> dict:
        return {
            "id": rid,
            "hotel_id": hotel,
            "room_type": "standard_king",
            "max_guests": 2,
            "nightly_rate": rate,
            "refundable": refundable,
            "breakfast": False,
            "sold_out_dates": sold_out,
        }

    def hotel(hid: str, name: str, chain: str, chain_name: str, amenities: list[str]) -> dict:
        return {
            "id": hid,
            "name": name,
            "chain": chain,
            "chain_name": chain_name,
            "city": "Boston",
            "neighborhood": "Harbor District",
            "address": f"{hid[-1]} Seaport Boulevard",
            "stars": 4,
            "rating": 4.4,
            "amenities": amenities,
            "phone": "+1-555-3000",
            "check_in_time": "15:00",
            "check_out_time": "11:00",
        }

    def reservation(res_id: str, h: dict, r: dict, check_in: str, check_out: str) -> dict:
        return {
            "id": res_id,
            "confirmation": f"CONF{res_id[-2:]}",
            "hotel_id": h["id"],
            "hotel_name": h["name"],
            "hotel_address": h["address"],
            "city": h["city"],
            "room_id": r["id"],
            "room_type": r["room_type"],
            "check_in": check_in,
            "check_out": check_out,
            "nights": 2,
            "guests": 1,
            "guest_name": "Alex Morgan",
            "nightly_rate": r["nightly_rate"],
            "total": r["nightly_rate"] * 2,
            "refundable": r["refundable"],
            "breakfast": False,
            "status": "confirmed",
            "loyalty_number": None,
            "requests": [],
            "online_check_in": None,
            "booked_at": "2026-02-01T12:00",
        }

    h1 = hotel("h_1", "Meridian Harborview", "MER", "Meridian", ["wifi", "airport_shuttle"])
    h2 = hotel("h_2", "Lumen Suites Union", "LUM", "Lumen Suites", ["wifi", "gym"])
    r1 = room("rm_1", "h_1", 150.0, True, ["2026-03-20"])
    r2 = room("rm_2", "h_2", 120.0, False, [])
    r3 = room("rm_3", "h_2", 200.0, True, ["2026-03-15"])
    return {
        "hotels": {
            "hotels": [h1, h2],
            "rooms": [r1, r2, r3],
            "reservations": [
                reservation("res_11", h1, r1, "2026-03-10", "2026-03-12"),
                reservation("res_12", h2, r2, "2026-03-03", "2026-03-05"),
            ],
            "reviews": [
                {
                    "id": "hr_1",
                    "hotel_id": "h_1",
                    "author": "Sam",
                    "stars": 5,
                    "text": "Great view.",
                    "date": "2026-02-01",
                },
                {
                    "id": "hr_2",
                    "hotel_id": "h_1",
                    "author": "Kim",
                    "stars": 3,
                    "text": "Noisy.",
                    "date": "2026-02-20",
                },
            ],
        }
    }


# --------------------------------------------------------------------------- rides


def test_ride_estimate_request_and_trip_lifecycle() -> None:
    env = make_env(rides_world())
    products = ok(env, "rides_list_products")
    assert {p["id"]: p["drivers_available"] for p in products}["xl"] == 0
    estimates = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST, passengers=3)
    assert [e["ride_class"] for e in estimates] == ["economy", "comfort", "xl"]
    assert estimates[2]["available"] is False and estimates[1]["surge_multiplier"] == 1.5
    ride = ok(env, "rides_request", estimate_id=estimates[0]["id"], payment_method_id="pm_2")
    assert ride["status"] == "accepted" and ride["payment_method_id"] == "pm_2"
    assert ride["driver"]["plate"] == "7ABC102" and ride["passengers"] == 3
    again = ok(env, "rides_get_estimates", pickup=HOME, dropoff="Union Square")
    refused(env, "rides_request", "already have an active ride", estimate_id=again[0]["id"])
    moved = ok(env, "rides_update_dropoff", ride_id=ride["id"], dropoff="Union Square")
    assert moved["dropoff"] == "Union Square" and moved["fare"] != ride["fare"]
    ok(env, "rides_add_stop", ride_id=ride["id"], address="5 Oak Street")
    ok(env, "rides_add_stop", ride_id=ride["id"], address="6 Oak Street")
    refused(env, "rides_add_stop", "at most 2 stops", ride_id=ride["id"], address="7 Oak Street")
    share = ok(env, "rides_share_trip", ride_id=ride["id"], phone="+1-555-0199")
    assert share["plate"] == "7ABC102"
    assert ok(env, "rides_get_ride", ride_id=ride["id"])["stops"] == [
        "5 Oak Street",
        "6 Oak Street",
    ]
    cancelled = ok(env, "rides_cancel", ride_id=ride["id"], reason="changed_plans")
    assert cancelled["status"] == "cancelled" and cancelled["cancellation_fee"] == 5.0
    assert ok(env, "rides_get_receipt", ride_id=ride["id"])["total"] == 5.0
    refused(env, "rides_cancel", "is cancelled", ride_id=ride["id"])
    assert [r["id"] for r in ok(env, "rides_list_rides", status="completed")] == ["ride_1"]


def test_ride_no_drivers_available() -> None:
    env = make_env(rides_world())
    estimate = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST, ride_class="xl")[0]
    refused(env, "rides_request", "no drivers available for xl", estimate_id=estimate["id"])


def test_ride_surge_needs_acceptance() -> None:
    env = make_env(rides_world())
    estimate = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST, ride_class="comfort")[0]
    refused(env, "rides_request", "rides_accept_surge", estimate_id=estimate["id"])
    refused(
        env,
        "rides_request",
        "surge pricing 1.5x",
        estimate_id=estimate["id"],
        surge_confirmation_id="sc_bogus",
    )
    confirmation = ok(env, "rides_accept_surge", estimate_id=estimate["id"])
    ride = ok(
        env, "rides_request", estimate_id=estimate["id"], surge_confirmation_id=confirmation["id"]
    )
    assert ride["surge_multiplier"] == 1.5 and ride["surge_confirmation_id"] == confirmation["id"]
    plain = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST, ride_class="economy")[0]
    refused(env, "rides_accept_surge", "no surge", estimate_id=plain["id"])


def test_ride_airport_pickup_needs_terminal_and_estimates_expire() -> None:
    env = make_env(rides_world())
    estimate = ok(
        env,
        "rides_get_estimates",
        pickup="Logan International Airport",
        dropoff=DEST,
        ride_class="economy",
    )[0]
    refused(env, "rides_request", "terminal", estimate_id=estimate["id"], pickup_note="by Door 4")
    ride = ok(env, "rides_request", estimate_id=estimate["id"], pickup_note="Terminal B arrivals")
    assert ride["pickup_note"] == "Terminal B arrivals"
    ok(env, "rides_cancel", ride_id=ride["id"])
    stale = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST, ride_class="economy")[0]
    for _ in range(21):
        ok(env, "rides_list_places")
    refused(env, "rides_request", "expired", estimate_id=stale["id"])


def test_ride_payment_needs_confirmation() -> None:
    env = make_env(rides_world(), confirmations=[])
    estimate = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST)[0]
    refused(env, "rides_request", "not confirmed", "permission_denied", estimate_id=estimate["id"])


@pytest.mark.parametrize(
    ("tool", "arguments", "needle"),
    [
        (
            "rides_get_estimates",
            {"pickup": HOME, "dropoff": DEST, "ride_class": "limo"},
            "argument 'ride_class'",
        ),
        (
            "rides_get_estimates",
            {"pickup": HOME, "dropoff": DEST, "passengers": 9},
            "argument 'passengers'",
        ),
        ("rides_get_estimates", {"pickup": HOME, "dropoff": HOME}, "same address"),
        (
            "rides_schedule",
            {
                "dropoff": DEST,
                "pickup": HOME,
                "ride_class": "economy",
                "pickup_time": "tomorrow 8am",
            },
            "argument 'pickup_time'",
        ),
        ("rides_add_tip", {"ride_id": "ride_1", "amount": -2}, "argument 'amount'"),
        (
            "rides_schedule",
            {
                "dropoff": DEST,
                "pickup": HOME,
                "ride_class": "economy",
                "pickup_time": "2026-02-30T08:00",
            },
            "argument 'pickup_time'",
        ),
        ("rides_apply_promo", {"code": "spring 5"}, "argument 'code'"),
    ],
)
def test_ride_invalid_arguments_name_the_field(
    tool: str, arguments: dict[str, Any], needle: str
) -> None:
    env = make_env(rides_world())
    refused(env, tool, needle, "invalid_arguments", **arguments)


def test_ride_schedule_rules() -> None:
    env = make_env(rides_world())
    base = {"dropoff": DEST, "pickup": HOME}
    refused(
        env,
        "rides_schedule",
        "cannot be scheduled",
        ride_class="pool",
        pickup_time="2026-03-03T08:00",
        **base,
    )
    refused(
        env,
        "rides_schedule",
        "at least 15 minutes",
        ride_class="economy",
        pickup_time="2026-03-02T09:05",
        **base,
    )
    refused(
        env,
        "rides_schedule",
        "terminal",
        dropoff=DEST,
        pickup="Logan International Airport",
        ride_class="economy",
        pickup_time="2026-03-03T08:00",
    )
    ride = ok(
        env, "rides_schedule", ride_class="xl", pickup_time="2026-03-03T08:00", passengers=5, **base
    )
    assert ride["status"] == "scheduled" and ride["driver"] is None
    assert ok(env, "rides_cancel", ride_id=ride["id"])["cancellation_fee"] == 0.0


def test_ride_rating_tip_and_receipt() -> None:
    env = make_env(rides_world())
    refused(env, "rides_add_tip", "rate ride ride_1 before tipping", ride_id="ride_1", amount=4)
    ok(env, "rides_rate_trip", ride_id="ride_1", stars=5, comment="Great")
    refused(env, "rides_rate_trip", "already rated", ride_id="ride_1", stars=4)
    receipt = ok(env, "rides_add_tip", ride_id="ride_1", amount=4.8)
    assert receipt["total"] == 28.8 and receipt["card"] == "Visa ending 4242"
    refused(env, "rides_add_tip", "already has a tip", ride_id="ride_1", amount=1)
    report = ok(
        env,
        "rides_report_lost_item",
        ride_id="ride_1",
        description="black umbrella",
        contact_phone="+1-555-0100",
    )
    assert report["status"] == "driver_notified"


def test_ride_account_places_cards_promos() -> None:
    env = make_env(rides_world())
    ok(env, "rides_save_place", label="Gym", address="9 Elm Street")
    ok(env, "rides_save_place", label="home", address="44 Pine Street")
    places = {p["label"]: p["address"] for p in ok(env, "rides_list_places")}
    assert places == {"home": "44 Pine Street", "gym": "9 Elm Street"}
    ok(env, "rides_set_default_payment", payment_method_id="pm_2")
    cards = ok(env, "rides_list_payment_methods")
    assert [c["id"] for c in cards if c["default"]] == ["pm_2"]
    refused(env, "rides_apply_promo", "not valid", code="NOPE2026")
    refused(env, "rides_apply_promo", "expired", code="OLD10")
    assert ok(env, "rides_apply_promo", code="SPRING5")["status"] == "applied"
    estimate = ok(env, "rides_get_estimates", pickup=HOME, dropoff=DEST, ride_class="economy")[0]
    ride = ok(env, "rides_request", estimate_id=estimate["id"])
    assert ride["fare"] == round(estimate["price"] - 5.0, 2) and ride["payment_method_id"] == "pm_2"


# --------------------------------------------------------------------------- maps


def test_maps_places_search_and_lists() -> None:
    env = make_env(maps_world())
    cafes = ok(env, "maps_search_places", category="cafe", sort_by="rating")
    assert [p["id"] for p in cafes] == ["pl_2", "pl_1"]
    assert ok(env, "maps_search_places", query="night", open_now=True) == []
    assert ok(env, "maps_get_place", place_id="pl_3")["open_now"] is False
    assert ok(env, "maps_geocode", address="work")["address"] == DEST
    assert ok(env, "maps_geocode", address="Night Owl")["place_id"] == "pl_3"
    refused(env, "maps_search_places", "along_route", "invalid_arguments", sort_by="detour")
    ok(env, "maps_save_place", place_id="pl_1", list_name="want_to_go")
    refused(
        env, "maps_save_place", "already in want_to_go", place_id="pl_1", list_name="want_to_go"
    )
    assert [s["place_id"] for s in ok(env, "maps_list_saved", list_name="want_to_go")] == ["pl_1"]
    ok(env, "maps_remove_saved", place_id="pl_1", list_name="want_to_go")
    refused(env, "maps_remove_saved", "not in want_to_go", place_id="pl_1", list_name="want_to_go")
    refused(env, "maps_get_place", "place 'pl_9' not found", place_id="pl_9")


def test_maps_directions_navigation_eta_and_stops() -> None:
    env = make_env(maps_world())
    refused(env, "maps_get_directions", "same place", origin="home", destination=HOME)
    refused(
        env,
        "maps_get_directions",
        "driving only",
        "invalid_arguments",
        origin="home",
        destination="work",
        mode="transit",
        avoid=["tolls"],
    )
    refused(
        env,
        "maps_get_directions",
        "too far to walk",
        origin="home",
        destination="work",
        mode="walking",
    )
    refused(
        env,
        "maps_get_directions",
        "argument 'depart_at'",
        "invalid_arguments",
        origin="home",
        destination="work",
        depart_at="2026-03-02T25:00",
    )
    refused(
        env,
        "maps_get_directions",
        "in the past",
        origin="home",
        destination="work",
        depart_at="2026-03-01T08:00",
    )
    route = ok(env, "maps_get_directions", origin="home", destination="work", avoid=["tolls"])
    assert route["destination"] == DEST and route["avoid"] == ["tolls"] and route["tolls"] == 0.0
    assert route["via"] == route_via(HOME, DEST)
    nav = ok(env, "maps_start_navigation", route_id=route["id"])
    on_route = ok(
        env, "maps_search_places", category="cafe", along_route=route["id"], sort_by="detour"
    )
    assert [p["id"] for p in on_route] == ["pl_1"] and on_route[0]["detour_min"] >= 1
    refused(env, "maps_add_stop", "not along this route", navigation_id=nav["id"], place_id="pl_2")
    stopped = ok(env, "maps_add_stop", navigation_id=nav["id"], place_id="pl_1")
    assert stopped["stops"] == ["pl_1"] and stopped["eta"] > nav["eta"]
    share = ok(env, "maps_share_eta", navigation_id=nav["id"], phone="+1-555-0142")
    assert share["destination"] == DEST
    refused(env, "maps_share_eta", "already shared", navigation_id=nav["id"], phone="+1-555-0142")
    incident = ok(
        env,
        "maps_report_incident",
        kind="accident",
        location="Market Avenue",
        navigation_id=nav["id"],
    )
    assert incident["kind"] == "accident"
    ok(env, "maps_end_navigation", navigation_id=nav["id"])
    refused(env, "maps_share_eta", "not active", navigation_id=nav["id"], phone="+1-555-0143")
    refused(
        env,
        "maps_report_incident",
        "argument 'kind'",
        "invalid_arguments",
        kind="ufo",
        location="Main Street",
    )


def test_maps_labels_history_reviews() -> None:
    env = make_env(maps_world())
    ok(env, "maps_set_label", label="work", address="1 New Office Park")
    labels = {lbl["label"]: lbl["address"] for lbl in ok(env, "maps_get_labels")}
    assert labels["work"] == "1 New Office Park"
    refused(
        env,
        "maps_set_label",
        "argument 'label'",
        "invalid_arguments",
        label="gym",
        address="9 Elm Street",
    )
    visits = ok(env, "maps_get_timeline", date="2026-02-27")
    assert [v["place_id"] for v in visits] == ["pl_3"]
    refused(env, "maps_get_timeline", "future", date="2026-03-09")
    refused(env, "maps_get_timeline", "argument 'date'", "invalid_arguments", date="27/02/2026")
    ok(env, "maps_write_review", place_id="pl_3", stars=4, text="Good cocktails.")
    refused(env, "maps_write_review", "already reviewed", place_id="pl_3", stars=2, text="Meh.")
    refused(
        env,
        "maps_write_review",
        "argument 'stars'",
        "invalid_arguments",
        place_id="pl_1",
        stars=6,
        text="Great!",
    )


# --------------------------------------------------------------------------- flights


def test_flights_search_book_sold_out_and_frequent_flyer() -> None:
    env = make_env(flights_world())
    assert [a["code"] for a in ok(env, "flights_search_airports", query="london")] == ["LHR"]
    offers = ok(env, "flights_search", origin="JFK", destination="LHR", date="2026-03-11")
    assert offers[0]["seats_left"] == 0
    refused(env, "flights_book", "sold out in economy", flight_id="fl_5")
    cheapest = ok(
        env, "flights_search", origin="JFK", destination="LHR", date="2026-03-10", max_price=400
    )
    assert [o["id"] for o in cheapest] == ["fl_3"]
    assert (
        ok(
            env,
            "flights_search",
            origin="JFK",
            destination="LHR",
            date="2026-03-10",
            airline="NW",
            sort_by="departure",
        )[0]["id"]
        == "fl_2"
    )
    assert ok(env, "flights_get_flight", flight_id="fl_3")["airline_name"] == "Blue Horizon"
    rules = ok(env, "flights_get_fare_rules", flight_id="fl_3", cabin="economy")
    assert rules["refundable"] is False and rules["change_fee"] == 75.0
    refused(
        env,
        "flights_book",
        "not a Blue Horizon",
        flight_id="fl_3",
        frequent_flyer_number="NW-12345678",
    )
    refused(
        env, "flights_book", "no premium_economy cabin", flight_id="fl_3", cabin="premium_economy"
    )
    booked = ok(
        env, "flights_book", flight_id="fl_3", passengers=2, frequent_flyer_number="BH-12345678"
    )
    assert booked["price_paid"] == 600.0 and booked["frequent_flyer"] == "BH-12345678"
    assert ok(env, "flights_get_booking", booking_ref=booked["pnr"])["id"] == booked["id"]
    refused(
        env,
        "flights_add_frequent_flyer",
        "not a Northwind",
        booking_id="bk_101",
        number="BH-12345678",
    )
    assert (
        ok(env, "flights_add_frequent_flyer", booking_id="bk_101", number="NW-87654321")[
            "frequent_flyer"
        ]
        == "NW-87654321"
    )
    upcoming = ok(env, "flights_list_bookings", status="upcoming")
    assert [b["id"] for b in upcoming] == ["bk_101", booked["id"], "bk_103", "bk_102"]


@pytest.mark.parametrize(
    ("tool", "arguments", "needle"),
    [
        (
            "flights_search",
            {"origin": "New York", "destination": "LHR", "date": "2026-03-10"},
            "argument 'origin'",
        ),
        (
            "flights_search",
            {"origin": "JFK", "destination": "LHR", "date": "March 10"},
            "argument 'date'",
        ),
        (
            "flights_search",
            {"origin": "JFK", "destination": "LHR", "date": "2026-03-10", "cabin": "coach"},
            "argument 'cabin'",
        ),
        (
            "flights_search",
            {"origin": "JFK", "destination": "LHR", "date": "2026-03-10", "max_stops": 5},
            "argument 'max_stops'",
        ),
        ("flights_select_seat", {"booking_id": "bk_101", "seat": "aisle"}, "argument 'seat'"),
        (
            "flights_add_passport",
            {
                "booking_id": "bk_101",
                "passport_number": "X1",
                "nationality": "US",
                "expiry": "2030-01-01",
            },
            "argument 'passport_number'",
        ),
        (
            "flights_add_passport",
            {
                "booking_id": "bk_101",
                "passport_number": "X1234567",
                "nationality": "US",
                "expiry": "2031-13-01",
            },
            "argument 'expiry'",
        ),
    ],
)
def test_flights_invalid_arguments_name_the_field(
    tool: str, arguments: dict[str, Any], needle: str
) -> None:
    env = make_env(flights_world())
    refused(env, tool, needle, "invalid_arguments", **arguments)


def test_flights_change_booking_procedure() -> None:
    env = make_env(flights_world())
    refused(
        env, "flights_change_booking", "another airline", booking_id="bk_101", new_flight_id="fl_3"
    )
    refused(
        env,
        "flights_change_booking",
        "keep the route JFK-LHR",
        booking_id="bk_101",
        new_flight_id="fl_7",
        accept_fare_difference=True,
    )
    refused(
        env,
        "flights_change_booking",
        "sold out",
        booking_id="bk_101",
        new_flight_id="fl_5",
        accept_fare_difference=True,
    )
    refused(
        env,
        "flights_change_booking",
        "accept_fare_difference=true",
        booking_id="bk_101",
        new_flight_id="fl_2",
    )
    changed = ok(
        env,
        "flights_change_booking",
        booking_id="bk_101",
        new_flight_id="fl_2",
        accept_fare_difference=True,
    )
    assert changed["flight_id"] == "fl_2" and changed["fare_difference_paid"] == 150.0
    assert changed["change_fee_paid"] == 75.0
    cheaper = ok(
        env,
        "flights_change_booking",
        booking_id="bk_101",
        new_flight_id="fl_6",
        accept_fare_difference=True,
    )
    assert cheaper["travel_credit"] == 200.0 and cheaper["change_fee_paid"] == 150.0


def test_flights_cancel_refund_rules() -> None:
    env = make_env(flights_world())
    economy = ok(env, "flights_cancel_booking", booking_id="bk_102")
    assert economy["status"] == "cancelled" and economy["refund"] == 0.0
    assert economy["travel_credit"] == 99.0  # SkyWays charges no change fee
    business = ok(env, "flights_cancel_booking", booking_id="bk_103")
    assert business["refund"] == 1950.0
    refused(env, "flights_cancel_booking", "is cancelled", booking_id="bk_103")
    assert len(ok(env, "flights_list_bookings", status="cancelled")) == 2


def test_flights_seats_bags_meals_status_alerts() -> None:
    env = make_env(flights_world())
    aisles = ok(env, "flights_get_seat_map", flight_id="fl_4", seat_type="aisle")
    assert aisles and all(s["seat"][-1] in "CD" and s["available"] for s in aisles)
    everything = ok(env, "flights_get_seat_map", flight_id="fl_4", available_only=False)
    taken = next(s["seat"] for s in everything if not s["available"])
    refused(env, "flights_select_seat", f"seat {taken}", booking_id="bk_102", seat=taken)
    refused(env, "flights_select_seat", "not in the economy cabin", booking_id="bk_102", seat="2A")
    assert (
        ok(env, "flights_select_seat", booking_id="bk_102", seat=aisles[0]["seat"])["seat"]
        == aisles[0]["seat"]
    )
    second = ok(env, "flights_book", flight_id="fl_4")
    refused(env, "flights_select_seat", "is taken", booking_id=second["id"], seat=aisles[0]["seat"])
    bags = ok(env, "flights_add_bags", booking_id="bk_102", count=2)
    assert bags["bags"] == 2 and bags["bags_paid"] == 80.0
    refused(env, "flights_add_bags", "at most 3", booking_id="bk_102", count=2)
    refused(env, "flights_request_meal", "no meal service", booking_id="bk_102", meal="vegan")
    assert ok(env, "flights_request_meal", booking_id="bk_101", meal="vegan")["meal"] == "vegan"
    status = ok(env, "flights_get_status", flight_no="NW101", date="2026-03-03")
    assert status["arrival_terminal"] == "5" and status["gate"] == "B22"
    refused(env, "flights_get_status", "no flight", flight_no="NW 999", date="2026-03-03")
    ok(
        env,
        "flights_create_price_alert",
        origin="JFK",
        destination="LHR",
        date="2026-03-20",
        max_price=350,
    )
    refused(
        env,
        "flights_create_price_alert",
        "already exists",
        origin="JFK",
        destination="LHR",
        date="2026-03-20",
        max_price=300,
    )


def test_flights_international_check_in_needs_passport() -> None:
    env = make_env(flights_world())
    refused(env, "flights_check_in", "opens 24 hours before", booking_id="bk_102")
    refused(env, "flights_check_in", "passport details are required", booking_id="bk_101")
    refused(
        env,
        "flights_add_passport",
        "less than 6 months",
        booking_id="bk_101",
        passport_number="X1234567",
        nationality="US",
        expiry="2026-06-01",
    )
    ok(
        env,
        "flights_add_passport",
        booking_id="bk_101",
        passport_number="X1234567",
        nationality="US",
        expiry="2031-06-01",
    )
    done = ok(env, "flights_check_in", booking_id="bk_101")
    assert done["checked_in"] is True and done["boarding_pass"]["gate"] == "B22"
    refused(env, "flights_check_in", "already checked in", booking_id="bk_101")
    refused(
        env,
        "flights_change_booking",
        "checked in",
        booking_id="bk_101",
        new_flight_id="fl_2",
        accept_fare_difference=True,
    )


# --------------------------------------------------------------------------- hotels


def test_hotels_search_quote_book() -> None:
    env = make_env(hotels_world())
    offers = ok(env, "hotels_search", city="Boston", check_in="2026-03-14", check_out="2026-03-16")
    assert [(o["id"], o["from_price"]) for o in offers] == [("h_2", 120.0), ("h_1", 150.0)]
    shuttle = ok(
        env,
        "hotels_search",
        city="boston",
        check_in="2026-03-19",
        check_out="2026-03-21",
        amenities=["airport_shuttle"],
    )
    assert shuttle[0]["available"] is False and shuttle[0]["from_price"] is None
    refused(
        env,
        "hotels_check_availability",
        "no availability at Meridian Harborview",
        hotel_id="h_1",
        check_in="2026-03-19",
        check_out="2026-03-21",
    )
    assert ok(env, "hotels_get_hotel", hotel_id="h_1")["chain"] == "MER"
    assert [r["id"] for r in ok(env, "hotels_get_reviews", hotel_id="h_1")] == ["hr_2", "hr_1"]
    quotes = ok(
        env,
        "hotels_check_availability",
        hotel_id="h_1",
        check_in="2026-03-14",
        check_out="2026-03-16",
        guests=2,
    )
    assert quotes[0]["total"] == 300.0 and quotes[0]["nights"] == 2
    refused(
        env,
        "hotels_book",
        "not a Meridian",
        rate_id=quotes[0]["id"],
        guest_name="Alex Morgan",
        loyalty_number="LUM-1234567",
    )
    booked = ok(
        env,
        "hotels_book",
        rate_id=quotes[0]["id"],
        guest_name="Alex Morgan",
        loyalty_number="MER-1234567",
    )
    assert booked["hotel_address"] == "1 Seaport Boulevard" and booked["status"] == "confirmed"
    found = ok(env, "hotels_get_reservation", reservation_ref=booked["confirmation"])
    assert found["id"] == booked["id"]
    assert len(ok(env, "hotels_list_reservations", status="upcoming", city="Boston")) == 3
    refused(env, "hotels_book", "rate 'rate_0' not found", rate_id="rate_0", guest_name="Alex M")


@pytest.mark.parametrize(
    ("arguments", "needle", "kind"),
    [
        (
            {"check_in": "2026-03-14", "check_out": "2026-03-14"},
            "after check_in",
            "invalid_arguments",
        ),
        (
            {"check_in": "2026-03-14", "check_out": "14-03-2026"},
            "argument 'check_out'",
            "invalid_arguments",
        ),
        (
            {"check_in": "2026-03-14", "check_out": "2026-03-16", "guests": 0},
            "argument 'guests'",
            "invalid_arguments",
        ),
        (
            {"check_in": "2026-03-14", "check_out": "2026-03-16", "amenities": ["casino"]},
            "argument 'amenities",
            "invalid_arguments",
        ),
        (
            {"check_in": "2026-04-31", "check_out": "2026-05-02"},
            "invalid date",
            "invalid_arguments",
        ),
        (
            {"check_in": "2026-02-14", "check_out": "2026-02-16"},
            "in the past",
            "precondition_failed",
        ),
    ],
)
def test_hotels_invalid_search_arguments(arguments: dict[str, Any], needle: str, kind: str) -> None:
    env = make_env(hotels_world())
    refused(env, "hotels_search", needle, kind, city="Boston", **arguments)


def test_hotels_modify_cancel_requests_and_online_check_in() -> None:
    env = make_env(hotels_world())
    refused(
        env,
        "hotels_modify_reservation",
        "non-refundable",
        reservation_id="res_12",
        check_in="2026-03-04",
        check_out="2026-03-06",
    )
    refused(
        env,
        "hotels_modify_reservation",
        "no availability",
        reservation_id="res_11",
        check_in="2026-03-19",
        check_out="2026-03-21",
    )
    moved = ok(
        env,
        "hotels_modify_reservation",
        reservation_id="res_11",
        check_in="2026-03-10",
        check_out="2026-03-13",
    )
    assert moved["nights"] == 3 and moved["total"] == 450.0 and moved["price_difference"] == 150.0
    refused(
        env,
        "hotels_add_request",
        "flight number and landing time",
        reservation_id="res_11",
        request="airport_shuttle",
        note="please pick me up",
    )
    request = ok(
        env,
        "hotels_add_request",
        reservation_id="res_11",
        request="airport_shuttle",
        note="NW 214 landing 14:35",
    )
    assert (request["flight_no"], request["landing_time"]) == ("NW 214", "14:35")
    refused(
        env,
        "hotels_add_request",
        "already requested",
        reservation_id="res_11",
        request="airport_shuttle",
        note="NW 214 landing 14:35",
    )
    refused(
        env,
        "hotels_add_request",
        "no airport shuttle",
        reservation_id="res_12",
        request="airport_shuttle",
        note="NW 214 landing 14:35",
    )
    ok(env, "hotels_add_request", reservation_id="res_12", request="late_checkout")
    refused(
        env,
        "hotels_add_loyalty",
        "not a Lumen Suites",
        reservation_id="res_12",
        loyalty_number="MER-1234567",
    )
    assert (
        ok(env, "hotels_add_loyalty", reservation_id="res_12", loyalty_number="LUM-7654321")[
            "loyalty_number"
        ]
        == "LUM-7654321"
    )
    refused(
        env,
        "hotels_check_in_online",
        "opens on 2026-03-09",
        reservation_id="res_11",
        arrival_time="16:00",
    )
    checked = ok(env, "hotels_check_in_online", reservation_id="res_12", arrival_time="13:00")
    assert checked["online_check_in"] == {"arrival_time": "13:00", "room_ready_at": "15:00"}
    refused(env, "hotels_cancel_reservation", "accept_no_refund=true", reservation_id="res_12")
    gone = ok(env, "hotels_cancel_reservation", reservation_id="res_12", accept_no_refund=True)
    assert gone["status"] == "cancelled" and gone["refund"] == 0.0
    assert ok(env, "hotels_cancel_reservation", reservation_id="res_11")["refund"] == 450.0
    refused(env, "hotels_add_request", "is cancelled", reservation_id="res_11", request="crib")


# --------------------------------------------------------------------------- the templates


MINE = [t for t in generate_suite() if t.domain in MY_DOMAINS]


def test_my_apps_ship_enough_tools_and_skills() -> None:
    apps = all_apps()
    assert sum(len(apps[a].bound_tools) for a in MY_APPS) >= 50
    for name in MY_APPS:
        assert apps[name].skills, name
        for bound in apps[name].bound_tools.values():
            assert bound.name.startswith(f"{name}_")
            assert bound.spec.result, f"{bound.name} has no result schema"


def test_domains_cover_every_capability_twice() -> None:
    by_domain: dict[str, Counter[str]] = defaultdict(Counter)
    templates = [t for t in all_templates().values() if t.domain in MY_DOMAINS]
    for tpl in templates:
        by_domain[tpl.domain].update(tpl.capabilities)
    for domain in MY_DOMAINS:
        assert sum(t.domain == domain for t in templates) >= 7, domain
        for capability in CAPABILITIES:
            assert by_domain[domain][capability] >= 2, (domain, capability)


def test_every_template_makes_distinct_instructions() -> None:
    per_template: dict[str, set[str]] = defaultdict(set)
    for task in MINE:
        per_template[task.template or ""].add(task.instruction)
    for name, tpl in all_templates().items():
        if tpl.domain in MY_DOMAINS:
            assert len(per_template[name]) == sum(tpl.counts.values()), name


@pytest.mark.parametrize(
    ("planner", "success"), [("oracle", True), ("noop", False), ("greedy_wrong", False)]
)
def test_reference_planners_on_my_domains(planner: str, success: bool) -> None:
    env = SandboxEnv()
    wrong = [
        task.id for task in MINE if run_episode(env, task, make_planner(planner)).success != success
    ]
    assert wrong == []


def test_memory_tasks_carry_conflicting_evidence() -> None:
    for task in MINE:
        if "memory" not in task.capabilities:
            continue
        keys = Counter(item.key for item in task.memory)
        assert any(count >= 2 for count in keys.values()), task.id


def test_subagent_tasks_delegate_and_return() -> None:
    for task in MINE:
        if "subagent" not in task.capabilities:
            continue
        plan = task.reference_plan or []
        kinds = [a.type for a in plan]
        assert kinds.count("delegate") >= 2, task.id
        assert kinds[-1] == "finish" and kinds.count("finish") == kinds.count("delegate") + 1
