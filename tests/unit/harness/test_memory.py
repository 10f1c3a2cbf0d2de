"""Persistent Memory: evidence-graded resolution, retrieval, persistence, write-back, threads."""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from qpa.contract import (
    Feedback,
    Finish,
    MemoryItem,
    Policy,
    Step,
    Task,
    ToolCall,
    ToolSpec,
    Trajectory,
    Verification,
)
from qpa.harness.memory import (
    SCHEMA_VERSION,
    MemoryStore,
    MemoryStoreError,
    RetrievedMemory,
    key_matches,
)

U = "u_0001"
T0 = datetime(2026, 1, 1, 12, 0)


def item(
    key: str, value: str, evidence: str = "stated", days: int = 0, source: str = "seed"
) -> MemoryItem:
    return MemoryItem(
        key=key,
        value=value,
        evidence=evidence,
        source=source,
        time=T0 + timedelta(days=days),
    )


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


# --------------------------------------------------------------------------- resolution


def test_stated_beats_newer_inferred(store: MemoryStore) -> None:
    store.put(U, item("usual_coffee", "flat white", "stated", days=0))
    store.put(U, item("usual_coffee", "latte", "inferred", days=30, source="traj#1"))
    got = store.resolve(U, "usual_coffee")
    assert got is not None
    assert (got.value, got.evidence) == ("flat white", "stated")
    assert [(s.value, s.evidence, s.source) for s in got.superseded] == [
        ("latte", "inferred", "traj#1")
    ]
    notes = MemoryStore.annotations([got])
    assert notes == {
        "memory_retrieved": ["usual_coffee=flat white (stated)"],
        "memory_superseded": ["usual_coffee=latte (inferred) superseded by stated"],
    }


def test_evidence_order_confirmed_over_observed_over_inferred(store: MemoryStore) -> None:
    store.put(U, item("card", "amex", "inferred", days=9))
    store.put(U, item("card", "mastercard", "observed", days=5))
    assert store.resolve(U, "card").value == "mastercard"  # type: ignore[union-attr]
    store.put(U, item("card", "visa", "confirmed", days=1))
    got = store.resolve(U, "card")
    assert got is not None and got.value == "visa"
    assert [s.value for s in got.superseded] == ["mastercard", "amex"]


def test_same_evidence_newer_wins_then_later_written(store: MemoryStore) -> None:
    store.put(U, item("gym_day", "monday", "confirmed", days=10))
    store.put(U, item("gym_day", "friday", "confirmed", days=3))
    assert store.resolve(U, "gym_day").value == "monday"  # type: ignore[union-attr]
    store.put(U, item("gym_day", "tuesday", "confirmed", days=11))
    assert store.resolve(U, "gym_day").value == "tuesday"  # type: ignore[union-attr]
    # same evidence and time: the later written wins
    store.put(U, item("gym_day", "sunday", "confirmed", days=11, source="other"))
    assert store.resolve(U, "gym_day").value == "sunday"  # type: ignore[union-attr]


def test_agreeing_items_support_not_supersede(store: MemoryStore) -> None:
    store.put(U, item("home_city", "Lisbon", "stated"))
    store.put(U, item("home_city", " lisbon ", "observed", days=2, source="t#2"))
    store.put(U, item("home_city", "Porto", "inferred", days=4, source="t#3"))
    got = store.resolve(U, "home_city")
    assert got is not None and got.value == "Lisbon"
    assert got.support == 1
    assert [s.value for s in got.superseded] == ["Porto"]


def test_aware_and_naive_times_compare(store: MemoryStore) -> None:
    later_aware = datetime(2026, 1, 2, 3, 0, tzinfo=timezone(timedelta(hours=5)))  # 2026-01-01T22Z
    store.put(U, MemoryItem(key="k", value="aware", evidence="observed", time=later_aware))
    store.put(U, MemoryItem(key="k", value="naive", evidence="observed", time=T0))
    got = store.resolve(U, "k")
    assert got is not None and got.value == "aware"
    assert got.item.time == datetime(2026, 1, 1, 22, 0)


