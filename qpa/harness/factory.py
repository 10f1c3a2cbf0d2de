"""Build any planner by name: model-free (`oracle`, `noop`, `greedy_wrong`, `noisy`) or a model
behind the Harness (`openai`, `local`). The CLI, the benchmark and the server all go through here.

The `local` planner's `--model-uri` is a checkpoint folder or a location `qpa.store.resolve_local`
understands (`file://`, `s3://`, `pvc://`, `hf://`): the spec resolves it once, when it is made,
to `model_dir` (a download lands in the cache), so a bad location fails before any episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from qpa.harness.agent import HarnessConfig, HarnessPlanner
from qpa.harness.memory import MemoryStore
from qpa.harness.noisy import NoisyPlanner
from qpa.harness.planners import PLANNERS, Planner
from qpa.store import resolve_local

MODEL_PLANNERS = ("openai", "local")
PLANNER_NAMES = (*PLANNERS, "noisy", *MODEL_PLANNERS)


@dataclass
class PlannerSpec:
    """Everything needed to build planners of one kind, once per episode."""

    name: str
    model_url: str | None = None
    model: str = "planner"
    model_path: str | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    native_tools: bool = True
    device: str = "cpu"
    noise: float = 0.5
    seed: int = 0
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    model_dir: Path | None = field(default=None, init=False)
    """The local checkpoint folder `model_path` resolved to (planner `local` only)."""

    def __post_init__(self) -> None:
        if self.name not in PLANNER_NAMES:
            raise ValueError(
                f"unknown planner {self.name!r}; choose from {', '.join(PLANNER_NAMES)}"
            )
        if self.name == "openai" and not self.model_url:
            raise ValueError("planner 'openai' needs --model-url (an OpenAI-compatible endpoint)")
        if self.name == "local" and not self.model_path:
            raise ValueError(
                "planner 'local' needs --model-uri (a checkpoint folder or a file://, s3://, "
                "pvc:// or hf:// location of one)"
            )
        if self.name == "local":
            self.model_dir = resolve_local(str(self.model_path), field="--model-uri")
            if not self.model_dir.is_dir():
                raise ValueError(f"--model-uri {self.model_path}: is not a checkpoint folder")

    @property
    def policy_model(self) -> str:
        if self.name == "openai":
            return self.model
        if self.name == "local":
            return str(self.model_path)
        return ""


def load_harness_config(path: str | Path | None) -> HarnessConfig:
    """A Harness version from YAML (`qpa run --harness-config h.yaml`), or the defaults."""
    if path is None:
        return HarnessConfig()
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return HarnessConfig.model_validate(data)


class PlannerFactory:
    """Makes a fresh planner per episode; model backends and memory are shared across them."""

    def __init__(self, spec: PlannerSpec) -> None:
        self.spec = spec
        self._backend: Any = None
        self._memory: MemoryStore | None = None

    def _shared_backend(self) -> Any:
        if self._backend is None:
            spec = self.spec
            if spec.name == "openai":
                from qpa.harness.backends.openai import OpenAIBackend

                self._backend = OpenAIBackend(
                    str(spec.model_url),
                    spec.model,
                    api_key_env=spec.api_key_env,
                    api_key_file=spec.api_key_file,
                    native_tools=spec.native_tools,
                )
            else:
                from qpa.harness.backends.local import LocalBackend

                self._backend = LocalBackend(str(spec.model_dir), device=spec.device)
        return self._backend

    def warm(self) -> None:
        """Load the local planner's weights now (a server is ready only once they are in)."""
        if self.spec.name == "local":
            self._shared_backend().load()

    def __call__(self) -> Planner:
        spec = self.spec
        if spec.name in PLANNERS:
            planner: Planner = PLANNERS[spec.name]()
            return planner
        if spec.name == "noisy":
            return NoisyPlanner(fault_rate=spec.noise, seed=spec.seed)
        if self._memory is None:
            self._memory = MemoryStore(spec.harness.memory_path)
        return HarnessPlanner(self._shared_backend(), spec.harness, memory=self._memory)
