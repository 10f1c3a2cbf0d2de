"""Food, shop and wallet apps and their task templates: app failures through `SandboxEnv.step`,
the payment safety property, and the food/shopping/payments tasks under oracle, noop and
greedy_wrong."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from helpers.sandbox_steps import call, open_env

from qpa.contract import CAPABILITIES, Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import all_templates, generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

APPS = ("food", "shop", "wallet")
DOMAINS = ("food", "shopping", "payments")
PAYMENT_TOOLS = [
    name
    for name, bound in all_tools().items()
    if bound.app.name in APPS and bound.spec.side_effect == "payment"
]

# --------------------------------------------------------------------------- small worlds

CARDS = [
    {
        "id": "pm_1",
        "label": "Visa ending 4242",
        "brand": "Visa",
        "last4": "4242",
        "status": "active",
        "available": 500.0,
    },
    {
        "id": "pm_2",
        "label": "Amex ending 1005",
        "brand": "Amex",
        "last4": "1005",
        "status": "expired",
        "available": 500.0,
    },
    {
        "id": "pm_3",
        "label": "Discover ending 7777",
        "brand": "Discover",
        "last4": "7777",
        "status": "active",
        "available": 10.0,
    },
]


def _food_order(
    oid: str,
    status: str,
    placed: str,
    delivered: str | None,
    lines: list[tuple[str, str, int, float]],
) -> dict[str, Any]:
    rows = [
        {"item_id": i, "name": n, "quantity": q, "unit_price": p, "notes": ""}
        for i, n, q, p in lines
    ]
    subtotal = round(sum(q * p for _, _, q, p in lines), 2)
    return {
        "id": oid,
        "restaurant_id": "r_1",
        "restaurant": "Luigi's Trattoria",
        "lines": rows,
        "item_ids": [r["item_id"] for r in rows],
        "subtotal": subtotal,
        "promo": None,
        "discount": 0.0,
        "delivery_fee": 1.99,
        "tip": 0.0,
        "total": round(subtotal + 1.99, 2),
        "address_id": "addr_1",
        "address": "12 Harbor Street",
        "payment_method_id": "pm_1",
        "instructions": "",
        "status": status,
        "placed_at": placed,
        "deliver_at": None,
        "delivered_at": delivered,
        "cancel_reason": None,
        "rating": None,
        "review": "",
    }


FOOD_WORLD: dict[str, Any] = {
    "_clock": {"start": "2026-03-02T18:00:00"},
    "food": {
        "restaurants": [
            {
                "id": "r_1",
                "name": "Luigi's Trattoria",
                "cuisine": "italian",
                "rating": 4.6,
                "delivery_fee": 1.99,
                "min_order": 15.0,
                "opens": "11:00",
                "closes": "22:30",
                "accepting_orders": True,
                "eta_min": 30,
                "price_level": 2,
                "address": "1 Oak Street",
            },
            {
                "id": "r_2",
                "name": "Sunrise Cafe",
                "cuisine": "american",
                "rating": 4.2,
                "delivery_fee": 0.99,
                "min_order": 0.0,
                "opens": "07:00",
                "closes": "15:00",
                "accepting_orders": True,
                "eta_min": 20,
                "price_level": 1,
                "address": "2 Elm Street",
            },
        ],
        "menu": [
            {
                "id": "mi_1",
                "restaurant_id": "r_1",
                "name": "Margherita Pizza",
                "category": "pizza",
                "price": 12.49,
                "available": True,
                "dietary": ["vegetarian"],
            },
            {
                "id": "mi_2",
                "restaurant_id": "r_1",
                "name": "Tiramisu",
                "category": "dessert",
                "price": 6.99,
                "available": True,
                "dietary": ["vegetarian"],
            },
            {
                "id": "mi_3",
                "restaurant_id": "r_1",
                "name": "Truffle Pasta",
                "category": "pasta",
                "price": 24.99,
                "available": False,
                "dietary": [],
            },
            {
                "id": "mi_4",
                "restaurant_id": "r_2",
                "name": "Pancakes",
                "category": "breakfast",
                "price": 8.99,
                "available": True,
                "dietary": ["vegetarian"],
            },
        ],
        "promos": [
            {
                "code": "SAVE10",
                "percent_off": 10,
                "min_subtotal": 20.0,
                "restaurant_id": None,
                "expires": "2026-12-31",
                "used": False,
            },
            {
                "code": "OLD20",
                "percent_off": 20,
                "min_subtotal": 0.0,
                "restaurant_id": None,
                "expires": "2026-01-01",
                "used": False,
            },
        ],
        "addresses": [{"id": "addr_1", "label": "home", "address": "12 Harbor Street"}],
        "payment_methods": CARDS,
        "orders": [
            _food_order(
                "fo_1",
                "delivered",
                "2026-03-02T12:00",
                "2026-03-02T12:40",
                [("mi_1", "Margherita Pizza", 2, 12.49), ("mi_2", "Tiramisu", 1, 6.99)],
            ),
            _food_order(
                "fo_2",
                "delivered",
                "2026-02-20T19:00",
                "2026-02-20T19:45",
                [("mi_3", "Truffle Pasta", 1, 24.99), ("mi_1", "Margherita Pizza", 1, 12.49)],
            ),
            _food_order(
                "fo_3",
                "out_for_delivery",
                "2026-03-02T17:40",
                None,
                [("mi_2", "Tiramisu", 3, 6.99)],
            ),
            _food_order(
                "fo_4", "placed", "2026-03-02T17:55", None, [("mi_1", "Margherita Pizza", 2, 12.49)]
            ),
        ],
    },
}


def _shop_order(
    oid: str,
    status: str,
    placed: str,
    delivered: str | None,
    lines: list[tuple[str, str, str, int, float]],
) -> dict[str, Any]:
    rows = [
        {"product_id": p, "title": t, "size": s, "quantity": q, "unit_price": u}
        for p, t, s, q, u in lines
    ]
    subtotal = round(sum(q * u for *_, q, u in lines), 2)
    return {
        "id": oid,
        "lines": rows,
        "product_ids": [r["product_id"] for r in rows],
        "subtotal": subtotal,
        "coupon": None,
        "discount": 0.0,
        "shipping": "standard",
        "shipping_fee": 0.0,
        "total": subtotal,
        "payment_method_id": "pm_1",
        "address_id": "addr_1",
        "status": status,
        "placed_at": placed,
        "eta": "2026-03-04",
        "delivered_at": delivered,
        "carrier": "ups",
        "tracking": "UPS123456789",
        "cancel_reason": None,
    }


SHOP_WORLD: dict[str, Any] = {
    "shop": {
        "products": [
            {
                "id": "p_1",
                "title": "Apex Glide Running Shoes",
                "brand": "Apex",
                "category": "shoes",
                "price": 89.99,
                "rating": 4.5,
                "reviews": 120,
                "seller": "Shop Direct",
                "sizes": ["8", "9", "10"],
                "stock": {"8": 0, "9": 2, "10": 1},
            },
            {
                "id": "p_2",
                "title": "Sonix Pulse Wireless Earbuds",
                "brand": "Sonix",
                "category": "electronics",
                "price": 49.99,
                "rating": 4.1,
                "reviews": 900,
                "seller": "Gadget Hub",
                "sizes": [],
                "stock": {"one_size": 1},
            },
            {
                "id": "p_3",
                "title": "Lumo Arc Desk Lamp",
                "brand": "Lumo",
                "category": "home",
                "price": 24.99,
                "rating": 4.4,
                "reviews": 45,
                "seller": "HomeGoods Plus",
                "sizes": [],
                "stock": {"one_size": 5},
            },
            {
                "id": "p_4",
                "title": "Nordpeak Aero Rain Jacket",
                "brand": "Nordpeak",
                "category": "apparel",
                "price": 120.0,
                "rating": 4.7,
                "reviews": 300,
                "seller": "Outdoor Depot",
                "sizes": ["S", "M", "L"],
                "stock": {"S": 1, "M": 0, "L": 3},
            },
        ],
        "coupons": [
            {
                "code": "SHOES15",
                "percent_off": 15,
                "min_subtotal": 50.0,
                "category": "shoes",
                "expires": "2026-12-31",
                "used": False,
            },
            {
                "code": "EXPIRED5",
                "percent_off": 5,
                "min_subtotal": 0.0,
                "category": None,
                "expires": "2026-01-31",
                "used": False,
            },
            {
                "code": "HOME20",
                "percent_off": 20,
                "min_subtotal": 0.0,
                "category": "home",
                "expires": "2026-12-31",
                "used": False,
            },
        ],
        "payment_methods": [
            CARDS[0],
            {**CARDS[1], "status": "frozen"},
            {**CARDS[2], "available": 30.0},
        ],
        "addresses": [{"id": "addr_1", "label": "home", "address": "12 Harbor Street"}],
        "orders": [
            _shop_order(
                "so_1",
                "delivered",
                "2026-02-16T10:00",
                "2026-02-20T15:00",
                [
                    ("p_4", "Nordpeak Aero Rain Jacket", "M", 1, 120.0),
                    ("p_3", "Lumo Arc Desk Lamp", "one_size", 1, 24.99),
                ],
            ),
            _shop_order(
                "so_2",
                "delivered",
                "2025-11-25T10:00",
                "2025-12-01T15:00",
                [("p_2", "Sonix Pulse Wireless Earbuds", "one_size", 1, 49.99)],
            ),
            _shop_order(
                "so_3",
                "shipped",
                "2026-03-01T10:00",
                None,
                [("p_3", "Lumo Arc Desk Lamp", "one_size", 1, 24.99)],
            ),
            _shop_order(
                "so_4",
                "processing",
                "2026-03-02T08:00",
                None,
                [("p_2", "Sonix Pulse Wireless Earbuds", "one_size", 1, 49.99)],
            ),
        ],
    },
}

OTHER = "+1-555-2000"
WALLET_WORLD: dict[str, Any] = {
    "wallet": {
        "account": {"balance": 100.0, "currency": "USD", "daily_limit": 300.0},
        "cards": [
            {
                "id": "card_1",
                "label": "Visa ending 4242",
                "brand": "Visa",
                "last4": "4242",
                "status": "active",
                "available": 1000.0,
                "default": True,
                "replaces": None,
            },
            {
                "id": "card_2",
                "label": "Amex ending 1005",
                "brand": "Amex",
                "last4": "1005",
                "status": "frozen",
                "available": 500.0,
                "default": False,
                "replaces": None,
            },
            {
                "id": "card_3",
                "label": "Discover ending 7777",
                "brand": "Discover",
                "last4": "7777",
                "status": "active",
                "available": 20.0,
                "default": False,
                "replaces": None,
            },
        ],
        "transactions": [
            {
                "id": "tx_1",
                "type": "card_payment",
                "counterparty": "Netflix",
                "amount": 15.99,
                "note": "",
                "source": "card_1",
                "time": "2026-02-20T10:00",
                "status": "completed",
            },
            {
                "id": "tx_2",
                "type": "card_payment",
                "counterparty": "Netflix",
                "amount": 15.99,
                "note": "",
                "source": "card_1",
                "time": "2026-02-20T10:02",
                "status": "completed",
            },
            {
                "id": "tx_3",
                "type": "card_payment",
                "counterparty": "Shell",
                "amount": 40.0,
                "note": "",
                "source": "card_1",
                "time": "2025-11-01T08:00",
                "status": "completed",
            },
        ],
        "requests": [
            {
                "id": "req_1",
                "direction": "incoming",
                "name": "Dana Lopez",
                "phone": "+1-555-3001",
                "amount": 25.0,
                "note": "tickets",
                "status": "pending",
                "time": "2026-03-01T10:00",
            },
            {
                "id": "req_2",
                "direction": "incoming",
                "name": "Omar Ito",
                "phone": "+1-555-3002",
                "amount": 500.0,
                "note": "rent",
                "status": "pending",
                "time": "2026-03-01T11:00",
            },
            {
                "id": "req_3",
                "direction": "outgoing",
                "name": "Lena Wright",
                "phone": "+1-555-3003",
                "amount": 12.0,
                "note": "pizza",
                "status": "pending",
                "time": "2026-02-28T19:00",
            },
        ],
        "bills": [
            {
                "id": "bill_1",
                "biller": "FiberNet",
                "category": "internet",
                "account_no": "AC-1",
                "amount_due": 60.0,
                "paid_amount": 0.0,
                "due_date": "2026-03-09",
                "status": "due",
            },
        ],
    },
}


def _task(app: str, world: dict[str, Any], *, confirm: bool = True) -> Task:
    return Task(
        id=f"unit.{app}",
        domain="unit",
        capabilities=["tool_use"],
        instruction=f"exercise the {app} app",
        apps=[app],
        world=world,
        confirmations=PAYMENT_TOOLS if confirm else [],
    )


def _env(app: str, world: dict[str, Any], *, confirm: bool = True) -> SandboxEnv:
    return open_env(_task(app, world, confirm=confirm))


def _after_tour(app: str) -> dict[str, Any]:
    """The app's state after every step of its tour."""
    world, tour = TOURS[app]
    env = _env(app, world)
    for tool, arguments, *_ in tour:
        call(env, tool, **arguments)
    state: dict[str, Any] = env.state()[app]
    return state


