"""Contacts: the address book other apps resolve people through."""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Annotated, Any

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.cow import FrozenList
from qpa.envs.sandbox.engine import PHONE, App, Limit, Offset, fail, paginate, tool, updates


class Contact(TypedDict):
    id: str
    name: str
    phone: str
    email: str
    address: str
    favorite: bool
    groups: list[str]


_SEP = "\x00"  # between fields and records of the search text (a query holding it is scanned)


def _part(c: dict[str, Any]) -> str:
    if not isinstance(c["phone"], str):
        raise TypeError("phone")
    return f"{c['name'].lower()}{_SEP}{c['phone']}{_SEP}{c['email'].lower()}{_SEP}"


def _joined(parts: list[str]) -> tuple[str, list[int], list[str]]:
    starts = list(accumulate(map(len, parts), initial=0))[:-1]
    return "".join(parts), starts, parts


def _search_text(contacts: list[dict[str, Any]]) -> tuple[str, list[int], list[str]]:
    """What `contacts_search` matches, as one string: per contact its lowered name, phone and
    lowered email, each followed by `_SEP`; where each contact's part starts; the parts."""
    return _joined([_part(c) for c in contacts])


def _patch_search_text(
    view: tuple[str, list[int], list[str]],
    _root: list[Any],
    contacts: list[dict[str, Any]],
    changed: list[int],
) -> tuple[str, list[int], list[str]]:
    """`_search_text` of a re-made list from its root's parts: the changed contacts' parts
    remade, the rest reused, joined again (string and list work, no per-contact Python)."""
    parts = list(view[2])
    for i in changed:
        if i < len(parts):
            parts[i] = _part(contacts[i])
        else:
            parts.append(_part(contacts[i]))
    return _joined(parts)


class ContactsApp(App):
    name = "contacts"
    title = "Contacts"
    description = "The user's address book: people, phone numbers, emails, addresses, groups."
    skills = {
        "resolve_person": (
            "To reach a person by name, call contacts_search with part of the name first and use "
            "the returned phone or email; never guess a number. If several contacts match, pick "
            "the exact full-name match or ask the user."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"contacts": []}

    @tool()
    def contacts_search(
        self,
        query: Annotated[str, Field(min_length=1, description="Part of a name, phone or email")],
        limit: Limit = 10,
    ) -> list[Contact]:
        """Find contacts whose name, phone or email contains the query (case-insensitive)."""
        q = query.lower()
        contacts = self.records("contacts")
        if type(contacts) is FrozenList and _SEP not in q:
            try:
                text, starts, _ = contacts.derived(
                    "contacts.search_text", _search_text, _patch_search_text
                )
            except (AttributeError, KeyError, TypeError):  # a malformed record: scan as before
                text = None
            if text is not None:
                # One substring search over the committed contacts' searchable text, record by
                # record in order, stopping at `limit`: the cost is the hits, not the book.
                found: list[Contact] = []
                at = text.find(q)
                while at >= 0 and len(found) < limit:
                    i = bisect_right(starts, at) - 1
                    found.append(contacts[i])
                    at = text.find(q, starts[i + 1]) if i + 1 < len(starts) else -1
                return found
        hits = [
            c
            for c in contacts
            if q in c["name"].lower() or q in c["phone"] or q in c["email"].lower()
        ]
        return hits[:limit]  # type: ignore[return-value]

    @tool()
    def contacts_get(self, contact_id: str) -> Contact:
        """Get one contact by id."""
        record: Contact = self.find("contacts", contact_id, what="contact")  # type: ignore[assignment]
        return record

    @tool()
    def contacts_list_group(
        self, group: str, limit: Limit = 50, offset: Offset = 0
    ) -> list[Contact]:
        """List the contacts in a group such as 'family' or 'work', `limit` from `offset` on."""
        found = []
        for c in self.records("contacts"):
            if group in c.get("groups", []):
                found.append(c)
                if len(found) >= offset + limit:  # the page is complete: stop
                    break
        return paginate(found, limit, offset)  # type: ignore[arg-type]

    @tool()
    def contacts_list_favorites(self) -> list[Contact]:
        """List the contacts marked as favorite."""
        return [c for c in self.records("contacts") if c.get("favorite")]  # type: ignore[misc]

    @tool("write")
    def contacts_create(
        self,
        name: Annotated[str, Field(min_length=1)],
        phone: Annotated[str, Field(pattern=PHONE)],
        email: str = "",
        address: str = "",
    ) -> Contact:
        """Add a new contact. Fails if a contact with the same phone already exists."""
        if any(c["phone"] == phone for c in self.records("contacts")):
            raise fail(f"a contact with phone {phone} already exists")
        contact: Contact = {
            "id": self.world.new_id("c"),
            "name": name,
            "phone": phone,
            "email": email,
            "address": address,
            "favorite": False,
            "groups": [],
        }
        self.records("contacts").append(dict(contact))
        return contact

    @tool("write")
    def contacts_update(
        self,
        contact_id: str,
        phone: str | None = None,
        email: str | None = None,
        address: str | None = None,
        favorite: bool | None = None,
    ) -> Contact:
        """Change a contact's phone, email, address or favorite flag (only the given fields)."""
        record = self.find("contacts", contact_id, what="contact")
        given = updates(
            "nothing to update: give at least one of phone, email, address, favorite",
            phone=phone,
            email=email,
            address=address,
            favorite=favorite,
        )
        record.update(given)
        return record  # type: ignore[return-value]

    @tool("write")
    def contacts_add_to_group(
        self, contact_id: str, group: Annotated[str, Field(min_length=1)]
    ) -> Contact:
        """Put a contact into a group (creating the group if needed)."""
        record = self.find("contacts", contact_id, what="contact")
        if group not in record["groups"]:
            record["groups"].append(group)
        return record  # type: ignore[return-value]

    @tool("write")
    def contacts_delete(self, contact_id: str) -> dict[str, Any]:
        """Delete a contact."""
        record = self.find("contacts", contact_id, what="contact")
        self.records("contacts").remove(record)
        return {"deleted": contact_id}
