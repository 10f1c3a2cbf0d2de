"""The custom resources of the qpa operator, as pydantic models (the source of `crds/*.yaml`).

`qpa.api.v1alpha1` holds the specs and statuses of TaskBatch, RolloutPool, DevicePool,
TrainingRun and HarnessRelease (group `qpa.ai`); `qpa.api.crdgen` turns them into structural
CustomResourceDefinitions. This package imports only pydantic (and the standard library), so the
operator, the CLI and tests can all read and write custom resources without pulling in the rest
of qpa.
"""

from qpa.api.v1alpha1 import (
    API_VERSION,
    CATEGORY,
    GROUP,
    RESOURCES,
    VERSION,
    CustomResource,
    DevicePool,
    HarnessRelease,
    KindInfo,
    RolloutPool,
    TaskBatch,
    TrainingRun,
    parse_resource,
    resource_for_kind,
)

__all__ = [
    "API_VERSION",
    "CATEGORY",
    "GROUP",
    "RESOURCES",
    "VERSION",
    "CustomResource",
    "DevicePool",
    "HarnessRelease",
    "KindInfo",
    "RolloutPool",
    "TaskBatch",
    "TrainingRun",
    "parse_resource",
    "resource_for_kind",
]
