"""GPU smoke: one prepared script that proves a GPU node runs qpa's training paths end to end.

Four steps, each through the project's own entry points, each timed, each reported ok or failed:

1. **rl**: `qpa train rl --config ...` (one process) for a few RL steps of the tiny Qwen3
   through the Harness (in-process sandbox, batched generation, CARE, the GRPO update,
   checkpoints); on CUDA with bf16 weights and autocast. Figure: RL seconds per step.
2. **zero2-rl, zero3-rl, zero2-sft, zero3-sft**: `qpa train launch` (torchrun) starts the ranks
   of `qpa train rl|sft` under DeepSpeed ZeRO-2 / ZeRO-3 (nccl on CUDA, gloo on CPU), the run
   is SIGKILLed (the whole process group) once its first checkpoint is complete, and the same
   command with `--resume` must continue from the newest complete checkpoint to the same final
   step. World size: the GPU count on CUDA (NCCL refuses two ranks on one device, so one GPU
   means one rank), 2 ranks on CPU.
3. **qwen3-update**: one RL update (`RLTrainer.update`) of a randomly initialised model of
   Qwen3-0.6B's shape (transformers `Qwen3Config`, nothing downloaded; the project's own
   tokenizer) on one packed multi-turn episode of 4096 tokens (prompt, completions, feedback with
   loss mask 0). A first update warms up; the second is timed. Figures: peak GPU memory,
   tokens/s. On CPU: a small Qwen3-shaped config and 256 tokens; peak RSS instead.
4. **eval-test**: greedy evaluation of the test split (`qpa.train.greedy.evaluate`: the loop's
   evaluation, scored by `qpa.bench`, diagnosed) with the step-1 model, on the GPU when there
   is one. On CPU a handful of tasks spread over the domains.

With no arguments on a machine without a GPU every step runs at tiny sizes on CPU (fp32, gloo,
2 ranks, 2 RL steps), so CI proves the script starts and every path it drives works. Packages
the GPU node lacks travel as wheels: `--build-wheels DIR` (here, needs PyPI) writes the
project's wheel, a wheel of DeepSpeed and every locked dependency (the versions installed in
this environment, minus torch and the CUDA libraries the node brings) for the node's Python,
plus `DIR/requirements.txt`; `--wheels DIR` on the node installs them offline (`pip install
--no-index --find-links DIR`) and then runs the smoke.

    python benchmarks/gpu_smoke.py [--out DIR] [--device auto|cpu|cuda] [--ranks N]
    python benchmarks/gpu_smoke.py --wheels DIR --out DIR     # on a GPU node, offline
    python benchmarks/gpu_smoke.py --build-wheels DIR [--python-version 3.12]   # here

A table (step, ok/failed, seconds, figures) is printed; `--out DIR` also writes
`DIR/gpu_smoke.json`. The exit code is 1 when any step failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FILE = "gpu_smoke.json"
STEP_NAMES = ("rl", "zero2-rl", "zero3-rl", "zero2-sft", "zero3-sft", "qwen3-update", "eval-test")
EXCLUDED_FROM_WHEELS = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|pytorch-triton.*)$")
"""Never carried: the GPU node's own CUDA torch and the libraries that come with it."""
WHEEL_EXTRAS = ("train", "data")
"""qpa's extras the smoke needs on the node (`train`: transformers, TRL, DeepSpeed, ...)."""

QWEN3_06B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
}
"""Qwen3-0.6B's shape (its published config.json); the weights are random."""
QWEN3_SMALL = {
    "vocab_size": None,  # the tokenizer's size, rounded up to 64
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
}
"""The CPU stand-in: Qwen3's layout (GQA 2:1, 3x MLP, tied embeddings) at a tiny size."""


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class Profile:
    """Sizes and settings of one run of the smoke (`cuda` or `cpu`)."""

    device: str
    world_size: int
    tiny: dict[str, Any]
    rl_steps: int
    tasks_per_step: int
    samples_per_task: int
    max_new_tokens: int
    harness: dict[str, Any]
    resume_steps: int
    sft_steps: int
    sft_max_length: int
    update_model: dict[str, Any]
    update_tokens: int
    eval_limit: int | None
    eval_max_new_tokens: int
    jobs: int

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def backend(self) -> str:
        return "nccl" if self.cuda else "gloo"

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.cuda else "float32"


