"""`SandboxEnv`: the programmatic sandbox behind the `Environment` protocol.

A task's world (its `world` document, filled out to its `world_profile`, with the apps'
defaults) is built once and frozen into a base shared by every session and every reset
(`base_for`, cached by content); a session keeps only its own changes, copy-on-write
(`qpa.envs.sandbox.cow`). A reset drops them: its cost does not depend on the world's size.
Verification reads what changed and the collections the checks name, nothing else.

An episode is a pure function of (task, seed, actions): replaying a trajectory's actions on a
fresh environment gives the same feedback byte for byte. Tool results are detached copies of
state (JSON round-trip), so nothing outside can mutate the phone.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from pydantic import ValidationError

from qpa.contract import (
    Action,
    Delegate,
    EnvKind,
    Feedback,
    Finish,
    MessageUser,
    Task,
    ToolCall,
    ToolSpec,
    Verification,
)
from qpa.envs.sandbox.collateral import WriteLog, find_collateral
from qpa.envs.sandbox.cow import ALL, MISSING, CallScope, Plan, Store, Thaw, freeze
from qpa.envs.sandbox.engine import DEFAULT_START, App, BoundTool, ToolError, World
from qpa.envs.sandbox.engine import describe_validation_error as _describe
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.verify import verify_state

MAX_STEPS = 200
BASE_CACHE_SIZE = 32  # frozen bases kept (a phone-profile base is a few MB of objects)
MAX_THAWS = 64  # reruns of one call before it gets whole collections to change
_WHOLE_AFTER = 4  # record thaws in one collection in one call before it is thawed whole


@dataclass(frozen=True)
class WorldBase:
    """A task's world, built once: frozen state shared by every session, and its clock."""

    state: dict[str, dict[str, Any]]
    start: datetime
    apps: tuple[str, ...]

    @property
    def records(self) -> int:
        return sum(
            len(v) for app in self.state.values() for v in app.values() if isinstance(v, list)
        )


_BASES: OrderedDict[bytes, WorldBase] = OrderedDict()
_BASES_LOCK = threading.Lock()


# The content key of the task objects last reset (by identity, while they live): hashing a
# large world document on every reset would make reset O(world) again. A task's world is not
# to be changed in place once an environment has been reset on it (copy the task instead).
_KEYS: dict[int, tuple[weakref.ref[Task], tuple[str, ...], bytes]] = {}


def _world_key(task: Task, app_names: list[str]) -> bytes:
    known = _KEYS.get(id(task))
    if known is not None and known[0]() is task and known[1] == tuple(app_names):
        return known[2]
    digest = hashlib.blake2b(orjson.dumps(task.world), digest_size=16)
    digest.update(orjson.dumps([app_names, task.world_profile, task.seed]))
    key = digest.digest()
    with _BASES_LOCK:
        if len(_KEYS) >= 4 * BASE_CACHE_SIZE:
            for stale in [k for k, v in _KEYS.items() if v[0]() is None] or list(_KEYS)[:1]:
                del _KEYS[stale]
        _KEYS[id(task)] = (weakref.ref(task), tuple(app_names), key)
    return key


def base_for(task: Task, app_names: list[str], apps: dict[str, type[App]]) -> WorldBase:
    """The frozen base of `task`'s world (with these apps' defaults), built at most once per
    content while it stays in the cache."""
    key = _world_key(task, app_names)
    with _BASES_LOCK:
        found = _BASES.get(key)
        if found is not None:
            _BASES.move_to_end(key)
            return found
    check_world(task.world, apps)
    state = orjson.loads(
        orjson.dumps({k: v for k, v in task.world.items() if not k.startswith("_")})
    )
    if task.world_profile != "default":
        from qpa.envs.sandbox.profiles import fill_world

        state = fill_world(task, state)
    start = datetime.fromisoformat(
        task.world.get("_clock", {}).get("start", DEFAULT_START.isoformat())
    )
    world = World(state, task.user, start)
    for name in app_names:
        apps[name](world)  # installs the app's defaults
    frozen = {
        app: {c: freeze(v) for c, v in value.items()}
        for app, value in state.items()
        if isinstance(value, dict)
    }
    base = WorldBase(frozen, start, tuple(app_names))
    with _BASES_LOCK:
        _BASES[key] = base
        while len(_BASES) > BASE_CACHE_SIZE:
            _BASES.popitem(last=False)
    return base


