"""`qpa train tiny|sft|launch`: tiny checkpoints, supervised fine-tuning, multi-node launching.

`train_app` is the `qpa train` sub-app; other training commands (`rl`) register on it from
their own modules. torch, transformers and TRL are imported only inside the commands, so
`qpa --help` stays fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from qpa.cli import app
from qpa.cli.common import console, die, print_json, write_summary
from qpa.train.config import ConfigError, SFTConfig, parse_overrides

train_app = typer.Typer(
    help="Train planner models: tiny local checkpoints, SFT (and RL), DeepSpeed launching.",
    no_args_is_help=True,
)
app.add_typer(train_app, name="train")


@train_app.command("tiny")
def tiny(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the checkpoint to.")],
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size.")] = 2048,
    hidden_size: Annotated[int, typer.Option(help="Hidden size.")] = 128,
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 2,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    kv_heads: Annotated[int, typer.Option(help="Key/value heads.")] = 2,
    max_positions: Annotated[int, typer.Option(help="Maximum sequence length.")] = 4096,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    conversations: Annotated[
        int, typer.Option(help="Oracle conversations in the tokenizer's corpus.")
    ] = 40,
    sample_data: Annotated[
        Path | None,
        typer.Option(
            help="Also write a stand-in SFT dataset (oracle episodes, some erroneous turns "
            "flagged) here, in the format `qpa train sft` reads."
        ),
    ] = None,
    sample_rows: Annotated[int, typer.Option(help="Rows of the sample dataset.")] = 64,
) -> None:
    """Build a tiny Qwen3 checkpoint (tokenizer trained on the suite's text, random weights).

    The folder is an ordinary Hugging Face checkpoint: `model:` of an SFT run, `--model-uri`
    of the local planner.
    """
    from pydantic import ValidationError

    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, suite_corpus

    try:
        config = TinyConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=max(8, hidden_size // heads),
            max_position_embeddings=max_positions,
            seed=seed,
        )
    except ValidationError as exc:
        die(f"invalid tiny model settings: {exc.errors(include_url=False)[0]['msg']}")
    with console.status("training the tokenizer and building the model"):
        path = make_tiny_checkpoint(out, config, corpus=suite_corpus(conversations=conversations))
    manifest = json.loads((path / "qpa_tiny.json").read_text())
    report: dict[str, Any] = {"path": str(path.resolve()), **manifest}
    if sample_data is not None:
        import datasets

        from qpa.train.tiny import sft_rows_from_suite

        rows = sft_rows_from_suite(sample_rows, seed=seed)
        datasets.Dataset.from_list(rows).save_to_disk(str(sample_data))
        report["sample_data"] = {"path": str(sample_data.resolve()), "rows": len(rows)}
    print_json(report)


def load_sft_config(
    config: Path,
    *,
    overrides: list[str],
    resume: bool,
    resume_from: str | None,
    max_steps: int | None,
    output_dir: Path | None,
) -> SFTConfig:
    """The run's settings: the YAML file, then `--set` overrides, then the explicit options."""
    values: dict[str, Any] = parse_overrides(overrides)
    if resume:
        values["checkpoint.resume"] = "latest"
    if resume_from:
        values["checkpoint.resume_from"] = resume_from
    if max_steps is not None:
        values["max_steps"] = max_steps
    if output_dir is not None:
        values["output_dir"] = str(output_dir.resolve())
    return SFTConfig.from_yaml(config, values)


def load_order(spec: Path, stage: str) -> Any:
    """A TrainingRun work order (`--spec`) of `stage`; a bad one ends the command, naming it."""
    from qpa.api.v1alpha1 import TrainingRun, WorkOrder, WorkOrderError

    try:
        order = WorkOrder.load(spec, TrainingRun)
    except WorkOrderError as exc:
        die(str(exc))
    if order.resource.spec.stage != stage:
        die(f"{spec}: spec.stage is {order.resource.spec.stage}, not {stage}")
    return order


def config_or_spec(config: Path | None, spec: Path | None) -> None:
    """Exactly one of `--config` (a person's settings) and `--spec` (a work order)."""
    if (config is None) == (spec is None):
        die("give exactly one of --config (settings YAML) or --spec (a TrainingRun work order)")


@train_app.command("sft")
def sft(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="SFT settings (YAML).")
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A TrainingRun work order (what its ranks run): every setting comes from the "
            "resource; the other options apply to --config only.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue from the latest complete checkpoint (or fail)."),
    ] = False,
    resume_from: Annotated[
        str | None, typer.Option(help="Continue from this checkpoint (folder or store URI).")
    ] = None,
    max_steps: Annotated[int | None, typer.Option(help="Override max_steps.")] = None,
    output_dir: Annotated[Path | None, typer.Option(help="Override output_dir.")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a setting: KEY=VALUE (dotted keys, YAML values)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check the inputs and print the plan (data, TRL and DeepSpeed "
            "settings, resume point); train nothing.",
        ),
    ] = False,
) -> None:
    """Supervised fine-tuning with turn-level error masking (TRL SFTTrainer, DeepSpeed)."""
    config_or_spec(config, spec)
    try:
        if spec is not None:
            settings = SFTConfig.from_trainingrun(load_order(spec, "sft"))
        else:
            assert config is not None
            settings = load_sft_config(
                config,
                overrides=overrides or [],
                resume=resume,
                resume_from=resume_from,
                max_steps=max_steps,
                output_dir=output_dir,
            )
    except ConfigError as exc:
        die(str(exc))
    from qpa.train.checkpoint import CheckpointError
    from qpa.train.sft import SFTInputError, plan_sft, train_sft

    try:
        if dry_run:
            plan = plan_sft(settings)
            print_json(
                {
                    "run": settings.name,
                    "model": str(plan.model_dir),
                    "data": plan.stats.model_dump(),
                    "resume": (
                        {"step": plan.resume.step, "from": plan.resume.location}
                        if plan.resume
                        else None
                    ),
                    "deepspeed": plan.deepspeed,
                    "trl": settings.trl_kwargs(
                        bf16=bool(plan.args.bf16),
                        gradient_checkpointing=bool(plan.args.activation_checkpointing),
                        deepspeed=None,
                    ),
                }
            )
            return
        result = train_sft(settings)
    except (SFTInputError, ConfigError, CheckpointError) as exc:
        die(str(exc))
    if int(os.environ.get("RANK", "0")) == 0:
        from qpa.train.summary import sft_summary

        print_json(result.model_dump())
        write_summary(sft_summary(result, settings))


