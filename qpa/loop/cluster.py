"""`qpa loop --preset cluster --dry-run`: the same loop as Kubernetes custom resources.

On a cluster the loop's stages are not run in one process: each becomes a resource the operator
reconciles into Jobs and InferenceServices. `cluster_resources(preset)` builds them with the
pydantic models of `qpa.api.v1alpha1` (so every field is checked as the CRDs check it) and
`render_yaml` prints them as one multi-document YAML stream, in apply order:

| local stage | resource |
|---|---|
| `harness` v1 settings | ConfigMap `<name>-harness-v1` (the Harness YAML, `--harness-config`) |
| `tasks` + `collect` | TaskBatch `<name>-oracle`, `<name>-noisy` (generate train tasks, roll out) |
| `curate` + `mix` + `sft` | TrainingRun `<name>-sft` on both batches (stage `sft`, turn masking) |
| `eval_sft` + diagnosis | TaskBatch `<name>-validation` (the SFT model on the validation split) |
| `round2` | TaskBatch `<name>-round2` (train tasks for the weak capabilities) |
| `rl` | TrainingRun `<name>-rl` from the SFT model (stage `rl`, CARE, the RolloutPool) |
| `eval_rl` | HarnessRelease `<name>`: RL model + Harness v2, test benchmark, gate |

The Harness v2 ConfigMap is what the revision writes from the validation diagnosis (`qpa
diagnose` on `<name>-validation`); the HarnessRelease references it by name.
"""

from __future__ import annotations

from typing import Any

import yaml

from qpa.loop.presets import LoopPreset

KINDS = ("TaskBatch", "TrainingRun", "HarnessRelease")
LABEL = "qpa.ai/loop"


def _meta(preset: LoopPreset, name: str, stage: str) -> dict[str, Any]:
    cluster = preset.cluster
    return {
        "name": name,
        "namespace": cluster.namespace,
        "labels": {
            "app.kubernetes.io/part-of": "qpa",
            LABEL: cluster.name,
            "qpa.ai/stage": stage,
        },
    }


def _store(preset: LoopPreset) -> dict[str, Any]:
    return {
        "endpoint": preset.cluster.store_endpoint,
        "secretRef": {"name": preset.cluster.store_secret},
    }


def _uri(preset: LoopPreset, *parts: str) -> str:
    return "/".join([preset.cluster.store_uri.rstrip("/"), *parts]) + "/"


def _capabilities(preset: LoopPreset) -> list[str]:
    from qpa.loop.stages import capabilities_of

    return capabilities_of(preset)


def harness_configmap(preset: LoopPreset, version: str | None = None) -> dict[str, Any]:
    """A ConfigMap holding a Harness version's YAML (what `--harness-config` reads)."""
    harness = preset.harness
    name = f"{preset.cluster.name}-{version or harness.version}"
    body = yaml.safe_dump(harness.model_dump(mode="json"), sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(preset, name, "harness"),
        "data": {"harness.yaml": body},
    }


def _task_batch(
    preset: LoopPreset,
    name: str,
    stage: str,
    *,
    planner: str,
    seed: int,
    split: str,
    samples: int,
    limit: int | None,
    model_uri: str | None = None,
    harness_version: str | None = None,
) -> dict[str, Any]:
    cluster = preset.cluster
    harness = harness_version or preset.harness.version
    policy: dict[str, Any] = {
        "planner": planner,
        "harness": {
            "version": harness,
            "configMapRef": {"name": f"{cluster.name}-{harness}", "key": "harness.yaml"},
        },
    }
    if model_uri is not None:
        policy["modelUri"] = model_uri
    source: dict[str, Any] = {
        "generator": {"suite": preset.suite, "seed": seed},
        "split": split,
        "capabilities": _capabilities(preset),
    }
    if limit is not None:
        source["limit"] = limit
    return {
        "apiVersion": "qpa.ai/v1alpha1",
        "kind": "TaskBatch",
        "metadata": _meta(preset, name, stage),
        "spec": {
            "source": source,
            "policy": policy,
            "rolloutPoolRef": {"name": cluster.rollout_pool},
            "samplesPerTask": samples,
            "parallelism": cluster.parallelism,
            "maxTurns": preset.collect.max_turns,
            "outputUri": _uri(preset, "taskbatches", name),
            "store": _store(preset),
        },
    }


