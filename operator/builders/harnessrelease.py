"""HarnessRelease -> KServe InferenceServices for the model and the Harness, a benchmark Job.

- `<release>-model-<model id>`: one InferenceService per model version, on KServe's Hugging
  Face runtime with the vLLM backend (`storageUri` = the model URI, `nvidia.com/gpu` per
  replica, `--tensor-parallel-size` = the GPUs, `--dtype` (bfloat16 unless the spec says
  otherwise), `--max-model-len`, CPU and memory requests (the spec's, else `MODEL_CPU_PER_GPU`
  and `MODEL_MEMORY_PER_GPU_GI` per GPU) with the memory limit at the request, and a memory-backed
  `/dev/shm` for NCCL when it spans GPUs); it serves the OpenAI API at
  `http://<release>-model-<model id>-predictor.<ns>.svc.<domain>/openai/v1`. The candidate's,
  the stable version's and the previous stable version's models run side by side (the same
  InferenceService when they share a model). An `s3://` model is downloaded by KServe's storage
  initializer with the service account `<release>-model-storage`, whose immutable Secret
  `<release>-model-storage-<source hash>` holds the store's keys in KServe's format
  (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, annotations `serving.kserve.io/s3-endpoint`,
  `-usehttps`, `-region`): the handler derives it from the store Secret of the release's
  namespace (`qpa_operator.storecreds`' rules), this module only shapes it;
- `<release>-model`: a Service, the release's **stable model endpoint**
  (`http://<release>-model.<ns>.svc.<domain>:8080/openai/v1`), selecting the stable version's
  model predictor pods, for TaskBatches and other clients that must not follow the candidate;
- `<release>-harness`: the Harness as a KServe custom predictor, a container running
  `qpa harness serve --planner openai --model-url <its model> --http-port 8080 ...` with the
  Harness version's YAML from its ConfigMap, and the callers' authentication of `harness.auth`:
  `--tokens-file /var/run/secrets/qpa/harness-tokens/tokens.yaml` with the Secret key mounted
  there read-only by the kubelet (the operator never reads it), or `--identity-header <name>`
  (validated by the CRD and `qpa.api`); without it callers are anonymous with a throwaway
  memory. It is the release's endpoint: its
  `canaryTrafficPercent` splits requests between the candidate's revision and the last
  rolled-out one (KServe keeps the previous revision; KServe's Serverless mode, pinned by the
  `serving.kserve.io/deploymentMode` annotation); a rollback writes the stable version's spec
  back, so no candidate is left in it;
- `<release>-bench-<candidate>`: a Job running `qpa bench run --spec` on its work order (a
  ConfigMap of the same name: the release plus the candidate's endpoint, store and report
  prefix the operator resolved), i.e. the suite split against the candidate's model with the
  candidate's Harness settings; its report goes to `<reportUri>/<release>/<candidate>/report.json`.

A spec that leaves `harness.image` unset gets the operator's Harness image (the chart's
`images.harness`) and one that leaves `store` unset the operator's object store (the chart's
`objectStore`); `MissingSetting` names the field when neither gives one. The model id hashes
the model's serving settings; the version id hashes model and Harness (with the image it
resolves to, so a new default image is a new version, benchmarked before it serves); the
candidate id adds the benchmark settings, so a new candidate (or a changed benchmark) gets a new
benchmark Job. Which of these exist and at what traffic is decided by the release state machine
(`qpa_operator.release`); everything here is a pure function of its arguments.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from qpa_operator.builders import netpol, podtemplate
from qpa_operator.builders.common import (
    LABEL_COMPONENT,
    TERMINATION_LOG,
    Defaults,
    JsonDict,
    MissingSetting,
    PodParts,
    bounded_name,
    combine,
    content_hash,
    empty_dir,
    env_var,
    gpu_placement,
    harness_config_parts,
    kind_label,
    labels,
    metadata,
    owner_namespace,
    resources,
    restricted_container_security,
    restricted_pod_security,
    rollout_pool_url,
    selector_labels,
    service_host,
    setting,
    store_parts,
    with_spec_hash,
    work_order_config_map,
    work_order_parts,
)

from qpa.api import HarnessRelease
from qpa.api.v1alpha1 import (
    WORK_ORDER_PATH,
    HarnessServing,
    ModelServing,
    ObjectStore,
    ReleaseVersion,
    Resolved,
    ResourceRequirements,
)

ISVC_API: Final = "serving.kserve.io/v1beta1"
MODEL_COMPONENT: Final = "model"
HARNESS_COMPONENT: Final = "harness"
BENCH_COMPONENT: Final = "benchmark"
CANDIDATE_LABEL: Final = "qpa.ai/candidate"
VERSION_LABEL: Final = "qpa.ai/version"
MODEL_LABEL: Final = "qpa.ai/model"
HARNESS_PORT: Final = 8080
HF_RUNTIME: Final = "kserve-huggingfaceserver"
#: KServe serves tagged routes (`latest-<isvc>`, `prev-<isvc>`) with this annotation, so the
#: candidate revision can be reached directly while it has no traffic.
TAG_ROUTING: Final = "serving.kserve.io/enable-tag-routing"
REPORT_FILE: Final = "report.json"
#: Where the Harness predictor finds its bearer tokens (the `harness.auth.tokensSecretRef` key).
TOKENS_MOUNT: Final = "/var/run/secrets/qpa/harness-tokens"
TOKENS_FILE: Final = "tokens.yaml"
TOKENS_PATH: Final = f"{TOKENS_MOUNT}/{TOKENS_FILE}"
#: Where the identity proxy's shared secret is mounted (`--proxy-secret-file`).
PROXY_SECRET_MOUNT: Final = "/var/run/secrets/qpa/harness-proxy"
PROXY_SECRET_FILE: Final = "proxy-secret"
PROXY_SECRET_PATH: Final = f"{PROXY_SECRET_MOUNT}/{PROXY_SECRET_FILE}"


@dataclass(frozen=True)
class IdentityProxy:
    """The trusted proxy of identity-header mode: the pods it runs in (a required, non-empty
    label selector, in `namespace` or the release's own) and the Secret key holding the secret
    it proves itself with (`X-Qpa-Proxy-Secret`): `spec.harness.auth.proxySelector`,
    `proxyNamespace` and `proxySecretRef`."""

    pod_labels: Mapping[str, str]
    secret_name: str
    secret_key: str
    namespace: str | None = None

    def __post_init__(self) -> None:
        if not self.pod_labels or not all(k and v for k, v in self.pod_labels.items()):
            raise ValueError(
                "spec.harness.auth.proxySelector: identity-header mode needs the proxy's pod "
                "labels (a non-empty selector): only those pods may reach the Harness"
            )
        if not self.secret_name or not self.secret_key:
            raise ValueError("spec.harness.auth.proxySecretRef: the proxy's shared secret")

    @classmethod
    def of(cls, harness: HarnessServing) -> IdentityProxy | None:
        """The proxy a release's `spec.harness.auth` names (None outside identity-header mode;
        the CRD's rule makes the selector and secret required in it)."""
        auth = harness.auth
        if auth is None or auth.identity_header is None:
            return None
        ref = auth.proxy_secret_ref
        return cls(
            pod_labels=dict(auth.proxy_selector or {}),
            secret_name=ref.name if ref else "",
            secret_key=ref.key if ref else "",
            namespace=auth.proxy_namespace,
        )


#: What `spec.podTemplate` changes in the model predictor (its resources are the model's own).
MODEL_PARTS: Final = podtemplate.ALL_PARTS - {podtemplate.RESOURCES, podtemplate.SERVICE_ACCOUNT}
#: The KServe deployment mode every InferenceService of a release is pinned to (the canary
#: splits traffic with Knative's revisions; RawDeployment has no canaryTrafficPercent).
DEPLOYMENT_MODE: Final = "serving.kserve.io/deploymentMode"
SUPPORTED_MODE: Final = "Serverless"
#: The port of KServe's model server container (`kserve-container`).
MODEL_PORT: Final = 8080
#: CPU and memory requests of a model replica whose spec names none, per GPU (and for a
#: replica without GPUs); the memory limit equals the memory request.
MODEL_CPU_PER_GPU: Final = 4
MODEL_MEMORY_PER_GPU_GI: Final = 32
MODEL_CPU_WITHOUT_GPU: Final = 2
MODEL_MEMORY_WITHOUT_GPU_GI: Final = 8
#: The memory-backed `/dev/shm` of a replica spanning GPUs (NCCL's intra-node buffers).
SHM_SIZE: Final = "8Gi"
#: KServe's S3 settings, read from the storage initializer's service account Secret.
S3_ENDPOINT_ANNOTATION: Final = "serving.kserve.io/s3-endpoint"
S3_USE_HTTPS_ANNOTATION: Final = "serving.kserve.io/s3-usehttps"
S3_REGION_ANNOTATION: Final = "serving.kserve.io/s3-region"
S3_ANONYMOUS_ANNOTATION: Final = "serving.kserve.io/s3-useanoncredential"
#: KServe's default key names of that Secret (inferenceservice-config `credentials.s3`).
KSERVE_ACCESS_KEY: Final = "AWS_ACCESS_KEY_ID"
KSERVE_SECRET_KEY: Final = "AWS_SECRET_ACCESS_KEY"
#: On the service account: a hash of what its Secret was derived from (store, Secret name and
#: resourceVersion), so the handler writes a Secret only when its source changed.
STORAGE_SOURCE_ANNOTATION: Final = "qpa.ai/storage-source"
#: Pods of the namespace's TaskBatches may call the stable model endpoint.
TASKBATCH_PODS: Final = kind_label("TaskBatch")


#: KServe names the predictor's Service `<isvc>-predictor` (and revisions
#: `<isvc>-predictor-00001` in serverless mode): InferenceService names stay within 47.
ISVC_NAME_LIMIT: Final = 63 - len("-predictor-00001")


# --------------------------------------------------------------------------- identities


def model_id(model: ModelServing) -> str:
    """6 hex digits over the model's serving settings: one InferenceService per value."""
    return content_hash(model.to_k8s(), 6)


def version_id(model: ModelServing, harness: HarnessServing) -> str:
    """10 hex digits over model and Harness: what a release promotes."""
    return content_hash({"model": model.to_k8s(), "harness": harness.to_k8s()}, 10)


def harness_image(hr: HarnessRelease, defaults: Defaults) -> str:
    """`spec.harness.image`, else the operator's Harness image (the chart's `images.harness`)."""
    image: str = setting(
        hr,
        "spec.harness.image",
        hr.spec.harness.image,
        defaults.harness_image,
        "QPA_OPERATOR_HARNESS_IMAGE, the chart's images.harness",
    )
    return image


def harness_of(hr: HarnessRelease, defaults: Defaults) -> HarnessServing:
    """The spec's Harness with its image resolved: what is served, hashed and promoted."""
    harness = hr.spec.harness
    image = harness_image(hr, defaults)
    return harness if harness.image == image else harness.model_copy(update={"image": image})


def store_of(hr: HarnessRelease, defaults: Defaults) -> ObjectStore | None:
    """The spec's `store`, else the operator's; an `s3://` reportUri needs one of them."""
    store = hr.spec.store or defaults.store
    if store is None and hr.spec.report_uri.startswith("s3://"):
        raise MissingSetting(
            f"{hr.kind} {owner_namespace(hr)}/{hr.metadata.name}: spec.store is not set for the "
            "s3:// spec.reportUri and the operator has no default object store "
            "(QPA_OPERATOR_STORE_ENDPOINT/QPA_OPERATOR_STORE_SECRET, the chart's objectStore)"
        )
    return store


def candidate_id(hr: HarnessRelease, defaults: Defaults) -> str:
    """The version plus the benchmark settings: a changed benchmark is a new benchmark Job."""
    spec = hr.spec
    parts = {
        "model": spec.model.to_k8s(),
        "harness": harness_of(hr, defaults).to_k8s(),
        "benchmark": spec.benchmark.to_k8s(),
    }
    return content_hash(parts, 8)


def report_prefix(hr: HarnessRelease, defaults: Defaults) -> str:
    """Where the candidate's benchmark report belongs: `<reportUri>/<release>/<candidate>/`."""
    base = hr.spec.report_uri.rstrip("/")
    return f"{base}/{hr.metadata.name}/{candidate_id(hr, defaults)}/"


def candidate(hr: HarnessRelease, defaults: Defaults) -> ReleaseVersion:
    """The version the spec asks for (its Harness image resolved)."""
    spec = hr.spec
    harness = harness_of(hr, defaults)
    return ReleaseVersion(
        id=version_id(spec.model, harness),
        model_uri=spec.model.uri,
        harness_image=harness_image(hr, defaults),
        harness_version=harness.version,
        model=spec.model,
        harness=harness,
        report_uri=report_prefix(hr, defaults) + REPORT_FILE,
    )


def model_name(hr: HarnessRelease, model: ModelServing | None = None) -> str:
    return bounded_name(hr, f"model-{model_id(model or hr.spec.model)}", ISVC_NAME_LIMIT)


def harness_name(hr: HarnessRelease) -> str:
    return bounded_name(hr, "harness", ISVC_NAME_LIMIT)


def bench_job_name(hr: HarnessRelease, defaults: Defaults) -> str:
    return bounded_name(hr, f"bench-{candidate_id(hr, defaults)}", 63)


def model_url(hr: HarnessRelease, defaults: Defaults, model: ModelServing | None = None) -> str:
    """The OpenAI-compatible endpoint of a model InferenceService's predictor."""
    host = service_host(f"{model_name(hr, model)}-predictor", owner_namespace(hr), defaults)
    return f"http://{host}/openai/v1"


def candidate_metrics_url(hr: HarnessRelease, defaults: Defaults) -> str:
    """The candidate revision's /metrics: KServe's tag route of the latest revision."""
    host = service_host(f"latest-{harness_name(hr)}-predictor", owner_namespace(hr), defaults)
    return f"http://{host}/metrics"


def harness_url(hr: HarnessRelease, defaults: Defaults) -> str:
    host = service_host(f"{harness_name(hr)}-predictor", owner_namespace(hr), defaults)
    return f"http://{host}/v1/models/harness:predict"


# --------------------------------------------------------------------------- manifests


def model_args(model: ModelServing) -> list[str]:
    """The model server's flags: KServe's Hugging Face server passes vLLM's own through."""
    args = [
        f"--model_name={model.served_model_name}",
        f"--backend={model.runtime}",
        f"--dtype={model.dtype}",
    ]
    if model.runtime == "vllm":
        args.append(f"--tensor-parallel-size={max(1, model.gpus)}")
    if model.max_model_length is not None:
        args.append(f"--max-model-len={model.max_model_length}")
    return args


def model_resources(model: ModelServing) -> JsonDict:
    """The replica's requests and limits: the spec's, CPU and memory defaulted per GPU, the
    memory limit at the memory request (vLLM's host memory is not elastic)."""
    spec = model.resources
    requests = dict(spec.requests) if spec else {}
    limits = dict(spec.limits) if spec else {}
    gpus = model.gpus
    if "cpu" not in requests:
        requests["cpu"] = str(MODEL_CPU_PER_GPU * gpus if gpus else MODEL_CPU_WITHOUT_GPU)
    if "memory" not in requests:
        requests["memory"] = limits.get("memory") or (
            f"{MODEL_MEMORY_PER_GPU_GI * gpus if gpus else MODEL_MEMORY_WITHOUT_GPU_GI}Gi"
        )
    limits.setdefault("memory", requests["memory"])
    return resources(ResourceRequirements(requests=requests, limits=limits), gpus=gpus)


def uses_store(model: ModelServing) -> bool:
    """The model is downloaded from the object store (needs the storage service account)."""
    return model.uri.startswith("s3://")


def model_store(hr: HarnessRelease, defaults: Defaults) -> ObjectStore:
    """The store an `s3://` model is downloaded from: `spec.store`, else the operator's."""
    store = hr.spec.store or defaults.store
    if store is None:
        raise MissingSetting(
            f"{hr.kind} {owner_namespace(hr)}/{hr.metadata.name}: spec.store is not set for the "
            "s3:// spec.model.uri and the operator has no default object store "
            "(QPA_OPERATOR_STORE_ENDPOINT/QPA_OPERATOR_STORE_SECRET, the chart's objectStore)"
        )
    return store


def storage_name(hr: HarnessRelease) -> str:
    """The storage initializer's service account."""
    return bounded_name(hr, "model-storage", 63)


def storage_secret_name(hr: HarnessRelease, source: str) -> str:
    """The storage initializer's Secret derived from `source` (`storage_source`): one
    immutable Secret per source, so the operator only ever creates Secrets, never changes one."""
    return bounded_name(hr, f"model-storage-{source[:8]}", 63)


def s3_annotations(store: ObjectStore) -> dict[str, str]:
    """KServe's S3 annotations for `store`: endpoint as host[:port], https or not, region."""
    parts = urlsplit(store.endpoint)
    https = parts.scheme.lower() == "https"
    return {
        S3_ENDPOINT_ANNOTATION: parts.netloc,
        S3_USE_HTTPS_ANNOTATION: "1" if https else "0",
        S3_REGION_ANNOTATION: store.region,
        S3_ANONYMOUS_ANNOTATION: "false",
    }


def storage_source(store: ObjectStore, source_version: str) -> str:
    """What the storage Secret is derived from, hashed: store, Secret, key names, version."""
    return content_hash({"store": store.to_k8s(), "resourceVersion": source_version}, 16)


def storage_secret(
    hr: HarnessRelease,
    defaults: Defaults,
    store: ObjectStore,
    source: str,
    access_key: str,
    secret_key: str,
) -> JsonDict:
    """The storage initializer's Secret in KServe's S3 format, from the store's keys (immutable;
    named by its source, see `storage_secret_name`).

    No spec hash: its data are credentials, and no digest of them is written anywhere.
    """
    meta = metadata(
        hr,
        storage_secret_name(hr, source),
        MODEL_COMPONENT,
        defaults,
        annotations={**s3_annotations(store), "qpa.ai/derived-from": store.secret_ref.name},
    )
    encode = lambda value: base64.b64encode(value.encode()).decode()  # noqa: E731
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "immutable": True,
        "data": {KSERVE_ACCESS_KEY: encode(access_key), KSERVE_SECRET_KEY: encode(secret_key)},
    }


