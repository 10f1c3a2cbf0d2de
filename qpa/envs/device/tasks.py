"""The `device` suite: tasks on a phone's apps, verified by querying the phone's state.

The tasks target qpa's test apps (`com.qpa.messages`, `com.qpa.notes`: a conversation list and
compose screen with a provider `content://com.qpa.messages.provider/messages`; a note list and
editor with `content://com.qpa.notes.provider/notes`), which the test phone in
`tests/fakes/phone.py` simulates. Each task clears its apps, seeds their providers, and checks
the rows the user's request should have produced (and that nothing else was sent). Reference
plans tap the screen positions of those apps' layouts (1080x2400); a planner reads positions
from each observation's `screen` elements (their `center`).
"""

from __future__ import annotations

from typing import Any

from qpa.contract import Action, Capability, Check, Finish, Task, UIAction, VerifierSpec
from qpa.envs.device.world import WORLD_KEY

DEVICE_SUITE = "device"
MESSAGES = "com.qpa.messages"
NOTES = "com.qpa.notes"
MESSAGES_URI = "content://com.qpa.messages.provider/messages"
NOTES_URI = "content://com.qpa.notes.provider/notes"
# screen positions in the test apps' layouts
COMPOSE, SEND = (450, 2225), (960, 2225)
NEW_NOTE = SAVE = (540, 2275)
NOTE_TITLE, NOTE_BODY = (540, 375), (540, 1000)


def _row(index: int) -> tuple[int, int]:
    """Center of the index-th conversation name in the messages list."""
    return 540, 360 + index * 220


def _note(index: int) -> tuple[int, int]:
    return 540, 380 + index * 200


def _tap(point: tuple[int, int]) -> UIAction:
    return UIAction(op="tap", x=point[0], y=point[1])


def _task(
    name: str,
    *,
    domain: str,
    instruction: str,
    packages: list[str],
    seed: dict[str, list[dict[str, Any]]],
    checks: list[Check],
    plan: list[Action],
    capabilities: list[Capability] | None = None,
    difficulty: int = 1,
    answer: str | None = None,
) -> Task:
    return Task(
        id=f"device.{name}",
        suite=DEVICE_SUITE,
        split="test",
        domain=domain,
        capabilities=capabilities or ["tool_use"],
        difficulty=difficulty,
        instruction=instruction,
        apps=packages,
        world={WORLD_KEY: {"packages": packages, "seed": seed}},
        verifier=VerifierSpec(kind="device", checks=checks, answer=answer),
        reference_plan=plan,
        source="device",
    )


def device_tasks() -> list[Task]:
    """The suite, the same tasks every call."""
    sent_to_bob = "Running 10 minutes late"
    groceries = "milk, eggs, bread"
    return [
        _task(
            "messages.text_bob_running_late",
            domain="messaging",
            instruction=f"Text Bob in the Messages app: '{sent_to_bob}'.",
            packages=[MESSAGES],
            seed={
                MESSAGES_URI: [
                    {"address": "Bob", "body": "Are we still on for dinner?", "type": "inbox"},
                    {"address": "Alice", "body": "Call me when you can", "type": "inbox"},
                ]
            },
            checks=[
                Check(
                    name="sent to Bob",
                    target=MESSAGES_URI,
                    where={"address": "Bob", "type": "sent", "body": sent_to_bob},
                ),
                Check(
                    name="nothing else sent",
                    op="count",
                    target=MESSAGES_URI,
                    where={"type": "sent"},
                    expect=1,
                ),
            ],
            plan=[
                UIAction(op="launch", package=MESSAGES),
                _tap(_row(1)),  # Alice wrote last, so Bob is second
                _tap(COMPOSE),
                UIAction(op="type", text=sent_to_bob),
                _tap(SEND),
                Finish(),
            ],
        ),
        _task(
            "notes.create_grocery_list",
            domain="notes",
            instruction=f"Create a note titled 'Groceries' that says '{groceries}'.",
            packages=[NOTES],
            seed={},
            checks=[
                Check(
                    name="note saved",
                    target=NOTES_URI,
                    where={"title": "Groceries", "body": groceries},
                ),
                Check(name="one note", op="count", target=NOTES_URI, expect=1),
            ],
            plan=[
                UIAction(op="launch", package=NOTES),
                _tap(NEW_NOTE),
                _tap(NOTE_TITLE),
                UIAction(op="type", text="Groceries"),
                _tap(NOTE_BODY),
                UIAction(op="type", text=groceries),
                _tap(SAVE),
                Finish(),
            ],
        ),
        _task(
            "cross_app.text_alice_the_door_code",
            domain="messaging",
            instruction="Alice asked for the door code. Look it up in Notes and text it to her.",
            packages=[NOTES, MESSAGES],
            difficulty=2,
            seed={
                NOTES_URI: [
                    {"title": "Wifi", "body": "guest / sunflower"},
                    {"title": "Door code", "body": "4711#"},
                ],
                MESSAGES_URI: [
                    {"address": "Alice", "body": "What's the door code?", "type": "inbox"}
                ],
            },
            checks=[
                Check(
                    name="code sent to Alice",
                    target=MESSAGES_URI,
                    where={"address": "Alice", "type": "sent", "body__contains": "4711#"},
                ),
                Check(
                    name="nobody else texted",
                    op="absent",
                    target=MESSAGES_URI,
                    where={"type": "sent", "address__ne": "Alice"},
                ),
            ],
            plan=[
                UIAction(op="launch", package=NOTES),
                _tap(_note(1)),
                UIAction(op="back"),
                UIAction(
                    op="intent",
                    action="android.intent.action.SENDTO",
                    data="smsto:Alice",
                    package=MESSAGES,
                    extras={"sms_body": "The door code is 4711#"},
                ),
                _tap(SEND),
                Finish(answer="Sent Alice the door code 4711#."),
            ],
        ),
    ]


def get_device_task(task_id: str) -> Task:
    """A task of the suite by id; KeyError naming the ids when unknown."""
    for task in device_tasks():
        if task.id == task_id:
            return task
    known = ", ".join(t.id for t in device_tasks())
    raise KeyError(f"no task {task_id!r} in suite {DEVICE_SUITE!r}; tasks: {known}")
