"""Benchmark reports and judged releases for release tests.

`make_report({"tool_use": 8, ...}, per_capability=10)` scores (with `qpa.bench`) one episode
per task, `per_capability` tasks per capability of which the given number succeed (all, for a
capability left out). `judged_release(passed=...)` is a HarnessRelease whose status the
operator's own state machine wrote.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from qpa_operator.builders import harnessrelease as builder

from qpa.api import HarnessRelease
from qpa.bench.scoring import Report, score
from qpa.contract import Policy, Task, Totals, Trajectory, Verification

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

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


def judged_release(
    *,
    passed: bool = True,
    promotion: str = "auto",
    harness: str = "harness-v4",
    model: str = "s3://qpa/models/b/",
    name: str = "planner",
) -> dict[str, Any]:
    """A HarnessRelease as the operator leaves it after judging its first candidate.

    Runs the operator's own (pure) state machine: deployed, Ready, benchmarked, then the gate's
    verdict; `passed=False` ends RolledBack with the gate's reasons.
    """
    from qpa_operator import release
    from qpa_operator.builders import Defaults

    from qpa.api.v1alpha1 import Scores
    from qpa.release.verdict import Verdict

    body = yaml.safe_load((EXAMPLES / "harnessrelease.yaml").read_text())
    body["metadata"].update(name=name, namespace="staging", uid="uid-1", generation=1)
    body["spec"]["harness"]["version"] = harness
    body["spec"]["model"]["uri"] = model
    body["spec"]["promotion"] = promotion
    ready = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
    complete = {"conditions": [{"type": "Complete", "status": "True"}]}
    scores = Scores(overall=0.85, by_capability={"memory": 0.9, "tool_use": 0.8}, tasks=40,
                    samples=1)  # fmt: skip
    verdict = Verdict(
        passed=passed,
        kind="passed" if passed else "gate_failed",
        reasons=[] if passed else ["tool_use: 60.00% vs baseline 80.00% (-20.0 points; beyond)"],
        report_uri=f"s3://qpa/releases/{name}/abc/report.json",
        scores=scores,
        deltas={"overall": 0.05, "memory": 0.1, "tool_use": 0.0},
    )
    observed: list[dict[str, Any]] = [
        {},
        {"model": ready, "harness": ready},
        {"model": ready, "harness": ready, "bench": complete, "verdict": verdict},
    ]
    for seen in observed:
        hr = HarnessRelease.model_validate(body)
        children = release.children(hr, hr.status, Defaults()) if hr.status else None
        live = {m["kind"] + m["metadata"]["name"]: m for m in (children.apply if children else ())}
        model_isvc = live.get("InferenceService" + builder.model_name(hr))
        harness_isvc = live.get("InferenceService" + builder.harness_name(hr))
        state = release.Observed(
            now=datetime(2026, 1, 1, tzinfo=UTC),
            model={**model_isvc, "status": seen["model"]}
            if model_isvc and "model" in seen
            else None,
            harness={**harness_isvc, "status": seen["harness"]}
            if harness_isvc and "harness" in seen
            else None,
            bench={"status": seen["bench"]} if "bench" in seen else None,
            verdict=seen.get("verdict"),
        )
        body["status"] = release.next_step(hr, state, Defaults()).status.to_k8s()
    return body
