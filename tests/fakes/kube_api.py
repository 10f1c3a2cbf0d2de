"""A Kubernetes API server for tests: kmock's `KubernetesEmulator`, taught what a real one does.

Stock kmock 0.8 is too thin for kopf and kubectl (see docs in DESIGN.md, "Testing with real
parts"); `KubeAPI` subclasses it and serves, on 127.0.0.1 only:

- **objects** with `uid`, `creationTimestamp`, the namespace from the URL, `generateName`, one
  monotonic `resourceVersion` counter and `generation` (1 on create, +1 when anything outside
  metadata/status changes); a no-op write changes nothing and sends no event;
- **writes**: POST, PUT, PATCH as JSON patch (a failed `test` answers 422), JSON merge patch,
  strategic merge patch (built-in kinds only; custom resources answer 415 as a real server) and
  server-side apply (approximated as a merge); 409 on a stale `metadata.resourceVersion`
  (PUT, patches carrying one, delete preconditions); finalizers and `deletionTimestamp`
  (no finalizer may be added while deleting); `dryRun=All`;
- **status subresource separation**: PUT/PATCH on the object ignore `status`, on `/status`
  ignore everything else; `status` is dropped on create;
- **lists** with `kind`/`apiVersion`, a list `resourceVersion`, `limit`/`continue`, label
  selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`) and field selectors
  (`metadata.name`, `metadata.namespace`, and the fields real servers support per kind,
  e.g. `involvedObject.*` of events for `kubectl describe`);
- **watches** as JSON lines with `Content-Type: application/json`: from a `resourceVersion`
  (410 Gone once it left the kept history), initial ADDED events otherwise,
  `sendInitialEvents` with the closing BOOKMARK, `timeoutSeconds`, and ADDED/DELETED when an
  object starts/stops matching a label selector;
- **tables** (`Accept: ...;as=Table`): `kubectl get` shows the CRD's printer columns;
- **discovery** kubectl and kopf accept: `/api` and `/api/v1` (groupVersion `v1`), `/apis`,
  every group/version with verbs (list, watch, ...), short names, categories and
  subresources (without short names); `v1/namespaces` is there, so kopf never waits silently;
- **CustomResourceDefinitions** as real objects: creating one (kubectl apply -f crds/ or
  `install_crds`) registers its kind; a non-structural schema or a CEL rule outside the
  supported subset is refused; deleting it deletes its objects;
- **validation** of custom resources against their CRD (fakes.kube_schema: pruning, defaults,
  OpenAPI checks, list-type uniqueness, CEL rules incl. `oldSelf`): 422 `Invalid` with causes
  naming the field path, worded like the real server; metadata names and labels are checked too;
  unknown fields are warned about (`Warning` header) or refused with `fieldValidation=Strict`;
- **built-in kinds validated** against the official Kubernetes 1.37 OpenAPI schemas
  (fakes.kube_builtin, from `kubernetes-validate`) plus the server's own checks (container
  names and images, selectors matching template labels, a Job's restartPolicy): 422 `Invalid`
  naming the field; unknown fields are refused (400 strict decoding error) unless the client
  sends `fieldValidation=Warn`/`Ignore` (stricter than a real server, which drops them: a
  misspelt field the operator writes is a failed test, not a silently lost setting);
- **KServe's CRDs** (InferenceService, ServingRuntime; vendored in `vendor/kserve/` with their
  license) installed as real CRDs, so InferenceServices go through the custom resource
  pipeline above;
- **`/openapi/v3`** (fakes.kube_openapi): the group-version documents kubectl reads, so
  `kubectl apply` runs with validation on and leaves it to the server (`fieldValidation=Strict`);
- **garbage collection**: deleting an owner deletes its dependents (background or foreground,
  or orphans them), recursively; deleting a namespace deletes what is in it;
- **fault injection** (`kube.faults`): fail a fraction or the next N requests with 500, 409,
  429 (with Retry-After) or 503, optionally by method and resource, for reliability tests;
  `slow_down(seconds)` answers later, like a loaded server.

Simplifications (documented, not hidden): one stored version per resource (no conversion),
garbage collection runs synchronously right after the owner is gone, namespaces need no
`kubernetes` finalizer, no authentication or RBAC, no `pods/log` subresource (`scale` is
served for custom resources only), no `/openapi/v2` (kubectl reads v3), watch bookmarks
are sent only for `sendInitialEvents`.

Use it three ways:

- `kube_api` fixture (pytest_plugins = ["fakes.kube_api"]): a `KubeAPIServer` running the
  emulator in its own thread and event loop with qpa's CRDs installed, so synchronous clients
  (`kubernetes`, `kubectl`), kopf's `KopfRunner` (another thread) and async tests all reach it;
  `kube_config` writes a kubeconfig and points `$KUBECONFIG` and the `kubernetes` package at it;
  `kube_client` is a `kubernetes.client.ApiClient` on it.
- `KubeAPIServer(crds=...)` as a context manager, outside pytest.
- In-loop: `async with KubeAPI() as kube, kmock.Server(kube) as srv:` (only async clients then).

    def test_it(kube_api, kube_config):
        kube_api.create({"apiVersion": "qpa.ai/v1alpha1", "kind": "TrainingRun", ...})
        kube_api.faults.fail_fraction(0.2, status=500, methods={"PATCH"})
        assert kube_api.get("qtr", "default", "demo")["status"]["phase"] == "Running"
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import copy
import datetime
import functools
import json
import random
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp.web
import attrs
import kmock
import orjson
import pytest
import yaml
from kmock._internal import rendering

from fakes import kube_builtin, kube_openapi
from fakes.kube_cel import CelSyntaxError, compile_rule
from fakes.kube_schema import (
    CustomResourceSchema,
    FieldError,
    compiled_schema,
    format_path,
    go_value,
)
from qpa.api.crdgen import structural_problems

__all__ = [
    "ApiError",
    "Fault",
    "FaultInjector",
    "KubeAPI",
    "KubeAPIServer",
    "ResourceType",
    "kube_api",
    "kube_client",
    "kube_config",
    "write_kubeconfig",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CRDS_DIR = REPO_ROOT / "crds"
#: KServe's own CRDs (InferenceService, ServingRuntime), vendored with their license.
VENDOR_CRDS_DIR = Path(__file__).resolve().parent / "vendor" / "kserve"

SERVER_VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.1-qpa-test",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
QUALIFIED_NAME_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
#: apimachinery's TotalAnnotationSizeLimitB: keys and values of all annotations together.
ANNOTATIONS_SIZE_LIMIT = 256 * 1024


def _qualified_name_problems(key: str) -> list[str]:
    """apimachinery's IsQualifiedName: `[prefix/]name`, worded as the real server words it."""
    parts = key.split("/")
    if len(parts) > 2:
        return [
            f"a qualified name {QUALIFIED_NAME_MESSAGE} with an optional DNS subdomain prefix "
            "and '/' (e.g. 'example.com/MyName')"
        ]
    problems = []
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        elif len(prefix) > 253:
            problems.append("prefix part must be no more than 253 characters")
        elif not DNS1123_SUBDOMAIN.match(prefix):
            problems.append(f"prefix part {SUBDOMAIN_MESSAGE}")
    if not name:
        problems.append("name part must be non-empty")
    else:
        if len(name) > 63:
            problems.append("name part must be no more than 63 characters")
        if not LABEL_NAME.match(name):
            problems.append(f"name part {QUALIFIED_NAME_MESSAGE}")
    return problems


def _label_value_problems(value: str) -> list[str]:
    """apimachinery's IsValidLabelValue."""
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not LABEL_VALUE.match(value):
        problems.append(LABEL_VALUE_MESSAGE)
    return problems


SYSTEM_METADATA = (
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
)


# --------------------------------------------------------------------------- resource types


