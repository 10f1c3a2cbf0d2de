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

from qpa_operator.builders.common import Defaults, owner_namespace

from qpa.api import HarnessRelease

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


def harnessrelease_uris(hr: HarnessRelease) -> Iterator[tuple[str, str | None]]:
    """(field path, URI) of every store URI a HarnessRelease makes the operator or a pod use."""
    yield "spec.reportUri", hr.spec.report_uri
    yield "spec.model.uri", hr.spec.model.uri
    status = hr.status
    if status is not None:
        for name, version in (("stable", status.stable), ("previous", status.previous)):
            if version is not None:
                yield f"status.{name}.reportUri", version.report_uri
                yield f"status.{name}.modelUri", version.model_uri


def harnessrelease_refusal(hr: HarnessRelease, defaults: Defaults) -> str | None:
    """The first reason the release names a URI outside its namespace's prefix, or None."""
    namespace = owner_namespace(hr)
    for field, uri in harnessrelease_uris(hr):
        problem = uri_refusal(field, uri, namespace, defaults)
        if problem is not None:
            return problem
    return None


def check_harnessrelease(hr: HarnessRelease, defaults: Defaults) -> None:
    """Raise `OutsideStorePrefix` when the release names a URI outside its prefix."""
    problem = harnessrelease_refusal(hr, defaults)
    if problem is not None:
        where = f"{owner_namespace(hr)}/{hr.metadata.name}"
        raise OutsideStorePrefix(f"HarnessRelease {where}: {problem}")
