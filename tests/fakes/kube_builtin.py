"""Built-in kinds checked as a real API server checks them (test-only).

The test API server (`fakes.kube_api`) validates every Job, Deployment, Service, Lease, RBAC
object, ... it stores against the official Kubernetes OpenAPI schemas of the release it claims
to be (1.37), as shipped by the `kubernetes-validate` package (offline, JSON Schema 2020-12,
`-strict` variant: `additionalProperties: false` everywhere). On top of the schema, a few
checks the real server makes in Go code and every controller relies on (`semantic_errors`):
container names and images, a Job's `restartPolicy`, a workload's selector matching its
template's labels, unique port and env names.

`check(obj)` answers the `FieldError`s (worded like the server's: `spec.template.spec.
containers[0].image: Required value`) and the unknown field paths apart, so the caller can
refuse unknown fields (`fieldValidation=Strict`) or drop them with a warning. Validators are
compiled once per kind and version and shared by every server in the process (creating a Job
costs about 2 ms).

`openapi_component(api_version, kind)` hands the same schema out for the server's
`/openapi/v3` documents.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import orjson
from referencing import Registry, Resource

from fakes.kube_schema import FieldError, field_errors, format_path, go_value

__all__ = [
    "KUBERNETES_VERSION",
    "Checked",
    "check",
    "drop_unknown",
    "has_schema",
    "openapi_definitions",
    "schema_name",
]

KUBERNETES_VERSION = "1.37"
_SCHEMA_DIR = f"v{KUBERNETES_VERSION}.0-local-strict"
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_WORKLOADS = {("apps/v1", "Deployment"), ("apps/v1", "DaemonSet"), ("apps/v1", "StatefulSet"),
              ("apps/v1", "ReplicaSet"), ("batch/v1", "Job")}  # fmt: skip


@dataclass
class Checked:
    """What the schema says about one object: field errors and unknown field paths."""

    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _files() -> Any:
    return importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / _SCHEMA_DIR


def _file_name(api_version: str, kind: str) -> str:
    # rbac.authorization.k8s.io/v1 -> rbac-v1, batch/v1 -> batch-v1, v1 -> v1
    short = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    return f"{kind.lower()}-{short}.json"


@functools.cache
def _definitions() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((_files() / "_definitions.json").read_text())
    return data


@functools.cache
def _registry() -> Registry:
    return Resource.from_contents(_definitions()) @ Registry()


@functools.cache
def _schema(api_version: str, kind: str) -> dict[str, Any] | None:
    path = _files() / _file_name(api_version, kind)
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator | None:
    schema = _schema(api_version, kind)
    if schema is None:
        return None
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def has_schema(api_version: str, kind: str) -> bool:
    """Does Kubernetes 1.37 define this kind (so the server validates it)?"""
    return _schema(api_version, kind) is not None


@functools.cache
def schema_name(api_version: str, kind: str) -> str | None:
    """The definition name of a kind, e.g. `io.k8s.api.batch.v1.Job` (None: not built in)."""
    schema = _schema(api_version, kind)
    if schema is None:
        return None
    for name, definition in _definitions()["$defs"].items():
        gvks = definition.get("x-kubernetes-group-version-kind") or []
        if definition.get("description") == schema.get("description") and any(
            gvk.get("kind") == kind for gvk in gvks
        ):
            return str(name)
    return None


def check(obj: Mapping[str, Any]) -> Checked:
    """The schema's (and the server's own) verdict on a built-in object."""
    if not has_schema(str(obj.get("apiVersion", "")), str(obj.get("kind", ""))):
        return Checked()
    verdict = _check(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS))
    return Checked(list(verdict.errors), list(verdict.unknown))


@functools.lru_cache(maxsize=256)
def _check(text: bytes) -> Checked:
    # Cached by content: controllers write the same objects again and again, and every test
    # server installs the same (large) CRDs.
    obj = orjson.loads(text)
    validator = _validator(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
    result = Checked()
    if validator is None:
        return result
    for error in validator.iter_errors(obj):
        if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            known = (error.schema or {}).get("properties") or {}
            base = list(error.absolute_path)
            result.unknown += [format_path([*base, k]) for k in error.instance if k not in known]
        else:
            result.errors += _errors_of(error)
    if not result.errors:
        result.errors += semantic_errors(obj)
    unique = {error.message: error for error in result.errors}
    result.errors = sorted(unique.values(), key=lambda e: (e.field, e.detail))
    result.unknown = sorted(set(result.unknown))
    return result


def _errors_of(error: jsonschema.ValidationError) -> list[FieldError]:
    if error.validator == "oneOf" and error.context:
        # int-or-string and quantities: one `oneOf` of typed alternatives, named as one error
        path = format_path(list(error.absolute_path))
        return [
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f"Invalid value: {go_value(error.instance)}: {path} must be a string or a number",
            )
        ]
    return field_errors(error)


def drop_unknown(obj: dict[str, Any], paths: list[str]) -> None:
    """Remove the unknown fields `check` reported (what the server does with fieldValidation
    Warn or Ignore), in place."""
    for path in paths:
        parts = _parse_path(path)
        node: Any = obj
        for part in parts[:-1]:
            node = node[part]
        if isinstance(node, dict):
            node.pop(parts[-1], None)


def _parse_path(path: str) -> list[Any]:
    parts: list[Any] = []
    for token in re.finditer(r"([^.\[\]]+)|\[(\d+)\]", path):
        parts.append(int(token.group(2)) if token.group(2) is not None else token.group(1))
    return parts


# --------------------------------------------------------------------------- semantic checks


def semantic_errors(obj: Mapping[str, Any]) -> list[FieldError]:
    """Checks the API server makes in Go code (validation.go), beyond the OpenAPI schema."""
    errors: list[FieldError] = []
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod" and api_version == "v1":
        errors += _pod_spec_errors(spec, ["spec"])
    if (api_version, kind) in _WORKLOADS:
        template = spec.get("template") or {}
        pod_path = ["spec", "template", "spec"]
        errors += _pod_spec_errors(template.get("spec") or {}, pod_path)
        labels = (template.get("metadata") or {}).get("labels") or {}
        selector = spec.get("selector")
        if kind != "Job" and selector is None:
            errors.append(FieldError("spec.selector", "FieldValueRequired", "Required value"))
        if selector is not None and not _selects(selector, labels):
            errors.append(
                FieldError(
                    "spec.template.metadata.labels",
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(labels, sort_keys=True)}: `selector` does not "
                    "match template `labels`",
                )
            )
        policy = (template.get("spec") or {}).get("restartPolicy")
        if kind == "Job" and policy not in ("Never", "OnFailure"):
            errors.append(
                FieldError(
                    "spec.template.spec.restartPolicy",
                    "FieldValueRequired" if policy is None else "FieldValueNotSupported",
                    'Required value: valid values: "OnFailure", "Never"'
                    if policy is None
                    else f'Unsupported value: {go_value(policy)}: supported values: "OnFailure", '
                    '"Never"',
                )
            )
        if kind != "Job" and policy not in (None, "Always"):
            errors.append(
                FieldError(
                    "spec.template.spec.restartPolicy",
                    "FieldValueNotSupported",
                    f'Unsupported value: {go_value(policy)}: supported values: "Always"',
                )
            )
    if kind == "Service" and api_version == "v1":
        errors += _unique(spec.get("ports") or [], "name", ["spec", "ports"])
    return errors


def _pod_spec_errors(spec: Mapping[str, Any], path: list[Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    if not spec.get("containers"):
        errors.append(
            FieldError(format_path([*path, "containers"]), "FieldValueRequired", "Required value")
        )
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            where = [*path, group, index]
            name = container.get("name") or ""
            if not _DNS1123_LABEL.match(name) or len(name) > 63:
                errors.append(
                    FieldError(
                        format_path([*where, "name"]),
                        "FieldValueInvalid",
                        f"Invalid value: {go_value(name)}: {_LABEL_MESSAGE}",
                    )
                )
            elif name in names:
                errors.append(
                    FieldError(
                        format_path([*where, "name"]),
                        "FieldValueDuplicate",
                        f"Duplicate value: {go_value(name)}",
                    )
                )
            names.add(name)
            if not container.get("image"):
                errors.append(
                    FieldError(
                        format_path([*where, "image"]), "FieldValueRequired", "Required value"
                    )
                )
            errors += _unique(container.get("ports") or [], "name", [*where, "ports"])
            volumes = {v.get("name") for v in spec.get("volumes") or []}
            for mount_index, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("name") not in volumes:
                    errors.append(
                        FieldError(
                            format_path([*where, "volumeMounts", mount_index, "name"]),
                            "FieldValueNotFound",
                            f"Not found: {go_value(mount.get('name'))}",
                        )
                    )
    errors += _unique(spec.get("volumes") or [], "name", [*path, "volumes"])
    return errors


def _unique(items: list[Any], key: str, path: list[Any]) -> Iterator[FieldError]:
    seen: set[Any] = set()
    for index, item in enumerate(items):
        value = item.get(key) if isinstance(item, Mapping) else None
        if value is None:
            continue
        if value in seen:
            yield FieldError(
                format_path([*path, index, key]),
                "FieldValueDuplicate",
                f"Duplicate value: {go_value(value)}",
            )
        seen.add(value)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Does a LabelSelector (matchLabels and matchExpressions) select these labels?"""
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return False  # an empty selector is refused for workloads ("empty selector is invalid")
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


# --------------------------------------------------------------------------- openapi


@functools.cache
def openapi_definitions() -> dict[str, Any]:
    """Every definition, with `$ref`s rewritten for an OpenAPI v3 document's components
    (shared: read, never change)."""
    text = json.dumps(_definitions()["$defs"]).replace('"#/$defs/', '"#/components/schemas/')
    return dict(json.loads(text))
