"""The CARE ablation: four RL arms from one SFT checkpoint and one budget, where efficiency matters.

    .venv/bin/python benchmarks/care_ablation.py --loop runs/loop-local --out runs/care-ablation
    .venv/bin/python benchmarks/care_ablation.py --loop DIR --out OUT --seeds 0 1 2 --steps 12

The arms (every one a `RLConfig`, and so a TrainingRun's `spec.rl`, setting):

| arm | reward | advantage | loss normaliser |
|---|---|---|---|
| `vanilla` (GRPO) | outcome `s` | `(r - mean) / (std + eps)` | trained tokens |
| `efficiency` (GRPO + efficiency) | `s * (1 - cost)`, every group | same | same |
| `dr_grpo` (Dr.GRPO, Liu et al. 2025) | outcome `s` | `r - mean` | a constant (`dr_grpo`) |
| `care` (CARE) | tiered by group success | success-anchored | trained tokens |

`efficiency` and `care` share the efficiency weights (`--token-weight`, `--call-weight`); CARE's
tier thresholds are `--low`/`--high`.

What it does, all resumable (every piece is a file under `--out`; `--loop` is only read):

1. **Held-out tasks.** Fresh variants of every curriculum template, `--validation` and `--test`
   per template, built with a seed of their own (`HELDOUT_SEED`) and kept apart by instruction
   from every task the loop trained on (the canonical suite, round 1, the round-2 pool) and from
   each other; the oracle must solve each one (`qpa.data.generate.executable`).
2. **Where efficiency matters.** The loop's SFT checkpoint is evaluated greedily through the
   loop's Harness v2 on validation, per template; the templates it solves at >= `--threshold`
   are the ablation's. If none does, SFT continues from that checkpoint on the loop's SFT
   mixture rows of the `--easiest` templates (highest validation success) in rounds of
   `--sft-steps` steps until they do (or `--sft-rounds` rounds are spent: the printout says so),
   and that checkpoint is every arm's start.
3. **The efficiency weights, on validation.** From the start checkpoint, `--groups` groups of k
   sampled episodes (the RL sampling) per validation task of the chosen templates are scored
   with each candidate weight; printed per candidate: the share of groups in the efficiency
   tier and the efficiency push (mean |advantage| of the successes of all-success groups)
   as a share of a success/failure push (mean |advantage| in mixed groups), CARE and
   efficiency-GRPO side by side. `choose_weights` picks the candidate whose CARE push is
   closest to `TARGET_PUSH` (every candidate keeps `(w_tok + w_call) * cap < 1`, so each success
   still outranks each failure); `--token-weight` etc. override it.
4. **The arms.** For every seed, each arm trains RL from the start checkpoint with the same
   budget (`--steps` x tasks per step x k, the preset's learning rate and sampling) on the
   training tasks of the chosen templates, and is evaluated greedily on their test tasks.
   Finished (arm, seed) runs are read back from `OUT/arms/<arm>-seed<k>/summary.json`.

The table: test success (mean over seeds; Wilson 95% interval over all seeds' episodes,
`qpa.bench.stats`; McNemar's exact p against CARE, episodes paired by seed and task), output
tokens and tool calls per task on the tasks EVERY arm solved (within each seed, pooled), and
skipped necessary tool calls per task: each reference-plan tool call the trajectory never made
(tool names as a multiset), the over-compression CARE's success anchor is meant to prevent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The held-out sets' suite seed (the canonical suite is seed 0; round 1 uses 1 + 1000 * seed).
HELDOUT_SEED = 22_005
ARMS = ("vanilla", "efficiency", "dr_grpo", "care")
LABELS = {
    "vanilla": "vanilla GRPO",
    "efficiency": "GRPO + efficiency reward",
    "dr_grpo": "Dr.GRPO",
    "care": "CARE",
}


# ----------------------------------------------------------------------------- small helpers


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def template_of(task: Any) -> str:
    return str(task.template or task.id.split(".")[1])


def skipped_calls(trajectory: Any) -> int:
    """Reference-plan tool calls the trajectory never made (tool names, as a multiset)."""
    plan = trajectory.task.reference_plan or []
    needed = Counter(a.tool for a in plan if getattr(a, "type", "") == "tool_call")
    made = Counter(
        s.action.tool for s in trajectory.steps if getattr(s.action, "type", "") == "tool_call"
    )
    return sum((needed - made).values())


def episode_record(trajectory: Any) -> dict[str, Any]:
    verification = trajectory.verification
    return {
        "task": trajectory.task.id,
        "template": template_of(trajectory.task),
        "success": bool(verification is not None and verification.success),
        "output_tokens": int(trajectory.totals.completion_tokens),
        "tool_calls": int(trajectory.totals.tool_calls),
        "skipped_calls": skipped_calls(trajectory),
    }


# ----------------------------------------------------------------------------- 1. held-out


#: What a planner, the environment and the verifier read of a task (its id and seed aside).
CONTENT = ("instruction", "user", "memory", "apps", "tools", "world", "verifier", "confirmations")


def content_key(task: Any) -> str:
    data = task.model_dump(mode="json")
    return json.dumps({k: data[k] for k in CONTENT}, sort_keys=True)


def heldout_tasks(
    templates: Sequence[str], training: Sequence[Any], *, per_split: dict[str, int], suite: str
) -> dict[str, list[Any]]:
    """Fresh validation/test variants of `templates`, apart from `training` and each other by
    content (`CONTENT`: a template's instructions repeat, its memory and world differ)."""
    from qpa.data.generate import executable
    from qpa.envs.sandbox.suite import all_templates, build_task, generate_suite

    taken = {content_key(t) for t in training} | {content_key(t) for t in generate_suite(suite)}
    out: dict[str, list[Any]] = {split: [] for split in per_split}
    catalog = all_templates()
    for name in templates:
        for split, count in per_split.items():
            made, index = 0, 0
            while made < count:
                if index > count * 20 + 20:
                    raise RuntimeError(f"template {name}: only {made} fresh {split} variants")
                task = build_task(catalog[name], split, index, HELDOUT_SEED)  # type: ignore[arg-type]
                index += 1
                key = content_key(task)
                if key in taken or executable(task) is not None:
                    continue
                taken.add(key)
                out[split].append(task.model_copy(update={"source": "heldout"}))
                made += 1
    return out


# ----------------------------------------------------------------------------- evaluation


def greedy_records(
    model_dir: Path, tasks: Sequence[Any], harness: Any, out: Path, *, label: str, preset: Any
) -> list[dict[str, Any]]:
    """Greedy episodes of `model_dir` on `tasks` (trajectories kept in `out`), one record each."""
    from qpa.contract import write_trajectories
    from qpa.train.greedy import load_model, run_episodes

    model, tokenizer = load_model(model_dir)
    trajectories = run_episodes(
        model,
        tokenizer,
        tasks,
        harness,
        label=label,
        max_new_tokens=preset.eval.max_new_tokens,
        workers=preset.eval.workers,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_trajectories(out / "trajectories.jsonl", trajectories)
    records = [episode_record(t) for t in trajectories]
    _write(out / "records.json", records)
    return records


def by_template(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    groups: dict[str, list[bool]] = {}
    for r in records:
        groups.setdefault(r["template"], []).append(r["success"])
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


# ----------------------------------------------------------------------------- 2. start checkpoint


def continue_sft(
    start: Path, mixture: Path, templates: Sequence[str], out: Path, *, steps: int, preset: Any
) -> Path:
    """SFT from `start` on the mixture rows of `templates` for `steps` more steps."""
    import datasets
    import torch

    from qpa.train.config import CheckpointSettings, MetricsSettings, SFTConfig
    from qpa.train.sft import train_sft

    rows = datasets.load_from_disk(str(mixture))
    wanted = set(templates)
    picked = rows.filter(lambda r: r["task_id"].split(".")[1] in wanted)
    data = out / "dataset"
    picked.save_to_disk(str(data))
    settings = preset.sft
    config = SFTConfig(
        name="care-ablation-sft",
        model=str(start),
        dataset=str(data),
        output_dir=str(out / "run"),
        max_length=settings.max_length,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate / 2,
        lr_scheduler_type="cosine",
        warmup_steps=settings.warmup,
        max_steps=steps,
        seed=0,
        bf16=settings.bf16,
        metrics=MetricsSettings(logging_steps=10),
        checkpoint=CheckpointSettings(every_steps=steps, keep_last=1, resume="auto"),
        trl={} if torch.cuda.is_available() else {"use_cpu": True},
    )
    result = train_sft(config)
    if result.final_dir is None:
        raise RuntimeError("continued SFT saved no final model")
    return Path(result.final_dir)


# ----------------------------------------------------------------------------- arms


def arm_settings(arm: str, preset: Any, *, token_weight: float, call_weight: float,
                 low: float, high: float) -> tuple[Any, str]:  # fmt: skip
    """(CareSettings, loss type) of one arm."""
    from qpa.api.v1alpha1 import CareSettings

    base = preset.rl.care.model_copy(
        update={
            "token_weight": token_weight,
            "call_weight": call_weight,
            "low_success_threshold": low,
            "high_success_threshold": high,
        }
    )
    care = CareSettings.model_validate(base.model_dump())  # the cross-field rules, again
    if arm == "vanilla":
        return care.model_copy(update={"enabled": False}), "token_mean"
    if arm == "efficiency":
        return care.model_copy(
            update={"enabled": False, "vanilla_reward": "efficiency_refinement"}
        ), "token_mean"
    if arm == "dr_grpo":
        return care.model_copy(update={"enabled": False, "scale_rewards": "none"}), "dr_grpo"
    if arm == "care":
        return care.model_copy(update={"enabled": True}), "token_mean"
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")


def arm_config(
    out: Path, preset: Any, model: Path, harness: Any, *, seed: int, steps: int, care: Any,
    loss_type: str,
) -> Any:  # fmt: skip
    from qpa.loop.stages import rl_config

    config = rl_config(out, preset, model, harness, seed=seed, care=care.enabled)
    update: dict[str, Any] = {
        "steps": steps,
        "care": care,
        "loss": config.loss.model_copy(update={"loss_type": loss_type}),
        "name": "care-ablation",
    }
    try:
        from qpa.api.v1alpha1 import TaskSampling  # type: ignore[attr-defined]
    except ImportError:  # a tree without task sampling settings draws uniformly anyway
        TaskSampling = None
    if TaskSampling is not None and "sampling" in type(config).model_fields:
        # uniform draws for every arm: learnability sampling drops all-success groups, which
        # are exactly where the efficiency reward and the success anchor act
        update["sampling"] = TaskSampling(strategy="uniform")
    return config.model_copy(update=update)


def tier_shares(metrics_path: Path) -> dict[str, float]:
    """Share of the run's groups per CARE tier, from its metrics (`care_tiers` per step)."""
    counts: Counter[str] = Counter()
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            for tier, n in (record.get("care_tiers") or {}).items():
                counts[tier] += float(n)
    total = sum(counts.values())
    return {t: round(n / total, 4) for t, n in sorted(counts.items())} if total else {}


# ----------------------------------------------------------------------------- 3. weights


def sample_groups(config: Any, tasks: Sequence[Any], groups: int) -> list[list[dict[str, Any]]]:
    """`groups` groups of k sampled episodes per task, as the RL stage samples them."""
    from qpa.train.care import Outcome
    from qpa.train.rl import RLTrainer

    trainer = RLTrainer(config, tasks=list(tasks))
    try:
        out: list[list[dict[str, Any]]] = []
        for round_ in range(groups):
            episodes = trainer.rollout(list(tasks), step=round_)
            by_group: dict[int, list[Any]] = {}
            for e in episodes:
                by_group.setdefault(e.group, []).append(e)
            for members in by_group.values():
                members.sort(key=lambda e: e.sample)
                outcomes = [Outcome.of(e.trajectory) for e in members]
                out.append([o.__dict__ | {"skipped": skipped_calls(e.trajectory)}
                            for o, e in zip(outcomes, members, strict=True)])  # fmt: skip
        return out
    finally:
        trainer.close()


def push_table(
    groups: Sequence[Sequence[dict[str, Any]]], candidates: Sequence[tuple[float, float, float]],
    preset: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """Per candidate (token weight, call weight, high threshold): tier share and pushes."""
    from qpa.api.v1alpha1 import CareSettings
    from qpa.train.care import Outcome, care_group, vanilla_group

    rows = []
    for w_tok, w_call, high in candidates:
        care = CareSettings.model_validate(
            preset.rl.care.model_copy(
                update={"token_weight": w_tok, "call_weight": w_call,
                        "high_success_threshold": high}
            ).model_dump()
        )  # fmt: skip
        tiers: Counter[str] = Counter()
        saturated: dict[str, list[float]] = {"care": [], "efficiency": []}
        mixed: dict[str, list[float]] = {"care": [], "efficiency": []}
        for raw in groups:
            group = [
                Outcome(
                    success=m["success"],
                    progress=m["progress"],
                    output_tokens=m["output_tokens"],
                    tool_calls=m["tool_calls"],
                )
                for m in raw
            ]
            results = {
                "care": care_group(group, care),
                "efficiency": vanilla_group(group, care, tier="efficiency_refinement"),
            }
            tiers[results["care"].tier] += 1
            wins = sum(o.success for o in group)
            for arm, result in results.items():
                if wins == len(group):
                    saturated[arm] += [abs(a) for a in result.advantages]
                elif wins:
                    mixed[arm] += [abs(a) for a in result.advantages]

        def share(arm: str, saturated: dict[str, list[float]] = saturated,
                  mixed: dict[str, list[float]] = mixed) -> float | None:  # fmt: skip
            if not saturated[arm] or not mixed[arm]:
                return None
            return statistics.fmean(saturated[arm]) / statistics.fmean(mixed[arm])

        rows.append(
            {
                "token_weight": w_tok,
                "call_weight": w_call,
                "high": high,
                "max_cost": round(care.max_cost, 4),
                "groups": len(groups),
                "efficiency_tier_share": tiers["efficiency_refinement"] / max(1, len(groups)),
                "care_push": share("care"),
                "efficiency_grpo_push": share("efficiency"),
            }
        )
    return rows


#: The efficiency push wanted in all-success groups, as a share of a success/failure push:
#: large enough to move token and call counts, well below what an outcome difference gets.
TARGET_PUSH = 0.25
#: The least share of groups the efficiency tier should see to be worth its name.
MIN_TIER_SHARE = 0.2


def choose_weights(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate whose CARE push is closest to `TARGET_PUSH` among those whose efficiency
    tier holds >= `MIN_TIER_SHARE` of the groups (all candidates when none does); ties go to
    the smaller cost. None when no candidate saw an all-success group."""
    scored = [r for r in rows if r["care_push"] is not None]
    if not scored:
        return None
    wide = [r for r in scored if r["efficiency_tier_share"] >= MIN_TIER_SHARE] or scored
    return min(wide, key=lambda r: (abs(r["care_push"] - TARGET_PUSH), r["max_cost"], -r["high"]))


# ----------------------------------------------------------------------------- 4. the table


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def ablation_table(
    results: dict[str, dict[int, list[dict[str, Any]]]], seeds: Sequence[int]
) -> list[dict[str, Any]]:
    """One row per arm (see the module doc); `results[arm][seed]` = test records."""
    from qpa.bench.stats import mcnemar_exact, wilson_interval

    arms = [a for a in ARMS if a in results]
    common: dict[int, set[str]] = {}
    for seed in seeds:
        solved = [{r["task"] for r in results[a][seed] if r["success"]} for a in arms]
        common[seed] = set.intersection(*solved) if solved else set()
    rows = []
    for arm in arms:
        flat = [r for seed in seeds for r in results[arm][seed]]
        wins = sum(r["success"] for r in flat)
        low, high = wilson_interval(wins, len(flat))
        per_seed = [
            sum(r["success"] for r in results[arm][s]) / max(1, len(results[arm][s])) for s in seeds
        ]
        shared = [r for s in seeds for r in results[arm][s] if r["task"] in common[s]]
        row: dict[str, Any] = {
            "arm": arm,
            "label": LABELS[arm],
            "episodes": len(flat),
            "success": wins / max(1, len(flat)),
            "success_ci": [low, high],
            "success_by_seed": per_seed,
            "success_sd": _mean_sd(per_seed)[1],
            "common_tasks": len(shared),
            "output_tokens_common": (
                statistics.fmean(r["output_tokens"] for r in shared) if shared else None
            ),
            "tool_calls_common": (
                statistics.fmean(r["tool_calls"] for r in shared) if shared else None
            ),
            "skipped_calls_per_task": statistics.fmean(r["skipped_calls"] for r in flat),
            "skipped_calls_total": sum(r["skipped_calls"] for r in flat),
            "skipped_calls_solved": sum(r["skipped_calls"] for r in flat if r["success"]),
        }
        if arm != "care" and "care" in results:
            pairs = [
                (r["success"], c["success"])
                for s in seeds
                for r, c in zip(
                    sorted(results[arm][s], key=lambda r: r["task"]),
                    sorted(results["care"][s], key=lambda r: r["task"]),
                    strict=True,
                )
            ]
            test = mcnemar_exact([p[0] for p in pairs], [p[1] for p in pairs])
            row["p_vs_care"] = test.p_value
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", type=Path, required=True, help="a finished `qpa loop` folder")
    parser.add_argument("--out", type=Path, required=True, help="the ablation's folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--steps", type=int, default=12, help="RL steps per arm and seed")
    parser.add_argument("--validation", type=int, default=20, help="validation tasks/template")
    parser.add_argument("--test", type=int, default=50, help="test tasks per template")
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--easiest", type=int, default=2, help="templates SFT continues on")
    parser.add_argument(
        "--continue-on",
        nargs="+",
        default=None,
        help="continue SFT on these templates without measuring the loop's checkpoint first",
    )
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--sft-rounds", type=int, default=2)
    parser.add_argument("--groups", type=int, default=2, help="sampled groups/validation task")
    parser.add_argument("--token-weight", type=float, default=None)
    parser.add_argument("--call-weight", type=float, default=None)
    parser.add_argument("--low", type=float, default=None)
    parser.add_argument("--high", type=float, default=None)
    parser.add_argument("--tune-only", action="store_true", help="stop after step 3")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from qpa.harness.agent import HarnessConfig
    from qpa.loop.presets import get_preset
    from qpa.loop.stages import (
        quiet_libraries,
        read_marker,
        read_task_file,
        seed_everything,
        stage_seed,
    )
    from qpa.train.rl import run_rl

    console = Console(width=max(Console().width, 160))
    quiet_libraries()
    loop, out = args.loop.resolve(), args.out.resolve()
    saved = _read(loop / "preset.json")
    preset = get_preset(saved["name"], seed=saved["seed"])
    markers = {n: read_marker(loop, n) for n in ("sft", "harness_revision", "tasks", "round2")}
    missing = [n for n, m in markers.items() if m is None]
    if missing:
        raise SystemExit(f"{loop}: stages {', '.join(missing)} have not finished")
    sft_dir = loop / markers["sft"]["outputs"]["checkpoint"]  # type: ignore[index]
    harness = HarnessConfig.model_validate(markers["harness_revision"]["outputs"]["harness"])  # type: ignore[index]
    train_pool = read_task_file(loop / markers["tasks"]["outputs"]["train_tasks"])  # type: ignore[index]
    round2 = read_task_file(loop / markers["round2"]["outputs"]["rl_pool"])  # type: ignore[index]
    mixture = loop / read_marker(loop, "mix")["outputs"]["dataset"]  # type: ignore[index]
    started = time.perf_counter()

    # 1. held-out sets
    heldout_path = out / "heldout.json"
    if heldout_path.exists():
        from qpa.contract import Task

        raw = _read(heldout_path)
        heldout = {s: [Task.model_validate(t) for t in ts] for s, ts in raw.items()}
    else:
        heldout = heldout_tasks(
            preset.tasks.templates,
            [*train_pool, *round2],
            per_split={"validation": args.validation, "test": args.test},
            suite=preset.suite,
        )
        _write(
            heldout_path, {s: [t.model_dump(mode="json") for t in ts] for s, ts in heldout.items()}
        )
    console.print(
        f"held-out: {len(heldout['validation'])} validation, {len(heldout['test'])} test tasks "
        f"({len(preset.tasks.templates)} templates, suite seed {HELDOUT_SEED})"
    )

    # 2. templates where efficiency matters, and the start checkpoint
    selection_path = out / "start" / "selection.json"
    if selection_path.exists():
        selection = _read(selection_path)
    else:
        model, rounds = sft_dir, []
        if args.continue_on:
            rates: dict[str, float] = {}
            chosen, easiest = [], list(args.continue_on)
            rounds.append({"checkpoint": str(model), "validation_by_template": None})
        else:
            records = greedy_records(
                model, heldout["validation"], harness, out / "start" / "eval-0", label="sft",
                preset=preset,
            )  # fmt: skip
            rates = by_template(records)
            rounds.append({"checkpoint": str(model), "validation_by_template": rates})
            console.print(f"SFT checkpoint, validation success per template: {rates}")
            chosen = [t for t, r in rates.items() if r >= args.threshold]
            easiest = sorted(rates, key=lambda t: (-rates[t], t))[: args.easiest]
        round_ = 0
        while not chosen and round_ < args.sft_rounds:
            round_ += 1
            console.print(f"no template >= {args.threshold:.0%} yet: SFT continues on {easiest}")
            model = continue_sft(
                model, mixture, easiest, out / "start" / f"sft-{round_}", steps=args.sft_steps,
                preset=preset,
            )  # fmt: skip
            records = greedy_records(
                model, [t for t in heldout["validation"] if template_of(t) in easiest], harness,
                out / "start" / f"eval-{round_}", label=f"sft+{round_}", preset=preset,
            )  # fmt: skip
            rates = by_template(records)
            rounds.append({"checkpoint": str(model), "validation_by_template": rates})
            console.print(f"  round {round_}: validation success per template {rates}")
            chosen = [t for t in easiest if rates.get(t, 0.0) >= args.threshold]
        if not chosen:
            chosen = [t for t in easiest if rates.get(t, 0.0) == max(rates.values())]
            console.print(f"[yellow]no template reached {args.threshold:.0%}; using {chosen}")
        selection = {
            "checkpoint": str(model),
            "templates": sorted(chosen),
            "continued_sft_rounds": len(rounds) - 1,
            "sft_steps_per_round": args.sft_steps,
            "rounds": rounds,
            "threshold": args.threshold,
            "reached": all(rates.get(t, 0.0) >= args.threshold for t in chosen),
        }
        _write(selection_path, selection)
    start = Path(selection["checkpoint"])
    templates = set(selection["templates"])
    validation = [t for t in heldout["validation"] if template_of(t) in templates]
    test = [t for t in heldout["test"] if template_of(t) in templates]
    pool = list({t.id: t for t in [*train_pool, *round2] if template_of(t) in templates}.values())
    console.print(
        f"templates {sorted(templates)} from {start} (validation "
        f"{selection['rounds'][-1]['validation_by_template']}); RL pool {len(pool)} tasks, "
        f"test {len(test)} tasks"
    )

    # 3. the efficiency weights on validation
    tune_path = out / "tune.json"
    care_defaults = preset.rl.care
    if tune_path.exists():
        tune = _read(tune_path)
    else:
        probe, _ = arm_settings(
            "care", preset, token_weight=care_defaults.token_weight,
            call_weight=care_defaults.call_weight, low=care_defaults.low_success_threshold,
            high=care_defaults.high_success_threshold,
        )  # fmt: skip
        config = arm_config(
            out / "tune" / "run", preset, start, harness, seed=stage_seed(0, "tune"),
            steps=1, care=probe, loss_type="token_mean",
        )  # fmt: skip
        seed_everything(stage_seed(0, "tune"))
        groups = sample_groups(config, validation, args.groups)
        candidates = [
            (w_tok, w_call, high)
            for w_tok, w_call in ((0.1, 0.05), (0.2, 0.1), (0.3, 0.15), (0.4, 0.05))
            for high in (0.8, 0.7)
        ]
        tune = {"groups": groups, "candidates": push_table(groups, candidates, preset)}
        _write(tune_path, tune)
    table = Table(title="efficiency weights on validation (sampled groups of the start model)")
    for column in ("w_tok", "w_call", "high", "max cost", "efficiency tier", "CARE push",
                   "eff-GRPO push"):  # fmt: skip
        table.add_column(column, justify="right")
    for row in tune["candidates"]:

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.1%}"

        table.add_row(
            f"{row['token_weight']:g}", f"{row['call_weight']:g}", f"{row['high']:g}",
            f"{row['max_cost']:g}", pct(row["efficiency_tier_share"]), pct(row["care_push"]),
            pct(row["efficiency_grpo_push"]),
        )  # fmt: skip
    console.print(table)
    if args.tune_only:
        return 0

    chosen = choose_weights(tune["candidates"])
    if chosen is None:
        console.print("[yellow]no all-success group on validation: the preset's weights stay")
    else:
        console.print(
            f"chosen on validation: token weight {chosen['token_weight']:g}, call weight "
            f"{chosen['call_weight']:g}, high {chosen['high']:g} (CARE push "
            f"{chosen['care_push']:.1%} of a success/failure push, target {TARGET_PUSH:.0%}; "
            f"efficiency tier {chosen['efficiency_tier_share']:.0%} of groups)"
        )
    tuned = chosen or {
        "token_weight": care_defaults.token_weight,
        "call_weight": care_defaults.call_weight,
        "high": care_defaults.high_success_threshold,
    }

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    weights = {
        "token_weight": pick(args.token_weight, tuned["token_weight"]),
        "call_weight": pick(args.call_weight, tuned["call_weight"]),
        "low": pick(args.low, care_defaults.low_success_threshold),
        "high": pick(args.high, tuned["high"]),
    }
    console.print(f"arms' CARE settings: {weights}")

    # 4. the arms
    results: dict[str, dict[int, list[dict[str, Any]]]] = {a: {} for a in args.arms}
    runs: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            folder = out / "arms" / f"{arm}-seed{seed}"
            summary_path = folder / "summary.json"
            if summary_path.exists():
                summary = _read(summary_path)
                if summary["settings"] != weights or summary["steps"] != args.steps:
                    raise SystemExit(
                        f"{summary_path}: made with {summary['settings']}, {summary['steps']} "
                        f"steps; this run asks {weights}, {args.steps} (use another --out)"
                    )
                results[arm][seed] = summary["test"]
                runs[arm][seed] = summary
                continue
            began = time.perf_counter()
            care, loss_type = arm_settings(arm, preset, **weights)
            run_seed = stage_seed(seed, "rl")
            seed_everything(run_seed)
            config = arm_config(
                folder / "run", preset, start, harness, seed=run_seed, steps=args.steps,
                care=care, loss_type=loss_type,
            )  # fmt: skip
            trained = run_rl(config, tasks=pool)
            if trained.final_dir is None:
                raise RuntimeError(f"{arm} seed {seed}: RL saved no final model")
            records = greedy_records(
                Path(trained.final_dir), test, harness, folder / "test", label=f"{arm}-{seed}",
                preset=preset,
            )  # fmt: skip
            summary = {
                "arm": arm,
                "seed": seed,
                "steps": args.steps,
                "settings": weights,
                "care": care.model_dump(mode="json"),
                "loss_type": loss_type,
                "test": records,
                "rollout_success_by_step": [
                    round(float(h.get("success_rate", 0.0)), 4) for h in trained.history
                ],
                "rollout_output_tokens_by_step": [
                    round(float(h.get("output_tokens_mean", 0.0)), 2) for h in trained.history
                ],
                "tier_shares": tier_shares(folder / "run" / "metrics.jsonl"),
                "seconds": round(time.perf_counter() - began, 1),
            }
            _write(summary_path, summary)
            results[arm][seed] = records
            runs[arm][seed] = summary
            wins = sum(r["success"] for r in records)
            console.print(
                f"  {LABELS[arm]:26s} seed {seed}: test {wins}/{len(records)}, "
                f"{summary['seconds']:.0f} s"
            )

    rows = ablation_table(results, args.seeds)
    _write(out / "table.json", {"weights": weights, "steps": args.steps, "seeds": args.seeds,
                                "templates": sorted(templates), "rows": rows})  # fmt: skip
    title = (
        f"CARE ablation: {len(args.seeds)} seeds x {len(test)} test tasks of "
        f"{', '.join(sorted(templates))}; {args.steps} RL steps per run"
    )
    table = Table(title=title)
    for column in ("arm", "test success [95% CI]", "per seed", "p vs CARE", "tokens/task*",
                   "calls/task*", "skipped calls/task", "skipped (solved)"):  # fmt: skip
        table.add_column(column, justify="left" if column == "arm" else "right")
    for row in rows:

        def num(v: float | None, digits: int = 1) -> str:
            return "n/a" if v is None else f"{v:.{digits}f}"

        table.add_row(
            row["label"],
            f"{row['success']:.1%} [{row['success_ci'][0]:.1%}, {row['success_ci'][1]:.1%}]",
            ", ".join(f"{v:.0%}" for v in row["success_by_seed"]),
            num(row.get("p_vs_care"), 3) if "p_vs_care" in row else "-",
            num(row["output_tokens_common"]),
            num(row["tool_calls_common"], 2),
            num(row["skipped_calls_per_task"], 3),
            str(row["skipped_calls_solved"]),
        )
    console.print(table)
    footnote = (
        f"* on the {rows[0]['common_tasks'] if rows else 0} (seed, task) pairs every arm solved"
    )
    console.print(f"{footnote}; {time.perf_counter() - started:.0f} s")
    (out / "table.md").write_text(markdown_table(rows, title, footnote))
    console.print(f"markdown: {out / 'table.md'}")
    return 0


def markdown_table(rows: Sequence[dict[str, Any]], title: str, footnote: str) -> str:
    """The ablation table as Markdown (what docs/closed-loop.md shows)."""

    def num(v: float | None, digits: int = 1) -> str:
        return "n/a" if v is None else f"{v:.{digits}f}"

    lines = [
        f"{title}:",
        "",
        "| arm | test success [95% CI] | per seed | p vs CARE | output tokens / task* "
        "| tool calls / task* | skipped necessary calls / task | of which in solved tasks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        seeds = ", ".join(f"{v:.0%}" for v in row["success_by_seed"])
        lines.append(
            f"| {row['label']} | {row['success']:.1%} [{row['success_ci'][0]:.1%}, "
            f"{row['success_ci'][1]:.1%}] | {seeds} "
            f"| {num(row.get('p_vs_care'), 3) if 'p_vs_care' in row else '-'} "
            f"| {num(row['output_tokens_common'])} | {num(row['tool_calls_common'], 2)} "
            f"| {num(row['skipped_calls_per_task'], 3)} | {row['skipped_calls_solved']} |"
        )
    return "\n".join([*lines, "", footnote + ".", ""])


if __name__ == "__main__":
    sys.exit(main())
