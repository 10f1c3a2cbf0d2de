"""`qpa rollout serve`: the rollout server an RL run samples from (what a TrainingRun's
`spec.rl.generation` starts): vLLM through TRL's `trl vllm-serve` command line on GPU, or the
same HTTP and weight-sync API over a transformers model (`--backend hf`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from qpa.api.v1alpha1 import TrainingRun, WorkOrder, WorkOrderError, first_error
from qpa.cli import app
from qpa.cli.common import die, err_console

rollout_app = typer.Typer(help="Rollout servers: sampling and weight sync for RL runs.")
app.add_typer(rollout_app, name="rollout", no_args_is_help=True)


def _model_path(model: str, backend: str, cache: Path) -> str:
    """A local folder for `model` (a store URI is downloaded); vLLM also takes a hub id."""
    from qpa.store import ResolveError, resolve_local

    if backend == "vllm" and "://" not in model and not Path(model).exists():
        return model  # a hub id: vLLM resolves it (where a hub is reachable)
    try:
        return str(resolve_local(model, field="model", cache_dir=cache))
    except ResolveError as exc:
        die(str(exc))


@rollout_app.command("serve")
def serve_command(
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A TrainingRun work order (what its rollout server pod runs): "
            "spec.rl.generation and the base model; the other flags are then not used.",
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option(help="vllm (TRL's vLLM server, GPU) or hf (transformers, CPU or GPU).")
    ] = "hf",
    model: Annotated[
        str | None, typer.Option(help="Model folder, store URI, or (vllm) hub id.")
    ] = None,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer folder (hf).")] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="Name in /v1/models (default: the model).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP port.")] = 8000,
    dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32.")] = "auto",
    tensor_parallel: Annotated[
        int, typer.Option("--tensor-parallel", min=1, help="Tensor-parallel size (vllm).")
    ] = 1,
    max_model_len: Annotated[
        int | None, typer.Option(min=1, help="Longest prompt plus completion.")
    ] = None,
    gpu_memory_utilization: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="Share of GPU memory vLLM takes.")
    ] = 0.9,
    group_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for the trainer in the weight group.")
    ] = 300.0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    cache_dir: Annotated[
        Path, typer.Option(help="Where a store URI's model is downloaded.")
    ] = Path("rollout-cache"),
) -> None:
    """Serve /v1/completions (with per-token log-probs) and the weight-sync endpoints."""
    from qpa.train.rl.rollout_server import RolloutServeConfig, exec_vllm, serve

    try:
        if spec is not None:
            config = RolloutServeConfig.from_trainingrun(WorkOrder.load(spec, TrainingRun))
        else:
            if not model:
                die("--model: required without --spec")
            config = RolloutServeConfig.model_validate(
                {
                    "backend": backend,
                    "model": model,
                    "tokenizer": tokenizer,
                    "served_model_name": served_model_name,
                    "host": host,
                    "port": port,
                    "dtype": dtype,
                    "tensor_parallel_size": tensor_parallel,
                    "max_model_len": max_model_len,
                    "gpu_memory_utilization": gpu_memory_utilization,
                    "group_timeout_s": group_timeout,
                    "log_level": log_level,
                }
            )
    except WorkOrderError as exc:
        die(str(exc))
    except ValidationError as exc:
        die(first_error(exc))
    except ValueError as exc:
        die(str(exc))
    model_path = _model_path(config.model, config.backend, cache_dir)
    if config.backend == "vllm":
        exec_vllm(config, model_path)  # pragma: no cover - replaces the process
    tokenizer_path = (
        Path(_model_path(config.tokenizer, "hf", cache_dir)) if config.tokenizer else None
    )
    err_console.print(
        f"rollout server (hf) for {config.served_model_name or config.model} on "
        f"http://{config.host}:{config.port}"
    )
    serve(config, Path(model_path), tokenizer_path)
