"""A HarnessRelease's `spec.harness.auth` reaches the Harness predictor: the tokens Secret key
mounted read-only at a fixed path with `--tokens-file`, or `--identity-header`; the pod stays
restricted, the operator reads no Secret, and changing the auth is a new version."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from helpers.podsecurity import violations
from pydantic import ValidationError
from qpa_operator.builders import Defaults, harnessrelease

from qpa.api import HarnessRelease, parse_resource
from qpa.cli import app
from qpa.harness.serve_config import HarnessServeConfig

ROOT = Path(__file__).resolve().parents[3]
D = Defaults(harness_image="registry.example/harness:1")
TOKENS = {"tokensSecretRef": {"name": "harness-tokens", "key": "alice-and-bob.yaml"}}
HEADER = {
    "identityHeader": "X-Qpa-User",
    "proxySelector": {"app": "oauth2-proxy"},
    "proxyNamespace": "auth",
    "proxySecretRef": {"name": "harness-proxy", "key": "shared"},
}
PROXY = harnessrelease.IdentityProxy(
    pod_labels={"app": "oauth2-proxy"},
    secret_name="harness-proxy",
    secret_key="shared",
    namespace="auth",
)


def release(auth: dict[str, Any] | None) -> HarnessRelease:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "harnessrelease.yaml").read_text())]
    body = copy.deepcopy(next(d for d in docs if d))
    body["metadata"].update(namespace="team-a", uid="uid-planner")
    if auth is not None:
        body["spec"]["harness"]["auth"] = auth
    hr = parse_resource(body)
    assert isinstance(hr, HarnessRelease)
    return hr


def predictor(
    hr: HarnessRelease, proxy: harnessrelease.IdentityProxy | None = None
) -> dict[str, Any]:
    service = harnessrelease.harness_service(hr, D, proxy=proxy)
    spec: dict[str, Any] = service["spec"]["predictor"]
    return spec


def serve_options() -> set[str]:
    command: Any = typer.main.get_command(app)
    command = command.commands["harness"].commands["serve"]
    return {opt for param in command.params for opt in param.opts}


def flag_value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, argv
    return argv[argv.index(flag) + 1]


def test_tokens_secret_is_mounted_read_only_and_passed_as_tokens_file() -> None:
    pod = predictor(release(TOKENS))
    (container,) = pod["containers"]
    argv = container["command"]
    assert flag_value(argv, "--tokens-file") == "/var/run/secrets/qpa/harness-tokens/tokens.yaml"
    assert "--identity-header" not in argv
    # the key is renamed to a fixed file: no name from the spec reaches argv
    assert not any("alice-and-bob" in word for word in argv)
    volume = next(v for v in pod["volumes"] if v["name"] == "harness-tokens")
    assert volume == {
        "name": "harness-tokens",
        "secret": {
            "secretName": "harness-tokens",
            "items": [{"key": "alice-and-bob.yaml", "path": "tokens.yaml"}],
            "defaultMode": 0o440,
        },
    }
    mount = next(m for m in container["volumeMounts"] if m["name"] == "harness-tokens")
    assert mount == {
        "name": "harness-tokens",
        "mountPath": "/var/run/secrets/qpa/harness-tokens",
        "readOnly": True,
    }
    # the kubelet reads the Secret: no secretKeyRef, no token value, nothing for the operator
    assert not any("valueFrom" in e for e in container["env"])
    assert {"--tokens-file"} <= {w for w in argv if w.startswith("--")} <= serve_options()
    assert violations(pod) == []


def test_identity_header_is_passed_with_the_proxy_secret_mounted() -> None:
    plain = predictor(release(None))
    pod = predictor(release(HEADER), PROXY)
    (container,) = pod["containers"]
    argv = container["command"]
    assert flag_value(argv, "--identity-header") == "X-Qpa-User"
    assert flag_value(argv, "--proxy-secret-file") == harnessrelease.PROXY_SECRET_PATH
    assert "--tokens-file" not in argv and not any("shared" in word for word in argv)
    volume = next(v for v in pod["volumes"] if v["name"] == "harness-proxy")
    assert volume["secret"] == {
        "secretName": "harness-proxy",
        "items": [{"key": "shared", "path": "proxy-secret"}],
        "defaultMode": 0o440,
    }
    assert [v for v in pod["volumes"] if v["name"] != "harness-proxy"] == plain["volumes"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "harness-proxy")
    assert mount["readOnly"] is True
    assert {w for w in argv if w.startswith("--")} <= serve_options()
    assert violations(pod) == []


def test_the_release_names_its_proxy_and_the_server_refuses_the_header_alone() -> None:
    """The proxy comes from `spec.harness.auth` (the CRD requires it in identity-header mode);
    `qpa harness serve` refuses the header without the proxy's secret."""
    argv = predictor(release(HEADER))["containers"][0]["command"]
    assert flag_value(argv, "--proxy-secret-file").endswith("/proxy-secret")
    with pytest.raises(ValidationError, match="proxy_secret_file"):
        HarnessServeConfig(identity_header=flag_value(argv, "--identity-header"))


