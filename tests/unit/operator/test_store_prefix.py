"""Every store URI a resource names must lie under its namespace's prefix (builders.storeaccess).

The examples in namespace team-a with the chart's default prefix `s3://qpa/{namespace}/`: a
URI under `s3://qpa/team-a/` passes, one under another namespace's prefix (or with `..`) is
refused naming the field, and the TaskBatch and TrainingRun builders build no child for it.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from helpers.chart import ROOT
from pydantic import ValidationError
from qpa_operator.builders import taskbatch, trainingrun
from qpa_operator.builders.common import Defaults
from qpa_operator.builders.storeaccess import OutsideStorePrefix, check, refusal, store_uris
from qpa_operator.builders.trainingrun import DataPlan

from qpa.api import parse_resource

DEFAULTS = Defaults(
    store_prefix="s3://qpa/{namespace}/", store_prefixes=(("team-c", "s3://team-c-bucket/"),)
)


def example(name: str, namespace: str = "team-a", index: int = 0) -> dict[str, Any]:
    doc = list(yaml.safe_load_all((ROOT / "examples" / name).read_text()))[index]
    doc["metadata"].update(namespace=namespace, uid="uid-1")
    return dict(doc)


def moved(value: Any, old: str, new: str) -> Any:
    """`value` with every string starting with `old` re-rooted at `new`."""
    if isinstance(value, dict):
        return {k: moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [moved(v, old, new) for v in value]
    return new + value[len(old) :] if isinstance(value, str) and value.startswith(old) else value


@pytest.mark.parametrize("name", ["taskbatch.yaml", "trainingrun.yaml", "harnessrelease.yaml"])
def test_uris_inside_the_namespaces_prefix_pass_and_others_are_refused(name: str) -> None:
    inside = parse_resource(moved(example(name), "s3://qpa/", "s3://qpa/team-a/"))
    uris = [field for field, uri in store_uris(inside) if uri and uri.startswith("s3://")]
    assert uris, "the example names no store URI"
    assert refusal(inside, DEFAULTS) is None
    check(inside, DEFAULTS)
    for field in uris:
        # one field moved to team-b's prefix: refused, naming exactly that field
        body = inside.to_k8s()
        target: Any = body
        *parents, leaf = field.replace("]", "").replace("[", ".").split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[leaf] = moved(target[leaf], "s3://qpa/team-a/", "s3://qpa/team-b/")
        problem = refusal(parse_resource(body), DEFAULTS)
        assert problem is not None and problem.startswith(f"{field} 's3://qpa/team-b/")
        assert "outside the store prefix 's3://qpa/team-a/' of namespace 'team-a'" in problem
    # the example as shipped (s3://qpa/<kind>/...) is outside every namespace's prefix
    assert refusal(parse_resource(example(name)), DEFAULTS) is not None
    # no limit without a prefix setting, and a per-namespace prefix overrides the default
    assert refusal(parse_resource(example(name)), Defaults()) is None
    other = parse_resource(moved(example(name, "team-c"), "s3://qpa/", "s3://team-c-bucket/"))
    assert refusal(other, DEFAULTS) is None


def test_dot_segments_are_refused_before_any_prefix_check() -> None:
    """The URI's normal form is a rule of the model and the CRD (`qpa.api.v1alpha1.rules`):
    plain or percent-encoded, a `..` never reaches the operator's prefix check."""
    for uri in ("s3://qpa/team-a/../team-b/out/", "s3://qpa/team-a/%2e%2e/team-b/out/"):
        body = moved(example("taskbatch.yaml"), "s3://qpa/", "s3://qpa/team-a/")
        body["spec"]["outputUri"] = uri
        with pytest.raises(ValidationError, match=r"spec\.outputUri\n.*normal form"):
            parse_resource(body)


def test_builders_schedule_no_pod_outside_the_prefix() -> None:
    tb = parse_resource(example("taskbatch.yaml"))
    with pytest.raises(OutsideStorePrefix, match=r"TaskBatch team-a/.*spec\.outputUri"):
        taskbatch.children(tb, DEFAULTS)
    assert taskbatch.children(parse_resource(moved(example("taskbatch.yaml"), "s3://qpa/",
                                                       "s3://qpa/team-a/")), DEFAULTS)  # fmt: skip
    tr = parse_resource(example("trainingrun.yaml"))
    with pytest.raises(OutsideStorePrefix, match=r"TrainingRun team-a/.*spec\.baseModelUri"):
        trainingrun.children(tr, DEFAULTS, attempt=0, plan=DataPlan(None), data_ready=True)


@pytest.mark.parametrize(
    ("path", "namespace"),
    [
        ("taskbatch.yaml", "default"),
        ("trainingrun.yaml", "default"),
        ("harnessrelease.yaml", "default"),
        ("kind/taskbatch.yaml", "qpa"),
        ("kind/trainingrun.yaml", "qpa"),
        ("kind/harnessrelease.yaml", "qpa"),
    ],
)
def test_the_shipped_examples_pass_the_charts_default_prefix_where_they_are_applied(
    path: str, namespace: str
) -> None:
    """A user who installs the chart (prefix `s3://qpa/{namespace}/`) and applies an example
    as the docs say (examples/ in `default`, examples/kind/ in `qpa`) is not refused."""
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / path).read_text()) if d]
    for index in range(len(docs)):
        resource = parse_resource(example(path, namespace, index))
        assert refusal(resource, DEFAULTS) is None, (path, index)
