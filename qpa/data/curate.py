"""Curation: trajectories in; valid, de-duplicated, attributed successes and failures out.

`curate(trajectories)` applies, in this order:

1. **Validity.** A trajectory is rejected (with its reasons, never silently) when its steps are
   not numbered 0..n-1, when no verification was recorded, when its task belongs to the test
   split or reproduces a canonical test instruction or id (test data never trains), or when its
   id repeats an earlier one. Schema errors are caught at reading: a corrupt line names the file
   and the line.
2. **Split.** Successes go to the `successes` set (what SFT trains on). Failed trajectories are
   **kept** in the `failures` set with their `Diagnosis` (`qpa.diagnose`) in
   `metadata["diagnosis"]`. A trajectory with an environment-side failure (the world broke, an
   endpoint died, an `environment_failure` feedback) never enters the SFT set: it goes to the
   failures with `curation.sft_eligible = false`.
3. **Turn flags.** Each erroneous assistant turn is flagged for turn-level masking in SFT:
   `annotations["train"] = False` and `annotations["mask_reason"]` on the step. Erroneous: an
   error the agent caused (`invalid_arguments`, `unknown_tool`, `malformed_action`,
   `precondition_failed`, `permission_denied`), a parse failure, a guard refusal, and, in a
   failure diagnosed as model-side, the step where the diagnosis shows the mistake. A success
   that met an error and recovered (the recovering oracle's rejected call, then its correction;
   a transient error, then the retry) keeps every turn but the erroneous one trained; the
   summary counts them (`recovered_successes`) and the steps whose error was injected by
   `qpa.envs.faults` (`injected_errors`, annotated `injected_error`).
4. **Capability attribution.** `metadata["curation"]["capabilities"]` holds the task's declared
   capabilities, those the trajectory exercised (tool calls that went through, remembered values
   used, sub-agents opened, Skill-governed writes: calls the trajectory's own `tools` record as
   state-changing) and, for failures, the capabilities the diagnosis blames.
5. **Near-duplicates.** Within each set, trajectories with the same normalized action sequence
   (tools and arguments, case and spacing folded) and near-identical instructions (MinHash over
   word 3-shingles, Jaccard >= `near_duplicate_threshold`) keep one representative: the first in
   (task id, sample, id) order, so the result never depends on input order. The representative
   lists the ids it stands for.

Per-task sample statistics (`samples`, `successes` across the valid samples of a task) are kept in
`curation.task_samples`: the mixture uses them to find unstable tasks.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from qpa.contract import (
    CAPABILITIES,
    Capability,
    Delegate,
    Finish,
    MessageUser,
    Step,
    ToolCall,
    Trajectory,
)
from qpa.data.render import mask_reason
from qpa.data.review import (
    ReviewConfig,
    ReviewItem,
    as_uri,
    batch_of,
    create_queue,
    load_yaml_config,
    manifest_with_review,
    open_batch,
    put_json,
    put_jsonl,
    read_source,
    start_batch,
)
from qpa.diagnose import Diagnosis, EpisodeTools, diagnose
from qpa.envs.faults import INJECTED
from qpa.envs.sandbox.suite import CANONICAL_SEED, generate_suite
from qpa.store import ArtifactNotFound, ArtifactStore
from qpa.store.manifest import (
    DatasetManifest,
    Lineage,
    ManifestError,
    ManifestFile,
    read_manifest,
    write_manifest,
)

SUCCESSES_KEY = "successes.jsonl"
FAILURES_KEY = "failures.jsonl"
REJECTED_KEY = "rejected.jsonl"
SUMMARY_KEY = "curation.json"
CURATED_KIND = "curated"
CURATION = "curation"
DIAGNOSIS = "diagnosis"


class CurateConfig(BaseModel):
    """Curation settings (YAML: `qpa data curate --config curate.yaml`)."""

    model_config = ConfigDict(extra="forbid")

    dedupe: bool = True
    near_duplicate_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    minhash_permutations: int = Field(default=64, ge=8, le=512)
    shingle_words: int = Field(default=3, ge=1, le=8)
    require_verification: bool = True
    mask_diagnosed_step: bool = True


class Rejection(BaseModel):
    """A trajectory that failed validity checks, and why."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str
    task_id: str
    reasons: list[str]


