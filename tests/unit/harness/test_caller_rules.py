"""Who a Harness request is, and what it may confirm: the identity header only with the
proxy's secret, confirmations only from an authenticated caller's own `confirm` field."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpa.api.v1alpha1.rules import client_controlled_cel, client_controlled_header
from qpa.envs.sandbox.suite import generate_suite
from qpa.harness.factory import PlannerSpec
from qpa.harness.serve_config import HarnessServeConfig
from qpa.harness.server import (
    Authenticator,
    Caller,
    HarnessModel,
    ProxySecretError,
    RequestRefused,
    parse_request,
)

SECRET = "s" * 40
TASK = next(t for t in generate_suite() if t.split == "test" and not t.confirmations)
PAYING = next(t for t in generate_suite() if t.confirmations)


def proxied(tmp_path: Path) -> Authenticator:
    path = tmp_path / "proxy-secret"
    path.write_text(SECRET + "\n")
    config = HarnessServeConfig(identity_header="x-qpa-user", proxy_secret_file=str(path))
    return Authenticator(config)


def refused(fn: object, *args: object) -> RequestRefused:
    with pytest.raises(RequestRefused) as caught:
        fn(*args)  # type: ignore[operator]
    return caught.value


def test_the_identity_header_counts_only_with_the_proxy_secret(tmp_path: Path) -> None:
    auth = proxied(tmp_path)
    assert auth.caller({"x-qpa-user": "carol", "x-qpa-proxy-secret": SECRET}) == Caller("carol")
    for headers in (
        {"x-qpa-user": "carol"},
        {"x-qpa-user": "carol", "x-qpa-proxy-secret": ""},
        {"x-qpa-user": "carol", "x-qpa-proxy-secret": SECRET + "x"},
        {"x-qpa-user": "carol", "x-qpa-proxy-secret": "é" * 40},
    ):
        error = refused(auth.caller, headers)
        assert error.status == 401 and error.field == "x-qpa-proxy-secret"
    assert refused(auth.caller, {}).field == "x-qpa-user"


def test_a_rotated_secret_is_read_again(tmp_path: Path) -> None:
    auth = proxied(tmp_path)
    rotated = "r" * 48
    (tmp_path / "proxy-secret").write_text(rotated)
    assert auth.caller({"x-qpa-user": "a", "x-qpa-proxy-secret": rotated}) == Caller("a")
    assert refused(auth.caller, {"x-qpa-user": "a", "x-qpa-proxy-secret": SECRET}).status == 401


def test_a_short_or_missing_secret_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("short")
    for path in (tmp_path / "short", tmp_path / "missing"):
        config = HarnessServeConfig(identity_header="x-qpa-user", proxy_secret_file=str(path))
        with pytest.raises(ProxySecretError):
            Authenticator(config)


def test_confirmations_come_only_from_the_callers_own_field() -> None:
    model = HarnessModel("harness", PlannerSpec("oracle"), config=HarnessServeConfig())
    bringing = {"task": {**TASK.model_dump(mode="json"), "confirmations": ["wallet_send_money"]}}
    error = refused(parse_request, bringing)
    assert error.status == 400 and error.field == "task.confirmations"
    request = parse_request(
        {"task": TASK.model_dump(mode="json"), "confirm": ["wallet_send_money"]}
    )
    task, user = model.admit(request, Caller("alice"))
    assert task.confirmations == ["wallet_send_money"] and user == "alice"
    anonymous = refused(model.admit, request, Caller(None))
    assert anonymous.status == 401 and anonymous.field == "confirm"
    plain, _ = model.admit(parse_request({"task": TASK.model_dump(mode="json")}), Caller("a"))
    assert plain.confirmations == []
    suite, _ = model.admit(parse_request({"task_id": PAYING.id}), Caller("a"))
    assert suite.confirmations == PAYING.confirmations  # the suite's own, not the request's


def test_non_finite_numbers_are_refused_naming_the_field() -> None:
    body = b'{"task_id": "%s", "max_turns": NaN}' % TASK.id.encode()
    assert refused(parse_request, body).field == "max_turns"
    world = b'{"task": {"id": "t", "world": {"a": {"b": [1, -Infinity]}}}}'
    assert refused(parse_request, world).field == "task.world.a.b[1]"


@pytest.mark.parametrize(
    ("name", "controlled"),
    [
        ("X-Forwarded-For", True),
        ("x-forwarded-user", True),
        ("X-FORWARDED-EMAIL", True),
        ("Forwarded", True),
        ("Host", True),
        ("X-Real-IP", True),
        ("Authorization", True),
        ("X-Qpa-Proxy-Secret", True),
        ("x-auth-request-user", False),
        ("X-Qpa-User", False),
        ("x-forwardedish", False),
    ],
)
def test_client_controlled_headers(name: str, controlled: bool) -> None:
    assert client_controlled_header(name) is controlled
    cel = client_controlled_cel("self.identityHeader")
    assert cel.startswith("!(self.identityHeader.lowerAscii() in [")
    assert "self.identityHeader.lowerAscii().startsWith('x-forwarded-')" in cel
