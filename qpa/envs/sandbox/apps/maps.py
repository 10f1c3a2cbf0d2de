"""Maps: places, directions, turn-by-turn navigation, ETA sharing, saved lists and history.

Geography (distances, neighbourhoods, travel times) comes from `qpa.envs.sandbox.geo`, which the
rides app and the task templates share, so they compute exactly what the tools report.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import (
    ISO_DATE,
    ISO_MINUTE,
    PHONE,
    App,
    Limit,
    Offset,
    fail,
    paginate,
    parse_moment,
    tool,
)
from qpa.envs.sandbox.geo import (
    detour_minutes,
    distance_km,
    is_open,
    neighborhood_of,
    route_via,
    tolls_for,
    travel_minutes,
)

Mode = Literal["driving", "transit", "walking", "cycling"]
Avoid = Literal["tolls", "highways", "ferries"]
Category = Literal[
    "restaurant",
    "cafe",
    "bar",
    "bakery",
    "gas_station",
    "ev_charger",
    "pharmacy",
    "supermarket",
    "museum",
    "park",
    "gym",
    "parking",
]
ListName = Literal["favorites", "want_to_go", "starred"]
Label = Literal["home", "work"]
IncidentKind = Literal["accident", "closure", "police", "hazard", "traffic_jam"]

TRANSIT_FARE = 2.75
MAX_STOPS = 3


# --------------------------------------------------------------------------- records


class Place(TypedDict):
    id: str
    name: str
    category: str
    address: str
    neighborhood: str
    rating: float
    price_level: int
    hours: str
    phone: str
    open_now: bool
    detour_min: int | None


class Geocode(TypedDict):
    query: str
    address: str
    neighborhood: str
    place_id: str | None


class Route(TypedDict):
    id: str
    origin: str
    destination: str
    destination_name: str
    mode: str
    avoid: list[str]
    distance_km: float
    duration_min: int
    depart_at: str
    arrive_at: str
    tolls: float
    fare: float
    via: list[str]
    summary: str


class Navigation(TypedDict):
    id: str
    route_id: str
    origin: str
    destination: str
    destination_name: str
    mode: str
    avoid: list[str]
    status: str
    started_at: str
    eta: str
    stops: list[str]


class EtaShare(TypedDict):
    id: str
    navigation_id: str
    phone: str
    destination: str
    eta: str
    link: str


class SavedPlace(TypedDict):
    id: str
    place_id: str
    place_name: str
    list_name: str
    saved_at: str


class Removed(TypedDict):
    removed: str
    list_name: str


class LabelRecord(TypedDict):
    id: str
    label: str
    address: str


class Visit(TypedDict):
    id: str
    date: str
    arrived: str
    left: str
    place_id: str
    place_name: str
    address: str


class Review(TypedDict):
    id: str
    place_id: str
    stars: int
    text: str
    created_at: str


class Incident(TypedDict):
    id: str
    kind: str
    location: str
    navigation_id: str | None
    reported_at: str


class MapsApp(App):
    name = "maps"
    title = "Maps"
    description = (
        "Maps and navigation: search places, directions by car/transit/foot/bike, turn-by-turn "
        "navigation, ETA sharing, saved lists, home/work labels and location history."
    )
    skills = {
        "share_eta": (
            "ETA can only be shared from an active navigation: maps_get_directions, then "
            "maps_start_navigation(route_id), then maps_share_eta(navigation_id, phone). Look "
            "the person's phone up with contacts_search; never guess it."
        ),
        "stop_along_route": (
            "To add a stop on the way (gas, coffee, pharmacy), start navigation first, then "
            "maps_search_places(category=..., along_route=<route_id>, sort_by='detour') and add "
            "the place with the smallest detour_min via maps_add_stop(navigation_id, place_id). "
            "Places not on the route are rejected; a plain nearby search does not find them."
        ),
        "labels_and_options": (
            "'home' and 'work' are labels: maps_get_labels lists them and maps_get_directions "
            "accepts them as origin or destination. Route options (avoid tolls/highways/ferries) "
            "are chosen on maps_get_directions; navigation keeps the route's options."
        ),
        "reviews_from_history": (
            "'The place I went to on <day>' is found with maps_get_timeline(date) (visits of "
            "that day in order); review it with maps_write_review using the visit's place_id."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "places": [],
            "labels": [],
            "saved": [],
            "routes": [],
            "navigation": [],
            "eta_shares": [],
            "timeline": [],
            "reviews": [],
            "incidents": [],
        }

    # helpers ----------------------------------------------------------------------------
    def _place_view(self, place: dict[str, Any], detour: int | None = None) -> Place:
        view = {**place, "open_now": is_open(place["hours"], self.world.now), "detour_min": detour}
        return cast(Place, view)

    def _resolve(self, where: str) -> tuple[str, str]:
        """An address for a label, a place name or an address: (address, display name)."""
        key = where.strip().lower()
        for label in self.records("labels"):
            if label["label"] == key:
                return label["address"], label["label"]
        for place in self.records("places"):
            if place["name"].lower() == key or place["address"].lower() == key:
                return place["address"], place["name"]
        return where.strip(), where.strip()

    def _active(self, navigation_id: str) -> dict[str, Any]:
        session = self.find("navigation", navigation_id, what="navigation")
        if session["status"] != "active":
            raise fail(f"navigation {navigation_id} is not active; start navigation first")
        return session

    # places -----------------------------------------------------------------------------
    @tool()
    def maps_search_places(
        self,
        query: Annotated[str, Field(max_length=100, description="Words in name or category")] = "",
        category: Category | None = None,
        neighborhood: str | None = None,
        open_now: bool = False,
        min_rating: Annotated[float, Field(ge=0, le=5)] = 0.0,
        max_price_level: Annotated[int, Field(ge=1, le=4)] = 4,
        along_route: Annotated[str | None, Field(description="A route id: places on it")] = None,
        sort_by: Literal["relevance", "rating", "detour"] = "relevance",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Place]:
        """Search places by words, category, neighbourhood, opening, rating and price level.

        With along_route, only places on that route are returned, each with its detour_min.
        """
        if sort_by == "detour" and along_route is None:
            raise fail("sort_by='detour' needs along_route", "invalid_arguments")
        via: list[str] | None = None
        route: dict[str, Any] | None = None
        if along_route is not None:
            route = self.find("routes", along_route, what="route")
            via = route["via"]
        q = query.strip().lower()
        hits: list[Place] = []
        for place in self.records("places"):
            words = f"{place['name']} {place['category'].replace('_', ' ')}".lower()
            if q and q not in words:
                continue
            if category and place["category"] != category:
                continue
            if neighborhood and place["neighborhood"].lower() != neighborhood.strip().lower():
                continue
            if place["rating"] < min_rating or place["price_level"] > max_price_level:
                continue
            if open_now and not is_open(place["hours"], self.world.now):
                continue
            detour = None
            if via is not None and route is not None:
                if place["neighborhood"] not in via:
                    continue
                detour = detour_minutes(place["id"], route["origin"], route["destination"])
            hits.append(self._place_view(place, detour))
        if sort_by == "rating":
            hits.sort(key=lambda p: -p["rating"])
        elif sort_by == "detour":
            hits.sort(key=lambda p: p["detour_min"] or 0)
        return paginate(hits, limit, offset)

    @tool()
    def maps_get_place(self, place_id: str) -> Place:
        """Details of one place: address, hours (open now or not), rating, price level, phone."""
        return self._place_view(self.find("places", place_id, what="place"))

    @tool()
    def maps_geocode(self, address: Annotated[str, Field(min_length=3)]) -> Geocode:
        """Resolve an address, a place name or a label ('home', 'work') to an address."""
        resolved, _ = self._resolve(address)
        place = next(
            (p for p in self.records("places") if p["address"].lower() == resolved.lower()), None
        )
        return {
            "query": address,
            "address": resolved,
            "neighborhood": place["neighborhood"] if place else neighborhood_of(resolved),
            "place_id": place["id"] if place else None,
        }

    # directions and navigation ----------------------------------------------------------
    @tool()
    def maps_get_directions(
        self,
        origin: Annotated[str, Field(min_length=3, description="Address, place name or label")],
        destination: Annotated[str, Field(min_length=3)],
        mode: Mode = "driving",
        avoid: list[Avoid] | None = None,
        depart_at: Annotated[str | None, Field(pattern=ISO_MINUTE)] = None,
    ) -> Route:
        """Plan a route: distance, duration, arrival time, tolls/fare and the areas it passes."""
        start, _ = self._resolve(origin)
        end, end_name = self._resolve(destination)
        if start.lower() == end.lower():
            raise fail("origin and destination are the same place")
        options: list[str] = sorted(set(avoid or []))
        if options and mode != "driving":
            raise fail(f"avoid options apply to driving only, not {mode}", "invalid_arguments")
        moment = parse_moment(depart_at, "depart_at") if depart_at else self.world.now
        if moment < self.world.now - timedelta(minutes=1):
            raise fail(f"depart_at {depart_at} is in the past (now {self.world.iso_now()})")
        distance = distance_km(start, end)
        if mode == "walking" and distance > 15:
            raise fail(f"no walking route: {distance} km is too far to walk")
        minutes = travel_minutes(distance, mode, moment, options, key=f"{start}|{end}")
        via = route_via(start, end)
        route: Route = {
            "id": self.world.new_id("rt"),
            "origin": start,
            "destination": end,
            "destination_name": end_name,
            "mode": mode,
            "avoid": options,
            "distance_km": distance,
            "duration_min": minutes,
            "depart_at": moment.isoformat(timespec="minutes"),
            "arrive_at": (moment + timedelta(minutes=minutes)).isoformat(timespec="minutes"),
            "tolls": tolls_for(distance, mode, options),
            "fare": TRANSIT_FARE if mode == "transit" else 0.0,
            "via": via,
            "summary": f"via {via[0]} and {via[1]}",
        }
        self.records("routes").append(dict(route))
        return route

    @tool("write")
    def maps_start_navigation(self, route_id: str) -> Navigation:
        """Start turn-by-turn navigation on a planned route (ends any other active navigation)."""
        route = self.find("routes", route_id, what="route")
        for other in self.records("navigation"):
            if other["status"] == "active":
                other["status"] = "ended"
        eta = self.world.now + timedelta(minutes=route["duration_min"])
        session: Navigation = {
            "id": self.world.new_id("nav"),
            "route_id": route_id,
            "origin": route["origin"],
            "destination": route["destination"],
            "destination_name": route["destination_name"],
            "mode": route["mode"],
            "avoid": list(route["avoid"]),
            "status": "active",
            "started_at": self.world.iso_now(),
            "eta": eta.isoformat(timespec="minutes"),
            "stops": [],
        }
        self.records("navigation").append(dict(session))
        return session

    @tool("write")
    def maps_end_navigation(self, navigation_id: str) -> Navigation:
        """Stop an active navigation."""
        session = self._active(navigation_id)
        session["status"] = "ended"
        return cast(Navigation, session)

    @tool("write")
    def maps_share_eta(
        self,
        navigation_id: str,
        phone: Annotated[str, Field(pattern=PHONE, description="Phone number to share with")],
    ) -> EtaShare:
        """Share live arrival time of an active navigation with a phone number."""
        session = self._active(navigation_id)
        if any(
            s["navigation_id"] == navigation_id and s["phone"] == phone
            for s in self.records("eta_shares")
        ):
            raise fail(f"ETA of {navigation_id} is already shared with {phone}")
        share_id = self.world.new_id("eta")
        share: EtaShare = {
            "id": share_id,
            "navigation_id": navigation_id,
            "phone": phone,
            "destination": session["destination"],
            "eta": session["eta"],
            "link": f"https://maps.example.com/eta/{share_id}",
        }
        self.records("eta_shares").append(dict(share))
        return share

    @tool("write")
    def maps_add_stop(self, navigation_id: str, place_id: str) -> Navigation:
        """Add a stop on the way to an active navigation's destination (must be on the route)."""
        session = self._active(navigation_id)
        place = self.find("places", place_id, what="place")
        route = self.find("routes", session["route_id"], what="route")
        if place["neighborhood"] not in route["via"]:
            raise fail(
                f"{place['name']} ({place['neighborhood']}) is not along this route; "
                "search with along_route to find places on it"
            )
        if place_id in session["stops"]:
            raise fail(f"{place['name']} is already a stop")
        if len(session["stops"]) >= MAX_STOPS:
            raise fail(f"a navigation takes at most {MAX_STOPS} stops")
        session["stops"].append(place_id)
        detour = detour_minutes(place_id, route["origin"], route["destination"])
        eta = datetime.fromisoformat(session["eta"]) + timedelta(minutes=detour)
        session["eta"] = eta.isoformat(timespec="minutes")
        return cast(Navigation, session)

    @tool("write")
    def maps_report_incident(
        self,
        kind: IncidentKind,
        location: Annotated[str, Field(min_length=3, description="Street or place")],
        navigation_id: str | None = None,
    ) -> Incident:
        """Report an accident, closure, police, hazard or traffic jam at a location."""
        if navigation_id is not None:
            self._active(navigation_id)
        incident: Incident = {
            "id": self.world.new_id("inc"),
            "kind": kind,
            "location": location,
            "navigation_id": navigation_id,
            "reported_at": self.world.iso_now(),
        }
        self.records("incidents").append(dict(incident))
        return incident

    # lists, labels, history -------------------------------------------------------------
    @tool("write")
    def maps_save_place(self, place_id: str, list_name: ListName = "favorites") -> SavedPlace:
        """Save a place to one of the user's lists: favorites, want_to_go or starred."""
        place = self.find("places", place_id, what="place")
        for saved in self.records("saved"):
            if saved["place_id"] == place_id and saved["list_name"] == list_name:
                raise fail(f"{place['name']} is already in {list_name}")
        record: SavedPlace = {
            "id": self.world.new_id("sv"),
            "place_id": place_id,
            "place_name": place["name"],
            "list_name": list_name,
            "saved_at": self.world.iso_now(),
        }
        self.records("saved").append(dict(record))
        return record

    @tool()
    def maps_list_saved(self, list_name: ListName | None = None) -> list[SavedPlace]:
        """Places saved to the user's lists (one list, or all)."""
        rows = [s for s in self.records("saved") if list_name in (None, s["list_name"])]
        return cast(list[SavedPlace], rows)

    @tool("write")
    def maps_remove_saved(self, place_id: str, list_name: ListName) -> Removed:
        """Remove a place from one of the user's lists."""
        for saved in self.records("saved"):
            if saved["place_id"] == place_id and saved["list_name"] == list_name:
                self.records("saved").remove(saved)
                return {"removed": place_id, "list_name": list_name}
        raise fail(f"place '{place_id}' is not in {list_name}")

    @tool()
    def maps_get_labels(self) -> list[LabelRecord]:
        """The user's labelled addresses (home, work)."""
        return cast(list[LabelRecord], self.records("labels"))

    @tool("write")
    def maps_set_label(
        self, label: Label, address: Annotated[str, Field(min_length=5, max_length=200)]
    ) -> LabelRecord:
        """Set the address of the home or work label."""
        for record in self.records("labels"):
            if record["label"] == label:
                record["address"] = address
                return cast(LabelRecord, record)
        created: LabelRecord = {"id": label, "label": label, "address": address}
        self.records("labels").append(dict(created))
        return created

    @tool()
    def maps_get_timeline(self, date: Annotated[str, Field(pattern=ISO_DATE)]) -> list[Visit]:
        """Location history: the places the user visited on a date, in order."""
        if date > self.world.now.date().isoformat():
            raise fail(f"no history for {date}: it is in the future")
        rows = [v for v in self.records("timeline") if v["date"] == date]
        return cast(list[Visit], sorted(rows, key=lambda v: v["arrived"]))

    @tool("write")
    def maps_write_review(
        self,
        place_id: str,
        stars: Annotated[int, Field(ge=1, le=5)],
        text: Annotated[str, Field(min_length=3, max_length=2000)],
    ) -> Review:
        """Publish a star rating and review of a place (one review per place)."""
        self.find("places", place_id, what="place")
        if any(r["place_id"] == place_id for r in self.records("reviews")):
            raise fail(f"you have already reviewed place '{place_id}'")
        review: Review = {
            "id": self.world.new_id("rev"),
            "place_id": place_id,
            "stars": stars,
            "text": text,
            "created_at": self.world.iso_now(),
        }
        self.records("reviews").append(dict(review))
        return review