def test_users_are_separate(store: MemoryStore) -> None:
    store.put(U, item("seat", "aisle"))
    store.put("u_0002", item("seat", "window"))
    assert store.resolve(U, "seat").value == "aisle"  # type: ignore[union-attr]
    assert store.resolve("u_0002", "seat").value == "window"  # type: ignore[union-attr]
    assert store.resolve("u_0003", "seat") is None
    assert store.users() == [U, "u_0002"]
    assert store.forget("u_0002") == 1 and store.users() == [U]


# --------------------------------------------------------------------------- retrieval


def test_retrieval_ranks_by_relevance(store: MemoryStore) -> None:
    store.seed(
        U,
        [
            item("usual_coffee_order", "oat flat white, large"),
            item("preferred_airline", "Aer Lingus"),
            item("preferred_payment_card", "Visa ending 4242"),
            item("gym_schedule", "Mondays and Thursdays 7am"),
            item("preferred_seat", "aisle seat"),
        ],
    )
    got = store.retrieve(U, "Order my usual coffee from the cafe near work", k=5)
    assert got[0].key == "usual_coffee_order"
    assert "preferred_airline" not in [r.key for r in got]
    assert all(r.score > 0 for r in got)

    flight = store.retrieve(U, "Book a flight to Dublin with my preferred airline and seat", k=2)
    assert {r.key for r in flight} == {"preferred_airline", "preferred_seat"}
    assert flight[0].score >= flight[1].score

    paid = store.retrieve(U, "Pay for it with the card I prefer", k=1)
    assert [r.key for r in paid] == ["preferred_payment_card"]
    assert store.retrieve(U, "What's the weather like?") == []
    with pytest.raises(MemoryStoreError, match="'k'"):
        store.retrieve(U, "coffee", k=0)


def test_retrieval_returns_resolved_values_with_superseded(store: MemoryStore) -> None:
    store.put(U, item("usual_coffee", "flat white", "stated"))
    store.put(U, item("usual_coffee", "espresso", "observed", days=50, source="t#9"))
    got = store.retrieve(U, "get me my usual coffee")
    assert len(got) == 1 and isinstance(got[0], RetrievedMemory)
    assert got[0].value == "flat white"
    assert got[0].superseded[0].value == "espresso"
    notes = MemoryStore.annotations(got)
    assert notes["memory_retrieved"] == ["usual_coffee=flat white (stated)"]
    assert notes["memory_superseded"] == ["usual_coffee=espresso (observed) superseded by stated"]
    step = Step(index=0, action=Finish(), feedback=Feedback(), annotations=notes)
    assert Step.model_validate_json(step.model_dump_json()).annotations == notes


def test_used_by_names_the_values_an_action_passes(store: MemoryStore) -> None:
    store.seed(U, [item("preferred_card", "card_77"), item("preferred_seat", "aisle")])
    got = store.retrieve(U, "pay with my preferred card, aisle seat")
    call = ToolCall(tool="shop_checkout", arguments={"card": "card_77", "items": [{"n": 1}]})
    assert MemoryStore.used_by(got, call) == ["preferred_card=card_77 (stated)"]
    assert MemoryStore.used_by(got, Finish(answer="card_77")) == []


# --------------------------------------------------------------------------- persistence


def test_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "mem" / "memory.db"
    with MemoryStore(path) as first:
        first.seed(U, [item("preferred_seat", "aisle"), item("usual_coffee", "latte")])
        first.put(U, item("preferred_seat", "window", "inferred", days=3, source="t#1"))
        assert first.schema_version == SCHEMA_VERSION
    with MemoryStore(str(path)) as again:
        assert again.count(U) == 3
        got = again.resolve(U, "preferred_seat")
        assert got is not None and got.value == "aisle"
        assert [s.value for s in got.superseded] == ["window"]
        # seeding the same facts again is idempotent
        again.seed(U, [item("preferred_seat", "aisle"), item("usual_coffee", "latte")])
        assert again.count(U) == 3
        assert again.keys(U) == ["preferred_seat", "usual_coffee"]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    MemoryStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(MemoryStoreError, match="newer than this qpa supports"):
        MemoryStore(path)