class WorldError(ValueError):
    """A task world the sandbox cannot install; the message names the field."""


def check_world(world: dict[str, Any], apps: dict[str, type[App]]) -> None:
    """Refuse a world whose shape no app can hold: every key not starting with `_` is a
    sandbox app holding collections, each a list of records or a settings object, of the type
    the app's own defaults give it. Checked once per distinct world (on a base-cache miss)."""
    for app, collections in world.items():
        if app.startswith("_"):
            continue
        if app not in apps:
            raise WorldError(f"world.{app}: not an app of the sandbox")
        if not isinstance(collections, dict):
            raise WorldError(f"world.{app}: an app's state is an object of collections")
        defaults = apps[app].default_state()
        for name, value in collections.items():
            default = defaults.get(name)
            where = f"world.{app}.{name}"
            if isinstance(value, list):
                if isinstance(default, dict):
                    raise WorldError(f"{where}: settings are an object, not a list")
                bad = next((i for i, r in enumerate(value) if not isinstance(r, dict)), None)
                if bad is not None:
                    raise WorldError(f"{where}[{bad}]: a record is an object")
            elif isinstance(value, dict):
                if isinstance(default, list):
                    raise WorldError(f"{where}: a collection is a list of records")
            else:
                raise WorldError(f"{where}: a list of records or a settings object")


