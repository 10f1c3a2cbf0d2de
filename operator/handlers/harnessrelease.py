"""HarnessRelease handlers: read the world, ask the release state machine, apply its answer.

Every trigger runs the same `reconcile`, one at a time per release (an asyncio lock):

1. **observe**: the candidate's model InferenceService, the Harness InferenceService and the
   benchmark Job from the kopf indexes; once the Job completed, the report from the store
   (`qpa.release.verdict.judge`: `qpa.store`; endpoint and Secret from `spec.store`, else the
   operator's default store `QPA_OPERATOR_STORE_*`; the keys are that Secret's **in the
   release's namespace** (`qpa_operator.storecreds`), never the operator's own), gated against
   the stable version's report. A release naming a store URI outside its namespace's prefix
   (`builders.storeaccess`) is refused before anything is read. For an `s3://` model, the
   storage initializer's Secret (`<release>-model-storage`, KServe's S3 format) is derived from
   the same namespace Secret (`storecreds.namespace_store_keys`) when its source (store,
   Secret and its resourceVersion) changed: a new immutable Secret per source, so the operator
   only ever creates Secrets, never reads or changes one it did not name. In the canary with
   `rollout.analysis`, the candidate's request counters are read
   (`qpa_operator.analysis.read_sample`);
2. **decide**: `qpa_operator.release.next_step` (pure) gives the new status, the Events and
   when to look again;
3. **apply**: the status (guarded by resourceVersion, recomputed on a conflict), the Events,
   the removal of an acted-on `qpa.ai/override` annotation, then the children
   `qpa_operator.release.children` calls for (create or patch), deleting the owned
   InferenceServices and Jobs it does not.

Triggers: create/update (spec)/resume; events of the owned InferenceServices and Jobs; the
override annotation; and a per-release clock (a kopf daemon, which carries kopf's finalizer)
that re-runs the reconcile when a deadline or the end of a canary step comes
(`QPA_OPERATOR_RELEASE_TICK` seconds between looks at the clock, default 1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

import kopf
from qpa_operator import analysis, release
from qpa_operator.builders import harnessrelease as builder
from qpa_operator.builders import storeaccess
from qpa_operator.builders.common import JsonDict, MissingSetting, kind_label
from qpa_operator.handlers.apply import delete_child, ensure
from qpa_operator.handlers.netpolicy import report_egress
from qpa_operator.handlers.runtime import measured, now, retry_delay, runtime
from qpa_operator.handlers.status import child_event, write_status
from qpa_operator.handlers.views import Views, fresher, parse
from qpa_operator.kube import ApiError
from qpa_operator.storecreds import (
    StoreCredentialsError,
    namespace_store_config,
    namespace_store_keys,
)

from qpa.api import GROUP, VERSION, HarnessRelease
from qpa.api.v1alpha1 import OVERRIDE_ANNOTATION
from qpa.release.verdict import ReportUnavailable, judge
from qpa.store.config import StoreConfig

logger = logging.getLogger("qpa_operator")

KIND: Final = "HarnessRelease"
PLURAL: Final = HarnessRelease.info.plural
API_VERSION: Final = f"{GROUP}/{VERSION}"
#: Pruned when the state machine no longer keeps them; the stable endpoint Service and the
#: storage account stay while the release exists (garbage-collected with it).
OWNED_KINDS: Final = ("InferenceService", "Job", "ConfigMap", "NetworkPolicy")

#: What `client.create(body)` creates, per function (tests/unit/install/test_rbac.py reads it).
CREATES: Final = {"storage_secret": ("v1", "secrets")}
#: (namespace, name) -> when the clock should run the reconcile again (None: no timer).
WAKE: dict[tuple[str, str], datetime] = {}
#: (namespace, name) -> the release as this operator last wrote it: the index may lag behind,
#: and the state machine must observe (e.g. decide to read the report) from the newest status.
WRITTEN: dict[tuple[str, str], Mapping[str, Any]] = {}
_LOCKS: dict[tuple[str, str], tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = {}
#: Reads of `file://` reports: no keys, and none taken from the operator's environment.
NO_CREDENTIALS: Final = StoreConfig(
    access_key_env="QPA_NAMESPACE_STORE_ACCESS_KEY_UNSET",
    secret_key_env="QPA_NAMESPACE_STORE_SECRET_KEY_UNSET",
    session_token_env="QPA_NAMESPACE_STORE_SESSION_TOKEN_UNSET",
)


def _lock(key: tuple[str, str]) -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    found = _LOCKS.get(key)
    if found is None or found[0] is not loop:
        found = (loop, asyncio.Lock())
        _LOCKS[key] = found
    return found[1]


@kopf.on.startup()
async def harnessrelease_startup(**_: Any) -> None:
    """A fresh operator run (tests start several in one process) remembers nothing."""
    WAKE.clear()
    WRITTEN.clear()
    _LOCKS.clear()


def clock_tick() -> float:
    return max(0.05, float(os.environ.get("QPA_OPERATOR_RELEASE_TICK") or 1.0))


# --------------------------------------------------------------------------- observe


async def observe(resource: HarnessRelease, views: Views) -> release.Observed:
    namespace = resource.metadata.namespace or "default"
    rt = await runtime()
    model = views.child("InferenceService", namespace, builder.model_name(resource))
    harness = views.child("InferenceService", namespace, builder.harness_name(resource))
    bench = views.child("Job", namespace, builder.bench_job_name(resource, rt.defaults))
    verdict = None
    problem = None
    # A URI outside the namespace's store prefix is refused before anything is read.
    refused = storeaccess.harnessrelease_refusal(resource, rt.defaults)
    if refused is None and release.wants_report(resource, bench, rt.defaults):
        spec = resource.spec
        report = builder.candidate(resource, rt.defaults).report_uri or builder.report_prefix(
            resource, rt.defaults
        )
        try:
            config = await report_store(resource, report, rt.client, rt.defaults)
            verdict = await asyncio.to_thread(
                judge, report, release.stable_report(resource), spec.gate, config
            )
        except (ReportUnavailable, StoreCredentialsError) as exc:
            problem = str(exc)
            logger.warning("HarnessRelease %s/%s: %s", namespace, resource.metadata.name, exc)
    sample, metrics_problem = None, None
    if refused is None and release.wants_metrics(resource, rt.defaults):
        sample, metrics_problem = await read_metrics(resource, harness, rt.defaults)
    return release.Observed(
        now=now(), model=model, harness=harness, bench=bench, verdict=verdict,
        report_problem=problem, refused=refused, metrics=sample, metrics_problem=metrics_problem,
    )  # fmt: skip


async def read_metrics(
    resource: HarnessRelease, harness: Mapping[str, Any] | None, defaults: Any
) -> tuple[Any, str | None]:
    """The candidate's counters now, or (None, why not)."""
    settings = resource.spec.rollout.analysis
    assert settings is not None  # release.wants_metrics
    predictor = (((harness or {}).get("status") or {}).get("components") or {}).get("predictor")
    revision = (predictor or {}).get("latestCreatedRevision")
    try:
        sample = await analysis.read_sample(
            settings,
            metrics_url=settings.metrics_url or builder.candidate_metrics_url(resource, defaults),
            namespace=resource.metadata.namespace or "default",
            revision=str(revision) if revision else None,
            at=now(),
        )
    except analysis.MetricsUnavailable as exc:
        logger.warning("HarnessRelease %s: %s", resource.metadata.name, exc)
        return None, str(exc)
    return sample, None


