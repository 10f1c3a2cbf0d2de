"""The action -> feedback -> verification contract: the data every stage of qpa shares.

Environments consume `Task` and `Action` and produce `Feedback` and `Verification`; the Harness,
data pipeline, training, benchmark and diagnosis all read and write the same `Trajectory`.
Nothing here knows which environment kind produced it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)

Capability = Literal["tool_use", "memory", "skills", "subagent"]
CAPABILITIES: tuple[Capability, ...] = ("tool_use", "memory", "skills", "subagent")
Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
EnvKind = Literal["sandbox", "llm_sim", "device", "mcp", "agentdojo", "bfcl"]
SideEffect = Literal["read", "write", "payment", "egress"]
# What an argument of a tool is to the guard (qpa.harness.policy): `recipient` (whom the call
# reaches: an address, a number, a participant, a share), `target` (the record it acts on),
# `amount` (money or a quantity that costs), `content` (what it sends or writes out), `url`
# (an address it contacts), `credential` (a password, code or identity number it sets or
# sends), `destroyed` (the record it deletes, cancels or undoes), `option` (a choice among the
# tool's fixed settings that changes how the phone or an account behaves), `free` (anything
# else, a choice that only qualifies the call included).
ArgRole = Literal[
    "recipient", "target", "destroyed", "amount", "content", "url", "credential", "option", "free"
]
#: the roles whose values decide whom or what a call reaches: they must trace to the user
SINK_ROLES: frozenset[str] = frozenset(
    {"recipient", "target", "destroyed", "amount", "url", "credential"}
)
ErrorKind = Literal[
    "unknown_tool",
    "invalid_arguments",
    "precondition_failed",
    "permission_denied",
    "transient",
    "environment_failure",
    "malformed_action",  # the Harness could not parse the model's output into an action
]
Evidence = Literal["stated", "confirmed", "observed", "inferred"]
Fidelity = Literal["programmatic", "llm_judged", "device"]
CollateralChange = Literal["created", "modified", "deleted"]
WorldProfile = Literal["default", "phone"]
WORLD_PROFILES: tuple[WorldProfile, ...] = ("default", "phone")


class _Model(BaseModel):
    """Base for contract models: unknown fields are errors, so typos never pass silently."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- tasks


class UserProfile(_Model):
    """Who the simulated phone belongs to."""

    user_id: str = "u_0001"
    name: str = "Alex Morgan"
    phone: str = "+1-555-0100"
    email: str = "alex.morgan@example.com"
    home: str = "12 Harbor Street"
    work: str = "400 Market Avenue"
    timezone: str = "UTC"
    locale: str = "en-US"


class MemoryItem(_Model):
    """A remembered preference or fact about the user, graded by the evidence behind it."""

    key: str
    value: str
    evidence: Evidence = "stated"
    source: str = "seed"
    time: datetime = Field(default_factory=lambda: datetime(2026, 1, 1))


class Check(_Model):
    """One named verification check over the environment's final state.

    For the sandbox, `target` is `app.collection` (or `answer` for the final answer) and
    `where` filters records; keys may carry a Django-style suffix: `__contains`, `__in`,
    `__gte`, `__lte`, `__ne`, `__icontains`. `op` says what must hold of the matches.
    """

    name: str
    op: Literal["exists", "absent", "count", "equals", "answer"] = "exists"
    target: str
    where: dict[str, Any] = Field(default_factory=dict)
    expect: Any = None


class VerifierSpec(_Model):
    """How success is decided: state checks and an optional answer check, or a rubric."""

    kind: Literal["state", "rubric", "device"] = "state"
    checks: list[Check] = Field(default_factory=list)
    answer: str | None = None
    answer_match: Literal["exact", "contains", "number", "all_of"] = "contains"
    rubric: list[str] = Field(default_factory=list)


