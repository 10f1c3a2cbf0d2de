"""RolloutPool -> a Deployment of `qpa env serve`, its Service, and an autoscaler.

Each pod runs `qpa env serve --spec /etc/qpa/order/workorder.yaml`: its input is the pool itself
(the work order ConfigMap `<pool>-order`: the RolloutPool plus the DevicePool bridge address the
operator resolved), turned into the server's settings by `EnvServeConfig.from_rolloutpool`; a
changed work order rolls the pods (its hash is a pod-template annotation). The pods sit
behind the Service `<pool>-env` on port 80 (so clients need not know the container port:
TaskBatch and TrainingRun pass `--env-url http://<pool>-env.<ns>.svc.<domain>`).
`replicas.min` pods are kept warm; when `replicas.max` is larger, a HorizontalPodAutoscaler
between the two owns the Deployment's `replicas`. It scales on sessions in use (the Pods metric
`qpa_env_sessions_in_use` each server exports on `/metrics`, averaged over the pods, against
`targetPercent` of `sessionsPerPod`; needs a metrics adapter such as prometheus-adapter) or, when
`replicas.metric` (else the chart's `rolloutPools.autoscaleMetric`) says `cpu`, on CPU.

Sessions stay on their pod. A session's episode lives in one server's memory, so each pod knows
itself (`QPA_POD_NAME`, `QPA_POD_IP` from the downward API) and answers a reset with its own URL
(`http://<pod IP>:<port>`), which the client uses for the rest of the session; the headless
Service `<pool>-env-pods` publishes the ready pods (per-pod DNS names, discovery). The Service
`<pool>-env` only places new sessions. A pod going away drains first: its preStop hook
`qpa env drain` (the drain key lies in the pod's private /tmp) stops new episodes (`/ready`
then fails) and waits up to `drainTimeoutSeconds` for the live ones, within a
terminationGracePeriodSeconds `DRAIN_MARGIN_S` longer.

For `environment: device` the pods are wired to their DevicePool: they get the bridge Service
(`<devicepool>-bridge:5037`), the pool's name, the label `qpa.ai/devicepool-client=<devicepool>`
(the only pods the bridges' adb proxy and ingress policy admit; adb connections leave from the
pod's own IP, `QPA_ADB_SOURCE_ADDRESS`) and a ServiceAccount bound to the DevicePool's Role
`<devicepool>-phones` (list the Leases, get and update the pool's phone Leases by name), since a
device session leases a phone.

For `environment: mcp` the pods get the pool's `mcp` settings as the variables the `mcp` kind
reads (`qpa.envs.mcp.env`): the server as `QPA_MCP_URL` (its host opened in the egress policy
like an llm_sim model's) or `QPA_MCP_COMMAND` (a stdio server in the image, shell-quoted), and
the server-side tool lists `QPA_MCP_CONTROL_TOOLS` (what a task may name as its reset, verifier
or finish tool; empty: none) and `QPA_MCP_HIDDEN_TOOLS`, comma separated. A pod template cannot
set them (`QPA_*` is the operator's), so they come from the spec alone.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from qpa_operator.builders import devicepool as device_builder
from qpa_operator.builders import netpol, podtemplate
from qpa_operator.builders.common import (
    Defaults,
    JsonDict,
    PodParts,
    api_key_parts,
    child_name,
    combine,
    empty_dir,
    env_var,
    field_env,
    labels,
    metadata,
    owner_namespace,
    resources,
    restricted_container_security,
    restricted_pod_security,
    role_binding,
    rollout_pool_service,
    rollout_pool_url,
    selector_labels,
    service_account,
    service_host,
    with_spec_hash,
    work_order_config_map,
    work_order_hash,
    work_order_parts,
)

from qpa.api import RolloutPool
from qpa.api.v1alpha1 import WORK_ORDER_PATH, Resolved, RolloutPoolStatus, set_condition
from qpa.api.v1alpha1.base import parse_quantity

COMPONENT: Final = "env-server"
CONTAINER: Final = "env-server"
SERVICE_PORT: Final = 80
BRIDGE_PORT: Final = 5037
#: The name of the bridge container's adb port (`builders.devicepool`).
BRIDGE_PORT_NAME: Final = "adb"
#: The Pods metric the sessions autoscaler reads (`qpa.envs.server.SessionMetrics`).
SESSIONS_METRIC: Final = "qpa_env_sessions_in_use"
#: Seconds of grace beyond the drain bound: the hook's start and the server's shutdown.
DRAIN_MARGIN_S: Final = 15
DRAIN_KEY_FILE: Final = "/tmp/qpa-env-drain.key"


def deployment_name(pool: RolloutPool) -> str:
    return child_name(pool, "env")


def pods_service_name(pool: RolloutPool) -> str:
    """The headless Service listing the pool's ready pods (one address each)."""
    return child_name(pool, "env-pods")


