"""The HarnessRelease state machine (`qpa_operator.release`): pure transitions, every path.

A small `World` plays the cluster around the pure functions: it applies what `children()`
asks for (keeping spec hashes as the operator's `ensure` does), and the tests mark
InferenceServices Ready or failed and Jobs complete or failed, and hand in verdicts, as the
handler would after reading the report. No API server, no clock: time is passed in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from qpa_operator import release
from qpa_operator.builders import Defaults
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders.common import spec_hash_of

from qpa.api import HarnessRelease, parse_resource
from qpa.api.v1alpha1 import OVERRIDE_ANNOTATION, Scores
from qpa.release.verdict import Verdict

ROOT = Path(__file__).resolve().parents[3]
D = Defaults()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def hr_body(harness: str = "harness-v3", model: str = "s3://qpa/models/a/") -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / "harnessrelease.yaml").read_text())
    body["metadata"].update(namespace="team-a", uid="uid-planner", generation=1)
    body["spec"]["harness"]["version"] = harness
    body["spec"]["model"]["uri"] = model
    body["spec"]["canary"] = {"steps": [10, 50, 100], "stepSeconds": 60}
    # readiness-only canaries here (test_harnessrelease_serving.py has the live analysis)
    body["spec"]["rollout"].pop("analysis")
    return body


SCORES = Scores(overall=0.8, by_capability={"memory": 0.7, "tool_use": 0.9}, tasks=200, samples=2)


def passed(uri: str = "s3://qpa/releases/planner/x/report.json") -> Verdict:
    return Verdict(
        passed=True,
        kind="passed",
        reasons=[],
        report_uri=uri,
        scores=SCORES,
        stable_scores=Scores(overall=0.75, by_capability={"memory": 0.7, "tool_use": 0.85}),
        deltas={"overall": 0.05, "memory": 0.0, "tool_use": 0.05},
    )


def failed(kind: str = "gate_failed", *reasons: str) -> Verdict:
    return Verdict(
        passed=False,
        kind=kind,  # type: ignore[arg-type]
        reasons=list(reasons) or ["tool_use: 70.00% vs baseline 85.00% (-15.0 points; beyond)"],
        report_uri="s3://qpa/releases/planner/x/report.json",
        scores=SCORES if kind == "gate_failed" else None,
    )


@dataclass
class World:
    """The release resource and its live children, as an API server would hold them."""

    body: dict[str, Any]
    now: datetime = T0
    live: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[release.Event] = field(default_factory=list)
    last: release.Decision | None = None

    @property
    def hr(self) -> HarnessRelease:
        resource = parse_resource(copy.deepcopy(self.body))
        assert isinstance(resource, HarnessRelease)
        return resource

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    def child(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.live.get((kind, name))

    def observed(self, **extra: Any) -> release.Observed:
        hr = self.hr
        return release.Observed(
            now=self.now,
            model=self.child("InferenceService", builder.model_name(hr)),
            harness=self.child("InferenceService", builder.harness_name(hr)),
            bench=self.child("Job", builder.bench_job_name(hr, D)),
            **extra,
        )

    def step(self, **extra: Any) -> release.Decision:
        """One reconcile: decide, write the status, apply and prune the children."""
        hr = self.hr
        decision = release.next_step(hr, self.observed(**extra), D)
        self.last = decision
        self.events += decision.events
        self.body["status"] = decision.status.to_k8s()
        if decision.consume_override:
            self.body["metadata"].get("annotations", {}).pop(OVERRIDE_ANNOTATION, None)
        bench = self.child("Job", builder.bench_job_name(hr, D))
        desired = release.children(self.hr, decision.status, D, bench)
        for manifest in desired.apply:
            key = (manifest["kind"], manifest["metadata"]["name"])
            old = self.live.get(key)
            if old is None or spec_hash_of(old) != spec_hash_of(manifest):
                # As an API server: a new generation; the status stays until a controller
                # (the test) reports on the new generation.
                generation = int((old or {}).get("metadata", {}).get("generation", 0)) + 1
                self.live[key] = copy.deepcopy(manifest)
                self.live[key]["metadata"]["generation"] = generation
                if old is not None and "status" in old:
                    self.live[key]["status"] = old["status"]
        for key in list(self.live):
            if key not in desired.keep:
                del self.live[key]
        return decision

    # the cluster's controllers
    def ready(self, *names: str) -> None:
        for (kind, name), obj in self.live.items():
            if kind == "InferenceService" and (not names or name in names):
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }

    def fail_isvc(self, name: str) -> None:
        self.live[("InferenceService", name)]["status"] = {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "RevisionFailed",
                 "message": "CrashLoopBackOff"}
            ]
        }  # fmt: skip

    def job(self, **status: Any) -> None:
        self.live[("Job", builder.bench_job_name(self.hr, D))]["status"] = status

    def complete(self) -> None:
        self.job(
            conditions=[{"type": "Complete", "status": "True"}],
            completionTime=self.now.isoformat(),
        )

    def later(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def set_spec(self, harness: str, model: str | None = None) -> None:
        self.body["spec"]["harness"]["version"] = harness
        if model is not None:
            self.body["spec"]["model"]["uri"] = model
        self.body["metadata"]["generation"] += 1

    def annotate(self, value: str) -> None:
        self.body["metadata"].setdefault("annotations", {})[OVERRIDE_ANNOTATION] = value

    def isvcs(self) -> dict[str, dict[str, Any]]:
        return {name: obj for (kind, name), obj in self.live.items() if kind == "InferenceService"}

    def harness_traffic(self) -> int:
        obj = self.child("InferenceService", builder.harness_name(self.hr))
        assert obj is not None
        return int(obj["spec"]["predictor"]["canaryTrafficPercent"])

    def serves_stable(self) -> bool:
        """The Harness InferenceService is exactly the stable version's at 100%: no candidate
        left in its spec (a rollback restores the stable spec)."""
        obj = self.child("InferenceService", builder.harness_name(self.hr))
        stable = self.hr.status.stable if self.hr.status else None
        assert obj is not None and stable is not None
        expected = builder.harness_service(self.hr, D, stable, 100)
        return (
            obj["spec"] == expected["spec"]
            and obj["metadata"]["labels"][builder.VERSION_LABEL] == stable.id
            and spec_hash_of(obj) == spec_hash_of(expected)
        )

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]

    def conditions(self) -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c["reason"]) for c in self.status["conditions"]}


def first_release(world: World) -> None:
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=passed())
    assert world.status["phase"] == "Promoted"


def walk_canary(world: World) -> None:
    """Ready at each step, each step held: Canary to Promoted."""
    for _ in range(3):
        assert world.status["phase"] == "Canary"
        world.ready()
        world.later(60)
        world.step()
    assert world.status["phase"] == "Promoted"


# --------------------------------------------------------------------------- the happy paths


def test_a_first_release_is_deployed_benchmarked_and_promoted_without_a_canary() -> None:
    world = World(hr_body())
    decision = world.step()
    assert world.status["phase"] == "Deploying"
    assert world.status["candidate"]["harnessVersion"] == "harness-v3"
    assert set(world.isvcs()) == {builder.model_name(world.hr), "planner-harness"}
    assert world.harness_traffic() == 100  # nothing else serves
    assert not any(kind == "Job" for kind, _ in world.live)
    assert decision.wake_at == T0 + timedelta(seconds=1801)  # the deploy deadline

    world.ready(builder.model_name(world.hr))
    world.step()
    assert world.status["phase"] == "Deploying"  # the Harness is not Ready yet
    world.ready()
    world.step()
    assert world.status["phase"] == "Benchmarking"
    job = world.child("Job", builder.bench_job_name(world.hr, D))
    assert job is not None and job["spec"]["activeDeadlineSeconds"] == 21600
    assert world.status["benchmarkJob"] == job["metadata"]["name"]
    # Nothing is read until the Job completes.
    assert not release.wants_report(world.hr, job, D)

    world.complete()
    assert release.wants_report(world.hr, world.child("Job", job["metadata"]["name"]), D)
    world.step(verdict=passed())
    status = world.status
    assert status["phase"] == "Promoted" and status["decision"] == "promote"
    assert status["trafficPercent"] == 100
    assert status["stable"]["id"] == status["candidate"]["id"]
    assert status["stable"]["reportUri"] == "s3://qpa/releases/planner/x/report.json"
    assert status["scores"]["overall"] == 0.8 and status["deltas"]["tool_use"] == 0.05
    assert any("first release" in r for r in status["reasons"])
    assert status["reasons"][0].startswith("gate passed: overall 80.0% (+5.0 points)")
    assert world.reasons() == ["Deploying", "Benchmarking", "GatePassed", "Promoted"]
    assert world.conditions()["GatePassed"] == ("True", "GatePassed")
    assert world.conditions()["Promoted"] == ("True", "Promoted")
    # The finished benchmark Job stays for its logs; nothing is left to do.
    assert world.child("Job", job["metadata"]["name"]) is not None
    assert world.last is not None and world.last.wake_at is None


def test_a_better_candidate_goes_through_the_canary_steps_and_becomes_stable() -> None:
    world = World(hr_body())
    first_release(world)
    stable = world.status["stable"]
    old_model = builder.model_name(world.hr)

    world.set_spec("harness-v4", model="s3://qpa/models/b/")
    world.step()
    assert world.status["phase"] == "Deploying"
    new_model = builder.model_name(world.hr)
    assert new_model != old_model and set(world.isvcs()) >= {old_model, new_model}
    assert world.harness_traffic() == 0  # the candidate's revision has no traffic yet
    harness = world.child("InferenceService", "planner-harness")
    assert harness is not None and "--model-url" in str(harness["spec"])
    assert new_model in str(harness["spec"])  # the candidate Harness talks to its own model

    world.ready()
    world.step()
    world.complete()
    world.step(verdict=passed())
    assert world.status["phase"] == "Canary" and world.status["canaryStep"] == 0
    assert world.harness_traffic() == 10 and world.status["trafficPercent"] == 10

    # Not Ready at 10% yet: wait (up to the deploy deadline).
    decision = world.step()
    assert world.status["canaryStep"] == 0
    assert decision.wake_at == world.now + timedelta(seconds=1801)
    # Ready at 10%: the step is held stepSeconds, then 50%.
    world.ready()
    decision = world.step()
    assert world.status["canaryStep"] == 0
    assert decision.wake_at == world.now + timedelta(seconds=60)
    world.later(60)
    world.step()
    assert world.status["canaryStep"] == 1 and world.harness_traffic() == 50
    world.ready()
    world.later(60)
    world.step()
    assert world.harness_traffic() == 100
    world.step()
    assert world.status["phase"] == "Canary"
    world.ready()
    world.step()  # Ready at 100%: promoted
    status = world.status
    assert status["phase"] == "Promoted" and status["trafficPercent"] == 100
    assert status["stable"]["harnessVersion"] == "harness-v4"
    assert status["previous"]["id"] == stable["id"]
    assert status["stableScores"] == status["scores"]
    # The previous version's model stays deployed for a rollback.
    assert set(world.isvcs()) == {old_model, new_model, "planner-harness"}
    assert world.reasons()[-5:] == ["GatePassed", "Canary", "CanaryStep", "CanaryStep", "Promoted"]

    # A third promotion drops the model two versions back.
    world.set_spec("harness-v5", model="s3://qpa/models/c/")
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=passed())
    walk_canary(world)
    assert old_model not in world.isvcs() and new_model in world.isvcs()


def test_a_harness_only_candidate_shares_the_stable_model() -> None:
    world = World(hr_body())
    first_release(world)
    model = builder.model_name(world.hr)
    world.set_spec("harness-v4")
    world.step()
    assert builder.model_name(world.hr) == model
    assert set(world.isvcs()) == {model, "planner-harness"}
    # The stale Harness (still the stable's spec hash) does not count as the candidate's.
    world.step()
    assert world.status["phase"] == "Deploying"


# --------------------------------------------------------------------------- rollbacks


def test_a_capability_regression_rolls_back_with_every_reason() -> None:
    world = World(hr_body())
    first_release(world)
    stable_id = world.status["stable"]["id"]
    old_model = builder.model_name(world.hr)
    world.set_spec("harness-v4", model="s3://qpa/models/b/")
    world.step()
    candidate_model = builder.model_name(world.hr)
    world.ready()
    world.step()
    world.complete()
    reasons = ["tool_use: 70.0% vs 85.0% (-15.0 points; beyond)", "overall 60.0% < 70.0%"]
    world.step(verdict=failed("gate_failed", *reasons))
    status = world.status
    assert status["phase"] == "RolledBack" and status["decision"] == "rollback"
    assert status["reasons"] == reasons
    assert status["stable"]["id"] == stable_id and status["trafficPercent"] == 0
    assert world.conditions()["Rejected"] == ("True", "GateFailed")
    assert world.conditions()["GatePassed"] == ("False", "GateFailed")
    rejected = next(c for c in status["conditions"] if c["type"] == "Rejected")
    assert rejected["message"] == "; ".join(reasons)
    # The candidate's model is gone; the Harness serves the stable spec again, whole.
    assert candidate_model not in world.isvcs() and old_model in world.isvcs()
    assert world.serves_stable() and world.harness_traffic() == 100
    assert status["scores"]["overall"] == 0.8  # the numbers behind the decision are kept
    assert world.events[-1].warning and world.events[-1].reason == "RolledBack"


@pytest.mark.parametrize(
    ("verdict", "code"),
    [
        (failed("report_missing", "report s3://x/report.json: missing"), "ReportMissing"),
        (failed("report_corrupt", "report s3://x/report.json: corrupt JSON"), "ReportCorrupt"),
        (failed("stable_report_unreadable", "stable release: missing"), "StableReportUnreadable"),
    ],
)
def test_missing_or_broken_reports_never_promote(verdict: Verdict, code: str) -> None:
    world = World(hr_body())
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=verdict)
    assert world.status["phase"] == "RolledBack"
    assert world.conditions()["Rejected"] == ("True", code)
    # A first release rolled back leaves nothing serving.
    assert world.isvcs() == {}


def test_a_failed_benchmark_job_rolls_back() -> None:
    world = World(hr_body())
    world.step()
    world.ready()
    world.step()
    world.job(
        conditions=[
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}
        ]
    )  # fmt: skip
    world.step()
    assert world.status["phase"] == "RolledBack"
    assert world.conditions()["Rejected"] == ("True", "BenchmarkFailed")
    assert "BackoffLimitExceeded" in world.status["reasons"][0]
    assert "no promotion" in world.status["reasons"][0]
    # A failed Job is kept (finished) for its logs.
    assert world.child("Job", builder.bench_job_name(world.hr, D)) is not None


def test_deadlines_roll_back() -> None:
    world = World(hr_body())
    world.step()
    world.later(1801)
    world.step()
    assert world.conditions()["Rejected"] == ("True", "DeployTimeout")
    assert "not Ready within 1800 s" in world.status["reasons"][0]

    world = World(hr_body())
    world.step()
    world.ready()
    world.step()
    decision = world.step()
    assert decision.wake_at == world.now + timedelta(seconds=21600 + 600 + 1)
    world.later(22201)
    world.step()
    assert world.conditions()["Rejected"] == ("True", "BenchmarkTimeout")
    assert world.child("Job", builder.bench_job_name(world.hr, D)) is None  # unfinished: removed


def test_an_unreachable_store_is_retried_then_rolls_back() -> None:
    world = World(hr_body())
    world.step()
    world.ready()
    world.step()
    world.complete()
    problem = "report s3://x/report.json: store unavailable: connection refused"
    decision = world.step(report_problem=problem)
    assert world.status["phase"] == "Benchmarking"
    assert world.conditions()["BenchmarkDone"] == ("False", "ReportUnavailable")
    assert decision.wake_at == world.now + timedelta(seconds=release.REPORT_RETRY_SECONDS)
    world.later(300)
    world.step(report_problem=problem)  # still within reportSeconds of the first failure
    assert world.status["phase"] == "Benchmarking"
    world.later(301)
    world.step(report_problem=problem)
    assert world.status["phase"] == "RolledBack"
    assert world.status["reasons"] == [problem]


def test_a_completed_benchmark_not_read_yet_is_looked_at_again_never_rolled_back() -> None:
    # The handler observed before the phase was Benchmarking (an index behind): no verdict,
    # no problem. However old the Job's completion, that is no reason to give up.
    world = World(hr_body())
    world.step()
    world.ready()
    world.step()
    world.job(
        conditions=[{"type": "Complete", "status": "True"}],
        completionTime=(world.now - timedelta(days=30)).isoformat(),
    )
    decision = world.step()
    assert world.status["phase"] == "Benchmarking"
    assert decision.wake_at == world.now
    world.step(verdict=passed())
    assert world.status["phase"] == "Promoted"


def test_a_failed_revision_rolls_back_while_deploying_and_in_the_canary() -> None:
    world = World(hr_body())
    world.step()
    world.fail_isvc(builder.model_name(world.hr))
    world.step()
    assert world.conditions()["Rejected"] == ("True", "InferenceServiceFailed")
    assert "CrashLoopBackOff" in world.status["reasons"][0]

    world = World(hr_body())
    first_release(world)
    world.set_spec("harness-v4")
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=passed())
    assert world.status["phase"] == "Canary"
    world.fail_isvc("planner-harness")
    world.step()
    assert world.conditions()["Rejected"] == ("True", "CanaryFailed")
    assert world.serves_stable()


# --------------------------------------------------------------------------- overrides


def test_abort_rolls_back_an_active_release_and_is_consumed() -> None:
    world = World(hr_body())
    first_release(world)
    world.set_spec("harness-v4")
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=passed())
    assert world.status["phase"] == "Canary"
    world.annotate("abort")
    decision = world.step()
    assert decision.consume_override
    assert OVERRIDE_ANNOTATION not in world.body["metadata"]["annotations"]
    status = world.status
    assert status["phase"] == "RolledBack" and status["override"]["action"] == "abort"
    assert world.conditions()["Overridden"] == ("True", "Abort")
    assert world.conditions()["Rejected"] == ("True", "Aborted")
    assert world.serves_stable()
    assert "Override" in world.reasons()

    # Seen again before its removal reached the operator: already done, nothing new.
    world.annotate("abort")
    before, events = world.status, len(world.events)
    decision = world.step()
    assert decision.consume_override and world.status == before and len(world.events) == events

    # Abort on a promoted release changes nothing but says so.
    world = World(hr_body())
    first_release(world)
    world.annotate("ABORT ")
    before = world.status
    decision = world.step()
    assert decision.consume_override and world.status == before
    assert world.events[-1].reason == "OverrideIgnored" and world.events[-1].warning


def test_promote_overrules_a_failed_gate_and_skips_the_benchmark() -> None:
    world = World(hr_body())
    first_release(world)
    world.set_spec("harness-v4", model="s3://qpa/models/b/")
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=failed())
    assert world.status["phase"] == "RolledBack"
    assert builder.model_name(world.hr) not in world.isvcs()

    world.annotate("promote")
    world.step()
    status = world.status
    assert status["phase"] == "Deploying"  # the candidate comes back first
    assert status["override"]["action"] == "promote"
    assert world.conditions()["Overridden"] == ("True", "ForcePromote")
    assert builder.model_name(world.hr) in world.isvcs()
    world.ready()
    world.step()
    assert world.status["phase"] == "Canary"  # no new benchmark
    walk_canary(world)
    assert world.status["stable"]["harnessVersion"] == "harness-v4"
    assert any("override" in r for r in world.status["reasons"])


def test_manual_promotion_waits_for_the_annotation() -> None:
    body = hr_body()
    body["spec"]["promotion"] = "manual"
    world = World(body)
    world.step()
    world.ready()
    world.step()
    world.complete()
    world.step(verdict=passed())
    assert world.status["phase"] == "AwaitingPromotion"
    assert world.last is not None and world.last.wake_at is None
    world.step()
    assert world.status["phase"] == "AwaitingPromotion"
    world.annotate("promote")
    world.step()
    assert world.status["phase"] == "Promoted"  # first release: no canary to walk


def test_an_invalid_override_is_refused_with_a_warning() -> None:
    world = World(hr_body())
    world.annotate("yolo")
    decision = world.step()
    assert decision.consume_override
    assert world.status["phase"] == "Deploying"
    (invalid,) = [e for e in world.events if e.reason == "OverrideInvalid"]
    assert invalid.warning and "'yolo'" in invalid.message


# --------------------------------------------------------------------------- spec changes, restarts


def test_a_new_spec_supersedes_the_candidate_and_the_stable_spec_is_just_promoted() -> None:
    world = World(hr_body())
    first_release(world)
    stable = world.status["stable"]
    world.set_spec("harness-v4")
    world.step()
    world.ready()
    world.step()
    assert world.status["phase"] == "Benchmarking"
    old_job = builder.bench_job_name(world.hr, D)
    world.set_spec("harness-v5")
    world.step()
    assert world.status["phase"] == "Deploying" and "Superseded" in world.reasons()
    assert world.child("Job", old_job) is None  # the unfinished benchmark is stopped

    world.set_spec("harness-v3")  # back to the stable version
    world.step()
    status = world.status
    assert status["phase"] == "Promoted" and status["candidate"]["id"] == stable["id"]
    assert status["trafficPercent"] == 100 and world.harness_traffic() == 100
    assert "nothing to release" in status["reasons"][0]


def test_a_settled_release_decides_the_same_again_and_asks_for_nothing() -> None:
    world = World(hr_body())
    world.step()
    world.ready()
    world.step()
    settled = copy.deepcopy(world.body)
    live = copy.deepcopy(world.live)
    world.later(5)
    decision = world.step()
    assert world.body == settled and world.live == live  # what a restart would see and do
    assert decision.events == () and not decision.consume_override


def test_children_follow_the_status_alone() -> None:
    world = World(hr_body())
    first_release(world)
    hr = world.hr
    assert hr.status is not None
    desired = release.children(hr, hr.status, D)
    names = [m["metadata"]["name"] for m in desired.apply]
    # The stable model endpoint, the stable model, the Harness (the storage initializer's
    # account only once the handler derived its Secret).
    assert names == ["planner-model", builder.model_name(hr), "planner-harness"]
    endpoint, harness = desired.apply[0], desired.apply[2]
    assert endpoint["spec"]["selector"] == {
        "serving.kserve.io/inferenceservice": builder.model_name(hr)
    }
    assert ("ServiceAccount", "planner-model-storage") in desired.keep
    assert harness["metadata"]["annotations"][builder.TAG_ROUTING] == "true"
    assert harness["metadata"]["annotations"][builder.DEPLOYMENT_MODE] == "Serverless"
    assert harness["metadata"]["labels"][builder.VERSION_LABEL] == hr.status.stable.id  # type: ignore[union-attr]
    assert release.children(hr, None, D) == release.Desired((), frozenset())


def test_scores_read_in_one_line() -> None:
    line = release.score_line(SCORES, {"overall": 0.05, "tool_use": -0.02})
    assert line == "overall 80.0% (+5.0 points); memory 70.0%; tool_use 90.0% (-2.0 points)"


def test_gpu_models_land_on_gpu_nodes_and_the_default_store_reaches_the_benchmark() -> None:
    from qpa.api.v1alpha1 import ObjectStore

    store = ObjectStore.model_validate(
        {"endpoint": "http://minio:9000", "secretRef": {"name": "s3"}}
    )
    defaults = Defaults(gpu_node_selector=(("gpu", "h200"),), store=store)
    body = hr_body()
    body["spec"].pop("store")
    body["spec"]["reportUri"] = "s3://qpa/reports/"  # the operator's store: Defaults.store
    hr = parse_resource(body)
    assert isinstance(hr, HarnessRelease)
    predictor = builder.model_service(hr, defaults)["spec"]["predictor"]
    assert predictor["nodeSelector"] == {"gpu": "h200"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in predictor[
        "tolerations"
    ]
    job = builder.bench_job(hr, defaults)
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["QPA_S3_ENDPOINT"] == "http://minio:9000"
