"""Payments tasks: pay people found in contacts, bills with top-ups, bill splitting and card
emergencies (Skills), preferred card and rent from memory, debts read from texts by sub-agents."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from qpa.contract import Check, MemoryItem, Task
from qpa.envs.sandbox.apps.messaging import message_record
from qpa.envs.sandbox.authoring import PlanBuilder, card_pool, phone_book, ref, remembered
from qpa.envs.sandbox.engine import DEFAULT_START, money
from qpa.envs.sandbox.suite import TaskGen, template

WALLET_NOW = DEFAULT_START
TODAY = WALLET_NOW.isoformat(timespec="minutes")
MERCHANTS = [
    "Starbucks", "Whole Foods", "Shell", "Netflix", "Spotify", "Target", "Walgreens", "Chipotle",
    "Costco", "IKEA", "Best Buy", "Uber", "Lyft", "Apple Store", "Trader Joe's",
]  # fmt: skip
BILLERS = [
    ("City Power & Light", "electricity"),
    ("AquaFlow Water", "water"),
    ("FiberNet", "internet"),
    ("Metro Mobile", "phone"),
    ("GasCo Energy", "gas"),
    ("StreamMax Cable", "cable TV"),
]
REASONS = [
    "the concert tickets", "dinner last night", "the taxi home", "groceries", "the birthday gift",
    "the cabin booking", "coffee this week", "the movie tickets", "the parking fee", "the pizza",
]  # fmt: skip
MONTHS = {1: "January", 2: "February", 3: "March", 4: "April", 5: "May", 6: "June"}


def _amount(g: TaskGen, low: float, high: float) -> float:
    return round(g.rng.randint(int(low * 100), int(high * 100)) / 100, 2)


class WalletWorld:
    """Balance, cards, a little history, bills and requests."""

    def __init__(self, g: TaskGen, balance: float | None = None, n_cards: int = 3) -> None:
        self.g = g
        self.account = {
            "balance": balance if balance is not None else _amount(g, 300, 1500),
            "currency": "USD",
            "daily_limit": 2500.0,
        }
        self.cards = card_pool(g.rng, n_cards, prefix="card")
        for card in self.cards:
            card["default"] = False
            card["replaces"] = None
        g.rng.choice(self.cards)["default"] = True
        self.transactions: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.bills: list[dict[str, Any]] = []
        self.scheduled: list[dict[str, Any]] = []

    def tx(
        self,
        kind: str,
        counterparty: str,
        amount: float,
        when: datetime,
        source: str,
        note: str = "",
    ) -> dict[str, Any]:
        record = {
            "id": f"tx_{101 + len(self.transactions)}",
            "type": kind,
            "counterparty": counterparty,
            "amount": amount,
            "note": note,
            "source": source,
            "time": when.isoformat(timespec="minutes"),
            "status": "completed",
        }
        self.transactions.append(record)
        return record

    def history(self, n: int = 5) -> None:
        rng = self.g.rng
        for _ in range(n):
            when = WALLET_NOW - timedelta(days=rng.randint(1, 30), hours=rng.randint(0, 10))
            self.tx(
                "card_payment",
                rng.choice(MERCHANTS),
                _amount(self.g, 3, 120),
                when,
                rng.choice(self.cards)["id"],
            )

    def bill(self, biller: str, category: str, amount: float, due_in: int) -> dict[str, Any]:
        record = {
            "id": f"bill_{101 + len(self.bills)}",
            "biller": biller,
            "category": category,
            "account_no": f"AC-{self.g.rng.randint(100000, 999999)}",
            "amount_due": amount,
            "paid_amount": 0.0,
            "due_date": (WALLET_NOW + timedelta(days=due_in)).date().isoformat(),
            "status": "due",
        }
        self.bills.append(record)
        return record

    def request(
        self,
        person: dict[str, Any],
        amount: float,
        note: str,
        *,
        direction: str = "incoming",
        status: str = "pending",
        days_ago: int = 1,
    ) -> dict[str, Any]:
        record = {
            "id": f"req_{101 + len(self.requests)}",
            "direction": direction,
            "name": person["name"],
            "phone": person["phone"],
            "amount": amount,
            "note": note,
            "status": status,
            "time": (WALLET_NOW - timedelta(days=days_ago)).isoformat(timespec="minutes"),
        }
        self.requests.append(record)
        return record

    def world(self) -> dict[str, Any]:
        self.transactions.sort(key=lambda t: t["time"])
        return {
            "account": self.account,
            "cards": self.cards,
            "transactions": self.transactions,
            "requests": self.requests,
            "bills": self.bills,
            "scheduled": self.scheduled,
            "disputes": [],
        }


def _sent(n: int) -> Check:
    return Check(
        name=f"exactly {n} transfer(s) today",
        target="wallet.transactions",
        op="count",
        where={"type": "transfer_out", "time__gte": TODAY},
        expect=n,
    )


def _paid(name: str, person: dict[str, Any], amount: float, source: str, **where: Any) -> Check:
    """The user sent `amount` to `person` from `source` (the balance or a card id)."""
    return Check(
        name=name,
        target="wallet.transactions",
        where={
            "type": "transfer_out",
            "counterparty": person["phone"],
            "amount": amount,
            "source": source,
            **where,
        },
    )


def _thread(
    person: dict[str, Any], texts: list[tuple[str, datetime]], start: int
) -> list[dict[str, Any]]:
    return [
        message_record(f"m_{start + i}", person["phone"], text, when.isoformat(timespec="minutes"))
        for i, (text, when) in enumerate(texts)
    ]


# --------------------------------------------------------------------------- templates


@template(domain="payments", capabilities=["tool_use"], apps=["contacts", "wallet"], difficulty=2)
def payments_pay_back_contact(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 8)
    target = rng.choice(contacts)
    # a namesake: same first name, different person
    namesake = rng.choice([c for c in contacts if c is not target])
    taken = {c["name"] for c in contacts}
    first = target["name"].split()[0]
    namesake["name"] = next(
        name
        for name in (f"{first} {g.fake.name().split()[1]}" for _ in range(50))
        if name not in taken
    )
    ww = WalletWorld(g)
    ww.history(4)
    amount = _amount(g, 5, 250)
    reason = rng.choice(REASONS)
    ww.tx(
        "transfer_out",
        namesake["phone"],
        _amount(g, 5, 60),
        WALLET_NOW - timedelta(days=3),
        "balance",
        note="lunch",
    )
    instruction = rng.choice(
        [
            "Send {n} ${a:.2f} for {r} from my wallet balance.",
            "Pay {n} back ${a:.2f} for {r} — use my wallet balance.",
            "I owe {n} ${a:.2f} for {r}; send it from my balance.",
        ]
    ).format(n=target["name"], a=amount, r=reason)
    plan = PlanBuilder()
    s_c = plan.call("contacts_search", query=target["name"])
    plan.call(
        "wallet_send_money", to=ref(s_c, "0.phone"), amount=amount, note=reason, source="balance"
    )
    return g.task(
        instruction=instruction,
        world={"contacts": {"contacts": contacts}, "wallet": ww.world()},
        checks=[
            _paid(
                "paid the right person the right amount",
                target,
                amount,
                "balance",
                time__gte=TODAY,
            ),
            _sent(1),
        ],
        plan=plan.finish(),
        confirmations=["wallet_send_money"],
    )


@template(domain="payments", capabilities=["tool_use"], apps=["wallet"], difficulty=3)
def payments_bill_with_top_up(g: TaskGen) -> Task:
    rng = g.rng
    bills = rng.sample(BILLERS, 3)
    due = _amount(g, 45, 260)
    balance = round(due - _amount(g, 5, 40), 2)
    ww = WalletWorld(g, balance=balance)
    ww.history(3)
    target = ww.bill(*bills[0], amount=due, due_in=rng.randint(1, 9))
    for biller, category in bills[1:]:
        ww.bill(biller, category, _amount(g, 20, 150), due_in=rng.randint(3, 20))
    rng.shuffle(ww.bills)
    card = rng.choice(ww.cards)
    shortfall = money(due - balance)
    instruction = (
        f"Pay my {bills[0][1]} bill in full from my wallet balance. The balance won't cover it, so "
        f"first top up exactly the missing amount from my {card['label']}."
    )
    plan = PlanBuilder()
    plan.call("wallet_list_bills", status="due")
    plan.call("wallet_get_balance")
    plan.call("wallet_list_cards")
    plan.call("wallet_top_up", amount=shortfall, card_id=card["id"])
    plan.call("wallet_pay_bill", bill_id=target["id"], amount=due, source="balance")
    return g.task(
        instruction=instruction,
        world={"wallet": ww.world()},
        checks=[
            Check(
                name="bill paid in full",
                target="wallet.bills",
                where={"id": target["id"], "status": "paid", "paid_amount": due},
            ),
            Check(
                name="topped up exactly the shortfall from the card",
                target="wallet.transactions",
                where={"type": "top_up", "source": card["id"], "amount": shortfall},
            ),
            Check(
                name="no other bill paid",
                target="wallet.bills",
                op="count",
                where={"status": "due"},
                expect=2,
            ),
            Check(
                name="one top-up",
                target="wallet.transactions",
                op="count",
                where={"type": "top_up"},
                expect=1,
            ),
        ],
        plan=plan.finish(),
        confirmations=["wallet_top_up", "wallet_pay_bill"],
    )


SPLIT_THINGS = [
    "dinner at Nonna Rosa", "the cabin weekend", "the concert tickets", "the taxi to the airport",
    "groceries for the party", "the birthday cake", "the boat rental", "the escape room",
    "the museum tickets", "brunch on Sunday",
]  # fmt: skip


@template(
    domain="payments",
    capabilities=["skills", "tool_use"],
    apps=["contacts", "wallet"],
    difficulty=3,
)
def payments_split_bill(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 8)
    n = rng.randint(2, 4)
    friends = rng.sample(contacts, n)
    cents = rng.randint(3000, 40000)
    total = cents / 100
    share = (cents // (n + 1)) / 100
    thing = rng.choice(SPLIT_THINGS)
    ww = WalletWorld(g)
    ww.history(3)
    ww.request(
        rng.choice(contacts),
        _amount(g, 10, 40),
        "pizza",
        direction="outgoing",
        status="paid",
        days_ago=12,
    )
    names = ", ".join(f["name"] for f in friends[:-1]) + f" and {friends[-1]['name']}"
    instruction = (
        f"I paid ${total:.2f} for {thing}. Split it evenly between me, {names}, and request "
        f"their shares."
    )
    plan = PlanBuilder()
    lookups = [plan.call("contacts_search", query=f["name"]) for f in friends]
    for s in lookups:
        plan.call(
            "wallet_request_money",
            from_phone=ref(s, "0.phone"),
            amount=share,
            note=f"Split: {thing}",
        )
    return g.task(
        instruction=instruction,
        world={"contacts": {"contacts": contacts}, "wallet": ww.world()},
        checks=[
            *(
                Check(
                    name=f"requested {f['name']}'s share",
                    target="wallet.requests",
                    where={
                        "direction": "outgoing",
                        "phone": f["phone"],
                        "amount": share,
                        "status": "pending",
                    },
                )
                for f in friends
            ),
            Check(
                name="one request per friend",
                target="wallet.requests",
                op="count",
                where={"direction": "outgoing", "status": "pending"},
                expect=n,
            ),
            Check(
                name="no money sent",
                target="wallet.transactions",
                op="absent",
                where={"time__gte": TODAY},
            ),
        ],
        plan=plan.finish(),
    )


@template(domain="payments", capabilities=["skills"], apps=["wallet"], difficulty=3)
def payments_lost_card(g: TaskGen) -> Task:
    rng = g.rng
    ww = WalletWorld(g, n_cards=3)
    ww.history(4)
    card = rng.choice(ww.cards)
    how = rng.choice(["lost", "stolen"])
    phrase = {
        "lost": [
            "I lost my {c}",
            "I can't find my {c} anywhere",
            "I think I left my {c} in a taxi",
        ],
        "stolen": ["My {c} was stolen", "Someone stole my wallet with my {c}"],
    }[how]
    opener = rng.choice(phrase).format(c=card["label"])
    instruction = (
        f"{opener}. Make sure nobody can use it, get me a replacement, and make the new card my "
        f"default."
    )
    plan = PlanBuilder()
    plan.call("wallet_list_cards")
    plan.call("wallet_freeze_card", card_id=card["id"])
    s_new = plan.call("wallet_replace_card", card_id=card["id"], reason=how)
    plan.call("wallet_set_default_card", card_id=ref(s_new, "id"))
    return g.task(
        instruction=instruction,
        world={"wallet": ww.world()},
        checks=[
            Check(
                name="old card closed",
                target="wallet.cards",
                where={"id": card["id"], "status": "replaced"},
            ),
            Check(
                name="replacement is active and default",
                target="wallet.cards",
                where={"replaces": card["id"], "status": "active", "default": True},
            ),
            Check(
                name="a single default card",
                target="wallet.cards",
                op="count",
                where={"default": True},
                expect=1,
            ),
        ],
        plan=plan.finish(),
    )


@template(domain="payments", capabilities=["skills", "tool_use"], apps=["wallet"], difficulty=3)
def payments_dispute_duplicate(g: TaskGen) -> Task:
    rng = g.rng
    ww = WalletWorld(g)
    ww.history(5)
    merchant = rng.choice(MERCHANTS)
    card = rng.choice(ww.cards)
    amount = _amount(g, 4, 180)
    day = WALLET_NOW - timedelta(days=rng.randint(1, 20))
    first = day.replace(hour=rng.randint(8, 19), minute=rng.choice([5, 12, 20, 41]))
    original = ww.tx("card_payment", merchant, amount, first, card["id"])
    duplicate = ww.tx(
        "card_payment", merchant, amount, first + timedelta(minutes=rng.randint(1, 3)), card["id"]
    )
    ww.tx(
        "card_payment",
        merchant,
        round(amount + _amount(g, 1, 20), 2),
        first - timedelta(days=rng.randint(2, 6)),
        card["id"],
    )
    when = f"{MONTHS[day.month]} {day.day}"
    instruction = (
        f"{merchant} charged my {card['label']} twice for ${amount:.2f} on {when}. Get the "
        f"duplicate charge reversed."
    )
    plan = PlanBuilder()
    plan.call("wallet_list_transactions", counterparty=merchant, type="card_payment")
    plan.call(
        "wallet_dispute_transaction",
        transaction_id=duplicate["id"],
        reason="duplicate",
        original_transaction_id=original["id"],
    )
    return g.task(
        instruction=instruction,
        world={"wallet": ww.world()},
        checks=[
            Check(
                name="the later charge disputed as a duplicate",
                target="wallet.disputes",
                where={
                    "transaction_id": duplicate["id"],
                    "reason": "duplicate",
                    "original_transaction_id": original["id"],
                    "status": "open",
                },
            ),
            Check(name="one dispute only", target="wallet.disputes", op="count", expect=1),
            Check(
                name="original charge untouched",
                target="wallet.transactions",
                where={"id": original["id"], "status": "completed"},
            ),
        ],
        plan=plan.finish(),
    )


@template(
    domain="payments",
    capabilities=["memory", "tool_use"],
    apps=["contacts", "wallet"],
    difficulty=3,
)
def payments_preferred_card(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 8)
    target = rng.choice(contacts)
    ww = WalletWorld(g, n_cards=3)
    ww.history(4)
    card, wrong = rng.sample(ww.cards, 2)
    amount = _amount(g, 8, 300)
    reason = rng.choice(REASONS)
    memory = [
        *remembered(rng, "preferred_card", card["label"], wrong["label"], source="payments"),
        MemoryItem(key="default_note_style", value="short", evidence="inferred"),
    ]
    instruction = rng.choice(
        [
            "Pay {n} back ${a:.2f} for {r} — use the card I prefer.",
            "Send {n} ${a:.2f} for {r}, charged to my preferred card.",
        ]
    ).format(n=target["name"], a=amount, r=reason)
    plan = PlanBuilder()
    s_c = plan.call("contacts_search", query=target["name"])
    plan.call("wallet_list_cards")
    plan.call(
        "wallet_send_money", to=ref(s_c, "0.phone"), amount=amount, note=reason, source=card["id"]
    )
    return g.task(
        instruction=instruction,
        world={"contacts": {"contacts": contacts}, "wallet": ww.world()},
        checks=[
            _paid("paid from the preferred card", target, amount, card["id"]),
            _sent(1),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["wallet_send_money"],
    )


@template(domain="payments", capabilities=["memory"], apps=["contacts", "wallet"], difficulty=3)
def payments_usual_rent(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 8)
    landlord, old_landlord = rng.sample(contacts, 2)
    rent = float(rng.randint(90, 260) * 10)
    stale_rent = rent - rng.choice([50.0, 75.0, 100.0, 120.0])
    ww = WalletWorld(g, balance=_amount(g, rent + 100, rent + 2000))
    ww.history(3)
    ww.scheduled.append(
        {
            "id": "sched_101",
            "amount": 45.0,
            "note": "Gym",
            "to": rng.choice([c for c in contacts if c not in (landlord, old_landlord)])["phone"],
            "start_date": "2026-01-05",
            "repeat": "monthly",
            "source": "balance",
            "status": "active",
        }
    )
    month = rng.choice([3, 4, 5, 6])
    day = rng.randint(3 if month == 3 else 1, 28)
    start = f"2026-{month:02d}-{day:02d}"
    note = f"Rent - Apt {rng.randint(1, 40)}{rng.choice('ABCD')}"
    memory = [
        *remembered(rng, "landlord", landlord["name"], old_landlord["name"], source="contacts"),
        *remembered(rng, "monthly_rent", f"${rent:.2f}", f"${stale_rent:.2f}", source="payments"),
    ]
    instruction = (
        f"Set up my usual rent payment to my landlord, every month starting {MONTHS[month]} {day}, "
        f'with the note "{note}".'
    )
    plan = PlanBuilder()
    s_c = plan.call("contacts_search", query=landlord["name"])
    plan.call(
        "wallet_schedule_transfer",
        to=ref(s_c, "0.phone"),
        amount=rent,
        start_date=start,
        repeat="monthly",
        note=note,
    )
    return g.task(
        instruction=instruction,
        world={"contacts": {"contacts": contacts}, "wallet": ww.world()},
        checks=[
            Check(
                name="monthly rent to the current landlord",
                target="wallet.scheduled",
                where={
                    "to": landlord["phone"],
                    "amount": rent,
                    "start_date": start,
                    "repeat": "monthly",
                    "status": "active",
                },
            ),
            Check(name="one new schedule", target="wallet.scheduled", op="count", expect=2),
            Check(
                name="nothing sent now",
                target="wallet.transactions",
                op="absent",
                where={"time__gte": TODAY},
            ),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["wallet_schedule_transfer"],
    )


DEBT_TEXTS = [
    "Hey! Your share of {t} comes to ${a:.2f}.",
    "Hi, you owe me ${a:.2f} for {t} :)",
    "Reminder: ${a:.2f} for {t} whenever you can.",
]
CHATTER = [
    "See you Saturday!",
    "Did you get home ok?",
    "Thanks again for yesterday.",
    "Can you send me that photo?",
]


def _debt_world(
    g: TaskGen,
    creditors: list[dict[str, Any]],
    contacts: list[dict[str, Any]],
    amounts: list[float],
) -> list[dict[str, Any]]:
    """Texts: each creditor states an amount (after some chatter); others mention other sums."""
    rng = g.rng
    messages: list[dict[str, Any]] = []
    base = WALLET_NOW - timedelta(days=2)
    for person, amount in zip(creditors, amounts, strict=True):
        thing = rng.choice(REASONS)
        texts = [
            (rng.choice(CHATTER), base - timedelta(hours=rng.randint(5, 30))),
            (
                rng.choice(DEBT_TEXTS).format(t=thing, a=amount),
                base + timedelta(hours=rng.randint(1, 30)),
            ),
        ]
        messages += _thread(person, texts, 200 + len(messages))
    for person in contacts:
        if person not in creditors and rng.random() < 0.4:
            text = rng.choice(DEBT_TEXTS).format(t=rng.choice(REASONS), a=_amount(g, 5, 90))
            messages += _thread(person, [(text, base)], 200 + len(messages))
    messages.sort(key=lambda m: m["time"])
    return messages


def _debt_readers(
    plan: PlanBuilder,
    creditors: list[dict[str, Any]],
    amounts: list[float],
    goals: list[str],
    tools: list[str],
) -> list[int]:
    """One sub-agent per creditor reads their texts and reports the amount and phone number;
    returns the steps whose results hold each creditor's contact."""
    lookups = []
    for k, (person, amount, goal) in enumerate(zip(creditors, amounts, goals, strict=True)):
        plan.delegate(goal=goal, tools=tools, agent=f"reader_{k}")
        s_c = plan.call("contacts_search", query=person["name"])
        plan.call("messaging_read_thread", phone=ref(s_c, "0.phone"))
        plan.finish(answer=f"{person['name']} ({person['phone']}): ${amount:.2f}")
        lookups.append(s_c)
    return lookups


