"""AgentDojo itself, as qpa reaches it: the pinned version, its suites, attacks and judges.

Everything qpa knows of AgentDojo comes through this module, from the installed package
(`agentdojo==0.1.35`, benchmark version `v1.2.2`; the `benchmarks` extra): the suites'
tools, user tasks and injection tasks, the default environment with an attack's injections in
their vectors, and the judges (`utility()` / `security()`, through the suite's own dispatch
that prefers the `*_from_traces` variants). Nothing here re-implements a judge or an attack.

Attacks address the victim model by name: they are built with a pipeline whose `name` is
`target_model` (AgentDojo's `MODEL_NAMES` key; `local` addresses "Local model"). Only attacks
that pair a user task with an injection task are offered: the denial-of-service attacks judge
something else, and `manual` asks a person at a terminal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import yaml

from qpa.contract import ArgRole, SideEffect
from qpa.envs.effects import check_effect_table, check_role_table

VERSION = "0.1.35"
BENCHMARK_VERSION = "v1.2.2"
SUITES: tuple[str, ...] = ("workspace", "travel", "banking", "slack")
ATTACKS: tuple[str, ...] = (
    "important_instructions",
    "important_instructions_no_model_name",
    "important_instructions_no_names",
    "important_instructions_no_user_name",
    "important_instructions_wrong_model_name",
    "important_instructions_wrong_user_name",
    "tool_knowledge",
    "ignore_previous",
    "direct",
    "system_message",
    "injecagent",
)
DEFAULT_TARGET_MODEL = "local"


class AgentDojoUnavailable(RuntimeError):
    """The `agentdojo` package is not installed (`pip install 'qpa[benchmarks]'`)."""


def _agentdojo() -> Any:
    try:
        import agentdojo
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise AgentDojoUnavailable(
            "environment kind agentdojo needs the agentdojo package: pip install 'qpa[benchmarks]'"
        ) from exc
    return agentdojo


@functools.cache
def suite(name: str) -> Any:
    """AgentDojo's `TaskSuite` called `name` at the pinned benchmark version."""
    _agentdojo()
    from agentdojo.task_suite.load_suites import get_suites

    suites = get_suites(BENCHMARK_VERSION)
    if name not in suites:
        raise KeyError(f"unknown AgentDojo suite {name!r} (one of: {', '.join(SUITES)})")
    return suites[name]


@functools.cache
def effects() -> dict[str, dict[str, SideEffect]]:
    """The reviewed side-effect table (`effects.yaml`), checked against every suite's tools."""
    from importlib.resources import files

    text = files("qpa.envs.agentdojo").joinpath("effects.yaml").read_text()
    tools = {name: {tool.name for tool in suite(name).tools} for name in SUITES}
    table = check_effect_table(yaml.safe_load(text) or {}, tools, group="suite", member="tools")
    return {name: dict(table[name]) for name in SUITES}


@functools.cache
def roles() -> dict[str, dict[str, dict[str, ArgRole]]]:
    """The reviewed argument roles (`roles.yaml`), checked against every suite's tools: every
    state-changing tool declared, only its own arguments. A tool not in the table (a read) has
    no sink arguments: `{}`."""
    from importlib.resources import files

    text = files("qpa.envs.agentdojo").joinpath("roles.yaml").read_text()
    parameters = {
        name: {
            tool.name: set(tool.parameters.model_json_schema().get("properties") or {})
            for tool in suite(name).tools
        }
        for name in SUITES
    }
    table = check_role_table(yaml.safe_load(text) or {}, parameters, effects(), group="suite")
    return {
        name: {tool: dict(table[name].get(tool, {})) for tool in parameters[name]}
        for name in SUITES
    }