def storage_account(
    hr: HarnessRelease, defaults: Defaults, store: ObjectStore, source: str
) -> JsonDict:
    """The service account KServe's storage initializer downloads an `s3://` model with:
    the Secret derived from `source`, KServe's S3 annotations, and the source's hash."""
    annotations = {**s3_annotations(store), STORAGE_SOURCE_ANNOTATION: source}
    manifest = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(
            hr, storage_name(hr), MODEL_COMPONENT, defaults, annotations=annotations
        ),
        "automountServiceAccountToken": False,
        "secrets": [{"name": storage_secret_name(hr, source)}],
    }
    return with_spec_hash(manifest)


def model_service(
    hr: HarnessRelease, defaults: Defaults, model: ModelServing | None = None
) -> JsonDict:
    """The InferenceService of one model version (the spec's when `model` is None)."""
    model = model or hr.spec.model
    predictor_model: JsonDict = {
        "modelFormat": {"name": "huggingface"},
        "runtime": HF_RUNTIME,
        "storageUri": model.uri,
        "args": model_args(model),
        "resources": model_resources(model),
        # restricted, except a read-only root: model servers write caches under $HOME
        "securityContext": {
            **restricted_container_security(),
            "readOnlyRootFilesystem": False,
        },
    }
    meta = metadata(
        hr,
        model_name(hr, model),
        MODEL_COMPONENT,
        defaults,
        annotations={DEPLOYMENT_MODE: SUPPORTED_MODE},
    )
    meta["labels"][MODEL_LABEL] = model_id(model)
    predictor: JsonDict = {
        "minReplicas": 1,
        "securityContext": restricted_pod_security(defaults),
        "model": predictor_model,
    }
    if uses_store(model):
        model_store(hr, defaults)  # names the missing setting before anything is applied
        predictor["serviceAccountName"] = storage_name(hr)
    if model.gpus > 1:
        predictor["volumes"] = [empty_dir("dshm", memory=True, size_limit=SHM_SIZE)]
        predictor_model["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if model.gpus > 0:
        predictor.update(gpu_placement(defaults))  # GPU nodes: their taint, the chart's selector
    manifest = {
        "apiVersion": ISVC_API,
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {"predictor": predictor},
    }
    # the model has its own resources (spec.model.resources, gpus) and the operator's storage
    # ServiceAccount: the rest applies
    template = hr.spec.pod_template
    return with_spec_hash(podtemplate.merge_into(manifest, template, defaults, parts=MODEL_PARTS))


def stable_endpoint_name(hr: HarnessRelease) -> str:
    return bounded_name(hr, "model", 63)


def stable_model_url(hr: HarnessRelease, defaults: Defaults) -> str:
    """The stable model's OpenAI endpoint: what TaskBatches and other clients point at."""
    host = service_host(stable_endpoint_name(hr), owner_namespace(hr), defaults)
    return f"http://{host}:{MODEL_PORT}/openai/v1"


def stable_endpoint(hr: HarnessRelease, defaults: Defaults, model: ModelServing) -> JsonDict:
    """`<release>-model`: a Service in front of the stable version's model predictor pods."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(hr, stable_endpoint_name(hr), MODEL_COMPONENT, defaults),
        "spec": {
            "type": "ClusterIP",
            "selector": netpol.predictor_pods(model_name(hr, model)),
            "ports": [
                {"name": "http", "port": MODEL_PORT, "targetPort": MODEL_PORT, "protocol": "TCP"}
            ],
        },
    }
    return with_spec_hash(manifest)


def identity_auth_parts(header: str, proxy: IdentityProxy) -> tuple[PodParts, list[str]]:
    """Identity-header mode: the proxy secret's key mounted read-only at `PROXY_SECRET_PATH`
    (the kubelet reads it, as for tokens) and `--identity-header <header> --proxy-secret-file
    <path>`; the server refuses the mode without the secret."""
    parts = _secret_file(
        "harness-proxy", proxy.secret_name, proxy.secret_key, PROXY_SECRET_FILE, PROXY_SECRET_MOUNT
    )
    return parts, ["--identity-header", header, "--proxy-secret-file", PROXY_SECRET_PATH]


def _secret_file(volume: str, secret: str, key: str, file: str, mount_path: str) -> PodParts:
    """One Secret key as a read-only file `file` under `mount_path` (a fixed name, so no name
    from the spec reaches argv)."""
    source = {"secretName": secret, "items": [{"key": key, "path": file}], "defaultMode": 0o440}
    mount = {"name": volume, "mountPath": mount_path, "readOnly": True}
    return PodParts(volumes=({"name": volume, "secret": source},), mounts=(mount,))


def proxy_peers(proxy: IdentityProxy) -> list[JsonDict]:
    """The only ingress sources of a Harness in identity-header mode: the proxy's pods."""
    return [netpol.pods_peer(dict(proxy.pod_labels), proxy.namespace)]


def harness_auth_parts(
    harness: HarnessServing, proxy: IdentityProxy | None = None
) -> tuple[PodParts, list[str]]:
    """The Harness's caller authentication: the tokens Secret's volume and mount, and flags.

    The Secret key lands at a fixed path (`TOKENS_PATH`), so no name from the spec reaches argv;
    an identity header does, after the CRD and `qpa.api` validated it as a header name, with
    the proxy's secret (`identity_auth_parts`); `proxy` defaults to the one
    `spec.harness.auth` names (`IdentityProxy.of`).
    """
    auth = harness.auth
    if auth is None:
        return PodParts(), []
    if auth.identity_header is not None:
        proxy = proxy or IdentityProxy.of(harness)
        assert proxy is not None  # identity-header mode
        return identity_auth_parts(auth.identity_header, proxy)
    ref = auth.tokens_secret_ref
    if ref is None:  # HarnessAuth's rule: exactly one of the two
        raise ValueError("spec.harness.auth: set exactly one of tokensSecretRef or identityHeader")
    parts = _secret_file("harness-tokens", ref.name, ref.key, TOKENS_FILE, TOKENS_MOUNT)
    return parts, ["--tokens-file", TOKENS_PATH]


def harness_args(
    hr: HarnessRelease,
    defaults: Defaults,
    config_path: str | None,
    model: ModelServing,
    auth_args: list[str] | None = None,
) -> list[str]:
    args = [
        "qpa", "harness", "serve",
        "--planner", "openai",
        "--model-url", model_url(hr, defaults, model),
        "--model", model.served_model_name,
        "--name", "harness",
        "--host", "0.0.0.0",
        "--http-port", str(HARNESS_PORT),
    ]  # fmt: skip
    if config_path is not None:
        args += ["--harness-config", config_path]
    return args + list(auth_args or [])


def harness_service(
    hr: HarnessRelease,
    defaults: Defaults,
    version: ReleaseVersion | None = None,
    traffic: int = 100,
    proxy: IdentityProxy | None = None,
) -> JsonDict:
    """The Harness InferenceService serving `version` (the spec's) on `traffic` percent.

    Below 100 KServe keeps the rest of the requests on the last rolled-out revision. `proxy`:
    the identity proxy of identity-header mode (`harness_auth_parts`).
    """
    version = version or candidate(hr, defaults)
    harness = version.harness
    config_parts, config_path = harness_config_parts(harness.config_map_ref)
    auth_parts, auth_args = harness_auth_parts(harness, proxy)
    parts = combine(
        [
            PodParts(
                env=(
                    env_var("QPA_HARNESS_VERSION", harness.version),
                    env_var("HOME", "/tmp"),
                ),
                volumes=(empty_dir("tmp"),),
                mounts=({"name": "tmp", "mountPath": "/tmp"},),
            ),
            config_parts,
            auth_parts,
        ]
    )
    container = {
        "name": "kserve-container",
        "image": version.harness_image,
        "command": harness_args(hr, defaults, config_path, version.model, auth_args),
        "ports": [{"containerPort": HARNESS_PORT, "protocol": "TCP"}],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
    }
    meta = metadata(
        hr,
        harness_name(hr),
        HARNESS_COMPONENT,
        defaults,
        annotations={TAG_ROUTING: "true", DEPLOYMENT_MODE: SUPPORTED_MODE},
    )
    meta["labels"][VERSION_LABEL] = version.id
    manifest = {
        "apiVersion": ISVC_API,
        "kind": "InferenceService",
        "metadata": meta,
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "canaryTrafficPercent": traffic,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": restricted_pod_security(defaults),
                "containers": [container],
                "volumes": list(parts.volumes),
            }
        },
    }
    return with_spec_hash(podtemplate.merge_into(manifest, hr.spec.pod_template, defaults))


