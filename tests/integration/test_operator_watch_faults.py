"""The operator converges with no duplicate child when the API server breaks its watches too.

As the 10%-API-error test of test_operator.py, but the faults hit the streams the operator
lives on (fakes.kube_api `FaultInjector`): watches that start with ERROR 410 Expired, watch
connections cut mid-stream, and lists answered from a lagging cache (a stale relist, whose
resourceVersion the next watch resumes from). kopf must relist and rewatch; the operator must
neither miss an object nor create a child twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.kube_api import KubeAPIServer

kopf = pytest.importorskip("kopf")
from helpers.operator_runner import (  # noqa: E402
    NS,
    T0,
    example,
    mark_job,
    operator,
    owned,
    status,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(150)]


def taskbatch(name: str) -> dict[str, Any]:
    body = example("taskbatch.yaml")
    body["metadata"] = {"name": name, "namespace": NS}
    body["spec"].pop("rolloutPoolRef")
    return body


def rolloutpool(name: str) -> dict[str, Any]:
    body = example("rolloutpool.yaml")
    body["metadata"] = {"name": name, "namespace": NS}
    return body


async def test_everything_converges_when_watches_expire_drop_and_lists_go_stale(
    kube_api: KubeAPIServer, operator_env: Path
) -> None:
    batches = [f"watched-{i:02d}" for i in range(20)]
    pools = [f"pool-{i}" for i in range(3)]
    kube_api.faults.expire_watches(count=2)  # the first two watches: a 410 whatever the timing
    kube_api.faults.expire_watches(0.2)
    kube_api.faults.drop_watches(0.3, after=1.5)
    kube_api.faults.stale_lists(0.3, lag=15)
    kube_api.faults.fail_fraction(0.03, status=500)
    with operator():
        for name in batches:
            kube_api.create(taskbatch(name))
        for name in pools:
            kube_api.create(rolloutpool(name))

        def converged() -> bool:
            done = 0
            for name in batches:
                jobs = owned(kube_api, "jobs", "TaskBatch", name)
                for job in jobs:
                    if not (job.get("status") or {}).get("startTime"):
                        mark_job(kube_api, job["metadata"]["name"], startTime=T0, active=1)
                done += status(kube_api, "qtb", name).get("phase") == "Running"
            for name in pools:
                dep = kube_api.get("deployments", NS, f"{name}-env")
                if dep is not None and not dep.get("status"):
                    kube_api.patch_status("deployments", NS, f"{name}-env",
                                          {"replicas": 2, "readyReplicas": 2})  # fmt: skip
                done += status(kube_api, "qrp", name).get("phase") == "Ready"
            return done == len(batches) + len(pools)

        await kube_api.eventually(converged, timeout=120, interval=0.3)
    kinds = {status for status, _, _ in kube_api.faults.log}
    assert {410, 0, 200} <= kinds, kube_api.faults.log  # every watch fault happened
    watch_faults = [path for status, _, path in kube_api.faults.log if status in (410, 0)]
    assert len(watch_faults) >= 3, kube_api.faults.log
    for name in batches:
        assert len(owned(kube_api, "jobs", "TaskBatch", name)) == 1, name
        assert len(owned(kube_api, "configmaps", "TaskBatch", name)) == 1, name
    for name in pools:
        assert len(owned(kube_api, "deployments", "RolloutPool", name)) == 1, name
        services = sorted(
            s["metadata"]["name"] for s in owned(kube_api, "services", "RolloutPool", name)
        )
        assert services == [f"{name}-env", f"{name}-env-pods"], (
            name
        )  # the Service, the headless one
