"""TRL's own `GRPOTrainer` on qpa environments: a `rollout_func`, qpa's verification as the
reward, and CARE's rewards and success-anchored advantages as an option.

qpa trains its planner with its own loop (`qpa.train.rl`, `qpa train rl`); this module is the way
to train the same planner, in the same environments, with `trl.GRPOTrainer` instead, for teams
whose tooling is built around TRL (its loss variants, logging, PEFT, accelerate launchers):

```python
from trl import GRPOConfig
from qpa.train.trl_grpo import QpaRolloutSettings, build_grpo_trainer

trainer, rollout = build_grpo_trainer(
    "runs/tiny/model",                       # any causal LM folder (or a loaded model)
    tasks,                                   # qpa Tasks (e.g. the suite's train split)
    GRPOConfig(output_dir="runs/trl", num_generations=4, per_device_train_batch_size=8,
               scale_rewards="none", max_steps=100),
    settings=QpaRolloutSettings(harness={"max_turns": 8}, max_new_tokens=128),
    reward="care",                           # or "verification"
)
trainer.train()
```

**The data.** `task_dataset(tasks)` is a `datasets.Dataset` with TRL's conversational `prompt`
column and the task's id, domain, capabilities and difficulty. TRL hands a `rollout_func` the
prompts only (not the rows), so each prompt carries its task: a system message
`qpa-task: <id>` before the user's instruction. The planner never sees that message: the prompt
it sees is the Harness's.

**The rollout** (`QpaRollout`, TRL's `rollout_func`). Each prompt TRL passes (it has already
repeated every task `num_generations` times) becomes one qpa episode: `run_episode(env, task,
HarnessPlanner(backend))` in a fresh environment from the contract (`qpa.envs.factory.make_env`
of `settings.env.kind`, a `RemoteEnv` on `qpa env serve` URLs, or a caller's factory). The
backend is `qpa.train.rl.PolicyBackend` over the model TRL trains (unwrapped with TRL's
`unwrap_model_for_generation`), so the Harness renders exactly the prompt the planner is trained
on and served with (Scenario Adapter, Skills, memory, the text protocol, the chat template).
Episodes run in threads and their model calls are answered by one batched `generate` per turn
(`qpa.train.rl.TokenBatcher`), sampling with the `GRPOConfig`'s `temperature`, `top_p` and
`top_k`, the distribution TRL's loss computes log-probabilities under.

TRL trains one prompt and one completion per sample, with an `env_mask` that gives tokens the
model did not sample no loss. A multi-turn episode is packed into that layout as qpa's own trainer
packs it (`qpa.train.rl.build_samples`): the first turn's prompt is the prompt; the completion is
turn 1's sampled tokens, then what lies between them and turn 2's sampled tokens (the tool result
as the Harness wrote it, the chat template's tokens: `env_mask` 0), then turn 2's, and so on.

**The rewards.** `rollout_func` returns, per sample, the episode's verification and totals
(`qpa_success`, `qpa_progress`, `qpa_output_tokens`, `qpa_tool_calls`, `qpa_well_formed`,
`qpa_task_id`, `qpa_trajectory_id`, `qpa_env_failure`); TRL passes them to the reward functions.

- `verification_reward()` ("qpa_verification"): the environment's verifier, 1.0 for a success,
  `progress_weight * progress` otherwise (0 by default). TRL standardises it per group
  (`scale_rewards="group"`: vanilla GRPO) or centres it (`"none"`: Dr.GRPO's advantages).
- `CareReward` ("qpa_care"): CARE (`qpa.train.care.care_group`) on each group of
  `num_generations` samples of one task: the group's tier picks the reward (progress shaping,
  outcome consolidation, efficiency refinement), and the reward returned is the tier reward
  divided by CARE's scale for the group (the success anchor `max(std, kappa_k)` in an all-success
  or all-failure group, `std + eps` otherwise). With `scale_rewards="none"` TRL's advantage is
  `r' - mean(r')`, and since centring is linear that is exactly CARE's advantage
  `(r - mean(r)) / scale`. So CARE's advantages reach TRL's loss unchanged, with no private
  method overridden; `build_grpo_trainer` refuses `reward="care"` with any other
  `scale_rewards`, or next to other reward functions (TRL would sum them before centring).
  With `care.enabled: false` the reward is CARE's fixed baseline tier (`vanilla_reward`) and
  TRL's own `scale_rewards` must equal `care.scale_rewards` (GRPO or Dr.GRPO, computed by TRL).
  The tier rewards themselves and the tier mix are logged as TRL metrics (`care/reward`,
  `care/tier/<tier>`), since TRL's own `reward` column then shows the scaled values.

An episode the environment's side ended (a dead server, a failed reset: `Trajectory.error`
starting with `environment:`) is scored `None` by both functions, as qpa's trainer leaves it
out: TRL treats it as unscorable (excluded from the group's mean, advantage 0).

**What maps, and what does not.** Maps: the environments (every kind the contract has, in
process or over HTTP), the Harness prompt, qpa's verification, CARE's tiers and anchored
advantages, the GRPO loss (TRL's, with every `loss_type`; `dr_grpo` is the Dr.GRPO baseline),
turn-level masking of environment feedback. Does not map:

- *Turns whose prompt does not extend the packed sequence* (a sub-agent's own conversation, a
  Harness that rewrote earlier context, a re-tokenization that differs from the sampled ids):
  TRL's layout has one completion per sample, so these turns are left out of training (counted
  in the metric `qpa/unpacked_turns`); qpa's own trainer trains them as separate sequences.
- *Learnability sampling and refill* (`sampling.strategy: learnability`): TRL's sampler draws
  dataset rows uniformly; zero-signal groups are not replaced.
- *vLLM generation*: the rollout generates with the model in training; `use_vllm=True` is
  refused (qpa's trainer has `generation.backend: vllm`).
- *TRL's `environment_factory`*: its tool loop parses tool calls with the tokenizer's
  response template and renders tools with the model's chat template, which is not the
  Harness's text protocol the planner is trained on; so the rollout is a `rollout_func`.
- *qpa's store-backed checkpoints, resume and TrainMetrics*: TRL's own saving and logging apply.

The test (`tests/integration/test_trl_grpo.py`) runs two `GRPOTrainer` steps on the tiny model on
CPU and checks that rewards and advantages are the ones qpa's verification and CARE give.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from qpa.api.v1alpha1 import CareSettings
from qpa.contract import Environment, Policy, Task, Trajectory
from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.runner import run_episode
from qpa.harness.skills import SkillLibrary
from qpa.train.care import GroupResult, Outcome, care_group, vanilla_group
from qpa.train.config import ConfigError
from qpa.train.rl.config import EnvSettings, GenerationSettings
from qpa.train.rl.generation import (
    Episode,
    GenerationFailed,
    PolicyBackend,
    TokenBatcher,
    Turn,
    hf_generate,
)
from qpa.train.rl.loss import build_samples
from qpa.train.rl.trainer import trainable

TASK_TAG = "qpa-task: "
"""The system message that names a prompt's task (TRL gives `rollout_func` prompts only)."""