class Task(_Model):
    """An executable task: instruction, world to seed it in, tools on offer and how to verify it."""

    id: str
    suite: str = "mobilepa"
    split: Split = "train"
    domain: str
    capabilities: list[Capability] = Field(min_length=1)
    difficulty: int = Field(default=1, ge=1, le=5)
    instruction: str = Field(min_length=1)
    user: UserProfile = Field(default_factory=UserProfile)
    memory: list[MemoryItem] = Field(default_factory=list)
    seed: int = 0
    apps: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    world: dict[str, dict[str, Any]] = Field(default_factory=dict)
    verifier: VerifierSpec = Field(default_factory=VerifierSpec)
    reference_plan: list[Action] | None = None
    confirmations: list[str] = Field(default_factory=list)
    source: str = "template"
    template: str | None = None
    lineage: dict[str, Any] = Field(default_factory=dict)
    # How full the phone is: "default" is the task's own world; "phone" fills every app at a
    # real phone's sizes from the task's seed (qpa.envs.sandbox.profiles). Left out of the
    # serialised form when default, so existing tasks' JSON and hashes are unchanged.
    world_profile: WorldProfile = "default"

    @model_serializer(mode="wrap")
    def _drop_default_profile(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("world_profile") == "default":
            data.pop("world_profile")
        return data

    @field_validator("capabilities")
    @classmethod
    def _unique_capabilities(cls, value: list[Capability]) -> list[Capability]:
        if len(set(value)) != len(value):
            raise ValueError("capabilities must not repeat")
        return value


class ToolSpec(_Model):
    """A tool as a planner sees it: OpenAI-style function schema plus its side-effect class.

    `side_effect`: `read` changes nothing; `write` changes the world's state; `payment` changes it
    and moves money, so it needs the user's confirmation (the tool named in the task's
    `confirmations`) or the environment refuses it with `permission_denied`; `egress` sends
    data out of the world (fetching a URL, posting to an outside address) without changing its
    records: the guard treats it as a send, never as a read.
    """

    name: str = Field(pattern=r"^[a-zA-Z][a-zA-Z0-9_]{0,63}$")
    description: str
    app: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    result: dict[str, Any] = Field(default_factory=dict)
    side_effect: SideEffect = "read"
    # argument -> role, declared by the environment kind (an argument left out is `free`);
    # None: the kind declares no roles (the guard's strict mode refuses its state changes)
    roles: dict[str, ArgRole] | None = None
    # the collection of the records the tool returns ("files"), and the collection of the
    # record each `target`/`destroyed` argument names: a record's identity is both, never an
    # equal string of another collection (declared where ids are short and shared: AgentDojo)
    records: str | None = None
    collections: dict[str, str] = Field(default_factory=dict)
    # fields of its result that are the user's secrets (a passport or card number): what is
    # sent out may carry them only when the user's request names them
    secrets: list[str] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _drop_undeclared_roles(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in ("roles", "records"):
                if data.get(key) is None:
                    data.pop(key, None)
            for key in ("collections", "secrets"):
                if not data.get(key):
                    data.pop(key, None)
        return data

    def role(self, argument: str) -> ArgRole:
        """The declared role of `argument` (`free` when not declared)."""
        return (self.roles or {}).get(argument, "free")

    @property
    def changes_state(self) -> bool:
        """Whether a successful call changes the world (a `write` or a `payment`)."""
        return self.side_effect != "read"

    @property
    def needs_confirmation(self) -> bool:
        """Whether the user must confirm the call first (a `payment`)."""
        return self.side_effect == "payment"


class SkillSpec(_Model):
    """A Skill as the Harness holds it: an app's procedure document, recorded as `app.name`."""

    app: str = Field(min_length=1)
    name: str = Field(min_length=1)
    text: str

    @property
    def id(self) -> str:
        return f"{self.app}.{self.name}"


# --------------------------------------------------------------------------- actions


class ToolCall(_Model):
    """Call one of the environment's tools with JSON arguments."""

    type: Literal["tool_call"] = "tool_call"
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = None


class UIAction(_Model):
    """A raw UI gesture on a device screen, or an app launch / intent.

    `tap` (x, y), `swipe` (x, y -> x2, y2), `type` (text into the focused field), `back`,
    `home`, `launch` (package, optionally its `activity`), `intent` (an activity intent:
    `action`, optional `data` URI, `package` and string `extras`).
    """

    type: Literal["ui"] = "ui"
    op: Literal["tap", "type", "swipe", "back", "home", "launch", "intent"]
    x: int | None = None
    y: int | None = None
    x2: int | None = None
    y2: int | None = None
    text: str | None = None
    package: str | None = None
    activity: str | None = None
    action: str | None = None
    data: str | None = None
    extras: dict[str, str] | None = None


class MessageUser(_Model):
    """Say something to the user (a question, a confirmation request, a progress note)."""

    type: Literal["message_user"] = "message_user"
    text: str


class Delegate(_Model):
    """Hand a self-contained part of the task to a sub-agent with a scoped tool set."""

    type: Literal["delegate"] = "delegate"
    goal: str
    tools: list[str] = Field(default_factory=list)
    agent: str = "sub"


class Finish(_Model):
    """End the episode, optionally with an answer for the user."""

    type: Literal["finish"] = "finish"
    answer: str | None = None


Action = Annotated[
    ToolCall | UIAction | MessageUser | Delegate | Finish, Field(discriminator="type")
]
ACTION_ADAPTER: TypeAdapter[Action] = TypeAdapter(Action)


# --------------------------------------------------------------------------- feedback


class Feedback(_Model):
    """What the environment answers to reset or to one action. Errors are data, never raised."""

    status: Literal["ok", "error"] = "ok"
    observation: Any = None
    error: ErrorKind | None = None
    message: str = ""
    done: bool = False

    @classmethod
    def ok(cls, observation: Any = None, *, done: bool = False, message: str = "") -> Feedback:
        return cls.model_construct(
            status="ok", observation=observation, error=None, message=message, done=done
        )

    @classmethod
    def fail(cls, kind: ErrorKind, message: str, *, done: bool = False) -> Feedback:
        return cls.model_construct(
            status="error", observation=None, error=kind, message=message, done=done
        )


class CheckResult(_Model):
    name: str
    passed: bool
    detail: str = ""


class CollateralWrite(_Model):
    """A change to the world's state that the task's verifier does not expect.

    One record per changed record: `app` and `collection` name where it lives (a settings dict
    is one record, with `record_id` None), `change` what happened to it, `tool` the state-changing
    call that made it when the environment can tell (None otherwise), `detail` a readable line
    (the fields that changed, or the record's name).
    """

    app: str = Field(min_length=1)
    collection: str = Field(min_length=1)
    record_id: str | None = None
    change: CollateralChange
    tool: str | None = None
    detail: str = ""

    @property
    def target(self) -> str:
        """`app.collection`, as a verifier check names it."""
        return f"{self.app}.{self.collection}"


class Verification(_Model):
    """Whether the task is done and succeeded; progress is the share of checks passed.

    `collateral` lists the state changes the task's verifier does not explain (writes the user
    did not ask for). An environment that cannot tell leaves it empty (LLM-judged apps, devices,
    trajectories written before the field existed). A verification with collateral writes is
    never a success: the model refuses `success=True` with a non-empty `collateral`, so every
    reader (scoring, diagnosis, curation, rewards) sees the episode as failed; the sandbox also
    gives it progress 0, so partial-credit rewards do not pay for the damage.
    """

    done: bool
    success: bool
    progress: float = Field(ge=0.0, le=1.0)
    checks: list[CheckResult] = Field(default_factory=list)
    fidelity: Fidelity = "programmatic"
    collateral: list[CollateralWrite] = Field(default_factory=list)

    @model_validator(mode="after")
    def _collateral_is_failure(self) -> Verification:
        if self.success and self.collateral:
            raise ValueError(
                f"success: a verification with {len(self.collateral)} collateral write(s) "
                "cannot be a success"
            )
        return self


# --------------------------------------------------------------------------- trajectories


class TokenUsage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class Step(_Model):
    """One turn: the action taken, the feedback it got, and what the Harness noted about it."""

    index: int
    agent: str = "main"
    action: Action
    feedback: Feedback
    duration_ms: float = 0.0
    usage: TokenUsage = Field(default_factory=TokenUsage)
    annotations: dict[str, Any] = Field(default_factory=dict)


class Policy(_Model):
    """Which model and which Harness version acted."""

    planner: str
    model: str = ""
    harness_version: str = ""


class Totals(_Model):
    turns: int = 0
    tool_calls: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_time_s: float = 0.0


class Trajectory(_Model):
    """A whole episode, successful or not: failed trajectories are kept for diagnosis.

    `tools` are the tools the environment offered in the episode (its `tools()` after reset, with
    their side effects), whatever the Harness then showed the planner: what the planner was
    offered is the first step's `tools_exposed` annotation (names). `skills` are the Skills the
    planner could have been shown for those tools' apps (the Harness's library; empty for
    planners without Skills); which it was shown is the `skills_exposed` annotation. Together they
    tell diagnosis, curation and rendering what each tool does without any environment's
    registry. Trajectories written before these fields existed read back with both empty: their
    tools' effects are unknown, and readers must say so rather than guess.
    """

    id: str
    task: Task
    env_kind: EnvKind = "sandbox"
    policy: Policy
    sample: int = 0
    tools: list[ToolSpec] = Field(default_factory=list)
    skills: list[SkillSpec] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    verification: Verification | None = None
    totals: Totals = Field(default_factory=Totals)
    answer: str | None = None
    error: str | None = None
    started_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def success(self) -> bool:
        return self.verification is not None and self.verification.success

    def tool(self, name: str) -> ToolSpec | None:
        """The offered tool called `name`, or None (not offered, or not recorded)."""
        return next((t for t in self.tools if t.name == name), None)

    def recompute_totals(self, wall_time_s: float | None = None) -> Totals:
        """Derive totals from the steps (the one place they are computed)."""
        totals = Totals(
            turns=len(self.steps),
            tool_calls=sum(1 for s in self.steps if s.action.type == "tool_call"),
            errors=sum(1 for s in self.steps if s.feedback.status == "error"),
            prompt_tokens=sum(s.usage.prompt_tokens for s in self.steps),
            completion_tokens=sum(s.usage.completion_tokens for s in self.steps),
            wall_time_s=self.totals.wall_time_s if wall_time_s is None else wall_time_s,
        )
        self.totals = totals
        return totals


Task.model_rebuild()
