"""Food delivery tasks: order dishes, pick restaurants by filters, memory of usual orders and
diets, promo + tip convention, refunds for missing items, price comparison by sub-agents."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from qpa.contract import Check, Finish, MemoryItem, Task
from qpa.envs.sandbox.apps.food import FoodApp
from qpa.envs.sandbox.authoring import ADDRESSES, PlanBuilder, card_pool, near, ref, remembered
from qpa.envs.sandbox.engine import money
from qpa.envs.sandbox.suite import TaskGen, template

# --------------------------------------------------------------------------- food world

FOOD_NOW = datetime(2026, 3, 2, 18, 0)
CLOCK = {"start": FOOD_NOW.isoformat()}

# cuisine -> (restaurant names, dishes: (name, category, base price, dietary tags))
CUISINES: dict[str, tuple[list[str], list[tuple[str, str, float, list[str]]]]] = {
    "italian": (
        [
            "Luigi's Trattoria",
            "Nonna Rosa",
            "Pasta Fresca",
            "Via Roma Kitchen",
            "Trattoria Sole",
            "Il Forno",
        ],
        [
            ("Margherita Pizza", "pizza", 12.5, ["vegetarian"]),
            ("Pepperoni Pizza", "pizza", 14.0, []),
            ("Spaghetti Carbonara", "pasta", 15.5, []),
            ("Penne Arrabbiata", "pasta", 13.0, ["vegan", "vegetarian"]),
            ("Mushroom Risotto", "main", 16.0, ["vegetarian", "gluten_free"]),
            ("Caprese Salad", "starter", 9.5, ["vegetarian", "gluten_free"]),
            ("Tiramisu", "dessert", 7.0, ["vegetarian"]),
        ],
    ),
    "japanese": (
        [
            "Sakura Sushi",
            "Tokyo Bento",
            "Umami House",
            "Koi Ramen Bar",
            "Hana Izakaya",
            "Sushi Zen",
        ],
        [
            ("California Roll", "sushi", 9.0, []),
            ("Salmon Nigiri", "sushi", 11.0, ["gluten_free"]),
            ("Tonkotsu Ramen", "ramen", 14.5, []),
            ("Vegetable Tempura", "starter", 8.5, ["vegan", "vegetarian"]),
            ("Chicken Katsu Curry", "main", 15.0, []),
            ("Edamame", "starter", 5.0, ["vegan", "vegetarian", "gluten_free"]),
            ("Miso Soup", "starter", 4.0, ["vegetarian"]),
        ],
    ),
    "thai": (
        [
            "Bangkok Street",
            "Thai Orchid",
            "Lemongrass Kitchen",
            "Siam Garden",
            "Chili & Lime",
            "Baan Thai",
        ],
        [
            ("Pad Thai", "noodles", 13.0, []),
            ("Green Curry", "curry", 14.0, ["gluten_free"]),
            ("Tom Yum Soup", "soup", 9.0, ["gluten_free"]),
            ("Tofu Massaman Curry", "curry", 14.5, ["vegan", "vegetarian"]),
            ("Mango Sticky Rice", "dessert", 7.0, ["vegan", "vegetarian", "gluten_free"]),
            ("Chicken Satay", "starter", 8.5, ["gluten_free", "halal"]),
        ],
    ),
    "indian": (
        [
            "Spice Route",
            "Tandoor Nights",
            "Masala House",
            "Curry Leaf",
            "Delhi Darbar",
            "Saffron Table",
        ],
        [
            ("Butter Chicken", "curry", 15.0, ["gluten_free", "halal"]),
            ("Chicken Tikka Masala", "curry", 15.5, ["gluten_free", "halal"]),
            ("Chana Masala", "curry", 12.0, ["vegan", "vegetarian", "gluten_free"]),
            ("Palak Paneer", "curry", 13.5, ["vegetarian", "gluten_free"]),
            ("Garlic Naan", "bread", 3.5, ["vegetarian"]),
            ("Lamb Biryani", "rice", 17.0, ["halal"]),
            ("Vegetable Samosa", "starter", 6.0, ["vegan", "vegetarian"]),
        ],
    ),
    "mexican": (
        ["Casa Verde", "Taqueria Sol", "El Camino", "La Palma", "Burrito Barn", "Cantina Azul"],
        [
            ("Chicken Burrito", "burritos", 12.0, []),
            ("Beef Tacos", "tacos", 11.0, ["gluten_free"]),
            ("Veggie Quesadilla", "main", 10.5, ["vegetarian"]),
            ("Bean Burrito Bowl", "bowls", 11.5, ["vegan", "vegetarian", "gluten_free"]),
            ("Chips & Guacamole", "starter", 6.5, ["vegan", "vegetarian", "gluten_free"]),
            ("Churros", "dessert", 5.5, ["vegetarian"]),
        ],
    ),
    "chinese": (
        [
            "Golden Dragon",
            "Jade Garden",
            "Lucky Wok",
            "Dumpling Palace",
            "Red Lantern",
            "Bamboo House",
        ],
        [
            ("Kung Pao Chicken", "main", 14.0, []),
            ("Mapo Tofu", "main", 12.5, ["vegetarian"]),
            ("Vegetable Spring Rolls", "starter", 6.0, ["vegan", "vegetarian"]),
            ("Beef Chow Mein", "noodles", 13.5, []),
            ("Pork Dumplings", "starter", 9.0, []),
            ("Egg Fried Rice", "rice", 8.0, ["vegetarian"]),
        ],
    ),
    "american": (
        [
            "Liberty Burger",
            "Smokehouse 66",
            "Main Street Diner",
            "Patty Shack",
            "Grill Republic",
            "Route 9 Eats",
        ],
        [
            ("Classic Cheeseburger", "burgers", 13.0, []),
            ("Veggie Burger", "burgers", 12.5, ["vegetarian"]),
            ("Buffalo Wings", "starter", 11.0, ["gluten_free"]),
            ("Caesar Salad", "salads", 10.0, []),
            ("Sweet Potato Fries", "sides", 5.5, ["vegan", "vegetarian", "gluten_free"]),
            ("Pulled Pork Sandwich", "sandwiches", 14.0, []),
        ],
    ),
    "mediterranean": (
        ["Olive & Thyme", "Aegean Grill", "Cedar Tree", "Zaytoon", "Pita Corner", "Blue Cyprus"],
        [
            ("Chicken Shawarma Wrap", "wraps", 11.5, ["halal"]),
            ("Falafel Plate", "main", 12.0, ["vegan", "vegetarian"]),
            ("Lamb Kofta", "main", 16.0, ["halal", "gluten_free"]),
            ("Hummus & Pita", "starter", 7.0, ["vegan", "vegetarian"]),
            ("Greek Salad", "salads", 9.5, ["vegetarian", "gluten_free"]),
            ("Baklava", "dessert", 6.0, ["vegetarian"]),
        ],
    ),
}
FEES = [0.0, 0.99, 1.49, 1.99, 2.49, 2.99, 3.49, 3.99, 4.99]
NOTES_FOR_DRIVER = [
    "Leave it at the door, please.",
    "Ring the bell twice.",
    "Call me when you arrive.",
    "Buzzer code is 4821.",
    "Please don't ring, the baby is asleep.",
    "Hand it to the concierge.",
    "Side entrance on the left.",
    "Knock loudly, the bell is broken.",
]


def price_at(base: float, factor: float) -> float:
    """Menu price: base scaled by the restaurant's price factor, ending in .49 or .99."""
    return round(round(base * factor * 2) / 2 - 0.01, 2)


