"""`qpa.harness.argcheck`: its fast yes never accepts arguments jsonschema refuses.

Checked on every sandbox tool's real argument schema with arguments drawn by hypothesis (the
reference plans' own arguments, mutated: wrong types, missing and extra fields, bools for
numbers, floats for integers, non-ASCII text), against `jsonschema`'s Draft 2020-12 verdict.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from qpa.contract import ToolCall
from qpa.envs.sandbox.registry import all_tools
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.argcheck import compile_schema

SPECS = {name: bound.spec for name, bound in all_tools().items()}
SUITE = generate_suite()
PLAN_CALLS = [
    step
    for task in SUITE[:: max(1, len(SUITE) // 300)]
    for step in (task.reference_plan or [])
    if isinstance(step, ToolCall) and step.tool in SPECS
]

values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(["", "é", "😀x", "a" * 300, "2026-01-02"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


def test_most_tool_schemas_take_the_fast_path_and_plan_arguments_pass_it() -> None:
    compiled = {name: compile_schema(spec.parameters) for name, spec in SPECS.items()}
    assert sum(c is not None for c in compiled.values()) >= 0.9 * len(compiled)
    assert PLAN_CALLS
    fast = [c for c in PLAN_CALLS if (check := compiled[c.tool]) is not None and check(c.arguments)]
    assert len(fast) >= 0.9 * len(PLAN_CALLS)


@settings(max_examples=400, deadline=None)
@given(
    call=st.sampled_from(PLAN_CALLS),
    key=st.text(max_size=12),
    value=values,
    drop=st.booleans(),
)
def test_the_fast_yes_agrees_with_jsonschema(
    call: ToolCall, key: str, value: Any, drop: bool
) -> None:
    schema = SPECS[call.tool].parameters
    check = compile_schema(schema)
    if check is None:
        return
    arguments = dict(call.arguments)
    names = list(schema.get("properties", {}))
    target = names[len(key) % len(names)] if names and len(key) % 2 else key
    if drop and target in arguments:
        del arguments[target]
    else:
        arguments[target] = value
    if check(arguments):
        errors = list(Draft202012Validator(schema).iter_errors(arguments))
        assert not errors, (call.tool, arguments, errors[0].message)


@pytest.mark.parametrize(
    ("schema", "instance", "fast"),
    [
        ({"type": "integer"}, 3.0, True),
        ({"type": "integer"}, True, False),
        ({"type": "number"}, False, False),
        ({"type": "string", "maxLength": 2}, "ab", True),
        ({"type": "string", "maxLength": 2}, "abc", False),
        ({"enum": ["a", "b"]}, "c", False),
        ({"type": "integer", "enum": [5, 10]}, 10, True),  # clock_create_alarm's snooze_min
        ({"type": "integer", "enum": [5, 10]}, 7, False),
        ({"type": "integer", "enum": [5, 10]}, 10.0, False),  # 10.0 == 10: jsonschema's call
        ({"enum": [1, "a"]}, True, False),  # True is not 1 to jsonschema: never a fast yes
        ({"enum": [1, "a"]}, "a", True),
        ({"enum": [1.5]}, 1.5, None),  # float options: jsonschema's
        ({"type": "object", "required": ["x"]}, {}, False),
        ({"type": "object", "additionalProperties": False}, {"y": 1}, False),
        ({"type": "array", "items": {"type": "string"}}, ["a", 1], False),
        ({"type": "string", "pattern": "^a$"}, "ab", False),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, None, True),
        ({"type": "string", "format": "date"}, "not a date", True),  # formats not asserted
        ({"type": "object", "$ref": "#/$defs/x"}, {}, None),  # unknown keyword: jsonschema's
    ],
)
def test_the_fast_path_on_single_keywords(schema: Any, instance: Any, fast: bool | None) -> None:
    check = compile_schema(schema)
    if fast is None:
        assert check is None
        return
    assert check is not None and check(instance) is fast
    if fast:
        assert Draft202012Validator(schema).is_valid(instance)


def test_the_adapters_token_count_is_the_estimate_of_its_text() -> None:
    """The adapter adds up its parts' counts instead of re-counting the whole text: exact."""
    from qpa.harness.adapter import ScenarioAdapter, estimate_tokens
    from qpa.harness.skills import SkillLibrary

    adapter = ScenarioAdapter(SkillLibrary.from_registry(), token_budget=900)
    tools = [bound.spec for bound in all_tools().values()]
    for task in SUITE[:: max(1, len(SUITE) // 40)]:
        offered = [t for t in tools if t.name in set(task.tools)] or tools[:40]
        exposure = adapter.select(task.instruction, offered)
        assert exposure.tokens == estimate_tokens(exposure.text), task.id
