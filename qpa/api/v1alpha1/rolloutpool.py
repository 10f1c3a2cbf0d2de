"""RolloutPool: its spec, status and custom resource model."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from qpa.api.v1alpha1.base import (
    IMAGE,
    MAX_IMAGE_LENGTH,
    Condition,
    Count,
    CrossFieldRule,
    EndpointUrl,
    EnvironmentKind,
    ResourceRequirements,
    SecretKeySelector,
    ServiceObjectReference,
    UriText,
    _check_unique,
    _conditions,
    _defaulted,
    _immutable,
    _list_set,
    _Model,
    _observed_generation,
)
from qpa.api.v1alpha1.podtemplate import PodTemplate
from qpa.api.v1alpha1.resource import (
    AGE_COLUMN,
    PHASE_COLUMN,
    CustomResource,
    KindInfo,
    PrinterColumn,
    ScaleSubresource,
)

AutoscaleMetric = Literal["sessions", "cpu"]


class ReplicaRange(_Model):
    """How many environment-server pods to keep: at least `min`, at most `max`, and what the
    autoscaler between the two scales on."""

    min: int = Field(default=1, ge=0, le=1000, description="Pods kept warm.")
    max: int = Field(default=4, ge=1, le=1000, description="Pods at most under load.")
    metric: AutoscaleMetric | None = Field(
        default=None,
        description="What the autoscaler scales on: sessions in use per pod (the env server's "
        "qpa_env_sessions_in_use, through a metrics adapter) or CPU; unset: the chart's "
        "rolloutPools.autoscaleMetric.",
    )
    target_percent: int = Field(
        default=70,
        ge=1,
        le=100,
        description="Target per pod: sessions in use as a percent of sessionsPerPod, or CPU "
        "utilization.",
    )

    RULES = (
        CrossFieldRule(
            cel="self.min <= self.max",
            message="replicas.min must not exceed replicas.max",
            check=lambda m: m.min <= m.max,
        ),
    )


class LLMSimSettings(_Model):
    """The model endpoint that plays the apps of an llm_sim environment."""

    model_url: EndpointUrl = Field(description="OpenAI-compatible endpoint (--model-url).")
    model: str = Field(
        default="", max_length=253, description="Model name at the endpoint (--model)."
    )
    api_key_secret_ref: SecretKeySelector | None = Field(
        default=None, description="Secret key holding the endpoint's API key."
    )


#: An MCP tool's name as the `mcp` environment kind accepts one (`qpa.envs.mcp.env.TOOL_NAME`).
MCP_TOOL_NAME: Final = r"^[A-Za-z0-9_.-]{1,128}$"
MAX_MCP_TOOLS: Final = 64
MAX_MCP_ARGS: Final = 64
McpToolName = Annotated[str, Field(min_length=1, max_length=128, pattern=MCP_TOOL_NAME)]
McpArg = Annotated[str, Field(min_length=1, max_length=1024)]


class McpSettings(_Model):
    """The MCP server an `mcp` pool's pods front, and which of its tools a task may reach.

    The operator hands these to each pod as `$QPA_MCP_URL` (or `$QPA_MCP_COMMAND`),
    `$QPA_MCP_CONTROL_TOOLS` and `$QPA_MCP_HIDDEN_TOOLS` (docs/ecosystem.md, "In: environment
    kind mcp"): a task comes from whichever client resets an episode, so what it may call is
    said here, never by the task."""

    url: EndpointUrl | None = Field(
        default=None, description="Streamable HTTP endpoint of the MCP server ($QPA_MCP_URL)."
    )
    command: list[McpArg] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MCP_ARGS,
        description="Or the argv of an MCP server in the image, started over stdio by each "
        "session ($QPA_MCP_COMMAND).",
    )
    control_tools: list[McpToolName] = _list_set(
        "Tools a task may name as its world._mcp.reset_tool, verifier_tool or finish_tool "
        "($QPA_MCP_CONTROL_TOOLS); never offered to the planner. Empty: a task names none.",
        max_length=MAX_MCP_TOOLS,
    )
    hidden_tools: list[McpToolName] = _list_set(
        "Tools never offered to the planner nor called in any role, whatever a task says "
        "($QPA_MCP_HIDDEN_TOOLS): an admin tool, say.",
        max_length=MAX_MCP_TOOLS,
    )

    RULES = (
        CrossFieldRule(
            cel="has(self.url) != has(self.command)",
            message="mcp: set url (streamable HTTP) or command (stdio), one of them",
            check=lambda m: (m.url is None) != (m.command is None),
        ),
        CrossFieldRule(
            cel="!has(self.hiddenTools) || !has(self.controlTools) || "
            "self.hiddenTools.all(t, !(t in self.controlTools))",
            message="mcp: a tool is a control tool or a hidden one, not both",
            check=lambda m: not set(m.hidden_tools) & set(m.control_tools),
        ),
        CrossFieldRule(
            cel=None,  # x-kubernetes-list-type: set
            message="mcp: controlTools and hiddenTools must not repeat a tool",
            check=_check_unique("control_tools", "hidden_tools"),
        ),
    )


class RolloutPoolSpec(_Model):
    """A warm pool of environment servers (`qpa env serve`) behind one Service."""

    environment: EnvironmentKind = Field(
        description="Environment kind served (qpa env serve --kind).",
        json_schema_extra=_immutable("environment is immutable"),
    )
    image: str | None = Field(
        default=None,
        pattern=IMAGE,
        max_length=MAX_IMAGE_LENGTH,
        description="Image with qpa installed (the operator's sandbox image if unset).",
    )
    replicas: ReplicaRange = _defaulted(ReplicaRange, "Pod count range.")
    sessions_per_pod: int = Field(
        default=16, ge=1, le=1024, description="Concurrent episodes per pod (--max-sessions)."
    )
    session_ttl_seconds: float = Field(
        default=600.0, gt=0, le=86400, description="Idle session lifetime (--session-ttl)."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Container and Service port.")
    drain_timeout_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        description="Seconds a pod going away waits for its live episodes (preStop "
        "`qpa env drain`; terminationGracePeriodSeconds is this plus a margin).",
    )
    llm_sim: LLMSimSettings | None = Field(
        default=None, description="Endpoint settings, for environment llm_sim only."
    )
    device_pool_ref: ServiceObjectReference | None = Field(
        default=None, description="DevicePool whose phones back the sessions (device only)."
    )
    mcp: McpSettings | None = Field(
        default=None,
        description="The MCP server fronted and the tools tasks may reach, for environment mcp "
        "only.",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of each pod."
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Additions to the environment-server pods (placement, pull secrets, "
        'volumes, env, resources), merged as docs/operator.md "Pod overrides" says.',
    )

    RULES = (
        CrossFieldRule(
            cel="self.environment == 'device' ? has(self.devicePoolRef) : !has(self.devicePoolRef)",
            message="devicePoolRef is required for environment device and allowed only there",
            check=lambda m: (m.environment == "device") == (m.device_pool_ref is not None),
        ),
        CrossFieldRule(
            cel="self.environment == 'llm_sim' ? has(self.llmSim) : !has(self.llmSim)",
            message="llmSim is required for environment llm_sim and allowed only there",
            check=lambda m: (m.environment == "llm_sim") == (m.llm_sim is not None),
        ),
        CrossFieldRule(
            cel="self.environment == 'mcp' ? has(self.mcp) : !has(self.mcp)",
            message="mcp is required for environment mcp and allowed only there",
            check=lambda m: (m.environment == "mcp") == (m.mcp is not None),
        ),
    )


RolloutPoolPhase = Literal["Pending", "Ready", "Degraded", "Failed"]


class RolloutPoolStatus(_Model):
    """Capacity of a RolloutPool."""

    phase: RolloutPoolPhase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = _observed_generation()
    conditions: list[Condition] = _conditions()
    replicas: Count = Field(default=0, description="Pods that exist.")
    ready_replicas: Count = Field(default=0, description="Pods that are ready.")
    capacity: Count = Field(default=0, description="Sessions the ready pods can hold.")
    leased: Count = Field(
        default=0,
        description="Sessions in use: summed from the pods' qpa_env_sessions_in_use as the "
        "autoscaler last read it, or the phone Leases held (device pools), whichever is more.",
    )
    free: Count = Field(default=0, description="Free session slots: capacity - leased.")
    service_url: UriText | None = Field(default=None, description="URL of the pool's Service.")
    label_selector: str | None = Field(
        default=None,
        max_length=4096,
        description="Label selector of the pool's pods, as a string (the scale subresource's, "
        "for a HorizontalPodAutoscaler).",
    )


class RolloutPool(CustomResource):
    """A warm pool of environment servers that rollouts lease sessions from."""

    info = KindInfo(
        kind="RolloutPool",
        plural="rolloutpools",
        singular="rolloutpool",
        short_names=("qrp",),
        scale=ScaleSubresource(
            spec_replicas_path=".spec.replicas.min",
            status_replicas_path=".status.replicas",
            label_selector_path=".status.labelSelector",
        ),
        description="RolloutPool keeps a warm pool of environment servers (`qpa env serve`): "
        "sandbox, LLM-simulated, device-backed or fronting an MCP server.",
        printer_columns=(
            PrinterColumn(name="Environment", type="string", json_path=".spec.environment"),
            PHASE_COLUMN,
            PrinterColumn(name="Ready", type="integer", json_path=".status.readyReplicas"),
            PrinterColumn(name="Capacity", type="integer", json_path=".status.capacity"),
            PrinterColumn(name="Leased", type="integer", json_path=".status.leased"),
            PrinterColumn(name="Free", type="integer", json_path=".status.free"),
            PrinterColumn(name="Image", type="string", json_path=".spec.image", priority=1),
            AGE_COLUMN,
        ),
    )

    kind: Literal["RolloutPool"] = "RolloutPool"
    spec: RolloutPoolSpec
    status: RolloutPoolStatus | None = None
