"""Shopping tasks: filtered search and checkout, carts without buying, sizes and checkout habits
from memory, returns and exchanges (Skills), bundles and gifts researched by sub-agents."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from qpa.contract import Check, MemoryItem, Task
from qpa.envs.sandbox.apps.shop import ShopApp
from qpa.envs.sandbox.authoring import ADDRESSES, PlanBuilder, card_pool, near, ref, remembered
from qpa.envs.sandbox.engine import DEFAULT_START, money
from qpa.envs.sandbox.suite import TaskGen, template

SHOP_NOW = DEFAULT_START
SHOE_SIZES = ["6", "7", "8", "9", "10", "11", "12"]
CLOTH_SIZES = ["XS", "S", "M", "L", "XL"]

# item type -> (category, brands, sizes, price range)
TYPES: dict[str, tuple[str, list[str], list[str], tuple[int, int]]] = {
    "Running Shoes": (
        "shoes",
        ["Stride", "Apex", "Velo", "Kinetic", "Nordpeak", "Swift"],
        SHOE_SIZES,
        (55, 160),
    ),
    "Sneakers": (
        "shoes",
        ["Urbano", "Stride", "Canvas Co", "Apex", "Metro", "Luma"],
        SHOE_SIZES,
        (40, 130),
    ),
    "Hiking Boots": (
        "shoes",
        ["Nordpeak", "Ridge", "Timberline", "Kinetic", "Summit", "Trailhead"],
        SHOE_SIZES,
        (80, 220),
    ),
    "Rain Jacket": (
        "apparel",
        ["Nordpeak", "Tidewell", "Forge", "Urbano", "Ridge", "Summit"],
        CLOTH_SIZES,
        (45, 180),
    ),
    "Hoodie": (
        "apparel",
        ["Urbano", "Forge", "Luma", "Metro", "Canvas Co", "Basecamp"],
        CLOTH_SIZES,
        (25, 80),
    ),
    "Fleece Vest": (
        "apparel",
        ["Basecamp", "Nordpeak", "Ridge", "Tidewell", "Summit", "Forge"],
        CLOTH_SIZES,
        (30, 90),
    ),
    "Wireless Earbuds": (
        "electronics",
        ["Sonix", "Auralab", "Beatline", "Pulse", "Nimbus", "Vox"],
        [],
        (25, 180),
    ),
    "Phone Case": (
        "electronics",
        ["Shellguard", "Armor", "Slimfit", "Nimbus", "Vox", "Orbit"],
        [],
        (8, 45),
    ),
    "USB-C Charger": (
        "electronics",
        ["Voltix", "Ampere", "Orbit", "Nimbus", "Chargeon", "Sonix"],
        [],
        (12, 60),
    ),
    "Bluetooth Speaker": (
        "electronics",
        ["Sonix", "Beatline", "Boomer", "Auralab", "Pulse", "Vox"],
        [],
        (20, 150),
    ),
    "Power Bank": (
        "electronics",
        ["Voltix", "Ampere", "Chargeon", "Orbit", "Juicebox", "Nimbus"],
        [],
        (15, 70),
    ),
    "Desk Lamp": ("home", ["Lumo", "Brightly", "Nordlys", "Halo", "Studio", "Arc"], [], (15, 80)),
    "French Press": (
        "home",
        ["Brewmaster", "Kaffa", "Bodum Co", "Morning", "Roastery", "Pour"],
        [],
        (15, 60),
    ),
    "Throw Blanket": (
        "home",
        ["Cozy", "Hearth", "Woolly", "Nordlys", "Loom", "Nest"],
        [],
        (20, 90),
    ),
    "Yoga Mat": (
        "sports",
        ["Zenflow", "Grip", "Lotus", "Balance", "Core", "Stretch"],
        [],
        (15, 80),
    ),
    "Water Bottle": ("sports", ["Hydro", "Aqua", "Summit", "Trek", "Flow", "Peak"], [], (10, 45)),
    "Board Game": (
        "toys",
        ["Gamewright", "Meeple", "Tabletop", "Dicey", "Puzzlers", "Kingdom"],
        [],
        (12, 60),
    ),
    "Science Kit": ("toys", ["Curio", "Labkid", "Eureka", "Tinker", "Spark", "Atom"], [], (15, 70)),
    "Picture Book": (
        "books",
        ["Pageturn", "Inkwell", "Storybook", "Owl Press", "Maple", "Lantern"],
        [],
        (8, 30),
    ),
    "Jigsaw Puzzle": (
        "toys",
        ["Puzzlers", "Piecemeal", "Mosaic", "Tabletop", "Curio", "Jigsy"],
        [],
        (10, 40),
    ),
    "Lego Set": (
        "toys",
        ["Brickworks", "Blockcity", "Buildit", "Tinker", "Studs", "Maker"],
        [],
        (15, 120),
    ),
}
MODELS = [
    "Glide",
    "Pulse",
    "Aero",
    "Trail",
    "Flex",
    "Nova",
    "Core",
    "Zen",
    "Max",
    "Lite",
    "Edge",
    "Orbit",
    "Vista",
    "Echo",
    "Terra",
    "Drift",
    "Quest",
    "Spark",
]
SELLERS = ["Shop Direct", "Gadget Hub", "Outdoor Depot", "HomeGoods Plus", "Kids Corner"]
SHIPPING_WORDS = {"standard": "standard", "express": "express", "next_day": "next-day"}


PLURAL_KINDS = {"Running Shoes", "Sneakers", "Hiking Boots", "Wireless Earbuds"}


def _a(kind: str) -> str:
    """'a desk lamp', 'a pair of wireless earbuds'."""
    return f"a pair of {kind.lower()}" if kind in PLURAL_KINDS else f"a {kind.lower()}"


def _price(low: float, high: float, g: TaskGen) -> float:
    return float(g.rng.randint(int(low), int(high))) + 0.99


class ShopWorld:
    """A small catalog with cards, addresses and past orders."""

    def __init__(self, g: TaskGen, n_cards: int = 3) -> None:
        self.g = g
        self.products: list[dict[str, Any]] = []
        self.orders: list[dict[str, Any]] = []
        self.cards = card_pool(g.rng, n_cards)
        self.addresses = [dict(a) for a in ADDRESSES[: g.rng.randint(2, 4)]]
        self.wishlist: list[dict[str, Any]] = []
        self._titles: set[str] = set()

    def product(
        self,
        kind: str,
        *,
        price: float | None = None,
        rating: float | None = None,
        stock: int | dict[str, int] | None = None,
        brand: str | None = None,
    ) -> dict[str, Any]:
        rng = self.g.rng
        category, brands, sizes, (low, high) = TYPES[kind]
        for _ in range(200):
            title = f"{brand or rng.choice(brands)} {rng.choice(MODELS)} {kind}"
            if title not in self._titles and not any(
                t.split()[:2] == title.split()[:2] for t in self._titles
            ):
                break
        self._titles.add(title)
        if isinstance(stock, dict):
            stock_map = {s: stock.get(s, 0) for s in sizes} if sizes else dict(stock)
        elif sizes:
            level = stock if stock is not None else None
            stock_map = {s: level if level is not None else rng.randint(1, 6) for s in sizes}
        else:
            stock_map = {"one_size": stock if stock is not None else rng.randint(2, 30)}
        product = {
            "id": f"p_{101 + len(self.products)}",
            "title": title,
            "brand": brand if brand else title.split(" ")[0],
            "category": category,
            "price": price if price is not None else _price(low, high, self.g),
            "rating": rating if rating is not None else round(rng.uniform(3.4, 4.8), 1),
            "reviews": rng.randint(3, 2500),
            "seller": rng.choice(SELLERS),
            "sizes": list(sizes),
            "stock": stock_map,
        }
        if brand is None:
            product["brand"] = next(b for b in brands if title.startswith(b + " "))
        self.products.append(product)
        return product

    def noise(self, n: int, *exclude: str) -> None:
        kinds = [k for k in TYPES if k not in exclude]
        for kind in self.g.rng.sample(kinds, n):
            self.product(kind)

    def order(
        self,
        lines: list[tuple[dict[str, Any], str, int]],
        *,
        status: str,
        placed: datetime,
        delivered: datetime | None = None,
    ) -> dict[str, Any]:
        rng = self.g.rng
        rows = [_line(p, size, q) for p, size, q in lines]
        subtotal = money(sum(r["quantity"] * r["unit_price"] for r in rows))
        fee = 0.0 if subtotal >= 35 else 4.99
        carrier = rng.choice(["ups", "fedex", "usps"]) if status != "processing" else None
        order = {
            "id": f"so_{201 + len(self.orders)}",
            "lines": rows,
            "product_ids": [r["product_id"] for r in rows],
            "subtotal": subtotal,
            "coupon": None,
            "discount": 0.0,
            "shipping": "standard",
            "shipping_fee": fee,
            "total": money(subtotal + fee),
            "payment_method_id": rng.choice(self.cards)["id"],
            "address_id": rng.choice(self.addresses)["id"],
            "status": status,
            "placed_at": placed.isoformat(timespec="minutes"),
            "eta": (placed + timedelta(days=5)).date().isoformat(),
            "delivered_at": delivered.isoformat(timespec="minutes") if delivered else None,
            "carrier": carrier,
            "tracking": f"{carrier.upper()}{rng.randint(10**8, 10**9 - 1)}" if carrier else None,
            "cancel_reason": None,
        }
        self.orders.append(order)
        return order

    def address(self) -> dict[str, Any]:
        return self.g.rng.choice(self.addresses)

    def world(self) -> dict[str, dict[str, Any]]:
        self.g.rng.shuffle(self.products)
        self.orders.sort(key=lambda o: o["placed_at"])
        return {
            "shop": {
                **ShopApp.default_state(),
                "products": self.products,
                "orders": self.orders,
                "coupons": [
                    {
                        "code": "WELCOME10",
                        "percent_off": 10,
                        "min_subtotal": 20.0,
                        "category": None,
                        "expires": "2026-12-31",
                        "used": True,
                    },
                ],
                "wishlist": self.wishlist,
                "payment_methods": self.cards,
                "addresses": self.addresses,
            }
        }


def _new_orders(n: int = 1) -> Check:
    return Check(
        name="exactly one new order",
        target="shop.orders",
        op="count",
        where={"status": "processing"},
        expect=n,
    )


def _line(product: dict[str, Any], size: str, quantity: int) -> dict[str, Any]:
    return {
        "product_id": product["id"],
        "title": product["title"],
        "size": size,
        "quantity": quantity,
        "unit_price": product["price"],
    }


def _ago(days: int, hours: int = 0) -> datetime:
    return SHOP_NOW - timedelta(days=days, hours=hours)


# --------------------------------------------------------------------------- templates


@template(domain="shopping", capabilities=["tool_use"], apps=["shop"], difficulty=3)
def shopping_buy_cheapest_match(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kind = rng.choice(list(TYPES))
    _, _, sizes, (low, high) = TYPES[kind]
    min_rating = rng.choice([4.0, 4.2, 4.5])
    size = rng.choice(sizes[1:-1]) if sizes else None
    prices = sorted(rng.sample(range(low, high), 5))
    ok = round(rng.uniform(min_rating, 4.9), 1)
    # cheaper but badly rated; cheaper but out of stock (in that size); the target; pricier ones
    sw.product(kind, price=prices[0] + 0.99, rating=round(min_rating - 0.4, 1))
    out = {s: (0 if s == size else 3) for s in sizes} if sizes else 0
    sw.product(kind, price=prices[1] + 0.99, rating=ok, stock=out)
    target = sw.product(
        kind,
        price=prices[2] + 0.99,
        rating=round(rng.uniform(min_rating, 4.9), 1),
        stock={s: 2 for s in sizes} if sizes else 5,
    )
    for p in prices[3:]:
        sw.product(kind, price=p + 0.99, rating=round(rng.uniform(min_rating, 4.9), 1))
    sw.noise(4, kind)
    shipping = rng.choice(["standard", "express", "next_day"])
    address, card = sw.address(), rng.choice(sw.cards)
    in_size = f" in size {size}" if size else ""
    instruction = (
        f"Buy the cheapest {kind.lower()} rated {min_rating} or higher that is in stock{in_size}. "
        f"Ship {SHIPPING_WORDS[shipping]} to my {address['label']} address and pay with my "
        f"{card['label']}."
    )
    plan = PlanBuilder()
    search: dict[str, Any] = {"query": kind, "min_rating": min_rating, "in_stock_only": True}
    if size:
        search["size"] = size
    s_search = plan.call("shop_search", **search, sort="price_asc")
    add: dict[str, Any] = {"product_id": ref(s_search, "0.id"), "quantity": 1}
    if size:
        add["size"] = size
    s_cart = plan.call("shop_add_to_cart", **add)
    plan.call("shop_list_payment_methods")
    plan.call(
        "shop_checkout",
        cart_id=ref(s_cart, "id"),
        payment_method_id=card["id"],
        address_id=address["id"],
        shipping=shipping,
    )
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="cheapest qualifying product bought",
                target="shop.orders",
                where={
                    "lines": [_line(target, size or "one_size", 1)],
                    "shipping": shipping,
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                    "status": "processing",
                },
            ),
            _new_orders(),
        ],
        plan=plan.finish(),
        confirmations=["shop_checkout"],
    )


@template(domain="shopping", capabilities=["tool_use"], apps=["shop"], difficulty=2)
def shopping_cart_without_buying(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kind = rng.choice([k for k, v in TYPES.items() if not v[2]])
    _, _, _, (low, high) = TYPES[kind]
    span = high - low
    lo = low + rng.randint(span // 6, span // 3)
    hi = lo + rng.randint(span // 4, span // 2)
    ratings = sorted(rng.sample([3.6, 3.8, 3.9, 4.1, 4.2, 4.4, 4.6, 4.7], 4), reverse=True)
    sw.product(kind, price=float(hi + rng.randint(2, 20)) + 0.99, rating=4.9)  # too expensive
    sw.product(kind, price=float(max(1, lo - rng.randint(2, 6))) + 0.99, rating=4.8)  # too cheap
    target = sw.product(
        kind, price=float(rng.randint(lo, hi - 1)) + 0.99, rating=ratings[0], stock=8
    )
    for r in ratings[1:]:
        sw.product(kind, price=float(rng.randint(lo, hi - 1)) + 0.99, rating=r)
    sw.noise(3, kind)
    qty = rng.randint(1, 3)
    instruction = (
        f"Put {qty} of the best-rated {kind.lower()} priced between ${lo} and ${hi} in my cart — "
        f"don't buy anything yet, I'll check out later."
    )
    plan = PlanBuilder()
    s_search = plan.call("shop_search", query=kind, min_price=lo, max_price=hi, sort="rating")
    plan.call("shop_add_to_cart", product_id=ref(s_search, "0.id"), quantity=qty)
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="best-rated product in range is in the cart, nothing else",
                target="shop.carts",
                where={"status": "open", "product_ids": [target["id"]], "units": qty},
            ),
            Check(
                name="no order placed",
                target="shop.orders",
                op="absent",
                where={"status": "processing"},
            ),
        ],
        plan=plan.finish(),
    )


@template(domain="shopping", capabilities=["memory", "tool_use"], apps=["shop"], difficulty=3)
def shopping_usual_size(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kind = rng.choice([k for k, v in TYPES.items() if v[2]])
    category, _, sizes, _ = TYPES[kind]
    right, wrong = rng.sample(sizes[1:-1], 2)
    target = sw.product(kind, stock={s: rng.randint(1, 4) for s in sizes})
    sw.product(kind)
    sw.noise(4, kind)
    key = "shoe_size" if category == "shoes" else "clothing_size"
    memory = [
        *remembered(rng, key, right, wrong, source="past orders"),
        MemoryItem(key="preferred_shipping", value="standard", evidence="observed"),
    ]
    shipping = rng.choice(["standard", "express", "next_day"])
    address, card = sw.address(), rng.choice(sw.cards)
    instruction = (
        f"Order the {target['title']} in my usual size — {SHIPPING_WORDS[shipping]} shipping to my "
        f"{address['label']} address, paid with my {card['label']}."
    )
    plan = PlanBuilder()
    s_search = plan.call("shop_search", query=target["title"])
    s_cart = plan.call("shop_add_to_cart", product_id=ref(s_search, "0.id"), quantity=1, size=right)
    plan.call(
        "shop_checkout",
        cart_id=ref(s_cart, "id"),
        payment_method_id=card["id"],
        address_id=address["id"],
        shipping=shipping,
    )
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="ordered in the remembered size",
                target="shop.orders",
                where={
                    "lines": [_line(target, right, 1)],
                    "shipping": shipping,
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                },
            ),
            _new_orders(),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["shop_checkout"],
    )


@template(domain="shopping", capabilities=["memory"], apps=["shop"], difficulty=3)
def shopping_checkout_habits(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g, n_cards=3)
    kind = rng.choice([k for k, v in TYPES.items() if not v[2]])
    target = sw.product(kind, stock=10)
    sw.product(kind)
    sw.noise(4, kind)
    card, wrong_card = rng.sample(sw.cards, 2)
    speed, wrong_speed = rng.sample(["standard", "express", "next_day"], 2)
    memory = [
        *remembered(rng, "preferred_card", card["label"], wrong_card["label"], source="checkout"),
        *remembered(
            rng,
            "shipping_speed",
            SHIPPING_WORDS[speed],
            SHIPPING_WORDS[wrong_speed],
            source="checkout",
        ),
    ]
    qty = rng.randint(1, 3)
    address = sw.address()
    instruction = (
        f"Buy {qty} of the {target['title']} and check out the way I usually do — my preferred "
        f"card and my usual shipping speed — to my {address['label']} address."
    )
    plan = PlanBuilder()
    s_search = plan.call("shop_search", query=target["title"])
    s_cart = plan.call("shop_add_to_cart", product_id=ref(s_search, "0.id"), quantity=qty)
    plan.call("shop_list_payment_methods")
    plan.call(
        "shop_checkout",
        cart_id=ref(s_cart, "id"),
        payment_method_id=card["id"],
        address_id=address["id"],
        shipping=speed,
    )
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="preferred card and usual shipping used",
                target="shop.orders",
                where={
                    "lines": [_line(target, "one_size", qty)],
                    "shipping": speed,
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                },
            ),
            _new_orders(),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["shop_checkout"],
    )


PROBLEMS = {
    "damaged": ["arrived with a cracked casing", "came crushed in the box", "arrived broken"],
    "defective": ["stopped working after a day", "won't turn on", "doesn't work at all"],
    "wrong_item": ["isn't what I ordered", "turned out to be a different model than I ordered"],
}
CARRIERS = {"ups": "UPS", "fedex": "FedEx", "usps": "USPS", "dhl": "DHL"}


@template(domain="shopping", capabilities=["skills", "tool_use"], apps=["shop"], difficulty=3)
def shopping_return_with_label(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kind = rng.choice([k for k, v in TYPES.items() if not v[2]])
    target = sw.product(kind)
    other = sw.product(rng.choice([k for k in TYPES if k != kind and not TYPES[k][2]]))
    sw.noise(3, kind)
    old = _ago(rng.randint(40, 90))
    sw.order(
        [(target, "one_size", 1)], status="delivered", placed=old, delivered=old + timedelta(days=4)
    )
    days = rng.randint(4, 20)
    placed = _ago(days + 3)
    order = sw.order(
        [(target, "one_size", 1), (other, "one_size", 1)],
        status="delivered",
        placed=placed,
        delivered=_ago(days),
    )
    reason = rng.choice(list(PROBLEMS))
    problem = rng.choice(PROBLEMS[reason])
    carrier = rng.choice(list(CARRIERS))
    when = rng.choice(["recently", f"{days} days ago", "in my latest order"])
    short = " ".join(target["title"].split()[:2])
    instruction = (
        f"The {target['title']} I got {when} {problem}. Send it back for a refund — I'll drop the "
        f"parcel at {CARRIERS[carrier]}."
    )
    plan = PlanBuilder()
    s_orders = plan.call("shop_list_orders", status="delivered", query=short)
    plan.call("shop_get_order", order_id=ref(s_orders, "0.id"))
    s_ret = plan.call(
        "shop_request_return",
        order_id=ref(s_orders, "0.id"),
        product_id=target["id"],
        reason_code=reason,
    )
    plan.call("shop_create_return_label", return_id=ref(s_ret, "id"), carrier=carrier)
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="return with the right reason and a label",
                target="shop.returns",
                where={
                    "order_id": order["id"],
                    "product_id": target["id"],
                    "reason_code": reason,
                    "status": "label_created",
                    "carrier": carrier,
                },
            ),
            Check(name="a single return", target="shop.returns", op="count", expect=1),
        ],
        plan=plan.finish(),
    )


@template(domain="shopping", capabilities=["skills"], apps=["shop"], difficulty=3)
def shopping_exchange_size(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kind = rng.choice([k for k, v in TYPES.items() if v[2]])
    sizes = TYPES[kind][2]
    i = rng.randint(1, len(sizes) - 2)
    old_size = sizes[i]
    bigger = rng.random() < 0.5
    new_size = sizes[i + 1] if bigger else sizes[i - 1]
    unavailable = sizes[i - 1] if bigger else sizes[i + 1]
    stock = {s: rng.randint(1, 4) for s in sizes}
    stock[unavailable] = 0
    target = sw.product(kind, stock=stock)
    sw.product(kind)
    sw.noise(3, kind)
    days = rng.randint(3, 25)
    order = sw.order(
        [(target, old_size, 1)], status="delivered", placed=_ago(days + 4), delivered=_ago(days)
    )
    unsized = sw.product(rng.choice([k for k, v in TYPES.items() if not v[2]]))
    sw.order([(unsized, "one_size", 1)], status="shipped", placed=_ago(2))
    if bigger:
        fit = rng.choice(["is too small", "is a size too small", "feels too tight"])
    else:
        fit = rng.choice(["is too big", "is a size too big", "feels too loose"])
    instruction = (
        f"The {target['title']} (size {old_size}) from my recent order {fit}. Exchange it for "
        f"size {new_size}."
    )
    plan = PlanBuilder()
    s_orders = plan.call("shop_list_orders", status="delivered", query=target["title"])
    s_ret = plan.call(
        "shop_request_return",
        order_id=ref(s_orders, "0.id"),
        product_id=target["id"],
        reason_code="wrong_size",
    )
    plan.call("shop_request_exchange", return_id=ref(s_ret, "id"), new_size=new_size)
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="exchange requested for the new size",
                target="shop.returns",
                where={
                    "order_id": order["id"],
                    "product_id": target["id"],
                    "reason_code": "wrong_size",
                    "status": "exchange_requested",
                    "exchange_size": new_size,
                },
            ),
            Check(
                name="no separate return label",
                target="shop.returns",
                op="absent",
                where={"status": "label_created"},
            ),
            Check(name="a single return", target="shop.returns", op="count", expect=1),
        ],
        plan=plan.finish(),
    )


def _ranked_options(
    sw: ShopWorld, kind: str, budget: int, trap_budget: int | None = None
) -> dict[str, Any]:
    """Products of one kind where exactly one is the best-rated in-stock under the budget."""
    rng = sw.g.rng
    low = max(TYPES[kind][3][0], 5)
    top = rng.choice([4.3, 4.4, 4.5, 4.6])

    def under(lo: int, hi: int) -> float:
        return round(rng.randint(lo, hi) - 0.01, 2)

    target = sw.product(kind, price=under(low, budget - 1), rating=top, stock=6)
    sw.product(kind, price=under(budget + 3, budget + 25), rating=4.9)  # over budget
    sw.product(kind, price=under(low, budget - 1), rating=4.8, stock=0)  # sold out
    sw.product(kind, price=under(low, budget - 1), rating=round(top - 0.4, 1))
    if trap_budget is not None:  # the best pick if the stale, higher budget were used
        sw.product(kind, price=under(budget + 2, trap_budget - 1), rating=4.7)
    return target


@template(domain="shopping", capabilities=["subagent", "tool_use"], apps=["shop"], difficulty=4)
def shopping_bundle_research(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    budget = rng.choice([30, 35, 40, 45, 50, 60])
    kinds = rng.sample([k for k, v in TYPES.items() if not v[2] and v[3][0] < budget - 8], 3)
    targets = [_ranked_options(sw, k, budget) for k in kinds]
    shipping = rng.choice(["standard", "express"])
    address, card = sw.address(), rng.choice(sw.cards)
    names = [_a(k) for k in kinds]
    instruction = (
        f"I need {names[0]}, {names[1]} and {names[2]}. For each, find the best-rated one "
        f"under ${budget} that's in stock, then buy all three together with my {card['label']}, "
        f"{SHIPPING_WORDS[shipping]} shipping to my {address['label']} address."
    )
    plan = PlanBuilder()
    searches = []
    for k, (kind, target) in enumerate(zip(kinds, targets, strict=True)):
        plan.delegate(
            goal=f"Find the best-rated {kind.lower()} under ${budget} that is in stock; "
            f"answer with its title and product id.",
            tools=["shop_search", "shop_get_product", "shop_check_stock"],
            agent=f"finder_{k}",
        )
        searches.append(
            plan.call(
                "shop_search", query=kind, max_price=budget, in_stock_only=True, sort="rating"
            )
        )
        plan.finish(answer=f"{target['title']} ({target['id']}), ${target['price']:.2f}")
    s_cart = -1
    for s in searches:
        s_cart = plan.call("shop_add_to_cart", product_id=ref(s, "0.id"), quantity=1)
    plan.call(
        "shop_checkout",
        cart_id=ref(s_cart, "id"),
        payment_method_id=card["id"],
        address_id=address["id"],
        shipping=shipping,
    )
    contains = [
        Check(
            name=f"bought the {kind.lower()}",
            target="shop.orders",
            where={
                "product_ids__contains": t["id"],
                "status": "processing",
                "payment_method_id": card["id"],
                "address_id": address["id"],
                "shipping": shipping,
            },
        )
        for kind, t in zip(kinds, targets, strict=True)
    ]
    total = money(sum(t["price"] for t in targets))
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            *contains,
            Check(
                name="exactly those three items",
                target="shop.orders",
                op="count",
                where={"status": "processing", "subtotal": total},
                expect=1,
            ),
            _new_orders(),
        ],
        plan=plan.finish(),
        confirmations=["shop_checkout"],
    )


KIDS = ["Mia", "Leo", "Sam", "Ava", "Noah", "Ella", "Finn", "Ivy", "Max", "Lily", "Theo", "Ruby"]
GIFT_KINDS = [
    "Board Game",
    "Science Kit",
    "Picture Book",
    "Jigsaw Puzzle",
    "Lego Set",
    "Water Bottle",
]


@template(domain="shopping", capabilities=["subagent", "memory"], apps=["shop"], difficulty=5)
def shopping_gift_wishlist(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    budget, wrong_budget = rng.choice([(25, 40), (30, 45), (35, 50), (40, 60), (30, 55)])
    kinds = rng.sample(GIFT_KINDS, 3)
    kids = rng.sample(KIDS, 3)
    targets = [_ranked_options(sw, k, budget, trap_budget=wrong_budget) for k in kinds]
    sw.noise(2, *kinds)
    keep = sw.product(rng.choice([k for k in TYPES if k not in kinds]))
    sw.wishlist.append(
        {
            "id": "wish_1",
            "product_id": keep["id"],
            "title": keep["title"],
            "price": keep["price"],
            "added_at": "2026-02-10T20:15",
        }
    )
    memory = [
        *remembered(rng, "gift_budget", f"${budget}", f"${wrong_budget}", source="gift purchases"),
        MemoryItem(key="gift_preference", value="educational toys", evidence="inferred"),
    ]
    occasion = rng.choice(
        ["birthday gifts", "gifts for the holidays", "end-of-school gifts", "little presents"]
    )
    parts = [f"a {k.lower()} for {kid}" for k, kid in zip(kinds, kids, strict=True)]
    instruction = (
        f"Find {occasion} within my usual gift budget: {parts[0]}, {parts[1]} and {parts[2]} — the "
        f"best-rated one in stock for each — and save them to my wishlist."
    )
    plan = PlanBuilder()
    searches = []
    for k, (kind, kid, target) in enumerate(zip(kinds, kids, targets, strict=True)):
        plan.delegate(
            goal=f"Find the best-rated in-stock {kind.lower()} under ${budget} for "
            f"{kid}; answer with its title and product id.",
            tools=["shop_search", "shop_get_product"],
            agent=f"gift_{k}",
        )
        searches.append(
            plan.call(
                "shop_search", query=kind, max_price=budget, in_stock_only=True, sort="rating"
            )
        )
        plan.finish(answer=f"{target['title']} ({target['id']})")
    for s in searches:
        plan.call("shop_add_to_wishlist", product_id=ref(s, "0.id"))
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            *(
                Check(
                    name=f"gift for {kid} saved",
                    target="shop.wishlist",
                    where={"product_id": t["id"]},
                )
                for kid, t in zip(kids, targets, strict=True)
            ),
            Check(name="nothing else saved", target="shop.wishlist", op="count", expect=4),
            Check(
                name="nothing bought",
                target="shop.orders",
                op="absent",
                where={"status": "processing"},
            ),
        ],
        plan=plan.finish(),
        memory=memory,
    )


CANCEL_PHRASES = {
    "found_cheaper": ["I found it cheaper elsewhere", "it's on sale at another store"],
    "changed_mind": ["I changed my mind", "I don't need it anymore"],
    "ordered_by_mistake": ["I ordered it by mistake", "I bought it twice by accident"],
}


@template(domain="shopping", capabilities=["tool_use"], apps=["shop"], difficulty=2)
def shopping_cancel_unshipped(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kinds = rng.sample(list(TYPES), 3)
    target = sw.product(kinds[0])
    extra = sw.product(kinds[1])
    shipped = sw.product(kinds[2])
    sw.noise(3, *kinds)

    def size(product: dict[str, Any]) -> str:
        return str(rng.choice(product["sizes"])) if product["sizes"] else "one_size"

    sw.order([(shipped, size(shipped), 1)], status="shipped", placed=_ago(2))
    lines = [(target, size(target), 1)]
    if rng.random() < 0.5:
        lines.append((extra, size(extra), 1))
    order = sw.order(lines, status="processing", placed=_ago(0, rng.randint(1, 12)))
    reason = rng.choice(list(CANCEL_PHRASES))
    phrase = rng.choice(CANCEL_PHRASES[reason])
    instruction = (
        f"Cancel my order with the {target['title']} — {phrase}. How much goes back to my card?"
    )
    plan = PlanBuilder()
    s_orders = plan.call("shop_list_orders", query=target["title"], status="processing")
    plan.call("shop_cancel_order", order_id=ref(s_orders, "0.id"), reason=reason)
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="order cancelled with the reason",
                target="shop.orders",
                where={"id": order["id"], "status": "cancelled", "cancel_reason": reason},
            ),
            Check(
                name="only that order cancelled",
                target="shop.orders",
                op="count",
                where={"status": "cancelled"},
                expect=1,
            ),
        ],
        answer=f"{order['total']:.2f}",
        answer_match="number",
        plan=plan.finish(answer=f"${order['total']:.2f} will be refunded."),
    )


REVIEW_TEXTS = [
    "Exactly as described, very happy with it.",
    "Good quality for the price.",
    "Works fine, but shipping took a while.",
    "Not great: it feels cheaper than it looks.",
    "Love it, would buy again.",
    "Does the job. Nothing special.",
]


@template(domain="shopping", capabilities=["tool_use"], apps=["shop"], difficulty=3)
def shopping_review_and_track(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    k1, k2 = rng.sample([k for k, v in TYPES.items() if not v[2]], 2)
    bought = sw.product(k1)
    coming = sw.product(k2)
    sw.noise(4, k1, k2)
    days = rng.randint(2, 12)
    sw.order(
        [(bought, "one_size", 1)], status="delivered", placed=_ago(days + 4), delivered=_ago(days)
    )
    shipped = sw.order([(coming, "one_size", 1)], status="shipped", placed=_ago(rng.randint(1, 3)))
    shipped["eta"] = (SHOP_NOW + timedelta(days=rng.randint(1, 6))).date().isoformat()
    stars = rng.randint(1, 5)
    text = rng.choice(REVIEW_TEXTS)
    instruction = (
        f'Leave a {stars}-star review on the {bought["title"]} I bought: "{text}" Also, when is my '
        f"{coming['title']} supposed to arrive? Give me the date as YYYY-MM-DD."
    )
    plan = PlanBuilder()
    s_orders = plan.call("shop_list_orders", query=coming["title"])
    plan.call("shop_track_shipment", order_id=ref(s_orders, "0.id"))
    s_search = plan.call("shop_search", query=bought["title"])
    plan.call("shop_write_review", product_id=ref(s_search, "0.id"), rating=stars, text=text)
    return g.task(
        instruction=instruction,
        world=sw.world(),
        checks=[
            Check(
                name="review posted",
                target="shop.reviews",
                where={"product_id": bought["id"], "rating": stars, "text": text},
            ),
            Check(name="one review", target="shop.reviews", op="count", expect=1),
        ],
        answer=shipped["eta"],
        plan=plan.finish(answer=f"It should arrive on {shipped['eta']}."),
    )


@template(domain="shopping", capabilities=["tool_use"], apps=["shop"], difficulty=3)
def shopping_coupon_checkout(g: TaskGen) -> Task:
    rng = g.rng
    sw = ShopWorld(g)
    kinds = rng.sample([k for k, v in TYPES.items() if not v[2]], 2)
    main = sw.product(kinds[0], stock=10)
    side = sw.product(kinds[1], stock=10)
    sw.noise(3, *kinds)
    percent = rng.choice([10, 15, 20, 25])
    code = f"{rng.choice(['SPRING', 'HELLO', 'TREAT', 'BONUS', 'FLASH', 'LOYAL'])}{percent}"
    world = sw.world()
    coupons = world["shop"]["coupons"]
    coupons.append(
        {
            "code": code,
            "percent_off": percent,
            "min_subtotal": 10.0,
            "category": main["category"],
            "expires": "2026-06-30",
            "used": False,
        }
    )
    coupons.append(
        {
            "code": f"OLD{percent}",
            "percent_off": percent + 10,
            "min_subtotal": 0.0,
            "category": None,
            "expires": "2026-01-31",
            "used": False,
        }
    )
    q1, q2 = rng.randint(1, 2), rng.randint(1, 2)
    address, card = sw.address(), rng.choice(sw.cards)
    instruction = (
        f"Buy {q1} of the {main['title']} and {q2} of the {side['title']}, use coupon {code}, "
        f"and ship standard to my {address['label']} address with my {card['label']}."
    )
    plan = PlanBuilder()
    s_a = plan.call("shop_search", query=main["title"])
    s_b = plan.call("shop_search", query=side["title"])
    plan.call("shop_add_to_cart", product_id=ref(s_a, "0.id"), quantity=q1)
    s_cart = plan.call("shop_add_to_cart", product_id=ref(s_b, "0.id"), quantity=q2)
    plan.call("shop_apply_coupon", cart_id=ref(s_cart, "id"), code=code)
    plan.call(
        "shop_checkout",
        cart_id=ref(s_cart, "id"),
        payment_method_id=card["id"],
        address_id=address["id"],
        shipping="standard",
    )
    eligible = main["price"] * q1 + (
        side["price"] * q2 if side["category"] == main["category"] else 0
    )
    discount = money(eligible * percent / 100)
    return g.task(
        instruction=instruction,
        world=world,
        checks=[
            Check(
                name="both items bought with the coupon",
                target="shop.orders",
                where={
                    "product_ids__contains": main["id"],
                    "coupon": code,
                    **near("subtotal", main["price"] * q1 + side["price"] * q2),
                    **near("discount", discount),
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                },
            ),
            Check(
                name="the second item too",
                target="shop.orders",
                where={"product_ids__contains": side["id"], "status": "processing"},
            ),
            _new_orders(),
        ],
        plan=plan.finish(),
        confirmations=["shop_checkout"],
    )