def _texts_world(
    contacts: list[dict[str, Any]], messages: list[dict[str, Any]], ww: WalletWorld
) -> dict[str, dict[str, Any]]:
    return {
        "contacts": {"contacts": contacts},
        "messaging": {"messages": messages, "blocked": []},
        "wallet": ww.world(),
    }


@template(
    domain="payments",
    capabilities=["subagent", "tool_use"],
    apps=["contacts", "messaging", "wallet"],
    difficulty=4,
)
def payments_settle_debts(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 9)
    creditors = rng.sample(contacts, 3)
    amounts = [_amount(g, 6, 120) for _ in creditors]
    messages = _debt_world(g, creditors, contacts, amounts)
    ww = WalletWorld(g, balance=_amount(g, 400, 1500))
    ww.history(3)
    names = [c["name"] for c in creditors]
    instruction = (
        f"{names[0]}, {names[1]} and {names[2]} each texted me what I owe them. Find the amounts "
        f"and pay each of them back from my wallet balance."
    )
    plan = PlanBuilder()
    goals = [
        f"Find how much I owe {person['name']} according to their texts; answer with the amount "
        f"and their phone number."
        for person in creditors
    ]
    tools = ["contacts_search", "messaging_read_thread", "messaging_search"]
    lookups = _debt_readers(plan, creditors, amounts, goals, tools)
    for s_c, amount in zip(lookups, amounts, strict=True):
        plan.call(
            "wallet_send_money", to=ref(s_c, "0.phone"), amount=amount, note="Paying you back"
        )
    return g.task(
        instruction=instruction,
        world=_texts_world(contacts, messages, ww),
        checks=[
            *(
                _paid(f"paid {p['name']}", p, a, "balance")
                for p, a in zip(creditors, amounts, strict=True)
            ),
            _sent(3),
        ],
        plan=plan.finish(),
        confirmations=["wallet_send_money"],
    )


