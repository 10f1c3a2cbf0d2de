"""The mixture: weighted by capability, difficulty and source; adaptive; TRL `messages` rows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

import qpa.cli.data_stages  # noqa: F401  (registers the stages on `qpa data`)
from qpa.bench.report import write_report
from qpa.bench.scoring import Report, score
from qpa.cli import app
from qpa.contract import Policy, Task, Trajectory
from qpa.data.curate import curate, write_curated
from qpa.data.mix import (
    COLUMNS,
    MixConfig,
    MixPlan,
    Weights,
    load_dataset_from_store,
    load_mix_config,
    load_validation_report,
    mix,
    plan_mixture,
)
from qpa.data.review import DataError, decide, load_queue, open_batch, publish
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.planners import NoopPlanner, OraclePlanner
from qpa.harness.runner import run_episode
from qpa.store.manifest import read_manifest

SUITE = generate_suite()
TRAIN = [t for t in SUITE if t.split == "train"]
runner = CliRunner()


def of(capabilities: list[str], difficulty: int, n: int) -> list[Task]:
    return [t for t in TRAIN if t.capabilities == capabilities and t.difficulty == difficulty][:n]


def oracle(task: Task, sample: int = 0) -> Trajectory:
    return run_episode(SandboxEnv(), task, OraclePlanner(), sample=sample)


@pytest.fixture(scope="module")
def skewed() -> list[Trajectory]:
    """20 tool_use trajectories and 2 memory ones: raw frequency 10:1."""
    return [oracle(t) for t in of(["tool_use"], 2, 20) + of(["memory"], 2, 2)]


def rows_by_capability(plan: MixPlan) -> Counter[str]:
    counts: Counter[str] = Counter()
    for item in plan.items:
        counts[item.trajectory.task.capabilities[0]] += item.copies
    return counts


def test_composition_follows_weights_not_raw_frequency(skewed: list[Trajectory]) -> None:
    plan = plan_mixture(skewed, MixConfig(target_size=100))
    assert rows_by_capability(plan) == {"tool_use": 50, "memory": 50}
    assert sum(i.copies for i in plan.items) == 100
    weighted = MixConfig(target_size=100, weights=Weights(capability={"memory": 3.0}))
    plan = plan_mixture(skewed, weighted)
    assert rows_by_capability(plan) == {"tool_use": 25, "memory": 75}
    assert plan.weights["capability.memory"] == 3.0
    by_difficulty = MixConfig(target_size=40, weights=Weights(difficulty={2: 0.0}))
    with pytest.raises(DataError, match="every mixture weight is 0"):
        plan_mixture(skewed, by_difficulty)


def test_sources_are_weighted_too(skewed: list[Trajectory]) -> None:
    generated = [
        t.model_copy(
            update={"id": t.id + "g", "task": t.task.model_copy(update={"source": "generated"})}
        )
        for t in skewed[:20]
    ]
    config = MixConfig(target_size=90, weights=Weights(source={"generated": 2.0}))
    plan = plan_mixture(skewed[:20] + generated, config)
    copies = Counter(i.trajectory.task.source for i in plan.items for _ in range(i.copies))
    assert copies == {"generated": 60, "template": 30}


def test_sampling_is_deterministic_for_a_seed(skewed: list[Trajectory]) -> None:
    config = MixConfig(target_size=33, seed=3)
    first = [(i.trajectory.id, i.copies) for i in plan_mixture(skewed, config).items]
    assert first == [(i.trajectory.id, i.copies) for i in plan_mixture(skewed, config).items]
    assert sum(c for _, c in first) == 33


def _validation_report(weak: str, unstable: str, mastered: str) -> Report:
    """Validation: `weak` capability fails, `unstable` template succeeds 1 of 2, the rest 2/2."""
    trajectories = []
    for task in [t for t in SUITE if t.split == "validation"][::4]:
        for sample in (0, 1):
            fails = weak in task.capabilities or (task.template == unstable and sample == 1)
            planner = NoopPlanner() if fails else OraclePlanner()
            trajectory = run_episode(SandboxEnv(), task, planner, sample=sample)
            trajectory.policy = Policy(planner="candidate")
            trajectories.append(trajectory)
    report = score(trajectories)
    assert report.per_task
    return report


def test_adaptive_rules_upweight_weak_and_unstable_and_downweight_mastered(
    skewed: list[Trajectory],
) -> None:
    tool_use = skewed[:20]
    unstable = tool_use[0].task.template
    mastered = tool_use[-1].task.template
    assert unstable != mastered
    report = _validation_report("memory", unstable or "", mastered or "")
    plan = plan_mixture(skewed, MixConfig(target_size=200), report)
    assert plan.weights["capability.memory"] > plan.weights["capability.tool_use"] == 1.0
    assert any(r.startswith("capability memory: validation success 0%") for r in plan.reasons)
    items = {i.trajectory.id: i for i in plan.items}
    shaky = items[tool_use[0].id]
    solid = items[tool_use[-1].id]
    assert shaky.factor == 2.0 and "unstable on validation" in shaky.reasons[0]
    assert solid.factor == 0.25 and "mastered" in solid.reasons[0]
    assert shaky.copies > solid.copies
    memory = sum(i.copies for i in plan.items if "memory" in i.trajectory.task.capabilities)
    assert memory > 100  # a weak capability gets more than its equal share


def test_curated_sample_statistics_mark_unstable_and_mastered(skewed: list[Trajectory]) -> None:
    first, second, *rest = [t.model_copy(deep=True) for t in skewed[:20]]
    first.metadata["curation"] = {"task_samples": {"samples": 4, "successes": 1}}
    second.metadata["curation"] = {"task_samples": {"samples": 4, "successes": 4}}
    plan = plan_mixture([first, second, *rest], MixConfig(target_size=100))
    items = {i.trajectory.id: i for i in plan.items}
    assert items[first.id].reasons == ["unstable: 1/4 samples succeed: x2"]
    assert items[second.id].reasons == ["mastered: 4/4 samples succeed: x0.25"]
    assert items[first.id].copies > items[rest[0].id].copies > items[second.id].copies


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text("target_size: 10\nweights:\n  capability: {teleport: 2.0}\n")
    with pytest.raises(DataError, match=r"mix.yaml: field 'weights.capability'.*'teleport'"):
        load_mix_config(str(path))
    path.write_text("mix:\n  weights: {difficulty: {9: 1.0}}\n")
    with pytest.raises(DataError, match=r"field 'weights.difficulty'.*difficulty 9"):
        load_mix_config(str(path))
    path.write_text("target_size: 0\n")
    with pytest.raises(DataError, match="field 'target_size'"):
        load_mix_config(str(path))
    path.write_text("mix:\n  target_size: 7\n  adaptive: {unstable_boost: 3}\n")
    assert load_mix_config(str(path)).adaptive.unstable_boost == 3
    with pytest.raises(DataError, match=r"report.json: missing"):
        load_validation_report(str(tmp_path / "report.json"))


def test_a_test_split_report_is_refused(tmp_path: Path, skewed: list[Trajectory]) -> None:
    report = _validation_report("memory", "", "").model_copy(update={"split": "test"})
    write_report(report, tmp_path, plots=False)
    with pytest.raises(DataError, match="split 'test'"):
        load_validation_report(str(tmp_path / "report.json"))


@pytest.fixture(scope="module")
def curated_batch(tmp_path_factory: pytest.TempPathFactory, skewed: list[Trajectory]) -> str:
    out = tmp_path_factory.mktemp("curated") / "batch"
    delegating = [oracle(t) for t in TRAIN if t.template == "triage_three_mailboxes"][:2]
    failed = [run_episode(SandboxEnv(), t.task, NoopPlanner()) for t in skewed[:3]]
    batch = open_batch(out)
    write_curated(batch, curate([*skewed, *delegating, *failed]), inputs=[str(out)])
    queue = load_queue(batch)
    assert queue is not None
    for item in queue.items:  # a reviewer passes the batch and publishes it: the mix may read it
        decide(batch, item.id, accept=True, reviewer="fixture")
    publish(batch)
    return str(out)


def test_mix_writes_a_trl_messages_dataset_with_manifest(
    tmp_path: Path, curated_batch: str
) -> None:
    out = tmp_path / "mix"
    result = mix(open_batch(out), [curated_batch], MixConfig(target_size=60))
    store = open_batch(out)
    manifest = read_manifest(store)
    assert manifest.kind == "sft" and manifest.counts["copies"] == 60
    assert manifest.weights and "capability.memory" in manifest.weights
    assert manifest.lineage.parents == [Path(curated_batch).resolve().as_uri()]
    assert any(f.key.startswith("dataset/") and f.key.endswith(".arrow") for f in manifest.files)
    dataset = load_dataset_from_store(store)
    assert tuple(dataset.column_names) == COLUMNS and len(dataset) == result.rows
    row = dataset[0]
    assert [m["role"] for m in row["messages"]][:2] == ["system", "user"]
    assert all(set(m) == {"role", "content", "train"} for m in row["messages"])
    assert all(m["train"] == (m["role"] == "assistant") for m in row["messages"])
    assert all(row["success"] for row in dataset)  # failures stay out of the SFT set by default
    agents = set(dataset["agent"])
    assert "main" in agents and len(agents) > 1  # sub-agent conversations are rows of their own
    again = tmp_path / "again"
    mix(open_batch(again), [curated_batch], MixConfig(target_size=60))
    assert load_dataset_from_store(open_batch(again)).to_list() == dataset.to_list()
    assert load_queue(store, required=False) is None  # the gate is that of the inputs
    reviewed = tmp_path / "reviewed"
    mix(open_batch(reviewed), [curated_batch], MixConfig(target_size=10, review_rows=True))
    queue = load_queue(open_batch(reviewed))
    assert queue is not None and {i.kind for i in queue.items} == {"row"}


def test_rejected_samples_never_enter_the_mix(tmp_path: Path, curated_batch: str) -> None:
    batch = open_batch(curated_batch)
    queue = load_queue(batch)
    assert queue is not None
    victim = next(i for i in queue.items if i.kind == "sample")
    decide(batch, victim.id, accept=False, reason="wrong recipient")
    try:
        result = mix(open_batch(tmp_path / "mix"), [curated_batch], MixConfig(target_size=40))
        assert victim.ref not in {i.trajectory.id for i in result.plan.items}
    finally:
        decide(batch, victim.id, accept=True)


def test_failures_can_join_with_their_mistakes_masked(tmp_path: Path, curated_batch: str) -> None:
    config = MixConfig(target_size=80, include_failures=True)
    result = mix(open_batch(tmp_path / "mix"), [curated_batch], config)
    failed = [i for i in result.plan.items if not i.trajectory.success]
    assert all(i.trajectory.metadata["diagnosis"]["side"] == "model" for i in failed)


def test_cli_mix_and_its_errors(tmp_path: Path, curated_batch: str) -> None:
    out = tmp_path / "mix"
    config = tmp_path / "mix.yaml"
    config.write_text("target_size: 20\nweights: {capability: {memory: 2}}\n")
    ok = runner.invoke(
        app, ["data", "mix", curated_batch, "--out", str(out), "--config", str(config), "--json"]
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["counts"]["copies"] == 20
    missing = runner.invoke(app, ["data", "mix", str(tmp_path / "nothing"), "--out", str(out)])
    assert missing.exit_code == 2 and "missing" in "".join(missing.output.split())
    config.write_text("weights: {capability: {teleport: 2}}\n")
    bad = runner.invoke(
        app, ["data", "mix", curated_batch, "--out", str(out), "--config", str(config)]
    )
    assert (
        bad.exit_code == 2
        and "weights.capability" in "".join(bad.output.split())
        and "teleport" in bad.output
    )
    no_report = runner.invoke(
        app, ["data", "mix", curated_batch, "--out", str(out), "--report", str(tmp_path / "r.json")]
    )
    assert no_report.exit_code == 2 and "r.json:missing" in "".join(no_report.output.split())


def test_importing_the_data_package_stays_light(tmp_path: Path) -> None:
    code = "import sys, qpa.data.mix, qpa.data.curate; assert 'datasets' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_harness_variants_render_each_trajectory_for_one_version(skewed: list[Trajectory]) -> None:
    from qpa.data.mix import build_rows
    from qpa.data.render import Renderer
    from qpa.harness.agent import HarnessConfig

    plan = plan_mixture(skewed, MixConfig(target_size=40))
    compact = HarnessConfig(version="compact", max_tools=2, token_budget=100)
    wide = HarnessConfig(version="wide", max_tools=16, token_budget=1500)
    alone = build_rows(plan, Renderer(compact))
    mixed = build_rows(plan, Renderer(compact), Renderer(wide), seed=3)
    assert len(mixed) == len(alone)

    def system_prompts(rows: list[dict[str, object]]) -> dict[str, str]:
        return {str(r["trajectory_id"]): r["messages"][0]["content"] for r in rows}  # type: ignore[index]

    compact_prompts, mixed_prompts = system_prompts(alone), system_prompts(mixed)
    changed = {t for t in compact_prompts if mixed_prompts[t] != compact_prompts[t]}
    assert 0 < len(changed) < len(compact_prompts)  # some trajectories each way
    for trajectory_id in changed:  # the wide version lists more tools than the compact one
        assert mixed_prompts[trajectory_id].count("\n- ") > compact_prompts[trajectory_id].count(
            "\n- "
        )
    assert system_prompts(build_rows(plan, Renderer(compact), Renderer(wide), seed=3)) == (
        mixed_prompts
    )


def test_input_batches_are_weighted_when_asked(skewed: list[Trajectory]) -> None:
    """A TrainingRun's `datasets[].weight`: the same kind of data from two inputs, 3:1."""
    second = [t.model_copy(update={"id": t.id + "-b"}) for t in skewed]
    origins = {t.id: "s3://q/a/" for t in skewed} | {t.id: "s3://q/b/" for t in second}
    config = MixConfig(target_size=80, input_weights={"s3://q/a/": 3.0})
    plan = plan_mixture([*skewed, *second], config, origins=origins)
    copies = Counter[str]()
    for item in plan.items:
        copies[origins[item.trajectory.id]] += item.copies
    assert copies == {"s3://q/a/": 60, "s3://q/b/": 20}
    assert plan.weights["input.s3://q/a/"] == 3.0
    unweighted = plan_mixture([*skewed, *second], MixConfig(target_size=80), origins=origins)
    even = Counter[str]()
    for item in unweighted.items:
        even[origins[item.trajectory.id]] += item.copies
    assert even == {"s3://q/a/": 40, "s3://q/b/": 40}


