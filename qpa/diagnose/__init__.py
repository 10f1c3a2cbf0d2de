"""Offline failure diagnosis: model-side, Harness-side or environment-side, and why.

`diagnose(trajectory)` attributes one failed trajectory (`attribution`, where the ordered rules
are documented); `diagnose_dir(DIR)` reads `DIR/trajectories.jsonl` and writes
`DIR/diagnosis.json` and `DIR/diagnosis.md` (`report`). `faults` injects Harness, environment
and model faults to measure the attribution's accuracy; the diagnosis never uses it.
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

__all__ = [
    "CAUSES",
    "SIDES",
    "CorruptLine",
    "DiagnoseError",
    "Diagnosis",
    "DiagnosisReport",
    "Side",
    "build_report",
    "diagnose",
    "diagnose_dir",
    "extract_calls",
    "skills_needed",
]