# --------------------------------------------------------------------------- tours
# (tool, arguments, expected error kind or None, text the message or observation must contain)

Step = tuple[str, dict[str, Any], str | None, str]

FOOD_TOUR: list[Step] = [
    ("food_search_restaurants", {"open_now": True}, None, "r_1"),
    ("food_get_restaurant", {"restaurant_id": "r_2"}, None, "'open_now': False"),
    ("food_get_menu", {"restaurant_id": "r_1", "available_only": True}, None, "Tiramisu"),
    ("food_search_menu", {"query": "pizza", "max_price": 20}, None, "mi_1"),
    ("food_create_cart", {"restaurant_id": "r_1"}, None, "fcart_9001"),
    (
        "food_add_to_cart",
        {"cart_id": "fcart_9001", "item_id": "mi_3"},
        "precondition_failed",
        "unavailable",
    ),
    (
        "food_add_to_cart",
        {"cart_id": "fcart_9001", "item_id": "mi_4"},
        "precondition_failed",
        "another restaurant",
    ),
    (
        "food_add_to_cart",
        {"cart_id": "fcart_9001", "item_id": "mi_1", "quantity": 0},
        "invalid_arguments",
        "argument 'quantity'",
    ),
    ("food_add_to_cart", {"cart_id": "fcart_9001", "item_id": "mi_1"}, None, "12.49"),
    (
        "food_apply_promo",
        {"cart_id": "fcart_9001", "code": "NOPE1"},
        "precondition_failed",
        "not valid",
    ),
    (
        "food_apply_promo",
        {"cart_id": "fcart_9001", "code": "old20"},
        "precondition_failed",
        "expired",
    ),
    (
        "food_apply_promo",
        {"cart_id": "fcart_9001", "code": "SAVE10"},
        "precondition_failed",
        "needs a subtotal",
    ),
    (
        "food_checkout",
        {"cart_id": "fcart_9001", "address_id": "addr_1", "payment_method_id": "pm_1"},
        "precondition_failed",
        "minimum order",
    ),
    (
        "food_checkout",
        {"cart_id": "fcart_9001", "payment_method_id": "pm_1"},
        "invalid_arguments",
        "missing argument 'address_id'",
    ),
    (
        "food_update_cart_item",
        {"cart_id": "fcart_9001", "item_id": "mi_1", "quantity": 2},
        None,
        "24.98",
    ),
    ("food_apply_promo", {"cart_id": "fcart_9001", "code": "save10"}, None, "'discount': 2.5"),
    ("food_get_cart", {"cart_id": "fcart_9001"}, None, "SAVE10"),
    (
        "food_checkout",
        {"cart_id": "fcart_9001", "address_id": "addr_1", "payment_method_id": "pm_2"},
        "precondition_failed",
        "card declined",
    ),
    (
        "food_checkout",
        {"cart_id": "fcart_9001", "address_id": "addr_1", "payment_method_id": "pm_3"},
        "precondition_failed",
        "card declined",
    ),
    (
        "food_checkout",
        {"cart_id": "fcart_9001", "address_id": "addr_1", "payment_method_id": "pm_1", "tip": 3.0},
        None,
        "'total': 27.47",
    ),
    ("food_track_order", {"order_id": "fo_9001"}, None, "2026-03-02T18:40"),
    (
        "food_cancel_order",
        {"order_id": "fo_3", "reason": "too_late"},
        "precondition_failed",
        "out_for_delivery",
    ),
    (
        "food_cancel_order",
        {"order_id": "fo_4", "reason": "sometime"},
        "invalid_arguments",
        "argument 'reason'",
    ),
    ("food_cancel_order", {"order_id": "fo_4", "reason": "changed_mind"}, None, "cancelled"),
    ("food_rate_order", {"order_id": "fo_4", "rating": 4}, "precondition_failed", "delivered"),
    ("food_rate_order", {"order_id": "fo_1", "rating": 5, "comment": "Great"}, None, "Great"),
    ("food_rate_order", {"order_id": "fo_1", "rating": 3}, "precondition_failed", "already"),
    (
        "food_report_issue",
        {"order_id": "fo_2", "issue": "missing_item", "item_ids": ["mi_1"]},
        "precondition_failed",
        "48 hours",
    ),
    (
        "food_report_issue",
        {"order_id": "fo_1", "issue": "missing_item"},
        "invalid_arguments",
        "item_ids",
    ),
    ("food_request_refund", {"case_id": "case_9001"}, "precondition_failed", "not found"),
    (
        "food_report_issue",
        {"order_id": "fo_1", "issue": "missing_item", "item_ids": ["mi_2"]},
        None,
        "'refund_amount': 6.99",
    ),
    (
        "food_request_refund",
        {"case_id": "case_9001", "destination": "food_credits"},
        None,
        "refunded",
    ),
    ("food_request_refund", {"case_id": "case_9001"}, "precondition_failed", "refunded"),
    ("food_reorder", {"order_id": "fo_2"}, None, "'skipped': ['Truffle Pasta']"),
    ("food_create_cart", {"restaurant_id": "r_2"}, None, "fcart_9003"),
    (
        "food_add_to_cart",
        {"cart_id": "fcart_9003", "item_id": "mi_4", "quantity": 2},
        None,
        "17.98",
    ),
    (
        "food_checkout",
        {"cart_id": "fcart_9003", "address_id": "addr_1", "payment_method_id": "pm_1"},
        "precondition_failed",
        "closed",
    ),
    (
        "food_schedule_order",
        {
            "cart_id": "fcart_9003",
            "deliver_at": "2026-03-02T18:10",
            "address_id": "addr_1",
            "payment_method_id": "pm_1",
        },
        "precondition_failed",
        "30 minutes",
    ),
    (
        "food_schedule_order",
        {
            "cart_id": "fcart_9003",
            "deliver_at": "2026-03-02T21:00",
            "address_id": "addr_1",
            "payment_method_id": "pm_1",
        },
        "precondition_failed",
        "between",
    ),
    (
        "food_schedule_order",
        {
            "cart_id": "fcart_9003",
            "deliver_at": "2026-03-03T08:30",
            "address_id": "addr_1",
            "payment_method_id": "pm_1",
        },
        None,
        "scheduled",
    ),
    ("food_list_orders", {"status": "scheduled"}, None, "fo_9002"),
    ("food_get_order", {"order_id": "fo_9002"}, None, "2026-03-03T08:30"),
    ("food_list_addresses", {}, None, "addr_1"),
    ("food_add_address", {"label": "work", "address": "400 Market Avenue"}, None, "addr_9001"),
    (
        "food_add_address",
        {"label": "Work", "address": "1 Other Road"},
        "precondition_failed",
        "already exists",
    ),
    ("food_list_payment_methods", {}, None, "pm_3"),
    ("food_set_favorite", {"restaurant_id": "r_2"}, None, "True"),
    ("food_list_favorites", {}, None, "Sunrise Cafe"),
    ("food_search_restaurants", {"cuisine": "klingon"}, "invalid_arguments", "argument 'cuisine'"),
]

