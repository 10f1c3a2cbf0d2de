"""Every read tool's cost at the phone profile against the default world, from the suite's own
calls: a cost that grows with the world rather than with the answer shows up here.

Run: `.venv/bin/python benchmarks/tool_scaling.py [--split test]` (about 5 minutes on the
test split; prints one line per tool, worst ratio first; asserts nothing).

For each task of the split, at the `phone` profile and at `default` (the same task), the
reference plan runs in a fresh session; each read call in it is timed 7 times after one warm
call (wall time, median) along with its answer's JSON size; the other actions run once. Per
tool: the median over its calls of both times, their ratio and both answer sizes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qpa.contract import Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.registry import all_tools
from qpa.envs.sandbox.suite import generate_suite

TOOLS = all_tools()


def timed(task: Task, repeats: int = 7) -> list[tuple[str, float, int]]:
    """(tool, median µs, answer bytes) per read call of the task's reference plan."""
    env = SandboxEnv()
    env.reset(task)
    out = []
    for action in task.reference_plan or []:
        env._steps = 0
        read = (
            isinstance(action, ToolCall)
            and action.tool in TOOLS
            and TOOLS[action.tool].spec.side_effect == "read"
        )
        feedback = env.step(action)
        if not read or feedback.status != "ok":
            continue
        times = []
        for _ in range(repeats):
            env._steps = 0
            t0 = time.perf_counter()
            feedback = env.step(action)
            times.append(time.perf_counter() - t0)
        size = len(orjson.dumps(feedback.observation))
        out.append((action.tool, statistics.median(times) * 1e6, size))  # type: ignore[union-attr]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="test", choices=("train", "validation", "test"))
    args = parser.parse_args()
    default = {t.id: t for t in generate_suite() if t.split == args.split}
    per_tool: dict[str, list[list[float]]] = defaultdict(lambda: [[], [], [], []])
    for task in generate_suite(profile="phone"):
        small = default.get(task.id.removesuffix(".phone"))
        if task.split != args.split or small is None:
            continue
        large_calls, small_calls = timed(task), timed(small)
        for (name, us, size), (name0, us0, size0) in zip(large_calls, small_calls, strict=False):
            if name != name0:
                continue
            cell = per_tool[name]
            cell[0].append(us)
            cell[1].append(us0)
            cell[2].append(size)
            cell[3].append(size0)
    rows = []
    for name, (large, small_t, size, size0) in per_tool.items():
        ratio = statistics.median(large) / statistics.median(small_t)
        rows.append((ratio, name, large, small_t, size, size0))
    for ratio, name, large, small_t, size, size0 in sorted(rows, reverse=True):
        print(
            f"{ratio:6.1f}x {name:32s} phone {statistics.median(large):8.1f} µs "
            f"default {statistics.median(small_t):7.1f} µs  answer {statistics.median(size):7.0f}"
            f" / {statistics.median(size0):6.0f} B  calls {len(large)}"
        )


if __name__ == "__main__":
    main()
