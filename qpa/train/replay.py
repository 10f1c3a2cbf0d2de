"""Counterfactual replay: label a failed episode's side by fixing one side and running it again.

`qpa diagnose` attributes a failure by rules that read the trajectory. To measure those rules on
real failures of a trained model, this module labels the failures WITHOUT them: it replays each
failed episode through the real agent loop (`qpa.harness`: `HarnessPlanner` + `run_episode`) with
one side fixed, and the side whose fix turns the failure into a success is the label.

For each failed trajectory (the task, the model's recorded outputs, the Harness it ran under):

1. **Rerun** (the retry): the same model, the same Harness, the same task, a fresh environment.
   If the original met an environment error (`trajectory.error` from the environment, or an
   `environment_failure` / `transient` answer) and the rerun succeeds, the label is
   `environment` (a retry fixes it). A rerun that succeeds without any environment error means
   the failure does not reproduce: `unknown`.
2. **Model side** (`substitute`): find the diverging turn: the first turn whose action differs
   from the oracle's (the task's reference plan, `${i.path}` grounded in the results the episode
   saw, as `qpa.harness.planners.OraclePlanner` does; after the plan, the oracle finishes).
   Replay the episode: the turns before it get the model's recorded outputs, the diverging turn
   gets the oracle's step written as a text-protocol model writes it (`qpa.data.render`), and
   the same model continues live (greedy) under the same Harness. Success means the model's step
   was the cause: `model`, with a cause read off the two steps (`wrong_tool`, `wrong_arguments`,
   `ignored_memory`, `skipped_step`, `gave_up`, `malformed_output`, `wrong_answer`,
   `extra_action`). `max_substitutions` > 1 substitutes again at the replay's own next
   divergence. A model step equal to the oracle's (refused or failing all the same) is no
   divergence the model made: nothing is substituted.
3. **Harness side** (`harness`): the same model, unchanged, on the same task under each Harness
   variant (the run's revised Harness, a Harness with the needed tools and Skills in reach).
   Success where step 2 did not help: `harness`. The cause is named by the single setting
   that, changed alone from the failing Harness toward the variant that fixed it, fixes it too
   (`max_tools`: `tool_not_exposed`; `token_budget`: `tool_not_exposed` when a plan tool was
   missing from the exposure, else `skill_not_injected`; `drop_skills`: `skill_not_injected`;
   `memory_k`: `memory_retrieval_miss`; `max_turns` / `max_tokens` / `max_wall_s`: `budget_cut`).
4. Otherwise `unknown`: no replay decides.

Every label keeps all the replays' outcomes (`ReplayLabel.replays`), so a failure that both a
substituted step and a revised Harness fix (`fixed_by_both`) can be told apart.

Models run as `qpa.train.greedy` runs them: `ModelRunner` loads a checkpoint with
`qpa.train.greedy.load_model` and answers the live turns of all replays at once with one
batched greedy `generate` (`qpa.train.rl.TokenBatcher`, ordered by episode: deterministic).
`BackendRunner` runs replays one by one on any `ModelBackend` (a served model, a test's scripted
one). The module lives in `qpa.train`, not `qpa.diagnose`, because it runs environments and
models, which diagnosis never does. Importing it never imports torch.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from qpa.contract import (
    Action,
    Delegate,
    Environment,
    Finish,
    MessageUser,
    Policy,
    Step,
    Task,
    TokenUsage,
    ToolCall,
    ToolSpec,
    Trajectory,
)
from qpa.data.render import action_text
from qpa.envs.factory import make_env
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion, ModelBackend
from qpa.harness.planners import ground
from qpa.harness.runner import run_episode
from qpa.harness.skills import SkillLibrary

Label = Literal["model", "harness", "environment", "unknown"]
LABELS: tuple[Label, ...] = ("model", "harness", "environment", "unknown")
ReplayKind = Literal["rerun", "substitute", "harness", "harness_setting"]

ENV_ERRORS = frozenset({"environment_failure", "transient"})
_GIVE_UP = re.compile(
    r"\b(sorry|could ?n[o']t|cannot|can't|unable|not able|giving up|no tool)\b", re.IGNORECASE
)
# A Harness setting changed alone -> the Harness-side cause its fix names.
SETTING_CAUSES: dict[str, str] = {
    "max_tools": "tool_not_exposed",
    "token_budget": "skill_not_injected",  # or tool_not_exposed: decided from the exposure
    "drop_skills": "skill_not_injected",
    "memory_k": "memory_retrieval_miss",
    "max_turns": "budget_cut",
    "max_tokens": "budget_cut",
    "max_wall_s": "budget_cut",
}


class ReplayError(RuntimeError):
    """A failed trajectory cannot be replayed (the message names the trajectory and why)."""


# =========================================================================== records


class ReplayOutcome(BaseModel):
    """One replay of a failed episode and how it ended."""

    model_config = ConfigDict(extra="forbid")

    kind: ReplayKind
    name: str
    """`rerun`; `substitute@<turn>` (turns substituted, comma-separated); a Harness variant's
    version; `<variant>:<setting>` for a single-setting change."""
    success: bool
    turns: int
    error: str | None = None
    same_actions: bool | None = None
    """For the rerun: whether it took exactly the original's actions (a faithful reproduction)."""


