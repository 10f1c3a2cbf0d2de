"""`qpa data generate|curate|mix|review|publish`: the AI-for-Data flywheel's stages and its gate.

Every stage reads local files or store URIs and writes one batch under `--out` (a local folder,
`file:///abs/dir` or `s3://bucket/prefix`): its data, a `manifest.json` with lineage and a
review queue (`review.json`). `publish` refuses a dataset until its review gates pass, unless
the review config says `gate: automatic`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from qpa.cli.common import console, die, print_json
from qpa.cli.data import data_app
from qpa.cli.options import ModelOpt
from qpa.contract import CorruptLineError, Task
from qpa.store import ArtifactNotFound, StoreError

T = TypeVar("T")

review_app = typer.Typer(
    help="The human gate: list, accept or reject sampled items; gate status.",
    no_args_is_help=True,
)
data_app.add_typer(review_app, name="review")

OutOpt = Annotated[
    str, typer.Option("--out", "-o", help="Output batch: folder or file:// / s3:// URI.")
]
ReviewCfgOpt = Annotated[
    str | None,
    typer.Option("--review-config", help="Review YAML: sample_size, max_reject_rate, gate, seed."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _guard(fn: Callable[[], T]) -> T:
    """Run a stage; bad input becomes one clean error line naming the file, line or field."""
    from qpa.bench.gate import ReportError
    from qpa.data.review import DataError

    try:
        return fn()
    except (DataError, CorruptLineError, ReportError, ArtifactNotFound, StoreError) as exc:
        die(str(exc))
    except FileNotFoundError as exc:
        die(f"{exc.filename}: missing (no such file)")


def _review_config(path: str | None) -> Any:
    from qpa.data.review import ReviewConfig, load_yaml_config

    return load_yaml_config(path, ReviewConfig, section="review")


@data_app.command("generate")
def generate_command(
    out: OutOpt,
    count: Annotated[
        int | None, typer.Option("--count", "-n", min=1, help="Tasks to plan (default: fill).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Suite seed for fresh tasks (never 0).")] = 1,
    target: Annotated[str | None, typer.Option(help="Coverage target YAML.")] = None,
    report: Annotated[str | None, typer.Option(help="Validation report.json to steer by.")] = None,
    existing: Annotated[
        list[str] | None, typer.Option(help="Task JSONL files already generated (repeatable).")
    ] = None,
    planner: Annotated[str, typer.Option(help="template, or openai (LLM variants).")] = "template",
    model_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL.")] = None,
    model: ModelOpt = "planner",
    api_key_env: Annotated[str | None, typer.Option(help="Env var holding the API key.")] = None,
    api_key_file: Annotated[str | None, typer.Option(help="File holding the API key.")] = None,
    variants: Annotated[int, typer.Option(min=1, help="LLM variants kept per task.")] = 1,
    check: Annotated[bool, typer.Option(help="Keep only executable tasks.")] = True,
    review_config: ReviewCfgOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Generate executable tasks where coverage is thin or validation is weak."""
    from qpa.data import generate as gen
    from qpa.data.review import as_uri, open_batch, read_source

    if planner not in ("template", "openai"):
        die(f"unknown --planner {planner!r}; choose from template, openai")
    if planner == "openai" and not model_url:
        die("--planner openai needs --model-url (an OpenAI-compatible endpoint)")

    def run() -> Any:
        coverage = gen.load_coverage_target(target)
        weakness = None
        if report:
            from qpa.data.mix import load_validation_report

            loaded = load_validation_report(report)
            assert loaded is not None
            weakness = gen.Weakness.from_report(loaded, report)
        known: list[Task] = [t for ref in existing or [] for t in read_source(ref, Task)]
        plan = gen.plan_generation(coverage, existing=known, weakness=weakness, count=count)
        rewriter = None
        if planner == "openai":
            from qpa.harness.backends.openai import OpenAIBackend

            backend = OpenAIBackend(
                str(model_url),
                model,
                api_key_env=api_key_env,
                api_key_file=api_key_file,
                native_tools=False,
                temperature=0.7,
            )
            rewriter = gen.LLMRewriter(backend, variants=variants, model=model)
        result = gen.generate_tasks(
            plan,
            seed=seed,
            existing=known,
            suite=coverage.suite,
            rewriter=rewriter,
            check_executable=check,
        )
        manifest = gen.write_generated(
            open_batch(out),
            result,
            target=coverage,
            params={"count": count, "planner": planner, "report": report, "model": model},
            parents=[as_uri(r) for r in existing or []],
            review=_review_config(review_config),
        )
        return result.summary(), manifest

    summary, manifest = _guard(run)
    if as_json:
        print_json({"summary": summary, "manifest": manifest.model_dump(mode="json")})
        return
    console.print(
        f"generated {summary['generated']} of {summary['planned']} planned tasks "
        f"({summary['dropped']} dropped) -> {out}"
    )
    _counts_table("by capability", summary["by_capability"])


