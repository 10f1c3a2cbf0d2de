"""RolloutPool children that keep sessions on their pod: the headless Service, the pods'
identity and drain hook, the autoscaler on sessions in use (CPU when asked), and the free
slots in the status, summed from the autoscaler's reading of the pods' metric.

Every child is checked against the official Kubernetes 1.37 schemas (strict), as the API
server would; the drain hook's command line is parsed by the real CLI.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_builtin import check
from qpa_operator.builders import rolloutpool
from qpa_operator.builders.common import Defaults, selector_labels
from qpa_operator.builders.netsettings import NetworkSettings
from typer.testing import CliRunner

from qpa.api import RolloutPool, parse_resource
from qpa.api.v1alpha1.base import parse_quantity
from qpa.cli import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
D = Defaults()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pool(index: int = 0, **spec: Any) -> RolloutPool:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "rolloutpool.yaml").read_text()) if d]
    body = copy.deepcopy(docs[index])
    body["metadata"].update(namespace="team-a", uid="uid-1")
    body["spec"].update(spec)
    resource = parse_resource(body)
    assert isinstance(resource, RolloutPool)
    return resource


def schema_clean(obj: dict[str, Any]) -> None:
    checked = check(obj)
    assert not checked.errors and not checked.unknown, (checked.errors, checked.unknown)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


def test_a_headless_service_lists_the_pods_on_their_own_port() -> None:
    sandbox = pool(port=8100)
    (headless,) = [
        c
        for c in rolloutpool.children(sandbox, D)
        if c["metadata"]["name"] == rolloutpool.pods_service_name(sandbox)
    ]
    assert headless["metadata"]["name"] == "sandbox-env-pods"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == selector_labels(sandbox, rolloutpool.COMPONENT)
    assert headless["spec"]["ports"] == [
        {"name": "http", "port": 8100, "targetPort": "http", "protocol": "TCP"}
    ]
    assert rolloutpool.service(sandbox, D)["spec"]["type"] == "ClusterIP"  # places new sessions
    schema_clean(headless)


def test_pods_know_themselves_and_drain_before_they_go() -> None:
    sandbox = pool(drainTimeoutSeconds=300)
    deployment = rolloutpool.deployment(sandbox, D)
    schema_clean(deployment)
    pod = deployment["spec"]["template"]["spec"]
    main = container(deployment)
    env = {e["name"]: e for e in main["env"]}
    assert env["QPA_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["QPA_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    key_file = env["QPA_ENV_DRAIN_FILE"]["value"]
    assert key_file.startswith("/tmp/")  # the pod's private emptyDir, never a shared volume
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in tmp

    hook = main["lifecycle"]["preStop"]["exec"]["command"]
    assert hook == [
        "qpa", "env", "drain", "--url", "http://127.0.0.1:8000", "--timeout-seconds", "300",
    ]  # fmt: skip
    assert pod["terminationGracePeriodSeconds"] == 300 + rolloutpool.DRAIN_MARGIN_S
    assert main["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    notes = deployment["spec"]["template"]["metadata"]["annotations"]
    assert (notes["prometheus.io/scrape"], notes["prometheus.io/port"]) == ("true", "8000")
    assert notes["prometheus.io/path"] == "/metrics"

    # the hook's command line is the real CLI's: its flags parse, the missing key is named
    missing = ["--key-file", "/nonexistent/drain.key"]
    result = CliRunner().invoke(app, [*hook[1:], *missing])
    assert result.exit_code == 2 and "--key-file: cannot read" in result.output


def test_the_autoscaler_scales_on_sessions_in_use_by_default() -> None:
    sandbox = pool()  # sessionsPerPod 32, replicas 2..8
    hpa = rolloutpool.autoscaler(sandbox, D)
    schema_clean(hpa)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"] == {"name": "qpa_env_sessions_in_use"}
    target = metric["pods"]["target"]
    assert target["type"] == "AverageValue"
    assert parse_quantity(target["averageValue"]) == parse_quantity("22.4")  # 70% of 32
    half = rolloutpool.autoscaler(pool(replicas={"min": 1, "max": 4, "targetPercent": 50}), D)
    assert parse_quantity(half["spec"]["metrics"][0]["pods"]["target"]["averageValue"]) == 16


@pytest.mark.parametrize("source", ["spec", "chart"])
def test_cpu_is_the_fallback_when_the_spec_or_the_chart_says_so(source: str) -> None:
    if source == "spec":
        sandbox, defaults = pool(replicas={"min": 2, "max": 8, "metric": "cpu"}), D
    else:
        sandbox = pool()
        defaults = Defaults.from_env({"QPA_OPERATOR_ROLLOUTPOOL_METRIC": "cpu"})
    hpa = rolloutpool.autoscaler(sandbox, defaults)
    schema_clean(hpa)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 70},
            },
        }
    ]
    chart_cpu = Defaults.from_env({"QPA_OPERATOR_ROLLOUTPOOL_METRIC": "cpu"})
    spec_wins = rolloutpool.autoscaler(
        pool(replicas={"min": 2, "max": 8, "metric": "sessions"}), chart_cpu
    )
    assert spec_wins["spec"]["metrics"][0]["type"] == "Pods"


def test_a_bad_chart_metric_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="QPA_OPERATOR_ROLLOUTPOOL_METRIC: 'memory' is not one"):
        Defaults.from_env({"QPA_OPERATOR_ROLLOUTPOOL_METRIC": "memory"})
    assert Defaults.from_env({}).rollout_pool_metric == "sessions"


def hpa_reading(average: str, pods: int, name: str = "qpa_env_sessions_in_use") -> dict[str, Any]:
    return {
        "status": {
            "currentReplicas": pods,
            "currentMetrics": [
                {
                    "type": "Pods",
                    "pods": {"metric": {"name": name}, "current": {"averageValue": average}},
                }
            ],
        }
    }


DEPLOYMENT = {"status": {"replicas": 3, "readyReplicas": 3}}


def status(resource: RolloutPool, autoscaler: dict[str, Any] | None, leased: int = 0) -> Any:
    return rolloutpool.rolloutpool_status(
        resource,
        DEPLOYMENT,
        leased=leased,
        phones_available=None,
        device_pool_found=None,
        observed_generation=1,
        defaults=D,
        now=NOW,
        autoscaler=autoscaler,
    )


def test_status_shows_free_slots_summed_from_the_pods() -> None:
    sandbox = pool()  # 3 ready pods x 32 = 96 slots
    reading = status(sandbox, hpa_reading("12500m", 3))  # 12.5 sessions per pod on average
    assert (reading.capacity, reading.leased, reading.free) == (96, 38, 58)
    assert status(sandbox, hpa_reading("40", 3)).free == 0  # never below zero
    # no reading yet (no metrics adapter, a CPU autoscaler, none at all): nothing in use known
    for none in (None, {"status": {}}, hpa_reading("3", 3, name="cpu"), hpa_reading("x", 3)):
        unknown = status(sandbox, none)
        assert (unknown.leased, unknown.free) == (0, 96)
    # device pools: the phone Leases held count when the metric says less
    assert status(sandbox, hpa_reading("1", 3), leased=5).leased == 5
    assert status(sandbox, hpa_reading("3", 3), leased=5).leased == 9
    assert rolloutpool.sessions_in_use(hpa_reading("2", 0)) == 0


def test_the_admins_metrics_scrapers_may_reach_the_servers_port() -> None:
    sandbox = pool()
    alone = rolloutpool.ingress_policy(sandbox, D)
    assert len(alone["spec"]["ingress"]) == 1  # the pool's clients only, by default
    network = NetworkSettings.model_validate(
        {
            "ingress": {
                "metricsScrapers": [{"namespace": "monitoring", "podLabels": {"app": "prom"}}]
            }
        }
    )
    policy = rolloutpool.ingress_policy(sandbox, replace(D, network=network))
    schema_clean(policy)
    clients, scrapers = policy["spec"]["ingress"]
    assert scrapers["ports"] == clients["ports"] == [{"protocol": "TCP", "port": "http"}]
    (peer,) = scrapers["from"]
    assert peer["podSelector"] == {"matchLabels": {"app": "prom"}}
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
