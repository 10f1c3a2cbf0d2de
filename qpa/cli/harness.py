"""`qpa harness serve`: the Harness as a KServe custom predictor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qpa.cli import app
from qpa.cli.options import ModelOpt, ModelPathOpt
from qpa.cli.run import planner_spec

harness_app = typer.Typer(help="Serve the Harness.", no_args_is_help=True)
app.add_typer(harness_app, name="harness")


@harness_app.command("serve")
def serve(
    planner: Annotated[str, typer.Option(help="Planner behind the Harness.")] = "openai",
    model_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    model: ModelOpt = "planner",
    model_path: ModelPathOpt = None,
    api_key_env: Annotated[str | None, typer.Option(help="Env var with the API key.")] = None,
    harness_config: Annotated[
        Path | None, typer.Option(help="Harness version YAML (Skills, memory store, budgets).")
    ] = None,
    env_url: Annotated[
        str | None, typer.Option(help="Default environment server for requests.")
    ] = None,
    name: Annotated[str, typer.Option(help="KServe model name.")] = "harness",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port.")] = 8080,
) -> None:
    """Serve `/v1/models/<name>:predict` with {user_id, query | task_id | task, env_url?}."""
    from qpa.harness.server import HarnessModel
    from qpa.harness.server import serve as run_server

    spec = planner_spec(planner, model_url, model, model_path, harness_config, api_key_env)
    run_server(HarnessModel(name, spec, env_url=env_url), host=host, http_port=http_port)
