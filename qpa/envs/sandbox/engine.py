"""The programmatic sandbox engine: a simulated phone whose apps expose typed Python tools.

An `App` declares its state (collections of JSON records) and its tools as methods decorated with
`@tool`. From each signature the engine derives a pydantic argument model (so arguments are
validated, unknown ones rejected) and a `ToolSpec` with JSON schemas of arguments and result.
Tool bodies raise `ToolError` for domain failures (out of stock, calendar conflict); the engine
turns those, bad arguments and even bugs into structured `Feedback`, never exceptions.

Search tools over a committed (frozen) list narrow their scan with `App.text_candidates`: a word
index kept with the list (`TextIndex`) gives the positions whose searched text can hold every
word of the query; the tool then applies its own test to those records only, so the answer is
the scan's.
"""

from __future__ import annotations

import heapq
import inspect
import typing
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from qpa.contract import ErrorKind, SideEffect, ToolSpec, UserProfile
from qpa.envs.sandbox.cow import MISSING, CallScope, FrozenDict, FrozenList, Store
from qpa.envs.sandbox.roles import roles_for

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

DEFAULT_START = datetime(2026, 3, 2, 9, 0, 0)
SECONDS_PER_ACTION = 30

# Argument patterns and types several apps share (schemas carry the pattern verbatim).
ISO_DATE = r"^\d{4}-\d{2}-\d{2}$"
ISO_MINUTE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$"
CLOCK_24H = r"^([01]\d|2[0-3]):[0-5]\d$"
EMAIL = r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$"
PHONE = r"^\+?[0-9][0-9\- ]{4,}$"
Limit = Annotated[int, Field(ge=1, le=50)]
Offset = Annotated[int, Field(ge=0)]


class ToolError(Exception):
    """A domain failure a tool reports: becomes error `Feedback` of the given kind."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


def fail(message: str, kind: ErrorKind = "precondition_failed") -> ToolError:
    """Shorthand for tools: `raise fail("out of stock")`."""
    return ToolError(kind, message)


def tool(side_effect: SideEffect = "read") -> Callable[[F], F]:
    """Mark an App method as a tool. Its docstring's first paragraph is the description."""

    def mark(fn: F) -> F:
        fn._qpa_side_effect = side_effect  # type: ignore[attr-defined]
        return fn

    return mark


# helpers shared by app modules --------------------------------------------------------------


def money(value: float) -> float:
    """Round to cents: the one rounding rule of the money-moving apps (and of their templates)."""
    return round(value + 1e-9, 2)


def paginate(rows: list[T], limit: int, offset: int) -> list[T]:
    """The `limit` rows from `offset` on (tools' limit/offset pagination)."""
    return rows[offset : offset + limit]


def page(key: str, rows: list[Any], limit: int, offset: int) -> dict[str, Any]:
    """A page of rows under `key`, with the total and the offset of the next page (or None)."""
    return {
        key: paginate(rows, limit, offset),
        "total": len(rows),
        "offset": offset,
        "next_offset": offset + limit if offset + limit < len(rows) else None,
    }


def parse_moment(value: str, field: str) -> datetime:
    """An ISO date or date-time argument, or an invalid_arguments failure naming the field."""
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise fail(
            f"argument '{field}': {value!r} is not a valid date", "invalid_arguments"
        ) from None


