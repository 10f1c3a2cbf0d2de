"""Offline failure diagnosis: model-side, Harness-side or environment-side, and why.

`diagnose(trajectory)` attributes one failed trajectory (`attribution`); `diagnose_dir(DIR)`
reads `DIR/trajectories.jsonl` and writes `DIR/diagnosis.json` and `DIR/diagnosis.md`
(`report`). `faults` injects Harness and environment faults to measure the attribution's
accuracy; it is not used by the diagnosis itself.
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

__all__ = [
    "CAUSES",
    "SIDES",
    "Diagnosis",
    "Side",
    "diagnose",
    "extract_calls",
    "skills_needed",
]