class SandboxEnv:
    """One simulated phone; one episode at a time (servers hold one per session)."""

    kind: EnvKind = "sandbox"

    def __init__(self, *, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps
        self._tools = all_tools()
        self._apps = all_apps()
        self._task: Task | None = None
        self._world: World | None = None
        self._store: Store | None = None
        self._base: WorldBase | None = None
        self._instances: dict[str, App] = {}
        self._allowed: dict[str, BoundTool] = {}
        self._finished = False
        self._answer: str | None = None
        self._steps = 0
        self._user_log: list[dict[str, Any]] = []
        self._writes = WriteLog()
        self._replays: list[_Replayable] = []
        # Per tool: the collections its calls had to copy (list or dict level), copied up front
        # next time instead of found by a rerun.
        self._hints: dict[str, set[tuple[str, str]]] = {}

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Task) -> Feedback:
        self._task = task
        self._finished = False
        self._answer = None
        self._steps = 0
        app_names = list(
            dict.fromkeys(
                [*task.apps, *(self._tools[t].app.name for t in task.tools if t in self._tools)]
            )
        )
        unknown = [a for a in app_names if a not in self._apps]
        if unknown:
            return Feedback.fail(
                "environment_failure", f"task uses unknown apps: {', '.join(unknown)}"
            )
        try:
            base = base_for(task, app_names, self._apps)
        except WorldError as exc:
            return Feedback.fail("invalid_arguments", str(exc))
        self._base = base
        self._store = Store(base.state)
        self._world = World(None, task.user, base.start, store=self._store)
        self._instances = {name: self._apps[name](self._world) for name in app_names}
        names = task.tools or [t for a in app_names for t in self._apps[a].bound_tools]
        self._allowed = {n: self._tools[n] for n in names if n in self._tools}
        self._user_log = []
        self._writes = WriteLog()
        self._replays = []
        return Feedback.ok(
            {
                "time": self._world.iso_now(),
                "user": task.user.name,
                "apps": app_names,
                "tools": list(self._allowed),
            }
        )

    def step(self, action: Action) -> Feedback:
        if self._world is None or self._task is None:
            return Feedback.fail("precondition_failed", "no episode: call reset(task) first")
        if self._finished:
            return Feedback.fail(
                "precondition_failed", "the episode has finished; no more actions", done=True
            )
        self._steps += 1
        if self._steps > self.max_steps:
            self._finished = True
            return Feedback.fail(
                "precondition_failed", f"step budget of {self.max_steps} exhausted", done=True
            )
        self._world.tick()
        if isinstance(action, ToolCall):
            return self._call(action.tool, action.arguments)
        if isinstance(action, Finish):
            self._finished = True
            self._answer = action.answer
            return Feedback.ok({"finished": True}, done=True)
        if isinstance(action, MessageUser):
            self._user_log.append({"time": self._world.iso_now(), "text": action.text})
            return Feedback.ok({"delivered": True})
        if isinstance(action, Delegate):
            return Feedback.fail(
                "precondition_failed", "delegation is handled by the Harness, not the environment"
            )
        return Feedback.fail(
            "precondition_failed",
            "the sandbox has no screen: UI gestures are not available, use tools",
        )

    def verify(self) -> Verification:
        if self._world is None or self._task is None or self._store is None:
            return Verification(done=False, success=False, progress=0.0)
        checks = self._task.verifier.checks
        named = [tuple(c.target.split(".")[:2]) for c in checks if c.target.count(".") >= 1]
        pairs = list(dict.fromkeys([*self._store.owned(), *named]))
        base = Store(self._store.base)
        initial = base.view(pairs)  # type: ignore[arg-type]
        final = self._store.view(pairs)  # type: ignore[arg-type]
        collateral = (
            find_collateral(checks, initial, final, self._writes, replay=self._replay)
            if self._writes.calls
            else []
        )
        if self._user_log:
            final["_user"] = {"messages": self._user_log}
        return verify_state(
            self._task.verifier,
            final,
            self._answer,
            finished=self._finished,
            collateral=collateral,
        )

    def tools(self) -> list[ToolSpec]:
        return [bound.spec for bound in self._allowed.values()]

    def close(self) -> None:
        self._world = None
        self._store = None
        self._instances = {}

    # ------------------------------------------------------------------ extras
    def state(self) -> dict[str, Any]:
        """A detached snapshot of the phone's state (for servers, debugging and tests)."""
        if self._store is None:
            return {}
        whole: dict[str, Any] = self._store.materialise()
        if self._user_log:
            whole["_user"] = {"messages": self._user_log}
        snapshot: dict[str, Any] = orjson.loads(orjson.dumps(whole))
        return snapshot

    def session_bytes(self) -> int:
        """What this session holds of its own: the JSON size of the records in its overlay that
        are not the base's, plus a pointer (8 bytes) per slot of the lists it re-made (a list it
        changed shares every record it left alone with the base)."""
        if self._store is None:
            return 0
        total = len(orjson.dumps(self._user_log))
        for app, collection in self._store.owned():
            mine = self._store.overlay[app][collection]
            theirs = self._store.base.get(app, {}).get(collection)
            if isinstance(mine, list):
                shared = set(map(id, theirs)) if isinstance(theirs, list) else set()
                own = [r for r in mine if id(r) not in shared]
                total += len(orjson.dumps(own)) + 8 * len(mine)
            elif mine is not Store.DELETED:
                total += len(orjson.dumps(mine))
        return total

    @property
    def finished(self) -> bool:
        return self._finished

    def _call(self, name: str, arguments: dict[str, Any]) -> Feedback:
        bound = self._allowed.get(name)
        if bound is None:
            if name in self._tools:
                return Feedback.fail(
                    "unknown_tool", f"tool '{name}' is not available in this scenario"
                )
            return Feedback.fail("unknown_tool", f"no tool named '{name}'")
        task = self._task
        assert task is not None
        if bound.spec.side_effect == "payment" and name not in task.confirmations:
            return Feedback.fail(
                "permission_denied", f"'{name}' moves money and the user has not confirmed it"
            )
        try:
            parsed = bound.args_model.model_validate(arguments)
        except ValidationError as exc:
            return Feedback.fail("invalid_arguments", _describe(name, exc))
        world = self._world
        assert world is not None and self._store is not None
        app = self._instances[bound.app.name]
        writes = bound.spec.changes_state
        version = self._store.version() if writes else None
        replayable = (
            _Replayable(bound, orjson.dumps(arguments), world.now, dict(world._counters))
            if writes
            else None
        )
        outcome, done = _run_scoped(
            world, self._store, bound, app, parsed.__dict__, self._hints.setdefault(name, set())
        )
        # A state-changing call's changes (even those a failing call left behind) are
        # attributed to it; what read tools change is never collateral.
        if (
            writes
            and version is not None
            and replayable is not None
            and self._writes.record(name, version, _views(done, before=True), _views(done))
        ):
            self._replays.append(replayable)
        if isinstance(outcome, ToolError):
            return Feedback.fail(outcome.kind, outcome.message)
        if isinstance(outcome, Exception):  # a bug in an app must not kill the episode
            return Feedback.fail(
                "environment_failure", f"{name} crashed: {type(outcome).__name__}: {outcome}"
            )
        return ok_feedback(orjson.loads(orjson.dumps(outcome.value)))

    def _replay(self, index: int, state: dict[str, Any]) -> dict[str, Any] | None:
        """Run logged state-changing call `index` again on the state before it, with the
        collections in `state` (`{app: {collection: value}}`) in place of that state's, at the
        moment and with the id counters it first ran with: {} afterwards, or None if the call
        fails."""
        call = self._replays[index]
        assert self._task is not None and self._store is not None
        overlay = {app: dict(mine) for app, mine in self._writes.calls[index].version.items()}
        for app, collections in state.items():
            for collection, value in collections.items():
                overlay.setdefault(app, {})[collection] = freeze(value)
        store = Store(self._store.base, overlay)
        world = World(None, self._task.user, call.now, store=store)
        world._counters.update(call.counters)
        parsed = call.bound.args_model.model_validate(orjson.loads(call.arguments))
        outcome, _ = _run_scoped(
            world, store, call.bound, call.bound.app(world), parsed.__dict__, set()
        )
        if isinstance(outcome, BaseException):  # any failure means the call needs what was undone
            return None
        return {}