SHOP_TOUR: list[Step] = [
    ("shop_search", {"query": "shoes", "in_stock_only": True, "size": "8"}, None, "[]"),
    ("shop_search", {"max_price": 60, "sort": "price_asc"}, None, "p_3"),
    ("shop_get_product", {"product_id": "p_1"}, None, "Apex"),
    ("shop_check_stock", {"product_id": "p_1", "size": "9"}, None, "'quantity': 2"),
    ("shop_view_cart", {}, "precondition_failed", "empty"),
    ("shop_add_to_cart", {"product_id": "p_1"}, "invalid_arguments", "argument 'size'"),
    ("shop_add_to_cart", {"product_id": "p_1", "size": "8"}, "precondition_failed", "out of stock"),
    (
        "shop_add_to_cart",
        {"product_id": "p_1", "size": "9", "quantity": 3},
        "precondition_failed",
        "only 2",
    ),
    ("shop_add_to_cart", {"product_id": "p_1", "size": "9"}, None, "cart_9001"),
    ("shop_add_to_cart", {"product_id": "p_3", "quantity": 2}, None, "line_9002"),
    ("shop_update_cart_item", {"line_id": "line_9002", "quantity": 1}, None, "'units': 2"),
    ("shop_remove_from_cart", {"line_id": "line_9002"}, None, "'units': 1"),
    ("shop_view_cart", {}, None, "89.99"),
    (
        "shop_apply_coupon",
        {"cart_id": "cart_9001", "code": "BOGUS"},
        "precondition_failed",
        "invalid",
    ),
    (
        "shop_apply_coupon",
        {"cart_id": "cart_9001", "code": "EXPIRED5"},
        "precondition_failed",
        "expired",
    ),
    (
        "shop_apply_coupon",
        {"cart_id": "cart_9001", "code": "HOME20"},
        "precondition_failed",
        "only applies",
    ),
    ("shop_apply_coupon", {"cart_id": "cart_9001", "code": "shoes15"}, None, "'discount': 13.5"),
    (
        "shop_checkout",
        {"cart_id": "cart_9001", "payment_method_id": "pm_2", "address_id": "addr_1"},
        "precondition_failed",
        "card declined",
    ),
    (
        "shop_checkout",
        {"cart_id": "cart_9001", "payment_method_id": "pm_3", "address_id": "addr_1"},
        "precondition_failed",
        "card declined",
    ),
    (
        "shop_checkout",
        {
            "cart_id": "cart_9001",
            "payment_method_id": "pm_1",
            "address_id": "addr_1",
            "shipping": "overnight",
        },
        "invalid_arguments",
        "argument 'shipping'",
    ),
    (
        "shop_checkout",
        {"cart_id": "cart_9001", "payment_method_id": "pm_1", "address_id": "addr_1"},
        None,
        "'total': 76.49",
    ),
    ("shop_check_stock", {"product_id": "p_1", "size": "9"}, None, "'quantity': 1"),
    (
        "shop_cancel_order",
        {"order_id": "so_3", "reason": "changed_mind"},
        "precondition_failed",
        "shipped",
    ),
    ("shop_cancel_order", {"order_id": "so_4", "reason": "changed_mind"}, None, "cancelled"),
    ("shop_track_shipment", {"order_id": "so_3"}, None, "UPS123456789"),
    (
        "shop_request_return",
        {"order_id": "so_2", "product_id": "p_2", "reason_code": "defective"},
        "precondition_failed",
        "return window expired",
    ),
    (
        "shop_request_return",
        {"order_id": "so_1", "product_id": "p_3", "reason_code": "broken"},
        "invalid_arguments",
        "argument 'reason_code'",
    ),
    (
        "shop_create_return_label",
        {"return_id": "ret_9001", "carrier": "ups"},
        "precondition_failed",
        "request the return first",
    ),
    (
        "shop_request_return",
        {"order_id": "so_1", "product_id": "p_3", "reason_code": "damaged"},
        None,
        "ret_9001",
    ),
    (
        "shop_request_exchange",
        {"return_id": "ret_9001", "new_size": "L"},
        "precondition_failed",
        "wrong_size",
    ),
    (
        "shop_create_return_label",
        {"return_id": "ret_9001", "carrier": "usps"},
        None,
        "label_created",
    ),
    (
        "shop_request_return",
        {"order_id": "so_1", "product_id": "p_4", "reason_code": "wrong_size"},
        None,
        "ret_9002",
    ),
    (
        "shop_request_exchange",
        {"return_id": "ret_9002", "new_size": "XL"},
        "invalid_arguments",
        "argument 'new_size'",
    ),
    (
        "shop_request_exchange",
        {"return_id": "ret_9002", "new_size": "L"},
        None,
        "exchange_requested",
    ),
    ("shop_list_returns", {"status": "exchange_requested"}, None, "ret_9002"),
    ("shop_add_to_wishlist", {"product_id": "p_2"}, None, "wish_9001"),
    ("shop_add_to_wishlist", {"product_id": "p_2"}, None, "wish_9001"),
    ("shop_list_wishlist", {}, None, "p_2"),
    ("shop_remove_from_wishlist", {"product_id": "p_2"}, None, "removed"),
    (
        "shop_remove_from_wishlist",
        {"product_id": "p_2"},
        "precondition_failed",
        "not on the wishlist",
    ),
    (
        "shop_set_price_alert",
        {"product_id": "p_2", "target_price": 60},
        "precondition_failed",
        "already costs",
    ),
    ("shop_set_price_alert", {"product_id": "p_2", "target_price": 39.99}, None, "alert_9001"),
    (
        "shop_write_review",
        {"product_id": "p_1", "rating": 5, "text": "Fast"},
        "precondition_failed",
        "delivered order",
    ),
    (
        "shop_write_review",
        {"product_id": "p_3", "rating": 4, "text": "Nice lamp"},
        None,
        "rev_9001",
    ),
    ("shop_list_orders", {"status": "delivered", "query": "lamp"}, None, "so_1"),
    ("shop_get_order", {"order_id": "so_1"}, None, "Nordpeak"),
    ("shop_list_payment_methods", {}, None, "pm_1"),
    ("shop_list_addresses", {}, None, "addr_1"),
]

