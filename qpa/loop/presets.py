"""Loop presets: every setting of one run of the closed loop, embedded, validated, hashable.

A `LoopPreset` names the curriculum (which task templates the run covers), the tiny model and
its tokenizer, the first Harness version, and the budgets of every stage (collection, mixture,
SFT, evaluation, the Harness revision, the weakness-targeted second round and CARE RL). Stages
hash the part of the preset they read, so changing one setting reruns that stage and what
depends on it, and nothing else.

Four presets ship:

- `local` (`qpa loop --preset local`, what `make demo` runs): the whole loop on 2 CPU cores in
  at most 15 minutes. It is sized for a tiny model trained from scratch in minutes, so it
  makes choices a real run would not, all recorded here and in the report:

  * **A curriculum.** Six templates of the `mobilepa` suite (three `tool_use`, two `memory`,
    one `skills`) whose reference plans are short (one or two tool calls, then
    finish) and whose arguments are copied from the instruction, the user's memory or the
    previous tool result. Training uses their `train` split and freshly generated train
    variants; evaluation uses held-out sets of fresh variants (`HeldOutSettings`: 20
    validation and 50 test tasks per template, apart by content from every training task);
    validation drives diagnosis, the Harness revision and the weakness targeting, test is
    only reported.
    `subagent` templates (7+ steps) are out of a tiny model's reach and left out.
  * **A copying warm-up** (`WarmupSettings`): a model built from a config cannot copy a name
    or a number from its prompt, which every task needs; a pretrained planner can.
  * **A tokenizer with macro tokens.** Lines of the Harness's prompts that recur across the
    training conversations (the rules, the tool protocol, each tool's schema line, Skills,
    reset observations) are single added tokens, so the fixed text costs a token per line and
    a conversation is about 300 tokens instead of about 1,800. The text the model sees is
    exactly the Harness's (`qpa.data.render`); only its tokenization is compact. A real
    planner uses its own tokenizer.
  * **A compact first Harness** (`harness-v1`): at most 12 tools and a 150-token adapter
    budget (tool lines only, no Skills). Diagnosis then finds the Harness-side failures this
    causes (`skill_not_injected`, `tool_not_exposed`) and the revision (`harness-v2`) fixes
    them. The SFT mixture renders each trajectory for v1 or one rung of a ladder of Harness
    sizes up to the revision's caps, so the revised Harness's prompt is not new to the model.
  * **Every template trained**: round 1 generates `generated_per_template` tasks for each
    template (`plan_per_template`), not per coverage cell.
  * A 2-layer, hidden-128 Qwen3 (8 heads), bf16 autocast where the CPU has native bf16
    (fp32 elsewhere), greedy decoding.

- `local-long` (`qpa loop --preset local-long`): `local` with a longer RL stage (48 steps of
  8 tasks x 8 samples, two refill rounds of zero-variance groups), at most 60 minutes on 2
  CPU cores, for an RL-over-SFT comparison with more episodes behind it.
- `small`: the same loop on three templates with a few dozen optimizer steps, for tests (< 3
  minutes). Its numbers prove the plumbing, not learning.
- `cluster`: the loop's settings at cluster scale plus where things live (object store,
  images, pools); `qpa loop --preset cluster --dry-run` prints the TaskBatch, TrainingRun and
  HarnessRelease resources that run it on Kubernetes (`qpa.loop.cluster`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from qpa.api.v1alpha1 import CareSettings, TaskSampling
from qpa.harness.agent import HarnessConfig
from qpa.train.tiny import TinyConfig

PresetName = Literal["local", "local-long", "small", "cluster"]
EVAL_STAGES = ("eval_untrained", "eval_sft", "eval_harness", "eval_rl")
PRESET_NAMES: tuple[PresetName, ...] = ("local", "local-long", "small", "cluster")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizerSettings(_Settings):
    """The tiny model's tokenizer: byte-level BPE plus macro tokens for recurring prompt lines.

    Words, spaces, punctuation and digits are pre-tokenized apart (each digit alone), so a name
    or a number has the same tokens in the instruction, in a tool result and in the call that
    copies it.
    """

    vocab_size: int = Field(default=2048, ge=300, description="BPE vocabulary (before macros)")
    macro_lines: bool = Field(default=True, description="recurring prompt lines as one token")
    macro_min_count: int = Field(default=2, ge=1, description="seen in this many conversations")
    macro_min_chars: int = Field(default=12, ge=2)
    macro_max: int = Field(default=6000, ge=0, description="at most this many macro tokens")
    conversations: int = Field(
        default=400, ge=1, description="oracle conversations (train split) mined for macros"
    )


class WarmupSettings(_Settings):
    """An induction warm-up of the random tiny model, before any task data.

    A real planner starts from a pretrained LM that can copy from its context; a tiny model
    built from a config cannot, and learning to copy from the few copy tokens of SFT data
    (a name, a number) takes far more steps than a CPU run has: without the warm-up the SFT
    model writes well-formed calls with memorized values and solves nothing. So the tiny model
    first learns copying alone: a span, filler, the same span again, loss on the repeat (the
    induction-head task). Spans vary in length and distance (a fixed offset is learned as a
    position shortcut that does not copy text); some are random words between spaces (text is
    tokenized that way, so copying must look past the space) and some windows of the
    tokenizer's training corpus (train/validation text, never the test split).
    """

    steps: int = Field(default=1500, ge=0, description="0: no warm-up")
    batch_size: int = Field(default=32, ge=1)
    length: int = Field(default=24, ge=4, description="longest span (filler: up to half)")
    learning_rate: float = Field(default=3e-3, gt=0)
    token_low: int = Field(default=3, ge=0, description="token ids drawn from [low, high)")
    token_high: int = Field(default=1_000_000, ge=1, description="capped at the vocabulary")
    text_share: float = Field(
        default=0.2, ge=0.0, le=1.0, description="rows copied from tokenized corpus text"
    )
    spaced_share: float = Field(
        default=0.4, ge=0.0, le=1.0, description="rows of random words between spaces"
    )
    bf16: bool | Literal["auto"] = Field(
        default="auto", description="bf16 autocast; auto: where the device has it natively"
    )


class TaskSettings(_Settings):
    """The curriculum and the first round of generated training tasks."""

    templates: list[str] = Field(min_length=1, description="templates the loop covers")
    generated_per_template: int = Field(
        default=40, ge=0, description="round 1: fresh train variants per template"
    )
    per_cell: int = Field(
        default=4,
        ge=0,
        description="round 1's coverage target per cell, recorded in its plan (the count per "
        "template is `generated_per_template`)",
    )


class HeldOutSettings(_Settings):
    """The held-out sets every evaluation reads (the `heldout` stage).

    Fresh seeded variants of every curriculum template, generated with a seed stream of their
    own and kept apart by task content (everything the planner, environment and verifier read)
    from every training task (the canonical suite, round 1 and round 2) and from each other.
    Every choice of the loop (RL steps, Harness sizes, weights, thresholds) is made on
    `validation`; `test` is only read for the reported numbers.
    """

    validation_per_template: int = Field(default=20, ge=1, description="validation tasks")
    test_per_template: int = Field(default=50, ge=1, description="test tasks")


class CollectSettings(_Settings):
    """Trajectory collection on the training tasks: the oracle, the noisy oracle and the
    recovering oracle (`qpa.harness.recovery`: a wrong call the sandbox rejects, then the
    correction; transient errors retried), whose episodes may meet injected transient errors
    (`qpa.envs.faults`). SFT masks the rejected call and trains the recovery."""

    oracle_samples: int = Field(default=1, ge=1)
    noisy_samples: int = Field(default=1, ge=0, description="0: no noisy trajectories")
    noise: float = Field(default=0.5, ge=0.0, le=1.0, description="noisy planner's fault rate")
    recovering_samples: int = Field(
        default=0, ge=0, description="recovering-oracle samples per task; 0: none"
    )
    mistake_rate: float = Field(
        default=0.5, ge=0.0, le=1.0, description="share of recovering episodes with a wrong call"
    )
    transient_error_rate: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="share of recovering episodes whose first state-changing call meets an "
        "injected transient error",
    )
    concurrency: int = Field(default=2, ge=1)
    max_turns: int = Field(default=12, ge=1)


RecoveryModel = Literal["untrained", "sft"]
RECOVERY_MODELS: tuple[RecoveryModel, ...] = ("untrained", "sft")


class RecoverySettings(_Settings):
    """The recovery evaluation (`eval_recovery`, `qpa.loop.recovery`): held-out test tasks
    with one injected transient error per episode, for the models listed."""

    models: list[RecoveryModel] = Field(
        default_factory=lambda: list(RECOVERY_MODELS), description="models to evaluate"
    )
    tasks_per_template: int | None = Field(
        default=10, ge=1, description="held-out test tasks per template; unset: all"
    )


class MixSettings(_Settings):
    """The SFT mixture (`qpa.data.mix`): size, weights, failures kept with masked turns."""

    target_size: int = Field(default=600, ge=1)
    include_failures: bool = True
    harness_variants: bool = Field(
        default=True,
        description="render part of the trajectories for the widest Harness the revision can "
        "reach, so the model reads every prompt size it will be served with",
    )
    value_swaps: int = Field(
        default=0,
        ge=0,
        le=16,
        description="value-swapped copies of each row (`qpa.data.augment`): copying, not "
        "the mixture's frequent values",
    )
    day_swaps: bool = Field(
        default=False,
        description='the swapped copies also move phrased days ("March 10" and its ISO '
        "day) on the same weekday: the date is read from the instruction",
    )
    capability_weights: dict[str, float] = Field(default_factory=dict)
    difficulty_weights: dict[int, float] = Field(default_factory=dict)
    source_weights: dict[str, float] = Field(default_factory=dict)


class SFTSettings(_Settings):
    """The SFT cold start (`qpa.train.sft`)."""

    max_steps: int = Field(default=300, ge=1)
    batch_size: int = Field(default=8, ge=1)
    learning_rate: float = Field(default=3e-3, gt=0)
    warmup: float = Field(default=0.05, ge=0)
    max_length: int = Field(default=2048, ge=64)
    bf16: bool | Literal["auto"] = Field(
        default="auto",
        description="bf16 autocast; auto: where the device computes bf16 natively (CUDA, "
        "AMX/AVX-512 BF16 CPUs: ~2x faster), fp32 elsewhere (emulated bf16 is ~9x slower)",
    )
    checkpoint_every: int = Field(default=100, ge=1, description="resumable every N steps")


class EvalSettings(_Settings):
    """Evaluation of a checkpoint through the Harness (batched across episodes): one greedy
    episode per held-out task, and for the stages in `sampled_stages` also `samples` sampled
    episodes per test task (pass@1 estimated from k samples besides the greedy success)."""

    max_new_tokens: int = Field(default=96, ge=8, description="a call is ~20-40 tokens")
    workers: int = Field(default=96, ge=1, description="episodes in flight (one generate call)")
    samples: int = Field(
        default=0, ge=0, description="sampled episodes per test task (k); 0: greedy only"
    )
    sample_temperature: float = Field(default=1.0, gt=0, description="sampling temperature")
    sampled_stages: list[str] = Field(
        default_factory=lambda: ["eval_sft", "eval_rl"],
        description="eval stages that also sample (the others are greedy only)",
    )

    @field_validator("sampled_stages")
    @classmethod
    def _known_stages(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(EVAL_STAGES))
        if unknown:
            raise ValueError(
                f"eval.sampled_stages: unknown {', '.join(unknown)}; "
                f"choose from {', '.join(EVAL_STAGES)}"
            )
        return value


class RevisionSettings(_Settings):
    """How Harness-side failures become a Harness revision, and its limits."""

    max_tools_cap: int = Field(default=16, ge=1)
    token_budget_cap: int = Field(default=1500, ge=100)
    memory_k_cap: int = Field(default=10, ge=1)
    max_turns_cap: int = Field(default=24, ge=1)


class Round2Settings(_Settings):
    """The second round: tasks generated for the weaknesses validation showed, and their mix."""

    count: int = Field(default=120, ge=1, description="generated tasks for the weaknesses")
    per_cell: int = Field(default=4, ge=0)
    weak_threshold: float = Field(default=0.7, gt=0.0, le=1.0)
    weak_boost: float = Field(default=2.0, ge=0.0)
    target_size: int = Field(default=240, ge=1, description="RL task pool: mixture draws")
    pool: Literal["mixture", "learnable"] = Field(
        default="mixture",
        description="the RL pool: `mixture`, the round-2 mixture's draws (weighted to the "
        "weaknesses); `learnable`, round 1's and round 2's tasks with each template's share "
        "p(1-p) of its validation success (`qpa.train.rl.tasks.learnable_pool`)",
    )


class RLSettings(_Settings):
    """Online RL with CARE (`qpa.train.rl`) from the SFT checkpoint, through the revised Harness."""

    steps: int = Field(default=12, ge=1)
    seed: int | None = Field(
        default=None,
        ge=0,
        description="the RL stage's own seed (None: the loop's): RL seeds from one SFT "
        "checkpoint (benchmarks/rl_seeds.py)",
    )
    tasks_per_step: int = Field(default=8, ge=1)
    samples_per_task: int = Field(default=4, ge=2)
    learning_rate: float = Field(default=1e-4, gt=0)
    temperature: float = Field(default=1.0, gt=0)
    max_new_tokens: int = Field(default=96, ge=8)
    micro_batch_size: int = Field(default=8, ge=1)
    clip_high: float = Field(default=0.28, ge=0.0)
    beta: float = Field(
        default=0.0, ge=0.0, description="KL coefficient to the SFT model (0: no reference)"
    )
    warmup_steps: int = Field(default=1, ge=0)
    checkpoint_every: int = Field(default=4, ge=1)
    care: CareSettings = Field(
        default_factory=CareSettings, description="CARE as the CRD's spec.rl.care sets it"
    )
    sampling: TaskSampling = Field(
        default_factory=lambda: TaskSampling(strategy="learnability", refill_rounds=1),
        description="which pool tasks a step draws, as the CRD's spec.rl.sampling sets it: "
        "learnability p(1-p) weights, zero-variance groups dropped and refilled",
    )


class ClusterSettings(_Settings):
    """Where the cluster loop runs: namespace, object store, images, pools, hardware."""

    namespace: str = "qpa"
    name: str = "loop"
    store_uri: str = "s3://qpa/loop"
    store_endpoint: str = "http://minio.qpa.svc:9000"
    store_secret: str = "qpa-minio"
    image: str = "ghcr.io/qpa/qpa:0.1.0"
    trainer_image: str = "ghcr.io/qpa/trainer:0.1.0"
    harness_image: str = "ghcr.io/qpa/harness:0.1.0"
    rollout_pool: str = "sandbox"
    base_model_uri: str = "s3://qpa/models/qwen3-8b"
    policy_model_url: str = "http://planner-predictor.qpa.svc/v1"
    nodes: int = Field(default=2, ge=1)
    gpus_per_node: int = Field(default=8, ge=0)
    parallelism: int = Field(default=32, ge=1)


class LoopPreset(_Settings):
    """Everything one run of the loop needs; `qpa loop --preset NAME` picks one."""

    name: PresetName
    description: str = ""
    seed: int = 0
    suite: str = "mobilepa"
    budget_s: float = Field(default=900.0, gt=0, description="wall-time target of the run")
    tokenizer: TokenizerSettings = Field(default_factory=TokenizerSettings)
    model: TinyConfig = Field(default_factory=TinyConfig)
    warmup: WarmupSettings = Field(default_factory=WarmupSettings)
    tasks: TaskSettings
    heldout: HeldOutSettings = Field(default_factory=HeldOutSettings)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    collect: CollectSettings = Field(default_factory=CollectSettings)
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    mix: MixSettings = Field(default_factory=MixSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    revision: RevisionSettings = Field(default_factory=RevisionSettings)
    round2: Round2Settings = Field(default_factory=Round2Settings)
    rl: RLSettings = Field(default_factory=RLSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)

    def with_seed(self, seed: int) -> LoopPreset:
        """The same preset with another seed (every stage's seed derives from it)."""
        return self.model_copy(update={"seed": seed})

    def with_settings(self, assignments: Sequence[str]) -> LoopPreset:
        """The same preset with `KEY=VALUE` assignments applied (`qpa loop --set`): KEY a
        dotted path to one setting (`rl.beta`, `round2.pool`), VALUE JSON (`0.05`, `[1, 2]`,
        `true`) or else a plain string (`learnable`). The result is validated as a whole, so
        an unknown setting or a value out of range is an error naming its path."""
        data = json.loads(self.model_dump_json())
        for assignment in assignments:
            key, sep, text = assignment.partition("=")
            if not sep or not key:
                raise ValueError(f"--set {assignment!r}: expected KEY=VALUE (e.g. rl.beta=0.05)")
            *parents, last = key.split(".")
            node: Any = data
            for depth, part in enumerate(parents):
                if not isinstance(node.get(part), dict):
                    where = ".".join(parents[: depth + 1])
                    raise ValueError(f"--set {key}: {where} is not a section of the preset")
                node = node[part]
            if last not in node:
                raise ValueError(f"--set {key}: the preset has no setting {key}")
            try:
                node[last] = json.loads(text)
            except json.JSONDecodeError:
                node[last] = text
        try:
            return LoopPreset.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"--set: {problems}") from None

    def section(self, *names: str) -> dict[str, Any]:
        """The named settings as plain JSON data (what a stage's hash covers), with the
        removed settings of `REMOVED_SETTINGS` at their last default."""
        data = json.loads(self.model_dump_json())
        return {name: _with_removed(name, _without_unset(name, data[name])) for name in names}

    def fingerprint(self) -> str:
        """A short hash of every setting."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


OPTIONAL_SETTINGS: dict[str, dict[str, Any]] = {
    "rl": {"seed": None, "beta": 0.0, "care.format_weight": 0.0},
    "round2": {"pool": "mixture"},
    "mix": {"day_swaps": False},
}
"""Settings added later, with their default (a dotted key names one inside a nested model):
hashed only when set to something else, so the stages of a run made before keep their hash
and are reused."""


def _without_unset(section: str, data: Any) -> Any:
    optional = OPTIONAL_SETTINGS.get(section, {})
    if not optional or not isinstance(data, dict):
        return data
    return _drop_defaults(data, optional)


def _drop_defaults(data: dict[str, Any], optional: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in optional and value == optional[key]:
            continue
        nested = {k[len(key) + 1 :]: v for k, v in optional.items() if k.startswith(key + ".")}
        out[key] = _drop_defaults(value, nested) if nested and isinstance(value, dict) else value
    return out


REMOVED_SETTINGS: dict[str, dict[str, Any]] = {
    "tasks": {"validation_per_template": None, "test_per_template": None},
}
"""Settings that were removed, hashed at the default they had, so the stages of a run made
before keep their hash and are reused: `tasks.validation_per_template`/`test_per_template`
capped the canonical splits the `heldout` stage replaced (the `tiny` and `tasks` stages, and
through them all training, hash the `tasks` section)."""


def _with_removed(name: str, section: Any) -> Any:
    removed = REMOVED_SETTINGS.get(name)
    if not removed or not isinstance(section, dict):
        return section
    return {**removed, **section}


# --------------------------------------------------------------------------- the presets

LOCAL_TEMPLATES = [
    # tool_use: arguments copied from the instruction (for the text: via a contact search)
    "add_new_contact",
    "room_lights_brightness",
    "text_contact_by_name",
    # memory: a remembered value (the strongest evidence) goes into the call
    "alarm_with_preferred_sound",
    "text_partner_from_memory",
    # skills: an app procedure the tool schemas alone do not reveal
    "skip_alarm_for_one_day",
]
SMALL_TEMPLATES = ["add_new_contact", "alarm_with_preferred_sound", "cancel_meeting_with_attendees"]

COMPACT_HARNESS = HarnessConfig(
    version="harness-v1",
    token_budget=150,
    max_tools=12,
    memory_k=3,
    max_turns=6,
)
"""The first Harness for the tiny model: 12 tools, tool lines only (no Skills), 6 turns."""

TINY_MODEL = TinyConfig(
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=16,
    max_position_embeddings=4096,
)


def local_preset() -> LoopPreset:
    return LoopPreset(
        name="local",
        description="the whole loop on a tiny model, 2 CPU cores, <= 15 minutes",
        budget_s=900.0,
        model=TINY_MODEL,
        tasks=TaskSettings(templates=list(LOCAL_TEMPLATES), generated_per_template=100),
        harness=COMPACT_HARNESS,
        collect=CollectSettings(
            oracle_samples=1,
            noisy_samples=1,
            noise=0.5,
            recovering_samples=1,
            mistake_rate=0.5,
            transient_error_rate=0.5,
        ),
        # value swaps and 3e-3: chosen on validation (docs/closed-loop.md, "SFT variants")
        mix=MixSettings(target_size=1600, value_swaps=2),
        sft=SFTSettings(max_steps=600, batch_size=8, learning_rate=3e-3),
        round2=Round2Settings(count=120, target_size=240),
        rl=RLSettings(steps=24, tasks_per_step=8, samples_per_task=4, learning_rate=1e-4),
    )


def small_preset() -> LoopPreset:
    return LoopPreset(
        name="small",
        description="the loop's plumbing on three templates, for tests (< 3 minutes)",
        budget_s=180.0,
        tokenizer=TokenizerSettings(conversations=60),
        warmup=WarmupSettings(steps=40, batch_size=16, length=16),
        model=TINY_MODEL.model_copy(
            update={
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            }
        ),
        tasks=TaskSettings(templates=list(SMALL_TEMPLATES), generated_per_template=6),
        heldout=HeldOutSettings(validation_per_template=3, test_per_template=4),
        # 4 tools: a Harness gap on every template, so the revision always has work
        harness=COMPACT_HARNESS.model_copy(update={"max_tools": 4, "token_budget": 100}),
        collect=CollectSettings(oracle_samples=1, noisy_samples=1, noise=0.5, recovering_samples=1),
        recovery=RecoverySettings(models=["sft"], tasks_per_template=2),
        mix=MixSettings(target_size=60),
        sft=SFTSettings(max_steps=20, batch_size=8, learning_rate=3e-3, checkpoint_every=10),
        eval=EvalSettings(max_new_tokens=48, samples=2),
        round2=Round2Settings(count=12, target_size=24),
        rl=RLSettings(
            steps=2,
            tasks_per_step=2,
            samples_per_task=2,
            max_new_tokens=48,
            checkpoint_every=1,
        ),
    )


def cluster_preset() -> LoopPreset:
    """The loop at cluster scale: the whole suite, a real base model, GPUs (see `cluster`)."""
    return LoopPreset(
        name="cluster",
        description="the same loop as Kubernetes resources (TaskBatch, TrainingRun, "
        "HarnessRelease) on a GPU cluster",
        budget_s=86400.0,
        tasks=TaskSettings(templates=list(LOCAL_TEMPLATES), generated_per_template=400),
        harness=HarnessConfig(version="harness-v1", max_turns=40),
        collect=CollectSettings(oracle_samples=1, noisy_samples=4, concurrency=32, max_turns=40),
        mix=MixSettings(target_size=20000),
        sft=SFTSettings(
            max_steps=2000, batch_size=4, learning_rate=1e-5, max_length=8192, checkpoint_every=500
        ),
        eval=EvalSettings(max_new_tokens=512),
        round2=Round2Settings(count=2000, target_size=4000),
        rl=RLSettings(
            steps=200,
            tasks_per_step=64,
            samples_per_task=8,
            learning_rate=1e-6,
            max_new_tokens=512,
            checkpoint_every=20,
        ),
    )


def local_long_preset() -> LoopPreset:
    """`local` with four times the RL episodes (k = 8 samples a task, 48 steps, two refill
    rounds): at most 60 minutes on 2 CPU cores."""
    local = local_preset()
    return local.model_copy(
        update={
            "name": "local-long",
            "description": "the local loop with a longer RL stage, 2 CPU cores, <= 60 minutes",
            "budget_s": 3600.0,
            "rl": local.rl.model_copy(
                update={
                    "steps": 48,
                    "samples_per_task": 8,
                    "checkpoint_every": 8,
                    "sampling": TaskSampling(strategy="learnability", refill_rounds=2),
                }
            ),
        }
    )


def get_preset(name: str, *, seed: int | None = None) -> LoopPreset:
    """The preset called `name` (`local`, `local-long`, `small` or `cluster`), with `seed` when
    given."""
    builders = {
        "local": local_preset,
        "local-long": local_long_preset,
        "small": small_preset,
        "cluster": cluster_preset,
    }
    if name not in builders:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESET_NAMES)}")
    preset = builders[name]()
    return preset if seed is None else preset.with_seed(seed)


__all__ = [
    "COMPACT_HARNESS",
    "EVAL_STAGES",
    "LOCAL_TEMPLATES",
    "PRESET_NAMES",
    "REMOVED_SETTINGS",
    "SMALL_TEMPLATES",
    "TINY_MODEL",
    "ClusterSettings",
    "CollectSettings",
    "EvalSettings",
    "HeldOutSettings",
    "LoopPreset",
    "MixSettings",
    "PresetName",
    "RLSettings",
    "RecoverySettings",
    "RevisionSettings",
    "Round2Settings",
    "SFTSettings",
    "TaskSettings",
    "TokenizerSettings",
    "WarmupSettings",
    "get_preset",
    "local_long_preset",
    "local_preset",
    "small_preset",
]
