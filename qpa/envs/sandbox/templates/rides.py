"""Ride-hailing tasks: cheapest class that fits, usual class and card, surge, airport pickups,
sharing the car with a friend, ride vs transit, tips."""

from __future__ import annotations

from typing import Any

from qpa.contract import Check, Delegate, Finish, ToolCall
from qpa.envs.sandbox.apps.rides import ride_price
from qpa.envs.sandbox.authoring import (
    FRIEND_GROUPS,
    conflicting_pair,
    phone_book,
    side_memory,
    texted,
    texts_sent,
)
from qpa.envs.sandbox.engine import DEFAULT_START
from qpa.envs.sandbox.geo import distance_km, travel_minutes
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import (
    CARS,
    CLASS_WORDS,
    PRODUCTS,
    TODAY,
    FlightBook,
    HotelBook,
    Places,
    a_ride,
    booking_for,
    default_cards,
    international_pair,
    labels,
    plate,
    reservation_for,
    rides_world,
)

LANDMARKS = [
    "Union Square",
    "Riverside Mall",
    "Grand Library",
    "Tech Park",
    "Old Town Museum",
    "Sports Arena",
    "Botanical Garden",
    "Central Station",
    "City Hall",
    "Harbor Pier",
    "Convention Center",
    "University Library",
    "Opera House",
    "Farmers Market",
]
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
COMMENTS = ["", "Great driver!", "Smooth ride, thanks.", "Clean car and friendly.", "On time."]


def product(world: dict[str, Any], ride_class: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in world["products"] if p["id"] == ride_class)
    return found


def driver(world: dict[str, Any], ride_class: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        d for d in world["drivers"] if d["product"] == ride_class and d["available"]
    )
    return found


def saved_places(g: TaskGen, builder: Places) -> tuple[list[dict[str, Any]], str, str]:
    home, work = builder.address(), builder.address()
    rows = [
        {"id": "pl_1", "label": "home", "address": home},
        {"id": "pl_2", "label": "work", "address": work},
        {"id": "pl_3", "label": "gym", "address": builder.address()},
    ]
    return rows, home, work


def past_ride(
    g: TaskGen,
    world: dict[str, Any],
    ride_id: str,
    pickup: str,
    dropoff: str,
    ride_class: str,
    when: str,
    *,
    rating: int | None = 5,
    tip: float = 0.0,
) -> dict[str, Any]:
    """A completed trip from the history."""
    fare = ride_price(product(world, ride_class), distance_km(pickup, dropoff))
    return {
        "id": ride_id,
        "status": "completed",
        "pickup": pickup,
        "dropoff": dropoff,
        "stops": [],
        "ride_class": ride_class,
        "passengers": 1,
        "estimate_id": None,
        "fare": fare,
        "surge_multiplier": 1.0,
        "surge_confirmation_id": None,
        "payment_method_id": "pm_1",
        "pickup_note": "",
        "driver": {
            "name": g.fake.name(),
            "car": g.rng.choice(CARS[ride_class]),
            "plate": plate(g),
            "rating": 4.9,
        },
        "requested_at": when,
        "scheduled_for": None,
        "pickup_eta_min": 4,
        "completed_at": when[:-5] + f"{int(when[-5:-3]) + 1:02d}:{when[-2:]}",
        "rating": rating,
        "tip": tip,
        "cancellation_fee": 0.0,
    }


def destination(g: TaskGen, builder: Places) -> str:
    return g.rng.choice(LANDMARKS) if g.rng.random() < 0.4 else builder.address()


def accepted(where: dict[str, Any]) -> dict[str, Any]:
    return {"status": "accepted", **where}


ONE_RIDE = Check(
    name="exactly one ride requested",
    target="rides.rides",
    op="count",
    where={"status": "accepted"},
    expect=1,
)
NO_RIDE = Check(
    name="no ride requested",
    target="rides.rides",
    op="count",
    where={"status": "accepted"},
    expect=0,
)


# --------------------------------------------------------------------------- templates


