"""Flights: search, book, change and cancel flights; seats, bags, passports, check-in, status."""

from __future__ import annotations

import zlib
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import (
    CLOCK_24H,
    ISO_DATE,
    App,
    Limit,
    Offset,
    confirmation_code,
    fail,
    paginate,
    parse_moment,
    tool,
)

Cabin = Literal["economy", "premium_economy", "business", "first"]
Meal = Literal["vegetarian", "vegan", "kosher", "halal", "gluten_free", "child"]
SeatType = Literal["window", "aisle", "middle"]
BookingStatus = Literal["upcoming", "past", "cancelled"]

IATA = Annotated[str, Field(pattern=r"^[A-Z]{3}$", description="IATA airport code, e.g. JFK")]
IsoDate = Annotated[str, Field(pattern=ISO_DATE, description="YYYY-MM-DD")]
FF_NUMBER = r"^[A-Z]{2}-\d{8}$"

# (code, city, airport name, country)
AIRPORTS: list[tuple[str, str, str, str]] = [
    ("JFK", "New York", "John F. Kennedy International Airport", "US"),
    ("LGA", "New York", "LaGuardia Airport", "US"),
    ("BOS", "Boston", "Logan International Airport", "US"),
    ("ORD", "Chicago", "O'Hare International Airport", "US"),
    ("SFO", "San Francisco", "San Francisco International Airport", "US"),
    ("LAX", "Los Angeles", "Los Angeles International Airport", "US"),
    ("SEA", "Seattle", "Seattle-Tacoma International Airport", "US"),
    ("DEN", "Denver", "Denver International Airport", "US"),
    ("ATL", "Atlanta", "Hartsfield-Jackson Atlanta International Airport", "US"),
    ("MIA", "Miami", "Miami International Airport", "US"),
    ("AUS", "Austin", "Austin-Bergstrom International Airport", "US"),
    ("YYZ", "Toronto", "Toronto Pearson International Airport", "CA"),
    ("MEX", "Mexico City", "Mexico City International Airport", "MX"),
    ("LHR", "London", "Heathrow Airport", "GB"),
    ("CDG", "Paris", "Charles de Gaulle Airport", "FR"),
    ("FRA", "Frankfurt", "Frankfurt Airport", "DE"),
    ("NRT", "Tokyo", "Narita International Airport", "JP"),
]
AIRPORT_BY_CODE = {a[0]: a for a in AIRPORTS}
AIRLINES = {
    "SW": "SkyWays",
    "NW": "Northwind Air",
    "BH": "Blue Horizon",
    "PJ": "Pacific Jet",
    "AT": "Atlas Airlines",
}
# cabin -> (first row, last row, seat letters)
CABIN_ROWS: dict[str, tuple[int, int, str]] = {
    "first": (1, 2, "AF"),
    "business": (3, 6, "ACDF"),
    "premium_economy": (7, 9, "ABCDEF"),
    "economy": (10, 29, "ABCDEF"),
}
SEAT_TYPES = {
    "A": "window",
    "F": "window",
    "C": "aisle",
    "D": "aisle",
    "B": "middle",
    "E": "middle",
}
FIRST_BAG, EXTRA_BAG = 35.0, 45.0
CHECK_IN_WINDOW_H = 24
PASSPORT_MARGIN_DAYS = 182


def fare_rules(airline: str, cabin: str) -> dict[str, Any]:
    """Change fee, refundability and included bags of a cabin (SkyWays never charges changes)."""
    fee = {"economy": 75.0, "premium_economy": 50.0, "business": 0.0, "first": 0.0}[cabin]
    return {
        "cabin": cabin,
        "refundable": cabin in ("business", "first"),
        "change_fee": 0.0 if airline == "SW" else fee,
        "checked_bags_included": {"economy": 0, "premium_economy": 1}.get(cabin, 2),
        "carry_on": True,
    }


def seat_taken(flight: dict[str, Any], seat: str) -> bool:
    """Occupied seats: those booked in this world plus a fixed pseudo-random third of the rest."""
    if seat in flight.get("taken_seats", []):
        return True
    key = f"{flight['id']}|{flight['flight_no']}|{flight['date']}|{seat}"
    return zlib.crc32(key.encode()) % 3 == 0


