"""`qpa harness serve`: the Harness as a KServe custom predictor (see `qpa.harness.server`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from qpa.api.v1alpha1 import first_error
from qpa.cli import app
from qpa.cli.common import die, err_console
from qpa.cli.options import ModelOpt, ModelPathOpt
from qpa.cli.run import planner_spec
from qpa.envs.tokens import TokenFileError
from qpa.harness.serve_config import DEFAULT_MAX_BODY_BYTES, HarnessServeConfig

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
        str | None,
        typer.Option(
            help="Environment server every episode runs in (e.g. a RolloutPool's Service); "
            "default: an in-process sandbox. Requests cannot choose one."
        ),
    ] = None,
    tokens_file: Annotated[
        Path | None,
        typer.Option(help="Bearer tokens (YAML: sha256:<hex of token> -> user id)."),
    ] = None,
    identity_header: Annotated[
        str | None,
        typer.Option(
            help="Header a trusted proxy sets to the authenticated user id (needs "
            "--proxy-secret-file; X-Forwarded-*, Forwarded, Host, X-Real-IP are refused)."
        ),
    ] = None,
    proxy_secret_file: Annotated[
        Path | None,
        typer.Option(
            help="The trusted proxy's shared secret (at least 32 characters), which it sends "
            "in X-Qpa-Proxy-Secret: --identity-header is honoured only on requests carrying it."
        ),
    ] = None,
    insecure_single_user: Annotated[
        str | None,
        typer.Option(help="DEVELOPMENT ONLY: every caller is this user (no authentication)."),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1024, help="Largest request body.")] = (
        DEFAULT_MAX_BODY_BYTES
    ),
    read_timeout_seconds: Annotated[
        float, typer.Option(min=0.001, max=3600, help="Seconds a request may take to arrive.")
    ] = 30.0,
    name: Annotated[str, typer.Option(help="KServe model name.")] = "harness",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port.")] = 8080,
) -> None:
    """Serve `/v1/models/<name>:predict` with {user_id?, query | task_id | task}."""
    try:
        config = HarnessServeConfig(
            name=name,
            host=host,
            http_port=http_port,
            env_url=env_url,
            tokens_file=str(tokens_file) if tokens_file else None,
            identity_header=identity_header,
            proxy_secret_file=str(proxy_secret_file) if proxy_secret_file else None,
            insecure_single_user=insecure_single_user,
            max_body_bytes=max_body_bytes,
            read_timeout_seconds=read_timeout_seconds,
        )
    except ValidationError as exc:
        die(first_error(exc))
    from qpa.harness.server import Authenticator, HarnessModel, ProxySecretError
    from qpa.harness.server import serve as run_server

    try:
        authenticator = Authenticator(config)
    except TokenFileError as exc:
        die(f"--tokens-file: {exc}")
    except ProxySecretError as exc:
        die(f"--proxy-secret-file: {exc}")
    if config.insecure_single_user:
        err_console.print(
            f"[bold yellow]warning:[/] --insecure-single-user: every caller acts as "
            f"{config.insecure_single_user!r} without authentication (development only)"
        )
    elif not config.authenticates:
        err_console.print(
            "qpa harness serve: no authentication configured: callers are anonymous and each "
            "episode's memory is thrown away (see --tokens-file, --identity-header)",
            highlight=False,
        )
    spec = planner_spec(planner, model_url, model, model_path, harness_config, api_key_env)
    harness = HarnessModel(name, spec, config=config, authenticator=authenticator)
    run_server(harness, host=config.host, http_port=config.http_port)