async def storage_secret(
    resource: HarnessRelease, views: Views, client: Any, defaults: Any
) -> tuple[str | None, str | None]:
    """Derive the storage initializer's Secret from the namespace's store keys when its source
    changed (a new immutable Secret per source: the operator only creates Secrets). Returns
    (the source its service account should name, or None; a problem, or None)."""
    if not release.needs_storage(resource):
        return None, None
    namespace = resource.metadata.namespace or "default"
    try:
        store = builder.model_store(resource, defaults)
        field = "spec.store" if resource.spec.store else "the operator's store (objectStore)"
        keys = await namespace_store_keys(client, namespace, store, field, defaults)
    except (MissingSetting, StoreCredentialsError) as exc:
        return None, str(exc)
    source = builder.storage_source(store, keys.resource_version)
    account = views.child("ServiceAccount", namespace, builder.storage_name(resource)) or {}
    annotations = (account.get("metadata") or {}).get("annotations") or {}
    if annotations.get(builder.STORAGE_SOURCE_ANNOTATION) == source:
        return source, None  # its Secret exists: nothing to write
    body = builder.storage_secret(
        resource, defaults, store, source, keys.access_key, keys.secret_key
    )
    try:
        await client.create(body)
    except ApiError as exc:
        # Already there: created by an earlier reconcile that stopped before the account.
        if not exc.already_exists:
            name = body["metadata"]["name"]
            return None, f"Secret {namespace}/{name} cannot be created ({exc})"
    return source, None