ROLES = ["babysitter", "dog walker", "cleaner", "piano teacher", "math tutor", "gardener"]


@template(
    domain="payments",
    capabilities=["subagent", "memory"],
    apps=["contacts", "messaging", "wallet"],
    difficulty=5,
)
def payments_pay_helpers(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 10)
    roles = rng.sample(ROLES, 2)
    right = rng.sample(contacts, 2)
    wrong = rng.sample([c for c in contacts if c not in right], 2)
    amounts = [_amount(g, 20, 160) for _ in roles]
    # the stale helpers also texted amounts: paying them is the trap
    messages = _debt_world(
        g, [*right, *wrong], contacts, [*amounts, *(_amount(g, 20, 160) for _ in wrong)]
    )
    ww = WalletWorld(g, balance=_amount(g, 400, 1500))
    ww.history(2)
    memory = [
        item
        for role, r, w in zip(roles, right, wrong, strict=True)
        for item in remembered(rng, role.replace(" ", "_"), r["name"], w["name"], source="contacts")
    ]
    use_card = rng.random() < 0.5
    card = rng.choice(ww.cards)
    source = card["id"] if use_card else "balance"
    paid_with = f"my {card['label']}" if use_card else "my wallet balance"
    period = rng.choice(["this week", "last week", "the past two weeks", "this month"])
    instruction = (
        f"My {roles[0]} and my {roles[1]} both texted me what I owe them for {period}. Pay them "
        f"both from {paid_with}."
    )
    plan = PlanBuilder()
    goals = [
        f"My {role} is {person['name']}: find how much I owe them from their texts; answer with "
        f"the amount and phone number."
        for role, person in zip(roles, right, strict=True)
    ]
    lookups = _debt_readers(
        plan, right, amounts, goals, ["contacts_search", "messaging_read_thread"]
    )
    if use_card:
        plan.call("wallet_list_cards")
    for s_c, amount in zip(lookups, amounts, strict=True):
        plan.call(
            "wallet_send_money",
            to=ref(s_c, "0.phone"),
            amount=amount,
            note="Thank you!",
            source=source,
        )
    return g.task(
        instruction=instruction,
        world=_texts_world(contacts, messages, ww),
        checks=[
            *(
                _paid(f"paid the {role}", p, a, source)
                for role, p, a in zip(roles, right, amounts, strict=True)
            ),
            _sent(2),
        ],
        plan=plan.finish(),
        memory=memory,
        confirmations=["wallet_send_money"],
    )


