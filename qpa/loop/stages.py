"""The loop's stages: each a function with its inputs and outputs under `DIR/stages/<name>/`.

A stage reads the settings it needs from the preset and the outputs of the stages it depends on,
writes its artifacts into its own folder and returns a small JSON summary (paths relative to
`DIR`). `run_stage` wraps it with a **done-marker**, `DIR/stages/<name>/done.json`, holding a
hash of the stage's settings, its code version and the hashes of its inputs:

- marker present with the same hash: the stage is skipped and its summary reused;
- marker with another hash (a setting or an input changed): the folder is wiped and the stage
  reruns, and so, through their input hashes, does every stage downstream;
- no marker (first run, or a crash): the stage runs; SFT, RL and collection resume from what the
  crashed attempt left in the folder (checkpoints, uploaded parts) when the hash matches.

Every stage seeds `random`, NumPy and torch from the preset's seed and its own name, so a
second run with the same seed computes the same numbers (on the same machine and thread count).

The stages, in order (`STAGES`):

| stage | what it does |
|---|---|
| `tiny` | tokenizer (BPE + macro tokens for recurring Harness prompt lines), a random Qwen3 |
| `tasks` | round 1: fresh train variants of the curriculum's templates (`qpa.data.generate`) |
| `heldout` | fresh validation and test variants, apart by content from every training task |
| `collect` | oracle, noisy-oracle and recovering-oracle trajectories (`qpa.data.collect`) |
| `curate` | validity, diagnosis, turn flags, dedupe; failures kept (`qpa.data.curate`) |
| `mix` | the SFT mixture, rendered as the Harness prompts (`qpa.data.mix`), gate automatic |
| `eval_untrained` | the random model on the held-out test set |
| `sft` | SFT with turn-level masking (`qpa.train.sft`) |
| `eval_sft` | the SFT model on held-out validation and test (Harness v1), diagnosis of both |
| `harness_revision` | Harness-side failures on validation -> Harness v2 (budgets, tools) |
| `eval_harness` | the SFT model through Harness v2: a new Harness evaluated like a new model |
| `round2` | tasks generated for the validation weaknesses, collected, curated, mixed by weakness |
| `rl` | online RL with CARE from the SFT model through Harness v2 on the round-2 pool |
| `eval_rl` | the RL model on validation and test (Harness v2), diagnosis |
| `eval_recovery` | untrained and SFT models on test with injected errors (`qpa.loop.recovery`) |

This module is the orchestration only: the settings a stage reads, its inputs, its folder and
its summary. The work is done elsewhere: the tiny checkpoint by `qpa.train.warmup`, evaluation
by `qpa.train.greedy` (greedy episodes of a checkpoint) and `qpa.bench.evaluate` (report,
summary), the Harness revision by `qpa.harness.revision`, data by `qpa.data`, training by
`qpa.train.sft` and `qpa.train.rl`. `curriculum`, `train_rl` and the marker helpers are public:
`benchmarks/care_ablation.py` reuses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qpa.contract import CAPABILITIES, Split, Task, Trajectory
from qpa.harness.agent import HarnessConfig
from qpa.loop.presets import LoopPreset
from qpa.loop.recovery import stage_eval_recovery

if TYPE_CHECKING:
    from qpa.data.mix import Item

STAGE_VERSION = 1
"""Bumped when a stage's code changes what it computes (part of every stage hash)."""
MARKER = "done.json"
STARTED = "started.json"
LOG = "stage.log"


# =========================================================================== plumbing


class StageError(RuntimeError):
    """A stage cannot run (the message names the stage and what is missing)."""


@dataclass
class StageContext:
    """What a running stage sees: the run folder, the preset, its inputs' summaries."""

    root: Path
    preset: LoopPreset
    name: str
    inputs: dict[str, dict[str, Any]]
    log: Callable[[str], None] = print

    @property
    def dir(self) -> Path:
        return self.root / "stages" / self.name

    @property
    def seed(self) -> int:
        if self.name == "rl" and self.preset.rl.seed is not None:
            return stage_seed(self.preset.rl.seed, self.name)
        return stage_seed(self.preset.seed, self.name)

    def path(self, relative: str) -> Path:
        """A path a summary recorded (relative to the run folder)."""
        return self.root / relative

    def rel(self, path: Path) -> str:
        return os.path.relpath(path, self.root)

    def output(self, stage: str, key: str) -> Any:
        try:
            return self.inputs[stage][key]
        except KeyError:
            raise StageError(f"stage {self.name}: input {stage}.{key} is missing") from None


@dataclass(frozen=True)
class Stage:
    """One step of the loop: name, inputs (other stages), the preset sections it reads."""

    name: str
    title: str
    deps: tuple[str, ...]
    sections: tuple[str, ...]
    run: Callable[[StageContext], dict[str, Any]]


@dataclass
class StageResult:
    """How a stage ended in this run: ran or skipped, its summary, its time."""

    name: str
    status: str  # "ran" | "skipped"
    key: str
    outputs: dict[str, Any]
    elapsed_s: float
    ran_elapsed_s: float


def stage_seed(seed: int, name: str) -> int:
    """A stage's seed: the run's seed and the stage's name, hashed (stable across runs)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seed `random`, NumPy and torch (when installed)."""
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % (2**32))
    with contextlib.suppress(ImportError):
        import torch

        torch.manual_seed(seed)