def service_name(pool: RolloutPool) -> str:
    return rollout_pool_service(pool.metadata.name or "")


def account_name(pool: RolloutPool) -> str:
    return child_name(pool, "env")


def phones_binding_name(pool: RolloutPool) -> str:
    """The RoleBinding of a device pool's env servers to their DevicePool's phones Role."""
    return child_name(pool, "env-phones")


def autoscaled(pool: RolloutPool) -> bool:
    return pool.spec.replicas.max > pool.spec.replicas.min


def autoscale_metric(pool: RolloutPool, defaults: Defaults) -> str:
    """`sessions` or `cpu`: the spec's choice, else the chart's."""
    return pool.spec.replicas.metric or defaults.rollout_pool_metric


def sessions_target(pool: RolloutPool) -> str:
    """The average sessions in use per pod the autoscaler aims at, as a quantity (milli)."""
    return f"{pool.spec.sessions_per_pod * pool.spec.replicas.target_percent * 10}m"


def bridge_service(device_pool: str) -> str:
    """The Service in front of a DevicePool's bridges (see `builders.devicepool`)."""
    return f"{device_pool}-bridge"


def resolved(pool: RolloutPool, defaults: Defaults) -> Resolved:
    """What the pool's pods get besides the spec: their namespace and the DevicePool's bridge."""
    namespace = owner_namespace(pool)
    bridge = None
    if pool.spec.device_pool_ref is not None:
        host = service_host(bridge_service(pool.spec.device_pool_ref.name), namespace, defaults)
        bridge = f"{host}:{BRIDGE_PORT}"
    return Resolved(namespace=namespace, device_bridge=bridge)