@template(domain="rides", capabilities=["tool_use"], apps=["rides"], difficulty=2)
def ride_cheapest_for_group(g: TaskGen) -> Any:
    builder = Places(g)
    pickup = builder.address()
    dropoff = destination(g, builder)
    n = g.rng.randint(1, 6)
    fitting = [p[0] for p in PRODUCTS if p[2] >= n]
    busy = set(g.rng.sample(fitting, min(len(fitting) - 1, g.rng.randint(0, 2))))
    world = rides_world(g, unavailable=busy)
    d = distance_km(pickup, dropoff)
    best = min((ride_price(product(world, pid), d), pid) for pid in fitting if pid not in busy)[1]
    who = "just me" if n == 1 else f"the {NUMBER_WORDS[n]} of us"
    return g.task(
        instruction=f"Book the cheapest ride that fits {who} from {pickup} to {dropoff}.",
        world={"rides": world},
        checks=[
            Check(
                name="cheapest available class that fits",
                target="rides.rides",
                where=accepted(
                    {"pickup": pickup, "dropoff": dropoff, "ride_class": best, "passengers": n}
                ),
            ),
            ONE_RIDE,
        ],
        plan=[
            ToolCall(
                tool="rides_get_estimates",
                arguments={"pickup": pickup, "dropoff": dropoff, "passengers": n},
            ),
            ToolCall(
                tool="rides_request", arguments={"estimate_id": f"${{0.{fitting.index(best)}.id}}"}
            ),
            Finish(),
        ],
        difficulty=2 if busy else 1,
        confirmations=["rides_request"],
    )


@template(
    domain="rides",
    capabilities=["tool_use", "skills"],
    apps=["rides", "flights", "hotels"],
    difficulty=5,
)
def ride_airport_to_hotel(g: TaskGen) -> Any:

    origin, airport = international_pair(g, domestic=g.rng.random() < 0.6)
    flights = FlightBook(g)
    arriving = flights.add(
        g.rng.choice(["NW", "BH", "SW", "PJ", "AT"]),
        origin[0],
        airport[0],
        TODAY,
        arrive_before="08:55",
    )
    flights.add(g.rng.choice(["NW", "BH", "SW"]), airport[0], origin[0], "2026-03-09")
    hotels = HotelBook(g)
    hotel = hotels.add(airport[1])
    other = hotels.add(origin[1])
    reservations = [
        reservation_for(hotel, hotels.rooms_of(hotel)[0], TODAY, "2026-03-05", "res_11", g),
        reservation_for(other, hotels.rooms_of(other)[0], "2026-03-20", "2026-03-22", "res_12", g),
    ]
    ride_class = g.rng.choice(["economy", "green", "comfort", "xl", "black"])
    world = rides_world(g)
    terminal = arriving["arrival_terminal"]
    pickup = airport[2]
    return g.task(
        instruction=(
            f"I just landed at {pickup} on {arriving['flight_no']}. Get me "
            f"{a_ride(ride_class)} to my hotel."
        ),
        world={
            "rides": world,
            "flights": {"flights": flights.rows, "bookings": [booking_for(arriving, "bk_21", g)]},
            "hotels": {
                "hotels": hotels.hotels,
                "rooms": hotels.rooms,
                "reservations": reservations,
            },
        },
        checks=[
            Check(
                name="ride from the airport to the hotel",
                target="rides.rides",
                where=accepted(
                    {
                        "pickup__icontains": "airport",
                        "dropoff": hotel["address"],
                        "ride_class": ride_class,
                    }
                ),
            ),
            Check(
                name="pickup note names the arrival terminal",
                target="rides.rides",
                where=accepted({"pickup_note__icontains": f"terminal {terminal}"}),
            ),
            ONE_RIDE,
        ],
        plan=[
            ToolCall(
                tool="flights_get_status",
                arguments={"flight_no": arriving["flight_no"], "date": TODAY},
            ),
            ToolCall(
                tool="hotels_list_reservations",
                arguments={"status": "upcoming", "city": airport[1]},
            ),
            ToolCall(
                tool="rides_get_estimates",
                arguments={
                    "pickup": pickup,
                    "dropoff": "${1.0.hotel_address}",
                    "ride_class": ride_class,
                },
            ),
            ToolCall(
                tool="rides_request",
                arguments={
                    "estimate_id": "${2.0.id}",
                    "pickup_note": "Terminal ${0.arrival_terminal} arrivals",
                },
            ),
            Finish(),
        ],
        confirmations=["rides_request"],
    )