class ReplayLabel(BaseModel):
    """The counterfactual label of one failed trajectory."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str
    task_id: str
    label: Label
    cause: str | None = None
    reason: str
    divergence: int | None = None
    """The first turn whose action differs from the oracle's (None: the model followed the plan
    as far as the episode went)."""
    oracle_step: str | None = None
    """The oracle's step at the divergence, as the text protocol writes it."""
    model_step: str | None = None
    """What the model said at the divergence."""
    environment_error: bool = False
    reproduced: bool | None = None
    fixed_by_model: bool = False
    fixed_by_harness: bool = False
    replays: list[ReplayOutcome] = Field(default_factory=list)

    @property
    def fixed_by_both(self) -> bool:
        return self.fixed_by_model and self.fixed_by_harness


# =========================================================================== the oracle


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, Mapping):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return value


def same_action(got: Action, expected: Action) -> bool:
    """Whether the model's action is the oracle's (strings compared case- and
    whitespace-insensitively; an oracle `Finish` without an answer matches any `Finish`)."""
    if isinstance(expected, ToolCall):
        return (
            isinstance(got, ToolCall)
            and got.tool == expected.tool
            and _norm(got.arguments) == _norm(expected.arguments)
        )
    if isinstance(expected, Finish):
        if not isinstance(got, Finish):
            return False
        return not expected.answer or _norm(got.answer or "") == _norm(expected.answer)
    if isinstance(expected, Delegate):
        return (
            isinstance(got, Delegate)
            and got.agent == expected.agent
            and sorted(got.tools) == sorted(expected.tools)
            and _norm(got.goal) == _norm(expected.goal)
        )
    if isinstance(expected, MessageUser):
        return isinstance(got, MessageUser) and _norm(got.text) == _norm(expected.text)
    return bool(got == expected)


def oracle_action(task: Task, steps: Sequence[Step], turn: int) -> Action:
    """The oracle's action at `turn`, given that turns before it took the plan's steps: the plan
    step, grounded in the observations of the steps before it; after the plan, `Finish()`."""
    plan = list(task.reference_plan or [])
    if turn >= len(plan):
        return Finish()
    return ground(plan[turn], [s.feedback.observation for s in steps[:turn]])


def find_divergence(trajectory: Trajectory) -> tuple[int, Action] | None:
    """(turn, the oracle's action there) of the first turn whose action differs from the oracle's;
    None when every recorded turn took the oracle's action (the episode stopped on the plan)."""
    if not trajectory.task.reference_plan:
        raise ReplayError(f"{trajectory.id}: task {trajectory.task.id} has no reference plan")
    for turn, step in enumerate(trajectory.steps):
        expected = oracle_action(trajectory.task, trajectory.steps, turn)
        if not same_action(step.action, expected):
            return turn, expected
    return None


def recorded_output(step: Step) -> str:
    """What the model said at a step (its raw output when recorded; else the action as text)."""
    raw = step.annotations.get("model_output")
    if isinstance(raw, str) and raw.strip():
        return raw
    return action_text(step.action)


def has_environment_error(trajectory: Trajectory) -> bool:
    if (trajectory.error or "").startswith("environment:"):
        return True
    return any(s.feedback.error in ENV_ERRORS for s in trajectory.steps)