def make_profile(device: str, gpus: int, args: argparse.Namespace) -> Profile:
    """The GPU profile (bf16, nccl, Qwen3-0.6B, the whole test split) or the tiny CPU one."""
    if device == "cuda":
        profile = Profile(
            device="cuda",
            world_size=max(1, gpus),
            tiny={"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512,
                  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 64, "max_position_embeddings": 8192},
            rl_steps=3, tasks_per_step=4, samples_per_task=4, max_new_tokens=32,
            harness={"token_budget": 400, "max_tools": 4, "max_turns": 3},
            resume_steps=3, sft_steps=4, sft_max_length=1024,
            update_model=QWEN3_06B, update_tokens=4096,
            eval_limit=None, eval_max_new_tokens=48,
            jobs=4,
        )  # fmt: skip
    else:
        profile = Profile(
            device="cpu",
            world_size=2,
            tiny={"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
                  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                  "head_dim": 32, "max_position_embeddings": 8192},
            rl_steps=2, tasks_per_step=1, samples_per_task=2, max_new_tokens=8,
            harness={"token_budget": 100, "max_tools": 1, "max_turns": 2},
            resume_steps=2, sft_steps=2, sft_max_length=256,
            update_model=QWEN3_SMALL, update_tokens=256,
            eval_limit=4, eval_max_new_tokens=8,
            jobs=1,
        )  # fmt: skip
    changes: dict[str, Any] = {}
    if args.ranks is not None:
        changes["world_size"] = args.ranks
    if args.update_tokens is not None:
        changes["update_tokens"] = args.update_tokens
    if args.eval_limit is not None:
        changes["eval_limit"] = args.eval_limit or None
    if args.jobs is not None:
        changes["jobs"] = max(1, args.jobs)
    if changes:
        from dataclasses import replace

        profile = replace(profile, **changes)
    return profile


# --------------------------------------------------------------------------- results


@dataclass
class StepReport:
    """One row of the table (and of the JSON)."""

    name: str
    ok: bool = False
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "figures": self.figures,
            "error": self.error,
        }


class SmokeFailure(RuntimeError):
    """A step ran but did not do what it must (the message says what)."""


def run_step(name: str, body: Callable[[], dict[str, Any]]) -> StepReport:
    report = StepReport(name)
    print(f"--- {name}", flush=True)
    started = time.perf_counter()
    try:
        report.figures = body()
        report.ok = True
    except Exception as exc:  # a failed step is reported, the next ones still run
        report.error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, SmokeFailure):
            report.error += "\n" + traceback.format_exc(limit=6)
    report.seconds = time.perf_counter() - started
    state = "ok" if report.ok else f"FAILED: {(report.error or '').splitlines()[0]}"
    print(f"--- {name}: {state} ({report.seconds:.1f} s)", flush=True)
    return report


def format_figures(figures: Mapping[str, Any]) -> str:
    parts = []
    for key, value in figures.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def print_table(reports: list[StepReport]) -> None:
    width = max(len(r.name) for r in reports)
    print(f"\n{'step':<{width}}  {'result':<6}  {'seconds':>8}  figures")
    for r in reports:
        result = "ok" if r.ok else "failed"
        print(f"{r.name:<{width}}  {result:<6}  {r.seconds:>8.1f}  {format_figures(r.figures)}")
    for r in reports:
        if r.error:
            print(f"\n{r.name} failed: {r.error}")


# --------------------------------------------------------------------------- processes


def qpa_command() -> list[str]:
    """The `qpa` console script of this interpreter's environment."""
    local = Path(sys.executable).parent / "qpa"
    if local.exists():
        return [str(local)]
    found = shutil.which("qpa")
    if found is None:
        raise SmokeFailure("no `qpa` command next to this Python or on PATH (install qpa)")
    return [found]


def child_env(profile: Profile) -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")  # torchrun and qpa of this Python
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONUNBUFFERED="1",
        QPA_PROGRESS="plain",  # progress as log lines (the logs are files)
    )
    if not profile.cuda:
        env["OMP_NUM_THREADS"] = "1"  # two ranks on two shared cores: no OpenMP oversubscription
        env["CUDA_VISIBLE_DEVICES"] = ""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # each launch brings its own rendezvous
    return env


def last_json(text: str) -> dict[str, Any]:
    """The last JSON object printed at the start of a line (what `qpa train ...` prints)."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    for match in re.finditer(r"(?m)^\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            found = value
    if found is None:
        raise SmokeFailure(f"the command printed no JSON result; its output ends:\n{text[-2000:]}")
    return found


def run_process(
    argv: list[str], *, env: Mapping[str, str], cwd: Path, log: Path, timeout: float
) -> str:
    """Run to the end (output to `log`); a non-zero exit or a timeout fails the step."""
    with log.open("w") as sink:
        process = subprocess.Popen(
            argv, cwd=cwd, env=dict(env), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            raise SmokeFailure(f"{argv_text(argv)} ran past {timeout:.0f} s (log {log})") from None
    output = log.read_text(errors="replace")
    if code != 0:
        raise SmokeFailure(f"{argv_text(argv)} exited {code}; output ends:\n{output[-3000:]}")
    return output


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc: torchrun starts each rank in a session of
    its own, so killing the launcher's process group alone would leave the ranks running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the process and everything it started (launcher and every rank at once, as when
    a node dies), then reap it."""
    for _ in range(2):  # a second pass catches what was being started during the first
        # the launcher first (its children are listed before they are orphaned): killed after
        # its ranks, a shell launcher could see them die and exit on its own first
        for pid in [process.pid, *descendants(process.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def argv_text(argv: list[str]) -> str:
    return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))