@dataclass
class ResourceType:
    """One served resource: names, scope, subresources, and (for CRDs) schema and columns."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    schema: CustomResourceSchema | None = None
    crd: str | None = None  # name of the defining CRD, None for built-ins
    scale: Mapping[str, str] | None = None  # a CRD's scale subresource paths
    field_selectors: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.singular = self.singular or self.kind.lower()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def resource(self) -> kmock.resource:
        return kmock.resource(group=self.group, version=self.version, plural=self.plural)

    @property
    def group_resource(self) -> str:
        """`trainingruns.qpa.ai`, `pods`: how messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        """`TrainingRun.qpa.ai`, `Pod`: how 422 messages name the kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def matches_name(self, name: str) -> bool:
        """Does `name` (plural, singular, kind, short name, with optional group) mean this type?"""
        wanted = name.lower()
        base, _, group = wanted.partition(".")
        if group and group != self.group and wanted not in (self.group_resource,):
            return False
        names = {self.plural, self.singular, self.kind.lower(), *self.short_names}
        return base in names or wanted in names


def _builtin(
    group: str,
    plural: str,
    kind: str,
    *,
    version: str = "v1",
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    fields: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        subresources=frozenset(sub),
        categories=categories,
        field_selectors=frozenset(fields),
    )


EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)


def builtin_types() -> list[ResourceType]:
    """The built-in kinds the operator creates, watches or kubectl shows (KServe's kinds come
    from its vendored CRDs, `VENDOR_CRDS_DIR`)."""
    return [
        _builtin("", "namespaces", "Namespace", namespaced=False, short=("ns",),
                 sub=("status", "finalize"), fields=("status.phase",)),
        _builtin("", "pods", "Pod", short=("po",), sub=("status",), categories=("all",),
                 fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                         "spec.serviceAccountName", "status.phase", "status.podIP")),
        _builtin("", "services", "Service", short=("svc",), sub=("status",), categories=("all",)),
        _builtin("", "configmaps", "ConfigMap", short=("cm",)),
        _builtin("", "secrets", "Secret", fields=("type",)),
        _builtin("", "events", "Event", short=("ev",), fields=EVENT_FIELDS),
        _builtin("", "serviceaccounts", "ServiceAccount", short=("sa",)),
        _builtin("", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",),
                 sub=("status",)),
        _builtin("", "endpoints", "Endpoints", short=("ep",)),
        _builtin("", "nodes", "Node", namespaced=False, short=("no",), sub=("status",),
                 fields=("spec.unschedulable",)),
        _builtin("apps", "deployments", "Deployment", short=("deploy",), sub=("status",),
                 categories=("all",)),
        _builtin("apps", "statefulsets", "StatefulSet", short=("sts",), sub=("status",),
                 categories=("all",)),
        _builtin("apps", "daemonsets", "DaemonSet", short=("ds",), sub=("status",),
                 categories=("all",)),
        _builtin("apps", "replicasets", "ReplicaSet", short=("rs",), sub=("status",),
                 categories=("all",)),
        _builtin("batch", "jobs", "Job", sub=("status",), categories=("all",),
                 fields=("status.successful",)),
        _builtin("batch", "cronjobs", "CronJob", short=("cj",), sub=("status",),
                 categories=("all",)),
        _builtin("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
                 version="v2", short=("hpa",), sub=("status",), categories=("all",)),
        _builtin("coordination.k8s.io", "leases", "Lease"),
        _builtin("networking.k8s.io", "networkpolicies", "NetworkPolicy", short=("netpol",)),
        _builtin("events.k8s.io", "events", "Event", short=("ev",)),
        _builtin("policy", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",),
                 sub=("status",)),
        _builtin("rbac.authorization.k8s.io", "roles", "Role"),
        _builtin("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
        _builtin("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", namespaced=False),
        _builtin("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding",
                 namespaced=False),
        _builtin("admissionregistration.k8s.io", "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicy", namespaced=False, sub=("status",),
                 categories=("api-extensions",)),
        _builtin("admissionregistration.k8s.io", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", namespaced=False,
                 categories=("api-extensions",)),
        _builtin("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, short=("crd", "crds"), sub=("status",),
                 categories=("api-extensions",)),
    ]  # fmt: skip


BUILTIN_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "namespaces": [{"name": "Status", "type": "string", "jsonPath": ".status.phase"}],
    "pods": [{"name": "Status", "type": "string", "jsonPath": ".status.phase"}],
}


# --------------------------------------------------------------------------- errors


#: The largest request body kube-apiserver reads (`MaxRequestBodyBytes`, 3 MiB).
MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
#: What a body nested past the JSON decoder's depth limit parses to.
TOO_DEEP: Any = object()


class ApiError(Exception):
    """An API answer other than success, rendered as a `Status` object."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})
        self.headers = dict(headers or {})

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    def response(self) -> kmock.Response:
        return kmock.Response(status=self.code, payload=self.status(), headers=self.headers)

    @classmethod
    def not_found(cls, rtype: ResourceType, name: str) -> ApiError:
        return cls(
            404,
            "NotFound",
            f'{rtype.group_resource} "{name}" not found',
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    @classmethod
    def no_resource(cls) -> ApiError:
        return cls(404, "NotFound", "the server could not find the requested resource")

    @classmethod
    def already_exists(cls, rtype: ResourceType, name: str) -> ApiError:
        return cls(
            409,
            "AlreadyExists",
            f'{rtype.group_resource} "{name}" already exists',
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    @classmethod
    def conflict(cls, rtype: ResourceType, name: str, why: str | None = None) -> ApiError:
        why = why or (
            "the object has been modified; please apply your changes to the latest version "
            "and try again"
        )
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rtype.group_resource} "{name}": {why}',
            {"name": name, "group": rtype.group, "kind": rtype.plural},
        )

    @classmethod
    def invalid(cls, rtype: ResourceType, name: str, errors: Sequence[FieldError]) -> ApiError:
        text = (
            errors[0].message
            if len(errors) == 1
            else "[" + ", ".join(error.message for error in errors) + "]"
        )
        return cls(
            422,
            "Invalid",
            f'{rtype.group_kind} "{name}" is invalid: {text}',
            {
                "name": name,
                "group": rtype.group,
                "kind": rtype.kind,
                "causes": [error.cause() for error in errors],
            },
        )

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)


# --------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class ParsedPath:
    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> ParsedPath | None:
    """Split a Kubernetes API path; None for non-API paths (/version, /openapi/v2, ...)."""
    parts = [part for part in path.strip("/").split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return ParsedPath(group, version)
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = "/".join(rest[2:]) or None
    return ParsedPath(group, version, plural, namespace, name, sub)


# --------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present  # "!"


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_TERM = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^()]*)\)$")
_EQ_TERM = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)$")
_EXISTS_TERM = re.compile(rf"^({_KEY})$")
_NOT_TERM = re.compile(rf"^!\s*({_KEY})$")


