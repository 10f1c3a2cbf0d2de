"""Travel tasks (flights and hotels): cheapest flights, preferred airline and chain, changes,
international check-in, seats and bags, comparing hotels and dates, itineraries, shuttles."""

from __future__ import annotations

from datetime import date as Date
from datetime import timedelta
from typing import Any

from qpa.contract import Check, Delegate, Finish, MemoryItem, ToolCall
from qpa.envs.sandbox.apps.flights import AIRLINES, AIRPORTS, cabin_seats, fare_rules, seat_taken
from qpa.envs.sandbox.apps.hotels import room_free
from qpa.envs.sandbox.authoring import (
    FRIEND_GROUPS,
    conflicting_pair,
    day_phrase,
    phone_book,
    side_memory,
    texted,
    texts_sent,
)
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import (
    AMENITIES,
    BASE_DAY,
    BOOKED_BEFORE,
    CHAINS,
    ROOM_TYPES,
    TODAY,
    USER,
    Airport,
    FlightBook,
    HotelBook,
    a_ride,
    booking_for,
    clock_time,
    international_pair,
    reservation_for,
    rides_world,
)

CABIN_WORDS = {"economy": "economy", "premium_economy": "premium economy", "business": "business"}


def travel_day(g: TaskGen, low: int = 3, high: int = 26) -> str:
    return (BASE_DAY.date() + timedelta(days=g.rng.randint(low, high))).isoformat()


def shift_day(day: str, days: int) -> str:
    return (Date.fromisoformat(day) + timedelta(days=days)).isoformat()


def city_words(airport: Airport) -> str:
    return f"{airport[1]} ({airport[0]})"


def ff_number(g: TaskGen, airline: str) -> str:
    return f"{airline}-{g.rng.randint(10_000_000, 99_999_999)}"


def loyalty_number(g: TaskGen, chain: str) -> str:
    return f"{chain}-{g.rng.randint(1_000_000, 9_999_999)}"


def distinct_prices(g: TaskGen, n: int, low: int = 89, high: int = 640) -> list[float]:
    return [float(p) for p in g.rng.sample(range(low, high), n)]


ONE_BOOKING = Check(
    name="exactly one new booking",
    target="flights.bookings",
    op="count",
    where={"status": "confirmed", "booked_at__ne": BOOKED_BEFORE},
    expect=1,
)
ONE_RESERVATION = Check(
    name="exactly one new reservation",
    target="hotels.reservations",
    op="count",
    where={"status": "confirmed", "booked_at__ne": BOOKED_BEFORE},
    expect=1,
)


# --------------------------------------------------------------------------- templates


@template(domain="travel", capabilities=["tool_use"], apps=["flights"], difficulty=2)
def flights_book_cheapest_nonstop(g: TaskGen) -> Any:
    a, b = international_pair(g)
    day = travel_day(g)
    cabin = g.rng.choice(["economy", "economy", "premium_economy", "business"])
    book = FlightBook(g)
    prices = sorted(distinct_prices(g, 6, 120, 700))
    airlines = list(AIRLINES)
    # two one-stop flights cheaper than every nonstop, then four nonstops
    book.add(g.rng.choice(airlines), a[0], b[0], day, price=prices[0], stops=1)
    sold_out_first = g.rng.random() < 0.5
    nonstops = []
    for i, price in enumerate(prices[2:]):
        seats = {cabin: 0} if sold_out_first and i == 0 else None
        nonstops.append(book.add(g.rng.choice(airlines), a[0], b[0], day, price=price, seats=seats))
    book.add(g.rng.choice(airlines), a[0], b[0], day, price=prices[1], stops=1)
    book.add(g.rng.choice(airlines), a[0], b[0], shift_day(day, 1), price=prices[0] - 20)
    best = nonstops[1] if sold_out_first else nonstops[0]
    g.rng.shuffle(book.rows)
    past = book.add(g.rng.choice(airlines), b[0], a[0], "2026-02-10")
    bookings = [booking_for(past, "bk_11", g)]
    return g.task(
        instruction=(
            f"Book the cheapest nonstop {CABIN_WORDS[cabin]} flight from {city_words(a)} to "
            f"{city_words(b)} on {day_phrase(day)}."
        ),
        world={"flights": {"flights": book.rows, "bookings": bookings}},
        checks=[
            Check(
                name="cheapest nonstop with seats booked",
                target="flights.bookings",
                where={"flight_id": best["id"], "cabin": cabin, "status": "confirmed"},
            ),
            ONE_BOOKING,
        ],
        plan=[
            ToolCall(
                tool="flights_search",
                arguments={
                    "origin": a[0],
                    "destination": b[0],
                    "date": day,
                    "cabin": cabin,
                    "max_stops": 0,
                },
            ),
            ToolCall(tool="flights_book", arguments={"flight_id": best["id"], "cabin": cabin}),
            Finish(),
        ],
        difficulty=3 if sold_out_first else 2,
        confirmations=["flights_book"],
    )


