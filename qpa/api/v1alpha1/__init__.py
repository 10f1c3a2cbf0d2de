"""qpa.ai/v1alpha1, a module per kind: TaskBatch, RolloutPool, DevicePool, TrainingRun and
HarnessRelease (with `base` and `resource`, what they share).

These pydantic models are the single source of the custom resources: `qpa crds generate` turns
them into `crds/*.yaml` (see `qpa.api.crdgen`), the operator parses what the API server stores
with them, and tests build custom resources from them. Field names are snake_case in Python and
camelCase on the wire (`samples_per_task` <-> `samplesPerTask`); both spellings are accepted when
parsing, and `to_k8s()` writes the wire form.

Rules that span fields are written once, as `CrossFieldRule`s: each carries the CEL expression the
API server enforces (`x-kubernetes-validations` in the CRD) and the same rule as a Python
predicate that pydantic enforces, so a custom resource is rejected alike by `kubectl apply` and by
`TrainingRun.model_validate`. Rules that compare with the stored object (immutable fields) exist
only in CEL (`oldSelf`), since only the server knows the old object.

Secrets are never inlined: credentials are referenced by `secretRef` / `apiKeySecretRef`.

This module imports only pydantic and the standard library (an import-linter contract keeps it
so), so the operator can use it without importing the rest of qpa.
"""

from __future__ import annotations

from typing import Any

from qpa.api.v1alpha1.base import (
    API_VERSION,
    ARTIFACT_URI,
    CATEGORY,
    CONDITION_REASON,
    CONDITION_TYPE,
    CONFIG_KEY,
    DNS_SUBDOMAIN,
    GROUP,
    HTTP_URL,
    IMAGE,
    MAX_NAME_LENGTH,
    MODEL_URI,
    QUANTITY,
    VERSION,
    Capability,
    Condition,
    ConditionStatus,
    ConfigMapKeySelector,
    CrossFieldRule,
    EnvironmentKind,
    LocalObjectReference,
    Name,
    ObjectStore,
    Offload,
    Planner,
    Quantity,
    ResourceRequirements,
    SecretKeySelector,
    Split,
    Stage,
    StoreSecretRef,
    _add_rules,
    _check_unique,
    _conditions,
    _defaulted,
    _immutable,
    _list_set,
    _Model,
    _observed_generation,
    _s3_needs_store,
    _snake,
    _timestamp,
    set_condition,
)
from qpa.api.v1alpha1.devicepool import (
    DeviceFilter,
    DeviceHealthCheck,
    DevicePool,
    DevicePoolPhase,
    DevicePoolSpec,
    DevicePoolStatus,
    Phone,
    PhoneState,
)
from qpa.api.v1alpha1.harnessrelease import (
    OVERRIDE_ANNOTATION,
    AnalysisStatus,
    BenchmarkSettings,
    BenchSummary,
    CanaryAnalysis,
    CanarySettings,
    GateSettings,
    HarnessRelease,
    HarnessReleasePhase,
    HarnessReleaseSpec,
    HarnessReleaseStatus,
    HarnessServing,
    MetricsSample,
    ModelServing,
    OverrideAction,
    ReleaseOverride,
    ReleaseTimeouts,
    ReleaseVersion,
    RolloutSettings,
    Scores,
)
from qpa.api.v1alpha1.resource import (
    AGE_COLUMN,
    PHASE_COLUMN,
    CustomResource,
    KindInfo,
    ObjectMeta,
    OwnerReference,
    PrinterColumn,
    ScaleSubresource,
)
from qpa.api.v1alpha1.rolloutpool import (
    LLMSimSettings,
    ReplicaRange,
    RolloutPool,
    RolloutPoolPhase,
    RolloutPoolSpec,
    RolloutPoolStatus,
)
from qpa.api.v1alpha1.taskbatch import (
    HarnessVersion,
    PolicyEndpoint,
    TaskBatch,
    TaskBatchPhase,
    TaskBatchSource,
    TaskBatchSpec,
    TaskBatchStatus,
    TaskGenerator,
    TaskSource,
)
from qpa.api.v1alpha1.trainingrun import (
    KUEUE_QUEUE_LABEL,
    CareSettings,
    CareTier,
    Checkpoint,
    DatasetRef,
    DeepSpeedSettings,
    Hyperparameters,
    RLSettings,
    SchedulingSettings,
    SFTSettings,
    TaskSampling,
    TrainingRun,
    TrainingRunPhase,
    TrainingRunSpec,
    TrainingRunStatus,
    TrainSummary,
)
from qpa.api.v1alpha1.workorder import (
    API_KEY_ENV,
    HARNESS_CONFIG_DIR,
    SUMMARY_LIMIT,
    WORK_ORDER_DIR,
    WORK_ORDER_KEY,
    WORK_ORDER_PATH,
    PodSummary,
    Resolved,
    WorkOrder,
    WorkOrderError,
    dump_work_order,
    first_error,
    harness_config_path,
    work_order_document,
)

