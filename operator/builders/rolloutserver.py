"""TrainingRun `spec.rl.generation` -> the run's rollout server: Deployment, Service, policies.

The way TRL's vLLM server mode runs, on its own pods: one pod `qpa rollout serve --spec
/etc/qpa/order/workorder.yaml` (the run's own work order ConfigMap `<run>-order`; the server
reads `spec.rl.generation` and the base model from it, and binds the port of the URL the
operator resolved). `backend: vllm` execs TRL's `trl vllm-serve` command line (vLLM's server
with the NCCL weight-transfer engine) and requests `gpus` GPUs; `backend: hf` serves the same
API with transformers (CPU unless `gpus` asks for some).

- Deployment `<run>-rollout` (1 replica, `Recreate`: a second server would miss the weight
  updates; 0 once the run has Succeeded or Failed, so a finished run holds no GPU): a readiness
  probe on `/health` (the trainer waits for it), a startup probe that
  allows a large model's load (`STARTUP_SECONDS`), a memory-backed `/dev/shm` (vLLM's
  tensor-parallel workers share memory), writable `/work` and `/tmp` only;
- Service `<run>-rollout` on `PORT` (`http`): the URL the ranks get in their work order
  (`resolved.rolloutServerUrl`) with the weight-sync rendezvous port
  (`resolved.rolloutGroupPort`), which rank 0 hosts;
- NetworkPolicies: into the server only from the run's ranks, and out of it only to DNS, the
  store and the base model's host, and to the run's ranks. The weight-sync group (NCCL, or
  gloo on CPU) opens ephemeral ports both ways, so ranks and server reach each other on every
  port, as the ranks do among themselves; the ranks' own policies admit the server
  (`rank_rules`).

Everything is owned by the TrainingRun and labelled `app.kubernetes.io/component:
rollout-server`. Pure functions, like every builder.
"""

from __future__ import annotations

from typing import Final

from qpa_operator.builders import netpol, podtemplate
from qpa_operator.builders.common import (
    Defaults,
    JsonDict,
    PodParts,
    child_name,
    combine,
    empty_dir,
    env_var,
    gpu_placement,
    labels,
    metadata,
    owner_namespace,
    resources,
    restricted_container_security,
    restricted_pod_security,
    selector_labels,
    service_host,
    store_parts,
    with_spec_hash,
    work_order_parts,
)

from qpa.api import TrainingRun
from qpa.api.v1alpha1.trainingrun import RolloutGeneration
from qpa.api.v1alpha1.workorder import WORK_ORDER_PATH

COMPONENT: Final = "rollout-server"
CONTAINER: Final = "rollout-server"
#: The server's HTTP port (container and Service).
PORT: Final = 8000
#: The weight-sync rendezvous port the trainer's rank 0 hosts (TRL's default group port).
GROUP_PORT: Final = 51216
GPU_RESOURCE: Final = "nvidia.com/gpu"
WORK_DIR: Final = "/work"
#: How long the server may take to load its model before the startup probe gives up.
STARTUP_SECONDS: Final = 1800
PROBE_PERIOD_SECONDS: Final = 10
SERVE_ARGS: Final = ("qpa", "rollout", "serve", "--spec", WORK_ORDER_PATH)
VLLM_CPU_PER_GPU: Final = 4
VLLM_MEMORY_GI_PER_GPU: Final = 32
HF_CPU: Final = 2
HF_MEMORY: Final = "8Gi"


def generation(tr: TrainingRun) -> RolloutGeneration | None:
    """The run's rollout server settings, or None when its ranks sample themselves."""
    return tr.spec.rl.generation if tr.spec.rl is not None else None


def name(tr: TrainingRun) -> str:
    """The Deployment and the Service (one name, as for a RolloutPool's servers)."""
    return child_name(tr, "rollout")


def url(tr: TrainingRun, defaults: Defaults) -> str:
    return f"http://{service_host(name(tr), owner_namespace(tr), defaults)}:{PORT}"


def finished(tr: TrainingRun) -> bool:
    """The run is over (no attempt will sample again): its server keeps no pod."""
    return tr.status is not None and tr.status.phase in ("Succeeded", "Failed")


def image(tr: TrainingRun, defaults: Defaults) -> str:
    """`generation.image`, else the run's image, else the trainer image (it carries vLLM)."""
    gen = generation(tr)
    return (gen.image if gen else None) or tr.spec.image or defaults.trainer_image