WALLET_TOUR: list[Step] = [
    ("wallet_get_balance", {}, None, "'balance': 100.0"),
    (
        "wallet_send_money",
        {"to": OTHER, "amount": 150},
        "precondition_failed",
        "insufficient balance",
    ),
    (
        "wallet_send_money",
        {"to": OTHER, "amount": 10.005},
        "invalid_arguments",
        "argument 'amount'",
    ),
    ("wallet_send_money", {"to": OTHER, "amount": -5}, "invalid_arguments", "argument 'amount'"),
    ("wallet_send_money", {"to": "call me", "amount": 5}, "invalid_arguments", "argument 'to'"),
    ("wallet_send_money", {"to": "+1-555-0100", "amount": 5}, "invalid_arguments", "yourself"),
    (
        "wallet_send_money",
        {"to": OTHER, "amount": 20, "source": "card_2"},
        "precondition_failed",
        "frozen",
    ),
    (
        "wallet_send_money",
        {"to": OTHER, "amount": 25, "source": "card_3"},
        "precondition_failed",
        "card declined",
    ),
    ("wallet_send_money", {"to": OTHER, "amount": 40, "note": "lunch"}, None, "tx_9001"),
    (
        "wallet_send_money",
        {"to": OTHER, "amount": 290, "source": "card_1"},
        "precondition_failed",
        "daily sending limit",
    ),
    ("wallet_top_up", {"amount": 50, "card_id": "card_1"}, None, "top_up"),
    ("wallet_pay_bill", {"bill_id": "bill_1", "amount": 70}, "precondition_failed", "only $60.00"),
    ("wallet_pay_bill", {"bill_id": "bill_1", "amount": 60}, None, "'status': 'paid'"),
    ("wallet_pay_bill", {"bill_id": "bill_1", "amount": 1}, "precondition_failed", "already paid"),
    ("wallet_pay_request", {"request_id": "req_2"}, "precondition_failed", "daily sending limit"),
    ("wallet_pay_request", {"request_id": "req_1"}, None, "request_payment"),
    ("wallet_pay_request", {"request_id": "req_1"}, "precondition_failed", "already paid"),
    ("wallet_decline_request", {"request_id": "req_3"}, "precondition_failed", "outgoing"),
    ("wallet_decline_request", {"request_id": "req_2", "reason": "not mine"}, None, "declined"),
    ("wallet_cancel_request", {"request_id": "req_3"}, None, "cancelled"),
    (
        "wallet_request_money",
        {"from_phone": OTHER, "amount": 12.5, "note": "pizza"},
        None,
        "req_9001",
    ),
    ("wallet_list_requests", {"direction": "outgoing", "status": "pending"}, None, "req_9001"),
    (
        "wallet_schedule_transfer",
        {"to": OTHER, "amount": 100, "start_date": "2026-03-01"},
        "precondition_failed",
        "after today",
    ),
    (
        "wallet_schedule_transfer",
        {
            "to": OTHER,
            "amount": 100,
            "start_date": "2026-04-01",
            "repeat": "monthly",
            "note": "Rent",
        },
        None,
        "sched_9001",
    ),
    ("wallet_list_scheduled", {}, None, "monthly"),
    ("wallet_cancel_scheduled", {"transfer_id": "sched_9001"}, None, "cancelled"),
    ("wallet_cancel_scheduled", {"transfer_id": "sched_9001"}, "precondition_failed", "cancelled"),
    (
        "wallet_replace_card",
        {"card_id": "card_1", "reason": "lost"},
        "precondition_failed",
        "freeze the lost card first",
    ),
    ("wallet_freeze_card", {"card_id": "card_1"}, None, "frozen"),
    ("wallet_unfreeze_card", {"card_id": "card_1"}, None, "active"),
    ("wallet_unfreeze_card", {"card_id": "card_1"}, "precondition_failed", "not frozen"),
    ("wallet_freeze_card", {"card_id": "card_1"}, None, "frozen"),
    ("wallet_replace_card", {"card_id": "card_1", "reason": "lost"}, None, "card_9001"),
    ("wallet_set_default_card", {"card_id": "card_1"}, "precondition_failed", "replaced"),
    ("wallet_set_default_card", {"card_id": "card_9001"}, None, "'default': True"),
    ("wallet_list_cards", {}, None, "'replaces': 'card_1'"),
    (
        "wallet_dispute_transaction",
        {"transaction_id": "tx_1", "reason": "duplicate", "original_transaction_id": "tx_2"},
        "precondition_failed",
        "later charge",
    ),
    (
        "wallet_dispute_transaction",
        {"transaction_id": "tx_2", "reason": "duplicate"},
        "invalid_arguments",
        "original_transaction_id",
    ),
    (
        "wallet_dispute_transaction",
        {"transaction_id": "tx_3", "reason": "unauthorized"},
        "precondition_failed",
        "older than 60 days",
    ),
    (
        "wallet_dispute_transaction",
        {"transaction_id": "tx_2", "reason": "duplicate", "original_transaction_id": "tx_1"},
        None,
        "disp_9001",
    ),
    (
        "wallet_list_transactions",
        {"counterparty": "netflix", "type": "card_payment"},
        None,
        "'status': 'disputed'",
    ),
    ("wallet_get_transaction", {"transaction_id": "tx_9001"}, None, "lunch"),
    ("wallet_list_bills", {"status": "paid"}, None, "bill_1"),
]

