"""Wallet: balance and cards, person-to-person payments, money requests, bills and disputes."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import ISO_DATE, PHONE, App, Offset, fail, money, tool

TxType = Literal[
    "transfer_out", "transfer_in", "card_payment", "top_up", "bill_payment", "request_payment"
]  # fmt: skip
Direction = Literal["incoming", "outgoing"]
RequestStatus = Literal["pending", "paid", "declined", "cancelled"]
BillStatus = Literal["due", "partially_paid", "paid"]
Repeat = Literal["once", "weekly", "monthly"]
ReplaceReason = Literal["lost", "stolen", "damaged", "expired"]
DisputeReason = Literal["duplicate", "unauthorized", "not_received", "wrong_amount"]

Phone = Annotated[str, Field(pattern=PHONE, description="Phone number")]
Amount = Annotated[float, Field(gt=0, le=10_000, description="US dollars, at most 2 decimals")]
Source = Annotated[
    str,
    Field(
        min_length=1, description="'balance' (wallet balance) or a card id from wallet_list_cards"
    ),
]
CardId = Annotated[str, Field(min_length=1, description="Card id, e.g. 'card_101'")]
IsoDate = Annotated[str, Field(pattern=ISO_DATE, description="YYYY-MM-DD")]
Limit = Annotated[int, Field(ge=1, le=100)]

DISPUTE_WINDOW_DAYS = 60


def _tx_time(t: dict[str, Any]) -> Any:
    return t["time"]


class Balance(TypedDict):
    balance: float
    currency: str
    daily_limit: float
    sent_today: float


class Card(TypedDict):
    id: str
    label: str
    brand: str
    last4: str
    status: str
    available: float
    default: bool
    replaces: str | None


class Transaction(TypedDict):
    id: str
    type: str
    counterparty: str
    amount: float
    note: str
    source: str
    time: str
    status: str


class MoneyRequest(TypedDict):
    id: str
    direction: str
    name: str
    phone: str
    amount: float
    note: str
    status: str
    time: str


class Bill(TypedDict):
    id: str
    biller: str
    category: str
    account_no: str
    amount_due: float
    paid_amount: float
    due_date: str
    status: str


class ScheduledTransfer(TypedDict):
    id: str
    to: str
    amount: float
    note: str
    start_date: str
    repeat: str
    source: str
    status: str


class Dispute(TypedDict):
    id: str
    transaction_id: str
    reason: str
    original_transaction_id: str | None
    amount: float
    status: str
    opened_at: str


def _cents_ok(amount: float) -> bool:
    return abs(amount * 100 - round(amount * 100)) < 1e-6


class WalletApp(App):
    name = "wallet"
    title = "Wallet"
    description = (
        "Mobile wallet: balance and cards, send and request money by phone number, pay bills, "
        "schedule transfers, freeze or replace cards and dispute charges."
    )
    skills = {
        "pay_people": (
            "People are paid by phone number: resolve the name with contacts_search, then "
            "wallet_send_money(to, amount, note, source). source is 'balance' unless the user "
            "names a card (then the card id from wallet_list_cards). If the balance is short, "
            "wallet_top_up(amount, card_id) first."
        ),
        "split_bill": (
            "To split a bill evenly between the user and N other people: share = total / (N + 1) "
            "rounded DOWN to the cent (the user covers the leftover cents). Send one "
            "wallet_request_money(from_phone, amount, note) per other person with exactly that "
            "share (phones via contacts_search); never request the user's own share."
        ),
        "lost_card": (
            "Lost or stolen card: 1) wallet_freeze_card(card_id) at once (replacing an unfrozen "
            "lost card is refused), 2) wallet_replace_card(card_id, reason) returns the new card, "
            "3) the new card is NOT default: if the user wants it as default (or the old card was "
            "default) call wallet_set_default_card with the NEW card's id."
        ),
        "disputes": (
            "Charged twice: find both charges with wallet_list_transactions(counterparty=...), "
            "then wallet_dispute_transaction on the LATER charge with reason 'duplicate' and "
            "original_transaction_id = the earlier charge. Never dispute both. Disputes are "
            "accepted for card payments up to 60 days old."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "account": {"balance": 0.0, "currency": "USD", "daily_limit": 2500.0},
            "cards": [],
            "transactions": [],
            "requests": [],
            "bills": [],
            "scheduled": [],
            "disputes": [],
        }

    # ------------------------------------------------------------------ helpers
    def _account(self) -> dict[str, Any]:
        account: dict[str, Any] = self.state.setdefault("account", {})
        account.setdefault("balance", 0.0)
        account.setdefault("currency", "USD")
        account.setdefault("daily_limit", 2500.0)
        return account

    def _sent_today(self) -> float:
        today = self.world.iso_now()[:10]
        history = self.records("transactions")
        source: Any = history
        order = self.in_order("transactions", "wallet.newest", _tx_time, reverse=True)
        if order is not None:  # committed: today's are among the newest; summed in list order
            todays = []
            for at in order:
                day = history[at]["time"][:10]
                if day < today:
                    break
                if day == today:
                    todays.append(at)
            source = map(history.__getitem__, sorted(todays))
        return money(
            sum(
                t["amount"]
                for t in source
                if t["type"] in ("transfer_out", "request_payment") and t["time"][:10] == today
            )
        )

    def _card(self, card_id: str) -> dict[str, Any]:
        return self.find("cards", card_id, what="card")

    def _usable_card(self, card_id: str, amount: float) -> dict[str, Any]:
        card = self._card(card_id)
        if card["status"] == "frozen":
            raise fail(f"card declined: {card['label']} is frozen (wallet_unfreeze_card)")
        if card["status"] != "active":
            raise fail(f"card declined: {card['label']} is {card['status']}")
        if amount > card["available"] + 1e-9:
            raise fail(
                f"card declined: {card['label']} has ${card['available']:.2f} available, "
                f"${amount:.2f} needed"
            )
        return card

    def _debit(self, source: str, amount: float) -> None:
        if source == "balance":
            account = self._account()
            if amount > account["balance"] + 1e-9:
                raise fail(
                    f"insufficient balance: ${account['balance']:.2f} available, ${amount:.2f} "
                    "needed; top up with wallet_top_up or pay with a card"
                )
            account["balance"] = money(account["balance"] - amount)
        else:
            card = self._usable_card(source, amount)
            card["available"] = money(card["available"] - amount)

    def _check_amount(self, amount: float) -> None:
        if not _cents_ok(amount):
            raise fail(f"argument 'amount': {amount} has more than 2 decimals", "invalid_arguments")

    def _check_limit(self, amount: float) -> None:
        account = self._account()
        if self._sent_today() + amount > account["daily_limit"] + 1e-9:
            raise fail(
                f"daily sending limit of ${account['daily_limit']:.2f} would be exceeded "
                f"(${self._sent_today():.2f} sent today)"
            )

    def _record(
        self, kind: str, counterparty: str, amount: float, note: str, source: str
    ) -> Transaction:
        tx = {
            "id": self.world.new_id("tx"),
            "type": kind,
            "counterparty": counterparty,
            "amount": money(amount),
            "note": note,
            "source": source,
            "time": self.world.iso_now(),
            "status": "completed",
        }
        self.records("transactions").append(tx)
        return cast(Transaction, tx)

    # ------------------------------------------------------------------ balance & history
    @tool()
    def wallet_get_balance(self) -> Balance:
        """The wallet balance, the daily sending limit and how much was sent today."""
        account = self._account()
        return {
            "balance": account["balance"],
            "currency": account["currency"],
            "daily_limit": account["daily_limit"],
            "sent_today": self._sent_today(),
        }

    @tool()
    def wallet_list_transactions(
        self,
        type: TxType | None = None,
        counterparty: Annotated[
            str, Field(max_length=80, description="Part of a name or phone")
        ] = "",
        min_amount: Annotated[float, Field(ge=0)] | None = None,
        max_amount: Annotated[float, Field(ge=0)] | None = None,
        since: IsoDate | None = None,
        source: str | None = None,
        limit: Limit = 20,
        offset: Offset = 0,
    ) -> list[Transaction]:
        """Transaction history, newest first, by type, counterparty, amount, date or source."""
        q = counterparty.lower()

        def wanted(t: dict[str, Any]) -> bool:
            return bool(
                (type is None or t["type"] == type)
                and q in t["counterparty"].lower()
                and (min_amount is None or t["amount"] >= min_amount)
                and (max_amount is None or t["amount"] <= max_amount)
                and (since is None or t["time"][:10] >= since)
                and (source is None or t["source"] == source)
            )

        page = self.page_in_order(
            "transactions", "wallet.newest", _tx_time, wanted, reverse=True,
            limit=limit, offset=offset,
        )  # fmt: skip
        return cast(list[Transaction], page)

    @tool()
    def wallet_get_transaction(
        self, transaction_id: Annotated[str, Field(min_length=1)]
    ) -> Transaction:
        """Get one transaction by id."""
        return cast(Transaction, self.find("transactions", transaction_id, what="transaction"))

    # ------------------------------------------------------------------ sending money
    @tool("payment")
    def wallet_send_money(
        self,
        to: Phone,
        amount: Amount,
        note: Annotated[str, Field(max_length=140)] = "",
        source: Source = "balance",
    ) -> Transaction:
        """Send money to a phone number from the wallet balance or a card."""
        self._check_amount(amount)
        if to == self.world.user.phone:
            raise fail("cannot send money to yourself", "invalid_arguments")
        self._check_limit(amount)
        self._debit(source, amount)
        return self._record("transfer_out", to, amount, note, source)

    @tool("payment")
    def wallet_top_up(self, amount: Amount, card_id: CardId) -> Transaction:
        """Move money from a card into the wallet balance."""
        self._check_amount(amount)
        card = self._usable_card(card_id, amount)
        card["available"] = money(card["available"] - amount)
        account = self._account()
        account["balance"] = money(account["balance"] + amount)
        return self._record("top_up", card["label"], amount, "top-up", card_id)

    @tool("payment")
    def wallet_schedule_transfer(
        self,
        to: Phone,
        amount: Amount,
        start_date: IsoDate,
        repeat: Repeat = "once",
        note: Annotated[str, Field(max_length=140)] = "",
        source: Source = "balance",
    ) -> ScheduledTransfer:
        """Schedule a transfer to a phone number on a future date, once or repeating."""
        self._check_amount(amount)
        try:
            start = date.fromisoformat(start_date)
        except ValueError:
            raise fail(
                f"argument 'start_date': {start_date} is not a date", "invalid_arguments"
            ) from None
        if start <= self.world.now.date():
            raise fail(f"start_date must be after today ({self.world.now.date().isoformat()})")
        if source != "balance":
            card = self._card(source)
            if card["status"] != "active":
                raise fail(f"card declined: {card['label']} is {card['status']}")
        record = {
            "id": self.world.new_id("sched"),
            "to": to,
            "amount": money(amount),
            "note": note,
            "start_date": start_date,
            "repeat": repeat,
            "source": source,
            "status": "active",
        }
        self.records("scheduled").append(record)
        return cast(ScheduledTransfer, record)

    @tool()
    def wallet_list_scheduled(self) -> list[ScheduledTransfer]:
        """Scheduled and recurring transfers."""
        return cast(list[ScheduledTransfer], self.records("scheduled"))

    @tool("write")
    def wallet_cancel_scheduled(
        self, transfer_id: Annotated[str, Field(min_length=1)]
    ) -> ScheduledTransfer:
        """Cancel a scheduled or recurring transfer."""
        record = self.find("scheduled", transfer_id, what="scheduled transfer")
        if record["status"] != "active":
            raise fail(f"scheduled transfer '{transfer_id}' is {record['status']}")
        record["status"] = "cancelled"
        return cast(ScheduledTransfer, record)

    # ------------------------------------------------------------------ requests
    @tool("write")
    def wallet_request_money(
        self,
        from_phone: Phone,
        amount: Amount,
        note: Annotated[str, Field(max_length=140)] = "",
    ) -> MoneyRequest:
        """Ask someone (by phone number) to pay you an amount; nothing moves until they pay."""
        self._check_amount(amount)
        if from_phone == self.world.user.phone:
            raise fail("cannot request money from yourself", "invalid_arguments")
        record = {
            "id": self.world.new_id("req"),
            "direction": "outgoing",
            "name": "",
            "phone": from_phone,
            "amount": money(amount),
            "note": note,
            "status": "pending",
            "time": self.world.iso_now(),
        }
        self.records("requests").append(record)
        return cast(MoneyRequest, record)

    @tool()
    def wallet_list_requests(
        self, direction: Direction | None = None, status: RequestStatus | None = None
    ) -> list[MoneyRequest]:
        """Money requests: incoming (others ask you) and outgoing (you asked others)."""
        rows = self.select("requests", direction=direction, status=status)
        return cast(list[MoneyRequest], rows)

    def _pending(self, request_id: str, direction: str) -> dict[str, Any]:
        record = self.find("requests", request_id, what="request")
        if record["direction"] != direction:
            raise fail(f"request '{request_id}' is {record['direction']}, not {direction}")
        if record["status"] != "pending":
            raise fail(f"request '{request_id}' is already {record['status']}")
        return record

    @tool("payment")
    def wallet_pay_request(
        self, request_id: Annotated[str, Field(min_length=1)], source: Source = "balance"
    ) -> Transaction:
        """Pay an incoming money request in full."""
        record = self._pending(request_id, "incoming")
        self._check_limit(record["amount"])
        self._debit(source, record["amount"])
        record["status"] = "paid"
        return self._record(
            "request_payment", record["phone"], record["amount"], record["note"], source
        )

    @tool("write")
    def wallet_decline_request(
        self,
        request_id: Annotated[str, Field(min_length=1)],
        reason: Annotated[str, Field(max_length=140)] = "",
    ) -> MoneyRequest:
        """Decline an incoming money request."""
        record = self._pending(request_id, "incoming")
        record["status"] = "declined"
        record["decline_reason"] = reason
        return cast(MoneyRequest, record)

    @tool("write")
    def wallet_cancel_request(
        self, request_id: Annotated[str, Field(min_length=1)]
    ) -> MoneyRequest:
        """Cancel a money request you sent that is still pending."""
        record = self._pending(request_id, "outgoing")
        record["status"] = "cancelled"
        return cast(MoneyRequest, record)

    # ------------------------------------------------------------------ bills
    @tool()
    def wallet_list_bills(self, status: BillStatus | None = None) -> list[Bill]:
        """Bills linked to the wallet (utilities, phone, internet ...) with amount and due date."""
        return cast(list[Bill], self.select("bills", status=status))

    @tool("payment")
    def wallet_pay_bill(
        self,
        bill_id: Annotated[str, Field(min_length=1)],
        amount: Amount,
        source: Source = "balance",
    ) -> Bill:
        """Pay a bill in full or in part (never more than what is still due)."""
        self._check_amount(amount)
        bill = self.find("bills", bill_id, what="bill")
        if bill["status"] == "paid":
            raise fail(f"bill '{bill_id}' is already paid")
        remaining = money(bill["amount_due"] - bill["paid_amount"])
        if amount > remaining + 1e-9:
            raise fail(f"only ${remaining:.2f} is due on bill '{bill_id}'")
        self._debit(source, amount)
        bill["paid_amount"] = money(bill["paid_amount"] + amount)
        bill["status"] = (
            "paid" if bill["paid_amount"] >= bill["amount_due"] - 1e-9 else "partially_paid"
        )
        self._record("bill_payment", bill["biller"], amount, bill["account_no"], source)
        return cast(Bill, bill)

    # ------------------------------------------------------------------ cards
    @tool()
    def wallet_list_cards(self) -> list[Card]:
        """Cards linked to the wallet with status, available credit and which one is default."""
        return cast(list[Card], self.records("cards"))

    @tool("write")
    def wallet_freeze_card(self, card_id: CardId) -> Card:
        """Freeze a card: every payment with it is declined until unfrozen."""
        card = self._card(card_id)
        if card["status"] not in ("active", "frozen"):
            raise fail(f"card '{card_id}' is {card['status']}")
        card["status"] = "frozen"
        return cast(Card, card)

    @tool("write")
    def wallet_unfreeze_card(self, card_id: CardId) -> Card:
        """Unfreeze a frozen card."""
        card = self._card(card_id)
        if card["status"] != "frozen":
            raise fail(f"card '{card_id}' is {card['status']}, not frozen")
        card["status"] = "active"
        return cast(Card, card)

    @tool("write")
    def wallet_replace_card(self, card_id: CardId, reason: ReplaceReason) -> Card:
        """Order a replacement card; the old card is closed. Returns the new card."""
        card = self._card(card_id)
        if card["status"] == "replaced":
            raise fail(f"card '{card_id}' was already replaced")
        if reason in ("lost", "stolen") and card["status"] != "frozen":
            raise fail(f"freeze the {reason} card first (wallet_freeze_card), then replace it")
        new_id = self.world.new_id("card")
        new = {
            "id": new_id,
            "label": f"{card['brand']} ending {int(new_id.split('_')[-1]) % 10000:04d}",
            "brand": card["brand"],
            "last4": f"{int(new_id.split('_')[-1]) % 10000:04d}",
            "status": "active",
            "available": card["available"],
            "default": False,
            "replaces": card_id,
        }
        card["status"] = "replaced"
        card["default"] = False
        self.records("cards").append(new)
        return cast(Card, new)

    @tool("write")
    def wallet_set_default_card(self, card_id: CardId) -> Card:
        """Make an active card the default for payments."""
        card = self._card(card_id)
        if card["status"] != "active":
            raise fail(f"card '{card_id}' is {card['status']}; only active cards can be default")
        for other in self.records("cards"):
            other["default"] = other["id"] == card_id
        return cast(Card, card)

    # ------------------------------------------------------------------ disputes
    @tool("write")
    def wallet_dispute_transaction(
        self,
        transaction_id: Annotated[str, Field(min_length=1)],
        reason: DisputeReason,
        original_transaction_id: Annotated[
            str | None, Field(description="For 'duplicate': the first charge")
        ] = None,
    ) -> Dispute:
        """Dispute a card payment (within 60 days); a duplicate names the original charge."""
        tx = self.find("transactions", transaction_id, what="transaction")
        if tx["type"] != "card_payment":
            raise fail("only card payments can be disputed")
        if tx["status"] == "disputed":
            raise fail(f"transaction '{transaction_id}' is already disputed")
        if self.world.now - datetime.fromisoformat(tx["time"]) > timedelta(
            days=DISPUTE_WINDOW_DAYS
        ):
            raise fail(f"transaction '{transaction_id}' is older than {DISPUTE_WINDOW_DAYS} days")
        if reason == "duplicate":
            if not original_transaction_id:
                raise fail("a duplicate dispute needs original_transaction_id", "invalid_arguments")
            original = self.find("transactions", original_transaction_id, what="transaction")
            if original["id"] == tx["id"]:
                raise fail("a charge cannot duplicate itself", "invalid_arguments")
            if original["counterparty"] != tx["counterparty"] or original["amount"] != tx["amount"]:
                raise fail("the two charges differ in merchant or amount; not a duplicate")
            if original["time"] > tx["time"]:
                raise fail("dispute the later charge; the original must be the earlier one")
            if original["status"] == "disputed":
                raise fail("the original charge is itself disputed")
        tx["status"] = "disputed"
        dispute = {
            "id": self.world.new_id("disp"),
            "transaction_id": transaction_id,
            "reason": reason,
            "original_transaction_id": original_transaction_id,
            "amount": tx["amount"],
            "status": "open",
            "opened_at": self.world.iso_now(),
        }
        self.records("disputes").append(dispute)
        return cast(Dispute, dispute)
