"""The vendored PodSpec parts are what `qpa.api.podspec_vendor` makes of kubernetes-validate's
schemas, and the models made from them accept the official structure and refuse any other."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from qpa.api import podspec_vendor
from qpa.api.v1alpha1.podtemplate import PodTemplate


def test_the_vendored_file_is_what_the_vendor_module_writes() -> None:
    expected = podspec_vendor.render(podspec_vendor.vendored_schema())
    assert podspec_vendor.VENDORED.read_text() == expected, "run python -m qpa.api.podspec_vendor"


def test_every_string_list_and_map_of_the_parts_is_bounded() -> None:
    def walk(node: dict, path: str):  # type: ignore[no-untyped-def,type-arg]
        kind = node.get("type")
        if kind == "string":
            assert "maxLength" in node, path
        if kind == "array":
            assert "maxItems" in node, path
            walk(node["items"], path + "[]")
        if kind == "object":
            if "additionalProperties" in node:
                assert "maxProperties" in node, path
                walk(node["additionalProperties"], path + "{}")
            for key, sub in (node.get("properties") or {}).items():
                walk(sub, f"{path}.{key}")

    for name, schema in podspec_vendor.vendored_schema()["schemas"].items():
        walk(schema, name)


AFFINITY = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "qpa"}},
                },
            }
        ]
    }
}


def test_the_official_structure_is_accepted_and_dumped_as_written() -> None:
    template = PodTemplate.model_validate({"affinity": AFFINITY})
    assert template.to_k8s()["affinity"] == AFFINITY


@pytest.mark.parametrize(
    ("affinity", "where"),
    [
        ({"nodeAffinity": {"requiredDuringScheduling": {}}},
         "nodeAffinity.requiredDuringScheduling"),
        ({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": "x"}]}},
         "podAffinity.preferredDuringSchedulingIgnoredDuringExecution.0.weight"),
        ({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}] * 33}},
         "podAffinity.preferredDuringSchedulingIgnoredDuringExecution"),
    ],
)  # fmt: skip
def test_other_structure_is_refused_naming_its_path(affinity: dict, where: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError) as refused:
        PodTemplate.model_validate({"affinity": affinity})
    locations = [".".join(str(p) for p in e["loc"]) for e in refused.value.errors()]
    assert any(loc.startswith(f"affinity.{where}") for loc in locations), locations