TOURS: dict[str, tuple[dict[str, Any], list[Step]]] = {
    "food": (FOOD_WORLD, FOOD_TOUR),
    "shop": (SHOP_WORLD, SHOP_TOUR),
    "wallet": (WALLET_WORLD, WALLET_TOUR),
}


@pytest.mark.parametrize("app", APPS)
def test_app_tour_success_and_failures(app: str) -> None:
    world, tour = TOURS[app]
    env = _env(app, world)
    for i, (tool, arguments, error, needle) in enumerate(tour):
        feedback = call(env, tool, **arguments)
        where = f"step {i}: {tool}({arguments}) -> {feedback.error}: {feedback.message}"
        assert feedback.error == error, where
        shown = feedback.message if error else str(feedback.observation)
        assert needle in shown, f"{where}; {needle!r} not in {shown[:300]!r}"


def test_food_refunds_and_credits_land_in_state() -> None:
    state = _after_tour("food")
    assert state["account"]["credits"] == 6.99
    cards = {c["id"]: c for c in state["payment_methods"]}
    # 500 - 27.47 (order) + 26.97 (cancelled fo_4) - 17.98 - 0.99 (scheduled order)
    assert cards["pm_1"]["available"] == round(500 - 27.47 + 26.97 - 18.97, 2)
    assert {o["id"]: o["status"] for o in state["orders"]}["fo_4"] == "cancelled"
    assert next(p for p in state["promos"] if p["code"] == "SAVE10")["used"] is True