@template(domain="travel", capabilities=["tool_use"], apps=["hotels", "rides"], difficulty=4)
def travel_hotel_then_airport_ride(g: TaskGen) -> Any:
    airport = g.rng.choice(AIRPORTS)
    city = airport[1]
    check_in = travel_day(g, 3, 22)
    nights = g.rng.randint(1, 4)
    check_out = shift_day(check_in, nights)
    guests = g.rng.randint(1, 3)
    hotels = HotelBook(g)
    prices = sorted(distinct_prices(g, 3, 95, 420))
    fits = [t for t in ROOM_TYPES if t[1] >= guests]
    blocked_first = g.rng.random() < 0.5
    target = hotels.add(
        city,
        rates=prices,
        sold_out=[[check_in] if blocked_first else [], [], []],
    )
    rooms = hotels.rooms_of(target)
    for room in rooms:  # every room fits the party; the first may be sold out
        room["room_type"], room["max_guests"] = g.rng.choice(fits)
    best = rooms[1] if blocked_first else rooms[0]
    for _ in range(3):
        hotels.add(city)
    hotels.add(g.rng.choice([a[1] for a in AIRPORTS if a[1] != city]))
    ride_class = g.rng.choice(["economy", "green", "comfort", "xl", "black"])
    hour = f"{g.rng.randint(6, 14):02d}:{g.rng.choice(['00', '15', '30', '45'])}"
    pickup_time = f"{check_out}T{hour}"
    who = "just me" if guests == 1 else f"{guests} guests"
    return g.task(
        instruction=(
            f"Book the cheapest available room at {target['name']} in {city} from "
            f"{day_phrase(check_in)} to {day_phrase(check_out)} ({who}), then schedule "
            f"{a_ride(ride_class)} from the hotel to {airport[2]} at {hour} on "
            "check-out day."
        ),
        world={
            "hotels": {"hotels": hotels.hotels, "rooms": hotels.rooms},
            "rides": rides_world(g),
        },
        checks=[
            Check(
                name="cheapest available room booked",
                target="hotels.reservations",
                where={
                    "hotel_id": target["id"],
                    "room_id": best["id"],
                    "check_in": check_in,
                    "check_out": check_out,
                    "guests": guests,
                    "status": "confirmed",
                },
            ),
            ONE_RESERVATION,
            Check(
                name="ride to the airport scheduled",
                target="rides.rides",
                where={
                    "status": "scheduled",
                    "pickup": target["address"],
                    "dropoff": airport[2],
                    "scheduled_for": pickup_time,
                    "ride_class": ride_class,
                },
            ),
            Check(
                name="one ride scheduled",
                target="rides.rides",
                op="count",
                where={"status": "scheduled"},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(
                tool="hotels_search",
                arguments={
                    "city": city,
                    "check_in": check_in,
                    "check_out": check_out,
                    "guests": guests,
                },
            ),
            ToolCall(
                tool="hotels_check_availability",
                arguments={
                    "hotel_id": target["id"],
                    "check_in": check_in,
                    "check_out": check_out,
                    "guests": guests,
                },
            ),
            ToolCall(tool="hotels_book", arguments={"rate_id": "${1.0.id}", "guest_name": USER}),
            ToolCall(
                tool="rides_schedule",
                arguments={
                    "dropoff": airport[2],
                    "pickup": "${2.hotel_address}",
                    "ride_class": ride_class,
                    "pickup_time": pickup_time,
                },
            ),
            Finish(),
        ],
        confirmations=["hotels_book"],
    )


@template(domain="travel", capabilities=["memory"], apps=["flights"], difficulty=3)
def flights_preferred_airline_ff(g: TaskGen) -> Any:
    a, b = international_pair(g)
    day = travel_day(g)
    right, wrong, third = g.rng.sample(list(AIRLINES), 3)
    book = FlightBook(g)
    prices = distinct_prices(g, 6, 110, 650)
    mine = sorted(prices[:3])
    best = book.add(right, a[0], b[0], day, price=mine[0])
    book.add(right, a[0], b[0], day, price=mine[1])
    book.add(right, a[0], b[0], day, price=mine[2], stops=1)
    book.add(wrong, a[0], b[0], day, price=round(mine[0] - g.rng.randint(10, 60), 0))
    book.add(wrong, a[0], b[0], day, price=prices[4])
    book.add(third, a[0], b[0], day, price=round(mine[0] - g.rng.randint(5, 40), 0))
    g.rng.shuffle(book.rows)
    numbers = {code: ff_number(g, code) for code in (right, wrong, third)}
    memory = [
        *conflicting_pair(g.rng, "preferred_airline", AIRLINES[right], AIRLINES[wrong]),
        *(
            MemoryItem(
                key=f"frequent_flyer_number:{AIRLINES[code]}",
                value=numbers[code],
                evidence="stated",
                source="profile",
            )
            for code in (right, wrong, third)
        ),
        side_memory(g.rng),
    ]
    return g.task(
        instruction=(
            f"Book me economy from {city_words(a)} to {city_words(b)} on {day_phrase(day)}: the "
            "cheapest flight on the airline I prefer, with my frequent flyer number on it."
        ),
        world={"flights": {"flights": book.rows}},
        checks=[
            Check(
                name="preferred airline's cheapest flight with the right number",
                target="flights.bookings",
                where={
                    "flight_id": best["id"],
                    "cabin": "economy",
                    "frequent_flyer": numbers[right],
                    "status": "confirmed",
                },
            ),
            ONE_BOOKING,
        ],
        memory=memory,
        plan=[
            ToolCall(
                tool="flights_search",
                arguments={"origin": a[0], "destination": b[0], "date": day, "airline": right},
            ),
            ToolCall(
                tool="flights_book",
                arguments={
                    "flight_id": best["id"],
                    "cabin": "economy",
                    "frequent_flyer_number": numbers[right],
                },
            ),
            Finish(),
        ],
        confirmations=["flights_book"],
    )


@template(domain="travel", capabilities=["memory"], apps=["hotels"], difficulty=3)
def hotels_usual_chain_loyalty(g: TaskGen) -> Any:
    city = g.rng.choice(sorted({a[1] for a in AIRPORTS}))
    check_in = travel_day(g, 3, 24)
    check_out = shift_day(check_in, g.rng.randint(1, 4))
    right, wrong = g.rng.sample(list(CHAINS), 2)
    hotels = HotelBook(g)
    low = sorted(distinct_prices(g, 4, 90, 400))
    cheap_full = g.rng.random() < 0.5
    blocked = [check_in] if cheap_full else []
    cheap = hotels.add(city, chain=right, rates=[low[1], low[3]], sold_out=[blocked, blocked])
    pricey = hotels.add(city, chain=right, rates=[low[2] + 10, low[3] + 40])
    hotels.add(city, chain=wrong, rates=[low[0], low[2]])
    neutral = g.rng.choice([c for c in CHAINS if c not in (right, wrong)])
    hotels.add(city, chain=neutral, rates=[low[0] + 5, low[1] + 15])
    target = pricey if cheap_full else cheap
    room = hotels.rooms_of(target)[0]
    numbers = {code: loyalty_number(g, code) for code in (right, wrong)}
    memory = [
        *conflicting_pair(g.rng, "hotel_chain", CHAINS[right], CHAINS[wrong]),
        *(
            MemoryItem(
                key=f"loyalty_number:{CHAINS[code]}",
                value=numbers[code],
                evidence="stated",
                source="profile",
            )
            for code in (right, wrong)
        ),
        side_memory(g.rng),
    ]
    return g.task(
        instruction=(
            f"Book me a room in {city} from {day_phrase(check_in)} to {day_phrase(check_out)} at "
            "my usual hotel chain, whichever of theirs is cheapest with availability, and add my "
            "loyalty number."
        ),
        world={"hotels": {"hotels": hotels.hotels, "rooms": hotels.rooms}},
        checks=[
            Check(
                name="usual chain's cheapest available room with loyalty number",
                target="hotels.reservations",
                where={
                    "hotel_id": target["id"],
                    "room_id": room["id"],
                    "check_in": check_in,
                    "check_out": check_out,
                    "loyalty_number": numbers[right],
                    "status": "confirmed",
                },
            ),
            ONE_RESERVATION,
        ],
        memory=memory,
        plan=[
            ToolCall(
                tool="hotels_search",
                arguments={
                    "city": city,
                    "check_in": check_in,
                    "check_out": check_out,
                    "chain": right,
                },
            ),
            ToolCall(
                tool="hotels_check_availability",
                arguments={"hotel_id": target["id"], "check_in": check_in, "check_out": check_out},
            ),
            ToolCall(
                tool="hotels_book",
                arguments={
                    "rate_id": "${1.0.id}",
                    "guest_name": USER,
                    "loyalty_number": numbers[right],
                },
            ),
            Finish(),
        ],
        confirmations=["hotels_book"],
    )


@template(domain="travel", capabilities=["skills"], apps=["flights"], difficulty=3)
def flights_change_to_new_date(g: TaskGen) -> Any:
    a, b = international_pair(g)
    day = travel_day(g, 6, 20)
    new_day = shift_day(day, g.rng.choice([-3, -2, -1, 1, 2, 3]))
    airline = g.rng.choice(list(AIRLINES))
    other = g.rng.choice([c for c in AIRLINES if c != airline])
    book = FlightBook(g)
    old_fare = float(g.rng.randint(90, 200))
    current = book.add(airline, a[0], b[0], day, price=old_fare)
    departs = sorted(g.rng.sample(range(6 * 60, 20 * 60, 5), 4))
    full_first = g.rng.random() < 0.5
    candidates = []
    for i, minute in enumerate(departs[1:]):
        candidates.append(
            book.add(
                airline,
                a[0],
                b[0],
                new_day,
                depart=clock_time(minute),
                price=old_fare + g.rng.randint(15, 180),
                seats={"economy": 0} if full_first and i == 0 else None,
            )
        )
    book.add(other, a[0], b[0], new_day, depart=clock_time(departs[0]), price=old_fare + 5)
    book.add(airline, b[0], a[0], new_day)
    best = candidates[1] if full_first else candidates[0]
    g.rng.shuffle(book.rows)
    booking = booking_for(current, "bk_31", g)
    diff = round(best["fares"]["economy"] - old_fare, 2)
    fee = fare_rules(airline, "economy")["change_fee"]
    return g.task(
        instruction=(
            f"Move my flight {booking['pnr']} to {day_phrase(new_day)}: same route, the earliest "
            "flight that day that still has seats. I'm fine paying the difference."
        ),
        world={"flights": {"flights": book.rows, "bookings": [booking]}},
        checks=[
            Check(
                name="booking moved to the earliest flight with seats",
                target="flights.bookings",
                where={
                    "id": "bk_31",
                    "flight_id": best["id"],
                    "date": new_day,
                    "status": "confirmed",
                    "fare_difference_paid": diff,
                    "change_fee_paid": fee,
                },
            ),
            Check(name="no new booking", target="flights.bookings", op="count", where={}, expect=1),
        ],
        plan=[
            ToolCall(tool="flights_get_booking", arguments={"booking_ref": booking["pnr"]}),
            ToolCall(
                tool="flights_search",
                arguments={
                    "origin": a[0],
                    "destination": b[0],
                    "date": new_day,
                    "airline": airline,
                    "sort_by": "departure",
                },
            ),
            ToolCall(
                tool="flights_change_booking",
                arguments={
                    "booking_id": "bk_31",
                    "new_flight_id": best["id"],
                    "accept_fare_difference": True,
                },
            ),
            Finish(),
        ],
        confirmations=["flights_change_booking"],
    )


@template(domain="travel", capabilities=["skills", "memory"], apps=["flights"], difficulty=4)
def flights_international_check_in(g: TaskGen) -> Any:
    a, b = international_pair(g, domestic=False)
    tonight = g.rng.random() < 0.5
    day = TODAY if tonight else "2026-03-03"
    depart = (
        clock_time(g.rng.randrange(13 * 60, 23 * 60, 5))
        if tonight
        else clock_time(g.rng.randrange(6 * 60, 8 * 60 + 55, 5))
    )
    book = FlightBook(g)
    flight = book.add(g.rng.choice(list(AIRLINES)), a[0], b[0], day, depart=depart)
    later = book.add(g.rng.choice(list(AIRLINES)), b[0], a[0], travel_day(g, 8, 20))
    booking = booking_for(flight, "bk_41", g)
    back = booking_for(later, "bk_42", g)

    def passport_number() -> str:
        return f"{g.rng.choice('XYZABCDE')}{g.rng.randint(10_000_000, 99_999_999)}"

    right = {
        "number": passport_number(),
        "nationality": "US",
        "expiry": f"{g.rng.randint(2029, 2035)}-{g.rng.randint(1, 12):02d}-15",
    }
    stale_expiry = g.rng.choice(["2026-05-20", "2026-07-01", "2028-10-10", "2030-02-02"])
    wrong = {"number": passport_number(), "nationality": "US", "expiry": stale_expiry}

    def said(p: dict[str, str]) -> str:
        return f"passport {p['number']}, nationality {p['nationality']}, expires {p['expiry']}"

    memory = [*conflicting_pair(g.rng, "passport", said(right), said(wrong)), side_memory(g.rng)]
    when = "tonight" if tonight else "tomorrow morning"
    return g.task(
        instruction=(f"Check me in for my flight to {b[1]} {when} (booking {booking['pnr']})."),
        world={"flights": {"flights": book.rows, "bookings": [booking, back]}},
        checks=[
            Check(
                name="checked in with the current passport",
                target="flights.bookings",
                where={"id": "bk_41", "checked_in": True, "passport": right},
            ),
            Check(
                name="return flight untouched",
                target="flights.bookings",
                where={"id": "bk_42", "checked_in": False, "passport": None},
            ),
        ],
        memory=memory,
        plan=[
            ToolCall(tool="flights_get_booking", arguments={"booking_ref": booking["pnr"]}),
            ToolCall(
                tool="flights_add_passport",
                arguments={
                    "booking_id": "bk_41",
                    "passport_number": right["number"],
                    "nationality": "US",
                    "expiry": right["expiry"],
                },
            ),
            ToolCall(tool="flights_check_in", arguments={"booking_id": "bk_41"}),
            Finish(),
        ],
    )


@template(domain="travel", capabilities=["subagent"], apps=["hotels"], difficulty=4)
def hotels_compare_three(g: TaskGen) -> Any:
    city = g.rng.choice(sorted({a[1] for a in AIRPORTS}))
    check_in = travel_day(g, 3, 24)
    check_out = shift_day(check_in, g.rng.randint(1, 3))
    guests = g.rng.randint(1, 2)
    for _ in range(50):
        hotels = HotelBook(g)
        trio = []
        for i in range(3):
            full = i == 2 and g.rng.random() < 0.4
            trio.append(
                hotels.add(
                    city,
                    refundable=[g.rng.random() < 0.5, True, g.rng.random() < 0.5],
                    rates=sorted(distinct_prices(g, 3, 90, 420)),
                    sold_out=[[check_in]] * 3 if full else None,
                )
            )
        hotels.add(city)
        hotels.add(city)
        options = []
        for h in trio:
            free = sorted(
                (
                    r
                    for r in hotels.rooms_of(h)
                    if r["max_guests"] >= guests and room_free(r, check_in, check_out)
                ),
                key=lambda r: r["nightly_rate"],
            )
            for j, room in enumerate(free):
                if room["refundable"]:
                    options.append((room["nightly_rate"], h, room, j))
        rates = [o[0] for o in options]
        if options and rates.count(min(rates)) == 1:
            break
    _, best_hotel, best_room, quote_index = min(options, key=lambda o: o[0])
    best_i = trio.index(best_hotel)
    plan: list[Any] = []
    for i, h in enumerate(trio):
        free_refundable = [o for o in options if o[1] is h]
        answer = (
            f"{h['name']}: cheapest refundable ${free_refundable[0][0]:.0f}/night"
            if free_refundable
            else f"{h['name']}: nothing refundable available"
        )
        plan += [
            Delegate(
                goal=f"Check {h['name']} ({h['id']}) in {city} from {check_in} to {check_out} "
                f"for {guests} guest(s); report its cheapest refundable room and rate id.",
                tools=["hotels_check_availability"],
                agent=f"hotel_{i + 1}",
            ),
            ToolCall(
                tool="hotels_check_availability",
                arguments={
                    "hotel_id": h["id"],
                    "check_in": check_in,
                    "check_out": check_out,
                    "guests": guests,
                },
            ),
            Finish(answer=answer),
        ]
    plan += [
        ToolCall(
            tool="hotels_book",
            arguments={"rate_id": f"${{{1 + 3 * best_i}.{quote_index}.id}}", "guest_name": USER},
        ),
        Finish(answer=best_hotel["name"]),
    ]
    names = f"{trio[0]['name']}, {trio[1]['name']} and {trio[2]['name']}"
    who = "one guest" if guests == 1 else "two guests"
    return g.task(
        instruction=(
            f"For {day_phrase(check_in)} to {day_phrase(check_out)} in {city} ({who}), compare "
            f"{names} with one helper per hotel, and book the cheapest refundable room among them."
        ),
        world={"hotels": {"hotels": hotels.hotels, "rooms": hotels.rooms}},
        checks=[
            Check(
                name="cheapest refundable room of the three",
                target="hotels.reservations",
                where={
                    "hotel_id": best_hotel["id"],
                    "room_id": best_room["id"],
                    "check_in": check_in,
                    "check_out": check_out,
                    "refundable": True,
                },
            ),
            ONE_RESERVATION,
        ],
        plan=plan,
        confirmations=["hotels_book"],
    )


@template(domain="travel", capabilities=["subagent"], apps=["flights"], difficulty=4)
def flights_cheapest_of_three_dates(g: TaskGen) -> Any:
    a, b = international_pair(g)
    first = travel_day(g, 3, 20)
    days = sorted({first, shift_day(first, g.rng.randint(1, 3)), shift_day(first, 4)})
    book = FlightBook(g)
    prices = distinct_prices(g, 12, 100, 700)
    cheapest: list[tuple[float, dict[str, Any]]] = []
    for d_i, day in enumerate(days):
        p = sorted(prices[d_i * 4 : d_i * 4 + 4])
        book.add(g.rng.choice(list(AIRLINES)), a[0], b[0], day, price=p[0], stops=1)
        full = g.rng.random() < 0.4
        n1 = book.add(
            g.rng.choice(list(AIRLINES)),
            a[0],
            b[0],
            day,
            price=p[1],
            seats={"economy": 0} if full else None,
        )
        n2 = book.add(g.rng.choice(list(AIRLINES)), a[0], b[0], day, price=p[2])
        book.add(g.rng.choice(list(AIRLINES)), a[0], b[0], day, price=p[3])
        cheapest.append((n2["fares"]["economy"], n2) if full else (n1["fares"]["economy"], n1))
    best_price, best = min(cheapest, key=lambda c: c[0])
    plan: list[Any] = []
    for i, day in enumerate(days):
        plan += [
            Delegate(
                goal=f"Find the cheapest nonstop economy flight {a[0]}-{b[0]} on {day} that has "
                "seats; report its id and price.",
                tools=["flights_search"],
                agent=f"date_{i + 1}",
            ),
            ToolCall(
                tool="flights_search",
                arguments={"origin": a[0], "destination": b[0], "date": day, "max_stops": 0},
            ),
            Finish(answer=f"{day}: {cheapest[i][1]['id']} at ${cheapest[i][0]:.0f}"),
        ]
    plan += [
        ToolCall(tool="flights_book", arguments={"flight_id": best["id"], "cabin": "economy"}),
        Finish(answer=f"{best['flight_no']} on {best['date']} for ${best_price:.0f}"),
    ]
    listed = ", ".join(day_phrase(d) for d in days[:-1]) + f" or {day_phrase(days[-1])}"
    return g.task(
        instruction=(
            f"I can fly {city_words(a)} to {city_words(b)} on {listed}. Have a helper check "
            "each date, then book the cheapest nonstop economy seat overall."
        ),
        world={"flights": {"flights": book.rows}},
        checks=[
            Check(
                name="cheapest nonstop across the dates booked",
                target="flights.bookings",
                where={"flight_id": best["id"], "cabin": "economy", "status": "confirmed"},
            ),
            ONE_BOOKING,
        ],
        plan=plan,
        confirmations=["flights_book"],
    )


@template(domain="travel", capabilities=["tool_use"], apps=["flights"], difficulty=3)
def flights_seat_and_bags(g: TaskGen) -> Any:
    a, b = international_pair(g)
    book = FlightBook(g)
    flight = book.add(g.rng.choice(list(AIRLINES)), a[0], b[0], travel_day(g, 4, 24))
    other = book.add(g.rng.choice(list(AIRLINES)), b[0], a[0], travel_day(g, 4, 24))
    booking = booking_for(flight, "bk_51", g)
    bookings = [booking, booking_for(other, "bk_52", g)]
    seat_type = g.rng.choice(["aisle", "window"])
    letters = "CD" if seat_type == "aisle" else "AF"
    for _ in range(20):
        max_row = g.rng.randint(11, 26)
        ok = [
            s
            for s in cabin_seats("economy")
            if s[-1] in letters and int(s[:-1]) <= max_row and not seat_taken(flight, s)
        ]
        if ok:
            break
    bags = g.rng.randint(1, 2)
    bag_words = "one checked bag" if bags == 1 else "two checked bags"
    article = "an" if seat_type == "aisle" else "a"
    return g.task(
        instruction=(
            f"On booking {booking['pnr']}, get me {article} {seat_type} seat in row {max_row} or "
            f"closer to the front, and add {bag_words}."
        ),
        world={"flights": {"flights": book.rows, "bookings": bookings}},
        checks=[
            Check(
                name="seat and bags on the booking",
                target="flights.bookings",
                where={"id": "bk_51", "seat__in": ok, "bags": bags},
            ),
            Check(
                name="other booking untouched",
                target="flights.bookings",
                where={"id": "bk_52", "seat": None, "bags": 0},
            ),
        ],
        plan=[
            ToolCall(tool="flights_get_booking", arguments={"booking_ref": booking["pnr"]}),
            ToolCall(
                tool="flights_get_seat_map",
                arguments={"flight_id": flight["id"], "cabin": "economy", "seat_type": seat_type},
            ),
            ToolCall(
                tool="flights_select_seat", arguments={"booking_id": "bk_51", "seat": "${1.0.seat}"}
            ),
            ToolCall(tool="flights_add_bags", arguments={"booking_id": "bk_51", "count": bags}),
            Finish(),
        ],
        confirmations=["flights_add_bags"],
    )


def _trip_world(
    g: TaskGen, *, shuttle: bool = False
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], Airport]:
    """Two upcoming trips (flight + hotel each); returns the world parts and the target trip."""
    home, there = international_pair(g)
    elsewhere = g.rng.choice([x for x in AIRPORTS if x[1] not in (home[1], there[1])])
    day = travel_day(g, 3, 14)
    later = travel_day(g, 16, 26)
    book = FlightBook(g)
    outbound = book.add(g.rng.choice(list(AIRLINES)), home[0], there[0], day)
    other = book.add(g.rng.choice(list(AIRLINES)), home[0], elsewhere[0], later)
    bookings = [booking_for(outbound, "bk_61", g), booking_for(other, "bk_62", g)]
    hotels = HotelBook(g)
    amen = sorted({*g.rng.sample(AMENITIES, 3), "airport_shuttle"}) if shuttle else None
    stay = hotels.add(there[1], amenities=amen)
    away = hotels.add(elsewhere[1])
    reservations = [
        reservation_for(stay, hotels.rooms_of(stay)[0], day, shift_day(day, 3), "res_61", g),
        reservation_for(away, hotels.rooms_of(away)[0], later, shift_day(later, 2), "res_62", g),
    ]
    world = {
        "flights": {"flights": book.rows, "bookings": bookings},
        "hotels": {"hotels": hotels.hotels, "rooms": hotels.rooms, "reservations": reservations},
    }
    return world, outbound, stay, reservations[0], there


