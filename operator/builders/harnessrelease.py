"""HarnessRelease -> two KServe InferenceServices and a benchmark Job against them.

- `<release>-model`: the planner model on KServe's Hugging Face runtime with the vLLM backend
  (`storageUri` = `spec.model.uri`, `nvidia.com/gpu` per replica); it serves the OpenAI API at
  `http://<release>-model-predictor.<ns>.svc.<domain>/openai/v1`;
- `<release>-harness`: the Harness as a KServe custom predictor, a container running
  `qpa harness serve --planner openai --model-url <the model> --http-port 8080 ...` with the
  Harness version's YAML from its ConfigMap;
- `<release>-bench-<candidate>`: once both report Ready, a Job running `qpa bench run` on the
  suite split against the candidate (the model endpoint through the same Harness version).

The candidate id hashes the model URI, runtime and Harness image/version/config, so a new
candidate gets a new benchmark Job and a re-run of the handler never benchmarks twice. The
release then waits in phase `Benchmarking` with condition `BenchmarkDone=True`
(reason `AwaitingGate`): the release gate and the canary steps decide from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from qpa_operator.builders.common import (
    TERMINATION_LOG,
    Defaults,
    JsonDict,
    PodParts,
    bounded_name,
    combine,
    content_hash,
    empty_dir,
    env_var,
    harness_config_parts,
    job_state,
    labels,
    metadata,
    owner_namespace,
    reason_word,
    resources,
    restricted_container_security,
    restricted_pod_security,
    rollout_pool_url,
    service_host,
    store_parts,
    with_spec_hash,
)

from qpa.api import HarnessRelease
from qpa.api.v1alpha1 import (
    ConditionStatus,
    HarnessReleaseStatus,
    ReleaseVersion,
    set_condition,
)

ISVC_API: Final = "serving.kserve.io/v1beta1"
MODEL_COMPONENT: Final = "model"
HARNESS_COMPONENT: Final = "harness"
BENCH_COMPONENT: Final = "benchmark"
CANDIDATE_LABEL: Final = "qpa.ai/candidate"
HARNESS_PORT: Final = 8080
HF_RUNTIME: Final = "kserve-huggingfaceserver"


#: KServe names the predictor's Service `<isvc>-predictor` (and revisions
#: `<isvc>-predictor-00001` in serverless mode): InferenceService names stay within 47.
ISVC_NAME_LIMIT: Final = 63 - len("-predictor-00001")


def model_name(hr: HarnessRelease) -> str:
    return bounded_name(hr, "model", ISVC_NAME_LIMIT)


def harness_name(hr: HarnessRelease) -> str:
    return bounded_name(hr, "harness", ISVC_NAME_LIMIT)


def candidate(hr: HarnessRelease) -> ReleaseVersion:
    return ReleaseVersion(
        model_uri=hr.spec.model.uri,
        harness_image=hr.spec.harness.image,
        harness_version=hr.spec.harness.version,
    )


def candidate_id(hr: HarnessRelease) -> str:
    spec = hr.spec
    parts = {
        "model": spec.model.to_k8s(),
        "harness": spec.harness.to_k8s(),
        "benchmark": spec.benchmark.to_k8s(),
    }
    return content_hash(parts, 8)


def bench_job_name(hr: HarnessRelease) -> str:
    return bounded_name(hr, f"bench-{candidate_id(hr)}", 63)


def model_url(hr: HarnessRelease, defaults: Defaults) -> str:
    """The OpenAI-compatible endpoint of the model InferenceService's predictor."""
    host = service_host(f"{model_name(hr)}-predictor", owner_namespace(hr), defaults)
    return f"http://{host}/openai/v1"


def harness_url(hr: HarnessRelease, defaults: Defaults) -> str:
    host = service_host(f"{harness_name(hr)}-predictor", owner_namespace(hr), defaults)
    return f"http://{host}/v1/models/harness:predict"


