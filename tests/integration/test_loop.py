"""`qpa loop` end to end: the `small` preset in one process, then a rerun, then the cluster dry run.

The `small` preset runs every stage of the loop (tiny model, task generation, oracle and noisy
collection, curation, mixture, SFT, evaluation, diagnosis, Harness revision, weakness-targeted
round 2, CARE RL, evaluation) on three templates with a few dozen optimizer steps: it proves the
plumbing and the report's shape, not learning (`qpa loop --preset local` is where learning is
measured).

Checked: `report.json` has the required keys and numbers in range (with Wilson intervals,
pass@1 from sampled episodes and McNemar comparisons recomputed from the trajectories), the
held-out sets are apart by content from every training task, the lineage points at files
that exist; a second run skips every stage and reproduces the numbers; a changed RL setting
marks only the RL stages stale; `--preset cluster --dry-run` prints YAML whose TaskBatch,
TrainingRun and HarnessRelease documents parse with `qpa.api.v1alpha1` and validate against
the CRDs in `crds/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from qpa.bench.stats import mcnemar_exact, wilson_interval
from qpa.contract import read_tasks, read_trajectories
from qpa.loop.presets import get_preset
from qpa.loop.report import comparable
from qpa.loop.run import LoopRun, plan, run_loop
from qpa.loop.stages import harness_ladder, task_content_hash

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("model", "harness", "environment")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> LoopRun:
    return run_loop(get_preset("small"), tmp_path_factory.mktemp("loop-small"))


def _check_entry(entry: dict[str, Any], capabilities: list[str]) -> None:
    assert 0.0 <= entry["test_success"] <= 1.0
    assert set(entry["by_capability"]) <= set(capabilities)
    assert entry["by_capability"], "per-capability success is missing"
    for value in entry["by_capability"].values():
        assert 0.0 <= value <= 1.0
    tokens = entry["output_tokens_per_solved_task"]
    assert tokens is None or tokens >= 0.0
    if entry["test_success"] > 0:
        assert tokens is not None
    assert set(entry["diagnosis"]) == set(SIDES)
    assert all(isinstance(v, int) and v >= 0 for v in entry["diagnosis"].values())
    failures = round((1.0 - entry["test_success"]) * entry["tasks"])
    assert sum(entry["diagnosis"].values()) == failures
    assert entry["test_tasks"] == entry["tasks"] == 12  # 3 templates x 4 held-out test tasks
    assert entry["test_successes"] == round(entry["test_success"] * 12)
    low, high = entry["test_success_ci"]
    assert [low, high] == [round(v, 6) for v in wilson_interval(entry["test_successes"], 12)]
    assert low <= entry["test_success"] <= high
    assert set(entry["by_capability_ci"]) == set(entry["by_capability"])


def _greedy_outcomes(out: Path, evaluation: dict[str, Any]) -> dict[str, bool]:
    path = out / evaluation["test"]["trajectories"]
    return {t.task.id: t.success for t in read_trajectories(path)}


@pytest.mark.timeout(900)  # the module's loop run happens in this test's setup
def test_small_preset_end_to_end(first_run: LoopRun) -> None:
    run = first_run
    assert run.ran and not run.skipped
    out = run.out
    report = run.report
    for name in ("report.json", "report.md"):
        assert (out / name).is_file()
    for plot in report["plots"]:
        assert (out / plot).is_file()
    stages = report["stages"]
    assert {"untrained", "sft", "rl"} <= set(stages)
    capabilities = report["curriculum"]["capabilities"]
    assert capabilities == ["tool_use", "memory", "skills"]
    for entry in stages.values():
        _check_entry(entry, capabilities)
    for name in ("sft", "rl"):  # the sampled stages (eval.sampled_stages), k = 2
        entry = stages[name]
        assert entry["pass_at_1_samples"] == 2 and entry["pass_at_1_temperature"] == 1.0
        assert entry["pass_at_1_ci"][0] <= entry["pass_at_1"] <= entry["pass_at_1_ci"][1]
        assert entry["validation_tasks"] == 9
        assert entry["validation_success_ci"][0] <= entry["validation_success"]
    assert stages["untrained"]["pass_at_1"] is None
    assert stages["untrained"]["validation_success_ci"] is None
    revised_key = next(n for n, e in stages.items() if e["kind"] == "harness_revision")
    pairs = [(c["from"], c["to"]) for c in report["comparisons"]]
    assert pairs == [("untrained", "sft"), ("sft", revised_key), (revised_key, "rl"), ("sft", "rl")]
    evaluations = {
        "untrained": "eval_untrained",
        "sft": "eval_sft",
        revised_key: "eval_harness",
        "rl": "eval_rl",
    }
    for comparison in report["comparisons"]:
        before = _greedy_outcomes(out, run.results[evaluations[comparison["from"]]].outputs)
        after = _greedy_outcomes(out, run.results[evaluations[comparison["to"]]].outputs)
        ids = sorted(before)
        assert ids == sorted(after)
        expected = mcnemar_exact([before[t] for t in ids], [after[t] for t in ids])
        assert (comparison["b"], comparison["c"], comparison["n"]) == (
            expected.b,
            expected.c,
            12,
        )
        assert comparison["p_value"] == round(expected.p_value, 6)
        assert comparison["test"] == "mcnemar_exact"
    heldout = run.results["heldout"].outputs
    assert heldout["counts"] == {"validation": 9, "test": 12}
    assert report["curriculum"]["test_tasks"] == 12
    assert (out / heldout["manifest"]).is_file()
    training = list(read_tasks(out / run.results["tasks"].outputs["train_tasks"]))
    training += list(read_tasks(out / run.results["round2"].outputs["rl_pool"]))
    trained = {task_content_hash(t) for t in training}
    held = {
        s: [task_content_hash(t) for t in read_tasks(out / heldout[s])] for s in heldout["counts"]
    }
    assert not trained & (set(held["validation"]) | set(held["test"]))
    assert not set(held["validation"]) & set(held["test"])
    revised = [n for n, e in stages.items() if e["kind"] == "harness_revision"]
    assert len(revised) == 1
    assert stages["rl"]["harness_version"] == stages[revised[0]]["harness_version"]
    revision = report["harness_revision"]
    for when in ("harness_failures_before", "harness_failures_after"):
        assert set(revision[when]) == {"validation", "test"}
    weakness = report["weakness_targeting"]
    assert set(weakness["mixture_weights"]) >= set(capabilities)
    assert sum(weakness["rl_pool_by_capability"].values()) > 0
    lineage = report["lineage"]
    final = lineage["final_model"]
    assert (out / final["checkpoint"] / "config.json").is_file()
    assert [m["name"] for m in lineage["models"]] == ["untrained", "sft", "rl"]
    for model in lineage["models"]:
        assert (out / model["checkpoint"]).is_dir()
    assert {"sft_mixture", "round2_mixture", "curated"} <= set(lineage["datasets"])
    for dataset in lineage["datasets"].values():
        assert (out / dataset["manifest"]).is_file()
    assert lineage["harness_versions"][0]["version"] == "harness-v1"
    timing = report["timing"]
    assert set(timing["stages_s"]) == set(timing["status"])
    assert all(s == "ran" for s in timing["status"].values())


def test_second_run_skips_every_stage_and_reproduces(first_run: LoopRun) -> None:
    run = first_run
    again = run_loop(get_preset("small"), run.out)
    assert again.skipped == [s for s in run.results]
    assert not again.ran
    assert comparable(again.report) == comparable(run.report)
    assert again.report["timing"]["stages_s"] == run.report["timing"]["stages_s"]


def test_changed_setting_reruns_downstream_only(first_run: LoopRun) -> None:
    run = first_run
    preset = get_preset("small")
    changed = preset.model_copy(
        update={"rl": preset.rl.model_copy(update={"steps": preset.rl.steps + 1})}
    )
    status = {stage.name: now for stage, now in plan(changed, run.out)}
    stale = sorted(n for n, s in status.items() if s != "skip (done)")
    assert stale == ["eval_rl", "rl"]
    reseeded = {stage.name: now for stage, now in plan(preset.with_seed(1), run.out)}
    assert all(s != "skip (done)" for s in reseeded.values())
    # The RL stage's own seed: only RL and its evaluation are stale; unset, nothing is.
    rl_seeded = preset.model_copy(update={"rl": preset.rl.model_copy(update={"seed": 5})})
    status = {stage.name: now for stage, now in plan(rl_seeded, run.out)}
    assert sorted(n for n, s in status.items() if s != "skip (done)") == ["eval_rl", "rl"]
    unset = preset.model_copy(update={"rl": preset.rl.model_copy(update={"seed": None})})
    assert all(now == "skip (done)" for _, now in plan(unset, run.out))
    # Settings added later are hashed only when they differ from their default.
    kl = preset.model_copy(update={"rl": preset.rl.model_copy(update={"beta": 0.1})})
    status = {stage.name: now for stage, now in plan(kl, run.out)}
    assert sorted(n for n, s in status.items() if s != "skip (done)") == ["eval_rl", "rl"]
    learnable = preset.model_copy(
        update={"round2": preset.round2.model_copy(update={"pool": "learnable"})}
    )
    status = {stage.name: now for stage, now in plan(learnable, run.out)}
    assert sorted(n for n, s in status.items() if s != "skip (done)") == ["eval_rl", "rl", "round2"]
    # ... also one inside a nested model (rl.care.format_weight)
    formatted = preset.with_settings(["rl.care.format_weight=0.1"])
    status = {stage.name: now for stage, now in plan(formatted, run.out)}
    assert sorted(n for n, s in status.items() if s != "skip (done)") == ["eval_rl", "rl"]
    assert preset.section("rl") == preset.with_settings(["rl.care.format_weight=0"]).section("rl")
    assert "format_weight" not in preset.section("rl")["rl"]["care"]
    # mix.day_swaps: the mixture and everything trained from it, not what came before
    days = preset.with_settings(["mix.day_swaps=true"])
    stale = {stage.name for stage, now in plan(days, run.out) if now != "skip (done)"}
    assert {"mix", "sft", "eval_sft", "rl"} <= stale
    assert not stale & {"tiny", "tasks", "heldout", "collect", "curate", "eval_untrained"}
    assert "day_swaps" not in preset.section("mix")["mix"]


def test_a_learnable_rl_pool_is_shared_by_validation_and_keeps_out_held_out_tasks(
    first_run: LoopRun, tmp_path: Path
) -> None:
    import shutil

    out = tmp_path / "loop"
    shutil.copytree(first_run.out, out)
    preset = get_preset("small")
    preset = preset.model_copy(
        update={"round2": preset.round2.model_copy(update={"pool": "learnable"})}
    )
    run = run_loop(preset, out, stages=["round2"], report=False)
    assert run.ran == ["round2"]
    outputs = run.results["round2"].outputs
    pool = list(read_tasks(out / outputs["rl_pool"]))
    assert len(pool) == outputs["rl_pool_size"] == preset.round2.target_size
    # validation success per template decides its share: p(1-p) + 0.02 of each
    success = outputs["validation_by_template"]
    weights = {t: success.get(t, 0.5) * (1 - success.get(t, 0.5)) + 0.02 for t in success}
    shares = {t: n / len(pool) for t, n in outputs["rl_pool_by_template"].items()}
    for template, weight in weights.items():
        assert shares.get(template, 0.0) == pytest.approx(
            weight / sum(weights.values()), abs=1.0 / len(pool)
        )
    # drawn from round 1's training tasks and round 2's, never from a held-out set
    round1 = {t.id for t in read_tasks(out / first_run.results["tasks"].outputs["train_tasks"])}
    round2 = {t.id for t in read_tasks(out / outputs["generated"]["tasks_file"])}
    assert {t.id for t in pool} <= round1 | round2
    assert {t.id for t in pool} & round1
    heldout = first_run.results["heldout"].outputs
    held = {
        task_content_hash(t) for s in ("validation", "test") for t in read_tasks(out / heldout[s])
    }
    assert not {task_content_hash(t) for t in pool} & held


def test_rl_seeds_reruns_only_rl_and_pools_the_seeds(
    first_run: LoopRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import rl_seeds

    assert (
        rl_seeds.main(["--loop", str(first_run.out), "--out", str(tmp_path), "--seeds", "0", "7"])
        == 0
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sft = _greedy_outcomes(first_run.out, first_run.results["eval_harness"].outputs)
    assert result["tasks"] == len(sft) and result["sft_solved"] == sum(sft.values())
    own_rl = _greedy_outcomes(first_run.out, first_run.results["eval_rl"].outputs)
    for entry, seed in zip(result["seeds"], (0, 7), strict=True):
        folder = tmp_path / f"seed-{seed}"
        rl = _greedy_outcomes(
            folder, json.loads((folder / "stages/eval_rl/done.json").read_text())["outputs"]
        )
        tasks = sorted(sft)
        test = mcnemar_exact([sft[t] for t in tasks], [rl[t] for t in tasks])
        assert (entry["seed"], entry["solved"], entry["b"], entry["c"]) == (
            seed,
            sum(rl.values()),
            test.b,
            test.c,
        )
        if seed == 0:  # the loop's own RL seed: the same run again
            assert rl == own_rl
        # every stage before RL was reused, not recomputed
        for stage in ("sft", "eval_harness", "round2"):
            assert (folder / "stages" / stage / "done.json").read_text() == (
                first_run.out / "stages" / stage / "done.json"
            ).read_text()
    assert 0 < result["p_value"] <= 1
    low, high = result["difference_ci"]
    assert low <= result["difference"] <= high


def _crd_schemas() -> dict[str, Any]:
    from fakes.kube_schema import CustomResourceSchema

    schemas: dict[str, Any] = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version = crd["spec"]["versions"][0]
        schemas[crd["spec"]["names"]["kind"]] = CustomResourceSchema(
            version["schema"]["openAPIV3Schema"]
        )
    return schemas


def test_harness_ladder_climbs_from_v1_to_the_revision_caps() -> None:
    preset = get_preset("local")
    first, caps = preset.harness, preset.revision
    ladder = harness_ladder(preset)
    assert len(ladder) == 3
    assert len({h.version for h in [first, *ladder]}) == 4
    for lower, upper in zip([first, *ladder], ladder, strict=False):
        assert upper.max_tools is not None and lower.max_tools is not None
        assert upper.max_tools >= lower.max_tools and upper.token_budget > lower.token_budget
        assert upper.memory_k >= lower.memory_k
    top = ladder[-1]
    assert (top.max_tools, top.token_budget, top.memory_k) == (
        caps.max_tools_cap,
        caps.token_budget_cap,
        caps.memory_k_cap,
    )
    assert all(h.token_budget % 50 == 0 and h.max_turns == first.max_turns for h in ladder)


def test_cluster_dry_run_prints_valid_resources() -> None:
    from typer.testing import CliRunner

    import qpa.cli.loop  # noqa: F401  (registers `qpa loop` on the app)
    from qpa.api.v1alpha1 import parse_resource
    from qpa.cli import app

    result = CliRunner().invoke(app, ["loop", "--preset", "cluster", "--dry-run"])
    assert result.exit_code == 0, result.output
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = [d["kind"] for d in documents]
    assert {"TaskBatch", "TrainingRun", "HarnessRelease"} <= set(kinds)
    stages = {d["spec"]["stage"] for d in documents if d["kind"] == "TrainingRun"}
    assert stages == {"sft", "rl"}
    schemas = _crd_schemas()
    for document in documents:
        if document["kind"] not in ("TaskBatch", "TrainingRun", "HarnessRelease"):
            continue
        parse_resource(document)
        schema = schemas[document["kind"]]
        body = yaml.safe_load(yaml.safe_dump(document))
        assert schema.prune(body) == [], document["metadata"]["name"]
        schema.default(body)
        assert schema.validate(body) == [], document["metadata"]["name"]
    release = next(d for d in documents if d["kind"] == "HarnessRelease")
    rl_run = next(d for d in documents if d["kind"] == "TrainingRun" and d["spec"]["stage"] == "rl")
    assert release["spec"]["model"]["uri"].startswith(rl_run["spec"]["outputUri"])


def test_loop_set_changes_one_setting_and_marks_only_its_stages(first_run: LoopRun) -> None:
    from typer.testing import CliRunner

    import qpa.cli.loop  # noqa: F401
    from qpa.cli import app

    args = ["loop", "--preset", "small", "--out", str(first_run.out), "--dry-run"]
    result = CliRunner().invoke(app, [*args, "--set", "rl.beta=0.1"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if line.count("│") >= 4}
    assert "skip" not in rows["rl"] and "skip" not in rows["eval_rl"]
    assert "skip" in rows["sft"] and "skip" in rows["round2"]
    refused = CliRunner().invoke(app, [*args, "--set", "rl.betta=0.1"])
    assert refused.exit_code != 0
    assert "rl.betta" in refused.output


def test_cluster_preset_needs_dry_run() -> None:
    from typer.testing import CliRunner

    import qpa.cli.loop  # noqa: F401
    from qpa.cli import app

    result = CliRunner().invoke(app, ["loop", "--preset", "cluster"])
    assert result.exit_code != 0
