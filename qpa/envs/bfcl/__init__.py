"""BFCL v4 multi-turn (the Berkeley Function Calling Leaderboard) as environment kind `bfcl`.

Its four multi-turn categories are suites `bfcl/<category>` (`bfcl_tasks`), played by `BfclEnv`
on BFCL's own backends and judged by BFCL's own `multi_turn_checker`, all from the installed
`bfcl-eval` package (`qpa.envs.bfcl.benchmark`).
"""

from qpa.envs.bfcl.benchmark import BFCL_CATEGORIES, VERSION
from qpa.envs.bfcl.env import BfclEnv
from qpa.envs.bfcl.tasks import bfcl_tasks, split_of

__all__ = ["BFCL_CATEGORIES", "VERSION", "BfclEnv", "bfcl_tasks", "split_of"]
