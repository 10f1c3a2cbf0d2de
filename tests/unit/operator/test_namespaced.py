"""A namespace-scoped operator refuses to run, or to send anything, outside its namespaces."""

from __future__ import annotations

import asyncio

import kopf
import pytest
from qpa_operator import main
from qpa_operator.kube import ApiError, KubeClient, namespace_of, served_namespaces

ENV = {"QPA_OPERATOR_NAMESPACES": "team-a, team-b"}


def settings(clusterwide: bool) -> kopf.OperatorSettings:
    value = kopf.OperatorSettings()
    value.peering.clusterwide = clusterwide
    return value


def test_served_namespaces_and_paths() -> None:
    assert served_namespaces(ENV) == {"team-a", "team-b"}
    assert served_namespaces({}) is None
    assert namespace_of("/api/v1/namespaces/team-a/pods") == "team-a"
    assert namespace_of("/apis/qpa.ai/v1alpha1/namespaces/x/taskbatches/y/status") == "x"
    assert namespace_of("/apis/apiextensions.k8s.io/v1/customresourcedefinitions") is None


def test_start_is_refused_cluster_wide_or_outside_the_list() -> None:
    with pytest.raises(main.NamespacesMismatch, match="runs cluster-wide"):
        main.check_namespaces(settings(True), ["kopf", "run", "-A"], ENV)
    argv = ["/venv/bin/kopf", "run", "--namespace=team-a", "-n", "team-c", "-m", "x"]
    with pytest.raises(main.NamespacesMismatch, match="team-c, outside"):
        main.check_namespaces(settings(False), argv, ENV)
    main.check_namespaces(settings(False), ["kopf", "run", "--namespace=team-b"], ENV)
    main.check_namespaces(settings(True), ["kopf", "run", "-A"], {})  # cluster-wide mode


def test_scanning_is_off_when_namespaced() -> None:
    namespaced, cluster = kopf.OperatorSettings(), kopf.OperatorSettings()
    main.settings_from_env(namespaced, {**ENV, "QPA_OPERATOR_STANDALONE": "true"})
    main.settings_from_env(cluster, {"QPA_OPERATOR_STANDALONE": "true"})
    assert namespaced.scanning.disabled and not cluster.scanning.disabled


def test_the_client_sends_nothing_outside_its_namespaces() -> None:
    async def attempt(path: str) -> ApiError:
        # port 9 (discard) is never contacted: the refusal comes first
        client = KubeClient("http://127.0.0.1:9", retries=0, namespaces=frozenset({"team-a"}))
        try:
            with pytest.raises(ApiError) as caught:
                await client.request("GET", path)
        finally:
            await client.close()
        return caught.value

    refused = asyncio.run(attempt("/api/v1/namespaces/team-b/configmaps/x"))
    assert (refused.status, refused.reason) == (403, "NotServed")
    assert "namespace 'team-b' is outside the operator's namespaces (team-a" in refused.message
    cluster = asyncio.run(attempt("/apis/rbac.authorization.k8s.io/v1/clusterroles"))
    assert cluster.reason == "NotServed"
    inside = asyncio.run(attempt("/api/v1/namespaces/team-a/configmaps/x"))
    assert inside.reason == "ConnectionError"  # sent (and nothing listens there)
