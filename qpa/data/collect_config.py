"""`CollectConfig`: everything one collection needs, built in one place per entry point.

`qpa collect`'s flags build it (`qpa.cli.collect`), and so does a TaskBatch's work order
(`CollectConfig.from_taskbatch(order, shard_index)`): every field of the TaskBatch's spec that
changes what a worker pod does lands here, the rest (image, resources, parallelism, retries,
deadline) shapes the Job the operator renders. `qpa.data.collect.run_collect(config)` runs it.

The policy is data too (`PlannerConfig`): the planner spec is built (and a `modelUri` resolved
through `qpa.store.resolve_local`) only when the collection starts, so building a config never
touches the network or the disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from qpa.api.v1alpha1 import (
    API_KEY_ENV,
    HARNESS_CONFIG_DIR,
    TaskBatch,
    TaskSource,
    WorkOrder,
)
from qpa.harness.factory import PLANNER_NAMES, PlannerSpec, load_harness_config
from qpa.harness.runner import DEFAULT_MAX_TURNS
from qpa.store import StoreConfig
from qpa.store.spool import shard_tag

DEFAULT_PART_SIZE: Final = 64
DEFAULT_FLUSH_TIMEOUT_S: Final = 600.0
DEFAULT_CONCURRENCY: Final = 4
DEFAULT_START_TIMEOUT_S: Final = 60.0
DEFAULT_ENV_RETRIES: Final = 5  # with the doubling backoff: ~25 s for a server to come back


class PlannerConfig(BaseModel):
    """The policy that acts, as data; `spec()` builds the planner spec when a run starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="oracle", description="Planner backend.")
    model_url: str | None = Field(default=None, description="OpenAI-compatible endpoint.")
    model: str = Field(default="planner", min_length=1, description="Model name at the endpoint.")
    model_uri: str | None = Field(
        default=None,
        description="Checkpoint of the local planner: a folder or a file://, s3://, pvc:// or "
        "hf:// location (qpa.store.resolve_local).",
    )
    api_key_env: str | None = Field(default=None, description="Variable holding the API key.")
    harness_config: Path | None = Field(default=None, description="Harness YAML file.")
    harness_version: str | None = Field(
        default=None,
        min_length=1,
        description="Harness version recorded in every trajectory (overrides the YAML's).",
    )
    noise: float = Field(default=0.5, ge=0, le=1, description="Fault rate of the noisy planner.")
    seed: int = Field(default=0, description="Seed of the noisy planner.")

    @field_validator("name")
    @classmethod
    def _known_planner(cls, value: str) -> str:
        if value not in PLANNER_NAMES:
            raise ValueError(f"unknown planner {value!r}; choose from {', '.join(PLANNER_NAMES)}")
        return value

    def spec(self) -> PlannerSpec:
        """The planner spec (reads the Harness YAML, resolves `model_uri`); ValueError/OSError
        name what is wrong."""
        harness = load_harness_config(self.harness_config)
        if self.harness_version is not None:
            harness = harness.model_copy(update={"version": self.harness_version})
        return PlannerSpec(
            name=self.name,
            model_url=self.model_url,
            model=self.model,
            model_path=self.model_uri,
            api_key_env=self.api_key_env,
            noise=self.noise,
            seed=self.seed,
            harness=harness,
        )


