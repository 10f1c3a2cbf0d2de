"""The Helm chart (charts/qpa), rendered by the real helm v4 and checked like an API server would.

- `helm lint --strict` passes for the defaults and with every option on;
- every rendered object validates against the Kubernetes 1.37 OpenAPI schemas (strict:
  unknown fields fail), the ClusterKopfPeering against kopf's CRD from the chart's crds/;
- the chart's qpa.ai CRDs are the repository's crds/ (which tests/unit/api checks against
  qpa.api and the examples), kept on uninstall;
- the operator's command is a real `kopf run` command line on the chart's peering, and every
  variable the chart sets is one the operator (or kopf) reads; the operator's `Defaults` built
  from the rendered variables carry the images, store and GPU placement of the values;
- values.schema.json rejects wrong values, naming the field.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helpers.chart import (
    CHART,
    FULL,
    NAMESPACE,
    RELEASE,
    ROOT,
    HelmRun,
    Render,
    env_of,
    find,
    operator_container,
    set_args,
)
from qpa_operator.builders import Defaults

from qpa.api.v1alpha1 import DevicePoolSpec

K8S_VERSION = "1.37.0"


def test_lint_is_clean(helm_run: HelmRun) -> None:
    for values in ({}, FULL):
        result = helm_run("lint", "--strict", str(CHART), *set_args(values))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("values", [{}, FULL], ids=["defaults", "full"])
def test_every_object_validates_against_the_kubernetes_schemas(
    render: Render, values: dict[str, Any]
) -> None:
    docs = render(values)
    peering_crds = {
        d["spec"]["names"]["kind"]: d
        for d in yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text())
    }
    kinds = set()
    for doc in docs:
        kinds.add(doc["kind"])
        if doc["kind"] in peering_crds:  # kopf's own kind: its CRD's schema
            version = peering_crds[doc["kind"]]["spec"]["versions"][0]
            jsonschema.validate(doc, version["schema"]["openAPIV3Schema"])
            assert doc["apiVersion"] == "kopf.dev/" + version["name"]
        elif doc["kind"] == "ServiceMonitor":  # monitoring.coreos.com: no schema offline
            endpoint = doc["spec"]["endpoints"][0]
            assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
            assert doc["spec"]["selector"]["matchLabels"]
        elif doc["kind"] == "PodMonitor":
            endpoint = doc["spec"]["podMetricsEndpoints"][0]
            assert endpoint["path"] == "/metrics" and (
                "port" in endpoint or "targetPort" in endpoint
            )
            assert doc["spec"]["selector"]["matchLabels"]
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    expected = {
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "Deployment", "Service", "ClusterKopfPeering",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    }  # fmt: skip
    if values:
        expected |= {"PersistentVolumeClaim", "ServiceMonitor", "PodMonitor"}
    assert kinds == expected


def test_schema_validation_catches_a_broken_object() -> None:
    """The validator used above is strict: it would catch a mistake in a template."""
    broken = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": "eighty"}], "selctor": {}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_qpa_crds_are_the_repositorys_and_kept_on_uninstall(render: Render) -> None:
    docs = render()
    rendered = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    sources = sorted((ROOT / "crds").glob("qpa.ai_*.yaml"))
    assert len(sources) == 5
    for path in sources:
        source = yaml.safe_load(path.read_text())
        crd = rendered.pop(source["metadata"]["name"])
        assert {**crd, "metadata": None} == {**source, "metadata": None}, path.name
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert source["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # what is left: kopf's peering CRDs (crds/ folder, installed before the templates)
    assert set(rendered) == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    without = render({"crds.install": False})
    names = {d["metadata"]["name"] for d in without if d["kind"] == "CustomResourceDefinition"}
    assert names == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def test_operator_runs_a_real_kopf_command_on_the_charts_peering(render: Render) -> None:
    docs = render()
    container = operator_container(docs)
    command = container["command"]
    assert command[:2] == ["kopf", "run"] and "--all-namespaces" in command
    peering = find(docs, "ClusterKopfPeering")["metadata"]["name"]
    assert peering == "qpa-operator"
    assert f"--peering={peering}" in command
    assert env_of(container)["QPA_OPERATOR_PEERING"] == peering
    # the options parse as kopf's own CLI parses them, and the module exists
    from kopf.cli import run as kopf_run

    context = kopf_run.make_context("run", list(command[2:]))
    assert context.params["peering_name"] == peering
    assert context.params["modules"] == ("qpa_operator.main",)
    assert context.params["clusterwide"] is True and not context.params["standalone"]
    assert importlib.util.find_spec("qpa_operator.main") is not None
    # probes hit kopf's liveness endpoint on the port the command opens
    port = container["ports"][0]
    assert port["name"] == "health"
    assert f"--liveness=http://0.0.0.0:{port['containerPort']}/healthz" in command
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_every_variable_the_chart_sets_is_read_by_the_operator(render: Render) -> None:
    # the operator's own code, and qpa.store's settings (how it reads benchmark reports)
    sources = [*(ROOT / "operator").rglob("*.py"), ROOT / "qpa" / "store" / "config.py"]
    source = "\n".join(path.read_text() for path in sources)
    from kopf._core.engines import peering

    kopf_reads = inspect.getsource(peering)
    for values in ({}, FULL):
        for name in env_of(operator_container(render(values))):
            assert f'"{name}"' in source or f'"{name}"' in kopf_reads.replace("'", '"'), name


def test_operator_defaults_follow_the_values(render: Render) -> None:
    digest = "sha256:" + "ab" * 32
    values = {
        **FULL,
        "images.sandbox.repository": "registry.example/qpa/sandbox",
        "images.sandbox.tag": "1.2.3",
        "images.trainer.digest": digest,
        "images.harness.tag": "9",
        "images.deviceBridge.repository": "registry.example/bridge",
    }
    env = env_of(operator_container(render(values)))
    defaults = Defaults.from_env(env)
    assert defaults.image == "registry.example/qpa/sandbox:1.2.3"
    assert defaults.trainer_image == f"ghcr.io/qpa-ai/qpa-trainer:0.1.0@{digest}"
    assert defaults.harness_image == "ghcr.io/qpa-ai/qpa-harness:9"
    assert defaults.bridge_image == "registry.example/bridge:0.1.0"
    assert defaults.store is not None
    assert defaults.store.endpoint == f"http://{RELEASE}-store.{NAMESPACE}.svc.cluster.local:8333"
    assert defaults.store.secret_ref.name == "qpa-store"
    assert defaults.gpu_node_selector == (("nvidia.com/gpu.present", "true"),)
    assert defaults.gpu_tolerations == ({"key": "dedicated", "operator": "Equal", "value": "gpu"},)
    plain = Defaults.from_env(env_of(operator_container(render())))
    assert plain.store is None and plain.image == "ghcr.io/qpa-ai/qpa-sandbox:0.1.0"
    external = {"objectStore.endpoint": "https://s3.example:9000", "objectStore.secretName": "s3"}
    store = Defaults.from_env(env_of(operator_container(render(external)))).store
    assert store is not None and store.endpoint == "https://s3.example:9000"


STORE_VALUES = [
    (FULL, f"http://{RELEASE}-store.{NAMESPACE}.svc.cluster.local:8333", "qpa-store"),
    (
        {"objectStore.endpoint": "https://s3.example:9000", "objectStore.secretName": "s3"},
        "https://s3.example:9000",
        "s3",
    ),
]


@pytest.mark.parametrize(
    ("values", "endpoint", "secret"), STORE_VALUES, ids=["bundled", "external"]
)
def test_operator_reads_reports_with_the_namespaces_secret_not_its_own(
    render: Render, values: dict[str, Any], endpoint: str, secret: str
) -> None:
    """The release gate reads reports with the Secret of the release's own namespace
    (qpa_operator.storecreds, RBAC `get` on that name only): the operator mounts no store keys."""
    docs = render(values)
    container = operator_container(docs)
    pod = find(docs, "Deployment", f"{RELEASE}-operator")["spec"]["template"]["spec"]
    env = env_of(container)
    defaults = Defaults.from_env(env)
    assert defaults.store is not None and defaults.store.secret_ref.name == secret
    assert defaults.store.endpoint == endpoint
    assert defaults.readable_secrets == (secret,)
    assert defaults.prefix_for("team-a") == "s3://qpa/team-a/"
    assert not [name for name in env if name.startswith(("QPA_S3_", "AWS_"))]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    # nothing secret is inlined: no variable reads a Secret key
    assert not [v for v in container["env"] if "secretKeyRef" in (v.get("valueFrom") or {})]


def test_no_store_no_store_credentials(render: Render) -> None:
    docs = render()
    container = operator_container(docs)
    pod = find(docs, "Deployment", f"{RELEASE}-operator")["spec"]["template"]["spec"]
    assert not [name for name in env_of(container) if name.startswith("QPA_S3_")]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert [m["name"] for m in container["volumeMounts"]] == ["tmp"]


def test_bundled_store_serves_s3_with_the_secrets_keys(render: Render) -> None:
    docs = render(FULL)
    deployment = find(docs, "Deployment", f"{RELEASE}-store")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    refs = {v["valueFrom"]["secretKeyRef"]["key"] for v in init["env"]}
    names = {v["valueFrom"]["secretKeyRef"]["name"] for v in init["env"]}
    assert refs == {"accessKeyId", "secretAccessKey"} and names == {"qpa-store"}
    (weed,) = pod["containers"]
    assert (
        weed["command"][:2] == ["weed", "mini"] and "-s3.config=/config/s3.json" in weed["command"]
    )
    service = find(docs, "Service", f"{RELEASE}-store")
    assert service["spec"]["ports"][0]["port"] == 8333
    claim = find(docs, "PersistentVolumeClaim")
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in (
        pod["volumes"]
    )


def test_metrics_service_selects_the_operators_metrics_port(render: Render) -> None:
    docs = render(FULL)
    service = find(docs, "Service", f"{RELEASE}-operator-metrics")
    deployment = find(docs, "Deployment", f"{RELEASE}-operator")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    container = operator_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert env_of(container)["QPA_OPERATOR_METRICS_PORT"] == str(ports["metrics"])
    monitor = find(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert not [d for d in render({"metrics.enabled": False}) if d["kind"] == "Service"]


def test_pod_monitors_scrape_the_env_servers_and_harness_predictors_the_operator_creates(
    render: Render,
) -> None:
    """The monitors select the pods the operator's own builders make, on their serving port."""
    from qpa_operator.builders import harnessrelease, rolloutpool

    from qpa.api.v1alpha1 import parse_resource

    def example(name: str) -> Any:
        body = next(d for d in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if d)
        body["metadata"].update(namespace="team-a", uid="uid-1")
        return parse_resource(body)

    defaults = Defaults()
    pool = example("rolloutpool.yaml")
    env_pods = rolloutpool.deployment(pool, defaults)["spec"]["template"]
    release = example("harnessrelease.yaml")
    predictor = harnessrelease.harness_service(release, defaults)  # KServe copies its labels
    container = predictor["spec"]["predictor"]["containers"][0]
    docs = render(FULL)
    env = find(docs, "PodMonitor", f"{RELEASE}-operator-env-servers")
    assert env["spec"]["selector"]["matchLabels"].items() <= env_pods["metadata"]["labels"].items()
    ports = {p["name"] for p in env_pods["spec"]["containers"][0]["ports"]}
    assert env["spec"]["podMetricsEndpoints"][0]["port"] in ports
    harness = find(docs, "PodMonitor", f"{RELEASE}-operator-harness")
    labels = predictor["metadata"]["labels"]
    assert harness["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert (
        harness["spec"]["podMetricsEndpoints"][0]["targetPort"]
        == (container["ports"][0]["containerPort"])
    )
    assert env["spec"]["namespaceSelector"] == {"any": True}
    scoped = render({**FULL, "operator.watchNamespaces": ["team-a", "team-b"]})
    selector = find(scoped, "PodMonitor", f"{RELEASE}-operator-harness")["spec"]
    assert selector["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    quiet = render({**FULL, "metrics.serviceMonitor.workloads": False})
    assert not [d for d in quiet if d["kind"] == "PodMonitor"]


def test_replicas_peer_and_platform_pods_avoid_device_and_gpu_nodes(render: Render) -> None:
    docs = render(FULL)
    deployment = find(docs, "Deployment", f"{RELEASE}-operator")
    assert deployment["spec"]["replicas"] == 2
    container = operator_container(docs)
    assert env_of(container)["QPA_OPERATOR_PRIORITY"] == "auto"
    assert env_of(container)["POD_NAME"] == "metadata.name"
    affinity = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    (term,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    expressions = {e["key"]: e for e in term["preference"]["matchExpressions"]}
    assert expressions["qpa.ai/device-node"] == {
        "key": "qpa.ai/device-node",
        "operator": "NotIn",
        "values": ["true"],
    }
    assert expressions["nvidia.com/gpu.present"]["operator"] == "NotIn"


def test_device_node_label_is_the_devicepools_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    field = DevicePoolSpec.model_fields["node_selector"]
    assert values["devices"]["nodeSelector"] == field.get_default(call_default_factory=True)


BAD_VALUES = [
    ({"operator.replicas": 0}, "replicas"),
    ({"images.operator.pullPolicy": "Sometimes"}, "pullPolicy"),
    ({"images.sandbox.digest": "sha256:xyz"}, "digest"),
    ({"operator.logLevel": "loud"}, "logLevel"),
    ({"metrics.port": 70000}, "port"),
    ({"objectStore.bundled.enabled": True}, "secretName"),
    ({"objectStore.endpoint": "minio:9000", "objectStore.secretName": "s"}, "endpoint"),
    ({"operator.replica": 2}, "replica"),
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_schema_rejects_wrong_values(helm_run: HelmRun, values: dict[str, Any], field: str) -> None:
    result = helm_run("template", RELEASE, str(CHART), *set_args(values))
    assert result.returncode != 0, f"{values} was accepted"
    assert "schema" in result.stderr and field in result.stderr, result.stderr


def test_the_values_file_passes_its_own_schema() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def test_symlinked_crds_resolve_inside_the_repository() -> None:
    link = CHART / "files" / "crds"
    assert link.is_symlink() and link.resolve() == (ROOT / "crds").resolve()
    assert Path(link, "qpa.ai_taskbatches.yaml").is_file()
