"""Reports a person reads at a glance: `report.md` with PNG plots, and report comparison.

`write_report(report, DIR)` writes `report.json` (atomically), `report.md`, and two plots:
`capabilities.png` (success per capability with its 95% interval, next to overall) and
`success_vs_tokens.png` (success against output tokens per episode, one point per domain).
Plots use matplotlib's Agg canvas directly (no pyplot state, safe in threads and servers).

Every success rate in `report.md` has two 95% intervals: the percentile bootstrap over tasks
(`Report.ci`) and the Wilson score interval over episodes (`qpa.bench.stats.wilson_interval`;
exact for one sample per task, narrower than it should be when a task's k samples are
correlated, so read the bootstrap then).

`compare(a, b)` lines two reports up: each metric of A and B and the delta B - A. Success rates
(overall, each capability, optionally each domain) get a significance test:

- **paired bootstrap over tasks** (the default, used whenever the two reports share tasks): for
  the tasks both reports scored, the per-task success rates are paired, the mean paired
  difference is resampled over tasks (1000 resamples, fixed seed), and the delta is significant
  when its 95% percentile interval excludes 0; the p-value is the two-sided bootstrap tail
  share. Pairing removes the variance that comes from task difficulty, so it detects smaller
  changes than an unpaired test on the same tasks.
- **two-proportion z-test** on episode counts, only when the reports share no task (different
  suites or seeds); it treats episodes as independent, so read it as approximate.

Other metrics (progress, pass@k, turns, tokens, cost) get the delta without a test.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from qpa.bench.scoring import (
    CI_LEVEL,
    CI_RESAMPLES,
    CI_SEED,
    GroupScore,
    Report,
    bootstrap_means,
    quantile,
)
from qpa.bench.stats import wilson_interval
from qpa.contract import CAPABILITIES, Policy

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not with this module
    from matplotlib.figure import Figure

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
CAPABILITY_PLOT = "capabilities.png"
TOKENS_PLOT = "success_vs_tokens.png"


# --------------------------------------------------------------------------- writing


@dataclass
class ReportFiles:
    json: Path
    markdown: Path
    plots: list[Path] = field(default_factory=list)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(report: Report, out_dir: str | Path, *, plots: bool = True) -> ReportFiles:
    """Write `report.json`, `report.md` and (unless `plots=False`) the PNG plots into a folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(json=out / REPORT_JSON, markdown=out / REPORT_MD)
    _atomic_write_text(files.json, report.model_dump_json(indent=2) + "\n")
    if plots:
        files.plots = [
            plot_capabilities(report, out / CAPABILITY_PLOT),
            plot_success_vs_tokens(report, out / TOKENS_PLOT),
        ]
    _atomic_write_text(files.markdown, render_markdown(report, plots=[p.name for p in files.plots]))
    return files


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def wilson(success: float, episodes: int) -> tuple[float, float]:
    """The Wilson 95% interval of a success rate over `episodes` episodes (the successes are
    `success * episodes`: every task has the same number of samples)."""
    return wilson_interval(min(episodes, round(success * episodes)), episodes)


def _wilson_text(success: float, episodes: int) -> str:
    low, high = wilson(success, episodes)
    return f"{_pct(low)} to {_pct(high)}"


def _group_rows(groups: dict[str, GroupScore], report: Report | None = None) -> list[str]:
    """Table rows of group scores with the Wilson 95% interval; with `report`, also the
    bootstrap interval (`Report.ci`)."""
    rows = []
    for name, group in groups.items():
        ci = ""
        if report is not None:
            interval = report.ci.get(name)
            ci = f" {_pct(interval.low)} to {_pct(interval.high)} |" if interval else " - |"
        rows.append(
            f"| {name} | {_pct(group.success)} |{ci} "
            f"{_wilson_text(group.success, group.episodes)} | {group.tasks} | {group.episodes} "
            f"| {_pct(group.mean_progress)} | {_num(group.output_tokens)} |"
        )
    return rows


