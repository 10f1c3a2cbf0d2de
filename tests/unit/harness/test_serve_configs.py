"""The servers' configuration objects refuse unsafe settings, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from qpa.cli import app
from qpa.envs.serve_config import EnvServeConfig
from qpa.envs.server import DEFAULT_EVICT_IDLE_S, DEFAULT_READ_TIMEOUT_S
from qpa.harness.serve_config import HarnessServeConfig


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"env_url": "http://user:secret@envs.example"}, "env_url"),
        ({"env_url": "file:///etc/passwd"}, "env_url"),
        ({"env_url": "envs.example"}, "env_url"),
        ({"identity_header": "Authorization"}, "identity_header"),
        ({"identity_header": "x user"}, "identity_header"),
        # headers clients set, or proxies append to, cannot carry an identity
        ({"identity_header": "X-Forwarded-For", "proxy_secret_file": "/s"}, "identity_header"),
        ({"identity_header": "x-forwarded-user", "proxy_secret_file": "/s"}, "identity_header"),
        ({"identity_header": "Forwarded", "proxy_secret_file": "/s"}, "identity_header"),
        ({"identity_header": "HOST", "proxy_secret_file": "/s"}, "identity_header"),
        ({"identity_header": "X-Real-IP", "proxy_secret_file": "/s"}, "identity_header"),
        ({"identity_header": "x-qpa-proxy-secret", "proxy_secret_file": "/s"}, "identity_header"),
        # the mode needs the proof that the header came from the proxy
        ({"identity_header": "x-qpa-user"}, "proxy_secret_file"),
        ({"tokens_file": "/t.yaml", "identity_header": "x-qpa-user"}, "proxy_secret_file"),
        ({"proxy_secret_file": "/s"}, "proxy_secret_file"),
        ({"insecure_single_user": "a b"}, "insecure_single_user"),
        ({"insecure_single_user": "dev", "tokens_file": "/t.yaml"}, "insecure_single_user"),
        ({"max_body_bytes": 10}, "max_body_bytes"),
        ({"read_timeout_seconds": 0}, "read_timeout_seconds"),
        ({"name": "Not A Name"}, "name"),
    ],
)
def test_harness_serve_config_refuses(settings: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        HarnessServeConfig.model_validate(settings)


def test_harness_serve_config_normalizes() -> None:
    config = HarnessServeConfig(
        env_url="http://pool-env.ns.svc/", identity_header="X-Qpa-User", proxy_secret_file="/s"
    )
    assert config.env_url == "http://pool-env.ns.svc"
    assert config.identity_header == "x-qpa-user" and config.authenticates
    assert not HarnessServeConfig().authenticates


def test_env_serve_config_defaults_and_bounds() -> None:
    config = EnvServeConfig()
    assert config.sessions_per_client is None
    assert config.evict_idle_seconds == DEFAULT_EVICT_IDLE_S
    assert config.read_timeout_seconds == DEFAULT_READ_TIMEOUT_S
    with pytest.raises(ValidationError, match="sessions_per_client"):
        EnvServeConfig(sessions_per_pod=4, sessions_per_client=5)
    with pytest.raises(ValidationError, match="read_timeout_seconds"):
        EnvServeConfig(read_timeout_seconds=0)


def test_cli_names_the_bad_flag(tmp_path: object) -> None:
    runner = CliRunner()
    both = runner.invoke(
        app,
        ["harness", "serve", "--planner", "oracle", "--insecure-single-user", "dev",
         "--identity-header", "x-user"],
    )  # fmt: skip
    assert both.exit_code == 2 and "insecure_single_user" in both.output
    unproven = runner.invoke(
        app, ["harness", "serve", "--planner", "oracle", "--identity-header", "x-user"]
    )
    assert unproven.exit_code == 2 and "proxy_secret_file" in unproven.output
    forwarded = runner.invoke(
        app,
        ["harness", "serve", "--planner", "oracle", "--identity-header", "X-Forwarded-For",
         "--proxy-secret-file", "/s"],
    )  # fmt: skip
    assert forwarded.exit_code == 2 and "identity_header" in forwarded.output
    short = tmp_path / "short-secret"  # type: ignore[operator]
    short.write_text("too-short")
    weak = runner.invoke(
        app,
        ["harness", "serve", "--planner", "oracle", "--identity-header", "x-user",
         "--proxy-secret-file", str(short)],
    )  # fmt: skip
    assert weak.exit_code == 2 and "--proxy-secret-file" in weak.output
    missing = runner.invoke(
        app, ["harness", "serve", "--planner", "oracle", "--tokens-file", "/nonexistent.yaml"]
    )
    assert missing.exit_code == 2 and "--tokens-file" in missing.output
    env = runner.invoke(app, ["env", "serve", "--tokens-file", "/nonexistent.yaml"])
    assert env.exit_code == 2 and "--tokens-file" in env.output
