"""Trajectory collection: k samples per task, in parallel, streamed to an artifact store.

`run_collect(config)` (a `CollectConfig`: tasks source, planner, samples, shard, output, ...)
is what `qpa collect` (and each pod of a TaskBatch's indexed Job, from its work order) runs;
`collect(tasks, spec, samples_per_task=k, out="s3://bucket/tb-1", shard=(i, n))` is the same for a
caller that already holds the tasks and the planner spec:

- **Identity and place (exactly once).** A trajectory's identity is (task id, sample index,
  `attempt` of the batch). Its place is a pure function of that identity and the dataset's
  layout (`<out>/layout.json`, fixed by the first run: the ordered task ids' hash and the
  tasks per part P): the part `parts/part-a<attempt>-t<position // P>-s<sample>.jsonl` holds
  sample s of P consecutive tasks, and nothing else. A rerun, a retried shard, a second
  process on the same shard or two racing uploaders therefore all write the same records to
  the same key: an S3 PUT replaces a key whole, so a trajectory can land at most once. A run
  with another task list than the layout's is refused (use a fresh --out); more samples per
  task are new parts.
- **Work.** Parts are numbered task-block-major (q = block * k + sample); shard i/n takes
  the parts whose number is i modulo n, so n shards cover every pair exactly once and never
  share a part. The first run of a sharded batch picks P no larger than keeps every shard
  busy. Each trajectory's `metadata` records `group` (the task id: the RL group of its k
  samples), `shard` ("i/n") and `attempt`. For the `noisy` planner sample s uses seed
  `seed + s`.
- **Workers.** `concurrency` threads, each holding one environment for its life: in-process
  (`make_env(env_kind)`) or a `RemoteEnv` on one of the `env_url`s (round-robin). A fresh
  planner per episode comes from `PlannerFactory` (model backends are shared).
- **Environment failures.** An episode an environment-side failure ended (a RolloutPool pod
  that died mid-episode, a lost session) is reported on stderr and run again, up to
  `env_retries` times with a doubling backoff from `env_retry_backoff_s`; the trajectory kept is
  the last attempt's, with the earlier errors in `metadata["env_failures"]` (`env_retried`
  counts the reruns). Only a failure that outlasts the retries is recorded as one.
- **Streaming.** The calling thread appends each finished trajectory to its part in a keyed
  `SpooledUploader`; a part is sealed and uploaded once it holds all its records (episodes
  run part by part, so parts complete one after another). When the store is down, parts wait
  in the local spool (retried with backoff) and upload once it is back. A part whose key
  another writer already filled with the same records is dropped (theirs stands); other
  records under the key are a `PartConflict`, never overwritten.
- **Resume.** Before any episode starts, one snapshot is read with uploads paused: the
  parts in the store and every part in the spool (sealed, and open ones a crash or an
  interruption left, a torn last line repaired). Pairs found there are skipped; an open part
  is completed, not restarted; an open part whose key the store already holds is dropped.
  A corrupt line in a part is an error naming the part's URI and the line. Parts holding
  another policy's trajectories are refused. An unreachable store is waited for up to
  `start_timeout_s`.
- **Manifests.** At the end each shard writes `<out>/shards/<i>-of-<n>.json` (its parts, counts,
  lineage); the shard that finds all n shard manifests present writes `<out>/manifest.json`
  (a `DatasetManifest` of kind "trajectories": every part with hash, size and rows, the counts,
  the policy and the lineage). Unsharded, `manifest.json` is written directly. Hashes are
  the store's (a part a racing writer replaced is read again). `qpa data verify`
  (`qpa.store.manifest.verify_manifest`) reads every part and names duplicated and missing
  identities.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from qpa.api.v1alpha1 import TaskSource, first_error
from qpa.contract import CorruptLineError, Environment, Policy, Task, Trajectory
from qpa.data.collect_config import (
    DEFAULT_FLUSH_TIMEOUT_S,
    DEFAULT_PART_SIZE,
    CollectConfig,
)
from qpa.data.tasks import select_tasks
from qpa.envs.faults import InjectionLog
from qpa.harness.factory import PlannerFactory, PlannerSpec
from qpa.harness.planners import Planner
from qpa.harness.pool import check_remote, env_maker, policy_of, run_episodes
from qpa.harness.recovery import RecoveringPlanner
from qpa.store import (
    ArtifactNotFound,
    ArtifactStore,
    StoreConfig,
    StoreUnavailable,
    join_key,
    open_store,
)
from qpa.store.manifest import (
    DatasetManifest,
    Lineage,
    ManifestFile,
    part_identities,
    write_manifest,
)
from qpa.store.spool import SpooledUploader, shard_tag

PARTS = "parts"
SHARDS = "shards"
LAYOUT = "layout.json"
GENERATOR = "qpa.data.collect"
_REPORT_LOCK = threading.Lock()


class CollectError(RuntimeError):
    """The collection cannot run or resume as asked (the message says why)."""


# --------------------------------------------------------------------------- inputs


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` -> (i, n), with 0 <= i < n."""
    try:
        index, count = (int(part) for part in text.strip().split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like i/n (e.g. 3/8), not {text!r}") from None
    shard_tag((index, count))  # validates the range
    return index, count


def shard_from_env(
    count: int | None = None, environ: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """The shard of a Kubernetes indexed Job pod: `JOB_COMPLETION_INDEX` of `count` shards.

    `count` defaults to `QPA_SHARD_COUNT` (the operator sets it to the Job's completions).
    """
    env = os.environ if environ is None else environ
    raw = env.get("JOB_COMPLETION_INDEX")
    if raw is None or not raw.strip().isdigit():
        raise ValueError("JOB_COMPLETION_INDEX is not set to a number (not an indexed Job pod?)")
    if count is None:
        total = env.get("QPA_SHARD_COUNT", "").strip()
        if not total.isdigit():
            raise ValueError("the shard count is unknown: pass --shards N or set QPA_SHARD_COUNT")
        count = int(total)
    shard = (int(raw), count)
    shard_tag(shard)
    return shard


# --------------------------------------------------------------------------- bookkeeping


Identity = tuple[str, int, int]  # (task id, sample index, attempt of the batch)


def identity_of(trajectory: Trajectory) -> Identity:
    """A trajectory's identity: (task id, sample, `metadata["attempt"]`, 0 when unset)."""
    return (trajectory.task.id, trajectory.sample, int(trajectory.metadata.get("attempt", 0)))


class CollectLayout(BaseModel):
    """`<out>/layout.json`: what fixes every trajectory's part, written by the first run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    tasks: int = Field(ge=1, description="How many tasks, in the collection's order.")
    tasks_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="ordered_digest(ids).")
    tasks_per_part: int = Field(ge=1, description="P: a part holds one sample of P tasks.")

    def part_of(self, position: int, sample: int, attempt: int) -> str:
        """The part (file name under parts/) of a trajectory: a pure function of its place."""
        return f"part-a{attempt:02d}-t{position // self.tasks_per_part:05d}-s{sample:04d}.jsonl"


def ordered_digest(task_ids: Sequence[str]) -> str:
    """SHA-256 of the task ids in order (positions decide parts, so order matters)."""
    digest = hashlib.sha256()
    for task_id in task_ids:
        digest.update(task_id.encode() + b"\n")
    return digest.hexdigest()


@dataclass
class PartSummary:
    """What one part holds: its manifest entry and the episodes in it."""

    entry: ManifestFile
    keys: list[Identity] = field(default_factory=list)
    successes: int = 0
    env_errors: int = 0
    won: set[Identity] = field(default_factory=set)  # the pairs that succeeded


@dataclass
class CollectProgress:
    """Passed to `on_episode` after each trajectory is spooled."""

    total: int
    done: int
    ran: int
    successes: int
    spooled_parts: int
    uploaded_parts: int


@dataclass
class CollectResult:
    """The outcome of `collect` for this shard."""

    out: str
    shard: tuple[int, int]
    total: int  # (task, sample) pairs of this shard
    ran: int
    skipped: int
    skipped_successes: int  # successful episodes among the pairs already collected
    successes: int  # among the episodes run now
    env_errors: int  # episodes run now that an environment-side error ended
    env_retried: int  # reruns of episodes an environment-side error had ended
    parts: list[ManifestFile]  # this shard's parts in the store
    spooled_parts: int  # parts still in the local spool (the store stayed down)
    spool_dir: Path
    manifest_uri: str | None = None  # manifest.json, once every shard has finished
    shard_manifest_uri: str | None = None
    repaired: list[str] = field(default_factory=list)
    duplicates: int = 0  # pairs found twice among existing parts (left as they are)
    superseded: list[str] = field(default_factory=list)  # parts another writer had filled
    interrupted: bool = False
    elapsed_s: float = 0.0
    error: str | None = None  # why the spool could not be emptied

    @property
    def complete(self) -> bool:
        return self.spooled_parts == 0 and not self.interrupted and self.error is None

    @property
    def throughput(self) -> float:
        return self.ran / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _side(error: str | None) -> str | None:
    return error.split(":", 1)[0] if error else None


def _summarize(
    data: bytes, uri: str, key: str, on_record: Callable[[Trajectory], None] | None = None
) -> PartSummary:
    """Validate every line of a part; its manifest entry and episode keys."""
    summary = PartSummary(
        ManifestFile(key=key, sha256=hashlib.sha256(data).hexdigest(), size=len(data), rows=0)
    )
    rows = 0
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            trajectory = Trajectory.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
            raise CorruptLineError(uri, number, f"{where}: {first.get('msg')}") from None
        rows += 1
        summary.keys.append(identity_of(trajectory))
        summary.successes += trajectory.success
        if trajectory.success:
            summary.won.add(identity_of(trajectory))
        summary.env_errors += _side(trajectory.error) == "environment"
        if on_record is not None:
            on_record(trajectory)
    summary.entry.rows = rows
    return summary


def _retrying(attempts: int = 6, within_s: float | None = None) -> Retrying:
    """Retries on `StoreUnavailable`: `attempts` times, or for `within_s` seconds if given."""
    return Retrying(
        stop=stop_after_attempt(attempts) if within_s is None else stop_after_delay(within_s),
        wait=wait_exponential(multiplier=0.2, max=3.0),
        retry=retry_if_exception_type(StoreUnavailable),
        reraise=True,
    )


def _counts(parts: Iterable[PartSummary]) -> dict[str, int]:
    parts = list(parts)
    rows = sum(p.entry.rows or 0 for p in parts)
    successes = sum(p.successes for p in parts)
    return {
        "trajectories": rows,
        "successes": successes,
        "failures": rows - successes,
        "env_errors": sum(p.env_errors for p in parts),
        "groups": len({key[0] for p in parts for key in p.keys}),
        "parts": len(parts),
    }


def default_spool_dir() -> Path:
    return Path(os.environ.get("QPA_SPOOL_DIR") or Path(tempfile.gettempdir()) / "qpa-spool")


def _check_remote(urls: Sequence[str]) -> None:
    """Fail fast when no environment server of the pool answers; one that does not (a pod
    restarting) is reported, and its workers' episodes are retried until it is back."""
    down: list[str] = []
    for url in dict.fromkeys(urls):
        try:
            check_remote([url], CollectError)
        except CollectError as exc:
            down.append(str(exc))
    if len(down) == len(dict.fromkeys(urls)):
        raise CollectError(down[0] if len(down) == 1 else "; ".join(down))
    for message in down:
        print(f"{message}; its episodes are retried until it answers", file=sys.stderr)


# --------------------------------------------------------------------------- the collection


def collect(
    tasks: Sequence[Task] | str | Path,
    spec: PlannerSpec,
    *,
    on_start: Callable[[int, int], None] | None = None,
    on_episode: Callable[[CollectProgress, Trajectory], None] | None = None,
    stop: threading.Event | None = None,
    **settings: Any,
) -> CollectResult:
    """`run_collect` for a caller holding tasks (or a tasks file or dataset) and a planner spec.

    `settings` are `CollectConfig` fields (`out`, `samples_per_task`, `shard`, `concurrency`,
    ...); one that does not validate is a `CollectError` naming the field.
    """
    if isinstance(tasks, (str, Path)):
        location = str(tasks)
        uri = location if "://" in location else Path(location).resolve().as_uri()
        settings["source"] = TaskSource(dataset_uri=uri)
        chosen: Sequence[Task] | None = None
    else:
        chosen = tasks
    try:
        config = CollectConfig.model_validate(settings)
    except ValidationError as exc:
        raise CollectError(first_error(exc)) from None
    return run_collect(
        config, tasks=chosen, spec=spec, on_start=on_start, on_episode=on_episode, stop=stop
    )


@dataclass
class _Hooks:
    """The caller's callbacks and stop flag, passed down together."""

    on_start: Callable[[int, int], None] | None
    on_episode: Callable[[CollectProgress, Trajectory], None] | None
    stop: threading.Event


def run_collect(
    config: CollectConfig,
    *,
    tasks: Sequence[Task] | None = None,
    spec: PlannerSpec | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_episode: Callable[[CollectProgress, Trajectory], None] | None = None,
    stop: threading.Event | None = None,
) -> CollectResult:
    """Run this shard's (task, sample) episodes not yet collected at `config.out`; see the
    module doc.

    The tasks are `tasks` when given, else `select_tasks(config.source)`; the planner spec is
    `spec` when given, else `config.planner.spec()`. `on_start(total, done)` is called once
    before work starts, `on_episode(progress, trajectory)` after each episode is spooled (both
    in the calling thread). Setting `stop` (or Ctrl-C) lets the episodes in flight finish and
    upload, then returns with `interrupted=True`. When the store is still down after
    `flush_timeout_s`, the result says how many parts wait in the spool (`complete` is False):
    rerun with the same spool to upload them.
    """
    started = time.perf_counter()
    shard = config.shard or (0, 1)
    tag = shard_tag(shard)
    parents = list(config.parents)
    if tasks is None:
        if config.source is None:
            raise CollectError("no tasks: set the config's source or pass tasks")
        tasks = select_tasks(config.source, config.store_config)
    if config.source is not None and config.source.dataset_uri is not None:
        parents.append(config.source.dataset_uri)
    tasks = list(tasks)
    if not tasks:
        raise CollectError("no tasks to collect")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise CollectError(f"the task list holds task id {duplicate!r} twice")
    if config.env_url:
        _check_remote(config.env_url)
    if spec is None:
        spec = config.planner.spec()
    if config.recovering and spec.name != "oracle":
        raise CollectError(f"recovering: the recovering planner is the oracle's, not {spec.name!r}")
    policy = policy_of(spec)
    config = config.model_copy(update={"shard": shard, "parents": parents})

    store = open_store(config.out, config.store_config)
    spool_root = config.spool_dir if config.spool_dir is not None else default_spool_dir()
    spool = spool_root / f"{hashlib.sha256(store.root_uri.encode()).hexdigest()[:12]}-{tag}"
    uploader = SpooledUploader(
        store, PARTS, spool, config.part_size, shard=shard, keyed=True, same_records=_same_records
    )
    hooks = _Hooks(on_start, on_episode, stop or threading.Event())
    try:
        return _collect(config, tasks, spec, policy, store, uploader, hooks, started)
    finally:
        uploader.abandon()  # a no-op after a clean close; else the spool keeps what is left


def _same_records(existing: bytes, spooled: Path) -> bool:
    """True when every record of the spooled part is already in the store's copy of its key
    (a retried shard or a racing uploader put them there): dropping ours loses nothing."""
    try:
        theirs = set(part_identities(existing))
        ours = set(part_identities(spooled.read_bytes()))
    except ValueError:
        return False
    return ours <= theirs


def _layout(
    store: ArtifactStore, tasks: Sequence[Task], config: CollectConfig, within_s: float
) -> CollectLayout:
    """The dataset's layout: read it, or write it on the first run; refuse other tasks."""
    ids = [t.id for t in tasks]
    digest = ordered_digest(ids)
    retrying = _retrying(within_s=within_s)
    try:
        found: CollectLayout | None = CollectLayout.model_validate_json(
            retrying(store.get_bytes, LAYOUT)
        )
    except ArtifactNotFound:
        found = None
    except ValidationError as exc:
        raise CollectError(f"{store.uri(LAYOUT)}: corrupt layout: {first_error(exc)}") from None
    if found is None:
        count = (config.shard or (0, 1))[1]
        samples = config.samples_per_task
        # Enough parts that every shard gets one: at most ceil(tasks / ceil(count / samples))
        per_part = min(config.part_size, -(-len(ids) // -(-count // samples)))
        found = CollectLayout(tasks=len(ids), tasks_sha256=digest, tasks_per_part=max(1, per_part))
        # Shards of one batch write the same bytes; the store's copy is the one that holds.
        retrying(store.put_bytes, LAYOUT, found.model_dump_json(indent=2).encode() + b"\n")
        found = CollectLayout.model_validate_json(retrying(store.get_bytes, LAYOUT))
    if found.tasks_sha256 != digest:
        raise CollectError(
            f"{store.root_uri} was laid out for another task list ({found.tasks} tasks, "
            f"tasks_sha256 {found.tasks_sha256[:12]}; these {len(ids)} hash to {digest[:12]}): "
            "collect them to a fresh --out"
        )
    return found


@dataclass
class _Snapshot:
    """What is already collected, read once (uploads paused) before anything new starts."""

    parts: dict[str, PartSummary]  # store key -> summary
    done: set[Identity]  # in the store or in the spool
    won: set[Identity]
    duplicates: int  # identities found twice among the store's parts
    ready: set[str]  # sealed spool parts (file names) awaiting upload
    open: dict[str, set[Identity]]  # open spool parts (file names) and what they hold


def _scan(
    store: ArtifactStore, uploader: SpooledUploader, policy: Policy, within_s: float
) -> _Snapshot:
    """Read the store's parts and the spool's as one snapshot (see the module doc)."""

    def check_policy(trajectory: Trajectory) -> None:
        if trajectory.policy != policy:
            raise CollectError(
                f"{store.root_uri} holds trajectories of another policy "
                f"({trajectory.policy.model_dump_json()}), not {policy.model_dump_json()}: "
                "use a fresh --out"
            )

    retrying = _retrying(within_s=within_s)
    parts: dict[str, PartSummary] = {}
    with uploader.paused():  # a part uploaded between the two reads would be in neither
        keys = [k for k in retrying(store.list, f"{PARTS}/") if k.endswith(".jsonl")]
        spooled = list(uploader.iter_spooled_lines())
        ready = {p.name for p in uploader.pending()}
    for key in keys:
        data = retrying(store.get_bytes, key)
        parts[key] = _summarize(data, store.uri(key), key, check_policy)
    done: set[Identity] = set()
    won: set[Identity] = set()
    duplicates = 0
    for summary in parts.values():
        for pair in summary.keys:
            duplicates += pair in done
            done.add(pair)
        won |= summary.won
    opened: dict[str, set[Identity]] = {}
    for path, number, line in spooled:
        try:
            trajectory = Trajectory.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
            raise CorruptLineError(str(path), number, f"{where}: {first.get('msg')}") from None
        check_policy(trajectory)
        identity = identity_of(trajectory)
        if path.name not in ready:
            opened.setdefault(path.name, set()).add(identity)
        done.add(identity)
        if trajectory.success:
            won.add(identity)
    return _Snapshot(parts, done, won, duplicates, ready, opened)


@dataclass
class _Plan:
    """This run's work: the pairs to run, part by part, and how many each part still needs."""

    mine: list[tuple[Task, int]]  # this shard's pairs
    own: set[str]  # this shard's part names
    pending: list[tuple[Task, int]]
    part_of: dict[Identity, str]
    remaining: dict[str, int]  # open part -> records it still needs
    complete: list[str]  # open parts that hold all they need (seal at once)
    stale: list[str]  # open parts whose key the store already holds (drop)


def _plan(
    tasks: list[Task], layout: CollectLayout, config: CollectConfig, snapshot: _Snapshot
) -> _Plan:
    samples, attempt = config.samples_per_task, config.attempt
    index, count = config.shard or (0, 1)
    blocks = -(-len(tasks) // layout.tasks_per_part)
    in_store = {key.rsplit("/", 1)[-1] for key in snapshot.parts}
    plan = _Plan([], set(), [], {}, {}, [], [])
    for block in range(blocks):
        chunk = range(
            block * layout.tasks_per_part, min(len(tasks), (block + 1) * layout.tasks_per_part)
        )
        for sample in range(samples):
            if (block * samples + sample) % count != index:
                continue
            name = layout.part_of(chunk.start, sample, attempt)
            plan.own.add(name)
            members = [tasks[position] for position in chunk]
            plan.mine += [(task, sample) for task in members]
            if name in in_store:
                if name in snapshot.open:
                    plan.stale.append(name)
                continue
            if name in snapshot.ready:
                continue
            todo = [t for t in members if (t.id, sample, attempt) not in snapshot.done]
            for task in todo:
                plan.part_of[(task.id, sample, attempt)] = name
            plan.pending += [(task, sample) for task in todo]
            if todo:
                plan.remaining[name] = len(todo)
            elif name in snapshot.open:
                plan.complete.append(name)
    return plan


def _collect(
    config: CollectConfig,
    tasks: list[Task],
    spec: PlannerSpec,
    policy: Policy,
    store: ArtifactStore,
    uploader: SpooledUploader,
    hooks: _Hooks,
    started: float,
) -> CollectResult:
    shard = config.shard or (0, 1)
    samples, urls = config.samples_per_task, config.env_url
    index, count = shard
    layout = _layout(store, tasks, config, config.start_timeout_s)
    snapshot = _scan(store, uploader, policy, config.start_timeout_s)
    existing, won, duplicates = snapshot.parts, snapshot.won, snapshot.duplicates
    plan = _plan(tasks, layout, config, snapshot)
    for name in plan.stale:
        uploader.discard(name)
    for name in plan.complete:
        uploader.seal(name)
    mine, pending = plan.mine, plan.pending
    total = len(mine)
    if hooks.on_start is not None:
        hooks.on_start(total, total - len(pending))

    # Per-part summaries of what this run writes, keyed by the part's store key.
    new_parts: dict[str, PartSummary] = {}
    counters = {"ran": 0, "successes": 0, "env_errors": 0, "env_retried": 0}
    shard_label = f"{index}/{count}"

    def record(trajectory: Trajectory, line: bytes) -> None:
        identity = identity_of(trajectory)
        name = plan.part_of[identity]
        uploader.append(line, part=name)
        plan.remaining[name] -= 1
        if plan.remaining[name] == 0:
            uploader.seal(name)
        key = join_key(PARTS, name)
        summary = new_parts.get(key)
        if summary is None:
            summary = new_parts[key] = PartSummary(
                ManifestFile(key=key, sha256="0" * 64, size=0, rows=0)
            )
        summary.keys.append(identity)
        summary.successes += trajectory.success
        if trajectory.success:
            summary.won.add(identity)
        env_error = _side(trajectory.error) == "environment"
        summary.env_errors += env_error
        counters["ran"] += 1
        counters["successes"] += trajectory.success
        counters["env_errors"] += env_error
        if hooks.on_episode is not None:
            hooks.on_episode(
                CollectProgress(
                    total=total,
                    done=total - len(pending) + counters["ran"],
                    ran=counters["ran"],
                    successes=counters["successes"],
                    spooled_parts=len(uploader.pending()),
                    uploaded_parts=len(uploader.uploaded),
                ),
                trajectory,
            )

    interrupted = False
    if pending:
        interrupted = _execute(
            pending,
            spec,
            policy,
            shard_label,
            config.attempt,
            record,
            concurrency=min(config.concurrency, len(pending)),
            make_env=env_maker(urls, config.env_kind),
            faults=(
                InjectionLog(config.transient_error_rate, spec.seed)
                if config.transient_error_rate > 0
                else None
            ),
            planners=_recovering(config) if config.recovering else PlannerFactory,
            max_turns=config.max_turns,
            stop=hooks.stop,
            env_retries=config.env_retries,
            retry_backoff_s=config.env_retry_backoff_s,
            on_retry=lambda trajectory, attempt, delay: _report_retry(
                trajectory, attempt, delay, config.env_retries, counters
            ),
        )

    result = CollectResult(
        out=store.root_uri,
        shard=shard,
        total=total,
        ran=counters["ran"],
        skipped=total - len(pending),
        skipped_successes=sum(1 for task, s in mine if (task.id, s, config.attempt) in won),
        successes=counters["successes"],
        env_errors=counters["env_errors"],
        env_retried=counters["env_retried"],
        parts=[],
        spooled_parts=0,
        spool_dir=uploader.spool_dir,
        repaired=list(uploader.repaired),
        duplicates=duplicates,
        interrupted=interrupted,
    )
    try:
        uploaded = uploader.close(timeout=config.flush_timeout_s)
    except StoreUnavailable as exc:
        result.spooled_parts = len(uploader.pending())
        result.error = str(exc)
        result.elapsed_s = time.perf_counter() - started
        return result
    result.superseded = list(uploader.superseded)

    # Parts recovered from the spool were written by an earlier run, and a part another
    # writer had filled holds their bytes: summarize those from the store; parts this run
    # uploaded get their final hashes, checked against the store's (a racing writer's PUT
    # may have replaced ours with the same records).
    for entry in uploaded:
        if entry.key in new_parts and entry.key not in result.superseded:
            new_parts[entry.key].entry = entry
            stored = _retrying()(store.stat, entry.key)
            if stored.sha256 == entry.sha256:
                continue
        new_parts.pop(entry.key, None)
        data = _retrying()(store.get_bytes, entry.key)
        existing[entry.key] = _summarize(data, store.uri(entry.key), entry.key)
    everything = {**existing, **new_parts}
    own = {k: v for k, v in sorted(everything.items()) if k.rsplit("/", 1)[-1] in plan.own}
    result.parts = [p.entry for p in own.values()]

    task_ids = [t.id for t in tasks]
    lineage_params = {
        "samples": samples,
        "attempt": config.attempt,
        "tasks_per_part": layout.tasks_per_part,
        "env": {"kind": "remote" if urls else config.env_kind, "urls": urls},
        "max_turns": config.max_turns,
        "planner": {"name": spec.name, "seed": spec.seed, "noise": spec.noise},
        **({"recovery": {"mistake_rate": config.mistake_rate}} if config.recovering else {}),
        **(
            {"transient_error_rate": config.transient_error_rate}
            if config.transient_error_rate > 0
            else {}
        ),
        **config.params,
    }
    generators = sorted({str(t.lineage.get("generator", t.source)) for t in tasks})
    lineage = Lineage.for_tasks(
        task_ids,
        policy=policy.model_dump(mode="json"),
        generator=config.generator or ",".join(generators),
        parents=config.parents,
        params=lineage_params,
    )
    dataset_name = config.name or store.root_uri.rstrip("/").rsplit("/", 1)[-1]
    shard_manifest = DatasetManifest(
        name=dataset_name,
        kind="trajectories",
        files=result.parts,
        counts={**_counts(own.values()), "tasks": len(task_ids), "samples": samples},
        lineage=lineage,
        extra={
            "collector": GENERATOR,
            "shard": f"{index}/{count}",
            "pairs": total,
            "parts": {k: {"successes": v.successes, "env_errors": v.env_errors,
                          "groups": sorted({key[0] for key in v.keys})}
                      for k, v in own.items()},
        },
    )  # fmt: skip
    if interrupted:
        return _finish(result, started)
    if count == 1:
        manifest = shard_manifest.model_copy(
            update={
                "files": [p.entry for _, p in sorted(everything.items())],
                "counts": {
                    **_counts(everything.values()),
                    "tasks": len(task_ids),
                    "samples": samples,
                },
                "extra": {"collector": GENERATOR, "shards": 1, "pairs": total},
            }
        )
        write_manifest(store, "", manifest)
        result.manifest_uri = store.uri("manifest.json")
        return _finish(result, started)
    shard_key = join_key(SHARDS, f"{shard_tag(shard)}.json")
    _retrying()(store.put_bytes, shard_key, shard_manifest.model_dump_json(indent=2).encode())
    result.shard_manifest_uri = store.uri(shard_key)
    merged = _merge_shards(store, count, tasks=len(task_ids), samples=samples)
    if merged is not None:
        result.manifest_uri = store.uri("manifest.json")
    return _finish(result, started)


def _finish(result: CollectResult, started: float) -> CollectResult:
    result.elapsed_s = time.perf_counter() - started
    return result


def _merge_shards(
    store: ArtifactStore, count: int, *, tasks: int, samples: int
) -> DatasetManifest | None:
    """Write `manifest.json` when all `count` shard manifests are in the store (else None)."""
    suffix = f"-of-{count:05d}.json"
    keys = [k for k in _retrying()(store.list, f"{SHARDS}/") if k.endswith(suffix)]
    if len(keys) < count:
        return None
    manifests = [
        DatasetManifest.model_validate_json(_retrying()(store.get_bytes, k)) for k in sorted(keys)
    ]
    files: dict[str, ManifestFile] = {}
    parts: dict[str, PartSummary] = {}
    for shard_manifest in manifests:
        details = shard_manifest.extra.get("parts") or {}
        for entry in shard_manifest.files:
            files[entry.key] = entry
            info = details.get(entry.key, {})
            parts[entry.key] = PartSummary(
                entry,
                keys=[(g, 0, 0) for g in info.get("groups", [])],
                successes=int(info.get("successes", 0)),
                env_errors=int(info.get("env_errors", 0)),
            )
    # Parts no shard manifest lists (an earlier run with another shard count): read them.
    for key in _retrying()(store.list, f"{PARTS}/"):
        if key.endswith(".jsonl") and key not in parts:
            parts[key] = _summarize(_retrying()(store.get_bytes, key), store.uri(key), key)
            files[key] = parts[key].entry
    first = manifests[0]
    lineage = first.lineage.model_copy(deep=True)
    manifest = DatasetManifest(
        name=first.name,
        kind="trajectories",
        files=[files[k] for k in sorted(files)],
        counts={**_counts(parts.values()), "tasks": tasks, "samples": samples},
        lineage=lineage,
        extra={"collector": GENERATOR, "shards": count},
    )
    write_manifest(store, "", manifest)
    return manifest


def _report_retry(
    trajectory: Trajectory, attempt: int, delay: float, retries: int, counters: dict[str, int]
) -> None:
    """Say on stderr that an environment-side failure ended an episode that runs again."""
    with _REPORT_LOCK:  # called from the worker threads
        counters["env_retried"] += 1
        print(
            f"episode {trajectory.id}: {trajectory.error}; "
            f"retry {attempt}/{retries} in {delay:.1f}s",
            file=sys.stderr,
            flush=True,
        )


def _execute(
    pending: list[tuple[Task, int]],
    spec: PlannerSpec,
    policy: Policy,
    shard_label: str,
    attempt: int,
    record: Callable[[Trajectory, bytes], None],
    *,
    concurrency: int,
    make_env: Callable[[int], Environment],
    faults: InjectionLog | None,
    planners: Callable[[PlannerSpec], Callable[[], Planner]],
    max_turns: int,
    stop: threading.Event,
    env_retries: int,
    retry_backoff_s: float,
    on_retry: Callable[[Trajectory, int, float], None],
) -> bool:
    """Run the episodes on worker threads; `record` each in this thread. True if interrupted.

    With `faults`, every worker's environment injects transient errors and each trajectory's
    injected steps are annotated before it is recorded."""
    if faults is not None:
        inner = make_env
        make_env = lambda worker: faults.wrap(inner(worker))  # noqa: E731

    def labelled(trajectory: Trajectory) -> None:
        if faults is not None:
            faults.mark(trajectory)
        trajectory.metadata["group"] = trajectory.task.id
        trajectory.metadata["shard"] = shard_label
        trajectory.metadata["attempt"] = attempt
        record(trajectory, trajectory.model_dump_json().encode())

    return run_episodes(
        pending,
        spec,
        policy,
        labelled,
        concurrency=concurrency,
        make_env=make_env,
        max_turns=max_turns,
        stop=stop,
        name="collect",
        env_retries=env_retries,
        retry_backoff_s=retry_backoff_s,
        on_retry=on_retry,
        planners=planners,
    )


def _recovering(config: CollectConfig) -> Callable[[PlannerSpec], Callable[[], Planner]]:
    """Per-episode factories of the recovering oracle (seeded by the spec's seed)."""

    def factory(spec: PlannerSpec) -> Callable[[], Planner]:
        return lambda: RecoveringPlanner(mistake_rate=config.mistake_rate, seed=spec.seed)

    return factory


def read_collected(out: str, config: StoreConfig | None = None) -> list[Trajectory]:
    """Every trajectory under `<out>/parts/` (for tests, small datasets and inspection)."""
    store = open_store(out, config)
    trajectories: list[Trajectory] = []
    for key in store.list(f"{PARTS}/"):
        if key.endswith(".jsonl"):
            data = store.get_bytes(key)
            for number, line in enumerate(data.split(b"\n"), start=1):
                if line.strip():
                    try:
                        trajectories.append(Trajectory.model_validate_json(line))
                    except ValidationError as exc:
                        raise CorruptLineError(store.uri(key), number, str(exc)) from None
    return trajectories


__all__ = [
    "DEFAULT_FLUSH_TIMEOUT_S",
    "DEFAULT_PART_SIZE",
    "CollectConfig",
    "CollectError",
    "CollectProgress",
    "CollectResult",
    "collect",
    "parse_shard",
    "read_collected",
    "run_collect",
    "shard_from_env",
]
