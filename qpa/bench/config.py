"""`BenchConfig`: everything `qpa bench run` needs, from CLI flags or a HarnessRelease.

A person's flags and a HarnessRelease's work order (`qpa bench run --spec FILE`, what the
release's benchmark Job runs) build the same object; `BenchConfig.from_harnessrelease` maps each
field of the release that the benchmark pod acts on: the suite settings (`benchmark.*`), the
candidate's served model name and Harness (version and config), the RolloutPool, and, from what
the operator resolved, the candidate model's endpoint and where the report is published. The
rest of the spec (model serving, image, gate, canary, timeouts) shapes the InferenceServices,
the Job, and the operator's decision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, InstanceOf, model_validator

from qpa.api.v1alpha1 import (
    HARNESS_CONFIG_DIR,
    Capability,
    EnvironmentKind,
    HarnessRelease,
    Split,
    WorkOrder,
)
from qpa.envs.sandbox.suite import CANONICAL_SEED, DEFAULT_SUITE
from qpa.envs.suites import is_third_party, suite_env_kind
from qpa.harness.factory import PlannerSpec, load_harness_config
from qpa.harness.runner import DEFAULT_MAX_TURNS

#: Where the benchmark Job writes its run before publishing it (an emptyDir).
POD_OUT = Path("/work/bench")


class BenchConfig(BaseModel):
    """One benchmark run: which tasks, which policy, where the episodes run, where results go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path = Field(description="Output folder (resumable).")
    planner: InstanceOf[PlannerSpec] = Field(description="The policy under test.")
    suite: str = Field(default=DEFAULT_SUITE, min_length=1, description="Task suite.")
    split: Split = "test"
    seed: int = Field(default=CANONICAL_SEED, ge=0, description="Suite seed.")
    samples_per_task: int = Field(
        default=1,
        ge=1,
        validation_alias=AliasChoices("samples_per_task", "samples"),
        description="Samples per task (`benchmark.samples` of a HarnessRelease).",
    )
    concurrency: int = Field(default=1, ge=1, description="Episodes in parallel.")
    env_urls: list[str] = Field(default_factory=list, description="Environment servers.")
    env_kind: EnvironmentKind = "sandbox"
    limit: int | None = Field(default=None, ge=1, description="At most this many tasks.")
    domains: list[str] = Field(default_factory=list, description="Only these domains.")
    capabilities: list[Capability] = Field(default_factory=list, description="Only these.")
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    retry_errors: bool = False
    prices: Path | None = None
    plots: bool = True
    report_uri: str | None = Field(default=None, description="Publish the finished run here.")

    @model_validator(mode="before")
    @classmethod
    def _suite_kind(cls, data: Any) -> Any:
        # no kind named and no server: the suite's own kind plays it (agentdojo/..., bfcl/...)
        # (with servers the kind is theirs: the field keeps its default)
        if isinstance(data, dict) and data.get("env_kind") is None:
            data = {k: v for k, v in data.items() if k != "env_kind"}
            if not data.get("env_urls"):
                data["env_kind"] = suite_env_kind(str(data.get("suite") or DEFAULT_SUITE))
        return data

    @model_validator(mode="after")
    def _one_environment(self) -> Self:
        if self.env_urls and self.env_kind != "sandbox":
            raise ValueError("env_urls: environment servers and an in-process kind exclude")
        wanted = suite_env_kind(self.suite)
        if not self.env_urls and is_third_party(self.suite) and self.env_kind != wanted:
            raise ValueError(
                f"env_kind: suite {self.suite!r} is played by environment kind {wanted}, "
                f"not {self.env_kind}"
            )
        return self

    @property
    def filters(self) -> dict[str, object]:
        """The task filters, as the run records them (a resumed run must use the same)."""
        return {"limit": self.limit, "domain": self.domains, "capability": self.capabilities}

    @classmethod
    def from_harnessrelease(
        cls,
        order: WorkOrder[HarnessRelease],
        *,
        out: Path = POD_OUT,
        harness_config_dir: str = HARNESS_CONFIG_DIR,
    ) -> BenchConfig:
        """The benchmark of a release's candidate, as its Job runs it (the Harness YAML of
        `harness.configMapRef` is read where the Job mounts it)."""
        spec = order.resource.spec
        bench, resolved = spec.benchmark, order.resolved
        if not resolved.model_url:
            raise ValueError("resolved.modelUrl: the operator gives the candidate's endpoint")
        ref = spec.harness.config_map_ref
        harness = load_harness_config(Path(harness_config_dir) / ref.key if ref else None)
        planner = PlannerSpec(
            name="openai",
            model_url=resolved.model_url,
            model=spec.model.served_model_name,
            harness=harness.model_copy(update={"version": spec.harness.version}),
        )
        pool = resolved.rollout_pool_url if bench.rollout_pool_ref is not None else None
        return cls(
            out=out,
            planner=planner,
            suite=bench.suite,
            split=bench.split,
            samples_per_task=bench.samples,
            concurrency=bench.concurrency,
            limit=bench.limit,
            env_urls=[pool] if pool else [],
            env_kind="sandbox" if pool else bench.environment,
            plots=False,
            report_uri=resolved.report_uri,
        )