def cluster_resources(preset: LoopPreset) -> list[dict[str, Any]]:
    """The loop's resources as plain dicts, validated by the `qpa.api.v1alpha1` models.

    Raises `pydantic.ValidationError` when a resource would not pass the CRD's validation.
    """
    cluster = preset.cluster
    name = cluster.name
    per_template = preset.tasks.generated_per_template
    train_limit = per_template * len(preset.tasks.templates) or None
    sft_name, rl_name = f"{name}-sft", f"{name}-rl"
    sft_model = _uri(preset, "trainingruns", sft_name, "final")
    rl_model = _uri(preset, "trainingruns", rl_name, "final")
    revised = "harness-v2"
    sft, rl = preset.sft, preset.rl
    resources: list[dict[str, Any]] = [
        harness_configmap(preset),
        _task_batch(
            preset,
            f"{name}-oracle",
            "collect",
            planner="oracle",
            seed=1 + preset.seed * 1000,
            split="train",
            samples=preset.collect.oracle_samples,
            limit=train_limit,
        ),
        _task_batch(
            preset,
            f"{name}-noisy",
            "collect",
            planner="noisy",
            seed=1 + preset.seed * 1000,
            split="train",
            samples=max(1, preset.collect.noisy_samples),
            limit=train_limit,
        ),
        {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": "TrainingRun",
            "metadata": _meta(preset, sft_name, "sft"),
            "spec": {
                "stage": "sft",
                "baseModelUri": cluster.base_model_uri,
                "datasets": [
                    {"taskBatchRef": {"name": f"{name}-oracle"}, "weight": 1.0},
                    {"taskBatchRef": {"name": f"{name}-noisy"}, "weight": 1.0},
                ],
                "sft": {"turnMasking": True},
                "hyperparameters": {
                    "learningRate": sft.learning_rate,
                    "maxSteps": sft.max_steps,
                    "perDeviceBatchSize": sft.batch_size,
                    "gradientAccumulationSteps": 1,
                    "maxSeqLength": max(128, sft.max_length),
                    "seed": preset.seed,
                },
                "deepspeed": {"zeroStage": 3, "bf16": True},
                "nodes": cluster.nodes,
                "gpusPerNode": cluster.gpus_per_node,
                "outputUri": _uri(preset, "trainingruns", sft_name),
                "store": _store(preset),
                "checkpointEvery": sft.checkpoint_every,
                "resume": True,
                "image": cluster.trainer_image,
            },
        },
        _task_batch(
            preset,
            f"{name}-validation",
            "eval_sft",
            planner="local",
            seed=0,
            split="validation",
            samples=1,
            limit=None,
            model_uri=sft_model,
        ),
        _task_batch(
            preset,
            f"{name}-round2",
            "round2",
            planner="oracle",
            seed=2 + preset.seed * 1000,
            split="train",
            samples=1,
            limit=preset.round2.count,
        ),
        {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": "TrainingRun",
            "metadata": _meta(preset, rl_name, "rl"),
            "spec": {
                "stage": "rl",
                "baseModelUri": sft_model,
                "datasets": [{"taskBatchRef": {"name": f"{name}-round2"}, "weight": 1.0}],
                "rl": {
                    "rolloutPoolRef": {"name": cluster.rollout_pool},
                    "samplesPerTask": rl.samples_per_task,
                    "tasksPerStep": rl.tasks_per_step,
                    "maxTurns": preset.harness.max_turns,
                    "care": rl.care.to_k8s(),
                    "sampling": rl.sampling.to_k8s(),
                },
                "hyperparameters": {
                    "learningRate": rl.learning_rate,
                    "maxSteps": rl.steps,
                    "perDeviceBatchSize": rl.micro_batch_size,
                    "gradientAccumulationSteps": 1,
                    "seed": preset.seed,
                },
                "deepspeed": {"zeroStage": 2, "bf16": True},
                "nodes": cluster.nodes,
                "gpusPerNode": cluster.gpus_per_node,
                "outputUri": _uri(preset, "trainingruns", rl_name),
                "store": _store(preset),
                "checkpointEvery": rl.checkpoint_every,
                "resume": True,
                "image": cluster.trainer_image,
            },
        },
        {
            "apiVersion": "qpa.ai/v1alpha1",
            "kind": "HarnessRelease",
            "metadata": _meta(preset, name, "release"),
            "spec": {
                "model": {
                    "uri": rl_model,
                    "runtime": "vllm",
                    "servedModelName": "planner",
                    "gpus": 1,
                },
                "harness": {
                    "image": cluster.harness_image,
                    "version": revised,
                    "configMapRef": {"name": f"{name}-{revised}", "key": "harness.yaml"},
                },
                "benchmark": {
                    "suite": preset.suite,
                    "split": "test",
                    "samples": 1,
                    "concurrency": cluster.parallelism,
                    "environment": "sandbox",
                    "rolloutPoolRef": {"name": cluster.rollout_pool},
                },
                "gate": {"minOverall": 0.5, "maxCapabilityRegression": 0.03},
                "promotion": "auto",
                "reportUri": _uri(preset, "releases", name),
                "store": _store(preset),
            },
        },
    ]
    validate(resources)
    return resources


def validate(resources: list[dict[str, Any]]) -> None:
    """Parse every qpa.ai resource with its `qpa.api.v1alpha1` model (raises when invalid)."""
    from qpa.api.v1alpha1 import parse_resource

    for resource in resources:
        if str(resource.get("apiVersion", "")).startswith("qpa.ai/"):
            parse_resource(resource)


def render_yaml(resources: list[dict[str, Any]], preset: LoopPreset) -> str:
    """One YAML stream, a header comment naming the preset and what each document does."""
    header = [
        f"# qpa loop --preset {preset.name} --dry-run (seed {preset.seed})",
        "# The closed loop as custom resources; apply in order:",
        f"#   kubectl apply -n {preset.cluster.namespace} -f <this file>",
        "# The Harness v2 ConfigMap is written by the revision from the diagnosis of "
        f"{preset.cluster.name}-validation",
        "# (`qpa diagnose`), before the HarnessRelease rolls out.",
    ]
    docs = [yaml.safe_dump(r, sort_keys=False) for r in resources]
    return "\n".join(header) + "\n---\n" + "---\n".join(docs)


__all__ = ["KINDS", "cluster_resources", "harness_configmap", "render_yaml", "validate"]
