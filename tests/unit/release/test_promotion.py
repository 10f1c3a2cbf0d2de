"""What a HarnessRelease's status allows to promote: only a version the gate passed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers.release_reports import judged_release

from qpa.api import HarnessRelease
from qpa.release.promotion import NotPromotable, promotable, score_lines


def parse(body: dict[str, Any]) -> HarnessRelease:
    return HarnessRelease.model_validate(body)


def test_a_promoted_release_gives_its_version_scores_and_report() -> None:
    promotion = promotable(parse(judged_release()))
    assert promotion.release == "planner" and promotion.phase == "Promoted"
    assert promotion.version.harness.version == "harness-v4"
    assert promotion.version.model.uri == "s3://qpa/models/b/"
    assert promotion.version.report_uri == "s3://qpa/releases/planner/abc/report.json"
    assert score_lines(promotion) == [
        "overall 85.0% (+5.0 points vs stable)",
        "memory 90.0% (+10.0 points vs stable)",
        "tool_use 80.0% (+0.0 points vs stable)",
        "40 tasks x 1 samples",
    ]


def test_awaiting_promotion_is_promotable_since_the_gate_passed() -> None:
    assert promotable(parse(judged_release(promotion="manual"))).phase == "AwaitingPromotion"


def test_a_rolled_back_release_is_refused_with_the_gates_reasons() -> None:
    with pytest.raises(NotPromotable) as caught:
        promotable(parse(judged_release(passed=False)))
    message = str(caught.value)
    assert message.startswith("the gate did not pass for ")
    assert "(GateFailed)" in message and "tool_use: 60.00% vs baseline 80.00%" in message


def test_an_undecided_or_stale_or_forced_release_is_refused() -> None:
    body = judged_release()
    undecided = copy.deepcopy(body)
    undecided["status"]["phase"] = "Benchmarking"
    for c in undecided["status"]["conditions"]:
        if c["type"] == "GatePassed":
            c.update(status="Unknown", reason="NotEvaluated")
    with pytest.raises(NotPromotable, match=r"has not passed \w+ \(phase Benchmarking"):
        promotable(parse(undecided))

    stale = copy.deepcopy(body)
    stale["metadata"]["generation"] = 2
    with pytest.raises(NotPromotable, match="status is for generation 1 but the spec is at 2"):
        promotable(parse(stale))

    other = copy.deepcopy(body)
    other["spec"]["harness"]["version"] = "harness-v5"
    with pytest.raises(NotPromotable, match="not the spec's Harness harness-v5"):
        promotable(parse(other))

    forced = copy.deepcopy(undecided)
    forced["status"]["phase"] = "Promoted"
    forced["status"]["override"] = {
        "action": "promote",
        "version": forced["status"]["candidate"]["id"],
        "at": "2026-01-01T00:00:00Z",
    }
    with pytest.raises(NotPromotable, match=r"went out by qpa\.ai/override=promote"):
        promotable(parse(forced))

    bare = copy.deepcopy(body)
    bare.pop("status")
    with pytest.raises(NotPromotable, match="has no status"):
        promotable(parse(bare))
