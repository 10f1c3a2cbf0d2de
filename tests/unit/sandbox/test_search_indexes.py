"""Search and list tools that read indexes kept with a committed list answer exactly what a scan
answers, also after a session re-made the list (records edited, appended, removed: the re-made
list's indexes and views are carried over or patched from its root's, or built afresh).

Each answer is compared with the same tool run on a plain, mutable copy of the session's state
(apps scan plain lists). The overlay writes go through `CallScope.commit`, the path every tool
call's changes take. Also: `FrozenList.follow` carries the id and field indexes correctly and
patches views instead of rebuilding them, and `TextIndex.candidates` never misses a match.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from qpa.contract import Feedback, Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.cow import CallScope, FrozenList, Store, freeze, thaw
from qpa.envs.sandbox.engine import TextIndex, ToolError, World
from qpa.envs.sandbox.env import ok_feedback
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import generate_suite

PHONE = [t for t in generate_suite(profile="phone") if t.split == "test"]

# (app, collection) whose records the random writes change, per search tool family
COLLECTIONS = {
    "email": ("email", "messages"),
    "messaging": ("messaging", "messages"),
    "music": ("music", "catalog"),
    "shop": ("shop", "products"),
    "orders": ("shop", "orders"),
    "notes": ("notes", "notes"),
    "calendar": ("calendar", "events"),
    "food": ("food", "menu"),
    "wallet": ("wallet", "transactions"),
    "contacts": ("contacts", "contacts"),
    "hotels": ("hotels", "rooms"),
}


def _task(app: str, collection: str) -> Task:
    return next(t for t in PHONE if len(t.world.get(app, {}).get(collection, [])) > 0)


TASKS = {family: _task(app, collection) for family, (app, collection) in COLLECTIONS.items()}


def _scan(env: SandboxEnv, task: Task, call: ToolCall) -> tuple[str, Any]:
    """The tool's answer on a plain copy of the session's state (apps scan plain lists)."""
    state = thaw({k: v for k, v in env.state().items() if k != "_user"})
    assert env._world is not None
    world = World(state, task.user, env._world.now)
    bound = all_tools()[call.tool]
    parsed = bound.args_model.model_validate(call.arguments)
    try:
        result = bound.method(all_apps()[bound.app.name](world), **parsed.__dict__)
    except ToolError as err:
        return "error", str(err)
    return "ok", orjson.loads(orjson.dumps(result))


def _indexed(env: SandboxEnv, call: ToolCall) -> tuple[str, Any]:
    env._steps = 0  # many calls per episode: stay under the step budget
    feedback = env.step(call)
    if feedback.status == "error":
        assert feedback.error != "environment_failure", feedback.message
        return "error", feedback.message
    return "ok", orjson.loads(orjson.dumps(feedback.observation))


def _rows(env: SandboxEnv, app: str, collection: str) -> list[dict[str, Any]]:
    assert env._store is not None
    rows = env._store.get(app, collection)
    assert isinstance(rows, list) and rows
    return rows


def _overlay_write(env: SandboxEnv, app: str, collection: str, draw: st.DrawFn) -> None:
    """Re-make the session's list as a tool call would (through `CallScope.commit`): a record
    takes a field of another record (keeping its id), a record is appended (a copy of another
    with a new id), or a record is removed."""
    assert env._store is not None
    scope = CallScope(env._store, {}, writes=True)
    rows = list(scope.lookup(app, collection))
    kind = draw(st.sampled_from(["edit", "edit", "edit", "append", "remove"]), label="write")
    i = draw(st.integers(0, len(rows) - 1), label="record")
    j = draw(st.integers(0, len(rows) - 1), label="other")
    if kind == "edit":
        record = thaw(rows[i])
        fields = sorted(k for k in rows[j] if k != "id")
        if fields:
            field = draw(st.sampled_from(fields), label="field")
            record[field] = thaw(rows[j][field])
        rows[i] = record
    elif kind == "append":
        record = thaw(rows[j])
        record["id"] = f"{record.get('id', 'x')}_copy{len(rows)}"
        rows.append(record)
    elif len(rows) > 1:
        del rows[i]
    scope.assign(app, collection, rows)
    scope.commit()


def _piece(text: str, draw: st.DrawFn, *, words: bool) -> str:
    """Part of `text`: whole words (`words`) or a slice, possibly across a space."""
    parts = text.split()
    if not parts:
        return "zz"
    if words:
        start = draw(st.integers(0, len(parts) - 1))
        chosen = parts[start : start + draw(st.integers(1, 2))]
        if draw(st.booleans()):  # part of a word
            chosen[0] = chosen[0][: draw(st.integers(1, max(1, len(chosen[0]))))]
        return " ".join(chosen)
    at = draw(st.integers(0, max(0, len(text) - 1)))
    return text[at : at + draw(st.integers(1, 12))] or text


def _read(env: SandboxEnv, family: str, draw: st.DrawFn) -> ToolCall:
    """A random call of one of the family's indexed tools, with values taken from the world."""
    app, collection = COLLECTIONS[family]
    rows = _rows(env, app, collection)
    r = draw(st.sampled_from(rows), label="from")
    limit = draw(st.integers(1, 50), label="limit")
    offset = draw(st.sampled_from([0, 0, 1, 5, 20]), label="offset")
    flip = draw(st.booleans(), label="case")
    if family == "email":
        tool = draw(st.sampled_from(["email_search", "email_list", "email_list_accounts"]))
        if tool == "email_list_accounts":
            return ToolCall(tool=tool, arguments={})
        folder = draw(st.sampled_from([None, "inbox", "archive", "sent", "trash"]))
        if tool == "email_list":
            return ToolCall(
                tool=tool,
                arguments={
                    "folder": folder or "inbox",
                    "unread_only": draw(st.booleans()),
                    "limit": limit,
                    "offset": offset,
                },
            )
        query = (
            "" if draw(st.booleans()) else _piece(f"{r['subject']} {r['body']}", draw, words=True)
        )
        args: dict[str, Any] = {"query": query.upper() if flip else query, "limit": limit}
        args["offset"] = offset
        if folder is not None:
            args["folder"] = folder
        if draw(st.booleans()):
            args["unread_only"] = True
        if draw(st.booleans()):
            args["has_attachment"] = draw(st.booleans())
        if draw(st.booleans()):
            who = draw(st.sampled_from([r["sender"], r.get("sender_name") or r["sender"]]))
            args["sender"] = _piece(who, draw, words=False)
        return ToolCall(tool=tool, arguments=args)
    if family == "messaging":
        if draw(st.booleans()):
            return ToolCall(
                tool="messaging_list_threads",
                arguments={"unread_only": draw(st.booleans()), "limit": limit, "offset": offset},
            )
        text = _piece(r["text"], draw, words=False)
        return ToolCall(
            tool="messaging_search",
            arguments={"text": text.upper() if flip else text, "limit": limit, "offset": offset},
        )
    if family == "music":
        tool = draw(st.sampled_from(["music_search", "music_artist_top_tracks"]))
        if tool == "music_artist_top_tracks":
            artist = r["artist"].upper() if flip else r["artist"]
            return ToolCall(tool=tool, arguments={"artist": artist, "limit": min(limit, 20)})
        query = _piece(f"{r['title']} {r['artist']} {r['album']}", draw, words=True)
        args = {"query": query, "limit": limit, "offset": offset}
        if draw(st.booleans()):
            args["genre"] = r["genre"]
        return ToolCall(tool=tool, arguments=args)
    if family == "shop":
        query = (
            "" if draw(st.booleans()) else _piece(f"{r['title']} {r['brand']}", draw, words=True)
        )
        args = {"query": query[:80], "limit": limit, "offset": offset}
        if draw(st.booleans()):
            args["category"] = r["category"]
        args["sort"] = draw(st.sampled_from(["relevance", "price_asc", "rating"]))
        args["in_stock_only"] = draw(st.booleans())
        return ToolCall(tool="shop_search", arguments=args)
    if family == "orders":
        line = draw(st.sampled_from(r["lines"])) if r["lines"] else {"title": ""}
        query = "" if draw(st.booleans()) else _piece(line["title"], draw, words=False)
        args = {"query": query[:80], "limit": limit, "offset": offset}
        if draw(st.booleans()):
            args["status"] = r["status"]
        return ToolCall(tool="shop_list_orders", arguments=args)
    if family == "notes":
        text = f"{r.get('title', '')} {r.get('body', '')}"
        query = _piece(text, draw, words=False).strip() or "note"
        return ToolCall(tool="notes_search", arguments={"query": query, "limit": limit})
    if family == "calendar":
        text = " ".join(str(r.get(k, "")) for k in ("title", "location", "notes"))
        query = _piece(text, draw, words=False).strip() or "meeting"
        return ToolCall(tool="calendar_search_events", arguments={"query": query, "limit": limit})
    if family == "food":
        query = _piece(r["name"], draw, words=False).strip()[:80] or "pizza"
        return ToolCall(
            tool="food_search_menu",
            arguments={"query": query, "limit": limit, "offset": offset, "sort": "price_asc"},
        )
    if family == "wallet" and draw(st.booleans()):
        return ToolCall(tool="wallet_get_balance", arguments={})
    if family == "wallet":
        args = {"limit": limit, "offset": offset}
        if draw(st.booleans()):
            args["counterparty"] = _piece(r["counterparty"], draw, words=False)[:80]
        if draw(st.booleans()):
            args["type"] = r["type"]
        return ToolCall(tool="wallet_list_transactions", arguments=args)
    if family == "contacts" and draw(st.booleans()):
        text = draw(st.sampled_from([r["name"], r["phone"], r["email"]])) or r["name"]
        query = _piece(text, draw, words=False)
        return ToolCall(
            tool="contacts_search", arguments={"query": query.upper() if flip else query}
        )
    if family == "contacts":
        groups = sorted({g for c in rows for g in c.get("groups", [])}) or ["family"]
        return ToolCall(
            tool="contacts_list_group",
            arguments={"group": draw(st.sampled_from(groups)), "limit": limit, "offset": offset},
        )
    hotels = _rows(env, "hotels", "hotels")
    hotel = draw(st.sampled_from(hotels))
    assert env._world is not None
    day = env._world.now.date() + timedelta(days=draw(st.integers(1, 30)))
    return ToolCall(
        tool="hotels_search",
        arguments={
            "city": hotel["city"],
            "check_in": day.isoformat(),
            "check_out": (day + timedelta(days=draw(st.integers(1, 4)))).isoformat(),
            "guests": draw(st.integers(1, 4)),
            "limit": limit,
            "offset": offset,
        },
    )