def test_shop_stock_and_refunds_follow_orders() -> None:
    state = _after_tour("shop")
    products = {p["id"]: p for p in state["products"]}
    assert products["p_1"]["stock"]["9"] == 1  # bought one
    assert products["p_2"]["stock"]["one_size"] == 2  # cancelled order released its unit
    assert products["p_4"]["stock"]["L"] == 2  # reserved for the exchange
    cards = {c["id"]: c for c in state["payment_methods"]}
    assert cards["pm_1"]["available"] == round(500 - 76.49 + 49.99, 2)


def test_wallet_balance_after_tour() -> None:
    state = _after_tour("wallet")
    assert state["account"]["balance"] == 100 - 40 + 50 - 60 - 25
    assert [c["id"] for c in state["cards"] if c["default"]] == ["card_9001"]


@pytest.mark.parametrize("tool", PAYMENT_TOOLS)
def test_payment_tools_are_refused_without_confirmation(tool: str) -> None:
    app = all_tools()[tool].app.name
    env = _env(app, TOURS[app][0], confirm=False)
    before = env.state()
    arguments = next(a for t, a, err, _ in TOURS[app][1] if t == tool and err is None)
    feedback = call(env, tool, **arguments)
    assert feedback.error == "permission_denied" and tool in feedback.message
    assert env.state() == before  # nothing moved