def _group_header(with_ci: bool) -> list[str]:
    ci, align = (" 95% CI (bootstrap) |", "---|") if with_ci else ("", "")
    return [
        f"| group | success |{ci} 95% CI (Wilson) | tasks | episodes | progress "
        "| output tokens / episode |",
        f"|---|---:|{align}---|---:|---:|---:|---:|",
    ]


def render_markdown(report: Report, *, plots: Sequence[str] = ()) -> str:
    """`report.md`: the headline first, then capabilities, efficiency and breakdowns."""
    policy = report.policy
    overall_ci = report.ci.get("overall")
    status = (
        "complete"
        if report.complete
        else f"**PARTIAL: {report.missing_episodes} episodes missing**"
    )
    lines = [
        f"# Benchmark report: {report.suite} / {report.split}",
        "",
        f"Policy: planner `{policy.planner}`"
        + (f", model `{policy.model}`" if policy.model else "")
        + (f", Harness `{policy.harness_version}`" if policy.harness_version else "")
        + f". {report.tasks} tasks x {report.samples} samples = {report.episodes} episodes "
        f"({status}). Written {report.created_at:%Y-%m-%d %H:%M} UTC.",
        "",
        f"## Overall success: {_pct(report.overall)}"
        + (f" (95% CI {_pct(overall_ci.low)} to {_pct(overall_ci.high)})" if overall_ci else ""),
        "",
        "| metric | value |",
        "|---|---:|",
        f"| overall success | {_pct(report.overall)} |",
        f"| 95% CI (Wilson, {report.episodes} episodes) "
        f"| {_wilson_text(report.overall, report.episodes)} |",
        f"| mean progress | {_pct(report.mean_progress)} |",
    ]
    for k in sorted(report.pass_at_k):
        lines.append(f"| pass@{k} | {_pct(report.pass_at_k[k])} |")
    for k in sorted(report.pass_hat_k):
        if k > 1:
            lines.append(f"| pass^{k} (all {k} succeed) | {_pct(report.pass_hat_k[k])} |")
    lines += [
        f"| turns / episode | {_num(report.turns)} |",
        f"| tool calls / episode | {_num(report.tool_calls)} |",
        f"| output tokens / task | {_num(report.output_tokens_per_task)} |",
        f"| output tokens / success | {_num(report.output_tokens_per_success)} |",
        f"| cost per 1K tasks ({report.currency}) | {_num(report.cost_per_1k_tasks, 3)} |",
        f"| output cost per 1K tasks ({report.currency}) "
        f"| {_num(report.output_cost_per_1k_tasks, 3)} |",
        f"| episodes ended by an error | {report.errors} |",
        f"| collateral writes (records changed unasked) | {report.collateral_writes} "
        f"in {report.episodes_with_collateral} episodes |",
        "",
        "## By capability",
        "",
        *_group_header(with_ci=True),
        *_group_rows({str(k): v for k, v in report.by_capability.items()}, report),
        "",
    ]
    if CAPABILITY_PLOT in plots:
        lines += [f"![success per capability]({CAPABILITY_PLOT})", ""]
    if TOKENS_PLOT in plots:
        lines += [f"![success vs output tokens]({TOKENS_PLOT})", ""]
    lines += [
        "## By domain",
        "",
        *_group_header(with_ci=False),
        *_group_rows(report.by_domain),
        "",
        "## By difficulty",
        "",
        *_group_header(with_ci=False),
        *_group_rows({str(k): v for k, v in report.by_difficulty.items()}),
        "",
    ]
    if report.collateral_writes:
        lines += [
            "## Collateral writes",
            "",
            "State changes the task's verifier does not expect; such an episode is a failure.",
            "",
            "| capability | records | episodes |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {name} | {group.collateral_writes} | {group.episodes_with_collateral} |"
            for name, group in report.by_capability.items()
            if group.collateral_writes
        ]
        lines += ["", "| app.collection | records |", "|---|---:|"]
        lines += [
            f"| {target} | {count} |" for target, count in report.collateral_by_target.items()
        ]
        lines.append("")
    if report.errors_by_side:
        lines += ["## Errors by side", "", "| side | episodes |", "|---|---:|"]
        lines += [f"| {side} | {count} |" for side, count in report.errors_by_side.items()]
        lines.append("")
    price = report.price
    lines += [
        "## Method",
        "",
        "Success per task is the share of its samples that succeeded; group scores average it "
        "over the group's tasks. Intervals: percentile bootstrap over tasks "
        f"({next(iter(report.ci.values())).resamples if report.ci else CI_RESAMPLES} "
        "resamples, fixed seed) and Wilson score over episodes (exact for one sample per "
        "task; with several, a task's samples are correlated: read the bootstrap). "
        "pass@k and pass^k use the unbiased estimators over the "
        f"samples. Prices: {price.prompt_per_1m} / {price.completion_per_1m} {report.currency} "
        "per 1M prompt / completion tokens.",
        "",
    ]
    return "\n".join(lines)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_capabilities(report: Report, path: Path) -> Path:
    """Bars of success per capability (and overall) with 95% interval whiskers."""
    names = ["overall", *[str(c) for c in report.by_capability]]
    values = [report.overall, *[g.success for g in report.by_capability.values()]]
    lows, highs = [], []
    for name, value in zip(names, values, strict=True):
        interval = report.ci.get(name)
        lows.append(max(0.0, value - interval.low) if interval else 0.0)
        highs.append(max(0.0, interval.high - value) if interval else 0.0)
    figure = _figure(6.4, 3.8)
    axes = figure.add_subplot()
    colors = ["#4c72b0", *["#55a868"] * (len(names) - 1)]
    bars = axes.bar(names, [100 * v for v in values], color=colors)
    axes.errorbar(
        names,
        [100 * v for v in values],
        yerr=[[100 * v for v in lows], [100 * v for v in highs]],
        fmt="none",
        ecolor="black",
        capsize=4,
        linewidth=1,
    )
    for bar, value in zip(bars, values, strict=True):
        axes.annotate(
            f"{100 * value:.1f}",
            (bar.get_x() + bar.get_width() / 2, 0),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
            color="white" if value > 0.06 else "black",
            fontweight="bold",
        )
    axes.set_ylim(0, 105)
    axes.set_ylabel("success (%)")
    axes.set_title(f"{report.suite}/{report.split}: {report.policy.planner} (95% CI)")
    axes.grid(axis="y", alpha=0.3)
    figure.savefig(path)
    return path


