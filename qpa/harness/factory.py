"""Build any planner by name: model-free (`oracle`, `noop`, `greedy_wrong`, `noisy`) or a model
behind the Harness (`openai`, `local`). The CLI, the benchmark and the server all go through here.
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

    def __post_init__(self) -> None:
        if self.name not in PLANNER_NAMES:
            raise ValueError(
                f"unknown planner {self.name!r}; choose from {', '.join(PLANNER_NAMES)}"
            )
        if self.name == "openai" and not self.model_url:
            raise ValueError("planner 'openai' needs --model-url (an OpenAI-compatible endpoint)")
        if self.name == "local" and not self.model_path:
            raise ValueError("planner 'local' needs --model-path (a local checkpoint folder)")
        if self.name == "local" and not Path(str(self.model_path)).is_dir():
            raise ValueError(f"--model-path {self.model_path!r} is not a checkpoint folder")

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

                self._backend = LocalBackend(str(spec.model_path), device=spec.device)
        return self._backend

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
