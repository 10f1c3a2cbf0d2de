"""The scope of the user's request: which state changes it asks for.

A state-changing tool belongs to one of five effect classes, read off its name (the verb after
the app's prefix): `send` (it delivers something to someone: send, reply, forward, share),
`delete` (it destroys or undoes: delete, remove, cancel, clear, revoke, unsubscribe, forget...),
`configure` (it changes how the phone or an account behaves from then on: toggle, freeze,
block, set_default_*, set_app_permission, set_security, create_filter; the guard wants the
request to name what it configures), `payment` (it moves money; the tool's own side effect says
so) and `change` (everything else: create, add, set, update, move...). The request's scope is:

- the tools it is about, from the Scenario Adapter's relevance of each app and tool to the
  instruction (`ScenarioAdapter.relevance`, BM25): the tools of apps at least `APP_SHARE` as
  relevant as the top app, and tools the instruction's words match; an app merely installed on
  the phone is not in scope. The *core* tools are those of the leading apps (at least
  `LEAD_SHARE` of the top): only they may act on a value the agent brings itself, and only
  the top app's on a record the request merely listed (the guard decides);
- the effect classes its words ask for: a `send` or `delete` needs the instruction to say so
  (text, email, reply, tell... / delete, cancel, remove, clear...); `change`, `configure` and
  `payment` are what every other task does, so they are in scope for the tools in scope
  (payments still need the user's confirmation; a configuration, that the request names it).
  A send goes through the request's own apps ("email my manager" is no text message,
  whatever word matches);
- whether it asks for many records at once (all, every, each, both, a number, a plural, quoted
  text aside): a `send` or `delete` acting on more than one target the user did not name is a
  bulk effect, refused unless asked for.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from qpa.contract import Task, ToolSpec

Effect = Literal["read", "send", "delete", "configure", "change", "payment"]
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
# Changes to how the phone or an account behaves from then on (a setting, the default card, a
# frozen card, a blocked sender, a mail filter, an app's permission, the alarm): `configure`.
CONFIGURE_VERBS = frozenset({"toggle", "freeze", "unfreeze", "block", "unblock"})
CONFIGURE_ACTIONS = ("set_default", "set_app_permission", "set_security", "create_filter")
# Words that ask for a configuration without naming its verb (reporting spam blocks the sender).
CONFIGURE_WORDS: dict[str, tuple[str, ...]] = {"block": ("spam",)}
# Words in an instruction that ask for a send / a destructive change (measured on the mobilepa
# suite: every reference plan's sends and deletions are asked for with one of these).
SEND_WORDS = (
    r"send|text|message|e-?mail|reply|respond|forward|tell|let \w+ know|share|invite|ask|"
    r"notify|inform|write to"
)
DELETE_WORDS = (
    r"delete|remove|cancel|clear|revoke|unsubscribe|forget|unpair|decline|call off|get rid of|"
    r"drop|erase|trash|unlike|untag|uncheck|spam"
)
BULK_WORDS = (
    r"all|every|each|both|everything|everyone|anything|any|them|those|these|"
    r"two|three|four|five|six|several|many|multiple|\d+"
)
_SEND = re.compile(rf"\b(?:{SEND_WORDS})(?:s|ed|ing)?\b", re.I)
_DELETE = re.compile(rf"\b(?:{DELETE_WORDS})(?:s|d|ed|ing)?\b", re.I)
_BULK = re.compile(rf"\b(?:{BULK_WORDS})\b", re.I)
# Quoted text (double quotes, or single quotes that are not apostrophes) is content: a title,
# a note to write, a name to search for; it is not what the user asks the phone to do.
_QUOTED = re.compile(r'"[^"]*"|“[^”]*”|\u2018[^\u2019]*\u2019|(?<![\w\'])\'[^\']+\'(?![\w\'])')
_PLURAL = re.compile(r"\b[a-z]{3,}[^s']s\b", re.I)


def unquoted(text: str) -> str:
    """The instruction without its quoted text (titles, names, contents to write)."""
    return _QUOTED.sub(" ", text)


def effect_of(spec: ToolSpec, app: str = "") -> Effect:
    """The effect class of a tool (read, send, delete, change or payment)."""
    return _effect(spec.side_effect, spec.name, app or spec.app)


@functools.lru_cache(maxsize=8192)
def _effect(side_effect: str, name: str, app: str) -> Effect:
    """`effect_of` from the strings it reads (memoised: a pure function of them)."""
    if side_effect == "read":
        return "read"
    if side_effect == "payment":
        return "payment"
    if side_effect == "egress":  # data leaves the world: a send, whatever the name says
        return "send"
    prefix = f"{app}_"
    action = name[len(prefix) :] if name.startswith(prefix) else name
    verb = action.split("_", 1)[0]
    if name in SEND_TOOLS or verb in SEND_VERBS:
        return "send"
    if verb in DELETE_VERBS:
        return "delete"
    if verb in CONFIGURE_VERBS or action.startswith(CONFIGURE_ACTIONS):
        return "configure"
    return "change"


APP_SHARE = 0.5  # an app is in scope when its relevance is at least this share of the top app's
LEAD_SHARE = 0.75  # ... and the request is squarely about it from this share on


@dataclass(frozen=True)
class RequestScope:
    """What the user's request asks to change: tools, effect classes, and whether in bulk."""

    tools: frozenset[str]
    apps: frozenset[str]
    effects: frozenset[Effect]
    bulk: bool
    core: frozenset[str] = frozenset()  # tools squarely on the request: its top app's, or named

    @classmethod
    def of(
        cls,
        task: Task,
        tools: Iterable[tuple[ToolSpec, str]],
        app_scores: dict[str, float],
        tool_scores: dict[str, float],
    ) -> RequestScope:
        """The scope from the instruction and the Scenario Adapter's relevance scores: a tool
        is in scope when its app is among the instruction's apps (relevance at least
        `APP_SHARE` of the top app's) or the tool itself matches the instruction's words."""
        text = " ".join([task.instruction, *task.confirmations])
        effects: set[Effect] = {"read", "change", "configure", "payment"}
        if _SEND.search(text):
            effects.add("send")
        if _DELETE.search(text):
            effects.add("delete")
        asked = unquoted(task.instruction)  # quoted text is content, not the request
        bulk = bool(_BULK.search(asked) or _PLURAL.search(asked))
        top = max(app_scores.values(), default=0.0)
        pairs = list(tools)
        if top <= 0:  # the adapter cannot tell what the request is about: no app is ruled out
            apps = {app for _, app in pairs}
        else:
            apps = {a for a, score in app_scores.items() if score >= APP_SHARE * top}
        named = {spec.name for spec, _ in pairs if tool_scores.get(spec.name, 0.0) > 0}
        names = {spec.name for spec, app in pairs if app in apps or not app} | named
        leading = {a for a, score in app_scores.items() if top <= 0 or score >= LEAD_SHARE * top}
        core = {spec.name for spec, app in pairs if app in leading or not app}
        # A send goes through the request's own apps ("email my manager" is no text message,
        # whatever word matches); failing those, through a tool the instruction names; failing
        # that ("let my manager know ..."), through any app's (its recipient must still trace
        # to the user).
        senders = {spec.name: app for spec, app in pairs if effect_of(spec, app) == "send"}
        names -= set(senders)
        core -= set(senders)
        if "send" in effects:
            best = max((tool_scores.get(n, 0.0) for n in senders), default=0.0)
            chosen = {n for n, app in senders.items() if app in leading} | {
                n
                for n, app in senders.items()
                if (app in apps or n in named) and tool_scores.get(n, 0.0) >= APP_SHARE * best
            }
            chosen = chosen or set(senders)
            names |= chosen
            core |= chosen
        return cls(
            tools=frozenset(names),
            apps=frozenset(apps),
            effects=frozenset(effects),
            bulk=bulk,
            core=frozenset(core),
        )

    def refuses(self, spec: ToolSpec, app: str) -> str | None:
        """Why the request does not cover this tool (None when it does)."""
        effect = effect_of(spec, app)
        if effect not in self.effects:
            what = "sends something to someone" if effect == "send" else "deletes or cancels"
            return f"'{spec.name}' {what}, and the user's request asks for no such thing"
        if spec.name not in self.tools:
            return (
                f"'{spec.name}' changes the {app or 'unknown'} app, which the user's request is "
                f"not about (it concerns: {', '.join(sorted(self.apps)) or 'no app'})"
            )
        return None