@template(
    domain="travel",
    capabilities=["tool_use"],
    apps=["flights", "hotels", "contacts", "messaging"],
    difficulty=3,
)
def travel_text_itinerary(g: TaskGen) -> Any:
    world, flight, hotel, _, there = _trip_world(g)
    friends = phone_book(g.fake, 6, first_id=300, groups=FRIEND_GROUPS)
    friend = g.rng.choice(friends)
    text = (
        f"I land in {there[1]} on {flight['date']} at {flight['arrive']} ({flight['flight_no']}) "
        f"and I'm staying at {hotel['name']}, {hotel['address']}."
    )
    return g.task(
        instruction=(
            f"Text {friend['name']} when my flight to {there[1]} lands and the address of my "
            "hotel there."
        ),
        world={**world, "contacts": {"contacts": friends}, "messaging": {"messages": []}},
        checks=[
            texted(
                "text has the hotel address",
                {"to": friend["phone"], "text__contains": hotel["address"]},
            ),
            texted(
                "text has the landing time",
                {"to": friend["phone"], "text__contains": flight["arrive"]},
            ),
            texts_sent(1, "one text sent"),
        ],
        plan=[
            ToolCall(tool="flights_list_bookings", arguments={"status": "upcoming"}),
            ToolCall(tool="hotels_list_reservations", arguments={"city": there[1]}),
            ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${2.0.phone}", "text": text}),
            Finish(),
        ],
    )


