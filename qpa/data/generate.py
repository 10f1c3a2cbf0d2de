"""Task construction: new executable tasks where coverage is thin or the model is weak.

**Coverage model.** The sandbox's parametrised templates span cells of capability x domain x
difficulty (a template with two capabilities covers two cells). A `CoverageTarget` (YAML) says how
many tasks each cell should hold: `per_cell`, scaled by per-capability, per-domain and
per-difficulty multipliers, or set per cell. `have` counts the tasks that already exist (the
canonical train split and any task files passed in).

**Steering by a validation report.** A capability, domain or template whose validation success is
below `weak_threshold` gets its cells' targets raised by `1 + weak_boost * gap`, with
`gap = (threshold - success) / threshold` (the largest gap of the cell's capability, domain and
template). A report of the test split is refused: steering by test results leaks the test set.

**Allocation.** `count` tasks are picked one at a time: each pick goes to the template whose most
needed cell has the largest `target - have` (ties: the template picked least, then a stable
hash), and that template's cells count one more. Without `count`, picking stops when every cell
is full. Each pick records why (cell, have, target, weakness).

**Building.** Each pick is a template built with a fresh seed (`build_task(template, "train",
index, seed)` with `seed != 0`): never the canonical suite's test or validation tasks (ids differ
by the `.s<seed>` suffix; instructions equal to a canonical test or validation instruction, or to
an existing one, are skipped). A task is kept only when executable: the oracle (its reference
plan) succeeds and the no-op planner fails. Generated tasks are `split="train"`,
`source="generated"`, with the pick's reasons in `lineage`.

**LLM variants** (`--planner openai`): a model behind an OpenAI-compatible endpoint rewrites each
picked task's instruction into new phrasings on the same template (same world, verifier and
reference plan). A variant is kept only when it keeps every literal the plan and verifier depend
on (names, quoted text, numbers), adds no remembered value the original left out, is not a
canonical test/validation instruction (or a near-copy of one), and is executable (oracle
succeeds, noop fails). Such tasks have `source="llm"` and the model and original in `lineage`.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from qpa import progress
from qpa.bench.scoring import Report
from qpa.contract import CAPABILITIES, Capability, Task
from qpa.data.curate import minhash, shingles, similarity
from qpa.data.review import (
    DataError,
    ReviewConfig,
    ReviewItem,
    create_queue,
    load_yaml_config,
    manifest_with_review,
    put_json,
    put_jsonl,
    stable_hash,
    start_batch,
)
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import (
    CANONICAL_SEED,
    DEFAULT_SUITE,
    TaskTemplate,
    all_templates,
    build_task,
    generate_suite,
)
from qpa.harness.backends.base import ChatMessage, ModelBackend
from qpa.harness.planners import NoopPlanner, OraclePlanner
from qpa.harness.runner import run_episode
from qpa.store import ArtifactStore
from qpa.store.manifest import DatasetManifest, Lineage, ManifestFile, write_manifest

TASKS_KEY = "tasks.jsonl"
PLAN_KEY = "generation.json"
MAX_PICKS = 100_000
Cell = tuple[str, str, int]  # (capability, domain, difficulty)


def cell_name(cell: Cell) -> str:
    return f"{cell[0]}/{cell[1]}/{cell[2]}"


def check_capabilities(value: dict[str, Any], what: str = "capability") -> dict[str, Any]:
    """Config keys that must be capabilities; the error names the unknown one and the choices."""
    unknown = [k for k in value if k not in CAPABILITIES]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r} (choose from {', '.join(CAPABILITIES)})")
    return value


# --------------------------------------------------------------------------- the target


class CellTarget(BaseModel):
    """An explicit target for one cell."""

    model_config = ConfigDict(extra="forbid")

    capability: Capability
    domain: str
    difficulty: int = Field(ge=1, le=5)
    count: int = Field(ge=0)


class CoverageTarget(BaseModel):
    """How many tasks each capability x domain x difficulty cell should hold (YAML).

    ```yaml
    per_cell: 6
    capabilities: {memory: 1.5, subagent: 1.5}   # multipliers
    domains: {travel: 2.0}
    difficulties: {4: 1.5}
    cells:                                       # explicit targets win
      - {capability: memory, domain: email, difficulty: 3, count: 12}
    weak_threshold: 0.7                          # steering by a validation report
    weak_boost: 2.0
    include_canonical_train: true                # the canonical train split counts as covered
    ```
    """

    model_config = ConfigDict(extra="forbid")

    suite: str = DEFAULT_SUITE
    per_cell: int = Field(default=4, ge=0)
    capabilities: dict[str, float] = Field(default_factory=dict)
    domains: dict[str, float] = Field(default_factory=dict)
    difficulties: dict[int, float] = Field(default_factory=dict)
    cells: list[CellTarget] = Field(default_factory=list)
    weak_threshold: float = Field(default=0.7, gt=0.0, le=1.0)
    weak_boost: float = Field(default=2.0, ge=0.0)
    include_canonical_train: bool = True

    @field_validator("capabilities")
    @classmethod
    def _known_capabilities(cls, value: dict[str, float]) -> dict[str, float]:
        return check_capabilities(value)

    @field_validator("capabilities", "domains", "difficulties")
    @classmethod
    def _non_negative(cls, value: dict[Any, float]) -> dict[Any, float]:
        bad = [k for k, v in value.items() if v < 0]
        if bad:
            raise ValueError(f"multiplier for {bad[0]!r} must be >= 0")
        return value

    def target(self, cell: Cell) -> float:
        for explicit in self.cells:
            if (explicit.capability, explicit.domain, explicit.difficulty) == cell:
                return float(explicit.count)
        capability, domain, difficulty = cell
        return (
            self.per_cell
            * self.capabilities.get(capability, 1.0)
            * self.domains.get(domain, 1.0)
            * self.difficulties.get(difficulty, 1.0)
        )


def load_coverage_target(path: str | None) -> CoverageTarget:
    """A `CoverageTarget` from YAML (None: the defaults); errors name the file and field."""
    return load_yaml_config(path, CoverageTarget, section="coverage")


# --------------------------------------------------------------------------- weakness


@dataclass
class Weakness:
    """Validation success by capability, domain and template (from a bench `Report`)."""

    capability: dict[str, float] = field(default_factory=dict)
    domain: dict[str, float] = field(default_factory=dict)
    template: dict[str, float] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def from_report(cls, report: Report, source: str = "") -> Weakness:
        if report.split == "test":
            raise DataError(
                f"report {source or '<report>'}: split 'test': steering data generation by test "
                "results leaks the test set; pass a validation report"
            )
        templates = template_of_ids(report.suite, report.per_task)
        rates: dict[str, list[float]] = defaultdict(list)
        for task_id, outcome in report.per_task.items():
            name = templates.get(task_id)
            if name:
                rates[name].append(outcome.rate)
        return cls(
            capability={k: v.success for k, v in report.by_capability.items()},
            domain={k: v.success for k, v in report.by_domain.items()},
            template={k: sum(v) / len(v) for k, v in rates.items()},
            source=source,
        )

    def gap(self, success: float | None, threshold: float) -> float:
        if success is None or success >= threshold:
            return 0.0
        return (threshold - success) / threshold

    def factor(
        self, template: TaskTemplate, capability: str, target: CoverageTarget
    ) -> tuple[float, str]:
        """(multiplier, reason) for one cell of a template."""
        gaps = {
            f"capability {capability}": (
                self.gap(self.capability.get(capability), target.weak_threshold),
                self.capability.get(capability),
            ),
            f"domain {template.domain}": (
                self.gap(self.domain.get(template.domain), target.weak_threshold),
                self.domain.get(template.domain),
            ),
            f"template {template.name}": (
                self.gap(self.template.get(template.name), target.weak_threshold),
                self.template.get(template.name),
            ),
        }
        gap = max(g for g, _ in gaps.values())
        if gap <= 0:
            return 1.0, ""
        factor = 1.0 + target.weak_boost * gap
        weak = ", ".join(
            f"{what} is weak on validation ({success:.0%} < {target.weak_threshold:.0%})"
            for what, (g, success) in gaps.items()
            if g > 0 and success is not None
        )
        return factor, f"{weak}: target x{factor:.2f}"


def template_of_ids(suite: str, task_ids: Iterable[str]) -> dict[str, str]:
    """Template names of task ids (canonical suite lookup, else the id's second part)."""
    known = _canonical_templates(suite)
    out: dict[str, str] = {}
    templates = all_templates()
    for task_id in task_ids:
        name = known.get(task_id)
        if name is None:
            parts = task_id.split(".")
            name = parts[1] if len(parts) > 1 and parts[1] in templates else None
        if name:
            out[task_id] = name
    return out


@cache
def _canonical_templates(suite: str) -> dict[str, str]:
    try:
        return {t.id: t.template or "" for t in generate_suite(suite, CANONICAL_SEED)}
    except KeyError:
        return {}


@cache
def _held_out(suite: str) -> tuple[frozenset[str], frozenset[str], tuple[tuple[int, ...], ...]]:
    """Ids and instructions of the canonical test and validation splits (never generated),
    and MinHash signatures of the test instructions (near-copies are refused too)."""
    try:
        tasks = [t for t in generate_suite(suite, CANONICAL_SEED) if t.split != "train"]
    except KeyError:
        return frozenset(), frozenset(), ()
    signatures = tuple(minhash(shingles(t.instruction)) for t in tasks if t.split == "test")
    return (
        frozenset(t.id for t in tasks),
        frozenset(t.instruction for t in tasks),
        signatures,
    )


# --------------------------------------------------------------------------- the plan


class Pick(BaseModel):
    """One planned task: which template, for which cell, and why."""

    model_config = ConfigDict(extra="forbid")

    template: str
    cell: str
    have: float
    target: float
    reason: str


class CoveragePlan(BaseModel):
    """What `plan_generation` decided: picks per template and the coverage before/after."""

    model_config = ConfigDict(extra="forbid")

    picks: list[Pick] = Field(default_factory=list)
    cells: dict[str, dict[str, float]] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)

    def per_template(self) -> dict[str, list[Pick]]:
        out: dict[str, list[Pick]] = defaultdict(list)
        for pick in self.picks:
            out[pick.template].append(pick)
        return dict(out)


