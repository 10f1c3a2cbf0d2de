"""Persistent Memory: a per-user store of preferences and history, graded by evidence.

Every item is `(user_id, key, value, evidence, source, time)` plus a store-assigned `created_seq`.
Evidence ranks `stated` (the user said so) > `confirmed` (a completed action used it) >
`observed` (seen in a tool's output) > `inferred` (a model's guess). Several items may exist for
one key; **resolution** picks one: the highest evidence wins, then the newest `time`, then the
latest written. The losers whose value differs are returned as `superseded`, so a trajectory
shows not only what memory said but what it overruled.

Retrieval ranks a user's resolved keys by lexical relevance (BM25 over stemmed words of the key,
weighted double, and the winning value) to a query, usually the task instruction; its
`annotations()` go into the Step annotations, and `used_by()` says which retrieved values an
action actually used.

**Write-back rule** (`write_back(user_id, trajectory)`), applied to a finished episode:

- *Known keys* are the user's keys in the store plus the keys of the task's seeded memory.
  An argument or output field name *matches* a key when, lower-cased and split into words at
  non-alphanumerics, the two are equal after removing the qualifier words
  (`preferred`, `favorite`, `usual`, `default`, `my`, ...); a key may be scoped as
  `app.field` or `tool.field`, and then matches only that app's (prefix `app_`) or tool's fields.
  `preferred_payment_card` thus matches an argument `payment_card`.
- **confirmed**: only when the episode *succeeded*: every successful (`status == ok`) tool call
  with a `write`/`payment` side effect whose argument name matches a known key confirms the
  argument's value. Side effects come from the `tools` given, else from the sandbox registry; a
  tool known to neither is not treated as a write.
- **observed**: from any finished episode: for known keys the instruction asks about (a word of
  the key's name, after removing qualifiers, appears in the instruction), the scalar values of
  matching fields in successful tool outputs (nested anywhere in the JSON). Only when exactly one
  distinct value was seen for the key: a list of many contacts' addresses tells nothing.
- **inferred**: from any finished episode: notes a planner attached to a step as
  `annotations["memory_inferred"] = [{"key": ..., "value": ...}, ...]`.
- `stated` evidence never comes from write-back (a model cannot make the user have said
  something): it is put or seeded from what the user said.

Written items carry the trajectory id as `source` and the episode's start as `time`.

Storage is embedded SQLite (stdlib `sqlite3`; `":memory:"` or a file path), one connection
shared under a lock (`check_same_thread=False`), WAL for files. The schema is migrated forward
by the `user_version` pragma; a newer schema, a file that is not a database, or a row with an
unknown evidence grade is rejected with a `MemoryStoreError` naming the file, row and field.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.contract import Action, Evidence, MemoryItem, SideEffect, ToolCall, ToolSpec, Trajectory
from qpa.harness.adapter import BM25, terms

__all__ = [
    "EVIDENCE_RANK",
    "SCHEMA_VERSION",
    "MemoryStore",
    "MemoryStoreError",
    "RetrievedMemory",
    "key_matches",
]

EVIDENCE_LEVELS: tuple[Evidence, ...] = get_args(Evidence)
EVIDENCE_RANK: dict[str, int] = {"stated": 3, "confirmed": 2, "observed": 1, "inferred": 0}
assert set(EVIDENCE_RANK) == set(EVIDENCE_LEVELS), "EVIDENCE_RANK out of step with the contract"
QUALIFIERS = frozenset(
    {"preferred", "prefer", "favorite", "favourite", "usual", "default", "my", "user", "pref"}
)
MAX_VALUE_CHARS = 4000
INFERRED_NOTE = "memory_inferred"


class MemoryStoreError(ValueError):
    """Bad input to, or bad data in, the memory store (the message names the field)."""


class RetrievedMemory(BaseModel):
    """One resolved key: the winning item, its relevance, and the conflicting items it beat."""

    model_config = ConfigDict(extra="forbid")

    item: MemoryItem
    score: float = 0.0
    superseded: list[MemoryItem] = Field(default_factory=list)
    support: int = 0  # other items agreeing with the winner's value

    @property
    def key(self) -> str:
        return self.item.key

    @property
    def value(self) -> str:
        return self.item.value

    @property
    def evidence(self) -> Evidence:
        return self.item.evidence

    def describe(self) -> str:
        return _describe(self.item)


def _describe(item: MemoryItem) -> str:
    return f"{item.key}={item.value} ({item.evidence})"


# --------------------------------------------------------------------------- key matching


_NON_WORD = re.compile(r"[^a-z0-9]+")


def _words(name: str) -> list[str]:
    return [w for w in _NON_WORD.split(name.lower()) if w]


@functools.lru_cache(maxsize=8192)
def _core(name: str) -> tuple[str, ...]:
    """The name's words less the qualifiers (cached: field and key names repeat every turn)."""
    words = _words(name)
    core = tuple(w for w in words if w not in QUALIFIERS)
    return core or tuple(words)