@template(domain="rides", capabilities=["memory"], apps=["rides"], difficulty=2)
def ride_home_usual_class(g: TaskGen) -> Any:
    builder = Places(g)
    places, home, _ = saved_places(g, builder)
    pickup = g.rng.choice([builder.address(), g.rng.choice(LANDMARKS)])
    right, wrong = g.rng.sample(["economy", "green", "comfort", "xl", "black"], 2)
    world = rides_world(g, places=places)
    phrase = g.rng.choice(
        ["my usual ride class", "the class I usually take", "my usual kind of car"]
    )
    memory = [
        *conflicting_pair(g.rng, "ride_class", CLASS_WORDS[right], CLASS_WORDS[wrong]),
        side_memory(g.rng),
    ]
    return g.task(
        instruction=f"I'm at {pickup}. Book me a ride home, {phrase}.",
        world={"rides": world},
        checks=[
            Check(
                name="ride home in the remembered class",
                target="rides.rides",
                where=accepted({"dropoff": home, "ride_class": right}),
            ),
            ONE_RIDE,
        ],
        memory=memory,
        plan=[
            ToolCall(tool="rides_list_places", arguments={}),
            ToolCall(
                tool="rides_get_estimates",
                arguments={"pickup": pickup, "dropoff": "${0.0.address}", "ride_class": right},
            ),
            ToolCall(tool="rides_request", arguments={"estimate_id": "${1.0.id}"}),
            Finish(),
        ],
        confirmations=["rides_request"],
    )


@template(domain="rides", capabilities=["memory", "tool_use"], apps=["rides"], difficulty=3)
def ride_to_work_on_work_card(g: TaskGen) -> Any:
    builder = Places(g)
    places, _, work = saved_places(g, builder)
    pickup = builder.address()
    cards = default_cards(g)
    right, wrong = g.rng.sample(cards[1:], 2) if g.rng.random() < 0.5 else (cards[1], cards[0])
    ride_class = g.rng.choice(["economy", "green", "comfort", "black"])
    world = rides_world(g, places=places, cards=cards)

    def card(c: dict[str, Any]) -> str:
        return f"{c['brand']} ending {c['last4']}"

    memory = [
        *conflicting_pair(g.rng, "work_ride_card", card(right), card(wrong)),
        side_memory(g.rng),
    ]
    return g.task(
        instruction=(
            f"I'm at {pickup}. Book {a_ride(ride_class)} to work and put it on the "
            "card I use for work rides."
        ),
        world={"rides": world},
        checks=[
            Check(
                name="ride to work on the work card",
                target="rides.rides",
                where=accepted(
                    {"dropoff": work, "ride_class": ride_class, "payment_method_id": right["id"]}
                ),
            ),
            ONE_RIDE,
        ],
        memory=memory,
        plan=[
            ToolCall(tool="rides_list_payment_methods", arguments={}),
            ToolCall(
                tool="rides_get_estimates",
                arguments={"pickup": pickup, "dropoff": work, "ride_class": ride_class},
            ),
            ToolCall(
                tool="rides_request",
                arguments={"estimate_id": "${1.0.id}", "payment_method_id": right["id"]},
            ),
            Finish(),
        ],
        confirmations=["rides_request"],
    )