def template_cells(template: TaskTemplate) -> list[Cell]:
    return [(c, template.domain, template.difficulty) for c in template.capabilities]


def coverage(
    tasks: Iterable[Task], templates: dict[str, TaskTemplate] | None = None
) -> dict[Cell, int]:
    """How many tasks each cell holds (a template's task counts in the template's cells)."""
    pool = templates if templates is not None else all_templates()
    counts: dict[Cell, int] = defaultdict(int)
    for task in tasks:
        tpl = pool.get(task.template or "")
        cells = (
            template_cells(tpl)
            if tpl is not None
            else [(c, task.domain, task.difficulty) for c in task.capabilities]
        )
        for cell in cells:
            counts[cell] += 1
    return dict(counts)


def plan_generation(
    target: CoverageTarget,
    *,
    existing: Sequence[Task] = (),
    weakness: Weakness | None = None,
    count: int | None = None,
    templates: dict[str, TaskTemplate] | None = None,
) -> CoveragePlan:
    """Pick templates for `count` new tasks (or until every cell is full); see the docstring."""
    pool = {
        name: tpl
        for name, tpl in (templates or all_templates()).items()
        if tpl.suite == target.suite
    }
    if not pool:
        raise DataError(f"coverage target: field 'suite': no templates for suite {target.suite!r}")
    domains = {t.domain for t in pool.values()}
    unknown = [d for d in target.domains if d not in domains]
    if unknown:
        raise DataError(
            f"coverage target: field 'domains': unknown domain {unknown[0]!r} "
            f"(choose from {', '.join(sorted(domains))})"
        )
    known = list(existing)
    if target.include_canonical_train:
        known += [t for t in generate_suite(target.suite, CANONICAL_SEED) if t.split == "train"]
    have: dict[Cell, float] = {k: float(v) for k, v in coverage(known, pool).items()}
    wanted: dict[Cell, float] = {}
    why: dict[tuple[str, Cell], str] = {}
    for tpl in pool.values():
        for cell in template_cells(tpl):
            factor, reason = (1.0, "")
            if weakness is not None:
                factor, reason = weakness.factor(tpl, cell[0], target)
            goal = target.target(cell) * factor
            wanted[cell] = max(wanted.get(cell, 0.0), goal)
            why[(tpl.name, cell)] = reason
    before = dict(have)
    picked: dict[str, int] = defaultdict(int)
    plan = CoveragePlan()
    limit = MAX_PICKS if count is None else count
    ordered = sorted(pool.values(), key=lambda t: t.name)
    while len(plan.picks) < limit:
        best: tuple[float, int, int, str] | None = None
        best_cell: Cell | None = None
        for tpl in ordered:
            for cell in template_cells(tpl):
                need = wanted[cell] - have.get(cell, 0.0)
                key = (
                    need,
                    -picked[tpl.name],
                    stable_hash(tpl.name, len(plan.picks)),  # ties: spread, reproducibly
                    tpl.name,
                )
                if best is None or key > best:
                    best, best_cell = key, cell
        assert best is not None and best_cell is not None
        need, _, _, name = best
        if count is None and need <= 0:
            break
        cell = best_cell
        reason = f"cell {cell_name(cell)} holds {have.get(cell, 0.0):g} of {wanted[cell]:.1f}"
        if why.get((name, cell)):
            reason += f"; {why[(name, cell)]}"
        plan.picks.append(
            Pick(
                template=name,
                cell=cell_name(cell),
                have=have.get(cell, 0.0),
                target=round(wanted[cell], 3),
                reason=reason,
            )
        )
        picked[name] += 1
        for each in template_cells(pool[name]):
            have[each] = have.get(each, 0.0) + 1
    plan.cells = {
        cell_name(c): {
            "target": round(wanted[c], 3),
            "before": before.get(c, 0.0),
            "after": have.get(c, 0.0),
        }
        for c in sorted(wanted)
    }
    plan.reasons = sorted({r for r in why.values() if r})
    return plan