RewardName = Literal["verification", "care"]

#: The per-sample fields `QpaRollout` returns besides TRL's required ones (reward kwargs).
ROLLOUT_FIELDS = (
    "qpa_task_id",
    "qpa_trajectory_id",
    "qpa_success",
    "qpa_progress",
    "qpa_output_tokens",
    "qpa_tool_calls",
    "qpa_well_formed",
    "qpa_env_failure",
)


class QpaRolloutSettings(BaseModel):
    """How `QpaRollout` runs episodes (sampling settings come from the `GRPOConfig`).

    `max_new_tokens` bounds one model call (default: the config's `max_completion_length`);
    the packed completion of an episode holds up to `harness.max_turns` of them plus the
    feedback between. `workers` bounds concurrent episodes, `max_batch` the sequences of one
    `generate` call.
    """

    model_config = ConfigDict(extra="forbid")

    env: EnvSettings = Field(default_factory=EnvSettings)
    harness: HarnessConfig = Field(default_factory=lambda: HarnessConfig(max_turns=8))
    max_new_tokens: int | None = Field(default=None, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    stop_at_action: bool = True
    workers: int = Field(default=64, ge=1)
    max_batch: int = Field(default=64, ge=1)


# --------------------------------------------------------------------------- the data


def task_prompt(task: Task) -> list[dict[str, str]]:
    """TRL's conversational prompt for a task: the task-naming system message, the instruction."""
    return [
        {"role": "system", "content": f"{TASK_TAG}{task.id}"},
        {"role": "user", "content": task.instruction},
    ]


def task_id_of(prompt: Any) -> str:
    """The task id a prompt carries (`task_prompt`); ValueError naming what is wrong."""
    if isinstance(prompt, list):
        for message in prompt:
            content = message.get("content") if isinstance(message, Mapping) else None
            role = message.get("role") if isinstance(message, Mapping) else None
            if role == "system" and isinstance(content, str) and content.startswith(TASK_TAG):
                return content[len(TASK_TAG) :].strip()
    raise ValueError(
        f"prompt {str(prompt)[:120]!r}: no system message {TASK_TAG!r}<task id>; build the "
        "dataset with qpa.train.trl_grpo.task_dataset"
    )


def task_dataset(tasks: Sequence[Task]) -> Any:
    """The tasks as a `datasets.Dataset`: `prompt` (conversational), `task_id`, `domain`,
    `capabilities`, `difficulty`. Task ids must be unique."""
    from datasets import Dataset

    if not tasks:
        raise ValueError("tasks: empty (GRPO needs at least one task)")
    counts = Counter(t.id for t in tasks)
    repeated = [task_id for task_id, n in counts.items() if n > 1]
    if repeated:
        raise ValueError(f"tasks: task id {repeated[0]!r} appears {counts[repeated[0]]} times")
    return Dataset.from_list(
        [
            {
                "prompt": task_prompt(t),
                "task_id": t.id,
                "domain": t.domain,
                "capabilities": list(t.capabilities),
                "difficulty": t.difficulty,
            }
            for t in tasks
        ]
    )


# --------------------------------------------------------------------------- the rollout


@dataclass
class Packed:
    """An episode in TRL's layout: one prompt, one completion, its `env_mask`."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    unpacked_turns: int = 0
    """Turns left out: their prompt did not extend the packed sequence."""


@dataclass
class RolloutRecord:
    """One sample of the last rollout: its episode and how it was packed for TRL."""

    episode: Episode
    packed: Packed

    @property
    def trajectory(self) -> Trajectory:
        return self.episode.trajectory


def pack_turns(turns: Sequence[Turn], fallback_prompt: list[int], pad_id: int) -> Packed:
    """An episode's turns in TRL's layout (one prompt, one completion, `env_mask`).

    The sample is the first sequence `qpa.train.rl.build_samples` packs: the leading turns whose
    prompt extends the sequence so far; the turns after the first that does not are counted in
    `unpacked_turns`. An episode without a sampled token (a failed reset, an empty completion)
    gets `fallback_prompt` and one masked pad token, so TRL still has its row.
    """
    sampled = [t for t in turns if t.completion_ids]
    samples = build_samples(sampled, 0.0, pack=True)
    if not samples:
        return Packed(list(fallback_prompt), [pad_id], [0], 0)
    first = samples[0]
    packed_turns = 0
    sequence: list[int] = []
    for turn in sampled:
        extends = (
            len(turn.prompt_ids) >= len(sequence) and turn.prompt_ids[: len(sequence)] == sequence
        )
        if packed_turns and not extends:
            break
        sequence = [*turn.prompt_ids, *turn.completion_ids]
        packed_turns += 1
    if sequence != first.input_ids:  # pragma: no cover - the same rule as build_samples
        raise RuntimeError("pack_turns disagrees with build_samples on the packed sequence")
    return Packed(
        first.input_ids[: first.prompt_len],
        first.input_ids[first.prompt_len :],
        list(first.mask),
        len(sampled) - packed_turns,
    )


class QpaRollout:
    """TRL's `rollout_func`: each prompt becomes one Harness episode in a qpa environment.

    Call it as TRL does, `rollout(prompts, trainer)`; it returns `prompt_ids`,
    `completion_ids`, `logprobs` (None: the trainer computes them), `env_mask` and the
    `ROLLOUT_FIELDS` per sample. `records` holds the last call's samples, `trajectories` every
    trajectory so far (and `on_trajectory`, when given, is called with each one).
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        settings: QpaRolloutSettings | None = None,
        *,
        environment: Callable[[int], Environment] | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
        policy_name: str = "trl-grpo",
    ) -> None:
        self.tasks = {t.id: t for t in tasks}
        if len(self.tasks) != len(tasks):
            raise ValueError("tasks: task ids must be unique")
        self.settings = settings or QpaRolloutSettings()
        self._environment = environment
        self._on_trajectory = on_trajectory
        self.policy_name = policy_name
        self.records: list[RolloutRecord] = []
        self.trajectories: list[Trajectory] = []
        self.calls = 0
        self._episodes_started = 0
        self._token_lock = threading.Lock()
        self._skills: SkillLibrary | None = None

    # ------------------------------------------------------------------ helpers
    def _skill_library(self) -> SkillLibrary:
        if self._skills is None:
            self._skills = self.settings.harness.skill_library()
        return self._skills

    def make_env(self, index: int) -> Environment:
        """Episode `index`'s environment: the caller's factory, an env server, or in process."""
        if self._environment is not None:
            return self._environment(index)
        return self.settings.env.open(index)

    def _task(self, prompt: Any) -> Task:
        task_id = task_id_of(prompt)
        task = self.tasks.get(task_id)
        if task is None:
            raise ValueError(
                f"prompt names task {task_id!r}, which is not among the rollout's tasks"
            )
        return task

    def generation_settings(self, trainer: Any) -> GenerationSettings:
        """The rollout's sampling: the trainer's temperature / top_p / top_k (TRL computes its
        loss's log-probabilities at that temperature), the settings' token bounds."""
        args = trainer.args
        return GenerationSettings(
            max_new_tokens=self.settings.max_new_tokens or int(args.max_completion_length or 256),
            temperature=float(args.temperature),
            top_p=float(args.top_p if args.top_p is not None else 1.0),
            top_k=int(args.top_k or 0),
            max_prompt_tokens=self.settings.max_prompt_tokens,
            stop_at_action=self.settings.stop_at_action,
            workers=self.settings.workers,
            max_batch=self.settings.max_batch,
        )

    # ------------------------------------------------------------------ the hook
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        if getattr(trainer, "use_vllm", False):
            raise ConfigError(
                "GRPOConfig.use_vllm: the qpa rollout generates with the model in training; "
                "train with use_vllm=False (or use `qpa train rl` with generation.backend vllm)"
            )
        import torch
        from trl.models import unwrap_model_for_generation

        started = time.perf_counter()
        tasks = [self._task(p) for p in prompts]
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps one
        settings = self.generation_settings(trainer)
        seen: Counter[str] = Counter()
        jobs: list[tuple[Task, int]] = []
        for task in tasks:
            jobs.append((task, seen[task.id]))
            seen[task.id] += 1
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            episodes = self._run(model, tokenizer, jobs, settings)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        records: list[RolloutRecord] = []
        for prompt_index, episode in enumerate(episodes):
            fallback = self._fallback_prompt(tokenizer, tasks[prompt_index])
            records.append(RolloutRecord(episode, pack_turns(episode.turns, fallback, pad)))
            self.trajectories.append(episode.trajectory)
            if self._on_trajectory is not None:
                self._on_trajectory(episode.trajectory)
        self.records = records
        self.calls += 1
        unpacked = sum(r.packed.unpacked_turns for r in records)
        if hasattr(trainer, "_metrics"):
            mode = "train" if trainer.model.training else "eval"
            trainer._metrics[mode]["qpa/unpacked_turns"].append(float(unpacked))
            trainer._metrics[mode]["qpa/rollout_s"].append(time.perf_counter() - started)
            trainer._metrics[mode]["qpa/success"].append(
                sum(r.trajectory.success for r in records) / max(1, len(records))
            )
        out: dict[str, Any] = {
            "prompt_ids": [r.packed.prompt_ids for r in records],
            "completion_ids": [r.packed.completion_ids for r in records],
            "logprobs": None,
            "env_mask": [r.packed.env_mask for r in records],
        }
        outcomes = [Outcome.of(r.trajectory) for r in records]
        out["qpa_task_id"] = [r.trajectory.task.id for r in records]
        out["qpa_trajectory_id"] = [r.trajectory.id for r in records]
        out["qpa_success"] = [o.success for o in outcomes]
        out["qpa_progress"] = [o.progress for o in outcomes]
        out["qpa_output_tokens"] = [o.output_tokens for o in outcomes]
        out["qpa_tool_calls"] = [o.tool_calls for o in outcomes]
        out["qpa_well_formed"] = [o.well_formed for o in outcomes]
        out["qpa_env_failure"] = [not trainable(r.episode) for r in records]
        return out

    def _fallback_prompt(self, tokenizer: Any, task: Task) -> list[int]:
        with self._token_lock:
            ids = tokenizer(task.instruction, add_special_tokens=False)["input_ids"]
        return list(ids) or [tokenizer.pad_token_id or 0]

    def _run(
        self,
        model: Any,
        tokenizer: Any,
        jobs: Sequence[tuple[Task, int]],
        settings: GenerationSettings,
    ) -> list[Episode]:
        """The episodes of `jobs`, in order; generation batched across them (`TokenBatcher`)."""
        results: list[Episode | None] = [None] * len(jobs)
        queue = deque(enumerate(jobs))
        queue_lock = threading.Lock()
        errors: list[BaseException] = []

        def generate(prompts: list[list[int]]) -> list[list[int]]:
            return hf_generate(model, tokenizer, prompts, settings)

        batcher = TokenBatcher(generate, settings.max_batch)
        policy = Policy(
            planner="harness", model=self.policy_name, harness_version=self.settings.harness.version
        )
        base = self._episodes_started
        self._episodes_started += len(jobs)

        def work() -> None:
            try:
                while True:
                    with queue_lock:
                        if not queue:
                            return
                        index, (task, sample) = queue.popleft()
                    results[index] = self._episode(
                        model,
                        tokenizer,
                        task,
                        index,
                        sample,
                        base + index,
                        batcher,
                        policy,
                        settings,
                    )
            except BaseException as exc:  # a worker bug must not hang the batcher
                errors.append(exc)
            finally:
                batcher.leave()

        workers = min(len(jobs), settings.workers)
        batcher.enter(workers)
        threads = [
            threading.Thread(target=work, name=f"trl-rollout-{i}", daemon=True)
            for i in range(workers)
        ]
        was_training = model.training
        model.eval()
        try:
            for thread in threads:
                thread.start()
            batcher.serve()
        finally:
            for thread in threads:
                thread.join()
            model.train(was_training)
        if errors:
            raise errors[0]
        if batcher.failure is not None:
            raise GenerationFailed(
                f"the policy failed to generate: {type(batcher.failure).__name__}: "
                f"{batcher.failure}"
            ) from batcher.failure
        missing = [i for i, e in enumerate(results) if e is None]
        if missing:  # pragma: no cover - every job sets its result or raises
            raise RuntimeError(f"rollout: no episode for prompts {missing}")
        return [e for e in results if e is not None]

    def _episode(
        self,
        model: Any,
        tokenizer: Any,
        task: Task,
        index: int,
        sample: int,
        env_index: int,
        batcher: TokenBatcher,
        policy: Policy,
        settings: GenerationSettings,
    ) -> Episode:
        harness = self.settings.harness
        backend = PolicyBackend.from_loaded(
            model,
            tokenizer,
            name=self.policy_name,
            max_new_tokens=settings.max_new_tokens,
            stop_at_action=settings.stop_at_action,
        ).bind(
            batcher,
            order=(index, 0),
            max_prompt_tokens=settings.max_prompt_tokens,
            token_lock=self._token_lock,
        )
        planner = HarnessPlanner(backend, harness, skills=self._skill_library())
        env = self.make_env(env_index)
        try:
            trajectory = run_episode(
                env, task, planner, policy=policy, sample=sample, budgets=harness.budgets()
            )
        finally:
            with contextlib.suppress(Exception):
                env.close()
            with contextlib.suppress(Exception):
                planner.memory.close()
        return Episode(index, sample, trajectory, backend.turns)