@train_app.command(
    "launch",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def launch(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option(help="Nodes (pods of the indexed Job).")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="Ranks per node.")] = 1,
    service: Annotated[str, typer.Option(help="Headless Service for rendezvous.")] = "localhost",
    job_name: Annotated[
        str | None, typer.Option(help="Job name: the master is pod <job>-0.<service>.")
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="Namespace of the Service.")] = None,
    port: Annotated[int, typer.Option(help="Rendezvous port.")] = 29500,
    index: Annotated[
        int | None, typer.Option(help="Node index (default: $JOB_COMPLETION_INDEX).")
    ] = None,
    launcher: Annotated[str, typer.Option(help="torchrun or deepspeed.")] = "torchrun",
    hostfile: Annotated[
        str | None, typer.Option(help="DeepSpeed hostfile (deepspeed launcher, several nodes).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the environment and command; run nothing.")
    ] = False,
) -> None:
    """Start this node's ranks of a multi-node run: `qpa train launch ... -- qpa train sft ...`.

    The node's rank comes from JOB_COMPLETION_INDEX (an indexed Job), the master address from
    the headless Service; the launcher then runs the command after `--` once per rank.
    """
    from qpa.train.deepspeed import launch_argv, launch_env

    command = list(ctx.args)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        die("nothing to launch: give the command after --, e.g. -- qpa train sft --config x.yaml")
    if launcher not in ("torchrun", "deepspeed"):
        die(f"unknown launcher {launcher!r}: torchrun or deepspeed")
    kind: Literal["torchrun", "deepspeed"] = "torchrun" if launcher == "torchrun" else "deepspeed"
    try:
        env = launch_env(
            index, nodes, gpus_per_node, service, port, job_name=job_name, namespace=namespace
        )
        argv = launch_argv(command, env, launcher=kind, hostfile=hostfile)
    except ValueError as exc:
        die(str(exc))
    if dry_run:
        print_json({"env": env, "argv": argv})
        return
    os.execvpe(argv[0], argv, {**os.environ, **env})
