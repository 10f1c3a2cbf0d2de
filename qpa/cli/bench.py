"""`qpa bench run|report|compare|gate`: benchmark a policy, read the results, gate a release."""

from __future__ import annotations

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
from rich.table import Table

from qpa.api.v1alpha1 import (
    BenchSummary,
    HarnessRelease,
    WorkOrder,
    WorkOrderError,
    first_error,
)
from qpa.bench.config import POD_OUT, BenchConfig
from qpa.bench.gate import (
    GateResult,
    GateSpecError,
    ReportError,
    evaluate_gate_files,
    load_gate_spec,
    load_report,
)
from qpa.bench.publish import PublishError, open_report_store, publish_run
from qpa.bench.report import ComparisonRow, ReportFiles, compare, write_report
from qpa.bench.run import BenchError, finish, rescore, run_bench, select_tasks
from qpa.bench.scoring import EpisodeRecord, PriceTableError, Report, load_price_table
from qpa.cli import app
from qpa.cli.common import console, die, err_console, print_json, write_summary
from qpa.cli.options import (
    ApiKeyEnvOpt,
    HarnessConfigOpt,
    ModelOpt,
    ModelPathOpt,
    ModelUrlOpt,
    NoiseOpt,
)
from qpa.cli.run import planner_spec
from qpa.contract import CAPABILITIES, SPLITS, CorruptLineError
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.envs.suites import load_suite
from qpa.harness.factory import PLANNER_NAMES
from qpa.harness.runner import DEFAULT_MAX_TURNS