def test_cli_input_weights_name_the_problem(tmp_path: Path, curated_batch: str) -> None:
    out = str(tmp_path / "mix")
    weighted = runner.invoke(
        app, ["data", "mix", curated_batch, "--out", out, "--input-weight", f"{curated_batch}=2",
              "--json"],
    )  # fmt: skip
    assert weighted.exit_code == 0, weighted.output
    assert json.loads(weighted.output)["weights"][f"input.{curated_batch}"] == 2.0
    for item, message in (
        ("nope", "expected INPUT=WEIGHT"),
        (f"{curated_batch}=lots", "could not convert"),
        (f"{curated_batch}=-1", "must be a finite number > 0"),
        ("s3://elsewhere/=2", "which is not an input"),
    ):
        bad = runner.invoke(
            app, ["data", "mix", curated_batch, "--out", out, "--input-weight", item]
        )
        assert bad.exit_code == 2 and message in " ".join(bad.output.split()), bad.output


def test_the_mixture_adds_swapped_rows_and_counts_them(tmp_path: Path, curated_batch: str) -> None:
    plain = mix(open_batch(tmp_path / "plain"), [curated_batch], MixConfig(target_size=40))
    out = tmp_path / "swapped"
    swapped = mix(open_batch(out), [curated_batch], MixConfig(target_size=40, value_swaps=2))
    counts = read_manifest(open_batch(out)).counts
    assert counts["rows.value_swapped"] > 0
    assert swapped.rows == plain.rows + counts["rows.value_swapped"]
    ids = load_dataset_from_store(open_batch(out))["trajectory_id"]
    assert sum("~swap" in i for i in ids) == counts["rows.value_swapped"]
