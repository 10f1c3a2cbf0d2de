"""The LLM-simulated environment: long-tail apps whose backend a chat model plays.

Apps are tool schemas plus a world description (`SimApp`, YAML in `apps/`); any
OpenAI-compatible endpoint (vLLM, KServe, ...) answers the tool calls, validated against each
tool's result schema; verification is a rubric the model judges (`fidelity="llm_judged"`).
"""

from qpa.envs.llmsim.client import ChatClient, ChatError, ChatReply, resolve_api_key
from qpa.envs.llmsim.env import WORLD_KEY, LLMSimEnv
from qpa.envs.llmsim.spec import SimApp, SimWorld, builtin_apps, load_app, load_apps
from qpa.envs.llmsim.tasks import LONGTAIL_SUITE, longtail_tasks

__all__ = [
    "LONGTAIL_SUITE",
    "WORLD_KEY",
    "ChatClient",
    "ChatError",
    "ChatReply",
    "LLMSimEnv",
    "SimApp",
    "SimWorld",
    "builtin_apps",
    "load_app",
    "load_apps",
    "longtail_tasks",
    "resolve_api_key",
]