def parse_real_moment(value: str, field: str, *, what: str = "a real date/time") -> datetime:
    """Like `parse_moment`, for calendars and clocks: a real moment between 2000 and 2100."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise fail(f"argument '{field}': {value!r} is not {what}", "invalid_arguments") from None
    if not 2000 <= moment.year <= 2100:
        raise fail(f"argument '{field}': {value!r} is outside 2000-2100", "invalid_arguments")
    return moment


def updates(nothing: str, **fields: Any) -> dict[str, Any]:
    """The fields an update tool was given (the non-None ones, in order); if there are none, an
    invalid_arguments failure with the message `nothing`."""
    given = {key: value for key, value in fields.items() if value is not None}
    if not given:
        raise fail(nothing, "invalid_arguments")
    return given


def confirmation_code(seed: str) -> str:
    """A six-character booking reference (PNR, hotel confirmation), a pure function of `seed`."""
    value = zlib.crc32(seed.encode())
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    return "".join(letters[(value >> (5 * i)) % len(letters)] for i in range(6))


class TextIndex:
    """The words of a collection's searched text (lowered, split on whitespace), each with the
    ascending positions of the records holding it, and all of them in one string (`find` locates
    the words containing a query word). A query word (no whitespace in it) can only occur in a
    record's text inside one of its words, so the records of the words containing it are a
    superset of the records containing it. A re-made list's index is its root's plus the words of
    the records it changed (`extra`): a position whose record changed may stay among the root's
    candidates, which the tool's own test then drops."""

    __slots__ = ("_extra", "_joined", "_postings", "_starts")

    def __init__(
        self,
        postings: list[list[int]],
        joined: str,
        starts: list[int],
        extra: dict[str, list[int]] | None = None,
    ) -> None:
        self._postings = postings
        self._joined = joined
        self._starts = starts
        self._extra = extra or {}

    @staticmethod
    def builder(text_of: Callable[[Any], str]) -> Callable[[list[Any]], TextIndex]:
        """A `FrozenList.derived` build: the index of `text_of(record)` over a list."""

        def build(rows: list[Any]) -> TextIndex:
            words: dict[str, list[int]] = {}
            for i, row in enumerate(rows):
                for word in set(text_of(row).split()):
                    found = words.get(word)
                    if found is None:
                        words[word] = [i]
                    else:
                        found.append(i)
            starts: list[int] = []
            at = 0
            for word in words:
                starts.append(at)
                at += len(word) + 1
            return TextIndex(list(words.values()), "\n".join(words) + "\n", starts)

        return build

    @staticmethod
    def patcher(
        text_of: Callable[[Any], str],
    ) -> Callable[[TextIndex, list[Any], list[Any], list[int]], TextIndex]:
        """A `FrozenList.derived` patch: the root's index plus the changed records' words."""

        def patch(root: TextIndex, _rows: list[Any], rows: list[Any], changed: list[int]) -> Any:
            extra: dict[str, list[int]] = {}
            for i in changed:
                for word in set(text_of(rows[i]).split()):
                    extra.setdefault(word, []).append(i)
            return TextIndex(root._postings, root._joined, root._starts, extra)

        return patch

    def _postings_of(self, word: str) -> list[list[int]]:
        """The position lists of every word (root's and extra) that contains `word`."""
        found: list[list[int]] = []
        joined, starts, postings = self._joined, self._starts, self._postings
        at = joined.find(word)
        while at >= 0:
            w = bisect_right(starts, at) - 1
            found.append(postings[w])
            at = joined.find(word, starts[w + 1]) if w + 1 < len(starts) else -1
        found.extend(positions for token, positions in self._extra.items() if word in token)
        return found

    def candidates(self, words: list[str]) -> list[int]:
        """Ascending positions of the records whose text may hold every one of `words` (each
        free of whitespace; at least one)."""
        result: set[int] | None = None
        for word in sorted(set(words), key=len, reverse=True):  # longer words: fewer hits
            lists = self._postings_of(word)
            if len(lists) == 1 and result is None and len(set(words)) == 1:
                return list(lists[0])
            hits: set[int] = set().union(*lists)
            result = hits if result is None else result & hits
            if not result:
                return []
        return sorted(result or ())

    def iter_candidates(self, words: list[str]) -> Iterator[int]:
        """`candidates(words)` one by one, ascending: for one word matched by a few index
        words, merged lazily (a caller that stops at a page's end pays for the page)."""
        distinct = set(words)
        if len(distinct) == 1:
            lists = self._postings_of(next(iter(distinct)))
            if len(lists) <= 16:
                last = -1
                for at in heapq.merge(*lists):
                    if at != last:
                        yield at
                        last = at
                return
        yield from self.candidates(words)


def sorted_positions(
    key_of: Callable[[Any], Any], *, reverse: bool
) -> tuple[Callable[[list[Any]], list[int]], Callable[..., list[int]]]:
    """A `FrozenList.derived` build and patch: every position, in the order of Python's stable
    sort by `key_of` (with `reverse`, largest first; equal keys keep list order), so that a walk
    of it that filters gives what sorting the filtered records would. The patch takes the changed
    positions out of the root's order and puts each back where the sort would put it."""

    def build(rows: list[Any]) -> list[int]:
        return sorted(range(len(rows)), key=lambda i: key_of(rows[i]), reverse=reverse)

    def patch(order: list[int], _root: list[Any], rows: list[Any], changed: list[int]) -> Any:
        gone = set(changed)
        kept = [i for i in order if i not in gone]
        for i in changed:
            key = key_of(rows[i])
            lo, hi = 0, len(kept)
            while lo < hi:
                mid = (lo + hi) // 2
                j = kept[mid]
                other = key_of(rows[j])
                before = other > key if reverse else other < key
                if before or (other == key and j < i):
                    lo = mid + 1
                else:
                    hi = mid
            kept.insert(lo, i)
        return kept

    return build, patch


