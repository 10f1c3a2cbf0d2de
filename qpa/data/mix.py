"""The training mixture: composition set by capability, difficulty and source, not raw frequency.

**Strata and weights.** Curated trajectories fall into strata by (capabilities, difficulty,
source). Each stratum's share of the mixture is proportional to its weight, the product of the
configured weights (`weights.capability` — the largest over the task's capabilities —,
`weights.difficulty`, `weights.source`, `weights.env_kind`; 1.0 when not listed), however many
raw trajectories it holds: a stratum with ten trajectories gets as much as one with a thousand
of equal weight (its items are up-sampled, the other's down-sampled).

**Adaptive rules** (with a validation `Report`, and from the curated samples themselves):

- a capability whose validation success is below `adaptive.weak_threshold` is up-weighted by
  `1 + adaptive.weak_boost * gap` (`gap = (threshold - success) / threshold`);
- an unstable task (success strictly between 0 and 1 across its samples: the curated task's own
  samples, or the validation tasks of its template) is up-sampled by `adaptive.unstable_boost`;
- a mastered task (all samples succeed, at most `adaptive.mastered_max_output_tokens` output
  tokens per episode when set) is down-sampled by `adaptive.mastered_factor`.

An item's expected share is `stratum weight / stratum size * item factor`, normalized; the
mixture's `target_size` rows are drawn from these shares deterministically (largest remainder,
ties and row order by `seed`). The weights and every reason are written into the manifest.

**Output.** Every drawn trajectory is rendered (`qpa.data.render`: the text protocol the Harness
speaks, per-turn `train` flags) into one row per conversation (main agent and each sub-agent):
a `datasets.Dataset` with columns `messages` (list of `{role, content, train}`), `task_id`,
`trajectory_id`, `agent`, `capabilities`, `domain`, `difficulty`, `source`, `weight`, `success`.
It is saved with `save_to_disk` and uploaded file by file under the output prefix, next to a
`DatasetManifest` of kind `sft`. `datasets` is imported only when a dataset is built.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from qpa.bench.gate import load_report
from qpa.bench.scoring import Report
from qpa.contract import CAPABILITIES, Trajectory
from qpa.data.augment import swap_values
from qpa.data.curate import CURATION, FAILURES_KEY, SUCCESSES_KEY
from qpa.data.generate import check_capabilities, template_of_ids
from qpa.data.render import Renderer, RenderError
from qpa.data.review import (
    DataError,
    ReviewConfig,
    ReviewItem,
    as_uri,
    create_queue,
    load_yaml_config,
    manifest_with_review,
    open_batch,
    read_jsonl,
    rejected_refs,
    require_published,
    stable_hash,
    start_batch,
)
from qpa.harness.agent import HarnessConfig
from qpa.store import ArtifactStore
from qpa.store.manifest import DatasetManifest, Lineage, ManifestFile, write_manifest

DATASET_DIR = "dataset"
COLUMNS = (
    "messages",
    "task_id",
    "trajectory_id",
    "agent",
    "capabilities",
    "domain",
    "difficulty",
    "source",
    "weight",
    "success",
)


class Weights(BaseModel):
    """Explicit mixture weights (1.0 for anything not listed)."""

    model_config = ConfigDict(extra="forbid")

    capability: dict[str, float] = Field(default_factory=dict)
    difficulty: dict[int, float] = Field(default_factory=dict)
    source: dict[str, float] = Field(default_factory=dict)
    env_kind: dict[str, float] = Field(default_factory=dict)

    @field_validator("capability")
    @classmethod
    def _known_capabilities(cls, value: dict[str, float]) -> dict[str, float]:
        return check_capabilities(value)

    @field_validator("difficulty")
    @classmethod
    def _difficulty_range(cls, value: dict[int, float]) -> dict[int, float]:
        bad = [k for k in value if not 1 <= k <= 5]
        if bad:
            raise ValueError(f"unknown difficulty {bad[0]} (difficulties are 1..5)")
        return value

    @field_validator("capability", "difficulty", "source", "env_kind")
    @classmethod
    def _non_negative(cls, value: dict[Any, float]) -> dict[Any, float]:
        bad = [k for k, v in value.items() if not v >= 0 or math.isinf(v)]
        if bad:
            raise ValueError(f"weight for {bad[0]!r} must be a finite number >= 0")
        return value


class Adaptive(BaseModel):
    """How a validation report and the samples' own outcomes reshape the mixture."""

    model_config = ConfigDict(extra="forbid")

    weak_threshold: float = Field(default=0.7, gt=0.0, le=1.0)
    weak_boost: float = Field(default=2.0, ge=0.0)
    unstable_boost: float = Field(default=2.0, ge=1.0)
    mastered_factor: float = Field(default=0.25, ge=0.0, le=1.0)
    mastered_max_output_tokens: float | None = Field(default=None, ge=0.0)


