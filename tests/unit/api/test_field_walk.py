"""Every spec field of every kind changes what a pod does, what the operator creates, or what
the operator decides; docs/operator.md shows the table the walk prints (tools/field_walk.py)."""

from __future__ import annotations

import re
from pathlib import Path

from field_walk import OPERATOR_FIELDS, ROOT, TABLE_BEGIN, TABLE_END, table, walk_all

EFFECTS = walk_all()


def test_no_spec_field_is_accepted_and_ignored() -> None:
    idle = [f"{e.kind} {e.path}: {e.problem}" for e in EFFECTS if e.none]
    assert not idle, "fields nothing reads:\n" + "\n".join(idle)
    walked = {(e.kind, e.path) for e in EFFECTS}
    assert ("RolloutPool", "spec.sessionsPerPod") in walked  # the walk reaches leaves
    assert len({e.kind for e in EFFECTS}) >= 3


def test_fields_only_the_operator_acts_on_are_read_where_the_table_says() -> None:
    files = [
        *Path(ROOT, "operator").rglob("*.py"),
        *Path(ROOT, "qpa", "release").rglob("*.py"),
        Path(ROOT, "qpa", "bench", "gate.py"),
    ]
    sources = "\n".join(path.read_text() for path in files)
    for effect in EFFECTS:
        if not effect.operator or effect.pod or effect.children:
            continue
        leaf = effect.path.rsplit(".", 1)[-1]
        snake = re.sub(r"(?<!^)([A-Z])", r"_\1", leaf).lower()
        assert re.search(rf"\b{snake}\b", sources), f"{effect.path} is read nowhere in the operator"
    assert set(OPERATOR_FIELDS) <= {e.kind for e in EFFECTS}


def test_the_docs_carry_the_current_table() -> None:
    doc = (ROOT / "docs" / "operator.md").read_text()
    start, end = doc.index(TABLE_BEGIN) + len(TABLE_BEGIN), doc.index(TABLE_END)
    assert doc[start:end].strip() == table(EFFECTS).strip(), (
        "docs/operator.md is stale: run `.venv/bin/python tools/field_walk.py --write`"
    )
