"""`qpa run`: one episode of one task with one planner, as a readable transcript."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.panel import Panel

from qpa.api.v1alpha1 import first_error
from qpa.cli import app
from qpa.cli.common import console, die
from qpa.cli.options import (
    ApiKeyEnvOpt,
    HarnessConfigOpt,
    ModelOpt,
    ModelPathOpt,
    ModelUrlOpt,
    NoiseOpt,
)
from qpa.contract import Environment, Policy, Step, Trajectory, write_trajectories
from qpa.data.collect_config import PlannerConfig
from qpa.envs.factory import make_env
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.envs.suites import get_task, suite_env_kind
from qpa.harness.factory import PLANNER_NAMES, PlannerFactory, PlannerSpec
from qpa.harness.runner import run_episode

#: The environment kinds `qpa run` builds in-process (the others are served).
_IN_PROCESS = ("sandbox", "device", "agentdojo", "bfcl")


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


def print_transcript(trajectory: Trajectory) -> None:
    task = trajectory.task
    console.print(Panel(task.instruction, title=f"{task.id} [{', '.join(task.capabilities)}]"))
    for step in trajectory.steps:
        _print_step(step)
    verification = trajectory.verification
    if trajectory.error:
        console.print(f"[red]error:[/] {trajectory.error}")
    if verification is not None:
        for check in verification.checks:
            mark = "[green]✓[/]" if check.passed else "[red]✗[/]"
            console.print(f"  {mark} {check.name} ({check.detail})")
        verdict = "[bold green]SUCCESS" if verification.success else "[bold red]FAILURE"
        console.print(
            f"{verdict}[/] progress={verification.progress:.2f} turns={trajectory.totals.turns}"
        )


def _print_step(step: Step) -> None:
    action = step.action
    who = "" if step.agent == "main" else f"[magenta]{step.agent}[/] "
    if action.type == "tool_call":
        args = json.dumps(action.arguments, ensure_ascii=False)
        console.print(f"{who}[cyan]→ {action.tool}[/]({_clip(args)})", highlight=False)
    else:
        console.print(
            f"{who}[cyan]→ {action.type}[/] {_clip(action.model_dump_json(exclude={'type'}))}",
            highlight=False,
        )
    feedback = step.feedback
    if feedback.status == "ok":
        console.print(
            f"   [dim]{_clip(json.dumps(feedback.observation, ensure_ascii=False))}[/]",
            highlight=False,
        )
    else:
        console.print(f"   [yellow]{feedback.error}: {feedback.message}[/]", highlight=False)


def planner_spec(
    planner: str,
    model_url: str | None,
    model: str,
    model_path: str | None,
    harness_config: Path | None,
    api_key_env: str | None = None,
    noise: float = 0.5,
    seed: int = 0,
) -> PlannerSpec:
    """Validate planner options into a spec (through `PlannerConfig`, as `qpa collect` and a
    TaskBatch's work order do), or exit with a clear error."""
    try:
        return PlannerConfig(
            name=planner,
            model_url=model_url,
            model=model,
            model_uri=model_path,
            api_key_env=api_key_env,
            harness_config=harness_config,
            noise=noise,
            seed=seed,
        ).spec()
    except ValidationError as exc:
        die(first_error(exc))
    except (ValueError, OSError) as exc:
        die(str(exc))


@app.command("run")
def run(
    task_id: Annotated[str, typer.Option("--task", help="Task id (see `qpa tasks list`).")],
    planner: Annotated[str, typer.Option(help=f"One of: {', '.join(PLANNER_NAMES)}.")] = "oracle",
    suite: Annotated[str, typer.Option(help="Suite the task belongs to.")] = DEFAULT_SUITE,
    seed: Annotated[int, typer.Option(help="Suite seed.")] = CANONICAL_SEED,
    env_url: Annotated[
        str | None, typer.Option(help="Environment server URL (default: in-process).")
    ] = None,
    model_url: ModelUrlOpt = None,
    model: ModelOpt = "planner",
    model_path: ModelPathOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    harness_config: HarnessConfigOpt = None,
    noise: NoiseOpt = 0.5,
    out: Annotated[
        Path | None, typer.Option(help="Append the trajectory to this JSON Lines file.")
    ] = None,
    max_turns: Annotated[int, typer.Option(min=1)] = 40,
    env_kind: Annotated[
        str | None,
        typer.Option(
            "--env",
            help="In-process environment: sandbox, device (a phone), agentdojo or bfcl "
            "(default: the suite's own: agentdojo for agentdojo/..., bfcl for bfcl/...).",
        ),
    ] = None,
    serial: Annotated[
        str | None, typer.Option(help="device: the phone's adb serial (`qpa device list`).")
    ] = None,
    adb: Annotated[
        str | None, typer.Option(help="device: adb server HOST:PORT (default 127.0.0.1:5037).")
    ] = None,
    device_pool: Annotated[
        str | None, typer.Option(help="device: lease a phone from this DevicePool instead.")
    ] = None,
) -> None:
    """Run one episode and print its transcript; exits 1 when the task fails."""
    spec = planner_spec(
        planner, model_url, model, model_path, harness_config, api_key_env, noise, seed
    )
    if env_kind == "device" and suite == DEFAULT_SUITE:
        suite = "device"
    kind = env_kind or suite_env_kind(suite)
    if kind not in _IN_PROCESS:
        die(f"--env must be one of {', '.join(_IN_PROCESS)} (serve {kind} with `qpa env serve`)")
    if kind != suite_env_kind(suite):
        die(f"--env {kind} cannot play suite {suite!r} (its tasks are {suite_env_kind(suite)}'s)")
    try:
        task = get_task(task_id, suite, seed)
    except KeyError as exc:
        die(str(exc.args[0]))
    env: Environment
    if env_url:
        from qpa.envs.remote import RemoteEnv

        env = RemoteEnv(env_url)
    elif kind == "device":
        from qpa.cli.device import device_env_options

        options = device_env_options(serial=serial, adb=adb, device_pool=device_pool)
        env = make_env("device", **options)
    else:
        env = make_env(kind)
    policy = Policy(planner=planner, model=spec.policy_model, harness_version=spec.harness.version)
    try:
        trajectory = run_episode(
            env, task, PlannerFactory(spec)(), policy=policy, max_turns=max_turns
        )
    finally:
        env.close()
    print_transcript(trajectory)
    if out is not None:
        write_trajectories(out, [trajectory], append=True)
        console.print(f"trajectory appended to {out}")
    raise typer.Exit(0 if trajectory.success else 1)