@settings(
    max_examples=60,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a failure is reported unshrunk
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(family=st.sampled_from(sorted(TASKS)), data=st.data())
def test_indexed_search_tools_match_a_scan_after_overlay_writes(
    family: str, data: st.DataObject
) -> None:
    task = TASKS[family]
    app, collection = COLLECTIONS[family]
    env = SandboxEnv()
    env.reset(task)
    for _ in range(4):
        if data.draw(st.booleans(), label="write first"):
            _overlay_write(env, app, collection, data.draw)
        call = _read(env, family, data.draw)
        assert _indexed(env, call) == _scan(env, task, call), call


# --------------------------------------------------------------------------- cow lineage


def _committed(rows: list[dict[str, Any]]) -> tuple[Store, FrozenList]:
    base = {"app": {"rows": freeze(rows)}}
    return Store(base), base["app"]["rows"]


def _remake(store: Store, change: Any) -> FrozenList:
    scope = CallScope(store, {}, writes=True)
    rows = list(scope.lookup("app", "rows"))
    change(rows)
    scope.assign("app", "rows", rows)
    scope.commit()
    after = store.get("app", "rows")
    assert type(after) is FrozenList
    return after


def test_a_remade_list_carries_its_roots_indexes_and_patches_its_views() -> None:
    store, root = _committed(
        [{"id": f"r{i}", "kind": "ab"[i % 2], "text": f"w{i} common"} for i in range(200)]
    )
    assert root.position("r7") == 7
    assert root.positions("kind", "a") == list(range(0, 200, 2))
    builds: list[int] = []

    def build(rows: list[Any]) -> list[str]:
        builds.append(len(rows))
        return [r["kind"] for r in rows]

    def patch(view: list[str], _root: Any, rows: list[Any], changed: list[int]) -> list[str]:
        out = list(view) + [""] * (len(rows) - len(view))
        for i in changed:
            out[i] = rows[i]["kind"]
        return out

    assert root.derived("kinds", build, patch)[:3] == ["a", "b", "a"]

    def edit(rows: list[Any]) -> None:
        rows[3] = {**rows[3], "kind": "a"}
        rows.append({"id": "new", "kind": "b", "text": "fresh"})

    after = _remake(store, edit)
    assert after._root is root and after._changed == [3, 200]
    assert after._by_id is not None and after.position("new") == 200 and after.position("r3") == 3
    assert after.positions("kind", "a") == sorted([*range(0, 200, 2), 3])
    assert after.positions("kind", "b") == [*(i for i in range(1, 200, 2) if i != 3), 200]
    assert root.positions("kind", "b")[:2] == [1, 3]  # the root's buckets are untouched
    assert after.derived("kinds", build, patch) == [r["kind"] for r in after]
    assert builds == [200]  # patched from the root's view, not rebuilt
    # a second edit keeps the same root (the chain does not grow)
    again = _remake(store, lambda rows: rows.__setitem__(5, {**rows[5], "text": "w5 other"}))
    assert again._root is root and again._changed == [3, 5, 200]
    assert again.derived("kinds", build, patch) == [r["kind"] for r in again] and builds == [200]
    # a removal shifts positions: the list stands alone and builds its own
    alone = _remake(store, lambda rows: rows.__delitem__(0))
    assert alone._root is None and alone.position("r1") == 0
    assert alone.derived("kinds", build, patch) == [r["kind"] for r in alone]
    assert builds == [200, 200]


def test_an_id_changed_in_place_rebuilds_the_id_index() -> None:
    store, root = _committed([{"id": i} for i in range(10)])
    root.position(0)
    after = _remake(store, lambda rows: rows.__setitem__(4, {"id": 99}))
    assert after._root is root and after._by_id is None  # not carried: built when needed
    assert after.position(99) == 4 and after.position(4) is None


def test_many_changes_build_afresh() -> None:
    store, _ = _committed([{"id": i, "v": 0} for i in range(400)])
    after = _remake(
        store, lambda rows: rows.__setitem__(slice(0, 300), [{"id": i, "v": 1} for i in range(300)])
    )
    assert after._root is None and after.positions("v", 1) == list(range(300))


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="abAB \tçΣς\u0130x", max_size=12), min_size=1, max_size=12),
    query=st.text(alphabet="abAB çΣς\u0130x", min_size=1, max_size=5),
    changed=st.lists(st.text(alphabet="ab xΣ", max_size=8), max_size=3),
)
def test_text_index_candidates_never_miss_a_match(
    texts: list[str], query: str, changed: list[str]
) -> None:
    rows = [{"t": t} for t in texts]
    index = TextIndex.builder(lambda r: r["t"].lower())(rows)
    words = query.lower().split()
    if words:
        want = [i for i, r in enumerate(rows) if all(w in r["t"].lower() for w in words)]
        assert set(want) <= set(index.candidates(words))
    # patched with appended records: still never misses
    more = rows + [{"t": t} for t in changed]
    patched = TextIndex.patcher(lambda r: r["t"].lower())(
        index, rows, more, list(range(len(rows), len(more)))
    )
    if words:
        want = [i for i, r in enumerate(more) if all(w in r["t"].lower() for w in words)]
        assert set(want) <= set(patched.candidates(words))
        for made in (index, patched):  # one by one: the same positions, ascending, once each
            assert list(made.iter_candidates(words)) == made.candidates(words)
            assert made.candidates(words) == sorted(set(made.candidates(words)))


def test_a_field_index_first_asked_of_a_remade_list_is_its_roots_patched() -> None:
    store, root = _committed([{"id": i, "thread": f"t{i % 3}"} for i in range(30)])
    after = _remake(store, lambda rows: rows.append({"id": 30, "thread": "t9"}))
    assert after._root is root and "thread" not in root._by_field
    assert after.positions("thread", "t1") == list(range(1, 30, 3))
    assert after.positions("thread", "t9") == [30]
    assert "thread" in root._by_field and root.positions("thread", "t9") == []


def test_ok_feedback_is_feedback_ok() -> None:
    made, model = ok_feedback({"rows": [1, 2]}), Feedback.ok({"rows": [1, 2]})
    assert made == model and made.model_dump_json() == model.model_dump_json()
    assert made.model_fields_set == model.model_fields_set and repr(made) == repr(model)
    assert Feedback.model_validate(made.model_dump()) == made
