"""Descriptions of LLM-simulated apps (`SimApp`) and of a task's simulated world (`SimWorld`).

A long-tail app has no programmatic implementation: it is its tool schemas plus a description of
the world behind them, and a chat model plays its backend. Every tool declares a JSON schema of
its arguments (`parameters`, checked before any model call) and of its result (`result`, which
the model's answer must satisfy). Apps are YAML files, one app per file:

```yaml
name: parking_permits            # unique, also the `app` of every tool
title: City Parking Permits
description: Residential parking permits of the city of Northbridge.
world: |                         # how the backend behaves: rules, prices, id formats
  Permits cost 15.00 per month ...
skills:                          # optional app know-how the Harness may inject
  renew: look up the permit id with get_permit_status first
tools:
  - name: get_permit_status
    description: Permits registered to a licence plate.
    side_effect: read            # read | write | payment (payment needs the user's confirmation)
    parameters: {type: object, properties: {plate: {type: string}}, required: [plate]}
    result: {type: object, properties: {permits: {type: array}}, required: [permits]}
```

Tool parameter schemas that do not say otherwise get `additionalProperties: false`, so unknown
arguments are rejected as they are in the programmatic sandbox.

A task places its episode in a world through `task.world["_llmsim"]`, validated as `SimWorld`:

```yaml
_llmsim:
  apps: [parking_permits]        # catalogue names, or whole inline SimApp mappings
  facts: "Alex owns two cars: ..."  # what is true at the start, in words
  state: {vehicles: [...]}       # optional structured facts (ids the plans can rely on)
  start: "2026-03-02T09:00"      # optional simulated clock start
```
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from qpa.contract import ToolSpec

DEFAULT_START = datetime(2026, 3, 2, 9, 0, 0)
APPS_PACKAGE = "qpa.envs.llmsim"
APPS_FOLDER = "apps"


class SimApp(BaseModel):
    """A long-tail app: its tools (argument and result schemas) and the world behind them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    title: str = ""
    description: str = Field(min_length=1)
    world: str = Field(min_length=1, description="How the simulated backend behaves, in words.")
    skills: dict[str, str] = Field(default_factory=dict)
    tools: list[ToolSpec] = Field(min_length=1)

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, tools: list[ToolSpec]) -> list[ToolSpec]:
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate tool names: {', '.join(duplicates)}")
        for t in tools:
            if not t.result:
                raise ValueError(f"tool {t.name!r} has no result schema")
            for what, schema in (("parameters", t.parameters), ("result", t.result)):
                try:
                    Draft202012Validator.check_schema(schema)
                except SchemaError as exc:
                    raise ValueError(
                        f"tool {t.name!r}: invalid {what} schema: {exc.message}"
                    ) from exc
            if t.parameters.get("type") != "object":
                raise ValueError(f"tool {t.name!r}: parameters must be an object schema")
        return tools

    @model_validator(mode="after")
    def _own_tools(self) -> SimApp:
        owned = []
        for t in self.tools:
            if t.app and t.app != self.name:
                raise ValueError(f"tool {t.name!r} declares app {t.app!r}, not {self.name!r}")
            parameters = dict(t.parameters)
            parameters.setdefault("additionalProperties", False)
            owned.append(t.model_copy(update={"app": self.name, "parameters": parameters}))
        self.tools = owned
        return self

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


class SimWorld(BaseModel):
    """The layout of `task.world["_llmsim"]`: which apps, and what is true at the start."""

    model_config = ConfigDict(extra="forbid")

    apps: list[str | SimApp] = Field(default_factory=list)
    facts: str = ""
    state: dict[str, Any] = Field(default_factory=dict)
    start: datetime | None = None


def parse_app(document: Any, *, source: str = "<app>") -> SimApp:
    """Validate one app document (a mapping, e.g. parsed YAML); errors name the source."""
    if not isinstance(document, dict):
        raise ValueError(f"{source}: an app must be a mapping, got {type(document).__name__}")
    try:
        return SimApp.model_validate(document)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from exc


def load_app(path: str | Path) -> SimApp:
    """Load one app from a YAML file."""
    path = Path(path)
    return parse_app(yaml.safe_load(path.read_text(encoding="utf-8")), source=str(path))


def load_apps(paths: Iterable[str | Path]) -> dict[str, SimApp]:
    """Load apps from YAML files and folders of `*.yaml`/`*.yml` (names, tools unique)."""
    files: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            files.extend(sorted([*entry.glob("*.yaml"), *entry.glob("*.yml")]))
        else:
            files.append(entry)
    return catalogue(load_app(f) for f in files)


def catalogue(apps: Iterable[SimApp]) -> dict[str, SimApp]:
    """Index apps by name; a repeated app name or a tool name in two apps is an error."""
    found: dict[str, SimApp] = {}
    owner: dict[str, str] = {}
    for app in apps:
        if app.name in found:
            raise ValueError(f"duplicate sim app name {app.name!r}")
        for t in app.tools:
            if t.name in owner:
                raise ValueError(f"tool {t.name!r} defined by both {owner[t.name]} and {app.name}")
            owner[t.name] = app.name
        found[app.name] = app
    return dict(sorted(found.items()))


@cache
def builtin_apps() -> dict[str, SimApp]:
    """The apps shipped in `qpa/envs/llmsim/apps/*.yaml` (package data)."""
    folder = resources.files(APPS_PACKAGE).joinpath(APPS_FOLDER)
    apps = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".yaml", ".yml")):
            document = yaml.safe_load(entry.read_text(encoding="utf-8"))
            apps.append(parse_app(document, source=f"{APPS_FOLDER}/{entry.name}"))
    return catalogue(apps)
