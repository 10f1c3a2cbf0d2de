"""The argument roles of the sandbox's tools, as its apps declare them.

The sandbox's apps follow one naming convention for their tools' parameters (see
`qpa/envs/sandbox/apps/*.py`); this table is that convention, reviewed against every
state-changing tool, and the registry attaches it to each `ToolSpec.roles`
(`qpa.envs.sandbox.engine`). The guard reads roles, never names: what is here is the sandbox's
own declaration, the way AgentDojo's and BFCL's come from their reviewed `roles.yaml`.

- `recipient`: whom a call reaches or where something goes (an address, a phone number, an
  attendee, a share, a ride's pickup or drop-off, an email filter's forward address);
- `target`: the existing record it acts on (every `*_id` / `*_ids`, an account, a folder, a
  contact group, an app, a Wi-Fi network);
- `amount`: money it moves or commits to (an amount, a tip);
- `credential`: a password, PIN, guest code, passport or loyalty number it sets;
- `content`: what it sends or writes for someone to read (a text, a body, a subject, a note
  on a payment, a title: an event's goes out with its invitation, a reminder's is what the
  user will read and follow);
- `destroyed`: the record a deleting, cancelling or undoing tool (`DESTROYING_TOOLS`) acts on;
- `option`: a choice that changes how the phone or an account behaves from then on
  (`OPTIONS`: a setting among fixed values, or the card made default or frozen);
  any other `enum` parameter only qualifies its call (a reason, a sound) and is `free`;
- everything else is `free` (a new record's name, a date, a flag, a search's text).
"""

from __future__ import annotations

from typing import Any

from qpa.contract import ArgRole

__all__ = ["DESTROYING_TOOLS", "OPTIONS", "ROLE_OF_PARAMETER", "TOOL_OVERRIDES", "roles_for"]

ROLE_OF_PARAMETER: dict[str, ArgRole] = {
    **dict.fromkeys(
        (
            "to",
            "cc",
            "bcc",
            "emails",
            "email",
            "attendees",
            "forward_to",
            "contact_phone",
            "from_phone",
            "phone",
            "address",
            "dropoff",
            "pickup",
        ),
        "recipient",
    ),
    **dict.fromkeys(("account", "folder", "group", "app", "ssid", "list_name"), "target"),
    **dict.fromkeys(("amount", "tip"), "amount"),
    **dict.fromkeys(
        ("password", "pin", "passport_number", "loyalty_number", "frequent_flyer_number"),
        "credential",
    ),
    **dict.fromkeys(
        (
            "text",
            "body",
            "subject",
            "message",
            "note",
            "notes",
            "comment",
            "details",
            "instructions",
            "pickup_note",
            "description",
            "title",
        ),
        "content",
    ),
}
# Tools that delete, cancel or undo the record their `*_id` / `*_ids` parameters name: those
# parameters are `destroyed`.
DESTROYING_TOOLS = frozenset(
    {
        "calendar_cancel_event",
        "calendar_delete_event",
        "clock_cancel_timer",
        "clock_delete_alarm",
        "clock_remove_world_clock",
        "contacts_delete",
        "email_delete",
        "email_delete_filter",
        "email_unsubscribe",
        "flights_cancel_booking",
        "food_cancel_order",
        "home_delete_scene",
        "home_revoke_guest_code",
        "hotels_cancel_reservation",
        "messaging_delete",
        "music_delete_playlist",
        "music_remove_tracks",
        "music_unlike_track",
        "notes_delete",
        "podcasts_remove_download",
        "podcasts_unsubscribe",
        "reminders_delete",
        "rides_cancel",
        "settings_delete_dnd_schedule",
        "shop_cancel_order",
        "wallet_cancel_request",
        "wallet_cancel_scheduled",
        "wallet_decline_request",
    }
)
# Fixed choices that change how the phone or an account behaves from then on (`option`); every
# other `enum` parameter only qualifies its call (a reason, a sound, a size) and is `free`.
OPTIONS: dict[str, frozenset[str]] = {
    "settings_toggle": frozenset({"setting"}),
    "settings_set_app_permission": frozenset({"permission"}),
    "notes_share": frozenset({"permission"}),
    "home_set_security": frozenset({"mode"}),
    "email_create_filter": frozenset({"action"}),
    "email_move": frozenset({"folder"}),
    # which card pays by default, which cards can pay at all: a record chosen as a setting
    "wallet_set_default_card": frozenset({"card_id"}),
    "wallet_freeze_card": frozenset({"card_id"}),
    "wallet_unfreeze_card": frozenset({"card_id"}),
}
# Parameters whose name means something else in one tool.
TOOL_OVERRIDES: dict[str, dict[str, ArgRole]] = {
    "flights_add_frequent_flyer": {"number": "credential"},
    "home_create_guest_code": {"code": "credential"},
    "flights_create_price_alert": {"destination": "free"},
}


def roles_for(tool: str, parameters: dict[str, Any]) -> dict[str, ArgRole]:
    """The role of every non-free parameter of `tool` (its JSON schema's `properties`)."""
    properties = parameters.get("properties") or {}
    overrides = TOOL_OVERRIDES.get(tool, {})
    roles: dict[str, ArgRole] = {}
    for name, schema in properties.items():
        role = overrides.get(name)
        if role is None and name in OPTIONS.get(tool, ()):
            role = "option"
        if role is None:
            if _is_choice(schema):
                role = "option" if name in OPTIONS.get(tool, ()) else "free"
            elif name.endswith(("_id", "_ids")) or name == "id":
                role = "destroyed" if tool in DESTROYING_TOOLS else "target"
            else:
                role = ROLE_OF_PARAMETER.get(name, "free")
        if role != "free":
            roles[name] = role
    return roles


def _is_choice(schema: Any) -> bool:
    """A parameter among fixed values: an `enum`, or an optional one (`anyOf` with null)."""
    if not isinstance(schema, dict):
        return False
    return "enum" in schema or any(_is_choice(s) for s in schema.get("anyOf") or ())