RESOURCES: tuple[type[CustomResource], ...] = (
    TaskBatch,
    RolloutPool,
    DevicePool,
    TrainingRun,
    HarnessRelease,
)


def resource_for_kind(kind: str) -> type[CustomResource]:
    """The model class of a kind, plural or short name (`TrainingRun`, `trainingruns`, `tr`)."""
    wanted = kind.lower()
    for cls in RESOURCES:
        info = cls.info
        if wanted in (info.kind.lower(), info.plural, info.singular, *info.short_names):
            return cls
    raise KeyError(
        f"unknown qpa.ai kind {kind!r}; known: {', '.join(c.info.kind for c in RESOURCES)}"
    )


def parse_resource(obj: dict[str, Any]) -> CustomResource:
    """Parse a qpa.ai object (a dict as the API server or a YAML file has it) into its model."""
    api_version = obj.get("apiVersion")
    if api_version != API_VERSION:
        raise ValueError(f"apiVersion must be {API_VERSION}, not {api_version!r}")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise ValueError("kind is missing")
    return resource_for_kind(kind).model_validate(obj)


__all__ = [
    "AGE_COLUMN",
    "API_KEY_ENV",
    "API_VERSION",
    "ARTIFACT_URI",
    "CATEGORY",
    "CONDITION_REASON",
    "CONDITION_TYPE",
    "CONFIG_KEY",
    "DNS_SUBDOMAIN",
    "GROUP",
    "HARNESS_CONFIG_DIR",
    "HTTP_URL",
    "IMAGE",
    "KUEUE_QUEUE_LABEL",
    "MAX_NAME_LENGTH",
    "MODEL_URI",
    "OVERRIDE_ANNOTATION",
    "PHASE_COLUMN",
    "QUANTITY",
    "RESOURCES",
    "SUMMARY_LIMIT",
    "VERSION",
    "WORK_ORDER_DIR",
    "WORK_ORDER_KEY",
    "WORK_ORDER_PATH",
    "AnalysisStatus",
    "BenchSummary",
    "BenchmarkSettings",
    "CanaryAnalysis",
    "CanarySettings",
    "Capability",
    "CareSettings",
    "CareTier",
    "Checkpoint",
    "Condition",
    "ConditionStatus",
    "ConfigMapKeySelector",
    "CrossFieldRule",
    "CustomResource",
    "DatasetRef",
    "DeepSpeedSettings",
    "DeviceFilter",
    "DeviceHealthCheck",
    "DevicePool",
    "DevicePoolPhase",
    "DevicePoolSpec",
    "DevicePoolStatus",
    "EnvironmentKind",
    "GateSettings",
    "HarnessRelease",
    "HarnessReleasePhase",
    "HarnessReleaseSpec",
    "HarnessReleaseStatus",
    "HarnessServing",
    "HarnessVersion",
    "Hyperparameters",
    "KindInfo",
    "LLMSimSettings",
    "LocalObjectReference",
    "MetricsSample",
    "ModelServing",
    "Name",
    "ObjectMeta",
    "ObjectStore",
    "Offload",
    "OverrideAction",
    "OwnerReference",
    "Phone",
    "PhoneState",
    "Planner",
    "PodSummary",
    "PolicyEndpoint",
    "PrinterColumn",
    "Quantity",
    "RLSettings",
    "ReleaseOverride",
    "ReleaseTimeouts",
    "ReleaseVersion",
    "ReplicaRange",
    "Resolved",
    "ResourceRequirements",
    "RolloutPool",
    "RolloutPoolPhase",
    "RolloutPoolSpec",
    "RolloutPoolStatus",
    "RolloutSettings",
    "SFTSettings",
    "ScaleSubresource",
    "SchedulingSettings",
    "Scores",
    "SecretKeySelector",
    "Split",
    "Stage",
    "StoreSecretRef",
    "TaskBatch",
    "TaskBatchPhase",
    "TaskBatchSource",
    "TaskBatchSpec",
    "TaskBatchStatus",
    "TaskGenerator",
    "TaskSampling",
    "TaskSource",
    "TrainSummary",
    "TrainingRun",
    "TrainingRunPhase",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "WorkOrder",
    "WorkOrderError",
    "_Model",
    "_add_rules",
    "_check_unique",
    "_conditions",
    "_defaulted",
    "_immutable",
    "_list_set",
    "_observed_generation",
    "_s3_needs_store",
    "_snake",
    "_timestamp",
    "dump_work_order",
    "first_error",
    "harness_config_path",
    "parse_resource",
    "resource_for_kind",
    "set_condition",
    "work_order_document",
]