def bench_resolved(hr: HarnessRelease, defaults: Defaults) -> Resolved:
    """What the benchmark pod gets besides the spec: the candidate's endpoint, where to publish,
    the store and the RolloutPool."""
    bench = hr.spec.benchmark
    namespace = owner_namespace(hr)
    pool = bench.rollout_pool_ref
    return Resolved(
        namespace=namespace,
        store=store_of(hr, defaults),
        rollout_pool_url=rollout_pool_url(pool.name, namespace, defaults) if pool else None,
        model_url=model_url(hr, defaults),
        report_uri=report_prefix(hr, defaults),
    )


def bench_work_order(hr: HarnessRelease, defaults: Defaults) -> JsonDict:
    """The candidate's benchmark work order (named as its Job: one per candidate)."""
    return work_order_config_map(
        hr,
        bench_resolved(hr, defaults),
        BENCH_COMPONENT,
        defaults,
        name=bench_job_name(hr, defaults),
    )


BENCH_ARGS: Final = ("qpa", "bench", "run", "--spec", WORK_ORDER_PATH)


def bench_job(hr: HarnessRelease, defaults: Defaults) -> JsonDict:
    harness = harness_of(hr, defaults)
    config_parts, _ = harness_config_parts(harness.config_map_ref)
    parts = combine(
        [
            PodParts(
                env=(
                    env_var("QPA_STATUS_FILE", TERMINATION_LOG),
                    env_var("HOME", "/tmp"),
                ),
                volumes=(empty_dir("work"), empty_dir("tmp")),
                mounts=(
                    {"name": "work", "mountPath": "/work"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ),
            ),
            config_parts,
            store_parts(store_of(hr, defaults)),
            work_order_parts(hr, name=bench_job_name(hr, defaults)),
        ]
    )
    container = {
        "name": "bench",
        "image": harness.image,
        "command": list(BENCH_ARGS),
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    meta = metadata(hr, bench_job_name(hr, defaults), BENCH_COMPONENT, defaults)
    meta["labels"][CANDIDATE_LABEL] = candidate_id(hr, defaults)
    pod_labels = {
        **labels(hr, BENCH_COMPONENT, defaults),
        CANDIDATE_LABEL: candidate_id(hr, defaults),
    }
    pool = hr.spec.benchmark.rollout_pool_ref
    if pool is not None:  # admitted by the RolloutPool's ingress policy
        pod_labels[netpol.ENV_CLIENT_LABEL] = pool.name
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 2,
            "activeDeadlineSeconds": hr.spec.timeouts.benchmark_seconds,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": restricted_pod_security(defaults),
                    "containers": [container],
                    "volumes": list(parts.volumes),
                },
            },
        },
    }
    return with_spec_hash(podtemplate.merge_into(manifest, hr.spec.pod_template, defaults))