# --------------------------------------------------------------------------- the rewards


def verification_reward(progress_weight: float = 0.0) -> Callable[..., list[float | None]]:
    """TRL reward function "qpa_verification": 1.0 for a verified success, else
    `progress_weight * progress`; None for an episode the environment's side ended."""
    if not 0.0 <= progress_weight < 1.0:
        raise ValueError(f"progress_weight: {progress_weight} (must be in [0, 1))")

    def qpa_verification(
        prompts: list[Any],
        completions: list[Any],
        qpa_success: list[bool],
        qpa_progress: list[float],
        qpa_env_failure: list[bool],
        **_: Any,
    ) -> list[float | None]:
        return [
            None if failed else (1.0 if ok else progress_weight * min(max(progress, 0.0), 1.0))
            for ok, progress, failed in zip(qpa_success, qpa_progress, qpa_env_failure, strict=True)
        ]

    return qpa_verification


@dataclass
class CareReward:
    """TRL reward function "qpa_care": CARE per group of `num_generations` samples.

    Enabled CARE returns each member's tier reward divided by the group's CARE scale (see the
    module doc: with `scale_rewards="none"` TRL's advantages are then CARE's). Disabled, it
    returns the fixed baseline tier's reward and TRL standardises it as `care.scale_rewards`
    says. Groups are formed over every process's samples (TRL's groups can span processes),
    in TRL's order: `num_generations` consecutive samples of one task. `last_groups` holds the
    last call's `GroupResult`s.
    """

    care: CareSettings
    num_generations: int

    def __post_init__(self) -> None:
        self.__name__ = "qpa_care"  # TRL names the reward (metrics, logs) by `__name__`
        if self.num_generations < 2:
            raise ValueError(f"num_generations: {self.num_generations} (CARE needs groups >= 2)")
        self.last_groups: list[GroupResult] = []

    def required_scale_rewards(self) -> str:
        """The `GRPOConfig.scale_rewards` this reward needs."""
        return "none" if self.care.enabled else self.care.scale_rewards

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        qpa_task_id: list[str],
        qpa_success: list[bool],
        qpa_progress: list[float],
        qpa_output_tokens: list[int],
        qpa_tool_calls: list[int],
        qpa_env_failure: list[bool],
        qpa_well_formed: list[float] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        from accelerate import PartialState
        from accelerate.utils import gather_object

        well_formed = qpa_well_formed if qpa_well_formed is not None else [1.0] * len(qpa_task_id)
        local = [
            (task_id, None if failed else Outcome(bool(ok), float(p), int(n), int(c), float(f)))
            for task_id, ok, p, n, c, f, failed in zip(
                qpa_task_id,
                qpa_success,
                qpa_progress,
                qpa_output_tokens,
                qpa_tool_calls,
                well_formed,
                qpa_env_failure,
                strict=True,
            )
        ]
        state = PartialState()
        everything = gather_object(local) if state.num_processes > 1 else local
        values = self.group_values(everything)
        start = state.process_index * len(local) if state.num_processes > 1 else 0
        if log_metric is not None and self.last_groups:
            tiers = Counter(g.tier for g in self.last_groups)
            for tier, n in tiers.items():
                log_metric(f"care/tier/{tier}", n / len(self.last_groups))
            rewards = [r for g in self.last_groups for r in g.rewards]
            log_metric("care/reward", sum(rewards) / len(rewards))
            log_metric(
                "care/anchored", sum(g.anchored for g in self.last_groups) / len(self.last_groups)
            )
        return values[start : start + len(local)]

    def group_values(self, samples: Sequence[tuple[str, Outcome | None]]) -> list[float | None]:
        """The value TRL gets for each sample (None for environment failures), group by group."""
        k = self.num_generations
        if len(samples) % k:
            raise ValueError(f"{len(samples)} samples are not whole groups of num_generations={k}")
        out: list[float | None] = [None] * len(samples)
        self.last_groups = []
        for start in range(0, len(samples), k):
            block = samples[start : start + k]
            ids = {task_id for task_id, _ in block}
            if len(ids) != 1:
                raise ValueError(
                    f"samples {start}..{start + k - 1} hold tasks {sorted(ids)}: a group must be "
                    f"num_generations={k} samples of one task (TRL's RepeatSampler order)"
                )
            members = [(i, o) for i, (_, o) in enumerate(block) if o is not None]
            if not members:
                continue
            outcomes = [o for _, o in members]
            if self.care.enabled:
                result = care_group(outcomes, self.care)
                scaled = [r / result.scale for r in result.rewards]
            else:
                result = vanilla_group(outcomes, self.care, tier=self.care.vanilla_reward)
                scaled = list(result.rewards)
            self.last_groups.append(result)
            for (i, _), value in zip(members, scaled, strict=True):
                out[start + i] = value
        return out


