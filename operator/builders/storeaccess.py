"""Which store URIs a resource may name: only those inside its namespace's store prefix.

The operator reads benchmark reports with the credentials of the resource's own namespace, and
the pods it schedules get that namespace's Secret; but one S3 identity often serves several
namespaces (the chart's default store). A user-set URI outside the namespace's prefix would
make the operator, or a pod it schedules, read another team's data: a confused deputy. So
every store URI a resource names must start with the prefix its namespace is given
(`Defaults.prefix_for`: the chart's `objectStore.namespacePrefix`, e.g.
`s3://qpa/{namespace}/`, or a per-namespace `objectStore.namespacePrefixes` entry). The check
runs before anything is read and before any pod is scheduled; the refusal names the field.

Pure functions of the resource and the operator's defaults, like every builder.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

from pydantic import BaseModel
from qpa_operator.builders.common import Defaults, owner_namespace

from qpa.api import HarnessRelease
from qpa.api.v1alpha1 import CustomResource

#: Schemes of qpa's store (`file://` and plain paths too: a pod or the operator would read
#: them); other schemes (e.g. `hf://`, `pvc://`) are not in the store and not checked here.
STORE_SCHEMES = frozenset({"s3", "file", ""})


class OutsideStorePrefix(ValueError):
    """A store URI outside the namespace's prefix (the message names the field)."""


def _dot_segments(path: str) -> bool:
    return any(part in (".", "..") for part in path.split("/"))


def uri_refusal(field: str, uri: str | None, namespace: str, defaults: Defaults) -> str | None:
    """Why `uri` (the resource's `field`) may not be used in `namespace`, or None when it may."""
    if not uri:
        return None
    prefix = defaults.prefix_for(namespace)
    parts = urlsplit(uri)
    if prefix is None or parts.scheme not in STORE_SCHEMES:
        return None
    if _dot_segments(parts.path):
        return f"{field} {uri!r}: '.' and '..' segments are not allowed in a store URI"
    if not (uri if uri.endswith("/") else uri + "/").startswith(prefix):
        return (
            f"{field} {uri!r} lies outside the store prefix {prefix!r} of namespace "
            f"{namespace!r}: the operator reads, and its pods write, only there"
        )
    return None


def spec_uris(model: BaseModel, path: str = "spec") -> Iterator[tuple[str, str]]:
    """(field path, value) of every URI field (`uri`, `*Uri`) anywhere under a spec model."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        field = f"{path}.{info.alias or name}"
        if isinstance(value, str) and (name == "uri" or name.endswith("_uri")):
            yield field, value
        elif isinstance(value, BaseModel):
            yield from spec_uris(value, field)
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from spec_uris(item, f"{field}[{index}]")


def store_uris(resource: CustomResource) -> Iterator[tuple[str, str | None]]:
    """(field path, URI) of every store URI a resource makes the operator or its pods use: its
    spec's, and for a HarnessRelease the stable and previous versions' it deploys again."""
    spec = getattr(resource, "spec", None)
    if isinstance(spec, BaseModel):
        yield from spec_uris(spec)
    if isinstance(resource, HarnessRelease) and resource.status is not None:
        for name, version in (("stable", resource.status.stable),
                              ("previous", resource.status.previous)):  # fmt: skip
            if version is not None:
                yield f"status.{name}.reportUri", version.report_uri
                yield f"status.{name}.modelUri", version.model_uri


def refusal(resource: CustomResource, defaults: Defaults) -> str | None:
    """The first reason the resource names a URI outside its namespace's prefix, or None."""
    namespace = owner_namespace(resource)
    for field, uri in store_uris(resource):
        problem = uri_refusal(field, uri, namespace, defaults)
        if problem is not None:
            return problem
    return None


def check(resource: CustomResource, defaults: Defaults) -> None:
    """Raise `OutsideStorePrefix` when the resource names a URI outside its prefix: builders
    call it before building any pod of the resource."""
    problem = refusal(resource, defaults)
    if problem is not None:
        where = f"{owner_namespace(resource)}/{resource.metadata.name}"
        raise OutsideStorePrefix(f"{resource.kind} {where}: {problem}")


#: The HarnessRelease's names for the same checks (the release state machine's vocabulary).
harnessrelease_refusal = refusal
check_harnessrelease = check