@dataclass
class CurationResult:
    """The curated sets and what was dropped (`duplicates`: dropped id -> kept id)."""

    successes: list[Trajectory] = field(default_factory=list)
    failures: list[Trajectory] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    duplicates: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        by_cause: dict[str, int] = defaultdict(int)
        by_side: dict[str, int] = defaultdict(int)
        for t in self.failures:
            diagnosis = t.metadata.get(DIAGNOSIS) or {}
            by_side[str(diagnosis.get("side", "unknown"))] += 1
            by_cause[str(diagnosis.get("cause", "unknown"))] += 1
        reasons: dict[str, int] = defaultdict(int)
        for r in self.rejected:
            for reason in r.reasons:
                reasons[reason.split(":", 1)[0]] += 1
        kept = [*self.successes, *self.failures]
        masked = sum(1 for t in kept for s in t.steps if mask_reason(s))
        return {
            "successes": len(self.successes),
            "failures": len(self.failures),
            "rejected": len(self.rejected),
            "duplicates": len(self.duplicates),
            "masked_turns": masked,
            # successes that met an error and went on to succeed (what teaches recovery)
            "recovered_successes": sum(
                1 for t in self.successes if any(s.feedback.status == "error" for s in t.steps)
            ),
            "injected_errors": sum(1 for t in kept for s in t.steps if INJECTED in s.annotations),
            "failures_by_side": dict(sorted(by_side.items())),
            "failures_by_cause": dict(sorted(by_cause.items())),
            "rejected_by_reason": dict(sorted(reasons.items())),
        }


def diagnosis_of(trajectory: Trajectory) -> Diagnosis | None:
    """The `Diagnosis` curation attached to a failed trajectory (None for successes)."""
    data = trajectory.metadata.get(DIAGNOSIS)
    if not isinstance(data, dict) or "side" not in data:
        return None
    return Diagnosis.model_validate(data)


# --------------------------------------------------------------------------- validity


@cache
def _canonical_test(suite: str) -> tuple[frozenset[str], frozenset[str]]:
    try:
        tasks = generate_suite(suite, CANONICAL_SEED)
    except KeyError:
        return frozenset(), frozenset()
    test = [t for t in tasks if t.split == "test"]
    return frozenset(t.id for t in test), frozenset(t.instruction for t in test)


def validity_problems(trajectory: Trajectory, config: CurateConfig | None = None) -> list[str]:
    """Why a trajectory cannot be curated ([] when it can)."""
    config = config or CurateConfig()
    problems: list[str] = []
    task = trajectory.task
    test_ids, test_instructions = _canonical_test(task.suite)
    if task.split == "test":
        problems.append("test_split: the task belongs to the test split")
    elif task.id in test_ids:
        problems.append(f"test_task: {task.id} is a canonical test task id")
    elif task.instruction in test_instructions:
        problems.append("test_instruction: the instruction is a canonical test instruction")
    wrong = [i for i, s in enumerate(trajectory.steps) if s.index != i]
    if wrong:
        problems.append(
            f"step_index: step {wrong[0]} is numbered {trajectory.steps[wrong[0]].index}"
        )
    if config.require_verification and trajectory.verification is None:
        problems.append("verification_missing: no verification was recorded")
    return problems


def environment_failure(trajectory: Trajectory, diagnosis: Diagnosis | None) -> str | None:
    """Why the episode is environment-side broken (None when it is not)."""
    if trajectory.error and trajectory.error.startswith("environment"):
        return f"episode error: {trajectory.error[:200]}"
    if diagnosis is not None and diagnosis.side == "environment":
        return f"diagnosed {diagnosis.cause}: {diagnosis.reason}"
    broken = [s.index for s in trajectory.steps if s.feedback.error == "environment_failure"]
    if broken:
        return f"environment_failure feedback at step {broken[0]}"
    return None


# --------------------------------------------------------------------------- flags, attribution


