"""AgentDojo (a public prompt-injection benchmark) as environment kind `agentdojo`."""

from qpa.envs.agentdojo.benchmark import ATTACKS, BENCHMARK_VERSION, SUITES, VERSION
from qpa.envs.agentdojo.env import AgentDojoEnv
from qpa.envs.agentdojo.tasks import (
    NO_INJECTION_PLAN,
    agentdojo_tasks,
    injected_texts,
    injection_plan,
    parse_suite,
    split_of,
    suite_names,
)

__all__ = [
    "ATTACKS",
    "BENCHMARK_VERSION",
    "NO_INJECTION_PLAN",
    "SUITES",
    "VERSION",
    "AgentDojoEnv",
    "agentdojo_tasks",
    "injected_texts",
    "injection_plan",
    "parse_suite",
    "split_of",
    "suite_names",
]
