"""The human gate of the data flywheel: review queues, gate status and publishing.

Every batch a data stage writes (generated tasks, curated trajectories, a training mix) lives
under its own store prefix (a URI such as `s3://qpa/data/curated/c-7` or a local folder). When
the stage runs, a deterministic sample of its items (`ReviewConfig.sample_size` per batch) is put
in the batch's review queue, `<batch>/review.json`. A person lists the queue, and accepts or
rejects each item with a reason (`qpa data review list|accept|reject|status`).

A batch's gate passes when no sampled item is pending and the share of rejected items is at most
`max_reject_rate`. `publish(dataset)` refuses until the gates of the dataset and of every input it
was built from (its manifest's `lineage.parents`) pass, unless the config explicitly sets
`gate: automatic`; it then writes `<dataset>/published.json` and records the decision in the
manifest's `review` field. Rejected items are excluded downstream (`rejected_refs`): the mix
never trains on a trajectory a reviewer rejected.

This module also holds the artifact I/O the data stages share: reading JSON Lines from a local
path or a store URI (corrupt lines name the file and the 1-based line), writing JSON Lines and
manifests to a store, and loading YAML configs whose errors name the file and the field.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.contract import iter_models
from qpa.store import (
    ArtifactNotFound,
    ArtifactStore,
    ObjectInfo,
    StoreConfig,
    StoreError,
    open_object,
    open_store,
)
from qpa.store.manifest import (
    MANIFEST_NAME,
    DatasetManifest,
    ManifestError,
    read_manifest,
    verify_manifest,
    write_manifest,
)

M = TypeVar("M", bound=BaseModel)
C = TypeVar("C", bound=BaseModel)

REVIEW_KEY = "review.json"
PUBLISHED_KEY = "published.json"
MANIFEST_KEY = MANIFEST_NAME

GateMode = Literal["manual", "automatic"]
ItemKind = Literal["task", "sample", "failure", "row"]
ItemStatus = Literal["pending", "accepted", "rejected"]


# --------------------------------------------------------------------------- errors


class DataError(ValueError):
    """Bad input to a data stage: the message names the file (and line or field)."""


class ReviewError(DataError):
    """A review action that cannot be done (no queue, unknown item, reject without reason)."""


class GateClosed(DataError):
    """Publishing was refused: a gate has not passed (the message says which and why)."""


# --------------------------------------------------------------------------- shared I/O


def describe_validation_error(exc: ValidationError) -> str:
    """`field 'a.b': message; ...` for each error of a pydantic validation failure."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"field '{where}': {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts)