@data_app.command("curate")
def curate_command(
    inputs: Annotated[list[str], typer.Argument(help="Trajectory JSONL files or URIs.")],
    out: OutOpt,
    config: Annotated[str | None, typer.Option(help="Curation YAML.")] = None,
    review_config: ReviewCfgOpt = None,
    keep_existing: Annotated[
        bool,
        typer.Option(
            "--keep-existing",
            help="When --out already holds a curation of the same inputs, keep it (its review "
            "queue and publication too) instead of curating again: a retried data Job then "
            "reads the batch a reviewer published.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Validate, diagnose, flag, attribute and de-duplicate trajectories."""
    from qpa.data import curate as cur
    from qpa.data.review import open_batch, review_state, same_curation

    if keep_existing and _guard(lambda: same_curation(out, inputs)):
        state = _guard(lambda: review_state(out))
        if as_json:
            print_json({"kept": out, "review_state": state.state})
        else:
            console.print(f"kept {out}: already curated from these inputs ({state.detail})")
        return

    def run() -> Any:
        settings = cur.load_curate_config(config)
        result = cur.curate(cur.load_trajectories(inputs), settings)
        cur.write_curated(
            open_batch(out),
            result,
            inputs=inputs,
            config=settings,
            review=_review_config(review_config),
        )
        return result.summary()

    summary = _guard(run)
    if as_json:
        print_json(summary)
        return
    console.print(
        f"{summary['successes']} successes, {summary['failures']} failures (kept, diagnosed), "
        f"{summary['rejected']} rejected, {summary['duplicates']} duplicates, "
        f"{summary['masked_turns']} masked turns -> {out}"
    )
    if summary["failures_by_cause"]:
        _counts_table("failures by cause", summary["failures_by_cause"])


@data_app.command("mix")
def mix_command(
    inputs: Annotated[list[str], typer.Argument(help="Curated batches (qpa data curate --out).")],
    out: OutOpt,
    config: Annotated[
        str | None, typer.Option(help="Mixture YAML (weights, size, adaptive).")
    ] = None,
    report: Annotated[str | None, typer.Option(help="Validation report.json (adaptive).")] = None,
    input_weight: Annotated[
        list[str] | None,
        typer.Option(
            "--input-weight",
            help="INPUT=WEIGHT: relative weight of one input batch (repeat; default 1).",
        ),
    ] = None,
    review_config: ReviewCfgOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build a training set weighted by capability, difficulty, source and input batch."""
    from qpa.data import mix as mx
    from qpa.data.review import open_batch

    def run() -> Any:
        settings = mx.load_mix_config(config)
        if input_weight:
            settings = _with_input_weights(settings, input_weight)
        loaded = mx.load_validation_report(report)
        return mx.mix(
            open_batch(out),
            inputs,
            settings,
            report=loaded,
            report_ref=report,
            review=_review_config(review_config),
        )

    result = _guard(run)
    manifest = result.manifest
    if as_json:
        print_json(manifest.model_dump(mode="json"))
        return
    console.print(f"{result.rows} rows from {manifest.counts['drawn']} trajectories -> {out}")
    _counts_table("weights", manifest.weights)
    for reason in manifest.reasons[:20]:
        console.print(f"  - {reason}")


def _with_input_weights(settings: Any, items: list[str]) -> Any:
    """The mix settings with `--input-weight INPUT=WEIGHT` options merged in."""
    from pydantic import ValidationError

    from qpa.api.v1alpha1 import first_error
    from qpa.data import mix as mx

    weights = dict(settings.input_weights)
    for item in items:
        uri, sep, value = item.rpartition("=")
        try:
            if not sep or not uri:
                raise ValueError("expected INPUT=WEIGHT")
            weights[uri] = float(value)
        except ValueError as exc:
            raise mx.DataError(f"--input-weight {item!r}: {exc}") from None
    try:
        return mx.MixConfig.model_validate({**settings.model_dump(), "input_weights": weights})
    except ValidationError as exc:
        raise mx.DataError(f"--input-weight: {first_error(exc)}") from None


@data_app.command("publish")
def publish_command(
    dataset: Annotated[str, typer.Argument(help="Dataset batch (folder or URI).")],
    review_config: ReviewCfgOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish a dataset once its review gates pass (or the gate is automatic)."""
    from qpa.data.review import open_batch, publish

    result = _guard(
        lambda: publish(
            open_batch(dataset), _review_config(review_config) if review_config else None
        )
    )
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    console.print(f"published {result.dataset} ({result.mode} gate)")


# --------------------------------------------------------------------------- review


BatchArg = Annotated[str, typer.Argument(help="The batch (folder or URI) holding review.json.")]


@review_app.command("list")
def review_list(
    batch: BatchArg,
    show_all: Annotated[bool, typer.Option("--all", help="Also decided items.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Items of a batch awaiting review (or all of them)."""
    from qpa.data.review import load_queue, open_batch

    queue = _guard(lambda: load_queue(open_batch(batch)))
    assert queue is not None
    items = [i for i in queue.items if show_all or i.status == "pending"]
    if as_json:
        print_json([i.model_dump(mode="json") for i in items])
        return
    table = Table(title=f"{queue.stage} batch {queue.batch}: {len(items)} items")
    for column in ("id", "status", "summary", "reason"):
        table.add_column(column)
    for item in items:
        table.add_row(item.id, item.status, item.summary, item.reason or "")
    console.print(table)


def _decide(batch: str, item: str, accept: bool, reason: str | None, reviewer: str | None) -> None:
    from qpa.data.review import decide, open_batch

    decided = _guard(
        lambda: decide(open_batch(batch), item, accept=accept, reason=reason, reviewer=reviewer)
    )
    console.print(
        f"{decided.id}: {decided.status}" + (f" ({decided.reason})" if decided.reason else "")
    )


@review_app.command("accept")
def review_accept(
    batch: BatchArg,
    item: Annotated[str, typer.Argument(help="Item id (or task/trajectory id).")],
    reason: Annotated[str | None, typer.Option(help="Why (optional).")] = None,
    reviewer: Annotated[str | None, typer.Option(help="Who reviewed.")] = None,
) -> None:
    """Accept one item."""
    _decide(batch, item, True, reason, reviewer)


@review_app.command("reject")
def review_reject(
    batch: BatchArg,
    item: Annotated[str, typer.Argument(help="Item id (or task/trajectory id).")],
    reason: Annotated[str, typer.Option(help="Why it is rejected (required).")],
    reviewer: Annotated[str | None, typer.Option(help="Who reviewed.")] = None,
) -> None:
    """Reject one item, with a reason; rejected items are left out downstream."""
    _decide(batch, item, False, reason, reviewer)


@review_app.command("status")
def review_status(
    batch: BatchArg,
    review_config: ReviewCfgOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Gate status of a batch (exit code 1 while closed)."""
    from qpa.data.review import load_queue, open_batch

    def run() -> Any:
        queue = load_queue(open_batch(batch))
        assert queue is not None
        return queue.status(_review_config(review_config) if review_config else None)

    status = _guard(run)
    if as_json:
        print_json(status.model_dump(mode="json"))
    else:
        state = "[green]passed[/]" if status.passed else "[red]closed[/]"
        console.print(f"{status.batch}: gate {state}: {status.detail}")
    if not status.passed:
        raise typer.Exit(1)


def _counts_table(title: str, counts: dict[str, Any]) -> None:
    table = Table(title=title)
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in counts.items():
        table.add_row(str(key), f"{value:g}" if isinstance(value, float) else str(value))
    console.print(table)
