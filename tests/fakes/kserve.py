"""A KServe stand-in for the test cluster: InferenceServices become Deployments and Services.

`KServe(kube_api, storage_secret=..., s3_endpoint=...)` runs beside the test kubelet
(`fakes.kubelet`) and polls the test API server (`fakes.kube_api`). For every
`serving.kserve.io/v1beta1` InferenceService it does what KServe's controller (serverless mode,
on Knative) makes of it:

- **revisions**: each change of the predictor's pod template (anything but
  `canaryTrafficPercent` and the replica bounds) is a new revision `<isvc>-predictor-0000N`,
  run by a Deployment `<revision>-deployment` owned by the InferenceService, its Pods labelled
  `serving.kserve.io/inferenceservice`, `serving.knative.dev/revision` and `component:
  predictor`; the test kubelet runs them.
- **traffic** as KServe splits it: without `canaryTrafficPercent` (or at 100) the latest
  revision takes all traffic once Ready and becomes `latestRolledoutRevision` (the one before
  becomes `previousRolledoutRevision`); below 100 the latest revision gets that share and the
  last rolled-out revision the rest, so 0 is KServe's rollback. Revisions with no traffic are
  scaled to zero (their Deployment deleted), except the latest.
- **the Service `<isvc>-predictor`** (port 80 -> the container port, as Knative's route), so
  `http://<isvc>-predictor.<ns>.svc.cluster.local` resolves in every Pod.
- **status** as KServe writes it: `observedGeneration`, conditions `PredictorConfigurationReady`
  (the latest revision is Ready), `PredictorRouteReady`, `PredictorReady` and `Ready`;
  `RevisionFailed` with the container's termination message when the latest revision's
  container crash-loops; `url`, `address.url` and `components.predictor` (latestCreated/
  latestReady/latestRolledout/previousRolledoutRevision, `traffic` with the `latest`/`prev`
  tags).

The predictors:

- **custom** (`predictor.containers`, e.g. the Harness's `qpa harness serve`): the containers run
  as given, with a TCP readiness probe on the container port when they have none (Knative's
  default).
- **`predictor.model` on the Hugging Face runtime** (`kserve-huggingfaceserver`): KServe's
  storage initializer (an init container downloading `storageUri` into the emptyDir
  `/mnt/models`, here through `qpa.store.resolve_local` with the S3 keys of `storage_secret`,
  or, when the predictor names a `serviceAccountName`, as KServe does: the endpoint, region and
  `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` of that account's Secret annotated
  `serving.kserve.io/s3-endpoint`)
  then the model server with the runtime's arguments (`--model_name`, `--model_dir`,
  `--http_port`) and the InferenceService's `args`. The real runtime's vLLM backend needs a GPU,
  so the container runs `python -m fakes.kserve openai-server` instead: the same
  OpenAI-compatible API (`/openai/v1/chat/completions`, `/openai/v1/models`,
  `/v2/health/ready`) over the model in `/mnt/models`, generating with `transformers` on the
  CPU. It answers as vLLM configured by these arguments does: a request with `tools` and
  automatic tool choice is refused with vLLM's 400 (no `--enable-auto-tool-choice` given), a
  prompt plus `max_tokens` beyond the context length with vLLM's 400, `stop` strings end the
  completion (not included), an unknown model name is a 404.

Simplifications, forced by one machine: Pods share the host's network namespace, so two
revisions cannot both bind `0.0.0.0:<port>`; each revision's Pod binds its own Pod IP instead
(an argument `0.0.0.0` or `--host=0.0.0.0` becomes `$(POD_IP)`, a `fieldRef` to `status.podIP`)
and its `ports` are left out of the Pod so the kubelet does not hold them exclusively. A traffic
split routes round robin across the Ready Pods of the revisions that get traffic (the
percentages are reported, not weighed); there is no activator, no scale from zero, no ingress
gateway or tagged routes, no transformer or explainer, no ServingRuntime objects (the Hugging
Face runtime is built in), no RawDeployment mode. `nvidia.com/gpu` requests stay on the Pod but
nothing checks them. `KServe(max_new_tokens=N)` (the `kserve` fixture: 32) caps the tokens the
CPU server generates per request below the request's `max_tokens` (`finish_reason` `length`, as
when `max_tokens` runs out): a GPU serves a 1024-token completion in a second, the CPU stand-in in
minutes, and an untrained test model's completion is noise at any length. The context-length
check still counts the request's `max_tokens`, as vLLM does.

    async def test_it(kube_api, kubelet, kserve):
        kube_api.create(isvc)
        await kubelet.eventually(lambda: ready(kube_api.get("inferenceservices", "default", n)))
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import hashlib
import json
import shutil
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest
from fastapi import Request

from fakes.kube_api import ApiError, KubeAPIServer
from fakes.kubelet import owner_ref

__all__ = ["KServe", "kserve", "main"]

ISVC = "inferenceservices"
HF_RUNTIME = "kserve-huggingfaceserver"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
REVISION_LABEL = "serving.knative.dev/revision"
MODEL_DIR = "/mnt/models"
PROVISION_VOLUME = "kserve-provision-location"  # KServe's name for the model's emptyDir
USER_PORT = 8080  # KServe's default container port
TESTS_DIR = Path(__file__).resolve().parents[1]
STORAGE_IMAGE = "kserve/storage-initializer:v0.16.0"
HF_IMAGE = "kserve/huggingfaceserver:v0.16.0"
#: Predictor fields that are PodSpec fields (the rest are KServe's: replicas, canary, model...).
POD_FIELDS = (
    "affinity",
    "automountServiceAccountToken",
    "dnsPolicy",
    "enableServiceLinks",
    "hostAliases",
    "imagePullSecrets",
    "nodeSelector",
    "priorityClassName",
    "runtimeClassName",
    "schedulerName",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
)
JsonDict = dict[str, Any]
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


class ConfigError(Exception):
    """An InferenceService this stand-in cannot serve (named field)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def _own_host(argv: Sequence[str]) -> list[str]:
    """`0.0.0.0` (alone or as `--host=0.0.0.0`) -> the Pod's IP, `$(POD_IP)`."""
    return ["$(POD_IP)" if a == "0.0.0.0" else a.replace("=0.0.0.0", "=$(POD_IP)") for a in argv]


