"""Rides: ride-hailing with fare estimates, surge pricing, scheduling, trips, tips and receipts.

Distances and durations come from the shared deterministic geography (`geo`), so a ride and a
driving route of the maps app between the same addresses agree.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import (
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
from qpa.envs.sandbox.geo import distance_km, travel_minutes

RideClass = Literal["pool", "economy", "green", "comfort", "xl", "black"]
RideStatus = Literal["scheduled", "accepted", "completed", "cancelled"]
CancelReason = Literal[
    "changed_plans", "driver_late", "wrong_address", "booked_by_mistake", "other"
]

ESTIMATE_TTL_MIN = 10
MIN_SCHEDULE_AHEAD_MIN = 15
CANCEL_FEE = 5.0
CANCEL_GRACE_MIN = 2
MAX_RIDE_STOPS = 2

Address = Annotated[str, Field(min_length=3, max_length=200, description="Street address or place")]


def ride_price(product: dict[str, Any], distance: float, surge: float = 1.0) -> float:
    """The fare of a product over a distance, with surge applied (what estimates quote)."""
    base = max(product["min_fare"], product["base_fare"] + product["per_km"] * distance)
    return round(base * surge, 2)


def is_airport(address: str) -> bool:
    return "airport" in address.lower()


class Product(TypedDict):
    id: str
    name: str
    capacity: int
    base_fare: float
    per_km: float
    min_fare: float
    surge_multiplier: float
    pickup_eta_min: int
    drivers_available: int
    schedulable: bool


class Estimate(TypedDict):
    id: str
    pickup: str
    dropoff: str
    ride_class: str
    available: bool
    price: float
    currency: str
    surge_multiplier: float
    distance_km: float
    duration_min: int
    pickup_eta_min: int | None
    passengers: int
    expires_at: str


class SurgeConfirmation(TypedDict):
    id: str
    estimate_id: str
    surge_multiplier: float
    accepted_at: str


class DriverInfo(TypedDict):
    name: str
    car: str
    plate: str
    rating: float


class Ride(TypedDict):
    id: str
    status: str
    pickup: str
    dropoff: str
    stops: list[str]
    ride_class: str
    passengers: int
    estimate_id: str | None
    fare: float
    surge_multiplier: float
    surge_confirmation_id: str | None
    payment_method_id: str
    pickup_note: str
    driver: DriverInfo | None
    requested_at: str
    scheduled_for: str | None
    pickup_eta_min: int | None
    completed_at: str | None
    rating: int | None
    tip: float
    cancellation_fee: float


class Receipt(TypedDict):
    ride_id: str
    fare: float
    surge_multiplier: float
    tip: float
    cancellation_fee: float
    total: float
    payment_method_id: str
    card: str
    distance_km: float
    completed_at: str | None


class SavedPlace(TypedDict):
    id: str
    label: str
    address: str


class PaymentMethod(TypedDict):
    id: str
    brand: str
    last4: str
    kind: str
    default: bool


class Promo(TypedDict):
    id: str
    code: str
    discount: float
    expires: str
    status: str


class TripShare(TypedDict):
    id: str
    ride_id: str
    phone: str
    link: str
    plate: str


class LostItemReport(TypedDict):
    id: str
    ride_id: str
    description: str
    contact_phone: str
    status: str
    reported_at: str


class RidesApp(App):
    name = "rides"
    title = "Rides"
    description = (
        "Ride-hailing: fare estimates per ride class, requesting and scheduling rides, surge "
        "pricing, trip history, ratings, tips, receipts, saved places and payment methods."
    )
    skills = {
        "book_ride": (
            "To book a ride: rides_get_estimates(pickup, dropoff, passengers) -> pick an estimate "
            "with available=true and a capacity that fits -> rides_request(estimate_id). "
            "Estimates expire after 10 minutes. Saved places (home, work, gym...) come from "
            "rides_list_places; cards from rides_list_payment_methods (the default card is used "
            "unless payment_method_id is given)."
        ),
        "surge": (
            "When an estimate has surge_multiplier above 1.0, rides_request fails until the "
            "surge is accepted: call rides_accept_surge(estimate_id) and pass the returned id as "
            "surge_confirmation_id. Only accept surge the user agreed to; otherwise pick a class "
            "without surge."
        ),
        "airport_pickup": (
            "Pickups at an airport need pickup_note naming the arrival terminal, e.g. "
            "'Terminal 3 arrivals'; rides_request and rides_schedule refuse airport pickups "
            "without it. The terminal of an arriving flight is its arrival_terminal in "
            "flights_get_status(flight_no, date)."
        ),
        "tipping": (
            "Tips go on completed trips and only after the trip is rated: rides_rate_trip "
            "first, then rides_add_tip(ride_id, amount). A percentage tip is computed on the "
            "fare shown by rides_get_receipt (before tip) and rounded to cents."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "products": [],
            "drivers": [],
            "estimates": [],
            "surge_confirmations": [],
            "rides": [],
            "places": [],
            "payment_methods": [],
            "promos": [],
            "shares": [],
            "lost_items": [],
        }

    # helpers ----------------------------------------------------------------------------
    def _product(self, ride_class: str) -> dict[str, Any]:
        return self.find("products", ride_class, what="ride class")

    def _free_drivers(self, ride_class: str) -> list[dict[str, Any]]:
        return [d for d in self.records("drivers") if d["product"] == ride_class and d["available"]]

    def _payment(self, payment_method_id: str | None) -> dict[str, Any]:
        if payment_method_id is not None:
            return self.find("payment_methods", payment_method_id, what="payment method")
        for method in self.records("payment_methods"):
            if method.get("default"):
                return method
        raise fail("no default payment method; pass payment_method_id")

    def _check_airport(self, pickup: str, pickup_note: str) -> None:
        if is_airport(pickup) and "terminal" not in pickup_note.lower():
            raise fail(
                "airport pickups need the terminal in pickup_note (e.g. 'Terminal 2 arrivals')"
            )

    def _ride(self, ride_id: str, *statuses: str) -> dict[str, Any]:
        ride = self.find("rides", ride_id, what="ride")
        if statuses and ride["status"] not in statuses:
            wanted = "/".join(statuses)
            raise fail(f"ride {ride_id} is {ride['status']}; this needs a {wanted} ride")
        return ride

    def _route_distance(self, ride: dict[str, Any]) -> float:
        points = [ride["pickup"], *ride["stops"], ride["dropoff"]]
        return round(sum(distance_km(a, b) for a, b in pairwise(points)), 1)

    # catalogue and estimates ------------------------------------------------------------
    @tool()
    def rides_list_products(self) -> list[Product]:
        """Ride classes offered here: capacity, rates, current surge, drivers nearby, pickup ETA."""
        rows = []
        for product in self.records("products"):
            rows.append({**product, "drivers_available": len(self._free_drivers(product["id"]))})
        return cast(list[Product], rows)

    @tool()
    def rides_get_estimates(
        self,
        pickup: Address,
        dropoff: Address,
        ride_class: RideClass | None = None,
        passengers: Annotated[int, Field(ge=1, le=6)] = 1,
    ) -> list[Estimate]:
        """Fare estimates from pickup to dropoff for every class that fits the passengers.

        Each estimate has an id to request it with, its price (surge included), whether a
        driver is available and when it expires.
        """
        if pickup.strip().lower() == dropoff.strip().lower():
            raise fail("pickup and dropoff are the same address", "invalid_arguments")
        distance = distance_km(pickup, dropoff)
        minutes = travel_minutes(distance, "driving", self.world.now)
        expires = (self.world.now + timedelta(minutes=ESTIMATE_TTL_MIN)).isoformat(
            timespec="minutes"
        )
        out: list[Estimate] = []
        for product in self.records("products"):
            if ride_class and product["id"] != ride_class:
                continue
            if product["capacity"] < passengers:
                continue
            available = bool(self._free_drivers(product["id"]))
            estimate: Estimate = {
                "id": self.world.new_id("est"),
                "pickup": pickup.strip(),
                "dropoff": dropoff.strip(),
                "ride_class": product["id"],
                "available": available,
                "price": ride_price(product, distance, product["surge_multiplier"]),
                "currency": "USD",
                "surge_multiplier": product["surge_multiplier"],
                "distance_km": distance,
                "duration_min": minutes,
                "pickup_eta_min": product["pickup_eta_min"] if available else None,
                "passengers": passengers,
                "expires_at": expires,
            }
            self.records("estimates").append(dict(estimate))
            out.append(estimate)
        if not out:
            raise fail(f"no ride class here fits {passengers} passengers")
        return out

    @tool("write")
    def rides_accept_surge(self, estimate_id: str) -> SurgeConfirmation:
        """Accept the surge multiplier of an estimate; returns the id rides_request needs."""
        estimate = self.find("estimates", estimate_id, what="estimate")
        if estimate["surge_multiplier"] <= 1.0:
            raise fail(f"estimate {estimate_id} has no surge pricing to accept")
        confirmation: SurgeConfirmation = {
            "id": self.world.new_id("sc"),
            "estimate_id": estimate_id,
            "surge_multiplier": estimate["surge_multiplier"],
            "accepted_at": self.world.iso_now(),
        }
        self.records("surge_confirmations").append(dict(confirmation))
        return confirmation

    # booking ----------------------------------------------------------------------------
    @tool("payment")
    def rides_request(
        self,
        estimate_id: str,
        payment_method_id: str | None = None,
        pickup_note: Annotated[str, Field(max_length=200)] = "",
        surge_confirmation_id: str | None = None,
    ) -> Ride:
        """Request a ride now from an estimate; the fare is charged to the card at drop-off."""
        estimate = self.find("estimates", estimate_id, what="estimate")
        if estimate["expires_at"] < self.world.iso_now():
            raise fail(f"estimate {estimate_id} expired at {estimate['expires_at']}; get a new one")
        ride_class = estimate["ride_class"]
        drivers = self._free_drivers(ride_class)
        if not drivers:
            raise fail(
                f"no drivers available for {ride_class} near {estimate['pickup']}; "
                "try another ride class or schedule a ride"
            )
        surge = estimate["surge_multiplier"]
        if surge > 1.0:
            accepted = any(
                c["id"] == surge_confirmation_id and c["estimate_id"] == estimate_id
                for c in self.records("surge_confirmations")
            )
            if not accepted:
                raise fail(
                    f"surge pricing {surge}x is in effect for {ride_class}; accept it with "
                    "rides_accept_surge and pass surge_confirmation_id"
                )
        self._check_airport(estimate["pickup"], pickup_note)
        for other in self.records("rides"):
            if other["status"] == "accepted":
                raise fail(f"you already have an active ride {other['id']}; cancel it first")
        method = self._payment(payment_method_id)
        fare = estimate["price"]
        for promo in self.records("promos"):
            if promo["status"] == "applied":
                fare = round(max(0.0, fare - promo["discount"]), 2)
                promo["status"] = "used"
                break
        driver = drivers[0]
        driver["available"] = False
        ride: Ride = {
            "id": self.world.new_id("ride"),
            "status": "accepted",
            "pickup": estimate["pickup"],
            "dropoff": estimate["dropoff"],
            "stops": [],
            "ride_class": ride_class,
            "passengers": estimate["passengers"],
            "estimate_id": estimate_id,
            "fare": fare,
            "surge_multiplier": surge,
            "surge_confirmation_id": surge_confirmation_id if surge > 1.0 else None,
            "payment_method_id": method["id"],
            "pickup_note": pickup_note,
            "driver": {
                "name": driver["name"],
                "car": driver["car"],
                "plate": driver["plate"],
                "rating": driver["rating"],
            },
            "requested_at": self.world.iso_now(),
            "scheduled_for": None,
            "pickup_eta_min": self._product(ride_class)["pickup_eta_min"],
            "completed_at": None,
            "rating": None,
            "tip": 0.0,
            "cancellation_fee": 0.0,
        }
        self.records("rides").append(dict(ride))
        return ride

    @tool("write")
    def rides_schedule(
        self,
        dropoff: Address,
        pickup: Address,
        ride_class: RideClass,
        pickup_time: Annotated[str, Field(pattern=ISO_MINUTE, description="YYYY-MM-DDTHH:MM")],
        pickup_note: Annotated[str, Field(max_length=200)] = "",
        payment_method_id: str | None = None,
        passengers: Annotated[int, Field(ge=1, le=6)] = 1,
    ) -> Ride:
        """Reserve a ride for later; nothing is charged now, the fare is charged at pickup."""
        product = self._product(ride_class)
        if not product["schedulable"]:
            raise fail(f"{ride_class} rides cannot be scheduled; choose another class")
        if product["capacity"] < passengers:
            raise fail(f"{ride_class} seats {product['capacity']}, not {passengers}")
        if pickup.strip().lower() == dropoff.strip().lower():
            raise fail("pickup and dropoff are the same address", "invalid_arguments")
        when = parse_moment(pickup_time, "pickup_time")
        if when < self.world.now + timedelta(minutes=MIN_SCHEDULE_AHEAD_MIN):
            raise fail(
                f"scheduled rides must be at least {MIN_SCHEDULE_AHEAD_MIN} minutes ahead "
                f"(now {self.world.iso_now()})"
            )
        if when > self.world.now + timedelta(days=30):
            raise fail("rides can be scheduled at most 30 days ahead")
        self._check_airport(pickup, pickup_note)
        method = self._payment(payment_method_id)
        ride: Ride = {
            "id": self.world.new_id("ride"),
            "status": "scheduled",
            "pickup": pickup.strip(),
            "dropoff": dropoff.strip(),
            "stops": [],
            "ride_class": ride_class,
            "passengers": passengers,
            "estimate_id": None,
            "fare": ride_price(product, distance_km(pickup, dropoff)),
            "surge_multiplier": 1.0,
            "surge_confirmation_id": None,
            "payment_method_id": method["id"],
            "pickup_note": pickup_note,
            "driver": None,
            "requested_at": self.world.iso_now(),
            "scheduled_for": pickup_time,
            "pickup_eta_min": None,
            "completed_at": None,
            "rating": None,
            "tip": 0.0,
            "cancellation_fee": 0.0,
        }
        self.records("rides").append(dict(ride))
        return ride

    # trips ------------------------------------------------------------------------------
    @tool()
    def rides_get_ride(self, ride_id: str) -> Ride:
        """One ride: status, route, driver and car, fare, rating and tip."""
        return cast(Ride, self.find("rides", ride_id, what="ride"))

    @tool()
    def rides_list_rides(
        self,
        status: RideStatus | None = None,
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Ride]:
        """The user's rides, newest first, optionally only those with a status."""
        rows = [r for r in self.records("rides") if status in (None, r["status"])]
        rows.sort(key=lambda r: r["scheduled_for"] or r["requested_at"], reverse=True)
        return cast(list[Ride], paginate(rows, limit, offset))

    @tool("write")
    def rides_cancel(self, ride_id: str, reason: CancelReason = "other") -> Ride:
        """Cancel an active or scheduled ride; a fee applies once a driver has been on the way."""
        ride = self._ride(ride_id, "accepted", "scheduled")
        if ride["status"] == "accepted":
            requested = datetime.fromisoformat(ride["requested_at"])
            if self.world.now - requested >= timedelta(minutes=CANCEL_GRACE_MIN):
                ride["cancellation_fee"] = CANCEL_FEE
            for driver in self.records("drivers"):
                if ride["driver"] and driver["plate"] == ride["driver"]["plate"]:
                    driver["available"] = True
        ride["status"] = "cancelled"
        ride["cancel_reason"] = reason
        return cast(Ride, ride)

    @tool("write")
    def rides_update_dropoff(self, ride_id: str, dropoff: Address) -> Ride:
        """Change the destination of an active ride; the fare is re-quoted."""
        ride = self._ride(ride_id, "accepted", "scheduled")
        if dropoff.strip().lower() == ride["pickup"].lower():
            raise fail("the new dropoff is the pickup address", "invalid_arguments")
        ride["dropoff"] = dropoff.strip()
        product = self._product(ride["ride_class"])
        ride["fare"] = ride_price(product, self._route_distance(ride), ride["surge_multiplier"])
        return cast(Ride, ride)

    @tool("write")
    def rides_add_stop(self, ride_id: str, address: Address) -> Ride:
        """Add an intermediate stop to an active or scheduled ride (at most two)."""
        ride = self._ride(ride_id, "accepted", "scheduled")
        if len(ride["stops"]) >= MAX_RIDE_STOPS:
            raise fail(f"a ride takes at most {MAX_RIDE_STOPS} stops")
        ride["stops"].append(address.strip())
        product = self._product(ride["ride_class"])
        ride["fare"] = ride_price(product, self._route_distance(ride), ride["surge_multiplier"])
        return cast(Ride, ride)

    @tool("write")
    def rides_rate_trip(
        self,
        ride_id: str,
        stars: Annotated[int, Field(ge=1, le=5)],
        comment: Annotated[str, Field(max_length=500)] = "",
    ) -> Ride:
        """Rate the driver of a completed trip (1-5 stars, optional comment)."""
        ride = self._ride(ride_id, "completed")
        if ride["rating"] is not None:
            raise fail(f"ride {ride_id} is already rated")
        ride["rating"] = stars
        ride["rating_comment"] = comment
        return cast(Ride, ride)

    @tool("payment")
    def rides_add_tip(
        self, ride_id: str, amount: Annotated[float, Field(gt=0, le=200, description="USD")]
    ) -> Receipt:
        """Tip the driver of a completed, rated trip; charged to the trip's card."""
        ride = self._ride(ride_id, "completed")
        if ride["rating"] is None:
            raise fail(f"rate ride {ride_id} before tipping (rides_rate_trip)")
        if ride["tip"] > 0:
            raise fail(f"ride {ride_id} already has a tip of {ride['tip']:.2f}")
        ride["tip"] = round(amount, 2)
        return self.rides_get_receipt(ride_id)

    @tool()
    def rides_get_receipt(self, ride_id: str) -> Receipt:
        """The receipt of a completed (or fee-charged cancelled) ride: fare, tip, total, card."""
        ride = self.find("rides", ride_id, what="ride")
        charged = ride["status"] == "completed" or ride["cancellation_fee"] > 0
        if not charged:
            raise fail(f"ride {ride_id} is {ride['status']}: no receipt until it is completed")
        method = self.find("payment_methods", ride["payment_method_id"], what="payment method")
        fare = ride["fare"] if ride["status"] == "completed" else 0.0
        return {
            "ride_id": ride_id,
            "fare": fare,
            "surge_multiplier": ride["surge_multiplier"],
            "tip": ride["tip"],
            "cancellation_fee": ride["cancellation_fee"],
            "total": round(fare + ride["tip"] + ride["cancellation_fee"], 2),
            "payment_method_id": method["id"],
            "card": f"{method['brand']} ending {method['last4']}",
            "distance_km": self._route_distance(ride),
            "completed_at": ride["completed_at"],
        }

    @tool("write")
    def rides_share_trip(
        self, ride_id: str, phone: Annotated[str, Field(pattern=PHONE)]
    ) -> TripShare:
        """Share a live trip (route, car, plate, ETA) with a phone number."""
        ride = self._ride(ride_id, "accepted")
        driver = ride["driver"] or {}
        share_id = self.world.new_id("share")
        share: TripShare = {
            "id": share_id,
            "ride_id": ride_id,
            "phone": phone,
            "link": f"https://rides.example.com/trip/{share_id}",
            "plate": driver.get("plate", ""),
        }
        self.records("shares").append(dict(share))
        return share

    @tool("write")
    def rides_report_lost_item(
        self,
        ride_id: str,
        description: Annotated[str, Field(min_length=3, max_length=300)],
        contact_phone: Annotated[str, Field(pattern=PHONE)],
    ) -> LostItemReport:
        """Report an item left in the car of a completed trip; the driver is asked to call back."""
        ride = self._ride(ride_id, "completed")
        if ride["completed_at"] and datetime.fromisoformat(ride["completed_at"]) < (
            self.world.now - timedelta(days=30)
        ):
            raise fail(f"ride {ride_id} is more than 30 days old; contact support instead")
        report: LostItemReport = {
            "id": self.world.new_id("lost"),
            "ride_id": ride_id,
            "description": description,
            "contact_phone": contact_phone,
            "status": "driver_notified",
            "reported_at": self.world.iso_now(),
        }
        self.records("lost_items").append(dict(report))
        return report

    # account ----------------------------------------------------------------------------
    @tool()
    def rides_list_places(self) -> list[SavedPlace]:
        """Saved places such as home, work or gym, with their addresses."""
        return cast(list[SavedPlace], self.records("places"))

    @tool("write")
    def rides_save_place(
        self, label: Annotated[str, Field(min_length=1, max_length=40)], address: Address
    ) -> SavedPlace:
        """Save (or move) a labelled place, e.g. label 'gym' at an address."""
        key = label.strip().lower()
        for place in self.records("places"):
            if place["label"] == key:
                place["address"] = address.strip()
                return cast(SavedPlace, place)
        place_new: SavedPlace = {"id": self.world.new_id("pl"), "label": key, "address": address}
        self.records("places").append(dict(place_new))
        return place_new

    @tool()
    def rides_list_payment_methods(self) -> list[PaymentMethod]:
        """Cards on the account (brand, last four digits, personal/business, default)."""
        return cast(list[PaymentMethod], self.records("payment_methods"))

    @tool("write")
    def rides_set_default_payment(self, payment_method_id: str) -> PaymentMethod:
        """Make a card the default for future rides."""
        chosen = self.find("payment_methods", payment_method_id, what="payment method")
        for method in self.records("payment_methods"):
            method["default"] = method is chosen
        return cast(PaymentMethod, chosen)

    @tool("write")
    def rides_apply_promo(
        self, code: Annotated[str, Field(pattern=r"^[A-Z0-9]{4,16}$", description="Promo code")]
    ) -> Promo:
        """Apply a promo code to the next ride requested."""
        promo = self.first("promos", code=code)
        if promo is None:
            raise fail(f"promo code {code} is not valid")
        if promo["expires"] < self.world.now.date().isoformat():
            raise fail(f"promo code {code} expired on {promo['expires']}")
        if promo["status"] != "available":
            raise fail(f"promo code {code} is already {promo['status']}")
        promo["status"] = "applied"
        return cast(Promo, promo)