def bench_egress_policy(hr: HarnessRelease, defaults: Defaults) -> JsonDict:
    """The benchmark reaches DNS, the store, its RolloutPool and the candidate's model."""
    bench = bench_resolved(hr, defaults)
    pool = hr.spec.benchmark.rollout_pool_ref
    return netpol.egress_policy(
        hr,
        BENCH_COMPONENT,
        defaults,
        endpoints=[bench.model_url, bench.store.endpoint if bench.store else None],
        rules=[netpol.env_pool_rule(pool.name)] if pool is not None else [],
        part="bench",
    )


def _isvc_names(isvcs: list[JsonDict], component: str) -> list[str]:
    return [
        str(i["metadata"]["name"])
        for i in isvcs
        if i.get("kind") == "InferenceService"
        and i["metadata"]["labels"].get(LABEL_COMPONENT) == component
    ]


def network_policies(
    hr: HarnessRelease,
    defaults: Defaults,
    children: list[JsonDict],
    proxy: IdentityProxy | None = None,
) -> list[JsonDict]:
    """The policies of the InferenceServices among `children` (and of the benchmark Job):

    - `<model isvc>-ingress`: from this release's benchmark pods and Harness predictor pods
      and the admin's serving gateway (`networkPolicy.ingress.servingGateway`), KServe ports;
      the stable model (behind `<release>-model`) also from the namespace's TaskBatch pods;
    - `<harness isvc>-ingress`: from the benchmark pods and the serving gateway; with
      `proxy` (identity-header mode: the header is trusted only from the proxy) from the
      proxy's pods alone, its required selector;
    - `<harness isvc>-egress`: the Harness predictor reaches DNS and the release's models;
    - `<release>-bench-egress` while a benchmark Job is among `children`.
    """
    models = _isvc_names(children, MODEL_COMPONENT)
    harnesses = _isvc_names(children, HARNESS_COMPONENT)
    bench = [netpol.pods_peer(selector_labels(hr, BENCH_COMPONENT))]
    gateway = netpol.gateway_peers(defaults.network.ingress.serving_gateway)
    ports = defaults.network.kserve_ports
    harness_pods = [netpol.pods_peer(netpol.predictor_pods(h)) for h in harnesses]
    stable = {
        str(c["spec"]["selector"].get(netpol.ISVC_LABEL))
        for c in children
        if c.get("kind") == "Service" and c["metadata"]["name"] == stable_endpoint_name(hr)
    }
    taskbatches = {"podSelector": {"matchExpressions": [
        {"key": TASKBATCH_PODS, "operator": "Exists"}
    ]}}  # fmt: skip
    result: list[JsonDict] = []
    for name in models:
        clients = [*bench, *harness_pods, *gateway]
        if name in stable:  # the stable endpoint: the namespace's TaskBatches call it
            clients.append(taskbatches)
        result.append(
            netpol.ingress_policy(
                hr,
                name,
                MODEL_COMPONENT,
                defaults,
                pod_selector=netpol.predictor_pods(name),
                sources=[(clients, ports)],
            )
        )
    proxy = proxy or IdentityProxy.of(hr.spec.harness)
    harness_clients = proxy_peers(proxy) if proxy is not None else [*bench, *gateway]
    for name in harnesses:
        result.append(
            netpol.ingress_policy(
                hr,
                name,
                HARNESS_COMPONENT,
                defaults,
                pod_selector=netpol.predictor_pods(name),
                sources=[(harness_clients, ports)],
            )
        )
        result.append(
            netpol.egress_policy(
                hr,
                HARNESS_COMPONENT,
                defaults,
                rules=[netpol.predictor_rule(m, defaults) for m in models],
                part=name.removeprefix(f"{hr.metadata.name}-"),
                pod_selector=netpol.predictor_pods(name),
            )
        )
    if any(c.get("kind") == "Job" for c in children):
        result.append(bench_egress_policy(hr, defaults))
    return result


def services(hr: HarnessRelease, defaults: Defaults) -> list[JsonDict]:
    """The spec's model and Harness InferenceServices as a first release serves them."""
    return [model_service(hr, defaults), harness_service(hr, defaults)]


# --------------------------------------------------------------------------- status


def isvc_ready(isvc: Mapping[str, Any] | None) -> bool:
    """Ready=True, for the InferenceService's current generation when it reports one."""
    if not isvc:
        return False
    status = isvc.get("status") or {}
    generation = (isvc.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if observed is not None and generation is not None and observed < generation:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def isvc_failure(isvc: Mapping[str, Any] | None) -> str | None:
    """The message of a Ready=False condition with a failure reason, else None."""
    for c in ((isvc or {}).get("status") or {}).get("conditions") or []:
        if (
            c.get("type") == "Ready"
            and c.get("status") == "False"
            and c.get("reason")
            in (
                "RevisionFailed",
                "InferenceServiceFailed",
                "ServingRuntimeFailed",
            )
        ):
            return str(c.get("message") or c.get("reason"))
    return None