@dataclass
class _Revision:
    name: str
    digest: str
    pod: dict[str, Any]
    port: int


@dataclass
class _Memo:
    revisions: list[_Revision] = field(default_factory=list)
    rolled_out: str | None = None
    previous: str | None = None
    last_ready: str | None = None


class KServe:
    """KServe's controller for the test API server (see the module docstring)."""

    def __init__(
        self,
        api: KubeAPIServer,
        *,
        storage_secret: str | None = None,
        s3_endpoint: str | None = None,
        cluster_domain: str = "cluster.local",
        interval: float = 0.2,
        max_new_tokens: int | None = None,
    ) -> None:
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: {max_new_tokens} is not a positive count")
        self.api = api
        self.storage_secret = storage_secret
        self.s3_endpoint = s3_endpoint
        self.max_new_tokens = max_new_tokens
        self.domain = cluster_domain
        self.interval = interval
        self.errors: list[str] = []
        self._memos: dict[str, _Memo] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="test-kserve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception:  # recorded; the fixture fails the test with it
                self.errors.append(traceback.format_exc())
                if len(self.errors) > 20:
                    return
            self._stop.wait(self.interval)

    def sync(self) -> None:
        seen = set()
        for isvc in self.api.list_objects(ISVC):
            if isvc["metadata"].get("deletionTimestamp"):
                continue
            seen.add(isvc["metadata"]["uid"])
            self.reconcile(isvc)
        for uid in set(self._memos) - seen:
            del self._memos[uid]

    # ------------------------------------------------------------------ one InferenceService

    def reconcile(self, isvc: dict[str, Any]) -> None:
        meta = isvc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        predictor = isvc["spec"]["predictor"]
        memo = self._memos.setdefault(meta["uid"], _Memo())
        try:
            pod, port = self.pod_spec(isvc)
        except ConfigError as exc:
            self._write_status(isvc, memo, {}, failure=("InferenceServiceFailed", str(exc)))
            return
        digest = _hash(pod)
        if not memo.revisions or memo.revisions[-1].digest != digest:
            number = len(memo.revisions) + 1
            memo.revisions.append(_Revision(f"{name}-predictor-{number:05d}", digest, pod, port))
        latest = memo.revisions[-1]
        latest_ready = self._revision_ready(ns, latest)
        if latest_ready:
            memo.last_ready = latest.name
        canary = predictor.get("canaryTrafficPercent")
        split = (
            canary is not None
            and int(canary) < 100
            and memo.rolled_out is not None
            and memo.rolled_out != latest.name
        )
        traffic: dict[str, int]
        if split:
            assert memo.rolled_out is not None
            traffic = {latest.name: int(canary), memo.rolled_out: 100 - int(canary)}
        elif latest_ready or memo.rolled_out is None:
            if latest_ready and memo.rolled_out != latest.name:
                memo.previous, memo.rolled_out = memo.rolled_out, latest.name
            traffic = {latest.name: 100}
        else:  # a full rollout waits for the new revision; the old one keeps serving
            traffic = {memo.rolled_out: 100, latest.name: 0}
        running = {r for r, share in traffic.items() if share > 0} | {latest.name}
        for revision in memo.revisions:
            if revision.name in running:
                self._ensure_deployment(isvc, revision, predictor)
            else:
                self._remove_deployment(ns, revision)
        routed = sorted(r for r, share in traffic.items() if share > 0)
        self._ensure_service(isvc, routed, latest.port)
        failure = self._revision_failure(ns, latest)
        routes_ready = all(self._revision_ready(ns, r) for r in memo.revisions if r.name in routed)
        self._write_status(
            isvc,
            memo,
            traffic,
            ready=latest_ready and routes_ready,
            failure=("RevisionFailed", failure) if failure else None,
        )

    def pod_spec(self, isvc: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        """The revision's PodSpec and its container port."""
        predictor = isvc["spec"]["predictor"]
        pod = {k: copy.deepcopy(predictor[k]) for k in POD_FIELDS if k in predictor}
        if predictor.get("containers"):
            containers = copy.deepcopy(predictor["containers"])
            first_ports = containers[0].get("ports") or [{"containerPort": USER_PORT}]
            port = int(first_ports[0]["containerPort"])
            for c in containers:
                c.pop("ports", None)
                c["env"] = [POD_IP_ENV, *(c.get("env") or [])]
                for key in ("command", "args"):
                    if key in c:
                        c[key] = _own_host(c[key])
            containers[0].setdefault("readinessProbe", self._probe(port, None))
            pod["containers"] = containers
            return pod, port
        model = predictor.get("model")
        if not model:
            raise ConfigError("spec.predictor: neither containers nor model is set")
        runtime = model.get("runtime")
        format_name = (model.get("modelFormat") or {}).get("name")
        if runtime not in (None, HF_RUNTIME) or format_name != "huggingface":
            raise ConfigError(
                f"spec.predictor.model: runtime {runtime!r} / modelFormat {format_name!r}: "
                f"only {HF_RUNTIME} (modelFormat huggingface) is served here"
            )
        uri = model.get("storageUri")
        if not uri:
            raise ConfigError("spec.predictor.model.storageUri is required")
        pod.update(self._hf_pod(isvc, model, uri))
        return pod, USER_PORT

    def _hf_pod(self, isvc: Mapping[str, Any], model: Mapping[str, Any], uri: str) -> JsonDict:
        env: list[dict[str, Any]] = [
            {"name": "PYTHONPATH", "value": str(TESTS_DIR)},
            {"name": "HOME", "value": "/tmp"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
        ]
        storage_env = list(env)
        account = (isvc.get("spec") or {}).get("predictor", {}).get("serviceAccountName")
        if account:
            # As KServe's credential builder: the service account's Secrets annotated with
            # serving.kserve.io/s3-endpoint give the storage initializer its S3 settings and
            # the keys AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (KServe's default key names).
            storage_env += self._s3_credentials(isvc["metadata"]["namespace"], account)
        elif self.s3_endpoint:
            storage_env.append({"name": "QPA_S3_ENDPOINT", "value": self.s3_endpoint})
        if self.storage_secret and not account:
            for var, key in (
                ("AWS_ACCESS_KEY_ID", "accessKeyId"),
                ("AWS_SECRET_ACCESS_KEY", "secretAccessKey"),
            ):
                ref = {"secretKeyRef": {"name": self.storage_secret, "key": key}}
                storage_env.append({"name": var, "valueFrom": ref})
        mount = {"name": PROVISION_VOLUME, "mountPath": MODEL_DIR}
        module = [sys.executable, "-m", "fakes.kserve"]
        server = [*module, "openai-server"]
        if self.max_new_tokens is not None:
            server.append(f"--max-new-tokens={self.max_new_tokens}")
        runtime_args = [
            f"--model_name={isvc['metadata']['name']}",
            f"--model_dir={MODEL_DIR}",
            f"--http_port={USER_PORT}",
            "--host=$(POD_IP)",
        ]
        container: dict[str, Any] = {
            "name": "kserve-container",
            "image": HF_IMAGE,
            "command": server,
            "args": [*runtime_args, *(model.get("args") or [])],
            "env": [POD_IP_ENV, *env, *(model.get("env") or [])],
            "volumeMounts": [{**mount, "readOnly": True}],
            "readinessProbe": self._probe(USER_PORT, "/v2/health/ready"),
        }
        if model.get("resources"):
            container["resources"] = copy.deepcopy(model["resources"])
        return {
            "initContainers": [
                {
                    "name": "storage-initializer",
                    "image": STORAGE_IMAGE,
                    "command": [*module, "storage-initializer"],
                    "args": [uri, MODEL_DIR],
                    "env": storage_env,
                    "volumeMounts": [mount],
                }
            ],
            "containers": [container],
            "volumes": [{"name": PROVISION_VOLUME, "emptyDir": {}}],
        }

    def _s3_credentials(self, namespace: str, account: str) -> list[dict[str, Any]]:
        """The storage initializer's S3 variables from a service account's annotated Secret."""
        sa = self.api.get("serviceaccounts", namespace, account)
        if sa is None:
            raise ConfigError(f"spec.predictor.serviceAccountName: {account} does not exist")
        for ref in sa.get("secrets") or []:
            secret = self.api.get("secrets", namespace, ref["name"])
            notes = ((secret or {}).get("metadata") or {}).get("annotations") or {}
            endpoint = notes.get("serving.kserve.io/s3-endpoint")
            if secret is None or not endpoint:
                continue
            scheme = "https" if notes.get("serving.kserve.io/s3-usehttps", "1") == "1" else "http"
            keys = [
                {"name": var, "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": var}}}
                for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
            ]
            return [
                {"name": "QPA_S3_ENDPOINT", "value": f"{scheme}://{endpoint}"},
                {"name": "QPA_S3_REGION", "value": notes.get("serving.kserve.io/s3-region", "")},
                *keys,
            ]
        raise ConfigError(
            f"service account {account}: no Secret with serving.kserve.io/s3-endpoint"
        )

    @staticmethod
    def _probe(port: int, path: str | None) -> dict[str, Any]:
        action: dict[str, Any] = {"port": port}
        key = "tcpSocket"
        if path is not None:
            action["path"], key = path, "httpGet"
        return {key: action, "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 3}

    # ------------------------------------------------------------------ children

    def _deployment_name(self, revision: _Revision) -> str:
        return f"{revision.name}-deployment"

    def _ensure_deployment(
        self, isvc: Mapping[str, Any], revision: _Revision, predictor: Mapping[str, Any]
    ) -> None:
        ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
        if self.api.get("deployments", ns, self._deployment_name(revision)) is not None:
            return
        labels = {
            ISVC_LABEL: name,
            REVISION_LABEL: revision.name,
            "component": "predictor",
            "app": revision.name,
        }
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": self._deployment_name(revision),
                "namespace": ns,
                "labels": labels,
                "ownerReferences": [owner_ref(isvc)],
            },
            "spec": {
                "replicas": int(predictor.get("minReplicas") or 1),
                "selector": {"matchLabels": {REVISION_LABEL: revision.name}},
                "template": {"metadata": {"labels": labels}, "spec": revision.pod},
            },
        }
        with contextlib.suppress(ApiError):  # created meanwhile: the next sync sees it
            self.api.create(deployment)

    def _remove_deployment(self, namespace: str, revision: _Revision) -> None:
        if self.api.get("deployments", namespace, self._deployment_name(revision)) is not None:
            with contextlib.suppress(ApiError):
                self.api.delete("deployments", namespace, self._deployment_name(revision))

    def _ensure_service(self, isvc: Mapping[str, Any], routed: list[str], port: int) -> None:
        ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
        selector = (
            {REVISION_LABEL: routed[0]} if len(routed) == 1 else {ISVC_LABEL: name}
        )  # a split: every running revision of the InferenceService, round robin
        spec = {
            "selector": selector,
            "ports": [{"name": "http", "port": 80, "targetPort": port, "protocol": "TCP"}],
        }
        service_name = f"{name}-predictor"
        live = self.api.get("services", ns, service_name)
        if live is None:
            service = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": service_name,
                    "namespace": ns,
                    "labels": {ISVC_LABEL: name, "component": "predictor"},
                    "ownerReferences": [owner_ref(isvc)],
                },
                "spec": spec,
            }
            with contextlib.suppress(ApiError):
                self.api.create(service)
        elif (old := live["spec"].get("selector") or {}) != selector:
            # a merge patch: the labels the new selector drops are removed (null), not kept
            replace = {**{key: None for key in old if key not in selector}, **selector}
            self.api.patch("services", ns, service_name, {"spec": {"selector": replace}})

    def _pods(self, namespace: str, revision: _Revision) -> list[dict[str, Any]]:
        return self.api.list_objects("pods", namespace, f"{REVISION_LABEL}={revision.name}")

    def _revision_ready(self, namespace: str, revision: _Revision) -> bool:
        deployment = self.api.get("deployments", namespace, self._deployment_name(revision))
        status = (deployment or {}).get("status") or {}
        return int(status.get("readyReplicas") or 0) >= 1

    def _revision_failure(self, namespace: str, revision: _Revision) -> str | None:
        """The termination message of a crash-looping container of the revision, else None."""
        for pod in self._pods(namespace, revision):
            status = pod.get("status") or {}
            for c in status.get("containerStatuses") or []:
                waiting = (c.get("state") or {}).get("waiting") or {}
                last = (c.get("lastState") or {}).get("terminated") or {}
                if waiting.get("reason") == "CrashLoopBackOff" and int(c.get("restartCount", 0)):
                    why = last.get("message") or f"exit code {last.get('exitCode')}"
                    return f"Revision {revision.name} failed: container {c['name']}: {why}"
        return None

    # ------------------------------------------------------------------ status

    def _write_status(
        self,
        isvc: Mapping[str, Any],
        memo: _Memo,
        traffic: Mapping[str, int],
        *,
        ready: bool = False,
        failure: tuple[str, str] | None = None,
    ) -> None:
        meta = isvc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        url = f"http://{name}-predictor.{ns}.svc.{self.domain}"
        latest = memo.revisions[-1].name if memo.revisions else None

        def condition(type_: str, ok: bool) -> dict[str, Any]:
            cond: dict[str, Any] = {"type": type_, "status": "True" if ok else "False"}
            if not ok and failure is not None:
                cond["reason"], cond["message"] = failure
            elif not ok:
                cond["reason"], cond["message"] = "RevisionNotReady", f"{latest} is not Ready"
            return cond

        entries = []
        for revision, share in traffic.items():
            entry: dict[str, Any] = {
                "revisionName": revision,
                "percent": share,
                "latestRevision": revision == latest,
            }
            if len(traffic) > 1:
                entry["tag"] = "latest" if revision == latest else "prev"
            entries.append(entry)
        predictor: dict[str, Any] = {"url": url, "address": {"url": url}, "traffic": entries}
        for key, value in (
            ("latestCreatedRevision", latest),
            ("latestReadyRevision", memo.last_ready),
            ("latestRolledoutRevision", memo.rolled_out),
            ("previousRolledoutRevision", memo.previous),
        ):
            if value is not None:
                predictor[key] = value
        route_ok = ready or (failure is None and bool(traffic))
        conditions = [
            condition("PredictorConfigurationReady", ready),
            condition("PredictorRouteReady", route_ok and ready),
            condition("PredictorReady", ready),
            condition("Ready", ready),
        ]
        old = dict(isvc.get("status") or {})
        before = {c["type"]: c for c in old.get("conditions") or []}
        for cond in conditions:
            prior = before.get(cond["type"])
            same = prior is not None and all(
                prior.get(k) == cond.get(k) for k in ("status", "reason", "message")
            )
            kept = prior.get("lastTransitionTime") if prior is not None and same else None
            cond["lastTransitionTime"] = kept or _now()
        status = {
            "observedGeneration": meta.get("generation", 1),
            "url": url,
            "address": {"url": url},
            "components": {"predictor": predictor},
            "conditions": conditions,
            "deploymentMode": "Serverless",
        }
        if any(old.get(k) != v for k, v in status.items()):
            with contextlib.suppress(ApiError):  # deleted meanwhile
                self.api.patch_status(ISVC, ns, name, status)


