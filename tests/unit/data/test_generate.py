"""Task construction: coverage-driven, report-steered, executable, never the test split."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from fakes.openai_server import ChatRequest, FakeOpenAI
from typer.testing import CliRunner

import qpa.cli.data_stages  # noqa: F401  (registers the stages on `qpa data`)
from qpa.bench.scoring import score
from qpa.cli import app
from qpa.contract import Policy, Task, read_tasks
from qpa.data.generate import (
    CellTarget,
    CoverageTarget,
    LLMRewriter,
    Weakness,
    executable,
    generate_tasks,
    load_coverage_target,
    parse_variants,
    plan_generation,
    plan_per_template,
    required_literals,
    variant_problems,
    write_generated,
)
from qpa.data.review import DataError, load_queue, open_batch
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import all_templates, generate_suite
from qpa.harness.backends.openai import OpenAIBackend
from qpa.harness.planners import NoopPlanner, OraclePlanner
from qpa.harness.runner import run_episode
from qpa.store.manifest import read_manifest

SUITE = generate_suite()
HELD_OUT_IDS = {t.id for t in SUITE if t.split != "train"}
TEST_INSTRUCTIONS = {t.instruction for t in SUITE if t.split == "test"}
runner = CliRunner()


def test_generated_tasks_are_fresh_executable_train_tasks() -> None:
    plan = plan_generation(CoverageTarget(), count=30)
    result = generate_tasks(plan, seed=5)
    assert len(result.tasks) == 30 and not result.dropped
    for task in result.tasks:
        assert task.split == "train" and task.source == "generated"
        assert task.id not in HELD_OUT_IDS and task.id.endswith(".s5")
        assert task.instruction not in TEST_INSTRUCTIONS
        assert task.lineage["generator"] == "qpa.data.generate" and task.lineage["reason"]
    for task in result.tasks[::6]:
        assert run_episode(SandboxEnv(), task, OraclePlanner()).success
        assert not run_episode(SandboxEnv(), task, NoopPlanner()).success
    again = generate_tasks(plan, seed=5)
    assert [t.model_dump() for t in again.tasks] == [t.model_dump() for t in result.tasks]


def test_seed_zero_and_existing_tasks_are_never_reproduced() -> None:
    plan = plan_generation(CoverageTarget(), count=10)
    with pytest.raises(DataError, match="seed 0"):
        generate_tasks(plan, seed=0)
    first = generate_tasks(plan, seed=2)
    second = generate_tasks(plan, seed=2, existing=first.tasks)
    assert not {t.id for t in first.tasks} & {t.id for t in second.tasks}
    assert not {t.instruction for t in first.tasks} & {t.instruction for t in second.tasks}


def test_thin_cells_are_filled_first() -> None:
    target = CoverageTarget(
        per_cell=0,
        include_canonical_train=False,
        cells=[CellTarget(capability="memory", domain="email", difficulty=3, count=5)],
    )
    plan = plan_generation(target)  # no count: fill the target, then stop
    assert len(plan.picks) == 5
    assert {p.cell for p in plan.picks} == {"memory/email/3"}
    templates = all_templates()
    assert all("memory" in templates[p.template].capabilities for p in plan.picks)
    assert plan.cells["memory/email/3"]["after"] == 5
    # with the canonical train split counted, the default target is already full
    assert plan_generation(CoverageTarget()).picks == []


def test_every_template_gets_its_share_when_planned_per_template() -> None:
    # text_contact_by_name's only cell is also text_partner_from_memory's: cell filling
    # all but leaves it out, a per-template plan does not
    names = ["add_new_contact", "text_contact_by_name", "text_partner_from_memory"]
    templates = {n: t for n, t in all_templates().items() if n in names}
    target = CoverageTarget(include_canonical_train=False)
    cells = plan_generation(target, count=30, templates=templates)
    assert Counter(p.template for p in cells.picks)["text_contact_by_name"] <= 2
    plan = plan_per_template(target, count=10, templates=templates)
    assert Counter(p.template for p in plan.picks) == {n: 10 for n in names}
    made = generate_tasks(plan, seed=7)
    assert Counter(t.template for t in made.tasks)["text_contact_by_name"] == 10


def _report(weak: str) -> object:
    """A validation report where every task of capability `weak` fails and the rest succeed."""
    trajectories = []
    for task in [t for t in SUITE if t.split == "validation"][::3]:
        planner = NoopPlanner() if weak in task.capabilities else OraclePlanner()
        trajectory = run_episode(SandboxEnv(), task, planner)
        trajectory.policy = Policy(planner="candidate")
        trajectories.append(trajectory)
    return score(trajectories)


def test_weak_capabilities_get_more_tasks() -> None:
    report = _report("subagent")
    weakness = Weakness.from_report(report)  # type: ignore[arg-type]
    assert weakness.capability["subagent"] == 0.0
    target = CoverageTarget(per_cell=2, include_canonical_train=False)
    plain = Counter(
        c for p in plan_generation(target, count=60).picks for c in [p.cell.split("/")[0]]
    )
    steered_plan = plan_generation(target, count=60, weakness=weakness)
    steered = Counter(p.cell.split("/")[0] for p in steered_plan.picks)
    assert steered["subagent"] > plain["subagent"]
    assert any("capability subagent is weak" in r for r in steered_plan.reasons)


def test_a_test_split_report_is_refused() -> None:
    report = _report("memory").model_copy(update={"split": "test"})  # type: ignore[attr-defined]
    with pytest.raises(DataError, match="split 'test'"):
        Weakness.from_report(report, "r.json")


def test_bad_coverage_targets_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "coverage.yaml"
    path.write_text("per_cell: 3\ncapabilities: {teleport: 2.0}\n")
    with pytest.raises(DataError, match=r"coverage.yaml: field 'capabilities'.*teleport"):
        load_coverage_target(str(path))
    path.write_text("domains: {atlantis: 2.0}\n")
    with pytest.raises(DataError, match=r"field 'domains'.*atlantis"):
        plan_generation(load_coverage_target(str(path)), count=1)
    with pytest.raises(DataError, match="missing"):
        load_coverage_target(str(tmp_path / "nope.yaml"))


def test_executable_rejects_tasks_the_oracle_cannot_solve() -> None:
    task = next(t for t in SUITE if t.template == "add_new_contact" and t.split == "train")
    assert executable(task) is None
    broken = task.model_copy(update={"reference_plan": []})
    assert "oracle fails" in str(executable(broken))


# --------------------------------------------------------------------------- LLM variants


def _base() -> Task:
    return next(t for t in SUITE if t.template == "text_contact_by_name" and t.split == "train")


def test_rewrites_must_keep_what_the_plan_depends_on() -> None:
    task = _base()
    literals = required_literals(task)
    note = task.instruction.split('"')[1]
    assert note in literals
    good = f'Please send a text to {task.instruction[5:].split(":")[0]} saying "{note}"'
    assert variant_problems(task, good) == []
    assert "drops required text" in variant_problems(task, "Text my friend something nice")[0]
    test_instruction = next(t.instruction for t in SUITE if t.split == "test")
    assert "canonical test" in variant_problems(task, test_instruction)[-1]
    assert parse_variants('```json\n{"variants": ["a b", "c"]}\n```') == ["a b", "c"]
    assert parse_variants("no json here") == []


def test_openai_planner_keeps_only_executable_faithful_variants(openai_server: FakeOpenAI) -> None:
    lossy = "Message my contact about the thing"
    test_instruction = next(t.instruction for t in SUITE if t.split == "test")

    def writer(
        request: ChatRequest,
    ) -> dict[str, list[str]]:  # a model that rewrites the instruction it is given three ways
        instruction = request.last_user.split("\n\n")[0]
        name, note = instruction[5:].split(":")[0], instruction.split('"')[1]
        good = f'Could you message {name} for me: "{note}"'
        return {"variants": [lossy, test_instruction, good]}

    openai_server.handler = writer
    backend = OpenAIBackend(openai_server.base_url, "writer", native_tools=False, max_retries=0)
    plan = plan_generation(CoverageTarget(), count=1)
    plan.picks[0].template = "text_contact_by_name"
    result = generate_tasks(plan, seed=9, rewriter=LLMRewriter(backend, variants=1))
    assert len(result.tasks) == 1, (result.dropped, openai_server.handler_errors)
    kept = result.tasks[0]
    assert kept.instruction.startswith("Could you message") and kept.source == "llm"
    assert kept.lineage["model"] == "writer" and kept.lineage["original_instruction"]
    assert kept.id.endswith(".v2") and kept.split == "train"
    reasons = " | ".join(d["reason"] for d in result.dropped)
    assert "drops required text" in reasons and "canonical test" in reasons
    request = openai_server.chat_requests[0]
    assert "Keep exactly" in request.last_user and "tools" not in request.body
    assert executable(kept) is None


# --------------------------------------------------------------------------- the stage


def test_written_batch_and_cli(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    result = runner.invoke(
        app, ["data", "generate", "--out", str(out), "--count", "8", "--seed", "4", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)["summary"]
    assert summary["generated"] == 8
    tasks = list(read_tasks(out / "tasks.jsonl"))
    assert len(tasks) == 8 and all(t.split == "train" for t in tasks)
    store = open_batch(out)
    manifest = read_manifest(store)
    assert manifest.kind == "tasks" and manifest.lineage.task_count == 8
    assert manifest.lineage.params["seed"] == 4
    queue = load_queue(store)
    assert queue is not None and queue.population == 8 and {i.kind for i in queue.items} == {"task"}
    # a second round passing the first as existing never repeats a task
    again = runner.invoke(
        app,
        [
            "data",
            "generate",
            "--out",
            str(tmp_path / "gen2"),
            "--count",
            "8",
            "--seed",
            "4",
            "--existing",
            str(out / "tasks.jsonl"),
        ],
    )
    assert again.exit_code == 0, again.output
    second = list(read_tasks(tmp_path / "gen2" / "tasks.jsonl"))
    assert not {t.id for t in tasks} & {t.id for t in second}
    assert read_manifest(open_batch(tmp_path / "gen2")).lineage.parents


def test_cli_names_bad_inputs(tmp_path: Path) -> None:
    missing = runner.invoke(
        app,
        ["data", "generate", "--out", str(tmp_path / "g"), "--report", str(tmp_path / "r.json")],
    )
    assert missing.exit_code == 2 and "r.json:missing" in "".join(missing.output.split())
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"id": "x"}\n')
    corrupt = runner.invoke(
        app, ["data", "generate", "--out", str(tmp_path / "g"), "--existing", str(bad)]
    )
    assert corrupt.exit_code == 2 and "tasks.jsonl:1" in "".join(corrupt.output.split())
    no_url = runner.invoke(
        app, ["data", "generate", "--out", str(tmp_path / "g"), "--planner", "openai"]
    )
    assert no_url.exit_code == 2 and "--model-url" in no_url.output
    store = open_batch(tmp_path / "g2")
    write_generated(
        store,
        generate_tasks(plan_generation(CoverageTarget(), count=2), seed=3),
        target=CoverageTarget(),
    )
    assert read_manifest(store).counts["generated"] == 2
