"""A RolloutPool of `environment: mcp`: its spec (`mcp`: the server's URL or stdio command, the
server-side control and hidden tool lists) and what the builder makes of it: pods running
`qpa env serve --spec` whose work order says kind mcp, with the MCP server and the tool lists as
the variables the `mcp` kind reads, and an egress policy open to the MCP server.

Every child is checked against the official Kubernetes schemas (strict), as the API server
would; the spec's rules are checked on both sides (pydantic here, CEL in the CRD)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml
from fakes.kube_builtin import check
from pydantic import ValidationError
from qpa_operator.builders import rolloutpool
from qpa_operator.builders.common import Defaults

from qpa.api import RolloutPool, parse_resource
from qpa.api.v1alpha1 import WORK_ORDER_KEY, WORK_ORDER_PATH, WorkOrder
from qpa.api.v1alpha1.rolloutpool import MCP_TOOL_NAME
from qpa.envs.mcp.env import CONTROL_TOOLS_ENV, HIDDEN_TOOLS_ENV, TOOL_NAME, URL_ENV
from qpa.envs.serve_config import EnvServeConfig

D = Defaults()
URL = "http://notes-mcp.apps.svc:8000/mcp"
MCP = {"url": URL, "controlTools": ["reset_notes", "check_notes"], "hiddenTools": ["admin_wipe"]}


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "qpa.ai/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": "notes", "namespace": "team-a", "uid": "uid-1"},
        "spec": {"environment": "mcp", "replicas": {"min": 1, "max": 1}, "mcp": MCP, **spec},
    }


def pool(**spec: Any) -> RolloutPool:
    resource = parse_resource(body(**spec))
    assert isinstance(resource, RolloutPool)
    return resource


def env_of(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in main["env"]}


def schema_clean(obj: dict[str, Any]) -> None:
    checked = check(obj)
    assert not checked.errors and not checked.unknown, (checked.errors, checked.unknown)


def test_the_pods_serve_kind_mcp_with_the_server_and_tool_lists_of_the_spec() -> None:
    notes = pool()
    children = {(c["kind"], c["metadata"]["name"]): c for c in rolloutpool.children(notes, D)}
    deployment = children[("Deployment", "notes-env")]
    schema_clean(deployment)
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    assert main["args"] == ["qpa", "env", "serve", "--spec", WORK_ORDER_PATH]
    env = env_of(deployment)
    assert env[URL_ENV] == {"name": "QPA_MCP_URL", "value": URL}
    assert env[CONTROL_TOOLS_ENV]["value"] == "reset_notes,check_notes"
    assert env[HIDDEN_TOOLS_ENV]["value"] == "admin_wipe"
    assert "QPA_MCP_COMMAND" not in env
    # the pod's other input, its work order, says what it serves
    config_map = children[("ConfigMap", "notes-order")]
    order = WorkOrder.parse(yaml.safe_load(config_map["data"][WORK_ORDER_KEY]), RolloutPool)
    config = EnvServeConfig.from_rolloutpool(order)
    assert (config.kind, config.host, config.port) == ("mcp", "0.0.0.0", 8000)
    assert order.resource.spec.mcp is not None and order.resource.spec.mcp.url == URL
    # no phones, no API token: an mcp pod talks to its MCP server only
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod


def test_the_egress_policy_opens_the_mcp_server_and_nothing_else() -> None:
    policy = rolloutpool.egress_policy(pool(), D)
    schema_clean(policy)
    to_server = [
        rule
        for rule in policy["spec"]["egress"]
        if any(p.get("port") == 8000 for p in rule.get("ports", []))
    ]
    assert to_server, policy["spec"]["egress"]
    (peer,) = to_server[0]["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "apps"}
    assert policy["metadata"]["annotations"].get("qpa.ai/egress-blocked", "") == ""
    sandbox = parse_resource({**body(), "spec": {"environment": "sandbox"}})
    assert isinstance(sandbox, RolloutPool)
    sandbox_rules = rolloutpool.egress_policy(sandbox, D)["spec"]["egress"]
    assert len(policy["spec"]["egress"]) == len(sandbox_rules) + len(to_server)


def test_a_stdio_server_of_the_image_is_its_command_and_empty_lists_stay_empty() -> None:
    argv = ["python", "-m", "notes_mcp", "--db", "/data/notes db.sqlite"]
    deployment = rolloutpool.deployment(pool(mcp={"command": argv}), D)
    schema_clean(deployment)
    env = env_of(deployment)
    assert shlex.split(env["QPA_MCP_COMMAND"]["value"]) == argv  # how the mcp kind reads it
    assert URL_ENV not in env
    # set even when empty: whatever the image's environment says, a task names no control tool
    assert env[CONTROL_TOOLS_ENV] == {"name": CONTROL_TOOLS_ENV, "value": ""}
    assert env[HIDDEN_TOOLS_ENV] == {"name": HIDDEN_TOOLS_ENV, "value": ""}


def test_changed_tool_lists_roll_the_pods() -> None:
    before = rolloutpool.deployment(pool(), D)
    after = rolloutpool.deployment(pool(mcp={**MCP, "controlTools": ["reset_notes"]}), D)
    assert before["spec"]["template"] != after["spec"]["template"]
    assert env_of(after)[CONTROL_TOOLS_ENV]["value"] == "reset_notes"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"mcp": None}, "mcp is required for environment mcp and allowed only there"),
        (
            {"environment": "sandbox"},
            "mcp is required for environment mcp and allowed only there",
        ),
        ({"mcp": {"controlTools": ["reset_notes"]}}, "mcp: set url (streamable HTTP) or command"),
        ({"mcp": {"url": URL, "command": ["x"]}}, "mcp: set url (streamable HTTP) or command"),
        (
            {"mcp": {"url": URL, "controlTools": ["wipe"], "hiddenTools": ["wipe"]}},
            "mcp: a tool is a control tool or a hidden one, not both",
        ),
        ({"mcp": {"url": URL, "controlTools": ["a", "a"]}}, "must not repeat a tool"),
        ({"mcp": {"url": "ftp://notes/mcp"}}, "url"),
        ({"mcp": {"url": "http://user:pw@notes/mcp"}}, "credentials are not allowed"),
        ({"mcp": {"url": URL, "controlTools": ["reset,admin_wipe"]}}, "controlTools"),
        ({"mcp": {"url": URL, "hiddenTools": ["admin wipe"]}}, "hiddenTools"),
    ],
)
def test_bad_mcp_settings_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    document = body(**spec)
    if document["spec"].get("mcp") is None:
        document["spec"].pop("mcp", None)
    if spec.get("environment") == "sandbox":
        document["spec"]["mcp"] = MCP
    with pytest.raises(ValidationError) as raised:
        parse_resource(document)
    assert message in str(raised.value)


def test_the_crd_carries_the_same_rules_and_names_as_the_environment_kind() -> None:
    from qpa.api.crdgen import crd

    definition = crd(RolloutPool)
    spec = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert "mcp is required for environment mcp and allowed only there" in rules
    mcp = spec["properties"]["mcp"]
    assert set(mcp["properties"]) == {"url", "command", "controlTools", "hiddenTools"}
    assert mcp["properties"]["controlTools"]["items"]["pattern"] == MCP_TOOL_NAME
    assert TOOL_NAME.pattern == MCP_TOOL_NAME  # the CRD accepts what the pods accept
