"""Offline failure diagnosis: model-side, Harness-side or environment-side, and why.

`diagnose(trajectory)` attributes one failed trajectory (`attribution`, where the ordered rules
are documented); `diagnose_dir(DIR)` reads `DIR/trajectories.jsonl` and writes
`DIR/diagnosis.json` and `DIR/diagnosis.md` (`report`). What each tool does and which Skills came
with the tools are read from the trajectory (`tools`); no environment is imported. The fault
injection that measures the attribution's accuracy lives with the tests (`tests/helpers/faults.py`).
"""

from qpa.diagnose.attribution import (
    CAUSES,
    SIDES,
    Diagnosis,
    Side,
    diagnose,
    extract_calls,
    skills_needed,
)
from qpa.diagnose.report import (
    CorruptLine,
    DiagnoseError,
    DiagnosisReport,
    build_report,
    diagnose_dir,
)
from qpa.diagnose.tools import EpisodeTools, named_tools

__all__ = [
    "CAUSES",
    "SIDES",
    "CorruptLine",
    "DiagnoseError",
    "Diagnosis",
    "DiagnosisReport",
    "EpisodeTools",
    "Side",
    "build_report",
    "diagnose",
    "diagnose_dir",
    "extract_calls",
    "named_tools",
    "skills_needed",
]
