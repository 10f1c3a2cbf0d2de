"""docs/vocabulary.md is true: each concept's CRD field, CLI flag and Python attribute exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from qpa.api import resource_for_kind
from qpa.cli import app

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "vocabulary.md"


def rows() -> list[list[str]]:
    text = DOC.read_text()
    start, end = text.index("<!-- vocabulary:begin"), text.index("<!-- vocabulary:end -->")
    lines = [line for line in text[start:end].splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def code(cell: str) -> str | None:
    match = re.search(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def crd_has(kind: str, path: str) -> bool:
    info = resource_for_kind(kind).info
    crd = yaml.safe_load((ROOT / "crds" / f"qpa.ai_{info.plural}.yaml").read_text())
    node: Any = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in path.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return False
    return True


def command_flags(words: list[str]) -> set[str]:
    group: Any = typer.main.get_command(app)
    for word in words:
        group = group.commands[word]
    return {opt for param in group.params for opt in getattr(param, "opts", [])}


ROWS = rows()


def test_the_table_is_there() -> None:
    assert len(ROWS) >= 15


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_each_name_exists_where_the_table_says(row: list[str]) -> None:
    concept, crd, cli, python = row
    path = code(crd)
    if path and path.startswith("spec."):
        kind = crd.split()[0]
        assert crd_has(kind, path), f"{concept}: {kind} has no {path}"
    flag = code(cli)
    if flag:
        words = flag.split()
        assert words[0] == "qpa"
        assert words[-1] in command_flags(words[1:-1]), f"{concept}: no {flag}"
    target = code(python)
    assert target, f"{concept}: no Python attribute"
    module_path, cls_name, attribute = target.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_path), cls_name)
    fields = getattr(cls, "model_fields", {})
    assert attribute in fields or hasattr(cls, attribute), f"{concept}: no {target}"
