"""`benchmarks/gpu_smoke.py` starts and every step it drives works, on CPU.

The test runs the script as CI would, with `--device cpu --ranks 1 --jobs 2`: every step of the
default CPU run (RL through `qpa train rl`; ZeRO-2 and ZeRO-3 RL and SFT launched by
`qpa train launch`, SIGKILLed after their first checkpoint and resumed with `--resume`; the RL
update of a Qwen3-shaped model on a packed episode; the test-split evaluation), but each ZeRO
run with one gloo rank instead of two and two of them at a time: 16 instead of 24 heavy
processes (the imports of torch, transformers and DeepSpeed are most of their cost). Measured:
96 s of CPU time (user + sys) against ~150 s for the two-rank default, so under a minute on two
idle cores; 114 s, 178 s and 384 s of wall time on this machine while other jobs kept its
load average at 6-11. The two-rank default is what `gpu_smoke.py` runs with no arguments (its
numbers are in docs/gpu-cluster.md); multi-rank equivalence has its own tests
(tests/integration/test_multirank.py). Also: the wheel list for a GPU node leaves torch and the
CUDA libraries to the node.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("trl")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_smoke.py"
STEPS = [
    "prepare",
    "rl",
    "qwen3-update",
    "zero2-rl",
    "zero3-rl",
    "zero2-sft",
    "zero3-sft",
    "eval-test",
]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(900)  # ~60-90 s on two idle cores; a machine shared with others is slower
def test_gpu_smoke_runs_every_step_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--ranks", "1", "--jobs", "2",
         "--out", str(out), "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=880,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    document = json.loads((out / "gpu_smoke.json").read_text())
    assert document["ok"] is True and document["device"] == "cpu"
    assert document["profile"]["backend"] == "gloo" and document["profile"]["world_size"] == 1
    steps = {s["name"]: s for s in document["steps"]}
    assert [s["name"] for s in document["steps"]] == STEPS
    for name, step in steps.items():
        assert step["ok"] is True and step["error"] is None, (name, step["error"])
        assert step["seconds"] > 0, name
    # the table names every step with its result
    table = done.stdout[done.stdout.index("step ") :]
    for name in STEPS:
        assert any(line.split()[:2] == [name, "ok"] for line in table.splitlines()), name

    rl = steps["rl"]["figures"]
    assert rl["device"] == "cpu" and rl["dtype"] == "float32" and rl["steps"] == 2
    assert rl["rl_s_per_step"] > 0 and rl["tokens_per_s"] > 0
    for kind in ("rl", "sft"):
        for stage in (2, 3):
            figures = steps[f"zero{stage}-{kind}"]["figures"]
            assert figures["backend"] == "gloo" and figures["world_size"] == 1
            # killed after its first checkpoint, resumed from it, to the same final step
            assert figures["killed_after_step"] == figures["resumed_from"] == 1
            assert figures["final_step"] == 2
            if kind == "rl":
                assert figures["rl_s_per_step"] > 0
    update = steps["qwen3-update"]["figures"]
    assert update["shape"] == "Qwen3-small" and update["tokens"] == 256
    assert 0 < update["trained_tokens"] < update["tokens"]  # prompt and feedback carry no loss
    assert update["tokens_per_s"] > 0 and update["peak_rss_gib"] > 0
    evaluation = steps["eval-test"]["figures"]
    assert evaluation["device"] == "cpu" and evaluation["tasks"] == 4
    assert evaluation["model"] == "rl final"
    assert 0.0 <= evaluation["success"] <= 1.0
    report = json.loads((tmp_path / "work" / "eval" / "report.json").read_text())
    assert report["split"] == "test"


def test_wheel_list_leaves_torch_to_the_node() -> None:
    smoke = load_script()
    pins = smoke.locked_requirements("3.12")
    names = {p.split("==")[0] for p in pins}
    assert {"deepspeed", "trl", "transformers", "datasets", "pydantic", "typer"} <= names
    assert not any(smoke.EXCLUDED_FROM_WHEELS.match(n) for n in names)
    assert "qpa" not in names and all("==" in p for p in pins)


def test_a_kill_reaches_ranks_in_sessions_of_their_own(tmp_path: Path) -> None:
    """torchrun starts each rank with `start_new_session=True`: killing the launcher's process
    group alone leaves the ranks running (and writing checkpoints into the resumed run)."""
    import time

    smoke = load_script()
    pid_file = tmp_path / "rank.pid"
    launcher = subprocess.Popen(
        ["bash", "-c", f"setsid sleep 60 & echo $! > {pid_file}; wait"],
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the stand-in rank never started"
        time.sleep(0.02)
    rank = int(pid_file.read_text())
    assert rank in smoke.descendants(launcher.pid)
    smoke.kill_group(launcher)
    assert launcher.returncode == -9
    deadline = time.monotonic() + 5
    while Path(f"/proc/{rank}").exists() and "Z" not in _state(rank):
        assert time.monotonic() < deadline, "the rank outlived the kill"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_packed_episode_and_printed_result() -> None:
    smoke = load_script()
    from qpa.train.rl import build_samples

    turns = smoke.packed_turns(300, vocab=1000)
    (sample,) = build_samples(turns, 1.0, pack=True)  # one sequence: each prompt extends the last
    assert len(sample.input_ids) == 300
    completions = sum(len(t.completion_ids) for t in turns)
    assert sum(sample.mask) == sample.trained_tokens == completions < 300 - sample.prompt_len
    text = 'log line\n{"a": 1}\nmore\n{\n  "final_step": 3\n}\ntrailing'
    assert smoke.last_json(text) == {"final_step": 3}
    with pytest.raises(smoke.SmokeFailure, match="no JSON"):
        smoke.last_json("nothing here")


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    import zipfile

    lines = [f"Name: {name}", f"Version: {version}", *[f"Requires-Dist: {r}" for r in requires]]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n\n")


def test_wheel_folder_completeness(tmp_path: Path) -> None:
    smoke = load_script()
    _wheel(tmp_path, "qpa", "0.1.0", [
        "pydantic>=2.7", 'trl>=1.16; extra == "train"', 'torch==2.13.0; extra == "train"',
        'kopf>=1.45; extra == "operator"',
    ])  # fmt: skip
    _wheel(tmp_path, "pydantic", "2.14.4", ['tomli; python_version < "3.11"'])
    _wheel(tmp_path, "trl", "1.16.0", ["accelerate>=1.4", "datasets>=3"])
    _wheel(tmp_path, "accelerate", "1.2.0", ["torch>=2.0", "nvidia-nccl-cu13"])
    assert smoke.unmet_requirements(tmp_path, "3.12") == [
        "trl needs accelerate>=1.4, carried accelerate==1.2.0",
        "trl needs datasets>=3 (not carried)",
    ]  # torch and the CUDA libraries are the node's; other extras and markers are not wanted
    (tmp_path / "accelerate-1.2.0-py3-none-any.whl").unlink()
    _wheel(tmp_path, "accelerate", "1.15.0", ["torch>=2.0"])
    _wheel(tmp_path, "datasets", "5.2.0", [])
    assert smoke.unmet_requirements(tmp_path, "3.12") == []
