"""A small asyncio client of the Kubernetes REST API for the operator's own writes.

kopf watches and patches the custom resources with its own session; the handlers create,
read, patch and delete children, and write statuses, through this client. It reuses the
credentials kopf logged in with (`kopf.ConnectionInfo`: in-cluster service account or a
kubeconfig), speaks JSON to any group/version/plural, and retries what a real API server asks
to retry: 429 (honouring `Retry-After`), 5xx, a 409 `Conflict` that carries no
precondition of ours, and dropped connections. Other answers raise `ApiError` with the status,
the reason and the server's message.

Every request is counted in `qpa_operator_api_requests_total{method,code}`.

A namespace-scoped operator (`QPA_OPERATOR_NAMESPACES`, the chart's `operator.watchNamespaces`)
refuses, before sending, any request for a namespace outside that list (`NotServed`, 403): it
never reconciles, reads or writes anything elsewhere, whatever kopf was started with.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import ssl
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, unquote

import aiohttp
import kopf
from qpa_operator import metrics

JsonDict = dict[str, Any]

USER_AGENT: Final = "qpa-operator/0.1"
RETRIABLE: Final = frozenset({429, 500, 502, 503, 504})
MERGE_PATCH: Final = "application/merge-patch+json"

#: (apiVersion, kind) -> plural, for every kind the operator creates or reads.
PLURALS: Final[dict[tuple[str, str], str]] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Secret"): "secrets",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("apps/v1", "DaemonSet"): "daemonsets",
    ("batch/v1", "Job"): "jobs",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservices",
    ("qpa.ai/v1alpha1", "TaskBatch"): "taskbatches",
    ("qpa.ai/v1alpha1", "RolloutPool"): "rolloutpools",
    ("qpa.ai/v1alpha1", "DevicePool"): "devicepools",
    ("qpa.ai/v1alpha1", "TrainingRun"): "trainingruns",
    ("qpa.ai/v1alpha1", "HarnessRelease"): "harnessreleases",
}


def served_namespaces(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """`QPA_OPERATOR_NAMESPACES` (comma-separated) as a set; None when unset (cluster-wide)."""
    env = os.environ if environ is None else environ
    names = {part.strip() for part in (env.get("QPA_OPERATOR_NAMESPACES") or "").split(",")}
    names.discard("")
    return frozenset(names) or None


def namespace_of(path: str) -> str | None:
    """The namespace a request path names (`.../namespaces/<ns>/...`), else None."""
    parts = path.split("?", 1)[0].split("/")
    for index, part in enumerate(parts[:-1]):
        # `/api/v1/namespaces/<ns>` (the Namespace itself) names it too
        if part == "namespaces" and index in (3, 4):
            return unquote(parts[index + 1])
    return None


class ApiError(Exception):
    """A non-2xx answer of the API server (after the retries this client makes)."""

    def __init__(self, status: int, reason: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def conflict(self) -> bool:
        return self.status == 409 and self.reason != "AlreadyExists"


def plural_of(api_version: str, kind: str) -> str:
    try:
        return PLURALS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not manage {kind} ({api_version})") from None


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


def object_path(obj: Mapping[str, Any], *, collection: bool = False) -> str:
    meta = obj.get("metadata") or {}
    plural = plural_of(str(obj.get("apiVersion")), str(obj.get("kind")))
    name = None if collection else meta.get("name")
    return resource_path(str(obj.get("apiVersion")), plural, meta.get("namespace"), name)


class KubeClient:
    """The operator's API client; build it with `from_connection` inside a running loop."""

    def __init__(
        self,
        server: str,
        *,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        retries: int = 6,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        timeout: float = 30.0,
        relogin: Callable[[], kopf.ConnectionInfo | None] | None = None,
        namespaces: frozenset[str] | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        #: the namespaces requests may name (None: any)
        self.namespaces = namespaces
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._relogin = relogin
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        self._ssl = ssl_context
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout),
            connector=aiohttp.TCPConnector(
                limit=64, ssl=True if ssl_context is None else ssl_context
            ),
        )
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_connection(
        cls,
        info: kopf.ConnectionInfo,
        *,
        relogin: Callable[[], kopf.ConnectionInfo | None] | None = None,
        **options: Any,
    ) -> KubeClient:
        tempdir = tempfile.TemporaryDirectory(prefix="qpa-operator-")
        headers, context = _credentials(info, Path(tempdir.name))
        options.setdefault("namespaces", served_namespaces())
        client = cls(info.server, headers=headers, ssl_context=context, relogin=relogin, **options)
        client._tempdir = tempdir
        return client

    def _refresh(self) -> bool:
        if self._relogin is None:
            return False
        info = self._relogin()
        if info is None:
            return False
        directory = Path(self._tempdir.name) if self._tempdir else Path(tempfile.mkdtemp())
        headers, _ = _credentials(info, directory)
        self._headers.update(headers)
        return True

    async def close(self) -> None:
        await self._session.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    # ------------------------------------------------------------------ requests

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        retry_conflicts: bool = True,
    ) -> Any:
        """Send one request (retrying what is retriable) and return the decoded JSON body."""
        namespace = namespace_of(path)
        if self.namespaces is not None and (namespace is None or namespace not in self.namespaces):
            served = ", ".join(sorted(self.namespaces))
            where = f"namespace {namespace!r}" if namespace else "a cluster-scoped path"
            raise ApiError(
                403,
                "NotServed",
                f"{method} {path}: {where} is outside the operator's namespaces ({served}; "
                "QPA_OPERATOR_NAMESPACES): a namespace-scoped operator acts only there",
            )
        data = json.dumps(body).encode() if body is not None else None
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = content_type
        refreshed = False
        attempt = 0
        while True:
            attempt += 1
            delay: float | None = None
            try:
                async with self._session.request(
                    method,
                    self.server + path,
                    data=data,
                    params=params,
                    headers=headers,
                ) as response:
                    raw = await response.read()
                    metrics.API_REQUESTS.labels(method=method, code=str(response.status)).inc()
                    if response.status < 300:
                        return json.loads(raw) if raw else None
                    error = _error(response.status, raw)
                    if response.status == 401 and not refreshed and self._refresh():
                        refreshed = True
                        headers.update(self._headers)
                        continue
                    retriable = response.status in RETRIABLE or (retry_conflicts and error.conflict)
                    if not retriable or attempt > self.retries:
                        raise error
                    delay = _retry_after(response.headers.get("Retry-After"))
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                metrics.API_REQUESTS.labels(method=method, code="connection").inc()
                if attempt > self.retries:
                    raise ApiError(0, "ConnectionError", repr(exc)) from exc
            wait = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
            wait *= 0.5 + random.random()  # jitter: many workers must not retry in lockstep
            await asyncio.sleep(max(wait, delay or 0.0))

    async def get(
        self, api_version: str, plural: str, namespace: str | None, name: str
    ) -> JsonDict | None:
        try:
            result: JsonDict = await self.request(
                "GET", resource_path(api_version, plural, namespace, name)
            )
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        return result

    async def list(
        self,
        api_version: str,
        plural: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
    ) -> list[JsonDict]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request(
            "GET", resource_path(api_version, plural, namespace), params=params
        )
        return list((result or {}).get("items") or [])

    async def create(self, obj: Mapping[str, Any]) -> JsonDict:
        result: JsonDict = await self.request(
            "POST", object_path(obj, collection=True), body=dict(obj)
        )
        return result

    async def patch(
        self,
        api_version: str,
        plural: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
        retry_conflicts: bool = True,
    ) -> JsonDict:
        result: JsonDict = await self.request(
            "PATCH",
            resource_path(api_version, plural, namespace, name, subresource),
            body=dict(patch),
            content_type=MERGE_PATCH,
            retry_conflicts=retry_conflicts,
        )
        return result

    async def delete(
        self,
        api_version: str,
        plural: str,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
    ) -> bool:
        """Delete one object; False when it was already gone."""
        try:
            await self.request(
                "DELETE",
                resource_path(api_version, plural, namespace, name),
                body={"propagationPolicy": propagation},
            )
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def delete_collection(
        self,
        api_version: str,
        plural: str,
        namespace: str,
        *,
        label_selector: str,
        propagation: str = "Background",
    ) -> None:
        await self.request(
            "DELETE",
            resource_path(api_version, plural, namespace),
            body={"propagationPolicy": propagation},
            params={"labelSelector": label_selector},
        )