def test_migrates_an_old_database(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as db:  # a version-1 database holding a duplicated fact
        db.execute(
            "CREATE TABLE memory (created_seq INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT "
            "NULL, key TEXT NOT NULL, value TEXT NOT NULL, evidence TEXT NOT NULL, source TEXT NOT "
            "NULL, time TEXT NOT NULL)"
        )
        row = (U, "seat", "aisle", "stated", "seed", T0.isoformat())
        db.executemany(
            "INSERT INTO memory (user_id, key, value, evidence, source, time) VALUES (?,?,?,?,?,?)",
            [row, row],
        )
        db.execute("PRAGMA user_version = 1")
    with MemoryStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.count(U) == 1


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(MemoryStoreError, match=r"junk\.db"):
        MemoryStore(path)


def test_corrupt_evidence_in_the_database_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    MemoryStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO memory (user_id, key, value, evidence, source, time) VALUES (?,?,?,?,?,?)",
            (U, "seat", "aisle", "rumour", "seed", T0.isoformat()),
        )
    with (
        MemoryStore(path) as store,
        pytest.raises(MemoryStoreError, match=r"field 'evidence'.*rumour"),
    ):
        store.resolve(U, "seat")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE memory SET evidence = 'stated', time = 'yesterday'")
    with MemoryStore(path) as store, pytest.raises(MemoryStoreError, match="field 'time'"):
        store.items(U)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"key": "seat", "value": "aisle", "evidence": "rumour"}, "evidence"),
        ({"key": "seat", "value": "aisle", "evidence": None}, "evidence"),
        ({"key": "", "value": "aisle"}, "key"),
        ({"key": "seat", "value": "  "}, "value"),
        ({"key": "seat"}, "value"),
        ({"key": "seat", "value": "aisle", "time": "not a time"}, "time"),
        ({"key": "seat", "value": "aisle", "colour": "red"}, "colour"),
    ],
)
def test_bad_items_are_rejected_naming_the_field(
    store: MemoryStore, bad: dict[str, Any], field: str
) -> None:
    with pytest.raises(MemoryStoreError, match=f"field '{field}'"):
        store.put(U, bad)
    assert store.count() == 0


def test_bypassed_validation_is_still_caught(store: MemoryStore) -> None:
    sneaky = MemoryItem.model_construct(
        key="seat",
        value="aisle",
        evidence="hearsay",  # type: ignore[arg-type]
        source="seed",
        time=T0,
    )
    with pytest.raises(MemoryStoreError, match=r"field 'evidence'.*hearsay"):
        store.put(U, sneaky)
    with pytest.raises(MemoryStoreError, match="field 'user_id'"):
        store.put("  ", item("seat", "aisle"))
    with pytest.raises(MemoryStoreError, match="MemoryItem or a mapping"):
        store.put(U, ["seat", "aisle"])  # type: ignore[arg-type]
    # a batch with one bad item writes nothing
    with pytest.raises(MemoryStoreError):
        store.seed(U, [item("a", "1"), {"key": "b", "value": "2", "evidence": "guess"}])
    assert store.count() == 0


# --------------------------------------------------------------------------- write-back

CHECKOUT = ToolSpec(
    name="shop_checkout", description="Pay for the cart.", app="shop", side_effect="payment"
)
SEARCH = ToolSpec(name="shop_search", description="Search products.", app="shop")
PROFILE = ToolSpec(name="account_profile", description="Show the user's profile.", app="account")
BOOK = ToolSpec(
    name="flights_book", description="Book a flight.", app="flights", side_effect="write"
)
SPECS = [CHECKOUT, SEARCH, PROFILE, BOOK]


