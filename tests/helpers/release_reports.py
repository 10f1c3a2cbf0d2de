"""Benchmark reports for release tests: real `report.json` content, scored by `qpa.bench`.

`make_report({"tool_use": 8, ...}, per_capability=10)` scores one episode per task, `per_capability`
tasks per capability of which the given number succeed (all, for a capability left out).
"""

from __future__ import annotations

from qpa.bench.scoring import Report, score
from qpa.contract import Policy, Task, Totals, Trajectory, Verification

CAPABILITIES = ("tool_use", "memory", "skills", "subagent")


def make_report(successes: dict[str, int], per_capability: int = 10) -> Report:
    trajectories = []
    for capability in CAPABILITIES:
        for i in range(per_capability):
            task = Task(
                id=f"{capability}.{i}",
                split="test",
                domain="d",
                capabilities=[capability],
                instruction="x",
            )
            ok = i < successes.get(capability, per_capability)
            trajectories.append(
                Trajectory(
                    id=f"{task.id}#0",
                    task=task,
                    policy=Policy(planner="openai", model="planner"),
                    verification=Verification(done=True, success=ok, progress=float(ok)),
                    totals=Totals(completion_tokens=100, prompt_tokens=100),
                )
            )
    return score(trajectories)


def report_bytes(successes: dict[str, int], per_capability: int = 10) -> bytes:
    return make_report(successes, per_capability).model_dump_json(indent=1).encode()