def plan_per_template(
    target: CoverageTarget,
    *,
    count: int,
    existing: Sequence[Task] = (),
    templates: dict[str, TaskTemplate],
) -> CoveragePlan:
    """`count` picks for every template in `templates`, each planned against its own cells.

    `plan_generation` fills cells, and templates sharing a cell are interchangeable there: a
    template whose cells another template also covers can get no picks at all. A curriculum
    that must train every one of its templates plans them one by one instead.
    """
    plan = CoveragePlan()
    for name in sorted(templates):
        one = plan_generation(
            target, existing=existing, count=count, templates={name: templates[name]}
        )
        plan.picks += one.picks
        plan.cells.update(one.cells)
        plan.reasons = sorted({*plan.reasons, *one.reasons})
    return plan


# --------------------------------------------------------------------------- executability


def executable(task: Task) -> str | None:
    """None when the oracle solves the task and the no-op planner does not; else why not."""
    oracle = run_episode(SandboxEnv(), task, OraclePlanner())
    if not oracle.success:
        detail = oracle.error or ", ".join(
            c.name
            for c in (oracle.verification.checks if oracle.verification else [])
            if not c.passed
        )
        return f"oracle fails ({detail or 'verification failed'})"
    noop = run_episode(SandboxEnv(), task, NoopPlanner())
    if noop.success:
        return "noop succeeds (the verifier is trivially satisfied)"
    return None


