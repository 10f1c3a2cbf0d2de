"""The benchmark runner: every selected task k times, in parallel, resumable.

- **Work**: the (task, sample) episodes not yet in `DIR/trajectories.jsonl`, sample-major (all
  tasks' sample 0 first, so an interrupted run already has a k=1 result).
- **Workers**: `concurrency` threads; each holds its own environment for its whole life (an
  in-process one from `make_env(kind)`, or a `RemoteEnv` on one of the `env_urls`, spread
  round-robin) and gets a fresh planner per episode from `PlannerFactory` (model backends are
  shared). For the `noisy` planner, sample s uses seed `seed + s`, so samples differ.
  Threads pay off when episodes wait on I/O (environment servers, model endpoints); in-process
  sandbox episodes are CPU-bound and hold the GIL.
- **One writer**: the calling thread appends each finished episode as one JSON line and flushes
  it, so a crash loses at most the episodes in flight (plus the one line being written).
- **Resume**: the done-set is the (task id, sample) pairs already in the file. A last line cut
  by a crash is dropped and the file rewritten cleanly (atomically); a corrupt line elsewhere
  is an error naming the line. With `retry_errors`, episodes that ended with an
  environment-side error (a dead server or endpoint) are dropped from the file and run again.
  A file holding another policy's episodes is refused (one directory, one policy), and so is a
  folder another run is writing (an advisory lock on `DIR/run.lock`).
- `DIR/run.json` records the selection (so a report can be re-scored later); scoring and the
  report files are `finish(...)`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qpa.bench.scoring import (
    EpisodeRecord,
    PriceTable,
    Report,
    describe_validation_error,
    error_side,
    score,
)
from qpa.contract import CAPABILITIES, CorruptLineError, Environment, Policy, Task, Trajectory
from qpa.harness.factory import PlannerSpec
from qpa.harness.pool import check_remote, env_maker, policy_of, run_episodes
from qpa.harness.runner import DEFAULT_MAX_TURNS

TRAJECTORIES = "trajectories.jsonl"
MANIFEST = "run.json"
LOCK = "run.lock"


class BenchError(RuntimeError):
    """The benchmark cannot run or resume as asked (the message says why and what to do)."""


# --------------------------------------------------------------------------- selection


def select_tasks(
    tasks: Iterable[Task],
    *,
    split: str | None = "test",
    domains: Sequence[str] = (),
    capabilities: Sequence[str] = (),
    limit: int | None = None,
) -> list[Task]:
    """Filter tasks by split, domains and capabilities (any of them), then keep `limit`.

    The limit takes tasks round-robin across domains and, within a domain, across templates
    (first variant of each, then the second, ...), so a small subset still covers the suite.
    """
    unknown = [c for c in capabilities if c not in CAPABILITIES]
    if unknown:
        raise BenchError(
            f"unknown capability {unknown[0]!r}; choose from {', '.join(CAPABILITIES)}"
        )
    chosen = [
        t
        for t in tasks
        if (split is None or t.split == split)
        and (not domains or t.domain in domains)
        and (not capabilities or any(c in t.capabilities for c in capabilities))
    ]
    if limit is None or limit >= len(chosen):
        return chosen
    if limit < 0:
        raise BenchError(f"--limit must be positive, got {limit}")
    variant: dict[str, int] = defaultdict(int)
    template_rank: dict[str, dict[str, int]] = defaultdict(dict)
    domain_rank = {d: i for i, d in enumerate(sorted({t.domain for t in chosen}))}
    keys: list[tuple[int, int, int, int]] = []
    for position, task in enumerate(chosen):
        template = task.template or task.id
        ranks = template_rank[task.domain]
        ranks.setdefault(template, len(ranks))
        keys.append((variant[template], ranks[template], domain_rank[task.domain], position))
        variant[template] += 1
    order = sorted(range(len(chosen)), key=keys.__getitem__)[:limit]
    return [chosen[i] for i in sorted(order)]


class RunManifest(BaseModel):
    """`DIR/run.json`: what the run was asked to cover (for re-scoring and for humans)."""

    model_config = ConfigDict(extra="forbid")

    suite: str
    split: str
    seed: int = 0
    samples: int = Field(ge=1)
    policy: Policy
    task_ids: list[str]
    filters: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, Any] = Field(default_factory=dict)
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def load_manifest(out_dir: str | Path) -> RunManifest:
    path = Path(out_dir) / MANIFEST
    try:
        return RunManifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise BenchError(f"{path}: cannot read: {exc.strerror}") from None
    except ValidationError as exc:
        raise BenchError(f"{path}: {describe_validation_error(exc)}") from None


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- resume


@dataclass
class Resume:
    """What an existing trajectories file already holds."""

    records: dict[tuple[str, int], EpisodeRecord] = field(default_factory=dict)
    dropped_tail: bool = False  # a last line cut by a crash was dropped
    dropped_duplicates: int = 0
    dropped_errors: int = 0  # environment-side failures dropped to be run again
    rewritten: bool = False


def scan_trajectories(path: str | Path, *, retry_errors: bool = False) -> Resume:
    """Read the done-set of a trajectories file, repairing what a crash can leave behind."""
    path = Path(path)
    resume = Resume()
    if not path.exists():
        return resume
    data = path.read_bytes()
    lines = data.split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    cut = last == len(lines) - 1  # the last line has no newline: a crash cut it short
    kept: list[bytes] = []
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            trajectory = Trajectory.model_validate_json(raw)
        except ValidationError as exc:
            if index == last and cut:
                resume.dropped_tail = True
                continue
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
            raise CorruptLineError(str(path), index + 1, f"{where}: {first.get('msg')}") from None
        record = EpisodeRecord.of(trajectory)
        if record.key in resume.records:
            resume.dropped_duplicates += 1
            continue
        if retry_errors and record.error and error_side(record.error) == "environment":
            resume.dropped_errors += 1
            continue
        resume.records[record.key] = record
        kept.append(raw)
    clean = b"".join(raw + b"\n" for raw in kept)
    if clean != data:
        _atomic_write(path, clean)
        resume.rewritten = True
    return resume


# --------------------------------------------------------------------------- the run


@dataclass
class BenchRun:
    """The outcome of `run_bench`: every selected episode's record, new and resumed."""

    out_dir: Path
    task_ids: list[str]
    samples: int
    policy: Policy
    records: list[EpisodeRecord]
    ran: int
    skipped: int
    resume: Resume
    interrupted: bool = False
    elapsed_s: float = 0.0

    @property
    def trajectories_path(self) -> Path:
        return self.out_dir / TRAJECTORIES

    @property
    def missing(self) -> int:
        return len(self.task_ids) * self.samples - len(self.records)


