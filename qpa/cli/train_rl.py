"""`qpa train rl`: online multi-turn agentic RL with CARE (or vanilla GRPO with `--care off`).

Registers the `rl` command on `qpa train` (`train_app` of `qpa.cli.train`). torch, transformers
and DeepSpeed are imported only when the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from qpa.cli.common import die, print_json, write_summary
from qpa.cli.train import config_or_spec, load_order, train_app
from qpa.train.config import ConfigError, parse_overrides


def load_rl_config(
    config: Path,
    *,
    overrides: list[str],
    care: str | None,
    env_urls: list[str],
    resume: bool,
    resume_from: str | None,
    steps: int | None,
    output_dir: Path | None,
) -> Any:
    """The run's settings: the YAML file, then `--set` overrides, then the explicit options."""
    from qpa.train.rl import RLConfig

    values: dict[str, Any] = parse_overrides(overrides)
    if care is not None:
        if care not in ("on", "off"):
            raise ConfigError(f"--care must be 'on' or 'off', got {care!r}")
        values["care.enabled"] = care == "on"
    if env_urls:
        values["env.urls"] = list(env_urls)
    if resume:
        values["checkpoint.resume"] = "latest"
    if resume_from:
        values["checkpoint.resume_from"] = resume_from
    if steps is not None:
        values["steps"] = steps
    if output_dir is not None:
        values["output_dir"] = str(output_dir.resolve())
    return RLConfig.from_yaml(config, values)


@train_app.command("rl")
def rl(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="RL settings (YAML).")
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A TrainingRun work order (what its ranks run): every setting comes from the "
            "resource; the other options apply to --config only.",
        ),
    ] = None,
    care: Annotated[
        str | None,
        typer.Option(
            "--care",
            help="on: CARE rewards and success-anchored advantages; off: vanilla GRPO "
            "(outcome reward, group standardisation). Default: the config's care.enabled.",
        ),
    ] = None,
    env_url: Annotated[
        list[str] | None,
        typer.Option(
            "--env-url",
            help="Environment server (`qpa env serve`) to roll out in; repeat for several "
            "(episodes go round-robin). Default: in-process environments.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue from the latest complete checkpoint (or fail)."),
    ] = False,
    resume_from: Annotated[
        str | None, typer.Option(help="Continue from this checkpoint (folder or store URI).")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Override the total RL steps.")] = None,
    output_dir: Annotated[Path | None, typer.Option(help="Override output_dir.")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting: KEY=VALUE (dotted keys, YAML values)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Check the settings and the task pool, print the plan; train nothing."
        ),
    ] = False,
) -> None:
    """Online agentic RL: k rollouts per task through the Harness, CARE rewards, GRPO update."""
    from qpa.train.rl import RLConfig

    config_or_spec(config, spec)
    try:
        if spec is not None:
            settings = RLConfig.from_trainingrun(load_order(spec, "rl"))
        else:
            assert config is not None
            settings = load_rl_config(
                config,
                overrides=overrides or [],
                care=care,
                env_urls=env_url or [],
                resume=resume,
                resume_from=resume_from,
                steps=steps,
                output_dir=output_dir,
            )
    except ConfigError as exc:
        die(str(exc))
    from qpa.train.checkpoint import CheckpointError
    from qpa.train.rl import load_tasks, run_rl

    try:
        if dry_run:
            pool = load_tasks(settings.tasks)
            print_json(
                {
                    "run": settings.name,
                    "model": settings.model,
                    "care": settings.care.enabled,
                    "tasks": len(pool),
                    "steps": settings.steps,
                    "episodes_per_step": settings.tasks_per_step * settings.samples_per_task,
                    "env": settings.env.urls or settings.env.kind,
                    "generation": settings.generation.backend,
                    "deepspeed": settings.deepspeed.zero_stage
                    if settings.deepspeed.enabled
                    else None,
                    "output_dir": str(settings.run_dir),
                }
            )
            return
        result = run_rl(settings)
    except (ConfigError, CheckpointError) as exc:
        die(str(exc))
    if int(os.environ.get("RANK", "0")) == 0:
        from qpa.train.summary import rl_summary

        last = result.history[-1] if result.history else {}
        print_json(
            {
                "run": settings.name,
                "care": settings.care.enabled,
                "final_step": result.final_step,
                "resumed_from": result.resumed_from,
                "checkpoint": str(result.checkpoint) if result.checkpoint else None,
                "final_dir": str(result.final_dir) if result.final_dir else None,
                "final_uri": result.final_uri,
                "metrics_path": str(settings.metrics_path),
                "last_step": last,
            }
        )
        write_summary(rl_summary(result, settings))
