"""The typed summary a finished `qpa train sft|rl` leaves for the operator (`TrainSummary`).

One function per stage turns the trainer's result into `qpa.api.v1alpha1.TrainSummary`, the
model the operator parses the termination message with: one spelling per field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from qpa.api.v1alpha1 import Checkpoint, TrainSummary

if TYPE_CHECKING:
    from qpa.train.config import SFTConfig
    from qpa.train.rl import RLConfig, RunResult
    from qpa.train.sft import SFTResult

_STEP = re.compile(r"checkpoint-(\d+)/?$")


def checkpoints_of(uris: Iterable[str]) -> list[Checkpoint]:
    """Checkpoints from their URIs (`.../checkpoint-<step>/`), oldest first."""
    found = {int(match.group(1)): uri for uri in uris if (match := _STEP.search(uri)) is not None}
    return [Checkpoint(step=step, uri=found[step]) for step in sorted(found)]


def _finite(metrics: Mapping[str, object]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def sft_summary(result: SFTResult, config: SFTConfig) -> TrainSummary:
    """The summary of a finished SFT run."""
    return TrainSummary(
        run=result.run,
        stage="sft",
        step=result.global_step,
        total_steps=config.max_steps if config.max_steps > 0 else None,
        checkpoints=checkpoints_of(result.checkpoint_uris),
        model_uri=result.final_uri,
        loss=result.train_loss,
        metrics=_finite(
            {
                "tokens": result.tokens,
                "output_tokens": result.output_tokens,
                "tokens_per_second": result.tokens_per_second,
                "train_runtime_s": result.train_runtime_s,
            }
        ),
        resumed_from=result.resumed_from,
        resumed_step=result.resumed_step,
    )


def rl_summary(result: RunResult, config: RLConfig) -> TrainSummary:
    """The summary of a finished RL run (the last step's metrics)."""
    last = _finite(result.history[-1]) if result.history else {}
    return TrainSummary(
        run=config.name,
        stage="rl",
        step=result.final_step,
        total_steps=config.steps,
        checkpoints=checkpoints_of(result.checkpoint_uris),
        model_uri=result.final_uri,
        loss=last.get("loss"),
        metrics={
            "care": float(config.care.enabled),
            "learnability_sampling": float(config.sampling.strategy == "learnability"),
            **last,
        },
        resumed_from=None,
        resumed_step=result.resumed_from or None,
    )