def deployment(tr: TrainingRun, defaults: Defaults) -> JsonDict:
    gen = generation(tr)
    if gen is None:
        raise ValueError("spec.rl.generation: not set, the run has no rollout server")
    parts = combine(
        [
            PodParts(
                env=(
                    env_var("QPA_TRAININGRUN", tr.metadata.name or ""),
                    env_var("HOME", f"{WORK_DIR}/home"),
                    env_var("HF_HOME", f"{WORK_DIR}/hf"),
                    env_var("TRITON_CACHE_DIR", f"{WORK_DIR}/triton"),
                ),
                volumes=(empty_dir("work"), empty_dir("tmp"), empty_dir("dshm", memory=True)),
                mounts=(
                    {"name": "work", "mountPath": WORK_DIR},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ),
            ),
            work_order_parts(tr),
            store_parts(tr.spec.store or defaults.store),
        ]
    )
    probe: JsonDict = {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": PROBE_PERIOD_SECONDS,
        "timeoutSeconds": 5,
    }
    container: JsonDict = {
        "name": CONTAINER,
        "image": image(tr, defaults),
        "command": list(SERVE_ARGS),
        "workingDir": WORK_DIR,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "startupProbe": {**probe, "failureThreshold": STARTUP_SECONDS // PROBE_PERIOD_SECONDS},
        "readinessProbe": {**probe, "failureThreshold": 3},
        "livenessProbe": {**probe, "failureThreshold": 6},
        "securityContext": restricted_container_security(),
    }
    container["resources"] = server_resources(gen)
    pod_spec: JsonDict = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_security(defaults),
        "containers": [container],
        "volumes": list(parts.volumes),
    }
    if gen.gpus > 0:
        pod_spec.update(gpu_placement(defaults, GPU_RESOURCE))
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(tr, name(tr), COMPONENT, defaults),
        "spec": {
            "replicas": 0 if finished(tr) else 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector_labels(tr, COMPONENT)},
            "template": {
                "metadata": {"labels": labels(tr, COMPONENT, defaults)},
                "spec": pod_spec,
            },
        },
    }
    return with_spec_hash(podtemplate.merge_into(manifest, tr.spec.pod_template, defaults))


def server_resources(gen: RolloutGeneration) -> JsonDict:
    """CPU and memory beside the GPUs (never BestEffort): per GPU what vLLM's engine and
    tokenizer workers take with the weights in host memory while loading (as the model
    InferenceService of a HarnessRelease); a CPU `hf` server holds the model once."""
    if gen.gpus > 0:
        cpu, memory = VLLM_CPU_PER_GPU * gen.gpus, f"{VLLM_MEMORY_GI_PER_GPU * gen.gpus}Gi"
    else:
        cpu, memory = HF_CPU, HF_MEMORY
    result = resources(None, gpus=gen.gpus, gpu_resource=GPU_RESOURCE)
    requests = {**result.get("requests", {}), "cpu": str(cpu), "memory": memory}
    limits = {**result.get("limits", {}), "memory": memory}
    return {"requests": dict(sorted(requests.items())), "limits": dict(sorted(limits.items()))}


def service(tr: TrainingRun, defaults: Defaults) -> JsonDict:
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(tr, name(tr), COMPONENT, defaults),
        "spec": {
            "selector": selector_labels(tr, COMPONENT),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return with_spec_hash(manifest)


def egress_policy(tr: TrainingRun, defaults: Defaults, ranks: dict[str, str]) -> JsonDict:
    """Out of the server: DNS, the store and the base model's host, the run's ranks."""
    store = tr.spec.store or defaults.store
    return netpol.egress_policy(
        tr,
        COMPONENT,
        defaults,
        endpoints=[store.endpoint if store else None, netpol.model_source(tr.spec.base_model_uri)],
        rules=[{"to": [netpol.pods_peer(ranks)]}],
        part="rollout",
    )


def ingress_policy(tr: TrainingRun, defaults: Defaults, ranks: dict[str, str]) -> JsonDict:
    """Into the server only from the run's ranks (HTTP and the weight-sync group)."""
    return netpol.ingress_policy(
        tr,
        name(tr),
        COMPONENT,
        defaults,
        pod_selector=selector_labels(tr, COMPONENT),
        sources=[([netpol.pods_peer(ranks)], None)],
    )


def rank_rules(tr: TrainingRun) -> tuple[list[JsonDict], list[JsonDict]]:
    """(egress rules, ingress peers) the ranks' own policies add for the rollout server:
    every port both ways (the weight-sync group's ephemeral ports); nothing without one."""
    if generation(tr) is None:
        return [], []
    server = netpol.pods_peer(selector_labels(tr, COMPONENT))
    return [{"to": [server]}], [server]


def children(tr: TrainingRun, defaults: Defaults, ranks: dict[str, str]) -> list[JsonDict]:
    """The rollout server's objects (`ranks`: the selector labels of the run's rank pods);
    none when `spec.rl.generation` is unset."""
    if generation(tr) is None:
        return []
    return [
        deployment(tr, defaults),
        service(tr, defaults),
        egress_policy(tr, defaults, ranks),
        ingress_policy(tr, defaults, ranks),
    ]