def report_prefix(hr: HarnessRelease) -> str:
    """Where the candidate's benchmark report belongs: `<reportUri>/<release>/<candidate>/`."""
    base = hr.spec.report_uri.rstrip("/")
    return f"{base}/{hr.metadata.name}/{candidate_id(hr)}/"


def model_service(hr: HarnessRelease, defaults: Defaults) -> JsonDict:
    model = hr.spec.model
    args = [f"--model_name={model.served_model_name}", f"--backend={model.runtime}"]
    if model.max_model_length is not None:
        args.append(f"--max_model_len={model.max_model_length}")
    predictor_model: JsonDict = {
        "modelFormat": {"name": "huggingface"},
        "runtime": HF_RUNTIME,
        "storageUri": model.uri,
        "args": args,
    }
    model_resources = resources(model.resources, gpus=model.gpus)
    if model_resources:
        predictor_model["resources"] = model_resources
    manifest = {
        "apiVersion": ISVC_API,
        "kind": "InferenceService",
        "metadata": metadata(hr, model_name(hr), MODEL_COMPONENT, defaults),
        "spec": {"predictor": {"minReplicas": 1, "model": predictor_model}},
    }
    return with_spec_hash(manifest)


def harness_args(hr: HarnessRelease, defaults: Defaults, config_path: str | None) -> list[str]:
    args = [
        "qpa", "harness", "serve",
        "--planner", "openai",
        "--model-url", model_url(hr, defaults),
        "--model", hr.spec.model.served_model_name,
        "--name", "harness",
        "--host", "0.0.0.0",
        "--http-port", str(HARNESS_PORT),
    ]  # fmt: skip
    if config_path is not None:
        args += ["--harness-config", config_path]
    return args


def harness_service(hr: HarnessRelease, defaults: Defaults) -> JsonDict:
    config_parts, config_path = harness_config_parts(hr.spec.harness.config_map_ref)
    parts = combine(
        [
            PodParts(
                env=(
                    env_var("QPA_HARNESS_VERSION", hr.spec.harness.version),
                    env_var("HOME", "/tmp"),
                ),
                volumes=(empty_dir("tmp"),),
                mounts=({"name": "tmp", "mountPath": "/tmp"},),
            ),
            config_parts,
        ]
    )
    container = {
        "name": "kserve-container",
        "image": hr.spec.harness.image,
        "command": harness_args(hr, defaults, config_path),
        "ports": [{"containerPort": HARNESS_PORT, "protocol": "TCP"}],
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
    }
    manifest = {
        "apiVersion": ISVC_API,
        "kind": "InferenceService",
        "metadata": metadata(hr, harness_name(hr), HARNESS_COMPONENT, defaults),
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": restricted_pod_security(defaults),
                "containers": [container],
                "volumes": list(parts.volumes),
            }
        },
    }
    return with_spec_hash(manifest)


def bench_args(hr: HarnessRelease, defaults: Defaults, config_path: str | None) -> list[str]:
    bench = hr.spec.benchmark
    args = [
        "qpa", "bench", "run",
        "--suite", bench.suite,
        "--split", bench.split,
        "--samples", str(bench.samples),
        "--concurrency", str(bench.concurrency),
        "--planner", "openai",
        "--model-url", model_url(hr, defaults),
        "--model", hr.spec.model.served_model_name,
        "--out", "/work/bench",
        "--no-plots",
    ]  # fmt: skip
    if bench.limit is not None:
        args += ["--limit", str(bench.limit)]
    if config_path is not None:
        args += ["--harness-config", config_path]
    if bench.rollout_pool_ref is not None:
        pool = rollout_pool_url(bench.rollout_pool_ref.name, owner_namespace(hr), defaults)
        args += ["--env-url", pool]
    else:
        args += ["--env-kind", bench.environment]
    return args


