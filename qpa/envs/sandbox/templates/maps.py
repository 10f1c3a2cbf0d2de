"""Maps tasks: find and save places, navigate with preferences, share ETAs, stops on the way."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from qpa.contract import Check, Delegate, Finish, ToolCall
from qpa.envs.sandbox.authoring import (
    FRIEND_GROUPS,
    conflicting_pair,
    day_phrase,
    phone_book,
    side_memory,
)
from qpa.envs.sandbox.engine import DEFAULT_START
from qpa.envs.sandbox.geo import (
    NEIGHBORHOODS,
    detour_minutes,
    distance_km,
    route_via,
    travel_minutes,
)
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import PLACE_NAMES, RATINGS, Places, labels

CATEGORY_WORDS = {
    "cafe": "coffee shop",
    "restaurant": "restaurant",
    "bakery": "bakery",
    "bar": "bar",
    "gas_station": "gas station",
    "ev_charger": "EV charger",
    "pharmacy": "pharmacy",
    "supermarket": "supermarket",
    "museum": "museum",
    "park": "park",
    "gym": "gym",
    "parking": "parking garage",
}
LISTS = {"favorites": "Favorites", "want_to_go": "Want to go", "starred": "Starred"}
REVIEW_TEXTS = [
    "Friendly staff and quick service.",
    "Great spot, a bit crowded at lunch.",
    "Clean, calm and easy to find.",
    "Prices are fair and the quality is excellent.",
    "Would come back; parking was tricky though.",
    "Not bad, but the wait was long.",
    "Lovely place, highly recommended.",
    "Good value and a nice atmosphere.",
    "Disappointing this time, service was slow.",
    "Exactly what I needed, thanks!",
]
MODE_WORDS = {
    "driving": "driving",
    "transit": "transit",
    "walking": "walking",
    "cycling": "cycling",
}


def maps_state(places: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"places": places, **extra}


# --------------------------------------------------------------------------- templates


@template(domain="maps", capabilities=["tool_use"], apps=["maps"], difficulty=2)
def maps_save_best_open_place(g: TaskGen) -> Any:
    category = g.rng.choice(["cafe", "restaurant", "bakery", "bar", "pharmacy", "gym"])
    hood = g.rng.choice(NEIGHBORHOODS)
    list_name = g.rng.choice(list(LISTS))
    builder = Places(g)
    top = sorted(g.rng.sample(RATINGS, 4), reverse=True)
    builder.add(category, hood, rating=top[0], open_now=False)
    best = builder.add(category, hood, rating=top[1], open_now=True)
    builder.add(category, hood, rating=top[2])
    builder.add(category, hood, rating=top[3])
    others = [n for n in NEIGHBORHOODS if n != hood]
    for elsewhere in g.rng.sample(others, 2):
        builder.add(category, elsewhere, rating=round(min(4.9, top[0] + 0.1), 1), open_now=True)
    builder.fillers(4, exclude=(category,))
    g.rng.shuffle(builder.rows)
    pre = [
        {
            "id": "sv_1",
            "place_id": p["id"],
            "place_name": p["name"],
            "list_name": ln,
            "saved_at": "2026-02-10T18:00",
        }
        for p, ln in zip(
            [p for p in builder.rows if p["category"] != category][:2],
            ["favorites", "want_to_go"],
            strict=True,
        )
    ]
    pre[1]["id"] = "sv_2"
    word = CATEGORY_WORDS[category]
    return g.task(
        instruction=(
            f"Find the best-rated {word} in {hood} that's open right now and save it to my "
            f"{LISTS[list_name]} list."
        ),
        world={"maps": maps_state(builder.rows, saved=pre)},
        checks=[
            Check(
                name="best open place saved to the list",
                target="maps.saved",
                where={"place_id": best["id"], "list_name": list_name},
            ),
            Check(
                name="nothing else saved",
                target="maps.saved",
                op="count",
                where={},
                expect=len(pre) + 1,
            ),
        ],
        plan=[
            ToolCall(
                tool="maps_search_places",
                arguments={
                    "category": category,
                    "neighborhood": hood,
                    "open_now": True,
                    "sort_by": "rating",
                },
            ),
            ToolCall(
                tool="maps_save_place",
                arguments={"place_id": "${0.0.id}", "list_name": list_name},
            ),
            Finish(answer=best["name"]),
        ],
    )


@template(
    domain="maps", capabilities=["tool_use", "skills"], apps=["maps", "contacts"], difficulty=3
)
def maps_share_eta_with_friend(g: TaskGen) -> Any:
    friends = phone_book(g.fake, 6, first_id=300, groups=FRIEND_GROUPS)
    friend = g.rng.choice(friends)
    builder = Places(g)
    builder.addresses.update(p["address"] for p in friends)
    home, work = builder.address(), builder.address()
    builder.fillers(5)
    d = distance_km(home, friend["address"])
    modes = ["driving", "transit", "cycling"] + (["walking"] if d <= 6 else [])
    mode = g.rng.choice(modes)
    return g.task(
        instruction=(
            f"I'm leaving home for {friend['name']}'s place. Start {MODE_WORDS[mode]} navigation "
            f"there and share my ETA with {friend['name'].split()[0]}."
        ),
        world={
            "maps": maps_state(builder.rows, labels=labels(home, work)),
            "contacts": {"contacts": friends},
        },
        checks=[
            Check(
                name="navigating to the friend",
                target="maps.navigation",
                where={"destination": friend["address"], "mode": mode, "status": "active"},
            ),
            Check(
                name="ETA shared with the friend",
                target="maps.eta_shares",
                where={"phone": friend["phone"], "destination": friend["address"]},
            ),
            Check(name="ETA shared once", target="maps.eta_shares", op="count", where={}, expect=1),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
            ToolCall(
                tool="maps_get_directions",
                arguments={"origin": "home", "destination": "${0.0.address}", "mode": mode},
            ),
            ToolCall(tool="maps_start_navigation", arguments={"route_id": "${1.id}"}),
            ToolCall(
                tool="maps_share_eta",
                arguments={"navigation_id": "${2.id}", "phone": "${0.0.phone}"},
            ),
            Finish(),
        ],
    )


@template(domain="maps", capabilities=["memory"], apps=["maps"], difficulty=2)
def maps_navigate_usual_route_options(g: TaskGen) -> Any:
    right, wrong = g.rng.sample(["tolls", "highways", "ferries"], 2)
    builder = Places(g)
    home, work = builder.address(), builder.address()
    category = g.rng.choice(["restaurant", "museum", "park", "gym", "supermarket", "bar"])
    dest = builder.add(category, g.rng.choice(NEIGHBORHOODS))
    builder.fillers(5)
    origin = g.rng.choice(["home", "work"])
    phrase = g.rng.choice(
        ["with my usual route settings", "the way I like my routes", "using my route preferences"]
    )
    memory = [
        *conflicting_pair(g.rng, "route_preference", f"avoid {right}", f"avoid {wrong}"),
        side_memory(g.rng),
    ]
    return g.task(
        instruction=f"Navigate me by car from {origin} to {dest['name']}, {phrase}.",
        world={"maps": maps_state(builder.rows, labels=labels(home, work))},
        checks=[
            Check(
                name="navigation avoids what the user prefers",
                target="maps.navigation",
                where={
                    "destination": dest["address"],
                    "avoid": [right],
                    "mode": "driving",
                    "status": "active",
                },
            ),
        ],
        memory=memory,
        plan=[
            ToolCall(
                tool="maps_get_directions",
                arguments={
                    "origin": origin,
                    "destination": dest["name"],
                    "mode": "driving",
                    "avoid": [right],
                },
            ),
            ToolCall(tool="maps_start_navigation", arguments={"route_id": "${0.id}"}),
            Finish(),
        ],
    )


@template(domain="maps", capabilities=["memory", "skills"], apps=["maps"], difficulty=4)
def maps_stop_at_usual_chain(g: TaskGen) -> Any:
    kind, category = g.rng.choice(
        [
            ("coffee shop", "cafe"),
            ("bakery", "bakery"),
            ("gas station", "gas_station"),
            ("pharmacy", "pharmacy"),
        ]
    )
    right, wrong = g.rng.sample(PLACE_NAMES[category], 2)
    builder = Places(g)
    home, work = builder.address(), builder.address()
    dest = builder.address()
    via = route_via(home, dest)
    off = [n for n in NEIGHBORHOODS if n not in via]
    target = builder.add(category, via[0], base=right)
    builder.add(category, g.rng.choice(off), base=right)
    builder.add(category, via[1], base=wrong)
    builder.add(category, g.rng.choice(off), base=wrong)
    builder.fillers(4, exclude=(category,))
    g.rng.shuffle(builder.rows)
    memory = [*conflicting_pair(g.rng, f"usual_{category}", right, wrong), side_memory(g.rng)]
    return g.task(
        instruction=(
            f"Start driving from home to {dest} and add a stop at my usual {kind} on the way."
        ),
        world={"maps": maps_state(builder.rows, labels=labels(home, work))},
        checks=[
            Check(
                name="navigating with a stop at the usual place on the route",
                target="maps.navigation",
                where={"destination": dest, "status": "active", "stops": [target["id"]]},
            ),
        ],
        memory=memory,
        plan=[
            ToolCall(
                tool="maps_get_directions",
                arguments={"origin": "home", "destination": dest, "mode": "driving"},
            ),
            ToolCall(tool="maps_start_navigation", arguments={"route_id": "${0.id}"}),
            ToolCall(
                tool="maps_search_places", arguments={"query": right, "along_route": "${0.id}"}
            ),
            ToolCall(
                tool="maps_add_stop",
                arguments={"navigation_id": "${1.id}", "place_id": target["id"]},
            ),
            Finish(),
        ],
    )


@template(domain="maps", capabilities=["tool_use"], apps=["maps"], difficulty=3)
def maps_review_visited_place(g: TaskGen) -> Any:
    builder = Places(g)
    cats = g.rng.sample(["cafe", "restaurant", "bakery", "museum", "gym", "bar", "pharmacy"], 4)
    category = cats[0]
    offset = g.rng.randint(1, 6)
    day = DEFAULT_START - timedelta(days=offset)
    date = day.date().isoformat()
    visits = []
    hours = sorted(g.rng.sample(range(8, 21), 3))
    target = None
    for i, (cat, hour) in enumerate(zip([cats[0], cats[1], cats[2]], hours, strict=True)):
        place = builder.add(cat, g.rng.choice(NEIGHBORHOODS))
        target = place if i == 0 else target
        visits.append(
            {
                "id": f"v_{10 + i}",
                "date": date,
                "arrived": f"{hour:02d}:10",
                "left": f"{hour:02d}:50",
                "place_id": place["id"],
                "place_name": place["name"],
                "address": place["address"],
            }
        )
    assert target is not None
    other_day = (day - timedelta(days=g.rng.randint(1, 5))).date().isoformat()
    decoy = builder.add(category, g.rng.choice(NEIGHBORHOODS))
    visits.append(
        {
            "id": "v_20",
            "date": other_day,
            "arrived": "12:00",
            "left": "13:00",
            "place_id": decoy["id"],
            "place_name": decoy["name"],
            "address": decoy["address"],
        }
    )
    builder.fillers(3)
    old = builder.rows[-1]
    reviews = [
        {
            "id": "rev_1",
            "place_id": old["id"],
            "stars": 4,
            "text": "Nice.",
            "created_at": "2026-01-15T19:00",
        }
    ]
    stars = g.rng.randint(1, 5)
    text = g.rng.choice(REVIEW_TEXTS)
    return g.task(
        instruction=(
            f"Leave a {stars}-star review for the {CATEGORY_WORDS[category]} I went to on "
            f'{day_phrase(day)}: "{text}"'
        ),
        world={"maps": maps_state(builder.rows, timeline=visits, reviews=reviews)},
        checks=[
            Check(
                name="review on the visited place",
                target="maps.reviews",
                where={"place_id": target["id"], "stars": stars, "text": text},
            ),
            Check(name="one new review", target="maps.reviews", op="count", where={}, expect=2),
        ],
        plan=[
            ToolCall(tool="maps_get_timeline", arguments={"date": date}),
            ToolCall(
                tool="maps_write_review",
                arguments={"place_id": target["id"], "stars": stars, "text": text},
            ),
            Finish(),
        ],
    )


@template(domain="maps", capabilities=["subagent"], apps=["maps"], difficulty=4)
def maps_quickest_of_three(g: TaskGen) -> Any:
    mode = g.rng.choice(["driving", "transit", "cycling"])
    category = g.rng.choice(["restaurant", "cafe", "museum", "park", "gym", "bakery"])
    origin = g.rng.choice(["home", "work"])
    for _ in range(50):
        builder = Places(g)
        home, work = builder.address(), builder.address()
        start = home if origin == "home" else work
        candidates = [builder.add(category, h) for h in g.rng.sample(NEIGHBORHOODS, 3)]
        # the plan runs within minutes of the start: one traffic regime for all three
        durations = [
            travel_minutes(
                distance_km(start, p["address"]),
                mode,
                DEFAULT_START,
                key=f"{start}|{p['address']}",
            )
            for p in candidates
        ]
        if durations.count(min(durations)) == 1:
            break
    best_i = durations.index(min(durations))
    best = candidates[best_i]
    builder.fillers(4, exclude=(category,))
    plan: list[Any] = []
    for i, p in enumerate(candidates):
        plan += [
            Delegate(
                goal=f"Get {mode} directions from {origin} to {p['name']}; report duration_min "
                "and the route id.",
                tools=["maps_get_directions"],
                agent=f"scout_{i + 1}",
            ),
            ToolCall(
                tool="maps_get_directions",
                arguments={"origin": origin, "destination": p["name"], "mode": mode},
            ),
            Finish(answer=f"{p['name']}: {durations[i]} min"),
        ]
    plan += [
        ToolCall(tool="maps_start_navigation", arguments={"route_id": f"${{{1 + 3 * best_i}.id}}"}),
        Finish(answer=best["name"]),
    ]
    names = ", ".join(p["name"] for p in candidates[:2]) + f" or {candidates[2]['name']}"
    return g.task(
        instruction=(
            f"Which is quickest to reach from {origin} by {MODE_WORDS[mode]}: {names}? Have a "
            "helper check each one, then start navigation to the quickest and tell me which."
        ),
        world={"maps": maps_state(builder.rows, labels=labels(home, work))},
        checks=[
            Check(
                name="navigating to the quickest place",
                target="maps.navigation",
                where={"destination": best["address"], "mode": mode, "status": "active"},
            ),
            Check(name="one navigation", target="maps.navigation", op="count", where={}, expect=1),
        ],
        answer=best["name"],
        plan=plan,
    )


@template(domain="maps", capabilities=["skills"], apps=["maps"], difficulty=3)
def maps_stop_least_detour(g: TaskGen) -> Any:
    category = g.rng.choice(
        ["gas_station", "ev_charger", "pharmacy", "cafe", "supermarket", "bakery"]
    )
    origin = g.rng.choice(["home", "work"])
    builder = Places(g)
    home, work = builder.address(), builder.address()
    start = home if origin == "home" else work
    dest = builder.address()
    via = route_via(start, dest)
    off = [n for n in NEIGHBORHOODS if n not in via]
    on_route: list[dict[str, Any]] = []
    detours: set[int] = set()
    number = 500
    while len(on_route) < 3:
        number += 1
        pid = f"pl_{number}"
        detour = detour_minutes(pid, start, dest)
        if detour in detours:
            continue
        detours.add(detour)
        on_route.append(builder.add(category, via[len(on_route) % 2], place_id=pid))
    best = min(on_route, key=lambda p: detour_minutes(p["id"], start, dest))
    for hood in g.rng.sample(off, 2):
        builder.add(category, hood, rating=4.9)
    builder.fillers(3, exclude=(category,))
    g.rng.shuffle(builder.rows)
    word = CATEGORY_WORDS[category]
    return g.task(
        instruction=(
            f"Start driving from {origin} to {dest} and add a stop at whichever {word} on the "
            "way adds the least detour."
        ),
        world={"maps": maps_state(builder.rows, labels=labels(home, work))},
        checks=[
            Check(
                name="stop with the smallest detour",
                target="maps.navigation",
                where={"destination": dest, "status": "active", "stops": [best["id"]]},
            ),
        ],
        plan=[
            ToolCall(
                tool="maps_get_directions",
                arguments={"origin": origin, "destination": dest, "mode": "driving"},
            ),
            ToolCall(tool="maps_start_navigation", arguments={"route_id": "${0.id}"}),
            ToolCall(
                tool="maps_search_places",
                arguments={"category": category, "along_route": "${0.id}", "sort_by": "detour"},
            ),
            ToolCall(
                tool="maps_add_stop",
                arguments={"navigation_id": "${1.id}", "place_id": "${2.0.id}"},
            ),
            Finish(),
        ],
    )


@template(domain="maps", capabilities=["subagent"], apps=["maps"], difficulty=4)
def maps_fastest_mode(g: TaskGen) -> Any:
    modes = ["driving", "transit", "cycling"]
    builder = Places(g)
    home, work = builder.address(), builder.address()
    for _ in range(50):
        origin = builder.address()
        dest = builder.address()
        hour = g.rng.randint(10, 19)
        minute = g.rng.choice([0, 15, 30, 45])
        depart = DEFAULT_START.replace(hour=hour, minute=minute)
        d = distance_km(origin, dest)
        durations = [travel_minutes(d, m, depart, key=f"{origin}|{dest}") for m in modes]
        if durations.count(min(durations)) == 1:
            break
    best_i = durations.index(min(durations))
    best = modes[best_i]
    depart_at = depart.isoformat(timespec="minutes")
    builder.fillers(4)
    plan: list[Any] = []
    for i, m in enumerate(modes):
        plan += [
            Delegate(
                goal=f"Get {m} directions from {origin} to {dest} departing {depart_at}; report "
                "duration_min and the route id.",
                tools=["maps_get_directions"],
                agent=f"{m}_scout",
            ),
            ToolCall(
                tool="maps_get_directions",
                arguments={
                    "origin": origin,
                    "destination": dest,
                    "mode": m,
                    "depart_at": depart_at,
                },
            ),
            Finish(answer=f"{m}: {durations[i]} min"),
        ]
    plan += [
        ToolCall(tool="maps_start_navigation", arguments={"route_id": f"${{{1 + 3 * best_i}.id}}"}),
        Finish(answer=best),
    ]
    return g.task(
        instruction=(
            f"I'm leaving {origin} for {dest} at {hour:02d}:{minute:02d} today. Have helpers "
            "compare driving, transit and cycling for that departure, then start navigation "
            "with the fastest and tell me which mode it is."
        ),
        world={"maps": maps_state(builder.rows, labels=labels(home, work))},
        checks=[
            Check(
                name="navigation uses the fastest mode",
                target="maps.navigation",
                where={"destination": dest, "mode": best, "status": "active"},
            ),
            Check(name="one navigation", target="maps.navigation", op="count", where={}, expect=1),
        ],
        answer=best,
        plan=plan,
    )


@template(domain="maps", capabilities=["memory", "tool_use"], apps=["maps"], difficulty=3)
def maps_update_label_from_memory(g: TaskGen) -> Any:
    label = g.rng.choice(["home", "work"])
    builder = Places(g)
    home, work = builder.address(), builder.address()
    current = builder.address()
    stale = home if label == "home" else work
    other = builder.address()
    place = builder.add(
        g.rng.choice(["cafe", "gym", "museum", "restaurant", "park"]), g.rng.choice(NEIGHBORHOODS)
    )
    builder.fillers(4)
    mode = g.rng.choice(["driving", "transit", "cycling"])
    key = "home_address" if label == "home" else "work_address"
    memory = [*conflicting_pair(g.rng, key, current, other), side_memory(g.rng)]
    noun = "home" if label == "home" else "my work address"
    return g.task(
        instruction=(
            f"The {label} label in Maps still shows {stale}. Set {noun} to my current address, "
            f"then start {MODE_WORDS[mode]} directions there from {place['name']}."
        ),
        world={"maps": maps_state(builder.rows, labels=labels(home, work))},
        checks=[
            Check(
                name=f"{label} label updated",
                target="maps.labels",
                where={"label": label, "address": current},
            ),
            Check(
                name="navigating to the current address",
                target="maps.navigation",
                where={"destination": current, "mode": mode, "status": "active"},
            ),
        ],
        memory=memory,
        plan=[
            ToolCall(tool="maps_set_label", arguments={"label": label, "address": current}),
            ToolCall(
                tool="maps_get_directions",
                arguments={"origin": place["name"], "destination": label, "mode": mode},
            ),
            ToolCall(tool="maps_start_navigation", arguments={"route_id": "${1.id}"}),
            Finish(),
        ],
    )