# --------------------------------------------------------------------------- LLM variants

_QUOTED = re.compile(r"\"([^\"]{2,})\"|'([^']{3,})'")
_NUMBER = re.compile(r"\d[\d:.,/-]*\d|\d")
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)

REWRITE_SYSTEM = """\
You write user requests for a benchmark of phone assistant agents. Rewrite the request you are \
given in {n} different natural ways a real user might type or say it (vary tone, word order, \
politeness, brevity). Each rewrite must ask for exactly the same outcome.
Rules: keep every name, number, date, time, amount and quoted text exactly as written; add no \
facts, preferences or extra steps; do not answer the request.
Answer with JSON only: {{"variants": ["...", "..."]}}"""


def required_literals(task: Task) -> list[str]:
    """Text of the instruction the plan and verifier depend on (kept verbatim by rewrites)."""
    text = task.instruction
    found: list[str] = []
    for match in _QUOTED.finditer(text):
        found.append(match.group(1) or match.group(2))
    found += _NUMBER.findall(text)
    values: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and len(value) >= 3 and "${" not in value:
            values.append(value)

    for action in task.reference_plan or []:
        walk(action.model_dump(exclude={"type", "call_id"}))
    for check in task.verifier.checks:
        walk(check.where)
        walk(check.expect)
    if task.verifier.answer:
        values.append(task.verifier.answer)
    lowered = text.lower()
    found += [v for v in values if v.lower() in lowered]
    unique = sorted({f.strip() for f in found if f.strip()}, key=lambda s: (-len(s), s))
    # a literal contained in a longer kept one adds nothing
    return [u for i, u in enumerate(unique) if not any(u in longer for longer in unique[:i])]


