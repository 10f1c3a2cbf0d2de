"""`spec.harness.auth`: exactly one of a tokens Secret key or a proxy's identity header, bounded
and validated the same way by `qpa.api` and by the CRD the API server enforces."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from qpa.api import HarnessRelease, parse_resource
from qpa.api.v1alpha1.harnessrelease import HarnessAuth
from qpa.api.v1alpha1.rules import CLIENT_CONTROLLED_HEADERS

ROOT = Path(__file__).resolve().parents[3]

PROXY: dict[str, Any] = {
    "identityHeader": "x-auth-request-user",
    "proxySelector": {"app": "oauth2-proxy"},
    "proxySecretRef": {"name": "harness-proxy", "key": "secret"},
}


def body(auth: Any) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "harnessrelease.yaml").read_text())]
    doc = copy.deepcopy(next(d for d in docs if d))
    doc["spec"]["harness"]["auth"] = auth
    return doc


def refusal(auth: Any) -> tuple[str, str]:
    """(dotted location, message) of the one error parsing a release with `auth` gives."""
    with pytest.raises(ValidationError) as caught:
        parse_resource(body(auth))
    errors = caught.value.errors()
    assert len(errors) == 1, errors
    return ".".join(str(p) for p in errors[0]["loc"]), errors[0]["msg"]


@pytest.mark.parametrize(
    "auth",
    [
        {"tokensSecretRef": {"name": "harness-tokens", "key": "tokens.yaml"}},
        PROXY,
        {**PROXY, "identityHeader": "X-Auth-Request-User", "proxyNamespace": "auth"},
    ],
)
def test_one_mode_is_accepted_and_round_trips(auth: dict[str, Any]) -> None:
    hr = parse_resource(body(auth))
    assert isinstance(hr, HarnessRelease)
    assert hr.spec.harness.auth is not None
    assert hr.to_k8s()["spec"]["harness"]["auth"] == auth


def test_both_modes_are_refused_naming_the_field() -> None:
    where, message = refusal(
        {
            "tokensSecretRef": {"name": "harness-tokens", "key": "tokens.yaml"},
            **PROXY,
        }
    )
    assert where == "spec.harness.auth"
    assert "set exactly one of tokensSecretRef or identityHeader" in message


def test_an_empty_auth_is_refused() -> None:
    where, message = refusal({})
    assert where == "spec.harness.auth"
    assert "exactly one" in message


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ({"identityHeader": "x forwarded user"}, "spec.harness.auth.identityHeader"),
        ({"identityHeader": "x-user\r\nx-admin: 1"}, "spec.harness.auth.identityHeader"),
        ({"identityHeader": ""}, "spec.harness.auth.identityHeader"),
        ({"identityHeader": "x" * 65}, "spec.harness.auth.identityHeader"),
        ({"tokensSecretRef": {"name": "Bad_Name", "key": "t"}}, "spec.harness.auth."),
        ({"tokensSecretRef": {"name": "ok", "key": "../etc/passwd"}}, "spec.harness.auth."),
        ({"tokensSecretRef": {"name": "ok"}}, "spec.harness.auth.tokensSecretRef.key"),
        ({"tokensSecretRef": {"name": "a" * 254, "key": "t"}}, "spec.harness.auth."),
        ({"tokenSecretRef": {"name": "ok", "key": "t"}}, "spec.harness.auth.tokenSecretRef"),
        ({"tokensSecretRef": {"name": "ok", "key": "t", "value": "x"}}, "spec.harness.auth."),
    ],
)
def test_bad_values_are_refused_naming_the_field(auth: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_resource(body(auth))
    locations = [".".join(str(p) for p in e["loc"]) for e in caught.value.errors()]
    assert any(where.startswith(field) for where in locations), locations


@pytest.mark.parametrize(
    "header",
    [*CLIENT_CONTROLLED_HEADERS, "Authorization", "HOST", "X-Forwarded-For", "x-forwarded-user"],
)
def test_headers_a_client_sets_cannot_carry_an_identity(header: str) -> None:
    where, message = refusal({**PROXY, "identityHeader": header})
    assert where == "spec.harness.auth"
    assert "cannot carry an identity" in message


@pytest.mark.parametrize(
    "auth",
    [
        {"identityHeader": "x-auth-request-user"},  # no proxy: anyone could set the header
        {k: v for k, v in PROXY.items() if k != "proxySecretRef"},
        {k: v for k, v in PROXY.items() if k != "proxySelector"},
        {"tokensSecretRef": {"name": "t", "key": "k"}, "proxySelector": {"app": "p"}},
    ],
)
def test_identity_header_mode_needs_the_proxys_pods_and_secret(auth: dict[str, Any]) -> None:
    where, message = refusal(auth)
    assert where == "spec.harness.auth"
    assert "proxySelector and proxySecretRef" in message


def crd_auth_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "qpa.ai_harnessreleases.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema: dict[str, Any] = spec["properties"]["harness"]["properties"]["auth"]
    return schema


def test_the_crd_enforces_the_same_rules() -> None:
    schema = crd_auth_schema()
    rules = {r["rule"]: r["message"] for r in schema["x-kubernetes-validations"]}
    assert rules == {rule.cel: rule.message for rule in HarnessAuth.RULES}
    assert rules["has(self.tokensSecretRef) != has(self.identityHeader)"] == (
        "set exactly one of tokensSecretRef or identityHeader"
    )
    header = schema["properties"]["identityHeader"]
    assert header["maxLength"] == 64 and header["pattern"] == "^[A-Za-z0-9-]{1,64}$"
    ref = schema["properties"]["tokensSecretRef"]
    assert set(ref["required"]) == {"name", "key"}
    assert ref["properties"]["name"]["maxLength"] == 253
    assert ref["properties"]["key"]["maxLength"] == 253
    assert schema.get("additionalProperties") in (None, False)
    assert "tokens" not in schema["properties"]  # by reference only: no inline token field


@pytest.mark.parametrize(
    ("auth", "valid"),
    [
        ({"tokensSecretRef": {"name": "t", "key": "k"}}, True),
        (PROXY, True),
        ({"identityHeader": "x-auth-request-user"}, False),
        ({**PROXY, "identityHeader": "X-Forwarded-For"}, False),
        ({"tokensSecretRef": {"name": "t", "key": "k"}, "identityHeader": "x-user"}, False),
        ({}, False),
        ({"identityHeader": "Authorization"}, False),
        ({"identityHeader": "content-length"}, False),
    ],
)
def test_the_crd_rules_decide_as_qpa_api_does(auth: dict[str, Any], valid: bool) -> None:
    """The CRD's CEL (evaluated by the test API server's evaluator) agrees with pydantic."""
    from fakes.kube_cel import evaluate

    rules = [r["rule"] for r in crd_auth_schema()["x-kubernetes-validations"]]
    assert all(evaluate(rule, {"self": auth}) is True for rule in rules) is valid
    try:
        HarnessAuth.model_validate(auth)
    except ValidationError:
        assert not valid
    else:
        assert valid