class CollectConfig(BaseModel):
    """One collection: which tasks, which policy, how many samples, where the output goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: str = Field(min_length=1, description="Dataset root: folder, file:// or s3:// URI.")
    source: TaskSource | None = Field(
        default=None, description="Which tasks (unset when the caller passes tasks itself)."
    )
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    samples_per_task: int = Field(
        default=1,
        ge=1,
        validation_alias=AliasChoices("samples_per_task", "samples"),
        description="Samples per task (the group size; `samplesPerTask`).",
    )
    shard: tuple[int, int] | None = Field(default=None, description="(index, count) of shards.")
    env_url: list[str] = Field(
        default_factory=list, description="Environment servers (round-robin); in-process if none."
    )
    env_kind: str = Field(default="sandbox", description="In-process environment kind.")
    concurrency: int = Field(default=DEFAULT_CONCURRENCY, ge=1, description="Episodes at once.")
    spool_dir: Path | None = Field(default=None, description="Local spool (default: tmp).")
    part_size: int = Field(default=DEFAULT_PART_SIZE, ge=1, description="Trajectories per part.")
    flush_timeout_s: float | None = Field(
        default=DEFAULT_FLUSH_TIMEOUT_S, ge=0, description="Seconds to wait for the store."
    )
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1, description="Turn budget.")
    attempt: int = Field(
        default=0,
        ge=0,
        le=99,
        description="Attempt of the batch: part of every trajectory's identity (task, sample, "
        "attempt), so a deliberate second attempt at the same pairs gets its own parts while a "
        "rerun or a retried shard of one attempt never writes a pair twice.",
    )
    start_timeout_s: float = Field(
        default=DEFAULT_START_TIMEOUT_S,
        ge=0,
        description="Seconds the resume scan waits for an unreachable store before giving up.",
    )
    env_retries: int = Field(
        default=DEFAULT_ENV_RETRIES,
        ge=0,
        description="Reruns of an episode an environment-side failure ended (a dead server).",
    )
    env_retry_backoff_s: float = Field(
        default=1.0, ge=0, description="Seconds before the first rerun (doubling after)."
    )
    recovering: bool = Field(
        default=False,
        description="The oracle recovers: a corrected wrong call in a share `mistake_rate` of "
        "the episodes, transient errors retried (qpa.harness.recovery; planner oracle only).",
    )
    mistake_rate: float = Field(
        default=1.0, ge=0, le=1, description="Share of recovering episodes with a wrong call."
    )
    transient_error_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of episodes whose first state-changing call gets an injected "
        "transient error (qpa.envs.faults; seeded by the planner's seed).",
    )
    name: str | None = Field(default=None, description="Dataset name in the manifest.")
    generator: str | None = Field(default=None, description="Lineage generator (default: tasks').")
    parents: list[str] = Field(default_factory=list, description="Lineage parents.")
    params: dict[str, Any] = Field(default_factory=dict, description="Extra lineage params.")
    store_config: StoreConfig | None = Field(default=None, description="S3 endpoint and keys.")

    @field_validator("env_url", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if value is None:
            return []
        values = [value] if isinstance(value, str) else list(value)
        return [u.strip() for item in values for u in str(item).split(",") if u.strip()]

    @field_validator("shard")
    @classmethod
    def _valid_shard(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None:
            shard_tag(value)  # 0 <= index < count
        return value

    @model_validator(mode="after")
    def _recovering_oracle(self) -> CollectConfig:
        if self.recovering and self.planner.name != "oracle":
            raise ValueError(
                f"recovering: the recovering planner is the oracle's, not {self.planner.name!r}"
            )
        return self

    @classmethod
    def from_taskbatch(
        cls,
        order: WorkOrder[TaskBatch],
        shard_index: int,
        environ: Mapping[str, str] | None = None,
    ) -> CollectConfig:
        """The collection of shard `shard_index` of a TaskBatch's work order.

        S3 credentials come from the files the operator mounts (`QPA_S3_*_FILE` in `environ`);
        endpoint and region from the resolved store; the API key from `QPA_API_KEY`.
        """
        tb = order.resource
        spec = tb.spec
        policy = spec.policy
        store_config: StoreConfig | None = None
        if order.resolved.store is not None:
            base = StoreConfig.from_env(environ)
            store_config = base.model_copy(
                update={
                    "endpoint": order.resolved.store.endpoint,
                    "region": order.resolved.store.region,
                }
            )
            store_config = StoreConfig.model_validate(store_config.model_dump())
        harness_ref = policy.harness.config_map_ref
        name = order.name
        return cls(
            out=spec.output_uri,
            source=spec.source,
            planner=PlannerConfig(
                name=policy.planner,
                model_url=policy.model_url,
                model=policy.model,
                model_uri=policy.model_uri,
                api_key_env=API_KEY_ENV if policy.api_key_secret_ref is not None else None,
                harness_config=(
                    Path(HARNESS_CONFIG_DIR) / harness_ref.key if harness_ref is not None else None
                ),
                harness_version=policy.harness.version,
            ),
            samples_per_task=spec.samples_per_task,
            shard=(shard_index, spec.shards or spec.parallelism),
            env_url=[order.resolved.rollout_pool_url] if order.resolved.rollout_pool_url else [],
            max_turns=spec.max_turns,
            name=name,
            params={"taskbatch": {"namespace": order.resolved.namespace, "name": name}},
            store_config=store_config,
        )


__all__ = [
    "DEFAULT_FLUSH_TIMEOUT_S",
    "DEFAULT_PART_SIZE",
    "CollectConfig",
    "PlannerConfig",
]
