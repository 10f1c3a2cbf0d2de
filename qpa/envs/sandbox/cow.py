"""Copy-on-write world state: a shared, immutable base and a small overlay per session.

Committed state is made of frozen containers (`FrozenDict`, `FrozenList`): subclasses of dict
and list that read like them (orjson serialises them natively, comparisons and iteration are
the builtin ones) but raise `Thaw` on any mutation. A world's base is frozen once and shared by
every session (and every reset); a session's own changes live in its `Store.overlay`, one frozen
value per changed `(app, collection)`, so a reset is dropping the overlay.

A tool call runs against that frozen state. A read that mutates nothing costs no copy at all.
When a tool mutates something frozen, `Thaw` (a `BaseException`, so an app's `except
Exception` never swallows it) aborts the call; the environment works out which collection, and
which record of it, the object belongs to, and reruns the call with just those copied into a
scratch area (`CallScope`). Nothing committed changed, so the rerun needs no rollback. When the
call returns, its scratch values are frozen again and become the session's overlay entries.

Frozen lists carry lazily built indexes (by `id`, and by any field a lookup filters on) and
derived views (`FrozenList.derived`: the tools' thread aggregates, sorted orders, date and text
indexes); they are valid for the list's whole life, as it never changes. A list a call re-made
by replacing or appending a few records remembers the list it came from (its root: the first
of a chain of such edits, usually the shared base's list) and which positions differ: its id
and field indexes are carried over from the root's and its views are patched from the root's
(`derived(..., patch=)`), so a session's first read after a write costs its changes, not the
collection.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Iterator
from itertools import compress, repeat
from operator import is_, is_not  # type: ignore[attr-defined]
from typing import Any, NoReturn

MISSING: Any = object()
# A re-made list keeps its root (and patches the root's views) while it differs from it in at
# most this many positions (plus a fraction of its length); past that it builds afresh.
LINEAGE_MIN = 64
LINEAGE_FRACTION = 4


class Thaw(BaseException):
    """Raised by a frozen container on mutation: the call must rerun with `obj` copied."""

    def __init__(self, obj: object) -> None:
        super().__init__("mutation of frozen world state")
        self.obj = obj


def _refuse(self: object, *args: Any, **kwargs: Any) -> NoReturn:
    raise Thaw(self)


class FrozenDict(dict[str, Any]):
    """A dict that refuses mutation (raises `Thaw`); reads are the builtin dict's."""

    __slots__ = ()
    __delitem__ = _refuse

    def __setitem__(self, key: str, value: Any) -> None:
        # Setting a field to what it already is changes nothing (a read flag set again): no copy.
        if key in self:
            old = dict.__getitem__(self, key)
            if old is value or (type(old) is type(value) and old == value):
                return
        raise Thaw(self)

    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    update = _refuse

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key in self:
            return dict.__getitem__(self, key)
        raise Thaw(self)

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A list that refuses mutation (raises `Thaw`), with cached lookup indexes."""

    __slots__ = ("_all_keyed", "_by_field", "_by_id", "_changed", "_dups", "_memo", "_root")
    __setitem__ = _refuse
    __delitem__ = _refuse
    __iadd__ = _refuse
    __imul__ = _refuse
    append = _refuse
    extend = _refuse
    insert = _refuse
    remove = _refuse
    pop = _refuse
    clear = _refuse
    sort = _refuse
    reverse = _refuse

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self._by_id: dict[Any, int] | None = None
        self._dups = False
        self._all_keyed = False
        self._by_field: dict[str, dict[Any, list[int]]] = {}
        self._memo: dict[Any, Any] = {}
        self._root: FrozenList | None = None
        self._changed: list[int] = []

    def derived(
        self, key: Any, build: Callable[[FrozenList], Any], patch: Patch | None = None
    ) -> Any:
        """`build(self)`, computed once per list and kept for its life (the list never changes):
        a tool's aggregate, sorted view or search index over a committed collection. A base's
        views are shared by every session. A session's re-made list with a root (see `follow`)
        gets `patch(root_view, root, self, changed)` when `patch` is given: the root's view (built
        once, shared) brought up to date for the positions in `changed` (ascending; those below
        `len(root)` hold another record than the root's, the rest were appended). Otherwise it
        builds its own on first use. `key` names the view (and its parameters); `build` and
        `patch` must be pure functions of the lists (`patch` must not change `root_view`)."""
        try:
            return self._memo[key]
        except KeyError:
            pass
        root = self._root
        if patch is not None and root is not None:
            value = patch(root.derived(key, build), root, self, self._changed)
        else:
            value = build(self)
        self._memo[key] = value
        return value

    def record_memo(self, key: Any) -> dict[int, tuple[Any, Any]]:
        """A dict kept with this list's root (shared by every list re-made from it) in which a
        tool memoises a pure function of a committed record: `{id(record): (record, value)}`;
        holding the record keeps its id from being reused, and a reader checks `entry[0] is
        record`. Bounded by the records read."""
        root = self._root if self._root is not None else self
        memo: dict[int, tuple[Any, Any]] = root.derived(("records", key), lambda _rows: {})
        return memo

    def __reduce__(self) -> Any:
        return (list, (list(self),))

    def _id_index(self) -> dict[Any, int]:
        if self._by_id is None:
            index: dict[Any, int] = {}
            keyed = 0
            for i, row in enumerate(self):
                if isinstance(row, dict):
                    key = row.get("id")
                    if key is not None and not isinstance(key, (dict, list)):
                        index.setdefault(key, i)
                        keyed += 1
            self._by_id = index
            self._dups = keyed != len(index)
            self._all_keyed = keyed == len(self)
        return self._by_id

    def position(self, record_id: Any) -> int | None:
        """The position of the (first) record whose `id` is `record_id`, by index."""
        return self._id_index().get(record_id)

    def follow(self, earlier: FrozenList) -> None:
        """Record that this list is `earlier` with a few records replaced or appended (by
        identity, position for position): it then keeps `earlier`'s root and the positions where
        it differs from it, and takes over the root's id and field indexes, updated for those
        positions (the cost is the changes, not the list). A list that is shorter than its root
        (records removed) or differs in many positions keeps nothing and builds afresh."""
        root = earlier._root if earlier._root is not None else earlier
        base_changed = earlier._changed if earlier._root is not None else []
        n, m = len(root), len(self)
        if m < n or len(earlier) > m:
            return
        # positions where self differs from earlier (C-speed identity walk), plus earlier's own
        mine = list(compress(range(len(earlier)), map(is_not, self, earlier)))
        if len(mine) + len(base_changed) + (m - len(earlier)) > LINEAGE_MIN + m // LINEAGE_FRACTION:
            return
        candidates = sorted({*base_changed, *mine, *range(len(earlier), m)})
        changed = [p for p in candidates if p >= n or self[p] is not root[p]]
        self._root, self._changed = root, changed
        self._carry_id_index(root, changed)
        for field, index in root._by_field.items():
            self._by_field[field] = _patched_field_index(index, field, root, self, changed)

    def _carry_id_index(self, root: FrozenList, changed: list[int]) -> None:
        if root._by_id is None or root._dups:
            return
        n = len(root)
        index = dict(root._by_id)
        dups, all_keyed = False, root._all_keyed
        for p in changed:
            if p < n:
                old, new = root[p], self[p]
                old_id = old.get("id") if isinstance(old, dict) else None
                new_id = new.get("id") if isinstance(new, dict) else None
                if type(old_id) is not type(new_id) or old_id != new_id:
                    return  # an id changed in place: build the index afresh when it is needed
                continue
            row = self[p]
            key = row.get("id") if isinstance(row, dict) else None
            if key is None or isinstance(key, (dict, list)):
                all_keyed = False
                continue
            if key in index:
                dups = True
            else:
                index[key] = p
        self._by_id, self._dups, self._all_keyed = index, dups, all_keyed

    def all_keyed(self) -> bool:
        """Whether every item is a record with a (scalar) id."""
        self._id_index()
        return self._all_keyed

    def duplicate_ids(self) -> bool:
        """Whether two records share an id (or ids that compare equal, 1 and "1" aside)."""
        self._id_index()
        return self._dups

    def positions(self, field: str, value: Any) -> list[int] | None:
        """The positions of records whose `field` equals `value` (None: value not hashable)."""
        try:
            hash(value)
        except TypeError:
            return None
        index = self._by_field.get(field)
        if index is None and self._root is not None:  # the root's (built once, shared), patched
            self._root.positions(field, value)
            root_index = self._root._by_field.get(field)
            if root_index is not None:
                index = _patched_field_index(root_index, field, self._root, self, self._changed)
                self._by_field[field] = index
        if index is None:
            index = {}
            for i, row in enumerate(self):
                if isinstance(row, dict) and field in row:
                    key = row[field]
                    try:
                        index.setdefault(key, []).append(i)
                    except TypeError:  # an unhashable value: never equal to a hashable one
                        continue
            self._by_field[field] = index
        # A bucket holds every record whose value is == to the key (1, 1.0 and True share one),
        # as the scan it replaces would match.
        return index.get(value, [])


Patch = Callable[[Any, FrozenList, FrozenList, list[int]], Any]


def _patched_field_index(
    index: dict[Any, list[int]], field: str, root: FrozenList, rows: FrozenList, changed: list[int]
) -> dict[Any, list[int]]:
    """`root`'s index of `field` (value -> ascending positions) made right for `rows`: each
    changed position leaves its old record's bucket and joins its new record's (buckets copied
    on write; the root's stay as they are)."""
    out = dict(index)
    copied: set[Any] = set()

    def bucket(key: Any) -> list[int] | None:
        try:
            hash(key)
        except TypeError:  # an unhashable value is in no bucket
            return None
        found = out.get(key)
        if found is None:
            found = out[key] = []
            copied.add(key)
        elif key not in copied:
            found = out[key] = list(found)
            copied.add(key)
        return found

    n = len(root)
    for p in changed:
        if p < n:
            old = root[p]
            if isinstance(old, dict) and field in old:
                hit = bucket(old[field])
                if hit is not None and p in hit:
                    hit.remove(p)
        new = rows[p]
        if isinstance(new, dict) and field in new:
            hit = bucket(new[field])
            if hit is not None:
                insort(hit, p)
    return out


def freeze(value: Any) -> Any:
    """`value` with every dict and list replaced by a frozen one (frozen parts are kept)."""
    kind = type(value)
    if kind is FrozenDict or kind is FrozenList:
        return value
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(
            [v if type(v) is FrozenDict or type(v) is FrozenList else freeze(v) for v in value]
        )
    return value


def thaw(value: Any) -> Any:
    """A deep, mutable copy of `value` (plain dicts and lists)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value


def contains(container: Any, obj: object) -> bool:
    """Whether `obj` (by identity) is `container` or sits somewhere inside it."""
    if container is obj:
        return True
    if isinstance(container, dict):
        return any(contains(v, obj) for v in container.values())
    if isinstance(container, list):
        return any(contains(v, obj) for v in container)
    return False


# A plan for one collection in a call: None = copy the list or dict shallowly, ALL = thaw it
# whole, or the positions (keys) of the records (fields) to thaw deeply.
ALL = "all"
Plan = set[Any] | str


class Store:
    """A session's world: the shared frozen `base` and the session's own frozen `overlay`,
    both `{app: {collection: value}}`. A value in the overlay replaces the base's;
    `DELETED` removes it."""

    __slots__ = ("base", "overlay")

    DELETED: Any = object()

    def __init__(
        self, base: dict[str, dict[str, Any]], overlay: dict[str, dict[str, Any]] | None = None
    ) -> None:
        self.base = base
        self.overlay: dict[str, dict[str, Any]] = overlay if overlay is not None else {}

    def get(self, app: str, collection: str) -> Any:
        mine = self.overlay.get(app)
        if mine is not None and collection in mine:
            value = mine[collection]
            return MISSING if value is Store.DELETED else value
        theirs = self.base.get(app)
        if theirs is None:
            return MISSING
        return theirs.get(collection, MISSING)

    def put(self, app: str, collection: str, value: Any) -> None:
        self.overlay.setdefault(app, {})[collection] = value

    def collections(self, app: str) -> list[str]:
        names = dict.fromkeys([*self.base.get(app, {}), *self.overlay.get(app, {})])
        return [c for c in names if self.get(app, c) is not MISSING]

    def apps(self) -> list[str]:
        return list(dict.fromkeys([*self.base, *self.overlay]))

    def owned(self) -> list[tuple[str, str]]:
        """The (app, collection) pairs this session changed."""
        return [(app, c) for app, mine in self.overlay.items() for c in mine]

    def version(self) -> dict[str, dict[str, Any]]:
        """The overlay as it is now (its frozen values are shared, so this is cheap)."""
        return {app: dict(mine) for app, mine in self.overlay.items()}

    def view(self, pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, Any]]:
        """`{app: {collection: value}}` for the given pairs that exist."""
        out: dict[str, dict[str, Any]] = {}
        for app, collection in pairs:
            value = self.get(app, collection)
            if value is not MISSING:
                out.setdefault(app, {})[collection] = value
        return out

    def materialise(self) -> dict[str, dict[str, Any]]:
        """The whole state as nested plain values (for snapshots; O(world))."""
        return {app: {c: self.get(app, c) for c in self.collections(app)} for app in self.apps()}


class CallScope:
    """The scratch area of one tool call: what it copied and may change, and its plan."""

    __slots__ = ("accessed", "plan", "scratch", "store", "writes")

    def __init__(self, store: Store, plan: dict[tuple[str, str], Plan], *, writes: bool) -> None:
        self.store = store
        self.scratch: dict[tuple[str, str], Any] = {}
        self.plan = plan
        self.accessed: dict[tuple[str, str], Any] = {}
        self.writes = writes

    def lookup(self, app: str, collection: str) -> Any:
        key = (app, collection)
        if key in self.scratch:
            return self.scratch[key]
        value = self.store.get(app, collection)
        if value is MISSING:
            return MISSING
        self.accessed[key] = value
        plan = self.plan.get(key, MISSING)
        if plan is MISSING:
            return value
        copy = _materialise(value, plan)
        self.scratch[key] = copy
        return copy

    def assign(self, app: str, collection: str, value: Any) -> None:
        key = (app, collection)
        if key not in self.accessed:
            current = self.store.get(app, collection)
            if current is not MISSING:
                self.accessed[key] = current
        self.scratch[key] = value

    def thaw_record(self, app: str, collection: str, position: int) -> Any:
        """Record `position` of a list collection, made mutable in this call's scratch."""
        key = (app, collection)
        plan = self.plan.setdefault(key, set())
        if isinstance(plan, set):
            plan.add(position)
        rows = self.scratch.get(key, MISSING)
        if rows is MISSING:
            rows = self.lookup(app, collection)
        row = rows[position]
        if type(row) is FrozenDict:
            row = thaw(row)
            rows[position] = row
        return row

    def locate(self, obj: object) -> tuple[tuple[str, str], Any] | None:
        """Which accessed collection `obj` belongs to, and the record (position or key) it is
        in; the record is None when `obj` is the collection itself."""
        for key, value in self.accessed.items():
            if value is obj:
                return key, None
        for key, value in self.accessed.items():  # a record itself: by id, else by identity
            if isinstance(value, list):
                if type(value) is FrozenList and isinstance(obj, dict):
                    record_id = obj.get("id")
                    if record_id is not None and not isinstance(record_id, (dict, list)):
                        at = value.position(record_id)
                        if at is not None and value[at] is obj:
                            return key, at
                found = next(compress(range(len(value)), map(is_, value, repeat(obj))), None)
                if found is not None:
                    return key, found
        for key, value in self.accessed.items():
            if isinstance(value, list):
                for i, row in enumerate(value):
                    if contains(row, obj):
                        return key, i
            elif isinstance(value, dict):
                for field, item in value.items():
                    if contains(item, obj):
                        return key, field
        return None

    def commit(self) -> dict[tuple[str, str], tuple[Any, Any]]:
        """Freeze the scratch values into the overlay; (before, after) per changed pair."""
        done: dict[tuple[str, str], tuple[Any, Any]] = {}
        for (app, collection), value in self.scratch.items():
            before = self.accessed.get((app, collection), MISSING)
            after = Store.DELETED if value is Store.DELETED else freeze(value)
            if type(after) is FrozenList and type(before) is FrozenList and after is not before:
                after.follow(before)
            self.store.put(app, collection, after)
            done[(app, collection)] = (before, MISSING if after is Store.DELETED else after)
        return done


def _materialise(value: Any, plan: Plan) -> Any:
    if plan == ALL:
        return thaw(value)
    assert isinstance(plan, set)
    if isinstance(value, list):
        rows = list(value)
        for i in plan:
            if i < len(rows):
                rows[i] = thaw(rows[i])
        return rows
    if isinstance(value, dict):
        fields = dict(value)
        for k in plan:
            if k in fields:
                fields[k] = thaw(fields[k])
        return fields
    return value


def iter_frozen(value: Any) -> Iterator[Any]:
    """Every container inside `value`, itself included (for tests of immutability)."""
    if isinstance(value, (dict, list)):
        yield value
        for item in value.values() if isinstance(value, dict) else value:
            yield from iter_frozen(item)
