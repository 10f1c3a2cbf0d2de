"""Where a HarnessRelease is read from: a file (`kubectl get hr -o yaml`) or the cluster.

- `from_file(path, name)`: YAML or JSON holding one HarnessRelease, or a list of them
  (`kind: List` / `HarnessReleaseList`, as `kubectl get hr -o yaml` prints); `name` picks one
  from a list and must match a single object;
- `from_cluster(name, namespace, context, kubeconfig)`: the object as the API server has it,
  through the `kubernetes` client (kubeconfig, or the in-cluster service account); with no
  name, the namespace's only HarnessRelease.

Errors (`ReleaseSourceError`) name the file or the object and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from qpa.api import GROUP, VERSION, HarnessRelease


class ReleaseSourceError(ValueError):
    """A HarnessRelease that cannot be read (missing, unreadable, not a HarnessRelease)."""


def _parse(obj: Any, where: str) -> HarnessRelease:
    if not isinstance(obj, dict):
        raise ReleaseSourceError(f"{where}: expected an object, got {type(obj).__name__}")
    if obj.get("kind") != "HarnessRelease":
        raise ReleaseSourceError(f"{where}: kind is {obj.get('kind')!r}, not HarnessRelease")
    try:
        return HarnessRelease.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ReleaseSourceError(f"{where}: field {field!r}: {first['msg']}") from None


def _pick(items: list[Any], name: str | None, where: str) -> HarnessRelease:
    releases = [_parse(item, f"{where} item {i}") for i, item in enumerate(items)]
    names = [r.metadata.name for r in releases]
    if name is not None:
        found = [r for r in releases if r.metadata.name == name]
        if len(found) != 1:
            raise ReleaseSourceError(
                f"{where}: no single HarnessRelease {name!r} (found: {', '.join(map(str, names))})"
            )
        return found[0]
    if len(releases) != 1:
        raise ReleaseSourceError(
            f"{where}: {len(releases)} HarnessReleases ({', '.join(map(str, names))}): "
            "name one with --release"
        )
    return releases[0]


def from_file(path: str | Path, name: str | None = None) -> HarnessRelease:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReleaseSourceError(f"status file {file}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ReleaseSourceError(f"status file {file}: neither JSON nor YAML: {exc}") from None
    where = f"status file {file}"
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        return _pick(data["items"], name, where)
    release = _parse(data, where)
    if name is not None and release.metadata.name != name:
        raise ReleaseSourceError(
            f"{where}: holds HarnessRelease {release.metadata.name!r}, not {name!r}"
        )
    return release


def from_cluster(
    name: str | None,
    namespace: str | None = None,
    *,
    context: str | None = None,
    kubeconfig: str | Path | None = None,
) -> HarnessRelease:
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
    except ImportError as exc:  # pragma: no cover - the release extra installs it
        raise ReleaseSourceError(
            "reading from the cluster needs the kubernetes client (pip install 'qpa[release]')"
        ) from exc
    config_file = str(kubeconfig) if kubeconfig else None
    try:
        config.load_kube_config(config_file=config_file, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=config_file)
        chosen = next((c for c in contexts if c["name"] == context), active) if context else active
        default_namespace = (chosen.get("context") or {}).get("namespace")
    except (ConfigException, OSError, TypeError, KeyError):
        try:
            config.load_incluster_config()
        except ConfigException as exc:
            raise ReleaseSourceError(f"no kubeconfig and not in a cluster: {exc}") from None
        default_namespace = None
    ns = namespace or default_namespace or "default"
    api = client.CustomObjectsApi()
    where = f"cluster namespace {ns}"
    try:
        if name is not None:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, ns, "harnessreleases", name)
            return _parse(obj, f"HarnessRelease {ns}/{name}")
        listed = api.list_namespaced_custom_object(GROUP, VERSION, ns, "harnessreleases")
    except ApiException as exc:
        if exc.status == 404:
            raise ReleaseSourceError(f"{where}: no HarnessRelease {name!r}") from None
        raise ReleaseSourceError(
            f"{where}: the API server answered {exc.status} {exc.reason}"
        ) from None
    except Exception as exc:  # urllib3's connection, TLS and timeout errors
        raise ReleaseSourceError(f"{where}: cannot reach the API server: {exc}") from None
    items = listed.get("items") if isinstance(listed, dict) else None
    return _pick(list(items or []), None, where)