def key_matches(key: str, field: str, *, tool: str = "") -> bool:
    """Whether an argument/output field name refers to a memory key (see the module rule)."""
    scope, _, bare = key.rpartition(".")
    if scope and tool and not (tool == scope or tool.startswith(f"{scope}_")):
        return False
    if scope and not tool:
        return False
    core = _core(field)
    return bool(core) and core == _core(bare)


def _normalize_time(value: datetime) -> datetime:
    """Naive UTC, so stored times of any origin compare (aware ones are converted)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip()
    return text if text and len(text) <= MAX_VALUE_CHARS else None


# --------------------------------------------------------------------------- schema

_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []


def _migration(fn: Callable[[sqlite3.Connection], None]) -> Callable[[sqlite3.Connection], None]:
    _MIGRATIONS.append(fn)
    return fn


@_migration
def _v1(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE memory (
            created_seq INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            evidence TEXT NOT NULL,
            source TEXT NOT NULL,
            time TEXT NOT NULL
        )"""
    )
    db.execute("CREATE INDEX memory_user_key ON memory (user_id, key)")


@_migration
def _v2(db: sqlite3.Connection) -> None:
    # the same fact from the same source at the same time is stored once (idempotent seeding)
    db.execute(
        """DELETE FROM memory WHERE created_seq NOT IN (
            SELECT MIN(created_seq) FROM memory
            GROUP BY user_id, key, value, evidence, source, time)"""
    )
    db.execute(
        "CREATE UNIQUE INDEX memory_fact ON memory (user_id, key, value, evidence, source, time)"
    )


SCHEMA_VERSION = len(_MIGRATIONS)


# --------------------------------------------------------------------------- the store