def model_cause(task: Task, step: Step, expected: Action) -> str:
    """What the model did wrong at the divergence, read off its step and the oracle's."""
    plan = list(task.reference_plan or [])
    got = step.action
    if "parse_failure" in step.annotations:
        return "malformed_output"
    if isinstance(expected, Finish):
        if isinstance(got, Finish):
            value = expected.answer or ""
            remembered = any(m.value and m.value in value for m in task.memory)
            return "ignored_memory" if remembered else "wrong_answer"
        return "extra_action"
    if isinstance(got, (Finish, MessageUser)):
        calls_left = sum(isinstance(a, ToolCall) for a in plan[step.index :])
        text = got.answer if isinstance(got, Finish) else got.text
        if calls_left > 1 or _GIVE_UP.search(text or "") or isinstance(got, MessageUser):
            return "gave_up"
        return "skipped_step"
    if isinstance(expected, ToolCall) and isinstance(got, ToolCall):
        if got.tool == expected.tool:
            for key, value in expected.arguments.items():
                if _norm(got.arguments.get(key)) == _norm(value) or not isinstance(value, str):
                    continue
                if any(
                    m.value and m.value in value and m.value not in task.instruction
                    for m in task.memory
                ):
                    return "ignored_memory"
            return "wrong_arguments"
        later = [a.tool for a in plan[step.index + 1 :] if isinstance(a, ToolCall)]
        return "skipped_step" if got.tool in later else "wrong_tool"
    return "wrong_tool"


# =========================================================================== running replays


@dataclass
class ReplayJob:
    """One replay: a task under a Harness, with some turns' outputs fixed in advance."""

    task: Task
    harness: HarnessConfig
    script: dict[int, str] = field(default_factory=dict)
    """turn -> the model's output at that turn (recorded, or the oracle's substituted step);
    the other turns are the live model's."""