def free_port() -> int:
    from qpa.train.deepspeed import free_port as project_free_port

    return project_free_port()


def complete_checkpoint_step(run_dir: Path) -> int | None:
    """The newest complete (hashed) local checkpoint's step, or None."""
    from qpa.train.checkpoint import latest_local

    ref = latest_local(run_dir)
    return ref.step if ref is not None else None


# --------------------------------------------------------------------------- inputs


def write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def build_inputs(work: Path, profile: Profile) -> dict[str, Path]:
    """The tiny Qwen3 checkpoint (the project's tokenizer), a stand-in SFT dataset, and the
    task lists (RL's train tasks, the evaluated test tasks) as JSON Lines: every process reads
    them instead of generating the whole suite again."""
    import datasets

    from qpa.bench.run import select_tasks
    from qpa.contract import write_tasks
    from qpa.envs.sandbox.suite import generate_suite
    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint, sft_rows_from_suite, suite_corpus

    model = make_tiny_checkpoint(
        work / "tiny", TinyConfig(**profile.tiny), corpus=suite_corpus(conversations=6)
    )
    rows = sft_rows_from_suite(16 if not profile.cuda else 64, seed=1, error_rate=0.3)
    datasets.Dataset.from_list(rows).save_to_disk(str(work / "sft-data"))
    suite = generate_suite()
    train, test = work / "tasks-train.jsonl", work / "tasks-test.jsonl"
    write_tasks(train, select_tasks(suite, split="train", limit=16))
    write_tasks(test, select_tasks(suite, split="test", limit=profile.eval_limit))
    return {"model": model, "data": work / "sft-data", "train_tasks": train, "test_tasks": test}


def rl_settings(
    profile: Profile,
    inputs: Mapping[str, Path],
    out: Path,
    *,
    steps: int,
    zero: int | None,
    store: Path | None,
) -> dict[str, Any]:
    """An RL run's YAML settings (`qpa.train.rl.RLConfig`).

    A random tiny policy never solves a task, so every advantage is 0; `skip_zero_advantage:
    false` keeps those samples in the update, so each step still runs the forward/backward
    passes, the collectives and the optimizer step this smoke is about.
    """
    tasks = inputs["train_tasks"]
    data: dict[str, Any] = {
        "name": out.name,
        "model": str(inputs["model"]),
        "output_dir": str(out),
        "steps": steps,
        "tasks_per_step": profile.tasks_per_step,
        "samples_per_task": profile.samples_per_task,
        "seed": 0,
        "model_dtype": profile.dtype,
        "bf16": profile.cuda,
        "gradient_checkpointing": False,
        "tasks": {"dataset_uri": tasks.as_uri(), "split": "train"},
        "harness": profile.harness,
        "generation": {"max_new_tokens": profile.max_new_tokens},
        "loss": {"micro_batch_size": 64, "skip_zero_advantage": False},
        "optim": {"learning_rate": 1e-3},
        "checkpoint": {"every_steps": 1, "keep_last": 2, "save_final": True},
        "metrics": {"logging_steps": 1},
    }
    if zero is not None:
        data["deepspeed"] = {"enabled": True, "zero_stage": zero, "torch_adam": True}
    if store is not None:
        data["checkpoint"]["store"] = str(store)
    return data


def sft_settings(
    profile: Profile, inputs: Mapping[str, Path], out: Path, *, zero: int, store: Path
) -> dict[str, Any]:
    """An SFT run's YAML settings (`qpa.train.config.SFTConfig`) under ZeRO-`zero`."""
    return {
        "name": out.name,
        "model": str(inputs["model"]),
        "dataset": str(inputs["data"]),
        "output_dir": str(out),
        "max_length": profile.sft_max_length,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-3,
        "max_steps": profile.sft_steps,
        "model_dtype": profile.dtype,
        "bf16": profile.cuda,
        "gradient_checkpointing": False,
        "deepspeed": {"enabled": True, "zero_stage": zero, "torch_adam": True},
        "checkpoint": {"every_steps": 1, "keep_last": 2, "store": str(store), "resume": "auto"},
        "metrics": {"logging_steps": 1},
    }


