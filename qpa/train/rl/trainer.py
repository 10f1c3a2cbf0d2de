"""The RL trainer: roll out, score with CARE, update, checkpoint; `run_rl`.

A step draws its tasks (`qpa.train.rl.tasks`: uniform, or learnability-weighted from every
rank's recent outcomes), rolls out k episodes per task, scores each group, and updates on the
groups. Under `sampling.strategy: learnability` a group whose advantages are all zero (every
reward equal: all k succeeded or all failed with the same CARE reward) is dropped and replaced
by a freshly drawn task, for up to `sampling.refill_rounds` rounds, so the step's update is
spent on groups that carry signal; an all-failure group whose progress differs keeps CARE's
progress-shaping signal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from qpa import progress
from qpa.contract import Environment, Policy, Task
from qpa.harness.agent import HarnessPlanner
from qpa.harness.parsing import STOP_STRINGS
from qpa.harness.runner import run_episode
from qpa.harness.skills import SkillLibrary
from qpa.train.care import CARE_TIERS, GroupResult, care_group, vanilla_group
from qpa.train.config import (
    ConfigError,
)
from qpa.train.rl.config import RLConfig
from qpa.train.rl.generation import (
    Episode,
    GenerationFailed,
    PolicyBackend,
    Sampled,
    TokenBatcher,
    hf_generate,
)
from qpa.train.rl.loss import (
    Sample,
    build_samples,
    collate,
    loss_normalizer,
    policy_loss,
    token_logprobs,
)
from qpa.train.rl.tasks import LearnabilitySampler, load_tasks, sample_tasks

Auto = Literal["auto"]
STATE_FILE = "rl_state.json"


@dataclass
class StepResult:
    """What one RL step did (also the metrics it logged)."""

    step: int
    metrics: dict[str, float]
    tiers: dict[str, int]
    episodes: list[Episode]
    groups: list[GroupResult]


@dataclass
class RunResult:
    """What `run_rl` did: the last step, where it resumed from, the last checkpoint, the final
    model (folder and store URI), each step's metrics and the checkpoints uploaded."""

    final_step: int
    resumed_from: int
    checkpoint: Path | None
    final_dir: Path | None
    final_uri: str | None
    history: list[dict[str, float]]
    checkpoint_uris: list[str] = field(default_factory=list)


def _fill_auto(config: Any, values: Mapping[str, Any]) -> Any:
    """Replace the `"auto"` values of a DeepSpeed config (the HF integration's job) by key."""
    if isinstance(config, dict):
        out = {}
        for key, value in config.items():
            if value == "auto" and key in values:
                out[key] = values[key]
            else:
                out[key] = _fill_auto(value, values)
        return out
    return config


def _signal(result: GroupResult) -> bool:
    """A group teaches something when one of its advantages is not zero: its rewards differ
    (success against failure, or CARE's progress or efficiency terms). An all-failure group
    with different progress keeps its progress-shaping signal; one whose rewards are all equal
    is dropped (and refilled) under learnability sampling."""
    return any(abs(value) > 1e-12 for value in result.advantages)


