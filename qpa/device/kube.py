"""The few Kubernetes calls the device layer makes, on plain dicts, through the `kubernetes` client.

Leases (`coordination.k8s.io/v1`): list by label, get, create, replace (with the read
`resourceVersion`, so a concurrent writer answers 409 `Conflict`); DevicePools: get and
merge-patch the `status` subresource; Pods: list by label (the adb gate's allowlist). Errors
become `NotFound`, `Conflict` or `KubeError` with
the server's message. In a pod the service account is used; elsewhere the kubeconfig.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from qpa.api import GROUP, VERSION, DevicePool

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT_S = 10.0


class KubeError(Exception):
    """The API server refused a request or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


def _error(exc: Exception, what: str) -> KubeError:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            message = exc.reason
        cls = {404: NotFound, 409: Conflict}.get(exc.status or 0, KubeError)
        return cls(f"{what}: {message}", exc.status)
    return KubeError(f"{what}: {exc}")


def default_namespace(explicit: str | None = None) -> str:
    """The namespace to work in: explicit, $POD_NAMESPACE, the pod's, the kubeconfig's."""
    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    try:
        _, context = k8s_config.list_kube_config_contexts()
        return str((context or {}).get("context", {}).get("namespace") or "default")
    except Exception:  # no kubeconfig: the default namespace
        return "default"


class Kube:
    """Leases and DevicePools in one namespace."""

    def __init__(self, api_client: k8s.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self._leases = k8s.CoordinationV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)

    @classmethod
    def connect(cls, namespace: str | None = None, kubeconfig: str | None = None) -> Kube:
        """In a pod: the service account; elsewhere `kubeconfig` or the default one."""
        try:
            if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                k8s_config.load_incluster_config()
                api_client = k8s.ApiClient()
            else:
                api_client = k8s_config.new_client_from_config(config_file=kubeconfig)
        except Exception as exc:  # ConfigException, missing files
            raise KubeError(f"no Kubernetes configuration: {exc}") from exc
        return cls(api_client, default_namespace(namespace))

    def close(self) -> None:
        self.api_client.close()

    def _json(self, call: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        try:
            response = call(
                *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs
            )
        except (ApiException, HTTPError, OSError) as exc:
            raise _error(exc, what) from exc
        return json.loads(response.data or b"null")

    # ------------------------------------------------------------------ leases
    def list_leases(self, selector: str) -> list[dict[str, Any]]:
        body = self._json(
            self._leases.list_namespaced_lease,
            f"list leases {selector}",
            self.namespace,
            label_selector=selector,
        )
        return list(body.get("items") or [])

    def get_lease(self, name: str) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = self._json(
                self._leases.read_namespaced_lease, f"get lease {name}", name, self.namespace
            )
        except NotFound:
            return None
        return lease

    def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        created: dict[str, Any] = self._json(
            self._leases.create_namespaced_lease, f"create lease {name}", self.namespace, body
        )
        return created

    def replace_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        """Write a Lease read earlier; `Conflict` when someone wrote it in between."""
        name = body["metadata"]["name"]
        replaced: dict[str, Any] = self._json(
            self._leases.replace_namespaced_lease,
            f"update lease {name}",
            name,
            self.namespace,
            body,
        )
        return replaced

    # ------------------------------------------------------------------ pods
    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        body = self._json(
            self._core.list_namespaced_pod,
            f"list pods {selector}",
            self.namespace,
            label_selector=selector,
        )
        return list(body.get("items") or [])

    # ------------------------------------------------------------------ device pools
    def get_devicepool(self, name: str) -> dict[str, Any]:
        pool: dict[str, Any] = self._json(
            self._custom.get_namespaced_custom_object,
            f"get DevicePool {name}",
            GROUP,
            VERSION,
            self.namespace,
            DevicePool.info.plural,
            name,
        )
        return pool

    def patch_devicepool_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status (carry `metadata.resourceVersion` to make it conditional)."""
        pool: dict[str, Any] = self._json(
            self._custom.patch_namespaced_custom_object_status,
            f"patch DevicePool {name} status",
            GROUP,
            VERSION,
            self.namespace,
            DevicePool.info.plural,
            name,
            patch,
        )
        return pool
