"""What one episode's tools and Skills are, read from its trajectory alone.

Diagnosis and curation must know what each called tool does (does it change state? which app is
it? what arguments does it accept?) and which Skills came with the tools. They read it from the
trajectory (`Trajectory.tools`, `Trajectory.skills`, recorded by the episode runner), never from an
environment's registry, so device, LLM-simulated and remote episodes are judged by their own tools.

A tool the trajectory does not describe (an old trajectory, written before tools were recorded, or
a call of a tool the episode did not offer) has an **unknown** effect: `side_effect` returns None,
`is_write` is False (nothing is claimed to have changed) and `is_read` is False too (nothing is
claimed to be harmless). Callers pick the conservative reading for their question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from qpa.contract import SideEffect, SkillSpec, ToolSpec, Trajectory
from qpa.harness.parsing import PSEUDO_TOOLS

__all__ = ["EpisodeTools", "named_tools"]

_TOOL_NAME = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")


def named_tools(text: str, known: Iterable[str]) -> set[str]:
    """The names among `known` that a Skill's text mentions."""
    names = set(known)
    return {w for w in _TOOL_NAME.findall(text) if w in names}


@lru_cache(maxsize=1024)
def _validator(schema: str) -> Draft202012Validator | None:
    parameters = json.loads(schema)
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError:
        return None
    return Draft202012Validator(parameters)


@dataclass(frozen=True)
class EpisodeTools:
    """The tools an episode offered (plus the Harness's pseudo-tools) and its Skills."""

    specs: Mapping[str, ToolSpec]
    skills: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, trajectory: Trajectory) -> EpisodeTools:
        """What `trajectory` recorded (empty for a trajectory written before tools were)."""
        return cls.build(trajectory.tools, trajectory.skills)

    @classmethod
    def build(
        cls,
        tools: Iterable[ToolSpec],
        skills: Iterable[SkillSpec] | Mapping[str, Mapping[str, str]],
    ) -> EpisodeTools:
        """From tool specs and Skills (`SkillSpec`s, or app -> skill name -> text)."""
        specs = {p.name: p for p in PSEUDO_TOOLS}
        specs.update({t.name: t for t in tools})
        library: dict[str, dict[str, str]] = {}
        if isinstance(skills, Mapping):
            for app, entries in skills.items():
                library.setdefault(app, {}).update(entries)
        else:
            for skill in skills:
                library.setdefault(skill.app, {})[skill.name] = skill.text
        return cls(specs, library)

    @property
    def recorded(self) -> bool:
        """Whether any environment tool is described (False for an old trajectory)."""
        return any(name not in _PSEUDO_NAMES for name in self.specs)

    def side_effect(self, tool: str) -> SideEffect | None:
        """The tool's side effect, or None when the episode does not describe the tool."""
        spec = self.specs.get(tool)
        return spec.side_effect if spec is not None else None

    def is_write(self, tool: str) -> bool:
        """Whether the tool is known to change state (unknown tools: False)."""
        return self.side_effect(tool) not in (None, "read")

    def is_read(self, tool: str) -> bool:
        """Whether the tool is known to change nothing (unknown tools: False)."""
        return self.side_effect(tool) == "read"

    def app_of(self, tool: str, apps: Sequence[str] = ()) -> str:
        """The tool's app: its spec's, else the longest of `apps` prefixing its name, else the
        name's first word."""
        spec = self.specs.get(tool)
        if spec is not None and spec.app:
            return spec.app
        candidates = [a for a in apps if tool.startswith(f"{a}_")]
        return max(candidates, key=len) if candidates else tool.split("_", 1)[0]

    def named_tools(self, text: str, known: Iterable[str] = ()) -> set[str]:
        """The episode's tools (or the `known` names) that a Skill's text mentions."""
        return named_tools(text, set(self.specs) | set(known))

    def skill_text(self, skill_id: str) -> str:
        """The text of Skill `app.name` ('' when the episode did not offer it)."""
        app, _, name = skill_id.partition(".")
        return self.skills.get(app, {}).get(name, "")

    def validator(self, tool: str) -> Draft202012Validator | None:
        """A validator of the tool's argument schema (None: unknown tool or invalid schema)."""
        spec = self.specs.get(tool)
        if spec is None:
            return None
        return _validator(json.dumps(spec.parameters, sort_keys=True, default=str))


_PSEUDO_NAMES = frozenset(p.name for p in PSEUDO_TOOLS)