@template(domain="rides", capabilities=["skills"], apps=["rides"], difficulty=3)
def ride_with_surge_limit(g: TaskGen) -> Any:
    builder = Places(g)
    pickup = builder.address()
    dropoff = destination(g, builder)
    wanted, fallback = g.rng.sample(["economy", "green", "comfort", "xl", "black"], 2)
    multiplier = g.rng.choice([1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0, 2.3])
    cap = g.rng.choice([1.5, 1.7, 2.0, 2.5])
    world = rides_world(g, surge={wanted: multiplier})
    ok = multiplier <= cap
    order = [p[0] for p in PRODUCTS]
    instruction = (
        f"Book {a_ride(wanted)} from {pickup} to {dropoff}. I'll pay surge up to "
        f"{cap}x; if it's more than that, get me {CLASS_WORDS[fallback]} instead."
    )
    if ok:
        checks = [
            Check(
                name="surge accepted and ride booked",
                target="rides.rides",
                where=accepted(
                    {
                        "dropoff": dropoff,
                        "ride_class": wanted,
                        "surge_multiplier": multiplier,
                        "surge_confirmation_id__ne": None,
                    }
                ),
            ),
            ONE_RIDE,
        ]
        plan: list[Any] = [
            ToolCall(
                tool="rides_get_estimates",
                arguments={"pickup": pickup, "dropoff": dropoff, "ride_class": wanted},
            ),
            ToolCall(tool="rides_accept_surge", arguments={"estimate_id": "${0.0.id}"}),
            ToolCall(
                tool="rides_request",
                arguments={"estimate_id": "${0.0.id}", "surge_confirmation_id": "${1.id}"},
            ),
            Finish(),
        ]
    else:
        checks = [
            Check(
                name="fallback class booked",
                target="rides.rides",
                where=accepted({"dropoff": dropoff, "ride_class": fallback}),
            ),
            Check(
                name="surge above the limit not accepted",
                target="rides.surge_confirmations",
                op="count",
                where={},
                expect=0,
            ),
            ONE_RIDE,
        ]
        plan = [
            ToolCall(tool="rides_get_estimates", arguments={"pickup": pickup, "dropoff": dropoff}),
            ToolCall(
                tool="rides_request",
                arguments={"estimate_id": f"${{0.{order.index(fallback)}.id}}"},
            ),
            Finish(),
        ]
    return g.task(
        instruction=instruction,
        world={"rides": world},
        checks=checks,
        plan=plan,
        confirmations=["rides_request"],
    )


@template(
    domain="rides",
    capabilities=["tool_use"],
    apps=["rides", "contacts", "messaging"],
    difficulty=3,
)
def ride_to_friend_and_tell_car(g: TaskGen) -> Any:
    friends = phone_book(g.fake, 6, first_id=300, groups=FRIEND_GROUPS)
    friend = g.rng.choice(friends)
    builder = Places(g)
    builder.addresses.update(p["address"] for p in friends)
    pickup = builder.address()
    ride_class = g.rng.choice(["economy", "green", "comfort", "xl", "black"])
    world = rides_world(g)
    car = driver(world, ride_class)
    share = g.rng.random() < 0.5
    first = friend["name"].split()[0]
    steps: list[Any] = [
        ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
        ToolCall(
            tool="rides_get_estimates",
            arguments={"pickup": pickup, "dropoff": "${0.0.address}", "ride_class": ride_class},
        ),
        ToolCall(tool="rides_request", arguments={"estimate_id": "${1.0.id}"}),
    ]
    ride_check = Check(
        name="ride to the friend's place",
        target="rides.rides",
        where=accepted({"pickup": pickup, "dropoff": friend["address"], "ride_class": ride_class}),
    )
    if share:
        instruction = (
            f"Get me {a_ride(ride_class)} from {pickup} to {friend['name']}'s place and "
            f"share the live trip with {first}."
        )
        steps.append(
            ToolCall(
                tool="rides_share_trip", arguments={"ride_id": "${2.id}", "phone": "${0.0.phone}"}
            )
        )
        checks = [
            ride_check,
            Check(
                name="trip shared with the friend",
                target="rides.shares",
                where={"phone": friend["phone"], "plate": car["plate"]},
            ),
            ONE_RIDE,
        ]
    else:
        instruction = (
            f"Get me {a_ride(ride_class)} from {pickup} to {friend['name']}'s place and "
            f"text {first} the car model and plate so they can spot it."
        )
        steps.append(
            ToolCall(
                tool="messaging_send",
                arguments={
                    "to": "${0.0.phone}",
                    "text": "On my way in a ${2.driver.car}, plate ${2.driver.plate}.",
                },
            )
        )
        checks = [
            ride_check,
            texted(
                "friend texted the plate", {"to": friend["phone"], "text__contains": car["plate"]}
            ),
            texted("friend texted the car", {"to": friend["phone"], "text__contains": car["car"]}),
            texts_sent(1, "one text sent"),
            ONE_RIDE,
        ]
    return g.task(
        instruction=instruction,
        world={"rides": world, "contacts": {"contacts": friends}, "messaging": {"messages": []}},
        checks=checks,
        plan=[*steps, Finish()],
        confirmations=["rides_request"],
    )