def trajectory(
    steps: list[tuple[ToolCall, Feedback]] | list[Any],
    *,
    success: bool,
    instruction: str = "Buy more oat milk and pay the usual way",
    memory: list[MemoryItem] | None = None,
    annotations: dict[int, dict[str, Any]] | None = None,
) -> Trajectory:
    task = Task(
        id="shop-001",
        domain="shopping",
        capabilities=["memory"],
        instruction=instruction,
        memory=memory if memory is not None else [item("preferred_payment_card", "card_visa")],
    )
    return Trajectory(
        id="shop-001#0",
        task=task,
        policy=Policy(planner="test"),
        steps=[
            Step(index=i, action=a, feedback=f, annotations=(annotations or {}).get(i, {}))
            for i, (a, f) in enumerate(steps)
        ],
        verification=Verification(done=True, success=success, progress=1.0 if success else 0.0),
        started_at=datetime(2026, 3, 2, 9, 0, tzinfo=UTC),
    )


def test_key_matching_rule() -> None:
    assert key_matches("preferred_payment_card", "payment_card")
    assert key_matches("usual-delivery-address", "delivery_address")
    assert not key_matches("preferred_payment_card", "card")
    assert key_matches("shop.delivery_address", "delivery_address", tool="shop_checkout")
    assert not key_matches("shop.delivery_address", "delivery_address", tool="flights_book")
    assert key_matches("flights_book.seat", "seat", tool="flights_book")
    assert not key_matches("shop.delivery_address", "delivery_address")


def test_write_back_successful_episode_confirms_and_observes(store: MemoryStore) -> None:
    store.seed(U, [item("preferred_payment_card", "card_visa"), item("home_city", "Lisbon")])
    traj = trajectory(
        [
            (
                ToolCall(tool="shop_search", arguments={"query": "oat milk"}),
                Feedback.ok([{"id": "p1"}]),
            ),
            (
                ToolCall(tool="account_profile", arguments={}),
                Feedback.ok({"user": {"name": "Alex", "home_city": "Porto"}}),
            ),
            (
                ToolCall(tool="shop_checkout", arguments={"payment_card": "card_amex", "qty": 2}),
                Feedback.ok({"order": "o1"}),
            ),
            (Finish(answer="done"), Feedback.ok(done=True)),
        ],
        success=True,
        instruction="Buy oat milk, pay with my usual card and tell me my home city",
    )
    written = store.write_back(U, traj, tools=SPECS)
    assert {(w.key, w.value, w.evidence) for w in written} == {
        ("preferred_payment_card", "card_amex", "confirmed"),
        ("home_city", "Porto", "observed"),
    }
    assert all(w.source == "shop-001#0" for w in written)
    assert all(w.time == datetime(2026, 3, 2, 9, 0) for w in written)
    # the user's stated preference still wins; the confirmed value shows as superseded
    got = store.resolve(U, "preferred_payment_card")
    assert got is not None and got.value == "card_visa" and got.evidence == "stated"
    assert [(s.value, s.evidence) for s in got.superseded] == [("card_amex", "confirmed")]
    # writing back the same episode twice stores nothing new
    before = store.count(U)
    store.write_back(U, traj, tools=SPECS)
    assert store.count(U) == before


def test_confirmed_beats_older_observed_after_write_back(store: MemoryStore) -> None:
    store.put(U, item("preferred_payment_card", "card_old", "observed", days=80))
    traj = trajectory(
        [(ToolCall(tool="shop_checkout", arguments={"payment_card": "card_new"}), Feedback.ok({}))],
        success=True,
        memory=[],
    )
    store.write_back(U, traj, tools=SPECS)
    got = store.resolve(U, "preferred_payment_card")
    assert got is not None and (got.value, got.evidence) == ("card_new", "confirmed")


def test_write_back_failed_episode_writes_no_confirmed(store: MemoryStore) -> None:
    traj = trajectory(
        [
            (
                ToolCall(tool="shop_checkout", arguments={"payment_card": "card_amex"}),
                Feedback.ok({"order": "o1"}),
            ),
            (
                ToolCall(tool="account_profile", arguments={}),
                Feedback.ok({"preferred_payment_card": "card_visa"}),
            ),
        ],
        success=False,
        instruction="Which card do I usually pay with?",
    )
    written = store.write_back(U, traj, tools=SPECS)
    assert [(w.key, w.value, w.evidence) for w in written] == [
        ("preferred_payment_card", "card_visa", "observed")
    ]


