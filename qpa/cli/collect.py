"""`qpa collect`: k samples per task, in parallel, streamed to an artifact store (resumable).

    qpa collect --suite mobilepa --split train --planner oracle -k 8 --out s3://qpa/tb-1
    qpa collect --tasks s3://qpa/tasks/gen-3/tasks.jsonl ... --shard 3/8 --env-url http://env:8000
    qpa collect ... --shard-from-env --shards 8       # in an indexed Job (JOB_COMPLETION_INDEX)

S3 endpoint and credentials come from the environment (`QPA_S3_ENDPOINT`, `AWS_ACCESS_KEY_ID`
/ `AWS_SECRET_ACCESS_KEY` or `QPA_S3_ACCESS_KEY_FILE` / `QPA_S3_SECRET_KEY_FILE`), never from
the URI. Exit status: 0 done, 1 parts still in the local spool (the store stayed down: rerun
to upload them), 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import os
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

from qpa.api.v1alpha1 import TaskGenerator, TaskSource
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
from qpa.cli.run import planner_spec
from qpa.contract import SPLITS, CorruptLineError, Task, Trajectory
from qpa.data.collect import (
    DEFAULT_FLUSH_TIMEOUT_S,
    DEFAULT_PART_SIZE,
    CollectError,
    CollectProgress,
    collect,
    parse_shard,
    shard_from_env,
)
from qpa.data.tasks import select_tasks
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.harness.factory import PLANNER_NAMES
from qpa.harness.runner import DEFAULT_MAX_TURNS
from qpa.store import StoreConfig, StoreError


@app.command("collect")
def collect_command(
    out: Annotated[
        str, typer.Option("--out", "-o", help="Dataset root: folder, file:// or s3:// URI.")
    ],
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
        int, typer.Option("--samples", "-k", min=1, help="Samples per task (group size).")
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
    env_kind: Annotated[str, typer.Option(help="In-process environment kind.")] = "sandbox",
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-j", min=1, help="Episodes in parallel.")
    ] = 4,
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
    name: Annotated[str | None, typer.Option(help="Dataset name in the manifest.")] = None,
    s3_endpoint: Annotated[
        str | None, typer.Option(help="S3 endpoint (default QPA_S3_ENDPOINT).")
    ] = None,
    model_url: ModelUrlOpt = None,
    model: ModelOpt = "planner",
    model_path: ModelPathOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    harness_config: HarnessConfigOpt = None,
    noise: NoiseOpt = 0.5,
    planner_seed: Annotated[int, typer.Option(help="Seed of the noisy planner.")] = 0,
    json_: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Collect k trajectories per task into OUT/parts/*.jsonl and OUT/manifest.json.

    Rerunning with the same --out (and spool) skips what is already collected.
    """
    if split is None:
        split = "all" if tasks is not None else "train"
    if split not in (*SPLITS, "all"):
        die(f"unknown split {split!r}; choose from {', '.join(SPLITS)} or all")
    if shard is not None and shard_env:
        die("use --shard or --shard-from-env, not both")
    spec = planner_spec(
        planner, model_url, model, model_path, harness_config, api_key_env, noise, planner_seed
    )
    try:
        config = StoreConfig.from_env()
        if s3_endpoint:
            config = config.model_copy(update={"endpoint": s3_endpoint})
            config = StoreConfig.model_validate(config.model_dump())
        chosen_shard = (
            parse_shard(shard)
            if shard is not None
            else shard_from_env(shards, os.environ)
            if shard_env
            else None
        )
        source = TaskSource(
            generator=None if tasks is not None else TaskGenerator(suite=suite, seed=seed),
            dataset_uri=None if tasks is None else _as_uri(tasks),
            split=None if split == "all" else split,
            domains=domain or [],
            capabilities=capability or [],
            task_ids=task_id or [],
            limit=limit,
        )
        selected: list[Task] = select_tasks(source, config)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        die(f"task source {'.'.join(map(str, error['loc']))}: {error['msg']}")
    except (StoreError, CorruptLineError, ValueError, KeyError) as exc:
        die(str(exc))
    where = tasks or f"{suite}/{split}"
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("success {task.fields[success]}"),
        TextColumn("spooled {task.fields[spooled]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console if json_ else console,
        transient=False,
    )
    label = f"{planner} on {where}" + (
        f" [{chosen_shard[0]}/{chosen_shard[1]}]" if chosen_shard else ""
    )
    bar = progress.add_task(label, total=None, success="-", spooled=0)

    def started(total: int, done: int) -> None:
        progress.update(bar, total=total, completed=done)
        progress.start()
        if done:
            progress.console.print(f"resuming: {done} of {total} episodes already in {out}")

    def finished(state: CollectProgress, trajectory: Trajectory) -> None:
        rate = state.successes / state.ran if state.ran else 0.0
        progress.update(
            bar, completed=state.done, success=f"{100 * rate:.1f}%", spooled=state.spooled_parts
        )

    try:
        try:
            result = collect(
                selected,
                spec,
                samples=samples,
                out=out,
                shard=chosen_shard,
                env_url=env_url,
                concurrency=concurrency,
                spool_dir=spool_dir,
                env_kind=env_kind,
                max_turns=max_turns,
                part_size=part_size,
                store_config=config,
                flush_timeout_s=flush_timeout,
                name=name,
                parents=[_as_uri(tasks)] if tasks else [],
                on_start=started,
                on_episode=finished,
            )
        finally:
            progress.stop()
    except (CollectError, StoreError, CorruptLineError, ValueError) as exc:
        die(str(exc))
    if json_:
        print_json(
            {
                "out": result.out,
                "shard": f"{result.shard[0]}/{result.shard[1]}",
                "total": result.total,
                "ran": result.ran,
                "skipped": result.skipped,
                "successes": result.successes,
                "env_errors": result.env_errors,
                "parts": len(result.parts),
                "spooled_parts": result.spooled_parts,
                "manifest": result.manifest_uri,
                "complete": result.complete,
                "elapsed_s": round(result.elapsed_s, 3),
                "trajectories_per_s": round(result.throughput, 2),
            }
        )
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
        err_console.print(f"[yellow]{result.duplicates} episodes appear twice in {out}/parts[/]")
    if result.interrupted:
        err_console.print("[yellow]interrupted: rerun the same command to finish[/]")
        raise typer.Exit(130)
    if result.spooled_parts:
        err_console.print(
            f"[red]{result.spooled_parts} part(s) wait in {result.spool_dir}: the store is "
            f"unreachable ({result.error}); rerun the same command to upload them[/]"
        )
        raise typer.Exit(1)


def _as_uri(tasks: str) -> str:
    """The task source as a URI for lineage (a local path becomes file://)."""
    return tasks if "://" in tasks else Path(tasks).resolve().as_uri()