class MemoryStore:
    """A per-user memory on embedded SQLite; safe to share between threads."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._db.execute("PRAGMA busy_timeout = 30000")
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode = WAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise MemoryStoreError(f"memory database {self.path}: {exc}") from None

    # lifecycle -------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._lock:
            current = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if current > SCHEMA_VERSION:
                raise MemoryStoreError(
                    f"memory database {self.path} has schema version {current}, newer than this "
                    f"qpa supports ({SCHEMA_VERSION}); upgrade qpa"
                )
            for version in range(current, SCHEMA_VERSION):
                self._db.execute("BEGIN IMMEDIATE")  # DDL too: each step is all or nothing
                try:
                    _MIGRATIONS[version](self._db)
                    self._db.execute(f"PRAGMA user_version = {version + 1}")
                except BaseException:
                    self._db.rollback()
                    raise
                self._db.commit()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # writing ---------------------------------------------------------------------------
    @staticmethod
    def _check_user(user_id: str) -> str:
        if not isinstance(user_id, str) or not user_id.strip():
            raise MemoryStoreError(f"field 'user_id': must be a non-empty string, got {user_id!r}")
        return user_id

    @staticmethod
    def _validate(item: MemoryItem | Mapping[str, Any]) -> MemoryItem:
        if isinstance(item, MemoryItem):
            data: dict[str, Any] = dict(item.__dict__)
        elif isinstance(item, Mapping):
            data = dict(item)
        else:
            raise MemoryStoreError(
                f"a memory item is a MemoryItem or a mapping, got {type(item).__name__}"
            )
        evidence = data.get("evidence", "stated")
        if evidence not in EVIDENCE_RANK:
            raise MemoryStoreError(
                f"field 'evidence': unknown evidence {evidence!r} "
                f"(expected one of {', '.join(EVIDENCE_LEVELS)})"
            )
        try:
            valid = MemoryItem.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"field '{'.'.join(str(p) for p in e['loc'])}': {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise MemoryStoreError(f"invalid memory item: {problems}") from None
        for name in ("key", "value", "source"):
            if not getattr(valid, name).strip():
                raise MemoryStoreError(f"field '{name}': must be a non-empty string")
        if len(valid.value) > MAX_VALUE_CHARS:
            raise MemoryStoreError(f"field 'value': longer than {MAX_VALUE_CHARS} characters")
        return valid.model_copy(update={"time": _normalize_time(valid.time)})

    def put(self, user_id: str, item: MemoryItem | Mapping[str, Any]) -> MemoryItem:
        """Store one item (an identical fact from the same source and time is stored once)."""
        return self.put_many(user_id, [item])[0]

    def put_many(
        self, user_id: str, items: Iterable[MemoryItem | Mapping[str, Any]]
    ) -> list[MemoryItem]:
        """Store items atomically: all are validated before any is written."""
        self._check_user(user_id)
        valid = [self._validate(i) for i in items]
        rows = [(user_id, i.key, i.value, i.evidence, i.source, i.time.isoformat()) for i in valid]
        with self._lock, self._db:
            self._db.executemany(
                "INSERT OR IGNORE INTO memory (user_id, key, value, evidence, source, time) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
        return valid

    def seed(
        self, user_id: str, items: Iterable[MemoryItem | Mapping[str, Any]]
    ) -> list[MemoryItem]:
        """Load known facts (a task's `memory`, an import); idempotent for identical items."""
        return self.put_many(user_id, items)

    def forget(self, user_id: str, key: str | None = None) -> int:
        """Delete a user's items (one key, or all of them); returns how many were deleted."""
        self._check_user(user_id)
        with self._lock, self._db:
            if key is None:
                cur = self._db.execute("DELETE FROM memory WHERE user_id = ?", (user_id,))
            else:
                cur = self._db.execute(
                    "DELETE FROM memory WHERE user_id = ? AND key = ?", (user_id, key)
                )
            return cur.rowcount

    # reading ---------------------------------------------------------------------------
    def _rows(self, user_id: str, key: str | None = None) -> list[tuple[int, MemoryItem]]:
        self._check_user(user_id)
        sql = "SELECT created_seq, key, value, evidence, source, time FROM memory WHERE user_id = ?"
        args: tuple[str, ...] = (user_id,)
        if key is not None:
            sql += " AND key = ?"
            args = (user_id, key)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY created_seq", args).fetchall()
        return [(int(r[0]), self._from_row(r)) for r in rows]

    def _from_row(self, row: tuple[Any, ...]) -> MemoryItem:
        seq, key, value, evidence, source, time = row
        if evidence not in EVIDENCE_RANK:
            raise MemoryStoreError(
                f"memory database {self.path}, row {seq}: field 'evidence' holds unknown value "
                f"{evidence!r} (expected one of {', '.join(EVIDENCE_LEVELS)})"
            )
        try:
            when = datetime.fromisoformat(time)
        except (TypeError, ValueError):
            raise MemoryStoreError(
                f"memory database {self.path}, row {seq}: field 'time' is not an ISO time: {time!r}"
            ) from None
        return MemoryItem.model_construct(
            key=key, value=value, evidence=cast(Evidence, evidence), source=source, time=when
        )

    def items(self, user_id: str, key: str | None = None) -> list[MemoryItem]:
        """All stored items of a user (or of one key), oldest written first."""
        return [item for _, item in self._rows(user_id, key)]

    def keys(self, user_id: str) -> list[str]:
        self._check_user(user_id)
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT key FROM memory WHERE user_id = ? ORDER BY key", (user_id,)
            ).fetchall()
        return [r[0] for r in rows]

    def users(self) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT user_id FROM memory ORDER BY user_id"
            ).fetchall()
        return [r[0] for r in rows]

    def count(self, user_id: str | None = None) -> int:
        with self._lock:
            if user_id is None:
                return int(self._db.execute("SELECT COUNT(*) FROM memory").fetchone()[0])
            return int(
                self._db.execute(
                    "SELECT COUNT(*) FROM memory WHERE user_id = ?", (user_id,)
                ).fetchone()[0]
            )

    # resolution and retrieval -----------------------------------------------------------
    @staticmethod
    def _resolve(rows: list[tuple[int, MemoryItem]]) -> RetrievedMemory | None:
        if not rows:
            return None
        ordered = sorted(
            rows, key=lambda r: (EVIDENCE_RANK[r[1].evidence], r[1].time, r[0]), reverse=True
        )
        winner = ordered[0][1]
        losers = [item for _, item in ordered[1:]]
        return RetrievedMemory(
            item=winner,
            superseded=[i for i in losers if not _same(i.value, winner.value)],
            support=sum(1 for i in losers if _same(i.value, winner.value)),
        )

    def resolve(self, user_id: str, key: str) -> RetrievedMemory | None:
        """The value memory holds for a key: higher evidence wins, then newer time."""
        return self._resolve(self._rows(user_id, key))

    def resolved(self, user_id: str) -> list[RetrievedMemory]:
        """Every key of a user, resolved (key order)."""
        grouped: dict[str, list[tuple[int, MemoryItem]]] = {}
        for seq, item in self._rows(user_id):
            grouped.setdefault(item.key, []).append((seq, item))
        out = [self._resolve(rows) for _, rows in sorted(grouped.items())]
        return [r for r in out if r is not None]

    def retrieve(self, user_id: str, query: str, k: int = 5) -> list[RetrievedMemory]:
        """The `k` resolved keys most relevant to the query (only those sharing a word with it)."""
        if k < 1:
            raise MemoryStoreError(f"field 'k': must be >= 1, got {k}")
        candidates = self.resolved(user_id)
        if not candidates:
            return []
        docs = [terms(" ".join(_words(r.key))) * 2 + terms(r.value) for r in candidates]
        scores = BM25(docs).scores(terms(query))
        ranked = sorted(
            ((score, r) for score, r in zip(scores, candidates, strict=True) if score > 0),
            key=lambda sr: (-sr[0], -EVIDENCE_RANK[sr[1].evidence], sr[1].key),
        )
        return [r.model_copy(update={"score": round(s, 4)}) for s, r in ranked[:k]]

    @staticmethod
    def annotations(retrieved: Iterable[RetrievedMemory]) -> dict[str, Any]:
        """Step annotations: what memory contributed, and what it overruled."""
        got = list(retrieved)
        return {
            "memory_retrieved": [r.describe() for r in got],
            "memory_superseded": [
                f"{_describe(s)} superseded by {r.evidence}" for r in got for s in r.superseded
            ],
        }

    @staticmethod
    def used_by(retrieved: Iterable[RetrievedMemory], action: Action) -> list[str]:
        """The retrieved `key=value (evidence)` whose value a tool call passes as an argument."""
        if not isinstance(action, ToolCall):
            return []
        values = [v for v in (_as_text(x) for x in _scalars(action.arguments)) if v]
        return [r.describe() for r in retrieved if any(_same(v, r.value) for v in values)]

    # write-back ------------------------------------------------------------------------
    def write_back(
        self,
        user_id: str,
        trajectory: Trajectory,
        *,
        tools: Iterable[ToolSpec] | None = None,
        time: datetime | None = None,
    ) -> list[MemoryItem]:
        """Extract evidence from a finished episode (the module's rule); returns what it wrote."""
        self._check_user(user_id)
        effects = _side_effects(tools)
        known = list(dict.fromkeys([*self.keys(user_id), *(m.key for m in trajectory.task.memory)]))
        when = _normalize_time(time or trajectory.started_at or datetime.now(UTC))
        source = trajectory.id
        out: list[MemoryItem] = []

        def add(key: str, value: str, evidence: Evidence) -> None:
            if not any(
                o.key == key and _same(o.value, value) and o.evidence == evidence for o in out
            ):
                out.append(
                    MemoryItem(key=key, value=value, evidence=evidence, source=source, time=when)
                )

        calls = [
            (s.action, s.feedback.observation)
            for s in trajectory.steps
            if isinstance(s.action, ToolCall) and s.feedback.status == "ok"
        ]
        if trajectory.success:
            for call, _ in calls:
                if effects.get(call.tool, "read") == "read":
                    continue
                for arg, raw in call.arguments.items():
                    value = _as_text(raw)
                    if value is None:
                        continue
                    for key in known:
                        if key_matches(key, arg, tool=call.tool):
                            add(key, value, "confirmed")

        asked = set(terms(trajectory.task.instruction))
        wanted = [k for k in known if set(terms(" ".join(_core(k.rpartition(".")[2])))) & asked]
        # each call's output fields by their core words, read once for every wanted key: a key
        # matches a field of the same core (`key_matches`), in the order the fields come
        by_core: list[tuple[str, dict[tuple[str, ...], list[Any]]]] = []
        if wanted:
            for call, observation in calls:
                cores: dict[tuple[str, ...], list[Any]] = {}
                for field, raw in _fields(observation):
                    core = _core(field)
                    if core:
                        cores.setdefault(core, []).append(raw)
                by_core.append((call.tool, cores))
        for key in wanted:
            scope, _, bare = key.rpartition(".")
            core = _core(bare)
            seen: list[str] = []
            for tool, cores in by_core:
                if scope and not (tool and (tool == scope or tool.startswith(f"{scope}_"))):
                    continue  # a scoped key matches its own app's tools only
                for raw in cores.get(core, ()):
                    value = _as_text(raw)
                    if value is not None and not any(_same(value, s) for s in seen):
                        seen.append(value)
            if len(seen) == 1:
                add(key, seen[0], "observed")

        for step in trajectory.steps:
            notes = step.annotations.get(INFERRED_NOTE) or []
            if not isinstance(notes, list):
                raise MemoryStoreError(
                    f"trajectory {source}, step {step.index}: annotation '{INFERRED_NOTE}' must be "
                    "a list of {key, value}"
                )
            for note in notes:
                if not isinstance(note, dict) or not isinstance(note.get("key"), str):
                    raise MemoryStoreError(
                        f"trajectory {source}, step {step.index}: annotation '{INFERRED_NOTE}' "
                        f"entry {note!r} needs fields 'key' and 'value'"
                    )
                value = _as_text(note.get("value"))
                if value is not None and note["key"].strip():
                    add(note["key"], value, "inferred")

        return self.put_many(user_id, out) if out else []


def _side_effects(tools: Iterable[ToolSpec] | None) -> dict[str, SideEffect]:
    if tools is not None:
        return {t.name: t.side_effect for t in tools}
    return _registry_side_effects()


@functools.cache
def _registry_side_effects() -> dict[str, SideEffect]:
    """The sandbox registry's side effects (its apps are found once per process: built once;
    callers only read it)."""
    from qpa.envs.sandbox.registry import all_tools

    return {name: bound.spec.side_effect for name, bound in all_tools().items()}


def _fields(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (field name, scalar value) pair anywhere in a JSON-like observation."""
    if isinstance(value, dict):
        for name, inner in value.items():
            if isinstance(inner, dict | list):
                yield from _fields(inner)
            else:
                yield str(name), inner
    elif isinstance(value, list):
        for inner in value:
            yield from _fields(inner)


def _scalars(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for inner in value.values():
            yield from _scalars(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _scalars(inner)
    else:
        yield value