def _split_terms(text: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k`; 400 on syntax errors, as a real server."""
    requirements = []
    for term in _split_terms(text or ""):
        if match := _SET_TERM.match(term):
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append(Requirement(match.group(1), match.group(2), values))
        elif match := _EQ_TERM.match(term):
            op = "=" if match.group(2) in ("=", "==") else "!="
            requirements.append(Requirement(match.group(1), op, (match.group(3),)))
        elif match := _NOT_TERM.match(term):
            requirements.append(Requirement(match.group(1), "!"))
        elif match := _EXISTS_TERM.match(term):
            requirements.append(Requirement(match.group(1), "exists"))
        else:
            raise ApiError.bad_request(
                f"unable to parse requirement: found '{term}', expected: in, notin, =, ==, !=, "
                "gt, lt"
            )
    return requirements


def parse_field_selector(text: str, rtype: ResourceType) -> list[tuple[str, str, str]]:
    terms = []
    allowed = {"metadata.name", "metadata.namespace", *rtype.field_selectors}
    for term in _split_terms(text or ""):
        match = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", term)
        if match is None:
            raise ApiError.bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        path, op, value = match.group(1), match.group(2), match.group(3)
        if path not in allowed:
            raise ApiError.bad_request(
                f'"{path}" is not a known field selector: only "metadata.name", '
                f'"metadata.namespace"'
            )
        terms.append((path, "!=" if op == "!=" else "=", value))
    return terms


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return str(value.get("component", ""))  # events' source
    return str(value)


@dataclass
class Selector:
    labels: list[Requirement] = field(default_factory=list)
    fields: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def from_params(cls, params: Mapping[str, str], rtype: ResourceType) -> Selector:
        return cls(
            parse_label_selector(params.get("labelSelector", "")),
            parse_field_selector(params.get("fieldSelector", ""), rtype),
        )

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        if not all(requirement.matches(labels) for requirement in self.labels):
            return False
        for path, op, value in self.fields:
            actual = _field_value(obj, path)
            if (actual == value) != (op == "="):
                return False
        return True


# --------------------------------------------------------------------------- patches


class PatchError(Exception):
    """A patch that cannot be applied (answers 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_SMP_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
}
_SMP_SETS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for built-in kinds: merge keys for the lists that have them."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            continue
        current = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _SMP_SETS and isinstance(current, list):
            result[key] = current + [v for v in value if v not in current]
        elif (
            isinstance(value, list)
            and isinstance(current, list)
            and key in _SMP_KEYS | {"ports": ""}
        ):
            result[key] = _merge_list(current, value, key)
        elif isinstance(value, Mapping):
            result[key] = strategic_merge_patch(current, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, Mapping):
            return copy.deepcopy(patch)
        merge_key = _SMP_KEYS.get(key) or ("containerPort" if "containerPort" in item else "port")
        index = next(
            (i for i, old in enumerate(merged) if old.get(merge_key) == item.get(merge_key)), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append(copy.deepcopy(dict(item)))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _json_equal(left: Any, right: Any) -> bool:
    return json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True)


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch; a failed `test` or a missing path raises PatchError."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "test":
            actual = _get_pointer(doc, _pointer(path), path)
            if not _json_equal(actual, op.get("value")):
                raise PatchError(f"testing value {path} failed: test failed")
        elif kind == "remove":
            doc = _remove_pointer(doc, _pointer(path), path)[0]
        elif kind == "add":
            doc = _add_pointer(doc, _pointer(path), copy.deepcopy(op.get("value")), path)
        elif kind == "replace":
            doc = _remove_pointer(doc, _pointer(path), path)[0]
            doc = _add_pointer(doc, _pointer(path), copy.deepcopy(op.get("value")), path)
        elif kind in ("move", "copy"):
            source = op.get("from", "")
            value = copy.deepcopy(_get_pointer(doc, _pointer(source), source))
            if kind == "move":
                doc = _remove_pointer(doc, _pointer(source), source)[0]
            doc = _add_pointer(doc, _pointer(path), value, path)
        else:
            raise PatchError(f"unexpected kind of operation {kind!r}")
    return doc


def _get_pointer(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, Mapping) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"doc is missing path: {path!r}")
    return doc


def _remove_pointer(doc: Any, parts: list[str], path: str) -> tuple[Any, Any]:
    if not parts:
        return None, doc
    parent = _get_pointer(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise PatchError(f"unable to remove nonexistent key: {last}: missing value at {path!r}")


def _add_pointer(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _get_pointer(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"add operation does not apply: index out of range at {path!r}")
    else:
        raise PatchError(f"add operation does not apply: doc is missing path: {path!r}")
    return doc


# --------------------------------------------------------------------------- tables


def _jsonpath(obj: Any, path: str) -> Any:
    """Evaluate the simple JSONPath of printer columns: `.a.b`, `.a[0].b`, `.a['x.y']`."""
    tokens = re.findall(r"\.([^.\[\]]+)|\[(\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]", path)
    value = obj
    for name, index, single, double in tokens:
        if index:
            value = (
                value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
            )
        else:
            key = name or single or double
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is None:
            return None
    return value


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery's HumanDuration, as `kubectl get` prints AGE."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 120:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        return f"{minutes}m{secs % 60}s" if secs % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _parse_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def _now() -> str:
    moment = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------- faults


@dataclass
class Fault:
    """Answer matching requests with an error instead of serving them."""

    status: int = 500
    rate: float = 1.0
    remaining: int | None = None  # None: unlimited
    methods: frozenset[str] | None = None  # GET, POST, PUT, PATCH, DELETE
    resources: frozenset[str] | None = None  # plurals, e.g. {"trainingruns"}
    subresource: str | None = None  # "status" to hit only /status
    watch: bool = False  # also fail watch requests (off: most tests want streams up)
    retry_after: int = 1
    injected: int = 0
    # "error": answer `status`; on watches only: "gone" (a 200 stream whose first event is
    # ERROR 410 Expired), "drop" (the connection is cut within `drop_after` seconds, mid-stream);
    # on lists only: "stale" (the list as it was `lag` writes ago, with that resourceVersion,
    # as from a lagging watch cache)
    effect: str = "error"
    lag: int = 5
    drop_after: float = 1.0

    def matches(self, request: rendering.Request) -> bool:
        if self.remaining == 0:
            return False
        method = str(request.method.value if request.method else "").upper()
        if self.methods is not None and method not in self.methods:
            return False
        watching = request.params.get("watch") in ("true", "1")
        if watching and not self.watch:
            return False
        if self.effect in ("gone", "drop") and not watching:
            return False
        if self.effect == "stale" and (watching or method != "GET" or request.name):
            return False
        plural = request.resource.plural if request.resource is not None else None
        if self.resources is not None and plural not in self.resources:
            return False
        return self.subresource is None or request.subresource == self.subresource

    def error(self, request: rendering.Request) -> ApiError:
        name = request.name or ""
        plural = request.resource.plural if request.resource is not None else ""
        if self.status == 409:
            return ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again "
                "(injected fault)",
                {"name": name, "kind": plural},
            )
        if self.status == 429:
            return ApiError(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later "
                "(injected fault)",
                {"retryAfterSeconds": self.retry_after},
                {"Retry-After": str(self.retry_after)},
            )
        if self.status == 503:
            return ApiError(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request (injected fault)",
                headers={"Retry-After": str(self.retry_after)},
            )
        return ApiError(
            self.status,
            "InternalError",
            "Internal error occurred: injected fault",
            {"causes": [{"message": "injected fault"}]},
        )


class FaultInjector:
    """Fault hooks of a `KubeAPI`: configure from any thread; the server consults them."""

    def __init__(self, seed: int = 0) -> None:
        self._faults: list[Fault] = []
        self._delays: list[tuple[float, frozenset[str] | None]] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.log: list[tuple[int, str, str]] = []  # (status, method, path) of each injection

    def add(
        self,
        status: int = 500,
        *,
        rate: float = 1.0,
        count: int | None = None,
        methods: Iterable[str] | None = None,
        resources: Iterable[str] | None = None,
        subresource: str | None = None,
        watch: bool = False,
        retry_after: int = 1,
        effect: str = "error",
        lag: int = 5,
        drop_after: float = 1.0,
    ) -> Fault:
        """Fail matching requests with `status`, each with probability `rate`, `count` times."""
        if effect not in ("error", "gone", "drop", "stale"):
            raise ValueError(f"effect must be error, gone, drop or stale, not {effect!r}")
        fault = Fault(
            effect=effect,
            lag=lag,
            drop_after=drop_after,
            status=status,
            rate=rate,
            remaining=count,
            methods=frozenset(m.upper() for m in methods) if methods is not None else None,
            resources=frozenset(resources) if resources is not None else None,
            subresource=subresource,
            watch=watch,
            retry_after=retry_after,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail_next(self, count: int = 1, status: int = 500, **options: Any) -> Fault:
        """The next `count` matching requests fail."""
        return self.add(status, count=count, **options)

    def fail_fraction(self, rate: float, status: int = 500, **options: Any) -> Fault:
        """Each matching request fails with probability `rate` (seeded, reproducible)."""
        return self.add(status, rate=rate, **options)

    def expire_watches(self, rate: float = 1.0, **options: Any) -> Fault:
        """Matching watches start with ERROR 410 Expired: the client must relist."""
        return self.add(410, rate=rate, watch=True, effect="gone", **options)

    def drop_watches(self, rate: float = 1.0, *, after: float = 1.0, **options: Any) -> Fault:
        """Matching watches lose their connection within `after` seconds, mid-stream."""
        return self.add(0, rate=rate, watch=True, effect="drop", drop_after=after, **options)

    def stale_lists(self, rate: float = 1.0, *, lag: int = 5, **options: Any) -> Fault:
        """Matching lists answer the state of `lag` writes ago (a lagging watch cache)."""
        return self.add(200, rate=rate, effect="stale", lag=lag, **options)

    def slow_down(self, seconds: float, *, methods: Iterable[str] | None = None) -> None:
        """Answer matching resource requests `seconds` later (a loaded API server)."""
        wanted = frozenset(m.upper() for m in methods) if methods is not None else None
        with self._lock:
            self._delays.append((seconds, wanted))

    def delay(self, request: rendering.Request) -> float:
        if request.params.get("watch") in ("true", "1"):
            return 0.0
        method = str(request.method.value if request.method else "").upper()
        with self._lock:
            return sum(s for s, methods in self._delays if methods is None or method in methods)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._delays.clear()

    @property
    def injected(self) -> int:
        return len(self.log)

    def pick(self, request: rendering.Request) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(request) and self._random.random() < fault.rate:
                    if fault.remaining is not None:
                        fault.remaining -= 1
                    fault.injected += 1
                    method = str(request.method.value if request.method else "")
                    self.log.append((fault.status, method, request.url.path))
                    return fault
        return None


# --------------------------------------------------------------------------- the emulator


@dataclass
class _Event:
    rv: int
    key: tuple[str, str, str]
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


@attrs.define(kw_only=True)
class KubeAPI(kmock.KubernetesEmulator):
    """kmock's emulator with the behaviour of a real API server (see the module docstring)."""

    crds: Any = None  # CRD files/folders to install at start (None: none)
    vendor_crds: Any = VENDOR_CRDS_DIR  # third-party CRDs installed first (None: none)
    require_namespaces: bool = True  # creating in a missing namespace answers 404
    namespaces: Sequence[str] = DEFAULT_NAMESPACES
    history_limit: int = 10_000  # watch events kept for resuming from a resourceVersion
    bookmark_interval: float = 60.0  # BOOKMARK period of watches asking for them (0: never)
    seed: int = 0
    faults: FaultInjector = attrs.field(factory=FaultInjector)

    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _history: collections.deque[_Event] = attrs.field(factory=collections.deque, init=False)
    _trimmed_rv: int = attrs.field(default=0, init=False)
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _random: random.Random = attrs.field(factory=random.Random, init=False)
    warnings: list[str] = attrs.field(factory=list, init=False)
    _resource_reaction: Any = attrs.field(default=None, init=False)
    _builtin_payloads: int = attrs.field(default=0, init=False)
    _request_faults: dict[int, Fault] = attrs.field(factory=dict, init=False)
    _openapi: tuple[Any, dict[str, dict[str, Any]]] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        # Discovery routes and the final 404 of the scaffold, but not kmock's naive
        # object-handling fallbacks: every resource request goes to `_dispatch`.
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.fallback["get", re.compile(r"/(healthz|livez|readyz)(/.*)?")] << b"ok"
        # clients ask `/version/` too (the kubernetes package's VersionApi); a real server answers
        self.fallback["get /version/"] << self._serve_server_version
        self._resource_reaction = self.fallback[self._is_resource_request] << self._dispatch
        self.fallback["get", re.compile(r"/openapi/v3(/.*)?")] << self._serve_openapi_v3
        self.fallback << self._unknown_endpoint
        self._builtin_payloads = len(self._payloads)
        self._random.seed(self.seed)
        for rtype in builtin_types():
            self.register(rtype)
        for namespace in self.namespaces:
            self.create_object(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        if self.vendor_crds is not None:
            self.install_vendor_crds(self.vendor_crds)
        if self.crds is not None:
            self.install_crds(self.crds)

    # ------------------------------------------------------------------ request plumbing

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # As kmock's RawHandler.__call__, but parsing paths like the API server does (kmock 0.8
        # fails on /api/v1/namespaces and reads /api/v1/namespaces/x as a namespace scope).
        # Bodies up to the real server's limit (3 MiB), and over it a Status naming the limit,
        # as kube-apiserver answers (aiohttp's own 413 is a bare 1 MiB one).
        raw_request._client_max_size = MAX_REQUEST_BODY_BYTES
        try:
            await raw_request.read()
        except aiohttp.web.HTTPRequestEntityTooLarge:
            too_large = ApiError(
                413,
                "RequestEntityTooLarge",
                f"the request body is over the limit of {MAX_REQUEST_BODY_BYTES} bytes "
                f"(Request entity too large: limit is {MAX_REQUEST_BODY_BYTES})",
            )
            return aiohttp.web.json_response(too_large.status(), status=413)
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            if self.limit is not None and len(self._requests) >= self.limit:
                raise kmock.KMockError("Too many requests have been served so far.")
            request = await self._parse_request(raw_request, len(self._requests))
            self._requests.append(request)
            try:
                return await self._handle(request)
            except rendering.StreamingError as exc:
                raw_response = exc.args[0]
                if exc.__cause__ is not None:
                    raise exc.__cause__ from None
                raise  # pragma: no cover
        except Exception as exc:
            if not self._errors:
                raise
            self._errors[-1].append(exc)
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, raw_response)
            await raw_response.write_eof()
            return raw_response

    @staticmethod
    async def _parse_request(raw: aiohttp.web.BaseRequest, request_id: int) -> rendering.Request:
        body = await raw.read()
        text = body.decode("utf-8", errors="replace")
        data: Any = None
        if text.strip():
            try:
                data = json.loads(text)
            except RecursionError:
                data = TOO_DEEP
            except ValueError:
                try:
                    data = yaml.safe_load(text)
                except yaml.YAMLError:
                    data = None
        parsed = parse_path(raw.path)
        params = dict(raw.query)
        resource = action = None
        namespace = name = sub = None
        if parsed is not None:
            resource = kmock.resource(
                group=parsed.group, version=parsed.version, plural=parsed.plural
            )
            namespace, name, sub = parsed.namespace, parsed.name, parsed.subresource
            if parsed.plural is not None:
                method = raw.method.upper()
                if method == "GET" and params.get("watch") in ("true", "1"):
                    action = kmock.action.WATCH
                elif method == "GET":
                    action = kmock.action.FETCH if name else kmock.action.LIST
                elif method == "POST" and not name:
                    action = kmock.action.CREATE
                elif method in ("PUT", "PATCH") and name:
                    action = kmock.action.UPDATE
                elif method == "DELETE" and name:
                    action = kmock.action.DELETE
        return rendering.Request(
            id=request_id,
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=params,
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=resource,
            namespace=namespace,
            name=name,
            subresource=sub,
        )

    @staticmethod
    def _is_resource_request(request: rendering.Request) -> bool:
        return request.resource is not None and request.resource.plural is not None

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if self._is_resource_request(request):
            if delay := self.faults.delay(request):
                await asyncio.sleep(delay)
            fault = self.faults.pick(request)
            if fault is not None and fault.effect != "error":
                self._request_faults[request.id] = fault  # served, but broken (see Fault)
            elif fault is not None:
                return await fault.error(request).response()(request)
            # With no reactions added after start-up, a resource request can only reach
            # `_dispatch`: go there directly. kmock's matching checks `request in view`, which
            # scans every request served so far, so matching made each request O(history).
            if (
                self._resource_reaction is not None
                and len(self._payloads) == self._builtin_payloads
            ):
                return await self._resource_reaction(request)
        # Skip KubernetesEmulator._handle: it stores bodies naively before any validation.
        return await kmock.RawHandler._handle(self, request)

    async def _unknown_endpoint(self, request: rendering.Request) -> kmock.Response:
        return ApiError(
            404, "NotFound", "the server could not find the requested resource"
        ).response()

    @staticmethod
    def _header(request: rendering.Request, name: str) -> str:
        raw = request._raw_request
        if raw is not None:
            return str(raw.headers.get(name, ""))
        return next((v for k, v in request.headers.items() if k.lower() == name.lower()), "")

    # ------------------------------------------------------------------ registry

    def register(self, rtype: ResourceType) -> None:
        """Serve a resource type (built-ins at start; CRD kinds when their CRD is created)."""
        self._types[rtype.key] = rtype
        self._resources[rtype.resource] = kmock.ResourceInfo(
            namespaced=rtype.namespaced,
            kind=rtype.kind,
            singular=rtype.singular,
            verbs=set(VERBS),
            shortnames=set(rtype.short_names),
            categories=set(rtype.categories),
            subresources=set(rtype.subresources),
        )

    def unregister(self, rtype: ResourceType) -> None:
        self._types.pop(rtype.key, None)
        if rtype.resource in self._resources:
            del self._resources[rtype.resource]

    @property
    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def resolve(self, name: str) -> ResourceType:
        """A type by `group/version/plural`, `plural.group`, plural, kind or short name."""
        parsed = kmock.resource(name) if "/" in name else None
        for rtype in self._types.values():
            if parsed is not None and parsed.group is not None and parsed.version is not None:
                if rtype.key == (parsed.group, parsed.version, parsed.plural):
                    return rtype
            elif rtype.matches_name(name):
                return rtype
        raise KeyError(f"no resource type {name!r}")

    def _type_of(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rtype in self._types.values():
            if rtype.group == group and rtype.version == version and rtype.kind == kind:
                return rtype
        raise ApiError.bad_request(f'no matches for kind "{kind}" in version "{api_version}"')

    # ------------------------------------------------------------------ storage helpers

    def _key(self, rtype: ResourceType, namespace: str | None, name: str) -> tuple[Any, ...]:
        return (rtype.resource, namespace if rtype.namespaced else None, name)

    def _load(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self._key(rtype, namespace, name)
        if key not in self._objects:
            return None
        obj = self._objects[key]
        return None if obj.deleted else copy.deepcopy(obj.raw)

    def _store(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = self._key(rtype, meta.get("namespace"), meta["name"])
        snapshot = copy.deepcopy(obj)
        if key not in self._objects:
            self._objects[key] = snapshot
        else:
            self._objects[key].history.append(snapshot)

    def _objects_of(
        self, rtype: ResourceType, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        result = []
        for (resource, ns, _), obj in self._objects.items():
            wanted = namespace is None or ns == namespace
            if resource == rtype.resource and not obj.deleted and wanted:
                result.append(obj.raw)
        result.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return result

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(
        self,
        rtype: ResourceType,
        event_type: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None = None,
    ) -> None:
        self._history.append(
            _Event(
                int(obj["metadata"]["resourceVersion"]),
                rtype.key,
                event_type,
                copy.deepcopy(obj),
                old,
            )
        )
        while len(self._history) > self.history_limit:
            self._trimmed_rv = self._history.popleft().rv
        self._changed.set()
        self._changed = asyncio.Event()

    def close_watches(self) -> None:
        """End every open watch stream (before the server stops)."""
        self._closing = True
        self._changed.set()

    # ------------------------------------------------------------------ public helpers

    def install_crds(self, paths: str | Path | Iterable[str | Path]) -> list[str]:
        """Create the CRDs found in YAML files or folders; returns the CRD names."""
        items = [paths] if isinstance(paths, str | Path) else list(paths)
        files: list[Path] = []
        for item in items:
            path = Path(item)
            files.extend(sorted(path.glob("*.yaml")) if path.is_dir() else [path])
        names = []
        for file in files:
            for doc in _yaml_documents(file):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    created = self.apply_object(doc)
                    names.append(created["metadata"]["name"])
        return names

    def install_vendor_crds(self, folder: str | Path) -> list[str]:
        """Install third-party CRDs (KServe's): through the whole pipeline (`apply_object`) once
        per process, then, in later servers, the admitted objects and their resource types as
        they came out. The stored CRD is shared between servers, never mutated (the store
        copies on every read): KServe's InferenceService CRD is 700 kB, which copied through
        create took seconds per test."""
        crd_type = self._types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        names = []
        for file in sorted(Path(folder).glob("*.yaml")):
            cache_key = (str(file.resolve()), file.stat().st_mtime_ns)
            admitted = _VENDOR_ADMITTED.get(cache_key)
            if admitted is None:
                admitted = []
                for name in self.install_crds(file):
                    crd = self._load(crd_type, None, name)
                    assert crd is not None
                    admitted.append((crd, [t for t in self._types.values() if t.crd == name]))
                _VENDOR_ADMITTED[cache_key] = admitted
                names += [crd["metadata"]["name"] for crd, _ in admitted]
                continue
            for crd, rtypes in admitted:
                obj = dict(crd)  # spec and status shared, read-only; fresh metadata
                obj["metadata"] = {
                    **crd["metadata"],
                    "uid": str(uuid.UUID(int=self._random.getrandbits(128), version=4)),
                    "creationTimestamp": _now(),
                    "resourceVersion": self._next_rv(),
                }
                self._objects[self._key(crd_type, None, obj["metadata"]["name"])] = obj
                rv = int(obj["metadata"]["resourceVersion"])
                self._history.append(_Event(rv, crd_type.key, "ADDED", obj))
                for rtype in rtypes:
                    self.register(rtype)
                names.append(obj["metadata"]["name"])
        return names

    def create_object(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create as a client would (validation included); raises ApiError."""
        rtype = self._type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        ns = (
            namespace
            or obj.get("metadata", {}).get("namespace")
            or ("default" if rtype.namespaced else None)
        )
        return self._create(rtype, ns, copy.deepcopy(dict(obj)), {})[0]

    def apply_object(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create, or replace the existing object's content (like `kubectl apply`, simplified)."""
        rtype = self._type_of(obj.get("apiVersion", ""), obj.get("kind", ""))
        meta = obj.get("metadata", {})
        ns = namespace or meta.get("namespace") or ("default" if rtype.namespaced else None)
        current = self._load(rtype, ns, meta.get("name", ""))
        if current is None:
            return self.create_object(obj, ns)
        new = merge_patch(current, {k: v for k, v in obj.items() if k != "status"})
        return self._commit(rtype, current, new, {}, subresource=None)[0]

    def get_object(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object (a copy), or None."""
        return self._load(self.resolve(resource), namespace, name)

    def list_objects(
        self, resource: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        rtype = self.resolve(resource)
        selector = Selector(parse_label_selector(label_selector))
        return [copy.deepcopy(o) for o in self._objects_of(rtype, namespace) if selector.matches(o)]

    def patch_object(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch an object (or its status with subresource="status"); raises ApiError."""
        rtype = self.resolve(resource)
        current = self._load(rtype, namespace, name)
        if current is None:
            raise ApiError.not_found(rtype, name)
        new = merge_patch(current, patch)
        return self._commit(rtype, current, new, {}, subresource=subresource)[0]

    def patch_status(
        self, resource: str, namespace: str | None, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch `.status` through the status subresource (what a controller does)."""
        return self.patch_object(
            resource, namespace, name, {"status": dict(status)}, subresource="status"
        )

    def delete_object(
        self, resource: str, namespace: str | None, name: str, propagation: str = "Background"
    ) -> dict[str, Any]:
        rtype = self.resolve(resource)
        return self._delete(rtype, namespace, name, {"propagationPolicy": propagation}, {})[0]

    def events_for(self, resource: str) -> list[tuple[str, dict[str, Any]]]:
        """The watch events kept for a resource type: (type, object), oldest first."""
        key = self.resolve(resource).key
        return [(e.type, copy.deepcopy(e.obj)) for e in self._history if e.key == key]

    # ------------------------------------------------------------------ dispatch

    async def _dispatch(self, request: rendering.Request) -> Any:
        try:
            assert request.resource is not None
            key = (
                request.resource.group or "",
                request.resource.version or "",
                request.resource.plural or "",
            )
            rtype = self._types.get(key)
            if rtype is None:
                raise ApiError.no_resource()
            namespace, name, sub = request.namespace, request.name, request.subresource
            if rtype.namespaced is False and namespace is not None:
                raise ApiError.no_resource()
            if sub is not None and sub not in rtype.subresources:
                raise ApiError.no_resource()
            method = str(request.method.value).upper()
            params = dict(request.params)
            if method == "GET" and params.get("watch") in ("true", "1"):
                if name:
                    params["fieldSelector"] = ",".join(
                        filter(None, [params.get("fieldSelector"), f"metadata.name={name}"])
                    )
                return self._watch(request, rtype, namespace, params)
            if rtype.namespaced and namespace is None and (name or method not in ("GET",)):
                raise ApiError.no_resource()
            if sub == "scale" and name and rtype.scale is not None:
                return self._scale(rtype, namespace, name, request, method, params)
            headers: dict[str, str] = {}
            if "protobuf" in self._header(request, "Content-Type"):
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the test API server reads JSON bodies only, not protobuf (send JSON, e.g. "
                    "`kubectl apply -f` instead of `kubectl create namespace`)",
                )
            if method == "GET":
                stale = self._request_faults.pop(request.id, None)
                body = (
                    self._get(rtype, namespace, name, params)
                    if name
                    else self._list(rtype, namespace, params, lag=stale.lag if stale else 0)
                )
                if "as=Table" in self._header(request, "Accept"):
                    body = self._table(rtype, body, params, self._header(request, "Accept"))
                return kmock.Response(status=200, payload=body)
            if method == "POST" and not name:
                body, headers = self._create(rtype, namespace, self._body(request), params)
                return kmock.Response(status=201, payload=body, headers=headers)
            if method == "PUT" and name:
                body, headers = self._replace(
                    rtype, namespace, name, self._body(request), params, sub
                )
                return kmock.Response(status=200, payload=body, headers=headers)
            if method == "PATCH" and name:
                body, headers, status = self._patch(rtype, namespace, name, request, params, sub)
                return kmock.Response(status=status, payload=body, headers=headers)
            if method == "DELETE" and name and sub is None:
                options = request.data if isinstance(request.data, dict) else {}
                body, status = self._delete(rtype, namespace, name, options, params)
                return kmock.Response(status=status, payload=body)
            if method == "DELETE" and not name:
                options = request.data if isinstance(request.data, dict) else {}
                return kmock.Response(
                    status=200, payload=self._delete_collection(rtype, namespace, options, params)
                )
            raise ApiError(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        except ApiError as exc:
            return exc.response()

    @staticmethod
    def _body(request: rendering.Request) -> dict[str, Any]:
        if request.data is TOO_DEEP:
            raise ApiError.bad_request(
                "the request body nests deeper than the JSON decoder's depth limit"
            )
        if not isinstance(request.data, dict):
            raise ApiError.bad_request("the body of the request must be a JSON object")
        return copy.deepcopy(request.data)

    # ------------------------------------------------------------------ scale

    def _scale_of(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale of a custom resource, read through its CRD's paths."""
        paths = rtype.scale or {}
        meta = obj["metadata"]
        status: dict[str, Any] = {
            "replicas": _jsonpath(obj, paths.get("statusReplicasPath", "")) or 0
        }
        if paths.get("labelSelectorPath"):
            selector = _jsonpath(obj, paths["labelSelectorPath"])
            if selector:
                status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": _jsonpath(obj, paths.get("specReplicasPath", "")) or 0},
            "status": status,
        }

    def _scale(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        request: rendering.Request,
        method: str,
        params: Mapping[str, str],
    ) -> kmock.Response:
        """GET/PUT/PATCH `<plural>/<name>/scale`: a Scale whose `spec.replicas` is written to
        the CRD's specReplicasPath (the object is then validated like any update)."""
        current = self._load(rtype, namespace, name)
        if current is None:
            raise ApiError.not_found(rtype, name)
        scale = self._scale_of(rtype, current)
        if method == "GET":
            return kmock.Response(status=200, payload=scale)
        if method == "PUT":
            desired = self._body(request)
            version = (desired.get("metadata") or {}).get("resourceVersion")
            if version and version != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(rtype, name)
        elif method == "PATCH":
            content_type = self._header(request, "Content-Type").split(";")[0].strip().lower()
            try:
                if content_type == "application/json-patch+json":
                    desired = json_patch(scale, request.data)
                elif isinstance(request.data, dict):  # merge or strategic: Scale has no lists
                    desired = merge_patch(scale, request.data)
                else:
                    raise PatchError("a merge patch must be a JSON object")
            except PatchError as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request: {exc}") from exc
        else:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on scale"
            )
        replicas = (desired.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError.invalid(
                rtype,
                name,
                [
                    FieldError(
                        "spec.replicas",
                        "FieldValueInvalid",
                        f"Invalid value: {replicas!r}: must be greater than or equal to 0",
                    )
                ],
            )
        new = copy.deepcopy(current)
        path = (rtype.scale or {})["specReplicasPath"]
        *parents, leaf = [part for part in path.split(".") if part]
        target = new
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = replicas
        stored, _ = self._commit(rtype, current, new, params, subresource=None)
        return kmock.Response(status=200, payload=self._scale_of(rtype, stored))

    # ------------------------------------------------------------------ reads

    def _get(
        self, rtype: ResourceType, namespace: str | None, name: str, params: Mapping[str, str]
    ) -> dict[str, Any]:
        obj = self._load(rtype, namespace, name)
        if obj is None:
            raise ApiError.not_found(rtype, name)
        return obj

    def _list(
        self,
        rtype: ResourceType,
        namespace: str | None,
        params: Mapping[str, str],
        *,
        lag: int = 0,
    ) -> dict[str, Any]:
        selector = Selector.from_params(params, rtype)
        as_of, objects = (
            self._objects_as_of(rtype, namespace, lag)
            if lag
            else (self._rv, self._objects_of(rtype, namespace))
        )
        items = [copy.deepcopy(o) for o in objects if selector.matches(o)]
        for item in items:
            item.setdefault("apiVersion", rtype.api_version)
            item.setdefault("kind", rtype.kind)
        meta: dict[str, Any] = {"resourceVersion": str(as_of)}
        start = 0
        if params.get("continue"):
            try:
                token = json.loads(base64.b64decode(params["continue"]))
                start, meta["resourceVersion"] = int(token["start"]), str(token["rv"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError.bad_request("continue key is not valid") from exc
        limit = int(params.get("limit") or 0)
        if limit > 0 and start + limit < len(items):
            token = {"start": start + limit, "rv": meta["resourceVersion"]}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start : start + limit]
        else:
            items = items[start:]
        return {
            "apiVersion": rtype.api_version,
            "kind": f"{rtype.kind}List",
            "metadata": meta,
            "items": items,
        }

    def _objects_as_of(
        self, rtype: ResourceType, namespace: str | None, lag: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """The objects as they were `lag` writes ago (within the kept history), and that
        resourceVersion: the current ones with the newer events undone."""
        as_of = max(self._trimmed_rv, self._rv - lag)
        state = {
            (o["metadata"].get("namespace"), o["metadata"]["name"]): o
            for o in self._objects_of(rtype, namespace)
        }
        for event in reversed(self._history):
            if event.rv <= as_of:
                break
            meta = event.obj["metadata"]
            if event.key != rtype.key or namespace not in (None, meta.get("namespace")):
                continue
            key = (meta.get("namespace"), meta["name"])
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.type == "MODIFIED" and event.old is not None:
                state[key] = event.old
            elif event.type == "DELETED":
                state[key] = event.obj
        objects = sorted(state.values(), key=lambda o: (o["metadata"].get("namespace") or "",
                                                         o["metadata"]["name"]))  # fmt: skip
        return as_of, objects

    def _table(
        self, rtype: ResourceType, body: dict[str, Any], params: Mapping[str, str], accept: str
    ) -> dict[str, Any]:
        objs = (
            body["items"] if body.get("kind", "").endswith("List") and "items" in body else [body]
        )
        columns = rtype.printer_columns or BUILTIN_COLUMNS.get(rtype.plural, [])
        if not any(col.get("type") == "date" for col in columns):
            columns = [
                *columns,
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            ]
        definitions = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "description": "Name must be unique within a namespace.",
                "priority": 0,
            }
        ] + [
            {
                "name": col["name"],
                "type": col.get("type", "string"),
                "format": col.get("format", ""),
                "description": col.get("description", ""),
                "priority": col.get("priority", 0),
            }
            for col in columns
        ]
        include = params.get("includeObject", "Metadata")
        now = datetime.datetime.now(datetime.UTC)
        rows = []
        for obj in objs:
            cells: list[Any] = [obj["metadata"]["name"]]
            for col in columns:
                value = _jsonpath(obj, col["jsonPath"])
                if col.get("type") == "date" and isinstance(value, str):
                    moment = _parse_time(value)
                    value = human_duration((now - moment).total_seconds()) if moment else value
                elif isinstance(value, dict | list):
                    value = json.dumps(value)
                cells.append(value)
            row: dict[str, Any] = {"cells": cells}
            if include == "Object":
                row["object"] = obj
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                }
            rows.append(row)
        version = "v1" if "v=v1;" in accept or accept.rstrip().endswith("v=v1") else "v1beta1"
        meta = {"resourceVersion": body.get("metadata", {}).get("resourceVersion", str(self._rv))}
        if body.get("metadata", {}).get("continue"):
            meta["continue"] = body["metadata"]["continue"]
        return {
            "kind": "Table",
            "apiVersion": f"meta.k8s.io/{version}",
            "metadata": meta,
            "columnDefinitions": definitions,
            "rows": rows,
        }

    def _watch(
        self,
        request: rendering.Request,
        rtype: ResourceType,
        namespace: str | None,
        params: Mapping[str, str],
    ) -> kmock.Response:
        selector = Selector.from_params(params, rtype)
        since = params.get("resourceVersion", "")
        if since not in ("", "0"):
            try:
                int(since)
            except ValueError as exc:
                raise ApiError.bad_request(f"invalid resource version {since!r}") from exc
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        stream = self._watch_stream(request, rtype, namespace, selector, params, since, timeout)
        return kmock.Response(
            status=200, headers={"Content-Type": "application/json"}, payload=stream
        )

    async def _watch_stream(
        self,
        request: rendering.Request,
        rtype: ResourceType,
        namespace: str | None,
        selector: Selector,
        params: Mapping[str, str],
        since: str,
        timeout: float | None,
    ) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        yield b""  # send the headers now: clients wait for them before reading events
        fault = self._request_faults.pop(request.id, None)
        if fault is not None and fault.effect == "gone":
            expired = ApiError(410, "Expired", "too old resource version (injected fault)")
            yield _line("ERROR", expired.status())
            return
        drop_at = (
            loop.time() + self._random.uniform(0.05, fault.drop_after)
            if fault is not None and fault.effect == "drop"
            else None
        )
        initial = params.get("sendInitialEvents") == "true"
        if since in ("", "0") or initial:
            position = self._rv
            for obj in self._objects_of(rtype, namespace):
                if selector.matches(obj):
                    yield _line("ADDED", obj)
            if initial:
                bookmark = {
                    "apiVersion": rtype.api_version,
                    "kind": rtype.kind,
                    "metadata": {
                        "resourceVersion": str(position),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                yield _line("BOOKMARK", bookmark)
        else:
            position = int(since)
            if position < self._trimmed_rv:
                gone = ApiError(
                    410, "Expired", f"too old resource version: {since} ({self._trimmed_rv})"
                )
                yield _line("ERROR", gone.status())
                return
        raw = request._raw_request
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1") and self.bookmark_interval
        next_bookmark = loop.time() + (self.bookmark_interval or 0.0)
        while not self._closing:
            changed = self._changed
            # Only the events newer than `position`, found from the end: a scan of the whole
            # history per change made every watch O(history) with many objects.
            fresh: list[_Event] = []
            for event in reversed(self._history):
                if event.rv <= position:
                    break
                fresh.append(event)
            for event in reversed(fresh):
                position = event.rv
                if event.key != rtype.key:
                    continue
                obj_ns = event.obj["metadata"].get("namespace")
                if namespace is not None and obj_ns != namespace:
                    continue
                now_matches = selector.matches(event.obj)
                was_matching = event.old is not None and selector.matches(event.old)
                if event.type == "MODIFIED" and event.old is not None:
                    if now_matches and not was_matching:
                        yield _line("ADDED", event.obj)
                    elif was_matching and not now_matches:
                        yield _line("DELETED", event.obj)
                    elif now_matches:
                        yield _line("MODIFIED", event.obj)
                elif now_matches:
                    yield _line(event.type, event.obj)
            if bookmarks and loop.time() >= next_bookmark:
                # As a real server does about once a minute: clients see the stream is alive.
                next_bookmark = loop.time() + self.bookmark_interval
                bookmark = {
                    "apiVersion": rtype.api_version,
                    "kind": rtype.kind,
                    "metadata": {"resourceVersion": str(max(position, self._rv))},
                }
                position = max(position, self._rv)
                yield _line("BOOKMARK", bookmark)
            if deadline is not None and loop.time() >= deadline:
                return
            if raw is not None and (raw.transport is None or raw.transport.is_closing()):
                return
            if drop_at is not None and loop.time() >= drop_at:
                if raw is not None and raw.transport is not None:
                    raw.transport.abort()  # cut, not ended: no final chunk reaches the client
                return
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - loop.time()))
            if drop_at is not None:
                wait = max(0.0, min(wait, drop_at - loop.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=wait)

    # ------------------------------------------------------------------ writes

    def _check_kind(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        if not obj.get("kind"):
            if rtype.crd is not None:  # typed (built-in) endpoints default it from the URL
                raise ApiError.bad_request(f"Object 'Kind' is missing in '{json.dumps(obj)[:200]}'")
            obj["kind"] = rtype.kind
        if obj.get("apiVersion") and obj["apiVersion"] != rtype.api_version:
            raise ApiError.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected "
                f"API version ({rtype.api_version})"
            )
        if obj["kind"] != rtype.kind:
            raise ApiError.bad_request(
                f"the kind in the data ({obj['kind']}) does not match the expected kind "
                f"({rtype.kind})"
            )
        obj["apiVersion"] = rtype.api_version
        if not isinstance(obj.get("metadata", {}), dict):
            raise ApiError.bad_request("metadata must be an object")

    def _check_namespace(self, rtype: ResourceType, namespace: str | None) -> None:
        if not rtype.namespaced or not self.require_namespaces:
            return
        ns_type = self._types[("", "v1", "namespaces")]
        ns = self._load(ns_type, None, namespace or "")
        if ns is None:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
            )

    def _create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        obj: dict[str, Any],
        params: Mapping[str, str],
    ) -> tuple[dict[str, Any], dict[str, str]]:
        self._check_kind(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if rtype.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = namespace or meta.get("namespace")
        else:
            meta.pop("namespace", None)
        for key in (*SYSTEM_METADATA, "managedFields"):
            meta.pop(key, None)
        if not meta.get("name") and meta.get("generateName"):
            for _ in range(100):
                suffix = "".join(self._random.choice(GENERATE_ALPHABET) for _ in range(5))
                candidate = f"{meta['generateName']}{suffix}"
                if self._load(rtype, meta.get("namespace"), candidate) is None:
                    meta["name"] = candidate
                    break
        name = meta.get("name") or ""
        if rtype.subresources & {"status"} and rtype.plural != "namespaces":
            obj.pop("status", None)
        if rtype.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        self._check_namespace(rtype, meta.get("namespace"))
        headers = self._admit(rtype, obj, None, params)
        if self._load(rtype, meta.get("namespace"), name) is not None:
            raise ApiError.already_exists(rtype, name)
        if rtype.plural == "customresourcedefinitions":
            self._admit_crd(obj)
        meta["uid"] = str(uuid.UUID(int=self._random.getrandbits(128), version=4))
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        if params.get("dryRun") == "All":
            meta["resourceVersion"] = str(self._rv)
            return obj, headers
        meta["resourceVersion"] = self._next_rv()
        self._store(rtype, obj)
        self._emit(rtype, "ADDED", obj)
        if rtype.plural == "customresourcedefinitions":
            self._register_crd(obj)
            obj = self._load(rtype, None, name) or obj
        return obj, headers

    def _admit(
        self,
        rtype: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        params: Mapping[str, str],
    ) -> dict[str, str]:
        """Prune, default and validate `obj` in place; returns warning headers; raises 400/422."""
        if rtype.kind == "Secret" and obj.get("stringData"):
            # as a real API server: stringData is write-only, merged into data (base64)
            data = dict(obj.get("data") or {})
            for key, value in obj.pop("stringData").items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            obj["data"] = data
        headers: dict[str, str] = {}
        errors: list[FieldError] = []
        meta = obj.get("metadata", {})
        name = meta.get("name") or meta.get("generateName") or ""
        builtin = None
        if rtype.schema is None and rtype.crd is None:
            builtin = kube_builtin.check(obj)
        if rtype.schema is not None or builtin is not None:
            # Built-in kinds refuse unknown fields unless asked otherwise: stricter than a real
            # server (which drops them with a warning), so a misspelt field is a failed test.
            if builtin is not None:
                unknown = builtin.unknown
                mode = params.get("fieldValidation", "Strict")
            else:
                assert rtype.schema is not None
                unknown = rtype.schema.prune(obj)
                mode = params.get("fieldValidation", "Warn")
            if unknown and mode == "Strict":
                fields = ", ".join(f'unknown field "{path}"' for path in unknown)
                raise ApiError.bad_request(
                    f'{rtype.kind} in version "{rtype.version}" cannot be handled as a '
                    f"{rtype.kind}: strict decoding error: {fields}"
                )
            if unknown and mode != "Ignore":
                notes = [f'unknown field "{path}"' for path in unknown]
                self.warnings.extend(notes)
                headers["Warning"] = ", ".join(
                    '299 - "' + note.replace("\\", "\\\\").replace('"', '\\"') + '"'
                    for note in notes
                )
            if builtin is not None:
                kube_builtin.drop_unknown(obj, unknown)
                errors += builtin.errors
            else:
                assert rtype.schema is not None
                rtype.schema.default(obj)
                errors += rtype.schema.validate(obj, old)
        errors += self._metadata_errors(rtype, obj)
        if errors:
            raise ApiError.invalid(rtype, name, errors)
        return headers

    @staticmethod
    def _metadata_errors(rtype: ResourceType, obj: dict[str, Any]) -> list[FieldError]:
        errors = []
        meta = obj.get("metadata", {})
        name = meta.get("name")
        if not name:
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            )
        elif rtype.plural == "namespaces" and (len(name) > 63 or not DNS1123_LABEL.match(name)):
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f"Invalid value: {go_value(name)}: {LABEL_MESSAGE}",
                )
            )
        elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f"Invalid value: {go_value(name)}: {SUBDOMAIN_MESSAGE}",
                )
            )
        for label, value in (meta.get("labels") or {}).items():
            for problem in _qualified_name_problems(label):
                errors.append(
                    FieldError(
                        "metadata.labels",
                        "FieldValueInvalid",
                        f"Invalid value: {go_value(label)}: {problem}",
                    )
                )
            problems = (
                ["must be a string"] if not isinstance(value, str) else []
            ) or _label_value_problems(value)
            for problem in problems:
                errors.append(
                    FieldError(
                        "metadata.labels",
                        "FieldValueInvalid",
                        f"Invalid value: {go_value(value)}: {problem}",
                    )
                )
        annotations = meta.get("annotations") or {}
        size = 0
        for key, value in annotations.items():
            # apimachinery's ValidateAnnotations: qualified-name keys, case-insensitively
            for problem in _qualified_name_problems(key.lower()):
                errors.append(
                    FieldError(
                        "metadata.annotations",
                        "FieldValueInvalid",
                        f"Invalid value: {go_value(key)}: {problem}",
                    )
                )
            if not isinstance(value, str):
                errors.append(
                    FieldError(
                        f"metadata.annotations.{key}",
                        "FieldValueTypeInvalid",
                        "Invalid value: annotations must be strings",
                    )
                )
            else:
                size += len(key.encode()) + len(value.encode())
        if size > ANNOTATIONS_SIZE_LIMIT:
            errors.append(
                FieldError(
                    "metadata.annotations",
                    "FieldValueTooLong",
                    f"Too long: may not be more than {ANNOTATIONS_SIZE_LIMIT} bytes",
                )
            )
        return errors

    def _replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        params: Mapping[str, str],
        sub: str | None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        current = self._load(rtype, namespace, name)
        if current is None:
            raise ApiError.not_found(rtype, name)
        self._check_kind(rtype, body)
        meta = body.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        version = meta.get("resourceVersion")
        if not version and rtype.crd is not None:
            raise ApiError.invalid(
                rtype,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        if version and version != current["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rtype, name)
        if sub == "status":
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        else:
            new = body
        return self._commit(rtype, current, new, params, subresource=sub)

    def _patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        request: rendering.Request,
        params: Mapping[str, str],
        sub: str | None,
    ) -> tuple[dict[str, Any], dict[str, str], int]:
        content_type = self._header(request, "Content-Type").split(";")[0].strip().lower()
        current = self._load(rtype, namespace, name)
        patch = request.data
        if content_type == "application/apply-patch+yaml":
            if not params.get("fieldManager"):
                raise ApiError.invalid(
                    rtype,
                    name,
                    [
                        FieldError(
                            "fieldManager",
                            "FieldValueRequired",
                            "Required value: is required for apply patch",
                        )
                    ],
                )
            if not isinstance(patch, dict):
                raise ApiError.bad_request("an apply patch must be an object")
            if current is None:
                patch.setdefault("metadata", {})["name"] = name
                body, headers = self._create(rtype, namespace, copy.deepcopy(patch), params)
                return body, headers, 201
        if current is None:
            raise ApiError.not_found(rtype, name)
        try:
            if content_type == "application/json-patch+json":
                new = json_patch(current, patch)
            elif content_type in ("application/merge-patch+json", "application/apply-patch+yaml"):
                if not isinstance(patch, dict):
                    raise PatchError("a merge patch must be a JSON object")
                new = merge_patch(current, patch)
            elif content_type == "application/strategic-merge-patch+json":
                if rtype.crd is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types "
                        "include: application/json-patch+json, application/merge-patch+json, "
                        "application/apply-patch+yaml",
                    )
                new = strategic_merge_patch(current, patch)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: application/json-patch+json, application/merge-patch+json, "
                    f"application/apply-patch+yaml, application/strategic-merge-patch+json "
                    f"(got {content_type or 'none'})",
                )
        except PatchError as exc:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: {exc}",
                {
                    "name": name,
                    "group": rtype.group,
                    "kind": rtype.plural,
                    "causes": [{"message": str(exc)}],
                },
            ) from exc
        if not isinstance(new, dict):
            raise ApiError.bad_request("the patched object is not a JSON object")
        wanted = (
            (patch or {}).get("metadata", {}).get("resourceVersion")
            if isinstance(patch, dict)
            else None
        )
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rtype, name)
        if sub == "status":
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            new = result
        body, headers = self._commit(rtype, current, new, params, subresource=sub)
        return body, headers, 200

    def _commit(
        self,
        rtype: ResourceType,
        current: dict[str, Any],
        new: dict[str, Any],
        params: Mapping[str, str],
        *,
        subresource: str | None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Store an update of `current` to `new`: the rules every write path shares."""
        new = copy.deepcopy(new)
        old_meta = current["metadata"]
        meta = new.setdefault("metadata", {})
        for key in ("name", "namespace", *SYSTEM_METADATA):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        if subresource is None and "status" in rtype.subresources:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise ApiError.invalid(
                    rtype,
                    old_meta["name"],
                    [
                        FieldError(
                            "metadata.finalizers",
                            "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the object is being "
                            f"deleted, found new finalizers {json.dumps(sorted(added))}",
                        )
                    ],
                )
        headers = self._admit(rtype, new, current, params)
        if rtype.plural == "customresourcedefinitions":
            self._admit_crd(new)

        def body(o: Mapping[str, Any]) -> dict[str, Any]:
            return {
                k: v for k, v in o.items() if k not in ("metadata", "status", "apiVersion", "kind")
            }

        if body(new) != body(current):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        if new == current:
            return current, headers  # no-op: same resourceVersion, no event
        if params.get("dryRun") == "All":
            return new, headers
        meta["resourceVersion"] = self._next_rv()
        if old_meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(rtype, new)
            return new, headers
        self._store(rtype, new)
        self._emit(rtype, "MODIFIED", new, current)
        if rtype.plural == "customresourcedefinitions":
            self._register_crd(new)
            new = self._load(rtype, None, meta["name"]) or new
        return new, headers

    def _delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any],
        params: Mapping[str, str],
    ) -> tuple[dict[str, Any], int]:
        current = self._load(rtype, namespace, name)
        if current is None:
            raise ApiError.not_found(rtype, name)
        meta = current["metadata"]
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
            raise ApiError.conflict(
                rtype,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                f"UID in object meta: {meta['uid']}",
            )
        wanted = preconditions.get("resourceVersion")
        if wanted and wanted != meta["resourceVersion"]:
            raise ApiError.conflict(
                rtype,
                name,
                f"Precondition failed: ResourceVersion in precondition: {wanted}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        if options.get("dryRun") == ["All"] or params.get("dryRun") == "All":
            return current, 200
        if meta.get("deletionTimestamp"):
            return current, 200
        propagation = (
            options.get("propagationPolicy") or params.get("propagationPolicy") or "Background"
        )
        if options.get("orphanDependents") is True:
            propagation = "Orphan"
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        elif propagation == "Foreground":
            self._delete_dependents({meta["uid"]})
        if rtype.plural == "namespaces":
            self._empty_namespace(name)
            current = self._load(rtype, None, name) or current
            meta = current["metadata"]
            if self._namespace_has_content(name):
                new = copy.deepcopy(current)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["resourceVersion"] = self._next_rv()
                new.setdefault("status", {})["phase"] = "Terminating"
                self._store(rtype, new)
                self._emit(rtype, "MODIFIED", new, current)
                return new, 200
        if meta.get("finalizers"):
            new = copy.deepcopy(current)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._store(rtype, new)
            self._emit(rtype, "MODIFIED", new, current)
            return new, 200
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self._remove(rtype, final)
        return final, 200

    def _delete_collection(
        self,
        rtype: ResourceType,
        namespace: str | None,
        options: Mapping[str, Any],
        params: Mapping[str, str],
    ) -> dict[str, Any]:
        selector = Selector.from_params(params, rtype)
        deleted = []
        for obj in self._objects_of(rtype, namespace):
            if selector.matches(obj):
                body, _ = self._delete(
                    rtype,
                    obj["metadata"].get("namespace"),
                    obj["metadata"]["name"],
                    options,
                    params,
                )
                deleted.append(body)
        return {
            "apiVersion": rtype.api_version,
            "kind": f"{rtype.kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": deleted,
        }

    def _remove(self, rtype: ResourceType, final: dict[str, Any]) -> None:
        """The object is gone: store the tombstone, send DELETED, collect its dependents."""
        meta = final["metadata"]
        key = self._key(rtype, meta.get("namespace"), meta["name"])
        self._objects[key].history.append(copy.deepcopy(final))
        self._objects[key].delete()
        self._emit(rtype, "DELETED", final)
        if rtype.plural == "customresourcedefinitions":
            self._unregister_crd(final)
        self._collect_garbage({meta["uid"]})
        namespace = meta.get("namespace")
        if namespace and rtype.namespaced:
            ns_type = self._types[("", "v1", "namespaces")]
            ns = self._load(ns_type, None, namespace)
            if (
                ns is not None
                and ns["metadata"].get("deletionTimestamp")
                and not self._namespace_has_content(namespace)
            ):
                ns["metadata"]["resourceVersion"] = self._next_rv()
                self._remove(ns_type, ns)

    # ------------------------------------------------------------------ garbage collection

    def _all_objects(self) -> Iterator[tuple[ResourceType, dict[str, Any]]]:
        by_resource = {rtype.resource: rtype for rtype in self._types.values()}
        for (resource, _, _), obj in list(self._objects.items()):
            if not obj.deleted and resource in by_resource:
                yield by_resource[resource], obj.raw

    def _collect_garbage(self, gone: set[str]) -> None:
        """Delete dependents all of whose owners are gone (background propagation)."""
        live = {obj["metadata"]["uid"] for _, obj in self._all_objects()}
        for rtype, obj in list(self._all_objects()):
            refs = obj["metadata"].get("ownerReferences") or []
            owners = {ref.get("uid") for ref in refs}
            if owners & gone and not owners & live and not obj["metadata"].get("deletionTimestamp"):
                meta = obj["metadata"]
                if self._load(rtype, meta.get("namespace"), meta["name"]) is not None:
                    self._delete(rtype, meta.get("namespace"), meta["name"], {}, {})

    def _delete_dependents(self, owners: set[str]) -> None:
        for rtype, obj in list(self._all_objects()):
            refs = obj["metadata"].get("ownerReferences") or []
            if {ref.get("uid") for ref in refs} & owners:
                meta = obj["metadata"]
                if self._load(rtype, meta.get("namespace"), meta["name"]) is not None:
                    self._delete(
                        rtype,
                        meta.get("namespace"),
                        meta["name"],
                        {"propagationPolicy": "Foreground"},
                        {},
                    )

    def _orphan_dependents(self, owner: str) -> None:
        for rtype, obj in list(self._all_objects()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == owner for ref in refs):
                new = copy.deepcopy(obj)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner]
                if not new["metadata"]["ownerReferences"]:
                    del new["metadata"]["ownerReferences"]
                self._commit(rtype, obj, new, {}, subresource=None)

    def _namespace_has_content(self, namespace: str) -> bool:
        return any(
            rtype.namespaced and obj["metadata"].get("namespace") == namespace
            for rtype, obj in self._all_objects()
        )

    def _empty_namespace(self, namespace: str) -> None:
        for rtype, obj in list(self._all_objects()):
            meta = obj["metadata"]
            inside = rtype.namespaced and meta.get("namespace") == namespace
            live = self._load(rtype, namespace, meta["name"]) is not None
            if inside and live and not meta.get("deletionTimestamp"):
                self._delete(rtype, namespace, meta["name"], {}, {})

    # ------------------------------------------------------------------ CRDs

    def _admit_crd(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        errors: list[FieldError] = []
        name = obj.get("metadata", {}).get("name", "")
        for field_name in ("plural", "kind"):
            if not names.get(field_name):
                errors.append(
                    FieldError(f"spec.names.{field_name}", "FieldValueRequired", "Required value")
                )
        if not spec.get("group"):
            errors.append(FieldError("spec.group", "FieldValueRequired", "Required value"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            errors.append(
                FieldError(
                    "spec.scope",
                    "FieldValueNotSupported",
                    f"Unsupported value: {go_value(spec.get('scope'))}: "
                    'supported values: "Cluster", "Namespaced"',
                )
            )
        if (
            names.get("plural")
            and spec.get("group")
            and name != f"{names['plural']}.{spec['group']}"
        ):
            errors.append(
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    f'Invalid value: {go_value(name)}: must be spec.names.plural+"."+spec.group',
                )
            )
        versions = spec.get("versions") or []
        if sum(1 for v in versions if v.get("storage")) != 1:
            errors.append(
                FieldError(
                    "spec.versions",
                    "FieldValueInvalid",
                    "Invalid value: must have exactly one version marked as storage version",
                )
            )
        for index, version in enumerate(versions):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            where = f"spec.versions[{index}].schema.openAPIV3Schema"
            if schema is None:
                errors.append(
                    FieldError(where, "FieldValueRequired", "Required value: schemas are required")
                )
                continue
            errors += _schema_errors(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS), where)
        if errors:
            crd_type = self._types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
            raise ApiError.invalid(crd_type, name, errors)

    def _register_crd(self, obj: dict[str, Any]) -> None:
        spec = obj["spec"]
        names = spec["names"]
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            schema = version["schema"]["openAPIV3Schema"]
            self.register(
                ResourceType(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    singular=names.get("singular", ""),
                    namespaced=spec["scope"] == "Namespaced",
                    short_names=tuple(names.get("shortNames") or ()),
                    categories=tuple(names.get("categories") or ()),
                    subresources=frozenset((version.get("subresources") or {}).keys()),
                    scale=(version.get("subresources") or {}).get("scale"),
                    printer_columns=list(version.get("additionalPrinterColumns") or []),
                    schema=compiled_schema(schema),
                    crd=obj["metadata"]["name"],
                )
            )
        crd_type = self._types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        current = self._load(crd_type, None, obj["metadata"]["name"])
        if current is None:
            return
        status = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": _now(),
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": _now(),
                },
            ],
        }
        if (
            current.get("status", {}).get("acceptedNames") != names
            or current.get("status", {}).get("storedVersions") != status["storedVersions"]
        ):
            new = copy.deepcopy(current)
            new["status"] = status
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._store(crd_type, new)
            self._emit(crd_type, "MODIFIED", new, current)

    def _unregister_crd(self, obj: dict[str, Any]) -> None:
        for rtype in list(self._types.values()):
            if rtype.crd == obj["metadata"]["name"]:
                for item in self._objects_of(rtype):
                    final = copy.deepcopy(item)
                    final["metadata"]["resourceVersion"] = self._next_rv()
                    key = self._key(
                        rtype, item["metadata"].get("namespace"), item["metadata"]["name"]
                    )
                    self._objects[key].delete()
                    self._emit(rtype, "DELETED", final)
                self.unregister(rtype)

    # ------------------------------------------------------------------ discovery

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rtype in self._types.values():
            versions = groups.setdefault(rtype.group, [])
            if rtype.version not in versions:
                versions.append(rtype.version)
        return groups

    async def _serve_api(self, request: rendering.Request) -> Any:
        raw = request._raw_request
        host = raw.host if raw is not None else "127.0.0.1"
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }

    def _group_doc(self, group: str, versions: list[str]) -> dict[str, Any]:
        return {
            "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
        }

    async def _serve_apis(self, request: rendering.Request) -> Any:
        groups = [self._group_doc(g, vs) for g, vs in self._groups().items() if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    async def _serve_group(self, request: rendering.Request) -> Any:
        group = request.url.path.strip("/").split("/")[1]
        versions = self._groups().get(group or "")
        if not group or not versions:
            return ApiError.no_resource().response()
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group, versions)}

    async def _serve_version(self, request: rendering.Request) -> Any:
        assert request.resource is not None
        group, version = request.resource.group or "", request.resource.version or ""
        types = [t for t in self._types.values() if t.group == group and t.version == version]
        if not types:
            return ApiError.no_resource().response()
        resources: list[dict[str, Any]] = []
        for rtype in types:
            entry: dict[str, Any] = {
                "name": rtype.plural,
                "singularName": rtype.singular,
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": list(VERBS),
            }
            if rtype.short_names:
                entry["shortNames"] = list(rtype.short_names)
            if rtype.categories:
                entry["categories"] = list(rtype.categories)
            resources.append(entry)
            for sub in sorted(rtype.subresources):
                resources.append(
                    {
                        "name": f"{rtype.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "kind": rtype.kind,
                        "verbs": list(SUBRESOURCE_VERBS),
                    }
                    if sub != "scale"
                    else {  # how the scale client finds the Scale's group and version
                        "name": f"{rtype.plural}/scale",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": list(SUBRESOURCE_VERBS),
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": version if not group else f"{group}/{version}",
            "resources": resources,
        }

    async def _serve_root(self, request: rendering.Request) -> Any:
        paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/livez", "/readyz"}
        for group, versions in self._groups().items():
            if group:
                paths.add(f"/apis/{group}")
                paths.update(f"/apis/{group}/{v}" for v in versions)
        return {"paths": sorted(paths)}

    async def _serve_server_version(self, request: rendering.Request) -> Any:
        return dict(SERVER_VERSION)

    async def _serve_openapi_v3(self, request: rendering.Request) -> Any:
        documents = self._openapi_documents()
        key = request.url.path.removeprefix("/openapi/v3").strip("/")
        if not key:
            return kube_openapi.discovery(documents)
        if key not in documents:
            return ApiError.no_resource().response()
        return documents[key]

    def _openapi_documents(self) -> dict[str, dict[str, Any]]:
        """The OpenAPI v3 document of every served group-version (rebuilt when types change)."""
        served = tuple((t.key, id(t.schema)) for t in self._types.values())
        if self._openapi is None or self._openapi[0] != served:
            by_version: dict[tuple[str, str], list[ResourceType]] = {}
            for rtype in self._types.values():
                by_version.setdefault((rtype.group, rtype.version), []).append(rtype)
            documents = {
                kube_openapi.document_key(group, version): kube_openapi.document(
                    group, version, types
                )
                for (group, version), types in by_version.items()
            }
            self._openapi = (served, documents)
        return self._openapi[1]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: (file, mtime) -> the CRDs a server stored from it and their resource types (see
#: `KubeAPI.install_vendor_crds`).
_VENDOR_ADMITTED: dict[tuple[str, int], list[tuple[dict[str, Any], list[ResourceType]]]] = {}


def _yaml_documents(path: Path) -> list[Any]:
    """The YAML documents of a file (parsed once per file version: each server installs CRDs)."""
    stat = path.stat()
    docs = _parse_yaml(str(path), stat.st_mtime_ns, stat.st_size)
    return copy.deepcopy(docs)


@functools.lru_cache(maxsize=64)
def _parse_yaml(path: str, mtime_ns: int, size: int) -> list[Any]:
    return list(yaml.load_all(Path(path).read_text(encoding="utf-8"), Loader=_LOADER))


@functools.lru_cache(maxsize=64)
def _schema_errors(text: bytes, where: str) -> list[FieldError]:
    """A CRD version schema's structural and CEL problems (cached: every test server
    installs the same CRDs)."""
    schema = orjson.loads(text)
    errors: list[FieldError] = []
    for problem in structural_problems(schema):
        errors.append(FieldError(where, "FieldValueInvalid", f"Invalid value: {problem}"))
    for path, rule in _rules(schema, [where]):
        try:
            compile_rule(rule)
        except CelSyntaxError as exc:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {go_value(rule)}: compilation failed: {exc}",
                )
            )
    return errors


def _line(event_type: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"


def _rules(schema: Any, path: list[str]) -> Iterator[tuple[str, str]]:
    if not isinstance(schema, Mapping):
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        yield format_path(path), rule.get("rule", "")
    for name, prop in (schema.get("properties") or {}).items():
        yield from _rules(prop, [*path, name])
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), Mapping):
            yield from _rules(schema[key], [*path, key])


# --------------------------------------------------------------------------- threaded server


class KubeAPIServer:
    """A `KubeAPI` on 127.0.0.1 in a background thread with its own event loop.

    Synchronous clients (the `kubernetes` package, `kubectl`), kopf in a `KopfRunner` thread
    and async tests all reach it. The helpers (`create`, `get`, `list`, `patch_status`, ...)
    run inside the server's loop, so they are safe from any thread.
    """

    def __init__(self, *, crds: Any = CRDS_DIR, **options: Any) -> None:
        self._options = {"crds": crds, **options}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self.emulator: KubeAPI | None = None
        self.port = 0

    # lifecycle
    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="kube-api", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the test API server did not start in 30 s")
        if self._failure is not None:
            raise RuntimeError("the test API server failed to start") from self._failure
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._failure = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        emulator = KubeAPI(**self._options)
        async with emulator, kmock.Server(emulator, host="127.0.0.1") as server:
            self.emulator = emulator
            self.port = server.port
            self._ready.set()
            await self._stop.wait()
            emulator.close_watches()
            await asyncio.sleep(0.05)

    # access
    @property
    def kube(self) -> KubeAPI:
        if self.emulator is None:
            raise RuntimeError("the server is not running")
        return self.emulator

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def faults(self) -> FaultInjector:
        return self.kube.faults

    @property
    def errors(self) -> list[Exception]:
        """Exceptions the server raised while serving (emulator bugs or raising reactions)."""
        return list(self.kube.errors)

    @property
    def requests(self) -> list[rendering.Request]:
        return self.call(lambda: list(self.kube._requests))

    def request_count(self) -> int:
        """How many requests the server has received so far (watches count once, at start)."""
        return int(self.call(lambda: len(self.kube._requests)))

    def request_log(self, since: int = 0) -> list[tuple[str, str, str, bool]]:
        """(method, path, user agent, is-a-watch) of every request from number `since` on."""

        def collect() -> list[tuple[str, str, str, bool]]:
            log = []
            for request in list(self.kube._requests)[since:]:
                method = str(request.method.value if request.method else "").upper()
                agent = next(
                    (v for k, v in request.headers.items() if k.lower() == "user-agent"), ""
                )
                watch = request.params.get("watch") in ("true", "1")
                log.append((method, request.url.path, str(agent), watch))
            return log

        return list(self.call(collect))

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` in the server's loop and return its result (or raise)."""
        if self._loop is None:
            raise RuntimeError("the server is not running")

        async def run() -> Any:
            return fn(*args, **kwargs)

        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(30)

    def create(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.call(self.kube.create_object, obj, namespace)

    def apply(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.call(self.kube.apply_object, obj, namespace)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.call(self.kube.get_object, resource, namespace, name)

    def list_objects(
        self, resource: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        return self.call(self.kube.list_objects, resource, namespace, label_selector)

    def patch(
        self, resource: str, namespace: str | None, name: str, patch: Mapping[str, Any], **kw: Any
    ) -> dict[str, Any]:
        return self.call(self.kube.patch_object, resource, namespace, name, patch, **kw)

    def patch_status(
        self, resource: str, namespace: str | None, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        return self.call(self.kube.patch_status, resource, namespace, name, status)

    def delete(
        self, resource: str, namespace: str | None, name: str, propagation: str = "Background"
    ) -> dict[str, Any]:
        return self.call(self.kube.delete_object, resource, namespace, name, propagation)

    def install_crds(self, paths: Any) -> list[str]:
        return self.call(self.kube.install_crds, paths)

    def events_for(self, resource: str) -> list[tuple[str, dict[str, Any]]]:
        """The watch events kept for a resource type: (type, object), oldest first."""
        return self.call(self.kube.events_for, resource)

    async def eventually(
        self, check: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05
    ) -> Any:
        """Await until `check()` returns something truthy (polling with asyncio.sleep)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = check()
            if value:
                return value
            if loop.time() >= deadline:
                raise AssertionError(f"not true within {timeout} s: {check!r}")
            await asyncio.sleep(interval)

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace)


def write_kubeconfig(path: str | Path, server_url: str, namespace: str = "default") -> Path:
    """A kubeconfig with one context pointing at `server_url` (plain HTTP, no credentials)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "qpa-test", "cluster": {"server": server_url}}],
        "users": [{"name": "qpa-test", "user": {}}],
        "contexts": [
            {
                "name": "qpa-test",
                "context": {"cluster": "qpa-test", "user": "qpa-test", "namespace": namespace},
            }
        ],
        "current-context": "qpa-test",
        "preferences": {},
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


# --------------------------------------------------------------------------- pytest fixtures


@pytest.fixture(autouse=True)
def _kopf_default_registry() -> Iterator[None]:
    """Restore kopf's process-wide default registry after every test.

    `KopfRunner(..., registry=R)` makes R the default registry for good (kopf's CLI calls
    `set_default_registry`); a later `kopf run -m qpa_operator.main` in the same process would
    then register the operator's handlers next to that test's own handlers.
    """
    try:
        import kopf
    except ImportError:  # the operator extra is not installed: nothing to restore
        yield
        return
    saved = kopf.get_default_registry()
    yield
    kopf.set_default_registry(saved)


@pytest.fixture
def kube_api() -> Iterator[KubeAPIServer]:
    """A fresh test API server with qpa's CRDs installed (crds/), on 127.0.0.1."""
    with KubeAPIServer() as server:
        yield server
        problems = [e for e in server.errors if not isinstance(e, kmock.KubernetesError)]
    if problems:
        pytest.fail(f"the test API server raised while serving: {problems!r}")


@pytest.fixture
def kube_config(kube_api: KubeAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig for `kube_api`; $KUBECONFIG and the `kubernetes` package point at it."""
    path = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(path))
    try:
        import kubernetes.config.kube_config as kube_config_module
    except ImportError:  # pragma: no cover - the kubernetes package is a test dependency
        return path
    # The package reads $KUBECONFIG once, at import.
    monkeypatch.setattr(kube_config_module, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


@pytest.fixture
def kube_client(kube_config: Path) -> Iterator[Any]:
    """A `kubernetes.client.ApiClient` talking to `kube_api`."""
    kubernetes = pytest.importorskip("kubernetes")
    client = kubernetes.config.new_client_from_config(config_file=str(kube_config))
    try:
        yield client
    finally:
        client.close()
