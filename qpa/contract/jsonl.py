"""JSON Lines I/O for contract models, streaming in constant memory.

Every producer writes and every consumer reads trajectories (and task files) through these
functions. A corrupt line raises `CorruptLineError` naming the file and the 1-based line number.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TypeVar

from pydantic import BaseModel, ValidationError

from qpa.contract.models import Task, Trajectory

M = TypeVar("M", bound=BaseModel)


class CorruptLineError(ValueError):
    """A JSON Lines file holds a line that is not valid JSON or does not fit the model."""

    def __init__(self, source: str, line_no: int, reason: str) -> None:
        self.source = source
        self.line_no = line_no
        self.reason = reason
        super().__init__(f"{source}:{line_no}: corrupt line: {reason}")


def iter_models(stream: IO[str], model: type[M], source: str = "<stream>") -> Iterator[M]:
    """Yield one model per non-blank line of `stream`."""
    for line_no, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            yield model.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<line>"
            raise CorruptLineError(source, line_no, f"{where}: {first.get('msg')}") from exc


def read_models(path: str | Path, model: type[M]) -> Iterator[M]:
    """Stream models from a JSON Lines file."""
    with open(path, encoding="utf-8") as stream:
        yield from iter_models(stream, model, str(path))


def write_models(path: str | Path, items: Iterable[BaseModel], *, append: bool = False) -> int:
    """Write models as JSON Lines (one flush per line, so a crash loses at most one line)."""
    count = 0
    with open(path, "a" if append else "w", encoding="utf-8") as stream:
        for item in items:
            stream.write(item.model_dump_json() + "\n")
            stream.flush()
            count += 1
    return count


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    return read_models(path, Trajectory)


def write_trajectories(
    path: str | Path, items: Iterable[Trajectory], *, append: bool = False
) -> int:
    return write_models(path, items, append=append)


def read_tasks(path: str | Path) -> Iterator[Task]:
    return read_models(path, Task)


def write_tasks(path: str | Path, items: Iterable[Task], *, append: bool = False) -> int:
    return write_models(path, items, append=append)