# --------------------------------------------------------------------------- the trainer


def build_grpo_trainer(
    model: Any,
    tasks: Sequence[Task],
    args: Any,
    *,
    settings: QpaRolloutSettings | None = None,
    reward: RewardName = "care",
    care: CareSettings | None = None,
    progress_weight: float = 0.0,
    processing_class: Any = None,
    environment: Callable[[int], Environment] | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    **trainer_kwargs: Any,
) -> tuple[Any, QpaRollout]:
    """A `trl.GRPOTrainer` on qpa's tasks, rollout and reward, and the rollout (its records).

    `model` is a checkpoint folder or a loaded causal LM (as TRL takes it); `args` a
    `GRPOConfig`. The tokenizer is the model folder's unless `processing_class` is given (left
    padding, pad = eos when it has none). `reward="care"` (with `care`, default CARE on)
    needs `args.scale_rewards` to match (`"none"` for CARE on); `reward="verification"` takes
    any. Other keyword arguments go to `GRPOTrainer` (callbacks, peft_config, ...); passing
    `reward_funcs` or `rollout_func` there is refused.
    """
    from pathlib import Path

    from trl import GRPOTrainer

    for key in ("reward_funcs", "rollout_func", "train_dataset", "environment_factory"):
        if key in trainer_kwargs:
            raise ValueError(f"{key}: set by build_grpo_trainer (tasks, reward), not passed")
    if args.use_vllm:
        raise ConfigError(
            "GRPOConfig.use_vllm: the qpa rollout generates with the model in training; "
            "set use_vllm=False"
        )
    if args.num_generations is None or args.num_generations < 2:
        raise ConfigError(f"GRPOConfig.num_generations: {args.num_generations} (needs >= 2)")
    reward_func: Callable[..., list[float | None]]
    if reward == "care":
        care_reward = CareReward(care or CareSettings(), int(args.num_generations))
        needed = care_reward.required_scale_rewards()
        if args.scale_rewards != needed:
            state = "on" if care_reward.care.enabled else "off"
            raise ConfigError(
                f"GRPOConfig.scale_rewards: {args.scale_rewards!r}; reward 'care' with CARE "
                f"{state} needs {needed!r} (see qpa.train.trl_grpo)"
            )
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise ConfigError(
                "GRPOConfig.multi_objective_aggregation: reward 'care' needs 'sum_then_normalize'"
            )
        reward_func = care_reward
    elif reward == "verification":
        reward_func = verification_reward(progress_weight)
    else:
        raise ValueError(f"reward: {reward!r} (choose 'verification' or 'care')")
    if processing_class is None:
        from transformers import AutoTokenizer

        source = model if isinstance(model, str | Path) else model.name_or_path
        processing_class = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    if processing_class.pad_token_id is None:
        processing_class.pad_token = processing_class.eos_token
    processing_class.padding_side = "left"
    rollout = QpaRollout(tasks, settings, environment=environment, on_trajectory=on_trajectory)
    trainer = GRPOTrainer(
        model=str(model) if isinstance(model, Path) else model,
        reward_funcs=[reward_func],
        args=args,
        train_dataset=task_dataset(tasks),
        processing_class=processing_class,
        rollout_func=rollout,
        **trainer_kwargs,
    )
    return trainer, rollout


__all__ = [
    "ROLLOUT_FIELDS",
    "TASK_TAG",
    "CareReward",
    "Packed",
    "QpaRollout",
    "QpaRolloutSettings",
    "RolloutRecord",
    "build_grpo_trainer",
    "pack_turns",
    "task_dataset",
    "task_id_of",
    "verification_reward",
]
