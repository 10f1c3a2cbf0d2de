"""`make_env(kind, **options)`: the one place an environment kind's name becomes an `Environment`.

Servers, the CLI and rollout workers build environments only through this function, so adding a
kind (`llm_sim`, `device`) means adding one loader here; nothing else special-cases a kind.
Loaders import their module lazily, so asking for a sandbox never imports device or LLM code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qpa.contract import Environment


def _sandbox(**options: Any) -> Environment:
    from qpa.envs.sandbox import SandboxEnv

    env: Environment = SandboxEnv(**options)
    return env


def _llm_sim(**options: Any) -> Environment:
    from qpa.envs.llmsim import LLMSimEnv

    env: Environment = LLMSimEnv(**options)
    return env


def _device(**options: Any) -> Environment:
    from qpa.envs.device import DeviceEnv

    env: Environment = DeviceEnv(**options)
    return env


def _mcp(**options: Any) -> Environment:
    from qpa.envs.mcp import McpEnv

    env: Environment = McpEnv(**options)
    return env


def _agentdojo(**options: Any) -> Environment:
    from qpa.envs.agentdojo import AgentDojoEnv

    env: Environment = AgentDojoEnv(**options)
    return env


def _bfcl(**options: Any) -> Environment:
    from qpa.envs.bfcl import BfclEnv

    env: Environment = BfclEnv(**options)
    return env


# kind -> loader.
_LOADERS: dict[str, Callable[..., Environment]] = {
    "sandbox": _sandbox,
    "llm_sim": _llm_sim,
    "device": _device,
    "mcp": _mcp,
    "agentdojo": _agentdojo,
    "bfcl": _bfcl,
}


def env_kinds() -> list[str]:
    """The environment kinds `make_env` can build, sorted."""
    return sorted(_LOADERS)


def make_env(kind: str, **options: Any) -> Environment:
    """A fresh environment of `kind`; `options` go to its constructor (e.g. `max_steps`).

    Raises `ValueError` naming the available kinds when `kind` is unknown, and `TypeError` when
    an option is not one the kind accepts.
    """
    loader = _LOADERS.get(kind)
    if loader is None:
        choices = ", ".join(env_kinds())
        raise ValueError(f"unknown environment kind {kind!r}; choose from: {choices}")
    return loader(**options)
