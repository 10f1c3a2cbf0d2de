"""Environment kind `mcp`: the tools of a real app's MCP server, behind the shared contract."""

from qpa.envs.mcp.connection import McpConnection, McpServerSpec, McpUnavailable
from qpa.envs.mcp.env import McpEnv, tool_spec
from qpa.envs.mcp.spec import WORLD_KEY, McpWorld, VerifierReport

__all__ = [
    "WORLD_KEY",
    "McpConnection",
    "McpEnv",
    "McpServerSpec",
    "McpUnavailable",
    "McpWorld",
    "VerifierReport",
    "tool_spec",
]
