"""Skills: the versioned library of app procedures the Scenario Adapter injects into prompts.

A Skill is a short procedure document an app ships (`App.skills` in the sandbox): the order of
calls, conventions and field meanings that tool schemas alone do not reveal. `SkillLibrary` maps
app -> skill name -> text, plus an optional one-line description per app (used for relevance),
and carries a `version`, which is part of the Harness version a `HarnessRelease` deploys.

A Harness revision adds or rewrites Skills without code, as a YAML overlay::

    version: v2
    extends: registry            # or a path to another library file (relative to this file)
    skills:
      messaging:
        scheduled_send: |
          "Send it tomorrow at 8" means messaging_schedule with send_at=YYYY-MM-DDTHH:MM ...
        obsolete_skill: null     # null removes a skill inherited from the base

`SkillLibrary.load("skills-v2.yaml")` resolves the chain; `save` writes a self-contained file.
The library is immutable: `revise`/`remove`/`overlay` return a new library (with a bumped
version), so a running Harness never sees Skills change under it. The Harness imports the sandbox
registry (envs) for the defaults and never anything of training.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["DEFAULT_VERSION", "Skill", "SkillLibrary", "SkillLibraryError", "bump_version"]

DEFAULT_VERSION = "v1"
REGISTRY = "registry"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]{0,63}$")
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")
_MAX_EXTENDS_DEPTH = 16


class SkillLibraryError(ValueError):
    """A skill library file or revision is invalid (the message names the file and field)."""


class Skill(BaseModel):
    """One Skill as the adapter ranks and renders it: `app.name` plus its procedure text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app: str
    name: str
    text: str

    @property
    def id(self) -> str:
        """The identifier recorded in trajectories: `app.name`."""
        return f"{self.app}.{self.name}"


def bump_version(version: str) -> str:
    """The next version: a trailing number is incremented (`v1` -> `v2`, `2026.3` -> `2026.4`),
    otherwise `.1` is appended (`registry` -> `registry.1`)."""
    match = _TRAILING_NUMBER.match(version)
    if match:
        head, number = match.groups()
        return f"{head}{int(number) + 1:0{len(number)}d}"
    return f"{version}.1"


def _check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid name (letter first, then letters, digits, '_' or '-',"
            " at most 64; no dots: skills are recorded as 'app.skill')"
        )
    return value


def _check_text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"skill {where}: text must be a non-empty string")
    return value.strip()


