"""Trajectory collection: k samples per task, in parallel, streamed to an artifact store.

`run_collect(config)` (a `CollectConfig`: tasks source, planner, samples, shard, output, ...)
is what `qpa collect` (and each pod of a TaskBatch's indexed Job, from its work order) runs;
`collect(tasks, spec, samples_per_task=k, out="s3://bucket/tb-1", shard=(i, n))` is the same for a
caller that already holds the tasks and the planner spec:

- **Work.** Every (task, sample) pair, task-major (pair index = task position * k + sample);
  shard i/n takes the pairs whose index is i modulo n, so n shards cover every pair exactly
  once. Each trajectory's `metadata` records `group` (the task id: the RL group of its k
  samples) and `shard` ("i/n"). For the `noisy` planner sample s uses seed `seed + s`.
- **Workers.** `concurrency` threads, each holding one environment for its life: in-process
  (`make_env(env_kind)`) or a `RemoteEnv` on one of the `env_url`s (round-robin). A fresh
  planner per episode comes from `PlannerFactory` (model backends are shared).
- **Environment failures.** An episode an environment-side failure ended (a RolloutPool pod
  that died mid-episode, a lost session) is reported on stderr and run again, up to
  `env_retries` times with a doubling backoff from `env_retry_backoff_s`; the trajectory kept is
  the last attempt's, with the earlier errors in `metadata["env_failures"]` (`env_retried`
  counts the reruns). Only a failure that outlasts the retries is recorded as one.
- **Streaming.** The calling thread appends each finished trajectory to a `SpooledUploader`:
  parts of `part_size` lines land at `<out>/parts/part-<i>-of-<n>-<seq>.jsonl` while collection
  goes on. When the store is down, parts wait in the local spool (retried with backoff) and
  upload once it is back; nothing is lost, and deterministic part names plus hash checks mean
  nothing is uploaded twice.
- **Resume.** Pairs already in uploaded parts (of any shard) or in the spool (a crash's
  leftovers, a torn last line repaired) are skipped. A corrupt line in a part is an error naming
  the part's URI and the line. Parts holding another policy's trajectories are refused.
- **Manifests.** At the end each shard writes `<out>/shards/<i>-of-<n>.json` (its parts, counts,
  lineage); the shard that finds all n shard manifests present writes `<out>/manifest.json`
  (a `DatasetManifest` of kind "trajectories": every part with hash, size and rows, the counts,
  the policy and the lineage). Unsharded, `manifest.json` is written directly.
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

from pydantic import ValidationError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

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
    write_manifest,
)
from qpa.store.spool import SpooledUploader, shard_tag

PARTS = "parts"
SHARDS = "shards"
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


@dataclass
class PartSummary:
    """What one part holds: its manifest entry and the episodes in it."""

    entry: ManifestFile
    keys: list[tuple[str, int]] = field(default_factory=list)
    successes: int = 0
    env_errors: int = 0
    won: set[tuple[str, int]] = field(default_factory=set)  # the pairs that succeeded


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
        summary.keys.append((trajectory.task.id, trajectory.sample))
        summary.successes += trajectory.success
        if trajectory.success:
            summary.won.add((trajectory.task.id, trajectory.sample))
        summary.env_errors += _side(trajectory.error) == "environment"
        if on_record is not None:
            on_record(trajectory)
    summary.entry.rows = rows
    return summary


def _retrying(attempts: int = 6) -> Retrying:
    return Retrying(
        stop=stop_after_attempt(attempts),
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
        "groups": len({task for p in parts for task, _ in p.keys}),
        "parts": len(parts),
    }


def default_spool_dir() -> Path:
    return Path(os.environ.get("QPA_SPOOL_DIR") or Path(tempfile.gettempdir()) / "qpa-spool")


def _check_remote(urls: Sequence[str]) -> None:
    check_remote(urls, CollectError)


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
    uploader = SpooledUploader(store, PARTS, spool, config.part_size, shard=shard)
    hooks = _Hooks(on_start, on_episode, stop or threading.Event())
    try:
        return _collect(config, tasks, spec, policy, store, uploader, hooks, started)
    finally:
        uploader.abandon()  # a no-op after a clean close; else the spool keeps what is left


def _scan(
    store: ArtifactStore, uploader: SpooledUploader, policy: Policy
) -> tuple[dict[str, PartSummary], set[tuple[str, int]], set[tuple[str, int]], int]:
    """Parts already in the store (summarized), every collected pair and the successful ones
    (store and spool), and how many pairs appear twice."""

    def check_policy(trajectory: Trajectory) -> None:
        if trajectory.policy != policy:
            raise CollectError(
                f"{store.root_uri} holds trajectories of another policy "
                f"({trajectory.policy.model_dump_json()}), not {policy.model_dump_json()}: "
                "use a fresh --out"
            )

    parts: dict[str, PartSummary] = {}
    with uploader.paused():  # a part uploaded between the two reads would be in neither
        keys = [k for k in _retrying()(store.list, f"{PARTS}/") if k.endswith(".jsonl")]
        spooled = list(uploader.iter_spooled_lines())
    for key in keys:
        data = _retrying()(store.get_bytes, key)
        parts[key] = _summarize(data, store.uri(key), key, check_policy)
    done: set[tuple[str, int]] = set()
    won: set[tuple[str, int]] = set()
    duplicates = 0
    for summary in parts.values():
        for pair in summary.keys:
            duplicates += pair in done
            done.add(pair)
        won |= summary.won
    for path, number, line in spooled:
        try:
            trajectory = Trajectory.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
            raise CorruptLineError(str(path), number, f"{where}: {first.get('msg')}") from None
        check_policy(trajectory)
        done.add((trajectory.task.id, trajectory.sample))
        if trajectory.success:
            won.add((trajectory.task.id, trajectory.sample))
    return parts, done, won, duplicates


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
    tag = shard_tag(shard)
    existing, done, won, duplicates = _scan(store, uploader, policy)
    mine = [
        (task, sample)
        for position, task in enumerate(tasks)
        for sample in range(samples)
        if (position * samples + sample) % count == index
    ]
    pending = [(t, s) for t, s in mine if (t.id, s) not in done]
    total = len(mine)
    if hooks.on_start is not None:
        hooks.on_start(total, total - len(pending))

    # Per-part summaries of what this run writes, keyed by the part's store key.
    new_parts: dict[str, PartSummary] = {}
    counters = {"ran": 0, "successes": 0, "env_errors": 0, "env_retried": 0}
    shard_label = f"{index}/{count}"

    def record(trajectory: Trajectory, line: bytes) -> None:
        part = uploader.append(line)
        key = join_key(PARTS, part)
        summary = new_parts.get(key)
        if summary is None:
            summary = new_parts[key] = PartSummary(
                ManifestFile(key=key, sha256="0" * 64, size=0, rows=0)
            )
        summary.keys.append((trajectory.task.id, trajectory.sample))
        summary.successes += trajectory.success
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
        skipped_successes=sum(1 for task, s in mine if (task.id, s) in won),
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

    # Parts recovered from the spool were written by an earlier run: summarize them from the
    # store (they are small, and now uploaded); parts of this run get their final hashes.
    for entry in uploaded:
        if entry.key in new_parts:
            new_parts[entry.key].entry = entry
        elif entry.key not in existing:
            data = _retrying()(store.get_bytes, entry.key)
            existing[entry.key] = _summarize(data, store.uri(entry.key), entry.key)
    everything = {**existing, **new_parts}
    prefix = f"{PARTS}/part-{tag}-"
    own = {k: v for k, v in sorted(everything.items()) if k.startswith(prefix)}
    result.parts = [p.entry for p in own.values()]

    task_ids = [t.id for t in tasks]
    lineage_params = {
        "samples": samples,
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
                          "groups": sorted({t for t, _ in v.keys})}
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
    shard_key = join_key(SHARDS, f"{tag}.json")
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
                keys=[(g, 0) for g in info.get("groups", [])],
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
