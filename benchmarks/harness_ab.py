"""A/B equivalence of two trees of the Harness: what each does on the same episodes, written down.

Runs the Harness (driven by `OracleBackend`, a model that replays the reference plan) over a
spread of the suite's tasks at each world profile, with one memory store per profile (so memory
written back by an episode is what later episodes retrieve), and writes, per episode:

- every prompt the model was sent (each message's role, content, tool calls and tool name) and
  the tools offered with it;
- the trajectory (actions, feedback, annotations, success; durations and wall times left out);
- the traced origins of probe values: every string the episode's tool results and arguments
  hold, and pieces cut from them (digit runs, the last digits of numbers, single words, email
  domains), each through `trace`, loose `trace`, `related_to_free_text` and `copied_prose`;
- the guard's verdict (its refusal message, or none) on write calls of the episode's tools whose
  target arguments carry probe values;

and, per profile, the memory written back (every user's items; compared without the time each
was written, which write-back takes from the clock). Run it once per tree and compare
the two outputs (`--compare A B`): identical files mean the same behaviour on these episodes.

    PYTHONPATH=<tree> .venv/bin/python benchmarks/harness_ab.py --out A.json [--limit 200]
    .venv/bin/python benchmarks/harness_ab.py --compare A.json B.json
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from qpa.contract import Task, ToolCall, ToolSpec
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.agent import HarnessPlanner
from qpa.harness.backends.base import ChatMessage, Completion
from qpa.harness.backends.scripted import OracleBackend
from qpa.harness.memory import MemoryStore
from qpa.harness.provenance import Origin, is_target_key, strings
from qpa.harness.runner import run_episode

MAX_PROBES = 400  # probe values per episode (the first, in the order the episode met them)
WRITE_PROBES = 12  # probe values tried per target argument of a write tool
_DIGIT_RUN = re.compile(r"\d{3,}")
_WORD = re.compile(r"[A-Za-z]{4,}")


class RecordingBackend:
    """Wraps a backend and writes down every prompt it is sent."""

    def __init__(self, inner: OracleBackend) -> None:
        self.inner = inner
        self.prompts: list[dict[str, Any]] = []

    def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        self.prompts.append(
            {
                "messages": [m.model_dump(mode="json") for m in messages],
                "tools": [t.name for t in tools],
            }
        )
        return self.inner.complete(messages, tools)


def _origin(origin: Origin | None) -> dict[str, Any] | None:
    return None if origin is None else asdict(origin)


def _probes(trajectory: Any) -> list[str]:
    """Strings of the episode's results and arguments, and pieces cut from them."""
    seen: dict[str, None] = {}
    for step in trajectory.steps:
        values = [v for _, v in strings(step.feedback.observation)]
        if isinstance(step.action, ToolCall):
            values += [v for _, v in strings(step.action.arguments)]
        for value in values:
            for piece in (
                value,
                *_DIGIT_RUN.findall(value),
                *(run[-7:] for run in _DIGIT_RUN.findall(value.replace("-", ""))),
                *_WORD.findall(value)[:3],
                *(value.rsplit("@", 1)[1:] if "@" in value else ()),
            ):
                if piece.strip() and len(seen) < MAX_PROBES:
                    seen.setdefault(piece, None)
    return list(seen)