@functools.cache
def collections() -> dict[str, dict[str, Any]]:
    """The reviewed record collections (`collections.yaml`): per suite, `records` (tool ->
    the collection its result holds), `arguments` (tool -> argument -> collection) and
    `secrets` (tool -> its result's secret fields), every tool and argument checked against
    the suite's own."""
    from importlib.resources import files

    table = yaml.safe_load(files("qpa.envs.agentdojo").joinpath("collections.yaml").read_text())
    out: dict[str, dict[str, Any]] = {}
    for name in SUITES:
        declared = (table or {}).get(name) or {}
        unknown_keys = set(declared) - {"records", "arguments", "secrets"}
        if unknown_keys:
            raise ValueError(f"collections.yaml: suite {name}: unknown keys {sorted(unknown_keys)}")
        tools = {t.name: t for t in suite(name).tools}
        records = dict(declared.get("records") or {})
        arguments = {t: dict(a or {}) for t, a in (declared.get("arguments") or {}).items()}
        secrets = {t: list(f or []) for t, f in (declared.get("secrets") or {}).items()}
        stale = (set(records) | set(arguments) | set(secrets)) - set(tools)
        if stale:
            raise ValueError(f"collections.yaml: suite {name}: unknown tools {sorted(stale)}")
        for tool, args in arguments.items():
            params = set(tools[tool].parameters.model_json_schema().get("properties") or {})
            if set(args) - params:
                raise ValueError(
                    f"collections.yaml: suite {name}.{tool}: unknown arguments "
                    f"{sorted(set(args) - params)}"
                )
        out[name] = {"records": records, "arguments": arguments, "secrets": secrets}
    stale_suites = set(table or {}) - set(SUITES)
    if stale_suites:
        raise ValueError(f"collections.yaml: unknown suite names {sorted(stale_suites)}")
    return out


def _target_pipeline(target_model: str) -> Any:
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement

    class _Target(BasePipelineElement):
        """Stands for the attacked model: attacks read only its `name` (no query is made)."""

        def query(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("qpa drives the episode; the attack's target is never queried")

    target = _Target()
    target.name = target_model
    return target


@functools.cache
def attack(suite_name: str, attack_name: str, target_model: str = DEFAULT_TARGET_MODEL) -> Any:
    """AgentDojo's attack `attack_name` against `suite_name` (cached: it memoises its own
    injection candidates, which it finds by running the user task's ground truth)."""
    if attack_name not in ATTACKS:
        raise KeyError(f"unknown AgentDojo attack {attack_name!r} (one of: {', '.join(ATTACKS)})")
    from agentdojo.attacks.attack_registry import load_attack

    return load_attack(attack_name, suite(suite_name), _target_pipeline(target_model))


@functools.cache
def injections(
    suite_name: str,
    user_task: str,
    injection_task: str,
    attack_name: str,
    target_model: str = DEFAULT_TARGET_MODEL,
) -> dict[str, str]:
    """The texts the attack plants (injection vector -> text) for one pair."""
    s = suite(suite_name)
    made: dict[str, str] = attack(suite_name, attack_name, target_model).attack(
        s.user_tasks[user_task], s.injection_tasks[injection_task]
    )
    return dict(made)


@functools.lru_cache(maxsize=64)
def _environment(suite_name: str, planted: tuple[tuple[str, str], ...]) -> Any:
    return suite(suite_name).load_and_inject_default_environment(dict(planted))


def environment(suite_name: str, planted: dict[str, str]) -> Any:
    """A fresh copy of the suite's default environment with `planted` in its vectors (parsed
    once per distinct injection set: AgentDojo formats and parses its YAML on every load)."""
    base = _environment(suite_name, tuple(sorted(planted.items())))
    return base.model_copy(deep=True)


def function_calls(calls: Sequence[tuple[str, dict[str, Any]]]) -> list[Any]:
    """AgentDojo `FunctionCall`s, the form its trace-based judges read."""
    from agentdojo.functions_runtime import FunctionCall

    return [FunctionCall(function=name, args=dict(args)) for name, args in calls]


def judge(
    suite_name: str,
    task: Any,
    answer: str,
    pre_environment: Any,
    post_environment: Any,
    calls: Sequence[tuple[str, dict[str, Any]]],
) -> bool:
    """The suite's own verdict on `task` (a user task: utility; an injection task: whether the
    attacker's goal was reached). `TaskSuite._check_task_result` is private in 0.1.35, pinned
    above; tests/integration/test_agentdojo_env.py runs it on every suite."""
    from agentdojo.types import text_content_block_from_string

    verdict: bool = suite(suite_name)._check_task_result(
        task,
        [text_content_block_from_string(answer)],
        pre_environment,
        post_environment,
        function_calls(calls),
    )
    return bool(verdict)
