"""The CRD's bounds are the stage's bounds: what the API server accepts, the pod accepts.

Random specs are generated from each kind's CRD schema (`schema_strategy`, hypothesis), pruned,
defaulted and checked as the API server does (schema + CEL rules, tests/fakes/kube_schema.py).
Every spec the server would store must parse with `qpa.api`, and its work order, as the
operator writes it, must turn into the pod's config object without an error: a resource that
`kubectl apply` accepts never fails validation inside the pod.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_schema import CustomResourceSchema
from field_walk import kinds, walk_defaults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qpa.api import parse_resource

ROOT = Path(__file__).resolve().parents[3]
WALKS = {walk.kind: walk for walk in kinds()}
#: Never drawn: a pod template's own rules would refuse nearly every spec drawn at random;
#: the API server and qpa.api refuse the same templates in tests/unit/api/test_podtemplate.py.
SKIPPED = frozenset({"podTemplate"})


def crd_schema(crd: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "crds" / crd).read_text())
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def schema_strategy(schema: dict[str, Any], example: Any = None) -> st.SearchStrategy[Any]:
    """Values of an OpenAPI (structural) schema: the subset the qpa.ai CRDs use. Optional
    properties come and go, lists and maps stay short, strings match their patterns.

    A property the `example` has is drawn as the example's value or as any value, half and
    half: a spec drawn wholly at random passes TrainingRun's cross-field rules about once in
    200 draws, too rarely for a fixed number of examples to be sure of any (which draws
    Hypothesis makes depends on what the process has imported), while a spec one field away
    from a valid one probes each bound where it is.
    """
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 64), st.sampled_from(["100m", "1Gi", "2"]))
    kind = schema.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", -(2**31)), schema.get("maximum", 2**31)
        if kind == "integer":
            return st.integers(int(low), int(high))
        return st.floats(low, high, exclude_min=bool(schema.get("exclusiveMinimum")))
    if kind == "string":
        size = {
            "min_size": schema.get("minLength", 0),
            "max_size": min(schema.get("maxLength", 24), 24),
        }
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda v: size["min_size"] <= len(v) <= max(size["max_size"], 64)
            )
        return st.text(st.characters(min_codepoint=33, max_codepoint=126), **size)
    if kind == "array":
        first = example[0] if isinstance(example, list) and example else None
        items = schema_strategy(schema.get("items") or {"type": "string"}, first)
        unique = schema.get("x-kubernetes-list-type") == "set"
        return st.lists(items, max_size=min(schema.get("maxItems", 3), 3), unique=unique)
    if kind == "object" and "properties" in schema:
        # every output is an s3:// URI, which needs `store`: drawn always, like a required field
        required = set(schema.get("required") or ()) | ({"store"} & set(schema["properties"]))
        known = example if isinstance(example, dict) else {}
        fields = {
            k: schema_strategy(v, known.get(k))
            if k not in known
            else st.one_of(st.just(known[k]).map(copy.deepcopy), schema_strategy(v, known[k]))
            for k, v in schema["properties"].items()
        }

        @st.composite
        def objects(draw: st.DrawFn) -> dict[str, Any]:
            # optional fields present 3 times in 4: cross-field rules mostly need them set
            return {
                key: draw(field)
                for key, field in fields.items()
                if key not in SKIPPED
                and (key in required or key in known or draw(st.integers(0, 3)) > 0)
            }

        return objects()
    if kind == "object":
        values = schema_strategy(schema.get("additionalProperties") or {"type": "string"})
        keys = st.from_regex(r"[a-z][a-z0-9.-]{0,10}(/[a-z0-9]{1,8})?", fullmatch=True)
        return st.dictionaries(keys, values, max_size=2)
    return st.nothing()


def server_accepts(validator: CustomResourceSchema, body: dict[str, Any]) -> bool:
    validator.prune(body)
    validator.default(body)
    return not validator.validate(body)


@pytest.mark.parametrize("kind", sorted(WALKS))
def test_every_spec_the_api_server_accepts_runs_in_the_pod(kind: str) -> None:
    walk = WALKS[kind]
    full = crd_schema(walk.crd)
    validator = CustomResourceSchema(full)
    example = [d for d in yaml.safe_load_all((ROOT / "examples" / walk.examples[0][0]).read_text())]
    base = next(d for d in example if d)
    spec_strategy = schema_strategy(full["properties"]["spec"], base["spec"])
    base["metadata"].update(namespace="team-a", uid="uid-bounds", generation=1)
    defaults = walk_defaults()
    accepted: list[int] = []

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(spec=spec_strategy, seed=st.integers(0, 3))
    def check(spec: dict[str, Any], seed: int) -> None:
        body = copy.deepcopy(base)
        body["spec"] = spec
        if not server_accepts(validator, body):
            return
        accepted.append(seed)
        resource = parse_resource(body)  # what the server stores, qpa.api must read
        config = walk.pod(resource, defaults)  # and the pod must run
        assert config is not None

    check()
    assert accepted, f"no generated {kind} spec passed the API server's checks"


def test_a_spec_beyond_the_crd_bounds_is_refused_by_both() -> None:
    """The other direction, for one field per kind: beyond the bound, neither accepts."""
    cases: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("rolloutpool.yaml", lambda s: s.update(sessionsPerPod=100_000)),
        ("devicepool.yaml", lambda s: s.update(adbPort=70_000)),
        ("harnessrelease.yaml", lambda s: s["benchmark"].update(samples=0)),
    ]
    for name, mutate in cases:
        body = next(d for d in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if d)
        mutate(body["spec"])
        crd = next(w.crd for w in WALKS.values() if w.examples[0][0] == name)
        assert not server_accepts(CustomResourceSchema(crd_schema(crd)), copy.deepcopy(body))
        with pytest.raises(ValueError):
            parse_resource(body)
