"""The benchmark: run a policy on a suite split, score it by capability, report, and gate releases.

- `qpa.bench.run`: `select_tasks`, `run_bench` (parallel, resumable), `finish`, `rescore`;
- `qpa.bench.scoring`: `score(trajectories, prices) -> Report`, `PriceTable`;
- `qpa.bench.report`: `write_report` (report.json, report.md, PNG plots), `compare`;
- `qpa.bench.gate`: `GateSpec`, `evaluate_gate` (pure), `load_report`.
- `qpa.bench.evaluate`: `score_episodes` (trajectories + report of one episode per task),
  `summarize` (the numbers the loop reports).

The benchmark judges any policy and trains none: it imports the contract, environments and the
Harness, never training code or the CLI.
"""

from qpa.bench.gate import (
    GateCheck,
    GateResult,
    GateSpec,
    GateSpecError,
    ReportError,
    evaluate_gate,
    evaluate_gate_files,
    load_gate_spec,
    load_report,
)
from qpa.bench.scoring import (
    EpisodeRecord,
    GroupScore,
    Interval,
    ModelPrice,
    PriceTable,
    PriceTableError,
    Report,
    TaskOutcome,
    load_price_table,
    pass_at_k,
    pass_hat_k,
    score,
)

__all__ = [
    "EpisodeRecord",
    "GateCheck",
    "GateResult",
    "GateSpec",
    "GateSpecError",
    "GroupScore",
    "Interval",
    "ModelPrice",
    "PriceTable",
    "PriceTableError",
    "Report",
    "ReportError",
    "TaskOutcome",
    "evaluate_gate",
    "evaluate_gate_files",
    "load_gate_spec",
    "load_price_table",
    "load_report",
    "pass_at_k",
    "pass_hat_k",
    "score",
]