class MixConfig(BaseModel):
    """A training mixture (YAML: `qpa data mix --config mix.yaml`).

    ```yaml
    target_size: 2000
    seed: 0
    weights:
      capability: {tool_use: 1.0, memory: 1.5, skills: 1.0, subagent: 1.5}
      difficulty: {1: 0.5, 2: 1.0, 3: 1.0, 4: 1.5, 5: 1.5}
      source: {template: 1.0, generated: 1.0, llm: 0.8}
      env_kind: {sandbox: 1.0, llm_sim: 1.0, device: 2.0}
    adaptive: {weak_threshold: 0.7, weak_boost: 2.0, unstable_boost: 2.0, mastered_factor: 0.25}
    input_weights: {"s3://qpa/curated/a/": 3.0}   # per input batch (a TrainingRun's datasets)
    include_failures: false   # failed episodes with every turn from the mistake on masked
    review_rows: false        # also sample the mix's rows into its own review queue
    harness: {}               # the Harness version the rows are rendered for
    harness_variants: []      # more Harness versions; each trajectory is rendered for one
    value_swaps: 0            # value-swapped copies of each row (qpa.data.augment)
    day_swaps: false          # the swapped copies also move phrased days ("March 10")
    ```

    The mixture's review gate is that of its inputs (curated samples, and through them the
    generated tasks); `review_rows` adds a queue of drawn rows.
    """

    model_config = ConfigDict(extra="forbid")

    target_size: int = Field(default=1000, ge=1)
    seed: int = 0
    weights: Weights = Field(default_factory=Weights)
    adaptive: Adaptive = Field(default_factory=Adaptive)
    input_weights: dict[str, float] = Field(
        default_factory=dict,
        description="relative weight of each input batch (by its URI as given; 1.0 when not "
        "listed): a TrainingRun's `datasets[].weight`",
    )
    include_failures: bool = False
    review_rows: bool = False
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    harness_variants: list[HarnessConfig] = Field(
        default_factory=list,
        description="other Harness versions (tool caps, budgets, Skills): each drawn trajectory "
        "is rendered for one of `harness` + these, picked by a stable hash of its id, so the "
        "model learns prompts of every version it will be served with",
    )
    value_swaps: int = Field(
        default=0,
        ge=0,
        le=16,
        description="value-swapped copies of each row (`qpa.data.augment`): the values its "
        "calls copy from the context exchanged for others the same argument takes, so a model "
        "trained from scratch learns to copy rather than the frequent values",
    )
    day_swaps: bool = Field(
        default=False,
        description="the value-swapped copies also move each phrased day (an ISO day a call "
        'writes that the context names as "March 10") to another of the mixture\'s on the '
        "same weekday, so the day is read from the instruction rather than remembered",
    )

    @field_validator("input_weights")
    @classmethod
    def _positive_input_weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [k for k, v in value.items() if not v > 0 or math.isinf(v)]
        if bad:
            raise ValueError(f"input weight for {bad[0]!r} must be a finite number > 0")
        return value


def load_mix_config(path: str | None) -> MixConfig:
    """A `MixConfig` from YAML (None: defaults); errors name the file and the field."""
    return load_yaml_config(path, MixConfig, section="mix")


def load_validation_report(path: str | None) -> Report | None:
    """A validation report (`report.json` or its folder); `DataError` names a bad or test one."""
    if path is None:
        return None
    try:
        report = load_report(path)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    if report.split == "test":
        raise DataError(
            f"report {path}: split 'test': adapting the mixture to test results leaks the test "
            "set; pass a validation report"
        )
    return report