def load_yaml_config(path: str | Path | None, model: type[C], *, section: str | None = None) -> C:
    """A config model from a YAML file (None: the defaults); errors name the file and field.

    With `section`, a file whose top level holds that key (e.g. `mix:` in a shared data
    config) is read from there; otherwise the whole document is the config.
    """
    if path is None:
        return model()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"config {path}: missing (no such file)") from None
    except OSError as exc:
        raise DataError(f"config {path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DataError(f"config {path}: not YAML: {exc}") from None
    if data is None:
        return model()
    if not isinstance(data, dict):
        raise DataError(f"config {path}: expected a mapping at the top level")
    if section and isinstance(data.get(section), dict):
        data = data[section]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise DataError(f"config {path}: {describe_validation_error(exc)}") from None


def read_jsonl(ref: str | Path, model: type[M]) -> Iterator[M]:
    """Stream models from a JSON Lines file given as a local path or a store URI.

    Raises `DataError` for a missing file and `CorruptLineError` (file and line) for a line
    that is not valid JSON or does not fit the model.
    """
    path = Path(str(ref))
    if "://" not in str(ref):
        if not path.is_file():
            raise DataError(f"{ref}: missing (no such file)")
        with open(path, encoding="utf-8") as stream:
            yield from iter_models(stream, model, str(ref))
        return
    store, key = open_object(str(ref))
    try:
        data = store.get_bytes(key)
    except ArtifactNotFound:
        raise DataError(f"{ref}: missing (no such object)") from None
    yield from iter_models(io.StringIO(data.decode("utf-8")), model, str(ref))


def jsonl_bytes(items: Iterable[BaseModel]) -> tuple[bytes, int]:
    """JSON Lines bytes of the models and how many there are."""
    lines = [item.model_dump_json() for item in items]
    return ("".join(line + "\n" for line in lines)).encode("utf-8"), len(lines)


def put_jsonl(store: ArtifactStore, key: str, items: Iterable[BaseModel]) -> tuple[ObjectInfo, int]:
    """Write models as one JSON Lines object; (what was written, rows)."""
    data, rows = jsonl_bytes(items)
    return store.put_bytes(key, data), rows


def put_json(store: ArtifactStore, key: str, data: Any) -> ObjectInfo:
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return store.put_bytes(key, text.encode("utf-8"))


def open_batch(uri: str | Path) -> ArtifactStore:
    """The store rooted at a batch's prefix (a local folder or `file://`/`s3://` URI)."""
    return open_store(str(uri))


def as_uri(ref: str | Path) -> str:
    """A reference as a URI: local paths become absolute `file://` URIs."""
    text = str(ref)
    return text if "://" in text else Path(text).resolve().as_uri()


def read_source(
    ref: str | Path, model: type[M], *, keys: Iterable[str] | None = None
) -> Iterator[M]:
    """Models from a JSONL file/object, or from every JSONL file of a batch (a folder or prefix).

    A batch's files are those its `manifest.json` lists (only `keys` when given), else the
    `.jsonl` objects under `parts/` or at its root. A missing source raises `DataError`.
    """
    text = str(ref)
    if text.endswith(".jsonl"):
        yield from read_jsonl(ref, model)
        return
    if "://" not in text and not Path(text).is_dir():
        raise DataError(f"{ref}: missing (no such file or folder)")
    batch = open_batch(text)
    try:
        listed = [f.key for f in read_manifest(batch).files if f.key.endswith(".jsonl")]
    except ArtifactNotFound:
        listed = [k for k in batch.list("parts/") if k.endswith(".jsonl")] or [
            k for k in batch.list("") if k.endswith(".jsonl") and "/" not in k
        ]
    wanted = list(keys) if keys is not None else listed
    if not wanted:
        raise DataError(f"{ref}: missing: no JSON Lines files in this batch")
    for key in wanted:
        if not batch.exists(key):
            raise DataError(f"{batch.uri(key)}: missing (listed but not found)")
        data = batch.get_bytes(key)
        yield from iter_models(io.StringIO(data.decode("utf-8")), model, batch.uri(key))


def stable_hash(*parts: object) -> int:
    """A process-independent 64-bit hash (Python's `hash` is salted per process)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


# --------------------------------------------------------------------------- the queue


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReviewConfig(_Model):
    """How batches are reviewed, and whether publishing waits for people.

    ```yaml
    sample_size: 20        # items put in front of a reviewer per batch
    max_reject_rate: 0.1   # a batch passes with at most this share of its sample rejected
    gate: manual           # or `automatic`: publish without review (must be set explicitly)
    seed: 0                # which items are sampled
    ```
    """

    sample_size: int = Field(default=20, ge=1)
    max_reject_rate: float = Field(default=0.1, ge=0.0, le=1.0)
    gate: GateMode = "manual"
    seed: int = 0


class ReviewItem(_Model):
    """One item awaiting (or past) review: a generated task, a curated sample, a mix row."""

    id: str = Field(min_length=1)
    kind: ItemKind
    ref: str = Field(min_length=1, description="task id or trajectory id")
    summary: str = ""
    details: dict[str, Any] = Field(default_factory=dict)
    status: ItemStatus = "pending"
    reason: str | None = None
    reviewer: str | None = None
    decided_at: datetime | None = None


class GateStatus(_Model):
    """Where one batch's gate stands."""

    batch: str
    mode: GateMode
    passed: bool
    sampled: int
    pending: int
    accepted: int
    rejected: int
    reject_rate: float
    max_reject_rate: float
    detail: str


class ReviewQueue(_Model):
    """`<batch>/review.json`: the sampled items of one batch and their review state."""

    batch: str
    stage: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    population: int = Field(ge=0, description="items in the batch")
    config: ReviewConfig = Field(default_factory=ReviewConfig)
    items: list[ReviewItem] = Field(default_factory=list)

    def item(self, item_id: str) -> ReviewItem:
        for item in self.items:
            if item.id == item_id or item.ref == item_id:
                return item
        known = ", ".join(i.id for i in self.items[:10]) or "none"
        raise ReviewError(f"review queue {self.batch}: no item {item_id!r} (items: {known})")

    def status(self, config: ReviewConfig | None = None) -> GateStatus:
        """The gate by `config` (a reviewer's policy at publish time) or the queue's own."""
        config = config or self.config
        mode = config.gate
        counts = {s: sum(1 for i in self.items if i.status == s) for s in ("pending", "accepted")}
        rejected = sum(1 for i in self.items if i.status == "rejected")
        reviewed = counts["accepted"] + rejected
        rate = rejected / reviewed if reviewed else 0.0
        limit = config.max_reject_rate
        if mode == "automatic":
            passed, detail = True, "gate set to automatic: no review needed"
        elif counts["pending"]:
            passed, detail = False, f"{counts['pending']} of {len(self.items)} items await review"
        elif rate > limit:
            passed = False
            detail = f"{rejected} of {reviewed} reviewed items rejected ({rate:.0%} > {limit:.0%})"
        else:
            passed = True
            detail = f"{reviewed} items reviewed, {rejected} rejected ({rate:.0%} <= {limit:.0%})"
        return GateStatus(
            batch=self.batch,
            mode=mode,
            passed=passed,
            sampled=len(self.items),
            pending=counts["pending"],
            accepted=counts["accepted"],
            rejected=rejected,
            reject_rate=round(rate, 4),
            max_reject_rate=limit,
            detail=detail,
        )


def sample_items(items: list[ReviewItem], config: ReviewConfig) -> list[ReviewItem]:
    """A deterministic sample of `sample_size` items, spread over kinds, in a stable order."""
    ranked = sorted(items, key=lambda i: (stable_hash(config.seed, i.kind, i.id), i.id))
    by_kind: dict[str, list[ReviewItem]] = {}
    for item in ranked:
        by_kind.setdefault(item.kind, []).append(item)
    picked: list[ReviewItem] = []
    while len(picked) < min(config.sample_size, len(items)):  # round robin over the kinds
        for kind in sorted(by_kind):
            if by_kind[kind] and len(picked) < config.sample_size:
                picked.append(by_kind[kind].pop(0))
    return sorted(picked, key=lambda i: i.id)


def create_queue(
    store: ArtifactStore, stage: str, candidates: list[ReviewItem], config: ReviewConfig
) -> ReviewQueue:
    """Sample the batch's items into a fresh `review.json` (replacing an older queue)."""
    queue = ReviewQueue(
        batch=store.root_uri,
        stage=stage,
        population=len(candidates),
        config=config,
        items=sample_items(candidates, config),
    )
    save_queue(store, queue)
    return queue


def start_batch(store: ArtifactStore) -> None:
    """A stage is (re)writing this batch: an older review queue or publication no longer holds."""
    for key in (PUBLISHED_KEY, REVIEW_KEY):
        store.delete(key)


def save_queue(store: ArtifactStore, queue: ReviewQueue) -> None:
    store.put_bytes(REVIEW_KEY, queue.model_dump_json(indent=2).encode("utf-8") + b"\n")


def load_queue(store: ArtifactStore, *, required: bool = True) -> ReviewQueue | None:
    """The batch's review queue (None when it has none and `required` is false)."""
    try:
        data = store.get_bytes(REVIEW_KEY)
    except ArtifactNotFound:
        if required:
            raise ReviewError(
                f"{store.uri(REVIEW_KEY)}: missing: this batch has no review queue "
                "(run the stage that writes it: qpa data generate|curate|mix)"
            ) from None
        return None
    try:
        return ReviewQueue.model_validate_json(data)
    except ValidationError as exc:
        raise ReviewError(
            f"{store.uri(REVIEW_KEY)}: corrupt review queue: {describe_validation_error(exc)}"
        ) from None


def decide(
    store: ArtifactStore,
    item_id: str,
    *,
    accept: bool,
    reason: str | None = None,
    reviewer: str | None = None,
) -> ReviewItem:
    """Accept or reject one item of the batch's queue; a rejection needs a reason."""
    if not accept and not (reason and reason.strip()):
        raise ReviewError(f"rejecting {item_id!r} needs a reason (--reason)")
    queue = load_queue(store)
    assert queue is not None
    item = queue.item(item_id)
    item.status = "accepted" if accept else "rejected"
    item.reason = reason.strip() if reason else None
    item.reviewer = reviewer
    item.decided_at = datetime.now(UTC)
    save_queue(store, queue)
    return item


def pending_items(store: ArtifactStore) -> list[ReviewItem]:
    queue = load_queue(store)
    assert queue is not None
    return [i for i in queue.items if i.status == "pending"]


def rejected_refs(store: ArtifactStore) -> set[str]:
    """Task or trajectory ids reviewers rejected in this batch (empty without a queue)."""
    queue = load_queue(store, required=False)
    if queue is None:
        return set()
    return {i.ref for i in queue.items if i.status == "rejected"}


# --------------------------------------------------------------------------- publishing


class PublishResult(_Model):
    """What `publish` decided, written to `<dataset>/published.json`."""

    dataset: str
    published_at: datetime
    mode: GateMode
    gates: list[GateStatus]
    manifest_sha256: str


def batch_of(uri: str) -> str:
    """The batch (prefix) a URI names: a `.jsonl` object's folder, else the URI itself."""
    return uri.rsplit("/", 1)[0] if uri.endswith(".jsonl") else uri


def gates_for(
    store: ArtifactStore, config: ReviewConfig | None = None, *, max_depth: int = 6
) -> list[GateStatus]:
    """The gates a dataset must pass: its own review queue's and those of every batch it was
    built from (its manifest's `lineage.parents`, followed transitively)."""
    read_manifest(store)  # the dataset itself must exist
    gates: list[GateStatus] = []
    seen: set[str] = set()
    frontier: list[tuple[str, ArtifactStore | None]] = [(store.root_uri, store)]
    for _ in range(max_depth + 1):
        following: list[tuple[str, ArtifactStore | None]] = []
        for uri, opened in frontier:
            uri = batch_of(uri)
            if uri.rstrip("/") in seen:
                continue
            seen.add(uri.rstrip("/"))
            try:
                batch = opened or open_batch(uri)
                queue = load_queue(batch, required=False)
            except (ValueError, OSError, StoreError) as exc:
                raise GateClosed(f"cannot read the review queue of {uri}: {exc}") from None
            if queue is not None:
                gates.append(queue.status(config))
            try:
                parents = read_manifest(batch).lineage.parents
            except (ArtifactNotFound, ManifestError):
                parents = []
            following += [(p, None) for p in parents]
        frontier = following
        if not frontier:
            break
    return gates


def publish(store: ArtifactStore, config: ReviewConfig | None = None) -> PublishResult:
    """Publish the dataset at `store`'s root once every gate passes (or the gate is automatic).

    `config` is the review policy to apply (gate mode, reject rate); None applies each batch's
    own. Raises `GateClosed` saying which gate is closed and why; the manifest must exist
    (`ArtifactNotFound` names it otherwise).
    """
    manifest = read_manifest(store)
    problems = verify_manifest(store)
    if problems:
        raise GateClosed(
            f"{store.root_uri}: the dataset does not match its manifest: {'; '.join(problems[:5])}"
        )
    gates = gates_for(store, config)
    automatic = config is not None and config.gate == "automatic"
    if not automatic:
        if not gates:
            raise GateClosed(
                f"{store.root_uri}: nothing was reviewed: neither the dataset nor its inputs "
                "have a review queue (set `gate: automatic` in the review config to publish "
                "without review)"
            )
        closed = [g for g in gates if not g.passed]
        if closed:
            detail = "; ".join(f"{g.batch}: {g.detail}" for g in closed)
            raise GateClosed(f"{store.root_uri}: the review gate has not passed: {detail}")
    mode: GateMode = (
        "automatic" if automatic or all(g.mode == "automatic" for g in gates) else "manual"
    )
    result = PublishResult(
        dataset=store.root_uri,
        published_at=datetime.now(UTC),
        mode=mode,
        gates=gates,
        manifest_sha256=hashlib.sha256(manifest.model_dump_json().encode()).hexdigest(),
    )
    manifest.review = {
        "published": True,
        "mode": mode,
        "published_at": result.published_at.isoformat(),
        "gates": [g.model_dump(mode="json") for g in gates],
    }
    write_manifest(store, "", manifest)
    store.put_bytes(PUBLISHED_KEY, result.model_dump_json(indent=2).encode("utf-8") + b"\n")
    return result


def is_published(store: ArtifactStore) -> bool:
    return store.exists(PUBLISHED_KEY)


def manifest_with_review(
    manifest: DatasetManifest, queue: ReviewQueue | None, config: ReviewConfig | None = None
) -> DatasetManifest:
    """The manifest with the batch's review state recorded (unpublished).

    Without a queue (a stage that samples nothing of its own, e.g. a mix without
    `review_rows`), `config` still records the gate mode, so readers know whether the batch
    waits for people (`require_published`)."""
    if queue is not None:
        manifest.review = {
            "published": False,
            "queue": REVIEW_KEY,
            "sampled": len(queue.items),
            "population": queue.population,
            "gate": queue.config.gate,
        }
    elif config is not None:
        manifest.review = {"published": False, "queue": None, "gate": config.gate}
    return manifest


# --------------------------------------------------------------------------- the readers' gate

ReviewStateName = Literal[
    "published", "automatic", "pending", "rejected", "unpublished", "unreviewed"
]
#: (generator, kind) of the batches the reviewed stages write: one of them without review
#: metadata was never published (it is not a user's own file), so it counts as unpublished.
#: Collection output is not among them: it inherits its tasks' generator, but its kind is
#: `trajectories`, and nobody reviews it before curation does.
REVIEWED_GENERATORS = {
    "qpa.data.generate": "tasks",
    "qpa.data.curate": "curated",
    "qpa.data.mix": "sft",
}
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class ReviewState(_Model):
    """Where a dataset stands for its readers: `require_published` refuses all but
    `published`, `automatic` and `unreviewed` (data that never entered the review flow)."""

    dataset: str = Field(description="the reference as given (path or URI)")
    root: str = Field(description="the batch holding its manifest / review queue")
    state: ReviewStateName
    detail: str

    @property
    def readable(self) -> bool:
        return self.state in ("published", "automatic", "unreviewed")


def _dataset_roots(ref: str) -> list[str]:
    """Where a dataset's review metadata may live: the reference itself, and for a file or a
    mixture's `dataset/` folder, its parent (`<batch>/dataset`, `<batch>/tasks.jsonl`)."""
    text = ref.rstrip("/")
    parent = text.rsplit("/", 1)[0] if "/" in text else "."
    if "://" not in text:
        path = Path(text)
        if path.is_file() or text.endswith(_FILE_SUFFIXES):
            return [str(path.parent)]
        return [text, str(path.parent)] if path.name == "dataset" else [text]
    if text.endswith(_FILE_SUFFIXES):
        return [parent]
    return [text, parent] if text.rsplit("/", 1)[-1] == "dataset" else [text]


def _open_root(root: str, store_config: StoreConfig | None) -> ArtifactStore | None:
    if "://" not in root and not Path(root).is_dir():
        return None
    return open_store(root, store_config)


def same_curation(out: str | Path, inputs: Sequence[str | Path]) -> bool:
    """True when the batch at `out` is a curation (`qpa data curate`) of exactly `inputs`."""
    store = open_batch(out)
    if not store.exists(MANIFEST_KEY):
        return False
    manifest = read_manifest(store)
    recorded = (manifest.lineage.params or {}).get("inputs")
    return manifest.lineage.generator == "qpa.data.curate" and recorded == [
        as_uri(p) for p in inputs
    ]


def review_state(ref: str | Path, *, store_config: StoreConfig | None = None) -> ReviewState:
    """The review state of the dataset at `ref` (a local path or store URI: a batch, one of
    its files, or a mixture's `dataset/` folder). Reads only; never writes.

    - `published`: `qpa data publish` wrote `published.json` (the stage that rewrites a batch
      deletes it, so it always speaks of the current data);
    - `automatic`: the manifest records `gate: automatic` (the loop's presets);
    - `pending` / `rejected`: its review queue has items awaiting review / rejects more than
      `max_reject_rate` allows;
    - `unpublished`: reviewed (or made by a reviewed stage) but never published;
    - `unreviewed`: no manifest, queue or publication at all (a user's own file).
    """
    text = str(ref)
    for root in _dataset_roots(text):
        try:
            store = _open_root(root, store_config)
            found = None if store is None else _state_at(store)
        except (StoreError, OSError, ValueError) as exc:
            raise GateClosed(f"dataset {text}: cannot read its review state: {exc}") from None
        if found is not None and store is not None:
            name, detail = found
            return ReviewState(dataset=text, root=store.root_uri, state=name, detail=detail)
    return ReviewState(
        dataset=text, root=text, state="unreviewed", detail="no manifest or review queue"
    )


def _state_at(store: ArtifactStore) -> tuple[ReviewStateName, str] | None:
    """(state, detail) of the batch at `store`'s root; None when it holds no dataset metadata."""
    published = store.exists(PUBLISHED_KEY)
    has_manifest = store.exists(MANIFEST_KEY)
    queue = load_queue(store, required=False)
    if not (published or has_manifest or queue is not None):
        return None
    if published:
        return "published", f"published ({PUBLISHED_KEY})"
    manifest = read_manifest(store) if has_manifest else None
    recorded = (manifest.review if manifest is not None else None) or {}
    if recorded.get("gate") == "automatic" or recorded.get("mode") == "automatic":
        return "automatic", "its manifest records gate: automatic"
    if queue is not None:
        gate = queue.status()
        if gate.mode == "automatic":
            return "automatic", "its review queue's gate is automatic"
        if gate.pending:
            return "pending", gate.detail
        if not gate.passed:
            return "rejected", gate.detail
        return "unpublished", f"review passed ({gate.detail}) but it was never published"
    generator = manifest.lineage.generator if manifest is not None else ""
    kind = manifest.kind if manifest is not None else ""
    if recorded or REVIEWED_GENERATORS.get(generator) == kind:
        return "unpublished", f"written by {generator or 'a reviewed stage'}, never published"
    return "unreviewed", "its manifest carries no review metadata"


_HINTS = {
    "pending": "review it with qpa data review list|accept|reject {root}, then publish it",
    "rejected": "too many sampled items were rejected: fix and regenerate the batch",
    "unpublished": "publish it once its gates pass: qpa data publish {root}",
}


def require_published(ref: str | Path, *, store_config: StoreConfig | None = None) -> None:
    """Refuse to read a dataset whose review state is pending, rejected or unpublished.

    The one decision every reader of flywheel data makes (a mixture's inputs, an SFT dataset,
    an RL or collection task pool, and so a TrainingRun's pods): `GateClosed` names the
    dataset and its state, unless the manifest records `gate: automatic`. Data that never
    entered the review flow (no manifest, queue or publication: a hand-made JSONL) is read
    as is: the gate guards what the flywheel produced (docs/data-flywheel.md).
    """
    found = review_state(ref, store_config=store_config)
    if found.readable:
        return
    hint = _HINTS[found.state].format(root=found.root)
    raise GateClosed(
        f"dataset {found.dataset}: review state {found.state}: {found.detail}; "
        f"refusing to read it ({hint})"
    )


__all__ = [
    "PUBLISHED_KEY",
    "REVIEWED_GENERATORS",
    "REVIEW_KEY",
    "DataError",
    "GateClosed",
    "GateMode",
    "GateStatus",
    "PublishResult",
    "ReviewConfig",
    "ReviewError",
    "ReviewItem",
    "ReviewQueue",
    "ReviewState",
    "as_uri",
    "batch_of",
    "create_queue",
    "decide",
    "describe_validation_error",
    "gates_for",
    "is_published",
    "jsonl_bytes",
    "load_queue",
    "load_yaml_config",
    "manifest_with_review",
    "open_batch",
    "pending_items",
    "publish",
    "put_json",
    "put_jsonl",
    "read_jsonl",
    "read_source",
    "rejected_refs",
    "require_published",
    "review_state",
    "sample_items",
    "save_queue",
    "stable_hash",
    "start_batch",
]
