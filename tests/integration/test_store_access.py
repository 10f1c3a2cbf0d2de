"""Reports are read with the store Secret of the release's own namespace, inside its prefix.

Against a real S3 server (SeaweedFS, `fakes.seaweed`): the HarnessRelease handler's `observe`
reads a release's `report.json` with the keys of the Secret in the release's namespace (the
operator's own environment holds other, wrong keys), asks for no other Secret, and a release
in namespace A whose `reportUri` points at namespace B's prefix is refused before anything,
Secret or report, is read: the state machine rolls it back (`OutsideStorePrefix`, naming the
field) and schedules no pod. A stand-in client answers the Secret reads and records them.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.operator_runner import example
from helpers.release_reports import report_bytes
from qpa_operator import release
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders.common import Defaults
from qpa_operator.builders.storeaccess import OutsideStorePrefix
from qpa_operator.handlers import harnessrelease as handler

from qpa.api import parse_resource
from qpa.api.v1alpha1 import HarnessReleaseStatus
from qpa.store import open_store

GOOD = report_bytes({"tool_use": 8, "memory": 8, "skills": 8, "subagent": 8})


class SecretsClient:
    """The API client's `get` for Secrets: answers from a dict and records every read."""

    def __init__(self, secrets: dict[tuple[str, str], tuple[str, str]]) -> None:
        self.secrets = secrets
        self.reads: list[tuple[str, str, str | None, str]] = []

    async def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Any:
        self.reads.append((api_version, plural, namespace, name))
        keys = self.secrets.get((str(namespace), name))
        if keys is None:
            return None
        encode = lambda v: base64.b64encode(v.encode()).decode()  # noqa: E731
        return {"data": {"accessKeyId": encode(keys[0]), "secretAccessKey": encode(keys[1])}}


def release_in(namespace: str, report_uri: str, endpoint: str) -> Any:
    body = example("harnessrelease.yaml")
    body["metadata"] = {"name": "planner", "namespace": namespace, "uid": "uid-1", "generation": 1}
    spec = body["spec"]
    spec["reportUri"] = report_uri
    spec["model"]["uri"] = f"s3://{report_uri.split('/')[2]}/{namespace}/models/a/"
    spec["store"] = {"endpoint": endpoint, "secretRef": {"name": "qpa-store"}}
    spec["gate"] = {"minOverall": 0.5, "minSamples": 1, "minTasks": 10}
    return parse_resource(body)


def observe(hr: Any, client: SecretsClient, defaults: Defaults, monkeypatch: Any) -> Any:
    """The handler's observe, with the candidate's benchmark Job complete."""
    runtime = SimpleNamespace(client=client, defaults=defaults)

    async def current() -> Any:
        return runtime

    monkeypatch.setattr(handler, "runtime", current)
    monkeypatch.setattr(release, "wants_report", lambda *_: True)
    views = SimpleNamespace(child=lambda *_: None)
    return asyncio.run(handler.observe(hr, views))  # type: ignore[arg-type]


def test_the_report_is_read_with_the_namespaces_secret_not_the_operators(
    seaweed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = seaweed.bucket
    defaults = Defaults(
        store_prefix=f"s3://{bucket}/{{namespace}}/", readable_secrets=("qpa-store",)
    )
    # the operator's own environment: keys that S3 refuses (they must never be used)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "operator-own-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-own-secret")
    hr = release_in("team-a", f"s3://{bucket}/team-a/releases/", seaweed.endpoint)
    folder = builder.report_prefix(hr, defaults)
    open_store(folder, seaweed.store_config()).put_bytes("report.json", GOOD)
    client = SecretsClient({
        ("team-a", "qpa-store"): (seaweed.access_key, seaweed.secret_key),
        ("team-b", "qpa-store"): ("wrong", "wrong"),
    })  # fmt: skip
    observed = observe(hr, client, defaults, monkeypatch)
    assert observed.refused is None and observed.report_problem is None
    assert observed.verdict is not None and observed.verdict.passed
    assert observed.verdict.report_uri == folder + "report.json"
    assert client.reads == [("v1", "secrets", "team-a", "qpa-store")]

    # the namespace's Secret holding keys S3 refuses: no fallback to anything else
    client = SecretsClient({("team-a", "qpa-store"): ("wrong", "wrong")})
    observed = observe(hr, client, defaults, monkeypatch)
    assert observed.verdict is None or not observed.verdict.passed
    # a Secret name the operator may not read is refused before asking
    strict = Defaults(store_prefix=defaults.store_prefix, readable_secrets=("other",))
    client = SecretsClient({("team-a", "qpa-store"): (seaweed.access_key, seaweed.secret_key)})
    observed = observe(hr, client, strict, monkeypatch)
    assert client.reads == [] and observed.verdict is None
    assert "spec.store.secretRef.name 'qpa-store'" in str(observed.report_problem)


def test_a_report_uri_in_another_namespaces_prefix_is_refused_and_nothing_read(
    seaweed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = seaweed.bucket
    defaults = Defaults(store_prefix=f"s3://{bucket}/{{namespace}}/")
    victim = f"s3://{bucket}/team-b/releases/"
    hr = release_in("team-a", victim, seaweed.endpoint)
    # team-b's report exists, and team-a's Secret could read it
    open_store(builder.report_prefix(hr, defaults), seaweed.store_config()).put_bytes(
        "report.json", GOOD
    )
    client = SecretsClient({("team-a", "qpa-store"): (seaweed.access_key, seaweed.secret_key)})
    observed = observe(hr, client, defaults, monkeypatch)
    assert client.reads == [] and observed.verdict is None  # no Secret, no report read
    assert observed.refused is not None and observed.refused.startswith(
        f"spec.reportUri {victim!r}"
    )
    assert f"s3://{bucket}/team-a/" in observed.refused

    decision = release.next_step(hr, observed, defaults)
    status = decision.status
    assert status.phase == "RolledBack"
    (rejected,) = [c for c in status.conditions if c.type == "Rejected"]
    assert (rejected.status, rejected.reason) == ("True", "OutsideStorePrefix")
    assert "spec.reportUri" in rejected.message
    desired = release.children(hr, status, defaults)
    assert desired.apply == ()  # no InferenceService, no benchmark Job
    with pytest.raises(OutsideStorePrefix, match=r"spec\.reportUri"):
        release.children(hr, HarnessReleaseStatus(phase="Benchmarking"), defaults)
    # inside its own prefix the same release is not refused
    own = release_in("team-a", f"s3://{bucket}/team-a/releases/", seaweed.endpoint)
    assert (
        release.next_step(own, release.Observed(now=datetime.now(UTC)), defaults).status.phase
        == "Deploying"
    )
