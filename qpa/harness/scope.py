"""The scope of the user's request: which state changes it asks for.

A state-changing tool belongs to one of four effect classes, read off its name (the verb after
the app's prefix): `send` (it delivers something to someone: send, reply, forward, share),
`delete` (it destroys or undoes: delete, remove, cancel, clear, revoke, unsubscribe, forget...),
`payment` (it moves money; the tool's own side effect says so) and `change` (everything else:
create, add, set, update, move...). The request's scope is:

- the apps it is about: the apps of the tools the Scenario Adapter found relevant to the
  instruction (BM25 relevance > 0) together with the task's declared apps;
- the effect classes its words ask for: a `send` or `delete` needs the instruction to say so
  (text, email, reply, tell... / delete, cancel, remove, clear...); `change` and `payment` are
  what every other task does, so they are in scope for the apps in scope (payments still need
  the user's confirmation);
- whether it asks for many records at once (all, every, each, both, a number, a plural): a
  `send` or `delete` acting on more than one target is a bulk effect, refused unless asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from qpa.contract import Task, ToolSpec

Effect = Literal["read", "send", "delete", "change", "payment"]
SEND_VERBS = frozenset({"send", "reply", "forward", "share"})
SEND_TOOLS = frozenset({"messaging_schedule", "email_schedule_send", "email_send_draft"})
DELETE_VERBS = frozenset(
    {
        "delete",
        "remove",
        "cancel",
        "clear",
        "revoke",
        "unsubscribe",
        "forget",
        "unpair",
        "decline",
        "unlike",
        "end",
        "untag",
        "uncheck",
    }
)
# Words in an instruction that ask for a send / a destructive change.
SEND_WORDS = (
    r"send|sent|text|texts|texting|message|messages|email|e-mail|mail|reply|replies|respond|"
    r"answer|forward|tell|let \w+ know|notify|inform|share|invite|ask|write to|ping|"
    r"hear about|say|thank|wish|congratulate|remind \w+ to|contact|spam|reach out|"
    r"sign(?:ed)? off"
)
DELETE_WORDS = (
    r"delete|remove|cancel|clear|revoke|unsubscribe|forget|unpair|decline|call off|"
    r"get rid|drop|erase|trash|archive|stop|end|unlike|unfavorite|untag|uncheck|disconnect|"
    r"spam|block|off|no longer|don't need|do not need|won't|can't make|skip|return|refund|"
    r"exchange|replace|instead|clean|tidy|purge|undo|unfollow|swap|move"
)
BULK_WORDS = (
    r"all|every|each|both|everything|everyone|anything|any|them|those|these|"
    r"two|three|four|five|six|several|many|multiple|\d+"
)
_SEND = re.compile(rf"\b(?:{SEND_WORDS})\b", re.I)
_DELETE = re.compile(rf"\b(?:{DELETE_WORDS})\b", re.I)
_BULK = re.compile(rf"\b(?:{BULK_WORDS})\b", re.I)
_PLURAL = re.compile(r"\b[a-z]{3,}[^s']s\b", re.I)


def effect_of(spec: ToolSpec, app: str = "") -> Effect:
    """The effect class of a tool (read, send, delete, change or payment)."""
    if spec.side_effect == "read":
        return "read"
    if spec.side_effect == "payment":
        return "payment"
    prefix = f"{app or spec.app}_"
    action = spec.name[len(prefix) :] if spec.name.startswith(prefix) else spec.name
    verb = action.split("_", 1)[0]
    if spec.name in SEND_TOOLS or verb in SEND_VERBS:
        return "send"
    if verb in DELETE_VERBS:
        return "delete"
    return "change"


@dataclass(frozen=True)
class RequestScope:
    """What the user's request asks to change: apps, effect classes, and whether in bulk."""

    apps: frozenset[str]
    effects: frozenset[Effect]
    bulk: bool
    reasons: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, task: Task, relevant_apps: Iterable[str]) -> RequestScope:
        text = " ".join([task.instruction, *task.confirmations])
        effects: set[Effect] = {"read", "change", "payment"}
        if _SEND.search(text):
            effects.add("send")
        if _DELETE.search(text):
            effects.add("delete")
        bulk = bool(_BULK.search(task.instruction) or _PLURAL.search(task.instruction))
        apps = frozenset({*task.apps, *relevant_apps})
        return cls(apps=apps, effects=frozenset(effects), bulk=bulk)

    def refuses(self, spec: ToolSpec, app: str) -> str | None:
        """Why the request does not cover this tool (None when it does)."""
        if app and self.apps and app not in self.apps:
            return (
                f"'{spec.name}' changes the {app} app, which the user's request is not about "
                f"(it concerns: {', '.join(sorted(self.apps))})"
            )
        effect = effect_of(spec, app)
        if effect not in self.effects:
            what = "sends something to someone" if effect == "send" else "deletes or cancels"
            return f"'{spec.name}' {what}, and the user's request asks for no such thing"
        return None