def stage_key(stage: Stage, preset: LoopPreset, input_keys: Mapping[str, str]) -> str:
    """The hash a done-marker must hold for the stage to be skipped."""
    payload = {
        "stage": stage.name,
        "version": STAGE_VERSION,
        "seed": preset.seed,
        "suite": preset.suite,
        "settings": preset.section(*stage.sections),
        "inputs": dict(sorted(input_keys.items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_marker(root: Path, name: str) -> dict[str, Any] | None:
    path = root / "stages" / name / MARKER
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _captured(log_path: Path) -> Iterator[None]:
    """Send what libraries print (trainer logs, progress bars) to the stage's log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "a", encoding="utf-8") as stream,
        contextlib.redirect_stdout(stream),
        contextlib.redirect_stderr(stream),
    ):
        yield


def quiet_libraries() -> None:
    """Silence the chattiest library loggers (transformers, datasets) for the run."""
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        from datasets.utils.logging import disable_progress_bar, set_verbosity_error

        disable_progress_bar()
        set_verbosity_error()


def run_stage(
    stage: Stage,
    root: Path,
    preset: LoopPreset,
    done: Mapping[str, StageResult],
    *,
    log: Callable[[str], None] = print,
    capture: bool = True,
) -> StageResult:
    """Run `stage` unless its done-marker holds the same hash; see the module docstring."""
    missing = [d for d in stage.deps if d not in done]
    if missing:
        raise StageError(f"stage {stage.name}: inputs {', '.join(missing)} have not run")
    key = stage_key(stage, preset, {d: done[d].key for d in stage.deps})
    folder = root / "stages" / stage.name
    marker = read_marker(root, stage.name)
    if marker is not None and marker.get("key") == key:
        return StageResult(
            stage.name,
            "skipped",
            key,
            dict(marker.get("outputs") or {}),
            0.0,
            float(marker.get("elapsed_s") or 0.0),
        )
    started = _read_started(folder)
    if marker is not None or (started is not None and started != key):
        shutil.rmtree(folder, ignore_errors=True)  # stale: another setting or another input
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / STARTED, {"key": key, "started_at": datetime.now(UTC).isoformat()})
    context = StageContext(
        root=root,
        preset=preset,
        name=stage.name,
        inputs={d: done[d].outputs for d in stage.deps},
        log=log,
    )
    seed_everything(context.seed)
    clock = time.perf_counter()
    if capture:
        with _captured(folder / LOG):
            outputs = stage.run(context)
    else:
        outputs = stage.run(context)
    elapsed = round(time.perf_counter() - clock, 3)  # as the marker keeps it
    _write_json(
        folder / MARKER,
        {
            "stage": stage.name,
            "key": key,
            "inputs": {d: done[d].key for d in stage.deps},
            "settings": preset.section(*stage.sections),
            "outputs": outputs,
            "elapsed_s": elapsed,
            "finished_at": datetime.now(UTC).isoformat(),
        },
    )
    return StageResult(stage.name, "ran", key, outputs, elapsed, elapsed)


def _read_started(folder: Path) -> str | None:
    try:
        data = json.loads((folder / STARTED).read_text())
    except (OSError, ValueError):
        return None
    key = data.get("key") if isinstance(data, dict) else None
    return key if isinstance(key, str) else None


# =========================================================================== tasks


def curriculum(preset: LoopPreset, split: str) -> list[Task]:
    """The canonical tasks of the curriculum's templates in `split` (the loop trains on the
    `train` split; it evaluates on the `heldout` stage's sets, not on these)."""
    from qpa.envs.sandbox.suite import generate_suite

    wanted = set(preset.tasks.templates)
    unknown = wanted - {t.template for t in generate_suite(preset.suite)}
    if unknown:
        raise StageError(f"preset {preset.name}: unknown templates {', '.join(sorted(unknown))}")
    return [t for t in generate_suite(preset.suite) if t.split == split and t.template in wanted]


HELDOUT_SPLITS: tuple[Split, ...] = ("validation", "test")
HELDOUT_SEED = 3
"""Seed streams: round 1 generates with `1 + 1000 * seed`, round 2 with `2 + ...`, the
held-out sets with `3 + ...` (and their own split names, which the task seeds hash)."""
_CONTENT_FIELDS = {"suite", "template", "instruction", "verifier", "reference_plan"}


def task_content_hash(task: Task) -> str:
    """A hash of what a task asks and what counts as done: its template, instruction, verifier
    and reference plan (not its id, split, seed, source or lineage, nor the world's filler or
    memory distractors). Two tasks with the same hash have the same answer, so a held-out task
    apart from training by it cannot be solved by recalling a trained one."""
    data = task.model_dump(mode="json", include=_CONTENT_FIELDS)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def make_heldout(
    preset: LoopPreset, training: Iterable[Task]
) -> tuple[dict[str, list[Task]], dict[str, Any]]:
    """Fresh validation and test variants of every curriculum template (`per_template` each,
    `HeldOutSettings`), executable (the oracle succeeds, the no-op planner fails:
    `qpa.data.generate.executable`) and apart by content from `training`, from the whole
    canonical suite of the templates and from each other. A template whose variants run out
    is an error (a smaller set would quietly decide less)."""
    from qpa.data.generate import executable
    from qpa.envs.sandbox.suite import all_templates, build_task

    settings = preset.heldout
    wanted = {"validation": settings.validation_per_template, "test": settings.test_per_template}
    templates = all_templates()
    seed = HELDOUT_SEED + preset.seed * 1000
    training = list(training)
    canonical = [t for split in ("train", *HELDOUT_SPLITS) for t in curriculum(preset, split)]
    taken = {task_content_hash(t) for t in [*training, *canonical]}
    train_instructions = {t.instruction for t in training}
    sets: dict[str, list[Task]] = {split: [] for split in HELDOUT_SPLITS}
    dropped: Counter[str] = Counter()
    overlap: dict[str, dict[str, int]] = {split: {} for split in HELDOUT_SPLITS}
    for split in HELDOUT_SPLITS:
        for name in preset.tasks.templates:
            count = wanted[split]
            made, index = 0, 0
            while made < count:
                if index >= count * 20 + 20:
                    raise StageError(
                        f"heldout: template {name} gave {made} distinct executable {split} "
                        f"tasks of heldout.{split}_per_template={count} in {index} tries"
                    )
                task = build_task(templates[name], split, index, seed)
                index += 1
                digest = task_content_hash(task)
                if digest in taken:
                    dropped["same content as another task"] += 1
                    continue
                task = task.model_copy(
                    update={
                        "source": "heldout",
                        "lineage": {
                            "generator": "qpa.loop.stages.make_heldout",
                            "template": name,
                            "suite_seed": seed,
                            "index": index - 1,
                            "content_sha256": digest,
                        },
                    }
                )
                problem = executable(task)
                if problem:
                    dropped[problem] += 1
                    continue
                taken.add(digest)
                sets[split].append(task)
                made += 1
                if task.instruction in train_instructions:
                    overlap[split][name] = overlap[split].get(name, 0) + 1
    summary = {
        "seed": seed,
        "per_template": wanted,
        "dropped": dict(sorted(dropped.items())),
        "excluded_tasks": len(taken) - sum(len(v) for v in sets.values()),
        # Apart by content; a template with few instructions (the memory ones: the values
        # live in the user's memory) repeats a training instruction with another answer.
        "same_instruction_as_training": overlap,
    }
    return sets, summary


def read_heldout(ctx: StageContext, split: str) -> list[Task]:
    """The held-out `split` (validation or test) the `heldout` stage wrote."""
    return read_task_file(ctx.path(ctx.output("heldout", split)))


def read_task_file(path: Path) -> list[Task]:
    from qpa.contract import read_tasks

    return list(read_tasks(path))


def write_jsonl(path: Path, items: Iterable[Any]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as stream:
        for item in items:
            stream.write(item.model_dump_json() + "\n")
            count += 1
    return count


def read_trajectories(path: Path) -> list[Trajectory]:
    from qpa.contract import read_trajectories as read

    return list(read(path))


# =========================================================================== the tiny model


def harness_ladder(preset: LoopPreset, rungs: int = 3) -> list[HarnessConfig]:
    """The first Harness opened step by step to the revision's caps (tool cap, adapter budget,
    memory k), the last rung the widest: what a revision can become. Macro lines are mined from
    every rung, and the SFT mixture renders each trajectory for one of v1 and the rungs, so a
    revised Harness is no new prompt (a tiny model trained on two prompt sizes fails on a
    third in between). The budget grows geometrically: revisions are small steps."""
    first, caps = preset.harness, preset.revision
    tools = first.max_tools or caps.max_tools_cap
    budget = max(first.token_budget, 50)
    ladder: list[HarnessConfig] = []
    for rung in range(1, rungs + 1):
        share = rung / rungs
        rung_budget = budget * (max(caps.token_budget_cap, budget) / budget) ** share
        ladder.append(
            first.model_copy(
                update={
                    "version": f"{first.version}-rung{rung}",
                    "token_budget": max(first.token_budget, round(rung_budget / 50) * 50),
                    "max_tools": _between(tools, caps.max_tools_cap, share),
                    "memory_k": _between(first.memory_k, caps.memory_k_cap, share),
                }
            )
        )
    return ladder


def _between(start: int, cap: int, share: float) -> int:
    return max(start, round(start + (cap - start) * share))


def make_checkpoint(
    preset: LoopPreset, out: Path, *, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The tiny checkpoint of `preset` (`qpa.train.warmup.build_checkpoint`): its tokenizer's
    corpus holds the suite's train/validation text and the oracle conversations of a sample of
    the curriculum's train split, rendered for the first Harness and every rung of its ladder."""
    from qpa.train.warmup import build_checkpoint, oracle_trajectories

    train = curriculum(preset, "train")
    rng = random.Random(stage_seed(preset.seed, "tiny-corpus"))
    picked = rng.sample(train, min(preset.tokenizer.conversations, len(train)))
    trajectories = [t for t in oracle_trajectories(picked) if t.success]
    return build_checkpoint(
        out,
        trajectories=trajectories,
        harnesses=[preset.harness, *harness_ladder(preset)],
        tokenizer_settings=preset.tokenizer,
        model_config=preset.model,
        warmup_settings=preset.warmup,
        corpus_seed=preset.seed,
        warmup_seed=stage_seed(preset.seed, "tiny-warmup"),
        log=log,
    )


# =========================================================================== evaluation


def _evaluate_splits(
    ctx: StageContext,
    model_dir: Path,
    harness: HarnessConfig,
    label: str,
    splits: Sequence[str],
) -> dict[str, Any]:
    """Greedy episodes on each held-out split; for the stages of `eval.sampled_stages`, also
    `eval.samples` sampled episodes per test task (`test_sampled`: pass@1 from k samples)."""
    from qpa.train.greedy import evaluate, evaluate_sampled, load_model

    settings = ctx.preset.eval
    loaded = load_model(model_dir)
    outputs: dict[str, Any] = {"model": ctx.rel(model_dir), "harness": harness.model_dump()}
    for split in splits:
        tasks = read_heldout(ctx, split)
        summary = evaluate(
            model_dir,
            tasks,
            harness,
            ctx.dir / split,
            label=label,
            max_new_tokens=ctx.preset.eval.max_new_tokens,
            workers=ctx.preset.eval.workers,
            loaded=loaded,
        )
        summary["report"] = ctx.rel(ctx.dir / split / "report.json")
        summary["trajectories"] = ctx.rel(ctx.dir / split / "trajectories.jsonl")
        outputs[split] = summary
        ctx.log(
            f"{label} on {split}: {summary['success']:.0%} success, "
            f"failures by side {summary['diagnosis']}"
        )
        if split == "test" and settings.samples > 0 and ctx.name in settings.sampled_stages:
            sampled = evaluate_sampled(
                model_dir,
                tasks,
                harness,
                ctx.dir / "test_sampled",
                label=label,
                samples=settings.samples,
                temperature=settings.sample_temperature,
                max_new_tokens=settings.max_new_tokens,
                workers=settings.workers,
                loaded=loaded,
            )
            sampled["report"] = ctx.rel(ctx.dir / "test_sampled" / "report.json")
            sampled["trajectories"] = ctx.rel(ctx.dir / "test_sampled" / "trajectories.jsonl")
            outputs["test_sampled"] = sampled
            ctx.log(
                f"{label} on test, {settings.samples} samples per task at temperature "
                f"{settings.sample_temperature:g}: pass@1 {sampled['pass_at_1']:.1%}"
            )
    return outputs


# =========================================================================== Harness revision


def harness_failures(trajectories_path: Path) -> list[tuple[Task, str]]:
    """(task, cause) of every Harness-side failure among the trajectories."""
    from qpa.diagnose import diagnose

    out: list[tuple[Task, str]] = []
    for trajectory in read_trajectories(trajectories_path):
        found = diagnose(trajectory)
        if found is not None and found.side == "harness":
            out.append((trajectory.task, found.cause))
    return out


# =========================================================================== data helpers


def _automatic_review() -> Any:
    from qpa.data.review import ReviewConfig

    return ReviewConfig(gate="automatic", sample_size=20)


def _generate(
    ctx: StageContext,
    out: Path,
    *,
    count: int,
    per_cell: int,
    seed: int,
    existing: Sequence[Task],
    weakness: Any = None,
    weak_threshold: float = 0.7,
    weak_boost: float = 2.0,
    parents: Sequence[str] = (),
    per_template: bool = False,
    exclude_content: Collection[str] = (),
) -> tuple[list[Task], dict[str, Any]]:
    """Tasks for the curriculum's templates (`plan_generation` + `generate_tasks`), written
    with their plan and an (automatic) review queue to `out`. `per_template`: `count` is per
    template and every template gets its share (`plan_per_template`). A generated task whose
    content hash (`task_content_hash`) is in `exclude_content` (a held-out task) is dropped."""
    from qpa.data.generate import (
        CoverageTarget,
        generate_tasks,
        plan_generation,
        plan_per_template,
        write_generated,
    )
    from qpa.envs.sandbox.suite import all_templates
    from qpa.store import open_store

    templates = {n: t for n, t in all_templates().items() if n in set(ctx.preset.tasks.templates)}
    target = CoverageTarget(
        suite=ctx.preset.suite,
        per_cell=per_cell,
        weak_threshold=weak_threshold,
        weak_boost=weak_boost,
        include_canonical_train=False,
    )
    if per_template:
        plan = plan_per_template(target, count=count, existing=existing, templates=templates)
    else:
        plan = plan_generation(
            target, existing=existing, weakness=weakness, count=count, templates=templates
        )
    result = generate_tasks(plan, seed=seed, existing=existing, suite=ctx.preset.suite)
    if exclude_content:
        kept = [t for t in result.tasks if task_content_hash(t) not in exclude_content]
        result.dropped += [
            {"task": t.id, "reason": "same content as a held-out task"}
            for t in result.tasks
            if task_content_hash(t) in exclude_content
        ]
        result.tasks = kept
    store = open_store(out)
    manifest = write_generated(
        store,
        result,
        target=target,
        parents=list(parents),
        review=_automatic_review(),
        name=out.name,
    )
    picks = Counter(p.template for p in plan.picks)
    summary = {
        "tasks": len(result.tasks),
        "dropped": len(result.dropped),
        "picks_by_template": dict(sorted(picks.items())),
        "by_capability": result.summary()["by_capability"],
        "reasons": plan.reasons,
        "manifest": ctx.rel(out / "manifest.json"),
        "tasks_file": ctx.rel(out / "tasks.jsonl"),
        "lineage_tasks_sha256": manifest.lineage.tasks_sha256,
    }
    return result.tasks, summary


def _collect(
    tasks: Sequence[Task],
    out: Path,
    planner: str,
    *,
    samples: int,
    noise: float,
    seed: int,
    concurrency: int,
    max_turns: int,
    recovery: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`recovery`: `recovering`, `mistake_rate`, `transient_error_rate` of `CollectConfig`."""
    from qpa.data.collect import collect
    from qpa.harness.factory import PlannerSpec

    spec = PlannerSpec(name=planner, noise=noise, seed=seed)
    result = collect(
        list(tasks),
        spec,
        **dict(recovery or {}),
        samples_per_task=samples,
        out=str(out),
        concurrency=concurrency,
        spool_dir=out.parent / f".spool-{out.name}",
        max_turns=max_turns,
        flush_timeout_s=60.0,
        name=out.name,
    )
    if not result.complete:
        raise StageError(f"collection into {out} did not complete")
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest.get("counts", {})
    return {
        "trajectories": int(counts.get("trajectories", result.total)),
        "successes": int(counts.get("successes", result.successes)),
    }


def _curate(inputs: Sequence[Path], out: Path) -> dict[str, Any]:
    """Curate the trajectories of `inputs` together. Episodes of different collections share
    ids (`<task>#<sample>`); a later collection's are renamed `<id>~<folder>` so curation keeps
    both instead of rejecting the second as a duplicate."""
    from qpa.data.curate import curate, load_trajectories, write_curated
    from qpa.store import open_store

    trajectories: list[Trajectory] = []
    seen: set[str] = set()
    for path in inputs:
        for trajectory in load_trajectories([str(path)]):
            if trajectory.id in seen:
                trajectory = trajectory.model_copy(update={"id": f"{trajectory.id}~{path.name}"})
            seen.add(trajectory.id)
            trajectories.append(trajectory)
    result = curate(trajectories)
    write_curated(
        open_store(out),
        result,
        inputs=[str(p) for p in inputs],
        review=_automatic_review(),
        name=out.name,
    )
    return result.summary()


def _mix(
    ctx: StageContext,
    curated: Sequence[Path],
    out: Path,
    *,
    target_size: int,
    harness: HarnessConfig,
    include_failures: bool,
    harness_variants: Sequence[HarnessConfig] = (),
    report: Any = None,
    report_ref: str | None = None,
    weak_threshold: float = 0.7,
    weak_boost: float = 2.0,
) -> Any:
    from qpa.data.mix import Adaptive, MixConfig, Weights, mix
    from qpa.data.review import publish
    from qpa.store import open_store

    settings = ctx.preset.mix
    config = MixConfig(
        target_size=target_size,
        seed=ctx.seed,
        weights=Weights(
            capability=dict(settings.capability_weights),
            difficulty=dict(settings.difficulty_weights),
            source=dict(settings.source_weights),
        ),
        adaptive=Adaptive(weak_threshold=weak_threshold, weak_boost=weak_boost),
        include_failures=include_failures,
        harness=harness,
        harness_variants=list(harness_variants),
        value_swaps=settings.value_swaps,
        day_swaps=settings.day_swaps,
    )
    store = open_store(out)
    result = mix(
        store,
        [str(p) for p in curated],
        config,
        report=report,
        report_ref=report_ref,
        review=_automatic_review(),
        name=out.name,
    )
    publish(store, _automatic_review())
    return result


# =========================================================================== the stages


def stage_tiny(ctx: StageContext) -> dict[str, Any]:
    out = ctx.dir / "checkpoint"
    manifest = make_checkpoint(ctx.preset, out, log=ctx.log)
    return {"checkpoint": ctx.rel(out), **manifest}


def stage_tasks(ctx: StageContext) -> dict[str, Any]:
    canonical = curriculum(ctx.preset, "train")
    settings = ctx.preset.tasks
    generated, summary = _generate(
        ctx,
        ctx.dir / "generated",
        count=settings.generated_per_template,
        per_cell=settings.per_cell,
        seed=1 + ctx.preset.seed * 1000,
        existing=canonical,
        per_template=True,
    )
    train = [*canonical, *generated]
    write_jsonl(ctx.dir / "train_tasks.jsonl", train)
    ctx.log(f"tasks: {len(canonical)} canonical + {len(generated)} generated train tasks")
    return {
        "train_tasks": ctx.rel(ctx.dir / "train_tasks.jsonl"),
        "canonical": len(canonical),
        "generated": summary,
        "count": len(train),
    }


def stage_heldout(ctx: StageContext) -> dict[str, Any]:
    training = read_task_file(ctx.path(ctx.output("tasks", "train_tasks")))
    sets, summary = make_heldout(ctx.preset, training)
    files: dict[str, Any] = {}
    for split, tasks in sets.items():
        path = ctx.dir / f"{split}.jsonl"
        write_jsonl(path, tasks)
        files[split] = {
            "file": ctx.rel(path),
            "tasks": len(tasks),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "by_template": dict(sorted(Counter(t.template or "" for t in tasks).items())),
            "task_hashes": {t.id: task_content_hash(t) for t in tasks},
        }
    manifest = {
        "kind": "heldout",
        "suite": ctx.preset.suite,
        "templates": list(ctx.preset.tasks.templates),
        "apart_from": ctx.rel(ctx.path(ctx.output("tasks", "train_tasks"))),
        **summary,
        "splits": files,
    }
    _write_json(ctx.dir / "manifest.json", manifest)
    ctx.log(
        "heldout: "
        + ", ".join(f"{len(v)} {k}" for k, v in sets.items())
        + f" tasks, apart from {summary['excluded_tasks']} training and canonical tasks"
    )
    return {
        **{split: files[split]["file"] for split in sets},
        "manifest": ctx.rel(ctx.dir / "manifest.json"),
        "counts": {split: len(v) for split, v in sets.items()},
        "sha256": {split: files[split]["sha256"] for split in sets},
        "same_instruction_as_training": summary["same_instruction_as_training"],
    }


def stage_collect(ctx: StageContext) -> dict[str, Any]:
    tasks = read_task_file(ctx.path(ctx.output("tasks", "train_tasks")))
    settings = ctx.preset.collect
    outputs: dict[str, Any] = {}
    runs = [
        ("oracle", "oracle", settings.oracle_samples),
        ("noisy", "noisy", settings.noisy_samples),
        ("recovering", "oracle", settings.recovering_samples),
    ]
    for name, planner, samples in runs:
        if samples < 1:
            continue
        out = ctx.dir / name
        recovery = (
            {
                "recovering": True,
                "mistake_rate": settings.mistake_rate,
                "transient_error_rate": settings.transient_error_rate,
            }
            if name == "recovering"
            else None
        )
        counts = _collect(
            tasks,
            out,
            planner,
            samples=samples,
            noise=settings.noise,
            seed=ctx.seed,
            concurrency=settings.concurrency,
            max_turns=settings.max_turns,
            recovery=recovery,
        )
        outputs[name] = {"uri": ctx.rel(out), **counts}
        ctx.log(f"collect {name}: {counts['successes']}/{counts['trajectories']} succeeded")
    return outputs


def stage_curate(ctx: StageContext) -> dict[str, Any]:
    inputs = [
        ctx.path(ctx.inputs["collect"][p]["uri"])
        for p in ("oracle", "noisy", "recovering")
        if p in ctx.inputs["collect"]
    ]
    summary = _curate(inputs, ctx.dir / "curated")
    ctx.log(
        f"curate: {summary['successes']} successes, {summary['failures']} failures kept "
        f"({summary['failures_by_side']})"
    )
    return {"curated": ctx.rel(ctx.dir / "curated"), **summary}


def stage_mix(ctx: StageContext) -> dict[str, Any]:
    settings = ctx.preset.mix
    out = ctx.dir / "mixture"
    result = _mix(
        ctx,
        [ctx.path(ctx.output("curate", "curated"))],
        out,
        target_size=settings.target_size,
        harness=ctx.preset.harness,
        include_failures=settings.include_failures,
        harness_variants=harness_ladder(ctx.preset) if settings.harness_variants else [],
    )
    manifest = result.manifest
    ctx.log(f"mix: {result.rows} rows from {manifest.counts.get('drawn', 0)} trajectories")
    return {
        "dataset": ctx.rel(out / "dataset"),
        "manifest": ctx.rel(out / "manifest.json"),
        "rows": result.rows,
        "weights": dict(manifest.weights),
        "counts": dict(manifest.counts),
        "harness_version": ctx.preset.harness.version,
    }


def stage_eval_untrained(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("tiny", "checkpoint"))
    return _evaluate_splits(ctx, model_dir, ctx.preset.harness, "untrained", ["test"])


def stage_sft(ctx: StageContext) -> dict[str, Any]:
    import torch

    from qpa.train.config import CheckpointSettings, MetricsSettings, SFTConfig
    from qpa.train.precision import resolve_bf16
    from qpa.train.sft import train_sft

    settings = ctx.preset.sft
    trl: dict[str, Any] = {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = resolve_bf16(settings.bf16, device)
    if device == "cpu":
        trl["use_cpu"] = True  # bf16 autocast on CPU needs it
    config = SFTConfig(
        name="loop-sft",
        model=str(ctx.path(ctx.output("tiny", "checkpoint"))),
        dataset=str(ctx.path(ctx.output("mix", "dataset"))),
        output_dir=str(ctx.dir / "run"),
        max_length=settings.max_length,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=settings.warmup,
        max_steps=settings.max_steps,
        seed=ctx.seed,
        bf16=bf16,
        metrics=MetricsSettings(logging_steps=10),
        checkpoint=CheckpointSettings(
            every_steps=settings.checkpoint_every, keep_last=1, resume="auto"
        ),
        trl=trl,
    )
    result = train_sft(config)
    if result.final_dir is None:
        raise StageError("sft: no final model was saved")
    ctx.log(
        f"sft: {result.global_step} steps, loss {result.train_loss:.3f}, "
        f"{result.tokens_per_second:.0f} tokens/s, {'bf16' if bf16 else 'fp32'}"
    )
    return {
        "checkpoint": ctx.rel(Path(result.final_dir)),
        "steps": result.global_step,
        "train_loss": result.train_loss,
        "tokens": result.tokens,
        "tokens_per_second": round(result.tokens_per_second, 1),
        "bf16": bf16,
        "resumed_from": result.resumed_from,
        "metrics": ctx.rel(Path(result.metrics_path)) if result.metrics_path else None,
        "last_loss": _last_loss(Path(result.metrics_path)) if result.metrics_path else None,
        "data": result.stats.model_dump(),
    }


def _last_loss(path: Path) -> float | None:
    last: float | None = None
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(line).get("loss")
                if isinstance(value, (int, float)):
                    last = round(float(value), 4)
    return last


def stage_eval_sft(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("sft", "checkpoint"))
    return _evaluate_splits(ctx, model_dir, ctx.preset.harness, "sft", ["validation", "test"])


def stage_harness_revision(ctx: StageContext) -> dict[str, Any]:
    from qpa.diagnose import skills_needed
    from qpa.harness.revision import revise_harness

    current = ctx.preset.harness
    validation = ctx.inputs["eval_sft"]["validation"]
    failures = harness_failures(ctx.path(validation["trajectories"]))
    revision = revise_harness(current, failures, ctx.preset.revision, skills_needed=skills_needed)
    path = ctx.dir / f"{revision.config.version}.yaml"
    import yaml

    path.write_text(
        "# Harness revision written by `qpa loop` from the validation diagnosis\n"
        + yaml.safe_dump(revision.config.model_dump(mode="json"), sort_keys=False)
    )
    for change in revision.changes:
        ctx.log(
            f"harness: {change['setting']} {change['from']} -> {change['to']} "
            f"({change['cause']} on {change['tasks']} failed validation tasks)"
        )
    return {
        "from": current.version,
        "to": revision.config.version,
        "harness": revision.config.model_dump(mode="json"),
        "config_file": ctx.rel(path),
        "changes": revision.changes,
        "unaddressed": revision.unaddressed,
        "harness_failures": len(failures),
        "harness_failures_by_cause": dict(sorted(Counter(c for _, c in failures).items())),
    }


def revised_harness(ctx: StageContext) -> HarnessConfig:
    return HarnessConfig.model_validate(ctx.output("harness_revision", "harness"))


def stage_eval_harness(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("sft", "checkpoint"))
    harness = revised_harness(ctx)
    return _evaluate_splits(ctx, model_dir, harness, "sft", ["validation", "test"])


def stage_round2(ctx: StageContext) -> dict[str, Any]:
    from qpa.bench.gate import load_report
    from qpa.data.generate import Weakness

    settings = ctx.preset.round2
    harness = revised_harness(ctx)
    report_ref = ctx.path(ctx.inputs["eval_harness"]["validation"]["report"])
    report = load_report(report_ref)
    weakness = Weakness.from_report(report, source=str(report_ref))
    # New variants are unique against the canonical suite only, not round 1's: a template's
    # variant space can be small (a memory task's values come from the user's memory), and
    # round 1 may have used all of it. The generator never reproduces a test-split task.
    # The held-out sets are kept out by content (`exclude_content`).
    existing = curriculum(ctx.preset, "train")
    heldout = {task_content_hash(t) for split in HELDOUT_SPLITS for t in read_heldout(ctx, split)}
    generated, summary = _generate(
        ctx,
        ctx.dir / "generated",
        count=settings.count,
        per_cell=settings.per_cell,
        seed=2 + ctx.preset.seed * 1000,
        existing=existing,
        weakness=weakness,
        weak_threshold=settings.weak_threshold,
        weak_boost=settings.weak_boost,
        parents=[str(report_ref)],
        exclude_content=heldout,
    )
    if not generated:
        raise StageError("round2: no task was generated")
    collected = _collect(
        generated,
        ctx.dir / "oracle",
        "oracle",
        samples=1,
        noise=0.0,
        seed=ctx.seed,
        concurrency=ctx.preset.collect.concurrency,
        max_turns=ctx.preset.collect.max_turns,
    )
    curated = _curate([ctx.dir / "oracle"], ctx.dir / "curated")
    result = _mix(
        ctx,
        [ctx.dir / "curated"],
        ctx.dir / "mixture",
        target_size=settings.target_size,
        harness=harness,
        include_failures=False,
        report=report,
        report_ref=str(report_ref),
        weak_threshold=settings.weak_threshold,
        weak_boost=settings.weak_boost,
    )
    pool = _rl_pool(ctx, generated, result.plan.drawn, weakness.template)
    write_jsonl(ctx.dir / "rl_pool.jsonl", pool)
    weights = dict(result.manifest.weights)
    pool_caps = Counter(c for t in pool for c in t.capabilities)
    ctx.log(
        "round 2: validation "
        + ", ".join(f"{c} {s:.0%}" for c, s in weakness.capability.items())
        + " -> mixture weights "
        + ", ".join(
            f"{k.split('.', 1)[1]} x{v:g}"
            for k, v in weights.items()
            if k.startswith("capability.")
        )
    )
    return {
        "validation_report": ctx.rel(report_ref),
        "validation_by_capability": {k: round(v, 6) for k, v in weakness.capability.items()},
        "validation_by_template": {k: round(v, 6) for k, v in weakness.template.items()},
        "generated": summary,
        "collected": collected,
        "curated": {k: v for k, v in curated.items() if isinstance(v, (int, dict))},
        "mixture": ctx.rel(ctx.dir / "mixture" / "manifest.json"),
        "mixture_weights": weights,
        "mixture_reasons": list(result.manifest.reasons)[:50],
        "rl_pool": ctx.rel(ctx.dir / "rl_pool.jsonl"),
        "rl_pool_size": len(pool),
        "rl_pool_by_capability": dict(sorted(pool_caps.items())),
        "rl_pool_by_template": dict(sorted(Counter(t.template or "" for t in pool).items())),
    }


def _rl_pool(
    ctx: StageContext,
    generated: Sequence[Task],
    drawn: Sequence[Item],
    template_success: Mapping[str, float],
) -> list[Task]:
    """Round 2's RL pool (`round2.pool`): the mixture's draws, each as often as it was drawn,
    or (`learnable`) round 1's and round 2's tasks shared out by p(1-p) of each template's
    validation success (no held-out task is in either: both are kept out by content)."""
    from qpa.train.rl.tasks import learnable_pool

    settings = ctx.preset.round2
    if settings.pool == "learnable":
        tasks = read_task_file(ctx.path(ctx.output("tasks", "train_tasks"))) + list(generated)
        return learnable_pool(tasks, template_success, settings.target_size, ctx.seed)
    pool: list[Task] = []
    for item in drawn:
        pool += [item.trajectory.task] * item.copies
    return sorted(pool, key=lambda t: t.id)


def rl_config(
    ctx_dir: Path,
    preset: LoopPreset,
    model: Path,
    harness: HarnessConfig,
    *,
    seed: int,
    care: bool = True,
    name: str = "loop-rl",
) -> Any:
    """The `RLConfig` of the loop's RL stage (also used by `benchmarks/care_ablation.py`)."""
    from qpa.train.config import CheckpointSettings, MetricsSettings
    from qpa.train.rl import (
        CareSettings,
        GenerationSettings,
        LossSettings,
        OptimSettings,
        RLConfig,
    )

    settings = preset.rl
    return RLConfig(
        name=name,
        model=str(model),
        output_dir=str(ctx_dir),
        steps=settings.steps,
        tasks_per_step=settings.tasks_per_step,
        samples_per_task=settings.samples_per_task,
        seed=seed,
        harness=harness,
        generation=GenerationSettings(
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            workers=64,
            max_batch=64,
        ),
        loss=LossSettings(
            clip_high=settings.clip_high,
            beta=settings.beta,
            micro_batch_size=settings.micro_batch_size,
        ),
        optim=OptimSettings(
            learning_rate=settings.learning_rate, warmup_steps=settings.warmup_steps
        ),
        care=CareSettings(
            enabled=care,
            low_success_threshold=settings.care.low_success_threshold,
            high_success_threshold=settings.care.high_success_threshold,
            progress_weight=settings.care.progress_weight,
            format_weight=settings.care.format_weight,
            token_weight=settings.care.token_weight,
            call_weight=settings.care.call_weight,
            success_value=settings.care.success_value,
        ),
        sampling=settings.sampling,
        checkpoint=CheckpointSettings(
            every_steps=settings.checkpoint_every, keep_last=1, resume="auto"
        ),
        metrics=MetricsSettings(logging_steps=1),
    )


def train_rl(
    out: Path,
    preset: LoopPreset,
    model: Path,
    harness: HarnessConfig,
    pool: Sequence[Task],
    *,
    seed: int,
    care: bool = True,
) -> dict[str, Any]:
    """Run RL (CARE or vanilla GRPO) and summarize its history."""
    from qpa.train.rl import run_rl

    config = rl_config(out, preset, model, harness, seed=seed, care=care)
    result = run_rl(config, tasks=list(pool))
    if result.final_dir is None:
        raise StageError("rl: no final model was saved")
    by_step: dict[int, dict[str, Any]] = {}
    metrics_path = out / "metrics.jsonl"
    if metrics_path.exists():  # every step, also those of an interrupted attempt
        for line in metrics_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    by_step[record["step"]] = record
    history = [by_step[k] for k in sorted(by_step)] or [dict(h) for h in result.history]
    tiers: dict[str, float] = defaultdict(float)
    for record in history:
        for tier, share in (record.get("care_tiers") or {}).items():
            tiers[tier] += float(share)

    def series(key: str, digits: int) -> list[float]:
        return [round(float(h.get(key, 0.0)), digits) for h in history]

    return {
        "checkpoint": str(result.final_dir),
        "steps": result.final_step,
        "resumed_from": result.resumed_from,
        "care": care,
        "success_rate_by_step": series("success_rate", 4),
        "progress_by_step": series("progress", 4),
        "output_tokens_by_step": series("output_tokens_mean", 2),
        "reward_by_step": series("reward", 4),
        "advantage_abs_by_step": series("advantage_abs", 4),
        "updated_steps": sum(1 for h in history if float(h.get("micro_batches", 0.0)) > 0),
        "sampling": preset.rl.sampling.model_dump(),
        "groups_dropped_by_step": series("groups_dropped", 0),
        "groups_refilled_by_step": series("groups_refilled", 0),
        "mean_learnability_by_step": series("mean_learnability", 4),
        "care_tier_share": {
            t: round(v / max(1, len(history)), 4) for t, v in sorted(tiers.items())
        },
    }


def stage_rl(ctx: StageContext) -> dict[str, Any]:
    pool = read_task_file(ctx.path(ctx.output("round2", "rl_pool")))
    summary = train_rl(
        ctx.dir / "run",
        ctx.preset,
        ctx.path(ctx.output("sft", "checkpoint")),
        revised_harness(ctx),
        pool,
        seed=ctx.seed,
        care=True,
    )
    summary["checkpoint"] = ctx.rel(Path(summary["checkpoint"]))
    rates = summary["success_rate_by_step"]
    ctx.log(
        f"rl (CARE): {summary['steps']} steps, rollout success "
        f"{rates[0] if rates else 0:.0%} -> {rates[-1] if rates else 0:.0%}, "
        f"{summary['updated_steps']} steps with a gradient, "
        f"{summary['sampling']['strategy']} sampling "
        f"({sum(summary['groups_dropped_by_step']):g} zero-variance groups dropped, "
        f"{sum(summary['groups_refilled_by_step']):g} refilled), "
        f"tier shares {summary['care_tier_share']}"
    )
    return summary


def stage_eval_rl(ctx: StageContext) -> dict[str, Any]:
    model_dir = ctx.path(ctx.output("rl", "checkpoint"))
    return _evaluate_splits(ctx, model_dir, revised_harness(ctx), "rl", ["validation", "test"])


STAGES: tuple[Stage, ...] = (
    Stage(
        "tiny",
        "build the tiny model",
        (),
        ("model", "tokenizer", "warmup", "tasks", "harness", "revision"),
        stage_tiny,
    ),
    Stage("tasks", "generate tasks", (), ("tasks",), stage_tasks),
    Stage("heldout", "held-out validation and test sets", ("tasks",), ("heldout",), stage_heldout),
    Stage(
        "collect", "collect oracle + noisy + recovering", ("tasks",), ("collect",), stage_collect
    ),
    Stage("curate", "curate (keep failures)", ("collect",), (), stage_curate),
    Stage("mix", "mix", ("curate",), ("mix", "harness", "revision"), stage_mix),
    Stage(
        "eval_untrained",
        "evaluate untrained (test)",
        ("tiny", "heldout"),
        ("eval", "harness"),
        stage_eval_untrained,
    ),
    Stage("sft", "SFT", ("tiny", "mix"), ("sft",), stage_sft),
    Stage(
        "eval_sft",
        "evaluate SFT (validation, test)",
        ("sft", "heldout"),
        ("eval", "harness"),
        stage_eval_sft,
    ),
    Stage(
        "harness_revision",
        "diagnose -> Harness revision",
        ("eval_sft",),
        ("harness", "revision"),
        stage_harness_revision,
    ),
    Stage(
        "eval_harness",
        "evaluate Harness v2",
        ("sft", "harness_revision", "heldout"),
        ("eval",),
        stage_eval_harness,
    ),
    Stage(
        "round2",
        "tasks for weaknesses",
        ("tasks", "eval_harness", "harness_revision", "heldout"),
        ("round2", "collect", "mix"),
        stage_round2,
    ),
    Stage("rl", "RL with CARE", ("sft", "round2", "harness_revision"), ("rl",), stage_rl),
    Stage(
        "eval_rl",
        "evaluate RL (validation, test)",
        ("rl", "harness_revision", "heldout"),
        ("eval",),
        stage_eval_rl,
    ),
    Stage(
        "eval_recovery",
        "recovery from injected errors (test)",
        ("tiny", "sft", "heldout"),
        ("eval", "harness", "recovery"),
        stage_eval_recovery,
    ),
)
"""The loop's stages in execution order (each one's inputs come before it)."""


def stage_by_name(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in STAGES)}")


def capabilities_of(preset: LoopPreset) -> list[str]:
    """The capabilities the preset's curriculum covers, in the canonical order."""
    from qpa.envs.sandbox.suite import all_templates

    templates = all_templates()
    covered = {c for name in preset.tasks.templates for c in templates[name].capabilities}
    return [c for c in CAPABILITIES if c in covered]


__all__ = [
    "HELDOUT_SPLITS",
    "MARKER",
    "STAGES",
    "Stage",
    "StageContext",
    "StageError",
    "StageResult",
    "capabilities_of",
    "curriculum",
    "harness_failures",
    "harness_ladder",
    "make_checkpoint",
    "make_heldout",
    "read_heldout",
    "read_marker",
    "rl_config",
    "run_stage",
    "seed_everything",
    "stage_by_name",
    "stage_key",
    "stage_seed",
    "task_content_hash",
    "train_rl",
]