# --------------------------------------------------------------------------- weighting


@dataclass
class Item:
    """One trajectory with its stratum, factor and the reasons behind them."""

    trajectory: Trajectory
    stratum: tuple[Any, ...]  # capabilities, difficulty, source, env kind (, weighted input)
    stratum_weight: float
    factor: float = 1.0
    reasons: list[str] = field(default_factory=list)
    share: float = 0.0
    copies: int = 0


@dataclass
class MixPlan:
    """What `plan_mixture` decided: per-item copies, and the weights and reasons."""

    items: list[Item]
    weights: dict[str, float]
    reasons: list[str]
    target_size: int

    @property
    def drawn(self) -> list[Item]:
        return [i for i in self.items if i.copies]


def _task_stats(trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, int, float]]:
    """task id -> (samples, successes, mean output tokens), from curation stats or the set."""
    raw: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        raw[t.task.id].append(t)
    out: dict[str, tuple[int, int, float]] = {}
    for task_id, group in raw.items():
        recorded = group[0].metadata.get(CURATION, {}).get("task_samples")
        tokens = sum(t.totals.completion_tokens for t in group) / len(group)
        if isinstance(recorded, dict) and recorded.get("samples"):
            out[task_id] = (int(recorded["samples"]), int(recorded["successes"]), tokens)
        else:
            out[task_id] = (len(group), sum(t.success for t in group), tokens)
    return out


def plan_mixture(
    trajectories: Sequence[Trajectory],
    config: MixConfig,
    report: Report | None = None,
    *,
    origins: Mapping[str, str] | None = None,
) -> MixPlan:
    """Weights, adaptive factors and deterministic copies per trajectory (see the docstring).

    `origins` maps trajectory ids to the input batch they came from, for `input_weights`."""
    if not trajectories:
        raise DataError("nothing to mix: no curated trajectories")
    w, a = config.weights, config.adaptive
    weights: dict[str, float] = {}
    reasons: list[str] = []
    cap_factor: dict[str, float] = {}
    for cap in CAPABILITIES:
        base = w.capability.get(cap, 1.0)
        factor = 1.0
        if report is not None and cap in report.by_capability:
            success = report.by_capability[cap].success
            if success < a.weak_threshold:
                factor = 1.0 + a.weak_boost * (a.weak_threshold - success) / a.weak_threshold
                reasons.append(
                    f"capability {cap}: validation success {success:.0%} < "
                    f"{a.weak_threshold:.0%}: weight x{factor:.2f}"
                )
        cap_factor[cap] = base * factor
        weights[f"capability.{cap}"] = round(base * factor, 6)
    for level, value in sorted(w.difficulty.items()):
        weights[f"difficulty.{level}"] = value
    for group, table in (("source", w.source), ("env_kind", w.env_kind)):
        for name, value in sorted(table.items()):
            weights[f"{group}.{name}"] = value
    for uri, value in sorted(config.input_weights.items()):
        weights[f"input.{uri}"] = value

    # validation outcomes per template: unstable / mastered
    unstable_templates: set[str] = set()
    mastered_templates: set[str] = set()
    if report is not None:
        names = template_of_ids(report.suite, report.per_task)
        per_template: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
        for task_id, outcome in report.per_task.items():
            if task_id in names:
                per_template[names[task_id]].append(
                    (outcome.samples, outcome.successes, outcome.output_tokens)
                )
        for name, rows in per_template.items():
            if any(0 < s < n for n, s, _ in rows):
                unstable_templates.add(name)
            elif all(s == n for n, s, _ in rows) and all(
                a.mastered_max_output_tokens is None or tok <= a.mastered_max_output_tokens
                for _, _, tok in rows
            ):
                mastered_templates.add(name)
    stats = _task_stats(trajectories)

    items: list[Item] = []
    for t in trajectories:
        task = t.task
        capability = max(task.capabilities, key=lambda c: (cap_factor[c], c))
        origin = (origins or {}).get(t.id)
        stratum: tuple[Any, ...] = (
            "+".join(sorted(task.capabilities)),
            task.difficulty,
            task.source,
            t.env_kind,
        )
        if config.input_weights and origin is not None:
            stratum += (origin,)  # weighted inputs are strata of their own
        weight = (
            cap_factor[capability]
            * w.difficulty.get(task.difficulty, 1.0)
            * w.source.get(task.source, 1.0)
            * w.env_kind.get(t.env_kind, 1.0)
            * (config.input_weights.get(origin, 1.0) if origin is not None else 1.0)
        )
        item = Item(t, stratum, weight)
        samples, successes, tokens = stats[task.id]
        cheap = a.mastered_max_output_tokens is None or tokens <= a.mastered_max_output_tokens
        if 0 < successes < samples:
            item.factor *= a.unstable_boost
            item.reasons.append(
                f"unstable: {successes}/{samples} samples succeed: x{a.unstable_boost:g}"
            )
        elif task.template in unstable_templates:
            item.factor *= a.unstable_boost
            item.reasons.append(
                f"unstable on validation (template {task.template}): x{a.unstable_boost:g}"
            )
        elif (
            samples > 1 and successes == samples and cheap
        ) or task.template in mastered_templates:
            item.factor *= a.mastered_factor
            where = (
                f"{samples}/{samples} samples succeed"
                if samples > 1 and successes == samples
                else f"template {task.template} mastered on validation"
            )
            item.reasons.append(f"mastered: {where}: x{a.mastered_factor:g}")
        items.append(item)

    sizes: dict[tuple[str, int, str, str], int] = defaultdict(int)
    for item in items:
        sizes[item.stratum] += 1
    raw = [i.stratum_weight / sizes[i.stratum] * i.factor for i in items]
    total = sum(raw)
    if total <= 0:
        raise DataError("every mixture weight is 0: nothing can be drawn (check weights)")
    for item, value in zip(items, raw, strict=True):
        item.share = value / total
    _draw(items, config.target_size, config.seed)
    for name in sorted(unstable_templates):
        reasons.append(f"template {name}: unstable on validation: x{a.unstable_boost:g}")
    for name in sorted(mastered_templates):
        reasons.append(f"template {name}: mastered on validation: x{a.mastered_factor:g}")
    return MixPlan(items, weights, reasons, config.target_size)


