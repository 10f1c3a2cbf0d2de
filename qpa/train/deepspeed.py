"""DeepSpeed: the JSON config generated from qpa settings, and launching ranks from indexed Jobs.

`deepspeed_config(settings, cuda=...)` writes the ZeRO config the Hugging Face integration
expects: batch sizes, clipping and learning-rate settings are `"auto"` (filled from the trainer's
arguments, so they are stated once), `"bf16": {"enabled": "auto"}` follows the trainer's bf16,
and the optimizer is AdamW with `"torch_adam": true` where there is no CUDA (DeepSpeed's fused and
CPU Adam ops would otherwise be compiled at start-up). ZeRO-2 and ZeRO-3 (with optimizer/parameter
offload to CPU) run on CPU too, world size 1, over gloo.

A multi-node TrainingRun is an indexed Job (one pod per node, `completionMode: Indexed`) plus a
headless Service for rendezvous. `launch_env` turns the pod's `JOB_COMPLETION_INDEX` into the
rendezvous variables (the master is pod 0, reached through the Service's DNS), and `launch_argv`
builds the `torchrun` (or `deepspeed`) command line that starts `gpus_per_node` ranks per pod,
each running `qpa train sft|rl ...`. `local_rank_env` gives the same variables to ranks started
as processes on one machine (tests, benchmarks). This module never imports torch, and imports
DeepSpeed only inside `skip_cpu_shm_op`.
"""

from __future__ import annotations

import copy
import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from qpa.train.config import DeepSpeedSettings