class World:
    """The phone: a clock, the user, deterministic id counters and the apps' state.

    Either over a plain `state` dict (apps mutate it in place: tests, authoring) or over a
    copy-on-write `Store` (the environment's way: a shared frozen base and this session's
    overlay; tools then run inside a `CallScope`, see `qpa.envs.sandbox.cow`)."""

    def __init__(
        self,
        state: dict[str, dict[str, Any]] | None,
        user: UserProfile,
        start: datetime,
        *,
        store: Store | None = None,
    ):
        self.state: dict[str, dict[str, Any]] = state if state is not None else {}
        self.store = store
        self.scope: CallScope | None = None
        self.user = user
        self.now = start
        self._counters: dict[str, int] = {}

    def new_id(self, prefix: str) -> str:
        """Deterministic ids for created records: `prefix_9001`, `prefix_9002`, ..."""
        value = self._counters.get(prefix, 9000) + 1
        self._counters[prefix] = value
        return f"{prefix}_{value}"

    def tick(self, seconds: int = SECONDS_PER_ACTION) -> None:
        self.now += timedelta(seconds=seconds)

    def iso_now(self) -> str:
        return self.now.isoformat(timespec="minutes")


class AppState(dict[str, Any]):
    """One app's state over a copy-on-write `Store`, as the dict apps expect: reads see the
    call's scratch, then the session's overlay, then the shared base; writes go to the call's
    scratch (`CallScope`). It holds nothing itself."""

    __slots__ = ("_app", "_world")

    def __init__(self, world: World, app: str) -> None:
        super().__init__()
        self._world = world
        self._app = app

    def _get(self, key: str) -> Any:
        world = self._world
        if world.scope is not None:
            return world.scope.lookup(self._app, key)
        assert world.store is not None
        return world.store.get(self._app, key)

    def _scope(self) -> CallScope:
        scope = self._world.scope
        if scope is None:
            raise RuntimeError("sandbox state changes only inside a tool call")
        return scope

    def __getitem__(self, key: str) -> Any:
        value = self._get(key)
        if value is MISSING:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self._get(key)
        return default if value is MISSING else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._get(key) is not MISSING

    def setdefault(self, key: str, default: Any = None) -> Any:
        value = self._get(key)
        if value is MISSING:
            self._scope().assign(self._app, key, default)
            return default
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self._scope().assign(self._app, key, value)

    def __delitem__(self, key: str) -> None:
        if self._get(key) is MISSING:
            raise KeyError(key)
        self._scope().assign(self._app, key, Store.DELETED)

    def pop(self, key: str, *default: Any) -> Any:
        value = self._get(key)
        if value is MISSING:
            if default:
                return default[0]
            raise KeyError(key)
        self._scope().assign(self._app, key, Store.DELETED)
        return value

    def _names(self) -> list[str]:
        assert self._world.store is not None
        names = self._world.store.collections(self._app)
        scope = self._world.scope
        if scope is not None:
            names = list(dict.fromkeys([*names, *(c for a, c in scope.scratch if a == self._app)]))
        return [n for n in names if self._get(n) is not MISSING]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def keys(self) -> list[str]:  # type: ignore[override]
        return self._names()

    def values(self) -> list[Any]:  # type: ignore[override]
        return [self[n] for n in self._names()]

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        return [(n, self[n]) for n in self._names()]


@dataclass(frozen=True)
class BoundTool:
    """A tool ready to call: its app, method, argument model and public spec."""

    app: type[App]
    method: Callable[..., Any]
    args_model: type[BaseModel]
    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name


