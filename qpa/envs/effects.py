"""Reviewed side-effect tables: the check every third-party environment kind loads its table
through (`qpa/envs/agentdojo/effects.yaml`, `qpa/envs/bfcl/effects.yaml`).

A table maps a group (an AgentDojo suite, a BFCL class) to its tools' effects. It must name
every tool the benchmark has, nothing it does not, and only the contract's effects; anything
else is a `ValueError` naming the group and the tools, so no effect is ever guessed at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import cast

from qpa.contract import SideEffect

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
