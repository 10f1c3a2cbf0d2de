"""Reviewed side-effect tables: the check every third-party environment kind loads its table
through (`qpa/envs/agentdojo/effects.yaml`, `qpa/envs/bfcl/effects.yaml`).

A table maps a group (an AgentDojo suite, a BFCL class) to its tools' effects. It must name
every tool the benchmark has, nothing it does not, and only the contract's effects; anything
else is a `ValueError` naming the group and the tools, so no effect is ever guessed at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import cast

from qpa.contract import ArgRole, SideEffect

EFFECTS: frozenset[str] = frozenset(SideEffect.__args__)  # type: ignore[attr-defined]


def check_effect_table(
    table: Mapping[str, Mapping[str, str]],
    tools: Mapping[str, Set[str]],
    *,
    group: str,
    member: str,
) -> Mapping[str, Mapping[str, SideEffect]]:
    """`table` when it classifies exactly `tools` (group -> tool names); `group` and `member`
    name them in errors ("suite" / "tools", "class" / "functions")."""
    stale_groups = set(table) - set(tools)
    if stale_groups:
        raise ValueError(f"effects.yaml: unknown {group} names {sorted(stale_groups)}")
    for name, expected in tools.items():
        reviewed = table.get(name) or {}
        missing, stale = set(expected) - set(reviewed), set(reviewed) - set(expected)
        if missing or stale:
            raise ValueError(
                f"effects.yaml: {group} {name}: unreviewed {member} {sorted(missing)}, "
                f"stale entries {sorted(stale)}"
            )
        bad = {tool: e for tool, e in reviewed.items() if e not in EFFECTS}
        if bad:
            raise ValueError(f"effects.yaml: {group} {name}: unknown effects {bad}")
    return cast(Mapping[str, Mapping[str, SideEffect]], table)


ROLES: frozenset[str] = frozenset(ArgRole.__args__)  # type: ignore[attr-defined]


def check_role_table(
    table: Mapping[str, Mapping[str, Mapping[str, str]]],
    parameters: Mapping[str, Mapping[str, Set[str]]],
    effects: Mapping[str, Mapping[str, SideEffect]],
    *,
    group: str,
) -> Mapping[str, Mapping[str, dict[str, ArgRole]]]:
    """`table` (group -> tool -> argument -> role) when it declares the roles of every
    state-changing tool (`effects` says which) and names only arguments the tool has
    (`parameters`: group -> tool -> argument names) and only the contract's roles; an argument
    it leaves out is `free`. Anything else is a `ValueError` naming the group, tool and field."""
    stale_groups = set(table) - set(parameters)
    if stale_groups:
        raise ValueError(f"roles.yaml: unknown {group} names {sorted(stale_groups)}")
    out: dict[str, dict[str, dict[str, ArgRole]]] = {}
    for name, tools in parameters.items():
        declared = table.get(name) or {}
        stale = set(declared) - set(tools)
        if stale:
            raise ValueError(f"roles.yaml: {group} {name}: unknown tools {sorted(stale)}")
        writes = {t for t, e in (effects.get(name) or {}).items() if e != "read"}
        missing = writes - set(declared)
        if missing:
            raise ValueError(
                f"roles.yaml: {group} {name}: state-changing tools without reviewed roles "
                f"{sorted(missing)}"
            )
        out[name] = {}
        for tool, roles in declared.items():
            roles = roles or {}
            unknown_args = set(roles) - set(tools[tool])
            if unknown_args:
                raise ValueError(
                    f"roles.yaml: {group} {name}.{tool}: unknown arguments {sorted(unknown_args)}"
                )
            bad = {a: r for a, r in roles.items() if r not in ROLES}
            if bad:
                raise ValueError(f"roles.yaml: {group} {name}.{tool}: unknown roles {bad}")
            out[name][tool] = cast(dict[str, ArgRole], dict(roles))
    return out