def _line(dish: dict[str, Any], quantity: int) -> dict[str, Any]:
    """An order or cart line of the food app for a menu item."""
    return {
        "item_id": dish["id"],
        "name": dish["name"],
        "quantity": quantity,
        "unit_price": dish["price"],
        "notes": "",
    }


class FoodWorld:
    """Builds a small, consistent food-app world: restaurants, menus, cards, past orders."""

    def __init__(self, g: TaskGen, n_cards: int = 3) -> None:
        self.g = g
        self.restaurants: list[dict[str, Any]] = []
        self.menu: list[dict[str, Any]] = []
        self.orders: list[dict[str, Any]] = []
        self.promos: list[dict[str, Any]] = []
        self.cases: list[dict[str, Any]] = []
        self.cards = card_pool(g.rng, n_cards)
        self.addresses = [dict(a) for a in ADDRESSES[: g.rng.randint(2, 4)]]
        self._used: set[str] = set()
        self._item = 100

    def restaurant(
        self,
        cuisine: str,
        dishes: list[str] | None = None,
        *,
        n_dishes: int = 4,
        factor: float | None = None,
        prices: dict[str, float] | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        rng = self.g.rng
        names, pool = CUISINES[cuisine]
        name = rng.choice([n for n in names if n not in self._used])
        self._used.add(name)
        restaurant = {
            "id": f"r_{101 + len(self.restaurants)}",
            "name": name,
            "cuisine": cuisine,
            "rating": round(rng.uniform(3.9, 4.9), 1),
            "delivery_fee": rng.choice(FEES),
            "min_order": float(rng.choice([0, 8, 10])),
            "opens": "11:00",
            "closes": "22:30",
            "accepting_orders": True,
            "eta_min": rng.choice([20, 25, 30, 35, 40, 45, 50]),
            "price_level": rng.randint(1, 3),
            "address": self.g.fake.address(),
        }
        restaurant.update(overrides)
        self.restaurants.append(restaurant)
        chosen = list(dishes or [])
        extra = [d[0] for d in pool if d[0] not in chosen]
        chosen += rng.sample(extra, max(0, min(len(extra), n_dishes - len(chosen))))
        scale = factor if factor is not None else rng.choice([0.9, 1.0, 1.1, 1.2, 1.3])
        by_name = {d[0]: d for d in pool}
        for dish in chosen:
            _, category, base, tags = by_name[dish]
            self._item += 1
            price = (prices or {}).get(dish, price_at(base, scale))
            self.menu.append(
                {
                    "id": f"mi_{self._item}",
                    "restaurant_id": restaurant["id"],
                    "name": dish,
                    "category": category,
                    "price": price,
                    "available": True,
                    "dietary": list(tags),
                }
            )
        return restaurant

    def dish(self, restaurant: dict[str, Any], name: str) -> dict[str, Any]:
        return next(
            m for m in self.menu if m["restaurant_id"] == restaurant["id"] and m["name"] == name
        )

    def dishes(self, restaurant: dict[str, Any]) -> list[dict[str, Any]]:
        return [m for m in self.menu if m["restaurant_id"] == restaurant["id"]]

    def order(
        self,
        restaurant: dict[str, Any],
        lines: list[tuple[dict[str, Any], int]],
        *,
        status: str,
        placed: datetime,
        delivered: datetime | None = None,
    ) -> dict[str, Any]:
        rng = self.g.rng
        card = rng.choice(self.cards)
        address = rng.choice(self.addresses)
        rows = [_line(m, q) for m, q in lines]
        subtotal = money(sum(r["quantity"] * r["unit_price"] for r in rows))
        tip = float(rng.choice([0, 2, 3, 4, 5]))
        order = {
            "id": f"fo_{301 + len(self.orders)}",
            "restaurant_id": restaurant["id"],
            "restaurant": restaurant["name"],
            "lines": rows,
            "item_ids": [r["item_id"] for r in rows],
            "subtotal": subtotal,
            "promo": None,
            "discount": 0.0,
            "delivery_fee": restaurant["delivery_fee"],
            "tip": tip,
            "total": money(subtotal + restaurant["delivery_fee"] + tip),
            "address_id": address["id"],
            "address": address["address"],
            "payment_method_id": card["id"],
            "instructions": "",
            "status": status,
            "placed_at": placed.isoformat(timespec="minutes"),
            "deliver_at": None,
            "delivered_at": delivered.isoformat(timespec="minutes") if delivered else None,
            "cancel_reason": None,
            "rating": None,
            "review": "",
        }
        if status == "out_for_delivery":
            order["courier"] = self.g.fake.name()
        self.orders.append(order)
        return order

    def history(self, n: int = 2) -> None:
        """A few delivered orders from the past weeks (realistic noise)."""
        for _ in range(n):
            restaurant = self.g.rng.choice(self.restaurants)
            dish = self.g.rng.choice(self.dishes(restaurant))
            placed = FOOD_NOW - timedelta(
                days=self.g.rng.randint(5, 40), hours=self.g.rng.randint(0, 5)
            )
            self.order(
                restaurant,
                [(dish, self.g.rng.randint(1, 2))],
                status="delivered",
                placed=placed,
                delivered=placed + timedelta(minutes=40),
            )

    def address(self) -> dict[str, Any]:
        return self.g.rng.choice(self.addresses)

    def world(self) -> dict[str, dict[str, Any]]:
        self.orders.sort(key=lambda o: o["placed_at"])
        return {
            "_clock": dict(CLOCK),
            "food": {
                **FoodApp.default_state(),
                "restaurants": self.restaurants,
                "menu": self.menu,
                "orders": self.orders,
                "promos": self.promos,
                "cases": self.cases,
                "addresses": self.addresses,
                "payment_methods": self.cards,
            },
        }


def other_cuisines(rng: random.Random, *exclude: str, k: int = 2) -> list[str]:
    return rng.sample([c for c in CUISINES if c not in exclude], k)


def _addr_phrase(address: dict[str, Any]) -> str:
    return f"my {address['label']} address"


def _placed_check(n: int = 1) -> Check:
    return Check(
        name="exactly one new order placed",
        target="food.orders",
        op="count",
        where={"status__in": ["placed", "scheduled"]},
        expect=n,
    )


def _find_dish(plan: PlanBuilder, restaurant: str, dish: str) -> tuple[int, int]:
    """Plan steps finding a restaurant by name, then the dish on its menu."""
    s_rest = plan.call("food_search_restaurants", query=restaurant)
    s_menu = plan.call("food_search_menu", query=dish, restaurant_id=ref(s_rest, "0.id"))
    return s_rest, s_menu


def _cart_with(plan: PlanBuilder, s_rest: int, s_menu: int, quantity: int) -> int:
    """Plan steps opening a cart at the restaurant of step `s_rest` with the first dish of step
    `s_menu`; returns the cart's step."""
    s_cart = plan.call("food_create_cart", restaurant_id=ref(s_rest, "0.id"))
    plan.call(
        "food_add_to_cart",
        cart_id=ref(s_cart, "id"),
        item_id=ref(s_menu, "0.id"),
        quantity=quantity,
    )
    return s_cart


def _checkout(
    plan: PlanBuilder, cart_step: int, address: dict[str, Any], card: dict[str, Any], **extra: Any
) -> int:
    return plan.call(
        "food_checkout",
        cart_id=ref(cart_step, "id"),
        address_id=address["id"],
        payment_method_id=card["id"],
        **extra,
    )


# --------------------------------------------------------------------------- templates


@template(domain="food", capabilities=["tool_use"], apps=["food"], difficulty=2)
def food_order_dish_delivery(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    target = fw.restaurant(cuisine, n_dishes=5)
    fw.restaurant(cuisine, n_dishes=5)  # same cuisine: the same dishes elsewhere
    for other in other_cuisines(rng, cuisine, k=2):
        fw.restaurant(other)
    fw.history(2)
    dish = rng.choice(fw.dishes(target))
    qty = rng.randint(1, 4)
    target["min_order"] = min(target["min_order"], dish["price"] * qty)
    address, card = fw.address(), rng.choice(fw.cards)
    phrasing = rng.choice(
        [
            "Order {q} {d} from {r} for delivery to {a}, and pay with my {c}.",
            "Can you get {q} {d} from {r} delivered to {a}? Pay with my {c}.",
            "I'd like {q} {d} from {r} sent to {a} — charge my {c}.",
        ]
    )
    instruction = phrasing.format(
        q=qty, d=dish["name"], r=target["name"], a=_addr_phrase(address), c=card["label"]
    )
    plan = PlanBuilder()
    s_rest, s_menu = _find_dish(plan, target["name"], dish["name"])
    s_cart = _cart_with(plan, s_rest, s_menu, qty)
    plan.call("food_list_addresses")
    plan.call("food_list_payment_methods")
    _checkout(plan, s_cart, address, card)
    line = _line(dish, qty)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="order placed at the right restaurant, address and card",
                target="food.orders",
                where={
                    "restaurant_id": target["id"],
                    "lines": [line],
                    "address_id": address["id"],
                    "payment_method_id": card["id"],
                    "status": "placed",
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(),
        confirmations=["food_checkout"],
    )


@template(domain="food", capabilities=["tool_use"], apps=["food"], difficulty=3)
def food_best_open_restaurant(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    dish_name = rng.choice(CUISINES[cuisine][1])[0]
    min_rating = rng.choice([4.0, 4.2, 4.3, 4.5])
    fees = sorted(rng.sample(FEES, 4))
    cheap = fees[:2]
    rng.shuffle(cheap)

    def good() -> float:
        return round(rng.uniform(min_rating, 4.9), 1)

    closed_hours: dict[str, Any] = rng.choice(
        [{"opens": "07:00", "closes": "15:00"}, {"accepting_orders": False}]
    )
    fw.restaurant(cuisine, [dish_name], rating=good(), delivery_fee=cheap[0], **closed_hours)
    fw.restaurant(
        cuisine,
        [dish_name],
        rating=round(min_rating - rng.choice([0.1, 0.3, 0.5]), 1),
        delivery_fee=cheap[1],
    )
    target = fw.restaurant(cuisine, [dish_name], rating=good(), delivery_fee=fees[2], min_order=0.0)
    fw.restaurant(cuisine, [dish_name], rating=good(), delivery_fee=fees[3])
    for other in other_cuisines(rng, cuisine, k=2):
        fw.restaurant(other, delivery_fee=0.0)
    rng.shuffle(fw.restaurants)
    fw.history(1)
    dish = fw.dish(target, dish_name)
    qty = rng.randint(1, 3)
    address, card = fw.address(), rng.choice(fw.cards)
    instruction = (
        f"I want {cuisine} food now: find the {cuisine} restaurant that is open right now, rated "
        f"at least {min_rating}, with the lowest delivery fee, and order {qty} {dish_name} from it "
        f"to {_addr_phrase(address)}. Pay with my {card['label']}."
    )
    plan = PlanBuilder()
    s_rest = plan.call(
        "food_search_restaurants",
        cuisine=cuisine,
        min_rating=min_rating,
        open_now=True,
        sort="delivery_fee",
    )
    s_menu = plan.call("food_search_menu", query=dish_name, restaurant_id=ref(s_rest, "0.id"))
    s_cart = _cart_with(plan, s_rest, s_menu, qty)
    _checkout(plan, s_cart, address, card)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="ordered from the cheapest-delivery open, well-rated place",
                target="food.orders",
                where={
                    "restaurant_id": target["id"],
                    "item_ids": [dish["id"]],
                    "address_id": address["id"],
                    "payment_method_id": card["id"],
                    "status": "placed",
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(),
        confirmations=["food_checkout"],
    )


@template(domain="food", capabilities=["memory", "tool_use"], apps=["food"], difficulty=3)
def food_usual_order(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    c_right, c_wrong, c_other = rng.sample(list(CUISINES), 3)
    right = fw.restaurant(c_right, n_dishes=4)
    wrong = fw.restaurant(c_wrong, n_dishes=4)
    fw.restaurant(c_other)
    dish, decoy = rng.choice(fw.dishes(right)), rng.choice(fw.dishes(wrong))
    for restaurant, item in ((right, dish), (wrong, decoy)):
        placed = FOOD_NOW - timedelta(days=rng.randint(3, 30), hours=1)
        fw.order(
            restaurant,
            [(item, 1)],
            status="delivered",
            placed=placed,
            delivered=placed + timedelta(minutes=35),
        )
    card, wrong_card = rng.sample(fw.cards, 2)
    qty = rng.randint(1, 3)
    right["min_order"] = 0.0
    tip = float(rng.choice([2, 3, 4, 5, 6, 7, 8]) + rng.choice([0, 0.5]))
    note = rng.choice(NOTES_FOR_DRIVER)
    address = fw.address()
    memory = [
        *remembered(
            rng,
            "usual_food_order",
            f"{dish['name']} from {right['name']}",
            f"{decoy['name']} from {wrong['name']}",
            source="food orders",
        ),
        *remembered(rng, "preferred_card", card["label"], wrong_card["label"], source="payments"),
        MemoryItem(key="home_address", value="12 Harbor Street", evidence="confirmed"),
    ]
    count = {1: "just one", 2: "two of them", 3: "three of them"}[qty]
    instruction = (
        f"Order my usual — {count} — delivered to {_addr_phrase(address)} with a ${tip:.2f} tip, "
        f'and pay with the card I prefer. Tell the driver: "{note}"'
    )
    plan = PlanBuilder()
    s_rest, s_menu = _find_dish(plan, right["name"], dish["name"])
    s_cart = _cart_with(plan, s_rest, s_menu, qty)
    plan.call("food_list_payment_methods")
    _checkout(plan, s_cart, address, card, tip=tip, instructions=note)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="usual dish from the usual restaurant, preferred card",
                target="food.orders",
                where={
                    "restaurant_id": right["id"],
                    "item_ids": [dish["id"]],
                    "status": "placed",
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                    "instructions": note,
                    **near("tip", tip),
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["food_checkout"],
    )


DIET_WORDS = {
    "vegan": "vegan",
    "gluten_free": "gluten-free",
    "halal": "halal",
    "vegetarian": "vegetarian",
}


@template(domain="food", capabilities=["memory"], apps=["food"], difficulty=3)
def food_diet_memory(g: TaskGen) -> Task:
    rng = g.rng
    options = []
    for cuisine, (_, pool) in CUISINES.items():
        for right in ("vegan", "gluten_free", "halal"):
            for wrong in ("vegan", "gluten_free", "halal", "vegetarian"):
                has_fit = any(right in d[3] and wrong not in d[3] for d in pool)
                has_trap = any(wrong in d[3] and right not in d[3] for d in pool)
                if right != wrong and has_fit and has_trap:
                    options.append((cuisine, right, wrong))
    cuisine, right, wrong = rng.choice(options)
    pool = CUISINES[cuisine][1]
    fit = rng.choice([d for d in pool if right in d[3] and wrong not in d[3]])
    trap = rng.choice([d for d in pool if wrong in d[3] and right not in d[3]])
    others = [d[0] for d in pool if right not in d[3] and d[0] != trap[0]]
    fw = FoodWorld(g)
    fw.restaurant(rng.choice(other_cuisines(rng, cuisine, k=1)))
    dishes = [fit[0], trap[0], *rng.sample(others, min(2, len(others)))]
    target = fw.restaurant(cuisine, dishes, n_dishes=len(dishes), min_order=0.0)
    fw.restaurant(cuisine, [fit[0]])
    fit_item, trap_item = fw.dish(target, fit[0]), fw.dish(target, trap[0])
    budget = float(int(max(fit_item["price"], trap_item["price"])) + rng.choice([1, 2, 3, 4]))
    # another dish that fits the diet but is off-limits (over budget or sold out)
    extra = [d for d in pool if right in d[3] and d[0] not in dishes]
    if extra:
        spare = extra[0]
        fw._item += 1
        blocked_price = rng.random() < 0.5
        fw.menu.append(
            {
                "id": f"mi_{fw._item}",
                "restaurant_id": target["id"],
                "name": spare[0],
                "category": spare[1],
                "price": budget + 3.49 if blocked_price else fit_item["price"],
                "available": blocked_price,
                "dietary": list(spare[3]),
            }
        )
    rng.shuffle(fw.restaurants)
    address, card = fw.address(), rng.choice(fw.cards)
    meal = rng.choice(["dinner", "something to eat", "a quick dinner", "a meal"])
    instruction = (
        f"Get me {meal} from {target['name']} that fits my diet, under ${budget:.0f}, delivered to "
        f"{_addr_phrase(address)} — use my {card['label']}."
    )
    memory = [
        *remembered(rng, "diet", DIET_WORDS[right], DIET_WORDS[wrong], source="profile"),
        MemoryItem(key="favorite_cuisine", value=cuisine, evidence="observed"),
    ]
    plan = PlanBuilder()
    s_rest = plan.call("food_search_restaurants", query=target["name"])
    s_menu = plan.call(
        "food_get_menu",
        restaurant_id=ref(s_rest, "0.id"),
        dietary=right,
        max_price=budget,
        available_only=True,
    )
    s_cart = _cart_with(plan, s_rest, s_menu, 1)
    _checkout(plan, s_cart, address, card)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name=f"ordered the one {right} dish within budget",
                target="food.orders",
                where={
                    "restaurant_id": target["id"],
                    "item_ids": [fit_item["id"]],
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                    "status": "placed",
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["food_checkout"],
    )


PROMO_WORDS = ["SAVE", "FEAST", "TASTY", "HUNGRY", "DINNER", "WEEKEND", "YUMMY", "SPRING"]


@template(domain="food", capabilities=["skills", "tool_use"], apps=["food"], difficulty=3)
def food_promo_and_tip(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    target = fw.restaurant(cuisine, n_dishes=5, min_order=0.0)
    fw.restaurant(rng.choice(other_cuisines(rng, cuisine, k=1)))
    dish = rng.choice(fw.dishes(target))
    qty = rng.randint(2, 4)
    percent = rng.choice([10, 15, 20, 25, 30])
    code = f"{rng.choice(PROMO_WORDS)}{percent}"
    subtotal = money(dish["price"] * qty)
    fw.promos.append(
        {
            "code": code,
            "percent_off": percent,
            "min_subtotal": float(int(subtotal * 0.6)),
            "restaurant_id": None,
            "expires": "2026-04-30",
            "used": False,
        }
    )
    fw.promos.append(
        {
            "code": f"{rng.choice(PROMO_WORDS)}{percent + 5}X",
            "percent_off": percent + 5,
            "min_subtotal": 0.0,
            "restaurant_id": None,
            "expires": "2026-02-01",
            "used": False,
        }
    )
    tip_pct = rng.choice([10, 12, 15, 18, 20, 22, 25])
    discount = money(subtotal * percent / 100)
    tip = money((subtotal - discount) * tip_pct / 100)
    address, card = fw.address(), rng.choice(fw.cards)
    instruction = (
        f"Order {qty} {dish['name']} from {target['name']} to {_addr_phrase(address)} with my "
        f"{card['label']}. Use promo code {code} and leave a {tip_pct}% tip."
    )
    plan = PlanBuilder()
    s_rest, s_menu = _find_dish(plan, target["name"], dish["name"])
    s_cart = _cart_with(plan, s_rest, s_menu, qty)
    plan.call("food_apply_promo", cart_id=ref(s_cart, "id"), code=code)
    _checkout(plan, s_cart, address, card, tip=tip)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="promo applied, tip on the discounted food subtotal",
                target="food.orders",
                where={
                    "restaurant_id": target["id"],
                    "item_ids": [dish["id"]],
                    "promo": code,
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                    **near("discount", discount),
                    **near("tip", tip),
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(),
        confirmations=["food_checkout"],
    )


@template(domain="food", capabilities=["skills"], apps=["food"], difficulty=3)
def food_missing_item_refund(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    target = fw.restaurant(cuisine, n_dishes=5)
    other = fw.restaurant(rng.choice(other_cuisines(rng, cuisine, k=1)))
    menu = fw.dishes(target)
    missing = rng.choice(menu)
    rest = rng.sample([m for m in menu if m is not missing], 2)
    qty = rng.choice([1, 1, 2])
    old_placed = FOOD_NOW - timedelta(days=rng.randint(6, 20), hours=2)
    fw.order(
        target,
        [(missing, qty), (rest[0], 1)],
        status="delivered",
        placed=old_placed,
        delivered=old_placed + timedelta(minutes=45),
    )
    placed = FOOD_NOW - timedelta(hours=rng.randint(2, 40), minutes=rng.choice([0, 15, 30]))
    lines = [(rest[0], rng.randint(1, 2)), (missing, qty), (rest[1], 1)]
    order = fw.order(
        target, lines, status="delivered", placed=placed, delivered=placed + timedelta(minutes=40)
    )
    later = placed + timedelta(hours=rng.randint(0, 1), minutes=50)
    fw.order(
        other,
        [(rng.choice(fw.dishes(other)), 1)],
        status="delivered",
        placed=later,
        delivered=later + timedelta(minutes=30),
    )
    amount = money(qty * missing["price"])
    destination = rng.choice(["original_payment", "food_credits"])
    where = "back to my card" if destination == "original_payment" else "as food credits in the app"
    what = f"the {missing['name']}" if qty == 1 else f"both {missing['name']}"
    instruction = (
        f"My last order from {target['name']} came without {what}. Get me a refund for that "
        f"{where}, and tell me how much it was."
    )
    plan = PlanBuilder()
    s_rest = plan.call("food_search_restaurants", query=target["name"])
    s_orders = plan.call("food_list_orders", restaurant_id=ref(s_rest, "0.id"), status="delivered")
    plan.call("food_get_order", order_id=ref(s_orders, "0.id"))
    s_case = plan.call(
        "food_report_issue",
        order_id=ref(s_orders, "0.id"),
        issue="missing_item",
        item_ids=[missing["id"]],
    )
    plan.call("food_request_refund", case_id=ref(s_case, "id"), destination=destination)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="missing item refunded to the right place",
                target="food.cases",
                where={
                    "order_id": order["id"],
                    "issue": "missing_item",
                    "item_ids": [missing["id"]],
                    "status": "refunded",
                    "destination": destination,
                    **near("refund_amount", amount),
                },
            ),
            Check(name="only one support case", target="food.cases", op="count", expect=1),
        ],
        answer=f"{amount:.2f}",
        answer_match="number",
        plan=plan.finish(answer=f"Refunded ${amount:.2f}."),
    )


def _scout(
    plan: PlanBuilder, k: int, restaurant: dict[str, Any], dish: dict[str, Any]
) -> tuple[int, int]:
    """A sub-agent that looks up one dish's price at one restaurant."""
    plan.delegate(
        goal=f"Find the price of {dish['name']} at {restaurant['name']} and report it.",
        tools=["food_search_restaurants", "food_search_menu", "food_get_menu"],
        agent=f"scout_{k}",
    )
    s_rest, s_menu = _find_dish(plan, restaurant["name"], dish["name"])
    plan.add(
        Finish(
            answer=f"{restaurant['name']} ({restaurant['id']}): {dish['name']} ({dish['id']}) "
            f"costs ${dish['price']:.2f}"
        )
    )
    return s_rest, s_menu


@template(domain="food", capabilities=["subagent", "tool_use"], apps=["food"], difficulty=4)
def food_compare_prices(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    dish_name = rng.choice(CUISINES[cuisine][1])[0]
    factors = rng.sample([0.85, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4], 3)
    trio = [fw.restaurant(cuisine, [dish_name], factor=f, min_order=0.0) for f in factors]
    for other in other_cuisines(rng, cuisine, k=2):
        fw.restaurant(other)
    fw.history(1)
    items = [fw.dish(r, dish_name) for r in trio]
    cheapest = min(range(3), key=lambda i: items[i]["price"])
    qty = rng.randint(1, 3)
    address, card = fw.address(), rng.choice(fw.cards)
    names = [r["name"] for r in trio]
    instruction = (
        f"Check what {dish_name} costs at {names[0]}, {names[1]} and {names[2]}, then order {qty} "
        f"from whichever is cheapest to {_addr_phrase(address)} with my {card['label']}. Tell me "
        f"which place you picked."
    )
    plan = PlanBuilder()
    scouts = [_scout(plan, k, r, items[k]) for k, r in enumerate(trio)]
    s_rest, s_menu = scouts[cheapest]
    s_cart = _cart_with(plan, s_rest, s_menu, qty)
    _checkout(plan, s_cart, address, card)
    winner = trio[cheapest]
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="ordered at the cheapest of the three",
                target="food.orders",
                where={
                    "restaurant_id": winner["id"],
                    "item_ids": [items[cheapest]["id"]],
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                    "status": "placed",
                },
            ),
            _placed_check(),
        ],
        answer=winner["name"],
        plan=plan.finish(answer=f"{winner['name']} (${items[cheapest]['price']:.2f} each)"),
        confirmations=["food_checkout"],
    )


@template(domain="food", capabilities=["subagent", "memory"], apps=["food"], difficulty=4)
def food_usual_dish_cheapest(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    right_dish, wrong_dish = rng.sample([d[0] for d in CUISINES[cuisine][1]], 2)
    # prices: the cheapest place for the usual dish differs from the cheapest for the decoy
    right_prices = rng.sample([9.49, 10.99, 11.49, 12.99, 13.49, 14.99], 3)
    order = sorted(range(3), key=lambda i: right_prices[i])
    wrong_prices = [0.0, 0.0, 0.0]
    for rank, i in enumerate([order[1], order[0], order[2]]):
        wrong_prices[i] = [8.99, 11.99, 15.49][rank]
    trio = [
        fw.restaurant(
            cuisine,
            [right_dish, wrong_dish],
            min_order=0.0,
            prices={right_dish: right_prices[i], wrong_dish: wrong_prices[i]},
        )
        for i in range(3)
    ]
    fw.restaurant(rng.choice(other_cuisines(rng, cuisine, k=1)))
    cheapest = order[0]
    qty = rng.randint(1, 2)
    address, card = fw.address(), rng.choice(fw.cards)
    names = [r["name"] for r in trio]
    extra = "" if qty == 1 else " (two portions)"
    instruction = (
        f"Order my usual dish{extra} from whichever of {names[0]}, {names[1]} or {names[2]} sells "
        f"it for the least; deliver it to {_addr_phrase(address)} and pay with my {card['label']}."
    )
    memory = [
        *remembered(rng, "usual_dish", right_dish, wrong_dish, source="food orders"),
        MemoryItem(key="usual_cuisine", value=cuisine, evidence="observed"),
    ]
    plan = PlanBuilder()
    scouts = [_scout(plan, k, r, fw.dish(r, right_dish)) for k, r in enumerate(trio)]
    s_rest, s_menu = scouts[cheapest]
    s_cart = _cart_with(plan, s_rest, s_menu, qty)
    _checkout(plan, s_cart, address, card)
    winner = trio[cheapest]
    item = fw.dish(winner, right_dish)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="usual dish from the cheapest place",
                target="food.orders",
                where={
                    "restaurant_id": winner["id"],
                    "item_ids": [item["id"]],
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                    "status": "placed",
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(answer=f"Ordered {right_dish} from {winner['name']}."),
        memory=memory,
        confirmations=["food_checkout"],
    )


CANCEL_REASONS = {
    "too_late": ["it's taking forever", "it's way too late now", "I can't wait any longer"],
    "ordered_by_mistake": ["I ordered it by mistake", "I tapped order by accident"],
    "wrong_address": ["it's going to the wrong address", "I picked the wrong address"],
    "changed_mind": ["I changed my mind", "we're eating out instead"],
}


@template(domain="food", capabilities=["tool_use"], apps=["food"], difficulty=2)
def food_cancel_pending_order(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    c1, c2, c3 = rng.sample(list(CUISINES), 3)
    target, courier_side = fw.restaurant(c1), fw.restaurant(c2)
    fw.restaurant(c3)
    old = FOOD_NOW - timedelta(days=rng.randint(2, 15))
    fw.order(
        target,
        [(rng.choice(fw.dishes(target)), 1)],
        status="delivered",
        placed=old,
        delivered=old + timedelta(minutes=40),
    )
    fw.order(
        courier_side,
        [(rng.choice(fw.dishes(courier_side)), 2)],
        status="out_for_delivery",
        placed=FOOD_NOW - timedelta(minutes=rng.choice([25, 35, 45])),
    )
    menu = fw.dishes(target)
    lines = [(m, rng.randint(1, 2)) for m in rng.sample(menu, rng.randint(1, 2))]
    order = fw.order(
        target,
        lines,
        status=rng.choice(["placed", "preparing"]),
        placed=FOOD_NOW - timedelta(minutes=rng.choice([10, 15, 20])),
    )
    fw.history(1)
    reason = rng.choice(list(CANCEL_REASONS))
    phrase = rng.choice(CANCEL_REASONS[reason])
    instruction = f"Cancel my current {target['name']} order — {phrase}. How much will I get back?"
    plan = PlanBuilder()
    s_rest = plan.call("food_search_restaurants", query=target["name"])
    s_orders = plan.call("food_list_orders", restaurant_id=ref(s_rest, "0.id"))
    plan.call("food_cancel_order", order_id=ref(s_orders, "0.id"), reason=reason)
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="the pending order is cancelled with the reason",
                target="food.orders",
                where={"id": order["id"], "status": "cancelled", "cancel_reason": reason},
            ),
            Check(
                name="nothing else cancelled",
                target="food.orders",
                op="count",
                where={"status": "cancelled"},
                expect=1,
            ),
        ],
        answer=f"{order['total']:.2f}",
        answer_match="number",
        plan=plan.finish(answer=f"Cancelled; ${order['total']:.2f} goes back to your card."),
    )