#: The Secret holding the storage initializer's S3 keys (in namespace `default`), as a
#: ServiceAccount's `serving.kserve.io/s3-endpoint` Secret gives them to KServe.
STORAGE_SECRET = "kserve-s3"
#: The `kserve` fixture's cap on the tokens generated per request (see the module docstring).
FIXTURE_MAX_NEW_TOKENS = 32


@pytest.fixture
def kserve(kube_api: KubeAPIServer, seaweed: Any) -> Iterator[KServe]:
    """A `KServe` stand-in on `kube_api` whose storage initializer reads SeaweedFS (`seaweed`)
    with the keys of the Secret `kserve-s3` in `default` and whose model servers generate at most
    `FIXTURE_MAX_NEW_TOKENS` tokens per request; its errors fail the test."""
    keys = {"accessKeyId": seaweed.access_key, "secretAccessKey": seaweed.secret_key}
    kube_api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": STORAGE_SECRET, "namespace": "default"},
            "stringData": keys,
        }
    )
    with KServe(
        kube_api,
        storage_secret=STORAGE_SECRET,
        s3_endpoint=seaweed.endpoint,
        max_new_tokens=FIXTURE_MAX_NEW_TOKENS,
    ) as ks:
        yield ks
    if ks.errors:
        pytest.fail("the KServe stand-in raised:\n" + "\n".join(ks.errors))