@template(domain="rides", capabilities=["subagent"], apps=["rides", "maps"], difficulty=4)
def ride_or_transit(g: TaskGen) -> Any:
    ride_class = g.rng.choice(["economy", "green", "comfort"])
    world = rides_world(g)
    builder = Places(g)
    home, work = builder.address(), builder.address()
    eta = product(world, ride_class)["pickup_eta_min"]
    choice = g.rng.choice(["transit", "ride"])
    for attempt in range(200):
        origin = builder.address()
        dest = destination(g, builder)
        d = distance_km(origin, dest)
        transit = travel_minutes(d, "transit", DEFAULT_START, key=f"{origin}|{dest}")
        ride = eta + travel_minutes(d, "driving", DEFAULT_START)
        if choice == "ride" and transit - ride >= 2:
            limit = g.rng.randint(ride, transit - 1)
            break
        if choice == "transit" or attempt == 199:
            choice = "transit"
            limit = transit + g.rng.randint(0, 8)
            break
    price = ride_price(product(world, ride_class), d)
    plan: list[Any] = [
        Delegate(
            goal=f"Estimate a {ride_class} ride from {origin} to {dest}: price, pickup ETA and "
            "trip minutes.",
            tools=["rides_get_estimates"],
            agent="ride_scout",
        ),
        ToolCall(
            tool="rides_get_estimates",
            arguments={"pickup": origin, "dropoff": dest, "ride_class": ride_class},
        ),
        Finish(answer=f"{ride_class}: ${price:.2f}, {ride} min door to door"),
        Delegate(
            goal=f"Find public transit from {origin} to {dest} leaving now: minutes and fare.",
            tools=["maps_get_directions"],
            agent="transit_scout",
        ),
        ToolCall(
            tool="maps_get_directions",
            arguments={"origin": origin, "destination": dest, "mode": "transit"},
        ),
        Finish(answer=f"transit: {transit} min, $2.75"),
    ]
    if choice == "transit":
        plan.append(ToolCall(tool="maps_start_navigation", arguments={"route_id": "${4.id}"}))
        checks = [
            Check(
                name="transit navigation started",
                target="maps.navigation",
                where={"destination": dest, "mode": "transit", "status": "active"},
            ),
            NO_RIDE,
        ]
    else:
        plan.append(ToolCall(tool="rides_request", arguments={"estimate_id": "${1.0.id}"}))
        checks = [
            Check(
                name="ride booked",
                target="rides.rides",
                where=accepted({"pickup": origin, "dropoff": dest, "ride_class": ride_class}),
            ),
            Check(
                name="no transit navigation",
                target="maps.navigation",
                op="count",
                where={},
                expect=0,
            ),
            ONE_RIDE,
        ]
    plan.append(Finish(answer=choice))
    return g.task(
        instruction=(
            f"I need to get from {origin} to {dest} within {limit} minutes. Have one helper "
            f"price {a_ride(ride_class)} and another check public transit. If "
            "transit gets me there in time, start transit navigation; otherwise book the ride."
        ),
        world={"rides": world, "maps": {"places": builder.rows, "labels": labels(home, work)}},
        checks=checks,
        plan=plan,
        confirmations=["rides_request"],
    )