def test_write_back_ignores_reads_failures_and_unknown_keys(store: MemoryStore) -> None:
    traj = trajectory(
        [
            # a read tool's argument is not a completed action
            (ToolCall(tool="shop_search", arguments={"payment_card": "card_x"}), Feedback.ok([])),
            # a failed write confirms nothing
            (
                ToolCall(tool="shop_checkout", arguments={"payment_card": "card_y"}),
                Feedback.fail("precondition_failed", "card declined"),
            ),
            # an argument that matches no known key
            (ToolCall(tool="flights_book", arguments={"seat": "12A"}), Feedback.ok({})),
            # a tool nobody knows the side effect of is not a write
            (ToolCall(tool="mystery_pay", arguments={"payment_card": "card_z"}), Feedback.ok({})),
        ],
        success=True,
    )
    assert store.write_back(U, traj, tools=SPECS) == []


def test_observed_needs_one_unambiguous_value_the_user_asked_about(store: MemoryStore) -> None:
    store.seed(U, [item("home_city", "Lisbon"), item("preferred_seat", "aisle")])
    many = Feedback.ok(
        [{"home_city": "Porto"}, {"home_city": "Faro"}, {"preferred_seat": "window"}]
    )
    traj = trajectory(
        [(ToolCall(tool="account_profile", arguments={}), many)],
        success=True,
        instruction="What is my home city?",
        memory=[],
    )
    assert store.write_back(U, traj, tools=SPECS) == []  # two cities: ambiguous; seat: not asked


def test_inferred_notes_from_annotations(store: MemoryStore) -> None:
    traj = trajectory(
        [(Finish(answer="ok"), Feedback.ok(done=True))],
        success=False,
        annotations={0: {"memory_inferred": [{"key": "diet", "value": "vegetarian"}]}},
    )
    written = store.write_back(U, traj, tools=SPECS)
    assert [(w.key, w.value, w.evidence) for w in written] == [("diet", "vegetarian", "inferred")]
    broken = trajectory(
        [(Finish(), Feedback.ok(done=True))],
        success=True,
        annotations={0: {"memory_inferred": [{"value": "no key"}]}},
    )
    with pytest.raises(MemoryStoreError, match="'key' and 'value'"):
        store.write_back(U, broken, tools=SPECS)


def test_scoped_keys_only_match_their_app(store: MemoryStore) -> None:
    store.seed(U, [item("shop.delivery_address", "12 Harbor Street")])
    traj = trajectory(
        [
            (
                ToolCall(tool="flights_book", arguments={"delivery_address": "Airport"}),
                Feedback.ok({}),
            ),
            (
                ToolCall(tool="shop_checkout", arguments={"delivery_address": "400 Market Avenue"}),
                Feedback.ok({}),
            ),
        ],
        success=True,
        memory=[],
    )
    written = store.write_back(U, traj, tools=SPECS)
    assert [(w.key, w.value) for w in written] == [("shop.delivery_address", "400 Market Avenue")]


def test_write_back_defaults_to_registry_side_effects(store: MemoryStore) -> None:
    store.seed(U, [item("contacts.email", "old@example.com")])
    traj = trajectory(
        [
            (
                ToolCall(
                    tool="contacts_update", arguments={"contact_id": "c_1", "email": "new@x.io"}
                ),
                Feedback.ok({"id": "c_1"}),
            )
        ],
        success=True,
        memory=[],
    )
    written = store.write_back(U, traj)
    assert [(w.key, w.value, w.evidence) for w in written] == [
        ("contacts.email", "new@x.io", "confirmed")
    ]


# --------------------------------------------------------------------------- threads


def test_concurrent_puts_and_reads_from_threads(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "threads.db")
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        try:
            start.wait()
            for i in range(50):
                store.put(U, item(f"k{n}", f"v{i}", "observed", days=i, source=f"t{n}"))
                if i % 10 == 0:
                    store.retrieve(U, f"k{n}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count(U) == 400
    for n in range(8):
        assert store.resolve(U, f"k{n}").value == "v49"  # type: ignore[union-attr]
    store.close()
    with MemoryStore(tmp_path / "threads.db") as again:
        assert again.count(U) == 400