def apportion(size: int, shares: list[float], keys: list[str], seed: int) -> list[int]:
    """Largest-remainder apportionment of `size` by `shares` (ties broken by seed and key)."""
    total = sum(shares)
    if size <= 0 or total <= 0:
        return [0] * len(shares)
    exact = [share / total * size for share in shares]
    counts = [math.floor(value) for value in exact]
    order = sorted(
        range(len(shares)),
        key=lambda k: (-(exact[k] - counts[k]), stable_hash(seed, keys[k])),
    )
    for k in order[: size - sum(counts)]:
        counts[k] += 1
    return counts


def _draw(items: list[Item], size: int, seed: int) -> None:
    """Copies per item: `size` split over strata by their mass, then over each stratum's items
    by their share (so every stratum gets its exact proportion, up to one row)."""
    strata: dict[tuple[str, int, str, str], list[Item]] = defaultdict(list)
    for item in items:
        strata[item.stratum].append(item)
    names = sorted(strata)
    masses = [sum(i.share for i in strata[name]) for name in names]
    per_stratum = apportion(size, masses, ["|".join(map(str, n)) for n in names], seed)
    for name, copies in zip(names, per_stratum, strict=True):
        members = strata[name]
        counts = apportion(
            copies, [i.share for i in members], [i.trajectory.id for i in members], seed
        )
        for item, count in zip(members, counts, strict=True):
            item.copies = count


# --------------------------------------------------------------------------- rows


def _masked_from_mistake(trajectory: Trajectory) -> Trajectory:
    """A failure for training: every turn from the diagnosed mistake on is masked."""
    copy = trajectory.model_copy(deep=True)
    diagnosis = copy.metadata.get("diagnosis") or {}
    start = diagnosis.get("step")
    start = start if isinstance(start, int) else 0
    for step in copy.steps[start:]:
        if step.annotations.get("train") is not False:
            step.annotations["train"] = False
            step.annotations["mask_reason"] = "after_diagnosed_mistake"
    return copy


