"""Hotels: search stays, quote rooms, book, modify, cancel and add requests to reservations."""

from __future__ import annotations

import re
from datetime import date as Date
from datetime import timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import (
    ISO_DATE,
    App,
    Limit,
    Offset,
    confirmation_code,
    fail,
    paginate,
    tool,
)

Amenity = Literal[
    "wifi",
    "pool",
    "gym",
    "spa",
    "parking",
    "breakfast",
    "airport_shuttle",
    "pet_friendly",
    "ev_charging",
    "restaurant",
]
RoomType = Literal[
    "standard_queen", "standard_king", "double_queen", "deluxe_king", "junior_suite", "suite"
]
RequestKind = Literal[
    "late_checkout",
    "early_checkin",
    "extra_bed",
    "crib",
    "quiet_room",
    "high_floor",
    "airport_shuttle",
]
ReservationStatus = Literal["upcoming", "past", "cancelled"]

IsoDate = Annotated[str, Field(pattern=ISO_DATE, description="YYYY-MM-DD")]
LOYALTY = r"^[A-Z]{3}-\d{7}$"
MAX_NIGHTS = 30
QUOTE_TTL_MIN = 30
_TIME = re.compile(r"\b\d{1,2}:\d{2}\b")
# How a flight number appears in free text ('NW 214', 'NW214').
FLIGHT_NO = re.compile(r"\b([A-Z]{2}) ?(\d{1,4})\b")


def reservation_record(
    reservation_id: str,
    confirmation: str,
    hotel: dict[str, Any],
    room: dict[str, Any],
    stay: dict[str, Any],
    *,
    guest_name: str,
    booked_at: str,
    loyalty_number: str | None = None,
) -> dict[str, Any]:
    """A confirmed reservation of `room` at `hotel`; `stay` holds check_in, check_out, nights,
    guests, nightly_rate, total, refundable and breakfast (a quote has them all)."""
    return {
        "id": reservation_id,
        "confirmation": confirmation,
        "hotel_id": hotel["id"],
        "hotel_name": hotel["name"],
        "hotel_address": hotel["address"],
        "city": hotel["city"],
        "room_id": room["id"],
        "room_type": room["room_type"],
        "check_in": stay["check_in"],
        "check_out": stay["check_out"],
        "nights": stay["nights"],
        "guests": stay["guests"],
        "guest_name": guest_name,
        "nightly_rate": stay["nightly_rate"],
        "total": stay["total"],
        "refundable": stay["refundable"],
        "breakfast": stay["breakfast"],
        "status": "confirmed",
        "loyalty_number": loyalty_number,
        "requests": [],
        "online_check_in": None,
        "booked_at": booked_at,
    }


def stay_dates(check_in: str, check_out: str) -> list[str]:
    """The nights of a stay as ISO dates (check-in day up to the day before check-out)."""
    start, end = Date.fromisoformat(check_in), Date.fromisoformat(check_out)
    return [(start + timedelta(days=i)).isoformat() for i in range((end - start).days)]


def room_free(room: dict[str, Any], check_in: str, check_out: str) -> bool:
    blocked = set(room.get("sold_out_dates", []))
    return not blocked.intersection(stay_dates(check_in, check_out))


class Hotel(TypedDict):
    id: str
    name: str
    chain: str
    chain_name: str
    city: str
    neighborhood: str
    address: str
    stars: int
    rating: float
    amenities: list[str]
    phone: str
    check_in_time: str
    check_out_time: str


class HotelOffer(TypedDict):
    id: str
    name: str
    chain: str
    city: str
    neighborhood: str
    address: str
    stars: int
    rating: float
    amenities: list[str]
    available: bool
    from_price: float | None


class Quote(TypedDict):
    id: str
    hotel_id: str
    hotel_name: str
    room_id: str
    room_type: str
    max_guests: int
    check_in: str
    check_out: str
    nights: int
    guests: int
    nightly_rate: float
    total: float
    refundable: bool
    breakfast: bool
    expires_at: str


class StayRequest(TypedDict):
    id: str
    reservation_id: str
    kind: str
    note: str
    flight_no: str | None
    landing_time: str | None
    status: str
    sent_at: str


class OnlineCheckIn(TypedDict):
    arrival_time: str
    room_ready_at: str


class Reservation(TypedDict):
    id: str
    confirmation: str
    hotel_id: str
    hotel_name: str
    hotel_address: str
    city: str
    room_id: str
    room_type: str
    check_in: str
    check_out: str
    nights: int
    guests: int
    guest_name: str
    nightly_rate: float
    total: float
    refundable: bool
    breakfast: bool
    status: str
    loyalty_number: str | None
    requests: list[str]
    online_check_in: OnlineCheckIn | None
    booked_at: str


class HotelReview(TypedDict):
    id: str
    hotel_id: str
    author: str
    stars: int
    text: str
    date: str


