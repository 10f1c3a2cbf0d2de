"""Food delivery: restaurants and menus, carts, promo codes, checkout, tracking and support."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import ISO_MINUTE, App, Limit, Offset, fail, money, paginate, tool

Cuisine = Literal[
    "italian", "japanese", "thai", "indian", "mexican", "chinese", "american", "mediterranean",
    "korean", "vegan",
]  # fmt: skip
Dietary = Literal["vegan", "vegetarian", "gluten_free", "halal", "nut_free"]
OrderStatus = Literal[
    "scheduled", "placed", "preparing", "out_for_delivery", "delivered", "cancelled"
]
CancelReason = Literal["changed_mind", "too_late", "wrong_address", "ordered_by_mistake", "other"]
Issue = Literal["missing_item", "wrong_item", "damaged", "late", "other"]
RefundDestination = Literal["original_payment", "food_credits"]

ItemId = Annotated[str, Field(min_length=1, description="Menu item id, e.g. 'mi_104'")]
RestaurantId = Annotated[str, Field(min_length=1, description="Restaurant id, e.g. 'r_101'")]
CartId = Annotated[str, Field(min_length=1, description="Cart id returned by food_create_cart")]
OrderId = Annotated[str, Field(min_length=1, description="Order id, e.g. 'fo_301'")]
Money = Annotated[float, Field(ge=0, le=10_000)]
IsoTime = Annotated[str, Field(pattern=ISO_MINUTE, description="YYYY-MM-DDTHH:MM")]

REFUND_WINDOW_HOURS = 48
CANCELLABLE = ("scheduled", "placed", "preparing")


def _dish_name(m: dict[str, Any]) -> str:
    """What `food_search_menu` looks in: the dish's name, lowered."""
    return str(m["name"].lower())


class Restaurant(TypedDict):
    id: str
    name: str
    cuisine: str
    rating: float
    delivery_fee: float
    min_order: float
    opens: str
    closes: str
    accepting_orders: bool
    open_now: bool
    eta_min: int
    price_level: int
    address: str


class MenuItem(TypedDict):
    id: str
    restaurant_id: str
    name: str
    category: str
    price: float
    available: bool
    dietary: list[str]


class CartLine(TypedDict):
    item_id: str
    name: str
    quantity: int
    unit_price: float
    notes: str


class Cart(TypedDict):
    id: str
    restaurant_id: str
    lines: list[CartLine]
    promo: str | None
    subtotal: float
    discount: float
    status: str


class Order(TypedDict):
    id: str
    restaurant_id: str
    restaurant: str
    lines: list[CartLine]
    item_ids: list[str]
    subtotal: float
    promo: str | None
    discount: float
    delivery_fee: float
    tip: float
    total: float
    address_id: str
    address: str
    payment_method_id: str
    instructions: str
    status: str
    placed_at: str
    deliver_at: str | None
    delivered_at: str | None
    cancel_reason: str | None
    rating: int | None
    review: str


class Tracking(TypedDict):
    order_id: str
    status: str
    restaurant: str
    eta: str | None
    courier: str | None


class ReorderResult(TypedDict):
    cart: Cart
    skipped: list[str]


class SupportCase(TypedDict):
    id: str
    order_id: str
    issue: str
    item_ids: list[str]
    details: str
    refund_amount: float
    status: str
    destination: str | None
    opened_at: str


class Address(TypedDict):
    id: str
    label: str
    address: str


class PaymentMethod(TypedDict):
    id: str
    label: str
    brand: str
    last4: str
    status: str
    available: float


class Favorite(TypedDict):
    restaurant_id: str
    name: str
    favorite: bool


def _parse(moment: str) -> datetime:
    return datetime.fromisoformat(moment)


