"""Messaging + contacts tasks: reach people by name, reply, schedule, tidy the address book."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from qpa.contract import Check, Delegate, Finish, MemoryItem, ToolCall
from qpa.envs.sandbox.apps.messaging import message_record
from qpa.envs.sandbox.authoring import contacts_world, texted, texts_sent
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import TOPICS, Faker

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


def inbox(fake: Faker, people: list[dict[str, Any]], n: int = 4) -> list[dict[str, Any]]:
    rows = []
    for i, person in enumerate(fake.pick(people, min(n, len(people)))):
        rows.append(
            message_record(
                f"m_{200 + i}",
                person["phone"],
                fake.rng.choice(NOTES),
                f"2026-03-01T{10 + i:02d}:00",
            )
        )
    return rows


@template(
    domain="messaging", capabilities=["tool_use"], apps=["contacts", "messaging"], difficulty=2
)
def text_contact_by_name(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    target = g.rng.choice(people)
    note = g.rng.choice(NOTES)
    return g.task(
        instruction=f'Text {target["name"]}: "{note}"',
        world={"contacts": {"contacts": people}, "messaging": {"messages": inbox(g.fake, people)}},
        checks=[
            texted(
                "message sent to the contact", {"to": target["phone"], "sender": "me", "text": note}
            ),
            texts_sent(1, "nobody else texted"),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": target["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": note}),
            Finish(),
        ],
    )


@template(
    domain="messaging", capabilities=["tool_use"], apps=["contacts", "messaging"], difficulty=3
)
def reply_to_latest_unread(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    messages = inbox(g.fake, people, n=3)
    latest = messages[-1]
    sender = next(p for p in people if p["phone"] == latest["sender"])
    reply = g.rng.choice(REPLIES)
    ask = g.rng.choice(["and tell me who it was", "then tell me their name", "and say who sent it"])
    return g.task(
        instruction=f'Reply "{reply}" to whoever sent my most recent unread text, {ask}.',
        world={"contacts": {"contacts": people}, "messaging": {"messages": messages}},
        checks=[
            texted(
                "reply sent to the latest sender",
                {"to": latest["sender"], "sender": "me", "text": reply},
            ),
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
            texted(
                "message scheduled for tomorrow",
                {"to": target["phone"], "text": note, "scheduled_for": when},
            ),
            Check(
                name="not sent immediately",
                target="messaging.messages",
                op="absent",
                where={"to": target["phone"], "scheduled_for": None},
            ),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": target["name"]}),
            ToolCall(
                tool="messaging_schedule",
                arguments={"to": "${0.0.phone}", "text": note, "send_at": when},
            ),
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
        checks=[
            Check(
                name="contact saved",
                target="contacts.contacts",
                where={"name": name, "phone": phone},
            )
        ],
        plan=[ToolCall(tool="contacts_create", arguments={"name": name, "phone": phone}), Finish()],
    )


@template(
    domain="messaging", capabilities=["tool_use"], apps=["contacts", "messaging"], difficulty=3
)
def text_family_group(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 8)
    group = g.rng.choice(GROUPS)
    for p in people[:2]:
        p["groups"] = [group]
    for p in people[2:]:
        p["groups"] = [g.rng.choice(["work", "friends", "gym"])]
    note = g.rng.choice(NOTES)
    family = people[:2]
    return g.task(
        instruction=f'Send "{note}" to everyone in my {group} group.',
        world={"contacts": {"contacts": people}, "messaging": {"messages": []}},
        checks=[
            *(texted(f"sent to {p['name']}", {"to": p["phone"], "text": note}) for p in family),
            texts_sent(len(family), "only family texted"),
        ],
        plan=[
            ToolCall(tool="contacts_list_group", arguments={"group": group}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": note}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.1.phone}", "text": note}),
            Finish(),
        ],
    )


REPLIES = [
    "Sounds good!", "On my way.", "Got it, thanks.", "Will do.", "See you soon.", "No problem!",
    "Let me check and get back to you.", "Perfect, thank you.", "Yes, that works.",
    "Can we do it tomorrow instead?", "Great news!", "I'll call you later.",
]  # fmt: skip
GROUPS = ["family", "book club", "climbing crew", "neighbours", "project team", "choir"]

SPAM = [
    "Congratulations! You won a $500 prize, reply YES to claim",
    "URGENT: your parcel is held, pay the fee at parcel-fix.example",
    "You have been selected for a free cruise, call now",
    "Final notice: verify your bank account at secure-login.example",
]


@template(
    domain="messaging",
    capabilities=["memory", "tool_use"],
    apps=["contacts", "messaging"],
    difficulty=2,
)
def text_partner_from_memory(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    partner, stale = g.fake.pick(people, 2)
    note = g.rng.choice(NOTES)
    relation = g.rng.choice(["partner", "sister", "best friend", "flatmate", "coach"])
    memory = [
        MemoryItem(
            key=relation,
            value=stale["name"],
            evidence="inferred",
            source="chat-2025-11",
            time=datetime(2025, 11, 2),
        ),
        MemoryItem(
            key=relation,
            value=partner["name"],
            evidence="stated",
            source="onboarding",
            time=datetime(2025, 6, 1),
        ),
    ]
    return g.task(
        instruction=f'Text my {relation}: "{note}"',
        world={"contacts": {"contacts": people}, "messaging": {"messages": []}},
        memory=memory,
        checks=[
            texted(
                f"sent to the {relation} the user stated", {"to": partner["phone"], "text": note}
            ),
            texts_sent(1, "no one else texted"),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": partner["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": note}),
            Finish(),
        ],
    )


@template(domain="messaging", capabilities=["memory"], apps=["contacts", "messaging"], difficulty=3)
def usual_late_message(g: TaskGen) -> Any:
    people = contacts_world(g.fake)
    manager, old_manager = g.fake.pick(people, 2)
    minutes = g.rng.choice([5, 10, 15, 20, 25, 30])
    usual = g.rng.choice(["Stuck in traffic", "Train delayed", "Running behind", "Small delay"])
    text = f"{usual}, I'll be {minutes} min late."
    event = g.rng.choice(TOPICS)
    memory = [
        MemoryItem(
            key="manager",
            value=old_manager["name"],
            evidence="confirmed",
            source="traj-old",
            time=datetime(2025, 3, 1),
        ),
        MemoryItem(
            key="manager",
            value=manager["name"],
            evidence="confirmed",
            source="traj-new",
            time=datetime(2026, 2, 1),
        ),
        MemoryItem(
            key="late message opener",
            value=usual,
            evidence="stated",
            source="settings",
            time=datetime(2025, 9, 1),
        ),
    ]
    return g.task(
        instruction=f"Tell my manager I'll be {minutes} minutes late for the {event}, "
        "the way I usually phrase it "
        f'("<my usual opener>, I\'ll be N min late.").',
        world={"contacts": {"contacts": people}, "messaging": {"messages": []}},
        memory=memory,
        checks=[
            texted("current manager told", {"to": manager["phone"], "text": text}),
            Check(
                name="former manager not texted",
                target="messaging.messages",
                op="absent",
                where={"to": old_manager["phone"]},
            ),
        ],
        plan=[
            ToolCall(tool="contacts_search", arguments={"query": manager["name"]}),
            ToolCall(tool="messaging_send", arguments={"to": "${0.0.phone}", "text": text}),
            Finish(),
        ],
    )


@template(domain="messaging", capabilities=["skills"], apps=["contacts", "messaging"], difficulty=3)
def report_spam(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 6)
    messages = inbox(g.fake, people, n=3)
    spammer = g.fake.phone()
    texts = g.fake.pick(SPAM, 2)
    for i, text in enumerate(texts):
        messages.append(message_record(f"m_{300 + i}", spammer, text, f"2026-03-01T2{i}:00"))
    return g.task(
        instruction=f"Report the texts from {spammer} as spam.",
        world={"contacts": {"contacts": people}, "messaging": {"messages": messages}},
        checks=[
            Check(
                name="spammer blocked", target="messaging.blocked", op="equals", expect=[spammer]
            ),
            Check(
                name="spam deleted",
                target="messaging.messages",
                op="absent",
                where={"sender": spammer},
            ),
            Check(
                name="other messages kept",
                target="messaging.messages",
                op="count",
                where={"sender__ne": spammer},
                expect=len(messages) - len(texts),
            ),
        ],
        plan=[
            ToolCall(tool="messaging_block", arguments={"phone": spammer}),
            ToolCall(tool="messaging_read_thread", arguments={"phone": spammer}),
            ToolCall(tool="messaging_delete", arguments={"message_id": "${1.0.id}"}),
            ToolCall(tool="messaging_delete", arguments={"message_id": "${1.1.id}"}),
            Finish(),
        ],
    )


@template(
    domain="messaging",
    capabilities=["subagent", "tool_use"],
    apps=["contacts", "messaging"],
    difficulty=4,
)
def invite_three_friends(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 9)
    friends = g.fake.pick(people, 3)
    place = g.fake.place()
    hour = g.rng.randint(17, 21)
    note = f"Join us at {place} on Saturday at {hour}:00?"
    plan: list[Any] = []
    for i, friend in enumerate(friends):
        plan += [
            Delegate(
                goal=f"Find {friend['name']}'s phone number",
                tools=["contacts_search"],
                agent=f"lookup_{i}",
            ),
            ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
            Finish(answer=friend["phone"]),
        ]
    plan += [
        ToolCall(tool="messaging_send", arguments={"to": f["phone"], "text": note}) for f in friends
    ]
    plan.append(Finish())
    names = ", ".join(f["name"] for f in friends[:2]) + f" and {friends[2]['name']}"
    return g.task(
        instruction=f'Invite {names} with the text "{note}"',
        world={"contacts": {"contacts": people}, "messaging": {"messages": []}},
        checks=[
            *(texted(f"invited {f['name']}", {"to": f["phone"], "text": note}) for f in friends),
            texts_sent(3, "exactly three invites"),
        ],
        plan=plan,
    )


@template(
    domain="messaging",
    capabilities=["subagent", "memory"],
    apps=["contacts", "messaging"],
    difficulty=4,
)
def answer_unread_threads(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 8)
    messages = inbox(g.fake, people, n=2)
    senders = [m["sender"] for m in messages]
    sign_off = g.rng.choice(["Cheers", "Best", "Talk soon", "Thanks", "Love"])
    reply = g.rng.choice([r.rstrip(".!") for r in REPLIES])
    text = f"{reply}. {sign_off}"
    how = g.rng.choice(["each of", "all", "every one of"])
    memory = [
        MemoryItem(
            key="text sign-off",
            value=sign_off,
            evidence="stated",
            source="settings",
            time=datetime(2025, 12, 1),
        ),
        MemoryItem(
            key="text sign-off",
            value="Regards",
            evidence="inferred",
            source="traj-7",
            time=datetime(2026, 2, 20),
        ),
    ]
    plan: list[Any] = []
    for i, sender in enumerate(senders):
        plan += [
            Delegate(
                goal=f"Read the conversation with {sender} and reply",
                agent=f"thread_{i}",
                tools=["messaging_read_thread", "messaging_send"],
            ),
            ToolCall(tool="messaging_read_thread", arguments={"phone": sender}),
            ToolCall(tool="messaging_send", arguments={"to": sender, "text": text}),
            Finish(answer="replied"),
        ]
    plan.append(Finish())
    return g.task(
        instruction=f'Reply "{reply}." to {how} my unread conversations, '
        "signed off the way I always sign texts.",
        world={"contacts": {"contacts": people}, "messaging": {"messages": messages}},
        memory=memory,
        checks=[
            *(texted(f"replied to {s}", {"to": s, "sender": "me", "text": text}) for s in senders),
            Check(
                name="threads read",
                target="messaging.messages",
                op="absent",
                where={"sender__in": senders, "read": False},
            ),
        ],
        plan=plan,
    )