def build_rows(
    plan: MixPlan, renderer: Renderer, *variants: Renderer, seed: int = 0
) -> list[dict[str, Any]]:
    """One row per conversation per drawn copy, in a seeded order; with `variants`, each
    trajectory is rendered by one of `renderer` + `variants` (a stable hash of its id)."""
    renderers = (renderer, *variants)
    rows: list[dict[str, Any]] = []
    n = len(plan.items)
    for item in plan.drawn:
        t = item.trajectory
        source = t if t.success else _masked_from_mistake(t)
        chosen = renderers[stable_hash(seed, "harness", t.id) % len(renderers)]
        try:
            conversations = chosen.conversations(source)
        except (RenderError, ValueError, KeyError) as exc:
            raise DataError(f"trajectory {t.id}: cannot be rendered: {exc}") from exc
        weight = round(item.share * n, 6)
        for conversation in conversations:
            if not conversation.trainable:
                continue
            row = {
                "messages": conversation.messages,
                "task_id": t.task.id,
                "trajectory_id": t.id,
                "agent": conversation.agent,
                "capabilities": list(t.task.capabilities),
                "domain": t.task.domain,
                "difficulty": t.task.difficulty,
                "source": t.task.source,
                "weight": weight,
                "success": t.success,
            }
            rows.extend(dict(row) for _ in range(item.copies))
    return rows


def to_dataset(rows: list[dict[str, Any]], seed: int = 0) -> Any:
    """The rows as a `datasets.Dataset` (imported here, lazily), in a seeded order."""
    from datasets import Dataset, Features, Sequence, Value

    ordered = sorted(
        enumerate(rows), key=lambda kv: stable_hash(seed, kv[1]["trajectory_id"], kv[0])
    )
    features = Features(
        {
            "messages": [
                {"role": Value("string"), "content": Value("string"), "train": Value("bool")}
            ],
            "task_id": Value("string"),
            "trajectory_id": Value("string"),
            "agent": Value("string"),
            "capabilities": Sequence(Value("string")),
            "domain": Value("string"),
            "difficulty": Value("int32"),
            "source": Value("string"),
            "weight": Value("float64"),
            "success": Value("bool"),
        }
    )
    columns = {name: [row[name] for _, row in ordered] for name in COLUMNS}
    return Dataset.from_dict(columns, features=features)


# --------------------------------------------------------------------------- the stage


def _save_quietly(dataset: Any, folder: Path) -> None:
    """`save_to_disk` without progress bars on stderr (restored afterwards)."""
    from datasets.utils.logging import (
        disable_progress_bar,
        enable_progress_bar,
        is_progress_bar_enabled,
    )

    enabled = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        dataset.save_to_disk(str(folder))
    finally:
        if enabled:
            enable_progress_bar()


@dataclass
class MixResult:
    plan: MixPlan
    rows: int
    manifest: DatasetManifest


def load_curated(
    inputs: Sequence[str],
    *,
    include_failures: bool,
    origins: dict[str, str] | None = None,
) -> list[Trajectory]:
    """Curated trajectories from `qpa data curate` outputs (their rejected items left out);
    `origins`, when given, is filled with trajectory id -> the input it came from."""
    out: list[Trajectory] = []
    for uri in inputs:
        require_published(uri)  # the review gate: refuse pending or unpublished inputs
        batch = open_batch(uri)
        rejected = rejected_refs(batch)
        keys = [SUCCESSES_KEY, *([FAILURES_KEY] if include_failures else [])]
        for key in keys:
            if not batch.exists(key):
                raise DataError(f"{batch.uri(key)}: missing: is {uri} a curated batch?")
            for t in read_jsonl(batch.uri(key), Trajectory):
                if t.id in rejected:
                    continue
                if not t.success and (t.metadata.get("diagnosis") or {}).get("side") != "model":
                    continue  # only the model's own mistakes teach recovery
                if origins is not None:
                    origins[t.id] = uri
                out.append(t)
    return out


