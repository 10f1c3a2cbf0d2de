"""The release gate: a pure decision that lists every reason and fails closed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qpa.bench.gate import (
    GateCheck,
    GateSpec,
    GateSpecError,
    ReportError,
    evaluate_gate,
    evaluate_gate_files,
    load_gate_spec,
    load_report,
)
from qpa.bench.scoring import GroupScore, Report, score
from qpa.contract import Policy, Task, Totals, Trajectory, Verification

CAPS = ("tool_use", "memory", "skills", "subagent")


def make_report(successes: dict[str, int], per_cap: int = 10, tokens: int = 100) -> Report:
    """A report with `per_cap` tasks per capability, `successes[cap]` of them successful."""
    trajectories = []
    for cap in CAPS:
        for i in range(per_cap):
            task = Task(
                id=f"{cap}.{i}", split="test", domain="d", capabilities=[cap], instruction="x"
            )
            ok = i < successes.get(cap, per_cap)
            trajectories.append(
                Trajectory(
                    id=f"{task.id}#0",
                    task=task,
                    policy=Policy(planner="openai", model="m"),
                    verification=Verification(done=True, success=ok, progress=float(ok)),
                    totals=Totals(completion_tokens=tokens, prompt_tokens=tokens),
                )
            )
    return score(trajectories)


BASE = make_report({c: 8 for c in CAPS})


def names(result_checks: list[GateCheck]) -> dict[str, bool]:
    return {c.name: c.passed for c in result_checks}


def test_a_candidate_as_good_as_the_baseline_passes_with_all_checks_listed() -> None:
    result = evaluate_gate(make_report({c: 8 for c in CAPS}), BASE, GateSpec())
    assert result.passed and result.reasons == []
    assert set(names(result.checks)) == {
        "candidate_present",
        "candidate_complete",
        "min_samples",
        "min_tasks",
        "min_overall",
        "candidate_environment_errors",
        "baseline_complete",
        "baseline_environment_errors",
        "same_suite",
        *(f"capability_regression:{c}" for c in CAPS),
        "cost_increase",
    }


def test_every_failure_is_a_reason() -> None:
    candidate = make_report({"tool_use": 3, "memory": 8, "skills": 7, "subagent": 2}, tokens=150)
    spec = GateSpec(min_overall=0.6, max_capability_regression=0.1, max_cost_increase=0.2)
    result = evaluate_gate(candidate, BASE, spec)
    assert not result.passed
    failed = {n for n, ok in names(result.checks).items() if not ok}
    assert failed == {
        "min_overall",
        "capability_regression:tool_use",
        "capability_regression:subagent",
        "cost_increase",
    }
    assert len(result.reasons) == 4
    assert any("tool_use" in r and "-50.0 points" in r for r in result.reasons)
    assert any("+50.0%" in r for r in result.reasons)  # cost 150 vs 100 tokens


def test_thresholds_are_inclusive() -> None:
    candidate = make_report({"tool_use": 7, "memory": 8, "skills": 8, "subagent": 8}, tokens=110)
    spec = GateSpec(min_overall=0.775, max_capability_regression=0.1, max_cost_increase=0.1)
    assert evaluate_gate(candidate, BASE, spec).passed


def test_first_release_is_judged_on_absolute_thresholds_only() -> None:
    weak = make_report({c: 1 for c in CAPS})
    result = evaluate_gate(weak, None, GateSpec(min_overall=0.05))
    assert result.passed
    assert not any(n.startswith(("capability", "cost", "baseline")) for n in names(result.checks))
    assert "candidate_environment_errors" in names(result.checks)
    assert not evaluate_gate(weak, None, GateSpec(min_overall=0.5)).passed


def test_missing_or_partial_reports_fail_closed() -> None:
    assert not evaluate_gate(None, BASE).passed
    assert evaluate_gate(None, BASE).reasons == ["no candidate report"]
    partial = BASE.model_copy(update={"complete": False, "missing_episodes": 3})
    result = evaluate_gate(partial, BASE)
    assert not result.passed and "partial: 3 episodes missing" in result.reasons[0]
    result = evaluate_gate(BASE, partial)
    assert not result.passed and any("baseline report is partial" in r for r in result.reasons)
    relaxed = GateSpec(require_complete=False)
    assert evaluate_gate(partial, partial, relaxed).passed


def test_samples_tasks_suite_and_missing_capability() -> None:
    spec = GateSpec(min_samples=3, min_tasks=100)
    result = evaluate_gate(BASE, None, spec)
    assert {n for n, ok in names(result.checks).items() if not ok} == {"min_samples", "min_tasks"}
    other_split = BASE.model_copy(update={"split": "validation"})
    assert "same_suite" in {c.name for c in evaluate_gate(other_split, BASE).checks if not c.passed}
    no_memory = BASE.model_copy(
        update={"by_capability": {k: v for k, v in BASE.by_capability.items() if k != "memory"}}
    )
    result = evaluate_gate(no_memory, BASE)
    assert result.reasons == ["memory: scored in the baseline but missing from the candidate"]


def test_cost_rules() -> None:
    free = BASE.model_copy(update={"cost_per_1k_tasks": 0.0})
    assert evaluate_gate(free, free).passed  # 0 -> 0
    assert not evaluate_gate(BASE, free).passed  # 0 -> something: unbounded increase
    assert evaluate_gate(BASE, free, GateSpec(max_cost_increase=None)).passed  # not checked
    euros = BASE.model_copy(update={"currency": "EUR"})
    assert not evaluate_gate(euros, BASE).passed
    cheaper = BASE.model_copy(update={"cost_per_1k_tasks": BASE.cost_per_1k_tasks / 2})
    assert evaluate_gate(cheaper, BASE).passed


def test_gate_is_pure() -> None:
    before = BASE.model_dump_json()
    first = evaluate_gate(BASE, BASE)
    assert evaluate_gate(BASE, BASE) == first and BASE.model_dump_json() == before


# --------------------------------------------------------------------------- files


def test_load_report_and_files(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "report.json").write_text(BASE.model_dump_json(), encoding="utf-8")
    assert load_report(folder) == BASE
    assert evaluate_gate_files(folder, folder).passed
    assert evaluate_gate_files(folder, None).passed
    missing = evaluate_gate_files(tmp_path / "nope.json", folder)
    assert not missing.passed and "missing" in missing.reasons[0]
    broken = tmp_path / "broken.json"
    broken.write_text(BASE.model_dump_json()[:200], encoding="utf-8")
    result = evaluate_gate_files(folder, broken)
    assert not result.passed and "corrupt JSON" in result.reasons[0]
    assert "min_overall" in names(result.checks)  # the candidate is still judged
    assert not evaluate_gate_files(None, folder).passed


def mutate(path: Path, change: dict[str, Any], drop: tuple[str, ...] = ()) -> Path:
    data = json.loads(BASE.model_dump_json())
    data.update(change)
    for key in drop:
        data.pop(key)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("change", "drop", "field"),
    [
        ({}, ("overall",), "overall"),
        ({"overall": 1.5}, (), "overall"),
        ({"schema_version": 2}, (), "schema_version"),
        (
            {
                "by_capability": {
                    "telepathy": GroupScore(
                        success=1, mean_progress=1, tasks=1, episodes=1
                    ).model_dump()
                }
            },
            (),
            "by_capability.telepathy",
        ),
        ({"samples": 0}, (), "samples"),
        ({"policy": {"planner": "x", "colour": "red"}}, (), "policy.colour"),
        ({"complete": "perhaps"}, (), "complete"),
        ({"pass_at_k": {"3": 0.5}}, (), "pass_at_k"),
        ({"ci": {"overall": {"low": 0.9, "high": 0.1}}}, (), "ci.overall"),
        ({"created_at": "yesterday"}, (), "created_at"),
    ],
)
def test_malformed_reports_name_the_field(
    tmp_path: Path, change: dict[str, Any], drop: tuple[str, ...], field: str
) -> None:
    path = mutate(tmp_path / "report.json", change, drop)
    with pytest.raises(ReportError, match=field.replace(".", r"\.")) as caught:
        load_report(path)
    assert str(path) in str(caught.value)


def test_gate_spec_files(tmp_path: Path) -> None:
    assert load_gate_spec(None) == GateSpec()
    spec = tmp_path / "gate.yaml"
    spec.write_text("", encoding="utf-8")
    assert load_gate_spec(spec) == GateSpec()
    spec.write_text("min_overall: 0.7\nmax_cost_increase: null\n", encoding="utf-8")
    assert load_gate_spec(spec) == GateSpec(min_overall=0.7, max_cost_increase=None)
    for text, field in [
        ("min_overal: 0.7\n", "min_overal"),
        ("min_overall: 1.5\n", "min_overall"),
        ("max_capability_regression: -0.1\n", "max_capability_regression"),
        ("min_samples: 0\n", "min_samples"),
        ("min_tasks: many\n", "min_tasks"),
        ("require_complete: perhaps\n", "require_complete"),
        ("- 1\n- 2\n", "mapping"),
        ("min_overall: [\n", "not YAML"),
    ]:
        spec.write_text(text, encoding="utf-8")
        with pytest.raises(GateSpecError, match=field):
            load_gate_spec(spec)


def test_runs_ended_by_infrastructure_fail() -> None:
    broken = BASE.model_copy(update={"errors": 4, "errors_by_side": {"environment": 4}})
    result = evaluate_gate(broken, BASE)  # 4 of 40 episodes = 10% > 5%
    assert result.reasons == [
        "candidate: 4 of 40 episodes ended by an environment-side error (10.0%; at most 5.0% "
        "allowed: rerun with `qpa bench run --retry-errors`)"
    ]
    assert not evaluate_gate(BASE, broken).passed  # a broken baseline is no reference either
    assert evaluate_gate(broken, BASE, GateSpec(max_environment_error_rate=None)).passed
    harness = BASE.model_copy(update={"errors": 4, "errors_by_side": {"harness": 4}})
    assert evaluate_gate(harness, BASE).passed  # budgets cut by the Harness are the policy's