class FoodApp(App):
    name = "food"
    title = "Food Delivery"
    description = (
        "Order food for delivery: find restaurants, browse menus, fill a cart, apply promo codes, "
        "check out, track and cancel orders, rate them and get refunds for problems."
    )
    skills = {
        "order_food": (
            "Ordering is cart-based: food_create_cart(restaurant_id) -> food_add_to_cart(cart_id, "
            "item_id, quantity) for each dish (item ids come from food_get_menu or "
            "food_search_menu; a cart holds dishes of one restaurant only) -> optional "
            "food_apply_promo(cart_id, code) -> food_checkout(cart_id, address_id, "
            "payment_method_id, tip). A closed restaurant only takes food_schedule_order. "
            "Checkout fails below the restaurant's min_order (food subtotal before discount)."
        ),
        "tip_convention": (
            "food_checkout takes the tip in dollars. When the user asks for a percentage tip, "
            "compute it on the food subtotal AFTER the promo discount (subtotal - discount; never "
            "on the delivery fee) and round to the nearest cent. So apply any promo code first, "
            "read subtotal and discount from the cart, then check out with the computed tip."
        ),
        "refund_problem": (
            "A refund for a delivered order takes two steps. 1) food_report_issue(order_id, issue, "
            "item_ids) opens a support case: use issue 'missing_item' for a dish that never came, "
            "'wrong_item' for a different dish, 'damaged' for spilled food (item_ids from "
            "food_get_order / food_list_orders), 'late' for late delivery (no items). Cases can "
            "only be opened within 48 hours of delivery. 2) food_request_refund(case_id, "
            "destination) pays the case out: 'original_payment' back to the card, 'food_credits' "
            "to the in-app balance. A case alone refunds nothing."
        ),
        "reorder": (
            "'Order the same again' means food_reorder(order_id), which builds a new cart from a "
            "past order and drops dishes that are no longer available (listed in 'skipped'); it "
            "does not pay: finish with food_checkout on the returned cart id."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "restaurants": [],
            "menu": [],
            "carts": [],
            "orders": [],
            "promos": [],
            "cases": [],
            "addresses": [],
            "payment_methods": [],
            "favorites": [],
            "account": {"credits": 0.0},
        }

    # ------------------------------------------------------------------ helpers
    def _is_open(self, restaurant: dict[str, Any], at: datetime | None = None) -> bool:
        moment = (at or self.world.now).strftime("%H:%M")
        return (
            bool(restaurant["accepting_orders"])
            and restaurant["opens"] <= moment < restaurant["closes"]
        )

    def _restaurant(self, restaurant: dict[str, Any]) -> Restaurant:
        return cast(Restaurant, {**restaurant, "open_now": self._is_open(restaurant)})

    def _cart_view(self, cart: dict[str, Any]) -> Cart:
        subtotal = money(sum(line["quantity"] * line["unit_price"] for line in cart["lines"]))
        discount = 0.0
        if cart.get("promo"):
            promo = self._promo(cart["promo"])
            if promo is not None:
                discount = money(subtotal * promo["percent_off"] / 100)
        cart["subtotal"], cart["discount"] = subtotal, discount
        return cast(Cart, cart)

    def _promo(self, code: str) -> dict[str, Any] | None:
        return self.first("promos", code=code.upper())

    def _open_cart(self, cart_id: str) -> dict[str, Any]:
        cart = self.find("carts", cart_id, what="cart")
        if cart["status"] != "open":
            raise fail(f"cart '{cart_id}' was already checked out; start a new cart")
        return cart

    def _charge(self, payment_method_id: str, amount: float) -> dict[str, Any]:
        card = self.find("payment_methods", payment_method_id, what="payment method")
        if card["status"] != "active":
            raise fail(f"card declined: {card['label']} is {card['status']}")
        if amount > card["available"] + 1e-9:
            raise fail(
                f"card declined: {card['label']} has ${card['available']:.2f} available, "
                f"the order is ${amount:.2f}"
            )
        card["available"] = money(card["available"] - amount)
        return card

    def _place(
        self,
        cart_id: str,
        address_id: str,
        payment_method_id: str,
        tip: float,
        instructions: str,
        deliver_at: str | None,
    ) -> Order:
        cart = self._open_cart(cart_id)
        if not cart["lines"]:
            raise fail("the cart is empty")
        restaurant = self.find("restaurants", cart["restaurant_id"], what="restaurant")
        for line in cart["lines"]:
            item = self.find("menu", line["item_id"], what="menu item")
            if not item["available"]:
                raise fail(f"'{item['name']}' is no longer available; remove it from the cart")
        view = self._cart_view(cart)
        if view["subtotal"] < restaurant["min_order"]:
            raise fail(
                f"minimum order at {restaurant['name']} is ${restaurant['min_order']:.2f}; "
                f"the cart subtotal is ${view['subtotal']:.2f}"
            )
        promo = self._promo(cart["promo"]) if cart.get("promo") else None
        if promo is not None and view["subtotal"] < promo["min_subtotal"]:
            raise fail(f"promo {promo['code']} needs a subtotal of ${promo['min_subtotal']:.2f}")
        address = self.find("addresses", address_id, what="address")
        total = money(view["subtotal"] - view["discount"] + restaurant["delivery_fee"] + tip)
        self._charge(payment_method_id, total)
        if promo is not None:
            promo["used"] = True
        order = {
            "id": self.world.new_id("fo"),
            "restaurant_id": restaurant["id"],
            "restaurant": restaurant["name"],
            "lines": [dict(line) for line in cart["lines"]],
            "item_ids": [line["item_id"] for line in cart["lines"]],
            "subtotal": view["subtotal"],
            "promo": cart.get("promo"),
            "discount": view["discount"],
            "delivery_fee": restaurant["delivery_fee"],
            "tip": money(tip),
            "total": total,
            "address_id": address_id,
            "address": address["address"],
            "payment_method_id": payment_method_id,
            "instructions": instructions,
            "status": "scheduled" if deliver_at else "placed",
            "placed_at": self.world.iso_now(),
            "deliver_at": deliver_at,
            "delivered_at": None,
            "cancel_reason": None,
            "rating": None,
            "review": "",
        }
        self.records("orders").append(order)
        cart["status"] = "checked_out"
        return cast(Order, order)

    # ------------------------------------------------------------------ discovery
    @tool()
    def food_search_restaurants(
        self,
        query: Annotated[str, Field(max_length=80, description="Part of the name")] = "",
        cuisine: Cuisine | None = None,
        min_rating: Annotated[float, Field(ge=0, le=5)] | None = None,
        max_delivery_fee: Money | None = None,
        open_now: bool = False,
        sort: Literal["relevance", "rating", "delivery_fee", "eta", "name"] = "relevance",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Restaurant]:
        """Search restaurants by name, cuisine, minimum rating, delivery fee and opening status."""
        q = query.lower()
        rows = [
            r
            for r in self.records("restaurants")
            if q in r["name"].lower()
            and (cuisine is None or r["cuisine"] == cuisine)
            and (min_rating is None or r["rating"] >= min_rating)
            and (max_delivery_fee is None or r["delivery_fee"] <= max_delivery_fee)
            and (not open_now or self._is_open(r))
        ]
        if sort == "rating":
            rows.sort(key=lambda r: -r["rating"])
        elif sort == "delivery_fee":
            rows.sort(key=lambda r: r["delivery_fee"])
        elif sort == "eta":
            rows.sort(key=lambda r: r["eta_min"])
        elif sort == "name":
            rows.sort(key=lambda r: r["name"])
        return [self._restaurant(r) for r in paginate(rows, limit, offset)]

    @tool()
    def food_get_restaurant(self, restaurant_id: RestaurantId) -> Restaurant:
        """Get one restaurant: hours, rating, delivery fee, minimum order, open now or not."""
        return self._restaurant(self.find("restaurants", restaurant_id, what="restaurant"))

    @tool()
    def food_get_menu(
        self,
        restaurant_id: RestaurantId,
        category: Annotated[
            str | None, Field(description="e.g. 'main', 'starter', 'dessert'")
        ] = None,
        dietary: Dietary | None = None,
        max_price: Money | None = None,
        available_only: bool = False,
        limit: Limit = 50,
        offset: Offset = 0,
    ) -> list[MenuItem]:
        """A restaurant's menu, filtered by category, dietary tag, maximum price or availability."""
        self.find("restaurants", restaurant_id, what="restaurant")
        rows = [
            m
            for m in self.records("menu")
            if m["restaurant_id"] == restaurant_id
            and (category is None or m["category"] == category)
            and (dietary is None or dietary in m["dietary"])
            and (max_price is None or m["price"] <= max_price)
            and (not available_only or m["available"])
        ]
        return cast(list[MenuItem], paginate(rows, limit, offset))

    @tool()
    def food_search_menu(
        self,
        query: Annotated[
            str, Field(min_length=1, max_length=80, description="Part of a dish name")
        ],
        restaurant_id: str | None = None,
        dietary: Dietary | None = None,
        max_price: Money | None = None,
        sort: Literal["relevance", "price_asc", "price_desc"] = "relevance",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[MenuItem]:
        """Search dishes by name across all restaurants (or one restaurant)."""
        q = query.lower()
        menu = self.records("menu")
        # Committed: only the dishes the word index names for the query's words can hold it.
        found = self.text_candidates("menu", "food.menu", _dish_name, q.split())
        rows = [
            m
            for m in (menu if found is None else map(menu.__getitem__, found))
            if q in m["name"].lower()
            and (restaurant_id is None or m["restaurant_id"] == restaurant_id)
            and (dietary is None or dietary in m["dietary"])
            and (max_price is None or m["price"] <= max_price)
        ]
        if sort != "relevance":
            rows.sort(key=lambda m: m["price"], reverse=sort == "price_desc")
        return cast(list[MenuItem], paginate(rows, limit, offset))

    # ------------------------------------------------------------------ cart
    @tool("write")
    def food_create_cart(self, restaurant_id: RestaurantId) -> Cart:
        """Start a cart at a restaurant (returns the open cart if there already is one)."""
        restaurant = self.find("restaurants", restaurant_id, what="restaurant")
        for cart in self.records("carts"):
            if cart["restaurant_id"] == restaurant["id"] and cart["status"] == "open":
                return self._cart_view(cart)
        cart = {
            "id": self.world.new_id("fcart"),
            "restaurant_id": restaurant["id"],
            "lines": [],
            "promo": None,
            "subtotal": 0.0,
            "discount": 0.0,
            "status": "open",
        }
        self.records("carts").append(cart)
        return self._cart_view(cart)

    @tool("write")
    def food_add_to_cart(
        self,
        cart_id: CartId,
        item_id: ItemId,
        quantity: Annotated[int, Field(ge=1, le=20)] = 1,
        notes: Annotated[str, Field(max_length=200, description="e.g. 'no onions'")] = "",
    ) -> Cart:
        """Add a dish to a cart; adding the same dish again increases its quantity."""
        cart = self._open_cart(cart_id)
        item = self.find("menu", item_id, what="menu item")
        if item["restaurant_id"] != cart["restaurant_id"]:
            raise fail(
                f"'{item['name']}' is from another restaurant; a cart holds one restaurant's dishes"
            )
        if not item["available"]:
            raise fail(f"'{item['name']}' is unavailable right now")
        for line in cart["lines"]:
            if line["item_id"] == item_id:
                if line["quantity"] + quantity > 20:
                    raise fail("at most 20 of one dish per order")
                line["quantity"] += quantity
                break
        else:
            cart["lines"].append(
                {
                    "item_id": item_id,
                    "name": item["name"],
                    "quantity": quantity,
                    "unit_price": item["price"],
                    "notes": notes,
                }
            )
        return self._cart_view(cart)

    @tool("write")
    def food_update_cart_item(
        self,
        cart_id: CartId,
        item_id: ItemId,
        quantity: Annotated[int, Field(ge=0, le=20, description="0 removes the dish")],
    ) -> Cart:
        """Change the quantity of a dish in the cart; quantity 0 removes it."""
        cart = self._open_cart(cart_id)
        line = next((ln for ln in cart["lines"] if ln["item_id"] == item_id), None)
        if line is None:
            raise fail(f"item '{item_id}' is not in cart '{cart_id}'")
        if quantity == 0:
            cart["lines"].remove(line)
        else:
            line["quantity"] = quantity
        return self._cart_view(cart)

    @tool()
    def food_get_cart(self, cart_id: CartId) -> Cart:
        """Get a cart with its lines, subtotal and promo discount."""
        return self._cart_view(self.find("carts", cart_id, what="cart"))

    @tool("write")
    def food_apply_promo(
        self, cart_id: CartId, code: Annotated[str, Field(min_length=3, max_length=20)]
    ) -> Cart:
        """Apply a promo code to a cart (one code per cart; it replaces an earlier one)."""
        cart = self._open_cart(cart_id)
        promo = self._promo(code)
        if promo is None:
            raise fail(f"promo code '{code}' is not valid")
        if promo["expires"] < self.world.iso_now()[:10]:
            raise fail(f"promo code '{promo['code']}' expired on {promo['expires']}")
        if promo["used"]:
            raise fail(f"promo code '{promo['code']}' has already been used")
        if promo.get("restaurant_id") and promo["restaurant_id"] != cart["restaurant_id"]:
            raise fail(f"promo code '{promo['code']}' is not valid at this restaurant")
        subtotal = self._cart_view(cart)["subtotal"]
        if subtotal < promo["min_subtotal"]:
            raise fail(
                f"promo code '{promo['code']}' needs a subtotal of ${promo['min_subtotal']:.2f}; "
                f"the cart is ${subtotal:.2f}"
            )
        cart["promo"] = promo["code"]
        return self._cart_view(cart)

    # ------------------------------------------------------------------ paying
    @tool("payment")
    def food_checkout(
        self,
        cart_id: CartId,
        address_id: Annotated[str, Field(min_length=1, description="From food_list_addresses")],
        payment_method_id: Annotated[
            str, Field(min_length=1, description="From food_list_payment_methods")
        ],
        tip: Annotated[float, Field(ge=0, le=500, description="Tip in dollars")] = 0.0,
        instructions: Annotated[
            str, Field(max_length=300, description="Note for the courier")
        ] = "",
    ) -> Order:
        """Place the order for delivery now and charge the card (food - promo + fee + tip)."""
        cart = self.find("carts", cart_id, what="cart")
        restaurant = self.find("restaurants", cart["restaurant_id"], what="restaurant")
        if not self._is_open(restaurant):
            raise fail(
                f"{restaurant['name']} is closed now (hours {restaurant['opens']}-"
                f"{restaurant['closes']}); use food_schedule_order for a later delivery"
            )
        return self._place(cart_id, address_id, payment_method_id, tip, instructions, None)

    @tool("payment")
    def food_schedule_order(
        self,
        cart_id: CartId,
        deliver_at: IsoTime,
        address_id: Annotated[str, Field(min_length=1)],
        payment_method_id: Annotated[str, Field(min_length=1)],
        tip: Annotated[float, Field(ge=0, le=500)] = 0.0,
    ) -> Order:
        """Order now for delivery at a later time (within the restaurant's hours, up to 7 days)."""
        cart = self.find("carts", cart_id, what="cart")
        restaurant = self.find("restaurants", cart["restaurant_id"], what="restaurant")
        when = _parse(deliver_at)
        if when < self.world.now + timedelta(minutes=30):
            raise fail(f"deliver_at must be at least 30 minutes from now ({self.world.iso_now()})")
        if when > self.world.now + timedelta(days=7):
            raise fail("orders can be scheduled at most 7 days ahead")
        if not restaurant["opens"] <= when.strftime("%H:%M") < restaurant["closes"]:
            raise fail(
                f"{restaurant['name']} delivers between {restaurant['opens']} and "
                f"{restaurant['closes']}"
            )
        return self._place(cart_id, address_id, payment_method_id, tip, "", deliver_at)

    # ------------------------------------------------------------------ orders
    @tool()
    def food_list_orders(
        self,
        status: OrderStatus | None = None,
        restaurant_id: str | None = None,
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Order]:
        """List orders, newest first, optionally by status or restaurant."""
        rows = self.select("orders", status=status, restaurant_id=restaurant_id)
        rows.sort(key=lambda o: o["placed_at"], reverse=True)
        return cast(list[Order], paginate(rows, limit, offset))

    @tool()
    def food_get_order(self, order_id: OrderId) -> Order:
        """Get one order with its dishes, amounts, address and status."""
        return cast(Order, self.find("orders", order_id, what="order"))

    @tool()
    def food_track_order(self, order_id: OrderId) -> Tracking:
        """Where an order is: status, estimated arrival and courier."""
        order = self.find("orders", order_id, what="order")
        eta = None
        if order["status"] in ("placed", "preparing", "out_for_delivery"):
            restaurant = self.find("restaurants", order["restaurant_id"], what="restaurant")
            eta_time = _parse(order["placed_at"]) + timedelta(minutes=restaurant["eta_min"])
            eta = eta_time.isoformat(timespec="minutes")
        elif order["status"] == "scheduled":
            eta = order["deliver_at"]
        courier = order.get("courier") if order["status"] == "out_for_delivery" else None
        return {
            "order_id": order["id"],
            "status": order["status"],
            "restaurant": order["restaurant"],
            "eta": eta,
            "courier": courier,
        }

    @tool("write")
    def food_cancel_order(self, order_id: OrderId, reason: CancelReason) -> Order:
        """Cancel an order that is not out for delivery yet; the charge goes back to the card."""
        order = self.find("orders", order_id, what="order")
        if order["status"] not in CANCELLABLE:
            raise fail(f"order '{order_id}' is {order['status']} and can no longer be cancelled")
        card = self.find("payment_methods", order["payment_method_id"], what="payment method")
        card["available"] = money(card["available"] + order["total"])
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        return cast(Order, order)

    @tool("write")
    def food_rate_order(
        self,
        order_id: OrderId,
        rating: Annotated[int, Field(ge=1, le=5)],
        comment: Annotated[str, Field(max_length=500)] = "",
    ) -> Order:
        """Rate a delivered order 1-5 stars with an optional comment (once per order)."""
        order = self.find("orders", order_id, what="order")
        if order["status"] != "delivered":
            raise fail(f"only delivered orders can be rated; '{order_id}' is {order['status']}")
        if order.get("rating") is not None:
            raise fail(f"order '{order_id}' was already rated {order['rating']} stars")
        order["rating"] = rating
        order["review"] = comment
        return cast(Order, order)

    @tool("write")
    def food_reorder(self, order_id: OrderId) -> ReorderResult:
        """Build a new cart from a past order; dishes no longer available are skipped."""
        order = self.find("orders", order_id, what="order")
        lines: list[dict[str, Any]] = []
        skipped = []
        for line in order["lines"]:
            item = self.first("menu", id=line["item_id"])
            if item is None or not item["available"]:
                skipped.append(line["name"])
                continue
            lines.append({**line, "unit_price": item["price"]})
        if not lines:
            raise fail("none of the dishes of that order is available any more")
        for old in self.records("carts"):
            if old["restaurant_id"] == order["restaurant_id"] and old["status"] == "open":
                old["status"] = "replaced"
        raw = {
            "id": self.world.new_id("fcart"),
            "restaurant_id": order["restaurant_id"],
            "lines": lines,
            "promo": None,
            "subtotal": 0.0,
            "discount": 0.0,
            "status": "open",
        }
        self.records("carts").append(raw)
        return {"cart": self._cart_view(raw), "skipped": skipped}

    # ------------------------------------------------------------------ support
    @tool("write")
    def food_report_issue(
        self,
        order_id: OrderId,
        issue: Issue,
        item_ids: Annotated[list[str], Field(max_length=20)] | None = None,
        details: Annotated[str, Field(max_length=500)] = "",
    ) -> SupportCase:
        """Open a support case about a delivered order (within 48 hours of delivery)."""
        order = self.find("orders", order_id, what="order")
        if order["status"] != "delivered" or not order.get("delivered_at"):
            raise fail(
                f"order '{order_id}' is {order['status']}; only delivered orders have issues"
            )
        if self.world.now - _parse(order["delivered_at"]) > timedelta(hours=REFUND_WINDOW_HOURS):
            raise fail(
                f"order '{order_id}' was delivered {order['delivered_at']}; issues must be "
                f"reported within {REFUND_WINDOW_HOURS} hours"
            )
        if any(c["order_id"] == order_id and c["issue"] == issue for c in self.records("cases")):
            raise fail(f"a '{issue}' case for order '{order_id}' is already open")
        item_ids = item_ids or []
        lines = {line["item_id"]: line for line in order["lines"]}
        if issue in ("missing_item", "wrong_item", "damaged"):
            if not item_ids:
                raise fail(f"issue '{issue}' needs the affected item_ids", "invalid_arguments")
            unknown = [i for i in item_ids if i not in lines]
            if unknown:
                raise fail(
                    f"item_ids not in order '{order_id}': {', '.join(unknown)}", "invalid_arguments"
                )
            amount = money(sum(lines[i]["quantity"] * lines[i]["unit_price"] for i in item_ids))
        elif issue == "late":
            amount = order["delivery_fee"]
        else:
            amount = 0.0
        case = {
            "id": self.world.new_id("case"),
            "order_id": order_id,
            "issue": issue,
            "item_ids": list(item_ids),
            "details": details,
            "refund_amount": amount,
            "status": "open",
            "destination": None,
            "opened_at": self.world.iso_now(),
        }
        self.records("cases").append(case)
        return cast(SupportCase, case)

    @tool("write")
    def food_request_refund(
        self,
        case_id: Annotated[str, Field(min_length=1, description="From food_report_issue")],
        destination: RefundDestination = "original_payment",
    ) -> SupportCase:
        """Pay out the refund of an open support case to the card or to in-app food credits."""
        case = self.find("cases", case_id, what="support case")
        if case["status"] != "open":
            raise fail(f"case '{case_id}' is {case['status']}")
        if case["refund_amount"] <= 0:
            raise fail(f"case '{case_id}' ({case['issue']}) is not eligible for a refund")
        order = self.find("orders", case["order_id"], what="order")
        if destination == "original_payment":
            card = self.find("payment_methods", order["payment_method_id"], what="payment method")
            card["available"] = money(card["available"] + case["refund_amount"])
        else:
            account = self.state.setdefault("account", {"credits": 0.0})
            account["credits"] = money(account.get("credits", 0.0) + case["refund_amount"])
        case["status"] = "refunded"
        case["destination"] = destination
        return cast(SupportCase, case)

    # ------------------------------------------------------------------ account
    @tool()
    def food_list_addresses(self) -> list[Address]:
        """The saved delivery addresses (home, work, ...)."""
        return cast(list[Address], self.records("addresses"))

    @tool("write")
    def food_add_address(
        self,
        label: Annotated[str, Field(min_length=1, max_length=40)],
        address: Annotated[str, Field(min_length=5, max_length=200)],
    ) -> Address:
        """Save a new delivery address under a label."""
        if any(a["label"].lower() == label.lower() for a in self.records("addresses")):
            raise fail(f"an address labelled '{label}' already exists")
        record = {"id": self.world.new_id("addr"), "label": label, "address": address}
        self.records("addresses").append(record)
        return cast(Address, record)

    @tool()
    def food_list_payment_methods(self) -> list[PaymentMethod]:
        """The saved cards with their status and available credit."""
        return cast(list[PaymentMethod], self.records("payment_methods"))

    @tool("write")
    def food_set_favorite(self, restaurant_id: RestaurantId, favorite: bool = True) -> Favorite:
        """Mark or unmark a restaurant as a favorite."""
        restaurant = self.find("restaurants", restaurant_id, what="restaurant")
        favorites: list[str] = self.state.setdefault("favorites", [])
        if favorite and restaurant_id not in favorites:
            favorites.append(restaurant_id)
        if not favorite and restaurant_id in favorites:
            favorites.remove(restaurant_id)
        return {"restaurant_id": restaurant_id, "name": restaurant["name"], "favorite": favorite}

    @tool()
    def food_list_favorites(self) -> list[Restaurant]:
        """The user's favorite restaurants."""
        favorites = self.state.get("favorites", [])
        return [self._restaurant(r) for r in self.records("restaurants") if r["id"] in favorites]