class SkillLibrary(BaseModel):
    """Immutable, versioned mapping app -> skill name -> procedure text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = DEFAULT_VERSION
    skills: dict[str, dict[str, str]] = Field(default_factory=dict)
    descriptions: dict[str, str] = Field(default_factory=dict)

    @field_validator("version")
    @classmethod
    def _valid_version(cls, value: str) -> str:
        if not _VERSION.match(value):
            raise ValueError(
                f"version {value!r} must be 1-64 characters of letters, digits, '.', '_', '+', '-'"
            )
        return value

    @field_validator("skills")
    @classmethod
    def _valid_skills(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        clean: dict[str, dict[str, str]] = {}
        for app, entries in value.items():
            _check_name(app, "app")
            clean[app] = {
                _check_name(name, f"skill of app {app!r}"): _check_text(text, f"{app}.{name}")
                for name, text in entries.items()
            }
        return {app: entries for app, entries in sorted(clean.items()) if entries}

    @field_validator("descriptions")
    @classmethod
    def _valid_descriptions(cls, value: dict[str, str]) -> dict[str, str]:
        for app in value:
            _check_name(app, "app")
        return dict(sorted(value.items()))

    # ------------------------------------------------------------------ building
    @classmethod
    def from_registry(
        cls, *, version: str = DEFAULT_VERSION, apps: Iterable[str] | None = None
    ) -> SkillLibrary:
        """The Skills every sandbox app ships (`App.skills`), optionally for some apps only."""
        from qpa.envs.sandbox.registry import all_apps

        registered = all_apps()
        names = list(registered) if apps is None else [a for a in apps if a in registered]
        return cls(
            version=version,
            skills={name: dict(registered[name].skills) for name in names},
            descriptions={
                name: registered[name].description for name in names if registered[name].description
            },
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "<dict>") -> SkillLibrary:
        """Validate a plain document (without `extends`); errors name the origin and field."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise SkillLibraryError(f"{origin}: {_describe(exc)}") from None

    @classmethod
    def from_yaml(
        cls, text: str, *, origin: str = "<yaml>", base_dir: Path | None = None
    ) -> SkillLibrary:
        """Parse a YAML document, resolving `extends` (`registry` or a library file path)."""
        return cls._from_yaml(text, origin=origin, base_dir=base_dir or Path.cwd(), seen=())

    @classmethod
    def load(cls, path: str | Path) -> SkillLibrary:
        """Load a library file; an `extends` chain is resolved relative to each file."""
        return cls._load(Path(path), seen=())

    @classmethod
    def _load(cls, path: Path, seen: tuple[Path, ...]) -> SkillLibrary:
        resolved = path.resolve()
        if resolved in seen:
            chain = " -> ".join(str(p) for p in (*seen, resolved))
            raise SkillLibraryError(f"{path}: 'extends' forms a cycle: {chain}")
        if len(seen) >= _MAX_EXTENDS_DEPTH:
            raise SkillLibraryError(f"{path}: 'extends' chain deeper than {_MAX_EXTENDS_DEPTH}")
        try:
            text = resolved.read_text(encoding="utf-8")
        except OSError as exc:
            raise SkillLibraryError(f"cannot read skill library {path}: {exc}") from None
        return cls._from_yaml(
            text, origin=str(path), base_dir=resolved.parent, seen=(*seen, resolved)
        )

    @classmethod
    def _from_yaml(
        cls, text: str, *, origin: str, base_dir: Path, seen: tuple[Path, ...]
    ) -> SkillLibrary:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SkillLibraryError(f"{origin}: not valid YAML: {exc}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise SkillLibraryError(
                f"{origin}: a skill library is a mapping, got {type(doc).__name__}"
            )
        unknown = set(doc) - {"version", "extends", "skills", "descriptions"}
        if unknown:
            raise SkillLibraryError(
                f"{origin}: unknown field(s) {', '.join(sorted(map(str, unknown)))}"
            )
        extends = doc.get("extends")
        if extends is None:
            return cls.from_dict({k: v for k, v in doc.items() if v is not None}, origin=origin)
        if not isinstance(extends, str) or not extends.strip():
            raise SkillLibraryError(f"{origin}: field 'extends' must be 'registry' or a file path")
        if extends == REGISTRY:
            base = cls.from_registry()
        else:
            target = Path(extends)
            base = cls._load(target if target.is_absolute() else base_dir / target, seen)
        skills = doc.get("skills") or {}
        descriptions = doc.get("descriptions") or {}
        if not isinstance(skills, dict) or not all(
            isinstance(v, dict) or v is None for v in skills.values()
        ):
            raise SkillLibraryError(f"{origin}: field 'skills' must map app -> skill name -> text")
        if not isinstance(descriptions, dict):
            raise SkillLibraryError(f"{origin}: field 'descriptions' must map app -> text")
        try:
            return base.overlay(skills, descriptions=descriptions, version=doc.get("version"))
        except (ValueError, ValidationError) as exc:
            detail = _describe(exc) if isinstance(exc, ValidationError) else str(exc)
            raise SkillLibraryError(f"{origin}: {detail}") from None

    # ------------------------------------------------------------------ saving
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """A self-contained YAML document (no `extends`): what `save` writes."""
        return yaml.safe_dump(self.to_dict(), sort_keys=True, allow_unicode=True, width=100)

    def save(self, path: str | Path) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_yaml(), encoding="utf-8")
        return target

    # ------------------------------------------------------------------ revising
    def revise(self, app: str, name: str, text: str, *, version: str | None = None) -> SkillLibrary:
        """A new library with skill `app.name` added or rewritten, and the version bumped."""
        return self.overlay({app: {name: text}}, version=version)

    def remove(self, app: str, name: str, *, version: str | None = None) -> SkillLibrary:
        """A new library without skill `app.name` (KeyError if absent), version bumped."""
        if name not in self.skills.get(app, {}):
            raise KeyError(f"no skill {app}.{name} in library {self.version}")
        return self.overlay({app: {name: None}}, version=version)

    def overlay(
        self,
        skills: Mapping[str, Mapping[str, str | None] | None],
        *,
        descriptions: Mapping[str, str] | None = None,
        version: str | None = None,
    ) -> SkillLibrary:
        """Apply overrides: text adds/rewrites, None removes (a skill, or a whole app).

        The new version is `version` when given, else this one bumped.
        """
        merged = {app: dict(entries) for app, entries in self.skills.items()}
        for app, entries in skills.items():
            if entries is None:
                merged.pop(app, None)
                continue
            target = merged.setdefault(app, {})
            for name, text in entries.items():
                if text is None:
                    target.pop(name, None)
                else:
                    target[name] = text
        return SkillLibrary(
            version=version or bump_version(self.version),
            skills=merged,
            descriptions={**self.descriptions, **(descriptions or {})},
        )

    # ------------------------------------------------------------------ reading
    @property
    def apps(self) -> list[str]:
        return list(self.skills)

    def get(self, app: str, name: str) -> str | None:
        return self.skills.get(app, {}).get(name)

    def for_apps(self, apps: Iterable[str]) -> list[Skill]:
        """The Skills of the given apps, in app order then skill name order."""
        return [
            Skill(app=app, name=name, text=text)
            for app in dict.fromkeys(apps)
            for name, text in sorted(self.skills.get(app, {}).items())
        ]

    def all(self) -> list[Skill]:
        """Every Skill of the library (app order, then name order)."""
        return self.for_apps(self.skills)

    @property
    def count(self) -> int:
        return sum(len(entries) for entries in self.skills.values())

    def fingerprint(self) -> str:
        """A content hash (sha256, 12 hex digits): two libraries with the same Skills agree."""
        blob = json.dumps(
            {"skills": self.skills, "descriptions": self.descriptions}, sort_keys=True
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<document>"
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"field '{loc}': {msg}")
    return "; ".join(parts)