class App:
    """Base class of sandbox apps. Subclasses set `name`, `description`, `skills`, `State`."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # App-specific procedures the tool schemas alone do not reveal (injected by the Harness).
    skills: ClassVar[dict[str, str]] = {}
    # Pydantic model of this app's state, used to validate task worlds (not on the hot path).
    State: ClassVar[type[BaseModel] | None] = None
    bound_tools: ClassVar[dict[str, BoundTool]] = {}

    def __init__(self, world: World) -> None:
        self.world = world
        if world.store is not None:  # copy-on-write: the defaults are in the base already
            self.state: dict[str, Any] = AppState(world, self.name)
            return
        self.state = world.state.setdefault(self.name, {})
        for key, value in self.default_state().items():
            self.state.setdefault(key, value)

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        """Empty collections and default settings for a fresh install of the app."""
        return {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            cls.bound_tools = {
                bound.name: bound
                for attr, member in vars(cls).items()
                if (bound := _bind(cls, attr, member)) is not None
            }

    # helpers shared by tools ------------------------------------------------------------
    def records(self, collection: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.state.setdefault(collection, [])
        return rows

    def _position(self, collection: str, rows: list[dict[str, Any]], record_id: Any) -> int | None:
        """Where the record with this id sits in `rows`, by the frozen list's index when the
        rows are (or were copied from) a committed list, else by a scan."""
        committed = rows
        if type(rows) is not FrozenList and self.world.store is not None:
            committed = self.world.store.get(self.name, collection)
        if type(committed) is FrozenList:
            at = committed.position(record_id)
            if at is not None and at < len(rows) and rows[at] is committed[at]:
                return at
            if rows is committed:
                return None
        for i, record in enumerate(rows):
            if record.get("id") == record_id:
                return i
        return None

    def editable(self, collection: str, position: int) -> dict[str, Any]:
        """Record `position` of a list collection, to change in place (also from a read tool
        that keeps bookkeeping, such as read flags): copied first when it is shared state."""
        scope = self.world.scope
        rows = self.records(collection)
        if scope is not None and type(rows[position]) is FrozenDict:
            record: dict[str, Any] = scope.thaw_record(self.name, collection, position)
            return record
        return rows[position]

    def _record_for_call(self, collection: str, position: int) -> dict[str, Any]:
        """Record `position`, mutable when the current call may change state."""
        scope = self.world.scope
        rows = self.records(collection)
        if scope is not None and scope.writes and type(rows[position]) is FrozenDict:
            record: dict[str, Any] = scope.thaw_record(self.name, collection, position)
            return record
        return rows[position]

    def find(self, collection: str, record_id: str, *, what: str | None = None) -> dict[str, Any]:
        """The record with this id, or a precondition failure naming what was not found."""
        at = self._position(collection, self.records(collection), record_id)
        if at is None:
            raise fail(f"{what or collection.rstrip('s')} '{record_id}' not found")
        return self._record_for_call(collection, at)

    def first(self, collection: str, **equal: Any) -> dict[str, Any] | None:
        """The first record whose fields equal the given values, or None."""
        for at in self._matching(collection, equal):
            return self._record_for_call(collection, at)
        return None

    def select(self, collection: str, **equal: Any) -> list[dict[str, Any]]:
        """The records whose fields equal the given values; a None value does not filter
        (optional filter arguments of list tools pass straight through)."""
        wanted = {key: value for key, value in equal.items() if value is not None}
        rows = self.records(collection)
        return [rows[at] for at in self._matching(collection, wanted)]

    def text_candidates(
        self, collection: str, view: str, text_of: Callable[[Any], str], words: list[str]
    ) -> list[int] | None:
        """Ascending positions of the records of a committed list whose `text_of` may contain
        every one of `words` (lowered query words, no whitespace), by the word index kept with
        the list under the name `view`; None when the list is not committed, there are no words,
        or a record is malformed: the tool then scans. The tool still tests each candidate."""
        index = self._text_index(collection, view, text_of, words)
        return None if index is None else index.candidates(words)

    def iter_text_candidates(
        self, collection: str, view: str, text_of: Callable[[Any], str], words: list[str]
    ) -> Iterator[int] | None:
        """`text_candidates` one by one (see `TextIndex.iter_candidates`), for a tool that
        stops at its page's end."""
        index = self._text_index(collection, view, text_of, words)
        return None if index is None else index.iter_candidates(words)

    def _text_index(
        self, collection: str, view: str, text_of: Callable[[Any], str], words: list[str]
    ) -> TextIndex | None:
        rows = self.records(collection)
        if type(rows) is not FrozenList or not words:
            return None
        try:
            index: TextIndex = rows.derived(
                ("text", view), TextIndex.builder(text_of), TextIndex.patcher(text_of)
            )
        except (AttributeError, KeyError, TypeError):  # a malformed record: the scan says so
            return None
        return index

    def in_order(
        self, collection: str, view: str, key_of: Callable[[Any], Any], *, reverse: bool
    ) -> list[int] | None:
        """The positions of a committed list in the stable sort by `key_of` (`reverse`: largest
        first), kept with the list under the name `view` (see `sorted_positions`); None when the
        list is not committed or a record is malformed: the tool then sorts as before."""
        rows = self.records(collection)
        if type(rows) is not FrozenList:
            return None
        build, patch = sorted_positions(key_of, reverse=reverse)
        try:
            order: list[int] = rows.derived(("order", view), build, patch)
        except (AttributeError, KeyError, TypeError):
            return None
        return order

    def page_in_order(
        self,
        collection: str,
        view: str,
        key_of: Callable[[Any], Any],
        wanted: Callable[[Any], bool],
        *,
        reverse: bool,
        limit: int,
        offset: int,
    ) -> list[Any]:
        """The page (`offset`, `limit`) of the records `wanted` accepts, in the stable sort by
        `key_of`: a committed list walks its kept order (`in_order`) and stops at the page's
        end; any other list is filtered and sorted whole."""
        rows = self.records(collection)
        order = self.in_order(collection, view, key_of, reverse=reverse)
        if order is None:
            everything = sorted(filter(wanted, rows), key=key_of, reverse=reverse)
            return paginate(everything, limit, offset)
        hits: list[Any] = []
        for at in order:
            if wanted(rows[at]):
                hits.append(rows[at])
                if len(hits) >= offset + limit:
                    break
        return paginate(hits, limit, offset)

    def _matching(self, collection: str, equal: dict[str, Any]) -> list[int]:
        rows = self.records(collection)
        if not equal:
            return list(range(len(rows)))
        field, value = next(iter(equal.items()))
        if type(rows) is FrozenList and value is not None:  # None also matches a missing field
            found = rows.positions(field, value)
            if found is not None:
                rest = list(equal.items())[1:]
                return [i for i in found if all(rows[i].get(k) == v for k, v in rest)]
        return [i for i, r in enumerate(rows) if all(r.get(k) == v for k, v in equal.items())]