_OK_FIELDS = frozenset({"status", "observation", "error", "message", "done"})


def ok_feedback(observation: Any) -> Feedback:
    """`Feedback.ok(observation)` without `model_construct`'s per-field loop (a tool call's
    fixed cost): the same fields, values and fields-set, made directly (the test compares)."""
    feedback = object.__new__(Feedback)
    object.__setattr__(
        feedback,
        "__dict__",
        {"status": "ok", "observation": observation, "error": None, "message": "", "done": False},
    )
    object.__setattr__(feedback, "__pydantic_fields_set__", set(_OK_FIELDS))
    object.__setattr__(feedback, "__pydantic_extra__", None)
    object.__setattr__(feedback, "__pydantic_private__", None)
    return feedback


@dataclass
class _Returned:
    value: Any


def _views(
    done: dict[tuple[str, str], tuple[Any, Any]], *, before: bool = False
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (app, collection), (old, new) in done.items():
        value = old if before else new
        if value is not MISSING:
            out.setdefault(app, {})[collection] = value
        else:
            out.setdefault(app, {})
    return out


def _run_scoped(
    world: World,
    store: Store,
    bound: BoundTool,
    app: App,
    arguments: dict[str, Any],
    hints: set[tuple[str, str]],
) -> tuple[_Returned | Exception, dict[tuple[str, str], tuple[Any, Any]]]:
    """Run one tool call over the store's frozen state, rerunning it with more copied each time
    it tries to change something frozen; then commit what it changed. The outcome (its value or
    the exception it raised) and the (before, after) of every collection it changed."""
    writes = bound.spec.changes_state
    plan: dict[tuple[str, str], Plan] = {key: set() for key in hints}
    counters = dict(world._counters)
    now = world.now
    thaws: dict[tuple[str, str], int] = {}
    for _ in range(MAX_THAWS):
        scope = CallScope(
            store, {k: (v if v == ALL else set(v)) for k, v in plan.items()}, writes=writes
        )
        world.scope = scope
        try:
            outcome: _Returned | Exception = _Returned(bound.method(app, **arguments))
        except Thaw as signal:
            where = scope.locate(signal.obj)
            if where is None:
                raise RuntimeError(
                    f"{bound.name} changed frozen state outside its app's collections"
                ) from None
            key, record = where
            plan.update({k: v for k, v in scope.plan.items() if k not in plan or v == ALL})
            thaws[key] = thaws.get(key, 0) + 1
            entry = plan.setdefault(key, set())
            if record is None or thaws[key] > _WHOLE_AFTER:
                if record is not None:
                    plan[key] = ALL
                hints.add(key)
            elif isinstance(entry, set):
                entry.add(record)
            world._counters = dict(counters)
            world.now = now
            continue
        except ToolError as exc:
            outcome = exc
        except Exception as exc:
            outcome = exc
        finally:
            world.scope = None
        return outcome, scope.commit()
    raise RuntimeError(f"{bound.name}: more than {MAX_THAWS} copy-on-write reruns")


@dataclass(frozen=True)
class _Replayable:
    """What it takes to run a state-changing call again (for the precondition test)."""

    bound: BoundTool
    arguments: bytes
    now: datetime
    counters: dict[str, int]