bench_app = typer.Typer(
    help="Benchmark a policy on a suite split, compare reports, gate releases.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_summary(report: Report, out_dir: Path | None = None) -> None:
    """The headline, capabilities and efficiency of a report as a Rich table."""
    ci = report.ci.get("overall")
    state = "complete" if report.complete else f"PARTIAL ({report.missing_episodes} missing)"
    table = Table(
        title=f"{report.suite}/{report.split}: {report.policy.planner} "
        f"({report.tasks} tasks x {report.samples}, {state})"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI", justify="right")
    table.add_row(
        "[bold]overall[/]", f"[bold]{_pct(report.overall)}[/]", _ci(ci.low, ci.high) if ci else ""
    )
    for capability, group in report.by_capability.items():
        interval = report.ci.get(capability)
        table.add_row(
            f"  {capability} ({group.tasks})",
            _pct(group.success),
            _ci(interval.low, interval.high) if interval else "",
        )
    table.add_row("mean progress", _pct(report.mean_progress), "")
    for k in sorted(report.pass_at_k):
        if k > 1:
            table.add_row(f"pass@{k} (any of {k})", _pct(report.pass_at_k[k]), "")
            table.add_row(f"pass^{k} (all of {k})", _pct(report.pass_hat_k.get(k)), "")
    table.add_row("turns / tool calls", f"{report.turns:.1f} / {report.tool_calls:.1f}", "")
    per_success = report.output_tokens_per_success
    table.add_row(
        "output tokens / task / success",
        f"{report.output_tokens_per_task:,.0f} / "
        + ("-" if per_success is None else f"{per_success:,.0f}"),
        "",
    )
    table.add_row(f"cost per 1K tasks ({report.currency})", f"{report.cost_per_1k_tasks:.3f}", "")
    if report.errors:
        sides = ", ".join(f"{k} {v}" for k, v in report.errors_by_side.items())
        table.add_row("episodes ended by an error", f"{report.errors} ({sides})", "")
    console.print(table)
    if out_dir is not None:
        console.print(f"report: {out_dir / 'report.md'} and {out_dir / 'report.json'}")


def _ci(low: float, high: float) -> str:
    return f"{_pct(low)} - {_pct(high)}"


@bench_app.command("run")
def run_command(
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output folder (resumable).")
    ] = None,
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A HarnessRelease work order (what its benchmark Job runs): the suite, the "
            "candidate and where to publish come from it; --out defaults to /work/bench.",
        ),
    ] = None,
    planner: Annotated[str, typer.Option(help=f"One of: {', '.join(PLANNER_NAMES)}.")] = "oracle",
    suite: Annotated[str, typer.Option("--suite", "-s", help="Task suite.")] = DEFAULT_SUITE,
    split: Annotated[str, typer.Option(help="train, validation or test.")] = "test",
    seed: Annotated[int, typer.Option(help="Suite seed (0 = canonical).")] = CANONICAL_SEED,
    samples: Annotated[
        int, typer.Option("--samples-per-task", "--samples", "-k", min=1, help="Samples per task.")
    ] = 1,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-j", min=1, help="Episodes in parallel.")
    ] = 1,
    env_url: Annotated[
        list[str] | None,
        typer.Option(help="Environment server URL (repeat to spread over servers)."),
    ] = None,
    env_kind: Annotated[
        str | None,
        typer.Option(help="In-process environment kind (default: the suite's own)."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many tasks (spread over domains).")
    ] = None,
    domain: Annotated[list[str] | None, typer.Option(help="Only these domains.")] = None,
    capability: Annotated[
        list[str] | None, typer.Option(help=f"Only these: {', '.join(CAPABILITIES)}.")
    ] = None,
    max_turns: Annotated[int, typer.Option(min=1)] = DEFAULT_MAX_TURNS,
    retry_errors: Annotated[
        bool, typer.Option(help="Re-run episodes a dead server or endpoint ended.")
    ] = False,
    prices: Annotated[
        Path | None, typer.Option(help="Price table YAML (per-1M token prices per model).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots with report.md.")] = True,
    report_uri: Annotated[
        str | None,
        typer.Option(
            "--report-uri",
            envvar="QPA_REPORT_URI",
            show_envvar=True,
            help="Also publish the finished run (report.json last) to this store folder: "
            "file:///abs/dir or s3://bucket/prefix/ (endpoint and keys from QPA_S3_*).",
        ),
    ] = None,
    model_url: ModelUrlOpt = None,
    model: ModelOpt = "planner",
    model_path: ModelPathOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    harness_config: HarnessConfigOpt = None,
    noise: NoiseOpt = 0.5,
    planner_seed: Annotated[int, typer.Option(help="Seed of the noisy planner.")] = 0,
) -> None:
    """Run every selected task k times and write trajectories.jsonl, report.json and report.md.

    Rerunning with the same --out skips the episodes already written. With --report-uri (or
    $QPA_REPORT_URI) the run's files are then uploaded there, report.json last.
    """
    try:
        if spec_file is not None:
            order = WorkOrder.load(spec_file, HarnessRelease)
            config = BenchConfig.from_harnessrelease(order, out=out or POD_OUT)
        else:
            if out is None:
                die("give --out (or --spec, a HarnessRelease work order)")
            if split not in SPLITS:
                die(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
            config = BenchConfig.model_validate(
                {
                    "out": out,
                    "planner": planner_spec(
                        planner, model_url, model, model_path, harness_config, api_key_env,
                        noise, planner_seed,
                    ),
                    "suite": suite,
                    "split": split,
                    "seed": seed,
                    "samples_per_task": samples,
                    "concurrency": concurrency,
                    "env_urls": env_url or [],
                    "env_kind": env_kind,
                    "limit": limit,
                    "domains": domain or [],
                    "capabilities": capability or [],
                    "max_turns": max_turns,
                    "retry_errors": retry_errors,
                    "prices": prices,
                    "plots": plots,
                    "report_uri": report_uri,
                }
            )  # fmt: skip
    except (WorkOrderError, ValueError, OSError) as exc:
        die(first_error(exc) if isinstance(exc, ValidationError) else str(exc))
    run_benchmark(config)


def run_benchmark(config: BenchConfig) -> None:
    """Run, score, report and publish one benchmark; exit codes as `qpa bench run --help`."""
    out, spec, suite, split = config.out, config.planner, config.suite, config.split
    try:  # a bad URI or missing credentials fail now, not after the episodes
        report_store = open_report_store(config.report_uri) if config.report_uri else None
    except PublishError as exc:
        die(str(exc))
    try:
        price_table = load_price_table(config.prices)
        everything = load_suite(suite, config.seed)
        tasks = select_tasks(
            everything,
            split=split,
            domains=config.domains,
            capabilities=list(config.capabilities),
            limit=config.limit,
        )
    except (KeyError, BenchError, PriceTableError) as exc:
        die(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("success {task.fields[success]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    bar = progress.add_task(f"{spec.name} on {suite}/{split}", total=None, success="-")
    counts = {"done": 0, "success": 0}

    def started(total: int, done: int) -> None:
        progress.update(bar, total=total, completed=done)
        progress.start()  # only once the request is valid and resumable
        if done:
            console.print(f"resuming: {done} of {total} episodes already in {out}")

    def finished(record: EpisodeRecord) -> None:
        counts["done"] += 1
        counts["success"] += record.success
        rate = counts["success"] / counts["done"]
        progress.update(bar, advance=1, success=f"{100 * rate:.1f}%")

    try:
        try:
            result = run_bench(
                tasks,
                spec,
                out,
                samples=config.samples_per_task,
                concurrency=config.concurrency,
                env_urls=config.env_urls,
                env_kind=config.env_kind,
                max_turns=config.max_turns,
                retry_errors=config.retry_errors,
                seed=config.seed,
                filters=config.filters,
                on_start=started,
                on_episode=finished,
            )
        finally:
            progress.stop()
    except (BenchError, CorruptLineError, ValueError) as exc:
        die(str(exc))
    resume = result.resume
    if resume.dropped_tail:
        err_console.print("[yellow]dropped a trajectory line cut short by a crash; rewrote file[/]")
    if resume.dropped_errors:
        err_console.print(f"re-ran {resume.dropped_errors} episodes that ended by a server error")
    if not result.records:
        die("no episode finished: nothing to score", code=130 if result.interrupted else 1)
    report = finish(result, price_table, plots=config.plots)
    broken = report.errors_by_side.get("environment", 0)
    if broken:
        err_console.print(
            f"[yellow]{broken} episodes ended by an environment-side error (server, device or "
            "model endpoint); rerun with --retry-errors once it is fixed[/]"
        )
    console.print(
        f"{result.ran} episodes run, {result.skipped} resumed, in {result.elapsed_s:.1f}s"
    )
    print_summary(report, out)
    published_uri: str | None = None
    if report_store is not None:
        try:
            published = publish_run(out, report_store)
        except PublishError as exc:
            die(f"{exc}; the run is kept in {out}: rerun the same command to publish it")
        published_uri = published.report_uri
        console.print(f"published: {published_uri} ({len(published.objects)} files)")
    write_summary(  # the pod's termination message, when $QPA_STATUS_FILE says where
        BenchSummary(
            report_uri=published_uri,
            overall=round(report.overall, 6),
            tasks=report.tasks,
            samples=report.samples,
            episodes=report.episodes,
            complete=report.complete,
        )
    )
    if result.interrupted:
        err_console.print("[yellow]interrupted: the report is partial; rerun to finish[/]")
        raise typer.Exit(130)


@bench_app.command("report")
def report_command(
    out: Annotated[Path, typer.Argument(help="A `qpa bench run` output folder.")],
    rescore_: Annotated[
        bool,
        typer.Option("--rescore", help="Score trajectories.jsonl again (e.g. with new prices)."),
    ] = False,
    prices: Annotated[Path | None, typer.Option(help="Price table YAML (with --rescore).")] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots with report.md.")] = True,
) -> None:
    """Re-render report.md and the plots from report.json (or re-score with --rescore)."""
    files: ReportFiles | None = None
    try:
        if rescore_:
            report = rescore(out, load_price_table(prices), plots=plots)
        else:
            if prices is not None:
                die("--prices needs --rescore (prices are applied when scoring)")
            report = load_report(out)
            files = write_report(report, out, plots=plots)
    except (BenchError, ReportError, PriceTableError, CorruptLineError, ValueError) as exc:
        die(str(exc))
    print_summary(report, out)
    if files is not None and files.plots:
        console.print("plots: " + ", ".join(str(p) for p in files.plots))


def _format_value(row: ComparisonRow, value: float | None) -> str:
    if value is None:
        return "-"
    return _pct(value) if row.kind == "rate" else f"{value:,.2f}"


def _format_delta(row: ComparisonRow) -> str:
    if row.delta is None:
        return "-"
    text = f"{100 * row.delta:+.1f} pp" if row.kind == "rate" else f"{row.delta:+,.2f}"
    if row.delta == 0:
        return text
    improved = (row.delta > 0) == row.higher_is_better
    if row.significant is False:
        return text
    return f"[{'green' if improved else 'red'}]{text}[/]"


@bench_app.command("compare")
def compare_command(
    a: Annotated[Path, typer.Argument(help="Baseline: report.json or its run folder.")],
    b: Annotated[Path, typer.Argument(help="Candidate: report.json or its run folder.")],
    by_domain: Annotated[bool, typer.Option(help="Also compare each domain.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Side-by-side table of two reports: deltas B - A and whether each is significant."""
    try:
        report_a, report_b = load_report(a), load_report(b)
    except ReportError as exc:
        die(str(exc))
    label_a = a.name if a.is_dir() else a.parent.name or a.name
    label_b = b.name if b.is_dir() else b.parent.name or b.name
    if label_a == label_b:
        label_a, label_b = "A", "B"
    table_data = compare(report_a, report_b, a_label=label_a, b_label=label_b, by_domain=by_domain)
    if as_json:
        print_json(table_data.model_dump(mode="json"))
        return
    table = Table(
        title=f"A = {label_a} ({report_a.policy.planner}) vs B = {label_b} "
        f"({report_b.policy.planner})",
        caption="significance: paired bootstrap over common tasks, 95%"
        if table_data.common_tasks
        else "significance: two-proportion z-test, 95%",
    )
    for column, justify in (
        ("metric", "left"),
        ("A", "right"),
        ("B", "right"),
        ("delta B-A", "right"),
        ("95% CI (pp)", "right"),
        ("p", "right"),
        ("significant", "center"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in table_data.rows:
        ci = (
            f"[{100 * row.ci_low:+.1f}, {100 * row.ci_high:+.1f}]"
            if row.ci_low is not None and row.ci_high is not None
            else ""
        )
        verdict = {
            "better": "[green]yes, better[/]",
            "worse": "[red]yes, worse[/]",
            "same": "no",
            "": "",
        }[row.verdict]
        table.add_row(
            row.metric,
            _format_value(row, row.a),
            _format_value(row, row.b),
            _format_delta(row),
            ci,
            "" if row.p_value is None else f"{row.p_value:.3f}",
            verdict,
        )
    console.print(table)
    for note in table_data.notes:
        console.print(f"[yellow]note:[/] {note}")


def _print_gate(result: GateResult) -> None:
    table = Table(title="release gate")
    table.add_column("check")
    table.add_column("", justify="center")
    table.add_column("detail", overflow="fold")
    for check in result.checks:
        table.add_row(check.name, "[green]ok[/]" if check.passed else "[red]FAIL[/]", check.detail)
    console.print(table)
    if result.passed:
        console.print("[bold green]PASS[/]")
    else:
        console.print(f"[bold red]FAIL[/] ({len(result.reasons)} reasons)")
        for reason in result.reasons:
            console.print(f"  - {reason}", highlight=False)


@bench_app.command("gate")
def gate_command(
    candidate: Annotated[Path, typer.Option(help="Candidate report.json (or its run folder).")],
    baseline: Annotated[
        Path | None,
        typer.Option(help="Baseline report.json or folder (omit for a first release)."),
    ] = None,
    spec: Annotated[
        Path | None, typer.Option(help="Gate spec YAML (default thresholds otherwise).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Pass or fail a release; exits 0 on pass, 1 on fail, 2 on a bad gate spec.

    Missing, corrupt or partial reports fail.
    """
    try:
        gate_spec = load_gate_spec(spec)
    except GateSpecError as exc:
        die(str(exc))
    result = evaluate_gate_files(candidate, baseline, gate_spec)
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        _print_gate(result)
    raise typer.Exit(0 if result.passed else 1)