# --------------------------------------------------------------------------- in the Pods


def storage_initializer(uri: str, dest: str) -> None:
    """KServe's storage initializer: the model at `uri` into `dest` (the emptyDir)."""
    from qpa.store import resolve_local

    source = resolve_local(uri, field="spec.predictor.model.storageUri")
    target = Path(dest)
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / source.name)
    print(f"copied {uri} to {dest}: {sorted(p.name for p in target.iterdir())}", flush=True)


def _error(status: int, message: str, kind: str = "BadRequestError") -> Any:
    from fastapi.responses import JSONResponse

    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def openai_server(args: argparse.Namespace) -> None:
    """The Hugging Face runtime's OpenAI API over the model in `--model_dir` (transformers)."""
    import torch
    import uvicorn
    from fastapi import FastAPI
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # the test machine's cores are shared: one is faster than two
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, local_files_only=True)
    model.eval()
    max_len = args.max_model_len or int(model.config.max_position_embeddings)
    created = int(time.time())
    lock = threading.Lock()
    app = FastAPI()

    @app.get("/v2/health/ready")
    @app.get("/v2/health/live")
    def health() -> dict[str, bool]:
        return {"ready": True, "live": True}

    @app.get("/openai/v1/models")
    def models() -> dict[str, Any]:
        card = {"id": args.model_name, "object": "model", "created": created, "owned_by": "kserve"}
        return {"object": "list", "data": [card]}

    def generate(body: dict[str, Any]) -> Any:
        messages = [
            {"role": m.get("role", "user"), "content": _text(m.get("content"))}
            for m in body.get("messages") or []
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        prompt_len = int(inputs["input_ids"].shape[1])
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        wanted = int(max_tokens) if max_tokens is not None else max_len - prompt_len
        if prompt_len + wanted > max_len:
            return _error(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you "
                f"requested {prompt_len + wanted} tokens ({prompt_len} in the messages, "
                f"{wanted} in the completion). Please reduce the length of the messages or "
                "completion.",
            )
        if args.max_new_tokens is not None:
            wanted = min(wanted, args.max_new_tokens)  # the CPU stand-in's cap
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        temperature = float(body.get("temperature", 1.0) or 0.0)
        options: dict[str, Any] = {"max_new_tokens": wanted, "do_sample": temperature > 0}
        if temperature > 0:
            options.update(temperature=temperature, top_p=float(body.get("top_p", 1.0)))
        if stop:
            options.update(stop_strings=stop, tokenizer=tokenizer)
        with lock, torch.no_grad():
            out = model.generate(
                **inputs,
                **options,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[0, prompt_len:]
        content = str(tokenizer.decode(new, skip_special_tokens=True))
        finish = "length" if len(new) >= wanted else "stop"
        for s in stop:
            if s in content:
                content, finish = content.split(s, 1)[0], "stop"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": args.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_len,
                "completion_tokens": len(new),
                "total_tokens": prompt_len + len(new),
            },
        }

    @app.post("/openai/v1/chat/completions")
    async def chat(request: Request) -> Any:
        from starlette.concurrency import run_in_threadpool

        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if body.get("model") != args.model_name:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if body.get("stream"):
            return _error(400, "stream=true is not served by this stand-in")
        if body.get("tools") and body.get("tool_choice") in (None, "auto"):
            return _error(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set",
            )
        return await run_in_threadpool(generate, body)

    uvicorn.run(app, host=args.host, port=args.http_port, log_level="info")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fakes.kserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("storage-initializer", help="download the model into the emptyDir")
    init.add_argument("uri")
    init.add_argument("dest")
    serve = sub.add_parser("openai-server", help="the Hugging Face runtime's OpenAI API (CPU)")
    serve.add_argument("--model_name", required=True)
    serve.add_argument("--model_dir", default=MODEL_DIR)
    serve.add_argument("--http_port", type=int, default=USER_PORT)
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--backend", default="vllm", choices=["vllm", "huggingface", "auto"])
    serve.add_argument("--max_model_len", "--max-model-len", type=int, default=None)
    # vLLM's own flags, which KServe's Hugging Face server passes through (one CPU here)
    serve.add_argument(
        "--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32", "half"]
    )
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    serve.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="generate at most this many tokens per request (the CPU stand-in's cap)",
    )
    args = parser.parse_args(argv)
    if args.command == "storage-initializer":
        storage_initializer(args.uri, args.dest)
    else:
        openai_server(args)


if __name__ == "__main__":
    main()