@template(
    domain="rides",
    capabilities=["subagent", "tool_use"],
    apps=["rides", "contacts", "messaging"],
    difficulty=4,
)
def ride_meet_at_cheaper_spot(g: TaskGen) -> Any:
    friends = phone_book(g.fake, 6, first_id=300, groups=FRIEND_GROUPS)
    friend = g.rng.choice(friends)
    ride_class = g.rng.choice(["economy", "green", "comfort", "black"])
    builder = Places(g)
    pickup = builder.address()
    world = rides_world(g)
    for _ in range(50):
        spots = g.rng.sample(LANDMARKS, 2)
        prices = [ride_price(product(world, ride_class), distance_km(pickup, s)) for s in spots]
        if prices[0] != prices[1]:
            break
    best_i = prices.index(min(prices))
    best = spots[best_i]
    plan: list[Any] = []
    for i, spot in enumerate(spots):
        plan += [
            Delegate(
                goal=f"Get the {ride_class} fare from {pickup} to {spot}.",
                tools=["rides_get_estimates"],
                agent=f"fare_{i + 1}",
            ),
            ToolCall(
                tool="rides_get_estimates",
                arguments={"pickup": pickup, "dropoff": spot, "ride_class": ride_class},
            ),
            Finish(answer=f"{spot}: ${prices[i]:.2f}"),
        ]
    text = f"Let's meet at {best}, I'm on my way."
    plan += [
        ToolCall(tool="rides_request", arguments={"estimate_id": f"${{{1 + 3 * best_i}.0.id}}"}),
        ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
        ToolCall(tool="messaging_send", arguments={"to": "${7.0.phone}", "text": text}),
        Finish(answer=best),
    ]
    first = friend["name"].split()[0]
    return g.task(
        instruction=(
            f"I'm at {pickup} and meeting {friend['name']} at either {spots[0]} or {spots[1]}. "
            f"Have two helpers get {CLASS_WORDS[ride_class]} fares to each, book the cheaper "
            f"one and text {first} where we're meeting."
        ),
        world={"rides": world, "contacts": {"contacts": friends}, "messaging": {"messages": []}},
        checks=[
            Check(
                name="ride to the cheaper spot",
                target="rides.rides",
                where=accepted({"dropoff": best, "ride_class": ride_class}),
            ),
            texted("friend told the place", {"to": friend["phone"], "text__icontains": best}),
            texts_sent(1, "one text sent"),
            ONE_RIDE,
        ],
        plan=plan,
        confirmations=["rides_request"],
    )


@template(domain="rides", capabilities=["memory", "skills"], apps=["rides"], difficulty=3)
def ride_rate_and_tip_usual(g: TaskGen) -> Any:
    builder = Places(g)
    places, home, work = saved_places(g, builder)
    world = rides_world(g, places=places)
    last_drop = destination(g, builder)
    history = [
        past_ride(g, world, "ride_101", home, work, "economy", "2026-02-26T08:10", tip=2.0),
        past_ride(
            g, world, "ride_102", work, builder.address(), "comfort", "2026-02-27T18:40", tip=3.5
        ),
        past_ride(
            g,
            world,
            "ride_103",
            builder.address(),
            last_drop,
            g.rng.choice(["economy", "comfort", "green", "xl"]),
            "2026-03-01T21:15",
            rating=None,
        ),
    ]
    world["rides"] = history
    fare = history[-1]["fare"]
    pct, wrong = g.rng.sample([10, 12, 15, 18, 20, 25], 2)
    tip = round(fare * pct / 100, 2)
    stars = g.rng.randint(3, 5)
    comment = g.rng.choice(COMMENTS)
    memory = [*conflicting_pair(g.rng, "tip_percent", f"{pct}%", f"{wrong}%"), side_memory(g.rng)]
    said = f' with the comment "{comment}"' if comment else ""
    rate_args: dict[str, Any] = {"ride_id": "${0.0.id}", "stars": stars}
    if comment:
        rate_args["comment"] = comment
    return g.task(
        instruction=(
            f"Give my last ride (the one to {last_drop}) {stars} stars{said} and tip my usual "
            "percentage."
        ),
        world={"rides": world},
        checks=[
            Check(
                name="last trip rated and tipped the usual percentage",
                target="rides.rides",
                where={
                    "id": "ride_103",
                    "rating": stars,
                    "tip__gte": round(tip - 0.01, 2),
                    "tip__lte": round(tip + 0.01, 2),
                },
            ),
            Check(
                name="no other trip changed",
                target="rides.rides",
                op="count",
                where={"tip__gte": 0.01},
                expect=3,
            ),
        ],
        memory=memory,
        plan=[
            ToolCall(tool="rides_list_rides", arguments={"status": "completed", "limit": 1}),
            ToolCall(tool="rides_get_receipt", arguments={"ride_id": "${0.0.id}"}),
            ToolCall(tool="rides_rate_trip", arguments=rate_args),
            ToolCall(tool="rides_add_tip", arguments={"ride_id": "${0.0.id}", "amount": tip}),
            Finish(),
        ],
        confirmations=["rides_add_tip"],
    )