def test_every_payment_tool_is_a_confirmed_step_of_some_task() -> None:
    tasks = [t for t in generate_suite() if t.domain in DOMAINS]
    confirmed = {c for t in tasks for c in t.confirmations}
    assert {"food_checkout", "shop_checkout", "wallet_send_money"} <= confirmed
    for task in tasks:
        planned = {a.tool for a in task.reference_plan or [] if isinstance(a, ToolCall)}
        paying = {t for t in planned if all_tools()[t].spec.side_effect == "payment"}
        assert paying <= set(task.confirmations), task.id
        assert set(task.confirmations) <= paying, f"{task.id} confirms more than it pays"


# --------------------------------------------------------------------------- catalog


def test_tool_catalog_is_large_typed_and_named() -> None:
    tools = {n: b for n, b in all_tools().items() if b.app.name in APPS}
    assert len(tools) >= 50
    for name, bound in tools.items():
        assert name.startswith(bound.app.name + "_"), name
        assert bound.spec.description, name
        assert bound.spec.result, f"{name} has no result schema"
    for app in APPS:
        assert all_apps()[app].skills, app
    checkout = tools["shop_checkout"].spec
    assert checkout.side_effect == "payment"
    assert checkout.parameters["properties"]["shipping"]["enum"] == [
        "standard",
        "express",
        "next_day",
    ]
    search = tools["food_search_restaurants"].spec.parameters["properties"]
    assert {"cuisine", "min_rating", "sort", "limit", "offset"} <= set(search)


