"""The programmatic sandbox: a deterministic simulated phone with apps, tools and verifiers."""

from qpa.envs.sandbox.engine import App, ToolError, World, fail, tool
from qpa.envs.sandbox.env import SandboxEnv

__all__ = ["App", "SandboxEnv", "ToolError", "World", "fail", "tool"]
