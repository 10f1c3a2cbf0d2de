"""Indexed list tools answer exactly what a scan answers: `messaging_list_threads`, `email_list`,
`calendar_list_events` and `contacts_search` read views kept with a committed (frozen) list;
after random writes in a session's overlay, each answer is compared with the same tool run on
a plain, mutable copy of the session's state (the scan it replaces)."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from qpa.contract import Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.cow import FrozenList, thaw
from qpa.envs.sandbox.engine import ToolError, World
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import generate_suite

PHONE = generate_suite(profile="phone")


def _task(app: str, collection: str) -> Task:
    return next(
        t for t in PHONE if t.split == "test" and len(t.world.get(app, {}).get(collection, [])) > 3
    )


TASKS = {
    "messaging": _task("messaging", "messages"),
    "email": _task("email", "messages"),
    "calendar": _task("calendar", "events"),
    "contacts": _task("contacts", "contacts"),
}


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
        return "error", feedback.message
    return "ok", orjson.loads(orjson.dumps(feedback.observation))


def _rows(env: SandboxEnv, app: str, collection: str) -> list[dict[str, Any]]:
    rows = env.state()[app][collection]
    assert isinstance(rows, list)
    return rows


def _write(env: SandboxEnv, app: str, draw: st.DrawFn) -> None:
    """One random state change in `app` (its result does not matter, only the state)."""
    if app == "messaging":
        rows = _rows(env, "messaging", "messages")
        m = draw(st.sampled_from(rows))
        peer = m["sender"] if m["sender"] != "me" else m["to"]
        call = draw(
            st.sampled_from(
                [
                    ToolCall(tool="messaging_send", arguments={"to": peer, "text": "hi again"}),
                    ToolCall(tool="messaging_send", arguments={"to": "+1-555-0177", "text": "new"}),
                    ToolCall(tool="messaging_read_thread", arguments={"phone": peer}),
                    ToolCall(tool="messaging_delete", arguments={"message_id": m["id"]}),
                ]
            )
        )
    elif app == "email":
        rows = _rows(env, "email", "messages")
        ids = [draw(st.sampled_from(rows))["id"] for _ in range(draw(st.integers(1, 3)))]
        ids = list(dict.fromkeys(ids))
        call = draw(
            st.sampled_from(
                [
                    ToolCall(tool="email_mark", arguments={"message_ids": ids, "read": False}),
                    ToolCall(tool="email_mark", arguments={"message_ids": ids, "read": True}),
                    ToolCall(
                        tool="email_move", arguments={"message_ids": ids, "folder": "archive"}
                    ),
                    ToolCall(tool="email_move", arguments={"message_ids": ids, "folder": "inbox"}),
                    ToolCall(tool="email_delete", arguments={"message_ids": ids}),
                ]
            )
        )
    elif app == "calendar":
        rows = _rows(env, "calendar", "events")
        event = draw(st.sampled_from(rows))
        day = draw(st.sampled_from([e["start"][:10] for e in rows if "start" in e]))
        hour = draw(st.integers(6, 20))
        start, end = f"{day}T{hour:02d}:00", f"{day}T{hour:02d}:45"
        call = draw(
            st.sampled_from(
                [
                    ToolCall(
                        tool="calendar_create_event",
                        arguments={"title": "Sync", "start": start, "end": end,
                                   "allow_overlap": True},
                    ),
                    ToolCall(
                        tool="calendar_create_recurring_event",
                        arguments={"title": "Run", "start": start, "end": end,
                                   "frequency": draw(st.sampled_from(["daily", "weekly",
                                                                      "monthly"])),
                                   "count": draw(st.integers(2, 6))},
                    ),
                    ToolCall(tool="calendar_cancel_event", arguments={"event_id": event["id"]}),
                    ToolCall(tool="calendar_delete_event", arguments={"event_id": event["id"]}),
                ]
            )
        )  # fmt: skip
    else:
        rows = _rows(env, "contacts", "contacts")
        c = draw(st.sampled_from(rows))
        call = draw(
            st.sampled_from(
                [
                    ToolCall(
                        tool="contacts_create",
                        arguments={"name": f"{c['name'].split()[0]} Quill",
                                   "phone": f"+1-555-{draw(st.integers(1000, 9999))}",
                                   "email": "quill@example.com"},
                    ),
                    ToolCall(tool="contacts_update",
                             arguments={"contact_id": c["id"], "email": "Moved@Example.org"}),
                    ToolCall(tool="contacts_delete", arguments={"contact_id": c["id"]}),
                ]
            )
        )  # fmt: skip
    _indexed(env, call)


def _read(env: SandboxEnv, app: str, draw: st.DrawFn) -> ToolCall:
    """A random call of the app's indexed list tool."""
    limit = draw(st.integers(1, 50))
    offset = draw(st.sampled_from([0, 0, 1, 5, 20, 45]))
    if app == "messaging":
        return ToolCall(
            tool="messaging_list_threads",
            arguments={"unread_only": draw(st.booleans()), "limit": limit, "offset": offset},
        )
    if app == "email":
        labels = sorted({lab for m in _rows(env, "email", "messages") for lab in m["labels"]})
        args: dict[str, Any] = {
            "folder": draw(st.sampled_from(["inbox", "archive", "sent", "trash", "spam"])),
            "unread_only": draw(st.booleans()),
            "limit": min(limit, 50),
            "offset": offset,
        }
        if labels and draw(st.booleans()):
            args["label"] = draw(st.sampled_from(labels))
        return ToolCall(tool="email_list", arguments=args)
    if app == "calendar":
        rows = _rows(env, "calendar", "events")
        day = draw(st.sampled_from([e["start"][:10] for e in rows if "start" in e]))
        args = {"date_from": day, "limit": min(limit, 100), "offset": offset}
        if draw(st.booleans()):
            # a range ending up to 62 days later (some starting before the chosen day)
            first = date.fromisoformat(day) - timedelta(days=draw(st.integers(0, 20)))
            args["date_from"] = first.isoformat()
            args["date_to"] = (first + timedelta(days=draw(st.integers(0, 62)))).isoformat()
        args["include_cancelled"] = draw(st.booleans())
        return ToolCall(tool="calendar_list_events", arguments=args)
    rows = _rows(env, "contacts", "contacts")
    c = draw(st.sampled_from(rows))
    field = draw(st.sampled_from([c["name"], c["phone"], c["email"], c["name"].upper()]))
    if not field:
        field = c["name"]
    at = draw(st.integers(0, max(0, len(field) - 1)))
    query = field[at : at + draw(st.integers(1, 8))] or field
    return ToolCall(tool="contacts_search", arguments={"query": query, "limit": limit % 30 + 1})


