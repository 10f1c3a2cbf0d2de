"""Training metrics shared by SFT and RL: a JSON Lines log and Prometheus collectors.

`TrainMetrics(run, stage, jsonl=...)` is what a trainer reports to. Each `log(step, ...)` call
appends one JSON line (`{"time", "run", "stage", "step", <metric>: value, ...}`) and updates the
Prometheus collectors, labelled by `run` and `stage` (`sft`, `rl`):

| collector | what |
|---|---|
| `qpa_train_loss` | last training loss |
| `qpa_train_reward` | mean reward of the last batch of rollouts (RL) |
| `qpa_train_success_rate` | share of successful trajectories (RL batch; SFT: the data mix) |
| `qpa_train_care_tier_share{tier}` | share of trajectory groups per CARE tier |
| `qpa_train_step` | last optimizer step |
| `qpa_train_learning_rate`, `qpa_train_grad_norm` | optimizer state |
| `qpa_train_tokens_per_second` | training throughput (all tokens) over the last interval |
| `qpa_train_tokens_total` | tokens processed |
| `qpa_train_output_tokens_total` | output tokens: trained assistant tokens (SFT), generated (RL) |

Collectors live in the default registry, created once per process (as `qpa.store.metrics`
does), so a process exposes them with the store's on one `/metrics` (`serve(port)`), or writes
them to a text file (`write_textfile`). A resumed run appends to the same JSONL file: steps after
the checkpoint appear again, and a reader keeps the last line per step.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, write_to_textfile

C = TypeVar("C")
CARE_TIERS = ("progress_shaping", "outcome_consolidation", "efficiency_refinement")
_LABELS = ["run", "stage"]


def _collector(kind: type[C], name: str, doc: str, labels: list[str]) -> C:
    """The collector `name` in the default registry, created on first use only."""
    names = REGISTRY._names_to_collectors  # prometheus_client has no public lookup
    existing = names.get(name) or names.get(name + "_total")
    if existing is not None:
        return existing  # type: ignore[return-value]
    return kind(name, doc, labels)  # type: ignore[call-arg]


LOSS: Gauge = _collector(Gauge, "qpa_train_loss", "Last training loss.", _LABELS)
REWARD: Gauge = _collector(Gauge, "qpa_train_reward", "Mean reward of the last batch.", _LABELS)
SUCCESS: Gauge = _collector(
    Gauge, "qpa_train_success_rate", "Share of successful trajectories.", _LABELS
)
CARE_SHARE: Gauge = _collector(
    Gauge,
    "qpa_train_care_tier_share",
    "Share of trajectory groups per CARE tier.",
    [*_LABELS, "tier"],
)
STEP: Gauge = _collector(Gauge, "qpa_train_step", "Last optimizer step.", _LABELS)
LR: Gauge = _collector(Gauge, "qpa_train_learning_rate", "Current learning rate.", _LABELS)
GRAD_NORM: Gauge = _collector(Gauge, "qpa_train_grad_norm", "Last gradient norm.", _LABELS)
TOKENS_PER_S: Gauge = _collector(
    Gauge, "qpa_train_tokens_per_second", "Tokens processed per second.", _LABELS
)
TOKENS: Counter = _collector(Counter, "qpa_train_tokens", "Tokens processed.", _LABELS)
OUTPUT_TOKENS: Counter = _collector(
    Counter,
    "qpa_train_output_tokens",
    "Output tokens: trained assistant tokens (SFT) or generated tokens (RL).",
    _LABELS,
)

_GAUGES: dict[str, Gauge] = {
    "loss": LOSS,
    "reward": REWARD,
    "success_rate": SUCCESS,
    "learning_rate": LR,
    "grad_norm": GRAD_NORM,
    "tokens_per_second": TOKENS_PER_S,
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value)  # tensors and numpy scalars
        except (TypeError, ValueError):
            return None
    number = float(value)
    return number if math.isfinite(number) else None


class TrainMetrics:
    """Report training metrics of one run and stage to a JSONL file and Prometheus."""

    def __init__(
        self,
        run: str,
        stage: str,
        *,
        jsonl: str | Path | None = None,
        textfile: str | Path | None = None,
        enabled: bool = True,
    ) -> None:
        self.run = run
        self.stage = stage
        self.jsonl = Path(jsonl) if jsonl else None
        self.textfile = Path(textfile) if textfile else None
        self.enabled = enabled  # off on non-main ranks: nothing written, nothing exported
        self._lock = threading.Lock()
        if self.enabled and self.jsonl is not None:
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)

    @property
    def labels(self) -> dict[str, str]:
        return {"run": self.run, "stage": self.stage}

    def log(
        self,
        step: int,
        *,
        tokens: int = 0,
        output_tokens: int = 0,
        care_tiers: Mapping[str, float] | None = None,
        **values: Any,
    ) -> dict[str, Any]:
        """Record metrics at `step`; returns the JSON record written.

        `tokens`/`output_tokens` are counts since the last call (added to the counters);
        `care_tiers` maps CARE tiers to counts or shares (normalised to shares); any other
        keyword is a metric (non-numeric or non-finite values are dropped).
        """
        record: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "run": self.run,
            "stage": self.stage,
            "step": int(step),
        }
        for key, value in values.items():
            number = _number(value)
            if number is not None:
                record[key] = number
        if tokens:
            record["tokens"] = int(tokens)
        if output_tokens:
            record["output_tokens"] = int(output_tokens)
        shares: dict[str, float] = {}
        if care_tiers:
            total = sum(max(0.0, float(v)) for v in care_tiers.values())
            unknown = sorted(set(care_tiers) - set(CARE_TIERS))
            if unknown:
                raise ValueError(f"unknown CARE tiers: {', '.join(unknown)}")
            shares = {
                tier: (max(0.0, float(care_tiers.get(tier, 0.0))) / total if total else 0.0)
                for tier in CARE_TIERS
            }
            record["care_tiers"] = shares
        if not self.enabled:
            return record
        with self._lock:
            STEP.labels(**self.labels).set(step)
            for key, gauge in _GAUGES.items():
                if key in record:
                    gauge.labels(**self.labels).set(record[key])
            if tokens:
                TOKENS.labels(**self.labels).inc(tokens)
            if output_tokens:
                OUTPUT_TOKENS.labels(**self.labels).inc(output_tokens)
            for tier, share in shares.items():
                CARE_SHARE.labels(**self.labels, tier=tier).set(share)
            if self.jsonl is not None:
                with self.jsonl.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
            if self.textfile is not None:
                self.write_textfile(self.textfile)
        return record

    def value(self, name: str, tier: str | None = None) -> float | None:
        """The current value of a collector for this run (tests, status reports)."""
        labels = {**self.labels, **({"tier": tier} if tier else {})}
        found = REGISTRY.get_sample_value(name, labels)
        return None if found is None else float(found)

    def write_textfile(self, path: str | Path) -> None:
        """Write the `qpa_train_*` collectors in the Prometheus text format (atomically)."""
        registry = CollectorRegistry()
        for collector in (
            LOSS, REWARD, SUCCESS, CARE_SHARE, STEP, LR, GRAD_NORM, TOKENS_PER_S, TOKENS,
            OUTPUT_TOKENS,
        ):  # fmt: skip
            registry.register(collector)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), registry)

    @staticmethod
    def serve(port: int, addr: str = "0.0.0.0") -> None:
        """Serve the default registry (train and store metrics) on `addr:port` in a thread."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSONL log's records, one per (run, stage, step) (later lines win), in step order."""
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    with Path(path).open(encoding="utf-8") as stream:
        for line in stream:
            if line.strip():
                record = json.loads(line)
                key = (record.get("run", ""), record.get("stage", ""), int(record.get("step", 0)))
                latest[key] = {**latest.get(key, {}), **record}
    return [latest[k] for k in sorted(latest, key=lambda k: (k[0], k[1], k[2]))]