def _episode(env: SandboxEnv, task: Task, memory: MemoryStore) -> dict[str, Any]:
    backend = RecordingBackend(OracleBackend(task))
    planner = HarnessPlanner(backend, memory=memory)  # type: ignore[arg-type]
    trajectory = run_episode(env, task, planner)
    record = trajectory.model_dump(mode="json")
    for step in record["steps"]:
        step.pop("duration_ms", None)
    record["totals"].pop("wall_time_s", None)
    record.pop("started_at", None)
    record.pop("ended_at", None)
    out: dict[str, Any] = {"task": task.id, "prompts": backend.prompts, "trajectory": record}
    guard = getattr(planner, "guard", None)
    if guard is None:
        return out
    ledger = guard.ledger
    probes = _probes(trajectory)
    out["origins"] = [
        [
            p,
            _origin(ledger.trace(p)),
            _origin(ledger.trace(p, loose=True)),
            _origin(ledger.related_to_free_text(p)),
            _origin(ledger.copied_prose(p, f"see {p} here")),
        ]
        for p in probes
    ]
    verdicts = []
    for spec in guard.tools.values():
        if spec.side_effect == "read":
            continue
        for key in spec.parameters.get("properties") or {}:
            if not is_target_key(key):
                continue
            step = max(1, len(probes) // WRITE_PROBES)
            for value in probes[::step][:WRITE_PROBES]:
                refusal = guard.check(ToolCall(tool=spec.name, arguments={key: value}))
                verdicts.append([spec.name, key, value, refusal and refusal.message])
    out["verdicts"] = verdicts
    return out


def run(limit: int, profiles: list[str]) -> dict[str, Any]:
    env = SandboxEnv()
    result: dict[str, Any] = {}
    for profile in profiles:
        suite = generate_suite(profile=profile)
        stride = max(1, len(suite) // limit)
        tasks = [t for t in suite[::stride] if t.reference_plan][:limit]
        memory = MemoryStore(":memory:")
        episodes = [_episode(env, task, memory) for task in tasks]
        users = sorted({t.user.user_id for t in tasks})
        written = {u: [i.model_dump(mode="json") for i in memory.items(u)] for u in users}
        result[profile] = {"episodes": episodes, "memory": written}
    return result


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _untimed(memory: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Memory items without the time they were written (write-back stamps the clock's)."""
    return {
        u: [{k: v for k, v in i.items() if k != "time"} for i in items]
        for u, items in memory.items()
    }


def compare(a_path: str, b_path: str) -> int:
    a, b = (orjson.loads(Path(p).read_bytes()) for p in (a_path, b_path))
    differences = 0
    for profile in sorted(set(a) | set(b)):
        pa, pb = a.get(profile), b.get(profile)
        if pa is None or pb is None:
            print(f"{profile}: only in one run")
            differences += 1
            continue
        ea, eb = pa["episodes"], pb["episodes"]
        same = sum(_digest(x) == _digest(y) for x, y in zip(ea, eb, strict=False))
        counts = {
            "prompts": sum(len(e["prompts"]) for e in ea),
            "steps": sum(len(e["trajectory"]["steps"]) for e in ea),
            "origins": sum(len(e.get("origins", ())) for e in ea),
            "verdicts": sum(len(e.get("verdicts", ())) for e in ea),
            "refusals": sum(1 for e in ea for v in e.get("verdicts", ()) if v[3]),
        }
        memory_same = _digest(_untimed(pa["memory"])) == _digest(_untimed(pb["memory"]))
        print(
            f"{profile}: {same}/{max(len(ea), len(eb))} episodes identical; memory written back "
            f"{'identical' if memory_same else 'DIFFERS'}; compared {counts}"
        )
        for x, y in zip(ea, eb, strict=False):
            if _digest(x) != _digest(y):
                keys = sorted(set(x) | set(y))
                parts = [k for k in keys if _digest(x.get(k)) != _digest(y.get(k))]
                print(f"  differs: {x['task']} in {parts}")
        differences += (max(len(ea), len(eb)) - same) + (not memory_same)
    return 1 if differences else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--limit", type=int, default=200, help="episodes per profile")
    parser.add_argument("--profiles", default="phone,default", help="world profiles")
    parser.add_argument("--out", help="where to write this tree's record (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two records")
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.out:
        parser.error("--out or --compare is required")
    record = run(args.limit, args.profiles.split(","))
    Path(args.out).write_bytes(orjson.dumps(record, option=orjson.OPT_SORT_KEYS))


if __name__ == "__main__":
    main()
