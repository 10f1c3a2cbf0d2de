"""Messaging + contacts tasks: reach people by name, reply, schedule, tidy the address book."""

from __future__ import annotations

from typing import Any

from qpa.contract import Check, Finish, ToolCall
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import Faker

NOTES = [
    "Running 10 minutes late, sorry!",
    "Can you send me the slides from today?",
    "Happy birthday! Hope you have a great day.",
    "Dinner on Friday still works for me.",
    "I left the keys under the blue pot.",
    "Please call me when you land.",
    "The meeting moved to Room 4B.",
    "Thanks for the help yesterday!",
]


def contacts_world(fake: Faker, n: int = 8) -> list[dict[str, Any]]:
    people = []
    for i in range(n):
        name = fake.name()
        people.append(
            {
                "id": f"c_{100 + i}",
                "name": name,
                "phone": fake.phone(),
                "email": fake.email(name),
                "address": fake.address(),
                "favorite": fake.rng.random() < 0.2,
                "groups": fake.pick(["family", "work", "friends", "gym"], 1),
            }
        )
    return people


def inbox(fake: Faker, people: list[dict[str, Any]], n: int = 4) -> list[dict[str, Any]]:
    rows = []
    for i, person in enumerate(fake.pick(people, min(n, len(people)))):
        thread = "t_" + "".join(ch for ch in person["phone"] if ch.isdigit())
        rows.append(
            {
                "id": f"m_{200 + i}",
                "thread": thread,
                "to": "me",
                "sender": person["phone"],
                "text": fake.rng.choice(NOTES),
                "time": f"2026-03-01T{10 + i:02d}:00",
                "read": False,
                "scheduled_for": None,
            }
        )
    return rows


@template(domain="messaging", capabilities=["tool_use"], apps=["contacts", "messaging"], difficulty=2)
def text_contact_by_name(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    target = g.rng.choice(people)
    note = g.rng.choice(NOTES)
    return g.task(
        instruction=f'Text {target["name"]}: "{note}"',
        world={"contacts": {"contacts": people}, "messaging": {"messages": inbox(g.fake, people)}},
        checks=[
            Check(name="message sent to the contact", target="messaging.messages",
                  where={"to": target["phone"], "sender": "me", "text": note}),
            Check(name="nobody else texted", target="messaging.messages", op="count",
                  where={"sender": "me"}, expect=1),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": target["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": note}),
            Finish(),
        ],
    )


@template(domain="messaging", capabilities=["tool_use"], apps=["contacts", "messaging"], difficulty=3)
def reply_to_latest_unread(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    messages = inbox(g.fake, people, n=3)
    latest = messages[-1]
    sender = next(p for p in people if p["phone"] == latest["sender"])
    reply = g.rng.choice(["Sounds good!", "On my way.", "Got it, thanks.", "Will do."])
    return g.task(
        instruction=f'Reply "{reply}" to whoever sent my most recent unread text, and tell me who it was.',
        world={"contacts": {"contacts": people}, "messaging": {"messages": messages}},
        checks=[
            Check(name="reply sent to the latest sender", target="messaging.messages",
                  where={"to": latest["sender"], "sender": "me", "text": reply}),
        ],
        answer=sender["name"],
        plan=[
            ToolCall(tool="messaging_list_threads", arguments={"unread_only": True}),
            ToolCall(tool="contacts_search", arguments={"query": latest["sender"]}),
            ToolCall(tool="messaging_send", arguments={"to": latest["sender"], "text": reply}),
            Finish(answer=sender["name"]),
        ],
    )


@template(domain="messaging", capabilities=["skills"], apps=["contacts", "messaging"], difficulty=2)
def schedule_text(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    target = g.rng.choice(people)
    note = g.rng.choice(NOTES)
    hour = g.rng.choice([7, 8, 9, 18, 20])
    when = f"2026-03-03T{hour:02d}:00"
    return g.task(
        instruction=f'Tomorrow at {hour}:00, send {target["name"]} the text "{note}".',
        world={"contacts": {"contacts": people}, "messaging": {"messages": []}},
        checks=[
            Check(name="message scheduled for tomorrow", target="messaging.messages",
                  where={"to": target["phone"], "text": note, "scheduled_for": when}),
            Check(name="not sent immediately", target="messaging.messages", op="absent",
                  where={"to": target["phone"], "scheduled_for": None}),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": target["name"]}),
            ToolCall(tool="messaging_schedule", arguments={"to": "${0.0.phone}", "text": note, "send_at": when}),
            Finish(),
        ],
    )


@template(domain="messaging", capabilities=["tool_use"], apps=["contacts"], difficulty=1)
def add_new_contact(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 6)
    name, phone = g.fake.name(), g.fake.phone()
    return g.task(
        instruction=f"Save {name} as a new contact with the number {phone}.",
        world={"contacts": {"contacts": people}},
        checks=[Check(name="contact saved", target="contacts.contacts", where={"name": name, "phone": phone})],
        plan=[ToolCall(tool="contacts_create", arguments={"name": name, "phone": phone}), Finish()],
    )


@template(domain="messaging", capabilities=["tool_use"], apps=["contacts", "messaging"], difficulty=3)
def text_family_group(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 8)
    for p in people[:2]:
        p["groups"] = ["family"]
    for p in people[2:]:
        p["groups"] = [g.rng.choice(["work", "friends", "gym"])]
    note = g.rng.choice(NOTES)
    family = people[:2]
    return g.task(
        instruction=f'Send "{note}" to everyone in my family group.',
        world={"contacts": {"contacts": people}, "messaging": {"messages": []}},
        checks=[
            *(Check(name=f"sent to {p['name']}", target="messaging.messages",
                    where={"to": p["phone"], "text": note}) for p in family),
            Check(name="only family texted", target="messaging.messages", op="count",
                  where={"sender": "me"}, expect=len(family)),
        ],
        plan=[
            ToolCall(tool="contacts_list_group", arguments={"group": "family"}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": note}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.1.phone}", "text": note}),
            Finish(),
        ],
    )
