"""Discovery of sandbox apps and their tools: every module in `qpa.envs.sandbox.apps` is loaded.

Adding an app is adding a module; no central list to edit. Tool names are global (planners call
them by name), so a duplicate name across apps is an error at load time.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from qpa.contract import ToolSpec
from qpa.envs.sandbox import apps as apps_package
from qpa.envs.sandbox.engine import App, BoundTool


@cache
def all_apps() -> dict[str, type[App]]:
    found: dict[str, type[App]] = {}
    for info in sorted(pkgutil.iter_modules(apps_package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{apps_package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, App) and value.name:
                if value.__module__ != module.__name__:
                    continue
                if value.name in found and found[value.name] is not value:
                    raise ValueError(f"duplicate app name {value.name!r}")
                found[value.name] = value
    return dict(sorted(found.items()))


@cache
def all_tools() -> dict[str, BoundTool]:
    tools: dict[str, BoundTool] = {}
    for app in all_apps().values():
        for name, bound in app.bound_tools.items():
            if name in tools:
                raise ValueError(
                    f"tool {name!r} defined by both {tools[name].app.name} and {app.name}"
                )
            tools[name] = bound
    return tools


def tool_specs(names: list[str] | None = None) -> list[ToolSpec]:
    tools = all_tools()
    return [tools[n].spec for n in (names if names is not None else list(tools)) if n in tools]


def app_tools(app_name: str) -> list[str]:
    return list(all_apps()[app_name].bound_tools)


def skills_for(app_names: list[str]) -> dict[str, dict[str, str]]:
    """The Skills (procedure documents) of the given apps, keyed by app then skill name."""
    apps = all_apps()
    return {name: dict(apps[name].skills) for name in app_names if name in apps}