class ScriptedTurns:
    """A `ModelBackend` that answers the scripted turns itself and asks `live` for the others."""

    def __init__(self, live: ModelBackend, script: Mapping[int, str]) -> None:
        self.live = live
        self.script = dict(script)
        self.turn = 0

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        turn, self.turn = self.turn, self.turn + 1
        text = self.script.get(turn)
        if text is None:
            return self.live.complete(messages, tools)
        prompt = sum(len(m.content or "") for m in messages) // 4
        return Completion(
            text=text,
            usage=TokenUsage(prompt_tokens=prompt, completion_tokens=max(1, len(text) // 4)),
            finish_reason="stop",
            model=str(getattr(self.live, "model", "replay")),
            protocol="text",
        )


class Runner(Protocol):
    """Runs replays through the real agent loop; one trajectory per job, in job order."""

    label: str

    def run(self, jobs: Sequence[ReplayJob]) -> list[Trajectory]: ...


def _episode(
    job: ReplayJob,
    backend: ModelBackend,
    skills: SkillLibrary,
    env: Environment,
    label: str,
) -> Trajectory:
    planner = HarnessPlanner(ScriptedTurns(backend, job.script), job.harness, skills=skills)
    policy = Policy(planner="local", model=label, harness_version=job.harness.version)
    try:
        return run_episode(env, job.task, planner, policy=policy, budgets=job.harness.budgets())
    finally:
        with contextlib.suppress(Exception):
            env.close()
        with contextlib.suppress(Exception):
            planner.memory.close()


class _Skills:
    """Skill libraries by Harness (loaded once per distinct setting)."""

    def __init__(self) -> None:
        self._cache: dict[str | None, SkillLibrary] = {}
        self._lock = threading.Lock()

    def of(self, harness: HarnessConfig) -> SkillLibrary:
        with self._lock:
            if harness.skills_path not in self._cache:
                self._cache[harness.skills_path] = harness.skill_library()
            return self._cache[harness.skills_path]


class BackendRunner:
    """Replays one at a time on backends from `factory(task)` (a served model, a scripted one)."""

    def __init__(
        self,
        factory: Callable[[Task], ModelBackend],
        *,
        label: str = "backend",
        env_factory: Callable[[Task], Environment] | None = None,
    ) -> None:
        self.factory = factory
        self.label = label
        self.env_factory = env_factory or (lambda task: make_env("sandbox"))
        self._skills = _Skills()

    def run(self, jobs: Sequence[ReplayJob]) -> list[Trajectory]:
        return [
            _episode(
                job,
                self.factory(job.task),
                self._skills.of(job.harness),
                self.env_factory(job.task),
                self.label,
            )
            for job in jobs
        ]


class ModelRunner:
    """Replays on a loaded checkpoint, greedy: the live turns of all replays in flight are
    answered by one batched `generate` (`qpa.train.greedy.greedy_generate` through a
    `TokenBatcher`, ordered by replay), as `qpa.train.greedy.run_episodes` evaluates."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        label: str,
        max_new_tokens: int = 96,
        workers: int = 64,
        env_factory: Callable[[Task], Environment] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.label = label
        self.max_new_tokens = max_new_tokens
        self.workers = workers
        self.env_factory = env_factory or (lambda task: make_env("sandbox"))
        self._skills = _Skills()

    def run(self, jobs: Sequence[ReplayJob]) -> list[Trajectory]:
        from qpa.train.greedy import run_batched

        def episode(index: int, backend: Any) -> Trajectory:
            job = jobs[index]
            return _episode(
                job, backend, self._skills.of(job.harness), self.env_factory(job.task), self.label
            )

        return run_batched(
            self.model,
            self.tokenizer,
            len(jobs),
            episode,
            label=self.label,
            max_new_tokens=self.max_new_tokens,
            workers=self.workers,
            title="replay",
        )


# =========================================================================== labelling


def _outcome(kind: ReplayKind, name: str, trajectory: Trajectory) -> ReplayOutcome:
    return ReplayOutcome(
        kind=kind,
        name=name,
        success=trajectory.success,
        turns=len(trajectory.steps),
        error=trajectory.error,
    )


def _same_actions(a: Trajectory, b: Trajectory) -> bool:
    return len(a.steps) == len(b.steps) and all(
        x.action.model_dump() == y.action.model_dump()
        for x, y in zip(a.steps, b.steps, strict=True)
    )


def _setting_deltas(base: HarnessConfig, variant: HarnessConfig) -> dict[str, Any]:
    """The settings (with a cause) in which `variant` differs from `base`."""
    mine, theirs = base.model_dump(), variant.model_dump()
    return {k: theirs[k] for k in SETTING_CAUSES if mine.get(k) != theirs.get(k)}


def _plan_tool_hidden(trajectory: Trajectory) -> bool:
    exposed = next(
        (s.annotations.get("tools_exposed") for s in trajectory.steps if s.agent == "main"), None
    )
    if not isinstance(exposed, list):
        return False
    plan = [a.tool for a in trajectory.task.reference_plan or [] if isinstance(a, ToolCall)]
    return any(tool not in exposed for tool in plan)


@dataclass
class _Case:
    original: Trajectory
    harness: HarnessConfig
    script: dict[int, str] = field(default_factory=dict)
    substituted: list[int] = field(default_factory=list)
    divergence: tuple[int, Action] | None = None
    rerun: Trajectory | None = None
    model_fix: Trajectory | None = None
    harness_fixes: dict[str, Trajectory] = field(default_factory=dict)
    outcomes: list[ReplayOutcome] = field(default_factory=list)
    cause: str | None = None


def label_failures(
    failures: Sequence[Trajectory],
    runner: Runner,
    *,
    harness: HarnessConfig | Callable[[Trajectory], HarnessConfig],
    variants: Sequence[HarnessConfig] = (),
    max_substitutions: int = 1,
) -> list[ReplayLabel]:
    """The counterfactual label of every failed trajectory (successes are refused).

    `harness`: the Harness the failures ran under (or a function of the trajectory giving it);
    `variants`: the Harness versions tried for the Harness side (a variant equal to a failure's
    own Harness is skipped for it). Replays of one phase run together (`runner.run`): the
    reruns and first substitutions, further substitutions, the variants, the single settings.
    """
    if max_substitutions < 1:
        raise ValueError("max_substitutions must be at least 1")
    cases: list[_Case] = []
    for trajectory in failures:
        if trajectory.success:
            raise ReplayError(f"{trajectory.id}: succeeded; only failures are replayed")
        own = harness if isinstance(harness, HarnessConfig) else harness(trajectory)
        case = _Case(trajectory, own, divergence=find_divergence(trajectory))
        cases.append(case)

    # Phase 1: the rerun (retry / reproduction) and the first substitution, together.
    jobs: list[tuple[_Case, str, ReplayJob]] = []
    for case in cases:
        jobs.append((case, "rerun", ReplayJob(case.original.task, case.harness)))
        if case.divergence is not None:
            turn, expected = case.divergence
            script = {i: recorded_output(s) for i, s in enumerate(case.original.steps[:turn])}
            script[turn] = action_text(expected)
            case.script, case.substituted = script, [turn]
            jobs.append((case, "substitute", ReplayJob(case.original.task, case.harness, script)))
    _run_phase(runner, jobs)

    # Further substitutions at the replay's own next divergence.
    for _ in range(max_substitutions - 1):
        jobs = []
        for case in cases:
            replay = case.model_fix
            if replay is None or replay.success or not case.substituted:
                continue
            nxt = find_divergence(replay)
            if nxt is None or nxt[0] <= case.substituted[-1]:
                continue
            turn, expected = nxt
            script = {i: recorded_output(s) for i, s in enumerate(replay.steps[:turn])}
            script.update({t: case.script[t] for t in case.substituted})
            script[turn] = action_text(expected)
            case.script, case.substituted = script, [*case.substituted, turn]
            jobs.append((case, "substitute", ReplayJob(case.original.task, case.harness, script)))
        if not jobs:
            break
        _run_phase(runner, jobs)

    # Phase 2: the same model under each Harness variant.
    jobs = []
    for case in cases:
        for variant in variants:
            if variant.model_dump() != case.harness.model_dump():
                jobs.append(
                    (case, f"harness:{variant.version}", ReplayJob(case.original.task, variant))
                )
    _run_phase(runner, jobs)

    # Phase 3: the single settings of the first variant that fixed it, to name the cause.
    jobs = []
    for case in cases:
        fixed = next((v for v in variants if case.harness_fixes.get(v.version)), None)
        if fixed is None:
            continue
        for setting, value in _setting_deltas(case.harness, fixed).items():
            single = case.harness.model_copy(
                update={setting: value, "version": f"{fixed.version}:{setting}"}
            )
            jobs.append((case, f"setting:{setting}", ReplayJob(case.original.task, single)))
    _run_phase(runner, jobs)

    return [_label(case) for case in cases]


def _run_phase(runner: Runner, jobs: list[tuple[_Case, str, ReplayJob]]) -> None:
    trajectories = runner.run([job for _, _, job in jobs])
    for (case, what, job), replay in zip(jobs, trajectories, strict=True):
        if what == "rerun":
            case.rerun = replay
            outcome = _outcome("rerun", "rerun", replay)
            outcome.same_actions = _same_actions(case.original, replay)
        elif what == "substitute":
            case.model_fix = replay
            name = "substitute@" + ",".join(str(t) for t in case.substituted)
            outcome = _outcome("substitute", name, replay)
        elif what.startswith("harness:"):
            case.harness_fixes[job.harness.version] = replay
            outcome = _outcome("harness", job.harness.version, replay)
        else:
            setting = what.removeprefix("setting:")
            outcome = _outcome("harness_setting", job.harness.version, replay)
            if replay.success and case.cause is None:
                cause = SETTING_CAUSES[setting]
                if setting == "token_budget" and _plan_tool_hidden(case.original):
                    cause = "tool_not_exposed"
                case.cause = cause
        case.outcomes.append(outcome)


def _label(case: _Case) -> ReplayLabel:
    original = case.original
    env_error = has_environment_error(original)
    reproduced = None if case.rerun is None else not case.rerun.success
    fixed_by_model = case.model_fix is not None and case.model_fix.success
    fixed_by_harness = any(t.success for t in case.harness_fixes.values())
    divergence = case.divergence
    common: dict[str, Any] = {
        "trajectory_id": original.id,
        "task_id": original.task.id,
        "divergence": divergence[0] if divergence else None,
        "oracle_step": action_text(divergence[1]) if divergence else None,
        "model_step": recorded_output(original.steps[divergence[0]]) if divergence else None,
        "environment_error": env_error,
        "reproduced": reproduced,
        "fixed_by_model": fixed_by_model,
        "fixed_by_harness": fixed_by_harness,
        "replays": case.outcomes,
    }
    if not reproduced:
        if env_error:
            return ReplayLabel(
                label="environment",
                cause="environment_error",
                reason="the same model and Harness succeed on a retry in a fresh environment",
                **common,
            )
        return ReplayLabel(
            label="unknown",
            reason="the failure does not reproduce: a rerun of the same model succeeds",
            **common,
        )
    if fixed_by_model and divergence is not None:
        turns = ", ".join(str(t) for t in case.substituted)
        step = original.steps[divergence[0]]
        return ReplayLabel(
            label="model",
            cause=model_cause(original.task, step, divergence[1]),
            reason=f"the oracle's step substituted at turn {turns}, the same model succeeds",
            **common,
        )
    if fixed_by_harness:
        fixed = next(v for v, t in case.harness_fixes.items() if t.success)
        return ReplayLabel(
            label="harness",
            cause=case.cause,
            reason=(
                f"the same model succeeds under {fixed}"
                + ("" if divergence is None else "; the oracle's step did not help")
            ),
            **common,
        )
    why = (
        "the model took the oracle's steps as far as the episode went"
        if divergence is None
        else "neither the oracle's step nor a Harness variant turns it into a success"
    )
    return ReplayLabel(label="unknown", reason=why, **common)


__all__ = [
    "LABELS",
    "SETTING_CAUSES",
    "BackendRunner",
    "Label",
    "ModelRunner",
    "ReplayError",
    "ReplayJob",
    "ReplayLabel",
    "ReplayOutcome",
    "Runner",
    "ScriptedTurns",
    "find_divergence",
    "has_environment_error",
    "label_failures",
    "model_cause",
    "oracle_action",
    "recorded_output",
    "same_action",
]