RATING_COMMENTS = [
    "Hot and fresh, great as always.",
    "Tasty but the portion was small.",
    "Arrived quickly, thanks!",
    "A bit cold this time.",
    "Perfect, will order again.",
    "Good food, packaging could be better.",
]


@template(domain="food", capabilities=["tool_use"], apps=["food"], difficulty=3)
def food_rate_and_reorder(g: TaskGen) -> Task:
    rng = g.rng
    fw = FoodWorld(g)
    cuisine = rng.choice(list(CUISINES))
    target = fw.restaurant(cuisine, n_dishes=5, min_order=0.0)
    fw.restaurant(rng.choice(other_cuisines(rng, cuisine, k=1)))
    menu = fw.dishes(target)
    picked = rng.sample(menu, 3)
    old = FOOD_NOW - timedelta(days=rng.randint(10, 30))
    fw.order(
        target,
        [(picked[0], 1)],
        status="delivered",
        placed=old,
        delivered=old + timedelta(minutes=40),
    )
    placed = FOOD_NOW - timedelta(days=rng.randint(1, 5), hours=rng.randint(0, 4))
    lines = [(m, rng.randint(1, 2)) for m in picked]
    last = fw.order(
        target, lines, status="delivered", placed=placed, delivered=placed + timedelta(minutes=35)
    )
    gone = rng.random() < 0.5
    if gone:
        picked[2]["available"] = False
    still = [m["id"] for m in picked if m["available"]]
    again = [_line(m, q) for m, q in lines if m["available"]]
    stars = rng.randint(1, 5)
    comment = rng.choice(RATING_COMMENTS)
    address, card = fw.address(), rng.choice(fw.cards)
    instruction = (
        f"Give my last {target['name']} order {stars} star{'s' if stars > 1 else ''} with the "
        f'comment "{comment}", then order the same thing again to {_addr_phrase(address)} with my '
        f"{card['label']}."
    )
    plan = PlanBuilder()
    s_rest = plan.call("food_search_restaurants", query=target["name"])
    s_orders = plan.call("food_list_orders", restaurant_id=ref(s_rest, "0.id"), status="delivered")
    plan.call("food_rate_order", order_id=ref(s_orders, "0.id"), rating=stars, comment=comment)
    s_re = plan.call("food_reorder", order_id=ref(s_orders, "0.id"))
    plan.call(
        "food_checkout",
        cart_id=ref(s_re, "cart.id"),
        address_id=address["id"],
        payment_method_id=card["id"],
    )
    return g.task(
        instruction=instruction,
        world=fw.world(),
        checks=[
            Check(
                name="last order rated",
                target="food.orders",
                where={"id": last["id"], "rating": stars, "review": comment},
            ),
            Check(
                name="same dishes ordered again",
                target="food.orders",
                where={
                    "restaurant_id": target["id"],
                    "item_ids": still,
                    "lines": again,
                    "status": "placed",
                    "payment_method_id": card["id"],
                    "address_id": address["id"],
                },
            ),
            _placed_check(),
        ],
        plan=plan.finish(),
        confirmations=["food_checkout"],
    )