def _error(status: int, raw: bytes) -> ApiError:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"message": raw.decode("utf-8", "replace")}
    if not isinstance(body, dict):
        body = {"message": str(body)}
    return ApiError(status, str(body.get("reason") or status), str(body.get("message") or ""), body)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return min(30.0, max(0.0, float(value)))
    except ValueError:
        return None


def _write(directory: Path, name: str, data: str | bytes) -> str:
    path = directory / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(0o600)
    return str(path)


def _credentials(
    info: kopf.ConnectionInfo, directory: Path
) -> tuple[dict[str, str], ssl.SSLContext | bool | None]:
    """Headers, TLS context and basic auth equivalent to kopf's for the same connection."""
    headers: dict[str, str] = {}
    if info.token:
        headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
    if info.username and not info.token:
        pair = f"{info.username}:{info.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    context: ssl.SSLContext | bool | None = None
    if info.server.startswith("https"):
        if info.insecure:
            context = False
        else:
            ca_path = info.ca_path
            if ca_path is None and info.ca_data is not None:
                ca_path = _write(directory, "ca.crt", info.ca_data)
            context = ssl.create_default_context(cafile=str(ca_path) if ca_path else None)
        cert = info.certificate_path
        key = info.private_key_path
        if cert is None and info.certificate_data is not None:
            cert = _write(directory, "client.crt", info.certificate_data)
        if key is None and info.private_key_data is not None:
            key = _write(directory, "client.key", info.private_key_data)
        if cert is not None and isinstance(context, ssl.SSLContext):
            context.load_cert_chain(str(cert), str(key) if key else None)
    return headers, context