def _check_remote(urls: Sequence[str]) -> None:
    check_remote(urls, BenchError)


def run_bench(
    tasks: Sequence[Task],
    spec: PlannerSpec,
    out_dir: str | Path,
    *,
    samples: int = 1,
    concurrency: int = 1,
    env_urls: Sequence[str] = (),
    env_kind: str = "sandbox",
    max_turns: int = DEFAULT_MAX_TURNS,
    retry_errors: bool = False,
    seed: int = 0,
    filters: dict[str, Any] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    stop: threading.Event | None = None,
) -> BenchRun:
    """Run every (task, sample) episode not yet in `out_dir`; returns all selected records.

    `on_start(total, done)` is called once before work starts and `on_episode(record)` after
    each episode is written (both in the calling thread). Setting `stop` (or Ctrl-C) lets the
    episodes in flight finish and write, then returns with `interrupted=True`. Raises
    `BenchError` for a bad request and re-raises a worker's unexpected exception.
    """
    if samples < 1:
        raise BenchError(f"--samples must be at least 1, got {samples}")
    if concurrency < 1:
        raise BenchError(f"--concurrency must be at least 1, got {concurrency}")
    if not tasks:
        raise BenchError("no tasks selected: check --split, --domain, --capability and --limit")
    if len({t.id for t in tasks}) != len(tasks):
        raise BenchError("the selection holds the same task id twice")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        ids = [t.id for t in tasks]
        path = out / TRAJECTORIES
        policy = policy_of(spec)
        resume = scan_trajectories(path, retry_errors=retry_errors)
        other = next((r.policy for r in resume.records.values() if r.policy != policy), None)
        if other is not None:
            raise BenchError(
                f"{path} holds episodes of another policy ({other.model_dump_json()}),"
                f" not {policy.model_dump_json()}: use a fresh --out directory"
            )
        if env_urls:
            _check_remote(env_urls)
        manifest = RunManifest(
            suite=tasks[0].suite,
            split=tasks[0].split,
            seed=seed,
            samples=samples,
            policy=policy,
            task_ids=ids,
            filters=filters or {},
            env={"kind": "remote" if env_urls else env_kind, "urls": list(env_urls)},
        )
        _atomic_write(out / MANIFEST, manifest.model_dump_json(indent=2).encode())

        pending = [
            (task, sample)
            for sample in range(samples)
            for task in tasks
            if (task.id, sample) not in resume.records
        ]
        total = len(tasks) * samples
        if on_start is not None:
            on_start(total, total - len(pending))
        started = time.perf_counter()
        ran, interrupted = 0, False
        if pending:
            ran, interrupted = _execute(
                pending,
                spec,
                policy,
                path,
                concurrency=min(concurrency, len(pending)),
                make_env=env_maker(env_urls, env_kind),
                max_turns=max_turns,
                resume=resume,
                on_episode=on_episode,
                stop=stop or threading.Event(),
            )
        selected = set(ids)
        records = [
            r for r in resume.records.values() if r.task_id in selected and r.sample < samples
        ]
        return BenchRun(
            out_dir=out,
            task_ids=ids,
            samples=samples,
            policy=policy,
            records=records,
            ran=ran,
            skipped=total - len(pending),
            resume=resume,
            interrupted=interrupted,
            elapsed_s=time.perf_counter() - started,
        )


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold `DIR/run.lock` (an advisory lock): two runs never write one folder at once."""
    with open(out / LOCK, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise BenchError(
                f"{out} is being written by another `qpa bench run` ({holder}); "
                "wait for it or use another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _execute(
    pending: list[tuple[Task, int]],
    spec: PlannerSpec,
    policy: Policy,
    path: Path,
    *,
    concurrency: int,
    make_env: Callable[[int], Environment],
    max_turns: int,
    resume: Resume,
    on_episode: Callable[[EpisodeRecord], None] | None,
    stop: threading.Event,
) -> tuple[int, bool]:
    """Run the episodes; append each to `path` as it finishes. Returns (ran, interrupted)."""
    ran = 0
    with open(path, "ab") as stream:

        def record(trajectory: Trajectory) -> None:
            nonlocal ran
            stream.write(trajectory.model_dump_json().encode() + b"\n")
            stream.flush()
            episode = EpisodeRecord.of(trajectory)
            resume.records[episode.key] = episode
            ran += 1
            if on_episode is not None:
                on_episode(episode)

        interrupted = run_episodes(
            pending,
            spec,
            policy,
            record,
            concurrency=concurrency,
            make_env=make_env,
            max_turns=max_turns,
            stop=stop,
            name="bench",
        )
    return ran, interrupted


# --------------------------------------------------------------------------- scoring


def finish(
    run: BenchRun,
    prices: PriceTable | None = None,
    *,
    plots: bool = True,
) -> Report:
    """Score the run's selected episodes and write `report.json`, `report.md` and the plots."""
    from qpa.bench.report import write_report

    report = score(run.records, prices, samples=run.samples, expected_tasks=run.task_ids)
    write_report(report, run.out_dir, plots=plots)
    return report


def rescore(out_dir: str | Path, prices: PriceTable | None = None, *, plots: bool = True) -> Report:
    """Score `DIR/trajectories.jsonl` again for the selection in `DIR/run.json`; rewrite reports."""
    from qpa.bench.report import write_report
    from qpa.contract import read_trajectories

    out = Path(out_dir)
    manifest = load_manifest(out)
    path = out / TRAJECTORIES
    if not path.exists():
        raise BenchError(f"{path}: no trajectories to score")
    report = score(
        (EpisodeRecord.of(t) for t in read_trajectories(path)),
        prices,
        samples=manifest.samples,
        expected_tasks=manifest.task_ids,
    )
    write_report(report, out, plots=plots)
    return report