def work_order(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    return work_order_config_map(pool, resolved(pool, defaults), COMPONENT, defaults)


SERVE_ARGS: Final = ("qpa", "env", "serve", "--spec", WORK_ORDER_PATH)


def pod_labels(pool: RolloutPool, defaults: Defaults) -> dict[str, str]:
    """The pods' labels; a device pool's carry the DevicePool's client label too."""
    result = labels(pool, COMPONENT, defaults)
    if pool.spec.device_pool_ref is not None:
        result[device_builder.CLIENT_LABEL] = pool.spec.device_pool_ref.name
    return result


def device_rbac(pool: RolloutPool, defaults: Defaults) -> list[JsonDict]:
    """ServiceAccount + RoleBinding to the DevicePool's `<devicepool>-phones` Role."""
    if pool.spec.device_pool_ref is None:
        return []
    name = account_name(pool)
    phones = device_builder.phones_role_name(pool.spec.device_pool_ref.name)
    # named apart from the `<pool>-env` binding of earlier versions (to their own Role): a
    # RoleBinding's roleRef is immutable, so that one could not be patched into this one
    objects = [
        service_account(pool, name, COMPONENT, defaults),
        role_binding(pool, phones_binding_name(pool), COMPONENT, defaults, phones, account=name),
    ]
    return [with_spec_hash(o) for o in objects]


#: The variables an `mcp` pod's environment kind reads (`qpa.envs.mcp.env`).
MCP_URL_ENV: Final = "QPA_MCP_URL"
MCP_COMMAND_ENV: Final = "QPA_MCP_COMMAND"
MCP_CONTROL_TOOLS_ENV: Final = "QPA_MCP_CONTROL_TOOLS"
MCP_HIDDEN_TOOLS_ENV: Final = "QPA_MCP_HIDDEN_TOOLS"


def mcp_parts(pool: RolloutPool) -> PodParts:
    """An `mcp` pool's server and tool lists as the pods' variables (nothing for other kinds)."""
    settings = pool.spec.mcp
    if settings is None:
        return PodParts()
    if settings.url is not None:
        server = env_var(MCP_URL_ENV, settings.url)
    else:
        assert settings.command is not None  # the spec's rule: url or command
        server = env_var(MCP_COMMAND_ENV, shlex.join(settings.command))
    return PodParts(
        env=(
            server,
            # always set, empty included: the pod's own environment never widens the lists
            env_var(MCP_CONTROL_TOOLS_ENV, ",".join(settings.control_tools)),
            env_var(MCP_HIDDEN_TOOLS_ENV, ",".join(settings.hidden_tools)),
        )
    )


def deployment(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    spec = pool.spec
    extra = PodParts(
        env=(
            env_var("HOME", "/tmp"),
            env_var("QPA_ROLLOUT_POOL", pool.metadata.name or ""),
            # the session handle's pod and URL (qpa.envs.server.PodIdentity), the drain key
            field_env("QPA_POD_NAME", "metadata.name"),
            field_env("QPA_POD_IP", "status.podIP"),
            env_var("QPA_ENV_DRAIN_FILE", DRAIN_KEY_FILE),
        ),
        volumes=(empty_dir("tmp"),),
        mounts=({"name": "tmp", "mountPath": "/tmp"},),
    )
    device = PodParts()
    if spec.device_pool_ref is not None:
        device = PodParts(
            env=(
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                field_env("POD_IP", "status.podIP"),
                env_var("QPA_ADB_SOURCE_ADDRESS", "$(POD_IP)"),
            )
        )
    llm = api_key_parts(spec.llm_sim.api_key_secret_ref if spec.llm_sim else None)
    parts = combine([extra, device, llm, mcp_parts(pool), work_order_parts(pool)])
    probe: JsonDict = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    drain = [
        "qpa",
        "env",
        "drain",
        "--url",
        f"http://127.0.0.1:{spec.port}",
        "--timeout-seconds",
        str(spec.drain_timeout_seconds),
    ]
    container: JsonDict = {
        "name": CONTAINER,
        "image": spec.image or defaults.image,
        "args": list(SERVE_ARGS),
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        # /ready fails while the pod drains (no new sessions); /health stays up (liveness)
        "readinessProbe": {
            **probe,
            "httpGet": {"path": "/ready", "port": "http"},
            "initialDelaySeconds": 2,
        },
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": drain}}},
        "securityContext": restricted_container_security(),
    }
    container_resources = resources(spec.resources)
    if container_resources:
        container["resources"] = container_resources
    pod_spec: JsonDict = {
        "automountServiceAccountToken": spec.device_pool_ref is not None,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_security(defaults),
        "terminationGracePeriodSeconds": spec.drain_timeout_seconds + DRAIN_MARGIN_S,
        "containers": [container],
        "volumes": list(parts.volumes),
    }
    if spec.device_pool_ref is not None:
        pod_spec["serviceAccountName"] = account_name(pool)
    pod_spec = podtemplate.merge(pod_spec, spec.pod_template, defaults)
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(pool, deployment_name(pool), COMPONENT, defaults),
        "spec": {
            "replicas": spec.replicas.min,
            "selector": {"matchLabels": selector_labels(pool, COMPONENT)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": pod_labels(pool, defaults),
                    "annotations": {
                        **work_order_hash(work_order(pool, defaults)),
                        # what Prometheus' kubernetes-pods job scrapes (qpa_env_sessions_*)
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(spec.port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }
    return with_spec_hash(manifest)


def service(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(pool, service_name(pool), COMPONENT, defaults),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(pool, COMPONENT),
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
    return with_spec_hash(manifest)


def pods_service(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    """`<pool>-env-pods`: headless, one DNS record per ready pod on the container port."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(pool, pods_service_name(pool), COMPONENT, defaults),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(pool, COMPONENT),
            "ports": [
                {"name": "http", "port": pool.spec.port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
    return with_spec_hash(manifest)


def autoscaler_metrics(pool: RolloutPool, defaults: Defaults) -> list[JsonDict]:
    target = pool.spec.replicas.target_percent
    if autoscale_metric(pool, defaults) == "cpu":
        utilization = {"type": "Utilization", "averageUtilization": target}
        return [{"type": "Resource", "resource": {"name": "cpu", "target": utilization}}]
    return [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": SESSIONS_METRIC},
                "target": {"type": "AverageValue", "averageValue": sessions_target(pool)},
            },
        }
    ]


def autoscaler(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    manifest = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(pool, deployment_name(pool), COMPONENT, defaults),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": deployment_name(pool),
            },
            "minReplicas": max(1, pool.spec.replicas.min),
            "maxReplicas": pool.spec.replicas.max,
            "metrics": autoscaler_metrics(pool, defaults),
        },
    }
    return with_spec_hash(manifest)


def egress_policy(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    """Env servers reach DNS only; LLM-simulated apps also their model, MCP-fronting ones their
    MCP server's URL, device-backed ones their own DevicePool's bridges (adb port) and the API
    server (phone Leases)."""
    spec = pool.spec
    rules: list[JsonDict] = []
    blocked: list[str] = []
    if spec.device_pool_ref is not None:
        bridges = netpol.component_pods("DevicePool", spec.device_pool_ref.name, "device-bridge")
        api, blocked = netpol.api_server_rules(defaults)
        rules += [netpol.pods_rule(bridges, [BRIDGE_PORT_NAME]), *api]
    return netpol.egress_policy(
        pool,
        COMPONENT,
        defaults,
        endpoints=[
            spec.llm_sim.model_url if spec.llm_sim else None,
            spec.mcp.url if spec.mcp else None,
        ],
        rules=rules,
        blocked=blocked,
    )


def ingress_policy(pool: RolloutPool, defaults: Defaults) -> JsonDict:
    """Into the env servers only from the pods that use this pool (collectors, RL ranks,
    benchmarks: labelled `qpa.ai/env-client=<pool>`), and from the admin's metrics scrapers
    (`networkPolicy.ingress.metricsScrapers`: the autoscaler's sessions metric), on the
    server's port."""
    clients = netpol.pods_peer({netpol.ENV_CLIENT_LABEL: pool.metadata.name or ""})
    scrapers = netpol.gateway_peers(defaults.network.ingress.metrics_scrapers)
    return netpol.ingress_policy(
        pool,
        deployment_name(pool),
        COMPONENT,
        defaults,
        pod_selector=selector_labels(pool, COMPONENT),
        sources=[([clients], ["http"]), (scrapers, ["http"])],
    )


def children(pool: RolloutPool, defaults: Defaults) -> list[JsonDict]:
    result: list[JsonDict] = [egress_policy(pool, defaults), ingress_policy(pool, defaults)]
    result += device_rbac(pool, defaults)
    result += [work_order(pool, defaults), deployment(pool, defaults), service(pool, defaults)]
    result.append(pods_service(pool, defaults))
    if autoscaled(pool):
        result.append(autoscaler(pool, defaults))
    return result


def unmanaged_fields(pool: RolloutPool) -> tuple[str, ...]:
    """Paths of the Deployment another controller owns (the autoscaler owns `replicas`)."""
    return ("spec.replicas",) if autoscaled(pool) else ()


def service_url(pool: RolloutPool, defaults: Defaults) -> str:
    return rollout_pool_url(pool.metadata.name or "", owner_namespace(pool), defaults)


# --------------------------------------------------------------------------- status


def _condition_true(obj: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def sessions_in_use(autoscaler: Mapping[str, Any] | None) -> int | None:
    """Sessions in use over the pool's pods, as its autoscaler last read them: the average of
    `qpa_env_sessions_in_use` times the pods it averaged over; None when it has no reading
    (no autoscaler, a CPU one, no metrics adapter yet)."""
    status = (autoscaler or {}).get("status") or {}
    pods = status.get("currentReplicas")
    for metric in status.get("currentMetrics") or []:
        reading = metric.get("pods") or {}
        if metric.get("type") != "Pods" or (reading.get("metric") or {}).get("name") != (
            SESSIONS_METRIC
        ):
            continue
        average = (reading.get("current") or {}).get("averageValue")
        if average is None or not isinstance(pods, int):
            return None
        try:
            return max(0, round(parse_quantity(str(average)) * pods))
        except ValueError:
            return None  # not a quantity: no reading rather than a wrong one
    return None


def rolloutpool_status(
    pool: RolloutPool,
    deployment: Mapping[str, Any] | None,
    *,
    leased: int,
    phones_available: int | None,
    device_pool_found: bool | None,
    observed_generation: int | None,
    defaults: Defaults,
    now: datetime,
    autoscaler: Mapping[str, Any] | None = None,
) -> RolloutPoolStatus:
    """Ready and leased capacity of a pool, from its Deployment and the Leases it holds.

    `phones_available` bounds a device pool's capacity (one session per phone);
    `device_pool_found` is None for pools that are not device-backed. Sessions in use are the
    autoscaler's reading of the pods' metric (`sessions_in_use`) or the phone Leases held
    (`leased`), whichever is more; `free` is the capacity left.
    """
    current = pool.status or RolloutPoolStatus()
    status = (deployment or {}).get("status") or {}
    replicas = int(status.get("replicas") or 0)
    ready = int(status.get("readyReplicas") or 0)
    capacity = ready * pool.spec.sessions_per_pod
    if phones_available is not None:
        capacity = min(capacity, phones_available + leased)
    in_use = max(leased, sessions_in_use(autoscaler) or 0)
    wanted = pool.spec.replicas.min
    progressing = _condition_true(deployment, "Progressing")
    if deployment is None:
        phase, reason, message = "Pending", "DeploymentMissing", "the Deployment is not there yet"
    elif progressing is not None and progressing.get("reason") == "ProgressDeadlineExceeded":
        phase, reason = "Failed", "ProgressDeadlineExceeded"
        message = str(progressing.get("message") or "the rollout exceeded its deadline")
    elif ready >= max(1, wanted) or (wanted == 0 and ready == 0):
        phase, reason, message = "Ready", "PodsReady", f"{ready} of {wanted}+ pods ready"
    elif ready > 0:
        phase, reason, message = "Degraded", "PodsNotReady", f"{ready} of {wanted} pods ready"
    else:
        phase, reason, message = "Pending", "PodsStarting", f"0 of {wanted} pods ready"

    generation = observed_generation
    conditions = set_condition(
        current.conditions,
        "Ready",
        "True" if phase == "Ready" else "False",
        reason,
        message,
        observed_generation=generation,
        now=now,
    )
    if device_pool_found is not None:
        device_pool = pool.spec.device_pool_ref.name if pool.spec.device_pool_ref else ""
        conditions = set_condition(
            conditions,
            "DevicePoolFound",
            "True" if device_pool_found else "False",
            "Found" if device_pool_found else "NotFound",
            f"DevicePool {device_pool}" + ("" if device_pool_found else " does not exist"),
            observed_generation=generation,
            now=now,
        )
        if not device_pool_found and phase == "Ready":
            phase = "Degraded"
    return RolloutPoolStatus(
        phase=phase,
        observed_generation=observed_generation,
        conditions=conditions,
        replicas=replicas,
        ready_replicas=ready,
        capacity=capacity,
        leased=in_use,
        free=max(0, capacity - in_use),
        service_url=service_url(pool, defaults),
        label_selector=",".join(
            f"{key}={value}" for key, value in sorted(selector_labels(pool, COMPONENT).items())
        ),
    )
