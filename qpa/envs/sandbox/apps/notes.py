"""Notes: free-text notes in folders, with tags, pins, checklists and sharing."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.cow import FrozenList
from qpa.envs.sandbox.engine import EMAIL, App, Limit, Offset, fail, page, tool

TAG = r"^[a-z0-9][a-z0-9-]{0,29}$"

NoteId = Annotated[str, Field(min_length=1, description="Note id, e.g. n_101")]
Tag = Annotated[str, Field(pattern=TAG, description="Lowercase tag, letters/digits/dashes")]
FolderName = Annotated[str, Field(min_length=1, max_length=60)]
ItemText = Annotated[str, Field(min_length=1, max_length=200)]


def _note_text(note: dict[str, Any]) -> str:
    """The text `notes_search` looks in: title, body and checklist items, each lowered as the
    search lowers them."""
    title = str(note.get("title", "")).lower()
    items = " ".join(str(i.get("text", "")) for i in note.get("checklist", [])).lower()
    return f"{title} {str(note.get('body', '')).lower()} {items}"


class ChecklistItem(TypedDict):
    text: str
    done: bool


class Share(TypedDict):
    email: str
    permission: str  # view | edit


class Note(TypedDict):
    id: str
    title: str
    body: str
    folder: str
    tags: list[str]
    pinned: bool
    checklist: list[ChecklistItem]
    shared_with: list[Share]
    created: str
    updated: str
    deleted: bool


class NotePage(TypedDict):
    notes: list[Note]
    total: int
    offset: int
    next_offset: int | None


class Folder(TypedDict):
    id: str
    name: str
    count: int


def note_record(
    note_id: str,
    title: str,
    body: str = "",
    *,
    folder: str = "Notes",
    tags: list[str] | None = None,
    pinned: bool = False,
    checklist: list[dict[str, Any]] | None = None,
    updated: str = "2026-02-20T18:00",
) -> dict[str, Any]:
    """A note as stored in a task world."""
    return {
        "id": note_id,
        "title": title,
        "body": body,
        "folder": folder,
        "tags": list(tags or []),
        "pinned": pinned,
        "checklist": [dict(item) for item in checklist or []],
        "shared_with": [],
        "created": updated,
        "updated": updated,
        "deleted": False,
    }


def folder_record(folder_id: str, name: str) -> dict[str, Any]:
    return {"id": folder_id, "name": name}


def _per_folder(notes: list[dict[str, Any]]) -> Counter[Any]:
    """How many notes (not deleted) each folder holds."""
    return Counter(n.get("folder") for n in notes if not n.get("deleted"))


class NotesApp(App):
    name = "notes"
    title = "Notes"
    description = "Notes in folders: write, append, tag, pin, share, and keep checklists."
    skills = {
        "lists": (
            "Shopping, packing and to-do lists are notes whose items live in the note's "
            "checklist, not in its body. Add each item with notes_add_checklist_item (one call "
            "per item) and tick items with notes_check_item. If an item is already on the list "
            "but ticked off, untick it with notes_check_item(done=false) instead of adding it "
            "again: duplicates are refused. Never rewrite the body to add list items."
        ),
        "filing": (
            "A note can only be created in or moved to an existing folder (notes_list_folders; "
            "create one with notes_create_folder first). To add to an existing note use "
            "notes_append rather than creating a second note with the same title."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {"folders": [folder_record("f_notes", "Notes")], "notes": []}

    # helpers ----------------------------------------------------------------------------
    def _folder(self, name: str) -> dict[str, Any]:
        for folder in self.records("folders"):
            if str(folder.get("name", "")).lower() == name.lower():
                return folder
        names = ", ".join(f["name"] for f in self.records("folders"))
        raise fail(
            f"folder '{name}' not found (folders: {names}); create it with notes_create_folder"
        )

    def _live(self, note_id: str) -> dict[str, Any]:
        note = self.find("notes", note_id, what="note")
        if note.get("deleted"):
            raise fail(f"note '{note['title']}' is in Recently Deleted; restore it first")
        return note

    def _touch(self, note: dict[str, Any]) -> Note:
        note["updated"] = self.world.iso_now()
        return cast(Note, note)

    @staticmethod
    def _item(note: dict[str, Any], text: str) -> dict[str, Any] | None:
        wanted = text.strip().lower()
        for item in note.get("checklist", []):
            if str(item.get("text", "")).strip().lower() == wanted:
                return cast(dict[str, Any], item)
        return None

    # reads ------------------------------------------------------------------------------
    @tool()
    def notes_list_folders(self) -> list[Folder]:
        """List note folders with how many notes each holds."""
        # One pass over the notes, not one per folder; kept with a committed list.
        notes = self.records("notes")
        if type(notes) is FrozenList:
            per_folder = notes.derived("notes.per_folder", _per_folder)
        else:
            per_folder = _per_folder(notes)
        return [
            {"id": f["id"], "name": f["name"], "count": per_folder.get(f["name"], 0)}
            for f in self.records("folders")
        ]

    @tool()
    def notes_list(
        self,
        folder: FolderName | None = None,
        tag: Tag | None = None,
        pinned_only: bool = False,
        include_deleted: bool = False,
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
        offset: Offset = 0,
    ) -> NotePage:
        """List notes, pinned first, optionally only one folder, tag or pinned ones.
        Paginated with limit/offset."""
        if folder is not None:
            folder = self._folder(folder)["name"]
        rows = [
            n
            for n in self.records("notes")
            if (include_deleted or not n.get("deleted"))
            and (folder is None or n.get("folder") == folder)
            and (tag is None or tag in n.get("tags", []))
            and (not pinned_only or n.get("pinned"))
        ]
        rows.sort(key=lambda n: not n.get("pinned"))
        return cast(NotePage, page("notes", rows, limit, offset))

    @tool()
    def notes_search(
        self,
        query: Annotated[
            str, Field(min_length=1, description="Words in a title, body or checklist")
        ],
        folder: FolderName | None = None,
        limit: Limit = 10,
    ) -> list[Note]:
        """Search notes (case-insensitive): exact title matches first, then titles containing
        the query, then bodies and checklist items."""
        q = query.strip().lower()
        ranked: list[tuple[int, int, dict[str, Any]]] = []
        notes = self.records("notes")
        # Committed: only the notes the word index names for the query's words can hold it.
        found = self.text_candidates("notes", "notes.search", _note_text, q.split())
        pairs = enumerate(notes) if found is None else ((i, notes[i]) for i in found)
        for pos, note in pairs:
            if note.get("deleted") or (folder is not None and note.get("folder") != folder):
                continue
            title = str(note.get("title", "")).lower()
            items = " ".join(str(i.get("text", "")) for i in note.get("checklist", [])).lower()
            if title == q:
                rank = 0
            elif q in title:
                rank = 1
            elif q in str(note.get("body", "")).lower() or q in items:
                rank = 2
            else:
                continue
            ranked.append((rank, pos, note))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [cast(Note, r[2]) for r in ranked[:limit]]

    @tool()
    def notes_get(self, note_id: NoteId) -> Note:
        """Get one note by id (also notes in Recently Deleted)."""
        return cast(Note, self.find("notes", note_id, what="note"))

    # writes -----------------------------------------------------------------------------
    @tool("write")
    def notes_create(
        self,
        title: Annotated[str, Field(min_length=1, max_length=120)],
        body: Annotated[str, Field(max_length=10000)] = "",
        folder: FolderName = "Notes",
        tags: list[Tag] = [],  # noqa: B006 - pydantic copies defaults
    ) -> Note:
        """Create a note in an existing folder. Fails if that folder already has a note with
        the same title."""
        name = self._folder(folder)["name"]
        for note in self.records("notes"):
            same = str(note.get("title", "")).lower() == title.lower()
            if same and note.get("folder") == name and not note.get("deleted"):
                raise fail(
                    f"'{name}' already has a note titled '{title}' ({note['id']}); append to it"
                )
        record = note_record(
            self.world.new_id("n"),
            title,
            body,
            folder=name,
            tags=list(dict.fromkeys(tags)),
            updated=self.world.iso_now(),
        )
        self.records("notes").append(record)
        return cast(Note, dict(record))

    @tool("write")
    def notes_append(
        self, note_id: NoteId, text: Annotated[str, Field(min_length=1, max_length=5000)]
    ) -> Note:
        """Add text as a new line at the end of a note's body."""
        note = self._live(note_id)
        note["body"] = f"{note['body']}\n{text}" if note.get("body") else text
        return self._touch(note)

    @tool("write")
    def notes_update(
        self,
        note_id: NoteId,
        title: Annotated[str | None, Field(min_length=1, max_length=120)] = None,
        body: Annotated[str | None, Field(max_length=10000)] = None,
    ) -> Note:
        """Replace a note's title and/or its whole body."""
        note = self._live(note_id)
        if title is None and body is None:
            raise fail("nothing to update: give title or body", "invalid_arguments")
        if title is not None:
            note["title"] = title
        if body is not None:
            note["body"] = body
        return self._touch(note)

    @tool("write")
    def notes_delete(self, note_id: NoteId) -> Note:
        """Move a note to Recently Deleted (it can be restored)."""
        note = self.find("notes", note_id, what="note")
        if note.get("deleted"):
            raise fail(f"note '{note['title']}' is already in Recently Deleted")
        note["deleted"] = True
        note["pinned"] = False
        return self._touch(note)

    @tool("write")
    def notes_restore(self, note_id: NoteId) -> Note:
        """Bring a note back from Recently Deleted."""
        note = self.find("notes", note_id, what="note")
        if not note.get("deleted"):
            raise fail(f"note '{note['title']}' is not deleted")
        note["deleted"] = False
        return self._touch(note)

    @tool("write")
    def notes_move(self, note_id: NoteId, folder: FolderName) -> Note:
        """Move a note to another existing folder."""
        note = self._live(note_id)
        name = self._folder(folder)["name"]
        if note.get("folder") == name:
            raise fail(f"note '{note['title']}' is already in '{name}'")
        note["folder"] = name
        return self._touch(note)

    @tool("write")
    def notes_create_folder(self, name: FolderName) -> Folder:
        """Create a new folder for notes."""
        if any(str(f.get("name", "")).lower() == name.lower() for f in self.records("folders")):
            raise fail(f"a folder named '{name}' already exists")
        folder = folder_record(self.world.new_id("f"), name)
        self.records("folders").append(folder)
        return {"id": folder["id"], "name": name, "count": 0}

    @tool("write")
    def notes_tag(self, note_id: NoteId, tag: Tag) -> Note:
        """Add a tag to a note."""
        note = self._live(note_id)
        if tag in note["tags"]:
            raise fail(f"note '{note['title']}' is already tagged '{tag}'")
        note["tags"].append(tag)
        return self._touch(note)

    @tool("write")
    def notes_untag(self, note_id: NoteId, tag: Tag) -> Note:
        """Remove a tag from a note."""
        note = self._live(note_id)
        if tag not in note["tags"]:
            raise fail(f"note '{note['title']}' is not tagged '{tag}'")
        note["tags"].remove(tag)
        return self._touch(note)

    @tool("write")
    def notes_pin(self, note_id: NoteId, pinned: bool = True) -> Note:
        """Pin a note to the top of its folder (or unpin it with pinned=false)."""
        note = self._live(note_id)
        note["pinned"] = pinned
        return self._touch(note)

    @tool("write")
    def notes_add_checklist_item(self, note_id: NoteId, text: ItemText) -> Note:
        """Add one unticked item to a note's checklist. Refuses items already on it."""
        note = self._live(note_id)
        existing = self._item(note, text)
        if existing is not None:
            if existing.get("done"):
                raise fail(
                    f"'{existing['text']}' is already on '{note['title']}' (ticked off); "
                    "untick it with notes_check_item(done=false)"
                )
            raise fail(f"'{existing['text']}' is already on '{note['title']}'")
        note.setdefault("checklist", []).append({"text": text.strip(), "done": False})
        return self._touch(note)

    @tool("write")
    def notes_check_item(self, note_id: NoteId, text: ItemText, done: bool = True) -> Note:
        """Tick (done=true) or untick (done=false) a checklist item, matched by its text."""
        note = self._live(note_id)
        item = self._item(note, text)
        if item is None:
            items = ", ".join(str(i.get("text")) for i in note.get("checklist", [])) or "none"
            raise fail(f"no item '{text}' on '{note['title']}' (items: {items})")
        item["done"] = done
        return self._touch(note)

    @tool("write")
    def notes_share(
        self,
        note_id: NoteId,
        email: Annotated[str, Field(pattern=EMAIL, description="Email address")],
        permission: Literal["view", "edit"] = "view",
    ) -> Note:
        """Share a note with someone by email (view or edit access); sharing again changes the
        permission."""
        note = self._live(note_id)
        for share in note.setdefault("shared_with", []):
            if share.get("email") == email:
                if share.get("permission") == permission:
                    raise fail(f"'{note['title']}' is already shared with {email} ({permission})")
                share["permission"] = permission
                return self._touch(note)
        note["shared_with"].append({"email": email, "permission": permission})
        return self._touch(note)
