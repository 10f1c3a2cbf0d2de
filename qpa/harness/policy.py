"""The guard's data-flow policy, as a table a reviewer can read whole.

Every rule is about where a value came from (`qpa.harness.provenance`) and the role the tool
declares for the argument that carries it (`ToolSpec.roles`, `qpa.contract.ArgRole`), never
about a tool's name, an app or an English word. `docs/security.md` prints this table; each
refusal names the rule that made it (`permission_denied`, and a question for the user).

Terms: a value is *the user's* when it traces to the instruction, the user's confirmations,
memory the user stated or confirmed, or the user's profile. A record is *named* when a read
narrowed by the user's words returned it (by an argument every kind shares, `query` or `*_id`,
or one its kind declares as choosing records: the channel of a channel read), its whole name
is in the user's words, or one of its amounts is a number the request writes to the cent
("that 10.00 I just got"); *picked*
when it is named or shares a word of its own short fields with the request; *listed* when a
read whose arguments are all the user's (or picked) returned it without narrowing; *unselected*
otherwise (a read given a value out of tool prose returns unselected records). Prose (bodies,
notes, descriptions, any field of more than a few words) never names, picks or lists anything,
and the dates ("June 11"), times and list numerals ("11. Serve") in it name no record.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RULES", "Rule", "rule"]


@dataclass(frozen=True)
class Rule:
    """One rule of the policy: its id, what it applies to and what it requires."""

    id: str
    applies_to: str
    requires: str


RULES: tuple[Rule, ...] = (
    Rule(
        "declared-roles",
        "a state-changing tool whose kind declares no argument roles",
        "strict mode: refused; otherwise every argument is held to the `recipient` rule",
    ),
    Rule(
        "confirmed-payment",
        "a `payment` tool",
        "the user confirmed this tool (the task's `confirmations`)",
    ),
    Rule(
        "payment-once",
        "a `payment` call identical to one that succeeded in the episode",
        "refused: a confirmation covers one payment",
    ),
    Rule(
        "sink-recipient",
        "a `recipient`, `url` or `credential` argument",
        "the user's value, or a field of a record the user *named*; a `recipient` may also be a "
        "field of a record a listing the user's words point at showed, when the request points "
        "at this tool (`POINT_SHARE` of its app's best) and no tool text names it",
    ),
    Rule(
        "sink-target",
        "a `target` or `amount` argument",
        "the user's value, or a field of a record the user *picked*; a *listed* record only from "
        "a listing the user's words point at, when no tool prose names it (see `bulk`); an "
        "amount (a JSON number) not written in the text of a record the user did not name",
    ),
    Rule(
        "sink-destroyed",
        "a `destroyed` argument (the record a call deletes, cancels or undoes)",
        "the user's value, or a field of a record the user *named*, and no other result handed "
        "the agent the same value unnamed (the weakest copy decides); a *listed* record only "
        "when the request's words name the argument's declared collection (\"the largest "
        'file"), the request points at this tool, no tool prose names it, and one per episode '
        "(`bulk`)",
    ),
    Rule(
        "link-read",
        "the `url` of a fetch (an `egress` tool whose only roles are `url`, `free` and "
        "`option`: it sends nothing but the address)",
        "besides the `sink-recipient` sources: a link written in the prose of a record the "
        'user *named* ("the websites posted to general"), not in a page a fetch returned '
        "(one hop: no crawling where an attacker's page leads); not counted by `bulk`",
    ),
    Rule(
        "record-identity",
        "a `target` or `destroyed` value",
        "where the tool declares the argument's collection, only a result of a tool of that "
        "collection vouches for it (an event's id 13 is no file's); a short number in the "
        "user's words (a date, a count, a list's numbering) vouches for no record",
    ),
    Rule(
        "option",
        "an `option` argument (a fixed choice that changes how the phone or an account behaves)",
        "the user's words, quoted text aside, name the option; an option that is a record (the "
        "card made default or frozen) is one the user's words picked",
    ),
    Rule(
        "content-flow",
        "the `content` arguments of a state-changing call (every argument when roles are "
        "undeclared): what it sends or writes for someone to read",
        "every link, address or number they carry (read after Unicode compatibility and "
        "look-alike normalisation, spelled digits as digits) is the user's, a field of a "
        "record the user named, or inside the prose of such a record copied whole",
    ),
    Rule(
        "secret-flow",
        "the `content` arguments of a state-changing call",
        "they carry none of the user's secrets a tool result showed (a field its tool declares "
        "secret) unless the request names that field or the user gave the value",
    ),
    Rule(
        "anchored",
        "a state-changing call with no sink value at all (a new record)",
        "at least one of its values is the user's, a field of a record the user picked, or the "
        "whole value of a field of a record the request selected (an address copied whole)",
    ),
    Rule(
        "bulk",
        "a `target`, `recipient` or `destroyed` value that is not the user's own value or a "
        "named record (a listed one where the user pointed counts only for `destroyed`)",
        "at most one such value per tool and argument in an episode",
    ),
    Rule(
        "in-scope",
        "a state-changing tool of an app the request's relevance does not reach",
        "refused (relevance only ever narrows: it never allows a call the rules above refuse)",
    ),
    Rule(
        "data-instructions",
        'values cut from the prose of a record the user named ("do what the email says")',
        "policy `ask` (default): prose is data and vouches for nothing; `allow`: a value in "
        "the prose of a named record counts as a field of it",
    ),
)
_BY_ID = {r.id: r for r in RULES}


def rule(rule_id: str) -> Rule:
    """The rule called `rule_id` (KeyError for a name the table does not have)."""
    return _BY_ID[rule_id]