def mix(
    store: ArtifactStore,
    inputs: Sequence[str],
    config: MixConfig | None = None,
    *,
    report: Report | None = None,
    report_ref: str | None = None,
    review: ReviewConfig | None = None,
    name: str | None = None,
) -> MixResult:
    """Build the mixture from curated batches and write it, with its manifest, to `store`."""
    config = config or MixConfig()
    unknown = sorted(set(config.input_weights) - set(inputs))
    if unknown:
        raise DataError(f"input_weights names {unknown[0]!r}, which is not an input")
    origins: dict[str, str] = {}
    trajectories = load_curated(inputs, include_failures=config.include_failures, origins=origins)
    plan = plan_mixture(trajectories, config, report, origins=origins)
    rows = build_rows(
        plan,
        Renderer(config.harness),
        *(Renderer(h) for h in config.harness_variants),
        seed=config.seed,
    )
    if not rows:
        raise DataError("the mixture is empty: no drawn trajectory has a trainable turn")
    swapped = swap_values(rows, config.value_swaps, seed=config.seed, days=config.day_swaps)
    rows += swapped
    dataset = to_dataset(rows, config.seed)
    start_batch(store)
    for stale in store.list(f"{DATASET_DIR}/"):
        store.delete(stale)
    files: list[ManifestFile] = []
    with tempfile.TemporaryDirectory(prefix="qpa-mix-") as scratch:
        folder = Path(scratch) / DATASET_DIR
        _save_quietly(dataset, folder)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = f"{DATASET_DIR}/{path.relative_to(folder).as_posix()}"
            files.append(ManifestFile.of(store.put_file(key, path)))
    queue = None
    if config.review_rows:
        candidates = [
            ReviewItem(
                id=f"row:{item.trajectory.id}",
                kind="row",
                ref=item.trajectory.id,
                summary=f"{item.trajectory.task.instruction[:160]} (x{item.copies})",
                details={"reasons": item.reasons, "stratum": list(item.stratum)},
            )
            for item in plan.drawn
        ]
        queue = create_queue(store, "mix", candidates, review or ReviewConfig())
    drawn = plan.drawn
    item_reasons = sorted({r for i in drawn for r in i.reasons})
    counts: dict[str, int] = {
        "rows": len(rows),
        "trajectories": len(trajectories),
        "drawn": len(drawn),
        "copies": sum(i.copies for i in drawn),
        "rows.value_swapped": len(swapped),
    }
    for cap in CAPABILITIES:
        counts[f"rows.capability.{cap}"] = sum(1 for r in rows if cap in r["capabilities"])
    manifest = DatasetManifest(
        name=name or store.root_uri.rstrip("/").rsplit("/", 1)[-1],
        kind="sft",
        files=files,
        counts=counts,
        lineage=Lineage.for_tasks(
            (i.trajectory.task.id for i in drawn),
            generator="qpa.data.mix",
            parents=[as_uri(i) for i in inputs],
            params={
                "config": json.loads(config.model_dump_json()),
                "report": report_ref,
                "format": "messages",
                "dataset_dir": DATASET_DIR,
            },
        ),
        weights=plan.weights,
        reasons=plan.reasons + item_reasons,
        extra={
            "columns": list(COLUMNS),
            "items": {
                i.trajectory.id: {
                    "copies": i.copies,
                    "share": round(i.share, 8),
                    "reasons": i.reasons,
                }
                for i in drawn
            },
        },
    )
    manifest = manifest_with_review(manifest, queue, review or ReviewConfig())
    write_manifest(store, "", manifest)
    return MixResult(plan, len(rows), manifest)


def load_dataset_from_store(store: ArtifactStore) -> Any:
    """Download a mixture's `dataset/` folder and `load_from_disk` it (for training)."""
    from datasets import load_from_disk

    scratch = Path(tempfile.mkdtemp(prefix="qpa-mix-load-"))
    for key in store.list(f"{DATASET_DIR}/"):
        store.get_file(key, scratch / key)
    return load_from_disk(str(scratch / DATASET_DIR))


__all__ = [
    "COLUMNS",
    "DATASET_DIR",
    "Adaptive",
    "Item",
    "MixConfig",
    "MixPlan",
    "MixResult",
    "Weights",
    "build_rows",
    "load_curated",
    "load_dataset_from_store",
    "load_mix_config",
    "load_validation_report",
    "mix",
    "plan_mixture",
    "to_dataset",
]