@settings(
    max_examples=24,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a failure is reported unshrunk
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(app=st.sampled_from(sorted(TASKS)), data=st.data())
def test_indexed_list_tools_match_a_scan_after_overlay_writes(
    app: str, data: st.DataObject
) -> None:
    task = TASKS[app]
    env = SandboxEnv()
    env.reset(task)
    for _ in range(5):
        if data.draw(st.booleans(), label="write first"):
            _write(env, app, data.draw)
        call = _read(env, app, data.draw)
        got, want = _indexed(env, call), _scan(env, task, call)
        assert got == want, call


@pytest.mark.parametrize("app", sorted(TASKS))
def test_a_base_view_is_built_once_and_shared_by_sessions(app: str) -> None:
    task = TASKS[app]
    if app == "messaging":
        call = ToolCall(tool="messaging_list_threads", arguments={"limit": 5})
    elif app == "email":
        call = ToolCall(tool="email_list", arguments={"limit": 5})
    elif app == "calendar":
        day = task.world["calendar"]["events"][0]["start"][:10]
        call = ToolCall(tool="calendar_list_events", arguments={"date_from": day})
    else:
        query = task.world["contacts"]["contacts"][0]["name"][:3]
        call = ToolCall(tool="contacts_search", arguments={"query": query})
    one, two = SandboxEnv(), SandboxEnv()
    one.reset(task)
    two.reset(task)
    assert _indexed(one, call) == _scan(one, task, call)
    assert one._store is not None and two._store is not None
    collection = "contacts" if app == "contacts" else "events" if app == "calendar" else "messages"
    rows = one._store.get(app, collection)
    assert type(rows) is FrozenList and rows is two._store.get(app, collection)
    assert rows._memo, "the view is kept with the shared base list"
    views = dict(rows._memo)
    assert _indexed(two, call) == _indexed(one, call)
    assert all(rows._memo[k] is v for k, v in views.items())  # not rebuilt by the other session
    if app == "messaging":  # the threads handed out are copies: a caller's change stays there
        answer = two.step(call).observation
        answer[0]["phone"] = "changed"
        assert _indexed(one, call) == _scan(one, task, call)


def test_contacts_search_with_the_separator_in_the_query_scans() -> None:
    task = TASKS["contacts"]
    env = SandboxEnv()
    env.reset(task)
    call = ToolCall(tool="contacts_search", arguments={"query": "a\x00b"})
    assert _indexed(env, call) == _scan(env, task, call) == ("ok", [])
