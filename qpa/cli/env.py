"""`qpa env serve`: run an environment server (what a RolloutPool's pods run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from qpa.api.v1alpha1 import RolloutPool, WorkOrder, WorkOrderError, first_error
from qpa.cli import app
from qpa.cli.common import die, err_console
from qpa.envs.factory import env_kinds
from qpa.envs.serve_config import EnvServeConfig
from qpa.envs.server import (
    DEFAULT_EVICT_IDLE_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_SESSION_TTL_S,
    DRAIN_KEY_FILE_ENV,
    MAX_DRAIN_S,
    serve,
)
from qpa.envs.tokens import TokenFileError, TokenTable

env_app = typer.Typer(help="Environment servers: many concurrent episodes over HTTP.")
app.add_typer(env_app, name="env", no_args_is_help=True)


@env_app.command("serve")
def serve_command(
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A RolloutPool work order (what the pool's pods run); the other flags are "
            "then not used.",
        ),
    ] = None,
    kind: Annotated[str, typer.Option(help=f"Environment kind: {', '.join(env_kinds())}.")] = (
        "sandbox"
    ),
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    max_sessions: Annotated[
        int,
        typer.Option(
            "--sessions-per-pod",
            "--max-sessions",
            min=1,
            help="Live sessions at most (a RolloutPool's sessionsPerPod); more answer 503.",
        ),
    ] = DEFAULT_MAX_SESSIONS,
    session_ttl: Annotated[
        float,
        typer.Option(
            "--session-ttl-seconds",
            "--session-ttl",
            min=0.001,
            help="Seconds an idle session lives (sessionTtlSeconds).",
        ),
    ] = DEFAULT_SESSION_TTL_S,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="Largest request body; larger ones answer 413.")
    ] = DEFAULT_MAX_BODY_BYTES,
    sessions_per_client: Annotated[
        int | None,
        typer.Option(min=1, help="Sessions one client holds at most; more answer 429."),
    ] = None,
    evict_idle_seconds: Annotated[
        float,
        typer.Option(
            min=0.001, help="Idle seconds after which a session may give its slot to a new one."
        ),
    ] = DEFAULT_EVICT_IDLE_S,
    read_timeout_seconds: Annotated[
        float,
        typer.Option(
            min=0.001, max=3600, help="Seconds a request may take to arrive; slower are cut off."
        ),
    ] = DEFAULT_READ_TIMEOUT_S,
    tokens_file: Annotated[
        Path | None,
        typer.Option(
            help="Bearer tokens (YAML: sha256:<hex of token> -> client name); required on "
            "every request but /health."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    model_url: Annotated[
        str | None, typer.Option(help="llm_sim: OpenAI-compatible endpoint playing the apps.")
    ] = None,
    model: Annotated[str, typer.Option(help="llm_sim: model name at the endpoint.")] = "",
    api_key_env: Annotated[
        str | None, typer.Option(help="llm_sim: environment variable holding the API key.")
    ] = None,
    device_pool: Annotated[
        str | None,
        typer.Option(envvar="QPA_DEVICE_POOL", help="device: lease phones from this DevicePool."),
    ] = None,
    serial: Annotated[str | None, typer.Option(help="device: serve this one phone.")] = None,
    adb: Annotated[
        str | None,
        typer.Option(envvar="QPA_DEVICE_BRIDGE", help="device: adb server HOST:PORT (fallback)."),
    ] = None,
    acquire_timeout: Annotated[
        float, typer.Option(min=0, help="device: seconds a reset waits for a free phone.")
    ] = 30.0,
) -> None:
    """Serve reset/step/verify/tools/state for one environment kind until interrupted."""
    try:
        if spec is not None:
            config = EnvServeConfig.from_rolloutpool(WorkOrder.load(spec, RolloutPool))
        else:
            config = EnvServeConfig.model_validate(
                {
                    "kind": kind,
                    "host": host,
                    "port": port,
                    "sessions_per_pod": max_sessions,
                    "session_ttl_seconds": session_ttl,
                    "max_body_bytes": max_body_bytes,
                    "sessions_per_client": sessions_per_client,
                    "evict_idle_seconds": evict_idle_seconds,
                    "read_timeout_seconds": read_timeout_seconds,
                    "tokens_file": str(tokens_file) if tokens_file else None,
                    "log_level": log_level,
                    "model_url": model_url,
                    "model": model,
                    "api_key_env": api_key_env,
                    "device_pool": device_pool,
                    "serial": serial,
                    "adb": adb,
                    "acquire_timeout_s": acquire_timeout,
                }
            )
    except WorkOrderError as exc:
        die(str(exc))
    except ValidationError as exc:
        die(first_error(exc))
    run_server(config)


def run_server(config: EnvServeConfig) -> None:
    """Serve `config` until interrupted (the kind's options built here, at the edge)."""
    env_options: dict[str, object] = {}
    if config.kind == "llm_sim":
        env_options = {
            "endpoint": config.model_url,
            "model": config.model,
            "api_key_env": config.api_key_env,
        }
    elif config.kind == "device":
        from qpa.cli.device import device_env_options

        env_options = device_env_options(
            serial=config.serial,
            adb=config.adb,
            device_pool=config.device_pool,
            namespace=config.namespace,
            acquire_timeout=config.acquire_timeout_s,
        )
    try:
        tokens = TokenTable(config.tokens_file) if config.tokens_file else None
    except TokenFileError as exc:
        die(f"--tokens-file: {exc}")
    err_console.print(
        f"qpa env serve: {config.kind} environments on http://{config.host}:{config.port} "
        f"(max {config.sessions_per_pod} sessions, idle ttl {config.session_ttl_seconds:g}s)",
        highlight=False,
    )
    serve(
        config.kind,
        host=config.host,
        port=config.port,
        max_sessions=config.sessions_per_pod,
        session_ttl_s=config.session_ttl_seconds,
        max_body_bytes=config.max_body_bytes,
        log_level=config.log_level,
        env_options=env_options,
        max_sessions_per_client=config.sessions_per_client,
        evict_idle_s=config.evict_idle_seconds,
        read_timeout_s=config.read_timeout_seconds,
        tokens=tokens,
    )


@env_app.command("drain")
def drain_command(
    url: Annotated[
        str, typer.Option(help="The server to drain (a pod's preStop hook: its own port).")
    ] = "http://127.0.0.1:8000",
    timeout_seconds: Annotated[
        float,
        typer.Option(min=0, max=MAX_DRAIN_S, help="Seconds to wait for live episodes at most."),
    ] = 60.0,
    key_file: Annotated[
        Path | None,
        typer.Option(
            envvar=DRAIN_KEY_FILE_ENV,
            help="The drain key the server wrote at start (only processes in the pod read it).",
        ),
    ] = None,
) -> None:
    """Stop new episodes on a server and wait for its live ones (a RolloutPool's preStop)."""
    from qpa.envs.remote import RemoteEnvError, drain

    if key_file is None:
        die(f"--key-file: no drain key file given (or ${DRAIN_KEY_FILE_ENV})")
    try:
        key = key_file.read_text().strip()
    except OSError as exc:
        die(f"--key-file: cannot read {key_file}: {exc.strerror or exc}")
    try:
        answer = drain(url, key, timeout_seconds)
    except RemoteEnvError as exc:
        die(str(exc))
    err_console.print(
        f"qpa env drain: {answer.get('live', 0)} episodes live after "
        f"{answer.get('waited_s', 0):g}s ({'drained' if answer.get('drained') else 'bound hit'})",
        highlight=False,
    )
