"""The episode pool (`qpa bench run`, `qpa collect`) runs a model behind the Harness within the
budgets its Harness version sets, and the run's `max_turns` caps every episode."""

from __future__ import annotations

import threading
from typing import Any

from fakes.openai_server import FakeOpenAI, Reply, scripted

from qpa.contract import Trajectory
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessConfig
from qpa.harness.factory import PlannerSpec
from qpa.harness.pool import policy_of, run_episodes

TASK = generate_suite()[0]


def bench(spec: PlannerSpec, max_turns: int) -> Trajectory:
    recorded: list[Trajectory] = []
    run_episodes(
        [(TASK, 0)],
        spec,
        policy_of(spec),
        recorded.append,
        concurrency=1,
        make_env=lambda worker: SandboxEnv(),
        max_turns=max_turns,
        stop=threading.Event(),
    )
    (trajectory,) = recorded
    return trajectory


def behind_the_harness(server: FakeOpenAI, **harness: Any) -> PlannerSpec:
    config = HarnessConfig.model_validate(harness)  # as `load_harness_config` reads the YAML
    return PlannerSpec(name="openai", model_url=server.base_url, model="fake-model", harness=config)


def test_the_harness_versions_budgets_cut_its_episodes() -> None:
    with FakeOpenAI(scripted(Reply(content="thinking it over"))) as server:  # never finishes
        by_turns = bench(behind_the_harness(server, max_turns=2), max_turns=40)
        assert len(by_turns.steps) == 2
        assert by_turns.error == "harness: turn budget of 2 exhausted"
        by_tokens = bench(behind_the_harness(server, max_tokens=100), max_turns=40)
        assert len(by_tokens.steps) == 1
        assert by_tokens.error == "harness: token budget of 100 exhausted"


def test_the_runs_max_turns_caps_every_episode() -> None:
    with FakeOpenAI(scripted(Reply(content="thinking it over"))) as server:
        higher = bench(behind_the_harness(server, max_turns=30), max_turns=3)
        assert higher.error == "harness: turn budget of 3 exhausted" and len(higher.steps) == 3
        unset = bench(behind_the_harness(server), max_turns=5)  # the default lowers nothing
        assert unset.error == "harness: turn budget of 5 exhausted" and len(unset.steps) == 5
        assert len(server.requests) == 3 + 5
