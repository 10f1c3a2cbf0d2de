"""BFCL itself, as qpa reaches it: the pinned `bfcl-eval` package's multi-turn data and backends.

Everything qpa knows of BFCL comes through this module, from the installed package
(`bfcl-eval==2026.3.23`, installed with `--no-deps`; its multi-turn backends need only the
standard library and `mpmath`): the four multi-turn categories' entries
(`data/BFCL_v4_multi_turn_<c>.json`), their ground truth (`data/possible_answer/`), the function
docs of the backend classes (`data/multi_turn_func_doc/`), the backend classes themselves
(`eval_checker/multi_turn_eval/func_source_code/`, found through BFCL's own
`CLASS_FILE_PATH_MAPPING`), the reviewed side-effect table (`effects.yaml`) and the reviewed
argument-role table (`roles.yaml`: which arguments of each state-changing function name a
recipient, a target record, an amount, content, a URL, a credential or an option; the rest are
free). Nothing here re-implements a backend or the judge.

BFCL's backends keep process-wide mutable state that its own harness never isolates (it runs
one model per process): `TwitterAPI.post_tweet`'s list defaults are shared and extended in
place by `mention`, and the long-context extensions (`long_context.py`: credit cards, booking
records, a weather report) are handed to instances by reference and changed by calls. Every
execution of BFCL code in qpa therefore runs inside `isolated(...)`: under one process-wide lock,
with the method defaults of the episode (or judge run) that is executing installed and the
pristine ones put back after, and live backends built by `new_backends` own deep copies of their
state (`decouple`), so one episode can never change another's world or its judge's.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from types import FunctionType, MappingProxyType, ModuleType
from typing import Any

import yaml

from qpa.contract import ArgRole, SideEffect
from qpa.envs.effects import check_effect_table, check_role_table

VERSION = "2026.3.23"
BFCL_CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)
#: The backend classes the multi-turn categories involve (BFCL's mapping also lists the web
#: search and memory backends of its agentic categories: left out).
MULTI_TURN_CLASSES: tuple[str, ...] = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
#: Held by every execution of BFCL code (live calls and judge runs): see the module docstring.
_LOCK = threading.RLock()


class BfclUnavailable(RuntimeError):
    """The `bfcl_eval` package is not installed (`pip install --no-deps bfcl-eval==2026.3.23`)."""


def _config() -> ModuleType:
    try:
        return importlib.import_module("bfcl_eval.constants.executable_backend_config")
    except ImportError as exc:  # pragma: no cover - installed by the Makefile
        raise BfclUnavailable(
            f"environment kind bfcl needs the bfcl-eval package: pip install --no-deps "
            f"bfcl-eval=={VERSION} mpmath"
        ) from exc


def _data_file(*parts: str) -> str:
    return files("bfcl_eval").joinpath("data", *parts).read_text(encoding="utf-8")


def _jsonl(*parts: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _data_file(*parts).splitlines() if line.strip()]


@dataclass(frozen=True)
class Entry:
    """One BFCL multi-turn entry, as its data files give it.

    `turns` are the user's texts, one per turn; a miss_func turn that only brings the withheld
    functions back has no user message in BFCL's data, and BFCL's harness says its
    `DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC` there: so does this. `missed` maps a turn
    to the functions it adds (withheld before it); `ground_truth` holds BFCL's call strings per
    turn (an empty turn is one where no call can do what the user asks).
    """

    category: str
    id: str
    turns: tuple[str, ...]
    initial_config: Mapping[str, Any]
    involved_classes: tuple[str, ...]
    missed: Mapping[int, tuple[str, ...]]
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def long_context(self) -> bool:
        """Whether backends load their long-context extensions (BFCL's own rule)."""
        return "long_context" in self.category or "composite" in self.category

    @property
    def withheld(self) -> frozenset[str]:
        """The functions not offered at the start."""
        return frozenset(name for names in self.missed.values() for name in names)

    def test_entry(self) -> dict[str, Any]:
        """The entry as BFCL's checker takes it (a fresh copy)."""
        return {
            "id": self.id,
            "initial_config": copy.deepcopy(dict(self.initial_config)),
            "involved_classes": list(self.involved_classes),
        }


def _check_category(category: str) -> None:
    if category not in BFCL_CATEGORIES:
        raise KeyError(
            f"unknown BFCL category {category!r}; choose from: {', '.join(BFCL_CATEGORIES)}"
        )


def _turn_text(messages: list[dict[str, Any]], holdout_prompt: str) -> str:
    texts = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    return "\n".join(texts) if texts else holdout_prompt


@functools.cache
def entries(category: str) -> Mapping[str, Entry]:
    """Every entry of `category` by BFCL id, in BFCL's order; `KeyError` when unknown."""
    _check_category(category)
    _config()
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    rows = _jsonl(f"BFCL_v4_{category}.json")
    answers = {
        a["id"]: a["ground_truth"] for a in _jsonl("possible_answer", f"BFCL_v4_{category}.json")
    }
    out: dict[str, Entry] = {}
    for row in rows:
        missed = {
            int(turn): tuple(names) for turn, names in (row.get("missed_function") or {}).items()
        }
        out[row["id"]] = Entry(
            category=category,
            id=row["id"],
            turns=tuple(
                _turn_text(turn, DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)
                for turn in row["question"]
            ),
            initial_config=row.get("initial_config") or {},
            involved_classes=tuple(row["involved_classes"]),
            missed=missed,
            ground_truth=tuple(tuple(turn) for turn in answers[row["id"]]),
        )
    return MappingProxyType(out)


def entry(category: str, entry_id: str) -> Entry:
    """The entry `entry_id` of `category`; `KeyError` naming both when there is none."""
    found = entries(category).get(entry_id)
    if found is None:
        raise KeyError(f"{entry_id!r} is not an entry of BFCL category {category}")
    return found


@functools.cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """The function docs of backend class `class_name`, in BFCL's order."""
    if class_name not in MULTI_TURN_CLASSES:
        raise KeyError(f"{class_name!r} is not a BFCL multi-turn backend class")
    mapping: Mapping[str, str] = _config().MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(_jsonl("multi_turn_func_doc", mapping[class_name]))


@functools.cache
def backend_class(class_name: str) -> type:
    """BFCL's backend class `class_name` (imported through BFCL's own mapping)."""
    if class_name not in MULTI_TURN_CLASSES:
        raise KeyError(f"{class_name!r} is not a BFCL multi-turn backend class")
    module = importlib.import_module(_config().CLASS_FILE_PATH_MAPPING[class_name])
    cls: type = getattr(module, class_name)
    return cls


def module_name(class_name: str) -> str:
    """The backend's module name (`GorillaFileSystem` -> `gorilla_file_system`)."""
    path: str = _config().CLASS_FILE_PATH_MAPPING[class_name]
    return path.rsplit(".", 1)[1]


@functools.cache
def parameters(class_name: str, function: str) -> tuple[str, ...]:
    """The parameter names of a backend method, in signature order (for positional calls)."""
    method = getattr(backend_class(class_name), function)
    names = list(inspect.signature(method).parameters)
    return tuple(names[1:])  # drop `self`


@functools.cache
def effects() -> Mapping[str, Mapping[str, SideEffect]]:
    """The reviewed side-effect table (`effects.yaml`), checked against every func doc."""
    text = files("qpa.envs.bfcl").joinpath("effects.yaml").read_text(encoding="utf-8")
    return check_effects(yaml.safe_load(text) or {})


def check_effects(table: Mapping[str, Mapping[str, str]]) -> Mapping[str, Mapping[str, SideEffect]]:
    """`table` if it classifies every function of every multi-turn class's func doc, and
    nothing else, as one of the contract's side effects; `ValueError` naming what is not."""
    tools = {name: {doc["name"] for doc in func_docs(name)} for name in MULTI_TURN_CLASSES}
    return check_effect_table(table, tools, group="class", member="functions")


@functools.cache
def roles() -> Mapping[str, Mapping[str, dict[str, ArgRole]]]:
    """The reviewed argument-role table (`roles.yaml`), checked against every func doc and the
    side-effect table (shared: copy before changing one)."""
    text = files("qpa.envs.bfcl").joinpath("roles.yaml").read_text(encoding="utf-8")
    return check_roles(yaml.safe_load(text) or {})


def check_roles(
    table: Mapping[str, Mapping[str, Mapping[str, str]]],
) -> Mapping[str, Mapping[str, dict[str, ArgRole]]]:
    """`table` if it declares the roles of every state-changing function (`effects()` says
    which) with only arguments its func doc has and only the contract's roles; `ValueError`
    naming the class, function and argument that is not."""
    arguments = {
        name: {
            doc["name"]: set((doc.get("parameters") or {}).get("properties") or {})
            for doc in func_docs(name)
        }
        for name in MULTI_TURN_CLASSES
    }
    return check_role_table(table, arguments, effects(), group="class")


# --------------------------------------------------------------------------- isolation

Defaults = dict[FunctionType, tuple[Any, Any]]


@functools.cache
def _functions() -> tuple[FunctionType, ...]:
    """Every function with defaults defined in the multi-turn backend modules' classes."""
    found: list[FunctionType] = []
    for class_name in MULTI_TURN_CLASSES:
        module = sys.modules[backend_class(class_name).__module__]
        for obj in vars(module).values():
            if not (inspect.isclass(obj) and obj.__module__ == module.__name__):
                continue
            for value in vars(obj).values():
                if isinstance(value, FunctionType) and (value.__defaults__ or value.__kwdefaults__):
                    found.append(value)
    return tuple(dict.fromkeys(found))


@functools.cache
def _pristine_defaults() -> Defaults:
    return {f: copy.deepcopy((f.__defaults__, f.__kwdefaults__)) for f in _functions()}


def fresh_defaults() -> Defaults:
    """A private copy of every backend method's default arguments, as BFCL ships them."""
    return copy.deepcopy(_pristine_defaults())


@functools.cache
def _long_context_module() -> ModuleType:
    return importlib.import_module(
        f"{_config().BACKEND_PATH_PREFIX}.long_context"  # the extensions' module
    )


@functools.cache
def _pristine_extensions() -> dict[str, Any]:
    module = _long_context_module()
    return {
        name: copy.deepcopy(value)
        for name, value in vars(module).items()
        if not name.startswith("_") and isinstance(value, dict | list)
    }


def _restore_extensions() -> None:
    """Put the long-context extensions back as shipped, in place (backend modules import them
    by name, so the objects must stay the same)."""
    module = _long_context_module()
    for name, value in _pristine_extensions().items():
        target = getattr(module, name)
        if target == value:  # the usual case, and far cheaper than a copy
            continue
        if isinstance(target, dict):
            target.clear()
            target.update(copy.deepcopy(value))
        else:
            target[:] = copy.deepcopy(value)


def _install(defaults: Defaults) -> None:
    for function, (positional, keyword) in defaults.items():
        function.__defaults__ = positional
        function.__kwdefaults__ = keyword


@contextmanager
def isolated(defaults: Defaults | None = None, *, extensions: bool = False) -> Iterator[None]:
    """Run BFCL code alone in the process, with `defaults` (an episode's own copy, changed in
    place by what runs) installed, and pristine defaults back after. `extensions` also puts the
    long-context extensions back as shipped first (a judge run starts from BFCL's data)."""
    _functions()  # import the backends before taking the lock's time
    with _LOCK:
        if extensions:
            _restore_extensions()
        own = defaults if defaults is not None else fresh_defaults()
        _install(own)
        try:
            yield
        finally:
            for function in own:
                own[function] = (function.__defaults__, function.__kwdefaults__)
            _install(fresh_defaults())
            if extensions:
                _restore_extensions()


def new_backends(found: Entry) -> dict[str, Any]:
    """Fresh backend instances for an entry, loaded as BFCL's `execute_multi_turn_func_call`
    loads them (`_load_scenario` with a deep copy of the class's initial config, stateless
    classes left as built), then `decouple`d from the module-level extensions."""
    stateless: list[str] = list(_config().STATELESS_CLASSES)
    instances: dict[str, Any] = {}
    with isolated(extensions=True):
        for class_name in found.involved_classes:
            instance = backend_class(class_name)()
            if class_name not in stateless:
                config = copy.deepcopy(dict(found.initial_config).get(class_name, {}))
                instance._load_scenario(config, long_context=found.long_context)
            instances[class_name] = decouple(instance)
    return instances


def decouple(instance: Any) -> Any:
    """The instance with its whole state deep-copied at once (aliases inside it kept), so it
    shares nothing with module-level objects."""
    vars(instance).update(copy.deepcopy(vars(instance)))
    return instance