def bench_job(hr: HarnessRelease, defaults: Defaults) -> JsonDict:
    config_parts, config_path = harness_config_parts(hr.spec.harness.config_map_ref)
    parts = combine(
        [
            PodParts(
                env=(
                    env_var("QPA_REPORT_URI", report_prefix(hr)),
                    env_var("QPA_STATUS_FILE", TERMINATION_LOG),
                    env_var("QPA_HARNESS_VERSION", hr.spec.harness.version),
                    env_var("HOME", "/tmp"),
                ),
                volumes=(empty_dir("work"), empty_dir("tmp")),
                mounts=(
                    {"name": "work", "mountPath": "/work"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ),
            ),
            config_parts,
            store_parts(hr.spec.store),
        ]
    )
    container = {
        "name": "bench",
        "image": hr.spec.harness.image,
        "command": bench_args(hr, defaults, config_path),
        "env": list(parts.env),
        "volumeMounts": list(parts.mounts),
        "securityContext": restricted_container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    meta = metadata(hr, bench_job_name(hr), BENCH_COMPONENT, defaults)
    meta["labels"][CANDIDATE_LABEL] = candidate_id(hr)
    pod_labels = {**labels(hr, BENCH_COMPONENT, defaults), CANDIDATE_LABEL: candidate_id(hr)}
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 2,
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
    return with_spec_hash(manifest)


def services(hr: HarnessRelease, defaults: Defaults) -> list[JsonDict]:
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


def harnessrelease_status(
    hr: HarnessRelease,
    *,
    model: Mapping[str, Any] | None,
    harness: Mapping[str, Any] | None,
    bench: Mapping[str, Any] | None,
    observed_generation: int | None,
    now: datetime,
) -> HarnessReleaseStatus:
    """Deploying -> Benchmarking -> (BenchmarkDone, awaiting the gate) or Failed."""
    current = hr.status or HarnessReleaseStatus()
    if current.phase in ("Canary", "Promoted", "RolledBack") and current.candidate == candidate(hr):
        return current  # the gate has taken over this candidate
    both_ready = isvc_ready(model) and isvc_ready(harness)
    failure = isvc_failure(model) or isvc_failure(harness)
    state = job_state(bench)
    generation = observed_generation
    conditions = list(current.conditions)
    bench_name = bench_job_name(hr)
    done_status: ConditionStatus = "False"
    done_reason, done_message = "NotStarted", "the benchmark has not run"
    if failure is not None:
        phase, reason, message = "Failed", "InferenceServiceFailed", failure
    elif not both_ready and not state.exists:
        phase, reason = "Deploying", "WaitingForInferenceServices"
        message = f"waiting for {model_name(hr)} and {harness_name(hr)} to be Ready"
    elif state.failed_for_good:
        phase, reason = "Failed", "BenchmarkFailed"
        message = state.message or f"Job {bench_name} failed; no report, no promotion"
        done_reason, done_message = reason_word(state.reason, "Failed"), message
    elif state.complete:
        phase, reason = "Benchmarking", "AwaitingGate"
        message = f"Job {bench_name} finished; the release gate decides on its report"
        done_status, done_reason, done_message = "True", "AwaitingGate", message
    else:
        phase, reason = "Benchmarking", "BenchmarkRunning"
        message = f"Job {bench_name} benchmarks the candidate"
        done_reason, done_message = "BenchmarkRunning", message
    conditions = set_condition(
        conditions,
        "Deployed",
        "True" if both_ready else "False",
        "InferenceServicesReady" if both_ready else "InferenceServicesNotReady",
        f"{model_name(hr)} and {harness_name(hr)}"
        + (" are Ready" if both_ready else " are not both Ready"),
        observed_generation=generation,
        now=now,
    )
    conditions = set_condition(
        conditions, "BenchmarkDone", done_status, done_reason, done_message,
        observed_generation=generation, now=now,
    )  # fmt: skip
    conditions = set_condition(
        conditions,
        "Failed",
        "True" if phase == "Failed" else "False",
        reason if phase == "Failed" else "NoFailure",
        message if phase == "Failed" else "",
        observed_generation=generation,
        now=now,
    )
    return current.model_copy(
        update={
            "phase": phase,
            "observed_generation": observed_generation,
            "conditions": conditions,
            "candidate": candidate(hr),
        }
    )