def flag_turns(
    trajectory: Trajectory, diagnosis: Diagnosis | None = None, *, mask_diagnosed: bool = True
) -> list[int]:
    """Flag erroneous assistant turns for masking (in place); the flagged step indexes."""
    flagged: list[int] = []
    for step in trajectory.steps:
        reason = mask_reason(step)
        if (
            reason is None
            and mask_diagnosed
            and diagnosis is not None
            and diagnosis.side == "model"
            and diagnosis.step == step.index
        ):
            reason = f"diagnosed:{diagnosis.cause}"
        if reason is not None:
            step.annotations["train"] = False
            step.annotations["mask_reason"] = reason
            flagged.append(step.index)
    return flagged


def _ok(step: Step) -> bool:
    return step.feedback.status == "ok" and mask_reason(step) is None


def _scalars(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, list):
        for v in value:
            yield from _scalars(v)
    elif value is not None:
        yield str(value).strip().lower()


def exercised_capabilities(trajectory: Trajectory) -> list[Capability]:
    """The capabilities the trajectory's own steps show (not just what the task declares)."""
    steps = trajectory.steps
    found: set[Capability] = set()
    if any(isinstance(s.action, ToolCall) and _ok(s) for s in steps):
        found.add("tool_use")
    if any(isinstance(s.action, Delegate) and s.feedback.status == "ok" for s in steps):
        found.add("subagent")
    remembered = {m.value.strip().lower() for m in trajectory.task.memory if m.value.strip()}
    for s in steps:
        if not _ok(s):
            continue
        values: set[str] = set()
        if isinstance(s.action, ToolCall):
            values = set(_scalars(s.action.arguments))
        elif isinstance(s.action, Finish | MessageUser):
            text = s.action.answer if isinstance(s.action, Finish) else s.action.text
            values = {text.strip().lower()} if text else set()
        hit = s.annotations.get("memory_used") or any(
            r in v for r in remembered for v in values if r
        )
        if hit:
            found.add("memory")
            break
    if "skills" in trajectory.task.capabilities:
        book = EpisodeTools.of(trajectory)  # a tool of unknown effect is not claimed as a write
        if any(
            isinstance(s.action, ToolCall) and _ok(s) and book.is_write(s.action.tool)
            for s in steps
        ):
            found.add("skills")
    return [c for c in CAPABILITIES if c in found]


def attribution(trajectory: Trajectory, diagnosis: Diagnosis | None) -> dict[str, Any]:
    return {
        "declared": list(trajectory.task.capabilities),
        "exercised": exercised_capabilities(trajectory),
        "blamed": list(diagnosis.capabilities) if diagnosis is not None else [],
    }


# --------------------------------------------------------------------------- near-duplicates


_WORD = re.compile(r"[a-z0-9]+")
_MASK64 = (1 << 64) - 1