DEFAULT_PORT = 29500
DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def deepspeed_config(settings: DeepSpeedSettings, *, cuda: bool = False) -> dict[str, Any]:
    """The DeepSpeed JSON config for `settings` (or the file named by `config_file`, as is)."""
    if settings.config_file:
        path = Path(settings.config_file)
        try:
            loaded = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read the DeepSpeed config {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"the DeepSpeed config {path} is not a JSON object")
        return loaded
    torch_adam = (not cuda) if settings.torch_adam is None else settings.torch_adam
    overlap = cuda if settings.overlap_comm is None else settings.overlap_comm
    zero: dict[str, Any] = {
        "stage": settings.zero_stage,
        "overlap_comm": overlap,
        "contiguous_gradients": settings.contiguous_gradients,
        "reduce_bucket_size": "auto",
    }
    if settings.zero_stage in (1, 2):
        zero["allgather_partitions"] = True
        zero["reduce_scatter"] = True
    if settings.zero_stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_gather_16bit_weights_on_model_save": (
                    settings.gather_16bit_weights_on_model_save
                ),
            }
        )
    if settings.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if settings.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    adam: dict[str, Any] = {
        "lr": "auto",
        "betas": "auto",
        "eps": "auto",
        "weight_decay": "auto",
    }
    if torch_adam:
        adam["torch_adam"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": settings.bf16},
        "fp16": {"enabled": False},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": adam},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    return _merge(config, settings.extra)


# --------------------------------------------------------------------------- launching


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (for single-process rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_single_process_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Fill in world-size-1 rendezvous variables where none are set (a laptop run).

    Variables already present (a launcher or a Job set them) are left alone. Returns what was set.
    """
    env = os.environ if environ is None else environ
    if all(var in env for var in DIST_VARS):
        return {}
    defaults = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }
    added = {k: v for k, v in defaults.items() if k not in env}
    env.update(added)
    return added


def local_rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The rendezvous variables of rank `rank` of `world_size` processes on this machine (what
    `torchrun --standalone` sets), the master on 127.0.0.1:`port`."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "NODE_RANK": "0",
    }


def skip_cpu_shm_op() -> None:
    """On CPU, stop DeepSpeed from compiling its shared-memory collective op.

    DeepSpeed builds `deepspeed_shm_comm` (a C++ extension, about a minute on 2 cores) when its
    communication backend starts on CPU. Only its inference all-reduce (tensor-parallel
    inference) uses it; training's collectives go through torch.distributed (gloo) at any world
    size. Marking the op incompatible makes DeepSpeed skip the build. Call it only without CUDA.
    """
    try:
        import deepspeed.ops
    except ImportError:
        return
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


def master_address(
    service: str, *, job_name: str | None = None, namespace: str | None = None
) -> str:
    """DNS name of pod 0 of an indexed Job behind a headless Service.

    With `job_name`, the pod's own record `<job>-0.<service>[.<namespace>.svc]` (the pods set
    `subdomain: <service>`); without it, `service` itself (a headless Service selecting only
    `batch.kubernetes.io/job-completion-index: "0"`).
    """
    host = f"{job_name}-0.{service}" if job_name else service
    if namespace:
        host = f"{host}.{namespace}.svc"
    return host


def launch_env(
    index: int | None = None,
    nodes: int = 1,
    gpus_per_node: int = 1,
    service: str = "localhost",
    port: int = DEFAULT_PORT,
    *,
    job_name: str | None = None,
    namespace: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Rendezvous variables of node `index` (default: `$JOB_COMPLETION_INDEX`).

    RANK and LOCAL_RANK are those of the node's first process; a launcher (`torchrun`,
    `deepspeed`) sets them per process. NNODES/NPROC_PER_NODE/NODE_RANK are what it reads.
    """
    env = os.environ if environ is None else environ
    if index is None:
        raw = env.get("JOB_COMPLETION_INDEX")
        if raw is None:
            raise ValueError("no node index: pass index or set JOB_COMPLETION_INDEX")
        try:
            index = int(raw)
        except ValueError:
            raise ValueError(f"JOB_COMPLETION_INDEX={raw!r} is not an integer") from None
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be at least 1")
    if not 0 <= index < nodes:
        raise ValueError(f"node index {index} is outside 0..{nodes - 1}")
    return {
        "MASTER_ADDR": master_address(service, job_name=job_name, namespace=namespace),
        "MASTER_PORT": str(port),
        "NNODES": str(nodes),
        "NPROC_PER_NODE": str(gpus_per_node),
        "NODE_RANK": str(index),
        "WORLD_SIZE": str(nodes * gpus_per_node),
        "RANK": str(index * gpus_per_node),
        "LOCAL_RANK": "0",
    }


def hostfile_text(
    nodes: int,
    gpus_per_node: int,
    service: str,
    job_name: str,
    *,
    namespace: str | None = None,
) -> str:
    """A DeepSpeed hostfile naming every pod of the indexed Job (`<job>-<i>.<service>`)."""
    lines = []
    for index in range(nodes):
        host = f"{job_name}-{index}.{service}" + (f".{namespace}.svc" if namespace else "")
        lines.append(f"{host} slots={gpus_per_node}")
    return "\n".join(lines) + "\n"


def launch_argv(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    launcher: Literal["torchrun", "deepspeed"] = "torchrun",
    hostfile: str | None = None,
) -> list[str]:
    """The launcher command line for one node, running `command` (e.g. `qpa train sft ...`).

    `env` is `launch_env(...)`'s result. `torchrun` starts `NPROC_PER_NODE` copies of `command`
    (`--no-python`: it is an executable, such as the `qpa` script). The `deepspeed` launcher
    does the same per pod (`--no_ssh`, this node's rank); with several nodes it needs the
    `hostfile` (`hostfile_text`) mounted in the pod.
    """
    if not command:
        raise ValueError("nothing to launch")
    nodes, nproc = env["NNODES"], env["NPROC_PER_NODE"]
    node_rank, addr, port = env["NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]
    if launcher == "torchrun":
        return [
            "torchrun",
            f"--nnodes={nodes}",
            f"--nproc-per-node={nproc}",
            f"--node-rank={node_rank}",
            f"--master-addr={addr}",
            f"--master-port={port}",
            "--no-python",
            *command,
        ]
    if int(nodes) > 1 and not hostfile:
        raise ValueError("the deepspeed launcher needs a hostfile for several nodes")
    argv = ["deepspeed"]
    if hostfile:
        argv.append(f"--hostfile={hostfile}")
    else:
        argv.append(f"--num_gpus={nproc}")
    return [
        *argv,
        "--no_ssh",
        f"--node_rank={node_rank}",
        f"--master_addr={addr}",
        f"--master_port={port}",
        "--no_python",
        "--no_local_rank",
        *command,
    ]
