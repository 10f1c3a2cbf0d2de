"""`SessionStore`'s fairness rules, with sessions made busy by holding their locks (a request
in flight): a client at its limit replaces its own oldest idle session, busy sessions are never
evicted, and what live sessions hold is refused with `Retry-After` and counted."""

from __future__ import annotations

import asyncio

import pytest

from qpa.envs.server import ServerError, SessionStore

A = "token:alice"
B = "token:bob"


def sid(n: int) -> str:
    return f"session-{n:04d}-" + "x" * 32


def store(**options: object) -> SessionStore:
    settings: dict[object, object] = {"max_sessions": 4, "session_ttl_s": 900.0}
    settings.update(options)
    return SessionStore("sandbox", **settings)  # type: ignore[arg-type]


def refused(s: SessionStore, session_id: str, client: str) -> ServerError:
    with pytest.raises(ServerError) as caught:
        s.get_or_create(session_id, client)
    return caught.value


def test_a_client_at_its_limit_replaces_its_own_oldest_idle_session() -> None:
    s = store(max_sessions=8, max_sessions_per_client=2, bind_owner=True)
    s.get_or_create(sid(0), B)
    s.get_or_create(sid(1), A)
    s.get_or_create(sid(2), A)
    s.get_or_create(sid(3), A)  # A at its limit: its oldest (sid 1) gives way, not B's
    assert sid(1) not in s and sid(0) in s and s.held_by(A) == 2
    with pytest.raises(ServerError) as gone:
        s.get(sid(1), A)
    assert gone.value.kind == "session_evicted"
    assert s.refused == {}


async def _busy_client_gets_429() -> None:
    s = store(max_sessions=8, max_sessions_per_client=2, bind_owner=True)
    mine = [s.get_or_create(sid(i), A) for i in range(2)]
    for session in mine:
        await session.lock.acquire()  # each has a request in flight
    over = refused(s, sid(9), A)
    assert over.status == 429 and over.kind == "too_many_sessions_for_client"
    assert over.headers == {"Retry-After": "1"}
    assert s.refused["client_busy"] == 1 and s.held_by(A) == 2
    s.get_or_create(sid(10), B)  # another client is served
    mine[0].lock.release()
    s.get_or_create(sid(9), A)  # the session no longer busy gives way
    assert sid(0) not in s and sid(1) in s


def test_a_client_whose_sessions_are_all_busy_gets_429_and_counted() -> None:
    asyncio.run(_busy_client_gets_429())


async def _busy_server_gets_503() -> None:
    s = store(max_sessions=3, evict_idle_s=30.0)
    held = [s.get_or_create(sid(i), f"peer:10.0.0.{i}") for i in range(3)]
    for session in held:
        await session.lock.acquire()
    full = refused(s, sid(7), "peer:10.0.0.9")
    assert full.status == 503 and full.kind == "too_many_sessions"
    assert full.headers == {"Retry-After": "1"}  # busy sessions: no idle clock to wait for
    for session in held:
        session.lock.release()
    again = refused(s, sid(7), "peer:10.0.0.9")  # idle now, but not for evict_idle_s
    assert again.headers is not None and 29 <= int(again.headers["Retry-After"]) <= 30
    assert s.refused["full"] == 2
    # the holder of a busy session cannot evict it; an idle one of its own gives way
    await held[0].lock.acquire()
    assert refused(s, sid(8), "peer:10.0.0.0").status == 503
    assert sid(0) in s and s.refused["full"] == 3
    held[0].lock.release()
    s.get_or_create(sid(8), "peer:10.0.0.0")
    assert sid(0) not in s and sid(8) in s and len(s) == 3


def test_live_sessions_holding_the_server_answer_503_with_retry_after() -> None:
    asyncio.run(_busy_server_gets_503())


def test_another_clients_session_is_not_found_and_its_fate_not_told() -> None:
    s = store(max_sessions=2, max_sessions_per_client=1, bind_owner=True)
    s.get_or_create(sid(0), A)
    theirs = refused(s, sid(0), B)  # reset with another client's id
    assert theirs.status == 404 and theirs.kind == "unknown_session"
    assert theirs.field == "session_id"
    with pytest.raises(ServerError) as looked:
        s.get(sid(0), B)
    assert looked.value.kind == "unknown_session" and looked.value.message == theirs.message
    s.get_or_create(sid(1), A)  # A's limit: sid 0 is evicted
    with pytest.raises(ServerError) as after:
        s.get(sid(0), B)
    assert after.value.kind == "unknown_session"  # B is not told it was evicted ...
    with pytest.raises(ServerError) as own:
        s.get(sid(0), A)
    assert own.value.kind == "session_evicted"  # ... A is
