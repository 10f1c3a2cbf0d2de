"""The `/openapi/v3` documents of the test API server, so kubectl runs with validation on.

kubectl 1.37 (`apply`, `create`, `replace`; `--validate=strict` is its default) asks
`/openapi/v3` for the list of group-version documents (`paths`, each with a
`serverRelativeURL` carrying a content hash), then the document of the object's group-version,
and looks there for the PATCH operation of the kind (`x-kubernetes-group-version-kind`) with a
`fieldValidation` query parameter. Finding it, kubectl leaves validation to the server and
sends `fieldValidation=Strict`; the server (fakes.kube_api) then answers an unknown field with
400 `strict decoding error: unknown field "spec.foo"` and a wrong one with 422 `Invalid`, both
naming the field, as a real cluster does.

Each document also carries the kinds' schemas under `components.schemas` (custom resources:
their CRD's `openAPIV3Schema`; built-ins: the official definitions of `fakes.kube_builtin`),
which `kubectl explain` reads. The PATCH operations do not offer strategic merge patch, so
`kubectl apply` computes its patches from its compiled-in types (built-ins) or as JSON merge
patches (custom resources), as it did before this document existed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Protocol

from fakes import kube_builtin

__all__ = ["ServedType", "discovery", "document", "document_key"]

_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)
_QUERY = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


class ServedType(Protocol):
    """What the documents need of a served resource type (fakes.kube_api.ResourceType)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    crd: str | None

    @property
    def api_version(self) -> str: ...

    @property
    def schema(self) -> Any: ...


def document_key(group: str, version: str) -> str:
    """`api/v1`, `apis/batch/v1`: how `/openapi/v3` names a group-version."""
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def discovery(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `/openapi/v3` answer: each document's URL with the hash of its content."""
    paths = {}
    for key, doc in sorted(documents.items()):
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64]
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest.upper()}"}
    return {"paths": paths}


def document(group: str, version: str, types: Iterable[ServedType]) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    builtin_defs: dict[str, Any] | None = None
    for rtype in types:
        gvk = {"group": group, "version": version, "kind": rtype.kind}
        prefix = f"/{document_key(group, version)}"
        scope = "/namespaces/{namespace}" if rtype.namespaced else ""
        path = f"{prefix}{scope}/{rtype.plural}/{{name}}"
        parameters = [
            {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
            *(
                [
                    {
                        "name": "namespace",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ]
                if rtype.namespaced
                else []
            ),
            *({"name": name, "in": "query", "schema": {"type": "string"}} for name in _QUERY),
        ]
        name = _schema_name(rtype)
        ref = {"$ref": f"#/components/schemas/{name}"}
        paths[path] = {
            "parameters": parameters,
            "patch": {
                "operationId": f"patch{rtype.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "requestBody": {
                    "content": {kind: {"schema": {"type": "object"}} for kind in _PATCH_TYPES},
                    "required": True,
                },
                "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
            },
        }
        if rtype.schema is not None:
            schema = json.loads(json.dumps(rtype.schema.schema))
            schema["x-kubernetes-group-version-kind"] = [gvk]
            schemas[name] = schema
        elif rtype.crd is None:
            builtin_defs = builtin_defs or kube_builtin.openapi_definitions()
            if name in builtin_defs:
                schemas.update(_closure(name, builtin_defs))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.37.1"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _schema_name(rtype: ServedType) -> str:
    if rtype.crd is None:
        name = kube_builtin.schema_name(rtype.api_version, rtype.kind)
        if name is not None:
            return name
    reverse = ".".join(reversed(rtype.group.split("."))) if rtype.group else "core"
    return f"{reverse}.{rtype.version}.{rtype.kind}"


def _closure(name: str, definitions: dict[str, Any]) -> dict[str, Any]:
    """A definition and every definition it refers to."""
    found: dict[str, Any] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in found or current not in definitions:
            continue
        found[current] = definitions[current]
        pending += _refs(definitions[current])
    return found


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = []
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out.append(value.rsplit("/", 1)[-1])
            else:
                out += _refs(value)
        return out
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    return []
