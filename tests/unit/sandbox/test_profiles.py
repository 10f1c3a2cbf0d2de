"""Phone-scale worlds and copy-on-write state: the `phone` profile fills apps to a real phone's
sizes (maps places and bills included) and keeps every task solvable (oracle) and unsolved by
the baselines (noop, one wrong argument), checked here on one task per template and every
`EVERY`th task of the suite (`benchmarks/phone_oracle.py` runs every task); sessions share one
frozen base, a reset drops a session's changes, the default profile's tasks are unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from qpa.cli import app as cli_app
from qpa.cli.tasks import world_sizes
from qpa.contract import Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.cow import FrozenDict, FrozenList, Thaw, iter_frozen
from qpa.envs.sandbox.env import base_for
from qpa.envs.sandbox.geo import route_via
from qpa.envs.sandbox.registry import all_apps
from qpa.envs.sandbox.suite import at_profile, generate_suite
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

SUITE = generate_suite()
PHONE = generate_suite(profile="phone")
# One test task per template, at the phone profile.
SAMPLE = list({t.template: t for t in reversed(PHONE) if t.split == "test"}.values())
# And every EVERY'th task of the whole suite (all splits): the sampled variant of
# benchmarks/phone_oracle.py, which runs every task.
EVERY = 30
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import phone_oracle  # noqa: E402


def _base(task: Task) -> dict[str, dict[str, object]]:
    apps = all_apps()
    return base_for(task, [a for a in task.apps if a in apps], apps).state


def _first(app: str, collection: str) -> Task:
    return next(t for t in PHONE if t.world.get(app, {}).get(collection))


def test_phone_worlds_have_a_phones_sizes() -> None:
    wanted = {
        ("contacts", "contacts"): 300,
        ("messaging", "messages"): 2000,
        ("email", "messages"): 1000,
        ("calendar", "events"): 200,
        ("shop", "products"): 500,
    }
    for (app, collection), at_least in wanted.items():
        rows = _base(_first(app, collection))[app][collection]
        assert isinstance(rows, list) and len(rows) >= at_least, (app, collection, len(rows))


def test_phone_world_has_near_duplicates_and_consistent_references() -> None:
    task = next(t for t in PHONE if t.world.get("contacts") and t.world.get("messaging"))
    state = _base(task)
    contacts = state["contacts"]["contacts"]
    assert isinstance(contacts, list)
    first_names = [str(c["name"]).split(" ")[0] for c in contacts]
    core = task.world["contacts"]["contacts"][0]["name"].split(" ")[0]
    assert first_names.count(core) >= 10  # searching by first name gives many
    assert len({c["name"] for c in contacts}) == len(contacts)  # full names stay unique
    assert len({c["id"] for c in contacts}) == len(contacts)
    phones = {c["phone"] for c in contacts}
    messages = state["messaging"]["messages"]
    assert isinstance(messages, list)
    peers = {m["sender"] if m["to"] == "me" else m["to"] for m in messages}
    assert len(peers & phones) > 20  # filler messages come from filler contacts


def test_phone_worlds_are_deterministic_and_leave_default_tasks_alone() -> None:
    task = SAMPLE[0]
    a = orjson.dumps(_base(task))
    again = at_profile(next(t for t in SUITE if t.id == task.id.removesuffix(".phone")), "phone")
    assert orjson.dumps(_base(again.model_copy(update={"id": "x"}))) == a
    assert task.id.endswith(".phone") and task.world_profile == "phone"
    default = SUITE[0]
    assert "world_profile" not in default.model_dump_json()
    assert Task.model_validate_json(task.model_dump_json()).world_profile == "phone"
    assert {t.id.removesuffix(".phone") for t in PHONE} == {t.id for t in SUITE}


def test_baselines_on_phone_worlds() -> None:
    tasks = {t.id: t for t in [*SAMPLE, *phone_oracle.sample(PHONE, EVERY)]}
    assert len(SAMPLE) == len({t.template for t in SUITE})
    out = phone_oracle.check(list(tasks.values()))
    assert out.tasks == len(tasks) > len(PHONE) // EVERY
    assert out.wrong == []
    assert out.rate("oracle") == 1.0 and out.rate("noop") == out.rate("greedy_wrong") == 0.0


def test_the_sample_refuses_a_bad_step() -> None:
    with pytest.raises(ValueError, match="every"):
        phone_oracle.sample(PHONE, 0)
    assert [t.id for t in phone_oracle.sample(PHONE, 1000, limit=2)] == [
        PHONE[0].id,
        PHONE[1000].id,
    ]


def test_phone_maps_places_are_look_alikes_off_the_plans_routes() -> None:
    task = next(t for t in PHONE if t.template == "maps_stop_least_detour")
    state = _base(task)
    places = state["maps"]["places"]
    assert isinstance(places, list) and len(places) >= 200
    own = {p["id"] for p in task.world["maps"]["places"]}
    clones = [p for p in places if p["id"] not in own]
    labels = {x["label"]: x["address"] for x in task.world["maps"]["labels"]}
    args = next(
        a.arguments
        for a in task.reference_plan or []
        if isinstance(a, ToolCall) and a.tool == "maps_get_directions"
    )
    via = route_via(labels.get(args["origin"], args["origin"]), args["destination"])
    assert clones and not [p for p in clones if p["neighborhood"] in via]
    assert len({p["name"] for p in places}) == len(places)
    assert len({p["address"] for p in places}) == len(places)
    lowest = min(p["rating"] for p in task.world["maps"]["places"])
    assert all(p["rating"] < lowest for p in clones)
    # look-alikes: the same chains, with another word
    bases = {p["name"].split(" ")[0] for p in task.world["maps"]["places"]}
    assert sum(p["name"].split(" ")[0] in bases for p in clones) == len(clones)


def test_phone_timeline_names_cloned_places_weeks_earlier() -> None:
    task = next(t for t in PHONE if t.template == "maps_review_visited_place")
    state = _base(task)
    places = {p["id"]: p for p in state["maps"]["places"]}
    visits = state["maps"]["timeline"]
    assert isinstance(visits, list) and len(visits) > len(task.world["maps"]["timeline"]) * 5
    own_dates = {v["date"] for v in task.world["maps"]["timeline"]}
    for visit in visits[len(task.world["maps"]["timeline"]) :]:
        place = places[visit["place_id"]]
        assert (visit["place_name"], visit["address"]) == (place["name"], place["address"])
        assert visit["date"] < min(own_dates)


def test_phone_bills_are_paid_history_of_the_same_billers() -> None:
    task = next(t for t in PHONE if t.world.get("wallet", {}).get("bills"))
    bills = _base(task)["wallet"]["bills"]
    own = task.world["wallet"]["bills"]
    assert isinstance(bills, list) and len(bills) >= 36
    history = bills[len(own) :]
    assert all(b["status"] == "paid" and b["paid_amount"] == b["amount_due"] for b in history)
    assert {b["biller"] for b in history} == {b["biller"] for b in own}
    assert [b for b in bills if b["status"] != "paid"] == own


def test_base_is_frozen_shared_and_never_changed_by_episodes() -> None:
    task = next(t for t in SAMPLE if t.template == "text_contact_by_name")
    state = _base(task)
    before = orjson.dumps(state)
    a, b = SandboxEnv(), SandboxEnv()
    a.reset(task)
    b.reset(task)
    assert a._store is not None and b._store is not None
    assert a._store.base is b._store.base  # one base for every session
    trajectory = run_episode(a, task, make_planner("oracle"))
    assert trajectory.success
    assert orjson.dumps(state) == before  # the episode changed only its own overlay
    assert b.state() != a.state()
    assert a.session_bytes() < len(before) // 10
    a.reset(task)  # a reset drops the overlay
    assert a.state() == b.state()
    for app in state.values():
        for value in app.values():
            for node in iter_frozen(value):
                assert type(node) in (FrozenDict, FrozenList)


def test_frozen_containers_refuse_changes() -> None:
    record = FrozenDict({"id": "x", "tags": FrozenList(["a"])})
    with pytest.raises(Thaw):
        record["id"] = "y"
    record["id"] = "x"  # setting what is already there changes nothing
    with pytest.raises(Thaw):
        record["tags"].append("b")
    with pytest.raises(Thaw):
        record.pop("id")
    assert orjson.loads(orjson.dumps(record)) == {"id": "x", "tags": ["a"]}


def test_a_read_tool_that_marks_read_copies_only_what_it_changes() -> None:
    task = next(t for t in SAMPLE if t.world.get("messaging", {}).get("messages"))
    env = SandboxEnv()
    env.reset(task)
    base_rows = _base(task)["messaging"]["messages"]
    assert isinstance(base_rows, list)
    unread = next(m for m in base_rows if m["read"] is False)
    phone = unread["sender"] if unread["to"] == "me" else unread["to"]
    feedback = env.step(ToolCall(tool="messaging_read_thread", arguments={"phone": phone}))
    assert feedback.status == "ok" and all(m["read"] for m in feedback.observation)
    assert env._store is not None
    mine = env._store.overlay["messaging"]["messages"]
    shared = sum(1 for x, y in zip(mine, base_rows, strict=True) if x is y)
    assert shared >= len(base_rows) - len(feedback.observation)  # the rest is the base's
    assert unread["read"] is False  # the base is untouched


def test_world_sizes_and_the_world_option() -> None:
    sizes = world_sizes(SAMPLE[:3])
    assert sizes["sampled_tasks"] == 3 and sizes["bytes_max"] > sizes["records_max"] > 0
    result = CliRunner().invoke(cli_app, ["tasks", "stats", "--world", "tablet"])
    assert result.exit_code != 0 and "--world" in result.output
