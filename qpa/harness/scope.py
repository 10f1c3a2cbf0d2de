"""The reach of the user's request: which apps' tools it may change, as relevance narrows it.

The Scenario Adapter ranks the phone's apps and tools against the instruction
(`ScenarioAdapter.relevance`, BM25). A state-changing tool is in the request's reach when its
app is at least `APP_SHARE` as relevant as the top app, or the instruction's words match the
tool itself; an outbound tool (`outbound`: declared egress, or a `recipient`/`url` argument)
likewise, and when no outbound tool is in reach, every one is ("let my manager know" names no
app). Relevance only ever *narrows* (rule `in-scope` of `qpa.harness.policy`): a tool in reach
is allowed nothing by it; every value the call carries must still pass the data-flow rules.
Nothing here reads a tool's name for what it does: the effect is the tool's declaration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from qpa.contract import Task, ToolSpec

# Quoted text (double quotes, or single quotes that are not apostrophes) is content: a title,
# a note to write, a name to search for; it is not what the user asks the phone to do.
_QUOTED = re.compile(r'"[^"]*"|“[^”]*”|\u2018[^\u2019]*\u2019|(?<![\w\'])\'[^\']+\'(?![\w\'])')


def unquoted(text: str) -> str:
    """The instruction without its quoted text (titles, names, contents to write)."""
    return _QUOTED.sub(" ", text)


def outbound(spec: ToolSpec) -> bool:
    """Whether a call of the tool reaches someone or somewhere: declared `egress`, or any tool
    with a `recipient` or `url` argument (a send, a share, an invitation, a forward rule)."""
    if spec.side_effect == "egress":
        return True
    return any(role in ("recipient", "url") for role in (spec.roles or {}).values())


APP_SHARE = 0.5  # an app is in reach when its relevance is at least this share of the top app's


@dataclass(frozen=True)
class RequestScope:
    """The state-changing tools the request's relevance reaches, and its apps."""

    tools: frozenset[str]
    apps: frozenset[str]

    @classmethod
    def of(
        cls,
        task: Task,
        tools: Iterable[tuple[ToolSpec, str]],
        app_scores: dict[str, float],
        tool_scores: dict[str, float],
    ) -> RequestScope:
        """The reach from the Scenario Adapter's relevance scores (`task` for symmetry with
        the ledger: the scores are the instruction's)."""
        top = max(app_scores.values(), default=0.0)
        pairs = list(tools)
        if top <= 0:  # the adapter cannot tell what the request is about: no app is ruled out
            apps = {app for _, app in pairs}
        else:
            apps = {a for a, score in app_scores.items() if score >= APP_SHARE * top}
        named = {spec.name for spec, _ in pairs if tool_scores.get(spec.name, 0.0) > 0}
        names = {spec.name for spec, app in pairs if app in apps or not app} | named
        senders = {spec.name for spec, _ in pairs if outbound(spec)}
        if senders and not senders & names:
            names |= senders
        return cls(tools=frozenset(names), apps=frozenset(apps))

    def refuses(self, spec: ToolSpec, app: str) -> str | None:
        """Why the request's reach does not cover this tool (None when it does)."""
        if spec.name not in self.tools:
            return (
                f"'{spec.name}' changes the {app or 'unknown'} app, which the user's request is "
                f"not about (it concerns: {', '.join(sorted(self.apps)) or 'no app'})"
            )
        return None
