"""`qpa collect`: k samples per task, in parallel, streamed to an artifact store (resumable).

    qpa collect --suite mobilepa --split train --planner oracle -k 8 --out s3://qpa/tb-1
    qpa collect --tasks s3://qpa/tasks/gen-3/tasks.jsonl ... --shard 3/8 --env-url http://env:8000
    qpa collect ... --shard-from-env --shards 8       # in an indexed Job (JOB_COMPLETION_INDEX)
    qpa collect --spec /etc/qpa/order/workorder.yaml  # a TaskBatch's worker pod

The flags build a `CollectConfig` here, and `--spec` builds it from a TaskBatch's work order
(`CollectConfig.from_taskbatch`, shard JOB_COMPLETION_INDEX of the spec's shards); both then
run `qpa.data.collect.run_collect`. With `--spec` (and `--json`) the result is printed as a
`CollectSummary`, the typed termination message the operator reads.

S3 endpoint and credentials come from the environment (`QPA_S3_ENDPOINT`, `AWS_ACCESS_KEY_ID`
/ `AWS_SECRET_ACCESS_KEY` or `QPA_S3_ACCESS_KEY_FILE` / `QPA_S3_SECRET_KEY_FILE`), never from
the URI. Exit status: 0 done, 1 parts still in the local spool (the store stayed down: rerun
to upload them), 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from qpa.api.v1alpha1 import (
    TaskBatch,
    TaskGenerator,
    TaskSource,
    WorkOrder,
    WorkOrderError,
    first_error,
)
from qpa.api.v1alpha1.taskbatch import CollectSummary
from qpa.cli import app
from qpa.cli.common import console, die, err_console, print_json
from qpa.cli.options import (
    ApiKeyEnvOpt,
    HarnessConfigOpt,
    ModelOpt,
    ModelPathOpt,
    ModelUrlOpt,
    NoiseOpt,
)
from qpa.contract import SPLITS, CorruptLineError, Task, Trajectory
from qpa.data.collect import (
    CollectError,
    CollectProgress,
    CollectResult,
    parse_shard,
    run_collect,
    shard_from_env,
)
from qpa.data.collect_config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_FLUSH_TIMEOUT_S,
    DEFAULT_PART_SIZE,
    DEFAULT_START_TIMEOUT_S,
    CollectConfig,
    PlannerConfig,
)
from qpa.data.tasks import select_tasks
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.envs.suites import suite_env_kind
from qpa.harness.factory import PLANNER_NAMES, PlannerSpec
from qpa.harness.runner import DEFAULT_MAX_TURNS
from qpa.store import StoreConfig, StoreError


@app.command("collect")
def collect_command(
    ctx: typer.Context,
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="Dataset root: folder, file:// or s3:// URI."),
    ] = None,
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A TaskBatch work order: the whole collection (no other flag but --json).",
        ),
    ] = None,
    tasks: Annotated[
        str | None,
        typer.Option(help="Tasks JSONL (path or URI) or a tasks dataset URI (else --suite)."),
    ] = None,
    suite: Annotated[str, typer.Option("--suite", "-s", help="Task suite.")] = DEFAULT_SUITE,
    split: Annotated[
        str | None,
        typer.Option(
            help="Only tasks of this split: train, validation, test or all "
            "(default: train for --suite, all for --tasks)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Suite seed (0 = canonical).")] = CANONICAL_SEED,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many tasks, round-robin by domain.")
    ] = None,
    domain: Annotated[list[str] | None, typer.Option(help="Only these domains (repeat).")] = None,
    capability: Annotated[
        list[str] | None,
        typer.Option(help="Only tasks exercising any of these capabilities (repeat)."),
    ] = None,
    task_id: Annotated[
        list[str] | None, typer.Option("--task-id", help="Only these task ids (repeat).")
    ] = None,
    planner: Annotated[str, typer.Option(help=f"One of: {', '.join(PLANNER_NAMES)}.")] = "oracle",
    samples: Annotated[
        int,
        typer.Option(
            "--samples-per-task", "--samples", "-k", min=1, help="Samples per task (group size)."
        ),
    ] = 1,
    shard: Annotated[str | None, typer.Option(help="This worker's shard i/n.")] = None,
    shard_env: Annotated[
        bool,
        typer.Option(
            "--shard-from-env", help="Shard index from JOB_COMPLETION_INDEX (indexed Jobs)."
        ),
    ] = False,
    shards: Annotated[
        int | None,
        typer.Option(min=1, help="Shard count with --shard-from-env (default QPA_SHARD_COUNT)."),
    ] = None,
    env_url: Annotated[
        list[str] | None,
        typer.Option(help="Environment server URL (repeat, or comma-separate, to spread)."),
    ] = None,
    env_kind: Annotated[
        str | None,
        typer.Option(help="In-process environment kind (default: the suite's own)."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-j", min=1, help="Episodes in parallel.")
    ] = DEFAULT_CONCURRENCY,
    spool_dir: Annotated[
        Path | None,
        typer.Option(help="Local spool for parts awaiting upload (default $QPA_SPOOL_DIR or tmp)."),
    ] = None,
    part_size: Annotated[int, typer.Option(min=1, help="Trajectories per part.")] = (
        DEFAULT_PART_SIZE
    ),
    flush_timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the store at the end.")
    ] = DEFAULT_FLUSH_TIMEOUT_S,
    max_turns: Annotated[int, typer.Option(min=1)] = DEFAULT_MAX_TURNS,
    attempt: Annotated[
        int,
        typer.Option(
            min=0,
            max=99,
            help="Attempt of the batch (part of each trajectory's identity: a new attempt "
            "collects the same pairs again into their own parts).",
        ),
    ] = 0,
    start_timeout: Annotated[
        float,
        typer.Option(min=0, help="Seconds to wait for an unreachable store at the start."),
    ] = DEFAULT_START_TIMEOUT_S,
    name: Annotated[str | None, typer.Option(help="Dataset name in the manifest.")] = None,
    s3_endpoint: Annotated[
        str | None, typer.Option(help="S3 endpoint (default QPA_S3_ENDPOINT).")
    ] = None,
    model_url: ModelUrlOpt = None,
    model: ModelOpt = "planner",
    model_path: ModelPathOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    harness_config: HarnessConfigOpt = None,
    harness_version: Annotated[
        str | None,
        typer.Option(help="Harness version recorded in every trajectory (default: the config's)."),
    ] = None,
    noise: NoiseOpt = 0.5,
    planner_seed: Annotated[int, typer.Option(help="Seed of the noisy planner.")] = 0,
    json_: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Collect k trajectories per task into OUT/parts/*.jsonl and OUT/manifest.json.

    Rerunning with the same --out (and spool) skips what is already collected.
    """
    try:
        if spec_file is not None:
            given = ("COMMANDLINE", "ENVIRONMENT")  # by name: typer may ship its own click
            extra = [
                param.opts[0]
                for param in ctx.command.params
                if param.name not in ("spec_file", "json_")
                and param.name is not None
                and getattr(ctx.get_parameter_source(param.name), "name", None) in given
            ]
            if extra:
                die(f"--spec holds the whole collection; drop {', '.join(extra)}")
            order = WorkOrder.load(spec_file, TaskBatch)
            count = order.resource.spec.shards or order.resource.spec.parallelism
            index = (
                shard_from_env(count, os.environ)[0]
                if count > 1 or "JOB_COMPLETION_INDEX" in os.environ
                else 0
            )
            config = CollectConfig.from_taskbatch(order, index)
        else:
            if out is None:
                die("--out is required (or --spec with a work order)")
            if shard is not None and shard_env:
                die("use --shard or --shard-from-env, not both")
            if split is None:
                split = "all" if tasks is not None else "train"
            if split not in (*SPLITS, "all"):
                die(f"unknown split {split!r}; choose from {', '.join(SPLITS)} or all")
            store = StoreConfig.from_env()
            if s3_endpoint:
                store = StoreConfig.model_validate({**store.model_dump(), "endpoint": s3_endpoint})
            config = CollectConfig(
                out=out,
                source=TaskSource(
                    generator=None if tasks is not None else TaskGenerator(suite=suite, seed=seed),
                    dataset_uri=None if tasks is None else _as_uri(tasks),
                    split=None if split == "all" else split,
                    domains=domain or [],
                    capabilities=capability or [],
                    task_ids=task_id or [],
                    limit=limit,
                ),
                planner=PlannerConfig(
                    name=planner,
                    model_url=model_url,
                    model=model,
                    model_uri=model_path,
                    api_key_env=api_key_env,
                    harness_config=harness_config,
                    harness_version=harness_version,
                    noise=noise,
                    seed=planner_seed,
                ),
                samples=samples,
                shard=(
                    parse_shard(shard)
                    if shard is not None
                    else shard_from_env(shards, os.environ)
                    if shard_env
                    else None
                ),
                env_url=env_url or [],
                env_kind=env_kind
                or (suite_env_kind(suite) if tasks is None and not env_url else "sandbox"),
                concurrency=concurrency,
                spool_dir=spool_dir,
                part_size=part_size,
                flush_timeout_s=flush_timeout,
                max_turns=max_turns,
                attempt=attempt,
                start_timeout_s=start_timeout,
                name=name,
                store_config=store,
            )
        planner_spec = config.planner.spec()
        assert config.source is not None
        selected = select_tasks(config.source, config.store_config)
    except ValidationError as exc:
        die(first_error(exc))
    except (StoreError, CorruptLineError, WorkOrderError, ValueError, KeyError, OSError) as exc:
        die(str(exc))
    result = _run(config, selected, planner_spec, quiet=json_ or spec_file is not None)
    summary = CollectSummary(
        out=result.out,
        shard=f"{result.shard[0]}/{result.shard[1]}",
        total=result.total,
        ran=result.ran,
        skipped=result.skipped,
        skipped_successes=result.skipped_successes,
        successes=result.successes,
        env_errors=result.env_errors,
        parts=len(result.parts),
        spooled_parts=result.spooled_parts,
        manifest=result.manifest_uri,
        complete=result.complete,
        harness_version=planner_spec.harness.version,
        elapsed_s=round(result.elapsed_s, 3),
        trajectories_per_s=round(result.throughput, 2),
    )
    if spec_file is not None:
        sys.stdout.write(summary.to_message() + "\n")
    elif json_:
        print_json(summary.to_k8s())
    else:
        console.print(
            f"{result.ran} episodes run, {result.skipped} already collected, "
            f"{len(result.parts)} parts, in {result.elapsed_s:.1f}s "
            f"({result.throughput:.1f} trajectories/s)"
        )
        if result.manifest_uri:
            console.print(f"manifest: {result.manifest_uri}")
        elif result.shard_manifest_uri:
            console.print(f"shard manifest: {result.shard_manifest_uri} (other shards pending)")
    for message in result.repaired:
        err_console.print(f"[yellow]spool: {message}[/]")
    if result.duplicates:
        err_console.print(
            f"[yellow]{result.duplicates} episodes appear twice in {config.out}/parts "
            "(qpa data verify names them)[/]"
        )
    if result.superseded:
        err_console.print(
            f"[yellow]{len(result.superseded)} part(s) had been written by another process "
            "with the same trajectories: kept theirs[/]"
        )
    if result.interrupted:
        err_console.print("[yellow]interrupted: rerun the same command to finish[/]")
        raise typer.Exit(130)
    if result.spooled_parts:
        err_console.print(
            f"[red]{result.spooled_parts} part(s) wait in {result.spool_dir}: the store is "
            f"unreachable ({result.error}); rerun the same command to upload them[/]"
        )
        raise typer.Exit(1)