def _fold(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.lower().split())
    if isinstance(value, dict):
        return {str(k): _fold(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_fold(v) for v in value]
    return value


def action_signature(trajectory: Trajectory) -> str:
    """SHA-256 of the normalized action sequence (agent, kind, tool, folded arguments)."""
    rows = []
    for step in trajectory.steps:
        data = step.action.model_dump(exclude={"call_id"}, exclude_none=True)
        rows.append([step.agent, _fold(data)])
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def shingles(text: str, size: int = 3) -> set[str]:
    words = _WORD.findall(text.lower())
    if len(words) <= size:
        return {" ".join(words)}
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


def minhash(items: set[str], permutations: int = 64) -> tuple[int, ...]:
    """A MinHash signature: per seeded hash function, the least 64-bit hash of any item."""
    hashes = [
        int.from_bytes(hashlib.blake2b(item.encode(), digest_size=8).digest(), "big")
        for item in sorted(items)
    ]
    signature = []
    for i in range(permutations):
        a = (0x9E3779B97F4A7C15 * (2 * i + 1)) & _MASK64
        b = (0xBF58476D1CE4E5B9 * (i + 1)) & _MASK64
        signature.append(min(((a * h + b) & _MASK64) for h in hashes) if hashes else 0)
    return tuple(signature)


def similarity(a: Sequence[int], b: Sequence[int]) -> float:
    """Estimated Jaccard similarity of two MinHash signatures."""
    return sum(1 for x, y in zip(a, b, strict=True) if x == y) / len(a) if a else 1.0


def dedupe(
    trajectories: list[Trajectory], config: CurateConfig | None = None
) -> tuple[list[Trajectory], dict[str, str]]:
    """Near-duplicate removal; (kept, dropped id -> id of the trajectory kept for it)."""
    config = config or CurateConfig()
    ordered = sorted(trajectories, key=lambda t: (t.task.id, t.sample, t.id))
    kept: list[Trajectory] = []
    dropped: dict[str, str] = {}
    buckets: dict[str, list[tuple[Trajectory, tuple[int, ...]]]] = defaultdict(list)
    for t in ordered:
        signature = minhash(
            shingles(t.task.instruction, config.shingle_words), config.minhash_permutations
        )
        bucket = buckets[action_signature(t)]
        twin = next(
            (k for k, s in bucket if similarity(s, signature) >= config.near_duplicate_threshold),
            None,
        )
        if twin is None:
            bucket.append((t, signature))
            kept.append(t)
        else:
            dropped[t.id] = twin.id
            twin.metadata.setdefault(CURATION, {}).setdefault("duplicates", []).append(t.id)
    return kept, dropped


# --------------------------------------------------------------------------- the stage


def curate(
    trajectories: Iterable[Trajectory], config: CurateConfig | None = None
) -> CurationResult:
    """Validate, diagnose, flag, attribute and de-duplicate (rules in the module docstring)."""
    config = config or CurateConfig()
    result = CurationResult()
    valid: list[Trajectory] = []
    seen: set[str] = set()
    for t in trajectories:
        problems = validity_problems(t, config)
        if t.id in seen:
            problems.append(f"duplicate_id: trajectory id {t.id} appears more than once")
        seen.add(t.id)
        if problems:
            result.rejected.append(
                Rejection(trajectory_id=t.id, task_id=t.task.id, reasons=problems)
            )
            continue
        valid.append(t.model_copy(deep=True))
    samples: dict[str, list[bool]] = defaultdict(list)
    for t in valid:
        samples[t.task.id].append(t.success)
    successes: list[Trajectory] = []
    failures: list[Trajectory] = []
    for t in valid:
        diagnosis: Diagnosis | None = None
        if not t.success:
            try:
                diagnosis = diagnose(t)
            except Exception as exc:  # a diagnosis bug must not lose the failure
                t.metadata[DIAGNOSIS] = {"error": f"{type(exc).__name__}: {exc}"}
        env_broken = environment_failure(t, diagnosis)
        flagged = flag_turns(t, diagnosis, mask_diagnosed=config.mask_diagnosed_step)
        runs = samples[t.task.id]
        t.metadata[CURATION] = {
            **t.metadata.get(CURATION, {}),
            "capabilities": attribution(t, diagnosis),
            "flagged_steps": flagged,
            "sft_eligible": t.success and env_broken is None,
            "environment_failure": env_broken,
            "task_samples": {"samples": len(runs), "successes": sum(runs)},
        }
        if diagnosis is not None:
            t.metadata[DIAGNOSIS] = diagnosis.model_dump(mode="json")
        (successes if t.success and env_broken is None else failures).append(t)
    if config.dedupe:
        successes, dropped = dedupe(successes, config)
        failures, dropped_failures = dedupe(failures, config)
        result.duplicates = {**dropped, **dropped_failures}
    result.successes = successes
    result.failures = failures
    return result


def load_trajectories(refs: Sequence[str]) -> list[Trajectory]:
    """Trajectories from JSONL files/objects or batches (a `qpa collect` output: its listed
    parts; a curated batch: its successes and failures). Errors name the file and line."""
    out: list[Trajectory] = []
    for ref in refs:
        keys: list[str] | None = None
        if not str(ref).endswith(".jsonl") and ("://" in str(ref) or Path(ref).is_dir()):
            try:
                if read_manifest(open_batch(ref)).kind == CURATED_KIND:
                    keys = [SUCCESSES_KEY, FAILURES_KEY]
            except (ArtifactNotFound, ManifestError):
                pass
        out.extend(read_source(ref, Trajectory, keys=keys))
    return out


def review_candidates(result: CurationResult) -> list[ReviewItem]:
    """Every curated trajectory as a review item (the queue samples from these)."""
    items: list[ReviewItem] = []
    for kind, group in (("sample", result.successes), ("failure", result.failures)):
        for t in group:
            curation = t.metadata.get(CURATION, {})
            diagnosis = t.metadata.get(DIAGNOSIS) or {}
            outcome = "success" if t.success else f"failure ({diagnosis.get('cause', '?')})"
            items.append(
                ReviewItem(
                    id=f"{kind}:{t.id}",
                    kind=kind,
                    ref=t.id,
                    summary=f"{t.task.instruction[:160]} -> {outcome}, {len(t.steps)} steps",
                    details={
                        "task_id": t.task.id,
                        "domain": t.task.domain,
                        "capabilities": curation.get("capabilities", {}),
                        "flagged_steps": curation.get("flagged_steps", []),
                        "diagnosis": diagnosis,
                    },
                )
            )
    return items


def write_curated(
    store: ArtifactStore,
    result: CurationResult,
    *,
    inputs: Sequence[str] = (),
    config: CurateConfig | None = None,
    review: ReviewConfig | None = None,
    name: str | None = None,
) -> DatasetManifest:
    """Write the sets, the summary, a review queue and the manifest to the store's root."""
    config = config or CurateConfig()
    start_batch(store)
    files: list[ManifestFile] = []
    for key, items in (
        (SUCCESSES_KEY, result.successes),
        (FAILURES_KEY, result.failures),
        (REJECTED_KEY, result.rejected),
    ):
        info, rows = put_jsonl(store, key, items)
        files.append(ManifestFile.of(info, rows))
    summary = result.summary()
    files.append(ManifestFile.of(put_json(store, SUMMARY_KEY, summary)))
    queue = create_queue(store, "curate", review_candidates(result), review or ReviewConfig())
    all_kept = [*result.successes, *result.failures]
    policies = sorted({t.policy.model_dump_json() for t in all_kept})
    manifest = DatasetManifest(
        name=name or store.root_uri.rstrip("/").rsplit("/", 1)[-1],
        kind=CURATED_KIND,
        files=files,
        counts={k: v for k, v in summary.items() if isinstance(v, int)},
        lineage=Lineage.for_tasks(
            (t.task.id for t in all_kept),
            generator="qpa.data.curate",
            parents=sorted({batch_of(as_uri(p)) for p in inputs}),
            policy=json.loads(policies[0]) if len(policies) == 1 else {},
            params={
                "config": config.model_dump(mode="json"),
                "inputs": [as_uri(p) for p in inputs],
            },
        ),
        reasons=[
            f"rejected {r.trajectory_id}: {'; '.join(r.reasons)}" for r in result.rejected[:200]
        ]
        + [f"duplicate {d} of {k}" for d, k in sorted(result.duplicates.items())[:200]],
        extra={"summary": summary},
    )
    manifest = manifest_with_review(manifest, queue)
    write_manifest(store, "", manifest)
    return manifest


def load_curate_config(path: str | None) -> CurateConfig:
    return load_yaml_config(path, CurateConfig, section="curate")


__all__ = [
    "CURATED_KIND",
    "FAILURES_KEY",
    "REJECTED_KEY",
    "SUCCESSES_KEY",
    "SUMMARY_KEY",
    "CurateConfig",
    "CurationResult",
    "Rejection",
    "action_signature",
    "attribution",
    "curate",
    "dedupe",
    "diagnosis_of",
    "environment_failure",
    "exercised_capabilities",
    "flag_turns",
    "load_curate_config",
    "load_trajectories",
    "minhash",
    "review_candidates",
    "shingles",
    "similarity",
    "validity_problems",
    "write_curated",
]