class HotelsApp(App):
    name = "hotels"
    title = "Hotels"
    description = (
        "Hotel stays: search hotels by city and dates, quote rooms, book, change dates, cancel, "
        "add requests (late checkout, shuttle...), loyalty numbers and online check-in."
    )
    skills = {
        "book_stay": (
            "To book: hotels_search(city, check_in, check_out) to shortlist, "
            "hotels_check_availability(hotel_id, dates, guests) for room quotes, then "
            "hotels_book(rate_id, guest_name). Search prices are per night; quote totals cover "
            "all nights. Quotes expire after 30 minutes."
        ),
        "airport_shuttle": (
            "An airport_shuttle request must carry the arriving flight number and landing time "
            "in note, e.g. 'NW 214 landing 14:35' (from flights_list_bookings or "
            "flights_get_status); the hotel must offer the airport_shuttle amenity."
        ),
        "change_or_cancel": (
            "Only refundable rates can change dates (hotels_modify_reservation; the price "
            "difference is charged or refunded). Cancelling a non-refundable rate needs "
            "accept_no_refund=true and refunds nothing."
        ),
        "loyalty": (
            "Hotel loyalty numbers start with the chain code, e.g. 'MER-2231907' for Meridian; "
            "a number of another chain is refused."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "hotels": [],
            "rooms": [],
            "quotes": [],
            "reservations": [],
            "requests": [],
            "reviews": [],
        }

    # helpers ----------------------------------------------------------------------------
    def _dates(self, check_in: str, check_out: str) -> int:
        try:
            nights = (Date.fromisoformat(check_out) - Date.fromisoformat(check_in)).days
        except ValueError as exc:
            raise fail(f"invalid date: {exc}", "invalid_arguments") from None
        if nights < 1:
            raise fail("check_out must be after check_in", "invalid_arguments")
        if nights > MAX_NIGHTS:
            raise fail(f"stays are limited to {MAX_NIGHTS} nights", "invalid_arguments")
        if check_in < self.world.now.date().isoformat():
            raise fail(f"check_in {check_in} is in the past")
        return nights

    def _rooms(
        self, hotel_id: str, check_in: str, check_out: str, guests: int
    ) -> list[dict[str, Any]]:
        rooms = self.records("rooms")
        return [  # the hotel's rooms by the field index of a committed list (else a scan)
            rooms[at]
            for at in self._matching("rooms", {"hotel_id": hotel_id})
            if (r := rooms[at])["max_guests"] >= guests and room_free(r, check_in, check_out)
        ]

    def _reservation(self, reservation_id: str) -> dict[str, Any]:
        record = self.find("reservations", reservation_id, what="reservation")
        if record["status"] != "confirmed":
            raise fail(f"reservation {reservation_id} is {record['status']}")
        return record

    def _check_loyalty(self, hotel: dict[str, Any], number: str) -> None:
        if not number.startswith(hotel["chain"] + "-"):
            raise fail(
                f"loyalty number {number} is not a {hotel['chain_name']} ({hotel['chain']}) number"
            )

    # search -----------------------------------------------------------------------------
    @tool()
    def hotels_search(
        self,
        city: Annotated[str, Field(min_length=2)],
        check_in: IsoDate,
        check_out: IsoDate,
        guests: Annotated[int, Field(ge=1, le=8)] = 1,
        min_stars: Annotated[int | None, Field(ge=1, le=5)] = None,
        max_price: Annotated[float | None, Field(gt=0, description="Per night, USD")] = None,
        amenities: list[Amenity] | None = None,
        chain: Annotated[str | None, Field(pattern=r"^[A-Z]{3}$")] = None,
        sort_by: Literal["price", "rating", "stars"] = "price",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[HotelOffer]:
        """Hotels in a city with their lowest nightly price for the dates (None: no rooms)."""
        self._dates(check_in, check_out)
        wanted = set(amenities or [])
        offers: list[HotelOffer] = []
        for hotel in self.records("hotels"):
            if hotel["city"].lower() != city.strip().lower():
                continue
            if min_stars and hotel["stars"] < min_stars:
                continue
            if chain and hotel["chain"] != chain:
                continue
            if not wanted <= set(hotel["amenities"]):
                continue
            rooms = self._rooms(hotel["id"], check_in, check_out, guests)
            rates = [r["nightly_rate"] for r in rooms]
            price = min(rates) if rates else None
            if max_price is not None and (price is None or price > max_price):
                continue
            offers.append(
                {
                    "id": hotel["id"],
                    "name": hotel["name"],
                    "chain": hotel["chain"],
                    "city": hotel["city"],
                    "neighborhood": hotel["neighborhood"],
                    "address": hotel["address"],
                    "stars": hotel["stars"],
                    "rating": hotel["rating"],
                    "amenities": list(hotel["amenities"]),
                    "available": price is not None,
                    "from_price": price,
                }
            )
        if sort_by == "price":
            offers.sort(key=lambda o: (o["from_price"] is None, o["from_price"] or 0.0))
        else:
            offers.sort(key=lambda o: -(o["rating"] if sort_by == "rating" else o["stars"]))
        return paginate(offers, limit, offset)

    @tool()
    def hotels_get_hotel(self, hotel_id: str) -> Hotel:
        """One hotel: address, stars, rating, amenities, phone, check-in and check-out times."""
        return cast(Hotel, self.find("hotels", hotel_id, what="hotel"))

    @tool()
    def hotels_check_availability(
        self,
        hotel_id: str,
        check_in: IsoDate,
        check_out: IsoDate,
        guests: Annotated[int, Field(ge=1, le=8)] = 1,
    ) -> list[Quote]:
        """Room quotes at a hotel for dates: each has a rate_id (its id) to book with."""
        nights = self._dates(check_in, check_out)
        hotel = self.find("hotels", hotel_id, what="hotel")
        rooms = self._rooms(hotel_id, check_in, check_out, guests)
        if not rooms:
            raise fail(
                f"no availability at {hotel['name']} for {guests} guest(s) from {check_in} "
                f"to {check_out}"
            )
        expires = self.world.now + timedelta(minutes=QUOTE_TTL_MIN)
        quotes: list[Quote] = []
        for room in sorted(rooms, key=lambda r: r["nightly_rate"]):
            quote: Quote = {
                "id": self.world.new_id("rate"),
                "hotel_id": hotel_id,
                "hotel_name": hotel["name"],
                "room_id": room["id"],
                "room_type": room["room_type"],
                "max_guests": room["max_guests"],
                "check_in": check_in,
                "check_out": check_out,
                "nights": nights,
                "guests": guests,
                "nightly_rate": room["nightly_rate"],
                "total": round(room["nightly_rate"] * nights, 2),
                "refundable": room["refundable"],
                "breakfast": room["breakfast"],
                "expires_at": expires.isoformat(timespec="minutes"),
            }
            self.records("quotes").append(dict(quote))
            quotes.append(quote)
        return quotes

    @tool()
    def hotels_get_reviews(
        self,
        hotel_id: str,
        limit: Limit = 5,
        offset: Offset = 0,
    ) -> list[HotelReview]:
        """Guest reviews of a hotel, newest first."""
        self.find("hotels", hotel_id, what="hotel")
        rows = [r for r in self.records("reviews") if r["hotel_id"] == hotel_id]
        rows.sort(key=lambda r: r["date"], reverse=True)
        return cast(list[HotelReview], paginate(rows, limit, offset))

    # reservations -----------------------------------------------------------------------
    @tool("payment")
    def hotels_book(
        self,
        rate_id: str,
        guest_name: Annotated[str, Field(min_length=3, max_length=80)],
        loyalty_number: Annotated[str | None, Field(pattern=LOYALTY)] = None,
    ) -> Reservation:
        """Book a quoted room; the quote's total is charged now."""
        quote = self.find("quotes", rate_id, what="rate")
        if quote["expires_at"] < self.world.iso_now():
            raise fail(f"rate {rate_id} expired; check availability again")
        hotel = self.find("hotels", quote["hotel_id"], what="hotel")
        room = self.find("rooms", quote["room_id"], what="room")
        if not room_free(room, quote["check_in"], quote["check_out"]):
            raise fail(f"{room['room_type']} at {hotel['name']} is no longer available")
        if loyalty_number:
            self._check_loyalty(hotel, loyalty_number)
        reservation_id = self.world.new_id("res")
        reservation = reservation_record(
            reservation_id,
            confirmation_code(f"{reservation_id}|{rate_id}|hotel"),
            hotel,
            room,
            quote,
            guest_name=guest_name,
            booked_at=self.world.iso_now(),
            loyalty_number=loyalty_number,
        )
        self.records("reservations").append(dict(reservation))
        return cast(Reservation, reservation)

    @tool()
    def hotels_get_reservation(
        self, reservation_ref: Annotated[str, Field(min_length=3, description="Id or code")]
    ) -> Reservation:
        """One reservation by id or confirmation code."""
        ref = reservation_ref.strip()
        for record in self.records("reservations"):
            if record["id"] == ref or record["confirmation"] == ref.upper():
                return cast(Reservation, record)
        raise fail(f"reservation '{reservation_ref}' not found")

    @tool()
    def hotels_list_reservations(
        self,
        status: ReservationStatus | None = None,
        city: str | None = None,
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Reservation]:
        """The user's hotel reservations, soonest first; filter by status or city."""
        today = self.world.now.date().isoformat()
        rows = []
        for record in self.records("reservations"):
            state = (
                "cancelled"
                if record["status"] == "cancelled"
                else "past"
                if record["check_out"] <= today
                else "upcoming"
            )
            if status not in (None, state):
                continue
            if city and record["city"].lower() != city.strip().lower():
                continue
            rows.append(record)
        rows.sort(key=lambda r: r["check_in"])
        return cast(list[Reservation], paginate(rows, limit, offset))

    @tool("payment")
    def hotels_modify_reservation(
        self, reservation_id: str, check_in: IsoDate, check_out: IsoDate
    ) -> Reservation:
        """Change the dates of a refundable reservation; the price difference is settled."""
        record = self._reservation(reservation_id)
        if not record["refundable"]:
            raise fail(f"reservation {reservation_id} is a non-refundable rate; dates can't change")
        nights = self._dates(check_in, check_out)
        room = self.find("rooms", record["room_id"], what="room")
        own = set(stay_dates(record["check_in"], record["check_out"]))
        blocked = set(room.get("sold_out_dates", [])) - own
        if blocked.intersection(stay_dates(check_in, check_out)):
            raise fail(
                f"no availability for {record['room_type']} at {record['hotel_name']} "
                f"from {check_in} to {check_out}"
            )
        total = round(room["nightly_rate"] * nights, 2)
        record["price_difference"] = round(total - record["total"], 2)
        record.update(check_in=check_in, check_out=check_out, nights=nights, total=total)
        return cast(Reservation, record)

    @tool("write")
    def hotels_cancel_reservation(
        self, reservation_id: str, accept_no_refund: bool = False
    ) -> Reservation:
        """Cancel a reservation: refundable rates are refunded in full."""
        record = self._reservation(reservation_id)
        if not record["refundable"] and not accept_no_refund:
            raise fail(
                f"reservation {reservation_id} is non-refundable: cancelling refunds nothing; "
                "pass accept_no_refund=true to cancel anyway"
            )
        record["status"] = "cancelled"
        record["refund"] = record["total"] if record["refundable"] else 0.0
        return cast(Reservation, record)

    @tool("write")
    def hotels_add_request(
        self,
        reservation_id: str,
        request: RequestKind,
        note: Annotated[str, Field(max_length=300)] = "",
    ) -> StayRequest:
        """Send the hotel a request: late checkout, early check-in, extra bed, shuttle, etc."""
        record = self._reservation(reservation_id)
        hotel = self.find("hotels", record["hotel_id"], what="hotel")
        if request in record["requests"]:
            raise fail(f"{request} is already requested on {reservation_id}")
        flight_no: str | None = None
        landing: str | None = None
        if request == "airport_shuttle":
            if "airport_shuttle" not in hotel["amenities"]:
                raise fail(f"{hotel['name']} has no airport shuttle")
            flight = FLIGHT_NO.search(note)
            time = _TIME.search(note)
            if not flight or not time:
                raise fail(
                    "airport_shuttle needs the arriving flight number and landing time in note "
                    "(e.g. 'NW 214 landing 14:35')"
                )
            flight_no = f"{flight.group(1)} {flight.group(2)}"
            landing = time.group(0).zfill(5)
        if request == "crib" and record["room_type"] == "standard_queen":
            raise fail("a crib does not fit a standard_queen room")
        record["requests"].append(request)
        sent: StayRequest = {
            "id": self.world.new_id("req"),
            "reservation_id": reservation_id,
            "kind": request,
            "note": note,
            "flight_no": flight_no,
            "landing_time": landing,
            "status": "sent",
            "sent_at": self.world.iso_now(),
        }
        self.records("requests").append(dict(sent))
        return sent

    @tool("write")
    def hotels_add_loyalty(
        self, reservation_id: str, loyalty_number: Annotated[str, Field(pattern=LOYALTY)]
    ) -> Reservation:
        """Attach the user's loyalty number of the hotel's chain to a reservation."""
        record = self._reservation(reservation_id)
        self._check_loyalty(self.find("hotels", record["hotel_id"], what="hotel"), loyalty_number)
        record["loyalty_number"] = loyalty_number
        return cast(Reservation, record)

    @tool("write")
    def hotels_check_in_online(
        self,
        reservation_id: str,
        arrival_time: Annotated[str, Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")],
    ) -> Reservation:
        """Check in online with an arrival time (opens the day before check-in)."""
        record = self._reservation(reservation_id)
        opens = Date.fromisoformat(record["check_in"]) - timedelta(days=1)
        if self.world.now.date() < opens:
            raise fail(f"online check-in opens on {opens.isoformat()}")
        hotel = self.find("hotels", record["hotel_id"], what="hotel")
        ready = max(arrival_time, hotel["check_in_time"])
        record["online_check_in"] = {"arrival_time": arrival_time, "room_ready_at": ready}
        return cast(Reservation, record)