def variant_problems(task: Task, variant: str) -> list[str]:
    """Why an LLM rewrite of `task.instruction` cannot be kept ([] when it can)."""
    problems: list[str] = []
    text = variant.strip()
    if not text:
        return ["empty"]
    if text == task.instruction.strip():
        return ["identical to the original"]
    lowered = text.lower()
    missing = [lit for lit in required_literals(task) if lit.lower() not in lowered]
    if missing:
        problems.append(f"drops required text {missing[0]!r}")
    original = task.instruction.lower()
    leaked = [
        m.value
        for m in task.memory
        if m.value.lower() in lowered and m.value.lower() not in original
    ]
    if leaked:
        problems.append(f"states the remembered value {leaked[0]!r}")
    _ids, instructions, signatures = _held_out(task.suite)
    if text in instructions:
        problems.append("is a canonical test/validation instruction")
    else:
        signature = minhash(shingles(text))
        if any(similarity(signature, s) >= 0.9 for s in signatures):
            problems.append("is a near-copy of a canonical test instruction")
    return problems


def parse_variants(text: str) -> list[str]:
    """The `variants` list of a model's JSON answer (code fences tolerated); [] when unusable."""
    body = text.strip()
    match = _FENCE.match(body)
    if match:
        body = match.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            return []
        try:
            data = json.loads(body[start : end + 1])
        except json.JSONDecodeError:
            return []
    if isinstance(data, dict):
        data = data.get("variants", [])
    if not isinstance(data, list):
        return []
    return [str(v).strip() for v in data if isinstance(v, str) and v.strip()]


