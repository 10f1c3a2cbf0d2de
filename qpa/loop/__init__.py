"""The closed AI-for-AI loop in one process: `qpa loop --preset local|small|cluster`.

Data (generate, collect, curate, mix) -> SFT -> evaluate -> diagnose -> Harness revision and
tasks for the weaknesses -> CARE RL -> evaluate, each stage resumable under `DIR/stages/`, one
report (`DIR/report.json`, `DIR/report.md`). `presets` holds the settings, `stages` the stage
functions and their done-markers, `run` the orchestrator, `report` the report, `cluster` the
same loop as Kubernetes resources. Heavy dependencies (torch, transformers) load when a stage
runs, not on import.
"""

from qpa.loop.presets import PRESET_NAMES, LoopPreset, get_preset

__all__ = ["PRESET_NAMES", "LoopPreset", "get_preset"]
