"""What a provenance ledger answers for a list of values: every trace the guard can ask.

Two ledgers that must behave alike (memoised or not, lazy or eager) are compared on these.
"""

from __future__ import annotations

from typing import Any

from qpa.harness.provenance import ProvenanceLedger


def ledger_answers(ledger: ProvenanceLedger, values: list[str]) -> list[tuple[Any, ...]]:
    """Per value: its strict and loose trace, its free-text relation and its copied prose."""
    return [
        (
            ledger.trace(v),
            ledger.trace(v, loose=True),
            ledger.related_to_free_text(v),
            ledger.copied_prose(v, f"see {v} here"),
        )
        for v in values
    ]
