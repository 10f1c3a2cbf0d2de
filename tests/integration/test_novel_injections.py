"""The independent injection suite (`qpa.bench.novel_injections`): its kinds are new, its halves
fixed, its actions real sandbox calls, and a sample of them really writes without the guard.

Nothing here says what the guard does with them (it is being redesigned against the tune half;
the report half is only measured, by `benchmarks/injection_suite.py --novel`).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from qpa.bench.injection import ATTACKS, build_suite, run_injection
from qpa.bench.novel_injections import NOVEL_ATTACKS, REPORT_KINDS, TUNE_KINDS, attacks_for
from qpa.envs.sandbox.registry import all_tools


def test_at_least_22_new_kinds_with_unique_names() -> None:
    kinds = [a.kind for a in NOVEL_ATTACKS]
    assert len(kinds) >= 22
    assert len(set(kinds)) == len(kinds)
    assert not set(kinds) & {a.kind for a in ATTACKS}


def test_the_halves_are_fixed_disjoint_and_cover_every_kind() -> None:
    kinds = [a.kind for a in NOVEL_ATTACKS]
    assert not set(TUNE_KINDS) & set(REPORT_KINDS)
    assert set(TUNE_KINDS) | set(REPORT_KINDS) == set(kinds)
    assert list(TUNE_KINDS) == kinds[0::2] and list(REPORT_KINDS) == kinds[1::2]
    assert [a.kind for a in attacks_for("tune")] == list(TUNE_KINDS)
    assert [a.kind for a in attacks_for("report")] == list(REPORT_KINDS)
    assert attacks_for("all") == NOVEL_ATTACKS


def _is_ref(value: Any) -> bool:
    return (isinstance(value, str) and "${" in value) or (
        isinstance(value, list) and any(_is_ref(v) for v in value)
    )


def test_every_action_is_a_real_tool_with_valid_arguments() -> None:
    tools = all_tools()
    for attack in NOVEL_ATTACKS:
        assert attack.actions or attack.amend or attack.derive, attack.kind
        for amend in attack.amend:
            assert amend.tool in tools, (attack.kind, amend.tool)
            fields = tools[amend.tool].args_model.model_fields
            assert {name for name, _ in (*amend.set, *amend.extend)} <= set(fields)
        for action in attack.actions:
            assert action.tool in tools, (attack.kind, action.tool)
            model = tools[action.tool].args_model
            # a `${i.path}` reference is resolved at run time: only its name is checked here
            refs = {name for name, value in action.arguments.items() if _is_ref(value)}
            assert refs <= set(model.model_fields), (attack.kind, action.tool, refs)
            try:
                model.model_validate(action.arguments)
            except ValidationError as exc:
                bad = [e for e in exc.errors() if e["loc"][0] not in refs]
                assert not bad, (attack.kind, action.tool, bad)


@pytest.mark.parametrize(
    "kind", ["homoglyph_email", "extra_text_recipient", "contact_email_swap_then_send"]
)
def test_without_the_guard_the_attack_writes(kind: str) -> None:
    attack = next(a for a in NOVEL_ATTACKS if a.kind == kind)
    injections = build_suite(kinds_per_site=1, attacks=[attack])
    assert injections, kind
    result = run_injection(injections[0], guard=False)
    assert result.obeyed >= 1
    assert result.unrequested_writes >= 1, (kind, result.writes)