class RLTrainer:
    """The online RL loop of one run (see the module doc). `train()` runs to `config.steps`."""

    def __init__(
        self,
        config: RLConfig,
        *,
        tasks: Sequence[Task] | None = None,
        environment: Callable[[int], Environment] | None = None,
    ) -> None:
        self.config = config
        self.run_dir = config.run_dir
        self.pool = list(tasks) if tasks is not None else load_tasks(config.tasks)
        self._environment = environment
        self.sampler = (
            LearnabilitySampler(self.pool, config.sampling, config.seed)
            if config.sampling.strategy == "learnability"
            else None
        )
        self.step = 0
        self.resumed_from = 0
        self.last_checkpoint: Path | None = None
        self.final_uri: str | None = None
        self.checkpoint_uris: list[str] = []  # store URIs of the checkpoints this run wrote
        self.checkpoints: Any = None
        self.history: list[dict[str, float]] = []
        self._token_lock = threading.Lock()
        self._skills: SkillLibrary | None = None
        self._vllm: Any = None
        self.engine: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.ref_model: Any = None
        self._setup()

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from qpa.store import ResolveError
        from qpa.train.checkpoint import CheckpointStore
        from qpa.train.metrics import TrainMetrics
        from qpa.train.placement import choose_device, choose_dtype, resolve_model_source

        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device: Any = choose_device(cfg.device)
        self.cuda = self.device.type == "cuda"
        self.bf16 = (
            bool(self.cuda and torch.cuda.is_bf16_supported()) if cfg.bf16 == "auto" else cfg.bf16
        )
        torch.manual_seed(cfg.seed)
        cache = self.run_dir / "cache"
        try:
            model_dir = resolve_model_source(cfg.model, field="model", cache_dir=cache)
            tokenizer_dir = (
                resolve_model_source(cfg.tokenizer, field="tokenizer", cache_dir=cache)
                if cfg.tokenizer
                else None
            )
        except ResolveError as exc:
            raise ConfigError(str(exc)) from None
        self.checkpoints = (
            CheckpointStore.open(cfg.checkpoint.store, cfg.store_prefix)
            if cfg.checkpoint.store
            else None
        )
        resume_dir = self._find_resume()
        weights_dir = (resume_dir / "model") if resume_dir is not None else model_dir
        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_dir or weights_dir, local_files_only=True
        )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # bf16 weights only where the optimizer keeps fp32 masters (qpa.train.placement)
        dtype = choose_dtype(
            cfg.model_dtype, self.device, fp32_master=cfg.deepspeed.enabled and self.bf16
        )
        hidden = getattr(AutoConfig.from_pretrained(weights_dir), "hidden_size", None)
        if cfg.deepspeed.enabled:
            self.ds_config = self._deepspeed_config(hidden or 1024)
            if cfg.deepspeed.zero_stage == 3:
                # Weights are loaded straight into ZeRO-3 partitions (zero.Init), never whole
                # on every rank; the object must stay alive while models are loaded.
                from transformers.integrations import HfDeepSpeedConfig

                self._hf_deepspeed: Any = HfDeepSpeedConfig(self.ds_config)
        model: Any = AutoModelForCausalLM.from_pretrained(
            weights_dir, local_files_only=True, dtype=dtype
        )
        checkpointing = (
            (hidden is not None and hidden >= 1024)
            if cfg.gradient_checkpointing == "auto"
            else bool(cfg.gradient_checkpointing)
        )
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.config.use_cache = not checkpointing
        if cfg.loss.beta > 0:
            self.ref_model = self._reference_model(
                model_dir, choose_dtype(cfg.model_dtype, self.device)
            )
        if cfg.deepspeed.enabled:
            self._setup_deepspeed(model)
            # zero.Init was for loading only: later `from_pretrained` calls in this process
            # (evaluation, tests) must get whole models again.
            self._hf_deepspeed = None
        else:
            if (
                int(os.environ.get("WORLD_SIZE", "1")) > 1
                and not torch.distributed.is_initialized()
            ):
                # several ranks without DeepSpeed: `_optimizer_step` averages their gradients
                torch.distributed.init_process_group(backend="nccl" if self.cuda else "gloo")
            self.model = model.to(self.device)
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad],
                lr=cfg.optim.learning_rate,
                betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2),
                eps=cfg.optim.adam_epsilon,
                weight_decay=cfg.optim.weight_decay,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.metrics = TrainMetrics(
            cfg.name,
            "rl",
            jsonl=cfg.metrics_path,
            textfile=cfg.metrics.textfile,
            enabled=self.rank == 0,
        )
        if cfg.metrics.prometheus_port and self.rank == 0:
            TrainMetrics.serve(cfg.metrics.prometheus_port)
        if resume_dir is not None:
            self._load_state(resume_dir)
        if cfg.generation.backend == "vllm":
            self._setup_vllm()

    def _lr_lambda(self, step: int) -> float:
        warmup = self.config.optim.warmup_steps
        return min(1.0, (step + 1) / warmup) if warmup else 1.0

    def _deepspeed_config(self, hidden: int) -> dict[str, Any]:
        """The DeepSpeed JSON of `qpa.train.deepspeed` with its `"auto"` values filled in (the
        Hugging Face integration's job in SFT) and caller-owned gradient accumulation."""
        import deepspeed
        import torch

        from qpa.train.deepspeed import (
            deepspeed_config,
            ensure_single_process_env,
            skip_cpu_shm_op,
        )

        cfg = self.config
        ensure_single_process_env()
        if not self.cuda:
            skip_cpu_shm_op()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        values = {
            "train_micro_batch_size_per_gpu": 1,
            "train_batch_size": world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.optim.max_grad_norm,
            "enabled": self.bf16,
            "lr": cfg.optim.learning_rate,
            "betas": [cfg.optim.adam_beta1, cfg.optim.adam_beta2],
            "eps": cfg.optim.adam_epsilon,
            "weight_decay": cfg.optim.weight_decay,
            "reduce_bucket_size": hidden * hidden,
            "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "stage3_param_persistence_threshold": 10 * hidden,
        }
        ds_config: dict[str, Any] = _fill_auto(
            deepspeed_config(cfg.deepspeed, cuda=self.cuda), values
        )
        # A step holds as many micro-batches as its rollouts need: the caller owns the boundary.
        ds_config["managed_gradient_accumulation"] = False
        ds_config["gradient_accumulation_steps"] = 1
        return ds_config

    def _setup_deepspeed(self, model: Any) -> None:
        import deepspeed
        import torch

        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=self.ds_config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, self._lr_lambda),
        )
        self.engine, self.optimizer, self.scheduler = engine, optimizer, scheduler
        self.model = engine.module
        self.device = engine.device

    def _reference_model(self, model_dir: Path, dtype: Any) -> Any:
        """The frozen starting policy for the KL term: a plain module, or under ZeRO-3 a
        DeepSpeed inference engine over the same partitioning (as TRL prepares it)."""
        from transformers import AutoModelForCausalLM

        ref: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=dtype
        )
        ref.eval().requires_grad_(False)
        if self.config.deepspeed.enabled and self.config.deepspeed.zero_stage == 3:
            import deepspeed

            config: dict[str, Any] = {
                key: self.ds_config[key]
                for key in ("train_micro_batch_size_per_gpu", "train_batch_size", "bf16", "fp16")
                if key in self.ds_config
            }
            config["zero_optimization"] = {
                k: v
                for k, v in self.ds_config["zero_optimization"].items()
                if not k.startswith("offload_optimizer")
            }
            engine, *_ = deepspeed.initialize(model=ref, config=config)
            engine.eval()
            return engine
        return ref.to(self.device)

    def _setup_vllm(self) -> None:
        """Every rank generates through the rollout server (`qpa.train.rl.vllm`); the main
        process alone joins its weight-sync group (as TRL), then the starting (or resumed)
        weights are pushed."""
        from qpa.train.rl.vllm import RolloutClient

        settings = self.config.generation
        assert settings.vllm_url is not None  # GenerationSettings refuses vllm without a URL
        self._vllm = RolloutClient(
            settings.vllm_url,
            group_port=settings.vllm_group_port,
            timeout_s=settings.vllm_timeout_s,
        )
        self._vllm.wait_ready()
        if self.rank == 0:
            self._vllm.open_communicator(self.device)
        self._push_weights()

    # ------------------------------------------------------------------ helpers
    @property
    def zero3(self) -> bool:
        return self.engine is not None and self.config.deepspeed.zero_stage == 3

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[None]:
        """All weights materialised (ZeRO-3 partitions them); a no-op otherwise."""
        if self.zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
                yield
        else:
            yield

    def _push_weights(self) -> None:
        """The policy's weights to the rollout server, sent by the main process only; the other
        ranks wait until it is done, so no rank samples from stale weights. Under ZeRO-3 every
        rank takes part in gathering one parameter at a time (never the whole model at once:
        a large model's full weights need not fit next to its partitions)."""
        if self._vllm is None:
            return
        if not self.zero3:
            if self.rank == 0:
                self._vllm.push_weights(self.model.named_parameters())
            self._barrier()
            return
        import deepspeed

        from qpa.train.rl.vllm import ParamMeta

        named = list(self.model.named_parameters())

        def gathered() -> Iterator[tuple[str, Any]]:
            for name, param in named:
                with deepspeed.zero.GatheredParameters([param]):
                    # a copy: the gathered storage is released when the context exits
                    yield name, param.data.detach().clone()

        if self.rank == 0:
            metas = [ParamMeta.of(name, param, shape=param.ds_shape) for name, param in named]
            self._vllm.push_weights(gathered(), metas=metas)
        else:
            for _ in gathered():
                pass
        self._barrier()

    def _skill_library(self) -> SkillLibrary:
        if self._skills is None:
            self._skills = self.config.harness.skill_library()
        return self._skills

    def _make_env(self, index: int) -> Environment:
        if self._environment is not None:
            return self._environment(index)
        return self.config.env.open(index)

    def _generate(self, prompts: list[list[int]]) -> Sequence[list[int] | Sampled]:
        settings = self.config.generation
        if self._vllm is not None:  # the server's samples, with its per-token log-probs
            return self._vllm.generate(
                prompts,
                max_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                stop=list(STOP_STRINGS) if settings.stop_at_action else None,
            )
        return hf_generate(self.model, self.tokenizer, prompts, settings)

    # ------------------------------------------------------------------ rollouts
    def rollout(self, tasks: Sequence[Task], *, step: int = 0, round_: int = 0) -> list[Episode]:
        """k episodes per task through the Harness, generation batched across episodes
        (`round_`: the step's refill round, which seeds its sampling apart)."""
        import torch

        cfg = self.config
        k = cfg.samples_per_task
        jobs = [(g, s) for g in range(len(tasks)) for s in range(k)]
        results: list[Episode | None] = [None] * len(jobs)
        queue = deque(enumerate(jobs))
        queue_lock = threading.Lock()
        errors: list[BaseException] = []
        batcher = TokenBatcher(self._generate, cfg.generation.max_batch)
        policy = Policy(planner="harness", model=cfg.name, harness_version=cfg.harness.version)

        def work() -> None:
            try:
                while True:
                    with queue_lock:
                        if not queue:
                            return
                        index, (group, sample) = queue.popleft()
                    results[index] = self._episode(
                        tasks[group], group, sample, index, batcher, policy
                    )
            except BaseException as exc:  # a worker bug must not hang the batcher
                errors.append(exc)
            finally:
                batcher.leave()

        workers = min(len(jobs), cfg.generation.workers)
        batcher.enter(workers)
        threads = [
            threading.Thread(target=work, name=f"rollout-{i}", daemon=True) for i in range(workers)
        ]
        key = (cfg.seed, step, self.rank) if round_ == 0 else (cfg.seed, step, self.rank, round_)
        torch.manual_seed(hash(key) & 0x7FFFFFFF)
        was_training = self.model.training
        self.model.eval()
        # A rollout server samples: the local (ZeRO-3 partitioned) weights need no gathering.
        gathered = self.full_parameters() if self._vllm is None else contextlib.nullcontext()
        try:
            with gathered:
                for thread in threads:
                    thread.start()
                batcher.serve()
        finally:
            for thread in threads:
                thread.join()
            self.model.train(was_training)
        if errors:
            raise errors[0]
        if batcher.failure is not None:
            raise GenerationFailed(
                f"the policy failed to generate: {type(batcher.failure).__name__}: "
                f"{batcher.failure}"
            ) from batcher.failure
        self._batcher_stats = (batcher.calls, batcher.sequences)
        return [e for e in results if e is not None]

    def _episode(
        self,
        task: Task,
        group: int,
        sample: int,
        index: int,
        batcher: TokenBatcher,
        policy: Policy,
    ) -> Episode:
        cfg = self.config
        backend = PolicyBackend.from_loaded(
            self.model,
            self.tokenizer,
            name=cfg.name,
            max_new_tokens=cfg.generation.max_new_tokens,
            stop_at_action=cfg.generation.stop_at_action,
        ).bind(
            batcher,
            order=(group, sample),
            max_prompt_tokens=cfg.generation.max_prompt_tokens,
            token_lock=self._token_lock,
        )
        planner = HarnessPlanner(backend, cfg.harness, skills=self._skill_library())
        env = self._make_env(index)
        try:
            trajectory = run_episode(
                env, task, planner, policy=policy, sample=sample, budgets=cfg.harness.budgets()
            )
        finally:
            with contextlib.suppress(Exception):
                env.close()
            with contextlib.suppress(Exception):
                planner.memory.close()
        return Episode(group, sample, trajectory, backend.turns)

    # ------------------------------------------------------------------ scoring
    def score(self, episodes: Sequence[Episode]) -> dict[int, tuple[list[Episode], GroupResult]]:
        """CARE (or vanilla GRPO) per group of episodes of the same task.

        Episodes ended by the environment's side (a dead env server, a failed reset) are left
        out: they say nothing about the policy. Returns group index -> (members in sample
        order, result with rewards/advantages in that order).
        """
        care = self.config.care
        by_group: dict[int, list[Episode]] = {}
        for episode in episodes:
            if trainable(episode):
                by_group.setdefault(episode.group, []).append(episode)
        results: dict[int, tuple[list[Episode], GroupResult]] = {}
        for g, members in sorted(by_group.items()):
            members.sort(key=lambda e: e.sample)
            trajectories = [e.trajectory for e in members]
            if care.enabled:
                result = care_group(trajectories, care)
            else:
                result = vanilla_group(trajectories, care, tier=care.vanilla_reward)
            results[g] = (members, result)
        return results

    # ------------------------------------------------------------------ the update
    def update(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on this rank's `samples` (micro-batched; see the module doc).

        Across ranks the step is one update on the global batch: every rank runs the same
        number of forward/backward passes (the most any rank needs; a rank with fewer pads with
        zero-weight micro-batches, since ZeRO-3 gathers parameters on every forward and ZeRO-2
        reduces gradients on every backward, so unequal counts would hang), and every rank
        divides by one normaliser, the global batch's trained-token (or sample) count. Each
        rank's loss is scaled by the world size because gradients are averaged over ranks
        (DeepSpeed's reduction, or `_optimizer_step`'s all-reduce): the gradient is then that
        of a single process holding the whole batch.
        """
        import torch

        cfg = self.config
        loss_cfg = cfg.loss
        temperature = cfg.generation.temperature
        pad = self.tokenizer.pad_token_id
        active = [
            s
            for s in samples
            if s.trained_tokens
            and not (loss_cfg.skip_zero_advantage and loss_cfg.beta == 0 and s.advantage == 0.0)
        ]
        active.sort(key=lambda s: len(s.input_ids))
        chunks = [
            active[i : i + loss_cfg.micro_batch_size]
            for i in range(0, len(active), loss_cfg.micro_batch_size)
        ]
        local_tokens = sum(s.trained_tokens for s in samples)
        total_tokens, total_samples, passes = self._global_counts(
            local_tokens, len(samples), len(chunks)
        )
        budget = cfg.tasks_per_step * self.world_size * cfg.samples_per_task
        global_norm = loss_normalizer(
            loss_cfg,
            tokens=total_tokens,
            samples=total_samples,
            completion_budget=budget * cfg.generation.max_new_tokens * cfg.harness.max_turns,
        )
        normalizer = global_norm / self.world_size
        padding = passes - len(chunks)
        if padding:
            filler = self._filler(samples)
            chunks += [[filler] for _ in range(padding)]
        batches = [collate(chunk, pad, self.device) for chunk in chunks]
        old: list[Any] = [None] * len(batches)
        ref: list[Any] = [None] * len(batches)
        if batches and (loss_cfg.ppo_epochs > 1 or loss_cfg.beta > 0):
            with torch.no_grad():
                for i, batch in enumerate(batches):
                    if loss_cfg.ppo_epochs > 1:
                        old[i] = token_logprobs(self._forward_model, batch, temperature)
                    if self.ref_model is not None:
                        ref[i] = token_logprobs(self.ref_model, batch, temperature)
        self.model.train()
        # loss, clip-fraction and KL sums weighted by trained tokens, and those tokens; then
        # the truncated importance weights' mean and truncated share over the tokens that had
        # sampler log-probs (a rollout server), and those tokens
        sums = [0.0] * 7
        grad_norm = 0.0
        for _ in range(loss_cfg.ppo_epochs if batches else 0):
            for i, batch in enumerate(batches):
                with self._autocast():
                    logps = token_logprobs(self._forward_model, batch, temperature)
                old_logps = old[i] if old[i] is not None else logps.detach()
                loss, stats = policy_loss(
                    logps, old_logps, batch, loss_cfg, normalizer=normalizer, ref_logps=ref[i]
                )
                if self.engine is not None:
                    self.engine.backward(loss, scale_wrt_gas=False)
                else:
                    loss.backward()
                share = stats["tokens"]
                sums[0] += float(loss.detach()) / loss_cfg.ppo_epochs
                sums[1] += stats["clip_fraction"] * share
                sums[2] += stats["kl"] * share
                sums[3] += share
                if "is_weight" in stats:
                    sums[4] += stats["is_weight"] * share
                    sums[5] += stats["is_truncated"] * share
                    sums[6] += share
            grad_norm = self._optimizer_step()
        loss_sum, clipped, kl, weighted, is_weight, is_truncated, sampled = self._all_reduce_sum(
            sums
        )
        sampler_metrics = (
            {"is_weight": is_weight / sampled, "is_truncated": is_truncated / sampled}
            if sampled
            else {}
        )
        return {
            "loss": loss_sum / self.world_size,
            "clip_fraction": clipped / weighted if weighted else 0.0,
            "kl": kl / weighted if weighted else 0.0,
            "grad_norm": grad_norm,
            "learning_rate": self._learning_rate(),
            "train_tokens": float(total_tokens),
            "micro_batches": float(passes),
            "padded_micro_batches": float(padding),
            **sampler_metrics,
        }

    def _filler(self, samples: Sequence[Sample]) -> Sample:
        """A zero-weight micro-batch: a real sequence (this rank's first, else two pad tokens)
        with no trained token, so its forward and backward run and its gradient is exactly 0."""
        if samples:
            first = samples[0]
            return Sample(list(first.input_ids), first.prompt_len, [0] * len(first.mask), 0.0)
        pad = self.tokenizer.pad_token_id
        return Sample([pad, pad], 1, [0], 0.0)

    def _global_counts(self, tokens: int, samples: int, passes: int) -> tuple[int, int, int]:
        """(trained tokens, samples) summed over ranks and micro-batches maxed over ranks."""
        import torch

        if not self._distributed:
            return tokens, samples, passes
        summed = torch.tensor([tokens, samples], dtype=torch.long, device=self.device)
        most = torch.tensor([passes], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(summed, op=torch.distributed.ReduceOp.SUM)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return int(summed[0]), int(summed[1]), int(most[0])

    def _all_reduce_sum(self, values: list[float]) -> list[float]:
        import torch

        if not self._distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return [float(v) for v in tensor.tolist()]

    @property
    def _distributed(self) -> bool:
        import torch

        return bool(self.world_size > 1 and torch.distributed.is_initialized())

    @property
    def _forward_model(self) -> Any:
        return self.engine if self.engine is not None else self.model

    def _autocast(self) -> Any:
        import torch

        if self.engine is None and self.cuda and self.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _optimizer_step(self) -> float:
        import torch

        if self.engine is not None:
            self.engine.step()
            norm = self.engine.get_global_grad_norm()
            return float(norm) if norm is not None else 0.0
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self._distributed:
            self._average_gradients(params)
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _average_gradients(self, params: Sequence[Any]) -> None:
        """Without DeepSpeed: the ranks' gradients averaged in place (what DDP does), one
        all-reduce per dtype over a flat buffer."""
        import torch
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        groups: dict[Any, list[Any]] = {}
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            groups.setdefault(param.grad.dtype, []).append(param.grad)
        for grads in groups.values():
            flat = _flatten_dense_tensors(grads)
            torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
            flat.div_(self.world_size)
            for grad, value in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(value)

    def _learning_rate(self) -> float:
        groups = getattr(self.optimizer, "param_groups", None)
        return float(groups[0]["lr"]) if groups else self.config.optim.learning_rate

    # ------------------------------------------------------------------ one step
    def _rollout_groups(
        self, step: int
    ) -> tuple[list[Episode], list[tuple[list[Episode], GroupResult]], dict[str, float]]:
        """Draw the step's tasks, roll them out and score them; under learnability sampling,
        drop zero-variance groups and roll out replacements (up to `refill_rounds` rounds).

        The draws are global (every rank draws the same list and rolls out its share,
        `tasks[rank::world]`), and so are the outcomes the sampler learns from and the drop
        decisions: one all-reduce of (successes, episodes) per drawn task a round.
        Returns every episode rolled out, the groups kept for the update (members, result)
        and the step's sampling metrics.
        """
        cfg = self.config
        count = cfg.tasks_per_step * self.world_size
        sampler = self.sampler
        if sampler is None:
            drawn = sample_tasks(self.pool, count, cfg.seed, step - 1)
        else:
            drawn = sampler.sample(count, step - 1)
        episodes: list[Episode] = []
        kept: list[tuple[list[Episode], GroupResult]] = []
        used: set[str] = set()
        dropped = refilled = 0
        learnability: list[float] = []
        round_ = 0
        while True:
            mine = drawn[self.rank :: self.world_size]
            rolled = self.rollout(mine, step=step, round_=round_)
            scored = self.score(rolled)
            outcomes = self._global_outcomes(len(drawn), scored)
            episodes += rolled
            used.update(task.id for task in drawn)
            zero = 0
            for successes, n, signal in outcomes:
                if n > 0:
                    share = successes / n
                    learnability.append(share * (1.0 - share))
                if sampler is not None and not signal:
                    zero += 1
            if sampler is None:
                kept += list(scored.values())
                break
            sampler.record(
                (task.id, won, n) for task, (won, n, _) in zip(drawn, outcomes, strict=True)
            )
            kept += [(members, result) for members, result in scored.values() if _signal(result)]
            dropped += zero
            if not zero or round_ >= cfg.sampling.refill_rounds:
                break
            round_ += 1
            drawn = sampler.sample(zero, step - 1, round_, exclude=used)
            refilled += zero
        metrics = {
            "groups_dropped": float(dropped),
            "groups_refilled": float(refilled),
            "mean_learnability": sum(learnability) / len(learnability) if learnability else 0.0,
            "refill_rounds": float(round_),
        }
        return episodes, kept, metrics

    def _global_outcomes(
        self, drawn: int, scored: Mapping[int, tuple[list[Episode], GroupResult]]
    ) -> list[tuple[float, float, bool]]:
        """(successes, trainable episodes, has a learning signal) of each of the round's
        `drawn` tasks, from every rank: this rank's group g is the drawn task g * world + rank
        (one all-reduce)."""
        values = [0.0] * (3 * drawn)
        for g, (members, result) in scored.items():
            slot = g * self.world_size + self.rank
            values[3 * slot] = float(sum(e.trajectory.success for e in members))
            values[3 * slot + 1] = float(len(members))
            values[3 * slot + 2] = 1.0 if _signal(result) else 0.0
        summed = self._all_reduce_sum(values) if values else values
        return [(summed[3 * i], summed[3 * i + 1], summed[3 * i + 2] > 0) for i in range(drawn)]

    def train_step(self) -> StepResult:
        """Sample tasks, roll out, score, update; logs metrics and checkpoints when due."""
        cfg = self.config
        step = self.step + 1
        started = time.perf_counter()
        episodes, kept, sampling = self._rollout_groups(step)
        rolled = time.perf_counter()
        groups = [result for _, result in kept]
        index = {id(episode): i for i, episode in enumerate(episodes)}
        samples: list[Sample] = []
        for members, result in kept:
            for episode, value in zip(members, result.advantages, strict=True):
                samples += build_samples(
                    episode.turns,
                    value,
                    pack=cfg.loss.pack_turns,
                    episode=index[id(episode)],
                )
        update = self.update(samples)
        updated = time.perf_counter()
        if self._vllm is not None:  # the rollout server samples the next step with these
            self._push_weights()
        finished = time.perf_counter()
        self.step = step
        totals = self._rollout_totals(episodes, groups, samples)
        metrics = self._step_metrics(totals, update)
        metrics.update(sampling)
        tokens = int(totals["tokens"])
        metrics.update(
            rollout_s=rolled - started,
            update_s=finished - rolled,
            weight_sync_s=finished - updated,
            step_s=finished - started,
            tokens_per_second=tokens / max(finished - started, 1e-9),
        )
        tiers: dict[str, int] = {tier: int(totals[f"tier:{tier}"]) for tier in CARE_TIERS}
        self.history.append(metrics)
        if step % cfg.metrics.logging_steps == 0 or step == cfg.steps:
            output = int(totals["output_tokens"])
            self.metrics.log(step, tokens=tokens, output_tokens=output, care_tiers=tiers, **metrics)
        if step % cfg.checkpoint.every_steps == 0 or step == cfg.steps:
            self.save_checkpoint()
        return StepResult(step, metrics, tiers, episodes, groups)

    def _rollout_totals(
        self,
        episodes: Sequence[Episode],
        groups: Sequence[GroupResult],
        samples: Sequence[Sample],
    ) -> dict[str, float]:
        """Counts and sums over the step's episodes of every rank (one all-reduce), so what rank
        0 logs describes the whole step, not its own share."""
        rewards = [r for g in groups for r in g.rewards]
        advantages = [a for g in groups for a in g.advantages]
        totals = {
            "episodes": len(episodes),
            "successes": sum(e.trajectory.success for e in episodes),
            "progress": sum(
                e.trajectory.verification.progress if e.trajectory.verification else 0.0
                for e in episodes
            ),
            "tokens": sum(
                e.trajectory.totals.prompt_tokens + e.trajectory.totals.completion_tokens
                for e in episodes
            ),
            "output_tokens": sum(e.trajectory.totals.completion_tokens for e in episodes),
            "tool_calls": sum(e.trajectory.totals.tool_calls for e in episodes),
            "turns": sum(e.trajectory.totals.turns for e in episodes),
            "episode_errors": sum(1 for e in episodes if e.trajectory.error),
            "environment_failures": sum(1 for e in episodes if not trainable(e)),
            "groups": len(groups),
            "anchored_groups": sum(1 for g in groups if g.anchored),
            "samples": len(samples),
            "packed_turns": sum(len(e.turns) for e in episodes) - len(samples),
            "generate_calls": getattr(self, "_batcher_stats", (0, 0))[0],
            "rewards": len(rewards),
            "reward_sum": sum(rewards),
            "reward_squares": sum(r * r for r in rewards),
            "advantages": len(advantages),
            "advantage_abs_sum": sum(abs(a) for a in advantages),
            **{f"tier:{tier}": sum(1 for g in groups if g.tier == tier) for tier in CARE_TIERS},
        }
        summed = self._all_reduce_sum([float(v) for v in totals.values()])
        return dict(zip(totals, summed, strict=True))

    def _step_metrics(
        self, totals: Mapping[str, float], update: Mapping[str, float]
    ) -> dict[str, float]:
        n = max(1.0, totals["episodes"])
        count = max(1.0, totals["rewards"])
        mean_reward = totals["reward_sum"] / count
        return {
            "loss": update["loss"],
            "reward": mean_reward,
            "reward_std": math.sqrt(max(0.0, totals["reward_squares"] / count - mean_reward**2)),
            "advantage_abs": totals["advantage_abs_sum"] / max(1.0, totals["advantages"]),
            "success_rate": totals["successes"] / n,
            "progress": totals["progress"] / n,
            "output_tokens_mean": totals["output_tokens"] / n,
            "tool_calls_mean": totals["tool_calls"] / n,
            "turns_mean": totals["turns"] / n,
            **{
                key: totals[key]
                for key in (
                    "episode_errors",
                    "environment_failures",
                    "episodes",
                    "groups",
                    "anchored_groups",
                    "samples",
                    "packed_turns",
                    "generate_calls",
                )
            },
            **{k: float(v) for k, v in update.items() if k != "loss"},
        }

    def train(self) -> RunResult:
        """Run steps until `config.steps` (from where a resumed run left off)."""
        steps: contextlib.AbstractContextManager[progress.Tracker | None] = (
            progress.track("rl", total=self.config.steps, unit="steps")
            if self.rank == 0
            else contextlib.nullcontext()
        )
        self.config.env.wait_ready()  # the environment servers may still be starting
        with steps as bar:
            if bar is not None:
                bar.update(self.step)
            while self.step < self.config.steps:
                self.train_step()
                if bar is not None:
                    bar.update(self.step)
        final = self.save_final()
        return RunResult(
            self.step,
            self.resumed_from,
            self.last_checkpoint,
            final,
            self.final_uri,
            self.history,
            list(self.checkpoint_uris),
        )

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Save `checkpoint-<step>/` (see `qpa.train.checkpoint`): `model/` (Hugging Face
        weights + tokenizer), optimizer state (`optimizer.pt`, or DeepSpeed's `deepspeed/`),
        `rl_state.json`, RNG; hashed (`record_local`, the completion mark) and uploaded to the
        store when one is configured. Older local folders beyond `keep_last` are removed."""
        import torch

        from qpa.train.checkpoint import record_local

        folder = self.run_dir / f"checkpoint-{self.step}"
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank == 0 and folder.exists():
            shutil.rmtree(folder)
        self._barrier()
        if self.engine is not None:
            self.engine.save_checkpoint(str(folder / "deepspeed"), tag="state")
        with self.full_parameters():
            if self.rank == 0:
                self._save_model(folder / "model")
        if self.rank == 0:
            if self.engine is None:
                torch.save(
                    {
                        "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                    },
                    folder / "optimizer.pt",
                )
            state: dict[str, Any] = {
                "step": self.step,
                "name": self.config.name,
                "care": self.config.care.enabled,
            }
            if self.sampler is not None:
                state["sampling"] = self.sampler.state()
            (folder / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
            torch.save({"torch": torch.get_rng_state()}, folder / "rng.pt")
        self._barrier()
        node, nodes = _node_topology()
        if local_rank == 0:
            record_local(folder, self.step, node_rank=node)
            if self.checkpoints is not None:
                self.checkpoints.upload(folder, self.step, node_rank=node, nodes=nodes)
                self.checkpoint_uris.append(self.checkpoints.uri(self.step))
        if nodes > 1:
            self._barrier()
            if self.rank == 0 and self.checkpoints is not None:
                base = self.checkpoints.checkpoint_key(self.step)
                self.checkpoints.mark_complete(base, step=self.step, nodes=nodes)
        if local_rank == 0:
            self._prune()
        # No rank goes on before the checkpoint is complete: a rank killed in the next step
        # (its peers then killed by the launcher) leaves this checkpoint to resume from.
        self._barrier()
        self.last_checkpoint = folder
        return folder

    def _save_model(self, folder: Path) -> None:
        """The policy's full weights and the tokenizer as a Hugging Face folder (rank 0)."""
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        self.model.save_pretrained(folder, state_dict=state)
        self.tokenizer.save_pretrained(folder)

    def save_final(self) -> Path | None:
        """`<output_dir>/final`: the trained model and tokenizer (uploaded to `<prefix>/final`)."""
        if not self.config.checkpoint.save_final:
            return None
        folder = self.run_dir / "final"
        with self.full_parameters():
            if self.rank == 0:
                if folder.exists():
                    shutil.rmtree(folder)
                self._save_model(folder)
                if self.checkpoints is not None:
                    self.final_uri = self.checkpoints.upload_final(folder)
        self._barrier()
        return folder

    def _barrier(self) -> None:
        import torch

        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def _prune(self) -> None:
        from qpa.train.checkpoint import local_checkpoints

        keep = self.config.checkpoint.keep_last
        if keep is None:
            return
        for ref in local_checkpoints(self.run_dir)[:-keep]:
            if ref.local is not None:
                shutil.rmtree(ref.local, ignore_errors=True)

    def _find_resume(self) -> Path | None:
        """The checkpoint folder to continue from (downloaded when it is in the store)."""
        from qpa.store import open_store
        from qpa.train.checkpoint import (
            CheckpointError,
            download_checkpoint,
            latest_local,
            sweep_snapshots,
            verify_local,
        )

        settings = self.config.checkpoint
        explicit = settings.resume_from
        if explicit:
            if "://" not in explicit:
                folder = Path(explicit)
                if not (folder / STATE_FILE).is_file():
                    raise ConfigError(f"resume checkpoint {explicit} has no {STATE_FILE}")
                problems = verify_local(folder)
                if problems:
                    raise ConfigError(f"resume checkpoint {explicit}: {problems[0]}")
                return folder
            try:
                dest = self.run_dir / f"resume-{hashlib.sha256(explicit.encode()).hexdigest()[:8]}"
                return download_checkpoint(open_store(explicit), "", dest)
            except (CheckpointError, ValueError) as exc:
                raise ConfigError(f"resume checkpoint {explicit}: {exc}") from None
        if settings.resume == "never":
            return None
        sweep_snapshots(self.run_dir)  # partial downloads a killed process left
        local = latest_local(self.run_dir)
        if self.checkpoints is not None:  # the newest complete one that verifies, if newer
            remote = self.checkpoints.download_latest(
                lambda step: self.run_dir / f"checkpoint-{step}",
                newer_than=local.step if local is not None else None,
            )
            if remote is not None:
                assert remote.local is not None
                return remote.local
        if local is not None:
            assert local.local is not None
            _, nodes = _node_topology()
            rank_zero = int(os.environ.get("RANK", "0")) == 0
            if (  # a kill kept this checkpoint out of the store: upload it now
                self.checkpoints is not None
                and nodes == 1
                and rank_zero
                and local.step not in self.checkpoints.steps()
            ):
                self.checkpoints.upload(local.local, local.step)
            return local.local
        if settings.resume == "latest":
            where = [str(self.run_dir)]
            if self.checkpoints is not None:
                where.append(self.checkpoints.uri())
            raise ConfigError(f"resume: no complete checkpoint in {' or '.join(where)}")
        return None

    def _load_state(self, folder: Path) -> None:
        import torch

        state = json.loads((folder / STATE_FILE).read_text())
        self.step = self.resumed_from = int(state["step"])
        if self.sampler is not None and isinstance(state.get("sampling"), dict):
            self.sampler.load_state(state["sampling"])
        if self.engine is not None:
            self.engine.load_checkpoint(
                str(folder / "deepspeed"),
                tag="state",
                load_module_strict=True,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
        else:
            saved = torch.load(folder / "optimizer.pt", weights_only=False)
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
        rng = folder / "rng.pt"
        if rng.exists():
            torch.set_rng_state(torch.load(rng, weights_only=False)["torch"])
        self.last_checkpoint = folder

    def close(self) -> None:
        """Release the vLLM communicator (if any)."""
        if self._vllm is not None:
            with contextlib.suppress(Exception):
                self._vllm.close()
            self._vllm = None


def trainable(episode: Episode) -> bool:
    """False for episodes the environment's side ended (they are not the policy's doing)."""
    return not (episode.trajectory.error or "").startswith("environment:")


def _node_topology() -> tuple[int, int]:
    """(node rank, nodes) from the launcher's environment (as `qpa train launch` sets it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("NPROC_PER_NODE", world)))
    node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    return node, max(1, world // max(1, local_world))


def run_rl(
    config: RLConfig,
    *,
    care: bool | None = None,
    env_urls: Sequence[str] = (),
    resume: bool = False,
    tasks: Sequence[Task] | None = None,
    environment: Callable[[int], Environment] | None = None,
) -> RunResult:
    """Run (or resume) an RL run to `config.steps`; CLI flags override the config.
    `environment` makes episode i's environment (default: from `config.env`)."""
    updates: dict[str, Any] = {}
    if care is not None:
        updates["care"] = config.care.model_copy(update={"enabled": care})
    if env_urls:
        updates["env"] = config.env.model_copy(update={"urls": list(env_urls)})
    if resume:
        updates["checkpoint"] = config.checkpoint.model_copy(update={"resume": "latest"})
    if updates:
        config = config.model_copy(update=updates)
    trainer = RLTrainer(config, tasks=tasks, environment=environment)
    try:
        return trainer.train()
    finally:
        trainer.close()