class LLMRewriter:
    """Asks a model (any `ModelBackend`, e.g. `OpenAIBackend`) for instruction variants."""

    def __init__(self, backend: ModelBackend, *, variants: int = 2, model: str = "") -> None:
        self.backend = backend
        self.variants = variants
        self.model = model or str(getattr(backend, "model", ""))

    def rewrite(self, task: Task) -> list[str]:
        literals = required_literals(task)
        user = task.instruction
        if literals:
            user += "\n\nKeep exactly: " + "; ".join(json.dumps(lit) for lit in literals)
        messages = [
            ChatMessage.system(REWRITE_SYSTEM.format(n=self.variants)),
            ChatMessage.user(user),
        ]
        completion = self.backend.complete(messages, [])
        return parse_variants(completion.text)[: max(10, 3 * self.variants)]


# --------------------------------------------------------------------------- building


@dataclass
class GenerationResult:
    """Generated tasks, the plan behind them and what was dropped (and why)."""

    tasks: list[Task] = field(default_factory=list)
    plan: CoveragePlan = field(default_factory=CoveragePlan)
    dropped: list[dict[str, str]] = field(default_factory=list)
    shortfall: dict[str, int] = field(default_factory=dict)
    seed: int = 1

    def summary(self) -> dict[str, Any]:
        by_cap = Counter(c for t in self.tasks for c in t.capabilities)
        by_domain = Counter(t.domain for t in self.tasks)
        return {
            "seed": self.seed,
            "planned": len(self.plan.picks),
            "generated": len(self.tasks),
            "dropped": len(self.dropped),
            "shortfall": dict(sorted(self.shortfall.items())),
            "by_capability": dict(sorted(by_cap.items())),
            "by_domain": dict(sorted(by_domain.items())),
        }


def generate_tasks(
    plan: CoveragePlan,
    *,
    seed: int = 1,
    existing: Sequence[Task] = (),
    suite: str = DEFAULT_SUITE,
    rewriter: LLMRewriter | None = None,
    check_executable: bool = True,
) -> GenerationResult:
    """Build the plan's tasks with fresh seeds (and LLM variants when `rewriter` is given)."""
    if seed == CANONICAL_SEED:
        raise DataError(
            f"seed {CANONICAL_SEED} is the canonical suite's (its test split is held out): "
            "generate with another seed"
        )
    held_ids, held_instructions, _ = _held_out(suite)
    taken_ids = {t.id for t in existing} | set(held_ids)
    taken_text = {t.instruction for t in existing} | set(held_instructions)
    templates = all_templates()
    result = GenerationResult(plan=plan, seed=seed)
    with progress.track("generate", total=len(plan.picks), unit="tasks") as bar:
        for name, picks in sorted(plan.per_template().items()):
            tpl = templates[name]
            made, index, attempts = 0, 0, 0
            while made < len(picks) and attempts < len(picks) * 20 + 20:
                attempts += 1
                base = build_task(tpl, "train", index, seed)
                index += 1
                if base.id in taken_ids or base.instruction in taken_text:
                    continue
                pick = picks[made]
                lineage = {
                    "generator": "qpa.data.generate",
                    "template": name,
                    "suite_seed": seed,
                    "index": index - 1,
                    "cell": pick.cell,
                    "reason": pick.reason,
                }
                if rewriter is None:
                    task = base.model_copy(update={"source": "generated", "lineage": lineage})
                    problem = executable(task) if check_executable else None
                    if problem:
                        result.dropped.append({"task": task.id, "reason": problem})
                        continue
                    _keep(result, task, taken_ids, taken_text)
                    made += 1
                    bar.advance()
                    continue
                if _add_variants(
                    result, base, lineage, rewriter, taken_ids, taken_text, check_executable
                ):
                    made += 1
                    bar.advance()
            if made < len(picks):
                result.shortfall[name] = len(picks) - made
    return result


def _keep(result: GenerationResult, task: Task, ids: set[str], texts: set[str]) -> None:
    assert task.split != "test"
    result.tasks.append(task)
    ids.add(task.id)
    texts.add(task.instruction)