@template(
    domain="travel", capabilities=["skills", "tool_use"], apps=["hotels", "flights"], difficulty=3
)
def hotels_shuttle_for_arrival(g: TaskGen) -> Any:
    world, flight, _, reservation, there = _trip_world(g, shuttle=True)
    note = f"{flight['flight_no']} landing {flight['arrive']}"
    return g.task(
        instruction=(
            f"Ask my hotel in {there[1]} to pick me up with their airport shuttle when I land "
            f"there on {day_phrase(flight['date'])}."
        ),
        world=world,
        checks=[
            Check(
                name="shuttle request carries the flight and landing time",
                target="hotels.requests",
                where={
                    "reservation_id": reservation["id"],
                    "kind": "airport_shuttle",
                    "flight_no": flight["flight_no"],
                    "landing_time": flight["arrive"],
                },
            ),
            Check(
                name="one request sent", target="hotels.requests", op="count", where={}, expect=1
            ),
        ],
        plan=[
            ToolCall(tool="flights_list_bookings", arguments={"status": "upcoming"}),
            ToolCall(tool="hotels_list_reservations", arguments={"city": there[1]}),
            ToolCall(
                tool="hotels_add_request",
                arguments={
                    "reservation_id": reservation["id"],
                    "request": "airport_shuttle",
                    "note": note,
                },
            ),
            Finish(),
        ],
    )