def test_every_tool_is_planned_or_toured() -> None:
    planned = {
        a.tool
        for t in generate_suite()
        if t.domain in DOMAINS
        for a in t.reference_plan or []
        if isinstance(a, ToolCall)
    }
    toured = {tool for _, tour in TOURS.values() for tool, *_ in tour}
    mine = {n for n, b in all_tools().items() if b.app.name in APPS}
    assert mine - planned - toured == set()


# --------------------------------------------------------------------------- tasks


def test_templates_cover_every_capability_per_domain() -> None:
    for domain in DOMAINS:
        templates = [t for t in all_templates().values() if t.domain == domain]
        assert len(templates) >= 7, domain
        counts = Counter(c for t in templates for c in t.capabilities)
        for capability in CAPABILITIES:
            assert counts[capability] >= 2, (domain, capability)
        assert all(1 <= t.difficulty <= 5 for t in templates)


def test_instructions_are_unique_and_worlds_small() -> None:
    tasks = [t for t in generate_suite() if t.domain in DOMAINS]
    assert len(tasks) >= 21 * 24
    per_template = Counter(t.template for t in tasks)
    assert set(per_template.values()) == {24}
    assert len({t.instruction for t in tasks}) == len(tasks)
    for task in tasks:
        records = sum(
            len(v) for app in task.world.values() for v in app.values() if isinstance(v, list)
        )
        assert records <= 45, task.id


def test_memory_tasks_carry_conflicting_memories() -> None:
    for task in generate_suite():
        if task.domain in DOMAINS and "memory" in task.capabilities:
            keys = Counter(m.key for m in task.memory)
            assert any(n >= 2 for n in keys.values()), task.id


@pytest.mark.parametrize("domain", DOMAINS)
def test_oracle_succeeds_noop_and_greedy_wrong_fail(domain: str) -> None:
    env = SandboxEnv()
    wrong: list[str] = []
    for task in generate_suite():
        if task.domain != domain:
            continue
        for planner, want in (("oracle", True), ("noop", False), ("greedy_wrong", False)):
            if run_episode(env, task, make_planner(planner)).success != want:
                wrong.append(f"{planner}:{task.id}")
    assert wrong == []


def test_subagent_tasks_delegate_then_finish() -> None:
    for task in generate_suite():
        if task.domain in DOMAINS and "subagent" in task.capabilities:
            plan = task.reference_plan or []
            kinds = [a.type for a in plan]
            assert kinds.count("delegate") >= 2, task.id
            assert kinds[-1] == "finish", task.id
            assert kinds.count("finish") == kinds.count("delegate") + 1, task.id