def _add_variants(
    result: GenerationResult,
    base: Task,
    lineage: dict[str, Any],
    rewriter: LLMRewriter,
    ids: set[str],
    texts: set[str],
    check_executable: bool,
) -> bool:
    try:
        variants = rewriter.rewrite(base)
    except Exception as exc:  # an endpoint failure drops this task, not the batch
        result.dropped.append({"task": base.id, "reason": f"model failed: {exc}"})
        return False
    kept = 0
    for number, text in enumerate(variants):
        if kept >= rewriter.variants:
            break
        problems = variant_problems(base, text)
        if text in texts:
            problems.append("duplicates an existing instruction")
        task_id = f"{base.id}.v{number}"
        if not problems:
            task = base.model_copy(
                update={
                    "id": task_id,
                    "instruction": text,
                    "source": "llm",
                    "lineage": {
                        **lineage,
                        "generator": "qpa.data.generate/llm",
                        "model": rewriter.model,
                        "base_task": base.id,
                        "original_instruction": base.instruction,
                    },
                }
            )
            problem = executable(task) if check_executable else None
            if problem:
                problems.append(problem)
            else:
                _keep(result, task, ids, texts)
                kept += 1
                continue
        result.dropped.append({"task": task_id, "reason": "; ".join(problems), "text": text[:300]})
    return kept > 0


# --------------------------------------------------------------------------- the stage


def review_candidates(tasks: Sequence[Task]) -> list[ReviewItem]:
    return [
        ReviewItem(
            id=f"task:{t.id}",
            kind="task",
            ref=t.id,
            summary=t.instruction[:240],
            details={
                "template": t.template,
                "domain": t.domain,
                "capabilities": list(t.capabilities),
                "difficulty": t.difficulty,
                "source": t.source,
                "reason": t.lineage.get("reason", ""),
            },
        )
        for t in tasks
    ]


def write_generated(
    store: ArtifactStore,
    result: GenerationResult,
    *,
    target: CoverageTarget,
    params: dict[str, Any] | None = None,
    parents: Sequence[str] = (),
    review: ReviewConfig | None = None,
    name: str | None = None,
) -> DatasetManifest:
    """Write `tasks.jsonl`, `generation.json`, a review queue and the manifest."""
    start_batch(store)
    info, rows = put_jsonl(store, TASKS_KEY, result.tasks)
    plan_doc = {
        "summary": result.summary(),
        "target": target.model_dump(mode="json"),
        "plan": result.plan.model_dump(mode="json"),
        "dropped": result.dropped,
    }
    plan_info = put_json(store, PLAN_KEY, plan_doc)
    queue = create_queue(
        store, "generate", review_candidates(result.tasks), review or ReviewConfig()
    )
    summary = result.summary()
    manifest = DatasetManifest(
        name=name or store.root_uri.rstrip("/").rsplit("/", 1)[-1],
        kind="tasks",
        files=[ManifestFile.of(info, rows), ManifestFile.of(plan_info)],
        counts={k: v for k, v in summary.items() if isinstance(v, int)},
        lineage=Lineage.for_tasks(
            (t.id for t in result.tasks),
            generator="qpa.data.generate",
            parents=list(parents),
            params={"seed": result.seed, "suite": target.suite, **(params or {})},
        ),
        reasons=result.plan.reasons + [f"{k}: {v} short" for k, v in result.shortfall.items()],
        extra={"summary": summary},
    )
    manifest = manifest_with_review(manifest, queue)
    write_manifest(store, "", manifest)
    return manifest


__all__ = [
    "PLAN_KEY",
    "TASKS_KEY",
    "CellTarget",
    "CoveragePlan",
    "CoverageTarget",
    "GenerationResult",
    "LLMRewriter",
    "Pick",
    "Weakness",
    "check_capabilities",
    "coverage",
    "executable",
    "generate_tasks",
    "load_coverage_target",
    "parse_variants",
    "plan_generation",
    "required_literals",
    "template_of_ids",
    "variant_problems",
    "write_generated",
]