async def report_store(
    resource: HarnessRelease, report: str, client: Any, defaults: Any
) -> StoreConfig:
    """How to read the release's reports: its store with its namespace's Secret, never the
    operator's own keys. A `file://` report without a store needs no credentials at all."""
    namespace = resource.metadata.namespace or "default"
    store, field = resource.spec.store, "spec.store"
    if store is None:
        store, field = defaults.store, "the operator's default store (objectStore)"
    if store is None:
        if report.startswith("s3://"):
            raise StoreCredentialsError(
                f"spec.reportUri {report!r} is on S3, but neither spec.store nor the operator's "
                "default store (objectStore) names the store and its Secret"
            )
        return NO_CREDENTIALS
    return await namespace_store_config(client, namespace, store, field, defaults)


# --------------------------------------------------------------------------- apply


def post(obj: Mapping[str, Any], event: release.Event) -> None:
    meta = obj.get("metadata") or {}
    raw: Any = {
        "apiVersion": obj.get("apiVersion") or API_VERSION,
        "kind": KIND,
        "metadata": {key: meta.get(key) for key in ("name", "namespace", "uid")},
    }
    try:
        if event.warning:
            kopf.warn(kopf.Body(raw), reason=event.reason, message=event.message)
        else:
            kopf.info(kopf.Body(raw), reason=event.reason, message=event.message)
    except LookupError:  # outside a kopf context: no event queue
        logger.info("HarnessRelease %s %s: %s", meta.get("name"), event.reason, event.message)


async def remove_override(obj: Mapping[str, Any], seen: str | None, attempts: int = 4) -> None:
    """Remove `qpa.ai/override` if it still holds `seen`, the value the decision acted on.

    The patch is guarded by the resourceVersion it read: a reconcile of an older body (the
    status write of `abort` wakes one) must not delete a `promote` annotated since, whose own
    watch event could then coalesce with the removal and never be acted on.
    """
    rt = await runtime()
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), str(meta.get("name"))
    current: Mapping[str, Any] | None = obj
    for _ in range(attempts):
        annotations = ((current or {}).get("metadata") or {}).get("annotations") or {}
        if current is None or annotations.get(OVERRIDE_ANNOTATION) != seen:
            return  # gone, or a newer override: its own event acts on it
        version = (current.get("metadata") or {}).get("resourceVersion")
        patch = {
            "metadata": {"resourceVersion": version, "annotations": {OVERRIDE_ANNOTATION: None}}
        }
        try:
            await rt.client.patch(
                API_VERSION, PLURAL, namespace, name, patch, retry_conflicts=False
            )
            return
        except ApiError as exc:
            if exc.not_found:
                return
            if not exc.conflict:
                raise
        current = await rt.client.get(API_VERSION, PLURAL, namespace, name)
    raise kopf.TemporaryError("the override annotation kept changing", delay=retry_delay(1))


async def apply_children(
    resource: HarnessRelease, desired: release.Desired, views: Views
) -> list[JsonDict]:
    """Apply `desired` with the network policies of its servers (and benchmark) first;
    delete owned children it does not keep. Returns the policies."""
    rt = await runtime()
    namespace = resource.metadata.namespace or "default"
    policies = builder.network_policies(resource, rt.defaults, list(desired.apply))
    keep = desired.keep | {("NetworkPolicy", p["metadata"]["name"]) for p in policies}
    for child in [*policies, *desired.apply]:
        kind, name = str(child["kind"]), child["metadata"]["name"]
        await ensure(child, views.child(kind, namespace, name), owner=resource)
    for kind in OWNED_KINDS:
        for live in views.children(kind, namespace, KIND, resource.metadata.name or ""):
            if (kind, live["metadata"]["name"]) not in keep:
                await delete_child(resource, live)
    return policies


# --------------------------------------------------------------------------- reconcile


async def reconcile(obj: Mapping[str, Any], views: Views, reason: str) -> None:
    meta = obj.get("metadata") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    async with _lock(key):
        await _reconcile(obj, views, key)


