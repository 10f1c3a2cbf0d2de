"""Vendor the parts of the official Kubernetes PodSpec schema that a `spec.podTemplate` carries.

`python -m qpa.api.podspec_vendor` reads the JSON schemas that `kubernetes-validate` ships for
the oldest Kubernetes version the chart supports (`charts/qpa/Chart.yaml` `kubeVersion`), inlines
the definitions of `Affinity` and `PersistentVolumeClaimSpec`, and writes them as structural
OpenAPI with bounds on every string, list, map and integer (`qpa/api/v1alpha1/schemas/`). The
models validate those parts against the file (`qpa.api.v1alpha1.podspec`), and the CRDs embed
it, so the API server and pydantic refuse the same unknown or ill-typed structure, naming its
path; a test checks the vendored file is what this module writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

#: The Kubernetes version whose schema is vendored: the oldest the chart supports (anything
#: valid there is valid on every later version).
KUBE_VERSION: Final = "1.29.0"
VENDORED: Final = Path(__file__).parent / "v1alpha1" / "schemas" / f"podspec-v{KUBE_VERSION}.json"
ROOTS: Final = {
    "affinity": "io.k8s.api.core.v1.Affinity",
    "persistentVolumeClaimSpec": "io.k8s.api.core.v1.PersistentVolumeClaimSpec",
}
_INT_OR_STRING: Final = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
#: Bounds laid on what the official schema leaves unbounded (a label key is at most 316
#: characters, so every string of these parts fits in 1,024).
MAX_STRING: Final = 1024
MAX_ITEMS: Final = 32
MAX_PROPERTIES: Final = 64
INT32: Final = (-(2**31), 2**31 - 1)


def _definitions(version: str) -> dict[str, Any]:
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = root / f"v{version}-local-strict" / "_definitions.json"
    defs: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return defs


def _type(node: dict[str, Any]) -> str | None:
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if kinds else None
    return kind if isinstance(kind, str) else None


def _convert(node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen:
            raise ValueError(f"recursive definition {name}")
        if name == _INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True, "maxLength": 64}
        if name == _QUANTITY:
            return {"x-kubernetes-int-or-string": True, "maxLength": 64}
        return _convert(defs[name], defs, (*seen, name))
    kind = _type(node)
    out: dict[str, Any] = {}
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties") or {}
        if props:
            out["properties"] = {k: _convert(v, defs, seen) for k, v in sorted(props.items())}
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _convert(extra, defs, seen)
            out["maxProperties"] = MAX_PROPERTIES
        required = node.get("required")
        if required:
            out["required"] = sorted(required)
    elif kind == "array":
        out["type"] = "array"
        out["items"] = _convert(node.get("items") or {}, defs, seen)
        out["maxItems"] = MAX_ITEMS
    elif kind == "string":
        out = {"type": "string", "maxLength": MAX_STRING}
        if node.get("enum"):
            out["enum"] = [v for v in node["enum"] if v is not None]
    elif kind == "integer":
        out = {"type": "integer", "minimum": INT32[0], "maximum": INT32[1]}
    elif kind in ("boolean", "number"):
        out = {"type": kind}
    else:
        raise ValueError(f"no type at {seen}: {sorted(node)}")
    return out


def vendored_schema(version: str = KUBE_VERSION) -> dict[str, Any]:
    """The bounded structural schemas of `ROOTS`, from `kubernetes-validate`'s files."""
    defs = _definitions(version)
    return {
        "kubernetesVersion": version,
        "schemas": {key: _convert({"$ref": f"#/{name}"}, defs, ()) for key, name in ROOTS.items()},
    }


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def main() -> int:
    VENDORED.parent.mkdir(parents=True, exist_ok=True)
    VENDORED.write_text(render(vendored_schema()))
    print(f"wrote {VENDORED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