def step_times(metrics_path: Path) -> list[float]:
    from qpa.train.metrics import read_metrics

    return [float(r["step_s"]) for r in read_metrics(metrics_path) if "step_s" in r]


def per_step(times: list[float]) -> float | None:
    """Median seconds per step, the first (warm-up) step left out when there are others."""
    rest = times[1:] if len(times) > 1 else times
    return statistics.median(rest) if rest else None


# --------------------------------------------------------------------------- steps


class Smoke:
    """Runs the four steps in a work folder and collects their reports."""

    def __init__(
        self, profile: Profile, work: Path, timeout: float, only: list[str] | None = None
    ) -> None:
        self.profile = profile
        self.only = set(only or STEP_NAMES)
        self.work = work
        self.timeout = timeout
        self.env = child_env(profile)
        self.inputs: dict[str, Path] = {}
        self.rl_model: Path | None = None

    def logs(self, name: str) -> Path:
        folder = self.work / "logs"
        folder.mkdir(exist_ok=True)
        return folder / f"{name}.log"

    # 1 ---------------------------------------------------------------- RL through the CLI
    def rl(self) -> dict[str, Any]:
        p = self.profile
        out = self.work / "rl"
        config = write_yaml(
            self.work / "rl.yaml",
            rl_settings(p, self.inputs, out, steps=p.rl_steps, zero=None, store=None),
        )
        output = run_process(
            [*qpa_command(), "train", "rl", "--config", str(config)],
            env=self.env, cwd=self.work, log=self.logs("rl"), timeout=self.timeout,
        )  # fmt: skip
        result = last_json(output)
        if result.get("final_step") != p.rl_steps:
            raise SmokeFailure(f"qpa train rl stopped at step {result.get('final_step')}")
        final = Path(str(result["final_dir"]))
        saved = json.loads((final / "config.json").read_text())
        dtype = saved.get("dtype") or saved.get("torch_dtype")
        if dtype != p.dtype:
            raise SmokeFailure(f"the trained model's weights are {dtype}, not {p.dtype}")
        self.rl_model = final
        times = step_times(Path(str(result["metrics_path"])))
        last = result.get("last_step") or {}
        return {
            "device": p.device,
            "dtype": dtype,
            "steps": result["final_step"],
            "rl_s_per_step": per_step(times),
            "first_step_s": times[0] if times else None,
            "tokens_per_s": last.get("tokens_per_second"),
            "episodes_per_step": p.tasks_per_step * p.samples_per_task,
        }

    # 2 ---------------------------------------------------------------- ZeRO, kill, resume
    def zero_runs(self) -> list[StepReport]:
        """ZeRO-2/3 x RL/SFT, each killed after its first checkpoint and resumed."""
        cases = [
            (stage, kind)
            for kind in ("rl", "sft")
            for stage in (2, 3)
            if f"zero{stage}-{kind}" in self.only
        ]
        if not cases:
            return []
        if self.profile.jobs == 1:
            return [
                run_step(f"zero{s}-{k}", lambda s=s, k=k: self.kill_and_resume(k, s))
                for s, k in cases
            ]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self.profile.jobs, len(cases))) as pool:
            futures = [
                pool.submit(run_step, f"zero{s}-{k}", lambda s=s, k=k: self.kill_and_resume(k, s))
                for s, k in cases
            ]
            return [f.result() for f in futures]

    def launch_argv(self, command: list[str]) -> list[str]:
        """`qpa train launch` (the TrainingRun pods' launcher: torchrun) on a free port."""
        return [
            *qpa_command(), "train", "launch", "--nodes", "1",
            "--gpus-per-node", str(self.profile.world_size), "--index", "0",
            "--service", "127.0.0.1", "--port", str(free_port()), "--", *command,
        ]  # fmt: skip

    def kill_and_resume(self, kind: str, stage: int) -> dict[str, Any]:
        p = self.profile
        name = f"zero{stage}-{kind}"
        out = self.work / name
        store = self.work / "store"
        total = p.resume_steps if kind == "rl" else p.sft_steps
        settings = (
            rl_settings(p, self.inputs, out, steps=total, zero=stage, store=store)
            if kind == "rl"
            else sft_settings(p, self.inputs, out, zero=stage, store=store)
        )
        config = write_yaml(self.work / f"{name}.yaml", settings)
        train = [*qpa_command(), "train", kind, "--config", str(config)]

        # the first run: SIGKILL (launcher and every rank) once a checkpoint is complete
        started = time.perf_counter()
        log = self.logs(f"{name}-killed")
        with log.open("w") as sink:
            process = subprocess.Popen(
                self.launch_argv(train), cwd=self.work, env=self.env, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                while complete_checkpoint_step(out) is None:
                    if process.poll() is not None:
                        text = log.read_text(errors="replace")[-3000:]
                        raise SmokeFailure(
                            f"the run exited {process.returncode} before its first checkpoint:"
                            f"\n{text}"
                        )
                    if time.perf_counter() - started > self.timeout:
                        raise SmokeFailure(f"no checkpoint within {self.timeout:.0f} s (log {log})")
                    time.sleep(0.05)
            finally:
                finished_early = process.poll() is not None
                kill_group(process)
        killed_s = time.perf_counter() - started
        killed_after = complete_checkpoint_step(out)
        if finished_early or killed_after is None or killed_after >= total:
            raise SmokeFailure(
                f"the run reached step {killed_after} of {total} before it could be killed"
            )

        # the same command with --resume continues to the same final step
        resumed_at = time.perf_counter()
        output = run_process(
            self.launch_argv([*train, "--resume"]),
            env=self.env, cwd=self.work, log=self.logs(f"{name}-resumed"), timeout=self.timeout,
        )  # fmt: skip
        resume_s = time.perf_counter() - resumed_at
        result = last_json(output)
        if kind == "rl":
            final, resumed = result.get("final_step"), result.get("resumed_from")
        else:
            final, resumed = result.get("global_step"), result.get("resumed_step")
        if final != total or resumed is None or not killed_after <= resumed < total:
            raise SmokeFailure(
                f"killed after step {killed_after}: the resumed run went from {resumed} to "
                f"{final}, not from >= {killed_after} to {total}"
            )
        figures: dict[str, Any] = {
            "world_size": p.world_size,
            "backend": p.backend,
            "killed_after_step": killed_after,
            "resumed_from": resumed,
            "final_step": final,
            "killed_run_s": killed_s,
            "resumed_run_s": resume_s,
        }
        if kind == "rl":
            figures["rl_s_per_step"] = per_step(step_times(Path(out) / "metrics.jsonl"))
        return figures

    # 3 ---------------------------------------------------------------- one big RL update
    def update(self) -> dict[str, Any]:
        p = self.profile
        return self.worker(
            "update",
            {
                "tokenizer": str(self.inputs["model"]),
                "out": str(self.work / "qwen3"),
                "shape": p.update_model,
                "tokens": p.update_tokens,
                "dtype": p.dtype,
                "cuda": p.cuda,
            },
        )

    # 4 ---------------------------------------------------------------- test-split evaluation
    def evaluate(self) -> dict[str, Any]:
        p = self.profile
        model = self.rl_model or self.inputs["model"]
        figures = self.worker(
            "eval",
            {
                "model": str(model),
                "out": str(self.work / "eval"),
                "tasks": str(self.inputs["test_tasks"]),
                "max_new_tokens": p.eval_max_new_tokens,
                "harness": p.harness,
            },
        )
        figures["model"] = "rl final" if self.rl_model else "tiny (the rl step failed)"
        return figures

    def worker(self, kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Run a step in its own process (clean peak memory, a crash stays in it)."""
        result = self.work / f"{kind}-result.json"
        result.unlink(missing_ok=True)
        argv = [
            sys.executable, str(Path(__file__).resolve()), "--worker", kind,
            "--params", json.dumps(dict(params)), "--result", str(result),
        ]  # fmt: skip
        run_process(argv, env=self.env, cwd=self.work, log=self.logs(kind), timeout=self.timeout)
        figures: dict[str, Any] = json.loads(result.read_text())
        return figures

    # ----------------------------------------------------------------------- all of it
    def run(self) -> list[StepReport]:
        def prepare() -> dict[str, Any]:
            self.inputs = build_inputs(self.work, self.profile)
            manifest = json.loads((self.inputs["model"] / "qpa_tiny.json").read_text())
            return {
                "tiny_hidden": self.profile.tiny["hidden_size"],
                "tokenizer_size": manifest["tokenizer_size"],
            }

        reports = [run_step("prepare", prepare)]
        if not reports[0].ok:
            return reports
        for name, body in (("rl", self.rl), ("qwen3-update", self.update)):
            if name in self.only:
                reports.append(run_step(name, body))
        reports += self.zero_runs()
        if "eval-test" in self.only:
            reports.append(run_step("eval-test", self.evaluate))
        return reports


# --------------------------------------------------------------------------- workers


def packed_turns(tokens: int, vocab: int, seed: int = 0) -> list[Any]:
    """A multi-turn episode of exactly `tokens` tokens once packed: a long first prompt, then
    completions alternating with environment feedback (each next prompt extends the last)."""
    import random

    from qpa.train.rl import Turn

    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(10, vocab) for _ in range(n)]  # noqa: E731
    turns_n = 4
    prompt = tokens // 4
    completion = max(1, (tokens - prompt) // (2 * turns_n))
    feedback = completion
    sequence = ids(prompt)
    turns = []
    for index in range(turns_n):
        out = ids(completion)
        if index == turns_n - 1:
            out = ids(tokens - len(sequence))  # the last completion fills up to `tokens`
        turns.append(Turn(list(sequence), out))
        sequence = [*sequence, *out, *ids(feedback)]
    return turns


def worker_update(params: Mapping[str, Any]) -> dict[str, Any]:
    """Build the random Qwen3 (on the device, in the run's dtype), save it, load it through
    `RLTrainer` and run two updates on one packed episode; the second is timed."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from qpa.train.rl import RLConfig, RLTrainer, build_samples
    from qpa.train.tiny import embedding_rows

    cuda = bool(params["cuda"])
    dtype = getattr(torch, params["dtype"])
    tokenizer = AutoTokenizer.from_pretrained(params["tokenizer"], local_files_only=True)
    shape = dict(params["shape"])
    shape["vocab_size"] = shape["vocab_size"] or embedding_rows(len(tokenizer), 64)
    rope_theta = shape.pop("rope_theta")
    config = Qwen3Config(
        **shape,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    out = Path(params["out"])
    built = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen3ForCausalLM(config).to(dtype)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if cuda:
        torch.cuda.empty_cache()
    build_s = time.perf_counter() - built

    settings = RLConfig.from_dict(
        {
            "name": "qwen3-update",
            "model": str(out),
            "output_dir": str(out.parent / "qwen3-run"),
            "steps": 1,
            "tasks_per_step": 1,
            "samples_per_task": 2,
            "model_dtype": params["dtype"],
            "bf16": cuda,
            "gradient_checkpointing": "auto",
            "loss": {"micro_batch_size": 1},
            "optim": {"learning_rate": 1e-6},
            "checkpoint": {"save_final": False},
        }
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = RLTrainer(settings, tasks=[])
    samples = build_samples(packed_turns(int(params["tokens"]), len(tokenizer)), 1.0, pack=True)
    if len(samples) != 1 or len(samples[0].input_ids) != int(params["tokens"]):
        raise SmokeFailure(f"the episode did not pack into one {params['tokens']}-token sequence")
    timings = []
    for _ in range(2):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        stats = trainer.update(samples)
        if cuda:
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - started)
        if not stats["micro_batches"] >= 1 or not stats["grad_norm"] > 0:
            raise SmokeFailure(f"the update did not train: {stats}")
    tokens = len(samples[0].input_ids)
    figures: dict[str, Any] = {
        "shape": "Qwen3-0.6B" if shape["num_hidden_layers"] == 28 else "Qwen3-small",
        "parameters_m": round(parameters / 1e6, 1),
        "dtype": params["dtype"],
        "tokens": tokens,
        "trained_tokens": int(stats["train_tokens"]),
        "gradient_checkpointing": bool(trainer.model.is_gradient_checkpointing),
        "update_s": timings[1],
        "first_update_s": timings[0],
        "tokens_per_s": tokens / timings[1],
        "build_s": build_s,
    }
    if cuda:
        figures["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        figures["peak_gpu_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        figures["gpu"] = torch.cuda.get_device_name()
    else:
        figures["peak_rss_gib"] = peak_rss_gib()
    return figures


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak) / (2**30 if sys.platform == "darwin" else 2**20)


def worker_eval(params: Mapping[str, Any]) -> dict[str, Any]:
    """Greedy episodes of the test split through the Harness, scored and diagnosed."""
    import torch

    from qpa.contract import read_tasks
    from qpa.harness.agent import HarnessConfig
    from qpa.train.greedy import evaluate, load_model

    tasks = list(read_tasks(params["tasks"]))
    model_dir = Path(params["model"])
    loaded = load_model(model_dir)
    device = str(next(iter(loaded[0].parameters())).device)
    harness = HarnessConfig(**params["harness"])
    started = time.perf_counter()
    summary = evaluate(
        model_dir, tasks, harness, Path(params["out"]), label="gpu-smoke",
        max_new_tokens=int(params["max_new_tokens"]), workers=128, loaded=loaded,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if summary["tasks"] != len(tasks):
        raise SmokeFailure(f"the report scored {summary['tasks']} of {len(tasks)} tasks")
    figures: dict[str, Any] = {
        "device": device,
        "tasks": len(tasks),
        "success": summary["success"],
        "episodes_per_s": len(tasks) / seconds,
    }
    if torch.cuda.is_available():
        figures["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return figures


WORKERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "update": worker_update,
    "eval": worker_eval,
}


# --------------------------------------------------------------------------- wheels


TRAINER_LOCKS = ("images/trainer/requirements.lock", "images/trainer/deepspeed.lock")
"""The trainer image's hashed locks (`images/lock.py`, Python 3.12): the versions carried."""
SOURCE_ONLY = ("deepspeed",)
"""Only an sdist on PyPI: built into a wheel here (pure Python; its ops are JIT-built)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _environment(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of the GPU node (Linux x86-64, CPython `python_version`)."""
    from packaging.markers import default_environment

    return {
        **default_environment(),
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def lock_pins(root: Path | None = None) -> dict[str, str]:
    """name -> version of the trainer image's locks (empty where the repository has none)."""
    root = root or Path(__file__).resolve().parents[1]
    pins: dict[str, str] = {}
    for relative in TRAINER_LOCKS:
        path = root / relative
        if path.is_file():
            for match in re.finditer(
                r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", path.read_text()
            ):
                pins[_canonical(match[1])] = match[2]
    return pins


def locked_requirements(python_version: str) -> list[str]:
    """`name==version` for qpa's dependencies (core + `WHEEL_EXTRAS`, transitively, as this
    environment's package metadata names them, for the node's Python), each at the trainer
    image's locked version (this environment's where the lock has none); torch and the CUDA
    libraries are left to the node."""
    from importlib import metadata

    from packaging.requirements import Requirement

    environment = _environment(python_version)
    pins = lock_pins()
    seen: dict[str, str] = {}
    visited: set[tuple[str, frozenset[str]]] = set()
    queue: list[tuple[str, frozenset[str]]] = [("qpa", frozenset(WHEEL_EXTRAS))]
    while queue:
        name, extras = queue.pop()
        if (_canonical(name), extras) in visited:
            continue
        visited.add((_canonical(name), extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SmokeFailure(f"{name} is not installed here: install qpa[train,data]") from None
        seen.setdefault(_canonical(name), dist.version)
        contexts = [{**environment, "extra": extra} for extra in ("", *sorted(extras))]
        for line in dist.requires or []:
            req = Requirement(line)
            if EXCLUDED_FROM_WHEELS.match(_canonical(req.name)):
                continue
            if req.marker is not None and not any(req.marker.evaluate(c) for c in contexts):
                continue
            queue.append((req.name, frozenset(req.extras)))
    seen.pop("qpa", None)
    return [f"{name}=={pins.get(name, version)}" for name, version in sorted(seen.items())]


def wheel_metadata(folder: Path) -> dict[str, tuple[str, list[str]]]:
    """canonical name -> (version, Requires-Dist lines) of every wheel in `folder`."""
    import zipfile

    found: dict[str, tuple[str, list[str]]] = {}
    for wheel in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            text = archive.read(name).decode()
        fields = dict(
            line.split(": ", 1) for line in text.split("\n\n")[0].splitlines() if ": " in line
        )
        requires = [line[len("Requires-Dist: ") :] for line in text.splitlines()
                    if line.startswith("Requires-Dist: ")]  # fmt: skip
        found[_canonical(fields["Name"])] = (fields["Version"], requires)
    return found


def unmet_requirements(folder: Path, python_version: str) -> list[str]:
    """What the wheels in `folder` need that is neither among them nor left to the node (a
    requirement of a carried package, or a carried version outside a requirement's range)."""
    from packaging.requirements import Requirement

    environment = _environment(python_version)
    wheels = wheel_metadata(folder)
    extras: dict[str, set[str]] = {"qpa": set(WHEEL_EXTRAS)}
    problems: list[str] = []
    todo = ["qpa"] if "qpa" in wheels else list(wheels)
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name = todo.pop()
        wanted = frozenset(extras.get(name, set()))
        if (name, wanted) in done or name not in wheels:
            continue
        done.add((name, wanted))
        contexts = [{**environment, "extra": extra} for extra in ("", *sorted(wanted))]
        for line in wheels[name][1]:
            req = Requirement(line)
            dep = _canonical(req.name)
            if EXCLUDED_FROM_WHEELS.match(dep):
                continue
            if req.marker is not None and not any(req.marker.evaluate(c) for c in contexts):
                continue
            if dep not in wheels:
                problems.append(f"{name} needs {req} (not carried)")
                continue
            if not req.specifier.contains(wheels[dep][0], prereleases=True):
                problems.append(f"{name} needs {req}, carried {dep}=={wheels[dep][0]}")
            extras.setdefault(dep, set()).update(req.extras)
            todo.append(dep)
    return sorted(set(problems))


def build_wheels(target: Path, python_version: str) -> None:
    """Write the wheel folder a GPU node installs offline (see the module doc), then check
    that its wheels' own requirements are all carried (or are torch and CUDA's)."""
    if target.is_dir() and any(target.glob("*.whl")):
        raise SystemExit(f"--build-wheels {target}: it already holds wheels; give a new folder")
    target.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    pip = [sys.executable, "-m", "pip"]
    requirements = locked_requirements(python_version)
    binary = [r for r in requirements if r.split("==")[0] not in SOURCE_ONLY]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(target), str(root)], check=True)
    for requirement in requirements:
        if requirement.split("==")[0] in SOURCE_ONLY:
            subprocess.run(
                [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(target),
                 requirement],
                check=True,
            )  # fmt: skip
    subprocess.run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(target),
         "--python-version", python_version, "--implementation", "cp",
         *[f"--platform={p}" for p in PLATFORMS], *binary],
        check=True,
    )  # fmt: skip
    (target / "requirements.txt").write_text("\n".join(requirements) + "\n")
    problems = unmet_requirements(target, python_version)
    if problems:
        raise SystemExit(f"the wheels in {target} are incomplete:\n" + "\n".join(problems))
    size = sum(p.stat().st_size for p in target.glob("*.whl")) / 2**20
    print(f"{len(requirements) + 1} wheels ({size:.0f} MiB) in {target}; on the GPU node: "
          f"python benchmarks/gpu_smoke.py --wheels {target} --out results")  # fmt: skip


def install_wheels(folder: Path) -> None:
    """Install qpa and its locked dependencies from `folder`, offline (qpa itself without
    dependencies: its `train` extra pins the CPU torch of laptops and CI)."""
    requirements = folder / "requirements.txt"
    if not requirements.is_file():
        raise SystemExit(f"--wheels {folder}: no requirements.txt (build it with --build-wheels)")
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(folder)]
    subprocess.run([*pip, "-r", str(requirements)], check=True)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", "qpa"], check=True)


# --------------------------------------------------------------------------- main


def detect(device: str) -> tuple[str, int, dict[str, Any]]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if device == "cuda" and not gpus:
        raise SystemExit("--device cuda: torch sees no GPU")
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": gpus,
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "cpus": os.cpu_count(),
    }
    return device, gpus, info


@contextlib.contextmanager
def work_folder(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="qpa-gpu-smoke-") as tmp:
        yield Path(tmp)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"write {RESULT_FILE} here")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--ranks", type=int, help="world size of the ZeRO runs")
    parser.add_argument("--update-tokens", type=int, help="length of the packed episode")
    parser.add_argument("--eval-limit", type=int, help="test tasks to evaluate (0: all)")
    parser.add_argument("--jobs", type=int, help="ZeRO runs at once (default: 4 on CUDA, 1 on CPU)")
    parser.add_argument(
        "--only", action="append", choices=STEP_NAMES, help="run only this step (repeatable)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    parser.add_argument("--work-dir", type=Path, help="keep every run's files here")
    parser.add_argument("--wheels", type=Path, help="install qpa + deps from this wheel folder")
    parser.add_argument("--build-wheels", type=Path, help="write the wheel folder; run nothing")
    parser.add_argument("--python-version", default="3.12", help="the GPU node's Python")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        figures = WORKERS[args.worker](json.loads(args.params))
        args.result.write_text(json.dumps(figures))
        return 0
    if args.build_wheels:
        build_wheels(args.build_wheels, args.python_version)
        return 0
    if args.wheels:
        install_wheels(args.wheels)
        rest = list(argv if argv is not None else sys.argv[1:])
        for index, arg in enumerate(rest):  # the same command, without --wheels DIR
            if arg == "--wheels" or arg.startswith("--wheels="):
                del rest[index : index + (1 if "=" in arg else 2)]
                break
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *rest])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device, gpus, info = detect(args.device)
    profile = make_profile(device, gpus, args)
    started = time.perf_counter()
    print(
        f"GPU smoke on {device}: {info['gpu'] or platform.processor() or 'CPU'}, torch "
        f"{info['torch']}, {profile.world_size} rank(s) on {profile.backend}, {profile.dtype}",
        flush=True,
    )
    with work_folder(args.work_dir) as work:
        reports = Smoke(profile, work, args.timeout, args.only).run()
    total = time.perf_counter() - started
    print_table(reports)
    ok = all(r.ok for r in reports)
    print(f"\n{'all steps ok' if ok else 'FAILED'} in {total:.0f} s")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        document = {
            "benchmark": "gpu_smoke",
            "ok": ok,
            "device": device,
            "profile": {
                "world_size": profile.world_size,
                "backend": profile.backend,
                "dtype": profile.dtype,
                "update_tokens": profile.update_tokens,
                "eval_limit": profile.eval_limit,
            },
            "environment": info,
            "total_s": round(total, 3),
            "steps": [r.as_dict() for r in reports],
        }
        (args.out / RESULT_FILE).write_text(json.dumps(document, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
