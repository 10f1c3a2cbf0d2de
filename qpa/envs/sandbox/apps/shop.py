"""Shopping: product search, cart and coupons, checkout, orders, returns, exchanges, wishlist."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import App, Limit, Offset, fail, money, paginate, tool


def _product_text(p: dict[str, Any]) -> str:
    """What `shop_search` matches its words in: title and brand, lowered."""
    return f"{p['title']} {p['brand']}".lower()


def _placed_at(o: dict[str, Any]) -> Any:
    return o["placed_at"]


Category = Literal["shoes", "apparel", "electronics", "home", "toys", "books", "beauty", "sports"]
OrderStatus = Literal["processing", "shipped", "delivered", "cancelled"]
Shipping = Literal["standard", "express", "next_day"]
ReturnReason = Literal["damaged", "defective", "wrong_item", "wrong_size", "no_longer_needed"]
ReturnStatus = Literal["requested", "label_created", "exchange_requested", "refunded"]
Carrier = Literal["ups", "fedex", "usps", "dhl"]
CancelReason = Literal["changed_mind", "found_cheaper", "ordered_by_mistake", "too_slow", "other"]

ProductId = Annotated[str, Field(min_length=1, description="Product id, e.g. 'p_104'")]
OrderId = Annotated[str, Field(min_length=1, description="Order id, e.g. 'so_201'")]
Money = Annotated[float, Field(ge=0, le=100_000)]

RETURN_WINDOW_DAYS = 30
SHIPPING_FEES: dict[str, float] = {"standard": 4.99, "express": 9.99, "next_day": 19.99}
FREE_STANDARD_FROM = 35.0
NO_SIZE = "one_size"


class Product(TypedDict):
    id: str
    title: str
    brand: str
    category: str
    price: float
    rating: float
    reviews: int
    seller: str
    sizes: list[str]
    stock: dict[str, int]


class Stock(TypedDict):
    product_id: str
    size: str
    quantity: int
    in_stock: bool


class CartLine(TypedDict):
    id: str
    product_id: str
    title: str
    category: str
    size: str
    quantity: int
    unit_price: float


class Cart(TypedDict):
    id: str
    lines: list[CartLine]
    product_ids: list[str]
    units: int
    coupon: str | None
    subtotal: float
    discount: float
    status: str


class OrderLine(TypedDict):
    product_id: str
    title: str
    size: str
    quantity: int
    unit_price: float


class Order(TypedDict):
    id: str
    lines: list[OrderLine]
    product_ids: list[str]
    subtotal: float
    coupon: str | None
    discount: float
    shipping: str
    shipping_fee: float
    total: float
    payment_method_id: str
    address_id: str
    status: str
    placed_at: str
    eta: str | None
    delivered_at: str | None
    carrier: str | None
    tracking: str | None
    cancel_reason: str | None


class Shipment(TypedDict):
    order_id: str
    status: str
    carrier: str | None
    tracking: str | None
    eta: str | None
    delivered_at: str | None


class Return(TypedDict):
    id: str
    order_id: str
    product_id: str
    size: str
    quantity: int
    reason_code: str
    status: str
    refund_amount: float
    carrier: str | None
    label: str | None
    exchange_size: str | None
    created_at: str


class WishlistEntry(TypedDict):
    id: str
    product_id: str
    title: str
    price: float
    added_at: str


class PriceAlert(TypedDict):
    id: str
    product_id: str
    target_price: float
    current_price: float


class Review(TypedDict):
    id: str
    product_id: str
    rating: int
    text: str
    time: str


class PaymentMethod(TypedDict):
    id: str
    label: str
    brand: str
    last4: str
    status: str
    available: float


class Address(TypedDict):
    id: str
    label: str
    address: str


class Removed(TypedDict):
    removed: str


def shipping_fee(shipping: str, merchandise: float) -> float:
    """Standard shipping is free from $35 of merchandise (after discount)."""
    if shipping == "standard" and merchandise >= FREE_STANDARD_FROM:
        return 0.0
    return SHIPPING_FEES[shipping]


class ShopApp(App):
    name = "shop"
    title = "Shop"
    description = (
        "Online store: search products, manage the cart and coupons, check out, track and cancel "
        "orders, return or exchange items, keep a wishlist and price alerts, write reviews."
    )
    skills = {
        "buy": (
            "shop_add_to_cart(product_id, quantity, size) creates the cart on first use and "
            "returns it with its id; sized products (shoes, apparel) need one of the product's "
            "sizes. Then shop_checkout(cart_id, payment_method_id, address_id, shipping). "
            "Standard shipping is free from $35 after discounts; express and next_day always "
            "cost extra."
        ),
        "returns": (
            "A refund needs an order lookup first (shop_list_orders / shop_get_order: the item "
            "must be delivered less than 30 days ago), then shop_request_return(order_id, "
            "product_id, reason_code) with the reason code that fits: 'damaged' arrived "
            "physically broken, 'defective' does not work, 'wrong_item' not what was ordered, "
            "'wrong_size' does not fit, 'no_longer_needed' otherwise. Then "
            "shop_create_return_label(return_id, carrier) for the return id you got; the refund "
            "is issued when the parcel arrives."
        ),
        "exchange": (
            "To swap an item for another size, do NOT create a return label: call "
            "shop_request_return with reason_code 'wrong_size', then shop_request_exchange("
            "return_id, new_size). The exchange reserves the new size and emails a prepaid label "
            "itself; a return with any other reason cannot be exchanged."
        ),
        "coupons": (
            "Coupons go on the cart before checkout with shop_apply_coupon(cart_id, code); one "
            "coupon per cart. A category coupon discounts only the lines of that category."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "products": [],
            "carts": [],
            "orders": [],
            "returns": [],
            "coupons": [],
            "wishlist": [],
            "price_alerts": [],
            "reviews": [],
            "payment_methods": [],
            "addresses": [],
        }

    # ------------------------------------------------------------------ helpers
    def _product(self, product_id: str) -> dict[str, Any]:
        return self.find("products", product_id, what="product")

    def _size(self, product: dict[str, Any], size: str | None, field: str = "size") -> str:
        if not product["sizes"]:
            if size not in (None, NO_SIZE):
                raise fail(f"'{product['title']}' comes in one size only", "invalid_arguments")
            return NO_SIZE
        if size is None:
            raise fail(
                f"argument '{field}' is required for '{product['title']}': one of "
                f"{', '.join(product['sizes'])}",
                "invalid_arguments",
            )
        if size not in product["sizes"]:
            raise fail(
                f"argument '{field}': '{size}' is not offered for '{product['title']}' (sizes: "
                f"{', '.join(product['sizes'])})",
                "invalid_arguments",
            )
        return size

    def _coupon(self, code: str | None) -> dict[str, Any] | None:
        if not code:
            return None
        return self.first("coupons", code=code.upper())

    def _discount(self, lines: list[dict[str, Any]], coupon: dict[str, Any] | None) -> float:
        if coupon is None:
            return 0.0
        eligible = money(
            sum(
                ln["quantity"] * ln["unit_price"]
                for ln in lines
                if not coupon.get("category") or ln["category"] == coupon["category"]
            )
        )
        if coupon.get("percent_off"):
            return money(eligible * coupon["percent_off"] / 100)
        return money(min(eligible, coupon.get("amount_off", 0.0)))

    def _cart_view(self, cart: dict[str, Any]) -> Cart:
        cart["product_ids"] = [ln["product_id"] for ln in cart["lines"]]
        cart["units"] = sum(ln["quantity"] for ln in cart["lines"])
        cart["subtotal"] = money(sum(ln["quantity"] * ln["unit_price"] for ln in cart["lines"]))
        cart["discount"] = self._discount(cart["lines"], self._coupon(cart.get("coupon")))
        return cast(Cart, cart)

    def _active_cart(self, create: bool) -> dict[str, Any] | None:
        cart = self.first("carts", status="open")
        if cart is None and create:
            cart = {
                "id": self.world.new_id("cart"),
                "lines": [],
                "product_ids": [],
                "units": 0,
                "coupon": None,
                "subtotal": 0.0,
                "discount": 0.0,
                "status": "open",
            }
            self.records("carts").append(cart)
        return cart

    def _open_cart(self, cart_id: str) -> dict[str, Any]:
        cart = self.find("carts", cart_id, what="cart")
        if cart["status"] != "open":
            raise fail(f"cart '{cart_id}' was already checked out")
        return cart

    def _line(self, line_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        cart = self._active_cart(create=False)
        if cart is not None:
            for line in cart["lines"]:
                if line["id"] == line_id:
                    return cart, line
        raise fail(f"cart line '{line_id}' not found (see shop_view_cart)")

    # ------------------------------------------------------------------ catalog
    @tool()
    def shop_search(
        self,
        query: Annotated[str, Field(max_length=80, description="Words of the title or brand")] = "",
        category: Category | None = None,
        brand: str | None = None,
        min_price: Money | None = None,
        max_price: Money | None = None,
        min_rating: Annotated[float, Field(ge=0, le=5)] | None = None,
        size: str | None = None,
        in_stock_only: bool = False,
        sort: Literal["relevance", "price_asc", "price_desc", "rating", "reviews"] = "relevance",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Product]:
        """Search the catalog with filters (price range, rating, brand, size, stock) and sorting."""
        words = query.lower().split()
        rows = []
        products = self.records("products")
        # Committed: only the products the word index names for the words (or, with no words,
        # those of the category, by its index) are tested; else a scan.
        found = self.text_candidates("products", "shop.search", _product_text, words)
        if found is None and category is not None and not words:
            found = self._matching("products", {"category": category})
        for p in products if found is None else map(products.__getitem__, found):
            text = _product_text(p)
            stock = p["stock"]
            if size is not None:
                if size not in p["sizes"]:
                    continue
                in_stock = stock.get(size, 0) > 0
            else:
                in_stock = any(q > 0 for q in stock.values())
            if (
                all(w in text for w in words)
                and (category is None or p["category"] == category)
                and (brand is None or p["brand"].lower() == brand.lower())
                and (min_price is None or p["price"] >= min_price)
                and (max_price is None or p["price"] <= max_price)
                and (min_rating is None or p["rating"] >= min_rating)
                and (not in_stock_only or in_stock)
            ):
                rows.append(p)
                if sort == "relevance" and len(rows) >= offset + limit:
                    break  # catalog order: the page is complete
        if sort == "price_asc":
            rows.sort(key=lambda p: p["price"])
        elif sort == "price_desc":
            rows.sort(key=lambda p: -p["price"])
        elif sort == "rating":
            rows.sort(key=lambda p: -p["rating"])
        elif sort == "reviews":
            rows.sort(key=lambda p: -p["reviews"])
        return cast(list[Product], paginate(rows, limit, offset))

    @tool()
    def shop_get_product(self, product_id: ProductId) -> Product:
        """Get one product with its sizes, stock per size, rating and seller."""
        return cast(Product, self._product(product_id))

    @tool()
    def shop_check_stock(self, product_id: ProductId, size: str | None = None) -> Stock:
        """How many units of a product (in a size) are in stock."""
        product = self._product(product_id)
        chosen = self._size(product, size)
        quantity = product["stock"].get(chosen, 0)
        return {
            "product_id": product_id,
            "size": chosen,
            "quantity": quantity,
            "in_stock": quantity > 0,
        }

    # ------------------------------------------------------------------ cart
    @tool("write")
    def shop_add_to_cart(
        self,
        product_id: ProductId,
        quantity: Annotated[int, Field(ge=1, le=10)] = 1,
        size: Annotated[str | None, Field(description="Required for sized products")] = None,
    ) -> Cart:
        """Add a product to the cart (created on first use); returns the cart with its id."""
        product = self._product(product_id)
        chosen = self._size(product, size)
        available = product["stock"].get(chosen, 0)
        cart = self._active_cart(create=False)
        already = 0
        existing = None
        if cart is not None:
            for line in cart["lines"]:
                if line["product_id"] == product_id and line["size"] == chosen:
                    existing, already = line, line["quantity"]
        if already + quantity > available:
            where = "" if chosen == NO_SIZE else f" in size {chosen}"
            if available == 0:
                raise fail(f"'{product['title']}' is out of stock{where}")
            raise fail(f"only {available} of '{product['title']}' left{where}")
        cart = self._active_cart(create=True)
        assert cart is not None
        if existing is not None:
            existing["quantity"] += quantity
        else:
            cart["lines"].append(
                {
                    "id": self.world.new_id("line"),
                    "product_id": product_id,
                    "title": product["title"],
                    "category": product["category"],
                    "size": chosen,
                    "quantity": quantity,
                    "unit_price": product["price"],
                }
            )
        return self._cart_view(cart)

    @tool("write")
    def shop_update_cart_item(
        self,
        line_id: Annotated[str, Field(min_length=1)],
        quantity: Annotated[int, Field(ge=1, le=10)],
    ) -> Cart:
        """Change the quantity of a cart line."""
        cart, line = self._line(line_id)
        product = self._product(line["product_id"])
        if quantity > product["stock"].get(line["size"], 0):
            raise fail(f"only {product['stock'].get(line['size'], 0)} of '{product['title']}' left")
        line["quantity"] = quantity
        return self._cart_view(cart)

    @tool("write")
    def shop_remove_from_cart(self, line_id: Annotated[str, Field(min_length=1)]) -> Cart:
        """Remove a line from the cart."""
        cart, line = self._line(line_id)
        cart["lines"].remove(line)
        return self._cart_view(cart)

    @tool()
    def shop_view_cart(self) -> Cart:
        """The current cart: lines, coupon, subtotal and discount."""
        cart = self._active_cart(create=False)
        if cart is None:
            raise fail("the cart is empty; add something with shop_add_to_cart")
        return self._cart_view(cart)

    @tool("write")
    def shop_apply_coupon(
        self,
        cart_id: Annotated[str, Field(min_length=1)],
        code: Annotated[str, Field(min_length=3, max_length=24)],
    ) -> Cart:
        """Apply a coupon code to the cart (replaces an earlier coupon)."""
        cart = self._open_cart(cart_id)
        coupon = self._coupon(code)
        if coupon is None:
            raise fail(f"coupon '{code}' is invalid")
        if coupon["expires"] < self.world.iso_now()[:10]:
            raise fail(f"coupon '{coupon['code']}' expired on {coupon['expires']}")
        if coupon.get("used"):
            raise fail(f"coupon '{coupon['code']}' has already been used")
        subtotal = self._cart_view(cart)["subtotal"]
        if subtotal < coupon["min_subtotal"]:
            raise fail(
                f"coupon '{coupon['code']}' needs a subtotal of ${coupon['min_subtotal']:.2f} "
                f"(cart: ${subtotal:.2f})"
            )
        if self._discount(cart["lines"], coupon) <= 0:
            raise fail(f"coupon '{coupon['code']}' only applies to {coupon.get('category')} items")
        cart["coupon"] = coupon["code"]
        return self._cart_view(cart)

    @tool("payment")
    def shop_checkout(
        self,
        cart_id: Annotated[
            str, Field(min_length=1, description="From shop_add_to_cart / shop_view_cart")
        ],
        payment_method_id: Annotated[str, Field(min_length=1)],
        address_id: Annotated[str, Field(min_length=1)],
        shipping: Shipping = "standard",
    ) -> Order:
        """Buy everything in the cart and charge the card (merchandise - coupon + shipping)."""
        cart = self._open_cart(cart_id)
        if not cart["lines"]:
            raise fail("the cart is empty")
        for line in cart["lines"]:
            product = self._product(line["product_id"])
            left = product["stock"].get(line["size"], 0)
            if line["quantity"] > left:
                raise fail(
                    f"'{product['title']}' is out of stock"
                    if not left
                    else f"only {left} of '{product['title']}' left"
                )
        address = self.find("addresses", address_id, what="address")
        view = self._cart_view(cart)
        merchandise = money(view["subtotal"] - view["discount"])
        fee = shipping_fee(shipping, merchandise)
        total = money(merchandise + fee)
        card = self.find("payment_methods", payment_method_id, what="payment method")
        if card["status"] != "active":
            raise fail(f"card declined: {card['label']} is {card['status']}")
        if total > card["available"] + 1e-9:
            raise fail(
                f"card declined: {card['label']} has ${card['available']:.2f} available, "
                f"the order is ${total:.2f}"
            )
        card["available"] = money(card["available"] - total)
        for line in cart["lines"]:
            self._product(line["product_id"])["stock"][line["size"]] -= line["quantity"]
        coupon = self._coupon(cart.get("coupon"))
        if coupon is not None:
            coupon["used"] = True
        days = {"standard": 5, "express": 2, "next_day": 1}[shipping]
        order = {
            "id": self.world.new_id("so"),
            "lines": [
                {k: ln[k] for k in ("product_id", "title", "size", "quantity", "unit_price")}
                for ln in cart["lines"]
            ],
            "product_ids": [ln["product_id"] for ln in cart["lines"]],
            "subtotal": view["subtotal"],
            "coupon": cart.get("coupon"),
            "discount": view["discount"],
            "shipping": shipping,
            "shipping_fee": fee,
            "total": total,
            "payment_method_id": payment_method_id,
            "address_id": address["id"],
            "status": "processing",
            "placed_at": self.world.iso_now(),
            "eta": (self.world.now + timedelta(days=days)).date().isoformat(),
            "delivered_at": None,
            "carrier": None,
            "tracking": None,
            "cancel_reason": None,
        }
        self.records("orders").append(order)
        cart["status"] = "checked_out"
        return cast(Order, order)

    # ------------------------------------------------------------------ orders
    @tool()
    def shop_list_orders(
        self,
        status: OrderStatus | None = None,
        query: Annotated[str, Field(max_length=80, description="Part of an item title")] = "",
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Order]:
        """List orders, newest first, optionally by status or by an item's title."""
        q = query.lower()

        def wanted(o: dict[str, Any]) -> bool:
            return (status is None or o["status"] == status) and (
                not q or any(q in ln["title"].lower() for ln in o["lines"])
            )

        page = self.page_in_order(
            "orders", "shop.newest", _placed_at, wanted, reverse=True, limit=limit, offset=offset
        )
        return cast(list[Order], page)

    @tool()
    def shop_get_order(self, order_id: OrderId) -> Order:
        """Get one order with its lines, amounts, status and delivery date."""
        return cast(Order, self.find("orders", order_id, what="order"))

    @tool()
    def shop_track_shipment(self, order_id: OrderId) -> Shipment:
        """Shipping status of an order: carrier, tracking number, estimated or actual delivery."""
        order = self.find("orders", order_id, what="order")
        return {
            "order_id": order["id"],
            "status": order["status"],
            "carrier": order.get("carrier"),
            "tracking": order.get("tracking"),
            "eta": order.get("eta"),
            "delivered_at": order.get("delivered_at"),
        }

    @tool("write")
    def shop_cancel_order(self, order_id: OrderId, reason: CancelReason) -> Order:
        """Cancel an order that has not shipped yet; the card is refunded and stock released."""
        order = self.find("orders", order_id, what="order")
        if order["status"] != "processing":
            raise fail(
                f"order '{order_id}' is {order['status']}; only processing orders can be cancelled"
            )
        card = self.find("payment_methods", order["payment_method_id"], what="payment method")
        card["available"] = money(card["available"] + order["total"])
        for line in order["lines"]:
            product = next(
                (p for p in self.records("products") if p["id"] == line["product_id"]), None
            )
            if product is not None:
                product["stock"][line["size"]] = (
                    product["stock"].get(line["size"], 0) + line["quantity"]
                )
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        return cast(Order, order)

    # ------------------------------------------------------------------ returns
    @tool("write")
    def shop_request_return(
        self,
        order_id: OrderId,
        product_id: ProductId,
        reason_code: ReturnReason,
        quantity: Annotated[int, Field(ge=1, le=10)] = 1,
    ) -> Return:
        """Open a return for an item of a delivered order (within 30 days of delivery)."""
        order = self.find("orders", order_id, what="order")
        if order["status"] != "delivered" or not order.get("delivered_at"):
            raise fail(
                f"order '{order_id}' is {order['status']}; only delivered items can be returned"
            )
        delivered = datetime.fromisoformat(order["delivered_at"])
        if self.world.now - delivered > timedelta(days=RETURN_WINDOW_DAYS):
            raise fail(
                f"return window expired: order '{order_id}' was delivered "
                f"{order['delivered_at'][:10]}; returns are accepted for {RETURN_WINDOW_DAYS} "
                "days after delivery"
            )
        line = next((ln for ln in order["lines"] if ln["product_id"] == product_id), None)
        if line is None:
            raise fail(f"product '{product_id}' is not in order '{order_id}'")
        returned = sum(
            r["quantity"]
            for r in self.records("returns")
            if r["order_id"] == order_id and r["product_id"] == product_id
        )
        if returned + quantity > line["quantity"]:
            raise fail(f"only {line['quantity'] - returned} of that item can still be returned")
        record = {
            "id": self.world.new_id("ret"),
            "order_id": order_id,
            "product_id": product_id,
            "size": line["size"],
            "quantity": quantity,
            "reason_code": reason_code,
            "status": "requested",
            "refund_amount": money(quantity * line["unit_price"]),
            "carrier": None,
            "label": None,
            "exchange_size": None,
            "created_at": self.world.iso_now(),
        }
        self.records("returns").append(record)
        return cast(Return, record)

    @tool("write")
    def shop_create_return_label(
        self,
        return_id: Annotated[str, Field(min_length=1, description="From shop_request_return")],
        carrier: Carrier,
    ) -> Return:
        """Create the prepaid shipping label for a requested return."""
        record = self.first("returns", id=return_id)
        if record is None:
            raise fail(
                f"return '{return_id}' not found; request the return first (shop_request_return)"
            )
        if record["status"] != "requested":
            raise fail(f"return '{return_id}' is {record['status']}; no label needed")
        record["status"] = "label_created"
        record["carrier"] = carrier
        record["label"] = f"{carrier.upper()}-{return_id.split('_')[-1]}-RL"
        return cast(Return, record)

    @tool("write")
    def shop_request_exchange(
        self,
        return_id: Annotated[str, Field(min_length=1)],
        new_size: Annotated[str, Field(min_length=1)],
    ) -> Return:
        """Turn a wrong-size return into an exchange for another size of the same product."""
        record = self.first("returns", id=return_id)
        if record is None:
            raise fail(f"return '{return_id}' not found; exchanges start with shop_request_return")
        if record["reason_code"] != "wrong_size":
            raise fail(
                f"return '{return_id}' has reason '{record['reason_code']}'; only wrong_size "
                "returns can be exchanged"
            )
        if record["status"] != "requested":
            raise fail(f"return '{return_id}' is {record['status']}")
        product = self._product(record["product_id"])
        size = self._size(product, new_size, "new_size")
        if size == record["size"]:
            raise fail(f"the item already is size {size}", "invalid_arguments")
        if product["stock"].get(size, 0) < record["quantity"]:
            raise fail(f"'{product['title']}' is out of stock in size {size}")
        product["stock"][size] -= record["quantity"]
        record["status"] = "exchange_requested"
        record["exchange_size"] = size
        record["carrier"] = "ups"
        record["label"] = f"UPS-{return_id.split('_')[-1]}-EX"
        return cast(Return, record)

    @tool()
    def shop_list_returns(self, status: ReturnStatus | None = None) -> list[Return]:
        """List returns and exchanges, optionally by status."""
        return cast(list[Return], self.select("returns", status=status))

    # ------------------------------------------------------------------ wishlist & alerts
    @tool("write")
    def shop_add_to_wishlist(self, product_id: ProductId) -> WishlistEntry:
        """Save a product to the wishlist (no duplicates)."""
        product = self._product(product_id)
        for entry in self.records("wishlist"):
            if entry["product_id"] == product_id:
                return cast(WishlistEntry, entry)
        entry = {
            "id": self.world.new_id("wish"),
            "product_id": product_id,
            "title": product["title"],
            "price": product["price"],
            "added_at": self.world.iso_now(),
        }
        self.records("wishlist").append(entry)
        return cast(WishlistEntry, entry)

    @tool()
    def shop_list_wishlist(self) -> list[WishlistEntry]:
        """The products saved to the wishlist."""
        return cast(list[WishlistEntry], self.records("wishlist"))

    @tool("write")
    def shop_remove_from_wishlist(self, product_id: ProductId) -> Removed:
        """Remove a product from the wishlist."""
        entry = self.first("wishlist", product_id=product_id)
        if entry is None:
            raise fail(f"product '{product_id}' is not on the wishlist")
        self.records("wishlist").remove(entry)
        return {"removed": product_id}

    @tool("write")
    def shop_set_price_alert(
        self, product_id: ProductId, target_price: Annotated[float, Field(gt=0, le=100_000)]
    ) -> PriceAlert:
        """Get notified when a product's price drops to the target price or below."""
        product = self._product(product_id)
        if product["price"] <= target_price:
            raise fail(
                f"'{product['title']}' already costs ${product['price']:.2f}, "
                "at or below the target"
            )
        for alert in self.records("price_alerts"):
            if alert["product_id"] == product_id:
                alert["target_price"] = target_price
                return cast(PriceAlert, alert)
        alert = {
            "id": self.world.new_id("alert"),
            "product_id": product_id,
            "target_price": target_price,
            "current_price": product["price"],
        }
        self.records("price_alerts").append(alert)
        return cast(PriceAlert, alert)

    @tool("write")
    def shop_write_review(
        self,
        product_id: ProductId,
        rating: Annotated[int, Field(ge=1, le=5)],
        text: Annotated[str, Field(min_length=1, max_length=2000)],
    ) -> Review:
        """Review a product the user bought and received (one review per product)."""
        self._product(product_id)
        bought = any(
            o["status"] == "delivered" and product_id in o["product_ids"]
            for o in self.records("orders")
        )
        if not bought:
            raise fail("only products from a delivered order can be reviewed")
        if any(r["product_id"] == product_id for r in self.records("reviews")):
            raise fail("you already reviewed this product")
        review = {
            "id": self.world.new_id("rev"),
            "product_id": product_id,
            "rating": rating,
            "text": text,
            "time": self.world.iso_now(),
        }
        self.records("reviews").append(review)
        return cast(Review, review)

    # ------------------------------------------------------------------ account
    @tool()
    def shop_list_payment_methods(self) -> list[PaymentMethod]:
        """Saved cards with status and available credit."""
        return cast(list[PaymentMethod], self.records("payment_methods"))

    @tool()
    def shop_list_addresses(self) -> list[Address]:
        """Saved shipping addresses."""
        return cast(list[Address], self.records("addresses"))
