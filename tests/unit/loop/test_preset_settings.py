"""`qpa loop --set KEY=VALUE` (`LoopPreset.with_settings`): one setting of a preset changed by
its dotted path, the whole preset validated again, and every bad assignment refused with a
message naming the path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qpa.loop.presets import get_preset


def test_settings_are_set_by_dotted_path_as_json_or_string() -> None:
    preset = get_preset("local")
    changed = preset.with_settings(
        ["rl.beta=0.05", "round2.pool=learnable", "rl.sampling.refill_rounds=2", "seed=7"]
    )
    assert changed.rl.beta == 0.05
    assert changed.round2.pool == "learnable"
    assert changed.rl.sampling.refill_rounds == 2
    assert changed.seed == 7
    # everything else as it was, and the preset given is left alone
    assert changed.sft == preset.sft and changed.rl.steps == preset.rl.steps
    assert preset.rl.beta == 0.0 and preset.round2.pool == "mixture"
    assert preset.with_settings([]) == preset


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("rl.beta", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("rl.betta=0.1", "the preset has no setting rl.betta"),
        ("nothing.beta=0.1", "nothing is not a section"),
        ("rl.beta.x=1", "rl.beta is not a section"),
        ("rl.beta=-1", "rl.beta: Input should be greater than or equal to 0"),
        ("round2.pool=everything", "round2.pool: Input should be 'mixture' or 'learnable'"),
        ("rl.steps=many", "rl.steps: Input should be a valid integer"),
        ("rl.care.format_weight=0.5", "rl.care: Value error, progressWeight + formatWeight"),
    ],
)
def test_a_bad_assignment_is_refused_naming_its_setting(assignment: str, message: str) -> None:
    with pytest.raises(ValueError, match="--set") as caught:
        get_preset("local").with_settings([assignment])
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "read"),
    [
        ("rl.beta", lambda config: config.loss.beta),
        ("rl.care.format_weight", lambda config: config.care.format_weight),
    ],
)
def test_the_rl_stage_trains_with_the_setting_set(
    setting: str, read: Callable[[Any], float], tmp_path: Path
) -> None:
    from qpa.loop.stages import rl_config

    preset = get_preset("local")
    for value in (0.0, 0.1):
        chosen = preset.with_settings([f"{setting}={value}"])
        config = rl_config(tmp_path, chosen, tmp_path / "sft", chosen.harness, seed=0)
        assert read(config) == value
        assert config.care.progress_weight == preset.rl.care.progress_weight


def test_the_mix_stage_hands_day_swaps_to_the_mixture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import qpa.data.mix
    from qpa.loop.stages import _mix

    seen: list[Any] = []

    def capture(store: Any, inputs: Any, config: Any, **_: Any) -> Any:
        seen.append(config)
        raise RuntimeError("captured")

    monkeypatch.setattr(qpa.data.mix, "mix", capture)
    for value in (False, True):
        chosen = get_preset("local").with_settings([f"mix.day_swaps={str(value).lower()}"])
        with pytest.raises(RuntimeError, match="captured"):
            _mix(
                types.SimpleNamespace(preset=chosen, seed=0),  # type: ignore[arg-type]
                [],
                tmp_path / "mix",
                target_size=10,
                harness=chosen.harness,
                include_failures=True,
            )
        assert seen[-1].day_swaps is value