def plot_success_vs_tokens(report: Report, path: Path) -> Path:
    """Success against output tokens per episode: one point per domain, a star for overall."""
    figure = _figure(6.4, 4.2)
    axes = figure.add_subplot()
    xs = [g.output_tokens for g in report.by_domain.values()]
    ys = [100 * g.success for g in report.by_domain.values()]
    axes.scatter(xs, ys, color="#4c72b0", label="domain")
    tokens_used = max([*xs, report.output_tokens_per_task], default=0.0) > 0.0
    if tokens_used:
        for name, x, y in zip(report.by_domain, xs, ys, strict=True):
            axes.annotate(name, (x, y), xytext=(4, 2), textcoords="offset points", fontsize=7)
    else:
        axes.set_xlim(-1, 1)
        axes.text(
            0.5,
            0.04,
            "no output tokens (a model-free planner)",
            transform=axes.transAxes,
            ha="center",
            fontsize=8,
            color="gray",
        )
    axes.scatter(
        [report.output_tokens_per_task],
        [100 * report.overall],
        marker="*",
        s=180,
        color="#c44e52",
        label="overall",
        zorder=3,
    )
    axes.set_xlabel("output tokens per episode")
    axes.set_ylabel("success (%)")
    axes.set_ylim(-5, 105)
    axes.set_title("success vs output tokens")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.savefig(path)
    return path


# --------------------------------------------------------------------------- comparison


Method = Literal["paired_bootstrap", "two_proportion_z"]