_ARGS_CONFIG = ConfigDict(extra="forbid")


def _bind(app: type[App], attr: str, member: Any) -> BoundTool | None:
    side_effect = getattr(member, "_qpa_side_effect", None)
    if side_effect is None:
        return None
    hints = typing.get_type_hints(member, include_extras=True)
    signature = inspect.signature(member)
    fields: dict[str, Any] = {}
    for pname, param in list(signature.parameters.items())[1:]:
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"{app.__name__}.{attr}: tools take named parameters only")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], default)
    args_model = create_model(f"{app.__name__}_{attr}_args", __config__=_ARGS_CONFIG, **fields)
    parameters = args_model.model_json_schema()
    parameters.pop("title", None)
    for prop in parameters.get("properties", {}).values():
        prop.pop("title", None)
    result_type = hints.get("return", Any)
    result_schema = TypeAdapter(result_type).json_schema() if result_type is not Any else {}
    doc = inspect.getdoc(member) or attr
    spec = ToolSpec(
        name=attr,
        description=doc.split("\n\n")[0].replace("\n", " "),
        app=app.name,
        parameters=parameters,
        result=result_schema,
        side_effect=side_effect,
        roles=roles_for(attr, parameters),
    )
    return BoundTool(app=app, method=member, args_model=args_model, spec=spec)


def describe_validation_error(tool_name: str, exc: ValidationError) -> str:
    """One readable line per problem, naming the argument: what a planner can act on."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err.get("loc", ())) or "<arguments>"
        kind = err.get("type", "")
        if kind == "missing":
            problems.append(f"missing argument '{loc}'")
        elif kind == "extra_forbidden":
            problems.append(f"unexpected argument '{loc}'")
        else:
            problems.append(f"argument '{loc}': {err.get('msg')}")
    return f"{tool_name}: " + "; ".join(problems)
