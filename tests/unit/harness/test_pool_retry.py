"""The episode pool reruns episodes an environment-side failure ended (`env_retries`)."""

from __future__ import annotations

import threading

from qpa.contract import Action, Feedback, Task, Trajectory
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.factory import PlannerSpec
from qpa.harness.pool import policy_of, run_episodes


class DyingEnv(SandboxEnv):
    """A sandbox whose server "dies" on the first `deaths` steps (the step raises)."""

    def __init__(self, deaths: int) -> None:
        super().__init__()
        self.deaths = deaths

    def step(self, action: Action) -> Feedback:
        if self.deaths > 0:
            self.deaths -= 1
            raise ConnectionError("environment server went away")
        return super().step(action)


def run(deaths: int, retries: int) -> tuple[list[Trajectory], list[tuple[str, int]]]:
    task: Task = generate_suite()[0]
    spec = PlannerSpec(name="oracle")
    recorded: list[Trajectory] = []
    reported: list[tuple[str, int]] = []
    env = DyingEnv(deaths)
    run_episodes(
        [(task, 0)],
        spec,
        policy_of(spec),
        recorded.append,
        concurrency=1,
        make_env=lambda worker: env,
        max_turns=40,
        stop=threading.Event(),
        env_retries=retries,
        retry_backoff_s=0.0,
        on_retry=lambda t, attempt, delay: reported.append((t.error or "", attempt)),
    )
    return recorded, reported


def test_an_environment_failure_is_reported_and_the_episode_runs_again() -> None:
    recorded, reported = run(deaths=2, retries=3)
    (trajectory,) = recorded  # one trajectory per pair, the last attempt's
    assert trajectory.success and trajectory.error is None
    assert [attempt for _, attempt in reported] == [1, 2]
    assert all(error.startswith("environment: ConnectionError") for error, _ in reported)
    assert trajectory.metadata["env_failures"] == [error for error, _ in reported]


def test_a_failure_outlasting_the_retries_is_recorded_as_environment_side() -> None:
    recorded, reported = run(deaths=5, retries=1)
    (trajectory,) = recorded
    assert not trajectory.success
    assert trajectory.error is not None and trajectory.error.startswith("environment:")
    assert len(reported) == 1 and len(trajectory.metadata["env_failures"]) == 1


def test_without_retries_nothing_runs_twice() -> None:
    recorded, reported = run(deaths=1, retries=0)
    assert reported == [] and recorded[0].error is not None
    assert "env_failures" not in recorded[0].metadata
