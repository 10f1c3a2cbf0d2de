"""A task world the sandbox cannot hold is refused at reset, naming the field (the contract
suite found worlds that were installed silently or raised AttributeError)."""

from __future__ import annotations

from typing import Any

import pytest

from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.suite import generate_suite


@pytest.mark.parametrize(
    ("world", "field"),
    [
        ({"contacts": "x"}, "world.contacts:"),
        ({"no_such_app": {}}, "world.no_such_app:"),
        ({"contacts": {"contacts": "not a list"}}, "world.contacts.contacts:"),
        ({"contacts": {"contacts": [{"id": "c1"}, 7]}}, "world.contacts.contacts[1]:"),
    ],
)
def test_a_world_of_the_wrong_shape_is_refused(world: dict[str, Any], field: str) -> None:
    task = next(t for t in generate_suite() if t.apps == ["contacts"])
    env = SandboxEnv()
    refused = env.reset(task.model_copy(update={"world": world}))
    assert (refused.status, refused.error) == ("error", "invalid_arguments")
    assert refused.message.startswith(field), refused.message
    assert env.reset(task).status == "ok"  # the environment is still usable


def test_every_suite_world_passes_the_check() -> None:
    env = SandboxEnv()
    assert all(env.reset(t).status == "ok" for t in generate_suite())