def cabin_seats(cabin: str) -> list[str]:
    first, last, letters = CABIN_ROWS[cabin]
    return [f"{row}{letter}" for row in range(first, last + 1) for letter in letters]


def booking_record(
    booking_id: str,
    pnr: str,
    flight: dict[str, Any],
    *,
    cabin: str,
    traveler_name: str,
    booked_at: str,
    passengers: int = 1,
    price_paid: float | None = None,
    frequent_flyer: str | None = None,
) -> dict[str, Any]:
    """A confirmed booking on `flight`: the fare paid (by default once), no seat, bags, meal or
    check-in yet."""
    fare = flight["fares"][cabin]
    return {
        "id": booking_id,
        "pnr": pnr,
        "flight_id": flight["id"],
        "airline": flight["airline"],
        "flight_no": flight["flight_no"],
        "origin": flight["origin"],
        "destination": flight["destination"],
        "date": flight["date"],
        "depart": flight["depart"],
        "arrive": flight["arrive"],
        "cabin": cabin,
        "passengers": passengers,
        "traveler_name": traveler_name,
        "fare_per_passenger": fare,
        "price_paid": fare if price_paid is None else price_paid,
        "fare_difference_paid": 0.0,
        "change_fee_paid": 0.0,
        "travel_credit": 0.0,
        "status": "confirmed",
        "seat": None,
        "bags": 0,
        "bags_paid": 0.0,
        "frequent_flyer": frequent_flyer,
        "passport": None,
        "meal": None,
        "checked_in": False,
        "boarding_pass": None,
        "international": flight["international"],
        "booked_at": booked_at,
    }


def _norm_flight_no(flight_no: str) -> str:
    return flight_no.replace(" ", "").upper()


class Airport(TypedDict):
    code: str
    city: str
    name: str
    country: str


class _FlightBase(TypedDict):
    id: str
    airline: str
    airline_name: str
    flight_no: str
    origin: str
    destination: str
    date: str
    depart: str
    arrive: str
    duration_min: int
    stops: int


class FlightOffer(_FlightBase):
    cabin: str
    price: float
    seats_left: int
    international: bool


class Flight(_FlightBase):
    aircraft: str
    fares: dict[str, float]
    seats_left: dict[str, int]
    international: bool


class FareRules(TypedDict):
    cabin: str
    refundable: bool
    change_fee: float
    checked_bags_included: int
    carry_on: bool


class Passport(TypedDict):
    number: str
    nationality: str
    expiry: str


class BoardingPass(TypedDict):
    seat: str
    gate: str
    group: int
    boarding_time: str


class Booking(TypedDict):
    id: str
    pnr: str
    flight_id: str
    airline: str
    flight_no: str
    origin: str
    destination: str
    date: str
    depart: str
    arrive: str
    cabin: str
    passengers: int
    traveler_name: str
    fare_per_passenger: float
    price_paid: float
    fare_difference_paid: float
    change_fee_paid: float
    travel_credit: float
    status: str
    seat: str | None
    bags: int
    bags_paid: float
    frequent_flyer: str | None
    passport: Passport | None
    meal: str | None
    checked_in: bool
    boarding_pass: BoardingPass | None
    international: bool
    booked_at: str


class Seat(TypedDict):
    seat: str
    row: int
    type: str
    available: bool
    extra_legroom: bool


class FlightStatus(TypedDict):
    flight_no: str
    date: str
    status: str
    delay_min: int
    scheduled_departure: str
    estimated_departure: str
    departure_terminal: str
    gate: str
    scheduled_arrival: str
    estimated_arrival: str
    arrival_terminal: str
    baggage_claim: str


class PriceAlert(TypedDict):
    id: str
    origin: str
    destination: str
    date: str
    max_price: float
    created_at: str


def _shift(hhmm: str, minutes: int) -> str:
    moment = datetime(2000, 1, 1, int(hhmm[:2]), int(hhmm[3:5])) + timedelta(minutes=minutes)
    return moment.strftime("%H:%M")


