"""The contract's own environment test-suite: what every environment kind must do, whoever
wrote its world (qpa's sandbox, an MCP server, AgentDojo, BFCL).

`check_environment(make, task)` drives one fresh environment through the protocol and asserts
each rule by name, so a kind that breaks one fails with the rule in the message:

- it is an `Environment` of its declared kind; `verify` before `reset` answers, never raises;
- `reset` answers ok, and twice in a row gives the same tools and the same first observation;
- `tools()` are `ToolSpec`s with unique names, valid JSON Schemas and a known side effect;
- the task's reference plan, played action by action, is judged a success and done;
- after a fresh `reset`, finishing at once is judged a failure (the state was reset);
- an unknown tool and arguments that break a tool's schema come back as error feedback
  (`unknown_tool`, `invalid_arguments`), never as exceptions;
- after the episode is done, a further action is an error;
- a task whose world is broken for the kind is refused at `reset` as error feedback;
- `close()` may be called twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from qpa.contract import Environment, Finish, Task, ToolCall, ToolSpec
from qpa.harness.planners import resolve_refs

EFFECTS = {"read", "write", "payment", "egress"}


def _wrong_type(spec: ToolSpec) -> dict[str, Any] | None:
    """Arguments that break `spec`'s schema: a required string or array given a dict."""
    props = spec.parameters.get("properties", {})
    for name in spec.parameters.get("required", []):
        kind = props.get(name, {}).get("type")
        if kind in ("string", "array", "integer", "number", "boolean"):
            return {name: {"not": "this"}}
    return None


def check_environment(
    make: Callable[[], Environment], task: Task, broken_world: dict[str, Any], kind: str
) -> None:
    env = make()
    try:
        assert isinstance(env, Environment), "rule: it implements the Environment protocol"
        assert env.kind == kind, f"rule: its kind is {kind}, not {env.kind}"
        early = env.verify()
        assert not early.success, "rule: verify before reset is no success"

        first = env.reset(task)
        assert first.status == "ok", f"rule: reset answers ok ({first.message})"
        tools = env.tools()
        assert tools, "rule: an episode offers tools"
        names = [t.name for t in tools]
        assert len(names) == len(set(names)), "rule: tool names are unique"
        for spec in tools:
            assert isinstance(spec, ToolSpec)
            Draft202012Validator.check_schema(spec.parameters)
            assert spec.parameters.get("type") == "object", f"rule: {spec.name} takes an object"
            assert spec.side_effect in EFFECTS, f"rule: {spec.name} has a known side effect"
        again = env.reset(task)
        assert again.observation == first.observation, "rule: reset is deterministic"
        assert [t.model_dump() for t in env.tools()] == [t.model_dump() for t in tools]

        results: list[Any] = []  # a plan's `${i.path}` reads step i's observation
        for action in task.reference_plan or []:
            if isinstance(action, ToolCall):
                action = action.model_copy(
                    update={"arguments": resolve_refs(action.arguments, results)}
                )
            results.append(env.step(action).observation)
        verdict = env.verify()
        assert verdict.success and verdict.done, f"rule: the reference plan succeeds ({verdict})"
        assert 0.0 <= verdict.progress <= 1.0
        late = env.step(ToolCall(tool=names[0], arguments={}))
        assert late.status == "error", "rule: no action after the episode is done"

        assert env.reset(task).status == "ok"
        unknown = env.step(ToolCall(tool="no_such_tool_anywhere", arguments={}))
        assert (unknown.status, unknown.error) == ("error", "unknown_tool"), unknown
        for spec in tools:
            bad = _wrong_type(spec)
            if bad is not None:
                refused = env.step(ToolCall(tool=spec.name, arguments=bad))
                assert (refused.status, refused.error) == ("error", "invalid_arguments"), (
                    spec.name,
                    refused,
                )
                assert next(iter(bad)) in refused.message, "rule: the error names the argument"
                break
        feedback = env.step(Finish())
        assert feedback.status == "ok"
        assert not env.verify().success, "rule: finishing at once after reset fails"

        broken = env.reset(task.model_copy(update={"world": broken_world}))
        assert broken.status == "error", f"rule: a broken world is refused ({broken})"
        assert broken.message, "rule: the refusal says why"
    finally:
        env.close()
        env.close()
