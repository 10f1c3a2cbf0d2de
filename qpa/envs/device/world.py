"""What a device task asks of the phone before it starts: `task.world["_device"]`.

    {"_device": {"packages": ["com.qpa.messages"],       # force-stopped and cleared each reset
                 "start": "com.qpa.messages",            # launched after the reset (else home)
                 "seed": {"content://com.qpa.messages.provider/messages":
                          [{"address": "Bob", "body": "Dinner at 8?", "type": "inbox"}]}}}

Seed rows are inserted with `content insert --uri URI --bind COLUMN:TYPE:VALUE` after the
packages are cleared, so every episode starts from the same provider state.
"""

from __future__ import annotations

import shlex
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from qpa.envs.device.actions import PACKAGE

WORLD_KEY = "_device"
Package = Annotated[str, StringConstraints(pattern=PACKAGE.pattern)]
ContentUri = Annotated[str, StringConstraints(pattern=r"^content://[A-Za-z0-9_.]+(/[\w.\-/]*)?$")]
Column = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Value = bool | int | float | str


class DeviceWorld(BaseModel):
    """The phone state a device task starts from."""

    model_config = ConfigDict(extra="forbid")

    packages: list[Package] = Field(default_factory=list)
    start: Package | None = None
    seed: dict[ContentUri, list[dict[Column, Value]]] = Field(default_factory=dict)

    @field_validator("seed")
    @classmethod
    def _rows_not_empty(
        cls, value: dict[str, list[dict[str, Value]]]
    ) -> dict[str, list[dict[str, Value]]]:
        for uri, rows in value.items():
            if any(not row for row in rows):
                raise ValueError(f"seed rows of {uri} must name at least one column")
        return value


def _bind(column: str, value: Value) -> str:
    if isinstance(value, bool):
        kind, text = "b", str(value).lower()
    elif isinstance(value, int):
        kind, text = "i", str(value)
    elif isinstance(value, float):
        kind, text = "d", repr(value)
    else:
        kind, text = "s", value
    return shlex.quote(f"{column}:{kind}:{text}")


def seed_commands(world: DeviceWorld) -> list[str]:
    """One `content insert` line per seed row, in order."""
    return [
        f"content insert --uri {shlex.quote(uri)} "
        + " ".join(f"--bind {_bind(column, value)}" for column, value in row.items())
        for uri, rows in world.seed.items()
        for row in rows
    ]
