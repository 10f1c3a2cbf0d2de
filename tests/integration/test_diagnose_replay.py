"""Counterfactual replay labels (`qpa.train.replay`) on real failures with a known cause.

The failures are real episodes of the agent loop (`HarnessPlanner` + `run_episode` on the
sandbox) of a scripted model that speaks the text protocol like the local checkpoint and decides
from the conversation alone (so a replay that fixes some turns in advance steers it exactly as
it would a trained model):

- a model-side failure: the model always writes a wrong subject into `email_send`; substituting
  the oracle's call at that turn makes the same model succeed -> `model` / `wrong_arguments`;
- a Harness-side failure: a Harness that exposes one tool hides a plan tool, the model gives up;
  the oracle's substituted call is refused as well (the tool is not exposed), the same model
  succeeds under a Harness with every tool -> `harness` / `tool_not_exposed` (named by the one
  setting, `max_tools`, that fixes it alone);
- an environment-side failure: the app stops responding once; the retry in a fresh environment
  succeeds -> `environment`.

`benchmarks/diagnosis_accuracy.py --replay` scores `qpa diagnose` against such labels; its
scoring function is checked on the three. A tiny (untrained) checkpoint checks `ModelRunner`:
the rerun reproduces greedy episodes exactly, and a scripted turn takes the oracle's step.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers.faults import FaultyEnv

from qpa.contract import Finish, TokenUsage, ToolCall, ToolSpec, Trajectory
from qpa.data.render import action_text
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessConfig
from qpa.harness.backends.base import ChatMessage, Completion
from qpa.harness.planners import ground
from qpa.train.replay import (
    BackendRunner,
    ReplayError,
    ReplayJob,
    find_divergence,
    label_failures,
    same_action,
)

ROOT = Path(__file__).resolve().parents[2]
TASK = next(
    t for t in generate_suite() if t.split == "test" and t.template == "email_contact_by_name"
)
WIDE = HarnessConfig(version="harness-wide", max_turns=8)
NARROW = HarnessConfig(version="harness-narrow", max_tools=1, max_turns=8)
_PREFACE_END = "]\n"


class PlanModel:
    """Follows the reference plan, reading its progress from the conversation: the plan step
    is the count of tool results that came back `ok`. `wrong_subject`: every `email_send` gets
    a wrong subject; a plan tool it is not offered -> it gives up."""

    def __init__(self, task: Any, *, wrong_subject: bool = False) -> None:
        self.plan = list(task.reference_plan or [])
        self.wrong_subject = wrong_subject

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        results = []
        for message in messages:
            if message.role != "tool":
                continue
            body = json.loads((message.content or "").partition(_PREFACE_END)[2])
            if body.get("status") == "ok":
                results.append(body.get("result"))
        step = len(results)
        action = Finish() if step >= len(self.plan) else ground(self.plan[step], results)
        if isinstance(action, ToolCall):
            if action.tool not in {t.name for t in tools}:
                action = Finish(answer="Sorry, I can't: the tool is not available to me.")
            elif self.wrong_subject and action.tool == "email_send":
                arguments = {**action.arguments, "subject": "Hello"}
                action = action.model_copy(update={"arguments": arguments})
        text = action_text(action)
        return Completion(
            text=text,
            usage=TokenUsage(prompt_tokens=100, completion_tokens=len(text) // 4),
            finish_reason="stop",
            protocol="text",
        )


def _runner(**model: Any) -> BackendRunner:
    return BackendRunner(lambda task: PlanModel(task, **model), label="plan-model")


def _original(harness: HarnessConfig, env: Any = None, **model: Any) -> Trajectory:
    runner = BackendRunner(
        lambda task: PlanModel(task, **model),
        label="plan-model",
        env_factory=(lambda task: env) if env is not None else None,
    )
    (trajectory,) = runner.run([ReplayJob(TASK, harness)])
    assert not trajectory.success, trajectory.verification
    return trajectory


def test_a_wrong_step_the_oracle_fixes_is_labelled_model() -> None:
    original = _original(WIDE, wrong_subject=True)
    turn, expected = find_divergence(original) or (None, None)
    assert turn == 1 and isinstance(expected, ToolCall) and expected.tool == "email_send"
    assert not same_action(original.steps[1].action, expected)

    (label,) = label_failures(
        [original], _runner(wrong_subject=True), harness=WIDE, variants=[WIDE]
    )
    assert label.label == "model" and label.cause == "wrong_arguments", label
    assert label.divergence == 1 and label.reproduced and label.fixed_by_model
    assert not label.fixed_by_harness
    assert label.oracle_step == action_text(expected)
    assert '"subject": "Hello"' in (label.model_step or "")
    kinds = {(o.kind, o.name): o.success for o in label.replays}
    assert kinds == {("rerun", "rerun"): False, ("substitute", "substitute@1"): True}
    rerun = next(o for o in label.replays if o.kind == "rerun")
    assert rerun.same_actions is True


def test_a_hidden_tool_a_wider_harness_fixes_is_labelled_harness() -> None:
    original = _original(NARROW)
    assert isinstance(original.steps[0].action, Finish)  # the model gave up at once

    (label,) = label_failures([original], _runner(), harness=NARROW, variants=[NARROW, WIDE])
    assert label.label == "harness" and label.cause == "tool_not_exposed", label
    assert label.divergence == 0 and label.reproduced
    assert label.fixed_by_harness and not label.fixed_by_model
    outcomes = {o.name: o.success for o in label.replays}
    # NARROW itself is the failure's Harness: skipped; WIDE fixes it, and so does max_tools alone
    assert outcomes == {
        "rerun": False,
        "substitute@0": False,
        "harness-wide": True,
        "harness-wide:max_tools": True,
    }


def test_an_environment_error_a_retry_fixes_is_labelled_environment() -> None:
    broken = FaultyEnv(SandboxEnv(), mode="transient", at_step=1)
    original = _original(WIDE, env=broken)
    assert original.steps[1].feedback.error == "transient"

    (label,) = label_failures([original], _runner(), harness=WIDE)
    assert label.label == "environment" and label.environment_error
    assert label.reproduced is False


def test_successes_are_refused() -> None:
    (success,) = _runner().run([ReplayJob(TASK, WIDE)])
    assert success.success
    with pytest.raises(ReplayError, match="only failures are replayed"):
        label_failures([success], _runner(), harness=WIDE)


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "diagnosis_accuracy", ROOT / "benchmarks" / "diagnosis_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["diagnosis_accuracy"] = module
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_scores_diagnose_against_the_labels() -> None:
    model_case = _original(WIDE, wrong_subject=True)
    harness_case = _original(NARROW)
    labels = label_failures([model_case], _runner(wrong_subject=True), harness=WIDE)
    labels += label_failures([harness_case], _runner(), harness=NARROW, variants=[WIDE])
    bench = _benchmark()
    scored = bench.score_replay(
        [("eval/test", model_case, labels[0]), ("eval/test", harness_case, labels[1])]
    )
    assert scored["decided"] == 2
    assert scored["labels"] == {"model": 1, "harness": 1, "environment": 0, "unknown": 0}
    assert scored["confusion"]["model"]["model"] == 1
    assert scored["confusion"]["harness"]["harness"] == 1
    assert scored["side_accuracy"] == 1.0 and scored["cause_accuracy"] == 1.0
    low, high = scored["side_accuracy_ci"]
    assert 0.0 < low < 1.0 and high == 1.0


def test_model_runner_reproduces_greedy_episodes_and_takes_scripted_steps(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    from qpa.harness.backends.base import to_text_protocol
    from qpa.harness.backends.scripted import OracleBackend
    from qpa.train.greedy import load_model, run_episodes
    from qpa.train.replay import ModelRunner
    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint

    # A compact Harness (two tools, a small adapter budget) and a tokenizer trained on its own
    # prompts keep the prompts short: the untrained model's episodes take seconds.
    harness = HarnessConfig(max_turns=1, max_tools=2, token_budget=100)
    tasks = [TASK, next(t for t in generate_suite() if t.template == "add_new_contact")]
    corpus: list[str] = []

    class Recording(OracleBackend):
        def complete(
            self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
        ) -> Completion:
            corpus.extend(m.content or "" for m in to_text_protocol(messages, tools))
            return super().complete(messages, tools)

    BackendRunner(Recording).run([ReplayJob(t, harness) for t in tasks])
    config = TinyConfig(
        vocab_size=4096,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
    )
    model, tokenizer = load_model(make_tiny_checkpoint(tmp_path / "tiny", config, corpus=corpus))
    greedy = run_episodes(model, tokenizer, tasks, harness, label="tiny", max_new_tokens=12)
    runner = ModelRunner(model, tokenizer, label="tiny", max_new_tokens=12, workers=4)
    # the scripted turn: the first plan call of a task whose first tool the Harness exposes
    exposed = [
        (task, plan[0])
        for task, episode in zip(tasks, greedy, strict=True)
        if (plan := task.reference_plan)
        and isinstance(plan[0], ToolCall)
        and plan[0].tool in episode.steps[0].annotations["tools_exposed"]
    ]
    assert exposed, [e.steps[0].annotations["tools_exposed"] for e in greedy]
    task, first_call = exposed[0]
    replays = runner.run(
        [
            ReplayJob(tasks[0], harness),
            ReplayJob(tasks[1], harness),
            ReplayJob(task, harness, {0: action_text(first_call)}),
        ]
    )
    for original, rerun in zip(greedy, replays[:2], strict=True):
        assert [s.annotations.get("model_output") for s in rerun.steps] == [
            s.annotations.get("model_output") for s in original.steps
        ]
        assert rerun.steps[0].usage.prompt_tokens == original.steps[0].usage.prompt_tokens
    scripted = replays[2]
    assert same_action(scripted.steps[0].action, first_call)
    assert scripted.steps[0].feedback.status == "ok"
