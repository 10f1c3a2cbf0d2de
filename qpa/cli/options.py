"""Typer option types shared by every command that builds a planner (run, bench, collect, serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ModelUrlOpt = Annotated[
    str | None, typer.Option(help="OpenAI-compatible endpoint (planner openai).")
]
ModelOpt = Annotated[str, typer.Option(help="Model name at the endpoint.")]
ModelPathOpt = Annotated[
    str | None,
    typer.Option(
        "--model-uri",
        "--model-path",
        help="Checkpoint (planner local; `policy.modelUri` of a TaskBatch): a folder or "
        "file://, s3://, pvc://<claim>/<path>, "
        "hf://org/name[@rev]; s3:// is downloaded once into $QPA_CACHE_DIR (~/.cache/qpa).",
    ),
]
ApiKeyEnvOpt = Annotated[
    str | None, typer.Option(help="Environment variable holding the endpoint's API key.")
]
HarnessConfigOpt = Annotated[
    Path | None, typer.Option(help="Harness version YAML (adapter, Skills, memory, budgets).")
]
NoiseOpt = Annotated[float, typer.Option(help="Fault rate of the noisy planner.")]