async def _reconcile(obj: Mapping[str, Any], views: Views, key: tuple[str, str]) -> None:
    current = fresher(obj, views.parent(KIND, *key)) or obj
    mine = WRITTEN.get(key)
    uid = (current.get("metadata") or {}).get("uid")
    if mine is not None and (mine.get("metadata") or {}).get("uid") == uid:
        current = fresher(current, mine) or current
    if (current.get("metadata") or {}).get("deletionTimestamp"):
        WAKE.pop(key, None)
        WRITTEN.pop(key, None)
        return
    resource = parse(current, HarnessRelease)
    if resource is None:
        return
    rt = await runtime()
    observed = await observe(resource, views)
    storage, storage_problem = None, None
    if observed.refused is None:
        storage, storage_problem = await storage_secret(resource, views, rt.client, rt.defaults)
        if storage_problem is not None:
            logger.warning("HarnessRelease %s/%s: %s", *key, storage_problem)
            observed = dataclasses.replace(observed, storage_problem=storage_problem)
    wanted = builder.candidate(resource, rt.defaults).id
    decisions: list[release.Decision] = []

    def compute(fresh: HarnessRelease) -> Any:
        if builder.candidate(fresh, rt.defaults).id != wanted:
            return None  # the spec changed meanwhile: its own update event reconciles it
        decision = release.next_step(fresh, observed, rt.defaults)
        decisions.append(decision)
        return decision.status

    change = await write_status(
        HarnessRelease,
        current,
        compute,
        reread=lambda: views.parent(KIND, *key),
        announce_phases=False,
    )
    if not decisions:
        return
    decision = decisions[-1]
    written = change.obj or current
    if change.written and change.obj is not None:
        WRITTEN[key] = change.obj
    if change.written or decision.consume_override:
        for event in decision.events:
            post(written, event)
    if decision.consume_override:
        await remove_override(written, decision.override_seen)
    latest = parse(written, HarnessRelease) or resource
    desired = release.children(latest, decision.status, rt.defaults, observed.bench, storage)
    policies = await apply_children(latest, desired, views)
    await report_egress(HarnessRelease, written, policies, reread=lambda: views.parent(KIND, *key))
    if decision.wake_at is None:
        WAKE.pop(key, None)
    else:
        WAKE[key] = decision.wake_at


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def harnessrelease_reconcile(body: Any, reason: str, **kwargs: Any) -> None:
    async with measured(KIND, str(reason)):
        await reconcile(dict(body), Views(kwargs), str(reason))


@kopf.on.event(GROUP, VERSION, PLURAL, annotations={OVERRIDE_ANNOTATION: kopf.PRESENT})
async def harnessrelease_override(type: str | None, body: Any, **kwargs: Any) -> None:
    """`qpa.ai/override` set: act on it now (the reconcile records it and removes it)."""
    if type == "DELETED":
        return
    try:
        async with measured(KIND, "override"):
            await reconcile(dict(body), Views(kwargs), "override")
    except (kopf.TemporaryError, ApiError) as exc:
        logger.warning("HarnessRelease override: %s (the next event retries)", exc)


@kopf.on.event(
    "serving.kserve.io", "v1beta1", "inferenceservices", labels={kind_label(KIND): kopf.PRESENT}
)
async def harnessrelease_isvc_event(type: str | None, body: Any, **kwargs: Any) -> None:
    """An InferenceService became Ready (or failed, or went): the release may move on."""
    await child_event(KIND, body, type, Views(kwargs), reconcile, _from_child)


@kopf.on.event("batch", "v1", "jobs", labels={kind_label(KIND): kopf.PRESENT})
async def harnessrelease_job_event(type: str | None, body: Any, **kwargs: Any) -> None:
    await child_event(KIND, body, type, Views(kwargs), reconcile, _from_child)


async def _from_child(obj: Mapping[str, Any], views: Views) -> None:
    await reconcile(obj, views, "child")


@kopf.daemon(GROUP, VERSION, PLURAL, id="harnessrelease_clock", cancellation_timeout=1.0)
async def harnessrelease_clock(
    stopped: kopf.DaemonStopped, namespace: str | None, name: str | None, **kwargs: Any
) -> None:
    """Run the reconcile when the state machine asked to look again (deadlines, canary steps)."""
    key = (str(namespace), str(name))
    views = Views(kwargs)
    tick = clock_tick()
    while not stopped:
        # A plain sleep: `stopped.wait(timeout)` leaves a timed helper task behind, which kopf
        # may find still running at shutdown.
        await asyncio.sleep(tick)
        if stopped:
            break
        due = WAKE.get(key)
        if due is None or now() < due:
            continue
        obj = views.parent(KIND, *key)
        if obj is None:
            continue
        try:
            async with measured(KIND, "clock"):
                await reconcile(obj, views, "clock")
        except (kopf.TemporaryError, ApiError) as exc:
            delay = retry_delay(2)
            logger.warning("HarnessRelease %s/%s: %s (again in %.1f s)", *key, exc, delay)
            WAKE[key] = now() + timedelta(seconds=delay)
    WAKE.pop(key, None)
    WRITTEN.pop(key, None)