@template(domain="payments", capabilities=["tool_use"], apps=["wallet"], difficulty=2)
def payments_answer_requests(g: TaskGen) -> Task:
    rng = g.rng
    contacts = phone_book(g.fake, 6)
    pay, decline, leave = rng.sample(contacts, 3)
    ww = WalletWorld(g)
    ww.history(3)
    notes = rng.sample(REASONS, 3)
    r_pay = ww.request(pay, _amount(g, 5, 150), notes[0], days_ago=rng.randint(0, 4))
    r_decline = ww.request(decline, _amount(g, 5, 150), notes[1], days_ago=rng.randint(0, 4))
    r_leave = ww.request(leave, _amount(g, 5, 150), notes[2], days_ago=rng.randint(0, 4))
    ww.request(pay, _amount(g, 5, 50), "coffee", status="paid", days_ago=20)
    rng.shuffle(ww.requests)
    instruction = (
        f"Pay {pay['name']}'s money request for {notes[0]} from my balance, and decline the one "
        f"from {decline['name']}. Leave any other requests alone."
    )
    plan = PlanBuilder()
    plan.call("wallet_list_requests", direction="incoming", status="pending")
    plan.call("wallet_pay_request", request_id=r_pay["id"], source="balance")
    plan.call("wallet_decline_request", request_id=r_decline["id"])
    return g.task(
        instruction=instruction,
        world={"wallet": ww.world()},
        checks=[
            Check(
                name="request paid",
                target="wallet.requests",
                where={"id": r_pay["id"], "status": "paid"},
            ),
            Check(
                name="payment recorded",
                target="wallet.transactions",
                where={
                    "type": "request_payment",
                    "counterparty": pay["phone"],
                    "amount": r_pay["amount"],
                    "source": "balance",
                },
            ),
            Check(
                name="request declined",
                target="wallet.requests",
                where={"id": r_decline["id"], "status": "declined"},
            ),
            Check(
                name="other request untouched",
                target="wallet.requests",
                where={"id": r_leave["id"], "status": "pending"},
            ),
        ],
        plan=plan.finish(),
        confirmations=["wallet_pay_request"],
    )