def test_identity_mode_admits_only_the_proxy_pods() -> None:
    for proxy, auth in ((PROXY, HEADER), (None, TOKENS)):
        hr = release(auth)
        children = harnessrelease.services(hr, D)
        policies = harnessrelease.network_policies(hr, D, children, proxy)
        (ingress,) = [
            p
            for p in policies
            if p["metadata"]["name"] == f"{harnessrelease.harness_name(hr)}-ingress"
        ]
        peers = [peer for rule in ingress["spec"]["ingress"] for peer in rule["from"]]
        if proxy is not None:
            assert peers == [
                {
                    "podSelector": {"matchLabels": {"app": "oauth2-proxy"}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "auth"}},
                }
            ]
        else:  # tokens: the gateway and the benchmark pods, as before
            assert peers and all(p["podSelector"]["matchLabels"] for p in peers)


@pytest.mark.parametrize(
    ("labels", "name", "field"),
    [
        ({}, "s", "proxySelector"),
        ({"app": ""}, "s", "proxySelector"),
        ({"app": "proxy"}, "", "proxySecretRef"),
    ],
)
def test_the_proxy_selector_and_secret_are_required(
    labels: dict[str, str], name: str, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        harnessrelease.IdentityProxy(pod_labels=labels, secret_name=name, secret_key="k")


def test_without_auth_no_auth_flag_and_no_tokens_volume() -> None:
    pod = predictor(release(None))
    argv = pod["containers"][0]["command"]
    assert "--tokens-file" not in argv and "--identity-header" not in argv
    assert all(v["name"] != "harness-tokens" for v in pod["volumes"])


@pytest.mark.parametrize("auth", [TOKENS, HEADER], ids=["tokens", "header"])
def test_the_flags_parse_into_an_authenticating_serve_config(auth: dict[str, Any]) -> None:
    """What the builder passes is what `qpa harness serve` accepts as authentication."""
    argv = predictor(release(auth), PROXY)["containers"][0]["command"]
    settings: dict[str, Any] = {}
    if "--tokens-file" in argv:
        settings["tokens_file"] = flag_value(argv, "--tokens-file")
    if "--identity-header" in argv:
        settings["identity_header"] = flag_value(argv, "--identity-header")
        settings["proxy_secret_file"] = flag_value(argv, "--proxy-secret-file")
    config = HarnessServeConfig(**settings)
    assert config.authenticates
    if "identity_header" in settings:
        assert config.identity_header == "x-qpa-user"


def test_the_release_renders_no_secret_and_the_bench_job_no_tokens() -> None:
    hr = release(TOKENS)
    children = [*harnessrelease.services(hr, D), harnessrelease.bench_job(hr, D)]
    assert all(child["kind"] != "Secret" for child in children)
    job = harnessrelease.bench_job(hr, D)["spec"]["template"]["spec"]
    assert all(v["name"] != "harness-tokens" for v in job["volumes"])


def test_changing_the_auth_is_a_new_version_and_candidate() -> None:
    plain, tokens, header = (release(a) for a in (None, TOKENS, HEADER))
    ids = {harnessrelease.candidate(hr, D).id for hr in (plain, tokens, header)}
    assert len(ids) == 3
    candidates = {harnessrelease.candidate_id(hr, D) for hr in (plain, tokens, header)}
    assert len(candidates) == 3
    # the version carries the auth, so the stable version's Harness keeps its own
    stable = harnessrelease.candidate(tokens, D)
    served = harnessrelease.harness_service(plain, D, version=stable)
    assert "--tokens-file" in served["spec"]["predictor"]["containers"][0]["command"]
