"""Online multi-turn agentic RL with CARE (`qpa train rl --config rl.yaml [--care on|off]`).

The package by job: `config` (RLConfig and its settings), `tasks` (the task pool), `generation`
(rollouts and batched generation), `loss` (samples from episodes, the GRPO loss) and `trainer`
(RLTrainer, run_rl). This module re-exports what callers import (`CareSettings` and
`TaskSource` are the `qpa.api` models, the same ones the TrainingRun CRD uses).

One step of the loop:

1. **Sample tasks.** `tasks_per_step` tasks from the pool (`tasks`: the `qpa.api` TaskSource,
   a suite split, a tasks JSONL or a dataset's tasks, selected by `qpa.data.tasks.select_tasks`),
   seeded by `(seed, step)`, so a resumed run sees the same sequence.
   With several DeepSpeed ranks, each rank takes its share of the step's tasks (whole groups).
2. **Roll out.** `samples_per_task` (k) episodes per task, each `run_episode(env, task,
   HarnessPlanner(backend))` on a `SandboxEnv` or a `RemoteEnv` (`--env-url`, round-robin over
   servers). The backend is `LocalBackend` wrapped around the in-memory policy
   (`LocalBackend.from_loaded`): the Harness renders exactly the prompt a served model would
   see (Scenario Adapter, Skills, memory, text protocol, ChatML). Episodes run in threads; every
   model call of every live episode is collected and answered by **one batched `generate`** in
   the main thread (when all live episodes wait on the model), so the k x tasks episodes of a
   step need about as many `generate` calls as one episode has turns. For each assistant turn
   the prompt token ids (as tokenized for generation) and the sampled token ids are recorded.
   On a GPU, generation may go to a vLLM server instead (`generation.backend: vllm`, TRL's
   `VLLMClient`, weights pushed after every optimizer step): configuration only, never reached
   by CPU tests.
3. **Score.** Episodes are grouped by task; CARE (`qpa.train.care.care_group`) picks each
   group's tier and computes rewards and success-anchored advantages; with `--care off`, one
   fixed reward (outcome by default) and vanilla GRPO standardisation. Each trajectory's
   advantage applies to every token it generated.
4. **Update.** Turns become training sequences: a turn's prompt followed by its completion. When
   the next turn's prompt extends the previous sequence token for token (the usual ChatML case),
   the turns are packed into one sequence and what lies between two completions (the
   environment's feedback, the chat template's tokens) gets loss mask 0. Whatever the layout,
   only tokens the policy sampled carry loss: prompt, tool responses and feedback have mask 0,
   so they get no gradient. The loss is GRPO's clipped surrogate
   ``-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)`` with ``rho = exp(logp - logp_old)``,
   optionally ``+ beta * KL_k3(pi || pi_ref)`` against the frozen starting model, averaged over
   all trained tokens of the step (`token_mean`, DAPO-style) or per sequence then over
   sequences (`sequence_mean`). Old log-probabilities are the rollout policy's, recomputed
   under the training graph (with one PPO epoch the ratio is exactly 1 and the clip inactive,
   as in TRL). Micro-batches accumulate into one optimizer step; samples with zero advantage
   are skipped when `beta == 0` (they contribute exactly zero gradient) but still count in the
   normaliser. Optimizer: AdamW, or a DeepSpeed engine (ZeRO-2/3, gloo on CPU) with
   `managed_gradient_accumulation: false`, so a step may hold any number of micro-batches.
   With several ranks a step is one update on the global batch, as one process holding all of
   it would make: every rank runs as many forward/backward passes as the busiest rank (padding
   with zero-weight micro-batches, else ZeRO-3's gathers and ZeRO-2's reductions hang), all
   divide by the global batch's token count, and gradients are averaged over ranks (by
   DeepSpeed, or by an all-reduce without it); `tests/integration/test_multirank.py` checks it.
5. **Record.** Metrics (loss, reward, success rate, CARE tier mix, output tokens, tool calls,
   turns, timings) go to `qpa.train.metrics.TrainMetrics` (JSONL + Prometheus). Every
   `checkpoint.every_steps` steps `<output_dir>/checkpoint-<step>/` is written (`model/`: weights
   + tokenizer as a Hugging Face folder; optimizer or DeepSpeed state; `rl_state.json`; RNG),
   hashed and uploaded to the store (`qpa.train.checkpoint`); `--resume` continues from the
   newest complete one, local or in the store, up to the same final step count. At the end,
   `<output_dir>/final/` (and `<prefix>/final` in the store) holds the trained model.

Why a lean loop instead of TRL's `GRPOTrainer` hooks: the Harness, not the trainer, owns the
conversation. TRL's `rollout_func` must return one prompt and one completion per sample with an
`env_mask`, which forces every multi-turn episode into a single growing token sequence; the
Harness's prompts are not always prefix-extensions of each other (sub-agents get their own
conversation, text-protocol tool results are merged, generated tokens are re-tokenized in the
next prompt), so that layout would train on tokens the model never saw, or drop turns. CARE needs
whole trajectories per group (verifier progress, tokens, tool calls) and replaces the advantage
computed inside TRL's private `_generate_and_score_completions`, a method that changes between
releases. And a k x tasks group of multi-turn episodes needs dynamic batching across episodes
that TRL's rollout hook does not provide. What TRL does well is kept: its vLLM client drives GPU
generation and weight sync, and the loss is TRL's GRPO objective (the same clipped surrogate, k3
KL estimator and `dapo` token-level normalisation), so `--care off` is vanilla GRPO as TRL
computes it. The loop has no hidden state machine; `benchmarks/rl_step.py` times a
step of it against plain `GRPOTrainer` on the same model and prompts.
"""

from qpa.api.v1alpha1 import CareSettings, TaskSource
from qpa.train.rl.config import (
    EnvSettings,
    GenerationSettings,
    LossSettings,
    OptimSettings,
    RLConfig,
)
from qpa.train.rl.generation import (
    Episode,
    GenerationFailed,
    PolicyBackend,
    PromptTooLong,
    TokenBatcher,
    Turn,
    hf_generate,
    stop_token_ids,
    trim_completion,
)
from qpa.train.rl.loss import (
    Batch,
    Sample,
    build_samples,
    collate,
    loss_normalizer,
    policy_loss,
    token_logprobs,
)
from qpa.train.rl.tasks import load_tasks, sample_tasks
from qpa.train.rl.trainer import RLTrainer, RunResult, StepResult, run_rl, trainable

__all__ = [
    "Batch",
    "CareSettings",
    "EnvSettings",
    "Episode",
    "GenerationFailed",
    "GenerationSettings",
    "LossSettings",
    "OptimSettings",
    "PolicyBackend",
    "PromptTooLong",
    "RLConfig",
    "RLTrainer",
    "RunResult",
    "Sample",
    "StepResult",
    "TaskSource",
    "TokenBatcher",
    "Turn",
    "build_samples",
    "collate",
    "hf_generate",
    "load_tasks",
    "loss_normalizer",
    "policy_loss",
    "run_rl",
    "sample_tasks",
    "stop_token_ids",
    "token_logprobs",
    "trainable",
    "trim_completion",
]