class FlightsApp(App):
    name = "flights"
    title = "Flights"
    description = (
        "Airline tickets: search and book flights, change or cancel bookings, seats, bags, "
        "meals, frequent flyer numbers, passports, online check-in and live flight status."
    )
    skills = {
        "change_flight": (
            "To change a flight: flights_get_booking, flights_search the SAME origin, "
            "destination and airline on the new date, then "
            "flights_change_booking(booking_id, new_flight_id, "
            "accept_fare_difference=true) when the new fare is higher or a change fee applies "
            "(see flights_get_fare_rules); the difference is charged. A different route is not "
            "a change: cancel and book again."
        ),
        "international_check_in": (
            "Online check-in opens 24 hours before departure. International flights need the "
            "passport on the booking first: flights_add_passport(booking_id, passport_number, "
            "nationality, expiry) with a passport valid at least 6 months after the travel date, "
            "then flights_check_in(booking_id)."
        ),
        "frequent_flyer": (
            "Frequent flyer numbers start with the airline code, e.g. 'NW-48213377' for "
            "Northwind Air; only the operating airline's number is accepted (on flights_book or "
            "later with flights_add_frequent_flyer)."
        ),
        "seats_and_bags": (
            "Seat letters: A and F are windows, C and D aisles, B and E middles; "
            "flights_get_seat_map lists a cabin's seats (rows 10 and 14 have extra legroom). "
            "Checked bags are bought per booking with flights_add_bags: $35 the first paid bag, "
            "$45 each further one, after the bags the cabin includes."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"flights": [], "bookings": [], "price_alerts": []}

    # helpers ----------------------------------------------------------------------------
    def _departure(self, record: dict[str, Any]) -> datetime:
        return datetime.fromisoformat(f"{record['date']}T{record['depart']}")

    def _booking(self, booking_id: str, *, active: bool = True) -> dict[str, Any]:
        booking = self.find("bookings", booking_id, what="booking")
        if active and booking["status"] != "confirmed":
            raise fail(f"booking {booking_id} is {booking['status']}")
        return booking

    def _offer(self, flight: dict[str, Any], cabin: str) -> FlightOffer:
        return {
            "id": flight["id"],
            "airline": flight["airline"],
            "airline_name": AIRLINES.get(flight["airline"], flight["airline"]),
            "flight_no": flight["flight_no"],
            "origin": flight["origin"],
            "destination": flight["destination"],
            "date": flight["date"],
            "depart": flight["depart"],
            "arrive": flight["arrive"],
            "duration_min": flight["duration_min"],
            "stops": flight["stops"],
            "cabin": cabin,
            "price": flight["fares"][cabin],
            "seats_left": flight["seats_left"].get(cabin, 0),
            "international": flight["international"],
        }

    def _seat_check(self, flight: dict[str, Any], cabin: str, passengers: int) -> None:
        if cabin not in flight["fares"]:
            raise fail(f"{flight['flight_no']} has no {cabin} cabin")
        left = flight["seats_left"].get(cabin, 0)
        if left == 0:
            raise fail(f"{flight['flight_no']} on {flight['date']} is sold out in {cabin}")
        if left < passengers:
            raise fail(f"only {left} {cabin} seats left on {flight['flight_no']}")

    # search -----------------------------------------------------------------------------
    @tool()
    def flights_search_airports(
        self, query: Annotated[str, Field(min_length=2, description="City, airport or code")]
    ) -> list[Airport]:
        """Find airports by city, name or IATA code."""
        q = query.strip().lower()
        return [
            {"code": code, "city": city, "name": name, "country": country}
            for code, city, name, country in AIRPORTS
            if q in code.lower() or q in city.lower() or q in name.lower()
        ]

    @tool()
    def flights_search(
        self,
        origin: IATA,
        destination: IATA,
        date: IsoDate,
        cabin: Cabin = "economy",
        passengers: Annotated[int, Field(ge=1, le=9)] = 1,
        max_stops: Annotated[int | None, Field(ge=0, le=2)] = None,
        max_price: Annotated[float | None, Field(gt=0, description="Per passenger, USD")] = None,
        airline: Annotated[str | None, Field(pattern=r"^[A-Z]{2}$")] = None,
        depart_after: Annotated[str | None, Field(pattern=CLOCK_24H)] = None,
        sort_by: Literal["price", "departure", "duration"] = "price",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[FlightOffer]:
        """Flights on a date with their price in a cabin and seats left (0 means sold out)."""
        if origin == destination:
            raise fail("origin and destination are the same airport", "invalid_arguments")
        if date < self.world.now.date().isoformat():
            raise fail(f"{date} is in the past")
        offers = []
        for flight in self.records("flights"):
            if (flight["origin"], flight["destination"], flight["date"]) != (
                origin,
                destination,
                date,
            ):
                continue
            if cabin not in flight["fares"]:
                continue
            if max_stops is not None and flight["stops"] > max_stops:
                continue
            if airline and flight["airline"] != airline:
                continue
            if depart_after and flight["depart"] < depart_after:
                continue
            if max_price is not None and flight["fares"][cabin] > max_price:
                continue
            offers.append(self._offer(flight, cabin))
        keys = {
            "price": lambda o: (o["price"], o["depart"]),
            "departure": lambda o: (o["depart"], o["price"]),
            "duration": lambda o: (o["duration_min"], o["price"]),
        }
        offers.sort(key=keys[sort_by])
        return paginate(offers, limit, offset)

    @tool()
    def flights_get_flight(self, flight_id: str) -> Flight:
        """One flight: schedule, stops, aircraft, fares and seats left per cabin."""
        flight = self.find("flights", flight_id, what="flight")
        view = {k: v for k, v in flight.items() if k in Flight.__annotations__}
        view["airline_name"] = AIRLINES.get(flight["airline"], flight["airline"])
        return cast(Flight, view)

    @tool()
    def flights_get_fare_rules(self, flight_id: str, cabin: Cabin = "economy") -> FareRules:
        """Change fee, refundability and included bags of a flight's cabin."""
        flight = self.find("flights", flight_id, what="flight")
        if cabin not in flight["fares"]:
            raise fail(f"{flight['flight_no']} has no {cabin} cabin")
        return cast(FareRules, fare_rules(flight["airline"], cabin))

    # bookings ---------------------------------------------------------------------------
    @tool("payment")
    def flights_book(
        self,
        flight_id: str,
        cabin: Cabin = "economy",
        passengers: Annotated[int, Field(ge=1, le=9)] = 1,
        traveler_name: Annotated[str | None, Field(min_length=3)] = None,
        frequent_flyer_number: Annotated[str | None, Field(pattern=FF_NUMBER)] = None,
    ) -> Booking:
        """Buy tickets on a flight; the fare times passengers is charged now."""
        flight = self.find("flights", flight_id, what="flight")
        if self._departure(flight) <= self.world.now:
            raise fail(f"{flight['flight_no']} on {flight['date']} has already departed")
        self._seat_check(flight, cabin, passengers)
        if frequent_flyer_number and frequent_flyer_number[:2] != flight["airline"]:
            raise fail(
                f"frequent flyer number {frequent_flyer_number} is not a "
                f"{AIRLINES.get(flight['airline'])} ({flight['airline']}) number"
            )
        flight["seats_left"][cabin] -= passengers
        fare = flight["fares"][cabin]
        booking_id = self.world.new_id("bk")
        booking = booking_record(
            booking_id,
            confirmation_code(f"{booking_id}|{flight_id}"),
            flight,
            cabin=cabin,
            traveler_name=traveler_name or self.world.user.name,
            booked_at=self.world.iso_now(),
            passengers=passengers,
            price_paid=round(fare * passengers, 2),
            frequent_flyer=frequent_flyer_number,
        )
        self.records("bookings").append(dict(booking))
        return cast(Booking, booking)

    @tool()
    def flights_get_booking(
        self, booking_ref: Annotated[str, Field(min_length=3, description="Booking id or PNR")]
    ) -> Booking:
        """One booking by id or 6-character PNR."""
        ref = booking_ref.strip()
        for booking in self.records("bookings"):
            if booking["id"] == ref or booking["pnr"] == ref.upper():
                return cast(Booking, booking)
        raise fail(f"booking '{booking_ref}' not found")

    @tool()
    def flights_list_bookings(
        self,
        status: BookingStatus | None = None,
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Booking]:
        """The user's flight bookings, soonest first; status upcoming, past or cancelled."""
        now = self.world.now
        rows = []
        for booking in self.records("bookings"):
            state = (
                "cancelled"
                if booking["status"] == "cancelled"
                else "upcoming"
                if self._departure(booking) > now
                else "past"
            )
            if status in (None, state):
                rows.append(booking)
        rows.sort(key=lambda b: (b["date"], b["depart"]))
        return cast(list[Booking], paginate(rows, limit, offset))

    @tool("payment")
    def flights_change_booking(
        self, booking_id: str, new_flight_id: str, accept_fare_difference: bool = False
    ) -> Booking:
        """Move a booking to another flight on the same route; charges any fare difference."""
        booking = self._booking(booking_id)
        if booking["checked_in"]:
            raise fail(f"booking {booking_id} is checked in and can no longer be changed")
        new = self.find("flights", new_flight_id, what="flight")
        if new["id"] == booking["flight_id"]:
            raise fail(f"booking {booking_id} is already on {new['flight_no']}")
        if new["airline"] != booking["airline"]:
            raise fail(
                f"{new['flight_no']} is operated by another airline; a change stays on "
                f"{AIRLINES.get(booking['airline'])} (cancel and book again to switch)"
            )
        if (new["origin"], new["destination"]) != (booking["origin"], booking["destination"]):
            raise fail(
                f"a change must keep the route {booking['origin']}-{booking['destination']}; "
                "cancel and book again for another route"
            )
        if self._departure(new) <= self.world.now:
            raise fail(f"{new['flight_no']} on {new['date']} has already departed")
        cabin, pax = booking["cabin"], booking["passengers"]
        self._seat_check(new, cabin, pax)
        diff = round((new["fares"][cabin] - booking["fare_per_passenger"]) * pax, 2)
        fee = round(fare_rules(booking["airline"], cabin)["change_fee"] * pax, 2)
        due = round(max(diff, 0.0) + fee, 2)
        if due > 0 and not accept_fare_difference:
            raise fail(
                f"this change costs ${due:.2f} (fare difference ${max(diff, 0.0):.2f} + change "
                f"fee ${fee:.2f}); pass accept_fare_difference=true to pay it"
            )
        for flight in self.records("flights"):
            if flight["id"] == booking["flight_id"]:
                flight["seats_left"][cabin] = flight["seats_left"].get(cabin, 0) + pax
                if booking["seat"] in flight.get("taken_seats", []):
                    flight["taken_seats"].remove(booking["seat"])
        new["seats_left"][cabin] -= pax
        booking.update(
            flight_id=new["id"],
            flight_no=new["flight_no"],
            date=new["date"],
            depart=new["depart"],
            arrive=new["arrive"],
            fare_per_passenger=new["fares"][cabin],
            seat=None,
            fare_difference_paid=round(booking["fare_difference_paid"] + max(diff, 0.0), 2),
            change_fee_paid=round(booking["change_fee_paid"] + fee, 2),
            travel_credit=round(booking["travel_credit"] + max(-diff, 0.0), 2),
        )
        return cast(Booking, booking)

    @tool("write")
    def flights_cancel_booking(self, booking_id: str) -> Booking:
        """Cancel a booking: refundable fares are refunded, others become travel credit."""
        booking = self._booking(booking_id)
        if booking["checked_in"]:
            raise fail(f"booking {booking_id} is checked in; cancel at the airport desk")
        rules = fare_rules(booking["airline"], booking["cabin"])
        paid = booking["price_paid"] + booking["fare_difference_paid"]
        booking["status"] = "cancelled"
        if rules["refundable"]:
            booking["refund"] = round(paid, 2)
        else:
            booking["refund"] = 0.0
            fee = rules["change_fee"] * booking["passengers"]
            booking["travel_credit"] = round(max(paid - fee, 0.0), 2)
        for flight in self.records("flights"):
            if flight["id"] == booking["flight_id"]:
                cabin = booking["cabin"]
                flight["seats_left"][cabin] = (
                    flight["seats_left"].get(cabin, 0) + booking["passengers"]
                )
        return cast(Booking, booking)

    # seats, bags, extras ----------------------------------------------------------------
    @tool()
    def flights_get_seat_map(
        self,
        flight_id: str,
        cabin: Cabin = "economy",
        seat_type: SeatType | None = None,
        available_only: bool = True,
    ) -> list[Seat]:
        """Seats of a flight's cabin with their type (window/aisle/middle) and availability."""
        flight = self.find("flights", flight_id, what="flight")
        if cabin not in flight["fares"]:
            raise fail(f"{flight['flight_no']} has no {cabin} cabin")
        seats: list[Seat] = []
        for seat in cabin_seats(cabin):
            kind = SEAT_TYPES[seat[-1]]
            free = not seat_taken(flight, seat)
            if (seat_type and kind != seat_type) or (available_only and not free):
                continue
            row = int(seat[:-1])
            seats.append(
                {
                    "seat": seat,
                    "row": row,
                    "type": kind,
                    "available": free,
                    "extra_legroom": row in (10, 14),
                }
            )
        return seats

    @tool("write")
    def flights_select_seat(
        self, booking_id: str, seat: Annotated[str, Field(pattern=r"^\d{1,2}[A-F]$")]
    ) -> Booking:
        """Pick a free seat in the booking's cabin (replaces the current seat)."""
        booking = self._booking(booking_id)
        flight = self.find("flights", booking["flight_id"], what="flight")
        if seat not in cabin_seats(booking["cabin"]):
            raise fail(f"seat {seat} is not in the {booking['cabin']} cabin")
        if seat_taken(flight, seat):
            raise fail(f"seat {seat} on {flight['flight_no']} is taken")
        taken: list[str] = flight.setdefault("taken_seats", [])
        if booking["seat"] in taken:
            taken.remove(booking["seat"])
        taken.append(seat)
        booking["seat"] = seat
        if booking["boarding_pass"]:
            booking["boarding_pass"]["seat"] = seat
        return cast(Booking, booking)

    @tool("payment")
    def flights_add_bags(
        self, booking_id: str, count: Annotated[int, Field(ge=1, le=3)] = 1
    ) -> Booking:
        """Buy checked bags for a booking ($35 the first paid bag, $45 each further one)."""
        booking = self._booking(booking_id)
        if booking["bags"] + count > 3:
            raise fail(f"at most 3 paid bags per booking; it has {booking['bags']}")
        cost = sum(
            FIRST_BAG if n == 0 else EXTRA_BAG
            for n in range(booking["bags"], booking["bags"] + count)
        )
        booking["bags"] += count
        booking["bags_paid"] = round(booking["bags_paid"] + cost * booking["passengers"], 2)
        return cast(Booking, booking)

    @tool("write")
    def flights_add_frequent_flyer(
        self, booking_id: str, number: Annotated[str, Field(pattern=FF_NUMBER)]
    ) -> Booking:
        """Attach a frequent flyer number of the operating airline to a booking."""
        booking = self._booking(booking_id)
        if number[:2] != booking["airline"]:
            raise fail(
                f"{number} is not a {AIRLINES.get(booking['airline'])} ({booking['airline']}) "
                "frequent flyer number"
            )
        booking["frequent_flyer"] = number
        return cast(Booking, booking)

    @tool("write")
    def flights_add_passport(
        self,
        booking_id: str,
        passport_number: Annotated[str, Field(pattern=r"^[A-Z0-9]{6,9}$")],
        nationality: Annotated[str, Field(pattern=r"^[A-Z]{2}$", description="Country code")],
        expiry: IsoDate,
    ) -> Booking:
        """Add the traveler's passport to a booking (needed to check in internationally)."""
        booking = self._booking(booking_id)
        travel = datetime.fromisoformat(booking["date"])
        if parse_moment(expiry, "expiry") < travel + timedelta(days=PASSPORT_MARGIN_DAYS):
            raise fail(
                f"passport expires {expiry}, less than 6 months after travel on {booking['date']}"
            )
        booking["passport"] = {
            "number": passport_number,
            "nationality": nationality,
            "expiry": expiry,
        }
        return cast(Booking, booking)

    @tool("write")
    def flights_check_in(self, booking_id: str) -> Booking:
        """Check in online and get a boarding pass (opens 24 hours before departure)."""
        booking = self._booking(booking_id)
        if booking["checked_in"]:
            raise fail(f"booking {booking_id} is already checked in")
        departure = self._departure(booking)
        if departure <= self.world.now:
            raise fail(f"{booking['flight_no']} has already departed")
        opens = departure - timedelta(hours=CHECK_IN_WINDOW_H)
        if self.world.now < opens:
            at = opens.isoformat(timespec="minutes")
            raise fail(f"check-in opens 24 hours before departure, at {at}")
        if booking["international"] and not booking["passport"]:
            raise fail(
                "passport details are required before checking in for an international flight "
                "(flights_add_passport)"
            )
        flight = self.find("flights", booking["flight_id"], what="flight")
        seat = booking["seat"]
        if seat is None:
            seat = next(s for s in cabin_seats(booking["cabin"]) if not seat_taken(flight, s))
            flight.setdefault("taken_seats", []).append(seat)
            booking["seat"] = seat
        booking["checked_in"] = True
        booking["boarding_pass"] = {
            "seat": seat,
            "gate": flight.get("gate", "TBA"),
            "group": 1 if booking["cabin"] in ("business", "first") else 3,
            "boarding_time": _shift(booking["depart"], -40),
        }
        return cast(Booking, booking)

    @tool("write")
    def flights_request_meal(self, booking_id: str, meal: Meal) -> Booking:
        """Request a special meal (served on flights over 3 hours, or in business and first)."""
        booking = self._booking(booking_id)
        flight = self.find("flights", booking["flight_id"], what="flight")
        if flight["duration_min"] < 180 and booking["cabin"] not in ("business", "first"):
            raise fail(f"no meal service on {flight['flight_no']} ({flight['duration_min']} min)")
        booking["meal"] = meal
        return cast(Booking, booking)

    # status and alerts ------------------------------------------------------------------
    @tool()
    def flights_get_status(
        self,
        flight_no: Annotated[str, Field(pattern=r"^[A-Z]{2} ?\d{1,4}$", description="e.g. NW 214")],
        date: IsoDate,
    ) -> FlightStatus:
        """Live status of a flight: delay, terminals, gate and baggage claim."""
        wanted = _norm_flight_no(flight_no)
        for flight in self.records("flights"):
            if _norm_flight_no(flight["flight_no"]) == wanted and flight["date"] == date:
                delay = int(flight.get("delay_min", 0))
                return {
                    "flight_no": flight["flight_no"],
                    "date": date,
                    "status": flight.get("status", "on_time"),
                    "delay_min": delay,
                    "scheduled_departure": flight["depart"],
                    "estimated_departure": _shift(flight["depart"], delay),
                    "departure_terminal": flight.get("departure_terminal", "1"),
                    "gate": flight.get("gate", "TBA"),
                    "scheduled_arrival": flight["arrive"],
                    "estimated_arrival": _shift(flight["arrive"], delay),
                    "arrival_terminal": flight.get("arrival_terminal", "1"),
                    "baggage_claim": flight.get("baggage_claim", "TBA"),
                }
        raise fail(f"no flight {flight_no} on {date}")

    @tool("write")
    def flights_create_price_alert(
        self,
        origin: IATA,
        destination: IATA,
        date: IsoDate,
        max_price: Annotated[float, Field(gt=0, description="Alert when a fare is at or below")],
    ) -> PriceAlert:
        """Get notified when a fare on a route and date drops to a price."""
        for alert in self.records("price_alerts"):
            if (alert["origin"], alert["destination"], alert["date"]) == (
                origin,
                destination,
                date,
            ):
                raise fail(f"an alert for {origin}-{destination} on {date} already exists")
        alert_new: PriceAlert = {
            "id": self.world.new_id("alert"),
            "origin": origin,
            "destination": destination,
            "date": date,
            "max_price": max_price,
            "created_at": self.world.iso_now(),
        }
        self.records("price_alerts").append(dict(alert_new))
        return alert_new
