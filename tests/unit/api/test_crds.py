"""crds/*.yaml: generated from qpa.api, structural, and accepting every example."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_cel import compile_rule
from fakes.kube_schema import CustomResourceSchema
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from qpa.api import RESOURCES, parse_resource
from qpa.api.crdgen import (
    HEADER,
    check_crds,
    crd_filename,
    crds,
    render_yaml,
    rendered_crds,
    structural_problems,
    write_crds,
)

ROOT = Path(__file__).resolve().parents[3]
CRDS_DIR = ROOT / "crds"
EXAMPLES = ROOT / "examples"


def crd_files() -> dict[str, dict[str, Any]]:
    return {
        path.name: yaml.safe_load(path.read_text())
        for path in sorted(CRDS_DIR.glob("qpa.ai_*.yaml"))
    }


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_crds_folder_matches_the_models(tmp_path: Path) -> None:
    """The drift test: regenerate and compare byte for byte (`qpa crds generate` fixes it)."""
    assert check_crds(CRDS_DIR) == []
    written = write_crds(tmp_path)
    assert sorted(p.name for p in written) == sorted(crd_files())
    for path in written:
        assert path.read_text() == (CRDS_DIR / path.name).read_text()
        assert path.read_text().startswith(HEADER)


def test_check_reports_drift_and_stale_files(tmp_path: Path) -> None:
    write_crds(tmp_path)
    target = tmp_path / crd_filename(RESOURCES[0])
    target.write_text(target.read_text().replace("minimum: 1", "minimum: 2", 1))
    (tmp_path / "qpa.ai_oldkinds.yaml").write_text("kind: CustomResourceDefinition\n")
    (tmp_path / crd_filename(RESOURCES[1])).unlink()
    problems = check_crds(tmp_path)
    assert any("differs from qpa.api" in p and "line" in p for p in problems)
    assert any(p.endswith("missing") for p in problems)
    assert any("no kind generates it" in p for p in problems)
    write_crds(tmp_path)
    assert check_crds(tmp_path) == []
    assert not (tmp_path / "qpa.ai_oldkinds.yaml").exists()


def test_cli_generate_and_check(tmp_path: Path) -> None:
    from qpa.cli.crds import crds_app

    runner = CliRunner()
    out = tmp_path / "crds"
    result = runner.invoke(crds_app, ["generate", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("qpa.ai_*.yaml"))) == len(RESOURCES)
    assert runner.invoke(crds_app, ["check", "--dir", str(out)]).exit_code == 0
    (out / crd_filename(RESOURCES[2])).write_text("drifted\n")
    drifted = runner.invoke(crds_app, ["check", "--dir", str(out)])
    assert drifted.exit_code == 1
    assert "qpa crds generate" in drifted.output


@pytest.mark.parametrize("name", sorted(crds()))
def test_crd_shape(name: str) -> None:
    crd = crd_files()[name]
    resource = next(r for r in RESOURCES if crd_filename(r) == name)
    info = resource.info
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{info.plural}.qpa.ai"
    spec = crd["spec"]
    assert spec["group"] == "qpa.ai" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": info.kind,
        "listKind": f"{info.kind}List",
        "plural": info.plural,
        "singular": info.singular,
        "shortNames": list(info.short_names),
        "categories": ["qpa"],
    }
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    scale = (
        {
            "scale": {
                "specReplicasPath": ".spec.replicas.min",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.labelSelector",
            }
        }
        if info.kind == "RolloutPool"
        else {}
    )
    assert version["subresources"] == {"status": {}, **scale}
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns][-1] == "Age"
    assert any(c["jsonPath"] == ".status.phase" for c in columns)
    schema = schema_of(crd)
    status = schema["properties"]["status"]["properties"]
    assert {"phase", "observedGeneration", "conditions"} <= set(status)
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert set(status["conditions"]["items"]["required"]) >= {
        "type",
        "status",
        "reason",
        "lastTransitionTime",
    }
    assert schema["required"] == ["spec"]


@pytest.mark.parametrize("name", sorted(crds()))
def test_schemas_are_structural(name: str) -> None:
    schema = schema_of(crd_files()[name])
    assert structural_problems(schema) == []
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf" not in text.replace("x-kubernetes-int-or-string", "")
    assert "additionalProperties: false" not in text and "title:" not in text


def test_secrets_are_referenced_never_inlined() -> None:
    def walk(node: Any, path: str) -> list[str]:
        found = []
        for key, prop in (node.get("properties") or {}).items():
            lowered = key.lower()
            secret = any(w in lowered for w in ("password", "token", "secretkey", "apikey"))
            # CARE's tokenWeight / tokenNorm count output tokens: numbers, never credentials
            if secret and not lowered.endswith(("ref", "key", "weight", "norm")):
                found.append(f"{path}.{key}")
            found += walk(prop, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            found += walk(node["items"], f"{path}[]")
        return found

    for name, crd in crd_files().items():
        assert walk(schema_of(crd), name) == []


def test_structural_checker_catches_what_the_api_server_refuses() -> None:
    bad = {
        "type": "object",
        "properties": {
            "untyped": {"description": "no type"},
            "union": {"anyOf": [{"type": "string"}, {"type": "integer"}], "type": "string"},
            "closed": {"type": "object", "properties": {}, "additionalProperties": False},
            "uniq": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "ref": {"$ref": "#/$defs/X"},
            "list": {"type": "array"},
            "map": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
        },
    }
    problems = "\n".join(structural_problems(bad))
    for expected in (
        "untyped: type is required",
        "union.anyOf[0]: 'type' is not allowed",
        "closed: additionalProperties must not be false",
        "uniqueItems is not allowed",
        "unknown keyword '$ref'",
        "list: arrays need items",
        "list-map key 'name' must be required or defaulted",
    ):
        assert expected in problems, problems


def test_every_cel_rule_compiles_in_the_test_servers_subset() -> None:
    def rules(node: Any) -> list[str]:
        found = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
        for prop in (node.get("properties") or {}).values():
            found += rules(prop)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += rules(node[key])
        return found

    all_rules = [rule for crd in crd_files().values() for rule in rules(schema_of(crd))]
    assert len(all_rules) >= 20
    for rule in all_rules:
        compile_rule(rule)


def example_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("qpa.ai/"):
                docs.append(doc)
    return docs


def test_examples_cover_every_kind() -> None:
    kinds = {doc["kind"] for doc in example_docs()}
    assert kinds == {r.info.kind for r in RESOURCES}
    assert (EXAMPLES / "trainingrun.yaml").exists()


@pytest.mark.parametrize(
    "doc", example_docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_every_example_validates_against_its_crd(doc: dict[str, Any]) -> None:
    plural = next(r.info.plural for r in RESOURCES if r.info.kind == doc["kind"])
    schema = CustomResourceSchema(schema_of(crd_files()[f"qpa.ai_{plural}.yaml"]))
    obj = copy.deepcopy(doc)
    assert schema.prune(obj) == [], "the example has fields the CRD does not know"
    schema.default(obj)
    assert schema.validate(obj) == []
    # What the server stores (with defaults) is what pydantic reads with its own defaults.
    assert parse_resource(obj) == parse_resource(doc)


@st.composite
def json_like(draw: st.DrawFn) -> Any:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(10**12), 10**12)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=30)
    )
    return draw(
        st.recursive(
            scalars,
            lambda children: (
                st.lists(children, max_size=4)
                | st.dictionaries(st.text(min_size=1, max_size=12), children, max_size=4)
            ),
            max_leaves=12,
        )
    )


@settings(max_examples=150, deadline=None)
@given(json_like())
def test_yaml_rendering_reads_back_exactly(value: Any) -> None:
    assert yaml.safe_load(render_yaml(value)) == value


def test_rendered_crds_read_back_exactly() -> None:
    for name, text in rendered_crds().items():
        assert yaml.safe_load(text) == crds()[name]
