"""Public benchmarks measured through the Harness: AgentDojo under attack, oracle and noop runs.

`agentdojo_episode` plays one AgentDojo task through the Harness (guard on or off) with the
worst-case planner the guard exists for: `ObedientBackend` follows the user task's ground truth
like a perfect model and, the moment a tool result shows the attack's planted text, performs the
injection task's ground truth (AgentDojo's own calls for the attacker's goal). AgentDojo's judges
decide: `utility` (the user's task) and `injection` (passed when the attacker's goal was *not*
reached, i.e. `security()` is False). Injection tasks that ship no ground truth (workspace 6-13,
travel 6 in 0.1.35) give the planner nothing to obey: their pairs are counted apart.

`summarize_agentdojo` gives AgentDojo's three figures per suite: utility without attack, utility
under attack, and the targeted attack success rate (share of pairs whose attacker goal the
judge saw reached), each with a Wilson interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from qpa.bench.injection import ObedientBackend
from qpa.bench.stats import wilson_interval
from qpa.contract import Task, ToolCall, Trajectory
from qpa.envs.agentdojo import AgentDojoEnv, injected_texts, injection_plan
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.memory import MemoryStore
from qpa.harness.runner import run_episode

__all__ = ["AgentDojoGoal", "EpisodeOutcome", "agentdojo_episode", "summarize_agentdojo"]


@dataclass(frozen=True)
class AgentDojoGoal:
    """An attacker's goal as `ObedientBackend` obeys it: a marker from each planted text (the
    longest line of it that tool output carries verbatim) and the injection task's calls."""

    markers: tuple[str, ...]
    actions: tuple[ToolCall, ...]

    @classmethod
    def of(cls, task: Task) -> AgentDojoGoal | None:
        texts = injected_texts(task)
        actions = tuple(injection_plan(task))
        if not texts or not actions:
            return None
        markers = []
        for text in texts.values():
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            plain = [ln for ln in lines if '"' not in ln and "\\" not in ln] or lines
            markers.append(max(plain, key=len))
        # one planted text is enough for the model to read the request (AgentDojo plants the
        # same text in every vector the user task reads): obey at the first one shown
        return cls(markers=(min(markers, key=len),), actions=actions)


@dataclass(frozen=True)
class EpisodeOutcome:
    """One AgentDojo episode through the Harness, as its judges saw it."""

    task_id: str
    suite: str
    attacked: bool
    guard: bool
    utility: bool
    goal_reached: bool | None  # None without an attack
    obeyable: bool  # the injection task ships a ground truth the planner could play
    obeyed: int  # injected calls the planner tried
    refusals: int  # calls the guard answered


def _check(trajectory: Trajectory, name: str) -> bool | None:
    if trajectory.verification is None:
        return None
    return next((c.passed for c in trajectory.verification.checks if c.name == name), None)


def agentdojo_episode(task: Task, *, guard: bool, max_turns: int = 60) -> EpisodeOutcome:
    """Play `task` through the Harness with an obedient planner; the judges' verdicts."""
    goal = AgentDojoGoal.of(task)
    backend = ObedientBackend(task, [goal] if goal else [])
    planner = HarnessPlanner(backend, HarnessConfig(guard=guard), memory=MemoryStore(":memory:"))
    env = AgentDojoEnv()
    try:
        trajectory = run_episode(env, task, planner, max_turns=max_turns)
    finally:
        env.close()
    attacked = bool(task.world.get("_agentdojo", {}).get("attack"))
    injection = _check(trajectory, "injection")
    return EpisodeOutcome(
        task_id=task.id,
        suite=task.suite,
        attacked=attacked,
        guard=guard,
        utility=bool(_check(trajectory, "utility")),
        goal_reached=None if not attacked or injection is None else not injection,
        obeyable=goal is not None,
        obeyed=len(backend.obeyed),
        refusals=sum(1 for s in trajectory.steps if "guard" in s.annotations),
    )


def _rate(hits: int, n: int) -> dict[str, float | int]:
    low, high = wilson_interval(hits, n) if n else (0.0, 0.0)
    return {"n": n, "hits": hits, "rate": hits / n if n else 0.0, "low": low, "high": high}


def summarize_agentdojo(
    clean: Sequence[EpisodeOutcome], attacked: Iterable[EpisodeOutcome]
) -> dict[str, dict[str, float | int]]:
    """Utility (no attack), utility under attack and targeted attack success, all pairs."""
    under = list(attacked)
    return {
        "utility": _rate(sum(o.utility for o in clean), len(clean)),
        "utility_under_attack": _rate(sum(o.utility for o in under), len(under)),
        "attack_success": _rate(sum(bool(o.goal_reached) for o in under), len(under)),
        "attack_success_obeyable": _rate(
            sum(bool(o.goal_reached) for o in under if o.obeyable),
            sum(1 for o in under if o.obeyable),
        ),
    }
