"""Several training ranks as local processes, the way `torchrun --standalone` starts them.

`Group(jobs, world_size=..., cwd=...)` writes the jobs (JSON) to a file and starts `world_size`
copies of this file as a script, each with its rank's rendezvous variables
(`qpa.train.deepspeed.local_rank_env`: 127.0.0.1, a port found free by binding port 0), one
intra-op thread and no hub access; every rank runs the jobs in order, in one process (so the
imports are paid once). `wait()` waits for all ranks; when one dies, the others are killed at
once (as torchrun's agent does): a rank blocked in a collective whose peer is gone would wait
forever. Ranks run from `cwd` (never the repository root: its `operator/` folder shadows the
stdlib module); their output goes to `rank<i>-*.log` there.

A job is a dict with a `mode`:

- `rl_update`: an `RLTrainer` (no rollouts) runs `update()` on this rank's share of each global
  batch in `batches` (`shares[update][rank]`: sample indices); rank 0 writes the metrics of
  every update and the full weights (`torch.save`, gathered under ZeRO-3) to `out`.
- `sft`: `train_sft` on `config`; rank 0 writes the `SFTResult` JSON to `out`.
- `rl_run`: `run_rl` on `config` in `ScoredSandbox` (a stand-in verifier whose outcome depends
  on the episode's index, so advantages are not all zero); with `kill_in_step`, every rank
  SIGKILLs itself as that step's first episode starts (lost mid-step, after the previous
  step's checkpoint); with `resume`, what `qpa train rl --resume` runs
  (`run_rl(..., resume=True)`). Rank 0 writes the result JSON to `out`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATTERN = (1.0, 1.0, 1.0, 1 / 3, 1.0, 0.0)


@dataclass
class Rank:
    """What one rank left behind (its output went to files in the group's folder)."""

    rank: int
    returncode: int
    stderr: str


class RanksFailed(AssertionError):
    """A rank exited otherwise than expected (or the group ran out of time)."""


class Group:
    """`world_size` ranks running `jobs` (see the module doc) one after the other; `wait()`."""

    def __init__(self, jobs: list[dict[str, Any]], *, world_size: int, cwd: Path) -> None:
        from qpa.train.deepspeed import free_port, local_rank_env

        cwd.mkdir(parents=True, exist_ok=True)
        self.cwd, self.world_size = cwd, world_size
        self.name = "+".join(job["mode"] for job in jobs)
        spec_file = cwd / f"jobs-{time.monotonic_ns()}.json"
        spec_file.write_text(json.dumps(jobs))
        port = free_port()
        base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        base.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.logs = [cwd / f"rank{rank}-{spec_file.stem}.log" for rank in range(world_size)]
        self.processes = []
        for rank, log in enumerate(self.logs):
            with log.open("w") as sink:  # a file, not a pipe: a full pipe would stall the rank
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, __file__, str(spec_file)],
                        cwd=cwd,
                        env={**base, **local_rank_env(rank, world_size, port)},
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                )

    def wait(self, timeout: float = 300.0, *, expect_killed: bool = False) -> list[Rank]:
        """Wait for every rank; raise `RanksFailed` unless all exit 0 (with `expect_killed`:
        all die of SIGKILL). When one rank dies the others are killed at once."""
        deadline = time.monotonic() + timeout
        timed_out = False
        while any(p.poll() is None for p in self.processes):
            died = any(p.returncode not in (None, 0) for p in self.processes)
            if died or time.monotonic() > deadline:
                timed_out = not died
                for process in self.processes:
                    if process.poll() is None:
                        process.kill()
                break
            time.sleep(0.1)
        ranks = [
            Rank(rank, process.wait(), log.read_text(errors="replace"))
            for rank, (process, log) in enumerate(zip(self.processes, self.logs, strict=True))
        ]
        wanted = -signal.SIGKILL if expect_killed else 0
        if timed_out or any(r.returncode != wanted for r in ranks):
            detail = "\n".join(
                f"--- rank {r.rank} exited {r.returncode}:\n{r.stderr[-3000:]}" for r in ranks
            )
            reason = f"timed out after {timeout:.0f} s" if timed_out else "a rank failed"
            raise RanksFailed(f"{self.name} x{self.world_size}: {reason}\n{detail}")
        return ranks


# --------------------------------------------------------------------------- inside a rank


def _scored_env(kill_at: int | None) -> Any:
    """Environments for `run_rl`; with `kill_at`, creating the `kill_at`-th one (from 1)
    SIGKILLs this process."""
    from qpa.contract import Verification
    from qpa.envs.sandbox import SandboxEnv

    class ScoredSandbox(SandboxEnv):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

        def verify(self) -> Verification:
            progress = PATTERN[self.index % len(PATTERN)]
            return Verification(done=True, success=progress == 1.0, progress=progress)

    made = [0]

    def make(index: int) -> ScoredSandbox:
        made[0] += 1
        if made[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return ScoredSandbox(index)

    return make


def _tasks() -> list[Any]:
    from qpa.envs.sandbox.suite import generate_suite

    pool = [t for t in generate_suite() if t.split == "train" and t.domain == "messaging"]
    return sorted(pool, key=lambda t: len(t.instruction))[:3]


def _rl_update(spec: dict[str, Any], rank: int) -> None:
    import torch

    from qpa.train.rl import RLConfig, RLTrainer, Sample

    trainer = RLTrainer(RLConfig.from_dict(spec["config"]), tasks=[])
    history = []
    for batch, shares in zip(spec["batches"], spec["shares"], strict=True):
        mine = [Sample(**batch[i]) for i in shares[rank]]
        history.append(trainer.update(mine))
    with trainer.full_parameters():
        if rank == 0:
            state = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
            torch.save({"history": history, "state": state}, spec["out"])
    trainer._barrier()


def _sft(spec: dict[str, Any], rank: int) -> None:
    from qpa.train.config import SFTConfig
    from qpa.train.sft import train_sft

    result = train_sft(SFTConfig.from_dict(spec["config"]))
    if rank == 0:
        Path(spec["out"]).write_text(result.model_dump_json())


def _rl_run(spec: dict[str, Any], rank: int) -> None:
    from qpa.train.rl import RLConfig, run_rl

    config = RLConfig.from_dict(spec["config"])
    kill_at = None
    if spec.get("kill_in_step"):  # the first episode of that step (episodes per step per rank)
        per_step = config.tasks_per_step * config.samples_per_task
        kill_at = (spec["kill_in_step"] - 1) * per_step + 1
    result = run_rl(
        config,
        resume=bool(spec.get("resume")),
        tasks=_tasks(),
        environment=_scored_env(kill_at),
    )
    if rank == 0:
        Path(spec["out"]).write_text(
            json.dumps(
                {
                    "final_step": result.final_step,
                    "resumed_from": result.resumed_from,
                    "final_dir": str(result.final_dir),
                    "history": result.history,
                }
            )
        )


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    (spec_file,) = argv
    rank = int(os.environ["RANK"])
    modes = {"rl_update": _rl_update, "sft": _sft, "rl_run": _rl_run}
    for job in json.loads(Path(spec_file).read_text()):
        started = time.perf_counter()
        modes[job["mode"]](job, rank)
        print(f"[multirank] {job['mode']} took {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