def _run(
    config: CollectConfig, tasks: list[Task], spec: PlannerSpec, *, quiet: bool
) -> CollectResult:
    """Run the collection with a progress bar (on stderr when stdout carries the summary)."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("success {task.fields[success]}"),
        TextColumn("spooled {task.fields[spooled]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console if quiet else console,
        transient=False,
    )
    source = config.source
    where = "tasks"
    if source is not None:
        where = source.dataset_uri or f"{source.generator.suite if source.generator else ''}"
        where += f"/{source.split}" if source.split else ""
    shard = config.shard
    label = f"{spec.name} on {where}" + (f" [{shard[0]}/{shard[1]}]" if shard else "")
    bar = progress.add_task(label, total=None, success="-", spooled=0)

    def started(total: int, done: int) -> None:
        progress.update(bar, total=total, completed=done)
        progress.start()
        if done:
            progress.console.print(f"resuming: {done} of {total} episodes already in {config.out}")

    def finished(state: CollectProgress, trajectory: Trajectory) -> None:
        rate = state.successes / state.ran if state.ran else 0.0
        progress.update(
            bar, completed=state.done, success=f"{100 * rate:.1f}%", spooled=state.spooled_parts
        )

    try:
        try:
            return run_collect(
                config, tasks=tasks, spec=spec, on_start=started, on_episode=finished
            )
        finally:
            progress.stop()
    except (CollectError, StoreError, CorruptLineError, ValueError) as exc:
        die(str(exc))


def _as_uri(tasks: str) -> str:
    """The task source as a URI (a local path becomes file://)."""
    return tasks if "://" in tasks else Path(tasks).resolve().as_uri()