class ComparisonRow(BaseModel):
    """One metric of A and B; `delta` is B - A. `significant` is None when not tested."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    a: float | None
    b: float | None
    delta: float | None
    higher_is_better: bool = True
    kind: Literal["rate", "number"] = "rate"
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    significant: bool | None = None
    method: Method | None = None
    tasks: int | None = None

    @property
    def verdict(self) -> str:
        """`better`, `worse`, `same` (not significant) or `` (not tested / no delta)."""
        if self.significant is None or self.delta is None:
            return ""
        if not self.significant:
            return "same"
        improved = (self.delta > 0) == self.higher_is_better
        return "better" if improved else "worse"


class ComparisonTable(BaseModel):
    """`compare(a, b)`: the rows, and what was compared."""

    model_config = ConfigDict(extra="forbid")

    a_label: str
    b_label: str
    a_policy: Policy
    b_policy: Policy
    level: float = CI_LEVEL
    common_tasks: int
    notes: list[str]
    rows: list[ComparisonRow]

    def row(self, metric: str) -> ComparisonRow:
        for row in self.rows:
            if row.metric == metric:
                return row
        raise KeyError(metric)


def _paired(
    a: Report, b: Report, tasks: list[str], *, level: float, resamples: int, seed: int, stream: str
) -> tuple[float, float, float, bool]:
    differences = [b.per_task[t].rate - a.per_task[t].rate for t in tasks]
    means = bootstrap_means(differences, resamples=resamples, seed=f"{seed}|compare|{stream}")
    tail = (1.0 - level) / 2.0
    low, high = quantile(means, tail), quantile(means, 1.0 - tail)
    below = sum(m <= 0.0 for m in means) / len(means)
    above = sum(m >= 0.0 for m in means) / len(means)
    p_value = min(1.0, 2.0 * min(below, above))
    return low, high, p_value, low > 0.0 or high < 0.0


def _z_test(
    p1: float, n1: int, p2: float, n2: int, *, level: float
) -> tuple[float, float, float, bool]:
    if n1 == 0 or n2 == 0:
        return 0.0, 0.0, 1.0, False
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    z_crit = NormalDist().inv_cdf(0.5 + level / 2.0)
    p_value = 1.0 if se0 == 0 else math.erfc(abs(p2 - p1) / se0 / math.sqrt(2))
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    delta = p2 - p1
    return delta - z_crit * se, delta + z_crit * se, p_value, p_value < 1.0 - level


def compare(
    a: Report,
    b: Report,
    *,
    a_label: str = "A",
    b_label: str = "B",
    by_domain: bool = False,
    level: float = CI_LEVEL,
    resamples: int = CI_RESAMPLES,
    seed: int = CI_SEED,
) -> ComparisonTable:
    """Metrics of A and B side by side with deltas B - A and significance of success rates."""
    notes: list[str] = []
    if (a.suite, a.split) != (b.suite, b.split):
        notes.append(f"different suites/splits: {a.suite}/{a.split} vs {b.suite}/{b.split}")
    common = sorted(set(a.per_task) & set(b.per_task))
    if common and (len(common) < len(a.per_task) or len(common) < len(b.per_task)):
        notes.append(
            f"tests pair the {len(common)} tasks both reports scored "
            f"(A {len(a.per_task)}, B {len(b.per_task)})"
        )
    if not common:
        notes.append("no common tasks: significance by two-proportion z-test (approximate)")
    for label, report in ((a_label, a), (b_label, b)):
        if not report.complete:
            notes.append(f"{label} is partial ({report.missing_episodes} episodes missing)")

    rows: list[ComparisonRow] = []

    def tested(
        metric: str,
        value_a: float | None,
        value_b: float | None,
        tasks: list[str],
        n_a: int,
        n_b: int,
    ) -> None:
        delta = None if value_a is None or value_b is None else value_b - value_a
        row = ComparisonRow(metric=metric, a=value_a, b=value_b, delta=delta)
        if value_a is not None and value_b is not None:
            if common:
                if tasks:
                    low, high, p, sig = _paired(
                        a, b, tasks, level=level, resamples=resamples, seed=seed, stream=metric
                    )
                    row = row.model_copy(
                        update={
                            "ci_low": low,
                            "ci_high": high,
                            "p_value": p,
                            "significant": sig,
                            "method": "paired_bootstrap",
                            "tasks": len(tasks),
                        }
                    )
            else:
                low, high, p, sig = _z_test(value_a, n_a, value_b, n_b, level=level)
                row = row.model_copy(
                    update={
                        "ci_low": low,
                        "ci_high": high,
                        "p_value": p,
                        "significant": sig,
                        "method": "two_proportion_z",
                    }
                )
        rows.append(row)

    def plain(
        metric: str,
        value_a: float | None,
        value_b: float | None,
        *,
        higher_is_better: bool = True,
        kind: Literal["rate", "number"] = "number",
    ) -> None:
        delta = None if value_a is None or value_b is None else value_b - value_a
        rows.append(
            ComparisonRow(
                metric=metric,
                a=value_a,
                b=value_b,
                delta=delta,
                higher_is_better=higher_is_better,
                kind=kind,
            )
        )

    tested("overall", a.overall, b.overall, common, a.episodes, b.episodes)
    for capability in CAPABILITIES:
        group_a, group_b = a.by_capability.get(capability), b.by_capability.get(capability)
        if group_a is None and group_b is None:
            continue
        tasks = [t for t in common if capability in b.per_task[t].capabilities]
        tested(
            capability,
            group_a.success if group_a else None,
            group_b.success if group_b else None,
            tasks,
            group_a.episodes if group_a else 0,
            group_b.episodes if group_b else 0,
        )
    if by_domain:
        for domain in sorted(set(a.by_domain) | set(b.by_domain)):
            domain_a, domain_b = a.by_domain.get(domain), b.by_domain.get(domain)
            tasks = [t for t in common if b.per_task[t].domain == domain]
            tested(
                f"domain:{domain}",
                domain_a.success if domain_a else None,
                domain_b.success if domain_b else None,
                tasks,
                domain_a.episodes if domain_a else 0,
                domain_b.episodes if domain_b else 0,
            )
    plain("mean_progress", a.mean_progress, b.mean_progress, kind="rate")
    for k in sorted(set(a.pass_at_k) | set(b.pass_at_k)):
        plain(f"pass@{k}", a.pass_at_k.get(k), b.pass_at_k.get(k), kind="rate")
    for k in sorted(set(a.pass_hat_k) | set(b.pass_hat_k)):
        if k > 1:
            plain(f"pass^{k}", a.pass_hat_k.get(k), b.pass_hat_k.get(k), kind="rate")
    plain("turns", a.turns, b.turns, higher_is_better=False)
    plain("tool_calls", a.tool_calls, b.tool_calls, higher_is_better=False)
    plain(
        "output_tokens_per_task",
        a.output_tokens_per_task,
        b.output_tokens_per_task,
        higher_is_better=False,
    )
    plain(
        "output_tokens_per_success",
        a.output_tokens_per_success,
        b.output_tokens_per_success,
        higher_is_better=False,
    )
    if a.currency != b.currency:
        notes.append(f"costs are in different currencies: {a.currency} vs {b.currency}")
    plain("cost_per_1k_tasks", a.cost_per_1k_tasks, b.cost_per_1k_tasks, higher_is_better=False)
    plain("errors", float(a.errors), float(b.errors), higher_is_better=False)
    plain(
        "collateral_writes",
        float(a.collateral_writes),
        float(b.collateral_writes),
        higher_is_better=False,
    )
    plain(
        "episodes_with_collateral",
        float(a.episodes_with_collateral),
        float(b.episodes_with_collateral),
        higher_is_better=False,
    )
    return ComparisonTable(
        a_label=a_label,
        b_label=b_label,
        a_policy=a.policy,
        b_policy=b.policy,
        level=level,
        common_tasks=len(common),
        notes=notes,
        rows=rows,
    )
