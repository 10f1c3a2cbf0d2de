"""Run many episodes concurrently: one environment per worker thread, results to the caller.

`qpa bench run` and `qpa collect` share this pool. Workers take (task, sample) pairs from a
queue, each with its own environment (in-process or an environment server) and a fresh planner
per episode; every finished trajectory is handed to `record` in the calling thread, so writing
files needs no locks. A failure in a worker or in `record` stops new episodes and is re-raised;
the first Ctrl-C lets the episodes in flight finish and be recorded, a second one stops at once.

With `env_retries`, an episode that an environment-side failure ended (a dead environment
server, a lost session: `trajectory.error` starting `environment:`) is reported to `on_retry` and
run again after a backoff (`retry_backoff_s`, doubling, at most `MAX_RETRY_BACKOFF_S`; its
`reset` starts a new session), so a restarting server costs time, not data; the recorded
trajectory is the last attempt's, its `metadata["env_failures"]` listing the earlier errors.

A model behind the Harness runs within the budgets its Harness version sets (`max_turns`,
`max_tokens`, `max_wall_s` of the Harness YAML, `episode_budgets`): the benchmark of a Harness
version measures that version, budgets included; the pool's `max_turns` caps every episode.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qpa import progress
from qpa.contract import Environment, Policy, Task, Trajectory
from qpa.harness.factory import MODEL_PLANNERS, PlannerFactory, PlannerSpec
from qpa.harness.planners import Planner
from qpa.harness.runner import Budgets, run_episode

MAX_RETRY_BACKOFF_S = 10.0


def policy_of(spec: PlannerSpec) -> Policy:
    return Policy(planner=spec.name, model=spec.policy_model, harness_version=spec.harness.version)


def episode_budgets(spec: PlannerSpec, max_turns: int) -> Budgets:
    """One episode's budgets: `max_turns` and, for a model behind the Harness, the budgets its
    Harness version sets (a turn budget it sets below `max_turns` wins; one it leaves at the
    default does not lift or lower the run's)."""
    if spec.name not in MODEL_PLANNERS:
        return Budgets(max_turns)
    harness = spec.harness
    turns = max_turns
    if "max_turns" in harness.model_fields_set:
        turns = min(max_turns, harness.max_turns)
    return Budgets(turns, harness.max_tokens, harness.max_wall_s)


def check_remote(urls: Sequence[str], error: Callable[[str], Exception]) -> None:
    """Fail fast, with `error(message)`, when an environment server does not answer."""
    from qpa.envs.remote import RemoteEnv

    for url in dict.fromkeys(urls):
        try:
            with RemoteEnv(url, retries=1) as env:
                env.health()
        except Exception as exc:  # unreachable, not a URL, not an environment server
            raise error(f"environment server {url} is not answering: {exc}") from None


def env_maker(urls: Sequence[str], env_kind: str) -> Callable[[int], Environment]:
    """Worker i's environment: a server round-robin from `urls`, or an in-process one."""
    if urls:
        from qpa.envs.remote import RemoteEnv

        def remote(worker: int) -> Environment:
            env: Environment = RemoteEnv(urls[worker % len(urls)])
            return env

        return remote
    from qpa.envs.factory import make_env

    return lambda worker: make_env(env_kind)


@dataclass
class _Failed:
    error: BaseException


_FINISHED = object()


def run_episodes(
    pending: Sequence[tuple[Task, int]],
    spec: PlannerSpec,
    policy: Policy,
    record: Callable[[Trajectory], None],
    *,
    concurrency: int,
    make_env: Callable[[int], Environment],
    max_turns: int,
    stop: threading.Event,
    name: str = "episode",
    env_retries: int = 0,
    retry_backoff_s: float = 1.0,
    on_retry: Callable[[Trajectory, int, float], None] | None = None,
    planners: Callable[[PlannerSpec], Callable[[], Planner]] = PlannerFactory,
) -> bool:
    """Run `pending` (task, sample) pairs; True when stopped before all of them ran.

    `on_retry(trajectory, attempt, delay_s)` is called (in the worker thread) before an episode
    an environment-side failure ended is run again; see the module doc. `planners(spec)` makes
    the per-episode planner factory (`PlannerFactory`, or e.g. the recovering oracle's).
    """
    if not pending:
        return stop.is_set()
    work: queue.SimpleQueue[tuple[Task, int]] = queue.SimpleQueue()
    for episode in pending:
        work.put(episode)
    results: queue.Queue[Trajectory | _Failed | object] = queue.Queue()
    budgets = episode_budgets(spec, max_turns)
    shared = planners(spec)
    factories: dict[int, Callable[[], Planner]] = {}
    factories_lock = threading.Lock()

    def factory_for(sample: int) -> Callable[[], Planner]:
        # the noisy planner varies its faults by sample, so pass^k means something for it
        if spec.name != "noisy":
            return shared
        with factories_lock:
            if sample not in factories:
                factories[sample] = planners(dataclasses.replace(spec, seed=spec.seed + sample))
            return factories[sample]

    def attempts(env: Environment, task: Task, sample: int) -> Trajectory:
        """One episode, run again while an environment-side failure ends it (`env_retries`)."""
        failures: list[str] = []
        while True:
            trajectory = run_episode(
                env, task, factory_for(sample)(), policy=policy, sample=sample, budgets=budgets
            )
            error = trajectory.error or ""
            if not error.startswith("environment:") or len(failures) >= env_retries:
                break
            failures.append(error)
            delay = min(retry_backoff_s * 2 ** (len(failures) - 1), MAX_RETRY_BACKOFF_S)
            if on_retry is not None:
                on_retry(trajectory, len(failures), delay)
            if stop.wait(delay):
                break
        if failures:
            trajectory.metadata["env_failures"] = failures
        return trajectory

    def worker(number: int) -> None:
        env: Environment | None = None
        try:
            env = make_env(number)
            while not stop.is_set():
                try:
                    task, sample = work.get_nowait()
                except queue.Empty:
                    break
                results.put(attempts(env, task, sample))
        except BaseException as exc:
            results.put(_Failed(exc))
        finally:
            if env is not None:
                try:
                    env.close()
                except Exception as exc:
                    results.put(_Failed(exc))
            results.put(_FINISHED)

    factory_for(pending[0][1])()  # build shared backends once, before the workers race to
    threads = [
        threading.Thread(target=worker, args=(i,), name=f"{name}-{i}", daemon=True)
        for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    alive, interrupted = len(threads), False
    failure: BaseException | None = None
    with progress.track(name, total=len(pending), unit="episodes") as bar:
        while alive:
            try:
                item = results.get(timeout=0.2)
                if item is _FINISHED:
                    alive -= 1
                elif isinstance(item, _Failed):
                    failure = failure or item.error
                    stop.set()
                elif isinstance(item, Trajectory):
                    record(item)
                    bar.advance()
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                if interrupted:  # a second Ctrl-C: stop waiting for the episodes in flight
                    stop.set()
                    raise
                stop.set()  # the first: finish and record the episodes in flight, start none
                interrupted = True
            except BaseException:
                stop.set()  # recording failed (e.g. a full disk): start no more episodes
                raise
    for thread in threads:
        thread.join()
    if failure is not None:
        raise failure
    return interrupted or stop.is_set()
