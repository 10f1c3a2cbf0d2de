"""Messaging: SMS-style conversations with phone numbers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.cow import FrozenList
from qpa.envs.sandbox.engine import ISO_MINUTE, PHONE, App, Limit, Offset, fail, paginate, tool


class Message(TypedDict):
    id: str
    thread: str
    to: str
    sender: str
    text: str
    time: str
    read: bool
    scheduled_for: str | None


def thread_id(phone: str) -> str:
    """A conversation's id: `t_` and the digits of the other side's phone number."""
    return "t_" + "".join(ch for ch in phone if ch.isdigit())


def message_record(message_id: str, sender: str, text: str, time: str) -> dict[str, Any]:
    """A received text message (unread, in the sender's conversation), for task worlds."""
    return {
        "id": message_id,
        "thread": thread_id(sender),
        "to": "me",
        "sender": sender,
        "text": text,
        "time": time,
        "read": False,
        "scheduled_for": None,
    }


def _threads(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per conversation, in order of first message: its phone, latest message and
    time, unread count."""
    threads: dict[str, dict[str, Any]] = {}
    for m in messages:
        peer = m["to"] if m["sender"] == "me" else m["sender"]
        entry = threads.setdefault(m["thread"], {"thread": m["thread"], "phone": peer, "unread": 0})
        entry["last"] = m["text"]
        entry["time"] = m["time"]
        if not m["read"] and m["sender"] != "me":
            entry["unread"] += 1
    return list(threads.values())


def _lowered_text(m: dict[str, Any]) -> str:
    """What `messaging_search` looks for its text in."""
    return str(m["text"].lower())


def _patch_threads(
    views: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    root: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    changed: list[int],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`_thread_views` of a re-made list from its root's: each conversation a changed message
    was or is in is recomputed from its messages (by the thread index); conversations keep
    their order of first message, a new one goes last. Built afresh when a change could reorder
    them (a replaced message that moved to another conversation, or a conversation emptied)."""
    every, _ = views
    touched: dict[str, None] = {}
    for i in changed:
        if i < len(root):
            if root[i]["thread"] != rows[i]["thread"]:
                return _thread_views(rows)
            touched[root[i]["thread"]] = None
        touched[rows[i]["thread"]] = None
    frozen = rows if type(rows) is FrozenList else FrozenList(rows)
    fresh: dict[str, dict[str, Any]] = {}
    first: dict[str, int] = {}
    for thread in touched:
        found = frozen.positions("thread", thread)
        if not found:
            return _thread_views(rows)
        (entry,) = _threads([rows[i] for i in found])
        fresh[thread], first[thread] = entry, found[0]
    out = [fresh.pop(t["thread"], t) for t in every]
    if fresh:  # new conversations (first message appended): last, in order of first message
        if any(first[t] < len(root) for t in fresh):
            return _thread_views(rows)
        out.extend(sorted(fresh.values(), key=lambda t: first[t["thread"]]))
    return out, [t for t in out if t["unread"]]


def _thread_views(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All conversations and the unread ones (a committed list's view; pages are copied out)."""
    rows = _threads(messages)
    return rows, [t for t in rows if t["unread"]]


class MessagingApp(App):
    name = "messaging"
    title = "Messages"
    description = "Text messages: read conversations, send, schedule and forward messages."
    skills = {
        "reply_in_thread": (
            "To answer someone, find their conversation with messaging_list_threads, read it with "
            "messaging_read_thread, then messaging_send to the thread's phone number."
        ),
        "spam_cleanup": (
            "Reporting spam means two things: messaging_block the sender's number, then "
            "messaging_delete every message from it. Deleting alone lets the sender text again."
        ),
        "scheduled_send": (
            "'Send it tomorrow at 8' means messaging_schedule with an ISO time "
            "(YYYY-MM-DDTHH:MM), not messaging_send now."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"messages": [], "blocked": []}

    @tool()
    def messaging_list_threads(
        self, unread_only: bool = False, limit: Limit = 50, offset: Offset = 0
    ) -> list[dict[str, Any]]:
        """List conversations (one per phone number) with their latest message and unread count,
        `limit` from `offset` on."""
        messages = self.records("messages")
        if type(messages) is FrozenList:  # committed: the aggregate is kept with the list
            rows, unread = messages.derived("messaging.threads", _thread_views, _patch_threads)
            return [dict(t) for t in paginate(unread if unread_only else rows, limit, offset)]
        rows = _threads(messages)
        return paginate([t for t in rows if t["unread"]] if unread_only else rows, limit, offset)

    @tool()
    def messaging_read_thread(
        self,
        phone: Annotated[str, Field(min_length=3)],
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
    ) -> list[Message]:
        """Read the latest messages with a phone number (marks them read)."""
        thread = thread_id(phone)
        hits = self._matching("messages", {"thread": thread})  # by index: the thread only
        rows = self.records("messages")
        for at in hits:
            if rows[at].get("read") is not True:
                self.editable("messages", at)["read"] = True
        rows = self.records("messages")
        return [rows[at] for at in hits][-limit:]  # type: ignore[return-value]

    @tool()
    def messaging_search(
        self, text: Annotated[str, Field(min_length=1)], limit: Limit = 50, offset: Offset = 0
    ) -> list[Message]:
        """Search all messages for text (case-insensitive), `limit` from `offset` on."""
        q = text.lower()
        messages = self.records("messages")
        # Committed: only the messages the word index names for the query's words can hold it
        # (in list order, stopping at the page's end); else, or with no words, a scan.
        hits = self.iter_text_candidates("messages", "messaging.search", _lowered_text, q.split())
        source = messages if hits is None else map(messages.__getitem__, hits)
        found = []
        for m in source:
            if q in m["text"].lower():
                found.append(m)
                if hits is not None and len(found) >= offset + limit:
                    break
        return paginate(found, limit, offset)  # type: ignore[arg-type]

    @tool("write")
    def messaging_send(
        self,
        to: Annotated[str, Field(pattern=PHONE, description="Phone number")],
        text: Annotated[str, Field(min_length=1, max_length=1000)],
    ) -> Message:
        """Send a text message to a phone number now."""
        if to in self.state.get("blocked", []):
            raise fail(f"{to} is blocked; unblock it before sending")
        return self._store(to, text, None)

    @tool("write")
    def messaging_schedule(
        self,
        to: Annotated[str, Field(pattern=PHONE)],
        text: Annotated[str, Field(min_length=1, max_length=1000)],
        send_at: Annotated[str, Field(pattern=ISO_MINUTE, description="ISO time")],
    ) -> Message:
        """Schedule a text message for later delivery."""
        if send_at <= self.world.iso_now():
            raise fail(f"send_at {send_at} is not in the future (now {self.world.iso_now()})")
        return self._store(to, text, send_at)

    @tool("write")
    def messaging_forward(
        self, message_id: str, to: Annotated[str, Field(pattern=PHONE)]
    ) -> Message:
        """Forward an existing message to another phone number."""
        original = self.find("messages", message_id, what="message")
        return self._store(to, original["text"], None)

    @tool("write")
    def messaging_block(self, phone: str) -> dict[str, Any]:
        """Block a phone number: no messages can be sent to or received from it."""
        blocked: list[str] = self.state.setdefault("blocked", [])
        if phone not in blocked:
            blocked.append(phone)
        return {"blocked": phone}

    @tool("write")
    def messaging_unblock(self, phone: str) -> dict[str, Any]:
        """Unblock a phone number."""
        blocked: list[str] = self.state.setdefault("blocked", [])
        if phone not in blocked:
            raise fail(f"{phone} is not blocked")
        blocked.remove(phone)
        return {"unblocked": phone}

    @tool("write")
    def messaging_delete(self, message_id: str) -> dict[str, Any]:
        """Delete one message."""
        record = self.find("messages", message_id, what="message")
        self.records("messages").remove(record)
        return {"deleted": message_id}

    @tool("write")
    def messaging_mark_read(self, phone: Annotated[str, Field(min_length=3)]) -> dict[str, Any]:
        """Mark every message from a phone number as read without opening the conversation."""
        thread = thread_id(phone)
        rows = [m for m in self.records("messages") if m["thread"] == thread and not m["read"]]
        if not any(m["thread"] == thread for m in self.records("messages")):
            raise fail(f"no conversation with {phone}")
        for m in rows:
            m["read"] = True
        return {"marked_read": len(rows)}

    def _store(self, to: str, text: str, scheduled_for: str | None) -> Message:
        message: Message = {
            "id": self.world.new_id("m"),
            "thread": thread_id(to),
            "to": to,
            "sender": "me",
            "text": text,
            "time": self.world.iso_now(),
            "read": True,
            "scheduled_for": scheduled_for,
        }
        self.records("messages").append(dict(message))
        return message
